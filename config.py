"""The one configuration tree of rankscope, and the one way to load it.

:class:`Config` composes one frozen, keyword-only dataclass per section (torchtitan's ``Config`` shape):
``stacks``, ``collectives``, ``performance`` (with its ``stragglers``), ``crashes``, ``inputs``,
``agent``, ``limits`` and ``batch``. Units are in the field names (``*_seconds``, ``*_bytes``, ``*_fraction``);
each section validates itself in ``__post_init__`` and a bad value is a :class:`~rankscope.spine.ConfigError`
naming the field, the value and what is expected.

Precedence, everywhere, highest first: **command-line flags > environment > config file > defaults**.

- Environment: ``RANKSCOPE_<SECTION>_<FIELD>`` in upper case (``RANKSCOPE_PERFORMANCE_CONTINUITY_SECONDS=120``,
  ``RANKSCOPE_PERFORMANCE_STRAGGLERS_MIN_EPISODE_STEPS=8``, ``RANKSCOPE_AGENT_STALL_SECONDS=600``).
  ``RANKSCOPE_RUN_DIR``, the hook's variable, also sets ``agent.run_dir`` (``RANKSCOPE_AGENT_RUN_DIR`` wins).
- Config file: ``--config FILE`` (or ``RANKSCOPE_CONFIG``; ``RANKSCOPE_AGENT_CONFIG`` for the agent), TOML
  (``tomllib``, or ``tomli`` on Python 3.10) or JSON (``.json``), one table per section
  (``[performance]``, ``[performance.stragglers]``, ``[agent]``, ...). The agent also accepts its
  settings at the top level of its own file. Unknown keys are errors naming the key and the valid ones.

Imports only :mod:`rankscope.spine`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.spine import (
    ConfigError,
    check_fraction,
    check_int,
    check_non_negative,
    check_positive,
)

ENV_PREFIX = "RANKSCOPE_"
ENV_CONFIG = "RANKSCOPE_CONFIG"
ENV_AGENT_CONFIG = "RANKSCOPE_AGENT_CONFIG"
ENV_ALIASES = {"RANKSCOPE_RUN_DIR": ("agent", "run_dir")}
"""Extra environment names (lower precedence than the ``RANKSCOPE_<SECTION>_<FIELD>`` name of the same field)."""


@dataclass(frozen=True, kw_only=True)
class StackConfig:
    """Stack clustering and hang localization (ByteRobust's aggregation analysis)."""

    lines: bool = False  # compare line numbers too when clustering
    dominance_fraction: float = 0.5  # a cluster at least this fraction of the largest is healthy
    max_cover_fraction: float = 0.5  # a fault domain larger than this share of nodes is no domain
    min_flag_fraction: float = 0.6  # fail-slow: degrader flagged in at least this share of rounds
    max_missing_fraction: float = 0.5  # more missing dumps than this -> inconclusive

    def __post_init__(self) -> None:
        for name in ("dominance_fraction", "max_cover_fraction", "min_flag_fraction", "max_missing_fraction"):
            check_fraction(f"stacks.{name}", getattr(self, name), error=ConfigError)


@dataclass(frozen=True, kw_only=True)
class CollectivesConfig:
    """Flight Recorder analysis."""

    slow_min_score: float = 0.5  # a rank whose kernels are this much shorter than its peers' arrives late

    def __post_init__(self) -> None:
        check_fraction("collectives.slow_min_score", self.slow_min_score, error=ConfigError)


@dataclass(frozen=True, kw_only=True)
class StragglerConfig:
    """Timing stragglers (ratios are durations over the peers' median; NVRx's relative score inverted)."""

    min_slowdown_ratio: float = 1.25
    min_episode_steps: int = 5
    min_significance: float = 5.0
    intermittent_fraction: float = 0.05

    def __post_init__(self) -> None:
        where = "performance.stragglers."
        ratio = check_positive(where + "min_slowdown_ratio", self.min_slowdown_ratio, error=ConfigError)
        if ratio <= 1.0:
            raise ConfigError(f"{where}min_slowdown_ratio={ratio!r} must be above 1 (e.g. 1.2)")
        check_int(where + "min_episode_steps", self.min_episode_steps, minimum=1, error=ConfigError)
        check_positive(where + "min_significance", self.min_significance, error=ConfigError)
        if check_fraction(where + "intermittent_fraction", self.intermittent_fraction, error=ConfigError) >= 1:
            raise ConfigError(f"{where}intermittent_fraction={self.intermittent_fraction!r} must be in (0, 1)")


@dataclass(frozen=True, kw_only=True)
class PerfConfig:
    """Metrics among peers (Minder: 4-minute continuity) and timing stragglers (NVRx)."""

    window_seconds: float = 10.0
    continuity_seconds: float = 240.0
    threshold: float = 12.0  # peer-distance score that alerts
    detector: str = "peer-distance"  # a rankscope.models.DETECTORS name (checked where the metrics are scored)
    rate_window_seconds: float = 120.0
    counter_allowance: float = 2.0  # counter increments forgiven per rate window (normal wear)
    min_machines: int = 3
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)

    def __post_init__(self) -> None:
        for name in ("window_seconds", "continuity_seconds", "threshold", "rate_window_seconds"):
            check_positive(f"performance.{name}", getattr(self, name), error=ConfigError)
        check_non_negative("performance.counter_allowance", self.counter_allowance, error=ConfigError)
        check_int("performance.min_machines", self.min_machines, minimum=3, error=ConfigError)


@dataclass(frozen=True, kw_only=True)
class CrashConfig:
    """Crash analysis: which exit came first, and which only followed it."""

    incident_window_seconds: float = 3600.0  # longer than any collective timeout
    tie_seconds: float = 0.1  # clocks of different hosts differ by milliseconds
    widespread_fraction: float = 0.25  # the same error on this share of the world: code, not a machine

    def __post_init__(self) -> None:
        check_positive("crashes.incident_window_seconds", self.incident_window_seconds, error=ConfigError)
        check_non_negative("crashes.tie_seconds", self.tie_seconds, error=ConfigError)
        check_fraction("crashes.widespread_fraction", self.widespread_fraction, error=ConfigError)


@dataclass(frozen=True, kw_only=True)
class InputsConfig:
    """Loading a store or a dump directory."""

    series_gap_seconds: float = 120.0  # captures further apart are separate incidents (rounds are 10 s apart)

    def __post_init__(self) -> None:
        check_positive("inputs.series_gap_seconds", self.series_gap_seconds, error=ConfigError)


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
        if check_int("agent config: metrics_port", self.metrics_port, minimum=0, error=ConfigError) > 65535:
            raise ConfigError(f"agent config: metrics_port={self.metrics_port!r} must be a TCP port (1-65535, 0 = off)")
        if not self.node:
            object.__setattr__(self, "node", socket.gethostname())
        if not self.trigger_file:
            object.__setattr__(self, "trigger_file", str(Path(self.run_dir) / "trigger"))
        object.__setattr__(self, "disk_paths", tuple(self.disk_paths))
        if not self.pyspy:
            object.__setattr__(self, "pyspy", default_pyspy())


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Bounds on what one diagnosis keeps and reports (hostile or huge inputs must not blow up the output)."""

    max_evidence_items: int = 100  # per-rank evidence entries listed before "N more"
    max_reported_clusters: int = 50  # stack clusters listed in a verdict

    def __post_init__(self) -> None:
        check_int("limits.max_evidence_items", self.max_evidence_items, minimum=1, error=ConfigError)
        check_int("limits.max_reported_clusters", self.max_reported_clusters, minimum=1, error=ConfigError)


RUNNERS = ("local", "ray")
"""Engines ``rankscope batch`` can schedule its per-job work on."""


@dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """Scheduled batch analysis (``rankscope batch``) and the fleet view over its verdicts (``rankscope fleet``)."""

    runner: str = "local"  # local | ray
    workers: int = 0  # local: processes (0 or 1: in this process); ray: CPUs of the local instance (0: all)
    ray_address: str = ""  # empty: start a local Ray instance; else join this cluster (auto, ray://host:10001)
    ray_object_store_bytes: int = 200_000_000  # the local instance's object store (small machines)
    since_seconds: float = 0.0  # >0: leave incidents older than this alone
    every_seconds: float = 0.0  # >0: run again every this many seconds until SIGTERM
    fleet_window_seconds: float = 7 * 86400.0  # verdicts older than this are out of the fleet view
    fleet_half_life_seconds: float = 3 * 86400.0  # an incident's weight halves every this many seconds
    quarantine_threshold: float = 1.5  # risk score above which a machine is quarantined
    collateral_weight: float = 0.05  # a suspect evicted beside a named culprit (over-eviction's collateral)
    repeat_in_job_weight: float = 0.5  # a machine's 2nd, 3rd... incident in one job (a job's own fault repeats)

    def __post_init__(self) -> None:
        if self.runner not in RUNNERS:
            raise ConfigError(f"batch.runner={self.runner!r} must be one of {', '.join(RUNNERS)}")
        check_int("batch.workers", self.workers, minimum=0, error=ConfigError)
        check_int("batch.ray_object_store_bytes", self.ray_object_store_bytes, minimum=78_643_200, error=ConfigError)
        for name in ("since_seconds", "every_seconds"):
            check_non_negative(f"batch.{name}", getattr(self, name), error=ConfigError)
        for name in ("fleet_window_seconds", "fleet_half_life_seconds", "quarantine_threshold"):
            check_positive(f"batch.{name}", getattr(self, name), error=ConfigError)
        for name in ("collateral_weight", "repeat_in_job_weight"):
            check_non_negative(f"batch.{name}", getattr(self, name), error=ConfigError)
            if getattr(self, name) > 1:
                raise ConfigError(f"batch.{name}={getattr(self, name)!r} must be in [0, 1]")


_DURATION = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(where: str, text: str | float) -> float:
    """``"90s"``, ``"5m"``, ``"1h30m"``, ``"7d"``, ``"2w"`` or a number of seconds, as seconds (ConfigError
    naming ``where`` otherwise)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return check_non_negative(where, float(text), error=ConfigError)
    raw = str(text).strip().lower()
    total, number, matched = 0.0, "", bool(raw)
    for ch in raw:
        if ch.isdigit() or ch == ".":
            number += ch
        elif ch in _DURATION and number and number.count(".") <= 1:
            total += float(number) * _DURATION[ch]
            number = ""
        else:
            matched = False
            break
    if number:
        if total or number.count(".") > 1:
            matched = False
        else:
            total = float(number)
    if not matched:
        raise ConfigError(f"{where}={text!r} is not a duration (e.g. 90s, 5m, 1h30m, 7d)")
    return total


@dataclass(frozen=True, kw_only=True)
class Config:
    """Every setting of rankscope, one section per concern."""

    stacks: StackConfig = field(default_factory=StackConfig)
    collectives: CollectivesConfig = field(default_factory=CollectivesConfig)
    performance: PerfConfig = field(default_factory=PerfConfig)
    crashes: CrashConfig = field(default_factory=CrashConfig)
    inputs: InputsConfig = field(default_factory=InputsConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    limits: Limits = field(default_factory=Limits)
    batch: BatchConfig = field(default_factory=BatchConfig)


# -- loading -------------------------------------------------------------------------------------------

Tree = dict[str, Any]


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """``value`` (often a string from the environment) as type ``tp`` (bool, int, float, str, tuple[str, ...])."""
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(text)
        if typing.get_origin(tp) is tuple:
            if isinstance(value, str):
                return tuple(p for p in value.split(",") if p)
            if not isinstance(value, (list, tuple)):
                raise TypeError(value)
            return tuple(str(v) for v in value)
        if tp is int:
            if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if tp is str:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise TypeError(value)
            return str(value)
    except (TypeError, ValueError):
        name = getattr(tp, "__name__", str(tp))
        raise ConfigError(f"{where}={value!r} is not a valid {name}") from None
    raise ConfigError(f"{where}: unsupported setting type {tp!r}")


def _check_keys(data: Mapping[str, Any], cls: type, where: str) -> None:
    valid = list(_hints(cls))
    unknown = sorted(str(k) for k in data if k not in valid)
    if unknown:
        raise ConfigError(f"{where}: unknown settings {unknown}; valid: {', '.join(valid)}")


def _typed_tree(data: Mapping[str, Any], cls: type, where: str, source: str) -> Tree:
    """``data`` checked against section ``cls`` (unknown keys, value types), nested sections included."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: [{where}] must be a table of settings, not {type(data).__name__}")
    _check_keys(data, cls, f"{source}: [{where}]" if where else source)
    out: Tree = {}
    hints = _hints(cls)
    for key, value in data.items():
        tp = hints[key]
        path = f"{where}.{key}" if where else key
        if _is_section(tp):
            out[key] = _typed_tree(value, tp, path, source)
        else:
            out[key] = _coerce(value, tp, f"{source}: {path}")
    return out


def _merge(base: Tree, top: Mapping[str, Any]) -> Tree:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        elif isinstance(value, Mapping):
            out[key] = _merge({}, value)
        elif value is not None:
            out[key] = value
    return out


def _build(cls: type, tree: Mapping[str, Any]) -> Any:
    hints = _hints(cls)
    kwargs = {k: (_build(hints[k], v) if _is_section(hints[k]) else v) for k, v in tree.items()}
    return cls(**kwargs)


def _leaves(cls: type, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out: list[tuple[tuple[str, ...], Any]] = []
    for name, tp in _hints(cls).items():
        if _is_section(tp):
            out += _leaves(tp, (*prefix, name))
        else:
            out.append(((*prefix, name), tp))
    return out


def env_name(path: tuple[str, ...]) -> str:
    """The environment variable of a setting: ``("performance", "continuity_seconds")`` ->
    ``RANKSCOPE_PERFORMANCE_CONTINUITY_SECONDS``."""
    return ENV_PREFIX + "_".join(path).upper()


def _set(tree: Tree, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def from_env(env: Mapping[str, str]) -> Tree:
    """The settings given as environment variables (``RANKSCOPE_<SECTION>_<FIELD>`` and the aliases)."""
    out: Tree = {}
    leaves = dict(_leaves(Config))
    for alias, alias_path in ENV_ALIASES.items():
        if alias in env and env_name(alias_path) not in env:
            _set(out, alias_path, _coerce(env[alias], leaves[alias_path], alias))
    for path, tp in leaves.items():
        key = env_name(path)
        if key in env:
            _set(out, path, _coerce(env[key], tp, key))
    return out


def _toml_loads(text: str) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib.loads(text)


def read_config_file(path: str | os.PathLike[str], *, bare_section: str | None = None) -> Tree:
    """The settings in a TOML or JSON file, one table per section. With ``bare_section`` (the agent's
    own ``--config``), settings of that section may also stand at the top level."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not a text file ({exc.reason})") from None
    is_json = p.suffix.lower() == ".json"
    try:
        data = json.loads(text) if is_json else _toml_loads(text)
    except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
        raise ConfigError(f"{p}: not valid {'JSON' if is_json else 'TOML'} ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a table of settings")
    sections = set(_hints(Config))
    if bare_section is not None:
        bare = {k: v for k, v in data.items() if k not in sections}
        data = {k: v for k, v in data.items() if k in sections}
        if bare:
            section_cls = _hints(Config)[bare_section]
            _check_keys(bare, section_cls, str(p))
            data[bare_section] = _merge(bare, data.get(bare_section, {}))
    return _typed_tree(data, Config, "", str(p))


def load_config(
    flags: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
    bare_section: str | None = None,
) -> Config:
    """Flags > environment > config file > defaults, as one frozen :class:`Config`.

    ``flags`` is a tree like ``{"performance": {"continuity_seconds": 120.0}}``; None means "not given".
    The file is ``config_file``, else ``RANKSCOPE_CONFIG`` (``RANKSCOPE_AGENT_CONFIG`` for the agent).
    """
    env = os.environ if env is None else env
    path = config_file or env.get(ENV_CONFIG) or (env.get(ENV_AGENT_CONFIG) if bare_section == "agent" else None)
    tree: Tree = read_config_file(path, bare_section=bare_section) if path else {}
    tree = _merge(tree, from_env(env))
    given = _merge({}, flags or {})  # drops None (= not given)
    tree = _merge(tree, _typed_tree(given, Config, "", "flags") if given else {})
    return typing.cast(Config, _build(Config, tree))


def resolve_agent(
    flags: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
) -> AgentConfig:
    """The agent's settings (flags are its own field names; None = not given), with a store named."""
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    unknown = sorted(set(given) - set(_hints(AgentConfig)))
    if unknown:
        raise ConfigError(f"agent config: unknown options {unknown}; valid: {', '.join(_hints(AgentConfig))}")
    cfg = load_config({"agent": given}, env=env, config_file=config_file, bare_section="agent").agent
    if not cfg.store:
        raise ConfigError(
            "agent config: no store given (pass STORE, set RANKSCOPE_AGENT_STORE or 'store' in the config file)"
        )
    return cfg


def agent_config_from_json(text: str) -> AgentConfig:
    """An already-resolved agent config written as a JSON object (the daemon's argument), validated again."""
    try:
        data: Any = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"agent config JSON is not valid ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError("agent config JSON must be an object of settings")
    tree = _typed_tree({"agent": data}, Config, "", "agent config JSON")
    cfg = typing.cast(AgentConfig, _build(AgentConfig, tree["agent"]))
    if not cfg.store:
        raise ConfigError("agent config JSON: no store given")
    return cfg
