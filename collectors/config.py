"""The agent's configuration: one frozen, validated dataclass, resolved from four sources.

Precedence, highest first: **command-line flags > environment variables > config file > defaults**.
Environment variables are ``RANKSCOPE_AGENT_<FIELD>`` in upper case (``RANKSCOPE_AGENT_STALL_SECONDS=600``);
the config file (``--config`` or ``RANKSCOPE_AGENT_CONFIG``) is TOML or JSON with the field names
as keys, optionally under an ``[agent]`` table. Unknown keys are errors that list the valid ones.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from rankscope.spine import InputError

ENV_PREFIX = "RANKSCOPE_AGENT_"
ENV_CONFIG = "RANKSCOPE_AGENT_CONFIG"


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """Everything the agent needs; defaults are the production settings (ByteRobust's numbers)."""

    store: str
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

    def __post_init__(self) -> None:
        if not self.store:
            raise InputError("agent config: store must name a directory (e.g. /var/lib/rankscope)")
        for name in ("metric_interval_seconds", "discovery_interval_seconds", "flush_interval_seconds",
                     "stall_seconds", "round_interval_seconds", "stack_timeout_seconds"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise InputError(f"agent config: {name}={value!r} must be a positive number of seconds (e.g. 1.0)")
        for name in ("slow_factor", "crash_grace_seconds", "max_runtime_seconds"):
            if getattr(self, name) < 0:
                raise InputError(f"agent config: {name}={getattr(self, name)!r} must be >= 0")
        if self.slow_factor and self.slow_factor <= 1:
            raise InputError(f"agent config: slow_factor={self.slow_factor!r} must be 0 (off) or > 1 (e.g. 3)")
        for name in ("capture_rounds", "max_buffer_rows"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InputError(f"agent config: {name}={getattr(self, name)!r} must be a positive integer")
        if self.exit_after_captures < 0:
            raise InputError(f"agent config: exit_after_captures={self.exit_after_captures!r} must be >= 0")
        if not self.node:
            object.__setattr__(self, "node", socket.gethostname())
        if not self.trigger_file:
            object.__setattr__(self, "trigger_file", str(Path(self.run_dir) / "trigger"))
        object.__setattr__(self, "disk_paths", tuple(self.disk_paths))
        if not self.pyspy:
            object.__setattr__(self, "pyspy", default_pyspy())


def default_pyspy() -> str:
    """py-spy installed beside this interpreter (a venv's bin/), else whatever ``py-spy`` is on PATH."""
    import shutil
    import sys

    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else (shutil.which("py-spy") or "py-spy")


FIELDS = {f.name: f for f in fields(AgentConfig)}


def coerce_setting(name: str, value: Any, source: str) -> Any:
    """``value`` (often a string from the environment) as the type of field ``name``."""
    default = FIELDS[name].default
    kind = type(default) if default is not MISSING else str
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(text)
        if kind is tuple:
            if isinstance(value, str):
                return tuple(p for p in value.split(",") if p)
            return tuple(str(v) for v in value)
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        return kind(value)
    except (TypeError, ValueError):
        raise InputError(f"{source}: {name}={value!r} is not a valid {kind.__name__}") from None


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The settings in a TOML or JSON config file (an ``[agent]`` table or top-level keys)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InputError(f"{p}: cannot read agent config ({exc.strerror})") from None
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            import tomllib

            data = tomllib.loads(text)
    except ValueError as exc:
        raise InputError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'TOML'} ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{p}: expected a table of settings")
    data = data.get("agent", data)
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise InputError(f"{p}: unknown settings {unknown}; valid: {', '.join(FIELDS)}")
    return {k: coerce_setting(k, v, str(p)) for k, v in data.items()}


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The settings given as ``RANKSCOPE_AGENT_<FIELD>`` variables."""
    out = {}
    for name in FIELDS:
        key = ENV_PREFIX + name.upper()
        if key in env:
            out[name] = coerce_setting(name, env[key], key)
    return out


def resolve(flags: Mapping[str, Any] | None = None, *, env: Mapping[str, str] | None = None,
            config_file: str | os.PathLike[str] | None = None) -> AgentConfig:
    """Flags (None = not given) > environment > config file > defaults, as one frozen config."""
    env = os.environ if env is None else env
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    unknown = sorted(set(flags) - set(FIELDS))
    if unknown:
        raise InputError(f"agent config: unknown options {unknown}; valid: {', '.join(FIELDS)}")
    path = config_file or env.get(ENV_CONFIG)
    merged: dict[str, Any] = read_config_file(path) if path else {}
    merged.update(from_env(env))
    merged.update({k: coerce_setting(k, v, f"--{k.replace('_', '-')}") for k, v in flags.items()})
    if "store" not in merged:
        raise InputError(f"agent config: no store given (pass STORE, set {ENV_PREFIX}STORE or 'store' in the config file)")
    return AgentConfig(**merged)
