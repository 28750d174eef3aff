"""The likeliest root ranks among the outliers of one snapshot, and whether the evidence is strong.

A rank with no dump, a rank not waiting on anyone, a rank whose child is stuck outrank ranks that
merely wait; when everyone waits, the wait is followed upstream (a collective whose group peer is
stuck in a pipeline transfer points at that transfer; a blocked send names the stage it sends to).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rankscope.analytics.faultdomain import pp_neighbours
from rankscope.analytics.stacks.clustering import Cluster
from rankscope.analytics.stacks.snapshot import SnapshotAnalysis
from rankscope.datasets.domain.topology import Topology

STRONG = 0.7


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


_SEND_NEXT, _RECV_NEXT, _SEND_PREV, _RECV_PREV = 1, 2, 4, 8
_P2P_OPS = {
    "recv_forward": _RECV_PREV,
    "recv_backward": _RECV_NEXT,
    "send_forward": _SEND_NEXT,
    "send_backward": _SEND_PREV,
    "send_forward_recv_backward": _SEND_NEXT | _RECV_NEXT,
    "send_backward_recv_forward": _SEND_PREV | _RECV_PREV,
    "send_forward_recv_forward": _SEND_NEXT | _RECV_PREV,
    "send_backward_recv_backward": _SEND_PREV | _RECV_NEXT,
    "send_forward_backward_recv_forward_backward": _SEND_NEXT | _RECV_NEXT | _SEND_PREV | _RECV_PREV,
}
"""The transfers a rank blocked in Megatron's pipeline call has posted (``p2p_communication``), as bits:
a send to or a receive from the next or the previous stage. The ops of one call complete together."""


def _p2p_ops(c: Cluster) -> int:
    """The transfer bits of the innermost pipeline call among ``c``'s last frames (0: none)."""
    for key in reversed(c.signature[-8:]):  # innermost first
        hit = _P2P_OPS.get(key.split("@", 1)[0])
        if hit is not None:
            return hit
    return 0


def pipeline_ends(clusters: Sequence[Cluster], topology: Topology) -> tuple[int, ...]:
    """Ranks of adjacent stages of one pipeline blocked on the link between them, among the trainer
    ``clusters`` (dominant or not: in a pipeline without replicas a stage's wait may be the largest): both
    ends of a transfer that cannot complete. () without a pipeline in the ``topology``.

    A link is stuck when each end has posted a transfer the other has not (two receives, or two sends: a
    schedule that deadlocks), or when both ends are blocked in transfers on this link alone (a send met by its
    receive that never completes, and whatever else they wait for waits on the other end: a lost message or a
    broken link). An end that also waits on its other neighbour may only be waiting in a chain, for the stage
    where the waits end (a stage that computes, hangs or died): that proves nothing about this link."""
    if "pp" not in topology.kinds():
        return ()
    ops = np.zeros(topology.world_size, dtype=np.int64)
    for c in clusters:
        if c.role == "trainer" and c.state == "p2p" and (bits := _p2p_ops(c)):
            ops[list(c.ranks)] = bits
    after = pp_neighbours(topology)[:, 1]
    a = np.flatnonzero((ops & (_SEND_NEXT | _RECV_NEXT) != 0) & (after >= 0))
    if not a.size:
        return ()
    b = after[a]
    oa, ob = ops[a], ops[b]
    fwd_a, bwd_a = oa & _SEND_NEXT != 0, oa & _RECV_NEXT != 0  # a's sends to b, a's receives from b
    fwd_b, bwd_b = ob & _RECV_PREV != 0, ob & _SEND_PREV != 0  # b's receives from a, b's sends to a
    lone_a = (fwd_a & ~fwd_b) | (bwd_a & ~bwd_b)  # a posted what b has not met
    lone_b = (fwd_b & ~fwd_a) | (bwd_b & ~bwd_a)
    only_link = (oa & (_SEND_PREV | _RECV_PREV) == 0) & (ob & (_SEND_NEXT | _RECV_NEXT) == 0)
    stuck = (lone_a & lone_b) | (only_link & (fwd_b | bwd_b))
    first = a[stuck]
    return tuple(int(r) for r in np.union1d(first, after[first]))


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
    out: set[int] = set()
    pp = topology.coords["pp"]
    gid = topology.group_ids("pp")
    n = topology.sizes["pp"]
    for r in ranks:
        target = pp[r] + direction
        if 0 <= target < n:
            members = topology.ranks[(gid == gid[r]) & (pp == target)]
            out.update(int(m) for m in members)
    return out
