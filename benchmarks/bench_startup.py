"""Benchmark: wall time of short CLI runs, whole process (interpreter start included). Prints one JSON object.

    .venv/bin/python benchmarks/bench_startup.py [--runs 20] [--warmup 3]

Cases: ``rankscope --help``, ``rankscope diagnose --help``, and the 4-rank gloo probe
(``rankscope diagnose ../shared/data/torch_gloo_hang_probe/pyspy/text --gpus-per-node 1``, skipped when the
shared data is absent). Each case runs ``--runs`` times after ``--warmup`` runs (page cache warm); the
JSON gives median, min and max wall seconds, the median CPU seconds (user + system: what the command
itself costs, nearly independent of the machine's load), and the load average before and after (the
machine is shared: read the wall times against the load). Uses hyperfine when it is on PATH (``--no-hyperfine`` to not),
else a loop of ``subprocess.run`` timed with ``perf_counter``. Also lists, per case, which heavy
third-party packages the process imported. Targets: ``--help`` < 0.15 s, the probe < 0.4 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(os.environ.get("RANKSCOPE_SHARED_DIR") or ROOT.parent / "shared") / "data/torch_gloo_hang_probe"
HEAVY = ("rich", "pydantic", "numpy", "polars", "pyarrow", "duckdb", "sklearn", "scipy", "matplotlib", "torch")
TARGETS = {"help": 0.15, "probe": 0.4}


def rankscope() -> list[str]:
    exe = Path(sys.executable).parent / "rankscope"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "rankscope"]


def cases() -> dict[str, list[str]]:
    out = {"help": [*rankscope(), "--help"], "diagnose_help": [*rankscope(), "diagnose", "--help"]}
    if (PROBE / "pyspy" / "text").is_dir():
        out["probe"] = [*rankscope(), "diagnose", str(PROBE / "pyspy" / "text"), "--gpus-per-node", "1"]
    return out


def loop(argv: list[str], runs: int, warmup: int) -> list[float]:
    return loop_with_cpu(argv, runs, warmup)[0]


def loop_with_cpu(argv: list[str], runs: int, warmup: int) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + system of the child) of each run. CPU time barely moves with
    the machine's load, wall time does: on a shared machine read both."""
    for _ in range(warmup):
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    times, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return times, cpu


def hyperfine(argv: list[str], runs: int, warmup: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "h.json"
        cmd = " ".join(f"'{a}'" for a in argv)
        subprocess.run(
            ["hyperfine", "-N", "--runs", str(runs), "--warmup", str(warmup), "--export-json", str(out), cmd],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        return [float(t) for t in json.loads(out.read_text())["results"][0]["times"]]


def heavy_imports(argv: list[str]) -> list[str]:
    """The heavy packages a run of ``argv`` (a rankscope command) imports."""
    args = argv[1:] if argv[0].endswith("rankscope") else argv[3:]
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['rankscope', *{args!r}]\n"
        "try:\n    runpy.run_module('rankscope', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    return last.split()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-hyperfine", action="store_true", help="time with a Python loop even if hyperfine exists")
    args = ap.parse_args()
    use_hf = shutil.which("hyperfine") is not None and not args.no_hyperfine
    out: dict[str, Any] = {
        "benchmark": "startup",
        "python": platform.python_version(),
        "timer": "hyperfine" if use_hf else "subprocess loop",
        "runs": args.runs,
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "cases": {},
    }
    for name, argv in cases().items():
        times = hyperfine(argv, args.runs, args.warmup) if use_hf else loop(argv, args.runs, args.warmup)
        _, cpu = loop_with_cpu(argv, max(3, args.runs // 4), 0)
        res = {
            "argv": " ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv)),
            "median_s": round(statistics.median(times), 4),
            "min_s": round(min(times), 4),
            "max_s": round(max(times), 4),
            "cpu_median_s": round(statistics.median(cpu), 4),
            "heavy_imports": heavy_imports(argv),
        }
        if name in TARGETS:
            res["target_s"] = TARGETS[name]
            res["met"] = res["median_s"] < TARGETS[name]
        out["cases"][name] = res
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
