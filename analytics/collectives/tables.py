"""Per process group, per rank: how far each member got (the progress tables of a Flight Recorder analysis).

Entries are aligned by ``collective_seq_id`` (absolute, so wrapped ring buffers and missing ranks need
no record-id alignment): each member's last enqueued, started and completed collective, the signature
of each collective (op, sizes, dtypes), the unfinished entries of each rank, the p2p ops still open per
(src, dst), the kernel durations recorded, and the job's own latency and enqueue cadence per group
(what "normal" looks like, for the clock in :mod:`.clock`).

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
MARKER_OPS = frozenset({"coalesced", "ALLGATHER_coalesced", "REDUCE_SCATTER_coalesced"})
_STATEFUL_BACKENDS = ("nccl", "ncclx", "rccl", "rcclx", "xccl", "hccl", "mccl")
SAMPLES_PER_RANK = 64
"""Latency/cadence samples kept per rank and group (its most recent ops): enough for a p99, bounded."""

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


def knows_starts(d: FRDump) -> bool:
    """Whether the dump says which ops *started* (NCCL with timing: ``started`` states, discovered start
    times, or a ``last_started`` counter), rather than only which were enqueued."""
    if any(st.last_started is not None and st.last_started >= 0 for st in d.pg_status.values()):
        return True
    return any(e.state == "started" or e.time_discovered_started_ns for e in d.entries)


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
    starts: dict[int, bool] = field(default_factory=dict)  # rank -> its dump records starts
    tracks: dict[int, bool] = field(default_factory=dict)  # rank -> its backend records states (not gloo)
    sigs: defaultdict[tuple[GroupKey, int], defaultdict[tuple[Signature, ...], list[int]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    ops_at: dict[tuple[GroupKey, int], str] = field(default_factory=dict)  # profiling name per collective
    durations: defaultdict[DurationKey, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    created_at: defaultdict[DurationKey, list[int]] = field(default_factory=lambda: defaultdict(list))
    pending: defaultdict[int, list[tuple[GroupKey, FREntry]]] = field(default_factory=lambda: defaultdict(list))
    p2p_open: defaultdict[P2PKey, list[tuple[int, bool]]] = field(default_factory=lambda: defaultdict(list))
    """Open (not completed) p2p ops per (group, src, dst, op): (rank, started) of each."""
    latency_s: defaultdict[GroupKey, list[float]] = field(default_factory=lambda: defaultdict(list))
    cadence_s: defaultdict[GroupKey, list[float]] = field(default_factory=lambda: defaultdict(list))
    n_entries: int = 0

    def reached(self, g: GroupKey, m: int, seq: int) -> bool:
        """Whether dumped member ``m`` started collective ``seq`` of ``g`` (enqueued, where starts are
        not recorded)."""
        table = self.started if self.starts.get(m) else self.enq
        return table[g].get(m, 0) >= seq or self.comp[g].get(m, 0) >= seq


def _status(t: ProgressTables, d: FRDump, r: int, k: Mapping[str, GroupKey], p2p_groups: set[str]) -> None:
    """A rank's pg_status (last enqueued/started/completed per group), and zeros for groups it knows.

    Groups that carry send/recv on this rank are skipped: their counters may be p2p sequence ids."""
    for n, st in d.pg_status.items():
        if n not in k or n in p2p_groups:
            continue
        g = k[n]
        if st.last_enqueued is not None:
            t.enq[g][r] = max(t.enq[g].get(r, 0), st.last_enqueued)
        if st.last_completed is not None:
            t.comp[g][r] = max(t.comp[g].get(r, 0), st.last_completed)
        if st.last_started is not None:
            t.started[g][r] = max(t.started[g].get(r, 0), st.last_started)
    for n in k:
        t.enq[k[n]].setdefault(r, 0)
        t.comp[k[n]].setdefault(r, 0)
        t.started[k[n]].setdefault(r, 0)


def _p2p(t: ProgressTables, r: int, g: GroupKey, e: FREntry, info: GroupInfo, done: bool, starts: bool) -> None:
    s, d = global_rank(info, e.src), global_rank(info, e.dst)
    if not done:
        t.pending[r].append((g, e))
        if s is not None and d is not None:
            t.p2p_open[(g, s, d, e.op)].append((r, e.state == "started" or not starts))


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
    if (done or e.state == "started") and seq > t.started[g][r]:
        t.started[g][r] = seq
    if e.op not in MARKER_OPS:
        rank_sigs[(g, seq)].append(signature(e))
        t.ops_at.setdefault((g, seq), e.profiling_name)
    if not done:
        t.pending[r].append((g, e))
    elif e.duration_ms is not None:
        t.durations[(g, seq)].append((r, e.duration_ms))
        if e.time_created_ns:
            t.created_at[(g, seq)].append(e.time_created_ns)


def _samples(t: ProgressTables, d: FRDump, k: Mapping[str, GroupKey], tracks: bool) -> None:
    """The rank's latest latency (created -> completed, else the kernel's duration) and enqueue-gap samples
    per group: the job's own idea of how long an op stays in flight and how often one comes."""
    last: dict[str, int] = {}
    lat: dict[str, list[float]] = defaultdict(list)
    cad: dict[str, list[float]] = defaultdict(list)
    for e in d.entries[-SAMPLES_PER_RANK * max(1, len(k)) :]:
        n, t0 = e.pg_name, e.time_created_ns
        if t0:
            prev = last.get(n)
            if prev is not None and t0 >= prev:
                cad[n].append((t0 - prev) / 1e9)
            last[n] = t0
        if is_done(e, tracks):
            t1 = e.time_discovered_completed_ns
            if t0 and t1 and t1 >= t0:
                lat[n].append((t1 - t0) / 1e9)
            elif e.duration_ms is not None:
                lat[n].append(e.duration_ms / 1e3)
    for n, xs in lat.items():
        t.latency_s[k[n]].extend(xs[-SAMPLES_PER_RANK:])
    for n, xs in cad.items():
        t.cadence_s[k[n]].extend(xs[-SAMPLES_PER_RANK:])


def build_tables(
    by_rank: Mapping[int, FRDump], keys: Mapping[int, Mapping[str, GroupKey]], groups: Mapping[GroupKey, GroupInfo]
) -> ProgressTables:
    """One pass over every rank's entries."""
    t = ProgressTables()
    for r, d in by_rank.items():
        k = keys[r]
        tracks = tracks_state(d)
        starts = tracks and knows_starts(d)
        t.starts[r], t.tracks[r] = starts, tracks
        rank_sigs: defaultdict[tuple[GroupKey, int], list[Signature]] = defaultdict(list)
        _status(t, d, r, k, {e.pg_name for e in d.entries if e.is_p2p})
        for e in d.entries:
            t.n_entries += 1
            g = k[e.pg_name]
            done = is_done(e, tracks)
            if e.is_p2p:
                _p2p(t, r, g, e, groups[g], done, starts)
            else:
                _collective(t, r, g, e, done, rank_sigs)
        for gs, sig in rank_sigs.items():
            t.sigs[gs][tuple(sig)].append(r)
        _samples(t, d, k, tracks)
    return t
