"""The fleet view's quarantine list reaches the recovery executor: no standby is taken from it."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rankscope.cli.main import app
from rankscope.datasets.store.quarantine import write_quarantine
from rankscope.datasets.store.store import Store


def _verdict(path: Path) -> Path:
    verdict = {
        "job": "j1",
        "verdict": "hang",
        "confidence": 0.9,
        "culprit_nodes": ["m2"],
        "suspect_nodes": ["m2"],
        "culprit_ranks": [4],
        "world_size": 8,
        "reasons": ["rank 4 is stuck in compute while its peers wait in all_reduce"],
    }
    path.write_text(json.dumps(verdict))
    return path


def test_store_quarantine_keeps_standby_off_a_blamed_machine(tmp_path: Path) -> None:
    store = tmp_path / "store"
    Store(store, create=True)  # an empty store: the audit trail and the fleet's list live there
    write_quarantine(store, [{"machine": "s1", "risk": 2.4, "incidents": 3, "jobs": 2}])
    args = ["plan", str(_verdict(tmp_path / "v.json")), "--machines", "m0,m1,m2,m3", "--standby", "s1,s2"]
    res = CliRunner().invoke(app, [*args, "--audit", str(store), "--format", "json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    restart = next(a for a in plan["actions"] if a["kind"] == "restart")
    assert restart["replacements"] == {"m2": "s2"}  # s1 is on the fleet's list: the next standby is used
    assert "s1" in restart["exclude"]
    guard = {g["name"]: g for g in plan["guardrails"]}
    assert guard["quarantine"]["decision"] == "warn" and "s1" in guard["quarantine"]["reason"]


def test_without_the_list_the_first_standby_is_used(tmp_path: Path) -> None:
    store = tmp_path / "store"
    Store(store, create=True)
    args = ["plan", str(_verdict(tmp_path / "v.json")), "--machines", "m0,m1,m2,m3", "--standby", "s1,s2"]
    res = CliRunner().invoke(app, [*args, "--audit", str(store), "--format", "json"])
    assert res.exit_code == 0, res.output
    restart = next(a for a in json.loads(res.output)["actions"] if a["kind"] == "restart")
    assert restart["replacements"] == {"m2": "s1"}
