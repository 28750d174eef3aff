"""Per process group, per rank: how far each member got (the progress tables of a Flight Recorder analysis).

Entries are aligned by ``collective_seq_id`` (absolute, so wrapped ring buffers and missing ranks need
no record-id alignment): each member's last enqueued, started and completed collective, the signature
of each collective (op, sizes, dtypes), the unfinished entries of each rank, p2p ops pending per
(src, dst) and the kernel durations recorded.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rankscope.analytics.collectives.groups import GroupInfo, GroupKey
from rankscope.datasets.domain.flight_recorder import FRDump, FREntry

VARIABLE_SIZE_OPS = frozenset(
    {
        "all_to_all",
        "all_to_all_single",
        "all_to_all_v_single",
        "all_gather_v",
        "reduce_scatter_v",
        "gather",
        "scatter",
        "alltoall",
        "alltoall_base",
    }
)
"""Ops whose members legitimately pass different sizes: only op and dtypes are compared."""
MARKER_OPS = frozenset({"coalesced", "ALLGATHER_coalesced", "REDUCE_SCATTER_coalesced"})
_STATEFUL_BACKENDS = ("nccl", "ncclx", "rccl", "rcclx", "xccl", "hccl", "mccl")

Shapes = tuple[tuple[int, ...], ...]
Sizes = tuple[Shapes, Shapes]
Signature = tuple[str, Sizes | None, tuple[str, ...], tuple[str, ...]]
"""(op, (input sizes, output sizes) or None for variable-size ops, input dtypes, output dtypes)"""
P2PKey = tuple[GroupKey, int, int, str]  # (group, global src, global dst, op)
DurationKey = tuple[object, ...]  # (group, seq) for collectives, (group, -i, src, dst) for paired p2p


def tracks_state(d: FRDump) -> bool:
    """NCCL moves entries to started/completed (retired but not completed = timed out); gloo leaves
    them 'scheduled' and only retires them when done."""
    return d.backend in _STATEFUL_BACKENDS or any(e.state in ("started", "completed") for e in d.entries)


def is_done(e: FREntry, tracks: bool) -> bool:
    return e.state == "completed" or (e.retired and not tracks)


def signature(e: FREntry) -> Signature:
    if e.op in VARIABLE_SIZE_OPS:
        return (e.op, None, e.input_dtypes, e.output_dtypes)
    return (e.op, (e.input_sizes, e.output_sizes), e.input_dtypes, e.output_dtypes)


def global_rank(info: GroupInfo, local: int | None) -> int | None:
    """A group-local rank as a global rank (None when out of the group)."""
    if local is None or local < 0 or local >= len(info.ranks):
        return None
    return info.ranks[local]


def richness(d: FRDump) -> tuple[int, int, int]:
    """Which of two dumps of one rank to keep: more entries, then frames (pickles), then newer."""
    newest = max((e.time_created_ns or 0 for e in d.entries), default=0)
    return (len(d.entries), int(any(e.frames for e in d.entries)), newest)


def dedupe(dumps: Sequence[FRDump]) -> tuple[dict[int, FRDump], list[str]]:
    """One dump per rank (e.g. the same dump as JSON and as pickle: the richer one), and what was dropped."""
    by_rank: dict[int, FRDump] = {}
    dropped: list[str] = []
    for d in dumps:
        old = by_rank.get(d.rank)
        if old is not None:
            keep, drop = (d, old) if richness(d) > richness(old) else (old, d)
            dropped.append(f"rank {d.rank}: used {keep.source_file or '?'}, ignored {drop.source_file or '?'}")
            d = keep
        by_rank[d.rank] = d
    return by_rank, dropped


def world_from(dumps: Sequence[FRDump], memberships: Mapping[str, Sequence[int]] | None) -> int:
    """The world size the dumps and memberships imply (without a topology)."""
    hi = max(d.rank for d in dumps)
    for d in dumps:
        for cfg in d.pg_config.values():
            if cfg.ranks:
                hi = max(hi, *cfg.ranks)
    for v in (memberships or {}).values():
        if v:
            hi = max(hi, *(int(x) for x in v))
    return hi + 1


def _seq_map() -> defaultdict[GroupKey, dict[int, int]]:
    return defaultdict(dict)


@dataclass
class ProgressTables:
    """Everything counted per group and rank in one pass over the entries."""

    enq: defaultdict[GroupKey, dict[int, int]] = field(default_factory=_seq_map)  # last enqueued seq
    comp: defaultdict[GroupKey, dict[int, int]] = field(default_factory=_seq_map)  # last completed seq
    started: defaultdict[GroupKey, dict[int, int]] = field(default_factory=_seq_map)  # last started seq
    sigs: defaultdict[tuple[GroupKey, int], defaultdict[tuple[Signature, ...], list[int]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    ops_at: dict[tuple[GroupKey, int], str] = field(default_factory=dict)  # profiling name per collective
    durations: defaultdict[DurationKey, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    pending: defaultdict[int, list[tuple[GroupKey, FREntry]]] = field(default_factory=lambda: defaultdict(list))
    p2p_pending: defaultdict[P2PKey, int] = field(default_factory=lambda: defaultdict(int))
    p2p_timed: defaultdict[P2PKey, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    n_entries: int = 0


def _status(t: ProgressTables, d: FRDump, r: int, k: Mapping[str, GroupKey]) -> None:
    """A rank's pg_status (last enqueued/started/completed per group), and zeros for groups it knows."""
    for n, st in d.pg_status.items():
        if n in k and st.last_enqueued is not None:
            t.enq[k[n]][r] = max(t.enq[k[n]].get(r, 0), st.last_enqueued)
        if n in k and st.last_completed is not None:
            t.comp[k[n]][r] = max(t.comp[k[n]].get(r, 0), st.last_completed)
        if n in k and st.last_started is not None:
            t.started[k[n]][r] = max(t.started[k[n]].get(r, 0), st.last_started)
    for n in k:
        t.enq[k[n]].setdefault(r, 0)
        t.comp[k[n]].setdefault(r, 0)


def _p2p(t: ProgressTables, r: int, g: GroupKey, e: FREntry, info: GroupInfo, done: bool) -> None:
    s, d = global_rank(info, e.src), global_rank(info, e.dst)
    if not done:
        t.pending[r].append((g, e))
        if s is not None and d is not None:
            t.p2p_pending[(g, s, d, e.op)] += 1
    elif e.duration_ms is not None and s is not None and d is not None:
        t.p2p_timed[(g, s, d, e.op)].append((r, e.duration_ms))


def _collective(
    t: ProgressTables,
    r: int,
    g: GroupKey,
    e: FREntry,
    done: bool,
    rank_sigs: defaultdict[tuple[GroupKey, int], list[Signature]],
) -> None:
    seq = e.collective_seq_id
    if seq > t.enq[g][r]:
        t.enq[g][r] = seq
    if done and seq > t.comp[g][r]:
        t.comp[g][r] = seq
    if (done or e.state == "started") and seq > t.started[g].get(r, 0):
        t.started[g][r] = seq
    if e.op not in MARKER_OPS:
        rank_sigs[(g, seq)].append(signature(e))
        t.ops_at.setdefault((g, seq), e.profiling_name)
    if not done:
        t.pending[r].append((g, e))
    elif e.duration_ms is not None:
        t.durations[(g, seq)].append((r, e.duration_ms))


def build_tables(
    by_rank: Mapping[int, FRDump], keys: Mapping[int, Mapping[str, GroupKey]], groups: Mapping[GroupKey, GroupInfo]
) -> ProgressTables:
    """One pass over every rank's entries."""
    t = ProgressTables()
    for r, d in by_rank.items():
        k = keys[r]
        tracks = tracks_state(d)
        rank_sigs: defaultdict[tuple[GroupKey, int], list[Signature]] = defaultdict(list)
        _status(t, d, r, k)
        for e in d.entries:
            t.n_entries += 1
            g = k[e.pg_name]
            done = is_done(e, tracks)
            if e.is_p2p:
                _p2p(t, r, g, e, groups[g], done)
            else:
                _collective(t, r, g, e, done, rank_sigs)
        for gs, sig in rank_sigs.items():
            t.sigs[gs][tuple(sig)].append(r)
    return t
