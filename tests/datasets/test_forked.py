"""Reading with forked workers returns what the sequential read returns, on every capture kept under tests/data,
and a worker that fails costs nothing: its chunk is read again in the parent, raising what it raises."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from rankscope.datasets.readers import forked
from rankscope.datasets.readers.dumpdir import scan_dump_dir
from rankscope.datasets.readers.flight_recorder import read_fr_dir_noted
from rankscope.spine import InputError

DATA = Path(__file__).resolve().parents[1] / "data"
PARENT = os.getpid()


def _case_dirs() -> list[Path]:
    out = []
    for group in ("outside", "review", "field", "fr_gloo", "stacks"):
        root = DATA / group
        if root.is_dir():
            out += sorted(p for p in root.iterdir() if p.is_dir())
    return out


def _outcome(fn, monkeypatch, workers: str):
    monkeypatch.setenv(forked.ENV, workers)
    try:
        return fn()
    except InputError as exc:
        return ("error", type(exc).__name__, str(exc))


def test_chunks_keep_order_and_cover_everything() -> None:
    items = list(range(1000))
    for n in (1, 2, 3, 8):
        for lead in (1.0, 1.3):
            parts = forked.chunks(items, n, lead=lead)
            assert len(parts) == n
            assert [x for p in parts for x in p] == items
            assert all(parts)
    assert len(forked.chunks(items, 2, lead=1.5)[0]) == 600
    assert forked.chunks([1, 2], 5) == [[1], [2]]


def test_map_chunks_equals_the_loop_and_runs_parts_in_children() -> None:
    parts = forked.chunks(list(range(50)), 4)
    out = forked.map_chunks(parts, lambda p: ([x * x for x in p], os.getpid()))
    assert [sq for sqs, _ in out for sq in sqs] == [x * x for x in range(50)]
    pids = [pid for _, pid in out]
    assert pids[0] == os.getpid() and all(pid != os.getpid() for pid in pids[1:]) and len(set(pids)) == 4


def test_a_failed_child_is_redone_here_and_raises_what_the_loop_raises() -> None:
    def work(part):
        if os.getpid() != PARENT and 7 in part:
            os._exit(3)  # killed mid-chunk (the OOM killer, a signal)
        if 33 in part:
            raise InputError("file 33: corrupt")
        return list(part)

    parts = forked.chunks(list(range(20)), 3)
    assert [x for p in forked.map_chunks(parts, work) for x in p] == list(range(20))
    with pytest.raises(InputError, match="file 33: corrupt"):
        forked.map_chunks(forked.chunks(list(range(40)), 3), work)


def test_a_result_that_does_not_decode_is_redone_here() -> None:
    parts = forked.chunks(list(range(10)), 2)
    calls = []

    def decode(data):
        calls.append(data)
        raise ValueError("bad")

    out = forked.map_chunks(parts, sum, encode=lambda r: r, decode=decode)
    assert out == [sum(parts[0]), sum(parts[1])] and calls == [sum(parts[1])]


def test_worker_count_env_threads_and_size(monkeypatch) -> None:
    monkeypatch.setenv(forked.ENV, "1")
    assert forked.worker_count(10**6, min_per_worker=1) == 1
    monkeypatch.setenv(forked.ENV, "3")
    assert forked.worker_count(100, min_per_worker=1000) == 3
    assert forked.worker_count(2, min_per_worker=1) == 2
    monkeypatch.delenv(forked.ENV)
    assert forked.worker_count(10, min_per_worker=1000) == 1  # too few files to be worth a fork
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:  # another thread (the agent's, a notebook's): forking is not safe, read here
        monkeypatch.setenv(forked.ENV, "4")
        assert forked.worker_count(10**6, min_per_worker=1) == 1
    finally:
        stop.set()
        t.join()
    assert forked.usable_cpus() >= 1


@pytest.mark.parametrize("case", _case_dirs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_stack_scan_with_workers_equals_the_sequential_scan(case: Path, monkeypatch) -> None:
    one = _outcome(lambda: scan_dump_dir(case, gpus_per_node=None), monkeypatch, "1")
    three = _outcome(lambda: scan_dump_dir(case, gpus_per_node=None), monkeypatch, "3")
    assert three == one


@pytest.mark.parametrize(
    "case", [p for p in _case_dirs() if any(p.rglob("*rank*"))], ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_fr_read_with_workers_equals_the_sequential_read(case: Path, monkeypatch) -> None:
    one = _outcome(lambda: read_fr_dir_noted(case), monkeypatch, "1")
    three = _outcome(lambda: read_fr_dir_noted(case), monkeypatch, "3")
    assert three == one


def test_synthetic_jobs_read_alike(tmp_path: Path, monkeypatch) -> None:
    from rankscope.harness.synthetic import generate_job
    from rankscope.harness.synthetic_fr import generate_fr

    job = generate_job("tp=2,pp=2,dp=4", gpus_per_node=4, fault="compute-hang", seed=3, dataloader_workers=1)
    job.write_dir(tmp_path / "stacks", fmt="mixed")
    one = _outcome(lambda: scan_dump_dir(tmp_path / "stacks", gpus_per_node=4), monkeypatch, "1")
    three = _outcome(lambda: scan_dump_dir(tmp_path / "stacks", gpus_per_node=4), monkeypatch, "3")
    assert isinstance(one, tuple) is False and three == one and len(one.files) > 16
    generate_fr("tp=2,pp=2,dp=4", fault="missing", seed=1, steps=2, dumped_after_s=660.0).write(tmp_path / "fr")
    good = sorted((tmp_path / "fr").iterdir())
    (tmp_path / "fr" / "nccl_trace_rank_99").write_bytes(good[0].read_bytes()[:3000])  # truncated: a note
    one = _outcome(lambda: read_fr_dir_noted(tmp_path / "fr"), monkeypatch, "1")
    three = _outcome(lambda: read_fr_dir_noted(tmp_path / "fr"), monkeypatch, "3")
    assert three == one and len(one[0]) == len(good) and "rank_99" in one[1][0]


def test_a_fork_that_fails_is_read_here(monkeypatch) -> None:
    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(forked.os, "fork", no_fork)
    parts = forked.chunks(list(range(30)), 3)
    out = forked.map_chunks(parts, lambda p: (list(p), os.getpid()))
    assert [x for p, _ in out for x in p] == list(range(30)) and {pid for _, pid in out} == {os.getpid()}


def test_a_stuck_child_is_killed_and_its_part_read_here(monkeypatch) -> None:
    import time

    monkeypatch.setattr(forked, "STUCK_AFTER_S", 0.5)

    def work(part):
        if os.getpid() != PARENT:
            time.sleep(60)  # a lock held by a thread of the parent at fork time
        return list(part)

    t = time.monotonic()
    out = forked.map_chunks(forked.chunks(list(range(10)), 2), work)
    assert [x for p in out for x in p] == list(range(10)) and time.monotonic() - t < 10
