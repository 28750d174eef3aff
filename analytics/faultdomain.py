"""Fault domains: from suspect ranks to the machines to isolate (shared by every evidence source).

ByteRobust's over-eviction: the smallest set of parallel groups of one kind that covers the outlier
ranks (fewest nodes, then fewest groups) is isolated whole; a set on one machine is that machine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rankscope.analytics.verdict import SuspectGroup
from rankscope.config import StackConfig
from rankscope.datasets.domain.topology import KINDS, Topology


def node_group(ranks: Sequence[int] | np.ndarray, topology: Topology) -> SuspectGroup:
    """The machines of ``ranks`` themselves as the fault domain (kind ``node``, nodes in index order)."""
    node_idx = np.unique(topology.node_index[np.asarray(ranks, dtype=np.int64)])
    members = topology.ranks[np.isin(topology.node_index, node_idx)]
    return SuspectGroup(
        "node",
        tuple(int(i) for i in node_idx),
        tuple(int(r) for r in members),
        tuple(topology.node_names[i] for i in node_idx),
    )


def node_limit(topology: Topology, max_fraction: float) -> int:
    """The most nodes a fault domain may take: ``max_fraction`` of the job's, at least one."""
    return max(1, int(max_fraction * len(topology.node_names)))


def cover(
    outliers: Sequence[int], topology: Topology, *, max_fraction: float = StackConfig().max_cover_fraction
) -> SuspectGroup | None:
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
        return node_group(out, topology)
    limit = node_limit(topology, max_fraction)
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
        return None if own.size > limit and n_nodes_total > 1 else node_group(out, topology)
    _, kind, groups, ranks, node_idx = best
    return SuspectGroup(
        kind,
        tuple(int(g) for g in groups),
        tuple(int(r) for r in ranks),
        tuple(topology.node_names[i] for i in node_idx),
    )


def node_lookup(topology: Topology | None) -> Callable[[Sequence[int]], tuple[str, ...]]:
    """A function ranks -> their nodes (empty without a topology)."""

    def nodes(ranks: Sequence[int]) -> tuple[str, ...]:
        """Nodes of ``ranks`` in node order (as Topology.nodes_of, without np.unique's numpy.ma import)."""
        if topology is None or not ranks:
            return ()
        idx = topology.node_index[np.asarray([r for r in ranks if r < topology.world_size], dtype=np.int64)]
        return tuple(topology.node_names[i] for i in sorted(set(idx.tolist())))

    return nodes


def smallest_group(
    ranks: Sequence[int], topology: Topology, *, max_fraction: float = StackConfig().max_cover_fraction
) -> SuspectGroup | None:
    """The one group that holds every rank of ``ranks`` with the fewest nodes: their node when they share
    one, else one parallel group of some kind (fewest nodes, then fewest ranks). None when no single group
    holds them within ``max_fraction`` of the job's nodes: the ranks are unrelated."""
    if len(ranks) == 0:
        return None
    out = np.unique(np.asarray(ranks, dtype=np.int64))
    own = np.unique(topology.node_index[out])
    if own.size == 1:
        return node_group(out, topology)
    limit = node_limit(topology, max_fraction)
    best = None
    for order, kind in enumerate(k for k in KINDS if k in topology.kinds()):
        gid = topology.group_ids(kind)
        g = np.unique(gid[out])
        if g.size != 1:
            continue
        members = topology.ranks[gid == g[0]]
        node_idx = np.unique(topology.node_index[members])
        key = (node_idx.size, members.size, order)
        if node_idx.size <= limit and (best is None or key < best[0]):
            best = (key, kind, int(g[0]), members, node_idx)
    if best is None:
        return None
    _, kind, g0, members, node_idx = best
    return SuspectGroup(
        kind, (g0,), tuple(int(r) for r in members), tuple(topology.node_names[i] for i in node_idx.tolist())
    )


def related_mask(ranks: Sequence[int], others: np.ndarray, topology: Topology, *, nodes: bool = True) -> np.ndarray:
    """For each rank of ``others``: whether it shares a node (unless ``nodes`` is False) or a parallel group
    (TP, CP, EP, PP, DP, or its model-parallel replica) with one of ``ranks``."""
    culprits = np.asarray(ranks, dtype=np.int64)
    if nodes:
        out = np.isin(topology.node_index[others], topology.node_index[culprits])
    else:
        out = np.zeros(len(others), dtype=bool)
    for kind in topology.kinds():
        gid = topology.group_ids(kind)
        out |= np.isin(gid[others], gid[culprits])
    return out  # the replica is the "mp" group, or the one model-parallel kind's group when there is one


def pp_neighbours(topology: Topology) -> np.ndarray:
    """Per rank, its pipeline neighbours one stage before and after (``(world, 2)``, -1 where none)."""
    world = topology.world_size
    out = np.full((world, 2), -1, dtype=np.int64)
    n = topology.sizes["pp"]
    if n <= 1:
        return out
    gid = topology.group_ids("pp")
    stage = np.asarray(topology.coords["pp"], dtype=np.int64)
    order = np.lexsort((stage, gid))  # each PP group holds one rank per stage
    by_group = topology.ranks[order].reshape(-1, n)
    pos = np.empty(world, dtype=np.int64)
    pos[by_group.ravel()] = np.tile(np.arange(n), by_group.shape[0])
    grp = np.empty(world, dtype=np.int64)
    grp[by_group.ravel()] = np.repeat(np.arange(by_group.shape[0]), n)
    before, after = pos > 0, pos < n - 1
    out[before, 0] = by_group[grp[before], pos[before] - 1]
    out[after, 1] = by_group[grp[after], pos[after] + 1]
    return out


def intra_stage_kind(topology: Topology) -> str | None:
    """The tightest parallel group inside a pipeline stage (TP, else CP, else EP), None when there is none."""
    return next((k for k in ("tp", "cp", "ep") if topology.sizes[k] > 1), None)


def waited_for(
    ranks: np.ndarray,
    has: np.ndarray,
    coll: np.ndarray,
    p2p: np.ndarray,
    topology: Topology,
    grad_sync: np.ndarray | None = None,
) -> list[str]:
    """For each rank of ``ranks`` (ranks without a usable stack): why its tightest parallel group is waiting
    for it, or ``""`` when it is not. Per rank of the job: ``has`` a usable stack, waits in a collective
    (``coll``), waits in a pipeline send/recv (``p2p``), is in the backward pass (``grad_sync``: DDP's gradient
    all-reduce is waited on inside the autograd engine, so data-parallel peers stuck there wait too).

    The tightest group with members that have a stack decides: its TP (else CP, EP) peers waiting in a
    collective, else its pipeline neighbours waiting in a send/recv, else its data-parallel peers waiting
    in a collective or the backward pass (the gradient sync); at least half of them.
    """
    ranks = np.asarray(ranks, dtype=np.int64)
    out = [""] * ranks.size
    decided = np.zeros(ranks.size, dtype=bool)

    def decide(n_with: np.ndarray, n_wait: np.ndarray, what: str) -> None:
        for i in np.flatnonzero(~decided & (n_with > 0)).tolist():
            decided[i] = True
            if 2 * n_wait[i] >= n_with[i]:
                out[i] = f"{int(n_wait[i])} of the {int(n_with[i])} {what} with a stack wait for it"

    for kind in ("tp", "cp", "ep"):
        if topology.sizes[kind] > 1:
            gid = topology.group_ids(kind)
            n_with = np.bincount(gid[has], minlength=topology.n_groups(kind))[gid[ranks]]
            n_wait = np.bincount(gid[coll], minlength=topology.n_groups(kind))[gid[ranks]]
            decide(n_with, n_wait, f"other members of its {kind.upper()} group (in a collective)")
    if topology.sizes["pp"] > 1 and not decided.all():
        nb = pp_neighbours(topology)[ranks]
        valid = nb >= 0
        safe = np.where(valid, nb, 0)
        n_with = (valid & has[safe]).sum(axis=1)
        n_wait = (valid & p2p[safe]).sum(axis=1)
        decide(n_with, n_wait, "neighbouring pipeline stages (in a send/recv)")
    if topology.sizes["dp"] > 1 and not decided.all():
        gid = topology.group_ids("dp")
        n_with = np.bincount(gid[has], minlength=topology.n_groups("dp"))[gid[ranks]]
        synced = coll if grad_sync is None else coll | grad_sync
        n_wait = np.bincount(gid[synced], minlength=topology.n_groups("dp"))[gid[ranks]]
        decide(
            n_with,
            n_wait,
            "data-parallel peers (in a collective)"
            if grad_sync is None
            else "data-parallel peers (in a collective or the backward pass: the gradient sync)",
        )
    return out
