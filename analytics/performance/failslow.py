"""Fail-slow from stacks and steps: the classifiers that tell a slow job from a hung or healthy one.

The other fail-slow evidence lives beside this module: metric outliers among peers (:mod:`.metrics`)
and timing stragglers (:mod:`.stragglers`), folded into one verdict by :mod:`.verdict`.

- Rounds of stack snapshots (ByteRobust's MFU-decline mode, every 10 s for 5 rounds): each round
  flags the parallel group holding significantly more outlier ranks than chance; after all rounds
  the group flagged most often is the degrader (:func:`degrader`), and a rank running its own code
  in far more rounds than chance is the slow rank inside it.
- Steps overrule a stack "hang" (:func:`steps_overrule`): stacks that look frozen while the step
  records show steps completing between the snapshots are a slow job, not a hung one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rankscope.analytics.faultdomain import cover
from rankscope.analytics.verdict import Severity, SuspectGroup, Verdict
from rankscope.datasets.domain.topology import KINDS, Topology


class Round(Protocol):
    """What a vote needs of one snapshot (the stacks' ``Round`` is one)."""

    @property
    def snapshot(self) -> int: ...

    @property
    def outlier_ranks(self) -> tuple[int, ...]: ...

    @property
    def busy_ranks(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class RoundFlag:
    snapshot: int
    kind: str  # a parallel kind, or "node"
    group: int
    n_outliers: int
    p_value: float


@dataclass(frozen=True)
class Degrader:
    """The group to isolate after all rounds, why, and the ranks inside it that kept others waiting."""

    group: SuspectGroup
    flags: int  # rounds in which the voted group was flagged (or the culprit was busy)
    rounds: int
    per_round: tuple[RoundFlag, ...]
    culprit_ranks: tuple[int, ...]
    culprit_counts: Mapping[int, int]
    voted: tuple[str, int] | None  # (kind, group) that won the vote, if any

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.group.ranks

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.group.nodes


def _groups(topology: Topology) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(kind, group id per rank, size per group) for every parallel kind and for nodes."""
    out = []
    for kind in (k for k in KINDS if k in topology.kinds()):
        gid = topology.group_ids(kind)
        out.append((kind, gid, np.full(topology.n_groups(kind), topology.group_size(kind))))
    node_sizes = np.bincount(topology.node_index, minlength=len(topology.node_names))
    out.append(("node", topology.node_index, node_sizes))
    return out


def flag_round(a: Round, topology: Topology, *, alpha: float = 0.01) -> RoundFlag | None:
    """The group holding significantly more outliers than chance in one round, if any.

    "Most outliers" is measured against the round's outlier rate: a group's count is tested with a
    binomial tail (Bonferroni over all groups tested); the most significant group is flagged, ties
    going to the smaller group. Raw counts would always favour the largest groups and, in a
    healthy job with outliers everywhere, flag some group every round.
    """
    if len(a.outlier_ranks) < 2:
        return None
    from scipy.stats import binom

    out = np.asarray(a.outlier_ranks, dtype=np.int64)
    rate = out.size / topology.world_size
    if rate >= 0.5:
        return None
    kinds = _groups(topology)
    n_tests = sum(sizes.size for _, _, sizes in kinds)
    best = None
    for order, (kind, gid, sizes) in enumerate(kinds):
        counts = np.bincount(gid[out], minlength=sizes.size)
        cand = np.flatnonzero(counts >= 2)
        if cand.size == 0:
            continue
        pv = binom.sf(counts[cand] - 1, sizes[cand], rate)
        i = int(np.argmin(pv))
        key = (float(pv[i]), int(sizes[cand[i]]), order)
        if best is None or key < best[0]:
            best = (key, RoundFlag(a.snapshot, kind, int(cand[i]), int(counts[cand[i]]), float(pv[i])))
    if best is None or best[1].p_value > alpha / n_tests:
        return None
    return best[1]


def _members(topology: Topology, kind: str, group: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    if kind == "node":
        ranks = topology.ranks[topology.node_index == group]
        return tuple(int(r) for r in ranks), (topology.node_names[group],)
    g = topology.group(kind, group)
    return g.ranks, g.nodes


def degrader(
    rounds: Sequence[Round], topology: Topology, *, alpha: float = 0.01, min_votes: int = 1
) -> Degrader | None:
    """Vote over rounds, and find the ranks that persistently keep the others waiting.

    Votes: each round flags one group (:func:`flag_round`); the most-flagged group wins when it has
    at least ``min_votes``. Persistence: a rank running its own code (not waiting) in significantly
    more rounds than the job's base rate is a slow rank (its peers keep waiting for it); it is the
    culprit. When the voted group does not contain it (the vote can land on its victims, e.g. the
    next pipeline stage), the degrader is the smallest cover of both; without a vote, the culprits'
    own cover (this also catches a lone slow rank in a pure data-parallel job).
    """
    from scipy.stats import binom

    flags = [f for f in (flag_round(a, topology, alpha=alpha) for a in rounds) if f is not None]
    counts: Counter[int] = Counter()
    rates = []
    for a in rounds:
        counts.update(a.busy_ranks)
        rates.append(len(a.busy_ranks) / topology.world_size)
    base = max(float(np.mean(rates)) if rates else 0.0, 1e-6)
    persistent = {
        r: k
        for r, k in counts.items()
        if k >= min_votes and base < 0.5 and binom.sf(k - 1, len(rounds), base) <= alpha / topology.world_size
    }
    voted: tuple[tuple[str, int], int] | None = None
    if flags:
        votes = Counter((f.kind, f.group) for f in flags)
        voted = max(votes.items(), key=lambda kv: (kv[1], -len(_members(topology, *kv[0])[0])))
    have_vote = voted is not None and voted[1] >= min_votes
    if persistent:
        top = max(persistent.values())
        culprits = tuple(sorted(r for r, k in persistent.items() if k == top))
    elif have_vote and voted is not None:
        members = set(_members(topology, *voted[0])[0])
        inside = {r: k for r, k in counts.items() if r in members}
        top = max(inside.values(), default=0)
        culprits = tuple(sorted(r for r, k in inside.items() if k == top and k * 2 >= len(rounds)))
    else:
        culprits = ()
    group: SuspectGroup | None
    if have_vote and voted is not None:
        (kind, gidx), n = voted
        ranks, nodes = _members(topology, kind, gidx)
        group = SuspectGroup(kind, (gidx,), ranks, nodes)
        if culprits and not set(culprits) <= set(ranks):
            group = cover(sorted(set(ranks) | set(culprits)), topology) or group
    elif culprits:
        group = cover(culprits, topology)
        n = max(counts[r] for r in culprits)
        if group is None:
            return None
    elif voted is not None:
        (kind, gidx), n = voted  # too few votes: reported, and judged by the caller
        ranks, nodes = _members(topology, kind, gidx)
        group = SuspectGroup(kind, (gidx,), ranks, nodes)
    else:
        return None
    return Degrader(
        group, n, len(rounds), tuple(flags), culprits, {r: counts[r] for r in culprits}, voted[0] if voted else None
    )


def steps_overrule(v: Verdict, timings: Any, snapshot_times: Mapping[int, float]) -> Verdict:
    """A "hang" over several snapshots while steps kept completing between them is fail-slow.

    Stacks sampled seconds apart can look frozen when every sample catches the same slow rank in
    the same place (a rank that sleeps or spins 2 s per step) while the job still advances; the
    step records settle it.
    """
    import polars as pl

    times = sorted(t for t in snapshot_times.values() if t is not None)
    if len(times) < 2 or not {"start_s", "duration_s", "step"} <= set(timings.columns):
        return v
    t0, t1 = times[0], times[-1]
    done = (
        timings.filter(pl.col("start_s").is_not_null())
        .with_columns((pl.col("start_s") + pl.col("duration_s")).alias("end_s"))
        .filter((pl.col("end_s") > t0) & (pl.col("end_s") <= t1))
    )
    if done.height == 0:
        return v
    steps = done.get_column("step").n_unique()
    reason = (
        f"The stacks look the same in every snapshot, but {steps} step(s) completed between the first and "
        f"the last snapshot ({t1 - t0:.0f} s apart): the job is slow, not hung; the outliers are where it "
        "waits on the slow rank(s)."
    )
    return v.with_updates(
        verdict=Severity.FAIL_SLOW, reasons=(reason, *v.reasons), details={**v.details, "steps_during_snapshots": steps}
    )
