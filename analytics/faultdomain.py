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
        return SuspectGroup(
            "node",
            tuple(int(i) for i in node_idx),
            tuple(int(r) for r in ranks),
            tuple(topology.node_names[i] for i in node_idx),
        )
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
