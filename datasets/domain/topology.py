"""Parallel topology: every rank's coordinates and node, and every parallel group.

A layout is Megatron's: sizes for tp (tensor), cp (context), ep (expert), dp (data) and pp
(pipeline) parallelism, and an order that says which dimension varies fastest along the rank
number (Megatron's default ``tp-cp-ep-dp-pp``: consecutive ranks share a TP group, and pipeline
stages are furthest apart). Here every dimension is a factor of the world size:
``world = tp * cp * ep * dp * pp``.

A group of kind ``k`` is the set of ranks whose coordinates agree on every dimension except ``k``.
The derived kind ``mp`` (model parallel: everything but dp) is one data-parallel replica.
Ranks are placed on nodes ``gpus_per_node`` at a time unless a manifest names the node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from rankscope.spine import LayoutError

DIMS = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = ("tp", "cp", "ep", "dp", "pp")
KINDS = ("tp", "cp", "ep", "pp", "dp", "mp")
"""Group kinds, in the order ties are broken when choosing a fault domain (smallest domains first)."""


def parse_layout(text: str) -> dict[str, int]:
    """``"tp=8,pp=4,dp=32"`` -> ``{"tp": 8, "pp": 4, "dp": 32}``; unknown or bad parts are errors."""
    sizes: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"([a-z]+)\s*=\s*(\d+)", part)
        if not m:
            raise LayoutError(f"layout {text!r}: cannot read {part!r} (expected e.g. tp=8,pp=4,dp=32)")
        dim, value = m.group(1), int(m.group(2))
        if dim not in DIMS:
            raise LayoutError(f"layout {text!r}: unknown dimension {dim!r} (valid: {', '.join(DIMS)})")
        if dim in sizes:
            raise LayoutError(f"layout {text!r}: {dim} given twice")
        if value < 1:
            raise LayoutError(f"layout {text!r}: {dim}={value} must be at least 1")
        sizes[dim] = value
    if not sizes:
        raise LayoutError(f"layout {text!r}: no dimensions (expected e.g. tp=8,pp=4,dp=32)")
    return sizes


def parse_order(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"tp-cp-ep-dp-pp"`` -> a permutation of the five dimensions (missing ones appended)."""
    parts = [p.strip() for p in re.split(r"[-,\s]+", text)] if isinstance(text, str) else list(text)
    parts = [p for p in parts if p]
    for p in parts:
        if p not in DIMS:
            raise LayoutError(f"order {text!r}: unknown dimension {p!r} (valid: {', '.join(DIMS)})")
    if len(set(parts)) != len(parts):
        raise LayoutError(f"order {text!r}: a dimension appears twice")
    return tuple(parts) + tuple(d for d in DEFAULT_ORDER if d not in parts)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Sizes of the parallel dimensions and the order ranks are laid out in."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1
    order: tuple[str, ...] = DEFAULT_ORDER

    def __post_init__(self) -> None:
        for d in DIMS:
            v = getattr(self, d)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise LayoutError(f"layout: {d}={v!r} must be a positive integer")
        object.__setattr__(self, "order", parse_order(self.order))

    @classmethod
    def parse(cls, text: str, order: str | Sequence[str] = DEFAULT_ORDER) -> Layout:
        return cls(**parse_layout(text), order=parse_order(order))

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.ep * self.dp * self.pp

    def size(self, dim: str) -> int:
        return int(getattr(self, dim))

    def __str__(self) -> str:
        return ",".join(f"{d}={self.size(d)}" for d in DIMS if self.size(d) > 1 or d in ("tp", "pp", "dp"))

    def coords(self, ranks: np.ndarray) -> dict[str, np.ndarray]:
        """Coordinates of ``ranks`` along every dimension (first dimension of ``order`` fastest)."""
        rest = np.asarray(ranks, dtype=np.int64)
        out: dict[str, np.ndarray] = {}
        for d in self.order:
            out[d] = rest % self.size(d)
            rest = rest // self.size(d)
        return out


@dataclass(frozen=True)
class Group:
    """One parallel group: its kind, its index among groups of that kind, its ranks and nodes."""

    kind: str
    index: int
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Topology:
    """Every rank's node and coordinates; groups are computed on demand with numpy.

    Build it with :meth:`from_layout` or :meth:`from_table`. Arrays are indexed by rank.
    """

    ranks: np.ndarray  # int64, sorted, == arange(world_size)
    node_index: np.ndarray  # int64 per rank, into node_names
    node_names: tuple[str, ...]
    local_rank: np.ndarray
    coords: Mapping[str, np.ndarray]  # dim -> int64 per rank
    sizes: Mapping[str, int]  # dim -> size
    layout: Layout | None = None
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_layout(
        cls,
        layout: Layout,
        *,
        gpus_per_node: int = 8,
        node_names: Sequence[str] | None = None,
        node_format: str = "node-{}",
    ) -> Topology:
        """The topology of ``layout`` with ``gpus_per_node`` consecutive ranks per node."""
        if gpus_per_node < 1:
            raise LayoutError(f"gpus_per_node={gpus_per_node} must be at least 1")
        world = layout.world_size
        ranks = np.arange(world, dtype=np.int64)
        if node_names is None:
            if world % gpus_per_node:
                raise LayoutError(
                    f"layout {layout} has world size {world}, not a multiple of gpus_per_node={gpus_per_node}"
                )
            n_nodes = world // gpus_per_node
            node_names = tuple(node_format.format(i) for i in range(n_nodes))
            node_index = ranks // gpus_per_node
            local = ranks % gpus_per_node
        else:
            if len(node_names) != world:
                raise LayoutError(f"{len(node_names)} node names given for world size {world}")
            node_names, node_index = _index_nodes(np.asarray(node_names, dtype=object))
            local = _local_ranks(node_index)
        coords = layout.coords(ranks)
        return cls(
            ranks,
            node_index.astype(np.int64),
            tuple(node_names),
            local,
            coords,
            {d: layout.size(d) for d in DIMS},
            layout,
        )

    @classmethod
    def from_table(
        cls,
        ranks: Sequence[int],
        nodes: Sequence[str],
        *,
        layout: Layout | None = None,
        coords: Mapping[str, Sequence[int]] | None = None,
    ) -> Topology:
        """A topology from an explicit per-rank table (a manifest).

        Coordinates come from ``coords`` (one column per dimension present), else from ``layout``;
        with neither, the job is treated as pure data parallel (every rank its own replica).
        """
        r = np.asarray(ranks, dtype=np.int64)
        if r.size == 0:
            raise LayoutError("topology: no ranks")
        if (r < 0).any():
            raise LayoutError(f"topology: negative rank {int(r[r < 0][0])}")
        sr = np.sort(r)  # (not np.unique: its first call imports numpy.ma, 6 ms of a 1,024-rank diagnosis)
        twice = sr[1:] == sr[:-1]
        if twice.any():
            raise LayoutError(f"topology: rank {int(sr[1:][twice][0])} appears twice")
        world = int(r.max()) + 1
        if r.size != world:
            missing = sorted(set(range(world)) - set(r.tolist()))[:5]
            raise LayoutError(f"topology: ranks must be 0..{world - 1}; missing {missing}")
        order = np.argsort(r)
        node_arr = np.asarray(nodes, dtype=object)[order]
        names, node_index = _index_nodes(node_arr)
        sorted_ranks = r[order]
        if coords:
            sizes = dict.fromkeys(DIMS, 1)
            cdict = {}
            for d in DIMS:
                if d in coords and coords[d] is not None:
                    c = np.asarray(coords[d], dtype=np.int64)[order]
                    sizes[d] = int(c.max()) + 1
                    cdict[d] = c
                else:
                    cdict[d] = np.zeros(world, dtype=np.int64)
            prod = int(np.prod(list(sizes.values())))
            if prod != world:
                raise LayoutError(f"topology: coordinate sizes {sizes} multiply to {prod}, not the world size {world}")
            used = {d: cdict[d] for d in DIMS}
            key = np.zeros(world, dtype=np.int64)
            for d in DIMS:
                key = key * sizes[d] + used[d]
            if np.unique(key).size != world:
                raise LayoutError("topology: two ranks share the same coordinates")
            lay = None
        else:
            lay = layout or Layout(dp=world)
            if lay.world_size != world:
                raise LayoutError(f"layout {lay} has world size {lay.world_size}, but the table has {world} ranks")
            cdict = lay.coords(sorted_ranks)
            sizes = {d: lay.size(d) for d in DIMS}
        return cls(
            sorted_ranks,
            node_index.astype(np.int64),
            tuple(str(n) for n in names),
            _local_ranks(node_index),
            cdict,
            sizes,
            lay,
        )

    # -- queries -----------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return int(self.ranks.size)

    @property
    def nodes(self) -> np.ndarray:
        """Node name per rank (object array)."""
        if "nodes" not in self._cache:
            self._cache["nodes"] = np.asarray(self.node_names, dtype=object)[self.node_index]
        return self._cache["nodes"]

    def node_of(self, rank: int) -> str:
        return self.node_names[int(self.node_index[rank])]

    def kinds(self) -> tuple[str, ...]:
        """The group kinds with more than one rank per group (``mp`` only when it differs from tp/pp/...)."""
        out = [k for k in KINDS if k != "mp" and self.sizes[k] > 1]
        mp_dims = [d for d in DIMS if d != "dp" and self.sizes[d] > 1]
        if len(mp_dims) > 1:
            out.append("mp")
        return tuple(out)

    def group_size(self, kind: str) -> int:
        if kind == "mp":
            return int(np.prod([self.sizes[d] for d in DIMS if d != "dp"]))
        return int(self.sizes[kind])

    def group_ids(self, kind: str) -> np.ndarray:
        """Per rank, the index of its group of ``kind`` (groups numbered 0..n-1)."""
        if kind not in KINDS:
            raise LayoutError(f"unknown group kind {kind!r} (valid: {', '.join(KINDS)})")
        cached = self._cache.get(("gid", kind))
        if cached is not None:
            return cached
        varying = {kind} if kind != "mp" else {d for d in DIMS if d != "dp"}
        gid = np.zeros(self.world_size, dtype=np.int64)
        for d in DIMS:
            if d in varying:
                continue
            gid = gid * self.sizes[d] + self.coords[d]
        _, gid = np.unique(gid, return_inverse=True)
        self._cache[("gid", kind)] = gid
        return gid

    def n_groups(self, kind: str) -> int:
        return self.world_size // self.group_size(kind)

    def group(self, kind: str, index: int) -> Group:
        gid = self.group_ids(kind)
        members = self.ranks[gid == index]
        nodes = tuple(dict.fromkeys(self.node_names[i] for i in self.node_index[members]))
        return Group(kind, int(index), tuple(int(r) for r in members), nodes)

    def group_of(self, kind: str, rank: int) -> Group:
        return self.group(kind, int(self.group_ids(kind)[rank]))

    def groups(self, kind: str) -> list[Group]:
        """Every group of ``kind``."""
        return [self.group(kind, i) for i in range(self.n_groups(kind))]

    def kind_of_members(self, ranks: Sequence[int]) -> tuple[str, int] | None:
        """``(kind, index)`` of the topology group whose members are exactly ``ranks`` (in any order; the first
        kind of :meth:`kinds` where two kinds share members), else None. One dict lookup: the table of every
        group is built on first use."""
        table = self._cache.get("members")
        if table is None:
            table = {}
            for kind in self.kinds():
                gid = self.group_ids(kind)
                rows = self.ranks[np.argsort(gid, kind="stable")].reshape(self.n_groups(kind), self.group_size(kind))
                for index, members in enumerate(map(tuple, rows.tolist())):
                    table.setdefault(members, (kind, index))
            self._cache["members"] = table
        return table.get(tuple(sorted(ranks)))

    def nodes_of(self, ranks: Sequence[int] | np.ndarray) -> tuple[str, ...]:
        idx = np.unique(self.node_index[np.asarray(ranks, dtype=np.int64)])
        return tuple(self.node_names[i] for i in idx)

    @cached_property
    def description(self) -> str:
        dims = ",".join(f"{d}={self.sizes[d]}" for d in DIMS if self.sizes[d] > 1) or "dp=1"
        return f"{self.world_size} ranks on {len(self.node_names)} nodes ({dims})"

    def to_rows(self, job: str) -> list[dict[str, Any]]:
        """Rows of the ``topology`` table."""
        return [
            {
                "job": job,
                "rank": int(r),
                "node": self.node_of(int(r)),
                "local_rank": int(self.local_rank[i]),
                **{d: int(self.coords[d][i]) for d in DIMS},
            }
            for i, r in enumerate(self.ranks)
        ]


def _natural(name: str) -> tuple[tuple[int, str] | str, ...]:
    # a digit run sorts by its value without int(): a 5,000-digit node name must not meet Python's digit limit
    return tuple((len(t.lstrip("0")), t.lstrip("0")) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _index_nodes(names: np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
    """Unique node names in natural order (node-2 before node-10) and each rank's index into them."""
    uniq = sorted({str(n) for n in names}, key=_natural)
    pos = {n: i for i, n in enumerate(uniq)}
    return tuple(uniq), np.fromiter((pos[str(n)] for n in names), dtype=np.int64, count=len(names))


def _local_ranks(node_index: np.ndarray) -> np.ndarray:
    """Position of each rank among the ranks of its node, in rank order."""
    node_index = np.asarray(node_index, dtype=np.int64)
    order = np.argsort(node_index, kind="stable")
    local = np.empty_like(node_index)
    sorted_nodes = node_index[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_nodes)) + 1]
    counts = np.diff(np.r_[starts, sorted_nodes.size])
    local[order] = np.arange(sorted_nodes.size) - np.repeat(starts, counts)
    return local
