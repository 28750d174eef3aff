"""Timing stragglers: which rank is persistently slower than its symmetric peers, and since when.

Per op and step, each rank's duration is divided by the median of its peers on other nodes (ranks
of the same pipeline stage across data-parallel replicas and tensor ranks): NVRx's relative score, inverted so
that 1.4 means 40 % slower. A rank is blamed only for an *episode*: a change point after which the
rolling median of its ratio stays above ``min_slowdown_ratio`` (1.25, about NVRx's 0.75 score) for
``min_episode_steps`` steps and
the shift is significant against the peers' noise; one noisy step blames no one.

Only compute ops blame a rank: in a collective (all-reduce, send/recv, barrier, ...) the ranks that
wait longest are the straggler's victims, and a whole step's wall time (``step``, the hook's
``log_step``) is the slowest rank's on every rank of a synchronous job. Slowness that is not one
machine's is reported as imbalance, never blamed: a whole pipeline stage
slower than the other stages, a whole replica slower at every stage (its data), every worker slower
together (a job-wide change), or slow steps that move between replicas (data imbalance).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from rankscope.analytics.performance.episodes import Episode, episodes, noise
from rankscope.analytics.performance.timings import (
    WALL_OPS,
    check_timings,
    group_reference,
    is_comm_op,
    latest_run,
    matrices,
    sum_ops,
    topology_for,
)
from rankscope.config import StragglerConfig
from rankscope.datasets.domain.topology import Topology
from rankscope.spine import InputError


@dataclass(frozen=True)
class SlowRank:
    """One rank's slow episode: how much slower than its peers, from which step, in which ops."""

    rank: int
    node: str
    ratio: float
    onset_step: int
    onset_s: float | None
    ops: tuple[str, ...]
    significance: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "ratio": round(self.ratio, 3),
            "onset_step": self.onset_step,
            "onset_s": self.onset_s,
            "ops": list(self.ops),
            "significance": round(self.significance, 1),
        }


@dataclass(frozen=True)
class Imbalance:
    """Slowness that belongs to no single machine: its kind, the ratio, where, and why in words."""

    kind: str  # stage | replica | job-wide | data
    ratio: float
    where: str
    onset_step: int | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "ratio": round(self.ratio, 3),
            "where": self.where,
            "onset_step": self.onset_step,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class StragglerReport:
    """The outcome: slow ranks to blame (machine faults) and imbalances (not blamed)."""

    slow_ranks: tuple[SlowRank, ...]
    imbalances: tuple[Imbalance, ...]
    n_ranks: int
    n_steps: int
    ops: tuple[str, ...]
    peer_kind: str
    notes: tuple[str, ...] = ()

    @property
    def slow_nodes(self) -> tuple[str, ...]:
        """Nodes of slow ranks, slowest first."""
        best: dict[str, float] = {}
        for s in self.slow_ranks:
            best[s.node] = max(best.get(s.node, 0.0), s.ratio)
        return tuple(sorted(best, key=lambda n: -best[n]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "slow_ranks": [s.to_dict() for s in self.slow_ranks],
            "imbalances": [i.to_dict() for i in self.imbalances],
            "n_ranks": self.n_ranks,
            "n_steps": self.n_steps,
            "ops": list(self.ops),
            "peer_kind": self.peer_kind,
            "notes": list(self.notes),
        }

    def explain(self) -> str:
        lines = [f"{self.n_ranks} ranks, {self.n_steps} steps, ops {', '.join(self.ops)}; peers: {self.peer_kind}"]
        for s in self.slow_ranks:
            lines.append(
                f"rank {s.rank} on {s.node}: {s.ratio:.2f}x its peers from step {s.onset_step} in {', '.join(s.ops)}"
            )
        lines.extend(i.reason for i in self.imbalances)
        return "\n".join(lines)


# -- inputs -------------------------------------------------------------------------------------


# -- episodes -----------------------------------------------------------------------------------


# -- the analysis -------------------------------------------------------------------------------


Episodes = dict[int, list[tuple[str, Episode]]]


@dataclass(frozen=True, eq=False)
class _Peers:
    """Who compares with whom: the timing matrices and each rank's stage, replica and peer group."""

    topo: Topology
    steps: np.ndarray
    mats: dict[str, np.ndarray]  # op -> steps x ranks durations
    start: np.ndarray | None  # per step, its earliest start (epoch seconds)
    pp: np.ndarray  # stage per rank
    n_pp: int
    dp: np.ndarray  # replica per rank
    stage_sizes: np.ndarray
    gid: np.ndarray  # peer group per rank
    peer_kind: str
    compute_ops: list[str]  # only compute ops blame a rank (comm ops when only those were timed; never wall times)


def _peers(df: pl.DataFrame, topo: Topology) -> _Peers:
    steps, mats, start = matrices(df, topo.world_size)
    pp = topo.coords["pp"]
    n_pp = int(topo.sizes["pp"])
    dp = topo.group_ids("mp") if n_pp > 1 or topo.sizes["tp"] > 1 else topo.ranks.copy()  # replica of each rank
    stage_sizes = np.bincount(pp)
    peers_ok = stage_sizes.min() >= 3
    gid = pp if peers_ok else np.zeros(topo.world_size, dtype=np.int64)
    peer_kind = "same pipeline stage across replicas" if peers_ok and n_pp > 1 else "all ranks"
    own = [op for op in mats if op not in WALL_OPS]  # a whole step's wall time includes the waits: blames no one
    compute_ops = [op for op in own if not is_comm_op(op)] or own
    return _Peers(topo, steps, mats, start, pp, n_pp, dp, stage_sizes, gid, peer_kind, compute_ops)


def _rank_episodes(p: _Peers, cfg: StragglerConfig) -> tuple[Episodes, Episodes]:
    """Each rank against its stage peers, per compute op; and each replica spread over several nodes.

    A rank is blamed for a persistent change of its ratio to its peers against its own earlier ratio,
    calibrated on the job (:class:`~rankscope.models.straggler.StragglerDetector`): a rank that was
    slower from the start (a heavier share, a slower part) is an offset, not a straggler. A replica spread
    over several nodes that is slow at every stage is slow because of its data: that common part is
    taken out before blaming ranks.
    """
    k, min_log = cfg.min_episode_steps, float(np.log(cfg.min_slowdown_ratio))
    topo, dp = p.topo, p.dp
    reps = np.unique(dp)
    spread = {int(rep): len(topo.nodes_of(np.flatnonzero(dp == rep))) > 1 for rep in reps}
    per_rank: Episodes = {}
    per_replica: Episodes = {}
    for op in p.compute_ops:
        m = p.mats[op]
        ref = group_reference(m, p.gid, topo.node_index)
        lr = np.log(np.clip(m, 1e-12, None) / np.clip(ref, 1e-12, None))
        common, rep_lr = _replica_parts(lr, dp, reps, spread, topo.node_index)
        # only a replica's *slowness* is explained by its data; when its other ranks look fast, that is
        # because their own reference holds the slow machine (two nodes per stage), not a lighter batch
        for r, ep in _changed_ranks(m, ref * np.exp(np.maximum(common, 0.0)), cfg).items():
            per_rank.setdefault(r, []).append((op, ep))
        if any(spread.values()):
            for j, rep_ep in enumerate(episodes(rep_lr, min_log=min_log, k=k, noise=noise(rep_lr))):
                if rep_ep is not None and rep_ep.significance >= cfg.min_significance and spread[int(reps[j])]:
                    per_replica.setdefault(int(reps[j]), []).append((op, rep_ep))
    return per_rank, per_replica


def _replica_parts(
    lr: np.ndarray, dp: np.ndarray, reps: np.ndarray, spread: dict[int, bool], node: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, its replica's slowness seen on the replica's *other* nodes; per replica, its median."""
    common = np.zeros_like(lr)
    rep_lr = np.zeros((lr.shape[0], reps.size))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for j, rep in enumerate(reps):
            cols = dp == rep
            if not spread[int(rep)]:
                continue
            rep_lr[:, j] = np.nanmedian(lr[:, cols], axis=1)
            for nd in np.unique(node[cols]):
                mine = cols & (node == nd)
                common[:, mine] = np.nanmedian(lr[:, cols & ~mine], axis=1, keepdims=True)
    return common, rep_lr


def _changed_ranks(m: np.ndarray, reference: np.ndarray, cfg: StragglerConfig) -> dict[int, Episode]:
    """Ranks whose ratio to ``reference`` changed persistently (calibrated on this op's own windows)."""
    from rankscope.models.straggler import StragglerDetector

    det = StragglerDetector(
        continuity_steps=max(2, cfg.min_episode_steps + 3),
        min_slowdown=cfg.min_slowdown_ratio,
        false_alarm_per_worker=cfg.false_alarm_per_worker,
    )
    try:
        det.fit(m, reference=reference)
    except InputError:  # too few steps or ranks for a baseline and a continuity window
        return {}
    out = {}
    for r in np.flatnonzero(det.labels_):
        score = float(det.decision_scores_[r])
        out[int(r)] = Episode(int(det.onset_index_[r]), m.shape[0], float(det.ratio_[r]), score)
    return out


def _blame(
    p: _Peers, per_rank: Episodes, per_replica: Episodes, max_fraction: float
) -> tuple[list[SlowRank], list[Imbalance]]:
    """Slow ranks to blame; a slow replica no blamed machine explains, or more than half of the ranks
    slow, is an imbalance instead."""
    imbalances: list[Imbalance] = []
    slow_set = set(per_rank)
    for rep, eps in sorted(per_replica.items()):
        if any(p.dp[r] == rep for r in slow_set):
            continue  # a blamed machine explains it
        ratio = float(max(ep.ratio for _, ep in eps))
        onset = min(ep.start for _, ep in eps)
        imbalances.append(
            Imbalance(
                "replica",
                ratio,
                f"replica {rep}",
                int(p.steps[onset]),
                f"replica {rep} is {ratio:.2f}x slower at every pipeline stage from step {int(p.steps[onset])} "
                "across several nodes: data imbalance (heavier batches), not one machine",
            )
        )
    world = p.topo.world_size
    machines = _slow_machines(p, per_rank, slow_set)
    n_nodes = len(p.topo.node_names)
    if len(slow_set) > world // 2 or len(machines) > max(2, int(max_fraction * n_nodes)):
        imbalances.append(
            Imbalance(
                "job-wide",
                1.0,
                f"{len(machines)} of {n_nodes} machines",
                None,
                f"{len(slow_set)} of {world} ranks on {len(machines)} of {n_nodes} machines became slower than "
                "their peers: more than a machine fault explains (an imbalance or a job-wide change); "
                "no machine is named",
            )
        )
        slow_set = set()
    slow_ranks = []
    for r in sorted(slow_set):
        eps = per_rank[r]
        first = min(ep.start for _, ep in eps)
        start = p.start
        slow_ranks.append(
            SlowRank(
                r,
                p.topo.node_of(r),
                float(max(ep.ratio for _, ep in eps)),
                int(p.steps[first]),
                None if start is None or not np.isfinite(start[first]) else float(start[first]),
                tuple(op for op, _ in sorted(eps, key=lambda e: -e[1].ratio)),
                float(max(ep.significance for _, ep in eps)),
            )
        )
    return slow_ranks, imbalances


def _slow_machines(p: _Peers, per_rank: Episodes, slow: set[int]) -> set[str]:
    """The machines of the slow ranks; without machine names (every rank its own ``rank-N``), ranks that
    slowed at the same step count as one machine (a node's GPUs slow down together)."""
    if not all(n.startswith("rank-") for n in p.topo.node_names):
        return {p.topo.node_of(r) for r in slow}
    onsets = sorted(min(ep.start for _, ep in per_rank[r]) for r in slow)
    groups = [o for i, o in enumerate(onsets) if i == 0 or o - onsets[i - 1] > 8]
    return {f"onset-{o}" for o in groups}


def _stage_imbalance(p: _Peers, cfg: StragglerConfig, busy: np.ndarray, slow_set: set[int]) -> list[Imbalance]:
    """A whole pipeline stage slower than the other stages (same replica across stages)."""
    k, min_log = cfg.min_episode_steps, float(np.log(cfg.min_slowdown_ratio))
    pp, n_pp, steps = p.pp, p.n_pp, p.steps
    out: list[Imbalance] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        stage = np.stack([np.nanmedian(busy[:, pp == s], axis=1) for s in range(n_pp)], axis=1)
        ref = np.nanmin(np.nanmedian(stage, axis=0))  # the fastest stage's typical step
        base = stage / np.nanmedian(stage[: max(k, stage.shape[0] // 5)], axis=0)  # each stage vs its own start
    lr = np.log(stage / ref)
    for s, ep in enumerate(episodes(np.log(base), min_log=min_log, k=k, noise=noise(np.log(base)))):
        if ep is not None and ep.significance >= cfg.min_significance and not _stage_has_culprit(s, pp, slow_set):
            others = [o for o in range(n_pp) if o != s]
            rel = float(np.nanmedian(stage[ep.start : ep.end, s]) / np.nanmedian(stage[ep.start : ep.end][:, others]))
            base_rel = float(
                np.nanmedian(stage[: max(k, ep.start), s]) / np.nanmedian(stage[: max(k, ep.start)][:, others])
            )
            if rel > base_rel * cfg.min_slowdown_ratio**0.5:
                out.append(
                    Imbalance(
                        "stage",
                        ep.ratio,
                        f"pipeline stage {s}",
                        int(steps[ep.start]),
                        f"pipeline stage {s} (all {int(p.stage_sizes[s])} ranks) became {ep.ratio:.2f}x slower "
                        "from step "
                        f"{int(steps[ep.start])} while the other stages did not: a stage imbalance, not a machine",
                    )
                )
    with warnings.catch_warnings():  # stages without any timing are all-NaN columns
        warnings.simplefilter("ignore", RuntimeWarning)
        persistent = np.nanmedian(lr, axis=0)
    worst = int(np.nanargmax(persistent)) if not np.all(np.isnan(persistent)) else 0
    if not out and persistent[worst] > min_log and not _stage_has_culprit(worst, pp, slow_set):
        ratio = float(np.exp(persistent[worst]))
        out.append(
            Imbalance(
                "stage",
                ratio,
                f"pipeline stage {worst}",
                None,
                f"pipeline stage {worst} is {ratio:.2f}x slower than the fastest stage on every replica throughout: "
                "the pipeline is unbalanced (layers per stage), not a machine",
            )
        )
    return out


def warm_up(log_ratio: np.ndarray, min_log: float) -> int:
    """How many of the first steps are the job's warm-up: the leading run of steps slower than the job's usual
    by ``min_log`` or more, when it ended within the first quarter of the steps (a job slow from its first step
    to its last has no warm-up: it is slow). 0 when there is none."""
    slow = np.nan_to_num(log_ratio, nan=0.0) > min_log
    lead = int(np.argmin(slow)) if not slow.all() else slow.size
    return lead if 0 < lead <= slow.size // 4 else 0


def _job_wide(p: _Peers, cfg: StragglerConfig, total: np.ndarray) -> Imbalance | None:
    """Every worker slower together (a job-wide change)."""
    k, min_log = cfg.min_episode_steps, float(np.log(cfg.min_slowdown_ratio))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        job = np.nanmedian(total, axis=1)
        lj = np.log(job / np.nanmedian(job[: max(k, job.size // 5)]))
    lj = lj.copy()
    lj[: warm_up(lj, min_log)] = 0.0  # compilation, caches, the first collectives: not a change of the job
    (ep,) = episodes(lj[:, None], min_log=min_log, k=k, noise=noise(lj))
    if ep is None or ep.significance < cfg.min_significance:
        return None
    lasted = ep.end >= lj.size - k  # to the last steps: the job changed
    if not lasted and ep.end - ep.start < max(2 * k, lj.size // 10):
        return None  # a few slow steps that passed (a restart's warm-up, a checkpoint): no change of the job
    how = "" if lasted else f" for {ep.end - ep.start} steps"
    return Imbalance(
        "job-wide",
        ep.ratio,
        "every rank",
        int(p.steps[ep.start]),
        f"every worker became {ep.ratio:.2f}x slower together{how} from step {int(p.steps[ep.start])}: a job-wide "
        "change (data, configuration or shared infrastructure), no machine is blamed",
    )


def _data_imbalance(p: _Peers, cfg: StragglerConfig, busy: np.ndarray) -> Imbalance | None:
    """Slow steps that move between replicas: data imbalance."""
    with warnings.catch_warnings():  # replicas without timings at a step are all-NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        rep_total = np.stack([np.nanmedian(busy[:, p.dp == rep], axis=1) for rep in np.unique(p.dp)], axis=1)
        rel = rep_total / np.nanmedian(rep_total, axis=1, keepdims=True)
    slow_cells = rel > cfg.min_slowdown_ratio
    frac = float(np.mean(slow_cells))
    spread = int(np.sum(slow_cells.any(axis=0)))
    if not (frac >= cfg.intermittent_fraction and spread > rep_total.shape[1] // 2 and rep_total.shape[1] > 1):
        return None
    return Imbalance(
        "data",
        float(np.nanquantile(rel, 0.95)),
        f"{spread} of {rep_total.shape[1]} replicas",
        None,
        f"{frac:.0%} of (step, replica) pairs are over {cfg.min_slowdown_ratio:.2f}x the median replica, and the "
        f"slow replica changes from step to step ({spread} replicas take turns): data imbalance, no straggler",
    )


def find_stragglers(
    timings: pl.DataFrame, topology: Topology | None = None, *, config: StragglerConfig | None = None
) -> StragglerReport:
    """Slow ranks (each against its symmetric peers) and imbalances in per-rank op timings."""
    cfg = config or StragglerConfig()
    notes: list[str] = []
    df = latest_run(check_timings(timings), notes)
    if df.height == 0:
        raise InputError("timings: no rows with a finite duration_s")
    p = _peers(df, topology_for(df, topology, notes))
    slow_ranks, imbalances = _blame(p, *_rank_episodes(p, cfg), cfg.max_slow_machine_fraction)
    total = sum_ops(list(p.mats.values()))  # steps x ranks, all ops (what the job waits for)
    busy = sum_ops([p.mats[op] for op in p.compute_ops]) if p.compute_ops else total  # the work, without waits
    if p.n_pp > 1:
        imbalances += _stage_imbalance(p, cfg, busy, {s.rank for s in slow_ranks})
    # with a blamed machine, everyone else waiting for it in collectives is its consequence, not a cause
    extra = [] if slow_ranks else [_job_wide(p, cfg, total), _data_imbalance(p, cfg, busy)]
    imbalances += [i for i in extra if i is not None]
    return StragglerReport(
        tuple(sorted(slow_ranks, key=lambda s: -s.ratio)),
        tuple(imbalances),
        p.topo.world_size,
        int(p.steps.size),
        tuple(p.mats),
        p.peer_kind,
        tuple(notes),
    )


def _stage_has_culprit(stage: int, pp: np.ndarray, slow: set[int]) -> bool:
    return any(pp[r] == stage for r in slow)
