"""The local backend: named machine slots, a warm standby pool, torchrun relaunched around an eviction.

The fast tests use a stand-in launcher (a small script that takes torchrun's arguments); the slow one
runs a real two-machine gloo job under torchrun with a machine-bound fault, plans from its logs, evicts
the machine and resumes on a standby from the newest complete checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rankscope.recovery.audit import JsonlAuditLog
from rankscope.recovery.backends.local import LocalBackend, newest_complete_checkpoint
from rankscope.recovery.executor import execute
from rankscope.recovery.plan import Action, Plan
from rankscope.recovery.planner import make_plan, situation_from_obj
from rankscope.spine import RankscopeError

HERE = Path(__file__).resolve().parent
TRIVIAL = HERE / "trivial_job.py"


def _plan(*actions: Action) -> Plan:
    return Plan(
        job="local",
        incident="inc-local",
        category="machine",
        rule="machine-event",
        confidence=1.0,
        actions=actions,
        time=0.0,
    )


def test_newest_complete_checkpoint(tmp_path: Path) -> None:
    for step, complete in ((3, True), (6, True), (9, False), (12, True)):
        d = tmp_path / f"step-{step:08d}"
        d.mkdir()
        if complete:
            (d / "COMPLETE").write_text("")
    (tmp_path / "step-junk").mkdir()
    assert newest_complete_checkpoint(tmp_path) == tmp_path / "step-00000012"
    assert newest_complete_checkpoint(tmp_path, before_step=12) == tmp_path / "step-00000006"
    assert newest_complete_checkpoint(tmp_path / "missing") is None


FAKE = textwrap.dedent("""
    import json, os, sys, time
    args = dict(a.split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    print(json.dumps({"machine": os.environ["RANKSCOPE_MACHINE"], "node_rank": args["--node-rank"],
                      "nnodes": args["--nnodes"], "resume": os.environ["RANKSCOPE_RESUME_FROM"],
                      "gen": os.environ["RANKSCOPE_GENERATION"], "cmd": sys.argv[-1]}), flush=True)
    if os.environ["RANKSCOPE_MACHINE"] == os.environ.get("FAKE_FAIL", ""):
        print("RuntimeError: CUDA error: uncorrectable ECC error encountered", flush=True)
        sys.exit(1)
    if os.environ.get("FAKE_WORKER"):  # a worker in a session of its own, as torchrun starts them
        import subprocess
        w = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        open(f"worker-{os.environ['RANKSCOPE_MACHINE']}.pid", "w").write(str(w.pid))
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0.2")) if os.environ["RANKSCOPE_GENERATION"] == "1" else 0.2)
""")


def _fake(tmp_path: Path, **env: str) -> LocalBackend:
    script = tmp_path / "fake_torchrun.py"
    script.write_text(FAKE)
    return LocalBackend(
        command=["train.py"],
        machines=["m0", "m1", "m2"],
        standby=["s0", "s1"],
        ckpt_root=tmp_path / "ckpt",
        run_dir=tmp_path / "run",
        launcher=[sys.executable, str(script)],
        env=env,
        stop_grace_seconds=2,
    )


def test_launch_evict_and_relaunch_with_a_standby_in_the_slot(tmp_path: Path) -> None:
    be = _fake(tmp_path, FAKE_FAIL="m1", FAKE_SLEEP="30")
    be.launch()
    codes = be.wait_any_failure(30)
    assert codes["m1"] == 1 and codes["m0"] is None  # m0, m2 still "running"
    lines = [{"text": ll.text, "node": ll.node, "time": ll.time} for ll in be.logs()]
    plan = make_plan(situation_from_obj({"logs": lines, "machines": be.slots, "standby": be.standby, "job": "local"}))
    assert plan.rule == "machine-event" and plan.evicted == ("m1",)
    ck = tmp_path / "ckpt" / "step-00000004"
    ck.mkdir(parents=True)
    (ck / "COMPLETE").write_text("")
    dry = execute(plan, be, audit=JsonlAuditLog(tmp_path / "audit.jsonl"), lock_dir=tmp_path)
    assert be.slots == ["m0", "m1", "m2"] and all(s.outcome in ("dry-run", "noop") for s in dry.steps)
    assert "slot 1 (ranks 1-1): m1 -> standby s0" in dry.explain()
    rep = execute(plan, be, audit=JsonlAuditLog(tmp_path / "audit.jsonl"), lock_dir=tmp_path, apply=True)
    assert rep.ok, rep.explain()
    assert be.slots == ["m0", "s0", "m2"] and be.quarantine == {"m1"} and be.standby == ["s1"]
    be.wait(30)
    got = [json.loads(line.text) for line in be.logs() if line.text.startswith("{")]
    assert {g["machine"]: g["node_rank"] for g in got} == {"m0": "0", "s0": "1", "m2": "2"}
    assert {g["resume"] for g in got} == {str(ck)} and {g["gen"] for g in got} == {"2"}
    with pytest.raises(RankscopeError, match="quarantined"):
        be.slots[0] = "m1"
        be.launch()


def test_no_usable_standby_refuses_the_eviction(tmp_path: Path) -> None:
    be = _fake(tmp_path)
    be.quarantine |= {"s0", "s1"}
    with pytest.raises(RankscopeError, match="no usable standby"):
        be.carry_out(Action("evict", "x", nodes=("m1",)), _plan(), apply=False)


def test_stop_kills_every_process_of_the_slots_even_in_other_sessions(tmp_path: Path) -> None:
    """torchrun starts each worker in a session of its own: a process-group signal would orphan them."""
    import os

    be = _fake(tmp_path, FAKE_SLEEP="60", FAKE_WORKER="1")
    be.launch()
    worker_files = [tmp_path / "run" / f"worker-{m}.pid" for m in be.slots]
    deadline = time.monotonic() + 30
    while not all(f.exists() for f in worker_files) and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = [int(f.read_text()) for f in worker_files]
    assert all(os.getsid(w) == w for w in workers)  # each in its own session
    be.carry_out(Action("stop", "x"), _plan(), apply=True)
    assert be.running == [] and json.loads((tmp_path / "run" / "local-cluster.json").read_text())["running"] == []
    from rankscope.recovery.procs import proc_start_time

    assert [proc_start_time(pid) for pid in workers] == [None] * len(workers)  # gone (or a zombie awaiting init)


def test_another_process_evicts_and_the_controller_relaunches_below_itself(tmp_path: Path) -> None:
    """What the node agent's `rankscope recover --backend local` does: load the state, act, exit. The
    relaunched job is started by the cluster's controller, so it stays below one parent."""
    from rankscope.recovery.backends import local_control
    from rankscope.recovery.procs import descendants

    be = _fake(tmp_path, FAKE_FAIL="m1", FAKE_SLEEP="30")
    be.save()
    controller = local_control.start(tmp_path / "run")
    try:
        be = LocalBackend.load(tmp_path / "run")
        be.launch()
        assert {r.pid for r in be.running} <= set(descendants(controller))
        assert be.wait_any_failure(30)["m1"] == 1
        code = textwrap.dedent(f"""
            from rankscope.recovery.audit import JsonlAuditLog
            from rankscope.recovery.backends.local import LocalBackend
            from rankscope.recovery.executor import recover
            from rankscope.recovery.planner import situation_from_obj
            be = LocalBackend.load({str(tmp_path / "run")!r})
            ev = {{"kind": "gpu_lost", "node": "m1", "time": {time.time()}}}
            s = situation_from_obj({{"job": "local", "events": [ev], **be.situation()}})
            rep = recover(s, be, audit=JsonlAuditLog({str(tmp_path / "audit.jsonl")!r}), lock_dir={str(tmp_path)!r},
                          apply=True)
            print(rep.explain())
        """)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0 and "[ok] evict" in out.stdout, out.stdout + out.stderr
        again = LocalBackend.load(tmp_path / "run")
        assert again.slots == ["m0", "s0", "m2"] and again.quarantine == {"m1"} and again.generation == 2
        assert {r.pid for r in again.running} <= set(descendants(controller))
        assert again.wait(30) == {"m0": 0, "s0": 0, "m2": 0}  # the supervisors recorded the exits
    finally:
        local_control.request(tmp_path / "run", "shutdown")
    assert LocalBackend.load(tmp_path / "run").controller == {}


@pytest.mark.slow
@pytest.mark.torch
def test_torchrun_job_recovers_on_a_standby_from_the_newest_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("torch")

    env = {"TRIVIAL_FAULT_MACHINE": "m1", "TRIVIAL_FAULT_STEP": "8", "OMP_NUM_THREADS": "1"}
    be = LocalBackend(
        command=[str(TRIVIAL), "--steps", "12", "--ckpt-every", "3"],
        machines=["m0", "m1"],
        standby=["s0", "s1"],
        ckpt_root=tmp_path / "ckpt",
        run_dir=tmp_path / "run",
        env=env,
        stop_grace_seconds=5,
    )
    be.launch()
    codes = be.wait_any_failure(240)
    assert codes["m1"] not in (None, 0), codes
    be.wait(60)  # m0's rank loses its peer and exits too
    lines = [{"text": ll.text, "node": ll.node, "time": ll.time} for ll in be.logs()]
    ckpts = [
        {"step": int(p.name.split("-")[1]), "path": str(p), "complete": (p / "COMPLETE").exists()}
        for p in sorted((tmp_path / "ckpt").glob("step-*"))
    ]
    plan = make_plan(
        situation_from_obj(
            {"job": "trivial", "logs": lines, "machines": be.slots, "standby": be.standby, "checkpoints": ckpts}
        )
    )
    assert plan.rule == "machine-event" and plan.evicted == ("m1",), plan.explain()
    rep = execute(plan, be, audit=JsonlAuditLog(tmp_path / "audit.jsonl"), lock_dir=tmp_path, apply=True)
    assert rep.ok, rep.explain()
    assert be.slots == ["m0", "s0"]
    codes = be.wait(240)
    assert codes == {"m0": 0, "s0": 0}, (codes, [ll.text for ll in be.logs()][-20:])
    progress = [line.split() for line in (tmp_path / "progress.log").read_text().splitlines()]
    steps_gen2 = [int(p[0]) for p in progress if p[3] == "2"]
    assert steps_gen2 == list(range(7, 13))  # resumed after step 6, the newest complete checkpoint
    final = json.loads((tmp_path / "ckpt" / "step-00000012" / "state.json").read_text())
    assert final == {"step": 12, "total": 24.0}  # the state carried across the restart: 2 ranks x 12 steps
    assert (tmp_path / "run" / "gen-2" / "s0.log").exists() and not (tmp_path / "run" / "gen-2" / "m1.log").exists()
