"""The numbers behind the figures: layout, aggregation at scale, pruning, wavefront and timing classes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from rankscope.reports import ReportInputError, load_case
from rankscope.reports import figure_data as fd
from rankscope.reports import grid as gd
from rankscope.reports import tree as tr
from rankscope.reports.ranges import parse_ranks, rank_ranges, short_ranges

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def topo(tp: int, pp: int, dp: int, gpus_per_node: int = 8) -> pl.DataFrame:
    """Megatron's default order (tp fastest, then dp, then pp), ``gpus_per_node`` ranks per machine."""
    r = np.arange(tp * pp * dp)
    return pl.DataFrame(
        {
            "rank": r,
            "node": [f"node-{i}" for i in r // gpus_per_node],
            "tp": r % tp,
            "dp": (r // tp) % dp,
            "pp": r // (tp * dp),
        }
    )


def verdict_with(world: int, culprit: int, outliers: list[int]) -> dict[str, Any]:
    healthy = sorted(set(range(world)) - set(outliers))
    return {
        "verdict": "hang",
        "world_size": world,
        "suspect_ranks": outliers,
        "culprit_ranks": [culprit],
        "clusters": [
            {
                "id": 0,
                "role": "trainer",
                "size": len(healthy),
                "ranks": rank_ranges(healthy),
                "healthy": True,
                "state": "collective",
                "representative": ["main (train.py:1)", "all_reduce (c10d.py:2)"],
            },
            {
                "id": 1,
                "role": "trainer",
                "size": 1,
                "ranks": str(culprit),
                "healthy": False,
                "state": "compute",
                "representative": ["main (train.py:1)", "attention (model.py:9)"],
            },
            {
                "id": 2,
                "role": "trainer",
                "size": len(outliers) - 1,
                "ranks": rank_ranges(r for r in outliers if r != culprit),
                "healthy": False,
                "state": "collective",
                "representative": ["main (train.py:1)", "all_reduce (c10d.py:7)"],
            },
        ],
    }


def test_rank_ranges_round_trip_and_errors() -> None:
    ranks = [0, 1, 2, 5, 7, 8, 100]
    assert rank_ranges(ranks) == "0-2,5,7-8,100"
    assert parse_ranks("0-2,5,7-8,100").tolist() == ranks
    assert parse_ranks([3, 1, 3]).tolist() == [1, 3]
    assert short_ranges(list(range(0, 400, 2)), 20).endswith("(200 ranks)")
    with pytest.raises(ReportInputError, match="runs backwards"):
        parse_ranks("5-2")
    with pytest.raises(ReportInputError, match="cannot read 'x'"):
        parse_ranks("1,x")


def test_small_grid_is_one_cell_per_rank_by_parallel_coordinates() -> None:
    g = gd.rank_grid(verdict_with(176, 139, [136, 137, 138, 139]), topo(4, 4, 11))
    assert g.codes.shape == (16, 11) and g.cell_unit == "rank" and g.ranks_per_cell == 1
    assert g.first_rank[15, 1] == 139  # pp=3, tp=3, dp=1
    assert g.culprit.sum() == 1 and g.culprit[15, 1]
    assert g.suspect.sum() == 4 and g.suspect[12:16, 1].all()
    assert g.classes[g.codes[15, 1]].cluster_ids == (1,)  # the culprit's own cluster, not the healthy one
    assert g.band_edges == (4, 8, 12)
    # machines: 8 consecutive ranks = 4 TP ranks x 2 replicas; boundaries only between machines
    segs = gd.boundary_segments(g.node)
    assert len(segs) > 0 and all(g.node[int(min(s[0][1], s[1][1])), 0] >= 0 for s in segs)


def test_16k_ranks_aggregate_but_one_stuck_rank_still_shows() -> None:
    t = topo(8, 16, 128)  # 16,384 ranks
    v = verdict_with(16384, 9001, [9000, 9001, 9002, 9003])
    g = gd.rank_grid(v, t)
    assert g.codes.size <= gd.MAX_GRID_CELLS and g.cell_unit == "TP group" and g.ranks_per_cell == 8
    assert g.world == 16384 and g.n_nodes == 2048
    ((i, j),) = np.argwhere(g.culprit)
    assert g.classes[g.codes[i, j]].cluster_ids == (1,)  # the 1-rank outlier wins its 8-rank cell
    assert g.suspect.sum() == 1


def test_pure_data_parallel_wraps_and_huge_jobs_fall_back_to_machines() -> None:
    g = gd.rank_grid(verdict_with(512, 3, [2, 3]), topo(1, 1, 512))
    assert g.codes.shape[0] > 1 and g.codes.shape[1] < 512 and g.cell_unit == "rank"
    big = gd.rank_grid(verdict_with(65536, 5, [4, 5]), topo(1, 1, 65536))
    assert big.cell_unit.endswith("node") or big.cell_unit.endswith("nodes")
    assert big.codes.size <= gd.MAX_GRID_CELLS * 2 and big.culprit.sum() == 1


def test_prefix_tree_keeps_the_culprit_branch_when_pruned() -> None:
    v, _ = load_case(FIXTURES / "fail-slow")
    root = tr.prefix_tree(v, max_leaves=10)
    assert root is not None
    leaves = [n for n in root.walk() if not n.children]
    assert len(leaves) <= 12  # the culprit path and its siblings may exceed the target slightly
    culprit_leaves = [n for n in leaves if n.culprit]
    assert culprit_leaves and all(n.status == "outlier" for n in culprit_leaves)
    assert any(n.status == "summary" or n.folded for n in root.walk())


def test_prefix_tree_from_the_verdicts_own_tree() -> None:
    v, _ = load_case(FIXTURES / "hang")
    root = tr.prefix_tree(v)
    assert root is not None and root.n_ranks == 176
    culprit = [n for n in root.walk() if n.culprit and not n.children]
    assert len(culprit) == 1 and culprit[0].ranks == "139" and culprit[0].status == "outlier"
    assert {n.status for n in root.walk()} >= {"healthy", "outlier", "mixed"}


def test_wavefront_of_the_real_gloo_hang() -> None:
    v, ev = load_case(FIXTURES / "hang-gloo")
    assert ev.fr_progress is not None
    wf = fd.fr_wavefront(v, ev.fr_progress)
    row = [i for i, lb in enumerate(wf.row_labels) if lb.startswith("default_pg")][0]
    names = [fd.WAVE_CLASSES[c] for c in wf.codes[row]]
    assert names == ["waiting at the front"] * 3 + ["1 collective behind"]  # rank 3 skipped all_reduce #6
    assert wf.fronts[row] == "front #6" and wf.culprit_cols.tolist() == [3]


def test_wavefront_marks_ranks_without_a_dump() -> None:
    v, ev = load_case(FIXTURES / "fr")
    assert ev.fr_progress is not None
    wf = fd.fr_wavefront(v, ev.fr_progress)
    no_dump = fd.WAVE_CLASSES.index("no Flight Recorder dump")
    assert (wf.codes[:, 28] == no_dump).all()  # rank 28 left no dump in this case
    assert wf.codes.shape[1] == 128


def test_step_matrix_shows_a_slow_rank_and_aggregates_big_jobs() -> None:
    rng = np.random.default_rng(0)
    world, steps = 2048, 900
    d = 1.0 + 0.02 * rng.standard_normal((world, steps))
    d[777, 300:] *= 1.5
    t = pl.DataFrame(
        {
            "rank": np.repeat(np.arange(world), steps),
            "step": np.tile(np.arange(steps), world),
            "op": "step",
            "duration_s": d.ravel(),
        }
    )
    m = fd.step_matrix({"culprit_ranks": [777], "world_size": world}, t)
    assert m.ratio.shape[0] <= fd.MAX_HEATMAP_ROWS and m.ratio.shape[1] <= fd.MAX_HEATMAP_COLS
    row = 777 // m.ranks_per_row
    late = m.ratio[:, m.steps >= 300 + m.steps_per_col]
    assert np.nanargmax(np.nanmean(late, axis=1)) == row and np.nanmean(late[row]) > 1.4
    assert m.suspect_rows.tolist() == [row]


def test_failslow_rounds_put_the_voted_group_first() -> None:
    v, _ = load_case(FIXTURES / "fail-slow")
    r = fd.failslow_rounds(v)
    assert r is not None and r.n_rounds == 5 and r.voted == r.groups[0]
    assert r.voted.startswith("MP group 8") and "node-40" in r.voted
    assert sorted(f[0] for f in r.flags) == [0, 1, 2, 3, 4]


def test_crash_exits_fall_back_to_the_verdict() -> None:
    v, _ = load_case(FIXTURES / "crash")
    ex = fd.crash_exits(v, None)
    assert ex is not None and ex["after_s"][0] == 0.0 and ex["cause"][0] == "primary" and ex["rank"][0] == 6
    assert set(ex["cause"][1:]) == {"cascade"}


def test_bad_prefix_tree_is_one_clear_error() -> None:
    with pytest.raises(ReportInputError, match=r"prefix_tree\[0\]"):
        tr.prefix_tree({"verdict": "hang", "details": {"prefix_tree": [{"frame": "x"}]}})
