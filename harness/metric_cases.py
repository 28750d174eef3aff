"""An independent check set: fleet telemetry as DCGM exporter and node_exporter publish it.

Varies what the development set fixes: fleet size (64-1,200 machines), sampling interval (1/5/15/30 s,
DCGM and node exporters apart), duration, GPU model and per-GPU offsets, metric subsets, fault kinds
and benign events. The model, per machine and GPU:

- synchronous training: the step takes as long as the slowest machine's compute plus communication;
  a GPU's utilisation is its busy fraction (compute, plus NCCL kernels while it waits), so when one
  machine is slow every other machine's utilisation and power drop together;
- power follows utilisation and clocks (a power cap clips it and pulls clocks down); temperature follows
  power through a first-order thermal lag; SM clocks sit at the GPU's clock bin, in 15 MHz steps;
- DCGM's ``DCGM_FI_PROF_*_BYTES`` are rates (gauges); ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER`` and
  ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` are counters since boot; node_exporter's network bytes and
  ``node_netstat_Tcp_RetransSegs`` are counters since boot; ``node_load1`` is the kernel's 1-minute
  exponentially damped load, ``instance:node_cpu_utilisation:rate1m`` a 1-minute rate;
- each exporter samples at its own phase with jitter; samples drop, exporters go away for a while,
  counters restart from zero;
- static differences that are not faults: hot GPUs, slower clock bins, hosts with background
  retransmits or a busier CPU, pipeline stages with different loads.

Fault kinds: thermal, slow-host, nic, pcie, gpu-slow (a single bad GPU), two-faults; no-fault kinds:
healthy, job-wide (power cap, slower phase, checkpoint pauses) and stage (a whole pipeline stage slows:
an imbalance, nobody to blame). Benign events: temperature blip, retransmit burst, CPU burst, clock
dip, brief stall, network burst, each shorter than the 240 s continuity window (up to 220 s).

    python -m rankscope.harness.metric_cases OUT --cases 40 --seed 11   # OUT/case-000/{metrics/,expected.json}
    python -m rankscope.harness.metric_cases OUT --kind slow-host --machines 600 --dcgm-interval 5 --node-interval 15

Ported from the standalone prototype (proto-metrics/gen_cases.py): the job model is in :mod:`.metric_fleet`,
the physics in :mod:`.metric_physics`, writing a case (Parquet, Prometheus text, query-range JSON) here.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rankscope.harness.metric_fleet import KINDS, Job, make_job
from rankscope.harness.metric_physics import simulate, window

# -- writing ------------------------------------------------------------------------------------


def to_table(job: Job, sampled: dict[str, Any], *, drop: float = 0.002, seed: int = 0) -> pa.Table:
    """The long frame as an Arrow table (node and metric dictionary-encoded), with drops and outages."""
    rng = np.random.default_rng(seed + 7)
    ts_parts, node_parts, metric_parts, value_parts, gpu_parts = [], [], [], [], []
    metric_names = list(sampled)
    for mi, name in enumerate(metric_names):
        t, v = sampled[name]
        n, gdim, s = v.shape
        tt = np.broadcast_to(t, v.shape)
        keep = rng.random(v.shape) >= drop
        dcgm = name.startswith("DCGM")
        for o in job.outages:
            if o["exporter"] == "both" or (o["exporter"] == "dcgm") == dcgm:
                keep[o["node"]] &= ~window(tt[o["node"]], o["start"], o["duration"])
        idx = np.nonzero(keep)
        ts_parts.append(job.start_ts + tt[idx])
        node_parts.append(idx[0].astype(np.int32))
        metric_parts.append(np.full(idx[0].size, mi, np.int32))
        value_parts.append(v[idx].astype(np.float64))
        gpu_parts.append(idx[1].astype(np.int64) if gdim > 1 else np.full(idx[0].size, -1, np.int64))
    gpu = np.concatenate(gpu_parts)
    return pa.table(
        {
            "ts": pa.array(np.round(np.concatenate(ts_parts), 3)),
            "node": pa.DictionaryArray.from_arrays(pa.array(np.concatenate(node_parts)), pa.array(job.names)),
            "metric": pa.DictionaryArray.from_arrays(pa.array(np.concatenate(metric_parts)), pa.array(metric_names)),
            "value": pa.array(np.concatenate(value_parts)),
            "gpu": pa.array(gpu, mask=gpu < 0),
        }
    )


def expected(job: Job, rows: int) -> dict[str, Any]:
    """The truth, in the development set's ``expected.json`` layout."""
    culprits = sorted({job.names[f["node"]] for f in job.faults})
    fault = bool(culprits)
    onsets = [f["onset"] for f in job.faults]

    def named(d: dict[str, Any]) -> dict[str, Any]:
        return {**d, "node": job.names[d["node"]]} if "node" in d else d

    return {
        "args": ["--gpus-per-node", str(job.gpus)],
        "kind": job.kind,
        "verdict": "fail-slow" if fault else "healthy",
        "accept_verdicts": ["fail-slow", "degraded"] if fault else ["healthy", "imbalance"],
        "culprit_nodes": culprits,
        "acceptable_nodes": culprits,
        "max_suspects": len(culprits),
        "input": "metrics",
        "onset_s": min(onsets) if onsets else (job.jobwide or {}).get("onset"),
        "machines": job.machines,
        "gpus_per_node": job.gpus,
        "minutes": job.duration_s / 60,
        "start_ts": job.start_ts,
        "gpu_model": job.gpu_model,
        "pp": job.pp,
        "step_period_s": job.step_s,
        "sample_interval_s": {"dcgm": job.dcgm_interval_s, "node": job.node_interval_s},
        "metrics": list(job.metrics),
        "rows": rows,
        "faults": [named(f) for f in job.faults],
        "jobwide": job.jobwide,
        "benign": [named(b) for b in job.benign],
        "counter_resets": [named(r) for r in job.resets],
        "outages": [named(o) for o in job.outages],
        "generator": {"seed": job.seed, "tool": "proto-metrics gen_cases.py"},
    }


def write_case(job: Job, out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``out_dir/metrics/metrics.parquet`` and ``out_dir/expected.json``; returns the expectation."""
    out = Path(out_dir)
    (out / "metrics").mkdir(parents=True, exist_ok=True)
    table = to_table(job, simulate(job), seed=job.seed)
    pq.write_table(table, out / "metrics" / "metrics.parquet", compression="zstd")
    exp = expected(job, table.num_rows)
    (out / "expected.json").write_text(json.dumps(exp, indent=1))
    return exp


def write_prometheus(table: pa.Table, out_dir: str | os.PathLike[str], *, form: str = "text") -> list[Path]:
    """Write the long table as operators export it: ``text`` = one exposition-format file per machine
    (dcgm-exporter lines carry ``Hostname``/``gpu``, node_exporter lines ``instance``, timestamps in
    ms, ``# TYPE`` lines), ``json`` = one ``/api/v1/query_range`` result per metric."""
    import polars as pl

    from rankscope.datasets.domain.counters import declared_kind

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    df = df.with_columns(pl.col("node").cast(pl.Utf8), pl.col("metric").cast(pl.Utf8))
    files = []
    if form == "text":
        for (node,), part in df.group_by(["node"]):
            lines = []
            for (metric,), m in part.sort("metric", "gpu", "ts").group_by(["metric"], maintain_order=True):
                kind: str = declared_kind(str(metric)) or "gauge"
                if str(metric).startswith("node_netstat_"):
                    kind = "untyped"  # as node_exporter declares its netstat counters
                lines.append(f"# TYPE {metric} {kind}")
                if str(metric).startswith("DCGM"):
                    lab = pl.format('{{gpu="{}",Hostname="{}",modelName="NVIDIA"}}', pl.col("gpu"), pl.col("node"))
                else:
                    lab = pl.format('{{instance="{}:9100",job="node"}}', pl.col("node"))
                body = m.select(
                    pl.format(
                        "{}{} {} {}",
                        pl.col("metric"),
                        lab,
                        pl.col("value"),
                        (pl.col("ts") * 1000).round(0).cast(pl.Int64),
                    )
                )
                lines.extend(body.to_series().to_list())
            p = out / f"{node}.prom"
            p.write_text("\n".join(lines) + "\n")
            files.append(p)
    else:
        for (metric,), part in df.group_by(["metric"]):
            result = []
            for (node, gpu), s in part.sort("ts").group_by(["node", "gpu"], maintain_order=True):
                labels = {"__name__": metric, "instance": f"{node}:9400", "Hostname": node}
                if gpu is not None:
                    labels["gpu"] = str(gpu)
                result.append({"metric": labels, "values": [[t, repr(float(v))] for t, v in zip(s["ts"], s["value"])]})
            p = out / f"{metric.replace(':', '_')}.json"
            p.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}))
            files.append(p)
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--cases", type=int, default=1)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--kind", choices=KINDS)
    ap.add_argument("--machines", type=int)
    ap.add_argument("--minutes", type=float)
    ap.add_argument("--dcgm-interval", type=float)
    ap.add_argument("--node-interval", type=float)
    ap.add_argument("--severity", type=float, default=1.0, help="scale of the faults, (0, 1]; 1 = full ranges")
    ap.add_argument("--kinds", help="comma-separated kinds to cycle through (default: all)")
    a = ap.parse_args(argv)
    pool = a.kinds.split(",") if a.kinds else list(KINDS)
    kinds = [a.kind] * a.cases if a.kind else [pool[i % len(pool)] for i in range(a.cases)]
    for i, kind in enumerate(kinds):
        job = make_job(
            kind,
            seed=a.seed * 1000 + i,
            machines=a.machines,
            duration_s=a.minutes * 60 if a.minutes else None,
            dcgm_interval_s=a.dcgm_interval,
            node_interval_s=a.node_interval,
            severity=a.severity,
        )
        exp = write_case(job, Path(a.out) / f"case-{i:03d}")
        print(
            f"case-{i:03d} {kind:<10} machines={job.machines:<5} minutes={job.duration_s / 60:<4g} "
            f"dcgm={job.dcgm_interval_s:g}s node={job.node_interval_s:g}s rows={exp['rows']} "
            f"culprits={exp['culprit_nodes']}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
