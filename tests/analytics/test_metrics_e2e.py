"""Metrics end to end through the CLI (``rankscope diagnose DIR --format json``) on generated fleet telemetry
(:mod:`rankscope.harness.metric_cases`: DCGM exporter and node_exporter physics, counters since boot, benign
events): the same fault in the three formats operators export, a healthy job, a job-wide shift, one slow host
that makes every other machine wait, and short benign events. Also: the streaming binning gives the same cube
in one chunk or many, with labels or without."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rankscope.cli.main import app
from rankscope.datasets.domain.metrics import MetricSet
from rankscope.harness.metric_cases import write_case, write_prometheus
from rankscope.harness.metric_fleet import make_job

FEW = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_SM_CLOCK",
    "node_load1",
    "node_netstat_Tcp_RetransSegs",
    "node_network_receive_bytes_total",
)


def _diagnose(path, *args):
    res = CliRunner().invoke(app, ["diagnose", str(path), "--format", "json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _case(tmp_path, kind, seed, **kw):
    job = make_job(
        kind, seed=seed, **{"machines": 48, "duration_s": 1200, "dcgm_interval_s": 15, "node_interval_s": 15, **kw}
    )
    return write_case(job, tmp_path)


@pytest.fixture(scope="module")
def nic_job(tmp_path_factory):
    d = tmp_path_factory.mktemp("nic")
    return d, _case(d, "nic", 4, metrics=FEW)


@pytest.mark.parametrize("form", ["parquet", "text", "json"])
def test_a_nic_fault_is_named_in_every_format(nic_job, tmp_path, form):
    d, exp = nic_job
    src = d / "metrics"
    if form != "parquet":
        write_prometheus(pq.read_table(d / "metrics" / "metrics.parquet"), tmp_path / form, form=form)
        src = tmp_path / form
    v = _diagnose(src)
    assert v["verdict"] in ("fail-slow", "degraded"), v["reasons"]
    assert v["suspect_nodes"] == exp["culprit_nodes"] == v["culprit_nodes"]
    assert 0 <= v["confidence"] <= 1
    assert any("Retrans" in r for r in v["reasons"])
    assert v["details"]["metrics"]["calibration"]["threshold"] > 0


def test_a_forced_format_and_node_label(nic_job, tmp_path):
    d, exp = nic_job
    write_prometheus(pq.read_table(d / "metrics" / "metrics.parquet"), tmp_path / "t", form="text")
    v = _diagnose(tmp_path / "t", "--metric-format", "prometheus-text", "--node-label", "instance")
    assert v["suspect_nodes"] == exp["culprit_nodes"]


def test_a_healthy_job_with_short_benign_events_names_nobody(tmp_path):
    exp = _case(tmp_path, "healthy", 9, machines=64, duration_s=1500, node_interval_s=30, n_benign=8)
    assert exp["benign"]  # temperature blips, retransmit and CPU bursts, clock dips, brief stalls (< 240 s)
    v = _diagnose(tmp_path / "metrics")
    assert v["verdict"] == "healthy" and v["suspect_nodes"] == [] and v["culprit_nodes"] == []


def test_a_job_wide_shift_names_nobody(tmp_path):
    _case(tmp_path, "job-wide", 12, machines=64)
    v = _diagnose(tmp_path / "metrics")
    assert v["verdict"] in ("healthy", "imbalance") and v["suspect_nodes"] == []


def test_one_slow_host_is_named_not_the_machines_that_wait_for_it(tmp_path):
    exp = _case(tmp_path, "slow-host", 21, machines=96)
    v = _diagnose(tmp_path / "metrics")
    # every other machine's utilisation and power drop while they wait; only the slow host is named
    if v["verdict"] == "imbalance":
        assert v["suspect_nodes"] == []
    else:
        assert v["verdict"] == "fail-slow" and v["suspect_nodes"] == exp["culprit_nodes"]


def test_too_little_data_is_inconclusive(tmp_path):
    _case(tmp_path, "healthy", 9, machines=16, duration_s=240)
    v = _diagnose(tmp_path / "metrics")
    assert v["verdict"] == "inconclusive" and v["suspect_nodes"] == []


def _by_unit(cube):
    out = {}
    for lv in cube.levels:
        for u in range(lv.values.shape[0]):
            key = (lv.level, cube.machines[lv.unit_machine[u]], lv.unit_gpu[u])
            out[key] = {f: lv.values[u, :, j] for j, f in enumerate(lv.features)}
    return out


def test_many_chunks_and_labelled_rows_give_the_same_cube(tmp_path, monkeypatch):
    from rankscope.datasets.readers import metric_binning, metric_files
    from rankscope.datasets.readers.metric_cube import build_cube

    _case(tmp_path, "pcie", 3, machines=12, duration_s=900, dcgm_interval_s=5)
    frame = pl.read_parquet(tmp_path / "metrics" / "metrics.parquet")
    one = build_cube(MetricSet(frame=frame), block_s=30.0)
    monkeypatch.setattr(metric_files, "CHUNK_ROWS", 50_000)  # many chunks: series split across them
    monkeypatch.setattr(metric_binning, "BUFFER_ROWS", 60_000)
    many = build_cube(MetricSet(frame=frame.sort("ts")), block_s=30.0)  # scrape by scrape: series across chunks
    labelled = build_cube(MetricSet(frame=frame.with_columns(pl.lit("train").alias("job"))), block_s=30.0)
    for other in (many, labelled):
        assert other.n_blocks == one.n_blocks and other.t0_s == one.t0_s
        a, b = _by_unit(one), _by_unit(other)
        assert a.keys() == b.keys()
        for key in a:
            for f in a[key]:
                np.testing.assert_allclose(a[key][f], b[key][f], rtol=1e-4, equal_nan=True, err_msg=f"{key} {f}")


def test_xid_metric_is_worded_as_the_xid_not_as_a_size() -> None:
    """DCGM_FI_DEV_XID_ERRORS holds the last Xid code: "rose by 79 units, score 5.7e12" told an operator
    nothing (outside tester); the throttle-reasons flag is no clock (it was worded in MHz)."""
    from rankscope.analytics.performance.metrics_words import sentence

    ev = {
        "feature": "DCGM_FI_DEV_XID_ERRORS",
        "gpu": 3,
        "reference": "peers",
        "direction": "up",
        "effect_peer_mads": 1e9,
        "effect_units": 79.0,
        "onset_s": 1_790_000_000.0,
        "quorum": 0.9,
        "score": 5.7e12,
        "threshold": 12.8,
    }
    words = sentence("gpu-07", ev, 600.0)
    assert "new Xid error" in words and "last Xid code" in words and "on GPU 3" in words
    assert "far over the calibrated threshold 12.8" in words and "e+12" not in words  # a nil spread: no multiple
    assert "79" not in words  # the change against peers is no Xid code (a GPU holding Xid 31 then 79 rose by 48)
    flag = sentence("gpu-07", {**ev, "feature": "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "effect_units": 1.0}, 600.0)
    assert "slowdown bit set" in flag and "while theirs stayed clear" in flag and "MHz" not in flag
    assert "MADs" not in flag  # "by 1000000000.0 peer MADs" said nothing
