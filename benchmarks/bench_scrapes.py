"""A directory of Prometheus scrape files, one per machine and scrape, read and diagnosed: runs of small files
read as one (:mod:`rankscope.datasets.readers.prometheus_batch`) against the same files read one by one.

Each machine has a dcgm-exporter scrape (8 GPUs, 8 fields, ``Hostname`` label) with node_exporter lines
beside it, every ``--interval`` seconds for ``--minutes``, the scrape time in the file name; one machine's GPUs
run 25 degC hotter after the middle. Timed in this process after imports: ``load_inputs`` + ``diagnose``
(the fastest of ``--repeat``), with the verdict and peak RSS. Prints one JSON object::

    .venv/bin/python benchmarks/bench_scrapes.py [--machines 64] [--minutes 20] [--interval 30]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import tempfile
import time
from pathlib import Path

from rankscope.analytics.diagnosis import diagnose
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.datasets.readers import prometheus_batch

T0 = 1764584000
FIELDS = (
    ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
    ("DCGM_FI_DEV_SM_CLOCK", "gauge"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge"),
)


def write_scrapes(root: Path, machines: int, scrapes: int, interval: int, hot: int, seed: int = 1) -> int:
    rng = random.Random(seed)
    n = 0
    for h in range(machines):
        host = f"gpu-node-{h:03d}"
        (root / host).mkdir(parents=True, exist_ok=True)
        for k in range(scrapes):
            lines = []
            for name, kind in FIELDS:
                lines += [f"# HELP {name} x", f"# TYPE {name} {kind}"]
                for g in range(8):
                    v = (
                        60 + rng.random() * 5
                        if "TEMP" in name
                        else (k * 3 if kind == "counter" else rng.random() * 100)
                    )
                    if h == hot and "TEMP" in name and k > scrapes // 2:
                        v += 25
                    lines.append(f'{name}{{gpu="{g}",UUID="GPU-{h}-{g}",device="nvidia{g}",Hostname="{host}"}} {v:.3f}')
            for c in range(64):
                lines.append(f'node_cpu_seconds_total{{cpu="{c}",mode="user"}} {k * 30 + rng.random():.2f}')
            (root / host / f"{host}-{T0 + interval * k}.prom").write_text("\n".join(lines) + "\n")
            n += 1
    return n


def timed(root: Path, repeat: int) -> dict:
    best, v = None, None
    for _ in range(repeat):
        t = time.perf_counter()
        v = diagnose(load_inputs(root))
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    assert v is not None and best is not None
    return {"seconds": round(best, 2), "verdict": v.verdict, "suspect_nodes": list(v.suspect_nodes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--interval", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--one-by-one", action="store_true", help="also time the files read one by one (slow)")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="rankscope-scrapes-"))
    try:
        scrapes = int(args.minutes * 60 // args.interval)
        hot = args.machines // 3
        files = write_scrapes(scratch / "scrapes", args.machines, scrapes, args.interval, hot)
        size = sum(p.stat().st_size for p in (scratch / "scrapes").rglob("*.prom"))
        out: dict = {
            "benchmark": "Prometheus scrape directory",
            "machines": args.machines,
            "files": files,
            "bytes": size,
            "culprit": f"gpu-node-{hot:03d}",
            "loadavg_start": os.getloadavg()[0],
            "batched": timed(scratch / "scrapes", args.repeat),
        }
        if args.one_by_one:
            prometheus_batch.BATCH_FILES = 1  # every run one file long: the one-by-one reader
            out["one_by_one"] = timed(scratch / "scrapes", 1)
        out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        out["loadavg_end"] = os.getloadavg()[0]
        print(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
