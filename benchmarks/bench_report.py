"""Benchmark: time and size of a report at 1k, 4k and 16k ranks. Prints one JSON object.

    .venv/bin/python benchmarks/bench_report.py [--sizes 1024,4096,16384] [--repeat 3]

Per size, the verdict is rankscope's own (``generate_job`` + the stack analysis: a compute hang in a
Megatron-style tp=8 x pp x dp job, 8 ranks per machine). Two reports are timed:

- ``stacks``: what a dump directory gives: the verdict + topology (rank grid, prefix tree);
- ``all``: every figure at that scale: the same verdict with fail-slow rounds added, plus step timings
  (every rank x 200 steps), Flight Recorder progress (4 group kinds per rank), an exit per rank
  and 6 metric panels of 240 points, synthesized with numpy (seeded).

``render_s`` is the median of ``--repeat`` warm renders (figures + HTML) in wall seconds and
``render_cpu_s`` in CPU seconds of this process (nearly independent of a shared machine's load), ``cold_s``
the first render in the process (matplotlib's import included), ``bytes`` the HTML size. Targets: < 5 s,
< 10 MB at 16k (wall; the JSON carries the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np
import polars as pl

from rankscope.reports.evidence import ReportEvidence
from rankscope.reports.figures import FIGURES
from rankscope.reports.html import render_html


def layout_for(world: int) -> str:
    pp = 4 if world <= 4096 else 8
    return f"tp=8,pp={pp},dp={world // (8 * pp)}"


def job_verdict(world: int, seed: int) -> tuple[dict[str, Any], pl.DataFrame, float]:
    from rankscope.analytics import stacks
    from rankscope.datasets.domain.stacks import from_dumps
    from rankscope.harness.synthetic import generate_job

    t = time.perf_counter()
    job = generate_job(layout_for(world), gpus_per_node=8, fault="compute-hang", seed=seed, dataloader_workers=0)
    procs = from_dumps((d.dump, d.snapshot, d.rank, d.node, d.role) for d in job.dumps)
    verdict = stacks.verdict(stacks.facts(procs, job.topology), job.topology).to_dict()
    topo = job.topology
    names = list(topo.node_names)
    table = pl.DataFrame(
        {
            "rank": topo.ranks,
            "node": [names[i] for i in topo.node_index.tolist()],
            **{d: topo.coords[d] for d in ("tp", "cp", "ep", "dp", "pp")},
        }
    )
    return verdict, table, time.perf_counter() - t


def all_evidence(verdict: dict[str, Any], topology: pl.DataFrame, seed: int) -> tuple[dict[str, Any], ReportEvidence]:
    """The verdict plus every evidence table at the job's scale (seeded synthetic data)."""
    rng = np.random.default_rng(seed)
    world = topology.height
    culprit = int((verdict.get("culprit_ranks") or [world // 3])[0])
    v = json.loads(json.dumps(verdict))
    v.setdefault("details", {})["rounds"] = [
        {"snapshot": i, "kind": "mp", "group": culprit % 16, "n_outliers": int(rng.integers(8, 40)), "p_value": 1e-12}
        for i in range(5)
        if i != 2
    ]
    v["n_snapshots"] = 5
    steps = 200
    d = 1.0 + 0.02 * rng.standard_normal((world, steps))
    node_ranks = topology.filter(pl.col("rank") // 8 == culprit // 8)["rank"].to_numpy()
    d[node_ranks, 120:] *= 1.3
    timings = pl.DataFrame(
        {
            "rank": np.repeat(np.arange(world), steps),
            "step": np.tile(np.arange(steps), world),
            "op": "step",
            "duration_s": d.ravel(),
        }
    )
    rows = []
    coords = {c: topology[c].to_numpy() for c in ("tp", "dp", "pp")}
    for desc, key in (
        ("TENSOR_MODEL_PARALLEL_GROUP", coords["dp"] + 1000 * coords["pp"]),
        ("DATA_PARALLEL_GROUP", coords["tp"] + 1000 * coords["pp"]),
        ("PIPELINE_MODEL_PARALLEL_GROUP", coords["tp"] + 1000 * coords["dp"]),
        ("default_pg", np.zeros(world, dtype=np.int64)),
    ):
        seq = np.full(world, 5000, dtype=np.int64)
        behind = key == key[culprit]
        seq[behind & (np.arange(world) == culprit)] -= 1
        rows.append(
            pl.DataFrame(
                {
                    "rank": np.arange(world),
                    "pg": [f"{desc}-{k}" for k in key.tolist()],
                    "pg_desc": desc,
                    "last_enqueued": seq,
                    "last_started": seq,
                    "last_completed": np.where(behind, seq - 1, seq),
                }
            )
        )
    fr = pl.concat(rows)
    after = np.sort(rng.uniform(0.5, 30.0, world))
    order = np.concatenate([[culprit], np.delete(np.arange(world), culprit)])
    exits = pl.DataFrame(
        {
            "rank": order,
            "after_s": np.concatenate([[0.0], after[:-1]]),
            "cause": ["primary"] + ["cascade"] * (world - 1),
            "node": [f"node-{r // 8}" for r in order],
            "kind": "RuntimeError",
            "message": ["injected"] + ["Connection closed by peer"] * (world - 1),
        }
    )
    ts = 1.79e9 + 5.0 * np.arange(240)
    bands = []
    for k in range(6):
        base = 100.0 + 10 * k + rng.standard_normal(240)
        mine = base.copy()
        mine[150:] -= 30
        bands.append(
            pl.DataFrame(
                {
                    "unit": f"node-{culprit // 8}/gpu{culprit % 8}",
                    "metric": f"METRIC_{k}",
                    "ts": ts,
                    "value": mine,
                    "peer_median": base,
                    "peer_q25": base - 2,
                    "peer_q75": base + 2,
                    "n_peers": world - 1,
                }
            )
        )
    return v, ReportEvidence(
        topology=topology, timings=timings, fr_progress=fr, exits=exits, metric_bands=pl.concat(bands)
    )


def measure(verdict: dict[str, Any], ev: ReportEvidence, repeat: int) -> dict[str, Any]:
    per_fig = {}
    for name, fn in FIGURES.items():
        t = time.perf_counter()
        f = fn(verdict, ev)
        if f is not None:
            per_fig[name] = round(time.perf_counter() - t, 3)
    times, cpu = [], []
    html = ""
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        html = render_html(verdict, ev)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {
        "render_s": round(statistics.median(times), 3),
        "render_s_all": [round(x, 3) for x in times],
        "render_cpu_s": round(statistics.median(cpu), 3),
        "bytes": len(html.encode("utf-8")),
        "figures": per_fig,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,4096,16384")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    out: dict[str, Any] = {
        "benchmark": "report",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus_note": "shared 2-core machine",
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "sizes": [],
    }
    cold_done = False
    for world in (int(s) for s in args.sizes.split(",")):
        verdict, topology, gen_s = job_verdict(world, args.seed)
        res: dict[str, Any] = {
            "ranks": world,
            "layout": layout_for(world),
            "verdict": verdict["verdict"],
            "clusters": len(verdict["clusters"]),
            "generate_and_diagnose_s": round(gen_s, 2),
        }
        ev = ReportEvidence(topology=topology)
        if not cold_done:
            t = time.perf_counter()
            render_html(verdict, ev)
            res["cold_s"] = round(time.perf_counter() - t, 3)
            cold_done = True
        res["stacks"] = measure(verdict, ev, args.repeat)
        v_all, ev_all = all_evidence(verdict, topology, args.seed)
        res["all"] = measure(v_all, ev_all, args.repeat)
        res["all"]["rows"] = {k: t.height for k, t in ev_all.tables().items()}
        out["sizes"].append(res)
        print(json.dumps(res), file=sys.stderr)
    big = [s for s in out["sizes"] if s["ranks"] >= 16384]
    if big:
        worst = max(big, key=lambda s: s["all"]["render_s"])
        out["target_16k"] = {
            "render_s": worst["all"]["render_s"],
            "mb": round(worst["all"]["bytes"] / 2**20, 2),
            "cpu_s": worst["all"]["render_cpu_s"],
            "met": worst["all"]["render_s"] < 5 and worst["all"]["bytes"] < 10 * 2**20,
        }
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
