"""Stacks of a job that was moving (progressing, or running when captured): fail-slow or healthy.

ByteRobust's fail-slow vote over the rounds (:mod:`rankscope.analytics.performance.failslow`) names the
rank the others keep waiting for; with too few rounds for a vote, step records that prove the job kept
moving (and, for one snapshot, that its steps slowed down) together with the same rank standing out in
every snapshot do. Otherwise the job is healthy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rankscope.analytics.performance.failslow import (
    MIN_FLAGS,
    Candidate,
    Degrader,
    RoundStates,
    StepEvidence,
    eviction_group,
    flag_round,
    vote,
)
from rankscope.analytics.stacks.duties import duty_ranks, duty_who, duty_words, main_process_duty
from rankscope.analytics.stacks.facts import StackFacts
from rankscope.analytics.stacks.motion import Motion
from rankscope.analytics.stacks.report import (
    common_fields,
    cover_words,
    culprits_first,
    details,
    problem_words,
    problems_of,
    round_states,
)
from rankscope.analytics.stacks.snapshot import SnapshotAnalysis
from rankscope.analytics.verdict import Evidence, Severity, Verdict, rank_ranges
from rankscope.datasets.domain.topology import Topology

VOTE_ROUNDS = 5
"""Rounds of stacks the fail-slow vote needs on its own (ByteRobust takes 5, 10 s apart); fewer when the
job's step records show it slowed down (then the question is only who slowed it)."""


def moving_verdict(facts: StackFacts, topology: Topology, m: Motion, job: str, steps: StepEvidence | None) -> Verdict:
    cfg, last = facts.config, facts.analyses[-1]
    rounds = [round_states(a, topology) for a in facts.analyses]
    reasons = list(m.reasons)
    common = common_fields(facts, topology, job, last)
    few = False  # a rank stood out, in too few rounds for the vote alone
    slowed = steps is not None and steps.progressing and steps.slowdown is not None
    v = (
        vote(
            rounds,
            topology,
            min_flag_fraction=cfg.min_flag_fraction,
            max_fraction=cfg.max_cover_fraction,
            min_flags=2 if slowed else MIN_FLAGS,  # the steps already say the job slowed: who, is the question
        )
        if len(rounds) >= 2
        else None
    )
    d = v.degrader if v is not None else None
    duty = ""
    if d is not None and not slowed:
        flagged = {s for s, f in d.per_round if not set(d.culprit_ranks).isdisjoint(f)}
        duty = main_process_duty(facts, d.culprit_ranks, flagged, duty_ranks(topology), any_rank=True)
    if duty and d is not None:
        reasons.append(duty_words(f"stood out in {d.flags} of {len(rounds)} rounds", duty, duty_who(d.culprit_ranks)))
        v, few = None, True
    one_stall = steps is not None and steps.progressing and steps.between_rounds is False and not slowed
    if v is not None and v.degrader is not None:
        if (len(rounds) >= VOTE_ROUNDS or slowed) and not one_stall:
            return _failslow(facts, topology, v.degrader, reasons, common, v.others)
        if not one_stall:  # too few rounds for the vote alone: a near miss, in words (one stall: said below)
            reasons.append(_too_few_rounds(v.degrader, len(rounds), topology))
        v, few = None, True
    if one_stall:
        reasons.append(
            f"No step completed between the {len(rounds)} rounds: they caught one stall several times (a single "
            "sample of the job), and the step times show no slowdown: no slow rank named."
        )
    if (
        steps is not None
        and steps.progressing
        and steps.source == "steps"  # the Flight Recorder's progress counts no steps: it names no slow rank
        # rounds that caught one stall (no step between them) are one sample: the steps must show a slowdown
        and ((len(rounds) >= 2 and steps.between_rounds is not False) or steps.slowdown is not None)
    ):
        named = _steps_and_stacks(facts, topology, rounds, steps, reasons, common)
        if named is not None:
            return named
    if v is not None:
        reasons.append(
            f"No rank stands out over the {len(rounds)} rounds (ByteRobust's fail-slow vote): none was a stack "
            f"outlier running its own code in {cfg.min_flag_fraction:.0%} of the rounds, clearly more often than "
            "its symmetric peers and than chance."
        )
        c = v.near_miss
        if c is not None and c.flags >= 2 and c.flags > c.peer_max:
            reasons.append(
                f"Closest: rank {c.rank} on {topology.node_of(c.rank)}, flagged in {c.flags} of {len(rounds)} rounds "
                f"(its symmetric peers at most {c.peer_max}); at this job's rate of busy outliers "
                f"{c.expected_by_chance:.2g} rank(s) would be flagged as often by chance. More rounds would tell."
            )
    hint = _hint(last, topology) if m.kind == "progressing" and len(rounds) == 1 else ""
    if hint:
        reasons.append(hint)
    reasons += problem_words(problems_of(facts))
    return Verdict(
        Severity.HEALTHY,
        confidence=0.5 if few else 0.7 if len(rounds) >= 2 else 0.6,
        reasons=tuple(reasons),
        details=details(facts, {"rounds": []}),
        **common,
    )


def _too_few_rounds(d: Degrader, n: int, topology: Topology) -> str:
    """Words for a rank the vote flagged in fewer rounds than it takes (``d``: the vote's degrader)."""
    r0 = d.culprit_ranks[0]
    return (
        f"Rank(s) {rank_ranges(d.culprit_ranks)} stood out in {d.flags} of {n} rounds, but {n} rounds are fewer "
        f"than the {VOTE_ROUNDS} ByteRobust's fail-slow vote takes: dumps taken one rank after another, or a phase "
        f"of the step every round caught alike, make a few rounds agree (rank {r0} on {topology.node_of(r0)}). "
        f"Take {VOTE_ROUNDS} rounds, or give the step times, before evicting."
    )


def _hint(a: SnapshotAnalysis, topology: Topology) -> str:
    """Words for a progressing job whose last snapshot shows a few ranks running their own code while most
    wait: one snapshot cannot tell a slow rank from the last one to finish its step."""
    flagged = np.flatnonzero(flag_round(round_states(a)))
    if flagged.size == 0 or flagged.size > 4 or a.blocked_fraction < 0.5:
        return ""
    return (
        f"Rank(s) {rank_ranges(flagged.tolist())} ran their own code while most ranks waited; one snapshot of a "
        "progressing job cannot tell a slow rank from the last one to finish its step: take several rounds "
        "(e.g. 5, 10 s apart) to check."
    )


def _steps_and_stacks(
    facts: StackFacts,
    topology: Topology,
    rounds: Sequence[RoundStates],
    steps: StepEvidence,
    reasons: list[str],
    common: dict[str, Any],
) -> Verdict | None:
    """Steps prove the job kept moving (and, with a single snapshot, that its steps slowed down); the stacks
    name the rank it waits on when the same rank(s) of one group ran their own code while most ranks waited
    in every snapshot. Too few rounds for the vote, enough together with the steps."""
    a = facts.analyses[-1]
    if a.blocked_fraction < 0.5:
        return None
    common_flags: np.ndarray | None = None
    for r in rounds:
        f = flag_round(r)
        common_flags = f if common_flags is None else common_flags & f
    flagged = np.flatnonzero(common_flags) if common_flags is not None else np.zeros(0, dtype=np.int64)
    if flagged.size == 0:
        return None
    group = eviction_group(flagged.tolist(), topology, max_fraction=facts.config.max_cover_fraction)
    if group is None or len(group.indices) != 1:
        return None
    culprit_ranks = tuple(int(x) for x in flagged)
    n = len(rounds)
    flagged_in = {r.snapshot for r in rounds}
    duty = (
        ""
        if steps.slowdown
        else main_process_duty(facts, culprit_ranks, flagged_in, duty_ranks(topology), any_rank=True)
    )
    if duty:
        how = f"ran its own code while most ranks waited in all {n} snapshot(s)"
        reasons.append(duty_words(how, duty, duty_who(culprit_ranks)))
        return None
    culprit_nodes = tuple(n for n in topology.nodes_of(culprit_ranks) if n in group.nodes)
    for rk in culprit_ranks[:5]:
        reasons.append(
            f"Rank {rk} on {topology.node_of(rk)} ran its own code ({a.state_of(rk)}) while most ranks waited, in "
            f"{'the snapshot' if n == 1 else f'all {n} snapshots'}: the rank the slow job waits on."
        )
    reasons.append(cover_words(group, "The slow rank's fault domain is"))
    reasons += problem_words(problems_of(facts))
    evidence: tuple[Evidence, ...] = tuple(
        Evidence(
            "stacks",
            "slow-rank",
            f"running its own code while most ranks wait, in {n} of {n} snapshot(s)",
            (rk,),
            (topology.node_of(rk),),
            0.6,
        )
        for rk in culprit_ranks
    )
    evidence += (Evidence("timings", "steps", "; ".join(steps.words)[:300], (), (), 0.6),)
    return Verdict(
        Severity.FAIL_SLOW,
        confidence=0.6,
        suspect_nodes=culprits_first(group.nodes, culprit_nodes),
        culprit_nodes=culprit_nodes,
        suspect_ranks=culprit_ranks,
        culprit_ranks=culprit_ranks,
        reasons=tuple(reasons),
        suspect_group=group,
        evidence=evidence,
        details=details(facts, {"rounds": [{"snapshot": r.snapshot, "flagged": list(culprit_ranks)} for r in rounds]}),
        **common,
    )


def _failslow(
    facts: StackFacts,
    topology: Topology,
    d: Degrader,
    reasons: list[str],
    common: dict[str, Any],
    others: Sequence[Candidate] = (),
) -> Verdict:
    culprit_nodes = tuple(n for n in topology.nodes_of(d.culprit_ranks) if n in d.nodes)
    for r in d.culprit_ranks[:5]:
        reasons.append(
            f"Rank {r} on {topology.node_of(r)} was a stack outlier running its own code (not waiting on anyone) "
            f"in {d.culprit_counts[r]} of {d.rounds} rounds; its symmetric peers (same slot in the other replicas) "
            f"at most {d.peer_counts.get(r, 0)}, and {d.p_values.get(r, 0.0):.2g} rank(s) of the job would be "
            "as often by chance: the others keep waiting for it (ByteRobust's fail-slow vote)."
        )
    reasons.append(cover_words(d.group, "The degrader is"))
    for c in others[:3]:
        reasons.append(
            f"Rank {c.rank} on {topology.node_of(c.rank)} stood out too ({c.flags} of {d.rounds} rounds), in an "
            "unrelated group: one fault domain is isolated at a time; check it after this one."
        )
    reasons += problem_words(problems_of(facts))
    members = set(d.ranks)
    suspect_ranks = tuple(
        sorted({r for a in facts.analyses for r in a.outlier_ranks if r in members} | set(d.culprit_ranks))
    )
    evidence = tuple(
        Evidence(
            "stacks",
            "slow-rank",
            f"a stack outlier running its own code in {d.culprit_counts[r]} of {d.rounds} rounds "
            f"(symmetric peers: at most {d.peer_counts.get(r, 0)})",
            (r,),
            (topology.node_of(r),),
            d.culprit_counts[r] / d.rounds,
        )
        for r in d.culprit_ranks
    )
    conf = 0.4 + 0.5 * d.flags / d.rounds + 0.05
    return Verdict(
        Severity.FAIL_SLOW,
        confidence=round(min(conf, 0.99), 3),
        suspect_nodes=culprits_first(d.nodes, culprit_nodes),
        culprit_nodes=culprit_nodes,
        suspect_ranks=suspect_ranks,
        culprit_ranks=d.culprit_ranks,
        reasons=tuple(reasons),
        suspect_group=d.group,
        evidence=evidence,
        details=details(facts, {"rounds": [{"snapshot": s, "flagged": list(f)} for s, f in d.per_round]}),
        **common,
    )
