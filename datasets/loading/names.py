"""Machine names and the topology: the user's names always win; a layout gives coordinates, never names.

Every source that names the machine of a rank is merged here, most trusted first: a manifest, the
hook's identities, the logs (torchrun's prefixes and failure summary), host folders, the ``node`` column of
timings and metrics. Only a rank no source names gets ``node-<rank // gpus_per_node>``, and the verdict
says so (:attr:`~rankscope.datasets.domain.inputs.Inputs.inferred_nodes`). Conflicting names for one rank
are a note (the more trusted source wins).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from rankscope.datasets.domain.bounds import limits
from rankscope.datasets.domain.flight_recorder import FRDump
from rankscope.datasets.domain.stacks import ProcStacks
from rankscope.datasets.domain.topology import Layout, Topology
from rankscope.spine import InputError, LayoutError, LimitError

PRIORITY = {"manifest": 0, "hook": 1, "log": 2, "host-folder": 3, "timings": 4, "metrics": 5}


class Names:
    """rank -> machine name, merged over sources by :data:`PRIORITY`."""

    def __init__(self) -> None:
        self.best: dict[int, tuple[str, str]] = {}  # rank -> (node, source)
        self.conflicts: list[str] = []

    def add(self, rank: int, node: str | None, source: str) -> None:
        if node is None or node == "" or rank < 0:
            return
        cur = self.best.get(rank)
        if cur is None:
            self.best[rank] = (node, source)
            return
        if cur[0] != node:
            win, lose = (
                (cur, (node, source)) if PRIORITY.get(cur[1], 9) <= PRIORITY.get(source, 9) else ((node, source), cur)
            )
            self.best[rank] = win
            if len(self.conflicts) < 5:
                self.conflicts.append(f"rank {rank}: {win[0]} ({win[1]}) over {lose[0]} ({lose[1]})")

    def add_all(self, items: Iterable[tuple[int, str | None, str]]) -> None:
        for rank, node, source in items:
            self.add(rank, node, source)

    def nodes(self) -> dict[int, str]:
        return {r: n for r, (n, _) in self.best.items()}

    def fill_from_neighbours(self, world: int, gpus_per_node: int) -> str | None:
        """Name a rank no source named after the machine of its neighbours, when the named ranks show
        consecutive placement (every machine's ranks in one block of ``gpus_per_node``) and the rank's block
        is on one machine with room for it (torchrun places local ranks 0..G-1 of a node consecutively).
        Returns the note saying so, or None."""
        g = gpus_per_node
        hosts: dict[str, set[int]] = {}
        for r, (n, _) in self.best.items():
            hosts.setdefault(n, set()).add(r)
        if not hosts or any(len({r // g for r in rs}) != 1 or len(rs) > g for rs in hosts.values()):
            return None
        block_host = {next(iter(rs)) // g: n for n, rs in hosts.items()}
        filled = []
        for r in range(world):
            if r not in self.best and (r // g) in block_host:
                self.best[r] = (block_host[r // g], "neighbours")
                filled.append(r)
        if not filled:
            return None
        shown = ", ".join(f"{r} ({self.best[r][0]})" for r in filled[:5]) + (", ..." if len(filled) > 5 else "")
        return (
            f"machine of {len(filled)} rank(s) nobody named taken from their neighbours (every named machine holds "
            f"one block of {g} consecutive ranks): {shown}"
        )

    def notes(self) -> list[str]:
        if not self.conflicts:
            return []
        return [f"machine names disagree between sources; the more trusted one is used: {'; '.join(self.conflicts)}"]


SPARSE_FLOOR = 1024
"""Without --layout, ranks up to this are believed from a single file (a job's last node may be all that dumped)."""


def check_ranks(sources: Iterable[tuple[int, str]], *, layout: Layout | None, where: str) -> None:
    """Refuse ranks no job can have, naming the file that gives one: negative, beyond ``--layout``'s world,
    over ``limits.max_world_size``, or (no layout) far beyond the ranks actually found: the world size is never
    taken from the largest rank alone (a file named ``rank2147483648.json`` would make a 2-billion-rank job)."""
    first: dict[int, str] = {}
    for r, src in sources:
        first.setdefault(r, src or where)
    if not first:
        return
    lo, hi = min(first), max(first)
    if lo < 0:
        raise InputError(f"{first[lo]}: rank {lo} is negative")
    if layout is not None:
        if hi >= layout.world_size:
            raise LayoutError(f"{first[hi]}: rank {hi} is outside the layout {layout} (world size {layout.world_size})")
        return
    lim = limits()
    if hi >= lim.max_world_size:
        raise LimitError(
            f"{first[hi]}: rank {hi} is over the limit of {lim.max_world_size:,} ranks (limits.max_world_size; "
            "raise it with RANKSCOPE_LIMITS_MAX_WORLD_SIZE)"
        )
    bound = max(SPARSE_FLOOR, lim.sparse_rank_factor * len(first))
    if hi >= bound:
        raise InputError(
            f"{first[hi]}: rank {hi} is far beyond the {len(first)} rank(s) found (without --layout the largest rank "
            f"may be at most {bound - 1}): pass --layout to state the job's world size, or remove the file"
        )


def infer_topology(
    ranks: Sequence[int],
    nodes: Mapping[int, str],
    *,
    layout: Layout | None,
    gpus_per_node: int,
    where: str,
    coords: Mapping[str, Sequence[int]] | None = None,
) -> tuple[Topology, list[str]]:
    """The topology of ranks 0..world-1: coordinates from ``coords`` (the hook's), else ``layout``, else pure
    data parallel; names from ``nodes``, else ``node-<rank // gpus_per_node>`` (the notes say which)."""
    notes: list[str] = []
    if gpus_per_node < 1:
        raise LayoutError(f"--gpus-per-node {gpus_per_node}: must be at least 1")
    check_ranks(((r, where) for r in ranks), layout=layout, where=where)
    max_rank = max(ranks) if ranks else -1
    if layout is not None:
        world = layout.world_size
        if max_rank >= world:
            raise LayoutError(f"{where}: rank {max_rank} is outside the layout {layout} (world size {world})")
    elif coords:
        world = len(next(iter(coords.values())))
    else:
        world = max_rank + 1
        if world <= 0:
            raise InputError(f"{where}: no ranks found")
        layout = Layout(dp=world)
        notes.append(
            f"no --layout given: treating ranks 0..{world - 1} as pure data parallel (pass --layout "
            "tp=..,pp=..,dp=.. to isolate parallel groups and to notice missing trailing ranks)"
        )
    names = [nodes.get(r) or f"node-{r // gpus_per_node}" for r in range(world)]
    if coords:
        return Topology.from_table(list(range(world)), names, coords=coords), notes
    return Topology.from_table(list(range(world)), names, layout=layout), notes


def inferred_nodes(topology: Topology | None, nodes: Mapping[int, str]) -> tuple[str, ...]:
    """The machine names of ``topology`` that no source gave (``node-<k>`` inventions)."""
    if topology is None:
        return ()
    out = {topology.node_of(int(r)) for r in topology.ranks if int(r) not in nodes}
    named = set(nodes.values())
    return tuple(sorted(out - named))


def inferred_note(inferred: Sequence[str], gpus_per_node: int) -> str:
    shown = ", ".join(inferred[:4]) + (", ..." if len(inferred) > 4 else "")
    return (
        f"machine names inferred as node-<rank // {gpus_per_node}> for {len(inferred)} machine(s) ({shown}): no "
        "manifest, hook identity, log, host folder or timings named them; add a manifest.csv (file,rank,node) "
        "before acting on this verdict"
    )


def rank_sources(procs: Sequence[ProcStacks], src: Any) -> Iterator[tuple[int, str]]:
    """Every rank the evidence names, with the file that names it."""
    for p in procs:
        if p.rank is not None:
            yield p.rank, p.source
    for d in src.fr:
        yield d.rank, d.source_file
    for e in src.exits:
        yield e.rank, e.source
    if src.logs is not None:
        for r in src.logs.ranks:
            yield r, "the logs"
    yield from pg_members(src.fr)


def pg_members(dumps: Sequence[FRDump]) -> Iterator[tuple[int, str]]:
    """The members of every group the dumps' ``pg_config`` lists, with the file listing them: each list of
    members once (every member lists the world's group; the reader shares one tuple per group), never ranks x
    world (a million at 1,024 ranks)."""
    seen: set[int] = set()
    for d in dumps:
        for pg in d.pg_config.values():
            if pg.ranks and id(pg.ranks) not in seen:
                seen.add(id(pg.ranks))
                where = f"{d.source_file} (pg_config)"
                for r in pg.ranks:
                    yield r, where
