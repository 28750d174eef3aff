"""Late arrivals and disagreements among the members of a collective (Flight Recorder).

``duration_ms``, when recorded, gives late-arrival scores: the rank everyone waits for has the
shortest kernel. Differing ops, sizes or dtypes at one seq id are a code/config fault (``mismatch``).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence

from rankscope.analytics.collectives.groups import GroupInfo, GroupKey
from rankscope.analytics.collectives.result import Mismatch
from rankscope.analytics.collectives.tables import (
    DurationKey,
    ProgressTables,
    Signature,
    Sizes,
)


def pair_p2p_durations(t: ProgressTables) -> None:
    """Pair the i-th last completed send with the i-th last recv of each (src, dst) as one 'collective'."""
    for (g, s, d, op), sends in t.p2p_timed.items():
        if op == "send" and not t.p2p_pending.get((g, s, d, "send")) and not t.p2p_pending.get((g, s, d, "recv")):
            recvs = t.p2p_timed.get((g, s, d, "recv"), [])
            for i, (a, b) in enumerate(zip(reversed(sends), reversed(recvs))):
                t.durations[(g, -1 - i, s, d)] = [a, b]


def slow_scores(durations: Mapping[DurationKey, list[tuple[int, float]]]) -> dict[int, float]:
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


def strongest_per_group(
    cands: Sequence[int],
    scores: Mapping[int, float],
    groups: Mapping[GroupKey, GroupInfo],
    keys: Mapping[int, Mapping[str, GroupKey]],
) -> tuple[int, ...]:
    """Late ranks, minus those sharing a model-parallel group with a later one (its delay spreads to them)."""
    keep = []
    for r in cands:
        mine = {g for g in keys.get(r, {}).values() if groups[g].kind not in ("dp", "world")}
        if not any(o != r and scores[o] > scores[r] and mine & set(keys.get(o, {}).values()) for o in cands):
            keep.append(r)
    return tuple(sorted(keep))


def mismatches(
    sigs: Mapping[tuple[GroupKey, int], Mapping[tuple[Signature, ...], list[int]]], groups: Mapping[GroupKey, GroupInfo]
) -> tuple[Mismatch, ...]:
    """Collectives whose members disagree; the majority's signature is the expected one."""
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


def _diff(a: tuple[Signature, ...], b: tuple[Signature, ...]) -> tuple[str, str, str]:
    if len(a) != len(b):
        return "op", f"{len(a)} op(s)", f"{len(b)} op(s)"
    for x, y in zip(a, b):
        if x[0] != y[0]:
            return "op", str(x[0]), str(y[0])
        if x[1] != y[1]:
            return "sizes", f"{x[0]} {_shape(x[1])}", f"{y[0]} {_shape(y[1])}"
        if x[2:] != y[2:]:
            return "dtypes", f"{x[0]} {list(x[2])}->{list(x[3])}", f"{y[0]} {list(y[2])}->{list(y[3])}"
    return "op", str(a)[:80], str(b)[:80]


def _shape(sizes: Sizes | None) -> str:
    if sizes is None:
        return "?"
    ins, outs = sizes
    return f"in {[list(s) for s in ins]} out {[list(s) for s in outs]}"
