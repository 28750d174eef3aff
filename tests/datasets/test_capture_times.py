"""Capture times read from round folders' names (``<host>/pyspy-20261202-055119/``): only where every trainer
dump carries exactly one stamp and the rounds' stamps rise with their order."""

from __future__ import annotations

import calendar

from rankscope.datasets.domain.stacks import ProcStacks
from rankscope.datasets.readers.capturefolders import folder_times


def _proc(rank: int, snapshot: int, source: str, role: str = "trainer") -> ProcStacks:
    return ProcStacks(snapshot, rank, "n0", role, 100 + rank, "ok", None, None, (), source, "pyspy-text")


def _t(*ymdhms: int) -> float:
    return float(calendar.timegm((*ymdhms, 0, 0, 0)))


def test_stamps_in_host_round_folders():
    procs = [_proc(r, k, f"host{r}/pyspy-2026120{2}-05511{k}/rank{r}.txt") for k in range(3) for r in range(2)] + [
        _proc(0, 0, "host0/dl/worker.txt", role="dataloader")
    ]
    assert folder_times(procs) == {k: _t(2026, 12, 2, 5, 51, 10 + k) for k in range(3)}


def test_iso_like_stamps_and_the_latest_host_counts():
    procs = [_proc(0, 0, "a/2026-12-02T05-51-10/r0.txt"), _proc(1, 0, "b/2026-12-02T05-51-12/r1.txt")]
    procs += [_proc(0, 1, "a/2026-12-02_05:52:10/r0.txt"), _proc(1, 1, "b/2026-12-02_05:52:11/r1.txt")]
    assert folder_times(procs) == {0: _t(2026, 12, 2, 5, 51, 12), 1: _t(2026, 12, 2, 5, 52, 11)}


def test_no_times_unless_every_round_has_its_own():
    one_stamp_for_all = [_proc(0, k, f"run-20261202-050000/round-{k}/rank0.txt") for k in range(2)]
    two_stamps = [_proc(0, k, f"run-20261202-050000/pyspy-20261202-05511{k}/rank0.txt") for k in range(2)]
    unstamped = [_proc(0, 0, "round-0/rank0.txt"), _proc(0, 1, "pyspy-20261202-055110/rank0.txt")]
    falling = [_proc(0, k, f"pyspy-20261202-05511{5 - k}/rank0.txt") for k in range(2)]
    no_date = [_proc(0, k, f"pyspy-2026-13-02T05-51-1{k}/rank0.txt") for k in range(2)]  # month 13
    for procs in (one_stamp_for_all, two_stamps, unstamped, falling, no_date):
        assert folder_times(procs) == {}, procs


def test_one_round_counts_only_as_a_capture_folder():
    """A single stamped snapshot is its capture time unless logs lie in the stamped folder too (a run folder
    named by the job's start, whose stamp says nothing of the capture)."""
    single = [_proc(r, 0, f"host{r}/pyspy-20261202-055110/rank{r}.txt") for r in range(2)]
    assert folder_times(single, {"host0/console.log": None}) == {0: _t(2026, 12, 2, 5, 51, 10)}
    run = [_proc(r, 0, f"run-20261202-050000/dumps/rank{r}.txt") for r in range(2)]
    assert folder_times(run, {"run-20261202-050000/train.log": _t(2026, 12, 2, 5, 0, 30)}) == {}
    assert folder_times(run, {"run-20261202-050000/train.log": None}) == {}
    copied_in = {"host0/pyspy-20261202-055110/console.log": _t(2026, 12, 2, 4, 10, 0)}  # logged before the stamp
    assert folder_times(single, copied_in) == {0: _t(2026, 12, 2, 5, 51, 10)}


def test_a_stamp_in_the_file_name_counts_too():
    """Per-host capture files named by time (``<host>/pyspy-20261202-063504.txt``, the host's ranks in one)."""
    procs = [_proc(r, k, f"host{r // 2}/pyspy-20261202-06350{4 + 2 * k}.txt") for k in range(2) for r in range(4)]
    assert folder_times(procs) == {0: _t(2026, 12, 2, 6, 35, 4), 1: _t(2026, 12, 2, 6, 35, 6)}
