"""Per process group, per rank: how far each member got (the progress tables of a Flight Recorder analysis).

Entries are aligned by ``collective_seq_id`` (absolute, so wrapped ring buffers and missing ranks need
no record-id alignment): each member's last enqueued, started and completed collective, the signature
of each collective (op, sizes, dtypes; kept only where members disagree), the unfinished entries of each
rank, the p2p ops still open per (src, dst) and the kernel durations recorded.

What "started" means depends on what the backend records (:func:`start_semantics`): NCCL with timing
moves an entry to ``started`` when its kernel begins; NCCL without timing and gloo do not, and then the
last op a rank *enqueued* is the best that is known.
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
ROOTED_OPS = {"gather": "output", "scatter": "input"}
"""Ops where only the root holds one side (gather: its output; scatter: its input), the other members an empty
list: that side's dtypes are not compared (as PyTorch's own Flight Recorder analysis does not)."""
MARKER_OPS = frozenset({"coalesced", "ALLGATHER_coalesced", "REDUCE_SCATTER_coalesced"})
_STATEFUL_BACKENDS = ("nccl", "ncclx", "rccl", "rcclx", "xccl", "hccl", "mccl")

Shapes = tuple[tuple[int, ...], ...]
Sizes = tuple[Shapes, Shapes]
Signature = tuple[str, Sizes | None, tuple[str, ...], tuple[str, ...]]
"""(op, (input sizes, output sizes) or None for variable-size ops, input dtypes, output dtypes)"""
P2PKey = tuple[GroupKey, int, int, str]  # (group, global src, global dst, op)
DurationKey = tuple[GroupKey, int]  # (group, collective seq)


def tracks_state(d: FRDump) -> bool:
    """NCCL moves entries to started/completed (retired but not completed = timed out); gloo leaves
    them 'scheduled' and only retires them when done."""
    return d.backend in _STATEFUL_BACKENDS or any(e.state in ("started", "completed") for e in d.entries)


def is_done(e: FREntry, tracks: bool) -> bool:
    return e.state == "completed" or (e.retired and not tracks)


def signature(e: FREntry) -> Signature:
    """What the members of one collective must agree on (:func:`_rank_pass` inlines the common case)."""
    if e.op in ROOTED_OPS:  # only the root holds that side: not compared
        root_only = ROOTED_OPS[e.op]
        return (
            e.op,
            None,
            () if root_only == "input" else e.input_dtypes,
            () if root_only == "output" else e.output_dtypes,
        )
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
    seen: set[int] = set()  # each member list once: the reader shares one tuple per group (the world's in every dump)
    for d in dumps:
        for cfg in d.pg_config.values():
            if cfg.ranks and id(cfg.ranks) not in seen:
                seen.add(id(cfg.ranks))
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
    starts: dict[int, bool] = field(default_factory=dict)  # rank -> its dump records starts
    tracks: dict[int, bool] = field(default_factory=dict)  # rank -> its backend records states (not gloo)
    unrecorded: set[int] = field(default_factory=set)
    """Ranks whose group counters run ahead of every op they recorded on the group (gloo's send/recv)."""
    sigs: defaultdict[tuple[GroupKey, int], defaultdict[tuple[Signature, ...], list[int]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    """Only the collectives whose members disagree: signature -> the ranks that issued it."""
    ops_at: dict[tuple[GroupKey, int], str] = field(default_factory=dict)  # profiling name per collective
    durations: defaultdict[DurationKey, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    created_at: defaultdict[DurationKey, list[int]] = field(default_factory=lambda: defaultdict(list))
    pending: defaultdict[int, list[tuple[GroupKey, FREntry]]] = field(default_factory=lambda: defaultdict(list))
    p2p_open: defaultdict[P2PKey, list[tuple[int, bool]]] = field(default_factory=lambda: defaultdict(list))
    """Open (not completed) p2p ops per (group, src, dst, op): (rank, in state ``started``) of each."""
    p2p_records: dict[int, tuple[Mapping[str, GroupKey], list[FREntry]]] = field(default_factory=dict)
    """Per rank: its group keys and every send/recv it recorded, for :func:`link_ids` (built only for the ranks
    a wait asks about: a pass over every record would cost every diagnosis)."""
    p2p_ids: dict[int, dict[P2PKey, dict[int, int]]] = field(default_factory=dict)  # link_ids, per rank once
    n_entries: int = 0

    def reached(self, g: GroupKey, m: int, seq: int) -> bool:
        """Whether dumped member ``m`` started collective ``seq`` of ``g`` (enqueued, where starts are
        not recorded)."""
        table = self.started if self.starts.get(m) else self.enq
        return table[g].get(m, 0) >= seq or self.comp[g].get(m, 0) >= seq


def _status(t: ProgressTables, d: FRDump, r: int, k: Mapping[str, GroupKey], p2p_groups: set[str], seen: _Seen) -> None:
    """A rank's counters per group: the largest of what its entries show and its pg_status says (groups that
    carry send/recv on this rank excepted: their pg_status counters may be p2p sequence ids; so are counters
    ahead of every op the rank recorded on the group: gloo counts its send/recv there, and records none)."""
    enq, comp, started = seen
    stateless = not t.tracks[r]  # gloo: NCCL records every op it runs
    for n, st in d.pg_status.items():
        if n not in k or n in p2p_groups:
            continue
        if stateless and n in enq and st.last_enqueued is not None and st.last_enqueued > enq[n]:
            t.unrecorded.add(r)  # ahead of every op the rank recorded on it: it counts unrecorded ops (send/recv)
            continue
        if st.last_enqueued is not None and st.last_enqueued > enq.get(n, 0):
            enq[n] = st.last_enqueued
        if st.last_completed is not None and st.last_completed > comp.get(n, 0):
            comp[n] = st.last_completed
        if st.last_started is not None and st.last_started > started.get(n, 0):
            started[n] = st.last_started
    for n, g in k.items():
        t.enq[g][r] = enq.get(n, 0)
        t.comp[g][r] = comp.get(n, 0)
        t.started[g][r] = started.get(n, 0)


_Seen = tuple[dict[str, int], dict[str, int], dict[str, int]]  # per pg name: last enqueued, completed, started


class _Several(tuple):  # type: ignore[type-arg]
    """The signatures of a rank's several records of one collective (a rank's one record is its signature)."""


def _signatures(sig: Signature | _Several) -> tuple[Signature, ...]:
    return tuple(sig) if sig.__class__ is _Several else (sig,)


def _open_p2p(
    t: ProgressTables, r: int, g: GroupKey, e: FREntry, info: GroupInfo, pending: list[tuple[GroupKey, FREntry]]
) -> None:
    """A send/recv rank ``r`` has not completed: one of its pending ops, and open on its link."""
    pending.append((g, e))
    src, dst = global_rank(info, e.src), global_rank(info, e.dst)
    if src is not None and dst is not None:
        t.p2p_open[(g, src, dst, e.op)].append((r, e.state == "started"))


def link_ids(t: ProgressTables, groups: Mapping[GroupKey, GroupInfo], r: int) -> dict[P2PKey, dict[int, int]]:
    """Rank ``r``'s recorded send/recv per link (group, global src, global dst, op): p2p sequence id -> its
    least progress (0 scheduled, 1 started, 2 completed). Built once per rank, when first asked."""
    ids = t.p2p_ids.get(r)
    if ids is not None:
        return ids
    ids = t.p2p_ids[r] = {}
    k, records = t.p2p_records.get(r, ({}, []))
    tracks = t.tracks.get(r, True)
    for e in records:
        g = k.get(e.pg_name)
        if g is None or (info := groups.get(g)) is None:
            continue
        src, dst = global_rank(info, e.src), global_rank(info, e.dst)
        if src is None or dst is None:
            continue
        progress = 2 if is_done(e, tracks) else 1 if e.state == "started" else 0
        seqs = ids.setdefault((g, src, dst, e.op), {})
        if seqs.get(e.p2p_seq_id, 3) > progress:
            seqs[e.p2p_seq_id] = progress
    return ids


def _rank_pass(
    t: ProgressTables, r: int, d: FRDump, k: Mapping[str, GroupKey], groups: Mapping[GroupKey, GroupInfo]
) -> tuple[_Seen, set[str], dict[tuple[GroupKey, int], Signature | _Several]]:
    """One pass over a rank's entries (hot: every entry of every rank)."""
    tracks = t.tracks[r]
    saw_start = any(st.last_started is not None and st.last_started >= 0 for st in d.pg_status.values())
    enq: dict[str, int] = {}
    comp: dict[str, int] = {}
    started: dict[str, int] = {}
    p2p_groups: set[str] = set()
    sigs: dict[tuple[GroupKey, int], Signature | _Several] = {}
    pending = t.pending[r]
    durations, created_at, ops_at = t.durations, t.created_at, t.ops_at
    records: list[FREntry] = []
    t.p2p_records[r] = (k, records)
    for e in d.entries:
        n = e.pg_name
        state = e.state
        done = state == "completed" or (e.retired and not tracks)
        if not saw_start and (state == "started" or e.time_discovered_started_ns):
            saw_start = True
        if e.is_p2p:
            p2p_groups.add(n)
            records.append(e)
            if not done:
                _open_p2p(t, r, k[n], e, groups[k[n]], pending)
            continue
        seq = e.collective_seq_id
        if seq > enq.get(n, 0):
            enq[n] = seq
        if done:
            if seq > comp.get(n, 0):
                comp[n] = seq
            if seq > started.get(n, 0):
                started[n] = seq
        elif state == "started" and seq > started.get(n, 0):
            started[n] = seq
        g = k[n]
        key = (g, seq)
        op = e.op
        if op not in MARKER_OPS:
            sig = (  # signature(e), inlined for the common case (every collective record of every rank)
                (
                    op,
                    None if op in VARIABLE_SIZE_OPS else (e.input_sizes, e.output_sizes),
                    e.input_dtypes,
                    e.output_dtypes,
                )
                if op not in ROOTED_OPS
                else signature(e)
            )
            prev = sigs.get(key)
            if prev is None:  # nearly always: one record per collective and rank
                sigs[key] = sig
                if key not in ops_at:
                    ops_at[key] = e.profiling_name
            else:
                sigs[key] = _Several((*prev, sig) if prev.__class__ is _Several else (prev, sig))
        if not done:
            pending.append((g, e))
        elif e.duration_ms is not None:
            durations[key].append((r, e.duration_ms))
            if e.time_created_ns:
                created_at[key].append(e.time_created_ns)
    t.starts[r] = tracks and saw_start
    return (enq, comp, started), p2p_groups, sigs


def build_tables(
    by_rank: Mapping[int, FRDump], keys: Mapping[int, Mapping[str, GroupKey]], groups: Mapping[GroupKey, GroupInfo]
) -> ProgressTables:
    """One pass over every rank's entries."""
    t = ProgressTables()
    first: dict[tuple[GroupKey, int], tuple[Signature | _Several, list[int]]] = {}
    for r, d in by_rank.items():
        k = keys[r]
        tracks = tracks_state(d)
        t.tracks[r] = tracks
        t.n_entries += len(d.entries)
        seen, p2p_groups, sigs = _rank_pass(t, r, d, k, groups)
        _status(t, d, r, k, p2p_groups, seen)
        for key, sig in sigs.items():  # most collectives agree: keep one signature and its ranks
            cur = first.get(key)
            if cur is None:
                first[key] = (sig, [r])
            elif cur[0] == sig:  # (one signature never equals several: their elements differ in type)
                cur[1].append(r)
            else:
                t.sigs[key][_signatures(sig)].append(r)
    for key in list(t.sigs):
        sig, ranks = first[key]
        t.sigs[key][_signatures(sig)].extend(ranks)
    return t
