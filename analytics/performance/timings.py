"""Per-rank timings as the straggler analysis reads them: checked columns, a topology, per-op matrices.

Only compute ops blame a rank: in a collective (all-reduce, send/recv, barrier, ...) the ranks that wait
longest are the straggler's victims (:func:`is_comm_op`).
"""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl

from rankscope.datasets.domain.topology import DIMS, Layout, Topology
from rankscope.spine import InputError

REQUIRED = ("rank", "step", "op", "duration_s")


COMM_WORDS = (
    "allreduce",
    "all-reduce",
    "all_reduce",
    "allgather",
    "all-gather",
    "all_gather",
    "reduce-scatter",
    "reduce_scatter",
    "reducescatter",
    "broadcast",
    "barrier",
    "send",
    "recv",
    "p2p",
    "comm",
    "wait",
    "nccl",
    "collective",
    "sync",
)
"""Ops that wait for other ranks: a rank slow in them is a victim of a straggler, not the straggler."""


WALL_OPS = frozenset({"step"})
"""Whole-step wall times (the hook's ``log_step``, the agent's ``timings``): they include every wait, so in
synchronous training each rank's step takes as long as the slowest rank's. They show that the job slowed,
never which rank slowed it."""


def is_comm_op(op: str) -> bool:
    """True for collective / point-to-point / wait ops (by name)."""
    low = op.lower()
    return any(w in low for w in COMM_WORDS)


def check_timings(timings: pl.DataFrame) -> pl.DataFrame:
    """The required columns with usable types; an InputError names what is wrong."""
    missing = [c for c in REQUIRED if c not in timings.columns]
    if missing:
        raise InputError(f"timings: missing column(s) {missing}; required: {list(REQUIRED)}")
    try:
        df = timings.with_columns(
            pl.col("rank").cast(pl.Int64),
            pl.col("step").cast(pl.Int64),
            pl.col("op").cast(pl.Utf8),
            pl.col("duration_s").cast(pl.Float64),
        )
    except pl.exceptions.PolarsError as exc:
        raise InputError(f"timings: a required column has the wrong type ({exc})") from None
    df = df.filter(pl.col("duration_s").is_not_null() & pl.col("duration_s").is_finite())
    if df.filter(pl.col("duration_s") < 0).height:
        raise InputError("timings: duration_s has negative values")
    if df.filter(pl.col("rank") < 0).height:
        raise InputError("timings: rank has negative values")
    return df


def latest_run(df: pl.DataFrame, notes: list[str] | None = None) -> pl.DataFrame:
    """Each rank's steps from the run that did them last: a restart from a checkpoint re-runs steps (``601``
    after ``700``), and adding both runs' times would double those steps. A rank's run changes where, in the
    order of ``start_s`` (ties in step order), its step number goes back below one it already did; without
    ``start_s`` the rows are kept as they are (several rows of one step and op, micro-batches, add up). Rows
    left out are said in ``notes`` (a step column that counts within each epoch restarts too)."""
    if "start_s" not in df.columns or df["start_s"].null_count() or df.height == 0:
        return df
    back = pl.col("step") < pl.col("step").cum_max().shift(1)
    runs = df.sort("rank", "start_s", "step", maintain_order=True).with_columns(
        _run=back.fill_null(False).cast(pl.Int64).cum_sum().over("rank")
    )
    if runs["_run"].max() == 0:
        return df
    kept = runs.filter(pl.col("_run") == pl.col("_run").max().over("rank", "step")).drop("_run")
    if notes is not None and kept.height < df.height:
        notes.append(
            f"timings: {df.height - kept.height} row(s) of steps run again later (a restart; or a step column "
            "that counts within each epoch) not used: each step's time is from the run that did it last"
        )
    return kept


def topology_for(timings: pl.DataFrame, topology: Topology | None, notes: list[str] | None = None) -> Topology:
    """The given topology, else (or when it cannot describe the timings) one built from the timing columns."""
    ranks = np.unique(timings["rank"].to_numpy())
    has_coords = any(
        d in timings.columns and timings[d].null_count() == 0 and (timings[d].max() or 0) > 0  # type: ignore[operator]
        for d in DIMS
        if d != "dp"
    )
    if topology is not None:
        flat = all(topology.sizes[d] == 1 for d in DIMS if d != "dp")
        if ranks.max() < topology.world_size and not (flat and has_coords):
            return topology
        why = (
            f"rank {int(ranks.max())} is outside the given topology ({topology.description})"
            if ranks.max() >= topology.world_size
            else "the given topology is pure data parallel"
        )
        if notes is not None:
            notes.append(f"timings: {why}; using the node and tp/pp/dp columns of the timings instead")
    per_rank = (
        timings.group_by("rank").agg([pl.col(c).first() for c in ("node", *DIMS) if c in timings.columns]).sort("rank")
    )
    world = int(ranks.max()) + 1
    if per_rank.height != world:
        raise InputError(f"timings: ranks must be 0..{world - 1} without gaps (found {per_rank.height} ranks)")
    nodes = per_rank["node"].cast(pl.Utf8).fill_null("").to_list() if "node" in per_rank.columns else [""] * world
    if notes is not None and not all(nodes):
        notes.append(
            "timings: no node column names the machines: each such rank stands for itself (rank-<N>), no machine; "
            "add a node column, or give --gpus-per-node to name them node-<rank // N>"
        )
    nodes = [n or f"rank-{r}" for r, n in zip(per_rank["rank"].to_list(), nodes)]
    dims = {d: per_rank[d].to_list() for d in DIMS if d in per_rank.columns and per_rank[d].null_count() == 0}
    if dims:
        return Topology.from_table(per_rank["rank"].to_list(), nodes, coords=dims)
    return Topology.from_table(per_rank["rank"].to_list(), nodes, layout=Layout(dp=world))


def matrices(df: pl.DataFrame, world: int) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
    steps = np.unique(df["step"].to_numpy())
    step_idx = {int(s): i for i, s in enumerate(steps)}
    mats: dict[str, np.ndarray] = {}
    agg = df.group_by("op", "step", "rank").agg(pl.col("duration_s").sum())
    for op in sorted(agg["op"].unique().to_list()):
        part = agg.filter(pl.col("op") == op)
        m = np.full((steps.size, world), np.nan)
        si = np.fromiter((step_idx[int(s)] for s in part["step"].to_numpy()), dtype=np.int64, count=part.height)
        m[si, part["rank"].to_numpy()] = part["duration_s"].to_numpy()
        mats[op] = m
    start = None
    if "start_s" in df.columns and df["start_s"].null_count() < df.height:
        s = df.group_by("step").agg(pl.col("start_s").min()).sort("step")
        start = np.full(steps.size, np.nan)
        start[[step_idx[int(x)] for x in s["step"].to_list()]] = s["start_s"].cast(pl.Float64).to_numpy()
    return steps, mats, start


def group_reference(m: np.ndarray, gid: np.ndarray, node: np.ndarray) -> np.ndarray:
    """Per step, each rank's reference: the median of its peer group on *other* nodes (steps x ranks).

    NVRx compares with the best rank; the median of the peers is steadier, and leaving out the rank's
    own node keeps the reference healthy when a slow node holds half of a stage's ranks.
    """
    out = np.full_like(m, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for g in np.unique(gid):
            in_group = gid == g
            for nd in np.unique(node[in_group]):
                others = in_group & (node != nd)
                if not others.any():
                    others = in_group
                out[:, in_group & (node == nd)] = np.nanmedian(m[:, others], axis=1, keepdims=True)
    return out


def sum_ops(parts: list[np.ndarray]) -> np.ndarray:
    stack = np.stack(parts)
    out = np.nansum(stack, axis=0)
    out[np.all(np.isnan(stack), axis=0)] = np.nan
    return out
