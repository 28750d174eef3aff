"""The numbers behind the smaller figures: fail-slow rounds, the Flight Recorder wavefront, the
step-time matrix and the crash exits (the rank grid is in :mod:`.grid`, the prefix tree in :mod:`.tree`).

Each function takes the verdict dict (``Verdict.to_dict()`` / ``diagnose --format json``) and/or one
evidence table, and returns a small frozen result that :mod:`.figures` draws; large jobs are
aggregated here (blocks of ranks and steps), so drawing cost does not grow with the job.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from rankscope.reports.errors import ReportInputError
from rankscope.reports.ranges import parse_ranks

MAX_HEATMAP_ROWS = 512
MAX_HEATMAP_COLS = 400
MAX_WAVEFRONT_COLS = 1024
MAX_WAVEFRONT_ROWS = 12


@dataclass(frozen=True)
class Rounds:
    n_rounds: int
    groups: tuple[str, ...]  # row labels, the voted group first
    flags: tuple[tuple[int, int, int, float], ...]  # (round, group row, n_outliers, p_value)
    voted: str | None


def failslow_rounds(verdict: Mapping[str, Any]) -> Rounds | None:
    """Which group each snapshot round flagged (``details.rounds``), or None without rounds."""
    details = verdict.get("details") or {}
    rounds = details.get("rounds") if isinstance(details, Mapping) else None
    if not rounds:
        return None
    rows: dict[str, int] = {}
    flags = []
    for i, r in enumerate(rounds):
        try:
            kind, group, snap = str(r["kind"]), int(r["group"]), int(r["snapshot"])
            n_out, p = int(r.get("n_outliers", 0)), float(r.get("p_value", float("nan")))
        except (KeyError, TypeError, ValueError):
            raise ReportInputError(f"verdict.details.rounds[{i}]: expected snapshot, kind, group") from None
        label = f"{kind.upper()} group {group}" if kind != "node" else f"node #{group}"
        flags.append((snap, rows.setdefault(label, len(rows)), n_out, p))
    sg = verdict.get("suspect_group") or {}
    voted = None
    if isinstance(sg, Mapping) and sg.get("kind") and sg.get("indices"):
        k = str(sg["kind"])
        voted = f"{k.upper()} group {int(sg['indices'][0])}" if k != "node" else f"node #{int(sg['indices'][0])}"
    n_rounds = max(int(verdict.get("n_snapshots") or 0), max(f[0] for f in flags) + 1)
    if voted in rows and isinstance(sg, Mapping) and sg.get("nodes"):
        nodes = [str(n) for n in sg["nodes"]]
        named = f"{voted} ({', '.join(nodes[:3])}{', …' if len(nodes) > 3 else ''})"
        rows = {(named if lb == voted else lb): i for lb, i in rows.items()}
        voted = named
    # the voted group on top, then by how often flagged
    counts = {label: sum(1 for f in flags if f[1] == row) for label, row in rows.items()}
    order = sorted(rows, key=lambda lb: (lb != voted, -counts[lb], rows[lb]))
    remap = {rows[lb]: i for i, lb in enumerate(order)}
    return Rounds(
        n_rounds, tuple(order), tuple((s, remap[g], n, p) for s, g, n, p in flags), voted if voted in rows else None
    )


# -- Flight Recorder wavefront ----------------------------------------------------------------------
WAVE_CLASSES = (
    "completed at the front",
    "waiting at the front",
    "1 collective behind",
    "2-9 behind",
    "10+ behind",
    "no Flight Recorder dump",
    "not a member",
)


@dataclass(frozen=True)
class Wavefront:
    codes: np.ndarray  # (rows, cols) index into WAVE_CLASSES
    row_labels: tuple[str, ...]
    col_edges: np.ndarray  # rank at which each column starts (len cols + 1)
    ranks_per_col: int
    world: int
    culprit_cols: np.ndarray
    fronts: tuple[str, ...]  # per row: "front #6" (one pg), "" (several pgs: each has its own front)


def fr_wavefront(
    verdict: Mapping[str, Any],
    progress: pl.DataFrame,
    *,
    max_cols: int = MAX_WAVEFRONT_COLS,
    max_rows: int = MAX_WAVEFRONT_ROWS,
) -> Wavefront:
    """Per process-group kind (``pg_desc``) and rank: how far the rank got relative to the furthest member
    of its group (``max(last_enqueued)``): at the front and done, at the front and waiting, or behind."""
    world = max(int(verdict.get("world_size") or 0), int(progress["rank"].max()) + 1)  # type: ignore[arg-type]
    p = progress.with_columns(
        pl.coalesce(pl.col("pg_desc") if "pg_desc" in progress.columns else pl.lit(None, pl.String), pl.lit("")).alias(
            "desc"
        )
    )
    p = p.with_columns(
        pl.when(pl.col("desc") == "")
        .then(pl.concat_str(pl.lit("pg "), pl.col("pg")))
        .otherwise(pl.col("desc"))
        .alias("row")
    )
    p = p.with_columns(pl.col("last_enqueued").fill_null(-1), pl.col("last_completed").fill_null(-1))
    p = p.with_columns(pl.col("last_enqueued").max().over("pg").alias("front"))
    lag = pl.col("front") - pl.col("last_enqueued")
    p = p.with_columns(
        pl.when(lag == 0)
        .then(pl.when(pl.col("last_completed") >= pl.col("front")).then(0).otherwise(1))
        .when(lag == 1)
        .then(2)
        .when(lag < 10)
        .then(3)
        .otherwise(4)
        .alias("code")
    )
    # rows: groups with ranks behind first, then by how many pgs
    stats = (
        p.group_by("row")
        .agg(
            pl.col("code").max().alias("worst"),
            pl.col("pg").n_unique().alias("n_pg"),
            pl.col("front").max().alias("front"),
        )
        .sort(["worst", "n_pg", "row"], descending=[True, True, False])
    )
    stats = stats.head(max_rows)
    rows = stats["row"].to_list()
    per = max(1, math.ceil(world / max_cols))
    ncols = math.ceil(world / per)
    has_dump = np.zeros(world, dtype=bool)
    has_dump[progress["rank"].to_numpy()] = True
    codes = np.full((len(rows), ncols), 6, dtype=np.int64)
    for i, row in enumerate(rows):
        sub = p.filter(pl.col("row") == row).group_by("rank").agg(pl.col("code").max())
        r = sub["rank"].to_numpy()
        c = sub["code"].to_numpy()
        per_rank = np.full(world, 6, dtype=np.int64)
        per_rank[r] = c
        per_rank[~has_dump] = 5
        # worst (highest lag) in each column block, "not a member" only when the whole block is
        member = np.where(per_rank == 6, -1, per_rank)
        blk = np.full(ncols, -1, dtype=np.int64)
        np.maximum.at(blk, np.arange(world) // per, member)
        codes[i] = np.where(blk < 0, 6, blk)
    n_pg = stats["n_pg"].to_list()
    fronts = tuple(
        f"front #{f}" if f is not None and f >= 0 and n == 1 else "" for f, n in zip(stats["front"].to_list(), n_pg)
    )
    labels = tuple(f"{r} ({n} pgs)" if n > 1 else r for r, n in zip(rows, n_pg))
    cul = parse_ranks(verdict.get("culprit_ranks"), field="verdict.culprit_ranks")
    cul_cols = np.unique(cul[cul < world] // per)
    return Wavefront(codes, labels, np.arange(ncols + 1) * per, per, world, cul_cols, fronts)


# -- timings heatmap ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepMatrix:
    ratio: np.ndarray  # (rows, cols) step time / median of all ranks at that step (NaN: no record)
    median_s: np.ndarray  # (cols,) median step time per column, seconds
    steps: np.ndarray  # (cols,) first step of each column
    row_edges: np.ndarray  # rank at which each row starts
    ranks_per_row: int
    steps_per_col: int
    op: str
    suspect_rows: np.ndarray


def step_matrix(
    verdict: Mapping[str, Any],
    timings: pl.DataFrame,
    *,
    max_rows: int = MAX_HEATMAP_ROWS,
    max_cols: int = MAX_HEATMAP_COLS,
) -> StepMatrix:
    """Rank x step times relative to each step's median. Uses the ``step`` op when recorded, else the sum
    of all ops per rank and step. Rows hold blocks of ranks (the slowest shown) and columns blocks of
    steps (mean) when the job is larger than ``max_rows`` x ``max_cols``."""
    t = timings
    op = "step"
    if "op" in t.columns:
        if (t["op"] == "step").any():
            t = t.filter(pl.col("op") == "step")
        else:
            op = "sum of " + ", ".join(sorted(str(o) for o in t["op"].unique().to_list())[:6])
    t = t.filter(pl.col("duration_s").is_not_nan() & pl.col("duration_s").is_not_null())
    rank = t["rank"].to_numpy()
    world = max(int(verdict.get("world_size") or 0), int(rank.max()) + 1)
    steps = np.sort(t["step"].unique().to_numpy())
    flat = rank * steps.size + np.searchsorted(steps, t["step"].to_numpy())
    n = world * steps.size
    # several ops (or records) per rank and step add up; bincount does it in one pass at any scale
    total = np.bincount(flat, weights=t["duration_s"].to_numpy(), minlength=n)
    count = np.bincount(flat, minlength=n)
    mat = np.where(count > 0, total, np.nan).reshape(world, steps.size)
    with warnings.catch_warnings():  # a step no rank recorded is NaN, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.median(mat, axis=0) if count.all() else np.nanmedian(mat, axis=0)
    ratio = mat / np.where(med > 0, med, np.nan)
    spc = max(1, math.ceil(steps.size / max_cols))
    if spc > 1:
        nc = math.ceil(steps.size / spc)
        pad = nc * spc - steps.size
        r = np.pad(ratio, ((0, 0), (0, pad)), constant_values=np.nan).reshape(world, nc, spc)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ratio = np.nanmean(r, axis=2)
            med = np.nanmean(np.pad(med, (0, pad), constant_values=np.nan).reshape(nc, spc), axis=1)
        steps = steps[::spc]
    rpr = max(1, math.ceil(world / max_rows))
    if rpr > 1:
        nr = math.ceil(world / rpr)
        pad = nr * rpr - world
        r = np.pad(ratio, ((0, pad), (0, 0)), constant_values=np.nan).reshape(nr, rpr, ratio.shape[1])
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ratio = np.nanmax(r, axis=1)
    sus = parse_ranks(verdict.get("culprit_ranks") or verdict.get("suspect_ranks"), field="verdict.suspect_ranks")
    return StepMatrix(
        ratio, med, steps, np.arange(ratio.shape[0] + 1) * rpr, rpr, spc, op, np.unique(sus[sus < world] // rpr)
    )


# -- crash time line ---------------------------------------------------------------------------------
def crash_exits(verdict: Mapping[str, Any], exits: pl.DataFrame | None) -> pl.DataFrame | None:
    """The exits to draw: the evidence table when given, else ``details.crash.exits`` of the verdict."""
    if exits is not None:
        return exits.sort("after_s")
    details = verdict.get("details") or {}
    crash = details.get("crash") if isinstance(details, Mapping) else None
    rows = crash.get("exits") if isinstance(crash, Mapping) else None
    if not rows:
        return None
    from rankscope.reports.evidence import as_table

    return as_table(
        "exits",
        [
            {k: r.get(k) for k in ("rank", "after_s", "cause", "node", "kind", "message")}
            for r in rows
            if isinstance(r, Mapping)
        ],
    )
