"""Speed and memory of the metrics path at the issue's size; prints JSON.

    python benchmarks/bench_metrics.py                       # 1,200 machines x 1 h x 14 metrics at 5 s, 3 runs
    python benchmarks/bench_metrics.py --machines 300 --minutes 20 --runs 1    # a smoke run

Generates once (cached under ``--data``, default ``/tmp/rankscope-bench-metrics``) a job of ``--machines``
eight-GPU machines, ``--minutes`` long, with the 14 metrics of the issue (9 dcgm-exporter fields per GPU,
5 node_exporter series per machine, counters since boot among them) sampled every ``--interval`` seconds,
four benign events and one thermal fault (:mod:`rankscope.harness.metric_cases`), written as one ZSTD
Parquet file in the long form. Each run is a fresh process pinned to ``--cores`` CPUs (polars and BLAS
threads capped to match) that does what ``rankscope diagnose`` does with the metrics: stream the file
into the cube (read + counters + binning), fit the peer-change detector, decide. It reports wall and CPU
seconds per stage (imports excluded), the peak RSS of the process, and the load average around the run
(the machine may be shared: a fixed numpy reference workload timed in the same process tells a slow
machine from slow code).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
import numpy as np
from rankscope.analytics.performance.metrics import metric_cube
from rankscope.analytics.performance.metrics_decide import _peer_change, decide_peer_change
from rankscope.config import PerfConfig
from rankscope.datasets.readers.metric_files import open_metrics
import rankscope.models.peer_change  # scikit-learn's import (~1 s) is not the detector's work
cfg = PerfConfig()
w0, c0 = time.perf_counter(), time.process_time()
ms = open_metrics(sys.argv[1])
cube = metric_cube(ms, cfg)
w1, c1 = time.perf_counter(), time.process_time()
det = _peer_change(cube, cfg)
w2, c2 = time.perf_counter(), time.process_time()
found = decide_peer_change(cube, cfg, list(cube.notes), det=det)
w3, c3 = time.perf_counter(), time.process_time()
# VmHWM: this process's own peak (ru_maxrss survives fork and exec: it would report a larger parent's size)
peak = next((int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:")), 0) / 1024
peak = peak or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
shape = {"rows": cube.rows, "machines": len(cube.machines), "blocks": cube.n_blocks, "block_s": cube.block_s,
         "features": len(cube.features)}
del cube, det, ms
# a fixed numpy workload after the run (its arrays are not in the peak above): a slow machine vs slow code
_r = np.random.default_rng(0); _i = _r.integers(0, 1_000_000, 20_000_000); _v = _r.random(20_000_000)
_t = time.perf_counter(); np.bincount(_i, weights=_v); np.sort(_v[:2_000_000]); (_v * 2.0 + 1.0).sum()
ref_s = time.perf_counter() - _t
print(json.dumps({
    "reference_workload_s": round(ref_s, 3), **shape,
    "verdict": found.kind, "named": list(found.named),
    "seconds": {"read_and_cube": round(w1 - w0, 3), "detect": round(w2 - w1, 3), "decide": round(w3 - w2, 3),
                "total": round(w3 - w0, 3)},
    "cpu_seconds": {"read_and_cube": round(c1 - c0, 3), "detect": round(c2 - c1, 3), "decide": round(c3 - c2, 3),
                    "total": round(c3 - c0, 3)},
    "peak_rss_mib": round(peak, 1),
}))
"""


def _case(a: argparse.Namespace) -> tuple[Path, dict, float | None]:
    case = Path(a.data) / f"bench-{a.machines}x{a.minutes:g}m-{a.interval:g}s-seed{a.seed}"
    gen_s = None
    if not (case / "metrics" / "metrics.parquet").is_file():
        from rankscope.harness.metric_cases import write_case
        from rankscope.harness.metric_fleet import BENCH_METRICS, make_job

        t = time.perf_counter()
        job = make_job(
            "thermal",
            seed=a.seed,
            machines=a.machines,
            duration_s=a.minutes * 60,
            dcgm_interval_s=a.interval,
            node_interval_s=a.interval,
            metrics=BENCH_METRICS,
            n_benign=4,
        )
        write_case(job, case)
        gen_s = round(time.perf_counter() - t, 1)
    return case, json.loads((case / "expected.json").read_text()), gen_s


def _run(case: Path, cores: int) -> dict:
    env = dict(
        os.environ,
        POLARS_MAX_THREADS=str(cores),
        OMP_NUM_THREADS=str(cores),
        OPENBLAS_NUM_THREADS=str(cores),
        MKL_NUM_THREADS=str(cores),
    )
    cpus = sorted(os.sched_getaffinity(0))[:cores]
    load_before = os.getloadavg()
    t = time.perf_counter()
    cmd = [sys.executable, "-c", CHILD, str(case / "metrics")]
    if len(cpus) < os.cpu_count() and _has("taskset"):
        cmd = ["taskset", "-c", ",".join(map(str, cpus)), *cmd]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(json.dumps({"error": proc.stderr.strip().splitlines()[-3:]}))
    r = json.loads(proc.stdout)
    r.update(
        process_wall_s=round(wall, 3),
        loadavg_before=[round(x, 2) for x in load_before],
        loadavg_after=[round(x, 2) for x in os.getloadavg()],
    )
    return r


def _has(tool: str) -> bool:
    return any((Path(d) / tool).is_file() for d in os.environ.get("PATH", "").split(os.pathsep))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--machines", type=int, default=1200)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--interval", type=float, default=5.0, help="sampling interval of both exporters (s)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--data", default="/tmp/rankscope-bench-metrics", help="where the generated job is cached")
    a = ap.parse_args(argv)
    case, expected, gen_s = _case(a)
    runs = [_run(case, a.cores) for _ in range(a.runs)]
    totals = [r["seconds"]["total"] for r in runs]
    out = {
        "what": "one job's metrics: stream Parquet into the cube, fit peer-change, decide (wall s, no imports)",
        "case": str(case),
        "parquet_mib": round((case / "metrics" / "metrics.parquet").stat().st_size / 2**20, 1),
        "machines": a.machines,
        "minutes": a.minutes,
        "interval_s": a.interval,
        "metrics": len(expected["metrics"]),
        "rows": runs[0]["rows"],
        "cores": a.cores,
        "generated_in_s": gen_s,
        "total_s_median": round(statistics.median(totals), 3),
        "total_s_min": round(min(totals), 3),
        "cpu_s_median": round(statistics.median(r["cpu_seconds"]["total"] for r in runs), 3),
        "peak_rss_mib_max": max(r["peak_rss_mib"] for r in runs),
        "target": {"seconds": 5.0, "rss_mib": 2048},
        "truth": expected["culprit_nodes"],
        "right": all(r["named"] == expected["culprit_nodes"] for r in runs),
        "runs": runs,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
