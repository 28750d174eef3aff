"""diagnose_perf: metric outliers per fault kind, stragglers, imbalance and healthy verdicts."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from rankscope.analytics import performance
from rankscope.analytics.performance.metrics import metric_cube
from rankscope.config import PerfConfig
from rankscope.harness.synthetic_metrics import FAULT_KINDS, make_metrics, make_timings
from rankscope.spine import InputError


def diagnose_perf(metrics, timings, topology, *, job="", config=None):
    """The metrics-and-timings verdict (None without either)."""
    f = performance.facts(metrics, timings, topology, config=config)
    return performance.verdict(f, topology, job=job) if f is not None else None


DRIVER = {
    "gpu-throttle": "gpu_sm_clock_hertz",
    "nic-degrade": "node_network_receive_bytes_per_second",
    "ecc-growth": "gpu_ecc_errors_total",
    "pcie-downgrade": "gpu_pcie_throughput_bytes_per_second",
    "slow-cpu": "node_cpu_utilization_ratio",
}


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_kind_names_the_machine_metric_and_onset(kind):
    run = make_metrics(n_machines=24, duration_s=1200, faults={kind: 1}, onset_range_s=(200, 300), seed=11)
    fault = run.faults[0]
    v = diagnose_perf(run.to_long(), None, None, job="j")
    assert v is not None
    assert v.verdict == ("degraded" if kind == "ecc-growth" else "fail-slow")
    assert v.culprit_nodes == (fault.node,) and v.suspect_nodes == (fault.node,)
    assert DRIVER[kind] in v.details["drivers"][fault.node]
    onset = pl.Series([v.details["onset"]]).str.to_datetime().dt.epoch("s")[0] - 1767225600
    assert fault.onset_s - 20 <= onset <= fault.onset_s + 700
    assert v.sources == ("metrics",)
    json.loads(v.to_json())


def test_fault_free_metrics_are_healthy():
    run = make_metrics(n_machines=24, duration_s=900, seed=12)
    v = diagnose_perf(run.to_long(), None, None)
    assert v.verdict == "healthy" and v.suspect_nodes == ()


def test_slow_machine_in_timings_is_fail_slow():
    df, topo, truth = make_timings("tp=2,pp=4,dp=8", scenario="slow-machine", seed=2)
    v = diagnose_perf(None, df, topo, job="j")
    assert v.verdict == "fail-slow"
    assert v.culprit_nodes == truth.slow_nodes
    assert v.details["onset"].startswith(f"step {truth.onset_step}")
    assert all(d.startswith("op:") for d in v.details["drivers"][truth.slow_nodes[0]])
    assert v.suspect_ranks and all(topo.node_of(r) == truth.slow_nodes[0] for r in v.suspect_ranks)


@pytest.mark.parametrize("scenario", ["slow-stage", "data-imbalance", "global-slowdown"])
def test_imbalance_verdict_blames_no_one(scenario):
    df, topo, _ = make_timings("tp=2,pp=4,dp=8", scenario=scenario, seed=3)
    v = diagnose_perf(None, df, topo)
    assert v.verdict == "imbalance"
    assert v.suspect_nodes == () and v.culprit_nodes == ()
    assert any("no machine" in r or "not a machine" in r or "no straggler" in r for r in v.reasons)


def test_nothing_to_analyze_is_none():
    assert diagnose_perf(None, None, None) is None
    assert diagnose_perf(pl.DataFrame(), None, None) is None


def test_metrics_and_timings_agree():
    run = make_metrics(n_machines=16, duration_s=900, faults={"gpu-throttle": 1}, onset_range_s=(250, 300), seed=5)
    df, topo, truth = make_timings("tp=1,pp=1,dp=16", scenario="slow-machine", gpus_per_node=1, seed=5)
    node = truth.slow_nodes[0]
    metrics = run.to_long().with_columns(
        pl.col("node").replace({run.faults[0].node: node, node: run.faults[0].node}).str.replace("node-00", "node-")
    )
    metrics = metrics.with_columns(pl.col("node").str.replace(r"^node-0*(\d)", "node-$1"))
    v = diagnose_perf(metrics, df, topo)
    assert v.verdict == "fail-slow" and v.culprit_nodes == (node,)
    assert v.confidence == pytest.approx(0.9)
    assert set(v.sources) == {"metrics", "timings"}


def test_gpu_level_metrics_compare_gpus():
    rng = np.random.default_rng(0)
    rows = []
    for node in range(6):
        for gpu in range(4):
            v = 1.98e9 + rng.normal(0, 2e6, 600)
            if node == 2 and gpu == 3:
                v[200:] *= 0.7
            rows.append(
                pl.DataFrame(
                    {
                        "ts": np.arange(600, dtype=float),
                        "node": f"n{node}",
                        "gpu": gpu,
                        "metric": "gpu_sm_clock_hertz",
                        "value": v,
                    }
                )
            )
    df = pl.concat(rows)
    cfg = PerfConfig(continuity_seconds=120)
    cube = metric_cube(df, cfg)
    (gpu_level,) = cube.levels
    assert gpu_level.level == "gpu" and gpu_level.values.shape == (24, 40, 1) and gpu_level.values.dtype == np.float32
    v = diagnose_perf(df, None, None, config=cfg)
    assert v.culprit_nodes == ("n2",)
    assert v.details["metric_alerts"][0]["unit"] == "n2/gpu3"


def test_counters_become_rates_across_a_reset():
    ts = np.arange(0, 600, 5.0)
    rows = []
    for node in ("a", "b", "c"):
        v = 1000.0 + 2.0 * ts  # a counter since boot: 2 per second
        if node == "b":
            v[60:] = 2.0 * (ts[60:] - ts[60])  # the exporter restarted: the counter starts again from zero
        rows.append(pl.DataFrame({"ts": ts, "node": node, "metric": "x_total", "value": v}))
    cube = metric_cube(pl.concat(rows), PerfConfig())
    (lv,) = cube.levels
    assert lv.kinds == ("counter",)
    rates = lv.values[:, :, 0]
    assert np.nanmax(np.abs(rates - 2.0)) < 1e-4  # never negative, never "the new value"
    assert np.isfinite(rates).mean() > 0.9 and any("reset" in n for n in cube.notes)


def test_bad_metrics_and_config_are_named():
    with pytest.raises(InputError, match="missing column"):
        diagnose_perf(pl.DataFrame({"ts": [1.0], "node": ["a"]}), None, None)
    with pytest.raises(InputError, match="continuity_seconds"):
        PerfConfig(continuity_seconds=0)


def test_too_few_machines_is_inconclusive():
    df = pl.DataFrame({"ts": [0.0, 1.0] * 2, "node": ["a", "a", "b", "b"], "metric": ["m"] * 4, "value": [1.0] * 4})
    v = diagnose_perf(df, None, None)
    assert v.verdict == "inconclusive" and "needs 3" in v.reasons[0]


def test_detect_command_over_files_and_store(tmp_path):
    from typer.testing import CliRunner

    from rankscope.cli.main import app
    from rankscope.datasets.store.store import Store

    df, _, truth = make_timings("tp=2,pp=2,dp=4", scenario="slow-machine", gpus_per_node=4, seed=1)
    (tmp_path / "dir").mkdir()
    df.write_csv(tmp_path / "dir" / "timings.csv")
    runner = CliRunner()
    res = runner.invoke(app, ["detect", str(tmp_path / "dir"), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["culprit_nodes"] == list(truth.slow_nodes)
    store = Store(tmp_path / "store", create=True)
    store.write("timings", df.drop("tp", "pp", "dp").with_columns(pl.lit("j1").alias("job")))
    res = runner.invoke(app, ["detect", str(tmp_path / "store"), "--layout", "tp=2,pp=2,dp=4", "--gpus-per-node", "4"])
    assert res.exit_code == 0 and "verdict: fail-slow" in res.stdout
    res = runner.invoke(app, ["detect", str(tmp_path / "nothing")])
    assert res.exit_code == 2


def test_jittered_and_coarse_sampling():
    run = make_metrics(n_machines=12, duration_s=1200, faults={"slow-cpu": 1}, onset_range_s=(200, 250), seed=21)
    df = run.to_long()
    offsets = {n: 0.1 * i for i, n in enumerate(run.nodes)}  # each node samples at its own sub-second offset
    jit = df.with_columns(
        pl.col("ts") + pl.duration(microseconds=pl.col("node").replace_strict(offsets).mul(1e6).cast(pl.Int64))
    )
    cube = metric_cube(jit, PerfConfig())
    assert cube.sample_interval_s and max(cube.sample_interval_s.values()) == pytest.approx(1.0, abs=0.05)
    assert diagnose_perf(jit, None, None).culprit_nodes == (run.faults[0].node,)
    coarse = df.filter(pl.col("ts").dt.second() % 15 == 0)  # one sample per 15 s: longer than a 10 s window
    v = diagnose_perf(coarse, None, None)
    assert v.culprit_nodes == (run.faults[0].node,)
    own = df.filter(pl.col("metric") == "gpu_power_watts").with_columns(
        pl.lit("rankscope_agent_cpu_seconds_total").alias("metric")
    )
    with pytest.raises(InputError, match="no samples"):  # the agent's own metrics describe the monitor
        metric_cube(own, PerfConfig())
