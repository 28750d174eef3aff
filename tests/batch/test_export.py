"""Prometheus: ``rankscope export --textfile`` parses with prometheus_client's own parser and follows the naming
conventions; the agent's ``--metrics-port`` serves its health on loopback; batch on a store the agent wrote."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from rankscope.batch.run import run_batch
from rankscope.cli.main import app
from rankscope.collectors.agent import Agent
from rankscope.config import AgentConfig
from rankscope.datasets.store.store import Store
from rankscope.harness.launchers import STUCK_TWO_RANKS

runner = CliRunner()


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _samples(families: dict, name: str) -> list:
    return families[f"rankscope_{name}"].samples


def _check_conventions(families: dict) -> None:
    for name, fam in families.items():
        assert name.startswith("rankscope_"), name
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        for s in fam.samples:
            assert "rank" not in s.labels, (name, s.labels)  # cardinality: never a per-rank series
            if fam.type == "counter" and not s.name.endswith("_created"):
                assert s.name.endswith("_total"), s.name
            if fam.type != "counter":
                assert not s.name.endswith("_total"), s.name
        for bad in ("_milliseconds", "_ms", "_minutes", "_kb", "_mb", "_mib", "_percent"):
            assert not name.endswith(bad), name  # base units only


def test_textfile_parses_and_says_what_the_store_holds(real_store: Path, tmp_path: Path) -> None:
    run_batch(real_store)
    out = tmp_path / "textfile"
    out.mkdir()
    res = runner.invoke(app, ["export", str(real_store), "--textfile", str(out)])
    assert res.exit_code == 0, res.output
    path = out / "rankscope.prom"
    assert res.stdout.strip() == f"wrote {path}" and not [p for p in out.iterdir() if p != path]  # no temp left
    fams = _families(path.read_text())
    _check_conventions(fams)
    verdict = {(s.labels["job"], s.labels["verdict"]): s.value for s in fams["rankscope_job_verdict"].samples}
    assert verdict == {("llama-a", "hang"): 1.0, ("llama-b", "hang"): 1.0, ("field-hang", "hang"): 1.0}
    named = {(s.labels["job"], s.labels["machine"], s.labels["role"]) for s in _samples(fams, "job_machine_named")}
    assert named == {
        ("llama-a", "gpu-bad", "culprit"),
        ("llama-b", "gpu-bad", "culprit"),
        ("field-hang", "node3", "culprit"),  # the real hang's spinning rank 6
    }
    blamed = {(s.labels["machine"], s.labels["role"]): s.value for s in _samples(fams, "machine_blamed_incidents")}
    assert blamed[("gpu-bad", "culprit")] == 2.0
    assert fams["rankscope_machine_blamed_incidents"].type == "counter"
    quar = {s.labels["machine"]: s.value for s in fams["rankscope_machine_quarantined"].samples}
    assert quar == {"gpu-bad": 1.0, "node3": 0.0}
    runs = fams["rankscope_batch_runs"]
    assert runs.type == "counter" and runs.samples[0].name == "rankscope_batch_runs_total"
    assert runs.samples[0].value == 1
    dur = fams["rankscope_batch_last_run_duration_seconds"].samples[0].value
    assert 0 < dur < 600
    assert fams["rankscope_batch_last_run_success"].samples[0].value == 1.0
    assert fams["rankscope_batch_last_run_failed_jobs"].samples[0].value == 0.0
    when = fams["rankscope_job_incident_timestamp_seconds"].samples[0].value
    assert abs(when - time.time()) < 86400  # epoch seconds, not milliseconds


def test_batch_failures_reach_the_textfile(real_store: Path, tmp_path: Path) -> None:
    bad = next((real_store / "stacks" / "job=llama-b").glob("part-*.parquet"))
    bad.write_bytes(b"not parquet")
    assert run_batch(real_store).exit_code == 1
    out = tmp_path / "tf"
    out.mkdir()
    assert runner.invoke(app, ["export", str(real_store), "--textfile", str(out), "--name", "prod"]).exit_code == 0
    fams = _families((out / "prod.prom").read_text())
    assert fams["rankscope_batch_last_run_failed_jobs"].samples[0].value == 1.0
    assert fams["rankscope_batch_last_run_success"].samples[0].value == 0.0
    assert fams["rankscope_batch_job_failures"].samples[0].value == 1.0


def test_export_of_an_empty_store_and_bad_paths(tmp_path: Path) -> None:
    Store(tmp_path / "s", create=True)
    (tmp_path / "tf").mkdir()
    assert runner.invoke(app, ["export", str(tmp_path / "s"), "--textfile", str(tmp_path / "tf")]).exit_code == 0
    fams = _families((tmp_path / "tf" / "rankscope.prom").read_text())
    assert fams["rankscope_batch_runs"].samples[0].value == 0.0 and not fams["rankscope_job_verdict"].samples
    res = runner.invoke(app, ["export", str(tmp_path / "s"), "--textfile", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "no such directory" in res.stderr


# -- the agent -----------------------------------------------------------------------------------------------
LAUNCHER = STUCK_TWO_RANKS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return _families(r.read().decode())
    except OSError:
        return None


@pytest.mark.slow
def test_agent_metrics_port_and_batch_on_the_agents_store(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], env={**os.environ, "RANKSCOPE_RUN_DIR": str(run_dir)}, start_new_session=True
    )
    port = _free_port()
    cfg = AgentConfig(
        store=str(tmp_path / "store"),
        job="mini",
        node="host-a",
        run_dir=str(run_dir),
        metric_interval_seconds=0.2,
        discovery_interval_seconds=0.5,
        flush_interval_seconds=1.0,
        stall_seconds=1.5,
        capture_flight_recorder=False,
        kernel_log="",
        max_runtime_seconds=60.0,
        metrics_port=port,
    )
    agent = Agent(cfg, launcher_pid=job.pid)
    t = threading.Thread(target=agent.run)
    t.start()
    try:
        fams = None
        deadline = time.monotonic() + 50
        while time.monotonic() < deadline:
            fams = _scrape(port)
            if fams and fams["rankscope_agent_captures"].samples[0].value >= 1:
                break
            time.sleep(0.3)
        assert fams is not None and fams["rankscope_agent_captures"].samples[0].value >= 1
        assert agent._metrics_server.server_address[0] == "127.0.0.1"  # loopback only
    finally:
        agent.stop()
        t.join(30)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    _check_conventions(fams)
    hist = fams["rankscope_agent_capture_duration_seconds"]
    assert hist.type == "histogram"
    count = next(s.value for s in hist.samples if s.name.endswith("_count"))
    assert count >= 1
    up = {s.labels["collector"]: s.value for s in fams["rankscope_agent_collector_up"].samples}
    assert up["discovery"] == 1.0 and up["metrics"] == 1.0 and up["capture"] == 1.0
    written = {s.labels["table"]: s.value for s in fams["rankscope_agent_rows_written"].samples}
    assert written.get("metrics", 0) > 0
    assert fams["rankscope_agent_resident_memory_bytes"].samples[0].value > 10 * 2**20
    assert _scrape(port) is None  # the endpoint goes away with the agent

    # the store the agent wrote: one capture series is one incident, diagnosed once
    rep = run_batch(tmp_path / "store")
    assert rep.exit_code == 0 and rep.jobs_done == 1, rep.lines()
    rows = Store(tmp_path / "store").read("verdicts").to_dicts()
    assert len(rows) == 1 and rows[0]["incident_id"].startswith("capture-")
    assert rows[0]["input_fingerprint"].startswith("capture:") and rows[0]["incident_source"] == "capture"
    assert run_batch(tmp_path / "store").verdicts_written == 0


def test_the_lean_daemon_does_not_load_prometheus_client_unless_asked() -> None:
    code = (
        "import sys, rankscope.collectors.agent, rankscope.collectors.daemon; print('prometheus_client' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"
