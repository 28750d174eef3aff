"""The agent's liveness checks: a trainer that wrote its exception is recorded as exiting before it is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rankscope.collectors.discovery import ProcInfo
from rankscope.collectors.events import Event
from rankscope.collectors.stall import StallDetector
from rankscope.collectors.tracking import Tracking, _Known
from rankscope.config import AgentConfig
from rankscope.datasets.readers import runfiles as rf


class _Agent(Tracking):
    def __init__(self, run_dir: Path, info: ProcInfo) -> None:
        self.cfg = AgentConfig(store=str(run_dir / "store"), job="j", run_dir=str(run_dir))
        self.run_dir, self.proc_root = run_dir, "/proc"
        self.known = {info.pid: _Known(info, "gpu-node-3")}
        self.alive = {info.pid: info}
        self.detector = StallDetector(600.0)
        self._crash_since, self._last_alive_check, self._crash_captured = None, 0.0, False
        self._urgent, self._next_discovery = False, 1e18
        self.events: list[Event] = []
        self._event = self.events.append
        self._fail = lambda name, exc: None
        self._node_of = lambda rank, pid=None: "gpu-node-3"


def test_a_trainer_tearing_down_after_its_exception_is_recorded_once_before_it_is_gone(tmp_path: Path) -> None:
    """torch's teardown after an uncaught exception can take seconds; the peers stall at once and a capture
    fires meanwhile: it must already hold the first failure (the hook's exception record)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        info = ProcInfo(proc.pid, os.getpid(), "python", "python train.py", 0, role="trainer", rank=6)
        agent = _Agent(tmp_path, info)
        agent._liveness(time.time())
        assert agent.events == [] and agent._crash_since is None  # alive, nothing written: nothing to say
        record = {"pid": proc.pid, "rank": 6, "time": time.time() - 2.0, "type": "RuntimeError", "message": "boom"}
        rf.path(tmp_path, proc.pid, rf.EXIT).write_text(json.dumps(record))
        agent._liveness(time.time())
        assert [e.kind for e in agent.events] == ["process_exit"] and "RuntimeError: boom" in agent.events[0].message
        assert agent.events[0].ts == record["time"] and agent._crash_since is not None  # the crash capture is armed
        assert proc.pid in agent.alive  # still tearing down
        agent._liveness(time.time())
        proc.kill()
        proc.wait()
        agent._liveness(time.time())
        assert len(agent.events) == 1 and proc.pid not in agent.alive  # its death adds no second exit
    finally:
        proc.kill()
