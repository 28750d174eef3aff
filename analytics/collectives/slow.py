"""Late arrivals and disagreements among the members of a collective (Flight Recorder).

``duration_ms`` (NCCL with ``TORCH_NCCL_ENABLE_TIMING``) is each member's kernel time: a collective's
kernel runs until the last member arrives, so the member everyone waits for has the shortest kernel.
A rank is *late* in a collective when its kernel is clearly the shortest (at most ``1 - slow_min_score``
of the next shortest). Arrival order is noise in a healthy job: each member of a group of ``n`` is last
about ``1/n`` of the time, and a rank with a little extra work (rank 0 logging) is last often but costs
its peers little. So a rank is **slow** only where all three hold, in a group of interchangeable
members (TP, CP, EP, DP: the same code on every member): it is late in many of the group's collectives
(at least 4), far more often than chance (binomial tail under ``1/n`` below 1e-3), and its peers spend
at least ``slow_min_wait_fraction`` of the group's recorded time waiting for it. Differing ops, sizes
or dtypes at one seq id are a code/config fault (``mismatch``).
"""

from __future__ import annotations

import math
import operator
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rankscope.analytics.collectives.groups import GroupInfo, GroupKey
from rankscope.analytics.collectives.result import Mismatch
from rankscope.analytics.collectives.tables import (
    DurationKey,
    Signature,
    Sizes,
)

SYMMETRIC_KINDS = ("tp", "cp", "ep", "dp")
"""Group kinds whose members run the same code: a member that is always last is anomalous there."""
_MIN_LATE = 4
_MAX_P = 1e-3
_DURATION = operator.itemgetter(1)


@dataclass(frozen=True)
class Lateness:
    """One rank in one group: how often it arrived last and what that cost its peers."""

    rank: int
    group: GroupKey
    n: int  # the group's timed collectives the rank is in
    late: int  # those it arrived clearly last to
    wait_fraction: float  # its peers' wait for it over the group's recorded time span
    p_value: float  # chance of being last so often in a healthy group (1.0 below _MIN_LATE: never flagged)


def _binom_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space: a 2,000-entry ring buffer holds groups of over
    a thousand timed collectives, where ``math.comb(n, i)`` no longer fits a float."""
    if k <= 0 or p >= 1.0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if n <= 1000:  # exact and fast: math.comb(1000, 500) ~ 2.7e299 still fits a float
        return min(sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)), 1.0)
    lp, lq, top = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    total = 0.0
    for i in range(k, n + 1):
        term = math.exp(top - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
        total += term
        if i > n * p and term <= total * 1e-17:  # past the mode the terms only shrink
            break
    return min(total, 1.0)


def lateness(
    durations: Mapping[DurationKey, list[tuple[int, float]]],
    created: Mapping[DurationKey, list[int]],
    groups: Mapping[GroupKey, GroupInfo],
    min_score: float,
) -> list[Lateness]:
    """Every (rank, symmetric group) that arrived clearly last at least once, with its statistics."""
    n: dict[tuple[int, GroupKey], int] = defaultdict(int)
    late: dict[tuple[int, GroupKey], int] = defaultdict(int)
    extra: dict[tuple[int, GroupKey], float] = defaultdict(float)
    p0: dict[tuple[int, GroupKey], float] = defaultdict(float)
    span: dict[GroupKey, list[int]] = {}
    symmetric = {g for g, info in groups.items() if info.kind in SYMMETRIC_KINDS}
    for key, items in durations.items():  # (hot: every timed collective of the ring buffers)
        gk = key[0]
        if len(items) < 2 or gk not in symmetric:
            continue
        ts = created.get(key, ())
        if ts:
            lo, hi = min(ts), max(ts)
            lo_hi = span.get(gk)
            if lo_hi is None:
                span[gk] = [lo, hi]
            else:
                lo_hi[0], lo_hi[1] = min(lo_hi[0], lo), max(lo_hi[1], hi)
        share = 1.0 / len(items)
        for r, _ in items:
            member = (r, gk)
            n[member] += 1
            p0[member] += share
        ranked = sorted(items, key=_DURATION)
        (r0, d0), (_, d1) = ranked[0], ranked[1]
        if d0 <= (1.0 - min_score) * d1:
            late[(r0, gk)] += 1
            extra[(r0, gk)] += statistics.median([d for r, d in ranked if r != r0]) - d0
    out = []
    for (r, g), k in late.items():
        total = n[(r, g)]
        lo, hi = span.get(g, (0, 0))
        seconds = (hi - lo) / 1e9
        frac = (extra[(r, g)] / 1e3) / seconds if seconds > 0 else 0.0
        p = _binom_tail(k, total, p0[(r, g)] / total) if k >= _MIN_LATE else 1.0  # fewer is never flagged
        out.append(Lateness(r, g, total, k, frac, p))
    return out


def slow_ranks(
    lates: Sequence[Lateness], groups: Mapping[GroupKey, GroupInfo], min_wait_fraction: float
) -> tuple[tuple[int, ...], dict[int, float]]:
    """The slow ranks (see the module docstring) and every late rank's strongest wait fraction.

    A rank late in its data-parallel group because a model-parallel peer is slow (its whole replica
    arrives late) is explained by that peer, flagged in the tighter group, and is not named."""
    scores: dict[int, float] = {}
    flagged: dict[int, set[str]] = defaultdict(set)
    for x in lates:
        scores[x.rank] = max(scores.get(x.rank, 0.0), round(x.wait_fraction, 4))
        if x.late >= _MIN_LATE and x.p_value <= _MAX_P and x.wait_fraction >= min_wait_fraction:
            flagged[x.rank].add(groups[x.group].kind)
    tight = {r for r, kinds in flagged.items() if kinds - {"dp"}}
    replica: dict[int, set[int]] = defaultdict(set)  # rank -> ranks it shares a model-parallel group with
    if len(tight) < len(flagged):
        for info in groups.values():
            if info.kind not in ("dp", "world", "other") and tight & set(info.ranks):
                for r in info.ranks:
                    replica[r].update(info.ranks)
    slow = {r for r in flagged if r in tight or not (replica.get(r, set()) & tight)}
    return tuple(sorted(slow)), scores


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
