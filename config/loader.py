"""The one way to load the configuration tree: flags > environment > config file > defaults."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.config.agent import AgentConfig
from rankscope.config.batch import BatchConfig
from rankscope.config.sections import (
    CollectivesConfig,
    CrashConfig,
    InputsConfig,
    Limits,
    PerfConfig,
    StackConfig,
)
from rankscope.spine import (
    ConfigError,
)

ENV_PREFIX = "RANKSCOPE_"
ENV_CONFIG = "RANKSCOPE_CONFIG"
ENV_AGENT_CONFIG = "RANKSCOPE_AGENT_CONFIG"
ENV_ALIASES = {"RANKSCOPE_RUN_DIR": ("agent", "run_dir")}
"""Extra environment names (lower precedence than the ``RANKSCOPE_<SECTION>_<FIELD>`` name of the same field)."""


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
