"""Timing stragglers as a persistent change against the peers (ported from proto-metrics): the worker that became
slow is named by the data's own name, a worker slower from the start and a job-wide slowdown are not; the
calibrated rank test keeps the scikit-learn contract; the real Alibaba PAI job 1 names worker-6 (also with a
``--layout``) and its healthy stretches name nobody."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from rankscope.analytics import performance
from rankscope.models import StragglerDetector
from rankscope.spine import InputError

PAI = Path(os.environ.get("RANKSCOPE_SHARED_DIR") or Path(__file__).resolve().parents[2].parent / "shared") / (
    "data/alibaba_pai_minibatch/job_1_norm.csv"
)


def _frame(rng, slow=None, offset=None, steps=300, workers=16):
    d = 100 * rng.lognormal(0, 0.03, (steps, workers)) * rng.lognormal(0, 0.05, (steps, 1))
    if offset is not None:
        d[:, offset] *= 1.15  # slower from the first step: a static offset, not a fault
    if slow is not None:
        d[150:, slow] *= 1.4
    s, w = np.meshgrid(np.arange(steps), np.arange(workers), indexing="ij")
    return pl.DataFrame(
        {
            "rank": w.ravel(),
            "step": s.ravel(),
            "op": "forward",
            "duration_s": d.ravel(),
            "node": [f"gpu-{i}" for i in w.ravel()],
        }
    )


def _verdict(df):
    return performance.verdict(performance.facts(None, df, None), None, job="j")


def test_names_the_worker_that_became_slow_not_the_offset_one():
    v = _verdict(_frame(np.random.default_rng(0), slow=5, offset=9))
    assert v.verdict == "fail-slow" and v.suspect_nodes == ("gpu-5",) == v.culprit_nodes


def test_offsets_and_a_job_wide_slowdown_name_nobody():
    f = _frame(np.random.default_rng(1), offset=3)
    f = f.with_columns(pl.when(pl.col("step") > 150).then(pl.col("duration_s") * 1.5).otherwise(pl.col("duration_s")))
    v = _verdict(f)
    assert v.suspect_nodes == () and v.verdict in ("healthy", "imbalance")


def test_straggler_detector_contract():
    det = StragglerDetector(continuity_steps=6)
    assert det.get_params()["continuity_steps"] == 6
    X = np.random.default_rng(2).lognormal(0, 0.03, (200, 8))
    assert det.fit(X) is det and det.labels_.shape == (8,) and det.decision_scores_.shape == (8,)
    assert det.labels_.sum() == 0
    with pytest.raises(InputError, match="quorum"):
        StragglerDetector(quorum=0.2).fit(X)


@pytest.fixture(scope="module")
def pai_job_1(tmp_path_factory):
    if not PAI.is_file():
        pytest.skip("Alibaba PAI data not present")
    from rankscope.harness.public import load_alibaba_job

    return load_alibaba_job(1, root=PAI.parents[1])


@pytest.mark.parametrize("layout", [None, "dp=10"])
def test_alibaba_pai_job_1_names_worker_6_from_the_data(pai_job_1, tmp_path, layout):
    from rankscope.cli.main import app

    pai_job_1.write_csv(tmp_path / "timings.csv")
    args = ["detect", str(tmp_path), "--format", "json"] + (
        ["--layout", layout, "--gpus-per-node", "1"] if layout else []
    )
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)
    assert v["verdict"] == "fail-slow" and v["suspect_nodes"] == ["worker-6"]  # the file's name, never node-6
    assert v["details"]["onset"].startswith("step 18")  # the trace's times jump at iteration ~1811


def test_alibaba_pai_job_1_healthy_stretches_name_nobody(pai_job_1):
    for lo, hi in ((1, 1741), (2001, 2988)):
        v = _verdict(pai_job_1.filter(pl.col("step").is_between(lo, hi)))
        assert v.suspect_nodes == (), (lo, hi, v.reasons)


@pytest.mark.parametrize("gpus_per_node", [None, 4])
def test_timings_without_a_node_column_name_node_k_only_when_told_how_many_ranks_a_machine_holds(
    tmp_path, gpus_per_node
):
    """An outside tester's timings.csv with no node column and ``--gpus-per-node 8``: the slow rank's machine was
    named ``rank-13``, though --gpus-per-node promises node-<rank // N> for unnamed machines."""
    from rankscope.analytics import diagnose
    from rankscope.datasets.loading.inputs import load_inputs

    _frame(np.random.default_rng(0), slow=5).drop("node").write_csv(tmp_path / "timings.csv")
    inp = load_inputs(tmp_path, gpus_per_node=gpus_per_node)
    v = diagnose(inp)
    assert v.verdict == "fail-slow" and v.culprit_ranks == (5,), v.explain()
    if gpus_per_node:
        assert v.culprit_nodes == ("node-1",) and "node-1" in v.details["inferred_node_names"], v.explain()
        assert any("machine names inferred as node-<rank // 4>" in n for n in v.details["notes"]), v.details
    else:
        assert v.culprit_nodes == ("rank-5",) and "no node column names the machines" in v.explain(), v.explain()


def _job(rng, steps=1200, workers=32, warm=10):
    d = rng.lognormal(0, 0.03, (steps, workers))
    d[:warm] *= 5.5  # compilation, caches, the first collectives
    return d


def _rows(d, start=None):
    s, w = np.meshgrid(np.arange(1, d.shape[0] + 1), np.arange(d.shape[1]), indexing="ij")
    cols = {"rank": w.ravel(), "step": s.ravel(), "op": "forward-backward", "duration_s": d.ravel()}
    if start is not None:
        cols["start_s"] = np.repeat(start, d.shape[1])
    return pl.DataFrame({**cols, "node": [f"gpu-h{i // 8:03d}" for i in w.ravel()]})


def test_warm_up_steps_are_no_job_wide_slowdown_and_the_real_one_is_told():
    """An outside tester's 64 ranks with 10 warm-up steps 5.5x: "every worker became 5.47x slower together from
    step 1"; the job's real 1.5x slowdown from step 600 went untold."""
    d = _job(np.random.default_rng(1))
    d[599:] *= 1.5
    v = _verdict(_rows(d))
    assert not v.suspect_nodes and "1.50x slower together from step 600" in v.explain(), v.explain()
    steady = _verdict(_rows(_job(np.random.default_rng(2))))
    assert steady.verdict == "healthy" and not steady.suspect_nodes, steady.explain()


def test_steps_a_restart_runs_again_count_once():
    """Steps 1-700, then a restart from the step-600 checkpoint re-runs 601-700 (with its own warm-up): both runs'
    times were added, "every worker became 2.00x slower together from step 601"."""
    rng = np.random.default_rng(3)
    first, again = _job(rng, steps=700), _job(rng, steps=600)
    start = np.concatenate([np.cumsum(first.max(axis=1)), 1000.0 + np.cumsum(again.max(axis=1))])
    rows = pl.concat([_rows(first, start[:700]), _rows(again, start[700:]).with_columns(pl.col("step") + 600)])
    v = _verdict(rows)
    assert v.verdict == "healthy" and not v.suspect_nodes, v.explain()


def test_tied_start_times_in_any_row_order_drop_nothing_and_a_restart_says_what_it_left_out():
    from rankscope.analytics.performance.timings import latest_run

    rows = pl.DataFrame({"rank": [0] * 6, "step": [1, 2, 3, 4, 5, 6], "op": "fwd", "duration_s": 0.4,
                         "start_s": [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]})  # fmt: skip
    shuffled = rows.sample(fraction=1.0, shuffle=True, seed=4)  # whole-second stamps, rows not in step order
    assert latest_run(shuffled).height == 6
    notes: list[str] = []
    again = rows.vstack(pl.DataFrame({"rank": [0, 0], "step": [5, 6], "op": "fwd", "duration_s": 0.4,
                                      "start_s": [9.0, 10.0]}))  # fmt: skip
    assert latest_run(again, notes).height == 6 and "2 row(s) of steps run again later" in notes[0]
