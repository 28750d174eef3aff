"""Watchdog lines that name no process group (torch before 2.3): one stall of most of the world is the job's group;
anything else stays unknown (a subgroup's members cannot be told from the lines)."""

from __future__ import annotations

from rankscope.analytics.logs.facts import stalls
from rankscope.datasets.domain.logs import LogEvidence, WatchdogRecord


def _timeouts(works: dict[int, tuple[int, str]]) -> LogEvidence:
    recs = tuple(WatchdogRecord("timeout", r, "h", None, seq=seq, op=op) for r, (seq, op) in works.items())
    return LogEvidence(watchdog=recs)


def test_one_work_most_of_the_world_times_out_in_is_the_world_s_group():
    (s,) = stalls(_timeouts({r: (1121, "ALLREDUCE") for r in range(16) if r != 5}), None, 16)
    assert s.seq == 1121 and s.silent == (5,) and s.members == tuple(range(16))


def test_two_works_or_a_minority_of_the_world_stay_unknown():
    two = {r: (1121 if r % 2 else 77, "ALLREDUCE" if r % 2 else "ALLGATHER") for r in range(15)}
    assert stalls(_timeouts(two), None, 16) == []
    few = dict.fromkeys(range(7), (1121, "ALLREDUCE"))  # 7 of 16: a subgroup, its members unknown
    assert stalls(_timeouts(few), None, 16) == []
