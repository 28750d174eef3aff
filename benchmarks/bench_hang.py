"""Hang localization speed at 1k, 10k and 100k ranks: in memory, from a dump directory, from the store.

Each scale is a synthetic Megatron job (tp=8, 8 GPUs per node) with a compute hang. Measured in the
same run, so the machine's load affects all figures alike:

- ``in_memory``: clustering + localization on already-parsed stacks (target: < 1 s at 100k ranks).
- ``dump_dir``: reading and parsing every dump file + clustering + localization, beside a *floor*
  that only reads and hashes the same files (target: < 3x the floor). Both are run ``--repeat`` times
  (one fewer at 100k; 5 by default) and the fastest of each counts: on a shared machine one floor run right after the
  files were written varied 0.28-0.37 s at 10k ranks. From 1,000 files the reader splits them between
  forked workers (``read_workers``; ``RANKSCOPE_READ_WORKERS=1`` reads in one process): ``cpu_total_s``
  counts the workers' CPU too, so ``cpu_ratio_to_floor`` is the work done, ``ratio_to_floor`` the wait.
- ``store``: the same from the Parquet store, beside a floor that decodes its stacks files to
  Arrow and hashes every row (the Parquet is compressed, so hashing raw bytes is no floor for a
  reader; that figure is printed too as ``bytes_floor_s``).

Prints one JSON object. Usage: ``python benchmarks/bench_hang.py [--scales 1024,10240,102400]``.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from rankscope.analytics import stacks
from rankscope.datasets.domain.stacks import from_dumps
from rankscope.datasets.loading.ingest import ingest_inputs
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.datasets.readers.dumpdir import FILES_PER_WORKER
from rankscope.datasets.readers.forked import worker_count
from rankscope.datasets.store.store import Store
from rankscope.harness.synthetic import generate_job

LAYOUTS = {1024: "tp=8,pp=4,dp=32", 10240: "tp=8,pp=8,dp=160", 102400: "tp=8,pp=16,dp=800"}


def floor(root: Path, clock=time.perf_counter) -> tuple[float, int, int]:
    """Seconds to read and hash every file under root (the least any reader must do)."""
    t = clock()
    n = size = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as fh:
                data = fh.read()
            hashlib.blake2b(data, digest_size=16).digest()
            n += 1
            size += len(data)
    return clock() - t, n, size


def _children_cpu() -> float:
    """CPU seconds of this process's reaped children (the readers' forked workers)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def store_floor(root: Path) -> float:
    """Seconds to decode the store's stacks files to Arrow and hash every row (columnar input's floor)."""
    import polars as pl
    import pyarrow.parquet as pq

    t = time.perf_counter()
    for p in sorted((root / "stacks").rglob("part-*.parquet")):
        tbl = pq.read_table(p)
        pl.from_arrow(tbl).hash_rows()
    return time.perf_counter() - t


def correct(v, truth) -> bool:
    return (
        v.verdict == truth.expected_verdict
        and set(truth.culprit_nodes) <= set(v.suspect_nodes)
        and bool(set(truth.culprit_nodes) & set(v.culprit_nodes))
    )


def run_scale(world: int, workdir: Path, *, fmt: str, dataloader_workers: int, seed: int, repeat: int = 3) -> dict:
    layout = LAYOUTS.get(world) or f"tp=8,pp=4,dp={world // 32}"
    res: dict = {
        "ranks": world,
        "layout": layout,
        "gpus_per_node": 8,
        "fault": "compute-hang",
        "dataloader_workers": dataloader_workers,
    }
    t = time.perf_counter()
    job = generate_job(layout, gpus_per_node=8, fault="compute-hang", seed=seed, dataloader_workers=dataloader_workers)
    res["generate_s"] = round(time.perf_counter() - t, 3)
    procs = from_dumps((d.dump, d.snapshot, d.rank, d.node, d.role) for d in job.dumps)
    res["processes"] = len(procs)
    best = None
    for _ in range(3):
        t = time.perf_counter()
        v = stacks.verdict(stacks.facts(procs, job.topology), job.topology)
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    res["in_memory"] = {"localize_s": round(best, 4), "correct": correct(v, job.truth)}

    dump = workdir / f"dumps-{world}"
    t = time.perf_counter()
    job.write_dir(dump, fmt=fmt)
    res["write_dir_s"] = round(time.perf_counter() - t, 2)
    truth = job.truth
    del job, procs, v  # read as `rankscope diagnose` reads: a process that does not hold the generated job
    gc.collect()  # (a large heap makes the reader's forked workers slower: page tables, copy-on-write)
    reps = repeat if world < 100_000 else max(1, repeat - 1)
    floors = [floor(dump) for _ in range(reps)]
    floor_s, n_files, n_bytes = min(floors)
    cpu_floor = min(floor(dump, time.process_time)[0] for _ in range(reps))
    loads, totals, cpus = [], [], []
    for _ in range(reps):  # floor and reader alike: the fastest of the same number of runs (a shared machine)
        inputs = v = None  # the previous run's stacks freed first (100k ranks: one copy in memory at a time)
        t, c, k = time.perf_counter(), time.process_time(), _children_cpu()
        inputs = load_inputs(dump, layout=layout, gpus_per_node=8, freeze=True)  # as `rankscope diagnose` does
        loads.append(time.perf_counter() - t)
        v = stacks.verdict(stacks.facts(inputs.procs, inputs.topology), inputs.topology)
        totals.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c + _children_cpu() - k)  # the reader's forked workers included
    t_load, total = min(loads), min(totals)
    res["dump_dir"] = {
        "files": n_files,
        "bytes": n_bytes,
        "format": fmt,
        "floor_s": round(floor_s, 3),
        "all_floor_s": [round(f[0], 3) for f in floors],
        "load_s": round(t_load, 3),
        "total_s": round(total, 3),
        "all_total_s": [round(x, 3) for x in totals],
        "ratio_to_floor": round(total / floor_s, 2),
        "cpu_floor_s": round(cpu_floor, 3),
        "cpu_total_s": round(min(cpus), 3),
        "cpu_ratio_to_floor": round(min(cpus) / cpu_floor, 2),
        "read_workers": worker_count(n_files, min_per_worker=FILES_PER_WORKER),
        "correct": correct(v, truth),
    }

    store_root = workdir / f"store-{world}"
    t = time.perf_counter()
    ingest_inputs(inputs, Store(store_root, create=True), job="bench")
    ingest_s = time.perf_counter() - t
    shutil.rmtree(dump)
    bytes_floor, s_files, s_bytes = floor(store_root)
    sfloor = store_floor(store_root)
    t = time.perf_counter()
    inputs = load_inputs(store_root)
    t_load = time.perf_counter() - t
    v = stacks.verdict(stacks.facts(inputs.procs, inputs.topology), inputs.topology)
    total = time.perf_counter() - t
    res["store"] = {
        "files": s_files,
        "bytes": s_bytes,
        "ingest_s": round(ingest_s, 3),
        "bytes_floor_s": round(bytes_floor, 4),
        "floor_s": round(sfloor, 4),
        "load_s": round(t_load, 3),
        "total_s": round(total, 3),
        "ratio_to_floor": round(total / sfloor, 2),
        "correct": correct(v, truth),
    }
    shutil.rmtree(store_root)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="1024,10240,102400")
    ap.add_argument("--format", default="mixed", choices=["pyspy-text", "pyspy-json", "faulthandler", "mixed"])
    ap.add_argument("--dataloader-workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5, help="floor and reader runs per scale (one fewer at 100k)")
    ap.add_argument("--workdir", default=None, help="Scratch directory (default: a temporary one).")
    args = ap.parse_args()
    scratch = Path(args.workdir or tempfile.mkdtemp(prefix="rankscope-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    out = {
        "benchmark": "hang localization",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg()[0],
        "results": [],
    }
    try:
        for world in (int(x) for x in args.scales.split(",")):
            out["results"].append(
                run_scale(
                    world,
                    scratch,
                    fmt=args.format,
                    dataloader_workers=args.dataloader_workers,
                    seed=args.seed,
                    repeat=args.repeat,
                )
            )
    finally:
        if not args.workdir:
            shutil.rmtree(scratch, ignore_errors=True)
    out["loadavg_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
