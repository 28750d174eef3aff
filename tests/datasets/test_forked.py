"""Reading with forked workers returns what the sequential read returns, on every capture kept under tests/data,
and a worker that fails costs nothing: its batch is read again in the parent, raising what it raises."""

from __future__ import annotations

import os
import threading
import time
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


def test_map_batches_equals_the_loop_and_shares_batches_with_children(tmp_path) -> None:
    marker = tmp_path / "a-child-took-a-batch"

    def work(part):  # this process waits (10 s at most) until a child has a batch: a loaded machine forks slowly
        if os.getpid() != PARENT:
            marker.touch()
        else:
            deadline = time.monotonic() + 10
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return _slow(part)

    out = forked.map_batches(list(range(50)), work, workers=4, batch=3)
    assert [x for xs, _ in out for x in xs] == list(range(50)) and len(out) == 17
    pids = {pid for _, pid in out}
    # this process and at least one child took batches
    assert os.getpid() in pids and len(pids) >= 2, (pids, threading.active_count(), marker.exists())
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


def test_prepare_runs_while_the_children_read_and_they_never_wait_on_a_full_pipe() -> None:
    """``prepare`` (the dump directory's manifests) runs here after the fork, before this process takes a
    batch; the children go on reading meanwhile, keeping what their pipe cannot take yet (2 MiB of results
    against a 1 MiB pipe), so all of their batches finish before ``prepare`` does."""
    import time

    ran: list[float] = []

    def prepare() -> None:
        time.sleep(1.5)
        ran.append(time.monotonic())

    def work(part):
        time.sleep(0.01)
        return list(part), os.getpid(), time.monotonic(), b"x" * 200_000

    out = forked.map_batches(list(range(40)), work, workers=2, batch=4, prepare=prepare)
    assert [x for xs, *_ in out for x in xs] == list(range(40))
    theirs = [t for _, pid, t, _ in out if pid != os.getpid()]
    assert len(theirs) == 10 and max(theirs) < ran[0]  # the child read every batch while this process waited
    seq: list[str] = []
    assert forked.map_batches(
        [1, 2], lambda p: seq.append("work") or list(p), workers=1, batch=1, prepare=lambda: seq.append("prepare")
    ) == [[1, 2]]
    assert seq == ["prepare", "work"]


def test_an_error_in_prepare_is_raised_and_stops_the_children() -> None:
    import time

    def prepare() -> None:
        raise InputError("manifest.csv: line 3: rank 'x' is not a non-negative integer")

    t = time.monotonic()
    with pytest.raises(InputError, match="manifest.csv: line 3"):
        forked.map_batches(list(range(40)), lambda p: time.sleep(0.3) or list(p), workers=2, batch=1, prepare=prepare)
    assert time.monotonic() - t < 2  # the queue holds 12 s of work: the child was stopped, not waited for
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # and reaped


def test_manifests_read_beside_the_workers_apply_as_before(tmp_path: Path, monkeypatch) -> None:
    """The workers read without the manifests (read meanwhile): a manifest's rows, its unlisted files and a
    hook-named file it lists come out as in a sequential read (real py-spy dumps of the gloo job)."""
    from rankscope.datasets.readers import dumpdir

    dumps = sorted((DATA / "stacks" / "healthy_gloo_pyspy_3rounds" / "snapshot-0").glob("rank*.txt"))
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "pid4242.stack.txt").write_bytes(dumps[0].read_bytes())  # named like the hook's
    (tmp_path / "snap" / "other.txt").write_bytes(dumps[1].read_bytes())  # in the manifest's folder, unlisted
    for k in range(30):  # enough files for batches to be shared
        (tmp_path / f"rank{k + 2}.txt").write_bytes(dumps[1].read_bytes())
    (tmp_path / "snap" / "manifest.csv").write_text("file,rank,node\npid4242.stack.txt,0,gpu-a\n")
    monkeypatch.setattr(dumpdir, "BATCH", 2)
    one = _outcome(lambda: scan_dump_dir(tmp_path, gpus_per_node=8), monkeypatch, "1")
    three = _outcome(lambda: scan_dump_dir(tmp_path, gpus_per_node=8), monkeypatch, "3")
    assert three == one
    listed = [f for f in one.files if f.path == "snap/pid4242.stack.txt"]
    assert [(f.rank, f.node) for f in listed] == [(0, "gpu-a")]
    assert not any(f.path == "snap/other.txt" for f in one.files)
    assert any("not in manifest.csv" in n and "snap/other.txt" in n for n in one.notes)
