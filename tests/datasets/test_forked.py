"""Reading with forked workers returns what the sequential read returns, on every capture kept under tests/data,
and a worker that fails costs nothing: its batch is read again in the parent, raising what it raises."""

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


def _slow(part):
    import time

    time.sleep(0.01)  # long enough that the children start and take batches
    return list(part), os.getpid()


def test_batches_keep_order_and_cover_everything() -> None:
    items = list(range(1000))
    for size in (1, 7, 64, 5000):
        parts = forked.batches(items, size)
        assert [x for p in parts for x in p] == items and all(0 < len(p) <= size for p in parts)
    assert forked.batches([], 4) == []


def test_map_batches_equals_the_loop_and_shares_batches_with_children() -> None:
    out = forked.map_batches(list(range(50)), _slow, workers=4, batch=3)
    assert [x for xs, _ in out for x in xs] == list(range(50)) and len(out) == 17
    pids = {pid for _, pid in out}
    assert os.getpid() in pids and len(pids) >= 2  # this process and at least one child took batches
    assert forked.map_batches(list(range(5)), _slow, workers=1, batch=2) == [(list(range(5)), os.getpid())]


def test_a_failed_child_is_redone_here_and_raises_what_the_loop_raises() -> None:
    def work(part):
        if os.getpid() != PARENT and 7 in part:
            os._exit(3)  # killed mid-batch (the OOM killer, a signal)
        if 33 in part:
            raise InputError("file 33: corrupt")
        return _slow(part)[0]

    assert [x for p in forked.map_batches(list(range(20)), work, workers=3, batch=2) for x in p] == list(range(20))
    with pytest.raises(InputError, match="file 33: corrupt"):
        forked.map_batches(list(range(40)), work, workers=3, batch=2)


def test_the_first_error_in_file_order_is_raised_whoever_met_it() -> None:
    def work(part):
        bad = [x for x in part if x in (13, 37)]
        if bad:
            raise InputError(f"file {bad[0]}: corrupt")
        return _slow(part)[0]

    for _ in range(3):
        with pytest.raises(InputError, match="file 13: corrupt"):
            forked.map_batches(list(range(60)), work, workers=3, batch=2)


def test_a_result_that_does_not_decode_is_redone_here() -> None:
    calls = []

    def decode(data):
        calls.append(data)
        raise ValueError("bad")

    def work(part):
        return sum(_slow(part)[0])

    out = forked.map_batches(list(range(40)), work, workers=2, batch=4, encode=lambda r: r, decode=decode)
    assert out == [sum(range(i, i + 4)) for i in range(0, 40, 4)] and calls  # every child result refused


def test_progress_is_reported_over_all_items_once(monkeypatch) -> None:
    from rankscope.spine import progress, reporting_progress

    tasks = []

    class Task:
        def __init__(self, label, total):
            self.label, self.total, self.done, self.closed = label, total, 0, False
            tasks.append(self)

        def advance(self, n=1):
            self.done += n

        def close(self):
            self.closed = True

    def work(part):
        return list(progress(part, "inner")) and _slow(part)[0]

    with reporting_progress(Task):
        out = forked.map_batches(list(range(30)), work, workers=3, batch=4, label="reading")
    assert [x for p in out for x in p] == list(range(30))
    assert [(t.label, t.total, t.done, t.closed) for t in tasks] == [("reading", 30, 30, True)]


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
    out = forked.map_batches(list(range(30)), _slow, workers=3, batch=4)
    assert [x for p, _ in out for x in p] == list(range(30)) and {pid for _, pid in out} == {os.getpid()}


def test_a_stuck_child_is_killed_and_its_part_read_here(monkeypatch) -> None:
    import time

    monkeypatch.setattr(forked, "STUCK_AFTER_S", 0.5)

    def work(part):
        time.sleep(60 if os.getpid() != PARENT else 0.02)  # a lock held by a thread of the parent at fork time
        return list(part)

    t = time.monotonic()
    out = forked.map_batches(list(range(10)), work, workers=2, batch=1)
    assert [x for p in out for x in p] == list(range(10)) and 0.5 <= time.monotonic() - t < 10


def test_an_error_stops_the_read_at_once_wherever_it_is_met() -> None:
    """The first batch raises (in this process or a child): nothing after it in file order matters, so the
    read stops there instead of finishing the queue (the sequential loop raises at once too)."""
    import time

    def work(part):
        if 0 in part:
            raise InputError("file 0: corrupt")
        time.sleep(0.3)
        return list(part)

    for _ in range(2):
        t = time.monotonic()
        with pytest.raises(InputError, match="file 0: corrupt"):
            forked.map_batches(list(range(40)), work, workers=2, batch=2)
        assert time.monotonic() - t < 2  # the queue holds 6 s of work


def test_no_more_children_than_batches(monkeypatch) -> None:
    forks = []
    real = forked.os.fork

    def counted() -> int:
        pid = real()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(forked.os, "fork", counted)
    out = forked.map_batches(list(range(4)), _slow, workers=8, batch=2)
    assert [x for p, _ in out for x in p] == list(range(4)) and len(forks) == 1


def test_a_queue_its_pipe_cannot_hold_is_read_here_without_waiting(monkeypatch) -> None:
    """A pipe smaller than the queue (a user past its pipe pages gets 8 KiB pipes) takes a short write: the
    read goes on here, in one process, instead of waiting on a reader that is this very process."""
    real, calls = forked.os.write, []

    def no_fork() -> int:
        raise AssertionError("forked although the queue could not be written")

    def short(fd: int, data) -> int:
        if not calls:  # the queue's write: the pipe took 4 bytes of it
            calls.append(fd)
            return real(fd, bytes(data[:4]))
        return real(fd, data)

    monkeypatch.setattr(forked.os, "write", short)
    monkeypatch.setattr(forked.os, "fork", no_fork)
    out = forked.map_batches(list(range(30)), _slow, workers=3, batch=4)
    assert [x for p, _ in out for x in p] == list(range(30)) and calls
