"""Synthetic benchmark of the peer-mode metric detectors; prints JSON.

Per fault kind: precision, recall, F1 and onset-to-alert delay; on fault-free runs: false alarms per
machine-day; optionally recall at milder faults (--sweep); timing-straggler accuracy per scenario (slow machine,
slow stage, data imbalance,
job-wide slowdown, healthy); speed of scoring 1,200 machines x 3,600 s x 8 metrics; LSTM-VAE denoiser training time.

A detection counts when the faulty machine is alerted at or after its onset; an alert on a healthy
machine, or on a faulty machine before its onset, is a false positive.

    python benchmarks/bench_metrics.py                 # full size (1,200 machines x 1 h), a few minutes
    python benchmarks/bench_metrics.py --quick         # 300 machines x 30 min, for a smoke run
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from rankscope.analytics.performance.metrics import counters_to_rates
from rankscope.harness.synthetic_metrics import FAULT_KINDS, make_metrics
from rankscope.models import PeerDistance, PeerMad


def _cube(run):
    return counters_to_rates(run.values, run.metric_names, interval_s=1.0, rate_window_s=120.0, allowance=2.0)


def _score_run(det, run, counts, delays, kind):
    X = _cube(run)
    alerts = det.fit(X).detect(X)
    truth = {f.machine: f for f in run.faults}
    for i in alerts.alerted:
        f = truth.get(int(i))
        if f is not None and alerts.alert_index[i] >= f.onset_s:
            counts[kind]["tp"] += 1
            delays[kind].append(float(alerts.alert_index[i] - f.onset_s))
        else:
            counts[kind]["fp"] += 1
    detected = {int(i) for i in alerts.alerted}
    counts[kind]["fn"] += sum(1 for m in truth if m not in detected)
    return int(alerts.labels.sum())


def _prf(c):
    p = c["tp"] / (c["tp"] + c["fp"]) if c["tp"] + c["fp"] else 1.0
    r = c["tp"] / (c["tp"] + c["fn"]) if c["tp"] + c["fn"] else 1.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": round(p, 4), "recall": round(r, 4), "f1": round(f, 4), **c}


def evaluate(make_det, *, machines, seconds, runs_per_kind, faults_per_run, healthy_runs, seed, severity=1.0):
    counts = {k: {"tp": 0, "fp": 0, "fn": 0} for k in (*FAULT_KINDS, "none")}
    delays: dict[str, list[float]] = {k: [] for k in counts}
    onset_range = (min(300.0, seconds * 0.1), seconds * 0.75)
    s = seed
    for kind in FAULT_KINDS:
        for _ in range(runs_per_kind):
            run = make_metrics(
                n_machines=machines,
                duration_s=seconds,
                faults={kind: faults_per_run},
                onset_range_s=onset_range,
                severity=severity,
                seed=s,
            )
            s += 1
            _score_run(make_det(), run, counts, delays, kind)
    false_alarms = 0
    for _ in range(healthy_runs):
        run = make_metrics(n_machines=machines, duration_s=seconds, seed=s)
        s += 1
        false_alarms += _score_run(make_det(), run, counts, delays, "none")
    total = {k: sum(counts[kind][k] for kind in counts) for k in ("tp", "fp", "fn")}
    per_kind = {}
    for kind in FAULT_KINDS:
        d = np.asarray(delays[kind])
        per_kind[kind] = {
            **_prf(counts[kind]),
            "delay_s_median": round(float(np.median(d)), 1) if d.size else None,
            "delay_s_p90": round(float(np.quantile(d, 0.9)), 1) if d.size else None,
        }
    machine_days = healthy_runs * machines * seconds / 86400.0
    return {
        "overall": _prf(total),
        "per_kind": per_kind,
        "fault_free": {
            "runs": healthy_runs,
            "machine_days": round(machine_days, 2),
            "false_alarms": false_alarms,
            "false_alarms_per_machine_day": round(false_alarms / machine_days, 4) if machine_days else None,
        },
    }


def timings_accuracy(runs: int, seed: int) -> dict:
    """Straggler localisation over seeded timing scenarios (Greyhound reports >99 % accuracy, 0 % FP)."""
    from rankscope.analytics.performance.stragglers import find_stragglers
    from rankscope.harness.synthetic_metrics import TIMING_SCENARIOS, make_timings

    rng = np.random.default_rng(seed)
    layouts = [
        ("tp=2,pp=4,dp=8", 8),
        ("tp=4,pp=2,dp=16", 8),
        ("tp=1,pp=1,dp=32", 1),
        ("tp=2,pp=2,dp=8", 4),
        ("tp=2,pp=2,dp=4", 4),
    ]
    out: dict = {}
    t = time.perf_counter()
    for scenario in TIMING_SCENARIOS:
        correct = blamed_wrong = 0
        for r in range(runs):
            layout, gpn = layouts[r % len(layouts)]
            slowdown = float(rng.choice([1.3, 1.5, 2.0]))
            df, topo, truth = make_timings(
                layout,
                scenario=scenario,
                gpus_per_node=gpn,
                slowdown=slowdown,
                onset_step=int(rng.integers(30, 150)),
                seed=seed + r,
            )
            rep = find_stragglers(df, topo)
            if scenario == "slow-machine":
                correct += rep.slow_nodes[:1] == truth.slow_nodes and len(rep.slow_nodes) == 1
                blamed_wrong += any(n not in truth.slow_nodes for n in rep.slow_nodes)
            else:
                ok = not rep.slow_ranks and (scenario == "healthy") == (not rep.imbalances)
                correct += ok
                blamed_wrong += bool(rep.slow_ranks)
        out[scenario] = {
            "runs": runs,
            "accuracy": round(correct / runs, 4),
            "runs_blaming_a_healthy_machine": int(blamed_wrong),
        }
    out["seconds"] = round(time.perf_counter() - t, 1)
    return out


def speed(machines: int, seconds: int, seed: int) -> dict:
    run = make_metrics(n_machines=machines, duration_s=seconds, faults={"gpu-throttle": 1}, seed=seed)
    X = _cube(run)
    det = PeerDistance()
    t = time.perf_counter()
    det.fit(X)
    fit_s = time.perf_counter() - t
    t = time.perf_counter()
    det.detect(X)
    score_s = time.perf_counter() - t
    return {
        "shape": list(X.shape),
        "fit_seconds": round(fit_s, 2),
        "score_seconds": round(score_s, 2),
        "target_seconds": 5.0,
    }


def vae(machines: int, seconds: int, seed: int, epochs: int) -> dict:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return {"skipped": "torch not installed"}
    from rankscope.models import lstm_vae

    run = make_metrics(n_machines=machines, duration_s=seconds, faults=dict.fromkeys(FAULT_KINDS, 1), seed=seed)
    X = _cube(run)
    train_time = [0.0]
    original = lstm_vae.train_vae

    def timed(*a, **kw):
        t = time.perf_counter()
        out = original(*a, **kw)
        train_time[0] += time.perf_counter() - t
        return out

    lstm_vae.train_vae = timed
    try:
        det = PeerDistance(denoiser="lstm-vae", denoiser_epochs=epochs)
        t = time.perf_counter()
        det.fit(X)
        fit_s = time.perf_counter() - t
    finally:
        lstm_vae.train_vae = original
    t = time.perf_counter()
    alerts = det.detect(X)
    score_s = time.perf_counter() - t
    truth = {f.machine for f in run.faults}
    found = {int(i) for i in alerts.alerted}
    return {
        "shape": list(X.shape),
        "epochs": epochs,
        "train_seconds_all_metrics": round(train_time[0], 1),
        "fit_seconds": round(fit_s, 1),
        "score_seconds": round(score_s, 1),
        "faults": len(truth),
        "detected": len(truth & found),
        "false_alarms": len(found - truth),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", type=int, default=1200)
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--runs-per-kind", type=int, default=3)
    ap.add_argument("--faults-per-run", type=int, default=3)
    ap.add_argument("--healthy-runs", type=int, default=3)
    ap.add_argument("--vae-machines", type=int, default=200)
    ap.add_argument("--vae-epochs", type=int, default=10)
    ap.add_argument("--no-vae", action="store_true")
    ap.add_argument("--timing-runs", type=int, default=40, help="seeded runs per timing scenario")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="recall of peer-distance at fault severity 0.5, 0.25, 0.1")
    ap.add_argument("--quick", action="store_true", help="300 machines x 1800 s, 1 run per kind")
    ap.add_argument("--seed", type=int, default=100)
    a = ap.parse_args()
    if a.quick:
        a.machines, a.seconds, a.runs_per_kind, a.healthy_runs, a.vae_machines = 300, 1800, 1, 1, 100
        a.timing_runs = 8
    cfg = dict(
        machines=a.machines,
        seconds=a.seconds,
        runs_per_kind=a.runs_per_kind,
        faults_per_run=a.faults_per_run,
        healthy_runs=a.healthy_runs,
        seed=a.seed,
    )
    out: dict = {"config": cfg, "convention": "TP = faulty machine alerted at/after onset; any other alert is FP"}
    t = time.perf_counter()
    out["peer_distance"] = evaluate(PeerDistance, **cfg)
    if not a.no_baseline:
        out["peer_mad_baseline"] = evaluate(PeerMad, **cfg)
    if a.sweep:
        out["severity_sweep"] = {
            str(sev): {
                k: v["recall"]
                for k, v in evaluate(PeerDistance, **{**cfg, "runs_per_kind": 1, "healthy_runs": 0}, severity=sev)[
                    "per_kind"
                ].items()
            }
            for sev in (0.5, 0.25, 0.1)
        }
    out["timings"] = timings_accuracy(a.timing_runs, a.seed)
    out["speed"] = speed(a.machines, a.seconds, a.seed + 999)
    if not a.no_vae:
        out["lstm_vae_denoiser"] = vae(a.vae_machines, a.seconds, a.seed + 1999, a.vae_epochs)
    out["wall_seconds"] = round(time.perf_counter() - t, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
