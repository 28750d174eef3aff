"""The agent's --recover: one argv-only recover process per complete capture series, a timeout, a quiet period."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from rankscope.collectors.recover import RecoveryLoop
from rankscope.config import AgentConfig, resolve_agent
from rankscope.spine import ConfigError


@dataclass
class Cap:
    snapshot: int
    reason: str = "stall"


def _loop(tmp_path: Path, script: str, **kw: float) -> RecoveryLoop:
    cfg = AgentConfig(
        store=str(tmp_path / "store"),
        job="j",
        run_dir=str(tmp_path),
        recover="local",
        recover_args=("--local-run-dir", "/x", "--apply"),
    )
    loop = RecoveryLoop(cfg, tmp_path, **kw)  # type: ignore[arg-type]
    loop.argv = lambda: [sys.executable, "-c", script]  # type: ignore[method-assign]
    return loop


def test_the_command_is_an_argv_list_with_the_store_job_backend_and_options(tmp_path: Path) -> None:
    cfg = AgentConfig(
        store="/s", job="j", run_dir=str(tmp_path), recover="slurm", recover_args=("--slurm-job-id", "4242", "--apply")
    )
    argv = RecoveryLoop(cfg, tmp_path).argv()
    assert argv[0] == sys.executable and argv[1] == "-c" and "del sys.path[0]" in argv[2]
    assert argv[3:] == ["recover", "/s", "--job", "j", "--backend", "slurm", "--slurm-job-id", "4242", "--apply"]


def test_one_run_per_capture_series_then_a_quiet_period(tmp_path: Path) -> None:
    loop = _loop(tmp_path, "import time; time.sleep(0.5); print('plan: evict m2')", quiet_seconds=30)
    caps: list[Cap] = []
    assert loop.tick(time.time(), caps, busy=False) == []
    caps.append(Cap(int(time.time())))
    assert loop.tick(time.time(), caps, busy=True) == []  # the series is not complete yet
    started = loop.tick(time.time(), caps, busy=False)
    assert [e.kind for e in started] == ["recovery"] and "(apply)" in started[0].message
    caps.append(Cap(int(time.time()) + 1, "crash"))  # the trainers die while the executor stops the job
    assert loop.tick(time.time(), caps, busy=False) == []  # one at a time
    deadline = time.time() + 20
    done: list = []
    while not done and time.time() < deadline:
        done = loop.tick(time.time(), caps, busy=False)
        time.sleep(0.05)
    assert "done" in done[0].message and "plan: evict m2" in done[0].message and done[0].labels["exit_code"] == 0
    caps.append(Cap(int(time.time()) + 2, "crash"))  # within the quiet period: the recovery's own doing
    assert loop.tick(time.time(), caps, busy=False) == [] and loop.proc is None
    loop.quiet_until = 0
    caps.append(Cap(int(time.time()) + 3))
    assert [e.kind for e in loop.tick(time.time(), caps, busy=False)] == ["recovery"]


def test_a_run_past_its_timeout_is_killed_and_reported(tmp_path: Path) -> None:
    loop = _loop(tmp_path, "import time; time.sleep(60)", timeout_seconds=0.5)
    caps = [Cap(int(time.time()))]
    loop.tick(time.time(), caps, busy=False)
    pid = loop.proc.pid if loop.proc else 0
    time.sleep(0.6)
    ev = loop.tick(time.time(), caps, busy=False)
    assert "killed after 0.5 s (timeout)" in ev[0].message and ev[0].severity == "warning"
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)


def test_the_agent_settings_check_the_backend(tmp_path: Path) -> None:
    cfg = resolve_agent({"store": "/s", "recover": "k8s", "recover_args": ("--namespace", "t")}, env={})
    assert cfg.recover == "k8s" and cfg.recover_args == ("--namespace", "t")
    with pytest.raises(ConfigError, match="recover='pbs' must be local, slurm, k8s"):
        resolve_agent({"store": "/s", "recover": "pbs"}, env={})
    assert resolve_agent({"store": "/s"}, env={"RANKSCOPE_AGENT_RECOVER": "slurm"}).recover == "slurm"


def test_a_run_the_cool_down_deferred_is_run_again_when_it_ends(tmp_path: Path) -> None:
    """rankscope recover exits 3 with "held until T": nothing new may fire (the job is still hung), so the
    agent itself re-plans at T."""
    until = time.time() + 1.0
    loop = _loop(tmp_path, f"print('guardrail cooldown: deferred: evict held until {until:.0f}; re-plan then'); "
                 "raise SystemExit(3)", quiet_seconds=0)  # fmt: skip
    caps = [Cap(int(time.time()))]
    loop.tick(time.time(), caps, busy=False)
    deadline = time.time() + 20
    ended: list = []
    while not ended and time.time() < deadline:
        ended = loop.tick(time.time(), caps, busy=False)
        time.sleep(0.05)
    assert "deferred by the cool-down" in ended[0].message and loop.retry_at == pytest.approx(round(until) + 1.0)
    loop.retry_at = time.time()
    again = loop.tick(time.time(), caps, busy=False)
    assert again and "re-planning after the cool-down" in again[0].message


def test_a_relaunched_job_is_no_stall_and_its_steps_count_again() -> None:
    """After a restart from the checkpoint at step 20, steps 21.. are progress, and the startup is not a stall."""
    from rankscope.collectors.stall import StallDetector

    d = StallDetector(10.0)
    for step in range(30):
        d.progress(step, 1000.0 + step)
    assert d.check(1041.0) is not None  # the fault: no progress for 12 s
    d.restart()  # the agent sees the relaunched trainers
    assert d.check(1080.0) is None  # 50 s of startup: no steps yet, no stall
    d.progress(21, 1081.0)
    d.progress(22, 1082.0)
    assert d.check(1083.0) is None and d.check(1093.0) is not None  # a new stall is seen again


def _finish(loop: RecoveryLoop, caps: list[Cap]) -> list:
    deadline = time.time() + 20
    done: list = []
    while not done and time.time() < deadline:
        done = loop.tick(time.time(), caps, busy=False)
        time.sleep(0.05)
    return done


def test_a_plan_that_only_collects_asks_for_another_capture_series_twice_at_most(tmp_path: Path) -> None:
    """A verdict too weak to act on (recover exits 4): capture again and plan again, not wait for a person
    forever and not loop forever either."""
    from rankscope.collectors.recover import COLLECT_ROUNDS, MAX_COLLECTS

    loop = _loop(tmp_path, "import sys; print('collect: another capture round'); sys.exit(4)", quiet_seconds=30)
    caps = [Cap(int(time.time()))]
    for n in range(1, MAX_COLLECTS + 2):
        loop.tick(time.time(), caps, busy=False)
        done = _finish(loop, caps)
        assert done[0].labels["exit_code"] == 4 and "asked for more evidence" in done[0].message
        if n <= MAX_COLLECTS:
            assert loop.collect_rounds == COLLECT_ROUNDS and f"({n} of {MAX_COLLECTS})" in done[0].message
            loop.collect_rounds = 0  # the agent scheduled the series
            caps.append(Cap(int(time.time()) + n))  # its capture is evidence: no quiet period after a collect
        else:
            assert loop.collect_rounds == 0  # enough: the job is left to a person (the plan says what to collect)
