"""Agent config: flags > environment > config file > defaults, and validation messages naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankscope.config import AgentConfig, resolve_agent
from rankscope.spine import InputError


def test_precedence_flags_env_file_defaults(tmp_path: Path) -> None:
    cfg_file = tmp_path / "agent.toml"
    cfg_file.write_text('[agent]\nstore = "/file/store"\nstall_seconds = 30\ncapture_rounds = 5\njob = "from-file"\n')
    env = {"RANKSCOPE_AGENT_STALL_SECONDS": "20", "RANKSCOPE_AGENT_JOB": "from-env"}
    cfg = resolve_agent({"job": "from-flag", "metric_interval_seconds": None}, env=env, config_file=cfg_file)
    assert cfg.job == "from-flag"  # flag beats env and file
    assert cfg.stall_seconds == 20.0  # env beats file
    assert cfg.capture_rounds == 5  # file beats default
    assert cfg.store == "/file/store"
    assert cfg.metric_interval_seconds == 1.0  # default (a None flag means "not given")
    assert cfg.trigger_file == "/tmp/rankscope-run/trigger"


def test_config_file_from_env_json_and_bool_coercion(tmp_path: Path) -> None:
    f = tmp_path / "a.json"
    f.write_text('{"store": "s", "gpu": false, "disk_paths": ["/a", "/b"]}')
    cfg = resolve_agent({}, env={"RANKSCOPE_AGENT_CONFIG": str(f), "RANKSCOPE_AGENT_CAPTURE_FLIGHT_RECORDER": "no"})
    assert cfg.gpu is False and cfg.capture_flight_recorder is False and cfg.disk_paths == ("/a", "/b")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"metric_interval_seconds": 0}, "metric_interval_seconds"),
        ({"stall_seconds": -1}, "stall_seconds"),
        ({"capture_rounds": 0}, "capture_rounds"),
        ({"slow_factor": 0.5}, "slow_factor"),
    ],
)
def test_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InputError, match=field):
        AgentConfig(store="s", **kwargs)


def test_bad_inputs_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no store"):
        resolve_agent({}, env={})
    with pytest.raises(InputError, match="RANKSCOPE_AGENT_STALL_SECONDS"):
        resolve_agent({"store": "s"}, env={"RANKSCOPE_AGENT_STALL_SECONDS": "soon"})
    bad = tmp_path / "bad.toml"
    bad.write_text("stall_secs = 3\n")
    with pytest.raises(InputError, match="unknown settings.*stall_secs"):
        resolve_agent({"store": "s"}, env={}, config_file=bad)
    broken = tmp_path / "broken.toml"
    broken.write_text("store = \n")
    with pytest.raises(InputError, match="broken.toml: not valid TOML"):
        resolve_agent({}, env={}, config_file=broken)
    with pytest.raises(InputError, match="cannot read"):
        resolve_agent({}, env={}, config_file=tmp_path / "missing.toml")
