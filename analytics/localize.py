"""From clusters to machines: outliers, the fault domain to isolate, and the likeliest culprit.

ByteRobust's aggregation analysis: the dominant stack clusters are healthy; the outlier ranks are
mapped onto parallel groups, and the smallest set of groups of one kind that covers them (fewest
nodes, then fewest groups) is isolated whole ("over-eviction": the group is the fault domain).
Inside it, ranks are scored by how likely they are to be the root rather than a victim: a rank
with no dump, a rank not waiting on anyone (compute, I/O), a rank whose dataloader or checkpoint
process is stuck in I/O outrank ranks that merely wait in a collective or a p2p transfer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rankscope.analytics.clustering import Cluster, cluster
from rankscope.analytics.frames import classify, display
from rankscope.analytics.verdict import SuspectGroup
from rankscope.datasets.domain.stacks import ProcStacks
from rankscope.datasets.domain.topology import KINDS, Topology

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
STRONG = 0.7
BUSY_STATES = frozenset({"compute", "io", "empty"})
MAX_COVER_FRACTION = 0.5


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


def analyze_snapshot(procs: Sequence[ProcStacks], topology: Topology, *, snapshot: int = 0,
                     lines: bool = False, dominance: float = 0.5) -> SnapshotAnalysis:
    """Cluster one snapshot and explain every outlier rank."""
    trainers: list[ProcStacks] = []
    seen: set[int] = set()
    children: dict[str, list[ProcStacks]] = defaultdict(list)
    cut: list[int] = []
    for p in procs:
        if p.role == "trainer":
            if p.rank is None or p.rank in seen:
                continue
            seen.add(p.rank)
            if p.status == "cut":  # present, but its dump died with it: neither healthy nor outlier
                cut.append(p.rank)
                continue
            trainers.append(p)
        else:
            children[p.role if p.role in CHILD_ROLES else "other"].append(p)
    replica_of = topology.coords["dp"] if topology.sizes["dp"] > 1 else None
    clusters = cluster(trainers, role="trainer", lines=lines, dominance=dominance, replica_of=replica_of)
    findings: dict[int, Finding] = {}

    def add(f: Finding) -> None:
        cur = findings.get(f.rank)
        if cur is None or f.score > cur.score:
            findings[f.rank] = f

    healthy = 0
    for c in clusters:
        if c.healthy:
            healthy += c.size
            continue
        kind = _STATE_KIND.get(c.state, "not-in-collective")
        for r in c.ranks:
            detail = {
                "not-in-collective": f"not waiting in any collective: in {c.state_frame}",
                "local-wait": f"blocked locally, not in a collective: in {c.state_frame}",
                "waits-on-dataloader": f"main thread waits on its dataloader: in {c.state_frame}",
                "waits-on-checkpoint": f"main thread waits on its checkpoint writer: in {c.state_frame}",
                "collective-wait": f"waits in a collective the healthy ranks are not in: {c.state_frame}",
                "p2p-wait": f"waits in a pipeline send/recv: {c.state_frame}",
                "failed-dump": f"stack capture failed: {c.state_frame}",
            }[kind]
            add(Finding(r, kind, detail))
    missing = np.setdiff1d(topology.ranks, np.fromiter(seen, dtype=np.int64, count=len(seen)))
    for r in missing.tolist():
        add(Finding(int(r), "missing-dump", "no stack dump for this rank (process crashed, exited, or unreachable)"))

    next_id = len(clusters)
    world = topology.world_size
    for role in CHILD_ROLES:
        kids = children.get(role)
        if not kids:
            continue
        cc = cluster(kids, role=role, lines=lines, dominance=dominance, start_id=next_id, replica_of=replica_of)
        next_id += len(cc)
        clusters.extend(cc)
        for c in cc:
            if c.healthy:
                continue
            stuck = c.state in ("io", "compute", "failed")
            for i in c.members:
                p = kids[i]
                if p.rank is None or not 0 <= p.rank < world:
                    continue
                if stuck:
                    add(Finding(p.rank, "child-stuck",
                                f"its {role} process (pid {p.pid}) is stuck: in {c.state_frame}"))
                else:
                    add(Finding(p.rank, "child-outlier",
                                f"its {role} process (pid {p.pid}) differs from its peers: in {c.state_frame}"))
    outliers = tuple(sorted(findings))
    by_rank = {p.rank: p for p in trainers}
    notes = []
    for r in outliers:
        p = by_rank.get(r)
        for t in (p.others if p is not None else ()):
            state, i = classify(t.frames, role="other")
            if state in ("io", "compute") and i >= 0:
                notes.append((r, f"thread {t.thread_name or t.thread_id!s} is running ({state}): {display(t.frames[i])}"))
    busy = tuple(sorted(r for c in clusters if c.role == "trainer" and c.state in BUSY_STATES for r in c.ranks))
    return SnapshotAnalysis(snapshot, tuple(clusters), len(trainers), healthy, outliers,
                            tuple(int(r) for r in missing.tolist()), tuple(findings[r] for r in outliers), busy,
                            tuple(notes), tuple(sorted(cut)))


def cover(outliers: Sequence[int], topology: Topology, *,
          max_fraction: float = MAX_COVER_FRACTION) -> SuspectGroup | None:
    """The smallest set of groups of one kind covering ``outliers`` (fewest nodes, then groups).

    When every outlier is on one node, that node alone is the domain. Kinds whose cover would take
    more than ``max_fraction`` of the job's nodes are not a fault domain; then each outlier's own
    node is (kind ``node``). ``None`` if even that is too much.
    """
    if len(outliers) == 0:
        return None
    out = np.asarray(sorted(set(outliers)), dtype=np.int64)
    n_nodes_total = len(topology.node_names)
    own = np.unique(topology.node_index[out])
    if own.size == 1:  # every outlier on one machine: that machine is the fault domain
        i = int(own[0])
        ranks = topology.ranks[topology.node_index == i]
        return SuspectGroup("node", (i,), tuple(int(r) for r in ranks), (topology.node_names[i],))
    limit = max(1, int(max_fraction * n_nodes_total))
    best = None
    for order, kind in enumerate(k for k in KINDS if k in topology.kinds()):
        gid = topology.group_ids(kind)
        groups = np.unique(gid[out])
        member = np.isin(gid, groups)
        node_idx = np.unique(topology.node_index[member])
        key = (node_idx.size, groups.size, order)
        if node_idx.size <= limit and (best is None or key < best[0]):
            best = (key, kind, groups, topology.ranks[member], node_idx)
    if best is None:
        node_idx = np.unique(topology.node_index[out])
        if node_idx.size > limit and n_nodes_total > 1:
            return None
        ranks = topology.ranks[np.isin(topology.node_index, node_idx)]
        return SuspectGroup("node", tuple(int(i) for i in node_idx), tuple(int(r) for r in ranks),
                            tuple(topology.node_names[i] for i in node_idx))
    _, kind, groups, ranks, node_idx = best
    return SuspectGroup(kind, tuple(int(g) for g in groups), tuple(int(r) for r in ranks),
                        tuple(topology.node_names[i] for i in node_idx))


def culprits(analysis: SnapshotAnalysis, topology: Topology | None = None) -> tuple[tuple[int, ...], bool]:
    """The likeliest root ranks among the outliers, and whether the evidence is strong.

    Strong: ranks with a finding of at least STRONG (no dump, not waiting, stuck child).
    Otherwise every outlier is waiting on someone; the origin is most likely where the wait
    started: a collective wait that the healthy majority is not in (p2p waiters are usually its
    downstream victims), else a blocked pipeline *send* together with the stage it sends to (a send
    that does not complete means that link or that receiver is stuck), else the smallest cluster.
    """
    best = analysis.best()
    strong = [r for r, f in best.items() if f.score >= STRONG]
    if strong:
        top = max(best[r].score for r in strong)
        return tuple(sorted(r for r in strong if best[r].score >= min(top, 0.9))), True
    outlier_clusters = [c for c in analysis.clusters if not c.healthy and c.role == "trainer" and c.ranks]
    if not outlier_clusters:
        return (), False
    coll = [c for c in outlier_clusters if c.state == "collective"]
    if coll:
        pick = min(coll, key=lambda c: (c.size, c.id))
        if topology is not None:
            upstream = _p2p_blockers(pick, outlier_clusters, topology)
            if upstream:
                return upstream, False
        return tuple(pick.ranks), False
    senders = [(c, _send_direction(c)) for c in outlier_clusters]
    senders = [(c, d) for c, d in senders if d]
    if senders:
        c, direction = min(senders, key=lambda cd: (cd[0].size, cd[0].id))
        ranks = set(c.ranks)
        if topology is not None and "pp" in topology.kinds():
            ranks |= _pp_neighbours(c.ranks, direction, topology)
        return tuple(sorted(ranks)), False
    pick = min(outlier_clusters, key=lambda c: (c.size, c.id))
    return tuple(pick.ranks), False


def _p2p_blockers(pick: Cluster, outliers: Sequence[Cluster], topology: Topology) -> tuple[int, ...]:
    """When the collective waiters wait for a group peer stuck in a pipeline transfer, that transfer
    is further upstream: the peers, plus their pipeline partners that are stuck in p2p too (two
    stages each waiting to receive from the other: a send that never arrived, on either side).

    Example (TP=2, PP=2): rank 1 skips a send to rank 5; rank 5 waits in recv; rank 4, its tensor-
    parallel peer, waits for it in an all_reduce. The all_reduce is not where the wait started.
    """
    in_p2p = np.zeros(topology.world_size, dtype=bool)
    for c in outliers:
        if c.state == "p2p":
            in_p2p[list(c.ranks)] = True
    if not in_p2p.any():
        return ()
    pick_ranks = np.asarray(pick.ranks, dtype=np.int64)
    members = np.zeros(topology.world_size, dtype=bool)
    members[pick_ranks] = True
    blocking = np.zeros(topology.world_size, dtype=bool)
    for kind in (k for k in topology.kinds() if k in ("tp", "cp", "ep")):  # collectives inside a stage
        gid = topology.group_ids(kind)
        blocking |= np.isin(gid, np.unique(gid[pick_ranks])) & in_p2p & ~members
    if not blocking.any() or "pp" not in topology.kinds():
        return tuple(int(r) for r in np.flatnonzero(blocking))
    # their pipeline partners one stage away that are stuck in p2p too: the other end of the transfer
    gid, stage, n = topology.group_ids("pp"), topology.coords["pp"], topology.sizes["pp"]
    b = np.flatnonzero(blocking)
    ends = np.concatenate([gid[b] * (n + 2) + stage[b], gid[b] * (n + 2) + stage[b] + 2])  # stage -1 / +1, shifted
    partner = in_p2p & np.isin(gid * (n + 2) + stage + 1, ends)
    return tuple(int(r) for r in np.flatnonzero(blocking | partner))


def _send_direction(c: Cluster) -> int:
    """+1 for a blocked forward send, -1 for a backward send, 0 if the cluster is not sending."""
    for key in reversed(c.signature[-8:]):  # innermost first
        fn = key.split("@", 1)[0]
        if fn.startswith("send_forward") or fn == "send_forward_recv_backward":
            return 1
        if fn.startswith("send_backward") or fn == "send_backward_recv_forward":
            return -1
    return 0


def _pp_neighbours(ranks: Sequence[int], direction: int, topology: Topology) -> set[int]:
    """The ranks one pipeline stage away (in ``direction``) from each of ``ranks``."""
    out = set()
    pp = topology.coords["pp"]
    gid = topology.group_ids("pp")
    n = topology.sizes["pp"]
    for r in ranks:
        target = pp[r] + direction
        if 0 <= target < n:
            members = topology.ranks[(gid == gid[r]) & (pp == target)]
            out.update(int(m) for m in members)
    return out
