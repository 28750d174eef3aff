"""``rankscope fleet``: machines blamed across jobs, the documented risk formula, the quarantine list."""

from __future__ import annotations

import csv
import io
import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rankscope.batch import load_quarantine
from rankscope.batch.fleet import fleet_view, refresh_quarantine
from rankscope.batch.run import run_batch
from rankscope.cli.main import app
from rankscope.config import BatchConfig
from rankscope.datasets.loading.ingest import ingest_path
from rankscope.datasets.store.quarantine import read_quarantine
from rankscope.datasets.store.store import Store

from .conftest import ingest_probe

runner = CliRunner()
DAY = 86400.0


def test_a_machine_blamed_in_two_jobs_is_quarantined(real_store: Path) -> None:
    rep = run_batch(real_store)
    assert rep.quarantined == 1
    assert load_quarantine(real_store) == {"gpu-bad"}
    view = fleet_view(Store(real_store))
    bad = view.machines[0]
    assert bad.machine == "gpu-bad" and bad.quarantined
    assert (bad.incidents, len(bad.jobs), bad.culprit, bad.suspect, bad.kinds) == (2, 2, 2, 0, {"hang": 2})
    conf = Store(real_store).read("verdicts").filter(job="llama-a")["confidence"][0]
    assert bad.risk == pytest.approx(2 * conf, rel=1e-3)  # two jobs, fresh: confidence x 1 (hang) x 1 (sole culprit)
    # the healthy ranks' machines are named by no one; the field hang's culprit (rank 6 on node3), once
    assert [m.machine for m in view.machines] == ["gpu-bad", "node3"]
    once = view.machines[1]
    assert (once.incidents, once.culprit, once.quarantined) == (1, 1, False)
    doc = read_quarantine(real_store)
    assert doc["threshold"] == 1.5 and doc["machines"][0]["machine"] == "gpu-bad"


def test_one_incident_is_not_enough_and_old_incidents_fade(real_store: Path) -> None:
    run_batch(real_store)
    st = Store(real_store)
    assert not fleet_view(st, BatchConfig(quarantine_threshold=1.7)).quarantine  # 2 x 0.825 = 1.65
    in_six_days = time.time() + 6 * DAY  # two half-lives: a quarter of the weight
    faded = fleet_view(st, now=in_six_days)
    assert faded.machines[0].risk == pytest.approx(fleet_view(st).machines[0].risk / 4, rel=1e-3)
    assert not faded.quarantine
    assert fleet_view(st, now=time.time() + 8 * DAY).machines == []  # out of the 7-day window


def test_the_same_job_failing_again_counts_less_than_another_job(probe_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "store"
    for i in range(2):  # the job restarted once with one healthy machine replaced, and hung again
        ingest_probe(probe_dir, root, "one-job", ["a", "b", f"c{i}", "gpu-x"], tmp_path / str(i))
    run_batch(root)
    m = fleet_view(Store(root)).machines[0]
    assert (m.machine, m.incidents, len(m.jobs)) == ("gpu-x", 2, 1)
    conf = Store(root).read("verdicts")["confidence"][0]
    assert m.risk == pytest.approx(conf * 1.5, rel=1e-3) and not m.quarantined  # 1 + 0.5 for the repeat


def test_made_up_machine_names_are_never_scored(probe_dir: Path, tmp_path: Path) -> None:
    """Without a manifest or host folders the probe's machines are node-<rank>: the same made-up name in two
    jobs is not one machine, and must never be quarantined."""
    root = tmp_path / "store"
    for job in ("a", "b", "c"):
        ingest_path(probe_dir / "pyspy" / "text", root, job=job, gpus_per_node=1)
    run_batch(root)
    rows = Store(root).read("verdicts")
    assert set(rows["verdict"]) == {"hang"} and all(c == ["node-3"] for c in rows["culprit_nodes"].to_list())
    view = fleet_view(Store(root))
    assert view.machines == [] and view.unnamed == 3 and load_quarantine(root) == set()


def _verdict(job: str, when: datetime, kind: str, conf: float, culprits: list[str], suspects: list[str]) -> dict:
    return {
        "job": job,
        "time": when,
        "verdict": kind,
        "confidence": conf,
        "culprit_nodes": culprits,
        "suspect_nodes": suspects,
        "verdict_json": "{}",
        "incident_time": when,
        "incident_id": f"{job}-{kind}",
    }


def test_the_formula_as_documented(tmp_path: Path) -> None:
    now = datetime.now(timezone.utc)
    st = Store(tmp_path / "s", create=True)
    tp_group = [f"tp-{i}" for i in range(8)]
    st.write(
        "verdicts",
        [
            # a crash with one culprit in a TP group of 8 evicted whole: 7 collateral suspects
            _verdict("j1", now, "crash", 1.0, ["tp-3"], tp_group),
            # a hang with no culprit: two suspects share the blame
            _verdict("j2", now, "hang", 0.8, [], ["s-1", "s-2"]),
            # a degraded machine counts half; a mismatch (a code fault) and imbalance not at all
            _verdict("j3", now, "degraded", 0.9, ["slow-1"], ["slow-1"]),
            _verdict("j4", now, "mismatch", 1.0, [], ["code-1"]),
            # half-life ago: half the weight
            _verdict("j5", now - timedelta(days=3), "hang", 1.0, ["old-1"], ["old-1"]),
        ],
    )
    risk = {m.machine: m.risk for m in fleet_view(st).machines}
    assert risk["tp-3"] == pytest.approx(1.0, rel=1e-3)
    assert risk["tp-0"] == pytest.approx(0.05, rel=1e-3)
    assert risk["s-1"] == pytest.approx(0.4, rel=1e-3) and risk["s-2"] == pytest.approx(0.4, rel=1e-3)
    assert risk["slow-1"] == pytest.approx(0.45, rel=1e-3)
    assert risk["code-1"] == 0.0
    assert risk["old-1"] == pytest.approx(0.5, rel=1e-3)
    m = {m.machine: m for m in fleet_view(st).machines}
    assert (m["tp-0"].culprit, m["tp-0"].suspect, m["tp-3"].culprit) == (0, 1, 1)


def test_cli_formats_threshold_and_no_quarantine(real_store: Path) -> None:
    run_batch(real_store)
    res = runner.invoke(app, ["fleet", str(real_store), "--no-quarantine", "--threshold", "5"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split()[:3] == ["machine", "risk", "quarantined"] and lines[2].startswith("gpu-bad")
    assert lines[-1].startswith("3 incident(s) of 3 job(s) in the last 7d; 0 machine(s) above 5")
    assert load_quarantine(real_store) == {"gpu-bad"}  # --no-quarantine left the list as the batch wrote it
    assert runner.invoke(app, ["fleet", str(real_store), "--threshold", "5"]).exit_code == 0
    assert load_quarantine(real_store) == set()  # rewritten at the new threshold
    js = json.loads(runner.invoke(app, ["fleet", str(real_store), "--format", "json"]).stdout)
    assert js[0]["machine"] == "gpu-bad" and js[0]["kinds"] == {"hang": 2} and js[0]["jobs"] == 2
    rows = list(csv.DictReader(io.StringIO(runner.invoke(app, ["fleet", str(real_store), "--format", "csv"]).stdout)))
    assert rows[0]["machine"] == "gpu-bad" and rows[0]["quarantined"] == "true"
    res = runner.invoke(app, ["fleet", str(real_store), "--window", "a week"])
    assert res.exit_code == 2 and "--window='a week' is not a duration" in res.stderr


def test_refresh_is_what_the_recovery_executor_reads(real_store: Path) -> None:
    assert load_quarantine(real_store) == set()  # no list yet: nothing quarantined
    run_batch(real_store)
    refresh_quarantine(Store(real_store), BatchConfig(quarantine_threshold=1.0))
    assert load_quarantine(real_store) == {"gpu-bad"}  # twice blamed; node3 (the field hang) once
    (real_store / "quarantine.json").write_text("[]")
    from rankscope.spine import StoreError

    with pytest.raises(StoreError, match="not a rankscope quarantine list"):
        load_quarantine(real_store)
