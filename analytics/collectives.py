"""Collective-trace analysis of Flight Recorder dumps: who did not join, who disagrees, who is slow.

Per process group, entries are aligned by ``collective_seq_id`` (absolute, so wrapped ring buffers
and missing ranks need no record-id alignment): each member's last enqueued/completed collective,
the first collective not every member reached and the members that did not reach it. Send/recv
are paired per (src, dst). Every rank stuck in an unfinished op *waits for* the members missing
from it; following these waits across groups (the wavefront) ends at ranks that wait for nobody:
the culprits. The stopped group is the first group, in the order model-parallel, data-parallel,
default, whose missing ranks hold a culprit. Differing ops, sizes or dtypes at one seq id are a
code/config fault (``mismatch``), not a machine fault. ``duration_ms``, when recorded, gives
late-arrival scores (the rank everyone waits for has the shortest kernel).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rankscope.analytics.collectives_groups import (
    KIND_ORDER,
    GroupInfo,
    GroupKey,
    group_keys,
    resolve_groups,
)
from rankscope.analytics.collectives_result import (
    CollectiveAnalysis,
    GroupStall,
    Mismatch,
)
from rankscope.analytics.collectives_verdict import fr_verdict, node_lookup
from rankscope.analytics.verdict import Evidence, rank_ranges
from rankscope.datasets.domain.flight_recorder import FRDump, FREntry
from rankscope.datasets.domain.topology import Topology
from rankscope.spine import InputError, paused_gc

__all__ = ["CollectiveAnalysis", "GroupStall", "Mismatch", "analyze_collectives", "fr_verdict"]

VARIABLE_SIZE_OPS = frozenset({
    "all_to_all", "all_to_all_single", "all_to_all_v_single", "all_gather_v", "reduce_scatter_v",
    "gather", "scatter", "alltoall", "alltoall_base",
})
"""Ops whose members legitimately pass different sizes: only op and dtypes are compared."""
MARKER_OPS = frozenset({"coalesced", "ALLGATHER_coalesced", "REDUCE_SCATTER_coalesced"})
SLOW_MIN_SCORE = 0.5
"""A rank whose kernels are at least this much shorter than its peers' (median) arrives late."""


# -- per-entry helpers --------------------------------------------------------------------------
_STATEFUL_BACKENDS = ("nccl", "ncclx", "rccl", "rcclx", "xccl", "hccl", "mccl")


def _tracks_state(d: FRDump) -> bool:
    """NCCL moves entries to started/completed (retired but not completed = timed out); gloo leaves
    them 'scheduled' and only retires them when done."""
    return d.backend in _STATEFUL_BACKENDS or any(e.state in ("started", "completed") for e in d.entries)


def _done(e: FREntry, tracks_state: bool) -> bool:
    return e.state == "completed" or (e.retired and not tracks_state)


def _sig(e: FREntry) -> tuple:
    if e.op in VARIABLE_SIZE_OPS:
        return (e.op, None, e.input_dtypes, e.output_dtypes)
    return (e.op, (e.input_sizes, e.output_sizes), e.input_dtypes, e.output_dtypes)


# -- the analysis -------------------------------------------------------------------------------
def analyze_collectives(
    dumps: Sequence[FRDump],
    topology: Topology | None = None,
    memberships: Mapping[str, Sequence[int]] | None = None,
) -> CollectiveAnalysis:
    """Analyze every rank's FR dump; see the module docstring for the method.

    ``topology`` maps ranks to parallel groups and nodes (and fills in members gloo does not record);
    ``memberships`` maps a pg name or description to its global ranks (the live hook's record).
    """
    if not dumps:
        raise InputError("analyze_collectives: no Flight Recorder dumps")
    with paused_gc():
        return _analyze(dumps, topology, memberships)


def _analyze(dumps: Sequence[FRDump], topology: Topology | None,
             memberships: Mapping[str, Sequence[int]] | None) -> CollectiveAnalysis:
    by_rank: dict[int, FRDump] = {}
    dropped: list[str] = []
    for d in dumps:
        old = by_rank.get(d.rank)
        if old is not None:  # e.g. the same dump as JSON and as pickle: keep the richer one
            keep, drop = (d, old) if _richness(d) > _richness(old) else (old, d)
            dropped.append(f"rank {d.rank}: used {keep.source_file or '?'}, ignored {drop.source_file or '?'}")
            d = keep
        by_rank[d.rank] = d
    dumps = list(by_rank.values())
    keys, cfg_members = group_keys(dumps)
    world = topology.world_size if topology is not None else _world_from(dumps, memberships)
    if topology is not None and max(by_rank) >= world:
        raise InputError(f"Flight Recorder dump of rank {max(by_rank)} but the topology has {world} ranks; "
                         "check the layout")
    groups = resolve_groups(dumps, keys, cfg_members, world, topology, memberships)
    tracks = {r: _tracks_state(d) for r, d in by_rank.items()}

    # per group, per rank: last enqueued / completed seq, collective signatures, p2p ops, pending ops
    enq: dict[GroupKey, dict[int, int]] = defaultdict(dict)
    comp: dict[GroupKey, dict[int, int]] = defaultdict(dict)
    started: dict[GroupKey, dict[int, int]] = defaultdict(dict)
    sigs: dict[tuple[GroupKey, int], dict[tuple, list[int]]] = defaultdict(lambda: defaultdict(list))
    ops_at: dict[tuple[GroupKey, int], str] = {}
    durations: dict[tuple[GroupKey, int], list[tuple[int, float]]] = defaultdict(list)
    pending: dict[int, list[tuple[GroupKey, FREntry]]] = defaultdict(list)
    p2p_pending: dict[tuple[GroupKey, int, int, str], int] = defaultdict(int)  # (g, src, dst, op) -> count
    p2p_timed: dict[tuple[GroupKey, int, int, str], list[tuple[int, float]]] = defaultdict(list)
    n_entries = 0
    for r, d in by_rank.items():
        k = keys[r]
        rank_sigs: dict[tuple[GroupKey, int], list[tuple]] = defaultdict(list)
        for n, st in d.pg_status.items():
            if n in k and st.last_enqueued is not None:
                enq[k[n]][r] = max(enq[k[n]].get(r, 0), st.last_enqueued)
            if n in k and st.last_completed is not None:
                comp[k[n]][r] = max(comp[k[n]].get(r, 0), st.last_completed)
            if n in k and st.last_started is not None:
                started[k[n]][r] = max(started[k[n]].get(r, 0), st.last_started)
        for n in k:
            enq[k[n]].setdefault(r, 0)
            comp[k[n]].setdefault(r, 0)
        for e in d.entries:
            n_entries += 1
            g = k[e.pg_name]
            done = _done(e, tracks[r])
            if e.is_p2p:
                info = groups[g]
                s, t = _global(info, e.src), _global(info, e.dst)
                if not done:
                    pending[r].append((g, e))
                    if s is not None and t is not None:
                        p2p_pending[(g, s, t, e.op)] += 1
                elif e.duration_ms is not None and s is not None and t is not None:
                    p2p_timed[(g, s, t, e.op)].append((r, e.duration_ms))
                continue
            seq = e.collective_seq_id
            if seq > enq[g][r]:
                enq[g][r] = seq
            if done and seq > comp[g][r]:
                comp[g][r] = seq
            if (done or e.state == "started") and seq > started[g].get(r, 0):
                started[g][r] = seq
            if e.op not in MARKER_OPS:
                rank_sigs[(g, seq)].append(_sig(e))
                ops_at.setdefault((g, seq), e.profiling_name)
            if not done:
                pending[r].append((g, e))
            elif e.duration_ms is not None:
                durations[(g, seq)].append((r, e.duration_ms))
        for gs, sig in rank_sigs.items():
            sigs[gs][tuple(sig)].append(r)

    mismatches = _mismatches(sigs, groups)
    stall_cache: dict[tuple[GroupKey, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def missing_at(g: GroupKey, seq: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(dumped members that never enqueued seq, members without a dump)."""
        hit = stall_cache.get((g, seq))
        if hit is None:
            e = enq[g]
            members = groups[g].ranks
            hit = (tuple(m for m in members if m in by_rank and e.get(m, 0) < seq),  # absent: never used it
                   tuple(m for m in members if m not in by_rank))
            stall_cache[(g, seq)] = hit
        return hit

    # who waits for whom: each stuck rank -> the members missing from its op (tuples shared per op)
    waits: dict[int, tuple[int, ...]] = {}
    all_sources: dict[int, list[tuple[int, ...]]] = {}
    stuck: dict[tuple[GroupKey, int], list[int]] = defaultdict(list)  # (g, seq) -> ranks stuck in it
    p2p_waits: list[tuple[GroupKey, int, int, str]] = []
    for r, items in pending.items():
        sources: list[tuple[int, ...]] = []
        for g, e in items:
            if e.is_p2p:
                info = groups[g]
                s, t = _global(info, e.src), _global(info, e.dst)
                peer = t if e.op == "send" else s
                if peer is None or peer == r:
                    continue
                other = "recv" if e.op == "send" else "send"
                if p2p_pending.get((g, s, t, other), 0) == 0:
                    sources.append((peer,))
                    p2p_waits.append((g, r, peer, e.op))
                continue
            if e.collective_seq_id <= comp[g].get(r, 0):
                continue  # pg_status says it completed (the entry was dumped before the watchdog saw it)
            stuck[(g, e.collective_seq_id)].append(r)
            miss, nodump = missing_at(g, e.collective_seq_id)
            if miss or nodump:  # a dumped member known to be missing explains the wait before an unknown one
                sources.append(miss or nodump)
        if sources:
            all_sources[r] = sources
            waits[r] = min(sources, key=len)  # the most specific wait, for reports

    # stalls: groups whose members did not all reach a collective
    stalls = []
    stuck_by_group: dict[GroupKey, list[int]] = defaultdict(list)
    for gg, sq in stuck:
        stuck_by_group[gg].append(sq)
    for g, e in enq.items():
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
        st_g, co_g = started[g], comp[g]
        progress = {m: (e.get(m, 0), st_g.get(m, 0), co_g.get(m, 0)) for m in info.ranks if m in by_rank}
        stalls.append(GroupStall(info.name, info.desc, info.kind, info.index, seq, ops_at.get((g, seq), ""),
                                 info.ranks, miss, nodump, tuple(sorted(stuck.get((g, seq), ()))), info.source,
                                 progress))
    stalls.sort(key=lambda s: (KIND_ORDER.get(s.kind, 5), len(s.members), s.pg))

    for (g, s, t, op), sends in p2p_timed.items():  # pair the i-th last send with the i-th last recv
        if op == "send" and not p2p_pending.get((g, s, t, "send")) and not p2p_pending.get((g, s, t, "recv")):
            recvs = p2p_timed.get((g, s, t, "recv"), [])
            for i, (a, b) in enumerate(zip(reversed(sends), reversed(recvs))):
                durations[(g, -1 - i, s, t)] = [a, b]  # type: ignore[index]
    slow_scores = _slow_scores(durations)
    slow = _strongest_per_group(
        [r for r, s in slow_scores.items() if s >= SLOW_MIN_SCORE], slow_scores, groups, keys)
    no_dump = tuple(r for r in range(world) if r not in by_rank)
    result = _decide(waits, all_sources, stalls, stuck, groups, p2p_waits, mismatches, slow, slow_scores, world,
                     tuple(sorted(by_rank)), no_dump, topology, n_entries)
    if dropped:
        note = f"{len(dropped)} rank(s) had two dumps; one kept each ({'; '.join(dropped[:3])})."
        result = replace(result, reasons=result.reasons + (note,))
    return result


def _richness(d: FRDump) -> tuple[int, int, int]:
    """Which of two dumps of one rank to keep: more entries, then frames (pickles), then newer."""
    newest = max((e.time_created_ns or 0 for e in d.entries), default=0)
    return (len(d.entries), int(any(e.frames for e in d.entries)), newest)


def _global(info: GroupInfo, local: int | None) -> int | None:
    if local is None or local < 0 or local >= len(info.ranks):
        return None
    return info.ranks[local]


def _world_from(dumps: Sequence[FRDump], memberships: Mapping[str, Sequence[int]] | None) -> int:
    hi = max(d.rank for d in dumps)
    for d in dumps:
        for cfg in d.pg_config.values():
            if cfg.ranks:
                hi = max(hi, max(cfg.ranks))
    for v in (memberships or {}).values():
        if v:
            hi = max(hi, max(int(x) for x in v))
    return hi + 1


def _mismatches(sigs: Mapping[tuple[GroupKey, int], Mapping[tuple, list[int]]],
                groups: Mapping[GroupKey, GroupInfo]) -> tuple[Mismatch, ...]:
    out = []
    for (g, seq), by_sig in sigs.items():
        if len(by_sig) < 2:
            continue
        info = groups[g]
        ranked = sorted(by_sig.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
        (ref, ref_ranks), rest = ranked[0], ranked[1:]
        majority = len(ref_ranks) > len(rest[0][1])
        for sig, ranks in rest:
            fld, exp, found = _diff(ref, sig)
            odd = tuple(sorted(ranks)) if majority else tuple(sorted(ranks + ref_ranks))
            out.append(Mismatch(info.name, info.desc, info.kind, seq, fld, odd, exp, found, majority))
    out.sort(key=lambda m: (not m.majority, m.seq, m.pg))
    return tuple(out)


def _diff(a: tuple, b: tuple) -> tuple[str, str, str]:
    if len(a) != len(b):
        return "op", f"{len(a)} op(s)", f"{len(b)} op(s)"
    for x, y in zip(a, b):
        if x[0] != y[0]:
            return "op", x[0], y[0]
        if x[1] != y[1]:
            return "sizes", f"{x[0]} {_shape(x[1])}", f"{y[0]} {_shape(y[1])}"
        if x[2:] != y[2:]:
            return "dtypes", f"{x[0]} {list(x[2])}->{list(x[3])}", f"{y[0]} {list(y[2])}->{list(y[3])}"
    return "op", str(a)[:80], str(b)[:80]


def _shape(sizes: Any) -> str:
    if sizes is None:
        return "?"
    ins, outs = sizes
    return f"in {[list(s) for s in ins]} out {[list(s) for s in outs]}"


def _strongest_per_group(cands: Sequence[int], scores: Mapping[int, float], groups: Mapping[GroupKey, GroupInfo],
                         keys: Mapping[int, Mapping[str, GroupKey]]) -> tuple[int, ...]:
    """Late ranks, minus those sharing a model-parallel group with a later one (its delay spreads to them)."""
    keep = []
    for r in cands:
        mine = {g for g in keys.get(r, {}).values() if groups[g].kind not in ("dp", "world")}
        if not any(o != r and scores[o] > scores[r] and mine & set(keys.get(o, {}).values()) for o in cands):
            keep.append(r)
    return tuple(sorted(keep))


def _slow_scores(durations: Mapping[tuple[GroupKey, int], list[tuple[int, float]]]) -> dict[int, float]:
    """Per rank, the median over its collectives of how much shorter its kernel was than the median's."""
    per_rank: dict[int, list[float]] = defaultdict(list)
    for items in durations.values():
        if len(items) < 2:
            continue
        med = statistics.median(d for _, d in items)
        if med <= 0:
            continue
        for r, d in items:
            per_rank[r].append((med - d) / med)
    return {r: statistics.median(v) for r, v in per_rank.items() if v}



def _decide(waits: Mapping[int, tuple[int, ...]], all_sources: Mapping[int, list[tuple[int, ...]]],
            stalls: Sequence[GroupStall],
            stuck: Mapping[tuple[GroupKey, int], list[int]], groups: Mapping[GroupKey, GroupInfo],
            p2p_waits: Sequence[tuple[GroupKey, int, int, str]], mismatches: tuple[Mismatch, ...],
            slow: tuple[int, ...], slow_scores: Mapping[int, float], world: int, dumped: tuple[int, ...],
            no_dump: tuple[int, ...], topology: Topology | None, n_entries: int) -> CollectiveAnalysis:
    """Turn the per-group facts into one finding with reasons and evidence."""
    node = (lambda r: (topology.node_of(r),) if topology is not None and r < topology.world_size else ())
    nodes = node_lookup(topology)
    common: dict[str, Any] = dict(world_size=world, dumped_ranks=dumped, stalls=tuple(stalls),
                                  mismatches=mismatches, slow_ranks=slow, slow_scores=dict(slow_scores),
                                  no_dump_ranks=no_dump, waits=dict(waits), n_groups=len(groups),
                                  n_entries=n_entries)
    reasons: list[str] = [f"{len(dumped)} of {world} ranks left a Flight Recorder dump ({n_entries} entries, "
                          f"{len(groups)} process groups)."]
    evidence: list[Evidence] = []
    if no_dump:
        evidence.append(Evidence("flight_recorder", "missing-dump", f"no Flight Recorder dump from rank(s) "
                                 f"{rank_ranges(no_dump)[:200]}", no_dump[:1000], nodes(no_dump[:1000]), 0.5))

    decided = [m for m in mismatches if m.majority] or list(mismatches)
    if decided:
        for m in decided[:10]:
            reasons.append(f"{_pg_words(m.pg, m.desc, m.kind)} collective #{m.seq}: rank(s) {rank_ranges(m.ranks)} "
                           f"issue {m.found} where {'the other members issue' if m.majority else 'others issue'} "
                           f"{m.expected} ({m.field} mismatch).")
            evidence.append(Evidence("flight_recorder", "collective-mismatch",
                                     f"{m.field} mismatch in pg {m.pg} #{m.seq}: {m.found} vs {m.expected}",
                                     m.ranks, nodes(m.ranks), 1.0 if m.majority else 0.5))
        reasons.append("Members of one collective disagree: a code or configuration fault (ranks run different "
                       "code paths, shapes or dtypes), not a machine fault; evicting machines will not fix it.")
        conf = 0.9 if decided[0].majority else 0.6
        return CollectiveAnalysis("mismatch", confidence=conf, reasons=tuple(reasons), evidence=tuple(evidence),
                                  **common)

    if waits:
        targets: set[int] = set()
        unique = {id(t): t for srcs in all_sources.values() for t in srcs}  # each op's missing set once
        for t in unique.values():
            targets.update(t)
        sinks = sorted(t for t in targets if t not in waits)
        no_dump_set = set(no_dump)
        alive = tuple(r for r in sinks if r not in no_dump_set)  # seen alive, waiting for nobody: strongest
        culprits = alive or tuple(sinks)
        if alive and len(alive) < len(sinks):
            reasons.append(f"Rank(s) {rank_ranges(sorted(no_dump_set & set(sinks)))[:200]} left no dump and are "
                           "waited for too; whether they reached their collective is unknown.")
        strong = bool(culprits)
        if not culprits:  # everyone waits for someone: a circular wait (ops issued in different orders)
            first = next((s for s in stalls if s.missing_ranks), None)
            culprits = first.missing_ranks if first else ()
            reasons.append("Every stuck rank waits for another stuck rank (a circular wait): collectives were "
                           "probably issued in different orders; the culprits below are a best guess.")
        cset = set(culprits)
        stop = next((s for s in stalls if cset & (set(s.missing_ranks) | set(s.no_dump_ranks))), None)
        p2p = [(g, r, peer, op) for g, r, peer, op in p2p_waits if peer in cset]
        n_waiting = len(waits)
        if stop is not None:
            missing = tuple(sorted(cset & (set(stop.missing_ranks) | set(stop.no_dump_ranks))))
            stopped = dict(stopped_pg=stop.pg, stopped_kind=stop.kind, stopped_index=stop.index,
                           stopped_members=stop.members, missing_ranks=missing)
            reasons.append(f"The wavefront stops in {_pg_words(stop.pg, stop.desc, stop.kind)}: collective "
                           f"#{stop.seq} ({stop.op or '?'}) was reached by {len(stop.waiting_ranks)} of "
                           f"{len(stop.members)} members; rank(s) {rank_ranges(missing)} never enqueued it.")
        elif p2p:
            g = p2p[0][0]
            info = groups[g]
            missing = tuple(sorted({peer for _, _, peer, _ in p2p}))
            stopped = dict(stopped_pg=info.name, stopped_kind=info.kind, stopped_index=info.index,
                           stopped_members=info.ranks, missing_ranks=missing)
            reasons.append(f"The wavefront stops in {_pg_words(info.name, info.desc, info.kind)}: rank(s) "
                           f"{rank_ranges(missing)} never posted the send/recv their pipeline peer waits in.")
        else:
            stopped = dict(missing_ranks=culprits)
        reasons.append(f"{n_waiting} rank(s) wait in unfinished collectives; following who waits for whom ends "
                       f"at rank(s) {rank_ranges(culprits)[:200]}, which wait for nobody: the culprit(s).")
        for r in culprits[:50]:
            evidence.append(Evidence("flight_recorder", *_culprit_words(r, stalls, p2p, groups, no_dump),
                                     (r,), node(r), 1.0 if strong else 0.5))
        if stop is not None and stop.waiting_ranks:
            evidence.append(Evidence("flight_recorder", "waiting-in-collective",
                                     f"{len(stop.waiting_ranks)} rank(s) wait in pg {stop.pg} #{stop.seq} "
                                     f"({stop.op})", stop.waiting_ranks[:1000], (), 0.2))
        if cset & set(no_dump):
            reasons.append(f"Rank(s) {rank_ranges(sorted(cset & set(no_dump)))} left no dump: their process or "
                           "node is probably gone.")
        conf = (0.9 if strong else 0.5) - (0.1 if cset & set(no_dump) else 0.0)
        return CollectiveAnalysis("hang", culprit_ranks=culprits, confidence=conf, reasons=tuple(reasons),
                                  evidence=tuple(evidence), **stopped, **common)

    joined = [s for s in stalls if s.waiting_ranks and not s.missing_ranks]
    if joined:
        s = joined[0]
        reasons.append(f"Every dumped member of {_pg_words(s.pg, s.desc, s.kind)} entered collective #{s.seq} "
                       f"({s.op}) but it never completed: the fault is inside the collective (network, NIC or GPU "
                       f"of one of its {len(s.members)} ranks), not a rank that failed to join.")
        evidence.append(Evidence("flight_recorder", "stuck-collective", f"pg {s.pg} #{s.seq} ({s.op}) entered by all "
                                 f"{len(s.waiting_ranks)} dumped members, never completed", s.members[:1000],
                                 nodes(s.members), 0.6))
        return CollectiveAnalysis("hang", stopped_pg=s.pg, stopped_kind=s.kind, stopped_index=s.index,
                                  stopped_members=s.members, confidence=0.6, reasons=tuple(reasons),
                                  evidence=tuple(evidence), **common)

    if slow:
        for r in slow[:20]:
            evidence.append(Evidence("flight_recorder", "slow-rank",
                                     f"rank {r}'s collective kernels are {slow_scores[r]:.0%} shorter than its peers' "
                                     "(everyone waits for it to arrive)", (r,), node(r), float(slow_scores[r])))
        reasons.append(f"Every collective completed, but rank(s) {rank_ranges(slow)} arrive late at their "
                       "collectives (their peers' kernels wait for them): fail-slow.")
        return CollectiveAnalysis("fail-slow", culprit_ranks=slow, confidence=0.7, reasons=tuple(reasons),
                                  evidence=tuple(evidence), **common)
    if len(no_dump) > world // 2:
        reasons.append("Too few dumps to tell a healthy job from a hang.")
        return CollectiveAnalysis("inconclusive", confidence=0.2, reasons=tuple(reasons), evidence=tuple(evidence),
                                  **common)
    behind = [s for s in stalls if s.missing_ranks]
    if behind:
        s = behind[0]
        reasons.append(f"Nobody waits in an unfinished collective, yet rank(s) {rank_ranges(s.missing_ranks)} are "
                       f"behind in {_pg_words(s.pg, s.desc, s.kind)} (#{s.seq}): dumps taken mid-step?")
        return CollectiveAnalysis("inconclusive", confidence=0.3, reasons=tuple(reasons), evidence=tuple(evidence),
                                  **common)
    reasons.append("Every recorded collective completed on every member and members agree on op, sizes and dtypes.")
    return CollectiveAnalysis("healthy", confidence=0.8 if not no_dump else 0.6, reasons=tuple(reasons),
                              evidence=tuple(evidence), **common)


def _pg_words(name: str, desc: str, kind: str) -> str:
    d = f" {desc}" if desc and desc != "undefined" else ""
    return f"pg {name}{d} [{kind}]"


def _culprit_words(r: int, stalls: Sequence[GroupStall], p2p: Sequence[tuple[GroupKey, int, int, str]],
                   groups: Mapping[GroupKey, GroupInfo], no_dump: tuple[int, ...]) -> tuple[str, str]:
    for s in stalls:
        if r in s.missing_ranks:
            return ("missing-from-collective", f"rank {r} never enqueued collective #{s.seq} ({s.op}) of "
                    f"{_pg_words(s.pg, s.desc, s.kind)}, which {len(s.waiting_ranks)} member(s) wait in")
    for g, waiter, peer, op in p2p:
        if peer == r:
            other = "send" if op == "recv" else "recv"
            return ("p2p-peer-behind", f"rank {r} never posted the {other} that rank {waiter} waits for in {op} "
                    f"({_pg_words(groups[g].name, groups[g].desc, groups[g].kind)})")
    if r in no_dump:
        return ("missing-dump", f"rank {r} left no Flight Recorder dump and other ranks wait for it")
    return ("waited-for", f"ranks wait for rank {r}, which waits for nobody")
