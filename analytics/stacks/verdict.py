"""Stacks -> Verdict: hang localization, progress detection and fail-slow voting.

Decision procedure:

1. Split processes by snapshot; with several snapshots, decide whether the job progresses.
2. Not progressing (or one snapshot): analyze the last snapshot as a hang. Outliers -> the
   smallest covering set of parallel groups (suspect nodes) -> culprit ranks inside it.
   No outlier -> ``healthy``; outliers on most nodes or most dumps missing -> ``inconclusive``.
3. Progressing: run every snapshot as a fail-slow round; a group flagged in at least
   ``min_flag_fraction`` of the rounds is the degrader (``fail-slow``), else ``healthy``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rankscope.analytics.faultdomain import cover
from rankscope.analytics.performance.failslow import Degrader, degrader
from rankscope.analytics.stacks.clustering import Cluster
from rankscope.analytics.stacks.culprits import culprits
from rankscope.analytics.stacks.facts import Progress, StackFacts
from rankscope.analytics.stacks.prefix_tree import build
from rankscope.analytics.stacks.snapshot import SnapshotAnalysis
from rankscope.analytics.verdict import (
    ClusterSummary,
    Evidence,
    Severity,
    SuspectGroup,
    Verdict,
    rank_ranges,
)
from rankscope.config import Limits, StackConfig
from rankscope.datasets.domain.topology import Topology


def _summaries(
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


def _missing_summary(a: SnapshotAnalysis, topology: Topology, next_id: int) -> tuple[ClusterSummary, ...]:
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


def _dominant_words(a: SnapshotAnalysis) -> str:
    healthy = [c for c in a.clusters if c.healthy and c.role == "trainer"]
    if not healthy:
        return "no dominant stack"
    top = healthy[0]
    more = f" (+{len(healthy) - 1} more healthy cluster(s))" if len(healthy) > 1 else ""
    return f"{top.state} in {top.state_frame}{more}"


def verdict(facts: StackFacts, topology: Topology, *, job: str = "") -> Verdict:
    """The stack-only verdict: a hang (or no fault) for a job that does not progress, fail-slow rounds for
    one that does."""
    if facts.progress is not None and facts.progress.progressing:
        return _failslow_verdict(facts.analyses, topology, facts.progress, job, facts.config, facts.limits)
    if not facts.analyses:
        return Verdict(
            Severity.INCONCLUSIVE,
            job=job,
            confidence=0.0,
            reasons=("no stack dumps",),
            world_size=topology.world_size,
            sources=("stacks",),
        )
    return _hang_verdict(
        facts.analyses[-1], topology, facts.progress, job, facts.config, facts.limits, facts.n_snapshots
    )


@dataclass
class _Hang:
    """One snapshot of a job that does not progress, and the words and fields every outcome shares."""

    a: SnapshotAnalysis
    topology: Topology
    cfg: StackConfig
    limits: Limits
    reasons: list[str]
    details: dict[str, Any]
    common: dict[str, Any]

    def verdict(self, kind: Severity, confidence: float, **fields: Any) -> Verdict:
        return Verdict(
            kind, confidence=confidence, reasons=tuple(self.reasons), details=self.details, **fields, **self.common
        )

    def evidence(self, culprit_ranks: Sequence[int] = ()) -> tuple[Evidence, ...]:
        return _evidence(self.a, self.topology, culprit_ranks, self.limits.max_evidence_items)


def _hang_verdict(
    a: SnapshotAnalysis,
    topology: Topology,
    prog: Progress | None,
    job: str,
    cfg: StackConfig,
    limits: Limits,
    n_snaps: int,
) -> Verdict:
    """The first classifier that applies decides: too little evidence, no outlier, or the outliers localized."""
    clusters = _summaries(a.clusters, topology, a.snapshot, limits.max_reported_clusters)
    clusters += _missing_summary(a, topology, len(a.clusters))
    tree = build([c for c in a.clusters if c.role == "trainer"])
    h = _Hang(
        a,
        topology,
        cfg,
        limits,
        [],
        {"prefix_tree": tree.to_dict()[:200], "dominant_fraction": round(a.dominant_fraction, 4)},
        dict(job=job, clusters=clusters, world_size=topology.world_size, n_snapshots=n_snaps, sources=("stacks",)),
    )
    if prog is not None:
        h.reasons.append(
            f"{prog.n_snapshots} snapshots: {prog.changed} of {prog.compared} rank stacks changed "
            f"between snapshots ({prog.fraction_changed:.0%}), so the job is not progressing."
        )
    return _too_little(h) or _no_outlier(h) or _localized(h)


def _too_little(h: _Hang) -> Verdict | None:
    """No trainer dump at all, or too many ranks without one: inconclusive."""
    a, total = h.a, h.topology.world_size
    if a.n_trainers == 0:
        h.reasons.append("no trainer stack dumps")
        return h.verdict(Severity.INCONCLUSIVE, 0.0)
    if len(a.missing_ranks) > h.cfg.max_missing_fraction * total:
        h.reasons.append(
            f"dumps are missing for {len(a.missing_ranks)} of {total} ranks "
            f"({rank_ranges(a.missing_ranks)[:200]}): too few to localize; check the layout "
            "(--layout, --gpus-per-node) and that every node's dumps were collected."
        )
        return h.verdict(Severity.INCONCLUSIVE, 0.2)
    return None


def _no_outlier(h: _Hang) -> Verdict | None:
    """Every rank with a stack looks healthy: healthy, or inconclusive when some ranks left no usable stack."""
    a = h.a
    h.reasons.append(
        f"{a.healthy_trainers} of {h.topology.world_size} ranks share the dominant stack(s): {_dominant_words(a)}."
    )
    if a.outlier_ranks:
        return None
    if a.cut:
        # a rank killed outright (OOM, SIGKILL) leaves no dump while the others wait in the collective it
        # never joined: that looks healthy. The ranks without a usable stack are where to look.
        h.reasons.append(
            f"No outlier among the ranks with a stack, but {len(a.cut)} rank(s) left no usable stack "
            f"(cut off or never written as they stopped): {rank_ranges(a.cut)[:200]}. If the job was "
            "stuck, look at them first (killed outright? the kernel log, the exit records)."
        )
        return h.verdict(Severity.INCONCLUSIVE, 0.3, suspect_ranks=a.cut, evidence=h.evidence())
    h.reasons.append(
        "No outlier: every rank is in a healthy state. If the job is stuck, the cause is not "
        "visible as a machine-specific stack (all ranks wait alike); take several snapshots "
        "to tell a hang from progress, and check the network and the Flight Recorder."
    )
    return h.verdict(Severity.HEALTHY, round(min(0.5 + 0.4 * a.dominant_fraction, 0.95), 3))


def _localized(h: _Hang) -> Verdict:
    """Outliers mapped onto a fault domain (hang) with their likeliest culprits, or spread too wide (inconclusive)."""
    a, topology = h.a, h.topology
    n_out_clusters = sum(1 for c in h.common["clusters"] if not c.healthy)
    h.reasons.append(
        f"{len(a.outlier_ranks)} outlier rank(s) in {n_out_clusters} cluster(s): {rank_ranges(a.outlier_ranks)[:300]}."
    )
    group = cover(a.outlier_ranks, topology, max_fraction=h.cfg.max_cover_fraction)
    if group is None:
        h.reasons.append("The outliers are spread over most of the job's nodes: no single fault domain to isolate.")
        return h.verdict(Severity.INCONCLUSIVE, 0.25, suspect_ranks=a.outlier_ranks, evidence=h.evidence())
    culprit_ranks, strong = culprits(a, topology)
    suspects = set(group.nodes)
    culprit_nodes = tuple(n for n in topology.nodes_of(culprit_ranks) if n in suspects)
    h.reasons.append(_cover_words(group))
    best = a.best()
    for r in culprit_ranks[:5]:
        f = best.get(r)
        if f is not None:
            h.reasons.append(f"Culprit rank {r} on {topology.node_of(r)}: {f.detail}.")
    if len(culprit_ranks) > 5:
        h.reasons.append(f"... and {len(culprit_ranks) - 5} more culprit rank(s): {rank_ranges(culprit_ranks)[:200]}.")
    if not strong and culprit_ranks:
        h.reasons.append(
            "Every outlier is waiting on someone else; the culprit above is the likeliest origin "
            "of the wait (weak evidence: isolate the whole suspect group)."
        )
    conf = 0.35 + 0.3 * a.dominant_fraction + (0.2 if strong else 0.05)
    conf += 0.1 if group.kind != "node" and len(group.indices) == 1 else 0.05
    if any(c.state == "failed" for c in a.clusters):
        conf -= 0.05
    return h.verdict(
        Severity.HANG,
        round(max(0.05, min(conf, 0.99)), 3),
        suspect_nodes=group.nodes,
        culprit_nodes=culprit_nodes,
        suspect_ranks=a.outlier_ranks,
        culprit_ranks=tuple(culprit_ranks),
        suspect_group=group,
        evidence=h.evidence(culprit_ranks),
    )


def _cover_words(group: SuspectGroup, subject: str = "The outliers are") -> str:
    if group.kind == "node" and len(group.nodes) == 1:
        return f"{subject} all on {group.nodes[0]}: that machine is the fault domain."
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


def _evidence(
    a: SnapshotAnalysis, topology: Topology, culprit_ranks: Sequence[int], limit: int = 100
) -> tuple[Evidence, ...]:
    first = set(culprit_ranks)
    ordered = sorted(a.findings, key=lambda f: (f.rank not in first, -f.score, f.rank))
    out = []
    for f in ordered[:limit]:
        out.append(Evidence("stacks", f.kind, f.detail, (f.rank,), (topology.node_of(f.rank),), f.score))
    for r, words in a.thread_notes[:limit]:
        out.append(Evidence("stacks", "other-thread", words, (r,), (topology.node_of(r),), 0.3))
    if a.cut:
        out.append(
            Evidence(
                "stacks",
                "dump-cut-off",
                "stack dump cut off or never written as the process was "
                "stopped (no frame, or no main thread): no evidence either way",
                a.cut,
                (),
                0.0,
            )
        )
    if len(ordered) > limit:
        rest = ordered[limit:]
        out.append(
            Evidence("stacks", "more-outliers", f"{len(rest)} more outlier ranks", tuple(f.rank for f in rest), (), 0.0)
        )
    return tuple(out)


def _failslow_verdict(
    rounds: Sequence[SnapshotAnalysis], topology: Topology, prog: Progress, job: str, cfg: StackConfig, limits: Limits
) -> Verdict:
    reasons = [
        f"{prog.n_snapshots} snapshots: {prog.changed} of {prog.compared} rank stacks changed between "
        f"snapshots ({prog.fraction_changed:.0%}), so the job progresses (not a hang)."
    ]
    last = rounds[-1]
    clusters = _summaries(last.clusters, topology, last.snapshot, limits.max_reported_clusters)
    common: dict[str, Any] = dict(
        job=job, clusters=clusters, world_size=topology.world_size, n_snapshots=len(rounds), sources=("stacks",)
    )
    min_votes = max(1, math.ceil(cfg.min_flag_fraction * len(rounds)))
    d: Degrader | None = degrader(rounds, topology, min_votes=min_votes)
    if d is None or d.flags < min_votes:
        if d is not None:
            reasons.append(
                f"No group stands out: the most flagged ({d.group.kind.upper()} group "
                f"{d.group.indices[0]}) was flagged in {d.flags} of {d.rounds} rounds."
            )
        else:
            reasons.append("No outlier in any round.")
        return Verdict(
            Severity.HEALTHY, confidence=0.7, reasons=tuple(reasons), details={"rounds": _rounds_dict(d)}, **common
        )
    culprit_nodes = tuple(n for n in topology.nodes_of(d.culprit_ranks) if n in d.nodes) if d.culprit_ranks else ()
    if d.voted is not None and d.flags >= min_votes:
        vk, vg = d.voted
        what = f"node {topology.node_names[vg]}" if vk == "node" else f"{vk.upper()} group {vg}"
        reasons.append(
            f"{what} held significantly more outlier ranks than chance in {d.flags} of {d.rounds} "
            "rounds (ByteRobust's fail-slow vote)."
        )
    for r in d.culprit_ranks[:5]:
        reasons.append(
            f"Rank {r} on {topology.node_of(r)} was running its own code (not waiting on anyone) in "
            f"{d.culprit_counts[r]} of {d.rounds} rounds, far more than chance: the others keep "
            "waiting for it."
        )
    reasons.append(_cover_words(d.group, "The degrader is"))
    suspect_ranks = tuple(
        sorted({r for a in rounds for r in a.outlier_ranks if r in set(d.ranks)} | set(d.culprit_ranks))
    )
    evidence = tuple(
        Evidence(
            "stacks",
            "slow-rank",
            f"not waiting in {d.culprit_counts[r]} of {d.rounds} rounds",
            (r,),
            (topology.node_of(r),),
            d.culprit_counts[r] / d.rounds,
        )
        for r in d.culprit_ranks
    )
    conf = 0.4 + 0.5 * d.flags / d.rounds + (0.05 if d.culprit_ranks else 0.0)
    return Verdict(
        Severity.FAIL_SLOW,
        confidence=round(min(conf, 0.99), 3),
        suspect_nodes=d.nodes,
        culprit_nodes=culprit_nodes,
        suspect_ranks=suspect_ranks,
        culprit_ranks=d.culprit_ranks,
        reasons=tuple(reasons),
        suspect_group=d.group,
        evidence=evidence,
        details={"rounds": _rounds_dict(d)},
        **common,
    )


def _rounds_dict(d: Degrader | None) -> list[dict[str, Any]]:
    if d is None:
        return []
    return [
        {"snapshot": f.snapshot, "kind": f.kind, "group": f.group, "n_outliers": f.n_outliers, "p_value": f.p_value}
        for f in d.per_round
    ]
