"""Process groups from watchdog lines: lines that name no group (torch before 2.3) are the job's group only as one
stall of most of the world; members timing out in different collectives at one work are a desync."""

from __future__ import annotations

from rankscope.analytics.logs import LogFacts
from rankscope.analytics.logs.facts import stalls
from rankscope.analytics.logs.verdict import verdict
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


def test_members_timing_out_in_different_collectives_at_one_work_are_a_desync_not_a_machine():
    """An outside tester's 16 ranks: 15 time out in ALLREDUCE work 1121, rank 7 in BROADCAST at the same work (its
    code took another path). It was inconclusive with the mismatch, the main clue, left out."""
    recs = tuple(
        WatchdogRecord("timeout", r, "h", 100.0, pg_id="0", pg_desc="default_pg", seq=1121,
                       op="BROADCAST" if r == 7 else "ALLREDUCE", timeout_ms=600000)
        for r in range(16)
    )  # fmt: skip
    (s,) = stalls(LogEvidence(watchdog=recs), None, 16)
    assert s.ops == (("ALLREDUCE", tuple(r for r in range(16) if r != 7)), ("BROADCAST", (7,)))
    f = LogFacts((s,), (), (), 16, (), (), 100.0, None, False, 0, 16)
    v = verdict(f, None)
    assert v.verdict == "mismatch" and not v.suspect_nodes and v.suspect_ranks == (7,), v.explain()
    assert "rank(s) 7 in BROADCAST" in v.reasons[0]


def test_a_pipeline_link_s_two_ends_in_send_and_recv_are_no_desync():
    recs = tuple(
        WatchdogRecord("timeout", r, "h", 100.0, pg_id="7", pg_rank=i, seq=31, op=op, timeout_ms=600000)
        for i, (r, op) in enumerate(((0, "SEND"), (8, "RECV")))
    )
    (s,) = stalls(LogEvidence(watchdog=recs), None, 16)
    assert s.ops == ()
