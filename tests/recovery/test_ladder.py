"""The decision ladder, rule by rule, including every rule that must not evict."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rankscope.recovery.ladder import RULES, LadderConfig, Situation, evaluate
from rankscope.recovery.planner import make_plan, situation_from_obj

T0 = 1_700_000_000.0
MACHINES = [f"node-{i}" for i in range(16)]


def verdict(
    kind: str,
    *,
    conf: float = 0.85,
    suspects: tuple[str, ...] = ("node-3",),
    culprits: tuple[str, ...] | None = None,
    evidence: list[dict[str, Any]] | None = None,
    group: dict[str, Any] | None = None,
    details: dict[str, Any] | None = None,
    world: int = 16,
    ranks: tuple[int, ...] = (3,),
    clusters: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    culprits = suspects if culprits is None else culprits
    return {
        "verdict": kind,
        "job": "llm",
        "confidence": conf,
        "suspect_nodes": list(suspects),
        "culprit_nodes": list(culprits),
        "suspect_ranks": list(ranks),
        "culprit_ranks": list(ranks),
        "suspect_group": group,
        "reasons": [f"{kind} reason"],
        "world_size": world,
        "evidence": evidence
        if evidence is not None
        else [
            {
                "source": "stacks",
                "kind": "not-in-collective",
                "detail": "x",
                "ranks": list(ranks),
                "nodes": list(culprits),
                "weight": 0.9,
            }
        ],
        "clusters": clusters or [],
        "details": details or {},
    }


def plan_of(**kw: Any) -> Any:
    kw.setdefault("machines", MACHINES)
    kw.setdefault("now", T0 + 100)
    return make_plan(situation_from_obj(kw))


def kinds(plan: Any) -> list[str]:
    return [a.kind for a in plan.actions]


def evicts(plan: Any) -> tuple[str, ...]:
    return plan.evicted


def ev(kind: str, node: str = "node-5", t: float = T0 + 50, **kw: Any) -> dict[str, Any]:
    return {"kind": kind, "node": node, "time": t, **kw}


# --- 1. high-confidence machine events: evict now -------------------------------------------------------


@pytest.mark.parametrize("xid", [48, 62, 64, 74, 79, 94, 95, 119, 140])
def test_fatal_xid_event_evicts_that_machine_now(xid: int) -> None:
    p = plan_of(events=[ev("xid", xid=xid, severity="critical", message=f"NVRM: Xid (PCI:0000:3b:00): {xid}, ...")])
    assert p.rule == "machine-event" and evicts(p) == ("node-5",)
    assert kinds(p) == ["evict", "restart"] and f"Xid {xid}" in p.actions[0].reason


@pytest.mark.parametrize("kind", ["gpu_lost", "ecc_uncorrectable", "disk_fault", "fs_readonly", "disk_full"])
def test_machine_health_events_evict(kind: str) -> None:
    p = plan_of(events=[ev(kind, node="node-9")])
    assert p.rule == "machine-event" and evicts(p) == ("node-9",)


@pytest.mark.parametrize("xid", [63, 92])
def test_xid_that_needs_a_reset_later_tolerates_and_drains_instead_of_evicting(xid: int) -> None:
    """Row remap pending (63) and a high corrected-error rate (92): the GPU works; reset it before the next restart."""
    line = f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1, Row Remapper: New row marked for remapping, reset gpu"
    for p in (plan_of(events=[ev("xid", xid=xid)]), plan_of(logs=[{"text": line, "node": "node-5"}])):
        assert p.rule == "machine-drain" and not evicts(p) and kinds(p) == ["tolerate", "collect"], p.explain()
        assert p.actions[0].nodes == ("node-5",) and "reset" in p.actions[1].collect[0]


def test_xid_154_evicts_only_when_it_asks_for_a_reset_or_reboot() -> None:
    reboot = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert evicts(plan_of(events=[ev("xid", xid=154, message=reboot)])) == ("node-5",)
    p = plan_of(events=[ev("xid", xid=154, message="GPU recovery action changed from 0x2 to 0x0 (None)")])
    assert not evicts(p) and p.rule == "no-signal"


def test_every_rank_of_one_machine_failing_alike_is_that_machine_not_the_code() -> None:
    """Two ranks on one machine with the same CUDA error are not "the same error on many ranks"."""
    text = "RuntimeError: CUDA error: an illegal memory access was encountered"
    exits = [{"rank": r, "time": T0 + 1, "kind": "RuntimeError", "message": text, "node": "node-1"} for r in (2, 3)]
    p = plan_of(exits=exits, verdict=verdict("crash", suspects=("node-1",), ranks=(2, 3), world=8))
    assert p.rule != "code-fault" and evicts(p) == ("node-1",), p.explain()
    spread = [{**x, "rank": r, "node": f"node-{r}"} for x, r in zip(exits * 2, (1, 3, 5, 7))]
    assert plan_of(exits=spread).rule == "code-fault"


def test_application_xid_does_not_evict() -> None:
    p = plan_of(events=[ev("xid", xid=13), ev("xid", xid=31), ev("xid", xid=43)])
    assert not evicts(p) and p.rule == "no-signal"


def test_machine_log_line_with_its_node_evicts_and_without_one_collects() -> None:
    line = "[ 8712.443] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."
    p = plan_of(logs=[{"text": line, "node": "node-7", "time": T0}])
    assert p.rule == "machine-event" and evicts(p) == ("node-7",)
    p = plan_of(logs=[line])
    assert not evicts(p) and kinds(p) == ["collect"] and "without naming the machine" in p.actions[0].reason


def test_a_process_enospc_line_alone_does_not_evict() -> None:
    # the disk may be a shared mount: below the eviction floor without the agent's disk_full event
    p = plan_of(logs=[{"text": "OSError: [Errno 28] No space left on device: '/ckpt/step-9'", "node": "node-2"}])
    assert not evicts(p)


# --- 2. network: tolerate once, evict on a repeat within 5 minutes ---------------------------------------


def test_single_network_flap_is_tolerated() -> None:
    p = plan_of(events=[ev("nic_flap", node="node-4", t=T0 + 90)])
    assert p.rule == "network-once" and kinds(p) == ["tolerate"] and not evicts(p)


def test_network_repeat_within_window_evicts() -> None:
    p = plan_of(events=[ev("nic_flap", node="node-4", t=T0 + 10), ev("nic_down", node="node-4", t=T0 + 90)])
    assert p.rule == "network-repeat" and evicts(p) == ("node-4",)


def test_network_alerts_further_apart_than_the_window_are_tolerated() -> None:
    p = plan_of(events=[ev("nic_flap", node="node-4", t=T0 - 400), ev("nic_flap", node="node-4", t=T0 + 90)])
    assert p.rule == "network-once" and not evicts(p)


def test_network_alerts_on_different_machines_are_not_a_repeat() -> None:
    p = plan_of(events=[ev("nic_flap", node="node-4", t=T0 + 10), ev("nic_flap", node="node-6", t=T0 + 90)])
    assert p.rule == "network-once" and not evicts(p)


def test_network_alert_tolerated_before_counts_toward_the_repeat() -> None:
    hist = [
        {
            "time": T0 + 20,
            "kind": "tolerate",
            "incident": "inc-old",
            "nodes": ["node-4"],
            "rule": "network-once",
            "executed": True,
        }
    ]
    p = plan_of(events=[ev("nic_flap", node="node-4", t=T0 + 90)], history=hist)
    assert p.rule == "network-repeat" and evicts(p) == ("node-4",)


# --- 3. code / configuration: no eviction ----------------------------------------------------------------


def test_mismatch_verdict_stops_without_eviction() -> None:
    p = plan_of(verdict=verdict("mismatch", suspects=(), ranks=()))
    assert p.rule == "code-fault" and not evicts(p) and kinds(p) == ["stop", "collect"]


def test_mismatch_rolls_back_to_the_previous_code_version_when_recorded() -> None:
    p = plan_of(verdict=verdict("mismatch", suspects=(), ranks=()), code_versions=["v41", "v42"])
    assert kinds(p) == ["rollback", "restart"] and p.actions[0].code_version == "v41" and not evicts(p)


def test_same_exception_on_many_ranks_is_a_code_fault() -> None:
    exits = [
        {
            "rank": r,
            "time": T0 + r * 0.01,
            "kind": "TypeError",
            "node": f"node-{r}",
            "message": f"unsupported operand type(s) for +: 'int' and 'str' (layer {r})",
        }
        for r in range(8)
    ]
    p = plan_of(exits=exits, verdict=verdict("crash", suspects=("node-0",), ranks=(0,)))
    assert p.rule == "code-fault" and not evicts(p) and "8 ranks" in p.actions[0].reason


def test_every_rank_aborting_after_a_timeout_is_not_a_code_fault() -> None:
    exits = [{"rank": r, "time": T0 + r * 0.01, "node": f"node-{r}", "exit_code": -6} for r in range(16)]
    p = plan_of(exits=exits, verdict=verdict("hang"))
    assert p.rule == "verdict-machine" and evicts(p) == ("node-3",)


def test_widespread_crash_verdict_is_a_code_fault() -> None:
    v = verdict(
        "crash",
        suspects=(),
        culprits=(),
        ranks=(0, 1, 2, 3),
        evidence=[
            {"source": "events", "kind": "widespread-crash", "detail": "ValueError", "ranks": [0, 1, 2, 3], "nodes": []}
        ],
    )
    p = plan_of(verdict=v)
    assert p.rule == "code-fault" and not evicts(p)


def test_same_cuda_error_on_every_rank_is_the_code_not_the_machines() -> None:
    logs = [
        {"text": "RuntimeError: CUDA error: an illegal memory access was encountered", "rank": r, "node": f"node-{r}"}
        for r in range(16)
    ]
    p = plan_of(logs=logs)
    assert p.rule == "code-fault" and not evicts(p)


def test_single_rank_user_exception_in_a_crash_is_not_a_machine() -> None:
    v = verdict(
        "crash",
        conf=0.95,
        details={
            "crash": {
                "first_failure_time": T0,
                "n_primary": 1,
                "n_cascade": 15,
                "exits": [
                    {
                        "rank": 3,
                        "node": "node-3",
                        "after_s": 0.0,
                        "kind": "KeyError",
                        "message": "'input_ids'",
                        "cause": "primary",
                    }
                ],
            }
        },
    )
    p = plan_of(verdict=v)
    assert p.rule == "crash-not-machine" and not evicts(p)


def test_cuda_oom_first_failure_stops_without_eviction() -> None:
    v = verdict(
        "crash",
        conf=0.95,
        details={
            "crash": {
                "n_primary": 1,
                "exits": [
                    {
                        "rank": 3,
                        "node": "node-3",
                        "after_s": 0.0,
                        "kind": "OutOfMemoryError",
                        "cause": "primary",
                        "message": "CUDA out of memory. Tried to allocate 2.00 GiB",
                    }
                ],
            }
        },
    )
    p = plan_of(verdict=v)
    assert p.rule == "crash-not-machine" and p.category == "resources" and kinds(p) == ["stop", "collect"]


# --- 4. machine verdicts: evict the suspects, restart from the newest complete checkpoint --------------


def test_hang_with_machine_culprit_evicts_suspect_group_and_restarts_from_newest_complete() -> None:
    v = verdict(
        "hang",
        suspects=("node-12", "node-13"),
        culprits=("node-13",),
        group={"kind": "pp", "indices": [3], "ranks": "96-111", "nodes": ["node-12", "node-13"]},
    )
    ck = [
        {"step": 100, "path": "/ckpt/step-100"},
        {"step": 200, "path": "/ckpt/step-200"},
        {"step": 300, "path": "/ckpt/step-300", "complete": False},
    ]
    p = plan_of(verdict=v, checkpoints=ck, standby=["spare-0", "spare-1", "spare-2"])
    assert p.rule == "verdict-machine" and evicts(p) == ("node-12", "node-13")
    restart = p.actions[1]
    assert restart.kind == "restart" and restart.checkpoint == "/ckpt/step-200" and restart.step == 200
    assert dict(restart.replacements) == {"node-12": "spare-0", "node-13": "spare-1"}
    assert set(restart.exclude) >= {"node-12", "node-13"}


def test_crash_with_a_vanished_first_rank_evicts_its_machine() -> None:
    v = verdict(
        "crash",
        conf=0.95,
        details={
            "crash": {
                "n_primary": 1,
                "exits": [
                    {
                        "rank": 3,
                        "node": "node-3",
                        "after_s": 0.0,
                        "kind": "vanished",
                        "message": "",
                        "cause": "primary",
                    },
                    {
                        "rank": 4,
                        "node": "node-4",
                        "after_s": 0.6,
                        "kind": "RuntimeError",
                        "cause": "cascade",
                        "message": "Connection closed by peer [10.0.0.3]:29500",
                    },
                ],
            }
        },
    )
    p = plan_of(verdict=v)
    assert p.rule == "verdict-machine" and evicts(p) == ("node-3",)


def test_fail_slow_evicts() -> None:
    p = plan_of(verdict=verdict("fail-slow", conf=0.9, suspects=("node-8",)))
    assert p.rule == "verdict-machine" and evicts(p) == ("node-8",)


def test_low_confidence_machine_verdict_collects() -> None:
    p = plan_of(verdict=verdict("hang", conf=0.4))
    assert p.rule == "low-confidence" and not evicts(p) and kinds(p) == ["collect"]


def test_failed_pyspy_capture_does_not_evict() -> None:
    v = verdict(
        "hang",
        conf=0.8,
        evidence=[
            {"source": "stacks", "kind": "failed-dump", "detail": "py-spy failed", "ranks": [3], "nodes": ["node-3"]}
        ],
    )
    p = plan_of(verdict=v)
    assert p.rule == "capture-failed" and not evicts(p) and "hook" in " ".join(p.actions[0].collect)


# --- 5. training metrics: NaN / 5x jump with no machine verdict -> rollback --------------------------


def _metrics(values: list[float], key: str = "loss") -> list[dict[str, Any]]:
    return [{"step": 50 + i, key: v, "time": T0 + i} for i, v in enumerate(values)]


CKPTS = [
    {"step": 40, "path": "/ckpt/40"},
    {"step": 50, "path": "/ckpt/50"},
    {"step": 56, "path": "/ckpt/56", "complete": False},
    {"step": 60, "path": "/ckpt/60"},
]


def test_nan_loss_rolls_back_to_the_checkpoint_before_the_onset() -> None:
    p = plan_of(metrics=_metrics([2.1, 2.0, 2.0, 1.9, 1.9, 1.9, 1.8, float("nan"), float("nan")]), checkpoints=CKPTS)
    assert p.rule == "numerics" and kinds(p)[0] == "rollback" and not evicts(p)
    assert p.actions[0].checkpoint == "/ckpt/50" and "step 57" in p.actions[0].reason


def test_five_x_grad_norm_jump_rolls_back_and_four_x_does_not() -> None:
    p = plan_of(metrics=_metrics([1.0, 1.1, 0.9, 1.0, 1.0, 5.5, 6.0], "grad_norm"), checkpoints=CKPTS)
    assert p.rule == "numerics" and p.actions[0].checkpoint == "/ckpt/50"
    p = plan_of(metrics=_metrics([1.0, 1.1, 0.9, 1.0, 1.0, 4.0, 4.1], "grad_norm"), checkpoints=CKPTS)
    assert p.rule != "numerics"


def test_nan_with_a_machine_verdict_follows_the_machine() -> None:
    p = plan_of(metrics=_metrics([2.0, 2.0, 2.0, float("nan")]), verdict=verdict("hang"))
    assert p.rule == "verdict-machine" and evicts(p) == ("node-3",)


# --- 6. symptoms and no-eviction verdicts ------------------------------------------------------------------


def test_lone_nccl_timeout_routes_to_aggregation_never_evicts() -> None:
    line = (
        "[rank5]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 5] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
        "for 600081 milliseconds before timing out."
    )
    p = plan_of(logs=[{"text": line, "node": "node-5"}])
    assert p.rule == "symptom-only" and not evicts(p) and kinds(p) == ["collect"]
    assert "aggregation" in p.actions[0].reason


def test_crash_made_only_of_cascades_does_not_evict() -> None:
    v = verdict(
        "crash",
        conf=0.5,
        details={
            "crash": {
                "n_primary": 0,
                "exits": [
                    {
                        "rank": 2,
                        "node": "node-2",
                        "after_s": 0.0,
                        "kind": "RuntimeError",
                        "cause": "cascade",
                        "message": "Connection closed by peer",
                    }
                ],
            }
        },
    )
    p = plan_of(verdict=v)
    assert not evicts(p) and p.rule in ("symptom-only", "low-confidence")


@pytest.mark.parametrize(
    "kind,rule",
    [("inconclusive", "inconclusive"), ("imbalance", "imbalance"), ("degraded", "degraded"), ("healthy", "healthy")],
)
def test_verdicts_that_never_evict(kind: str, rule: str) -> None:
    p = plan_of(verdict=verdict(kind, conf=0.7, suspects=("node-3",) if kind == "degraded" else (), ranks=()))
    assert p.rule == rule and not evicts(p)
    assert not any(a.kind in ("evict", "restart", "stop") for a in p.actions)
    if kind in ("inconclusive", "imbalance"):
        assert p.actions[0].kind == "collect" and p.actions[0].collect


def test_nothing_at_all_collects() -> None:
    p = plan_of()
    assert p.rule == "no-signal" and kinds(p) == ["collect"]


# --- 7. escalation: failing again right after an eviction -------------------------------------------------


def test_failing_again_after_an_eviction_widens_then_stops() -> None:
    v = verdict("hang", suspects=("node-3",))
    first = [
        {
            "time": T0 - 600,
            "kind": "evict",
            "incident": "inc-a",
            "nodes": ["node-9"],
            "rule": "verdict-machine",
            "suspect_nodes": ["node-9", "node-10"],
            "executed": True,
        }
    ]
    big = [f"node-{i}" for i in range(32)]  # room for 3 evictions an hour (1/8)
    p = plan_of(verdict=v, history=first, machines=big)
    assert p.rule == "escalate-widen" and p.escalation == 1 and evicts(p) == ("node-3", "node-10")
    second = first + [
        {
            "time": T0 - 60,
            "kind": "evict",
            "incident": "inc-b",
            "nodes": ["node-3", "node-10"],
            "rule": "escalate-widen",
            "executed": True,
        }
    ]
    p = plan_of(verdict=v, history=second, now=T0 + 400, machines=big)
    assert p.rule == "escalate-stop" and p.escalation == 2 and kinds(p) == ["stop", "collect"] and not evicts(p)
    assert any("dcgmi diag" in c for c in p.actions[1].collect)


def test_a_job_that_trained_to_a_new_checkpoint_after_the_eviction_has_a_new_fault_not_an_escalation() -> None:
    v = verdict("hang", suspects=("node-3",))
    evicted = [{"time": T0 - 600, "kind": "evict", "incident": "inc-a", "nodes": ["node-9"], "rule": "verdict-machine",
                "suspect_nodes": ["node-9"], "executed": True}]  # fmt: skip
    big = [f"node-{i}" for i in range(32)]
    before = [{"step": 40, "path": "/ck/step-40", "complete": True, "time": T0 - 700}]
    assert plan_of(verdict=v, history=evicted, machines=big, checkpoints=before).rule == "escalate-widen"
    after = [*before, {"step": 50, "path": "/ck/step-50", "complete": True, "time": T0 - 300}]
    p = plan_of(verdict=v, history=evicted, machines=big, checkpoints=after)
    assert p.rule == "verdict-machine" and p.escalation == 0 and evicts(p) == ("node-3",)
    assert any("completed checkpoint step 50" in r and "new fault" in r for r in p.reasons)
    assert p.actions[1].checkpoint == "/ck/step-50"


def test_dry_run_or_old_evictions_do_not_escalate() -> None:
    v = verdict("hang")
    dry = [
        {
            "time": T0 - 60,
            "kind": "evict",
            "incident": "inc-a",
            "nodes": ["node-9"],
            "dry_run": True,
            "outcome": "dry-run",
        }
    ]
    assert plan_of(verdict=v, history=dry).rule == "verdict-machine"
    old = [{"time": T0 - 7200, "kind": "evict", "incident": "inc-a", "nodes": ["node-9"], "executed": True}]
    assert plan_of(verdict=v, history=old).rule == "verdict-machine"


# --- determinism -----------------------------------------------------------------------------------------


def test_same_input_same_plan_bytes_and_order_does_not_matter() -> None:
    events = [
        ev("nic_flap", node="node-4", t=T0 + 10),
        ev("xid", node="node-2", xid=79, t=T0 + 20),
        ev("nic_flap", node="node-4", t=T0 + 30),
    ]
    a = plan_of(events=events, verdict=verdict("hang"))
    b = plan_of(events=list(reversed(events)), verdict=verdict("hang"))
    assert a.to_json() == b.to_json()
    assert json.loads(a.to_json())["incident"].startswith("inc-")
    assert a.rule == "machine-event" and set(a.also_matched) >= {"network-repeat", "verdict-machine"}


def test_incident_key_ignores_history_so_reruns_are_recognised() -> None:
    s = situation_from_obj({"verdict": verdict("hang"), "machines": MACHINES, "now": T0})
    p1 = evaluate(s)
    hist = [{"time": T0, "kind": "evict", "incident": p1.incident, "nodes": ["node-3"], "executed": True}]
    s2 = situation_from_obj({"verdict": verdict("hang"), "machines": MACHINES, "now": T0 + 5, "history": hist})
    assert evaluate(s2).incident == p1.incident
    assert make_plan(s2).actions == () and make_plan(s2).guardrails[0].decision == "skipped"


def test_plan_has_the_promised_fields() -> None:
    d = json.loads(plan_of(verdict=verdict("hang")).to_json())
    for key in ("job", "incident", "category", "actions", "confidence", "guardrails"):
        assert key in d
    assert all({"kind", "reason"} <= set(a) for a in d["actions"]) and d["actions"][0]["nodes"] == ["node-3"]
    assert all({"name", "decision", "reason"} <= set(g) for g in d["guardrails"])


def test_every_rule_in_the_table_is_exercised_by_this_file() -> None:
    text = Path(__file__).read_text()
    for rule in RULES:
        assert f'"{rule.id}"' in text, f"no test names rule {rule.id}"


def test_bad_input_names_the_field() -> None:
    from rankscope.spine import InputError

    with pytest.raises(InputError, match="verdict.*'bogus'"):
        situation_from_obj({"verdict": {"verdict": "bogus"}})
    with pytest.raises(InputError, match=r"events\[0\].*time"):
        situation_from_obj({"events": [{"kind": "xid"}]})
    with pytest.raises(InputError, match="unknown key"):
        Situation.from_dict({"verdicts": []})
    with pytest.raises(InputError, match="metric_jump_factor"):
        LadderConfig(metric_jump_factor=1.0)


def test_real_diagnose_output_is_accepted(probe_dir: Path, fr_hang_past_timeout: Path) -> None:
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankscope",
            "diagnose",
            str(fr_hang_past_timeout),  # a clocked hang, captured past the job's collective timeout
            "--gpus-per-node",
            "1",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if out.returncode != 0:
        pytest.skip(f"diagnose failed here: {out.stderr[-200:]}")
    p = plan_of(verdict=json.loads(out.stdout), machines=[f"node-{i}" for i in range(4)])
    assert p.rule == "verdict-machine" and evicts(p) == ("node-3",)
