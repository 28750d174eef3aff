"""The agent's store writer: batches, bounded buffers, drop-and-count on failure, kill -9 mid-write."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rankscope.collectors.writer import BatchWriter
from rankscope.datasets.store.store import Store


def metric(i: int) -> dict:
    return {"job": "j", "ts": None, "node": "n", "metric": "m", "value": float(i)}


def test_flush_writes_one_file_per_table(tmp_path: Path) -> None:
    w = BatchWriter(tmp_path / "store")
    w.add("metrics", [metric(i) for i in range(10)])
    w.add("events", [{"job": "j", "kind": "agent", "severity": "info", "message": "hi"}])
    assert w.pending == 11
    assert w.flush() == 11 and w.pending == 0
    store = Store(tmp_path / "store")
    assert store.read("metrics")["value"].to_list() == [float(i) for i in range(10)]
    assert len(store.files("metrics")) == 1 and store.read("events")["message"].to_list() == ["hi"]
    assert w.flush() == 0


def test_bounded_buffer_drops_oldest_and_counts(tmp_path: Path) -> None:
    w = BatchWriter(tmp_path / "store", max_rows=5)
    w.add("metrics", [metric(i) for i in range(8)])
    assert w.pending == 5 and w.dropped == {"metrics": 3}
    w.flush()
    assert Store(tmp_path / "store").read("metrics")["value"].to_list() == [3.0, 4.0, 5.0, 6.0, 7.0]


def test_full_disk_drops_and_counts_never_raises(tmp_path: Path, monkeypatch) -> None:
    w = BatchWriter(tmp_path / "store")
    w.add("metrics", [metric(1)])
    w.flush()

    def enospc(*a: object, **k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("rankscope.datasets.store.store.atomic_write_parquet", enospc)
    w.add("metrics", [metric(2), metric(3)])
    assert w.flush() == 0
    assert w.write_errors == 1 and w.dropped == {"metrics": 2} and "No space left" in w.last_error
    monkeypatch.undo()
    w.add("metrics", [metric(4)])
    assert w.flush() == 1  # recovers when space is back
    assert sorted(Store(tmp_path / "store").read("metrics")["value"].to_list()) == [1.0, 4.0]


def test_unwritable_store_and_bad_rows_are_counted(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    w = BatchWriter(blocker / "store")
    w.add("metrics", [metric(1)])
    assert w.flush() == 0 and w.write_errors == 1
    w2 = BatchWriter(tmp_path / "ok")
    w2.add("metrics", [{"job": "j", "value": "not a number"}])
    assert w2.flush() == 0 and w2.dropped == {"metrics": 1}


def test_rows_with_unknown_columns_or_tables_are_dropped_alone(tmp_path: Path) -> None:
    w = BatchWriter(tmp_path / "store")
    w.add("metrics", [metric(1), {**metric(2), "bogus": 1}, metric(3)])
    w.add("no_such_table", [{"a": 1}, {"a": 2}])
    assert w.pending == 2 and w.dropped == {"metrics": 1, "no_such_table": 2}
    assert w.flush() == 2
    assert Store(tmp_path / "store").read("metrics")["value"].to_list() == [1.0, 3.0]


WRITER = r"""
import sys
from rankscope.collectors.writer import BatchWriter
from rankscope.datasets.store.store import Store
Store(sys.argv[1], create=True)
w = BatchWriter(sys.argv[1])
rows = [{"job": "j", "metric": "m" * 50, "value": float(i), "labels": "x" * 200} for i in range(20000)]
print("ready", flush=True)
while True:
    w.add("metrics", rows)
    w.flush()
"""


def test_kill_9_mid_write_leaves_no_partial_visible_file(tmp_path: Path) -> None:
    root = tmp_path / "store"
    for delay in (0.4, 0.9, 1.4):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    store = Store(root)
    files = store.files("metrics")  # checks every visible file is a complete Parquet file
    df = store.read("metrics")
    assert files and df.height == 20000 * len(files)
    leftovers = [p.name for p in root.rglob("*") if p.is_file() and p.name.startswith(".tmp-")]
    assert all(not name.startswith("part-") for name in leftovers)
