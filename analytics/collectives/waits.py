"""Who waits for whom, and which groups stalled (the wavefront of a Flight Recorder analysis).

Every rank stuck in an unfinished op *waits for* the members missing from it (or its p2p peer when the
matching send/recv was never posted); following these waits across groups ends at ranks that wait for
nobody: the culprits. A group stalls where not every member reached one collective.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from rankscope.analytics.collectives.groups import KIND_ORDER, GroupInfo, GroupKey
from rankscope.analytics.collectives.result import GroupStall
from rankscope.analytics.collectives.tables import ProgressTables, global_rank
from rankscope.datasets.domain.flight_recorder import FRDump, FREntry

P2PWait = tuple[GroupKey, int, int, str]  # (group, waiting rank, peer it waits for, its op)


class MissingAt:
    """(dumped members that never enqueued ``seq`` of group ``g``, members without a dump), cached."""

    def __init__(
        self, tables: ProgressTables, groups: Mapping[GroupKey, GroupInfo], by_rank: Mapping[int, FRDump]
    ) -> None:
        self._t, self._groups, self._by_rank = tables, groups, by_rank
        self._cache: dict[tuple[GroupKey, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def __call__(self, g: GroupKey, seq: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        hit = self._cache.get((g, seq))
        if hit is None:
            e = self._t.enq[g]
            members = self._groups[g].ranks
            hit = (
                tuple(m for m in members if m in self._by_rank and e.get(m, 0) < seq),  # absent: never used it
                tuple(m for m in members if m not in self._by_rank),
            )
            self._cache[(g, seq)] = hit
        return hit


@dataclass
class WaitGraph:
    """Each stuck rank's waits; ``waits`` keeps its most specific one (for reports)."""

    waits: dict[int, tuple[int, ...]] = field(default_factory=dict)
    all_sources: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)
    stuck: defaultdict[tuple[GroupKey, int], list[int]] = field(default_factory=lambda: defaultdict(list))
    p2p_waits: list[P2PWait] = field(default_factory=list)


def _p2p_source(t: ProgressTables, r: int, g: GroupKey, e: FREntry, info: GroupInfo) -> int | None:
    """The peer a rank stuck in a send/recv waits for, when the matching op was never posted."""
    s, d = global_rank(info, e.src), global_rank(info, e.dst)
    peer = d if e.op == "send" else s
    if peer is None or peer == r:
        return None
    other = "recv" if e.op == "send" else "send"
    posted = t.p2p_pending.get((g, s, d, other), 0) if s is not None and d is not None else 0
    return peer if posted == 0 else None


def wait_graph(t: ProgressTables, groups: Mapping[GroupKey, GroupInfo], missing_at: MissingAt) -> WaitGraph:
    """Each stuck rank -> the members missing from its op (tuples shared per op)."""
    out = WaitGraph()
    for r, items in t.pending.items():
        sources: list[tuple[int, ...]] = []
        for g, e in items:
            if e.is_p2p:
                peer = _p2p_source(t, r, g, e, groups[g])
                if peer is not None:
                    sources.append((peer,))
                    out.p2p_waits.append((g, r, peer, e.op))
                continue
            if e.collective_seq_id <= t.comp[g].get(r, 0):
                continue  # pg_status says it completed (the entry was dumped before the watchdog saw it)
            out.stuck[(g, e.collective_seq_id)].append(r)
            miss, nodump = missing_at(g, e.collective_seq_id)
            if miss or nodump:  # a dumped member known to be missing explains the wait before an unknown one
                sources.append(miss or nodump)
        if sources:
            out.all_sources[r] = sources
            out.waits[r] = min(sources, key=len)
    return out


def group_stalls(
    t: ProgressTables,
    groups: Mapping[GroupKey, GroupInfo],
    by_rank: Mapping[int, FRDump],
    stuck: Mapping[tuple[GroupKey, int], list[int]],
    missing_at: MissingAt,
) -> list[GroupStall]:
    """Groups whose members did not all reach a collective (or are stuck in one), model-parallel first."""
    stalls = []
    stuck_by_group: dict[GroupKey, list[int]] = defaultdict(list)
    for gg, sq in stuck:
        stuck_by_group[gg].append(sq)
    for g, e in t.enq.items():
        info = groups[g]
        if not e:
            continue
        lo = min(e.get(m, 0) for m in info.ranks if m in by_rank)
        hi = max(e.values())
        seq = lo + 1 if lo < hi else None
        if seq is None:
            if g not in stuck_by_group:
                continue
            seq = min(stuck_by_group[g])
        miss, nodump = missing_at(g, seq)
        st_g, co_g = t.started[g], t.comp[g]
        progress = {m: (e.get(m, 0), st_g.get(m, 0), co_g.get(m, 0)) for m in info.ranks if m in by_rank}
        stalls.append(
            GroupStall(
                info.name,
                info.desc,
                info.kind,
                info.index,
                seq,
                t.ops_at.get((g, seq), ""),
                info.ranks,
                miss,
                nodump,
                tuple(sorted(stuck.get((g, seq), ()))),
                info.source,
                progress,
            )
        )
    stalls.sort(key=lambda s: (KIND_ORDER.get(s.kind, 5), len(s.members), s.pg))
    return stalls
