"""Guardrails: caps, cool-down, idempotency, standby pool, quarantine, the job lock, argv-only commands,
the append-only audit trail, and the executor that ties them together."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from rankscope.recovery.audit import AuditRecord, JsonlAuditLog, StoreAuditLog
from rankscope.recovery.backends.base import StepResult, check_nodes
from rankscope.recovery.executor import execute
from rankscope.recovery.guardrails import GuardrailConfig, check_placement
from rankscope.recovery.plan import Action, Plan
from rankscope.recovery.planner import make_plan, situation_from_obj
from rankscope.recovery.procs import JobLock, run_argv
from rankscope.spine import RankscopeError

T0 = 1_700_000_000.0


def hang(nodes: list[str], *, group: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "verdict": "hang",
        "job": "llm",
        "confidence": 0.9,
        "suspect_nodes": nodes,
        "culprit_nodes": nodes[:1],
        "suspect_ranks": [],
        "culprit_ranks": [],
        "suspect_group": group,
        "reasons": ["outliers"],
        "evidence": [],
        "world_size": 128,
    }


def plan_of(verdict: dict[str, Any], n_machines: int = 16, **kw: Any) -> Plan:
    d = {"verdict": verdict, "machines": [f"node-{i}" for i in range(n_machines)], "now": T0, **kw}
    return (
        make_plan(situation_from_obj(d), guards=kw.pop("guards", None))
        if "guards" not in kw
        else make_plan(situation_from_obj({k: v for k, v in d.items() if k != "guards"}), guards=kw["guards"])
    )


def g(plan: Plan, name: str) -> str:
    return next(x.decision for x in plan.guardrails if x.name == name)


# --- eviction caps ---------------------------------------------------------------------------------------


def test_eviction_within_one_eighth_passes_and_beyond_is_blocked() -> None:
    ok = plan_of(hang(["node-1", "node-2"]))  # 2 of 16 = 1/8
    assert ok.evicted == ("node-1", "node-2") and g(ok, "evict-cap") == "pass"
    big = plan_of(hang(["node-1", "node-2", "node-3"]))  # 3 of 16 > 1/8
    assert big.evicted == () and g(big, "evict-cap") == "blocked"
    assert [a.kind for a in big.actions][0] == "stop" and "person" in big.actions[0].reason
    assert not any(a.kind == "restart" for a in big.actions)


def test_machines_no_longer_in_the_job_are_never_evicted_again() -> None:
    """After a restart on standbys, a capture can still carry the previous launch's dead ranks: evidence that
    names only machines the job no longer has is stale, and nothing is evicted or restarted on it."""
    machines = ["s0", "m1", "s1", "m3"]
    stale = make_plan(situation_from_obj({"verdict": hang(["m0", "m2"]), "machines": machines, "now": T0}))
    assert stale.evicted == () and g(stale, "membership") == "skipped"
    assert [a.kind for a in stale.actions] == ["collect"] and "fresh capture" in stale.actions[0].collect[0]
    mixed = make_plan(situation_from_obj({"verdict": hang(["m3", "m2"]), "machines": machines, "now": T0}))
    assert mixed.evicted == ("m3",) and g(mixed, "membership") == "trimmed"  # the culprit m3 is still here
    gone_culprit = make_plan(situation_from_obj({"verdict": hang(["m2", "m3"]), "machines": machines, "now": T0}))
    assert gone_culprit.evicted == () and g(gone_culprit, "membership") == "skipped"


def test_cap_is_one_parallel_group_when_the_verdict_names_several() -> None:
    v = hang(
        [f"node-{i}" for i in range(4)],
        group={"kind": "pp", "indices": [0, 1], "nodes": [f"node-{i}" for i in range(4)]},
    )
    p = plan_of(v, n_machines=64)  # 1/8 of 64 = 8 would allow 4, but that is two PP groups of 2
    assert p.evicted == () and g(p, "evict-cap") == "blocked" and "one PP group" in p.guardrails[2].reason
    v1 = hang(["node-0", "node-1"], group={"kind": "pp", "indices": [0], "nodes": ["node-0", "node-1"]})
    assert plan_of(v1, n_machines=64).evicted == ("node-0", "node-1")


def test_small_jobs_may_still_lose_one_machine() -> None:
    p = plan_of(hang(["node-1"]), n_machines=4)
    assert p.evicted == ("node-1",)
    assert plan_of(hang(["node-1"]), n_machines=4, guards=GuardrailConfig(min_evict_machines=0)).evicted == ()


def test_hourly_cap_counts_earlier_evictions_of_other_incidents() -> None:
    hist = [
        {"time": T0 - 1800, "kind": "evict", "incident": "inc-old", "nodes": ["node-7", "node-8"], "executed": True}
    ]
    p = plan_of(hang(["node-1"]), history=hist, guards=GuardrailConfig(cooldown_seconds=0))
    assert p.evicted == () and g(p, "evict-cap") == "blocked" and "already evicted" in p.guardrails[2].reason
    hist[0]["time"] = T0 - 4000  # outside the hour
    assert plan_of(hang(["node-1"]), history=hist).evicted == ("node-1",)


# --- cool-down and idempotency -----------------------------------------------------------------------------


def test_cooldown_defers_disruptive_actions() -> None:
    hist = [{"time": T0 - 100, "kind": "restart", "incident": "inc-old", "executed": True}]
    p = plan_of(hang(["node-1"]), history=hist)
    assert g(p, "cooldown") == "deferred" and p.evicted == () and [a.kind for a in p.actions] == ["collect"]
    hist[0]["time"] = T0 - 400
    assert g(plan_of(hang(["node-1"]), history=hist), "cooldown") == "pass"


def test_idempotency_key_makes_reruns_change_nothing() -> None:
    first = plan_of(hang(["node-1"]))
    hist = [{"time": T0 + 1, "kind": "evict", "incident": first.incident, "nodes": ["node-1"], "executed": True}]
    again = plan_of(hang(["node-1"]), history=hist, now=T0 + 30)
    assert again.incident == first.incident and again.actions == () and g(again, "idempotency") == "skipped"
    dry = [{**hist[0], "executed": False}]  # a dry run did not act
    assert plan_of(hang(["node-1"]), history=dry).evicted == ("node-1",)


# --- standby pool and quarantine ---------------------------------------------------------------------------


def test_standby_pool_is_never_emptied_silently() -> None:
    p = plan_of(hang(["node-1"]), standby=["spare-0", "spare-1"])
    assert g(p, "standby") == "pass" and dict(p.actions[1].replacements) == {"node-1": "spare-0"}
    p = plan_of(hang(["node-1"]), standby=["spare-0"])
    assert g(p, "standby") == "warn" and "EMPTY" in p.guardrails[-1].reason
    p = plan_of(hang(["node-1", "node-2"]), standby=["spare-0"])
    assert g(p, "standby") == "warn" and "1 short" in p.guardrails[-1].reason
    p = plan_of(hang(["node-1"]))
    assert g(p, "standby") == "warn" and "no warm standby" in p.guardrails[-1].reason


def test_quarantined_standby_is_skipped_and_restart_avoids_quarantine() -> None:
    p = plan_of(hang(["node-1"]), standby=["spare-0", "spare-1"], quarantine=["spare-0", "node-12"])
    restart = p.actions[1]
    assert dict(restart.replacements) == {"node-1": "spare-1"}
    assert set(restart.exclude) == {"node-1", "spare-0", "node-12"} and g(p, "quarantine") == "warn"
    with pytest.raises(RankscopeError, match="quarantined.*spare-0"):
        check_placement(["node-2", "spare-0"], {"spare-0"})
    check_placement(["node-2"], {"spare-0"})


# --- one executor per job ------------------------------------------------------------------------------


def _hold(path: str, ready: Any, release: Any) -> None:
    with JobLock(path):
        ready.set()
        release.wait(10)


def test_lock_is_exclusive_and_released() -> None:
    ctx = multiprocessing.get_context("fork")
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"rankscope-lock-{os.getpid()}.lock")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold, args=(path, ready, release))
    proc.start()
    try:
        assert ready.wait(10)
        with pytest.raises(RankscopeError, match="another executor holds"):
            JobLock(path).acquire()
    finally:
        release.set()
        proc.join(10)
    with JobLock(path):
        assert json.loads(Path(path).read_text())["pid"] == os.getpid()
    os.unlink(path)


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "job.lock"
    ctx = multiprocessing.get_context("fork")
    dead = ctx.Process(target=lambda: None)
    dead.start()
    dead.join()
    path.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "time": time.time()}))
    with JobLock(path):
        info = json.loads(path.read_text())
        assert info["pid"] == os.getpid() and info["stale_taken_over"] is True


def test_live_holder_on_this_host_is_respected_even_without_flock(tmp_path: Path) -> None:
    path = tmp_path / "job.lock"
    path.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(), "time": time.time()}))
    with pytest.raises(RankscopeError, match="held by live pid"):
        JobLock(path).acquire()
    path.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(), "time": time.time() - 7200}))
    with JobLock(path):  # older than stale_seconds
        pass


# --- argv-only subprocesses ----------------------------------------------------------------------------


def test_run_argv_refuses_shell_strings_and_times_out(tmp_path: Path) -> None:
    with pytest.raises(RankscopeError, match="list of strings"):
        run_argv("echo hi")  # type: ignore[arg-type]
    with pytest.raises(RankscopeError, match="timed out"):
        run_argv(["sleep", "5"], timeout_seconds=0.2)
    marker = tmp_path / "pwned"
    r = run_argv(["echo", f"node-1; touch {marker}"])
    assert r.returncode == 0 and r.stdout.strip() == f"node-1; touch {marker}" and not marker.exists()
    with pytest.raises(RankscopeError, match="refusing machine name"):
        check_nodes(["node-1; reboot"])


# --- audit trail and the executor ------------------------------------------------------------------------


class Recorder:
    name = "fake"

    def __init__(self, fail: str = "") -> None:
        self.calls: list[tuple[str, bool]] = []
        self.fail = fail

    def carry_out(self, action: Action, plan: Plan, *, apply: bool) -> list[StepResult]:
        self.calls.append((action.kind, apply))
        if apply and action.kind == self.fail:
            return [StepResult(action.kind, f"do {action.kind}", "failed", "boom")]
        return [StepResult(action.kind, f"do {action.kind}", "ok" if apply else "dry-run")]


def test_audit_is_append_only_and_survives_a_torn_line(tmp_path: Path) -> None:
    log = JsonlAuditLog(tmp_path / "a.jsonl")
    r = AuditRecord("llm", "inc-1", "evict", "why", "ok", T0, "me", "slurm", False, ("node-1",))
    log.append(r)
    with open(tmp_path / "a.jsonl", "a") as f:
        f.write('{"job": "llm", "incid')  # a crash mid-write
    log.append(AuditRecord("llm", "inc-1", "restart", "why", "ok", T0 + 1, "me", "slurm", False))
    recs = log.records("llm")
    assert [x.what for x in recs] == ["evict", "restart"] and recs[0] == r
    assert log.history("llm")[0].executed and log.records("other") == []


def _audit(kind: str, tmp_path: Path) -> JsonlAuditLog | StoreAuditLog:
    return JsonlAuditLog(tmp_path / "audit.jsonl") if kind == "jsonl" else StoreAuditLog(tmp_path / "store")


@pytest.mark.parametrize("kind", ["jsonl", "store"])
def test_executor_dry_run_by_default_then_apply_once(tmp_path: Path, kind: str) -> None:
    plan = plan_of(hang(["node-1"]))
    audit = _audit(kind, tmp_path)
    be = Recorder()
    rep = execute(plan, be, audit=audit, lock_dir=tmp_path)
    assert not rep.apply and all(s.outcome == "dry-run" for s in rep.steps) and "DRY RUN" in rep.explain()
    assert be.calls == [("evict", False), ("restart", False)]
    assert all(r.dry_run and r.outcome == "dry-run" for r in audit.records())
    rep = execute(plan, be, audit=audit, lock_dir=tmp_path, apply=True)
    assert rep.ok and be.calls[-2:] == [("evict", True), ("restart", True)]
    rep = execute(plan, be, audit=audit, lock_dir=tmp_path, apply=True)
    assert rep.skipped and len(be.calls) == 4  # nothing ran the second time
    rec = audit.records()
    assert [(r.what, r.outcome, r.dry_run) for r in rec] == [
        ("evict", "dry-run", True),
        ("restart", "dry-run", True),
        ("evict", "ok", False),
        ("restart", "ok", False),
        ("skip", "skipped", False),
    ]
    assert all(r.who and r.when and r.incident == plan.incident and r.backend == "fake" for r in rec)
    # the audit trail, fed back as history, makes the planner skip the incident too
    s = situation_from_obj(
        {
            "verdict": hang(["node-1"]),
            "machines": [f"node-{i}" for i in range(16)],
            "now": T0 + 10,
            "history": [r.to_dict() for r in rec],
        }
    )
    assert make_plan(s).actions == ()


def test_no_restart_after_a_failed_eviction(tmp_path: Path) -> None:
    plan = plan_of(hang(["node-1"]))
    audit = JsonlAuditLog(tmp_path / "audit.jsonl")
    be = Recorder(fail="evict")
    rep = execute(plan, be, audit=audit, lock_dir=tmp_path, apply=True)
    assert not rep.ok and be.calls == [("evict", True)]
    assert [(r.what, r.outcome) for r in audit.records()] == [("evict", "failed"), ("restart", "skipped")]
    # a failed attempt is not "done": the incident can be retried
    assert execute(plan, Recorder(), audit=audit, lock_dir=tmp_path, apply=True).ok


def test_the_store_keeps_the_audit_trail_in_its_actions_table(tmp_path: Path) -> None:
    """who / what / when / why / outcome, append-only, one job's rows per partition, queryable with SQL."""
    from rankscope.datasets.store.store import Store

    audit = StoreAuditLog(tmp_path / "store")
    r = AuditRecord(
        "llm",
        "inc-1",
        "evict",
        "hang on node-1",
        "ok",
        T0,
        "me@h pid 1",
        "slurm",
        False,
        ("node-1",),
        ("scontrol update NodeName=node-1 State=DRAIN Reason=x",),
        "",
        "verdict-machine",
        ("node-1",),
    )
    audit.append(r)
    audit.append(AuditRecord("other", "inc-2", "collect", "why", "dry-run", T0 + 5, "me", "k8s", True))
    assert audit.records("llm") == [r] and [x.job for x in audit.records()] == ["llm", "other"]
    files = Store(tmp_path / "store").files("actions")
    assert len(files) == 2 and all("job=" in str(f.parent) for f in files)
    df = Store(tmp_path / "store").sql("SELECT who, what, why, outcome, nodes FROM actions WHERE job = 'llm'")
    assert df.to_dicts() == [
        {"who": "me@h pid 1", "what": "evict", "why": "hang on node-1", "outcome": "ok", "nodes": ["node-1"]}
    ]
