"""The rank grid: every rank placed by its parallel coordinates, coloured by stack cluster.

Rows are pipeline stages split by CP, EP and TP rank; columns are DP replicas. Large jobs are
aggregated (a cell per TP group, then per machine) so that the grid stays within ``MAX_GRID_CELLS``
cells and one stuck rank in 16,384 still shows: a cell takes the most unusual cluster among its ranks.
Pure numpy; :func:`reports.figures.rank_grid` draws the result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from rankscope.reports.clusters import ClusterInfo, innermost, latest_trainer_clusters, short_frame
from rankscope.reports.ranges import parse_ranks

MAX_GRID_CELLS = 4096
"""Above this many ranks the grid shows one cell per group of ranks (a TP group, then a node)."""
MAX_GRID_COLS = 1024
MAX_UNWRAPPED_COLS = 64
MAX_OUTLIER_CLASSES = 9
MAX_HEALTHY_CLASSES = 3
ROW_DIMS = ("pp", "cp", "ep", "tp")  # outermost first: pipeline stages are bands, TP ranks adjacent
COLLAPSE_ORDER = ("tp", "ep", "cp")  # node-local dimensions are merged into one cell first


@dataclass(frozen=True)
class GridClass:
    label: str
    kind: str  # outlier | missing | healthy | nostack
    cluster_ids: tuple[int, ...]


@dataclass(frozen=True)
class RankGrid:
    codes: np.ndarray  # (rows, cols) index into classes; -1 = empty cell
    suspect: np.ndarray  # (rows, cols) bool
    culprit: np.ndarray  # (rows, cols) bool
    node: np.ndarray  # (rows, cols) node index of the cell (-1 empty)
    first_rank: np.ndarray  # (rows, cols) lowest rank in the cell (-1 empty)
    classes: tuple[GridClass, ...]
    ranks_per_cell: int
    cell_unit: str  # "rank", "TP group", "node", "4 nodes"
    xlabel: str
    ylabel: str
    yticks: tuple[tuple[float, str], ...]
    band_edges: tuple[int, ...]  # rows where a pipeline stage starts
    wrap_edges: tuple[int, ...]  # rows where a band of wrapped DP replicas starts
    n_nodes: int
    world: int


def _dims(topo: pl.DataFrame) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, int]]:
    t = topo.sort("rank")
    ranks = t["rank"].to_numpy()
    coords: dict[str, np.ndarray] = {}
    sizes: dict[str, int] = {}
    for d in ("tp", "cp", "ep", "dp", "pp"):
        if d in t.columns and t[d].null_count() == 0:
            coords[d] = t[d].to_numpy().astype(np.int64)
        else:
            coords[d] = ranks.copy() if d == "dp" else np.zeros(ranks.size, dtype=np.int64)
        sizes[d] = int(coords[d].max()) + 1 if ranks.size else 1
    return ranks, coords, sizes


def _wrap(n: int) -> int:
    """Columns for wrapping ``n`` cells into a block about twice as wide as tall."""
    return max(1, min(n, math.ceil(math.sqrt(2 * n))))


def rank_grid(verdict: Mapping[str, Any], topology: pl.DataFrame, *, max_cells: int = MAX_GRID_CELLS) -> RankGrid:
    """Lay ranks out by their parallel coordinates (rows: PP stage > CP > EP > TP, columns: DP replica).

    Cells are coloured by the trainer stack cluster of their ranks; when a cell holds several ranks it
    takes the most unusual cluster among them (outliers before healthy, small clusters first), so one
    stuck rank in 16,384 still shows. Above ``max_cells`` ranks, node-local dimensions (TP, then EP, CP)
    are merged into one cell; if that is not enough (or the grid gets too wide) each cell is a node.
    """
    ranks, coords, sizes = _dims(topology)
    world = int(ranks.max()) + 1 if ranks.size else 0
    nodes_sorted = topology.sort("rank")["node"].to_numpy()
    # nodes numbered in order of their lowest rank, so neighbours on the grid are neighbours in rank order
    uniq, first_idx, node_index = np.unique(nodes_sorted, return_index=True, return_inverse=True)
    order = np.argsort(first_idx)
    renum = np.empty_like(order)
    renum[order] = np.arange(order.size)
    node_index = renum[node_index]
    n_nodes = int(uniq.size)

    # classes: outliers (small first), missing/failed, healthy (large first), then "no stack"
    clusters = latest_trainer_clusters(verdict)
    outl = sorted(
        (c for c in clusters if not c.healthy and c.state not in ("missing", "failed")), key=lambda c: (c.size, c.id)
    )
    miss = [c for c in clusters if not c.healthy and c.state in ("missing", "failed")]
    heal = sorted((c for c in clusters if c.healthy), key=lambda c: (-c.size, c.id))
    classes: list[GridClass] = []
    members: list[list[ClusterInfo]] = []

    def add(group: list[ClusterInfo], kind: str, label: str) -> None:
        if group:
            classes.append(GridClass(label, kind, tuple(c.id for c in group)))
            members.append(group)

    for c in outl[:MAX_OUTLIER_CLASSES]:
        add([c], "outlier", f"#{c.id} outlier, {c.state}, {c.size} rank(s): {short_frame(innermost(c.representative))}")
    rest = outl[MAX_OUTLIER_CLASSES:]
    add(rest, "outlier", f"{len(rest)} more outlier clusters, {sum(c.size for c in rest)} rank(s)")
    for c in miss:
        add([c], "missing", f"#{c.id} {c.state} (no usable stack), {c.size} rank(s)")
    for c in heal[:MAX_HEALTHY_CLASSES]:
        add([c], "healthy", f"#{c.id} healthy, {c.state}, {c.size} rank(s): {short_frame(innermost(c.representative))}")
    hrest = heal[MAX_HEALTHY_CLASSES:]
    add(hrest, "healthy", f"{len(hrest)} more healthy clusters, {sum(c.size for c in hrest)} rank(s)")
    nostack = len(classes)
    classes.append(
        GridClass(
            "no stack in the verdict for these ranks" if clusters else "stacks not part of this verdict", "nostack", ()
        )
    )
    rank_code = np.full(world, nostack, dtype=np.int64)
    for code in range(len(members) - 1, -1, -1):  # lower codes (more unusual) win where clusters overlap
        for c in members[code]:
            rr = c.ranks[c.ranks < world]
            rank_code[rr] = code
    code_of = np.full(world, nostack, dtype=np.int64)
    code_of[ranks] = rank_code[ranks]
    susp = np.zeros(world, dtype=bool)
    culp = np.zeros(world, dtype=bool)
    for arr, key in ((susp, "suspect_ranks"), (culp, "culprit_ranks")):
        rr = parse_ranks(verdict.get(key), field=f"verdict.{key}")
        arr[rr[rr < world]] = True
    rank_node = np.full(world, -1, dtype=np.int64)
    rank_node[ranks] = node_index

    # choose the cell of every rank
    row_dims = [d for d in ROW_DIMS if sizes[d] > 1]
    unit = "rank"
    while row_dims and _n_cells(row_dims, sizes) > max_cells and any(d in row_dims for d in COLLAPSE_ORDER):
        d = next(d for d in COLLAPSE_ORDER if d in row_dims)
        row_dims.remove(d)
        merged = [x for x in COLLAPSE_ORDER if x not in row_dims and sizes[x] > 1]
        unit = "×".join(x.upper() for x in merged) + " group"
    node_mode = _n_cells(row_dims, sizes) > max_cells or (row_dims and sizes["dp"] > MAX_GRID_COLS)
    band_edges: list[int] = []
    wrap_edges: list[int] = []
    yticks: list[tuple[float, str]] = []
    if node_mode:
        per = max(1, math.ceil(n_nodes / max_cells))
        n_cells = math.ceil(n_nodes / per)
        cols = _wrap(n_cells)
        rows = math.ceil(n_cells / cols)
        cell = np.where(rank_node >= 0, rank_node // per, -1)
        unit = "node" if per == 1 else f"{per} nodes"
        xlabel = f"nodes in rank order, {cols} per row"
        ylabel = "rows of nodes"
        r_of, c_of = cell // cols, cell % cols
    else:
        n_rows = int(np.prod([sizes[d] for d in row_dims])) if row_dims else 1
        row = np.zeros(world, dtype=np.int64)
        full_coords = {d: np.zeros(world, dtype=np.int64) for d in coords}
        for d in coords:
            full_coords[d][ranks] = coords[d]
        for d in row_dims:
            row = row * sizes[d] + full_coords[d]
        col = full_coords["dp"]
        if n_rows == 1 and sizes["dp"] > MAX_UNWRAPPED_COLS:  # pure data parallel: wrap the replicas
            cols = _wrap(sizes["dp"])
            r_of, c_of = col // cols, col % cols
            rows = math.ceil(sizes["dp"] / cols)
            xlabel, ylabel = f"DP replica (mod {cols})", f"DP replicas, {cols} per row"
            yticks = [(i + 0.5, str(i * cols)) for i in range(0, rows, max(1, rows // 12))]
        else:
            # many replicas: wrap them into bands of `width` columns, each band a full copy of the rows
            width = sizes["dp"]
            if sizes["dp"] > MAX_UNWRAPPED_COLS:
                width = max(16, min(sizes["dp"], math.ceil(math.sqrt(2 * n_rows * sizes["dp"]))))
                width = math.ceil(sizes["dp"] / math.ceil(sizes["dp"] / width))
            n_bands = math.ceil(sizes["dp"] / width)
            cols, rows = width, n_rows * n_bands
            r_of, c_of = (col // width) * n_rows + row, col % width
            what = " › ".join(f"{d.upper()} {'stage' if d == 'pp' else 'rank'}" for d in row_dims) or "(one row)"
            xlabel = "DP replica (dp index)" if n_bands == 1 else f"DP replica (mod {width})"
            ylabel = what if n_bands == 1 else f"DP replicas in bands of {width} › {what}"
            per_stage = n_rows // sizes["pp"] if "pp" in row_dims else n_rows
            stage_starts = [b * n_rows + s * per_stage for b in range(n_bands) for s in range(n_rows // per_stage)]
            wrap_edges = [b * n_rows for b in range(1, n_bands)]
            band_edges = [e for e in stage_starts if e > 0 and e not in wrap_edges]
            if n_bands > 1:
                yticks = [
                    (b * n_rows + n_rows / 2, f"dp {b * width}–{min(sizes['dp'], (b + 1) * width) - 1}")
                    for b in range(n_bands)
                ]
            elif "pp" in row_dims:
                step = max(1, sizes["pp"] // 16)
                yticks = [(s * per_stage + per_stage / 2, f"stage {s}") for s in range(0, sizes["pp"], step)]
            elif row_dims:
                yticks = [(i + 0.5, str(i)) for i in range(0, n_rows, max(1, n_rows // 16))]
    flat = np.where(rank_node >= 0, r_of * cols + c_of, -1)
    n = rows * cols
    valid = flat >= 0
    fl = flat[valid]
    codes = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(codes, fl, code_of[valid])
    codes[codes == np.iinfo(np.int64).max] = -1
    sus = np.zeros(n, dtype=bool)
    cul = np.zeros(n, dtype=bool)
    np.logical_or.at(sus, fl, susp[valid])
    np.logical_or.at(cul, fl, culp[valid])
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, fl, np.arange(world)[valid])
    first[first == np.iinfo(np.int64).max] = -1
    node = np.full(n, -1, dtype=np.int64)
    has = first >= 0
    node[has] = rank_node[first[has]]
    per_cell = int(np.bincount(fl, minlength=n).max()) if fl.size else 1
    shape = (rows, cols)
    return RankGrid(
        codes.reshape(shape),
        sus.reshape(shape),
        cul.reshape(shape),
        node.reshape(shape),
        first.reshape(shape),
        tuple(classes),
        per_cell,
        unit,
        xlabel,
        ylabel,
        tuple(yticks),
        tuple(band_edges),
        tuple(wrap_edges),
        n_nodes,
        world,
    )


def _n_cells(row_dims: Sequence[str], sizes: Mapping[str, int]) -> int:
    return int(np.prod([sizes[d] for d in row_dims])) * sizes["dp"] if row_dims else sizes["dp"]


def boundary_segments(labels: np.ndarray) -> np.ndarray:
    """Segments ``(k, 2, 2)`` in cell coordinates between horizontally/vertically adjacent cells whose
    labels differ (cell (i, j) spans x in [j, j+1], y in [i, i+1])."""
    rows, cols = labels.shape
    segs = []
    vi, vj = np.nonzero(labels[:, 1:] != labels[:, :-1])  # vertical edge at x = j + 1
    if vi.size:
        x = vj + 1.0
        segs.append(np.stack([np.stack([x, vi], 1), np.stack([x, vi + 1.0], 1)], 1))
    hi, hj = np.nonzero(labels[1:, :] != labels[:-1, :])  # horizontal edge at y = i + 1
    if hi.size:
        y = hi + 1.0
        segs.append(np.stack([np.stack([hj, y], 1), np.stack([hj + 1.0, y], 1)], 1))
    return np.concatenate(segs).astype(float) if segs else np.zeros((0, 2, 2))


def mask_outline(mask: np.ndarray) -> np.ndarray:
    """Segments around the cells where ``mask`` is true (the outside edge of each marked region)."""
    padded = np.pad(mask.astype(np.int8), 1)
    segs = boundary_segments(padded)
    if segs.size == 0:
        return segs
    return segs - 1.0  # undo the padding offset
