"""Words and fields every stack verdict shares: cluster summaries, collection problems, fault-domain words."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rankscope.analytics.faultdomain import intra_stage_kind
from rankscope.analytics.performance.failslow import RoundStates
from rankscope.analytics.stacks.clustering import Cluster
from rankscope.analytics.stacks.collection import CaptureProblem
from rankscope.analytics.stacks.facts import StackFacts
from rankscope.analytics.stacks.frames import OWN_WORK_STATES
from rankscope.analytics.stacks.snapshot import STATE_CODE, SnapshotAnalysis
from rankscope.analytics.verdict import ClusterSummary, SuspectGroup, rank_ranges
from rankscope.datasets.domain.topology import Topology

_OWN_CODES = np.array([STATE_CODE[s] for s in OWN_WORK_STATES], dtype=np.int8)


def summaries(
    clusters: Sequence[Cluster], topology: Topology, snapshot: int, limit: int = 50
) -> tuple[ClusterSummary, ...]:
    out = []
    world = topology.world_size
    for c in clusters[:limit]:
        nodes = topology.nodes_of([r for r in c.ranks if r < world]) if c.ranks else ()
        out.append(
            ClusterSummary(c.id, c.role, c.size, c.ranks, len(nodes), c.healthy, c.state, c.representative, snapshot)
        )
    return tuple(out)


def missing_summary(a: SnapshotAnalysis, topology: Topology, next_id: int) -> tuple[ClusterSummary, ...]:
    if not a.missing_ranks:
        return ()
    return (
        ClusterSummary(
            next_id,
            "trainer",
            len(a.missing_ranks),
            a.missing_ranks,
            len(topology.nodes_of(a.missing_ranks)),
            False,
            "missing",
            ("(no dump)",),
            a.snapshot,
        ),
    )


def dominant_words(a: SnapshotAnalysis) -> str:
    healthy = [c for c in a.clusters if c.healthy and c.role == "trainer"]
    if not healthy:
        return "no dominant stack"
    top = healthy[0]
    more = f" (+{len(healthy) - 1} more healthy cluster(s))" if len(healthy) > 1 else ""
    return f"{top.state} in {top.state_frame}{more}"


def round_states(a: SnapshotAnalysis, topology: Topology | None = None) -> RoundStates:
    """One snapshot as a round of the fail-slow vote: per rank, whether it runs its own code, whether its stack is
    an outlier (not in a dominant cluster) and, with the ``topology``, whether every other member of its tightest
    group inside a stage (TP, else CP, EP, else DP) waits in a collective: that group waits for it, whatever other
    groups of the job run (a healthy pipeline has whole TP groups in the same forward)."""
    healthy = np.zeros(a.states.size, dtype=bool)
    for c in a.clusters:
        if c.role == "trainer" and c.healthy and c.ranks:
            r = np.asarray(c.ranks, dtype=np.int64)
            healthy[r[r < healthy.size]] = True
    has = a.states >= 0
    known = topology is not None and topology.world_size == a.states.size
    laggard = group_laggards(a.states, topology) if topology is not None and known else None
    return RoundStates(a.snapshot, np.isin(a.states, _OWN_CODES), has & ~healthy, has, a.blocked_fraction, laggard)


def group_laggards(states: np.ndarray, topology: Topology) -> np.ndarray:
    """Per rank: whether every other member of its tightest group inside a stage waits in a collective while it
    does not (the rank its group waits for). Without TP, CP or EP that group is its data-parallel group (in a
    stage): FSDP's shard group all-gathers every layer's weights, and waits there for its slowest member. Rank 0
    is left out of that group's tally: it is the last of its data-parallel group by design (logging, evaluation,
    checkpoints), caught in model compute as often as not."""
    kind = intra_stage_kind(topology)
    dp_fallback = kind is None and topology.sizes["dp"] > 1
    kind = "dp" if dp_fallback else kind
    if kind is None:
        return np.zeros(states.size, dtype=bool)
    _, gid = np.unique(topology.group_ids(kind), return_inverse=True)
    members = np.bincount(gid)
    waiting = np.bincount(gid, weights=states == STATE_CODE["collective"]).astype(np.int64)
    me = (states == STATE_CODE["collective"]).astype(np.int64)
    out = (members[gid] > 1) & (me == 0) & (waiting[gid] == members[gid] - 1)
    if dp_fallback:  # rank 0 is the last of a data-parallel group by design (it logs, evaluates, saves)
        out[0] = False
    return out


def problems_of(facts: StackFacts) -> list[CaptureProblem]:
    """The last snapshot's captures that gave no evidence (each rank once)."""
    return list(facts.analyses[-1].problems) if facts.analyses else []


def problem_words(problems: Sequence[CaptureProblem], limit: int = 5) -> list[str]:
    if not problems:
        return []
    out = [
        f"Collection problems: {len(problems)} capture(s) gave no evidence (not clustered, never a suspect on "
        "their own):"
    ]
    out += [f"  {p.line()}" for p in problems[:limit]]
    if len(problems) > limit:
        rest = rank_ranges(p.rank for p in problems[limit:] if p.rank is not None)
        out.append(f"  ... and {len(problems) - limit} more: {rest[:200]}")
    return out


def problem_details(problems: Sequence[CaptureProblem], limit: int) -> list[dict[str, Any]]:
    return [
        {"rank": p.rank, "role": p.role, "kind": p.kind, "detail": p.detail, "advice": p.advice, "source": p.source}
        for p in problems[:limit]
    ]


def common_fields(facts: StackFacts, topology: Topology, job: str, a: SnapshotAnalysis) -> dict[str, Any]:
    clusters = summaries(a.clusters, topology, a.snapshot, facts.limits.max_reported_clusters)
    clusters += missing_summary(a, topology, len(a.clusters))
    return dict(
        job=job, clusters=clusters, world_size=topology.world_size, n_snapshots=facts.n_snapshots, sources=("stacks",)
    )


def details(facts: StackFacts, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    d: dict[str, Any] = dict(extra or {})
    probs = problems_of(facts)
    if probs:
        d["collection_problems"] = problem_details(probs, facts.limits.max_evidence_items)
    if facts.progress is not None:
        d["progress"] = {"released": list(facts.progress.released), "waiting": list(facts.progress.waiters)}
    return d


def culprits_first(nodes: Sequence[str], culprit_nodes: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*[n for n in culprit_nodes if n in nodes], *nodes]))


def blind_wait_words(blind: Sequence[int], nodes: Sequence[str]) -> str:
    """Every outlier waits on someone, and some ranks gave no stack: the waits may end at them."""
    return (
        f"Every outlier waits on someone, and rank(s) {rank_ranges(blind)[:200]} on {', '.join(nodes[:5])} gave no "
        "stack (their capture failed, see below): the waits may end there, where no stack shows it. A failed "
        "capture names no machine, and the waiters are not evicted in its place: capture those ranks again."
    )


def cover_words(group: SuspectGroup, subject: str = "The outliers are") -> str:
    if group.kind == "node" and len(group.nodes) == 1:
        where = "all on" if subject.endswith(" are") else "on"
        return f"{subject} {where} {group.nodes[0]}: that machine is the fault domain."
    if group.kind == "node":
        return (
            f"No parallel group is a small enough fault domain (or the layout has none): isolate the "
            f"{len(group.nodes)} nodes themselves."
        )
    idx = ",".join(map(str, group.indices[:10])) + ("..." if len(group.indices) > 10 else "")
    return (
        f"{subject} covered by {len(group.indices)} {group.kind.upper()} group(s) [{idx}] on "
        f"{len(group.nodes)} node(s): isolate them whole (the parallel group is the fault domain)."
    )
