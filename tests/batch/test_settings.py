"""The [batch] settings, durations, and the agent's --metrics-port setting."""

from __future__ import annotations

import pytest

from rankscope.config import BatchConfig, load_config, parse_duration, resolve_agent
from rankscope.spine import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("5m", 300), ("1h30m", 5400), ("7d", 604800), ("2w", 1209600), ("30", 30), ("0.5h", 1800)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration("--every", text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5x", "m5", "1.2.3s", "5m3", "-5m"])
def test_bad_durations_name_the_option(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--every=.* is not a duration \(e.g. 90s, 5m"):
        parse_duration("--every", text)


def test_batch_settings_flags_over_environment_over_file(tmp_path) -> None:
    f = tmp_path / "rankscope.toml"
    f.write_text("[batch]\nworkers = 2\nquarantine_threshold = 3.0\nrunner = 'ray'\n")
    cfg = load_config({"batch": {"workers": 4}}, env={"RANKSCOPE_BATCH_QUARANTINE_THRESHOLD": "2.5"}, config_file=f)
    assert (cfg.batch.workers, cfg.batch.quarantine_threshold, cfg.batch.runner) == (4, 2.5, "ray")


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("runner", "spark", "must be one of local, ray"),
        ("workers", -1, "batch.workers=-1"),
        ("quarantine_threshold", 0, "batch.quarantine_threshold=0"),
        ("collateral_weight", 2.0, "must be in [0, 1]"),
        ("ray_object_store_bytes", 1000, "batch.ray_object_store_bytes=1000"),
    ],
)
def test_bad_batch_settings(field: str, value: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        BatchConfig(**{field: value})  # type: ignore[arg-type]
    assert fragment in str(err.value)


def test_agent_metrics_port_is_a_port(tmp_path) -> None:
    assert resolve_agent({"store": str(tmp_path), "metrics_port": 9464}, env={}).metrics_port == 9464
    assert resolve_agent({"store": str(tmp_path)}, env={}).metrics_port == 0  # off by default
    with pytest.raises(ConfigError, match="metrics_port=70000 must be a TCP port"):
        resolve_agent({"store": str(tmp_path), "metrics_port": 70000}, env={})
