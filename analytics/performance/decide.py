"""Metrics and timings as evidence: facts in (:func:`facts`), a verdict out (:func:`verdict`).

Facts: metrics (a :class:`~rankscope.datasets.domain.metrics.MetricSet` of files in any supported format,
or a long-form frame) read into a cube and decided by the peer-change detector (:mod:`.metrics`,
:mod:`.metrics_decide`), and per-rank timings (``rank, step, op, duration_s[, start_s, node, tp, pp,
dp]``) against symmetric peers (:mod:`.stragglers`). Then small pure classifiers decide: slow ranks
(``fail-slow``, with the metric findings that agree), else machines the metrics name (``degraded`` for
wear, or when the timings show training is not slowed; ``fail-slow`` otherwise), else an ``imbalance``
no machine is blamed for (from either source), else ``inconclusive`` or ``healthy``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from rankscope.analytics.performance.metrics import (
    MetricAlert,
    MetricFindings,
    detect_metric_outliers,
    is_health_only,
    iso,
)
from rankscope.analytics.performance.stragglers import StragglerReport, find_stragglers
from rankscope.analytics.verdict import Evidence, Severity, Verdict, merge_nodes
from rankscope.config import PerfConfig
from rankscope.datasets.domain.metrics import MetricSet
from rankscope.datasets.domain.topology import Topology


@dataclass(frozen=True)
class PerfFacts:
    """What the metrics and timings say, before a decision."""

    findings: MetricFindings | None  # None without metrics
    report: StragglerReport | None  # None without timings
    sources: tuple[str, ...]
    config: PerfConfig


def facts(
    metrics: MetricSet | pl.DataFrame | None,
    timings: pl.DataFrame | None,
    topology: Topology | None,
    *,
    config: PerfConfig | None = None,
) -> PerfFacts | None:
    """Metric findings and timing stragglers; None when there are neither metrics nor timings. Metrics of
    machines outside the job (``topology``) are left out when some metric machines are job machines."""
    cfg = config or PerfConfig()
    have_metrics = metrics is not None and (not metrics.empty if isinstance(metrics, MetricSet) else metrics.height > 0)
    have_timings = timings is not None and timings.height > 0
    if not have_metrics and not have_timings:
        return None
    findings = (
        detect_metric_outliers(metrics, config=cfg, topology=topology) if metrics is not None and have_metrics else None
    )
    report = find_stragglers(timings, topology, config=cfg.stragglers) if timings is not None and have_timings else None
    sources = tuple(s for s, ok in (("metrics", have_metrics), ("timings", have_timings)) if ok)
    return PerfFacts(findings, report, sources, cfg)


@dataclass
class _Words:
    """Evidence and words gathered from the facts, shared by the classifiers."""

    evidence: list[Evidence] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    metric_reasons: list[str] = field(default_factory=list)
    timing_reasons: list[str] = field(default_factory=list)
    metric_nodes: dict[str, MetricAlert] = field(default_factory=dict)  # strongest alert per node
    drivers: dict[str, list[str]] = field(default_factory=dict)
    onset: dict[str, str] = field(default_factory=dict)
    step_onset: dict[str, int] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


def _metric_words(f: PerfFacts, w: _Words) -> None:
    fd = f.findings
    if fd is None:
        w.details["metric_alerts"] = []
        return
    for a in fd.alerts:
        if a.node not in fd.named:
            continue
        w.metric_nodes.setdefault(a.node, a)
        w.drivers.setdefault(a.node, [])
        w.drivers[a.node] += [d for d in a.drivers if d not in w.drivers[a.node]]
        if a.onset_s is not None:
            w.onset[a.node] = min(w.onset.get(a.node) or iso(a.onset_s) or "", iso(a.onset_s) or "")
        w.evidence.append(
            Evidence(
                "metrics",
                "peer-change" if fd.detector == "peer-change" else "peer-outlier",
                f"{a.unit} changed relative to its peers from {iso(a.onset_s)} (score {a.score:.1f} over "
                f"threshold {fd.threshold:.1f}; driven by {', '.join(a.drivers)})",
                nodes=(a.node,),
                weight=min(1.0, max(a.score, 0.0) / 50),
            )
        )
    w.metric_reasons += list(fd.reasons)
    w.details["metric_alerts"] = [a.to_dict() for a in fd.alerts if a.node in fd.named]
    w.details["metrics"] = {"verdict": fd.kind, "detector": fd.detector, "named": list(fd.named), **fd.details}


def _timing_words(report: StragglerReport, w: _Words) -> None:
    for s in report.slow_ranks:
        w.drivers.setdefault(s.node, [])
        w.drivers[s.node] += [f"op:{o}" for o in s.ops if f"op:{o}" not in w.drivers[s.node]]
        w.step_onset[s.node] = min(w.step_onset.get(s.node, s.onset_step), s.onset_step)
        w.evidence.append(
            Evidence(
                "timings",
                "slow-rank",
                f"rank {s.rank} {s.ratio:.2f}x slower than its peers from step {s.onset_step} in {', '.join(s.ops)}",
                ranks=(s.rank,),
                nodes=(s.node,),
                weight=min(1.0, (s.ratio - 1) * 2),
            )
        )
    for node in report.slow_nodes[:5]:
        worst = max((s for s in report.slow_ranks if s.node == node), key=lambda s: s.ratio)
        n_r = sum(1 for s in report.slow_ranks if s.node == node)
        w.timing_reasons.append(
            f"{node}: {n_r} rank(s) up to {worst.ratio:.2f}x slower than their symmetric peers "
            f"({report.peer_kind}) from step {w.step_onset[node]}, in {', '.join(worst.ops)}"
        )
    for imb in report.imbalances:
        w.evidence.append(Evidence("timings", f"{imb.kind}-imbalance", imb.reason, weight=0.5))


def _words(f: PerfFacts) -> _Words:
    w = _Words(notes=(list(f.findings.notes) if f.findings else []) + (list(f.report.notes) if f.report else []))
    _metric_words(f, w)
    if f.report is not None:
        _timing_words(f.report, w)
    w.details = {
        "drivers": w.drivers,
        "onset": None,
        "onset_by_node": w.onset,
        "onset_step": w.step_onset,
        "metric_alerts": w.details["metric_alerts"],
        **({"metrics": w.details["metrics"]} if "metrics" in w.details else {}),
        "timings": f.report.to_dict() if f.report is not None else None,
    }
    return w


def verdict(f: PerfFacts, topology: Topology | None = None, *, job: str = "") -> Verdict:
    """The first classifier that applies decides (see the module docstring)."""
    w = _words(f)
    for rule in (_slow_ranks, _metric_outliers, _imbalance):
        found = rule(f, w, job)
        if found is not None:
            return found
    return _quiet(f, w, job)


def _world(f: PerfFacts) -> int:
    return f.report.n_ranks if f.report else 0


def _slow_ranks(f: PerfFacts, w: _Words, job: str) -> Verdict | None:
    report = f.report
    if report is None or not report.slow_nodes:
        return None
    slow_nodes = report.slow_nodes
    both = tuple(n for n in slow_nodes if n in w.metric_nodes)
    suspects = merge_nodes(slow_nodes, tuple(w.metric_nodes))
    culprits = both or slow_nodes[:1] + tuple(n for n in slow_nodes[1:] if _close(report, n, slow_nodes[0]))
    first_step = min(w.step_onset[n] for n in culprits)
    secs = [s.onset_s for s in report.slow_ranks if s.node in culprits and s.onset_s is not None]
    w.details["onset"] = (
        min(w.onset[n] for n in culprits if n in w.onset)
        if any(n in w.onset for n in culprits)
        else f"step {first_step}" + (f" (t={min(secs):g} s)" if secs else "")
    )
    reasons = (
        ([f"timings and metrics agree on {', '.join(both)}"] if both else [])
        + w.timing_reasons
        + w.metric_reasons
        + w.notes
    )
    return Verdict(
        Severity.FAIL_SLOW,
        job=job,
        confidence=0.9 if both else 0.75,
        suspect_nodes=suspects,
        culprit_nodes=culprits,
        suspect_ranks=tuple(sorted(s.rank for s in report.slow_ranks)),
        culprit_ranks=tuple(s.rank for s in report.slow_ranks if s.node in culprits),
        reasons=tuple(reasons),
        evidence=tuple(w.evidence),
        sources=f.sources,
        world_size=_world(f),
        details=w.details,
    )


def _metric_outliers(f: PerfFacts, w: _Words, job: str) -> Verdict | None:
    fd = f.findings
    if fd is None or not fd.named:
        return None
    reasons = w.metric_reasons + w.notes
    suspects = fd.named
    health = fd.kind == "degraded" or all(
        is_health_only(w.metric_nodes[n].drivers) for n in suspects if n in w.metric_nodes
    )
    onsets = [w.onset[n] for n in suspects if n in w.onset]
    w.details["onset"] = min(onsets) if onsets else None
    if f.report is not None:
        reasons += [i.reason for i in f.report.imbalances]
        reasons.append("the timings show no straggler: the change has not (yet) slowed training")
    kind = Severity.DEGRADED if health or f.report is not None else Severity.FAIL_SLOW
    return Verdict(
        kind,
        job=job,
        confidence=fd.confidence if not health else min(fd.confidence, 0.8),
        suspect_nodes=suspects,
        culprit_nodes=suspects,
        reasons=tuple(reasons),
        evidence=tuple(w.evidence),
        sources=f.sources,
        world_size=_world(f),
        details=w.details,
    )


def _imbalance(f: PerfFacts, w: _Words, job: str) -> Verdict | None:
    timing = [i.reason for i in f.report.imbalances] if f.report is not None else []
    metric = f.findings is not None and f.findings.kind == "imbalance"
    if not timing and not metric:
        return None
    reasons = w.metric_reasons + w.notes + timing + ["no machine is blamed"]
    return Verdict(
        Severity.IMBALANCE,
        job=job,
        confidence=0.7 if timing else 0.6,
        reasons=tuple(dict.fromkeys(reasons)),
        evidence=tuple(w.evidence),
        sources=f.sources,
        world_size=_world(f),
        details=w.details,
    )


def _quiet(f: PerfFacts, w: _Words, job: str) -> Verdict:
    reasons = w.metric_reasons + w.notes
    if f.report is None and f.findings is not None and f.findings.kind == "inconclusive":
        return Verdict(
            Severity.INCONCLUSIVE,
            job=job,
            confidence=0.0,
            reasons=tuple(reasons) or ("no usable metrics",),
            sources=f.sources,
            details=w.details,
        )
    if f.report is not None:
        reasons.append("no rank is slower than its peers")
    return Verdict(
        Severity.HEALTHY,
        job=job,
        confidence=0.8,
        reasons=tuple(reasons),
        evidence=tuple(w.evidence),
        sources=f.sources,
        world_size=_world(f),
        details=w.details,
    )


def _close(report: StragglerReport, node: str, top: str) -> bool:
    """True when ``node`` is about as slow as the slowest node (independent stragglers are all culprits)."""
    best = {s.node: s.ratio for s in sorted(report.slow_ranks, key=lambda s: s.ratio)}
    return best.get(node, 0) - 1 >= 0.5 * (best.get(top, 0) - 1)
