"""The CLI: verdicts on the real probe, JSON shape, the demo, and one clear line for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from rankscope.cli.main import app
from rankscope.datasets.store.store import Store
from rankscope.harness.synthetic import generate_job

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, list(map(str, args)))


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_probe_names_node_3(probe_dir, fmt):
    res = _run("diagnose", probe_dir / "pyspy" / fmt, "--gpus-per-node", "1", "--format", "json")
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)
    assert v["verdict"] == "hang"
    assert v["culprit_nodes"] == ["node-3"] and v["suspect_nodes"] == ["node-3"]
    assert v["suspect_ranks"] == [3]
    for key in ("confidence", "clusters", "evidence", "reasons"):
        assert key in v


def test_text_output_explains(probe_dir):
    res = _run("diagnose", probe_dir / "pyspy" / "text", "--gpus-per-node", "1")
    assert res.exit_code == 0
    assert "isolate: 1 node(s)" in res.stdout and "culprit: node-3" in res.stdout
    assert "not waiting in any collective" in res.stdout


def test_layout_and_manifest_from_a_written_job(tmp_path):
    job = generate_job("tp=4,pp=2,dp=4", gpus_per_node=4, fault="dataloader-stall", seed=5)
    job.write_dir(tmp_path / "d", fmt="pyspy-json")
    res = _run("diagnose", tmp_path / "d", "--layout", "tp=4,pp=2,dp=4", "--gpus-per-node", "4", "--format", "json")
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)
    assert v["verdict"] == "hang"
    assert set(job.truth.culprit_nodes) <= set(v["culprit_nodes"])
    assert any(e["kind"] == "child-stuck" for e in v["evidence"])


def test_ingest_then_diagnose_the_store_and_save(tmp_path, probe_dir):
    st = tmp_path / "store"
    res = _run("ingest", probe_dir / "pyspy" / "json", "--store", st, "--job", "probe", "--gpus-per-node", "1")
    assert res.exit_code == 0, res.output
    res = _run("diagnose", st, "--format", "json", "--save")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["culprit_nodes"] == ["node-3"]
    assert Store(st).read("verdicts")["verdict"].to_list() == ["hang"]
    res = _run("sql", st, "SELECT count(DISTINCT rank) AS n FROM stacks", "--format", "csv")
    assert res.exit_code == 0 and "4" in res.stdout


def test_healthy_job_exits_zero_with_no_suspects(tmp_path):
    job = generate_job("tp=2,pp=2,dp=4", gpus_per_node=4, fault="none", seed=2)
    job.write_dir(tmp_path / "d", fmt="pyspy-text")
    res = _run("diagnose", tmp_path / "d", "--layout", "tp=2,pp=2,dp=4", "--gpus-per-node", "4", "--format", "json")
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)
    assert v["verdict"] == "healthy" and v["suspect_nodes"] == [] and v["culprit_nodes"] == []


def _bad(res, *fragments):
    assert res.exit_code == 2, res.output
    err = res.stderr.strip().splitlines()
    assert len(err) == 1, res.stderr
    assert err[0].startswith("rankscope: error:")
    assert "Traceback" not in res.output
    for f in fragments:
        assert f in err[0], err[0]


def test_bad_inputs_get_one_line_and_exit_2(tmp_path, probe_dir):
    _bad(_run("diagnose", tmp_path / "nope"), "no such file")
    _bad(_run("diagnose", tmp_path), "no stack dumps")
    _bad(_run("diagnose", probe_dir / "pyspy" / "text", "--layout", "tp=3,pp=0"), "pp=0")
    _bad(
        _run("diagnose", probe_dir / "pyspy" / "text", "--layout", "tp=2", "--gpus-per-node", "1"), "outside the layout"
    )
    _bad(_run("diagnose", probe_dir / "pyspy" / "text", "--order", "tp-xx"), "unknown dimension")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "rank0.txt").write_text("Error: Permission denied\n")
    (tmp_path / "m" / "manifest.csv").write_text("file,node\nrank0.txt,n\n")
    _bad(_run("diagnose", tmp_path / "m"), "manifest.csv", "missing rank")


def test_corrupt_store_file_is_named(tmp_path, probe_dir):
    st = tmp_path / "store"
    assert _run("ingest", probe_dir / "pyspy" / "text", "--store", st, "--gpus-per-node", "1").exit_code == 0
    part = next((st / "stacks").rglob("part-*.parquet"))
    part.write_bytes(part.read_bytes()[:100])
    _bad(_run("diagnose", st), part.name, "corrupt or truncated")


def test_failed_py_spy_dump_is_a_collection_problem_never_a_suspect(tmp_path, probe_dir):
    # py-spy's own failure says nothing about the process: it is reported with what to do, and evicts nothing
    d = tmp_path / "d"
    d.mkdir()
    for r in range(3):
        (d / f"rank{r}.txt").write_text((probe_dir / "pyspy/text" / f"rank{r}.txt").read_text())
    (d / "rank3.txt").write_text("Error: Failed to suspend process\n")
    res = _run("diagnose", d, "--gpus-per-node", "1", "--format", "json")
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)
    assert v["verdict"] == "inconclusive" and v["suspect_nodes"] == [] and v["culprit_nodes"] == []
    assert any(e["kind"] == "capture-failed" and e["ranks"] == [3] for e in v["evidence"])
    assert any("rank 3: py-spy failed: Error: Failed to suspend process" in r for r in v["reasons"]), v["reasons"]
    assert v["details"]["collection_problems"][0]["rank"] == 3


def test_demo_is_correct():
    res = _run("demo")
    assert res.exit_code == 0, res.output
    assert "CORRECT" in res.stdout


def test_console_script_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "rankscope", "--help"], capture_output=True, text=True, check=True)
    assert "diagnose" in out.stdout


def test_metrics_and_timings_only_directories(tmp_path):
    from rankscope.harness.synthetic_metrics import make_metrics, make_timings

    run = make_metrics(n_machines=24, duration_s=900, faults={"gpu-throttle": 1}, onset_range_s=(300, 400), seed=3)
    (tmp_path / "m").mkdir()
    run.to_long(job="m").write_parquet(tmp_path / "m" / "metrics.parquet")
    res = _run("diagnose", tmp_path / "m", "--format", "json")
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)
    assert v["verdict"] in ("fail-slow", "degraded")
    assert v["culprit_nodes"] == [run.faults[0].node]

    timings, _, truth = make_timings("tp=2,pp=2,dp=4", scenario="slow-machine", gpus_per_node=2, seed=1)
    (tmp_path / "t").mkdir()
    timings.write_csv(tmp_path / "t" / "timings.csv")
    res = _run("diagnose", tmp_path / "t", "--layout", "tp=2,pp=2,dp=4", "--gpus-per-node", "2", "--format", "json")
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)
    assert set(truth.slow_nodes) <= set(v["culprit_nodes"]), v


def test_timings_survive_the_store(tmp_path):
    from rankscope.harness.synthetic_metrics import make_timings

    timings, _, truth = make_timings("tp=2,pp=2,dp=4", scenario="slow-machine", gpus_per_node=2, seed=2)
    (tmp_path / "t").mkdir()
    timings.write_csv(tmp_path / "t" / "timings.csv")
    st = tmp_path / "store"
    assert _run("ingest", tmp_path / "t", "--store", st, "--job", "tj").exit_code == 0
    assert Store(st).read("timings").height == timings.height
    res = _run("diagnose", st, "--format", "json")
    assert res.exit_code == 0, res.output
    assert set(truth.slow_nodes) <= set(json.loads(res.stdout)["culprit_nodes"])


def test_stacks_and_flight_recorder_in_one_directory_are_fused(tmp_path, probe_dir):
    import shutil

    for f in (probe_dir / "pyspy" / "text").iterdir():
        shutil.copy(f, tmp_path / f.name)
    for f in (probe_dir / "fr").glob("rank_*"):
        shutil.copy(f, tmp_path / f.name)
    res = _run("diagnose", tmp_path, "--gpus-per-node", "1", "--format", "json")
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)
    assert v["sources"] == ["stacks", "flight_recorder"]
    assert v["verdict"] == "hang" and v["culprit_nodes"] == ["node-3"]
    # the probe's FR dumps carry no capture time: no time evidence, so the FR names nobody and the stacks lead
    assert v["details"]["fr_verdict"] == "inconclusive" and v["details"]["support"]["node-3"] == ["stacks"]
