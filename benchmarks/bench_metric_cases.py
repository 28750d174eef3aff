"""Accuracy of the metrics verdict on generated fleet telemetry (or any folder of cases); prints JSON.

    python benchmarks/bench_metric_cases.py --generate 27 --seed 71            # a fresh set in --out, then scored
    python benchmarks/bench_metric_cases.py --cases ../devcases/metrics        # score existing cases
    python benchmarks/bench_metric_cases.py --generate 20 --seed 41 --severity 0.15 --kinds thermal,nic,pcie

Cases are ``CASE/expected.json`` + ``CASE/metrics/`` (the development set's layout; generated ones come from
:mod:`rankscope.harness.metric_cases`: 64-1,200 machines, 15-60 min, DCGM exporter and node_exporter sampled
every 1-30 s, benign events, counter resets, exporter outages, static offsets). Each case goes through what
``rankscope diagnose CASE/metrics`` does with metrics (stream, peer-change, decision) in this process and is
scored like the development scorer: a fault case passes when its culprits are named and nothing outside the
acceptable machines is; a no-fault case (healthy, job-wide, stage) when nobody is named. Reported: cases
passed, precision and recall over machines, false machines, machine-hours of all jobs and of the no-fault jobs,
and the false-alarm rate per 1,000 machine-hours (with a 95 % upper bound when it is zero).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path


def _verdict(metrics_dir: Path) -> dict:
    from rankscope.analytics import performance
    from rankscope.config import PerfConfig
    from rankscope.datasets.readers.metric_files import open_metrics

    f = performance.facts(open_metrics(metrics_dir), None, None, config=PerfConfig())
    v = performance.verdict(f, None, job=metrics_dir.parent.name) if f is not None else None
    return {"verdict": v.verdict.value if v else None, "suspects": list(v.suspect_nodes) if v else []}


def _score(case: Path) -> dict:
    exp = json.loads((case / "expected.json").read_text())
    t = time.perf_counter()
    v = _verdict(case / exp.get("input", "metrics"))
    named = set(v["suspects"])
    truth = set(exp.get("culprit_nodes", []))
    ok_nodes = set(exp.get("acceptable_nodes", truth))
    if truth:
        passed = (
            v["verdict"] in exp["accept_verdicts"]
            and truth <= named <= ok_nodes
            and len(named) <= exp.get("max_suspects", len(truth))
        )
    else:
        passed = v["verdict"] in exp["accept_verdicts"] and not named
    return {
        "case": case.name,
        "kind": exp["kind"],
        "machines": exp["machines"],
        "machine_hours": exp["machines"] * exp["minutes"] / 60.0,
        "fault_free": not truth,
        "passed": passed,
        "tp": len(named & truth),
        "fp": len(named - truth),
        "fn": len(truth - named),
        "verdict": v["verdict"],
        "named": sorted(named),
        "seconds": round(time.perf_counter() - t, 2),
    }


def _generate(a: argparse.Namespace) -> Path:
    from rankscope.harness.metric_cases import main as generate

    out = Path(a.out) / f"seed{a.seed}-n{a.generate}-sev{a.severity:g}"
    if not (out / f"case-{a.generate - 1:03d}" / "expected.json").is_file():
        argv = [str(out), "--cases", str(a.generate), "--seed", str(a.seed), "--severity", str(a.severity)]
        with contextlib.redirect_stdout(sys.stderr):  # the generator's progress lines; stdout is the JSON
            generate(argv + (["--kinds", a.kinds] if a.kinds else []))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--cases", help="a folder of case-NNN folders to score")
    ap.add_argument("--generate", type=int, default=0, help="generate this many cases first (into --out)")
    ap.add_argument("--seed", type=int, default=71)
    ap.add_argument("--severity", type=float, default=1.0)
    ap.add_argument("--kinds", help="comma-separated kinds to cycle through (default: all)")
    ap.add_argument("--out", default="/tmp/rankscope-metric-cases")
    a = ap.parse_args(argv)
    if not a.cases and not a.generate:
        ap.error("give --cases DIR or --generate N")
    root = Path(a.cases) if a.cases else _generate(a)
    rows = [_score(c) for c in sorted(root.glob("case-*")) if (c / "expected.json").is_file()]
    tp, fp, fn = (sum(r[k] for r in rows) for k in ("tp", "fp", "fn"))
    mh = sum(r["machine_hours"] for r in rows)
    mh_free = sum(r["machine_hours"] for r in rows if r["fault_free"])
    fp_free = sum(r["fp"] for r in rows if r["fault_free"])
    per_kind: dict[str, list[int]] = {}
    for r in rows:
        per_kind.setdefault(r["kind"], [0, 0])
        per_kind[r["kind"]][0] += r["passed"]
        per_kind[r["kind"]][1] += 1
    out = {
        "cases": str(root),
        "passed": sum(r["passed"] for r in rows),
        "total": len(rows),
        "precision": round(tp / (tp + fp), 4) if tp + fp else 1.0,
        "recall": round(tp / (tp + fn), 4) if tp + fn else 1.0,
        "true_positives": tp,
        "false_machines": fp,
        "missed": fn,
        "machine_hours": round(mh, 1),
        "false_alarms_per_1000_machine_hours": round(1000 * fp / mh, 4) if mh else None,
        "fault_free_jobs": {
            "machine_hours": round(mh_free, 1),
            "false_machines": fp_free,
            "per_1000_machine_hours": round(1000 * fp_free / mh_free, 4) if mh_free else None,
            # zero seen in mh_free hours: the rate is below -ln(0.05)/hours with 95 % confidence
            "upper_95_per_1000_machine_hours": round(1000 * -math.log(0.05) / mh_free, 4)
            if mh_free and not fp_free
            else None,
        },
        "per_kind": {k: f"{p}/{n}" for k, (p, n) in sorted(per_kind.items())},
        "failed": [r for r in rows if not r["passed"]],
        "median_seconds": sorted(r["seconds"] for r in rows)[len(rows) // 2] if rows else None,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
