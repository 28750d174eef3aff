"""The node agent's section of the configuration tree. Imports only :mod:`rankscope.spine`."""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from rankscope.spine import (
    ConfigError,
    check_int,
    check_non_negative,
)


def default_pyspy() -> str:
    """py-spy installed beside this interpreter (a venv's bin/), else whatever ``py-spy`` is on PATH."""
    import shutil

    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else (shutil.which("py-spy") or "py-spy")


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """The node agent; defaults are the production settings (ByteRobust's numbers)."""

    store: str = ""  # required to run the agent (checked by :func:`resolve_agent`)
    job: str = "default"
    node: str = ""  # empty: the hostname; per-rank nodes reported by the hook win
    run_dir: str = "/tmp/rankscope-run"
    metric_interval_seconds: float = 1.0
    discovery_interval_seconds: float = 10.0
    flush_interval_seconds: float = 30.0  # critical events and captures flush at once
    max_buffer_rows: int = 100_000
    stall_seconds: float = 600.0  # "zero RDMA traffic within 10 minutes" stand-in: no step progress
    slow_factor: float = 0.0  # >0: a step this many times slower than the baseline counts as fail-slow
    capture_rounds: int = 1  # 5 for fail-slow analysis
    round_interval_seconds: float = 10.0
    stack_timeout_seconds: float = 5.0
    crash_grace_seconds: float = 2.0
    capture_flight_recorder: bool = True
    pyspy: str = ""  # empty: py-spy next to this Python, else on PATH
    trigger_file: str = ""  # empty: <run_dir>/trigger
    kernel_log: str = "/dev/kmsg"  # a file path also works; empty disables
    disk_paths: tuple[str, ...] = ()  # watched for full/read-only; the store and run_dir always are
    min_free_bytes: int = 1 << 30
    gpu: bool = True
    launcher_pid: int = 0  # >0: only this launcher's process tree (several jobs on one node)
    exit_after_captures: int = 0  # >0: stop after this many captures (tests, benchmarks)
    max_runtime_seconds: float = 0.0  # >0: stop after this long
    metrics_port: int = 0  # >0: serve the agent's own health for Prometheus on 127.0.0.1:PORT
    recover: str = ""  # local | slurm | k8s: run `rankscope recover STORE --job J --backend B` after each capture
    recover_args: tuple[str, ...] = ()  # its other arguments (--apply, the backend's options)

    def __post_init__(self) -> None:
        for name in (
            "metric_interval_seconds",
            "discovery_interval_seconds",
            "flush_interval_seconds",
            "stall_seconds",
            "round_interval_seconds",
            "stack_timeout_seconds",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"agent config: {name}={value!r} must be a positive number of seconds (e.g. 1.0)")
        for name in ("slow_factor", "crash_grace_seconds", "max_runtime_seconds"):
            check_non_negative(f"agent config: {name}", getattr(self, name), error=ConfigError)
        if self.slow_factor and self.slow_factor <= 1:
            raise ConfigError(f"agent config: slow_factor={self.slow_factor!r} must be 0 (off) or > 1 (e.g. 3)")
        for name in ("capture_rounds", "max_buffer_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"agent config: {name}={value!r} must be a positive integer")
        for name in ("exit_after_captures", "launcher_pid", "min_free_bytes"):
            check_int(f"agent config: {name}", getattr(self, name), minimum=0, error=ConfigError)
        if self.recover not in ("", "local", "slurm", "k8s"):
            raise ConfigError(f"agent config: recover={self.recover!r} must be local, slurm, k8s or empty (off)")
        if check_int("agent config: metrics_port", self.metrics_port, minimum=0, error=ConfigError) > 65535:
            raise ConfigError(f"agent config: metrics_port={self.metrics_port!r} must be a TCP port (1-65535, 0 = off)")
        if not self.node:
            object.__setattr__(self, "node", socket.gethostname())
        if not self.trigger_file:
            object.__setattr__(self, "trigger_file", str(Path(self.run_dir) / "trigger"))
        object.__setattr__(self, "disk_paths", tuple(self.disk_paths))
        if not self.pyspy:
            object.__setattr__(self, "pyspy", default_pyspy())
