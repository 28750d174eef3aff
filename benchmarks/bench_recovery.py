"""From fault to training again: the recovery loop vs the timeout-and-restart baseline; prints one JSON object.

The real CPU fault job (torchrun + gloo, 8 ranks, TP=2 x PP=2 x DP=2) runs on the local backend: 4
simulated machines of 2 ranks and a warm standby pool. Faults are bound to a machine (they follow it,
not the rank): ``hang`` (one GPU spins in compute), ``crash`` (one GPU's process dies with an
exception), ``slow_machine`` (every rank of the machine 10x slower).

- ``faults``: one fault per run, the node agent beside the job (stall threshold ``--stall-seconds``,
  10 s by default; fail-slow: 4x the baseline step, 3 capture rounds 5 s apart) runs ``rankscope
  recover --backend local --apply``; nobody else acts. Times from the fault (the fault job logs when
  it began) to the capture, to the plan (verdict and decision), to the eviction, to the first step
  after the restart; steps lost (done again after the restart); whether training finished.
- ``baseline``: the same job without the loop: the collective timeout (``--timeout-seconds``, short so
  that it runs here) ends the job, a plain restart on the same machines from the newest complete
  checkpoint meets the fault again. Measured: fault to the job's end (the timeout), to training again,
  to the fault again. The timeout part is then scaled to torch's defaults (NCCL 600 s, gloo 1,800 s):
  at the default, fault to training again = the default timeout + the measured overhead past the
  short timeout + the measured restart; the ``speedup`` is that over the loop's measured time.
- ``schedule``: several faults on different machines in one run (``--schedule``); effective training
  time ratio (ETTR) = productive step time (each step's last execution, the one the model keeps) over
  wall time from launch to the end, for the loop and for the baseline given the same wall time.

Guardrails are scaled to this 4-machine, few-minute job (a 2-machine fault domain is half the job; 3
incidents about 40 s apart): ``--max-evict-fraction 0.5 --hourly-window-seconds 20 --cooldown-seconds 10``.
Run: ``.venv/bin/python benchmarks/bench_recovery.py [--kinds hang,crash,slow_machine] [--no-schedule]``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rankscope.datasets.store.store import Store
from rankscope.harness import localrun
from rankscope.recovery.backends.local import newest_complete_checkpoint

KINDS: dict[str, dict[str, Any]] = {
    "hang": {"fault": "compute-hang", "local_rank": 0, "agent": []},
    "crash": {"fault": "crash", "local_rank": 0, "agent": []},
    "slow_machine": {
        "fault": "slow-rank",
        "local_rank": "all",
        "delay_s": 1.0,
        "agent": ["--slow-factor", "4", "--capture-rounds", "3", "--round-interval-seconds", "5"],
    },
}
RECOVER_ARGS = ["--max-evict-fraction", "0.5", "--hourly-window-seconds", "20", "--cooldown-seconds", "10"]
TORCH_DEFAULT_TIMEOUTS = {"nccl": 600.0, "gloo": 1800.0}
MACHINES = ("m0", "m1", "m2", "m3")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _after(times: list[float], t: float) -> float | None:
    later = [x for x in times if x >= t]
    return min(later) if later else None


def _plan_times(hook: Path) -> list[tuple[float, str]]:
    """(decision time, rule) of every plan the agent's recover runs made (their text header)."""
    out = []
    for log in sorted(hook.glob("recover-*.log")):
        m = re.search(r"^\w+ \(([\w-]+), confidence [\d.]+\) job \S+ incident \S+ at (\S+)$", log.read_text(), re.M)
        if m:
            out.append((datetime.fromisoformat(m.group(2)).timestamp(), m.group(1)))
    return sorted(out)


def ettr(progress: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """Productive step time (each step's last execution) over wall time ``end - start``."""
    last: dict[int, float] = {}
    for p in progress:
        if "step" in p and p["end"] <= end:
            last[int(p["step"])] = float(p["end"]) - float(p["start"])
    productive = sum(last.values())
    wall = end - start
    return {"productive_s": _r(productive), "wall_s": _r(wall), "ettr": round(productive / wall, 4) if wall else None,
            "steps_kept": len(last)}  # fmt: skip


def incidents(run: localrun.LocalRun) -> list[dict[str, Any]]:
    """Per injected fault: the times from it to each stage of the loop."""
    faults: dict[tuple[str, str], dict[str, Any]] = {}
    for f in _jsonl(run.hook / "faults.jsonl"):
        faults.setdefault((f["fault"], f["machine"]), f)
    store = Store(run.store)
    ev = store.sql("SELECT ts, kind FROM events WHERE kind IN ('stall', 'fail_slow', 'capture')").to_dicts()
    captures = sorted(e["ts"].timestamp() for e in ev)
    acts = store.sql("SELECT ts, what, nodes, commands FROM actions WHERE outcome = 'ok' ORDER BY ts").to_dicts()
    plans = _plan_times(run.hook)
    progress = [p for p in run.progress() if "step" in p]
    out = []
    for (kind, machine), f in sorted(faults.items(), key=lambda kv: kv[1]["time"]):
        t0 = float(f["time"])
        evict = next((a for a in acts if a["what"] == "evict" and a["ts"].timestamp() >= t0), None)
        restart = next((a for a in acts if a["what"] == "restart" and a["ts"].timestamp() >= t0), None)
        plan = next(((t, rule) for t, rule in plans if t >= t0), None)
        row: dict[str, Any] = {"fault": kind, "machine": machine, "fault_step": f["step"],
                               "capture_s": _r((_after(captures, t0) or t0) - t0) if _after(captures, t0) else None,
                               "plan_s": _r(plan[0] - t0) if plan else None, "rule": plan[1] if plan else None,
                               "evict_s": _r(evict["ts"].timestamp() - t0) if evict else None,
                               "evicted": evict["nodes"] if evict else None,
                               "restart_s": _r(restart["ts"].timestamp() - t0) if restart else None}  # fmt: skip
        if restart is not None:
            tr = restart["ts"].timestamp()
            m = re.search(r"RANKSCOPE_RESUME_FROM=\S*step-(\d+)", restart["commands"][0])
            ck = int(m.group(1)) if m else -1
            before = [p for p in progress if p["end"] <= tr]
            gen = min((p["gen"] for p in progress if p["start"] >= tr), default=None, key=int)  # the relaunch
            first = min((p["end"] for p in progress if p["start"] >= tr and p["gen"] == gen), default=None)
            last_step = max((p["step"] for p in before), default=ck)
            row.update(resume_step=ck + 1, steps_lost=last_step - ck, first_step_after_restart_s=_r(first - t0)
                       if first else None, fault_to_training_s=_r(first - t0) if first else None)  # fmt: skip
        out.append(row)
    return out


def run_loop(root: Path, faults: list[dict[str, Any]], *, steps: int, stall: float, agent: list[str],
             standby: int, timeout: float) -> tuple[localrun.LocalRun, bool]:  # fmt: skip
    run = localrun.start(root, faults=faults, steps=steps, ckpt_every=5, stall_seconds=stall,
                         standby=[f"s{i}" for i in range(standby)], recover_args=RECOVER_ARGS,
                         agent_args=agent)  # fmt: skip
    try:
        ok = run.wait(timeout)
    finally:
        run.close()
    return run, ok


def run_baseline(root: Path, faults: list[dict[str, Any]], *, steps: int, timeout_s: float, budget: float,
                 max_restarts: int = 2) -> tuple[localrun.LocalRun, list[dict[str, Any]], float]:  # fmt: skip
    """No loop: the collective timeout ends the job, a plain restart on the same machines follows."""
    run = localrun.start(root, faults=faults, steps=steps, ckpt_every=5, agent=False, pg_timeout_s=timeout_s)
    cycles: list[dict[str, Any]] = []
    deadline = time.time() + budget
    try:
        while time.time() < deadline and not run.finished():
            be = run.backend()
            codes = be.poll()
            if codes and any(c not in (None, 0) for c in codes.values()):
                ends = [json.loads(Path(r.exit_file).read_text())["time"] for r in be.running
                        if Path(r.exit_file).exists()]  # fmt: skip
                ck = newest_complete_checkpoint(run.ckpt)
                if len(cycles) >= max_restarts:
                    cycles.append({"job_ended": min(ends), "restart": None})
                    break
                be.launch(ck)
                cycles.append({"job_ended": min(ends), "restart": time.time(), "resume_from": str(ck)})
            time.sleep(0.5)
    finally:
        end = time.time()
        run.close()
    return run, cycles, end


def baseline_row(run: localrun.LocalRun, cycles: list[dict[str, Any]], timeout_s: float) -> dict[str, Any]:
    fired = sorted(_jsonl(run.hook / "faults.jsonl"), key=lambda f: f["time"])
    progress = [p for p in run.progress() if "step" in p]
    if not fired:
        return {"fault_fired": False}
    t0 = float(fired[0]["time"])
    row: dict[str, Any] = {"timeout_s": timeout_s, "restarts": sum(1 for c in cycles if c["restart"])}
    if not cycles:
        row.update(job_ended_s=None, note="no timeout fires: the job never stops, it only trains slower")
        return row
    c = cycles[0]
    row["job_ended_s"] = _r(c["job_ended"] - t0)
    row["overhead_past_timeout_s"] = _r(c["job_ended"] - t0 - timeout_s)
    if c["restart"]:
        gen2 = [p for p in progress if p["start"] >= c["restart"]]
        first = min((p["end"] for p in gen2), default=None)
        again = [float(f["time"]) for f in fired if f["time"] > c["restart"]]
        row.update(restart_s=_r(c["restart"] - t0), training_again_s=_r(first - t0) if first else None,
                   restart_to_training_s=_r(first - c["restart"]) if first else None,
                   fault_again_s=_r(min(again) - t0) if again else None)  # fmt: skip
    return row


def scaled(loop_s: float | None, base: dict[str, Any]) -> dict[str, Any]:
    """The baseline at torch's default collective timeouts, from its measured overhead and restart. Only
    where the timeout ended the job: a crash ends it at once (its peers see the connection close), and
    there the baseline's loss is not a timeout but the restart meeting the same fault again, every time."""
    if loop_s is None or base.get("overhead_past_timeout_s") is None or base.get("restart_to_training_s") is None:
        return {}
    if base["overhead_past_timeout_s"] < 0:
        note = (
            f"no timeout involved: the job ended {base['job_ended_s']} s after the fault; each plain restart met "
            f"the fault again ({base.get('restarts')} restarts), so it never trains on"
        )
        return {"note": note}
    out = {}
    for name, default in TORCH_DEFAULT_TIMEOUTS.items():
        t = default + base["overhead_past_timeout_s"] + base["restart_to_training_s"]
        out[name] = {"default_timeout_s": default, "baseline_fault_to_training_s": round(t, 1),
                     "speedup": round(t / loop_s, 1)}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default="hang,crash,slow_machine")
    ap.add_argument("--stall-seconds", type=float, default=10.0)
    ap.add_argument("--timeout-seconds", type=float, default=30.0, help="the baseline's collective timeout")
    ap.add_argument("--fault-step", type=int, default=22)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--no-schedule", action="store_true")
    ap.add_argument("--keep", help="keep the run directories here")
    args = ap.parse_args()
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rankscope-bench-recovery-"))
    result: dict[str, Any] = {"stall_seconds": args.stall_seconds, "baseline_timeout_s": args.timeout_seconds,
                              "machines": len(MACHINES), "ranks": 8, "recover_args": RECOVER_ARGS,
                              "faults": []}  # fmt: skip
    try:
        for kind in [k for k in args.kinds.split(",") if k]:
            spec = KINDS[kind]
            fault = {k: v for k, v in spec.items() if k != "agent"} | {"machine": "m2", "step": args.fault_step}
            run, ok = run_loop(base / f"loop-{kind}", [fault], steps=args.steps, stall=args.stall_seconds,
                               agent=spec["agent"], standby=2, timeout=420)  # fmt: skip
            rows = incidents(run)
            loop = {"recovered": ok, **(rows[0] if rows else {})}
            brun, cycles, _ = run_baseline(base / f"base-{kind}", [fault], steps=args.steps,
                                           timeout_s=args.timeout_seconds, budget=240)  # fmt: skip
            b = baseline_row(brun, cycles, args.timeout_seconds)
            result["faults"].append({"kind": kind, "loop": loop, "baseline": b,
                                     "at_default_timeouts": scaled(loop.get("fault_to_training_s"), b)})  # fmt: skip
            print(json.dumps(result["faults"][-1]), flush=True, file=__import__("sys").stderr)
        if not args.no_schedule:
            schedule = [
                {"fault": "compute-hang", "machine": "m2", "local_rank": 0, "step": 20},
                {"fault": "crash", "machine": "m1", "local_rank": 0, "step": 45},
                {"fault": "slow-rank", "machine": "m3", "local_rank": "all", "delay_s": 1.0, "step": 70},
            ]
            run, ok = run_loop(base / "loop-schedule", schedule, steps=100, stall=args.stall_seconds,
                               agent=KINDS["slow_machine"]["agent"], standby=6, timeout=900)  # fmt: skip
            progress = run.progress()
            done = [p["end"] for p in progress if "done" in p]
            end = max(done) if done else time.time()
            loop = {"recovered_all": ok, "incidents": incidents(run), **ettr(progress, run.started, end)}
            brun, cycles, bend = run_baseline(base / "base-schedule", schedule, steps=100,
                                              timeout_s=args.timeout_seconds, budget=end - run.started,
                                              max_restarts=100)  # fmt: skip
            bprog = brun.progress()
            same_wall = min(bend, brun.started + (end - run.started))
            baseline = {"restarts": sum(1 for c in cycles if c["restart"]), "finished": any("done" in p for p in bprog),
                        **ettr(bprog, brun.started, same_wall)}  # fmt: skip
            result["schedule"] = {"faults": schedule, "loop": loop, "baseline": baseline}
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
