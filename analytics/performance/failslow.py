"""Fail-slow from stacks and steps: the evidence that tells a slow job from a hung or a healthy one.

The other fail-slow evidence lives beside this module: metric outliers among peers (:mod:`.metrics`)
and timing stragglers (:mod:`.stragglers`), folded into one verdict by :mod:`.decide`.

- Rounds of stack snapshots (ByteRobust's fail-slow mode, every 10 s for 5 rounds; :func:`vote`): in
  each round a rank is *flagged* when its stack is an outlier of that round's clustering and it runs its
  own code (compute, I/O, a local wait, waiting on its own DataLoader) - an outlier that waits in a
  collective or a transfer is a victim of the rank it waits for; and, in a second tally, when it runs its own
  code while every other member of its tightest group in a stage (TP, else CP, EP, else DP but rank 0) waits in
  a collective: its group waits for it, whatever stack it runs (in a healthy pipeline whole TP groups share a
  forward's stack).
  Flags accumulate per rank and per tally, each tally against its own rate by chance. The degrader
  is flagged in most rounds, clearly more often than its symmetric peers (the same slot in the other
  data-parallel replicas, which run the same code), and more often than chance at the job's rate of
  busy outliers across all its ranks (family-wise: at most 0.05 ranks of the job expected as often, or
  0.2 when the job's dominant ranks were blocked every time it was flagged - they waited for it). One
  fault domain at a time: its tightest group inside a pipeline stage is evicted, its node first. The
  outliers may shift from round to round, and the dumps may come in mixed formats with per-node install
  prefixes: states and clusters are compared, never raw stacks.
- Step records (:func:`step_evidence`): steps completed up to a stop prove the job was progressing,
  a capture long after the last step proves it was stuck, and a step-time change point proves it slowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankscope.analytics.faultdomain import intra_stage_kind
from rankscope.analytics.verdict import SuspectGroup
from rankscope.datasets.domain.topology import Topology

PEER_MARGIN = 2
"""A degrader is flagged in at least this many more rounds than any of its symmetric peers."""
MIN_FLAGS = 3
"""A degrader is flagged in at least this many rounds (ByteRobust takes 5 rounds, 10 s apart); 2 when the
job's steps are known to have slowed down (the question is then only who slowed it)."""
CHANCE = 0.2
"""At most this many ranks of the whole job may be expected to be flagged as often by chance, when the job
waited (:data:`BLOCKED`) in every round the rank was flagged: the others were waiting for it."""
CHANCE_ALONE = 0.05
"""... and at most this many whatever the rest of the job was doing."""
BLOCKED = 0.9


@dataclass(frozen=True)
class RoundStates:
    """What a vote needs of one round, per rank: whether it runs its own code (``own``: compute, I/O, a
    local wait, waiting on its own DataLoader or checkpoint writer), whether its stack is an outlier of the
    round's clustering (``outlier``), and whether it has a usable stack at all (``has``)."""

    snapshot: int
    own: np.ndarray
    outlier: np.ndarray
    has: np.ndarray
    blocked: float = 0.0  # the share of the round's dominant ranks blocked in a wait
    laggard: np.ndarray | None = None
    """Ranks running their own code while every other member of their tightest group inside a stage (TP, else
    CP, EP) waits in a collective: the group waits for them, whatever other groups run (None: not known)."""


def flag_round(r: RoundStates) -> np.ndarray:
    """The ranks flagged in one round (a boolean per rank): stack outliers that run their own code. An outlier
    that waits in a collective or a transfer is a victim of the rank it waits for, not a slow rank; a rank
    running the same code as the dominant ranks is not an outlier."""
    return r.own & r.outlier & r.has


def flag_laggards(r: RoundStates) -> np.ndarray:
    """The ranks their own group waited for in one round (:attr:`RoundStates.laggard`)."""
    return r.own & r.has & r.laggard if r.laggard is not None else np.zeros_like(r.has)


@dataclass(frozen=True)
class Degrader:
    """The slow rank(s) after all rounds, the group to isolate, and how the vote went."""

    group: SuspectGroup
    culprit_ranks: tuple[int, ...]
    culprit_counts: Mapping[int, int]  # rounds in which each culprit was flagged
    peer_counts: Mapping[int, int]  # the most any symmetric peer of each culprit was flagged
    rounds: int
    per_round: tuple[tuple[int, tuple[int, ...]], ...]  # (snapshot, flagged ranks)
    p_values: Mapping[int, float] = field(default_factory=dict)  # ranks expected flagged this often by chance

    @property
    def flags(self) -> int:
        return max(self.culprit_counts.values(), default=0)

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.group.ranks

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.group.nodes


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p) (n is a handful of rounds: summed exactly)."""
    p = min(max(p, 0.0), 1.0)
    return float(sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(max(k, 0), n + 1)))


def _peers(rank: int, topology: Topology) -> np.ndarray:
    """The symmetric peers of ``rank``: the same TP/CP/EP/PP slot in the other data-parallel replicas (they run
    the same code); without replicas, every rank outside its tightest group."""
    if topology.sizes["dp"] > 1:
        gid = topology.group_ids("dp")
    else:
        kind = intra_stage_kind(topology)
        own = topology.group_ids(kind) if kind else topology.ranks
        return np.flatnonzero(own != own[rank])
    peers = np.flatnonzero(gid == gid[rank])
    return peers[peers != rank]


def eviction_group(ranks: Sequence[int], topology: Topology, *, max_fraction: float) -> SuspectGroup | None:
    """The nodes to isolate for slow ``ranks``: their tightest group inside a pipeline stage (TP, else CP,
    EP; usually one node), their own nodes when there is none or it is too large; culprit nodes first."""
    culprits = np.unique(np.asarray(ranks, dtype=np.int64))
    own_idx = list(dict.fromkeys(topology.node_index[culprits].tolist()))
    limit = max(1, int(max_fraction * len(topology.node_names)))
    kind = intra_stage_kind(topology)
    if kind is not None:
        gid = topology.group_ids(kind)
        groups = np.unique(gid[culprits])
        members = topology.ranks[np.isin(gid, groups)]
        idx = own_idx + [i for i in dict.fromkeys(topology.node_index[members].tolist()) if i not in own_idx]
        if len(idx) <= limit:
            return SuspectGroup(
                kind,
                tuple(int(g) for g in groups),
                tuple(int(r) for r in members),
                tuple(topology.node_names[i] for i in idx),
            )
    if len(own_idx) > limit:
        return None
    members = topology.ranks[np.isin(topology.node_index, own_idx)]
    return SuspectGroup(
        "node", tuple(own_idx), tuple(int(r) for r in members), tuple(topology.node_names[i] for i in own_idx)
    )


@dataclass(frozen=True)
class Candidate:
    """A rank flagged often: in how many rounds, the most any symmetric peer was, and how many ranks of the
    whole job would be flagged that often by chance (at the job's rate of busy outliers)."""

    rank: int
    flags: int
    peer_max: int
    expected_by_chance: float


@dataclass(frozen=True)
class Vote:
    """The vote over the rounds: the degrader when one stands out, else the best candidate that did not."""

    degrader: Degrader | None
    rounds: int
    near_miss: Candidate | None = None
    others: tuple[Candidate, ...] = ()  # ranks that stood out too, in unrelated groups (not evicted)


def vote(
    rounds: Sequence[RoundStates],
    topology: Topology,
    *,
    min_flag_fraction: float = 0.6,
    max_fraction: float = 0.5,
    margin: int = PEER_MARGIN,
    alpha: float = CHANCE,
    alpha_alone: float = CHANCE_ALONE,
    min_flags: int = MIN_FLAGS,
) -> Vote:
    """ByteRobust's vote over rounds: the rank(s) flagged in at least ``min_flag_fraction`` of the rounds (and
    ``min_flags``), at least ``margin`` rounds more than any symmetric peer, and more often than chance:
    at the job's rate of busy outliers, at most ``alpha_alone`` ranks of the whole job would be flagged that
    often (binomial tail times the number of ranks), or at most ``alpha`` when the job's dominant ranks were
    blocked in every round the rank was flagged (they were waiting for it). No degrader when no rank stands
    out (or the slow ranks would take more than ``max_fraction`` of the nodes)."""
    n = len(rounds)
    if not rounds:
        return Vote(None, 0)
    need = max(min_flags, 2, math.ceil(min_flag_fraction * n))
    rank_rounds = int(sum(int(np.count_nonzero(r.has)) for r in rounds))
    per_round = []
    cands: list[Candidate] = []
    keep: list[Candidate] = []
    # two tallies, each against its own rate by chance: stack outliers running their own code, and ranks their
    # own group waited for (a rank of a healthy pipeline often runs a stack other groups share)
    for flag in (flag_round, flag_laggards):
        flags = [flag(r) for r in rounds]
        counts: np.ndarray = np.asarray(flags, dtype=np.int64).sum(axis=0)
        per_round.append(flags)
        total = int(counts.sum())
        if total == 0:
            continue
        for r in np.flatnonzero(counts >= min(need, max(2, int(counts.max())))).tolist():
            peers = _peers(r, topology)
            pmax = int(counts[peers].max()) if peers.size else 0
            # the job's rate of such flags (without this rank): how many ranks would be flagged this often by chance
            p_job = max((total - int(counts[r])) / max(1, rank_rounds - n), 0.5 / max(1, rank_rounds))
            c = Candidate(r, int(counts[r]), pmax, binomial_tail(int(counts[r]), n, p_job) * topology.world_size)
            cands.append(c)
            waited = all(rnd.blocked >= BLOCKED for rnd, f in zip(rounds, flags) if f[r])  # blocked whenever flagged
            if (
                c.flags >= need
                and c.flags >= c.peer_max + margin
                and (c.expected_by_chance <= alpha_alone or (c.expected_by_chance <= alpha and waited))
            ):
                keep.append(c)
    keep = list({c.rank: c for c in sorted(keep, key=lambda c: -c.expected_by_chance)}.values())  # the stronger
    per_round_flags = tuple(
        (r.snapshot, tuple(int(x) for x in np.flatnonzero(a | b)[:50])) for r, a, b in zip(rounds, *per_round)
    )
    best = max(cands, key=lambda c: (c.flags - c.peer_max, -c.expected_by_chance), default=None)
    if not keep:
        return Vote(None, n, best)
    # one fault domain at a time: the strongest degrader's group; others in unrelated groups are reported
    keep.sort(key=lambda c: (-c.flags, c.expected_by_chance))
    kind = intra_stage_kind(topology)
    gid = topology.group_ids(kind) if kind else topology.node_index
    others = tuple(c for c in keep if gid[c.rank] != gid[keep[0].rank])
    keep = [c for c in keep if gid[c.rank] == gid[keep[0].rank]]
    group = eviction_group([c.rank for c in keep], topology, max_fraction=max_fraction)
    if group is None:
        return Vote(None, n, best)
    d = Degrader(
        group,
        tuple(c.rank for c in keep),
        {c.rank: c.flags for c in keep},
        {c.rank: c.peer_max for c in keep},
        n,
        per_round_flags,
        {c.rank: c.expected_by_chance for c in keep},
    )
    return Vote(d, n, others=others)


def degrader(rounds: Sequence[RoundStates], topology: Topology, **kw: Any) -> Degrader | None:
    """The degrader of :func:`vote`, or None."""
    return vote(rounds, topology, **kw).degrader


# -- steps -----------------------------------------------------------------------------------------

PROGRESS_STEPS = 3.0
"""A stop within this many step times of the last completed step is a stop while progressing."""
HANG_STEPS = 10.0
"""A capture this many step times (and at least :data:`HANG_MIN_SECONDS`) after the last step: stuck."""
HANG_MIN_SECONDS = 2.0
SLOWDOWN_RATIO = 1.5
"""Steps this much slower than before (a change point that lasts to the stop): the job slowed down."""
MIN_SEGMENT = 5


@dataclass(frozen=True)
class StepEvidence:
    """What the job's step records say about the snapshots (epoch seconds).

    ``progressing``: steps kept completing up to the last snapshot (a step completed after the previous
    snapshot's time, or within a few step times of the stop's latest possible time); ``stuck``: the last
    snapshot was taken long after the last step (from a time written in the evidence, never a file time);
    ``slowdown``: (before, after, first slow step) when the step time rose and stayed up to the stop.
    ``source``: ``steps`` (step records), or ``flight_recorder`` when no step was recorded but Flight Recorder
    captures taken with the stack rounds show every waiting rank moved on in between (progress, no step count).
    """

    last_step_end: float
    cadence_s: float
    n_steps: int
    progressing: bool
    stuck: bool
    slowdown: tuple[float, float, int] | None
    words: tuple[str, ...]
    source: str = "steps"  # or "flight_recorder": its captures, taken with the stack rounds, show the ranks moved
    between_rounds: bool | None = None
    """Whether a step completed between the first and the last snapshot's time: the rounds saw the job at
    different steps. False: none did (the rounds caught one stall several times, as good as one snapshot);
    None: unknown (fewer than two snapshots with a time, or times too close to tell: see :func:`stepped_between`)."""


def stepped_between(
    ends: Any,
    snapshot_times: Mapping[int, float | None],
    snapshot_latest: Mapping[int, float] | None = None,
    snapshots: Any = None,
) -> bool | None:
    """Whether any of the step end times ``ends`` lies strictly between the earliest and the latest of the
    snapshots' times (``snapshots``: those to consider, default all). A snapshot without a time written in the
    evidence takes its files' modification time (``snapshot_latest``). None with fewer than two timed ones, or
    with times less than :data:`MIN_ROUNDS_SPAN_S` apart (a copy gives files one time)."""
    timed = {**(snapshot_latest or {}), **snapshot_times}
    times = [t for s, t in timed.items() if t is not None and (snapshots is None or s in snapshots)]
    if len(times) < 2 or max(times) - min(times) < MIN_ROUNDS_SPAN_S:
        return None  # rounds a second apart, or file times a copy made alike: no window to look in
    lo, hi = min(times), max(times)
    return any(lo < float(e) < hi for e in ends)


MIN_ROUNDS_SPAN_S = 1.0
"""Snapshot times closer together than this tell nothing of steps between them (a copy gives files one time)."""


def _per_step(timings: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per completed step of the job (ordered): step number, end time (latest over ranks), duration (longest)."""
    import polars as pl

    cols = set(timings.columns)
    if not {"step", "duration_s", "start_s"} <= cols:
        return None
    df = timings
    if "op" in cols:
        df = df.filter(pl.col("op") == "step")
    df = df.filter(pl.col("start_s").is_not_null() & pl.col("duration_s").is_not_null())
    if df.height == 0:
        return None
    agg = (
        df.with_columns((pl.col("start_s") + pl.col("duration_s")).alias("end_s"))
        .group_by("step")
        .agg(pl.col("end_s").max(), pl.col("duration_s").max())
        .sort("step")
    )
    return (
        agg["step"].to_numpy(),
        agg["end_s"].cast(pl.Float64).to_numpy(),
        agg["duration_s"].cast(pl.Float64).to_numpy(),
    )


def _slowdown(steps: np.ndarray, dur: np.ndarray) -> tuple[float, float, int] | None:
    """The step-time change point that lasts to the last step: (median before, median after, first slow step).

    Among the splits where the steps after are at least :data:`SLOWDOWN_RATIO` times slower (and so are the
    last few), the one that fits best (least absolute deviation from the two medians) is the onset.
    """
    n = dur.size
    if n < 2 * MIN_SEGMENT:
        return None
    best = None
    tail = float(np.median(dur[-MIN_SEGMENT:]))
    for k in np.unique(np.linspace(MIN_SEGMENT, n - MIN_SEGMENT, num=min(100, n - 2 * MIN_SEGMENT + 1)).astype(int)):
        before, after = float(np.median(dur[:k])), float(np.median(dur[k:]))
        if before <= 0 or after < SLOWDOWN_RATIO * before or tail < SLOWDOWN_RATIO * before:
            continue
        cost = float(np.abs(dur[:k] - before).sum() + np.abs(dur[k:] - after).sum())
        if best is None or cost < best[0]:
            best = (cost, before, after, int(steps[k]))
    return None if best is None else (best[1], best[2], best[3])


def logged_slowdown(records: Sequence[Any]) -> tuple[float, float, int] | None:
    """:func:`_slowdown` of the step lines the logs hold (Megatron's "elapsed time per iteration (ms)"): each
    step's longest time over the ranks that logged it, in the latest run of the console (a step number that
    goes back, a requeued job appending to the same file, starts a new run). Where the lines state the global
    batch size, the time per sample is compared (a batch-size ramp-up makes every step longer by design)."""
    runs: dict[object, list[Any]] = {}
    for r in records:  # each logging stream in its order
        if r.elapsed_ms is not None and r.elapsed_ms > 0:
            runs.setdefault((r.node, r.rank), []).append(r)
    per: dict[int, float] = {}
    for recs in runs.values():
        start = max((i for i in range(1, len(recs)) if recs[i].step <= recs[i - 1].step), default=0)
        for r in recs[start:]:
            t = r.elapsed_ms / 1000.0 / (r.batch if r.batch else 1)
            per[r.step] = max(per.get(r.step, 0.0), t)
    if not per:
        return None
    steps = np.array(sorted(per))
    return _slowdown(steps, np.array([per[k] for k in steps.tolist()]))


def step_evidence(
    timings: Any,
    snapshot_times: Mapping[int, float],
    snapshot_latest: Mapping[int, float] | None = None,
    *,
    last_snapshot: int | None = None,
) -> StepEvidence | None:
    """Step records against the snapshots: None without step times (start and duration per step).

    ``snapshot_times``: when each snapshot was taken, from the evidence itself (the agent's capture time,
    a requested dump's time line). ``snapshot_latest``: the latest each snapshot can have been taken (a
    file's modification time: copying only makes it later) - proof of progress, never of a hang.
    """
    if timings is None or getattr(timings, "height", 0) == 0:
        return None
    per = _per_step(timings)
    if per is None:
        return None
    steps, end, dur = per
    last_end = float(end.max())
    recent = dur[-20:]
    cadence = float(np.median(recent[recent > 0])) if (recent > 0).any() else 0.0
    snaps = sorted(set(snapshot_times) | set(snapshot_latest or {}))
    last = last_snapshot if last_snapshot is not None else (snaps[-1] if snaps else None)
    words: list[str] = []
    progressing = stuck = False
    exact = sorted(t for s, t in snapshot_times.items() if t is not None)
    if last is not None:
        t_last = snapshot_times.get(last)
        t_prev = exact[-2] if len(exact) >= 2 else None
        upper = (snapshot_latest or {}).get(last)
        if t_last is not None and last_end > t_last:
            progressing = True
            words.append(
                f"steps kept completing after the last snapshot (last step ended {last_end - t_last:.1f} s later)"
            )
        elif t_prev is not None and last_end > t_prev and t_last is not None and last_end <= t_last:
            progressing = True
            n_after = int(np.count_nonzero(end > t_prev))
            words.append(f"{n_after} step(s) completed between the last two snapshots ({t_last - t_prev:.0f} s apart)")
        elif upper is not None and cadence > 0 and last_end >= upper - PROGRESS_STEPS * max(cadence, 0.1):
            progressing = True
            words.append(
                f"steps were logged until {max(upper - last_end, 0.0):.1f} s before the stop (a step takes "
                f"{cadence:.2f} s): stopped while progressing"
            )
        # the last snapshot's time, else the latest one known: no step after it, none for long before it
        t_ref = t_last if t_last is not None else (exact[-1] if exact else None)
        if not progressing and t_ref is not None:
            gap = t_ref - last_end
            if gap >= max(HANG_STEPS * cadence, HANG_MIN_SECONDS):
                stuck = True
                which = "the last snapshot" if t_last is not None else "a timed snapshot (none since)"
                words.append(
                    f"no step completed in the {gap:.0f} s before {which} (a step takes {cadence:.2f} s): "
                    "the job was stuck"
                )
        if not progressing and not stuck and upper is not None and t_last is None:
            words.append(
                f"the last step ended {upper - last_end:.0f} s before the files' modification time; file times "
                "only bound the stop from above (copying makes them later), so the steps cannot tell a stop "
                "while progressing from a hang"
            )
    slow = _slowdown(steps, dur)
    if slow is not None:
        words.append(f"steps slowed from {slow[0]:.2f} s to {slow[1]:.2f} s at step {slow[2]}")
    between = stepped_between(end, snapshot_times, snapshot_latest)
    return StepEvidence(
        last_end, cadence, int(steps.size), progressing, stuck, slow, tuple(words), between_rounds=between
    )
