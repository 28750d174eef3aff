"""Flight Recorder analysis -> :class:`~rankscope.analytics.verdict.Verdict`.

A hang with culprits (the ranks the wait-for chain ends at: missing dumps, ranks that never started the
stopped collective) isolates only the culprits' nodes; one whose stopped collective every member entered
and none finished (no culprit to tell: the fault is inside it) isolates that collective's members' nodes.
A mismatch names ranks but no node: it is a code/config fault.
"""

from __future__ import annotations

from typing import Any

from rankscope.analytics.collectives.result import CollectiveAnalysis
from rankscope.analytics.faultdomain import node_lookup
from rankscope.analytics.verdict import (
    Severity,
    SuspectGroup,
    Verdict,
    merge_nodes,
    rank_ranges,
)
from rankscope.datasets.domain.topology import Topology

MODEL_PARALLEL = ("tp", "cp", "ep", "pp", "mp")


def verdict(analysis: CollectiveAnalysis, topology: Topology | None, *, job: str = "") -> Verdict:
    """The verdict the Flight Recorder evidence alone supports (source ``flight_recorder``)."""
    a = analysis
    details = {"flight_recorder": {k: v for k, v in a.to_dict().items() if k not in ("evidence", "reasons")}}
    common: dict[str, Any] = dict(
        job=job,
        confidence=round(min(max(a.confidence, 0.0), 1.0), 3),
        reasons=a.reasons,
        evidence=a.evidence,
        sources=("flight_recorder",),
        world_size=a.world_size,
        details=details,
    )
    nodes = node_lookup(topology)
    if a.status == "mismatch":
        ranks = a.mismatch_ranks
        return Verdict(Severity.MISMATCH, suspect_ranks=ranks, culprit_ranks=ranks, **common)
    if a.status in ("healthy", "inconclusive"):
        return Verdict(a.status, suspect_ranks=a.missing_ranks, **common)
    if a.status == "fail-slow":
        n = nodes(a.slow_ranks)
        group = SuspectGroup("node", (), a.slow_ranks, n) if n else None
        return Verdict(
            Severity.FAIL_SLOW,
            suspect_nodes=n,
            culprit_nodes=n,
            suspect_ranks=a.slow_ranks,
            culprit_ranks=a.slow_ranks,
            suspect_group=group,
            **common,
        )
    # hang
    premise = _before_timeout(a)  # overdue against the job's rhythm, not yet its own timeout: a pause looks alike
    culprits = a.culprit_ranks
    if culprits:  # the wait-for chain ends at them: their machines, never their healthy peers' (precision first)
        suspect_ranks = culprits
        kind = "node"
    else:  # a collective every member entered but none finished: its members are the domain
        suspect_ranks = a.stopped_members
        kind = a.stopped_kind if a.stopped_kind in MODEL_PARALLEL else "node"
    culprit_nodes = nodes(culprits)
    suspect_nodes = merge_nodes(nodes(suspect_ranks), culprit_nodes)
    group = None
    if suspect_nodes:
        indices: tuple[int, ...] = ()
        if kind != "node" and topology is not None:
            gid = topology.group_ids(kind)
            indices = tuple(sorted({int(gid[r]) for r in (culprits or suspect_ranks) if r < topology.world_size}))
            if not culprits and a.stopped_index >= 0:
                indices = (a.stopped_index,)
        group = SuspectGroup(kind, indices, suspect_ranks, suspect_nodes)
    reasons = a.reasons
    if premise:
        te = a.time_evidence
        common["details"] = {**details, "stuck_on_premise": True}
        reasons = reasons + (
            f"The waits ({te['oldest_wait_seconds']:.3g} s at most) are overdue against this job's own rhythm but "
            f"younger than its collective timeout ({te['timeout_seconds']:.3g} s), in one capture: a long pause on "
            "the rank waited for (a checkpoint, an evaluation) looks alike. A second capture, or the logs' timeouts, "
            "confirm it.",
        )
    if culprits and suspect_nodes:
        act = "Once confirmed, isolate" if premise else "Isolate"
        reasons = reasons + (
            f"{act} {len(suspect_nodes)} node(s) ({_words(kind)}); culprit rank(s) "
            f"{rank_ranges(culprits)[:200]} on {', '.join(culprit_nodes[:8])}.",
        )
    return Verdict(
        Severity.HANG,
        suspect_nodes=suspect_nodes,
        culprit_nodes=culprit_nodes,
        suspect_ranks=suspect_ranks,
        culprit_ranks=culprits,
        suspect_group=group,
        **{**common, "reasons": reasons},
    )


def _before_timeout(a: CollectiveAnalysis) -> bool:
    """A hang whose oldest overdue wait is younger than the job's own collective timeout, from one capture (two
    captures that show no progress, or a dump the watchdog wrote on the timeout, are evidence enough)."""
    te = a.time_evidence
    age, timeout = te.get("oldest_wait_seconds"), te.get("timeout_seconds")
    return age is not None and timeout is not None and age < timeout and not a.progress


def _words(kind: str) -> str:
    if kind == "node":
        return "the culprits' own nodes: the ranks the wait-for chain ends at"
    return f"the stopped {kind.upper()} group, the fault domain"
