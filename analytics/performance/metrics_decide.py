"""From a detector's scores to what the metrics say, precision first (a wrong eviction costs more than a
missed one; the recovery executor acts on these findings).

- A machine is named only when the detector labels it: for :class:`~rankscope.models.PeerChangeDetector`
  a calibrated, physically large, persistent change in its relation to its peers that few other machines
  share.
- When more than a small fraction of the job would be named (``max(2, max_named_fraction x machines)``),
  it is not one machine's fault: if most of them moved one way on a metric and a few moved the other way,
  the few are the suspects (the many are waiting for them); otherwise ``imbalance`` with the reason,
  and nobody is named.
- Changes that many machines shared (a power cap that reached machines at different times, a pipeline
  stage that slowed) name nobody; when they are large the finding is ``imbalance``.
- ``fail-slow`` when the evidence includes throughput (utilisation, clocks, power, byte rates, CPU);
  ``degraded`` when it is only wear and error signals (temperature, retransmits, replay/ECC/Xid).
- ``inconclusive`` when the data cannot support a peer comparison (too few machines, or less data than a
  baseline plus a continuity window).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rankscope.analytics.performance.metrics import MetricAlert, MetricFindings, iso
from rankscope.analytics.performance.metrics_words import calibration, sentence, shared_reasons, waiting
from rankscope.config import PerfConfig
from rankscope.datasets.domain.metrics import MetricCube
from rankscope.models.peer_change import window_blocks

WEAR = re.compile(
    r"TEMP|temperature|REPLAY|_ECC_|XID|RETIRED|REMAP|_ERROR|errors?|VIOLATION|Retrans|retrans|_drop|crc", re.IGNORECASE
)


def inconclusive(why: str, n: int, notes: list[str], cfg: PerfConfig) -> MetricFindings:
    return MetricFindings("inconclusive", (), (), (why,), 0.0, n, tuple(notes), cfg.detector)


@dataclass(frozen=True)
class _Job:
    """What every finding of one job carries besides its kind: machines, notes, detector, threshold, details."""

    n: int
    notes: tuple[str, ...]
    detector: str
    threshold: float
    details: dict[str, Any]

    def out(
        self,
        kind: str,
        reasons: Sequence[str],
        confidence: float,
        named: Sequence[str] = (),
        alerts: Sequence[MetricAlert] = (),
        details: dict[str, Any] | None = None,
    ) -> MetricFindings:
        return MetricFindings(
            kind,
            tuple(named),
            tuple(alerts),
            tuple(reasons),
            confidence,
            self.n,
            self.notes,
            self.detector,
            self.threshold,
            {**self.details, **(details or {})},
        )


def _peer_change(cube: MetricCube, cfg: PerfConfig) -> Any:
    from rankscope.models.peer_change import PeerChangeDetector

    det = PeerChangeDetector(
        continuity_s=cfg.continuity_seconds,
        baseline_s=cfg.baseline_seconds,
        min_baseline_s=cfg.min_baseline_seconds,
        false_alarms_per_1000_machine_hours=cfg.false_alarms_per_1000_machine_hours,
        n_jobs=-1,
    )
    return det.fit(cube)


def _evidence(det: Any, i: int, cube: MetricCube) -> list[dict[str, Any]]:
    """The tests over the threshold that may name machine ``i`` (strongest first)."""
    kinds = cube.kinds()
    out = []
    for e in det.evidence(i, len(det.tests_)):
        if e["over_threshold"]:
            e.update(threshold=det.threshold_, quorum=det.quorum, kind=kinds.get(e["feature"], "gauge"))
            out.append(e)
    return out


def _rounded(e: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in e.items():
        out[k] = (round(v, 3) if math.isfinite(v) else None) if isinstance(v, float) else v
    if out.get("onset_s") is not None:
        out["onset"] = iso(e["onset_s"])
    return out


def _top_machines(det: Any, cube: MetricCube) -> list[dict[str, Any]]:
    scores = det.decision_scores_
    top = [int(i) for i in np.argsort(-scores)[:5]]
    best_eligible = int(np.argmax(det.eligible_scores_))
    if best_eligible not in top:
        top.append(best_eligible)
    return [
        {
            "machine": cube.machines[i],
            "score": round(float(scores[i]), 2),
            "eligible_score": round(float(det.eligible_scores_[i]), 2)
            if np.isfinite(det.eligible_scores_[i])
            else None,
            "evidence": [_rounded(e) for e in det.evidence(i, 3)],
        }
        for i in top
    ]


def _waiters(det: Any, cube: MetricCube, flagged: list[int], max_named: int) -> tuple[list[int] | None, str]:
    """Many machines flagged: the few that moved against the many are the suspects (the many wait for
    them); None when no such few exist, with the reason."""
    n = len(cube.machines)
    by_test: dict[tuple[str, str], list[int]] = {}
    for i in flagged:
        ev = _evidence(det, i, cube)
        if ev:
            by_test.setdefault((ev[0]["feature"], ev[0]["direction"]), []).append(i)
    (feat, d), many = max(by_test.items(), key=lambda kv: len(kv[1])) if by_test else (("?", "?"), flagged)
    opposite = "down" if d == "up" else "up"
    few = by_test.get((feat, opposite), [])
    if len(many) > max_named and 0 < len(few) <= max_named:
        return (
            few,
            f"{len(many)} machines' {feat} moved {d} together: they are waiting; {len(few)} moved {opposite}, "
            "against them",
        )
    return None, (
        f"{len(flagged)} of {n} machines ({len(flagged) / n:.0%}) changed relative to their peers, more than the "
        f"{max_named} a machine fault explains (mostly {feat} {d}): an imbalance or a job-wide change, no machine "
        "is named"
    )


def _named(det: Any, cube: MetricCube, flagged: list[int], reasons: list[str], cfg: PerfConfig) -> MetricFindings:
    """The machines to isolate, with their evidence in words and as alerts."""
    n = len(cube.machines)
    window = window_blocks(det.continuity_s, cube.block_s, det.quorum) * cube.block_s
    evidence = {cube.machines[i]: _evidence(det, i, cube) for i in flagged}
    alerts = []
    wear_only = True
    for i in flagged:
        m = cube.machines[i]
        evs = evidence[m]
        reasons += [sentence(m, e, window) for e in evs[:3]]
        wear_only &= all(bool(WEAR.search(e["feature"])) for e in evs[:3])
        gpu = next((e["gpu"] for e in evs if e.get("gpu") is not None), None)
        onsets = [e["onset_s"] for e in evs if e["onset_s"] is not None]
        alerts.append(
            MetricAlert(
                f"{m}/gpu{gpu}" if gpu is not None else m,
                m,
                float(det.decision_scores_[i]),
                min(onsets) if onsets else None,
                min(onsets) + window if onsets else None,
                tuple(dict.fromkeys(e["feature"] for e in evs)),
                "gpu" if gpu is not None else "node",
            )
        )
    onset = min((a.onset_s for a in alerts if a.onset_s is not None), default=None)
    reasons += waiting(cube, onset, set(flagged))
    worst = min(float(det.decision_scores_[i]) for i in flagged)
    p_test = -math.expm1(-math.exp(-worst))  # 1 - expected machines this strong by chance in this job
    conf = float(np.clip(1.0 - p_test * len(det.tests_) * n, 0.5, 0.99))
    if wear_only:
        reasons.append("the evidence is wear or error signals only (no throughput metric moved): degraded")
    details = {"onset": iso(onset), "evidence": {m: [_rounded(e) for e in evs] for m, evs in evidence.items()}}
    named = tuple(cube.machines[i] for i in flagged)
    kind = "degraded" if wear_only else "fail-slow"
    return MetricFindings(kind, named, tuple(alerts), tuple(reasons), round(conf, 3), n, details=details)


def decide_peer_change(cube: MetricCube, cfg: PerfConfig, notes: list[str], *, det: Any = None) -> MetricFindings:
    """The peer-change detector fitted on ``cube`` (or ``det``, already fitted on it) and its findings
    (module docstring)."""
    det = det if det is not None else _peer_change(cube, cfg)
    n = len(cube.machines)
    scores = det.decision_scores_
    flagged = sorted((int(i) for i in np.flatnonzero(det.labels_)), key=lambda i: -scores[i])
    max_named = max(2, int(math.floor(cfg.max_named_fraction * n)))
    details: dict[str, Any] = {
        "calibration": calibration(det, cube),
        "block_s": cube.block_s,
        "continuity_s": det.continuity_s,
        "baseline_s": det.baseline_s,
        "sample_interval_s": dict(cube.sample_interval_s),
        "top_machines": _top_machines(det, cube),
    }
    job = _Job(n, tuple(notes), "peer-change", float(det.threshold_), details)
    reasons: list[str] = []
    if len(flagged) > max_named:
        few, why = _waiters(det, cube, flagged, max_named)
        reasons.append(why)
        if few is None:
            return job.out("imbalance", reasons + shared_reasons(det, cube), 0.6)
        flagged = few
    if flagged:
        f = _named(det, cube, flagged, reasons, cfg)
        return job.out(f.kind, f.reasons, f.confidence, f.named, f.alerts, f.details)
    shared = shared_reasons(det, cube)
    if shared:
        return job.out("imbalance", [*shared, "no machine is named"], 0.6)
    best = int(np.argmax(scores))
    why = (
        f"no machine's relation to its peers changed persistently (threshold {det.threshold_:.1f} at "
        f"{det.false_alarms_per_1000_machine_hours:g} false machine per 1,000 machine-hours; best score "
        f"{float(scores[best]):.1f} on {cube.machines[best]})"
    )
    return job.out("healthy", [why, *_small_changes(det, cube)], 0.8)


def _small_changes(det: Any, cube: MetricCube) -> list[str]:
    """Machines whose raw score passed the threshold on a change too small or too shared to name anyone: said,
    not hidden behind the capped score (the margin the effect floor, not the calibration, kept)."""
    raw = getattr(det, "test_scores_", None)
    if raw is None or not raw.size:
        return []
    top = np.where(np.isfinite(raw), raw, -np.inf).max(axis=1)
    over = np.flatnonzero(top > det.threshold_)
    if not over.size:
        return []
    worst = int(over[np.argmax(top[over])])
    return [
        f"{over.size} machine(s) passed the threshold on changes smaller than {det.min_effect:g} peer MADs or "
        f"{det.min_relative_effect:.0%} of the metric's level, or shared by {det.max_shared_fraction:.0%} of the "
        f"machines or more, which never name a machine (largest raw score {float(top[worst]):.1f} on "
        f"{cube.machines[worst]})"
    ]


def decide_alerts(cube: MetricCube, cfg: PerfConfig, notes: list[str]) -> MetricFindings:
    """A detector other than peer-change (``detect --detector``): its alerts on each level's blocks, the
    same rule on how many machines a fault can explain."""
    from rankscope.analytics.performance.metrics_windowed import level_alerts

    alerts, threshold, n_units = level_alerts(cube, cfg)
    n = len(cube.machines)
    best: dict[str, MetricAlert] = {}
    for a in sorted(alerts, key=lambda a: -a.score):
        best.setdefault(a.node, a)
    max_named = max(2, int(math.floor(cfg.max_named_fraction * n)))
    job = _Job(n, tuple(notes), cfg.detector, threshold, {"block_s": cube.block_s, "threshold": threshold})
    if len(best) > max_named:
        why = (
            f"{len(best)} of {n} machines alert under {cfg.detector}, more than the {max_named} a machine fault "
            "explains: an imbalance or a job-wide change, no machine is named"
        )
        return job.out("imbalance", [why], 0.6, alerts=alerts)
    if not best:
        return job.out(
            "healthy", [f"no machine behaves unlike its peers under {cfg.detector} (threshold {threshold:g})"], 0.8
        )
    reasons = [
        f"{a.unit} has behaved unlike its peers since {iso(a.onset_s)} (score {a.score:.1f}, threshold "
        f"{threshold:g} of detector {cfg.detector}), driven by {', '.join(a.drivers)}"
        for a in best.values()
    ]
    top = max(a.score for a in best.values())
    named = tuple(m for m, a in best.items() if a.score >= 0.5 * top)
    wear = all(all(WEAR.search(d) for d in best[m].drivers) for m in named)
    return job.out("degraded" if wear else "fail-slow", reasons, 0.6 if wear else 0.7, named, alerts)
