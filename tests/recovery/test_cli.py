"""rankscope plan / recover / standby: every SOURCE kind, dry run by default, one line and exit 2 for bad input."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rankscope.cli.main import app
from rankscope.datasets.store.store import Store

runner = CliRunner()


def _run(*args: object, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return runner.invoke(app, [str(a) for a in args], env=env)


FR_HANG = Path(__file__).resolve().parents[1] / "data" / "fr_gloo" / "hang"  # the hook's dumps: a clocked hang


@pytest.fixture()
def verdict_file(tmp_path: Path, fr_hang_past_timeout: Path) -> Path:
    res = _run("diagnose", fr_hang_past_timeout, "--gpus-per-node", "1", "--format", "json")
    assert res.exit_code == 0, res.output
    path = tmp_path / "verdict.json"
    path.write_text(res.stdout)
    return path


def test_plan_from_a_verdict_file_is_json_with_every_field_and_the_same_bytes_twice(
    verdict_file: Path, tmp_path: Path
) -> None:
    args = (
        "plan",
        verdict_file,
        "--format",
        "json",
        "--machines",
        "node-0,node-1,node-2,node-3",
        "--standby",
        "s0",
        "--audit",
        tmp_path / "a.jsonl",
    )
    first, second = _run(*args), _run(*args)
    assert first.exit_code == 0, first.output
    assert first.stdout == second.stdout  # same input, same plan
    p = json.loads(first.stdout)
    assert {"job", "category", "actions", "confidence", "guardrails", "incident", "rule"} <= set(p)
    assert p["category"] == "machine" and p["rule"] == "verdict-machine"
    evict = p["actions"][0]
    assert evict["kind"] == "evict" and evict["nodes"] == ["node-3"] and evict["reason"]
    assert p["actions"][1]["kind"] == "restart" and p["actions"][1]["replacements"] == {"node-3": "s0"}
    assert {g["name"] for g in p["guardrails"]} >= {"idempotency", "cooldown", "evict-cap", "standby"}
    assert not (tmp_path / "a.jsonl").exists()  # plan changes nothing


def test_plan_diagnoses_a_dump_directory_and_a_store_first(
    probe_dir: Path, tmp_path: Path, fr_hang_past_timeout: Path
) -> None:
    res = _run("plan", fr_hang_past_timeout, "--gpus-per-node", "1", "--audit", tmp_path / "a.jsonl")
    assert res.exit_code == 0, res.output
    assert "evict node-3" in res.stdout and "hang verdict" in res.stdout
    # the same dumps taken 8 s in, younger than the job's 60 s timeout: a pause on rank 3 looks alike
    res = _run("plan", FR_HANG, "--gpus-per-node", "1")
    assert res.exit_code == 0, res.output
    assert "- evict" not in res.stdout, res.stdout
    # one py-spy snapshot and no time: rank 3 is named, but it is a hang only if the job was stuck when it was
    # captured (a healthy job caught at one instant looks alike): collect another round before evicting
    res = _run("plan", probe_dir / "pyspy" / "text", "--gpus-per-node", "1")
    assert res.exit_code == 0, res.output
    assert "- evict" not in res.stdout and "one snapshot with no time" in res.stdout, res.stdout
    st = tmp_path / "store"
    assert (
        _run("ingest", probe_dir / "pyspy" / "json", "--store", st, "--job", "probe", "--gpus-per-node", "1").exit_code
        == 0
    )
    res = _run("plan", st, "--job", "probe", "--format", "json")
    assert res.exit_code == 0, res.output
    p = json.loads(res.stdout)
    assert p["job"] == "probe" and p["category"] == "evidence" and p["suspect_nodes"] == ["node-3"]
    assert [a["kind"] for a in p["actions"]] == ["collect"]


def test_recover_is_a_dry_run_by_default_and_records_it_in_the_store(
    tmp_path: Path, fr_hang_past_timeout: Path
) -> None:
    st = tmp_path / "store"
    hang = tmp_path / "hang"  # the hook's clocked Flight Recorder dumps, past the job's timeout
    shutil.copytree(fr_hang_past_timeout, hang)
    _run("ingest", hang, "--store", st, "--job", "probe", "--gpus-per-node", "1")
    res = _run("recover", st, "--job", "probe", "--backend", "slurm", "--slurm-job-id", "4242")
    assert res.exit_code == 0, res.output
    assert "DRY RUN (nothing changed; --apply makes these calls)" in res.stdout
    assert "scontrol update NodeName=node-3 State=DRAIN" in res.stdout and "scontrol requeue 4242" in res.stdout
    rows = Store(st).sql("SELECT what, outcome, dry_run, backend, who FROM actions ORDER BY ts").to_dicts()
    assert [(r["what"], r["outcome"], r["dry_run"], r["backend"]) for r in rows] == [
        ("evict", "dry-run", True, "slurm"),
        ("restart", "dry-run", True, "slurm"),
    ]
    assert all(r["who"] for r in rows)
    assert (st / ".recovery-locks").is_dir()  # one executor per job: the lock lives beside the store
    k8s = _run("recover", st, "--job", "probe", "--backend", "k8s", "--namespace", "train", "--format", "json")
    assert k8s.exit_code == 0, k8s.output
    calls = [s["command"] for s in json.loads(k8s.stdout)["execution"]["steps"]]
    assert calls[0] == 'PATCH /api/v1/nodes/node-3 {"spec": {"unschedulable": true}}'
    assert any(c.startswith("POST /api/v1/namespaces/train/pods/") and "eviction" in c for c in calls)


def test_recover_applies_through_a_backend_once_per_incident(verdict_file: Path, tmp_path: Path) -> None:
    """--apply runs the commands (here a stand-in scontrol on PATH); a re-run of the incident changes nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "scontrol.log"
    fake = bin_dir / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    args = (
        "recover",
        verdict_file,
        "--backend",
        "slurm",
        "--slurm-job-id",
        "7",
        "--audit",
        tmp_path / "a.jsonl",
        "--lock-dir",
        tmp_path / "locks",
        "--apply",
    )
    res = _run(*args, env=env)
    assert res.exit_code == 0, res.output
    assert "APPLY" in res.stdout and "[ok] evict" in res.stdout
    assert log.read_text().splitlines()[0].startswith("update NodeName=node-3 State=DRAIN Reason=rankscope inc-")
    again = _run(*args, env=env)
    assert again.exit_code == 0 and "already" in again.stdout
    assert len(log.read_text().splitlines()) == 2  # drain + requeue, once
    other = json.loads(verdict_file.read_text())
    other.update(suspect_nodes=["node-1"], culprit_nodes=["node-1"], suspect_ranks=[1], culprit_ranks=[1])
    (tmp_path / "other.json").write_text(json.dumps(other))
    held = _run(*("recover", tmp_path / "other.json", *args[2:]), env=env)  # another incident, within the cool-down
    assert held.exit_code == 3 and "held until" in held.stdout, held.output
    assert len(log.read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("plan", "/nonexistent/verdict.json"), "no such file or directory"),
        (("recover", "VERDICT", "--backend", "pbs"), "--backend 'pbs' is not one of local, slurm, k8s"),
        (("recover", "VERDICT", "--backend", "slurm"), "needs --slurm-job-id"),
        (("recover", "VERDICT", "--backend", "local"), "needs --local-run-dir"),
        (("recover", "VERDICT", "--backend", "local", "--local-run-dir", "/nonexistent"), "no local cluster here"),
        (("recover", "VERDICT", "--backend", "slurm", "--slurm-job-id", "x; rm -rf /"), "is not a Slurm job id"),
        (("standby", "--machines", "0", "--daily-failure-rate", "0.001"), "--machines must be a positive integer"),
        (("standby", "--machines", "8", "--daily-failure-rate", "2"), "--daily-failure-rate must be a probability"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    verdict_file: Path, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    res = (
        _run(*[verdict_file if a == "VERDICT" else a for a in args], "--audit", tmp_path / "a.jsonl")
        if args[0] != "standby"
        else _run(*args)
    )
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rankscope: error: ") and message in lines[0], res.stderr


def test_a_malformed_verdict_names_the_file_and_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "v.json"
    bad.write_text(json.dumps({"verdict": "hang", "confidence": 3}))
    res = _run("plan", bad)
    assert res.exit_code == 2 and f"{bad}: verdict: confidence 3.0 is outside 0..1" in res.stderr


def test_standby_matches_the_paper_and_prints_json() -> None:
    res = _run("standby", "--machines", "1024", "--daily-failure-rate", "0.0012", "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["standby"] == 4


def test_the_agent_needs_a_backend_before_it_applies_anything(tmp_path: Path) -> None:
    res = _run("agent", tmp_path / "store", "--apply")
    assert res.exit_code == 2 and "--apply and --recover-args need --recover local|slurm|k8s" in res.stderr
    res = _run("agent", tmp_path / "store", "--recover", "pbs")
    assert res.exit_code == 2 and "recover='pbs' must be local, slurm, k8s" in res.stderr


def test_recover_exits_4_when_the_plan_only_collects(tmp_path: Path, verdict_file: Path) -> None:
    """A hang too weak to evict on: dry run, nothing to do but collect, exit 4 (the agent captures again)."""
    import json

    weak = json.loads(verdict_file.read_text())
    weak["confidence"] = 0.4
    path = tmp_path / "weak.json"
    path.write_text(json.dumps(weak))
    res = _run(
        "recover", path, "--backend", "slurm", "--slurm-job-id", "4242", "--machines", "node-0,node-1,node-2,node-3"
    )
    assert res.exit_code == 4, res.output
    assert "collect" in res.stdout and "scontrol" not in res.stdout
