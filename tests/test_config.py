"""The one configuration tree: sections, validation naming the field, flags > environment > file > defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rankscope.cli.main import app
from rankscope.config import Config, PerfConfig, StackConfig, env_name, load_config, resolve_agent
from rankscope.spine import ConfigError


def test_defaults_compose_every_section() -> None:
    cfg = Config()
    assert cfg.performance.continuity_seconds == 240.0 and cfg.performance.stragglers.min_episode_steps == 5
    assert cfg.stacks.dominance_fraction == 0.5 and cfg.crashes.tie_seconds == 0.1
    assert cfg.inputs.series_gap_seconds == 120.0 and cfg.limits.max_evidence_items == 100
    with pytest.raises(TypeError):
        PerfConfig(120.0)  # type: ignore[misc]  # keyword-only


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: StackConfig(max_cover_fraction=2.0), "stacks.max_cover_fraction"),
        (lambda: PerfConfig(window_seconds=-1), "performance.window_seconds"),
        (lambda: PerfConfig(min_machines=2), "performance.min_machines"),
    ],
)
def test_validation_names_the_field(build, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build()


def test_precedence_flags_env_file_defaults(tmp_path: Path) -> None:
    f = tmp_path / "rs.toml"
    f.write_text(
        "[performance]\ncontinuity_seconds = 60\nthreshold = 9\n"
        "[performance.stragglers]\nmin_episode_steps = 7\n[stacks]\nlines = true\n"
    )
    env = {"RANKSCOPE_PERFORMANCE_THRESHOLD": "10", "RANKSCOPE_PERFORMANCE_STRAGGLERS_MIN_EPISODE_STEPS": "8"}
    cfg = load_config({"performance": {"threshold": 11.0, "window_seconds": None}}, env=env, config_file=f)
    assert cfg.performance.threshold == 11.0  # flag beats env and file
    assert cfg.performance.stragglers.min_episode_steps == 8  # env beats file
    assert cfg.performance.continuity_seconds == 60.0 and cfg.stacks.lines is True  # file beats defaults
    assert cfg.performance.window_seconds == 10.0  # a None flag means "not given"
    assert env_name(("performance", "stragglers", "min_episode_steps")) == (
        "RANKSCOPE_PERFORMANCE_STRAGGLERS_MIN_EPISODE_STEPS"
    )


def test_json_files_and_bad_files_are_one_clear_error(tmp_path: Path) -> None:
    good = tmp_path / "c.json"
    good.write_text(json.dumps({"crashes": {"tie_seconds": 0.5}}))
    assert load_config(env={}, config_file=good).crashes.tie_seconds == 0.5
    unknown = tmp_path / "u.toml"
    unknown.write_text("[performance]\ncontinuity = 3\n")
    with pytest.raises(
        ConfigError, match=r"\[performance\]: unknown settings \['continuity'\]; valid: detector, continuity_seconds"
    ):
        load_config(env={}, config_file=unknown)
    section = tmp_path / "s.toml"
    section.write_text("[perf]\nthreshold = 3\n")
    with pytest.raises(ConfigError, match=r"unknown settings \['perf'\]; valid: stacks, collectives, performance"):
        load_config(env={}, config_file=section)
    typed = tmp_path / "t.toml"
    typed.write_text('[stacks]\ndominance_fraction = "half"\n')
    with pytest.raises(ConfigError, match="stacks.dominance_fraction='half' is not a valid float"):
        load_config(env={}, config_file=typed)
    with pytest.raises(ConfigError, match="RANKSCOPE_STACKS_LINES='maybe' is not a valid bool"):
        load_config(env={"RANKSCOPE_STACKS_LINES": "maybe"})
    with pytest.raises(ConfigError, match="stacks.dominance_fraction=0.0 must be in"):
        load_config(env={"RANKSCOPE_STACKS_DOMINANCE_FRACTION": "0"})


def test_the_hooks_run_dir_variable_sets_the_agents_run_dir() -> None:
    """``rankscope agent --help`` names RANKSCOPE_RUN_DIR (the hook's variable): it works, and the
    section-specific RANKSCOPE_AGENT_RUN_DIR wins when both are set."""
    assert resolve_agent({"store": "s"}, env={"RANKSCOPE_RUN_DIR": "/dev/shm/rs"}).run_dir == "/dev/shm/rs"
    both = {"RANKSCOPE_RUN_DIR": "/a", "RANKSCOPE_AGENT_RUN_DIR": "/b"}
    assert resolve_agent({"store": "s"}, env=both).run_dir == "/b"
    assert resolve_agent({"store": "s", "run_dir": "/c"}, env=both).run_dir == "/c"


def test_config_reaches_diagnose_from_the_cli(tmp_path: Path) -> None:
    """--config on diagnose: the limits it sets shape the verdict; a bad value is one line and exit 2."""
    from rankscope.harness.synthetic import generate_job

    job = generate_job("tp=2,pp=2,dp=4", gpus_per_node=4, fault="compute-hang", seed=3)
    root = job.write_dir(tmp_path / "dumps", fmt="pyspy-text")
    cfg = tmp_path / "rs.toml"
    cfg.write_text("[limits]\nmax_evidence_items = 1\n")
    runner = CliRunner()
    r = runner.invoke(
        app,
        [
            "diagnose",
            str(root),
            "--layout",
            "tp=2,pp=2,dp=4",
            "--gpus-per-node",
            "4",
            "--config",
            str(cfg),
            "--format",
            "json",
        ],
    )
    assert r.exit_code == 0, r.output
    verdict = json.loads(r.output)
    assert verdict["verdict"] == "hang"
    kinds = [e["kind"] for e in verdict["evidence"]]  # 4 items by default: one kept, the rest counted
    assert len(kinds) == 2 and kinds[-1] == "more-outliers", kinds
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits]\nmax_evidence_items = 0\n")
    r = runner.invoke(app, ["diagnose", str(root), "--config", str(bad)])
    assert r.exit_code == 2 and "limits.max_evidence_items=0" in r.output
