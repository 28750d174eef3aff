"""A corrupt or foreign file in the store names the file and the table in one line and the rest of the store
stays usable; temp files of killed writers are cleaned up by the next writer; a killed ingest leaves no
unreadable part file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankscope.analytics import diagnose
from rankscope.datasets.loading.ingest import ingest_path
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.datasets.store.store import Store
from rankscope.spine import TEMP_PREFIX, StoreError


@pytest.fixture
def store(tmp_path: Path, stack_dir: Path, fr_dir: Path) -> Path:
    for p in fr_dir.iterdir():  # stacks and FR dumps of one job, so several tables are written
        shutil.copy(p, stack_dir / p.name)
    root = tmp_path / "store"
    ingest_path(stack_dir, root, job="j")
    return root


def _part(root: Path, table: str) -> Path:
    return sorted((root / table).rglob("part-*.parquet"))[0]


def test_another_tables_parquet_in_place_is_named_with_its_table(store: Path) -> None:
    shutil.copy(_part(store, "ingests"), _part(store, "topology"))
    st = Store(store)
    with pytest.raises(StoreError, match=r"part-.*\.parquet: table topology: not a topology file") as exc:
        st.read("topology")
    assert "\n" not in str(exc.value)
    assert st.sql("SELECT count(*) AS n FROM stacks")["n"][0] > 0  # the other tables stay usable
    with pytest.raises(StoreError, match="table topology"):
        st.sql("SELECT * FROM topology")


def test_a_bit_flipped_part_leaves_the_diagnosis_standing_with_a_note(store: Path) -> None:
    part = _part(store, "collectives")
    data = bytearray(part.read_bytes())
    for i in range(len(data) - 64, len(data) - 8):
        data[i] ^= 0xFF
    part.write_bytes(bytes(data))
    inputs = load_inputs(store)
    assert any("left out" in n and "collectives" in n for n in inputs.notes), inputs.notes
    assert diagnose(inputs).verdict == "hang"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_or_device_for_a_part_or_the_marker_is_never_opened(store: Path) -> None:
    part = _part(store, "stacks")
    part.unlink()
    os.mkfifo(part)
    with pytest.raises(StoreError, match=r"table stacks: a FIFO, not a regular file"):
        Store(store).read("stacks")
    marker = store / "rankscope-store.json"
    marker.unlink()
    marker.symlink_to("/dev/zero")
    with pytest.raises(StoreError, match="unreadable store marker"):
        Store(store)


def test_a_deeply_nested_marker_is_one_line(store: Path) -> None:
    (store / "rankscope-store.json").write_text('{"version": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(StoreError, match="nested deeper than"):
        Store(store)


def test_the_next_writer_removes_what_killed_writers_left(store: Path, stack_dir: Path) -> None:
    part = _part(store, "stacks")
    stale = part.parent / f"{TEMP_PREFIX}123-deadbeef-part-x.parquet"
    other = store / "stacks" / "job=gone" / f"{TEMP_PREFIX}9-cafe-part-y.parquet"  # another job's partition
    other.parent.mkdir()
    fresh = part.parent / f"{TEMP_PREFIX}{os.getpid()}-beef-part-z.parquet"  # a writer busy right now
    old = time.time() - 7200
    for p in (stale, other, fresh):
        p.write_bytes(b"half a file")
    for p in (stale, other):
        os.utime(p, (old, old))
    (stack_dir / "rank0.txt").write_text((stack_dir / "rank1.txt").read_text())  # something new to ingest
    ingest_path(stack_dir, store, job="j")
    assert not stale.exists() and not other.exists() and fresh.exists()


def test_a_killed_ingest_leaves_no_unreadable_part(tmp_path: Path, stack_dir: Path) -> None:
    root = tmp_path / "killed"
    env = {**os.environ, "RANKSCOPE_PROGRESS": "0"}
    for delay in (0.4, 0.8, 1.2):
        p = subprocess.Popen(
            [sys.executable, "-m", "rankscope", "ingest", str(stack_dir), "--store", str(root)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
    if (root / "rankscope-store.json").exists():
        st = Store(root)
        for name in ("stacks", "ingests", "topology"):
            st.read(name)
        assert not st.skipped, st.skipped
    marker = root / "rankscope-store.json"
    assert not marker.exists() or json.loads(marker.read_text())["version"] >= 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_ingest_never_digests_a_device_named_like_a_hook_file(tmp_path: Path, hook_dir: Path) -> None:
    stack = hook_dir / "pid16480.stack.txt"
    stack.unlink()
    stack.symlink_to("/dev/urandom")  # the identity still names the process, and its stack file by name
    t = time.perf_counter()
    ingest_path(hook_dir, tmp_path / "s", job="j")
    assert time.perf_counter() - t < 30
