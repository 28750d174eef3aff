"""Benchmarks of ``rankscope batch`` over many small job stores; prints one JSON object.

The store: the real 4-rank gloo hang probe ingested once with ``rankscope ingest`` (one folder per machine),
then its part files written again under ``--jobs`` job names (what ``ingest --job NAME`` would write for
the same capture; ingesting 10,000 times would take hours). Every job is one incident to diagnose.

- ``runs``: ``rankscope batch STORE`` as a process, per runner (local in-process, local with a pool of 2,
  Ray on a local instance of 2 CPUs), each on the same fresh store: wall seconds, jobs per second, the
  peak resident memory of the whole process tree (driver, pool or Ray workers, Ray's raylet and GCS;
  sampled from /proc every 0.1 s), and what the run reported.
- ``nothing_new``: the same command again right after (the watermarks say nothing changed), ``--repeat``
  times: the median's wall seconds of the process and of the run itself (the store's ``batch_runs`` row),
  and every repeat's. Target < 2 s for 10,000.
- ``ray_start``: seconds to start and stop a local Ray instance (2 CPUs, 200 MB object store).
- ``per_job``: per-job seconds (serial run / jobs) and Ray's per-task overhead derived from the runs.
- ``agent_metrics_port``: resident memory the agent's ``--metrics-port`` adds (prometheus_client and
  its HTTP server thread), measured in the daemon's own process shape.

Run: ``.venv/bin/python benchmarks/bench_batch.py [--jobs 10000] [--runners local,local2,ray]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
PROBE = Path(os.environ.get("RANKSCOPE_SHARED_DIR") or REPO.parent / "shared") / "data" / "torch_gloo_hang_probe"
RUNNERS = {
    "local": ["--runner", "local", "--workers", "1"],
    "local2": ["--runner", "local", "--workers", "2"],
    "ray": ["--runner", "ray", "--workers", "2"],
}
DERIVED = ("verdicts", "batch_runs", "_batch", "quarantine.json")


def build_store(root: Path, jobs: int, tmp: Path) -> None:
    """The probe ingested once (machines named by host folders), relabelled under ``jobs`` names."""
    from rankscope.datasets.loading.ingest import ingest_path

    dump = tmp / "dump"
    for r in range(4):
        f = dump / f"host-{r}" / f"rank{r}.txt"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes((PROBE / "pyspy" / "text" / f"rank{r}.txt").read_bytes())
    ingest_path(dump, root, job="job-0", gpus_per_node=1)
    parts = [(d.parent, p, pq.read_table(p)) for d in root.glob("*/job=job-0") for p in d.glob("part-*.parquet")]
    for i in range(1, jobs):
        name = f"job-{i}"
        for table_dir, part, t in parts:
            col = t.schema.get_field_index("job")
            out = table_dir / f"job={name}" / part.name
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(t.set_column(col, "job", pa.array([name] * t.num_rows, pa.string())), out)


def reset(root: Path) -> None:
    """Remove everything a batch run wrote (the evidence stays)."""
    for name in DERIVED:
        p = root / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def _tree_rss(root_pid: int) -> int:
    """Resident bytes of ``root_pid`` and all its descendants."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/statm") as fh:
                rss[int(entry)] = int(fh.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        parent[int(entry)] = int(fields[1])
    keep, frontier = {root_pid}, [root_pid]
    children: dict[int, list[int]] = {}
    for pid, pp in parent.items():
        children.setdefault(pp, []).append(pid)
    while frontier:
        for c in children.get(frontier.pop(), []):
            if c not in keep:
                keep.add(c)
                frontier.append(c)
    return sum(rss.get(p, 0) for p in keep)


def timed(cmd: list[str]) -> dict[str, Any]:
    """Run ``cmd``; wall seconds, exit code, stdout, and the peak RSS of its process tree."""
    env = {**os.environ, "RANKSCOPE_PROGRESS": "0"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss(proc.pid))
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    return {
        "wall_seconds": round(wall, 3),
        "rc": proc.returncode,
        "peak_tree_rss_mib": round(peak / 2**20, 1),
        "stdout": out.strip().splitlines()[:3],
        "stderr": err.strip().splitlines()[-3:],
    }


def last_run_seconds(root: Path) -> float:
    from rankscope.datasets.store.store import Store

    runs = Store(root).read("batch_runs").sort("started")
    return round(float(runs["duration_seconds"][-1]), 3)


def ray_start_seconds() -> float | None:
    code = (
        "import time, logging; t=time.perf_counter(); import ray; "
        "ray.init(num_cpus=2, object_store_memory=2*10**8, include_dashboard=False, log_to_driver=False, "
        "logging_level=logging.ERROR); ray.shutdown(); print(time.perf_counter()-t)"
    )
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    try:
        return round(float(r.stdout.strip().splitlines()[-1]), 2)
    except (ValueError, IndexError):
        return None


def agent_metrics_rss(tmp: Path) -> dict[str, Any]:
    """VmRSS of a process shaped like the daemon (the agent imported and built), before and after
    ``--metrics-port`` (prometheus_client imported, the server started, one scrape served)."""
    code = f"""
import json, socket, urllib.request
def rss():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) * 1024
from rankscope.collectors.agent import Agent
from rankscope.config import AgentConfig
agent = Agent(AgentConfig(store={str(tmp / "agent-store")!r}, run_dir={str(tmp / "agent-run")!r}, kernel_log='',
              gpu=False))
agent.tick()
before = rss()
with socket.socket() as s:
    s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]
from rankscope.collectors.health import serve
server = serve(agent, port)
body = urllib.request.urlopen(f'http://127.0.0.1:{{port}}/metrics').read()
after = rss()
server.shutdown()
print(json.dumps({{"without_mib": before / 2**20, "with_mib": after / 2**20, "scrape_bytes": len(body)}}))
"""
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    try:
        d = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": r.stderr[-500:]}
    d = {k: round(v, 1) if isinstance(v, float) else v for k, v in d.items()}
    d["added_mib"] = round(d["with_mib"] - d["without_mib"], 1)
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--runners", default="local,local2,ray", help=f"comma-separated of {', '.join(RUNNERS)}")
    ap.add_argument("--keep", metavar="DIR", help="build the store here and keep it")
    ap.add_argument("--repeat", type=int, default=3, help="nothing-new runs per runner (the median is reported)")
    args = ap.parse_args()
    if not PROBE.is_dir():
        sys.exit(f"bench_batch: the probe captures are not at {PROBE} (set RANKSCOPE_SHARED_DIR)")
    tmp = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    root = Path(args.keep) if args.keep else tmp / "store"
    out: dict[str, Any] = {"jobs": args.jobs, "cpus": os.cpu_count(), "load_avg_start": os.getloadavg()[0]}
    t0 = time.perf_counter()
    build_store(root, args.jobs, tmp)
    out["build_seconds"] = round(time.perf_counter() - t0, 1)
    out["ray_start"] = {"seconds": ray_start_seconds()} if "ray" in args.runners else None
    runs: dict[str, Any] = {}
    cli = [sys.executable, "-m", "rankscope", "batch", str(root)]
    for name in [r for r in args.runners.split(",") if r]:
        reset(root)
        first = timed(cli + RUNNERS[name])
        first["run_seconds"] = last_run_seconds(root)
        first["jobs_per_second"] = round(args.jobs / first["wall_seconds"], 1)
        again = []
        for _ in range(args.repeat):  # the machine is shared: the median of a few
            a = timed(cli + RUNNERS[name])
            a["run_seconds"] = last_run_seconds(root)
            again.append(a)
        again.sort(key=lambda a: a["wall_seconds"])
        median = dict(again[len(again) // 2])
        median["wall_seconds_all"] = [a["wall_seconds"] for a in again]
        median["run_seconds_all"] = sorted(a["run_seconds"] for a in again)
        runs[name] = {"first": first, "nothing_new": median, "load_avg": os.getloadavg()[0]}
        print(json.dumps({name: runs[name]}), file=sys.stderr, flush=True)
    out["runs"] = runs
    if "local" in runs:
        per_job = runs["local"]["first"]["run_seconds"] / args.jobs
        out["per_job"] = {"serial_seconds": round(per_job, 4)}
        for name in ("local2", "ray"):
            if name in runs:
                out[f"ratio_{name}_vs_local"] = round(
                    runs[name]["first"]["jobs_per_second"] / runs["local"]["first"]["jobs_per_second"], 2
                )
        if "ray" in runs:  # 2 CPUs: wall = start + jobs * (work + overhead) / 2
            start = (out["ray_start"] or {}).get("seconds") or 0.0
            ray_wall = runs["ray"]["first"]["run_seconds"]
            overhead = max(0.0, (ray_wall - start) * 2 / args.jobs - per_job)
            out["per_job"]["ray_task_overhead_seconds"] = round(overhead, 4)
    out["agent_metrics_port"] = agent_metrics_rss(tmp)
    out["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
