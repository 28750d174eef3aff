"""Dry runs print the exact commands and change nothing, with no scheduler, cluster or API server here."""

from __future__ import annotations

from pathlib import Path

from rankscope.recovery.backends.local import LocalBackend
from rankscope.recovery.backends.slurm import SlurmBackend
from rankscope.recovery.plan import Action, Plan


def _plan(job: str, nodes: tuple[str, ...], incident: str) -> Plan:
    return Plan(
        job=f"slurm-{job}",
        incident=incident,
        category="machine",
        rule="machine-event",
        confidence=0.98,
        actions=(
            Action("evict", "Xid 79 (GPU has fallen off the bus)", nodes=nodes),
            Action("restart", "on the remaining machines", exclude=nodes),
        ),
        time=0.0,
    )


def test_dry_run_prints_exact_commands_without_a_controller() -> None:
    sb = SlurmBackend("1234", mode="auto", env={"SLURM_CONF": "/nonexistent"})
    plan = _plan("1234", ("gpu-07",), "inc-x")
    steps = sb.carry_out(plan.actions[0], plan, apply=False)
    cmds = [s.command for s in steps]
    assert cmds[0].startswith("scontrol update NodeName=gpu-07 State=DRAIN 'Reason=rankscope inc-x machine-event:")
    assert cmds[1] == "scontrol requeue 1234"
    assert cmds[2:] == [
        "scontrol requeuehold 1234",
        "scontrol update JobId=1234 ExcNodeList=gpu-07",
        "scontrol release 1234",
    ]
    assert all(s.outcome == "dry-run" for s in steps)
    assert (
        sb.submit("train.sh", exclude=("gpu-07", "gpu-08")).command
        == "sbatch --parsable --exclude=gpu-07,gpu-08 train.sh"
    )


def test_slurm_rollback_stop_and_restart_commands() -> None:
    sb = SlurmBackend("77", mode="requeue", env={"SLURM_CONF": "/nonexistent"})
    plan = Plan(job="j", incident="inc-y", category="numerics", rule="numerics", confidence=0.8, actions=())
    rb = sb.carry_out(Action("rollback", "nan", checkpoint="/ckpt/step-50", step=50), plan, apply=False)
    assert [s.command for s in rb] == [
        "scontrol update JobId=77 Comment=rankscope:resume=/ckpt/step-50",
        "scontrol requeue 77",
    ]
    assert sb.carry_out(Action("stop", "x"), plan, apply=False)[0].command == "scontrol requeuehold 77"
    assert sb.carry_out(Action("restart", "x"), plan, apply=False)[0].command == "scontrol requeue 77"
    assert sb.carry_out(Action("collect", "x"), plan, apply=False)[0].outcome == "noop"


def test_local_dry_run_changes_nothing(tmp_path: Path) -> None:
    be = LocalBackend(
        command=["train.py"], machines=["m0", "m1"], standby=["s0"], ckpt_root=tmp_path / "c", run_dir=tmp_path / "r"
    )
    plan = _plan("x", ("m1",), "inc-z")
    steps = [s for a in plan.actions for s in be.carry_out(a, plan, apply=False)]
    assert be.slots == ["m0", "m1"] and be.running == [] and not (tmp_path / "r").exists()
    assert any("m1 -> standby s0" in s.command for s in steps)
    restart = [s.command for s in steps if s.action == "restart"]
    assert restart[1].startswith("[s0] RANKSCOPE_MACHINE=s0") and "--node-rank=1" in restart[1]


def test_recover_plans_from_the_audit_history_and_applies_once(tmp_path: Path) -> None:
    import time

    from rankscope.recovery.audit import JsonlAuditLog
    from rankscope.recovery.backends import make_backend
    from rankscope.recovery.executor import recover
    from rankscope.recovery.planner import situation_from_obj

    s = situation_from_obj(
        {
            "job": "j",
            "events": [{"kind": "gpu_lost", "node": "m1", "time": time.time() - 5}],
            "machines": ["m0", "m1"],
            "standby": ["s0"],
        }
    )
    be = make_backend(
        "local",
        command=["train.py"],
        machines=["m0", "m1"],
        standby=["s0"],
        ckpt_root=tmp_path / "c",
        run_dir=tmp_path / "r",
        launcher=["python3", "-c", "import time; time.sleep(0.1)"],
    )
    audit = JsonlAuditLog(tmp_path / "audit.jsonl")
    dry = recover(s, be, audit=audit, lock_dir=tmp_path)
    assert not dry.apply and be.slots == ["m0", "m1"]
    done = recover(s, be, audit=audit, lock_dir=tmp_path, apply=True)
    assert done.ok and be.slots == ["m0", "s0"]
    again = recover(s, be, audit=audit, lock_dir=tmp_path, apply=True)
    assert again.steps == () and be.slots == ["m0", "s0"]  # planned as already handled: nothing to do
    old = situation_from_obj({"job": "j2", "events": [{"kind": "gpu_lost", "node": "m0", "time": 100.0}]})
    assert recover(old, be, audit=audit, lock_dir=tmp_path).plan.rule == "no-signal"  # an old event is not now
    be.stop()
    import pytest as _pytest

    from rankscope.spine import InputError

    with _pytest.raises(InputError, match="--backend 'lsf'"):
        make_backend("lsf")
