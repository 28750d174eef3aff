"""One snapshot's stack facts: clusters of every role, the outlier ranks, and why each is suspect.

ByteRobust's aggregation analysis, step by step: split processes by role (:func:`split_roles`),
cluster the trainers (the dominant clusters are healthy), give each outlier rank a finding, cluster
each child role among its own kind (a stuck dataloader or checkpoint process makes its rank suspect),
and note busy non-main threads. Findings are scored by how likely the rank is the root rather than a
victim (:data:`SCORES`); :mod:`.culprits` and :mod:`rankscope.analytics.faultdomain` take it from there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rankscope.analytics.stacks.clustering import Cluster, cluster
from rankscope.analytics.stacks.frames import classify, display
from rankscope.datasets.domain.stacks import ProcStacks
from rankscope.datasets.domain.topology import Topology

CHILD_ROLES = ("dataloader", "checkpoint", "other")

# How strongly each observation points at a rank being the root cause (1 = certain).
SCORES = {
    "missing-dump": 1.0,
    "child-stuck": 0.95,
    "failed-dump": 0.9,
    "not-in-collective": 0.9,
    "local-wait": 0.8,
    "waits-on-dataloader": 0.7,
    "waits-on-checkpoint": 0.7,
    "child-outlier": 0.5,
    "collective-wait": 0.25,
    "p2p-wait": 0.2,
}
BUSY_STATES = frozenset({"compute", "io", "empty"})


@dataclass(frozen=True)
class Finding:
    """Why one rank is suspect."""

    rank: int
    kind: str  # a key of SCORES
    detail: str

    @property
    def score(self) -> float:
        return SCORES[self.kind]


@dataclass(frozen=True)
class SnapshotAnalysis:
    """One snapshot: clusters of every role, outliers, missing ranks and per-rank findings."""

    snapshot: int
    clusters: tuple[Cluster, ...]
    n_trainers: int
    healthy_trainers: int
    outlier_ranks: tuple[int, ...]
    missing_ranks: tuple[int, ...]
    findings: tuple[Finding, ...]  # best finding per outlier rank
    busy_ranks: tuple[int, ...] = ()  # trainers running their own code (not waiting), healthy or not
    thread_notes: tuple[tuple[int, str], ...] = ()  # (rank, words) for busy non-main threads of outliers
    cut: tuple[int, ...] = ()  # ranks whose dump was cut off as they died: present, no evidence

    @property
    def dominant_fraction(self) -> float:
        total = self.n_trainers + len(self.missing_ranks)
        return self.healthy_trainers / total if total else 0.0

    def best(self) -> dict[int, Finding]:
        return {f.rank: f for f in self.findings}


_STATE_KIND = {
    "compute": "not-in-collective",
    "io": "not-in-collective",
    "empty": "not-in-collective",
    "idle": "local-wait",
    "dataloader-wait": "waits-on-dataloader",
    "checkpoint-wait": "waits-on-checkpoint",
    "collective": "collective-wait",
    "p2p": "p2p-wait",
    "failed": "failed-dump",
}


_DETAIL = {
    "not-in-collective": "not waiting in any collective: in {}",
    "local-wait": "blocked locally, not in a collective: in {}",
    "waits-on-dataloader": "main thread waits on its dataloader: in {}",
    "waits-on-checkpoint": "main thread waits on its checkpoint writer: in {}",
    "collective-wait": "waits in a collective the healthy ranks are not in: {}",
    "p2p-wait": "waits in a pipeline send/recv: {}",
    "failed-dump": "stack capture failed: {}",
}


@dataclass(frozen=True)
class _Roles:
    """One snapshot's processes by role: one trainer per rank, cut trainers apart, children by role."""

    trainers: list[ProcStacks]
    children: dict[str, list[ProcStacks]]
    seen: set[int]
    cut: list[int]


def split_roles(procs: Sequence[ProcStacks]) -> _Roles:
    """The first process of each trainer rank; a trainer whose dump was cut as it died is present but
    neither healthy nor an outlier (``cut``); children by role."""
    trainers: list[ProcStacks] = []
    seen: set[int] = set()
    children: dict[str, list[ProcStacks]] = defaultdict(list)
    cut: list[int] = []
    for p in procs:
        if p.role != "trainer":
            children[p.role if p.role in CHILD_ROLES else "other"].append(p)
            continue
        if p.rank is None or p.rank in seen:
            continue
        seen.add(p.rank)
        if p.status == "cut":
            cut.append(p.rank)
        else:
            trainers.append(p)
    return _Roles(trainers, children, seen, cut)


class _Findings(dict[int, Finding]):
    """The strongest finding per rank."""

    def add(self, f: Finding) -> None:
        cur = self.get(f.rank)
        if cur is None or f.score > cur.score:
            self[f.rank] = f


def _trainer_findings(clusters: Sequence[Cluster], findings: _Findings) -> int:
    """A finding for every rank of an outlier trainer cluster; the number of healthy trainers."""
    healthy = 0
    for c in clusters:
        if c.healthy:
            healthy += c.size
            continue
        kind = _STATE_KIND.get(c.state, "not-in-collective")
        for r in c.ranks:
            findings.add(Finding(r, kind, _DETAIL[kind].format(c.state_frame)))
    return healthy


def _child_findings(
    children: dict[str, list[ProcStacks]],
    world: int,
    *,
    lines: bool,
    dominance: float,
    start_id: int,
    replica_of: np.ndarray | None,
    findings: _Findings,
) -> list[Cluster]:
    """Cluster each child role among its own kind; a stuck or odd child makes its trainer rank suspect."""
    out: list[Cluster] = []
    for role in CHILD_ROLES:
        kids = children.get(role)
        if not kids:
            continue
        cc = cluster(
            kids, role=role, lines=lines, dominance=dominance, start_id=start_id + len(out), replica_of=replica_of
        )
        out.extend(cc)
        for c in (c for c in cc if not c.healthy):
            stuck = c.state in ("io", "compute", "failed")
            for i in c.members:
                p = kids[i]
                if p.rank is None or not 0 <= p.rank < world:
                    continue
                if stuck:
                    findings.add(
                        Finding(p.rank, "child-stuck", f"its {role} process (pid {p.pid}) is stuck: in {c.state_frame}")
                    )
                else:
                    findings.add(
                        Finding(
                            p.rank,
                            "child-outlier",
                            f"its {role} process (pid {p.pid}) differs from its peers: in {c.state_frame}",
                        )
                    )
    return out


def _thread_notes(outliers: Sequence[int], trainers: Sequence[ProcStacks]) -> tuple[tuple[int, str], ...]:
    """Busy non-main threads of outlier ranks, in words."""
    by_rank = {p.rank: p for p in trainers}
    notes = []
    for r in outliers:
        p = by_rank.get(r)
        for t in p.others if p is not None else ():
            state, i = classify(t.frames, role="other")
            if state in ("io", "compute") and i >= 0:
                notes.append(
                    (r, f"thread {t.thread_name or t.thread_id!s} is running ({state}): {display(t.frames[i])}")
                )
    return tuple(notes)


def analyze_snapshot(
    procs: Sequence[ProcStacks], topology: Topology, *, snapshot: int = 0, lines: bool = False, dominance: float = 0.5
) -> SnapshotAnalysis:
    """Cluster one snapshot and explain every outlier rank."""
    roles = split_roles(procs)
    replica_of = topology.coords["dp"] if topology.sizes["dp"] > 1 else None
    clusters = cluster(roles.trainers, role="trainer", lines=lines, dominance=dominance, replica_of=replica_of)
    findings = _Findings()
    healthy = _trainer_findings(clusters, findings)
    missing = np.setdiff1d(topology.ranks, np.fromiter(roles.seen, dtype=np.int64, count=len(roles.seen)))
    for r in missing.tolist():
        findings.add(
            Finding(int(r), "missing-dump", "no stack dump for this rank (process crashed, exited, or unreachable)")
        )
    clusters.extend(
        _child_findings(
            roles.children,
            topology.world_size,
            lines=lines,
            dominance=dominance,
            start_id=len(clusters),
            replica_of=replica_of,
            findings=findings,
        )
    )
    outliers = tuple(sorted(findings))
    busy = tuple(sorted(r for c in clusters if c.role == "trainer" and c.state in BUSY_STATES for r in c.ranks))
    return SnapshotAnalysis(
        snapshot,
        tuple(clusters),
        len(roles.trainers),
        healthy,
        outliers,
        tuple(int(r) for r in missing.tolist()),
        tuple(findings[r] for r in outliers),
        busy,
        _thread_notes(outliers, roles.trainers),
        tuple(sorted(roles.cut)),
    )
