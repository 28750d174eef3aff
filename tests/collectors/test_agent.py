"""The agent loop on a small real process tree (no torch): discovery, steps, stall capture, SIGTERM flush."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from rankscope.collectors.agent import Agent
from rankscope.config import AgentConfig
from rankscope.datasets.store.store import Store
from rankscope.harness.launchers import STUCK_TWO_RANKS

# A "launcher" starting two ranks; each logs 4 steps then waits forever in a named function.
LAUNCHER = STUCK_TWO_RANKS


@pytest.fixture
def mini_job(tmp_path: Path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "RANKSCOPE_RUN_DIR": str(run_dir)}
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], env=env, start_new_session=True)
    yield proc, run_dir
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def config(tmp_path: Path, run_dir: Path, **kw: object) -> AgentConfig:
    base = dict(
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
        max_runtime_seconds=40.0,
    )
    base.update(kw)
    return AgentConfig(**base)  # type: ignore[arg-type]


def test_agent_captures_a_stall_and_writes_every_table(tmp_path: Path, mini_job) -> None:
    proc, run_dir = mini_job
    agent = Agent(config(tmp_path, run_dir, exit_after_captures=1), launcher_pid=proc.pid)
    report = agent.run()
    assert len(report.captures) == 1, report.explain()
    cap = report.captures[0]
    assert cap.reason == "stall" and cap.n_processes == 2 and cap.n_failed == 0
    assert report.failures == {}, report.messages
    store = Store(tmp_path / "store")
    st = store.read("stacks").filter(pl.col("is_main_thread"))
    assert sorted(st["rank"].to_list()) == [0, 1]
    assert set(st["node"].to_list()) == {"node-0", "node-1"}  # the hook's per-rank node
    for frames in st["frames"].to_list():
        assert any(f["function"] == "stuck_forever" for f in frames)
    procs = store.read("processes")
    assert set(procs.filter(pl.col("role") == "trainer")["rank"].to_list()) == {0, 1}
    metrics = set(store.read("metrics")["metric"].to_list())
    assert {
        "train_loss",
        "train_step_time_seconds",
        "process_resident_memory_bytes",
        "node_load1",
        "rankscope_agent_cpu_seconds_total",
    } <= metrics
    kinds = store.read("events")["kind"].to_list()
    assert "stall" in kinds and kinds.count("agent") == 2 + len(agent.messages)
    if not agent.gpu.available:
        assert any("GPU metrics unavailable" in m for m in store.read("events")["message"].to_list())
    assert not (run_dir / "trigger").exists()
    # each hook was asked for a timestamped dump too: the run directory's evidence if a SIGTERM dump is cut
    from rankscope.datasets.readers.rundir import requested_at, split_faulthandler_dumps

    deadline = time.monotonic() + 5
    while True:
        chunks = [c for f in run_dir.glob("pid*.stack.txt") for c in split_faulthandler_dumps(f.read_text())]
        asked = [c for c in chunks if requested_at(c) is not None and "stuck_forever" in c]
        if len(asked) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(asked) == 2, chunks


def test_agent_trigger_file_and_sigterm_flush(tmp_path: Path, mini_job) -> None:
    proc, run_dir = mini_job
    cmd = [
        sys.executable,
        "-m",
        "rankscope",
        "agent",
        str(tmp_path / "store"),
        "--job",
        "mini",
        "--run-dir",
        str(run_dir),
        "--launcher-pid",
        str(proc.pid),
        "--stall-seconds",
        "600",
        "--metric-interval-seconds",
        "0.2",
    ]
    env = {
        **os.environ,
        "RANKSCOPE_AGENT_DISCOVERY_INTERVAL_SECONDS": "0.5",
        "RANKSCOPE_AGENT_KERNEL_LOG": "",
        "RANKSCOPE_AGENT_FLUSH_INTERVAL_SECONDS": "600",
    }
    agent = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while time.time() < deadline and not list(run_dir.glob("pid*.json")):
            time.sleep(0.2)
        time.sleep(2.0)
        # the CLI replaced itself (same pid) with the lean daemon: no typer/rich/pydantic in a week-long process
        cmdline = Path(f"/proc/{agent.pid}/cmdline").read_bytes().split(b"\0")
        assert any(b"rankscope.collectors.daemon" in arg for arg in cmdline), cmdline
        assert b"pydantic_core" not in Path(f"/proc/{agent.pid}/maps").read_bytes()
        subprocess.run(cmd[:4] + ["--run-dir", str(run_dir), "--trigger"], check=True, env=env, capture_output=True)
        while time.time() < deadline and (run_dir / "trigger").exists():
            time.sleep(0.2)
        time.sleep(1.5)
        agent.send_signal(signal.SIGTERM)
        out, err = agent.communicate(timeout=30)
    finally:
        agent.kill()
    assert agent.returncode == 0, err
    assert "trigger 1/1" in out, out + err
    store = Store(tmp_path / "store")
    assert store.read("stacks").height > 0
    # the metrics flush interval is 600 s: rows exist only because SIGTERM flushed them
    assert store.read("metrics").height > 0
    assert "agent stopped" in store.read("events")["message"].to_list()


def test_daemon_rejects_a_bad_config_in_one_line(tmp_path: Path) -> None:
    for arg in (
        '{"store": "x", "bogus": 1}',
        "{not json",
        '{"store": "x", "stall_seconds": -1}',
        '{"store": "x", "slow_factor": "fast"}',
    ):
        r = subprocess.run(
            [sys.executable, "-m", "rankscope.collectors.daemon", arg],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("rankscope: error:"), r.stderr


# The same launcher, but each worker's hook answers an "fr" request the way dump_flight_recorder does (the FR
# JSON, with its recorded dump time, at pid<PID>.fr.json), with a real capture's bytes (no torch needed here).
FR_LAUNCHER = LAUNCHER.replace(
    "hook.install()\n",
    "hook.install()\n"
    "import os, shutil\n"
    "from rankscope.datasets.readers import runfiles as rf\n"
    "def fake_dump(path=None):\n"
    "    target = rf.path(os.environ['RANKSCOPE_RUN_DIR'], os.getpid(), rf.FR)\n"
    "    shutil.copy(os.environ['FR_SRC'] + '/fr_rank' + os.environ['RANK'] + '.json', target)\n"
    "    return str(target)\n"
    "hook.dump_flight_recorder = fake_dump\n",
)


def test_agent_keeps_the_hooks_flight_recorder_dumps_raw(tmp_path: Path, fr_gloo: Path) -> None:
    """A capture asks each hook for an FR dump and copies the bytes into the store unparsed (the fr_dumps
    index says where); diagnose reads them back through the FR reader."""
    import hashlib

    from rankscope.datasets.loading.inputs import load_inputs

    run_dir = tmp_path / "run"
    env = {**os.environ, "RANKSCOPE_RUN_DIR": str(run_dir), "FR_SRC": str(fr_gloo / "hang")}
    proc = subprocess.Popen([sys.executable, "-c", FR_LAUNCHER], env=env, start_new_session=True)
    try:
        cfg = config(tmp_path, run_dir, exit_after_captures=1, capture_flight_recorder=True)
        report = Agent(cfg, launcher_pid=proc.pid).run()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert report.captures and report.captures[0].fr_dumps == 2 and report.failures == {}, report.messages
    store = Store(tmp_path / "store")
    index = store.read("fr_dumps").sort("rank")
    assert index["rank"].to_list() == [0, 1] and set(index["node"].to_list()) == {"node-0", "node-1"}
    for row in index.iter_rows(named=True):
        src = (fr_gloo / "hang" / f"fr_rank{row['rank']}.json").read_bytes()
        assert (tmp_path / "store" / row["path"]).read_bytes() == src
        assert row["sha256"] == hashlib.sha256(src).hexdigest() and row["format"] == "fr-json"
    assert "collectives" not in {p.name for p in (tmp_path / "store").iterdir()}  # nothing decoded into rows
    inputs = load_inputs(tmp_path / "store")
    assert sorted(d.rank for d in inputs.fr_dumps) == [0, 1] and all(d.capture == 0 for d in inputs.fr_dumps)
