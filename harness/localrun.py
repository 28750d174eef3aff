"""The fault job on simulated machines with the node agent closing the loop: what the local backend's
end-to-end test and ``benchmarks/bench_recovery.py`` run.

:func:`start` lays out one directory (``cluster/`` the local backend's state and logs, ``hook/`` the
in-process hook's run directory, ``ckpt/`` the checkpoints, ``store/`` the agent's store), saves a
:class:`~rankscope.recovery.backends.local.LocalBackend` of ``machines`` x ``nproc`` ranks with a warm
standby pool, starts its controller, launches the job (faults injected from a schedule bound to
machines) and, unless ``agent=False``, one ``rankscope agent`` that watches the controller's process
tree and runs ``rankscope recover --backend local --apply`` after each capture. Nobody else acts.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.recovery.backends import local_control
from rankscope.recovery.backends.local import LocalBackend


@dataclass
class LocalRun:
    root: Path
    controller: int
    agent: subprocess.Popen[bytes] | None = None
    started: float = field(default_factory=time.time)

    @property
    def cluster(self) -> Path:
        return self.root / "cluster"

    @property
    def hook(self) -> Path:
        return self.root / "hook"

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def ckpt(self) -> Path:
        return self.root / "ckpt"

    def backend(self) -> LocalBackend:
        return LocalBackend.load(self.cluster)

    def finished(self) -> bool:
        """The latest launch trained to its last step: rank 0 logs ``done`` after the final barrier, which
        every rank reached (how the processes exit afterwards is not training)."""
        gen = str(self.backend().generation)
        return any("done" in p and p.get("gen") == gen for p in self.progress())

    def wait(self, timeout_seconds: float, *, until: Any = None) -> bool:
        deadline = time.monotonic() + timeout_seconds
        test = until or self.finished
        while time.monotonic() < deadline:
            if test():
                return True
            time.sleep(0.5)
        return False

    def progress(self) -> list[dict[str, Any]]:
        try:
            lines = (self.hook / "progress.jsonl").read_text().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def close(self) -> None:
        """Stop the agent and the controller (which stops the job)."""
        if self.agent is not None and self.agent.poll() is None:
            self.agent.terminate()
            try:
                self.agent.wait(30)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait()
        try:
            local_control.request(self.cluster, "shutdown", timeout_seconds=60)
        except Exception:
            pass


def start(
    root: str | os.PathLike[str],
    *,
    faults: Sequence[dict[str, Any]] = (),
    steps: int = 40,
    ckpt_every: int = 5,
    machines: Sequence[str] = ("m0", "m1", "m2", "m3"),
    standby: Sequence[str] = ("s0", "s1"),
    nproc: int = 2,
    step_sleep_s: float = 0.05,
    pg_timeout_s: float = 600.0,
    agent: bool = True,
    stall_seconds: float = 10.0,
    recover_args: Sequence[str] = (),
    agent_args: Sequence[str] = (),
    stop_grace_seconds: float = 5.0,
) -> LocalRun:
    """Lay out ``root``, launch the fault job on the local backend and (by default) the agent beside it."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    schedule = root / "faults.json"
    schedule.write_text(json.dumps(list(faults)))
    env = {
        "OMP_NUM_THREADS": "1",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "PYTHONUNBUFFERED": "1",
        "RANKSCOPE_FAULT_SCHEDULE": str(schedule),
    }
    command = [
        "-m", "rankscope.harness.faultjob", "--run-dir", str(root / "hook"), "--steps", str(steps),
        "--step-sleep-s", str(step_sleep_s), "--num-workers", "0", "--ckpt-every", str(ckpt_every),
        "--pg-timeout-s", str(pg_timeout_s),
    ]  # fmt: skip
    be = LocalBackend(command=command, machines=machines, standby=standby, nproc_per_machine=nproc,
                      ckpt_root=root / "ckpt", run_dir=root / "cluster", env=env,
                      stop_grace_seconds=stop_grace_seconds)  # fmt: skip
    be.save()
    run = LocalRun(root, local_control.start(root / "cluster"))
    run.started = time.time()
    run.backend().launch()
    if agent:
        argv = [
            sys.executable, "-m", "rankscope", "agent", str(run.store), "--job", "localrun", "--run-dir",
            str(run.hook), "--stall-seconds", str(stall_seconds), "--metric-interval-seconds", "0.5",
            "--launcher-pid", str(run.controller), "--recover", "local", "--apply", "--recover-args",
            shlex.join(["--local-run-dir", str(run.cluster), *recover_args]), *agent_args,
        ]  # fmt: skip
        env_agent = {**os.environ, "RANKSCOPE_AGENT_DISCOVERY_INTERVAL_SECONDS": "1", "RANKSCOPE_AGENT_KERNEL_LOG": ""}
        with open(root / "agent.log", "wb") as log:
            run.agent = subprocess.Popen(argv, env=env_agent, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)  # fmt: skip
    return run
