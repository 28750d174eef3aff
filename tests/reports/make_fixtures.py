"""Make the report fixtures (tests/reports/fixtures) from rankscope's real output on real or independent evidence.

    RANKSCOPE_DEVCASES=../devcases .venv/bin/python tests/reports/make_fixtures.py [--only hang,crash]

Each case runs ``rankscope diagnose ... --format json`` on real or independently made evidence, loads
the same evidence with ``load_inputs`` and assembles the report tables
(:func:`rankscope.reports.assemble.evidence_from_inputs`), then saves ``<case>/verdict.json`` +
``*.parquet`` (each case < 200 KB). Rerun it when the verdict format changes:

==========  ==============================================================================================
hang        dev case stacks/case-001 (176 ranks, tp=4,pp=4,dp=11, Megatron stacks): MP group, culprit 139
fail-slow   ``rankscope demo --fault slow-rank`` (512 ranks, 5 snapshots), the culprit's innermost frame
            renamed to a hostile payload in every snapshot before diagnosis (HOSTILE_FRAME)
fr          dev case fr/case-001 (128 ranks, NCCL Flight Recorder pickles only)
metrics     dev case metrics/case-000 (128 machines x 20 min of DCGM/node metrics, thermal throttling)
crash       the release's fault-injection job under torchrun (gloo, 8 ranks, rank 6 raises at step 30):
            exit records, faulthandler stacks and step timings from the hook's run directory
hang-gloo   the real torch 2.13 gloo hang probe: py-spy stacks + Flight Recorder dumps of 4 ranks
==========  ==============================================================================================
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankscope.reports.assemble import evidence_from_inputs
from rankscope.reports.evidence import save_case

HERE = Path(__file__).resolve().parent
RANKSCOPE = [sys.executable, "-m", "rankscope"]
DEVCASES = Path(os.environ.get("RANKSCOPE_DEVCASES", "../devcases"))
GLOO = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "torch_gloo_hang_probe"
HOSTILE_FRAME = "<script>window.__pwned=1</script><svg/onload=window.__pwned=2>"
"""A frame name that runs script if any page inserts it unescaped (no spaces: dump parsers keep it whole)."""
MAX_CASE_BYTES = 200_000


def diagnose_json(path: Path, args: list[str]) -> dict[str, Any]:
    """The CLI's verdict for ``path``."""
    p = subprocess.run(
        [*RANKSCOPE, "diagnose", str(path), *args, "--format", "json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if p.returncode != 0:
        raise SystemExit(f"make_fixtures: rankscope diagnose {path} failed: {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout)


def load_kwargs(args: list[str]) -> dict[str, Any]:
    """``--layout/--order/--gpus-per-node`` CLI arguments as ``load_inputs`` keywords."""
    kw: dict[str, Any] = {}
    names = {"--layout": "layout", "--order": "order", "--gpus-per-node": "gpus_per_node"}
    for flag, value in zip(args[::2], args[1::2]):
        kw[names[flag]] = int(value) if flag == "--gpus-per-node" else value
    return kw


def from_dir(path: Path, args: list[str]) -> tuple[dict[str, Any], Any]:
    from rankscope.datasets.loading.inputs import load_inputs

    verdict = diagnose_json(path, args)
    return verdict, evidence_from_inputs(load_inputs(path, **load_kwargs(args)), verdict)


def devcase(kind: str, case: str) -> tuple[dict[str, Any], Any]:
    root = DEVCASES / kind / case
    expected = json.loads((root / "expected.json").read_text())
    return from_dir(root / expected.get("input", "dumps"), list(expected["args"]))


def _inject(path: Path, payload: str) -> bool:
    """Rename the innermost frame of the main thread in one dump (py-spy JSON/text or faulthandler)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        threads = json.loads(text)
        main = next((t for t in threads if t.get("thread_name") == "MainThread"), threads[0])
        main["frames"][0]["name"] = payload
        path.write_text(json.dumps(threads), encoding="utf-8")
        return True
    lines = text.splitlines(keepends=True)
    for i, ln in enumerate(lines):
        if ln.startswith("Current thread") or re.match(r'Thread \S+ \(.*\): "MainThread"', ln):
            frame = lines[i + 1]
            new = re.sub(r"(line \d+ in ).*$", lambda m: m.group(1) + payload, frame.rstrip("\n"), count=1)
            if new == frame.rstrip("\n"):
                new = re.sub(
                    r"^(\s+)\S+( \(.*:\d+\))$", lambda m: m.group(1) + payload + m.group(2), frame.rstrip("\n"), count=1
                )
            lines[i + 1] = new + "\n"
            path.write_text("".join(lines), encoding="utf-8")
            return new != frame.rstrip("\n")
    return False


def failslow(work: Path) -> tuple[dict[str, Any], Any]:
    out = work / "demo-slow"
    layout = ["--layout", "tp=8,pp=4,dp=16", "--gpus-per-node", "8"]
    p = subprocess.run(
        [*RANKSCOPE, "demo", "--fault", "slow-rank", "--out", str(out), "--format", "json", *layout],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if p.returncode != 0:
        raise SystemExit(f"make_fixtures: rankscope demo failed: {p.stderr.strip()[-500:]}")
    first = json.loads(p.stdout)
    rank = first["culprit_ranks"][0]
    import csv

    with open(out / "manifest.csv", newline="") as f:
        files = [out / r["file"] for r in csv.DictReader(f) if int(r["rank"]) == rank and r["role"] == "trainer"]
    if not files or not all(_inject(f, HOSTILE_FRAME) for f in files):
        raise SystemExit(f"make_fixtures: could not inject the hostile frame into rank {rank}'s dumps")
    verdict, ev = from_dir(out, layout)
    if HOSTILE_FRAME not in json.dumps(verdict):
        raise SystemExit("make_fixtures: the hostile frame did not reach the verdict")
    return verdict, ev


def crash(work: Path) -> tuple[dict[str, Any], Any]:
    from rankscope.harness.faultjob import command

    run = work / "faultjob-run"
    argv, env = command(run_dir=run, fault="crash", fault_rank=6, fault_step=30, steps=60, master_port=29611)
    with open(work / "faultjob.log", "w") as log:
        subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=300, check=False)
    return from_dir(run, [])


def hang_gloo(work: Path) -> tuple[dict[str, Any], Any]:
    d = work / "gloo"
    d.mkdir()
    for f in (GLOO / "pyspy/text").glob("rank*.txt"):
        shutil.copy(f, d)
    for f in (GLOO / "fr").glob("rank_*"):
        shutil.copy(f, d)
    return from_dir(d, ["--gpus-per-node", "1"])


CASES: dict[str, Callable[[Path], tuple[dict[str, Any], Any]]] = {
    "hang": lambda w: devcase("stacks", "case-001"),
    "fail-slow": failslow,
    "fr": lambda w: devcase("fr", "case-001"),
    "metrics": lambda w: devcase("metrics", "case-000"),
    "crash": crash,
    "hang-gloo": hang_gloo,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help=f"comma-separated cases (default: all of {', '.join(CASES)})")
    ap.add_argument("--out", default=str(HERE / "fixtures"))
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)} (valid: {', '.join(CASES)})")
    with tempfile.TemporaryDirectory(prefix="rankscope-fixtures-") as tmp:
        for name in names:
            t = time.perf_counter()
            verdict, ev = CASES[name](Path(tmp))
            root = save_case(Path(args.out) / name, verdict, ev)
            size = sum(f.stat().st_size for f in root.iterdir())
            print(
                json.dumps(
                    {
                        "case": name,
                        "verdict": verdict["verdict"],
                        "culprit_nodes": verdict["culprit_nodes"],
                        "tables": {k: t.height for k, t in ev.tables().items()},
                        "bytes": size,
                        "seconds": round(time.perf_counter() - t, 1),
                    }
                )
            )
            if size > MAX_CASE_BYTES:
                raise SystemExit(f"make_fixtures: {root} is {size} bytes (limit {MAX_CASE_BYTES})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
