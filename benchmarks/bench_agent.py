"""Benchmarks of the node agent beside the real 8-rank fault-injection job; prints one JSON object.

- ``overhead``: the agent's CPU (% of one core, steady state, after a warm-up) and peak RSS at
  default settings (1 s metric interval) beside the healthy 8-rank job.
- ``capture``: wall time of one parallel ``py-spy dump --json`` capture of the 8 trainers (and of
  all 16 processes with the DataLoader workers), several repetitions.
- ``faults``: fault injection to verdict, per fault kind, stall threshold 10 s: from the faulty
  rank's last completed step (or its exception) to ``rankscope diagnose`` returning; whether the
  right node was named. NaN is detected from the events table, not diagnose.
- ``production`` (``--production``): the agent the way it runs in production, beside the healthy 8-rank job
  under the hook (Flight Recorder on, 2,000-entry ring buffers): metrics every second, every step logged,
  an hour's steps (``--prod-steps``, 3,600: one a second) run faster than real time, and ``--prod-captures``
  captures spread over them (each: py-spy of every process, the hooks' timestamped stacks and their FR
  dumps, kept raw in the store). Peak RSS (VmHWM), RSS at the end, CPU; the store's FR captures are read
  back and diagnosed (a healthy job: nobody named).

Targets (issue 3, 10): < 0.5 % of a core and < 100 MB RSS; 8 stacks < 1 s; hang to verdict < 30 s.
Run: ``.venv/bin/python benchmarks/bench_agent.py [--quick] [--faults compute-hang,crash] [--production]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rankscope.collectors import discovery, stacks
from rankscope.config import default_pyspy
from rankscope.harness.faultjob import command

PY = sys.executable
LAYOUT = ["--layout", "tp=2,pp=2,dp=2", "--gpus-per-node", "2"]
FAULTS = {  # kind -> (rank, node expected in the verdict, agent flags)
    "compute-hang": (5, "node-2", []),
    "dataloader-stall": (3, "node-1", []),
    "p2p-stuck": (1, "node-0", []),
    "crash": (6, "node-3", []),
    "slow-rank": (2, "node-1", ["--slow-factor", "4", "--capture-rounds", "3", "--round-interval-seconds", "5"]),
    "nan": (7, "node-3", []),
}
FAULT_STEP = 6


def start_job(base: Path, fault: str = "none", rank: int = 0, **kw: Any) -> tuple[subprocess.Popen, Path]:
    run_dir = base / "run"
    argv, env = command(run_dir=run_dir, fault=fault, fault_rank=rank, fault_step=FAULT_STEP, **kw)
    log = open(base / "job.log", "w")  # noqa: SIM115
    return subprocess.Popen(argv, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT), run_dir


def start_agent(store: Path, run_dir: Path, launcher: int, flags: list[str]) -> subprocess.Popen:
    cmd = [
        PY,
        "-m",
        "rankscope",
        "agent",
        str(store),
        "--job",
        "bench",
        "--run-dir",
        str(run_dir),
        "--launcher-pid",
        str(launcher),
        *flags,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen, *, group: bool = False) -> None:
    """SIGTERM the agent; SIGKILL a job's whole tree (torchrun starts each worker in its own session)."""
    try:
        if group:
            for pid in [*discovery.descendants(proc.pid), proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        else:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()


def cpu_seconds(pid: int) -> float:
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def status_bytes(pid: int) -> dict[str, int]:
    """VmHWM (peak RSS), RssAnon (private heap) and RssFile (mapped libraries) of ``pid``."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "RssAnon", "RssFile"):
            out[key] = int(rest.split()[0]) * 1024
    return out


def wait_for_steps(run_dir: Path, step: int, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = 0
        for f in run_dir.glob("pid*.steps.jsonl"):
            lines = f.read_text().splitlines()
            if lines and json.loads(lines[-1])["step"] >= step:
                done += 1
        if done >= 8:
            return
        time.sleep(0.5)
    raise TimeoutError(f"the job did not reach step {step} in {timeout}s")


def bench_overhead_and_capture(base: Path, seconds: float, repeats: int) -> dict[str, Any]:
    job, run_dir = start_job(base)
    agent = None
    try:
        wait_for_steps(run_dir, 3)
        agent = start_agent(base / "store", run_dir, job.pid, [])
        time.sleep(10)  # imports, first discovery, first flush
        c0, t0 = cpu_seconds(agent.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = cpu_seconds(agent.pid), time.monotonic()
        mem = status_bytes(agent.pid)
        procs = discovery.discover(only_under=job.pid)
        node = {p.pid: p for p in procs}
        trainers = [stacks.Target(p.pid, p.rank, p.role, "n") for p in procs if p.role == "trainer"]
        everyone = [stacks.Target(p.pid, p.rank, p.role, "n") for p in procs if p.role != "launcher"]
        del node
        timings: dict[str, list[float]] = {"8": [], "all": []}
        ok = {"8": 0, "all": 0}
        for _ in range(repeats):
            for key, targets in (("8", trainers), ("all", everyone)):
                s = time.perf_counter()
                caps = stacks.capture_all(targets, run_dir=str(run_dir), pyspy=default_pyspy(), timeout_seconds=5)
                timings[key].append(time.perf_counter() - s)
                ok[key] += sum(c.method == "py-spy" for c in caps)
        return {
            "overhead": {
                "metric_interval_seconds": 1.0,
                "window_seconds": round(t1 - t0, 1),
                "agent_cpu_percent_of_one_core": round(100 * (c1 - c0) / (t1 - t0), 3),
                "agent_peak_rss_mb": round(mem["VmHWM"] / 2**20, 1),
                "agent_rss_anon_mb": round(mem["RssAnon"] / 2**20, 1),
                "agent_rss_file_mb": round(mem["RssFile"] / 2**20, 1),
                "target_cpu_percent": 0.5,
                "target_rss_mb": 100,
            },
            "capture": {
                "n_trainers": len(trainers),
                "n_all": len(everyone),
                "repeats": repeats,
                "trainers_median_seconds": round(statistics.median(timings["8"]), 3),
                "trainers_max_seconds": round(max(timings["8"]), 3),
                "all_median_seconds": round(statistics.median(timings["all"]), 3),
                "pyspy_ok_fraction": round(ok["8"] / max(1, repeats * len(trainers)), 3),
                "target_seconds_for_8": 1.0,
            },
        }
    finally:
        if agent is not None:
            stop(agent)
        stop(job, group=True)


def diagnose(store: Path) -> tuple[dict[str, Any], str]:
    r = subprocess.run(
        [PY, "-m", "rankscope", "diagnose", str(store), *LAYOUT, "--format", "json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if r.returncode == 0:
        return json.loads(r.stdout), "cli"
    # the CLI is still being wired by the lead: fall back to the stack analysis library call
    from rankscope.analytics import stacks
    from rankscope.datasets.loading.inputs import load_inputs

    inp = load_inputs(store, layout="tp=2,pp=2,dp=2", order="tp-cp-ep-dp-pp", gpus_per_node=2, job=None)
    return stacks.verdict(
        stacks.facts(inp.procs, inp.topology), inp.topology, job=inp.job
    ).to_dict(), "library (CLI failed: " + (r.stderr.strip().splitlines() or ["?"])[-1][:120] + ")"


def injection_time(run_dir: Path, rank: int, fault: str) -> float | None:
    """When the fault hit: the faulty rank's exception time, else the end of its last step before it."""
    for f in run_dir.glob("pid*.exit.json"):
        rec = json.loads(f.read_text())
        if fault == "crash" and rec.get("rank") == rank:
            return float(rec["time"])
    for f in run_dir.glob("pid*.steps.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("rank") == rank and rec["step"] == FAULT_STEP - 1:
                return float(rec["t"])
    return None


def first_capture_time(store: Path) -> float | None:
    """Wall time of the agent's first capture (its stall/fail-slow/capture event)."""
    from rankscope.datasets.store.store import Store

    ev = Store(store).read("events")
    ev = ev.filter(ev["kind"].is_in(["stall", "fail_slow", "capture"])).sort("ts")
    return ev["ts"][0].timestamp() if ev.height else None


def bench_fault(base: Path, kind: str, stall_seconds: float) -> dict[str, Any]:
    rank, node, flags = FAULTS[kind]
    job, run_dir = start_job(base, kind, rank)
    store = base / "store"
    agent_flags = ["--stall-seconds", str(stall_seconds), "--max-runtime-seconds", "150", *flags]
    if kind != "nan":
        rounds = int(flags[flags.index("--capture-rounds") + 1]) if "--capture-rounds" in flags else 1
        agent_flags += ["--exit-after-captures", str(rounds)]
    agent = start_agent(store, run_dir, job.pid, agent_flags)
    try:
        if kind == "nan":
            from rankscope.datasets.store.store import Store

            deadline, found = time.time() + 120, None
            while time.time() < deadline and found is None:
                time.sleep(0.5)
                if Store.is_store(store):
                    ev = Store(store).read("events")
                    ev = ev.filter(ev["kind"] == "nan").sort("ts")
                    if ev.height:
                        found = ev.row(0, named=True)
            t_verdict = time.time()
            t_fault = injection_time(run_dir, rank, kind)
            stop(agent)
            return {
                "kind": kind,
                "rank": rank,
                "expected_node": node,
                "detected_by": "events.nan",
                "named_node": found["node"] if found else None,
                "named_rank": found["rank"] if found else None,
                "correct": bool(found and found["node"] == node),
                "fault_to_verdict_seconds": round(t_verdict - t_fault, 2) if found and t_fault else None,
            }
        try:
            out, err = agent.communicate(timeout=200)
        except subprocess.TimeoutExpired:
            agent.kill()
            out, err = agent.communicate()
            return {
                "kind": kind,
                "rank": rank,
                "expected_node": node,
                "correct": False,
                "error": "agent did not finish within 200 s",
                "agent_stderr": err[-500:],
            }
        t_fault = injection_time(run_dir, rank, kind)
        stop(job, group=True)
        t_diag = time.time()
        verdict, via = diagnose(store)
        t_verdict = time.time()
        fired = first_capture_time(store)
        return {
            "kind": kind,
            "rank": rank,
            "expected_node": node,
            "diagnose": via,
            "verdict": verdict.get("verdict"),
            "suspect_nodes": verdict.get("suspect_nodes"),
            "culprit_nodes": verdict.get("culprit_nodes"),
            "culprit_ranks": verdict.get("culprit_ranks"),
            "correct": node in (verdict.get("culprit_nodes") or []),
            "suspect_contains_node": node in (verdict.get("suspect_nodes") or []),
            "fault_to_verdict_seconds": round(t_verdict - t_fault, 2) if t_fault else None,
            "fault_to_capture_seconds": round(fired - t_fault, 2) if t_fault and fired else None,
            "diagnose_seconds": round(t_verdict - t_diag, 2),
            "agent": out.strip().splitlines()[-1][:300] if out.strip() else err[-300:],
        }
    finally:
        if agent.poll() is None:
            stop(agent)
        stop(job, group=True)


def _last_step(run_dir: Path) -> int:
    steps = []
    for f in run_dir.glob("pid*.steps.jsonl"):
        lines = f.read_text().splitlines()
        if lines:
            steps.append(json.loads(lines[-1])["step"])
    return min(steps) if len(steps) >= 8 else 0


def bench_production(base: Path, steps: int, captures: int, timeout_s: float) -> dict[str, Any]:
    """The agent beside the healthy job for ``steps`` steps with ``captures`` captures (FR included)."""
    from rankscope.collectors.trigger import request_capture

    job, run_dir = start_job(base)
    store = base / "store"
    agent = None
    try:
        wait_for_steps(run_dir, 3)
        agent = start_agent(store, run_dir, job.pid, ["--capture-rounds", "1", "--stall-seconds", "600"])
        c0, t0, s0 = cpu_seconds(agent.pid), time.monotonic(), _last_step(run_dir)
        every = max(1, (steps - 20) // max(1, captures))
        asked, samples = 0, []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = _last_step(run_dir) - s0
            if asked < captures and done >= 10 + asked * every:
                request_capture(run_dir)
                asked += 1
            samples.append(status_bytes(agent.pid)["RssAnon"])
            if done >= steps and asked >= captures:
                break
            time.sleep(1.0)
        time.sleep(8)  # the last capture and its flush
        c1, t1 = cpu_seconds(agent.pid), time.monotonic()
        mem = status_bytes(agent.pid)
        done = _last_step(run_dir) - s0
    finally:
        if agent is not None:
            stop(agent)
        stop(job, group=True)
    from rankscope.analytics import diagnose
    from rankscope.datasets.loading.inputs import load_inputs
    from rankscope.datasets.store.store import Store

    st = Store(store)
    index = st.read("fr_dumps")
    events = st.read("events")
    n_caps = events.filter(events["kind"] == "capture").height
    inputs = load_inputs(store, layout="tp=2,pp=2,dp=2", gpus_per_node=2)
    v = diagnose(inputs, sources=("flight_recorder",))
    return {
        "steps_run": done,
        "captures_asked": asked,
        "captures_done": n_caps,
        "fr_dumps_kept": index.height,
        "fr_bytes_kept": int(index["size_bytes"].sum()) if index.height else 0,
        "window_seconds": round(t1 - t0, 1),
        "agent_cpu_percent_of_one_core": round(100 * (c1 - c0) / (t1 - t0), 3),
        "agent_peak_rss_mb": round(mem["VmHWM"] / 2**20, 1),
        "agent_rss_anon_end_mb": round(mem["RssAnon"] / 2**20, 1),
        "agent_rss_anon_max_sampled_mb": round(max(samples) / 2**20, 1) if samples else None,
        "agent_rss_file_mb": round(mem["RssFile"] / 2**20, 1),
        "fr_diagnosis_of_the_store": {"verdict": v.verdict.value, "suspect_nodes": list(v.suspect_nodes)},
        "target_rss_mb": 100,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 s overhead window, 3 capture repeats")
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"comma list of {', '.join(FAULTS)} (or 'none')")
    ap.add_argument("--stall-seconds", type=float, default=10.0)
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--production", action="store_true", help="run the production scenario (FR on, an hour's steps)")
    ap.add_argument("--prod-steps", type=int, default=3600)
    ap.add_argument("--prod-captures", type=int, default=6)
    ap.add_argument("--prod-timeout", type=float, default=1800.0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rankscope-bench-agent-"))
    result: dict[str, Any] = {
        "benchmark": "agent",
        "cpus": os.cpu_count(),
        "stall_seconds": args.stall_seconds,
        "loadavg_at_start": [round(x, 1) for x in os.getloadavg()],
    }
    try:
        if not args.skip_overhead:
            (root / "overhead").mkdir()
            result.update(
                bench_overhead_and_capture(root / "overhead", 20 if args.quick else 60, 3 if args.quick else 5)
            )
        if args.production:
            (root / "production").mkdir()
            result["production"] = bench_production(
                root / "production", args.prod_steps, args.prod_captures, args.prod_timeout
            )
            print(json.dumps(result["production"]), file=sys.stderr, flush=True)
        faults = [f for f in args.faults.split(",") if f and f != "none"]
        result["faults"] = []
        for kind in faults:
            (root / kind).mkdir()
            result["faults"].append(bench_fault(root / kind, kind, args.stall_seconds))
            print(json.dumps(result["faults"][-1]), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["loadavg_at_end"] = [round(x, 1) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
