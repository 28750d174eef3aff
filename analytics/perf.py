"""Performance diagnosis: metric outliers among peers and timing stragglers, folded into one Verdict.

The entry point :func:`diagnose_perf` takes long-form metrics (``ts, node, metric, value[, gpu]``) and
per-rank timings (``rank, step, op, duration_s[, start_s, node, tp, pp, dp]``) as frames, never files.
Metrics become a cube per level (one row per GPU for GPU metrics, per node for node metrics; counters
``*_total`` become rates) scored by the Minder-style :class:`~rankscope.models.PeerDistance`; timings
go through :func:`~rankscope.analytics.stragglers.find_stragglers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
import polars as pl
from rankscope.analytics.stragglers import (
    StragglerConfig,
    StragglerReport,
    find_stragglers,
)
from rankscope.analytics.verdict import Evidence, Verdict, merge_nodes
from rankscope.datasets.domain.topology import Topology
from rankscope.models.peer_distance import PeerDistance
from rankscope.spine import InputError

SELF_PREFIX = "rankscope_"
"""The agent's own health metrics: they describe the monitor, not the machine, and are not compared."""

HEALTH_WORDS = ("ecc", "remap", "retired", "xid", "temperature", "errors", "error")
"""Metrics that say a part is wearing out rather than that training is slower: ``degraded``."""


@dataclass(frozen=True, kw_only=True)
class PerfConfig:
    """Knobs of the performance diagnosis; defaults follow Minder (4-minute continuity) and NVRx."""

    window_seconds: float = 10.0
    continuity_seconds: float = 240.0
    threshold: float = 12.0
    rate_window_seconds: float = 120.0
    counter_allowance: float = 2.0
    min_machines: int = 3
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)

    def __post_init__(self) -> None:
        for name in ("window_seconds", "continuity_seconds", "threshold", "rate_window_seconds"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v <= 0:
                raise InputError(f"{name}={v!r} must be a positive number")
        if self.counter_allowance < 0:
            raise InputError(f"counter_allowance={self.counter_allowance!r} must be >= 0")
        if self.min_machines < 3:
            raise InputError(f"min_machines={self.min_machines!r} must be at least 3")


@dataclass(frozen=True, eq=False)
class MetricCube:
    """Metrics of one level on a regular grid: ``values`` is ``(n_units, n_times, n_metrics)``."""

    values: np.ndarray
    units: tuple[str, ...]  # "node" or "node/gpu<i>"
    unit_nodes: tuple[str, ...]
    metrics: tuple[str, ...]
    t0_s: float
    interval_s: float
    level: str  # gpu | node


@dataclass(frozen=True)
class MetricAlert:
    """One unit behaving unlike its peers: score, onset and alert time (epoch seconds), driving metrics."""

    unit: str
    node: str
    score: float
    onset_s: float
    alert_s: float
    drivers: tuple[str, ...]
    level: str

    def to_dict(self) -> dict[str, Any]:
        return {"unit": self.unit, "node": self.node, "score": round(self.score, 2), "onset": _iso(self.onset_s),
                "alert": _iso(self.alert_s), "drivers": list(self.drivers), "level": self.level}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="seconds")


# -- metrics ------------------------------------------------------------------------------------

def _seconds(ts: pl.Series) -> np.ndarray:
    if ts.dtype.is_temporal():
        return ts.dt.epoch("us").cast(pl.Float64).to_numpy() / 1e6
    try:
        return ts.cast(pl.Float64).to_numpy()
    except pl.exceptions.PolarsError:
        raise InputError(f"metrics: column 'ts' must be a timestamp or seconds, not {ts.dtype}") from None


def metric_cubes(metrics: pl.DataFrame, *, rate_window_seconds: float = 120.0,
                 counter_allowance: float = 2.0) -> list[MetricCube]:
    """Long-form metrics as one cube per level (GPU rows, node rows), counters turned into rates."""
    missing = [c for c in ("ts", "node", "metric", "value") if c not in metrics.columns]
    if missing:
        raise InputError(f"metrics: missing column(s) {missing}; required: ts, node, metric, value")
    df = metrics.select(
        pl.col("node").cast(pl.Utf8), pl.col("metric").cast(pl.Utf8),
        pl.col("value").cast(pl.Float64, strict=False),
        (pl.col("gpu").cast(pl.Int64, strict=False) if "gpu" in metrics.columns else pl.lit(None, pl.Int64)).alias("gpu"),
    ).with_columns(pl.Series("t", _seconds(metrics["ts"])))
    df = df.filter(pl.col("value").is_finite() & pl.col("node").is_not_null() & pl.col("t").is_not_null()
                   & ~pl.col("metric").str.starts_with(SELF_PREFIX))
    if df.height == 0:
        return []
    # the sampling interval of each node (nodes sample at different offsets), then the typical one
    per_node = df.group_by("node").agg(pl.col("t").unique().sort().diff().median().alias("dt"))
    dts = per_node["dt"].drop_nulls().to_numpy()
    interval = max(float(np.median(dts)) if dts.size else 1.0, 1e-3)
    t0 = float(df["t"].min())
    gpu_metrics = set(df.filter(pl.col("gpu").is_not_null())["metric"].unique().to_list())
    cubes = []
    for level in ("gpu", "node"):
        part = df.filter(pl.col("metric").is_in(sorted(gpu_metrics)) == (level == "gpu"))
        if part.height == 0:
            continue
        unit = (pl.col("node") + "/gpu" + pl.col("gpu").fill_null(-1).cast(pl.Utf8)) if level == "gpu" else pl.col("node")
        part = part.with_columns(unit.alias("unit"), ((pl.col("t") - t0) / interval).round().cast(pl.Int64).alias("bin"))
        part = part.group_by("unit", "node", "metric", "bin").agg(pl.col("value").mean())
        units = part.select("unit", "node").unique().sort("unit")
        names = tuple(sorted(part["metric"].unique().to_list()))
        n_t = int(part["bin"].max()) + 1
        ui = {u: i for i, u in enumerate(units["unit"].to_list())}
        mi = {m: i for i, m in enumerate(names)}
        cube = np.full((len(ui), n_t, len(names)), np.nan, dtype=np.float32)
        cube[np.fromiter((ui[u] for u in part["unit"].to_list()), np.int64, part.height), part["bin"].to_numpy(),
             np.fromiter((mi[m] for m in part["metric"].to_list()), np.int64, part.height)] = part["value"].to_numpy()
        cube = _ffill(cube)
        cube = counters_to_rates(cube, names, interval_s=interval, rate_window_s=rate_window_seconds,
                                 allowance=counter_allowance)
        cubes.append(MetricCube(cube, tuple(units["unit"].to_list()), tuple(units["node"].to_list()), names, t0,
                                interval, level))
    return cubes


def _ffill(cube: np.ndarray) -> np.ndarray:
    """Carry each unit's last sample forward over gaps (leading gaps stay NaN: the detector fills them)."""
    mask = np.isnan(cube)
    if not mask.any():
        return cube
    idx = np.where(~mask, np.arange(cube.shape[1])[None, :, None], 0)
    np.maximum.accumulate(idx, axis=1, out=idx)
    return np.take_along_axis(cube, idx, axis=1)


def counters_to_rates(values: np.ndarray, names: tuple[str, ...] | list[str], *, interval_s: float,
                      rate_window_s: float, allowance: float = 0.0) -> np.ndarray:
    """Prometheus-style ``rate(x[window])`` for every ``*_total`` metric; a counter reset counts as 0.

    ``allowance`` events per window are forgiven (``max(0, increase - allowance) / window``): a couple of
    corrected ECC errors is normal wear, a counter that keeps growing is not.
    """
    out = values
    lag = max(1, int(round(rate_window_s / interval_s)))
    for j, name in enumerate(names):
        if not name.endswith("_total"):
            continue
        if out is values:
            out = values.copy()
        c = values[:, :, j]
        inc = np.clip(np.diff(c, axis=1, prepend=c[:, :1]), 0, None)
        inc = np.nan_to_num(inc)
        cs = np.cumsum(inc, axis=1)
        r = np.empty_like(cs)
        r[:, :lag] = cs[:, :lag]
        r[:, lag:] = cs[:, lag:] - cs[:, :-lag]
        r = np.clip(r - allowance, 0, None) / (lag * interval_s)
        out[:, :, j] = r
    return out


@dataclass(frozen=True)
class MetricFindings:
    """Alerts (strongest first), how many units were compared, and why some data could not be used."""

    alerts: tuple[MetricAlert, ...]
    n_units: int
    notes: tuple[str, ...]


def detect_metric_outliers(metrics: pl.DataFrame, *, config: PerfConfig | None = None) -> MetricFindings:
    """Units whose metrics stay unlike their peers' for the continuity window."""
    cfg = config or PerfConfig()
    alerts: list[MetricAlert] = []
    notes: list[str] = []
    n_units = 0
    for cube in metric_cubes(metrics, rate_window_seconds=cfg.rate_window_seconds,
                             counter_allowance=cfg.counter_allowance):
        n, t = cube.values.shape[:2]
        if n < cfg.min_machines:
            notes.append(f"{cube.level} metrics: only {n} {cube.level}(s), peer comparison needs {cfg.min_machines}")
            continue
        if t * cube.interval_s < max(cfg.window_seconds, cube.interval_s):
            notes.append(f"{cube.level} metrics: {t * cube.interval_s:g} s of data, shorter than one "
                         f"{cfg.window_seconds:g} s window")
            continue
        n_units += n
        det = PeerDistance(window_s=max(cfg.window_seconds, cube.interval_s), continuity_s=cfg.continuity_seconds,
                           sample_interval_s=cube.interval_s, threshold=cfg.threshold)
        found = det.fit(cube.values).detect(cube.values)
        for i in found.alerted:
            alerts.append(MetricAlert(
                cube.units[i], cube.unit_nodes[i], float(found.scores[i]),
                cube.t0_s + found.onset_index[i] * cube.interval_s, cube.t0_s + found.alert_index[i] * cube.interval_s,
                tuple(cube.metrics[j] for j in found.drivers(int(i))), cube.level))
    return MetricFindings(tuple(sorted(alerts, key=lambda a: -a.score)), n_units, tuple(notes))


# -- the verdict --------------------------------------------------------------------------------

def _is_health_only(drivers: tuple[str, ...]) -> bool:
    """True when the strongest driver is a wear metric (ECC, temperature, ...), not a throughput one."""
    return bool(drivers) and any(w in drivers[0] for w in HEALTH_WORDS)


def diagnose_perf(
    metrics: pl.DataFrame | None,
    timings: pl.DataFrame | None,
    topology: Topology | None,
    *,
    job: str = "",
    config: PerfConfig | None = None,
) -> Verdict | None:
    """``fail-slow``/``degraded`` with suspect and culprit nodes, or ``imbalance``/``healthy``; None if no input."""
    cfg = config or PerfConfig()
    have_metrics = metrics is not None and metrics.height > 0
    have_timings = timings is not None and timings.height > 0
    if not have_metrics and not have_timings:
        return None
    findings = detect_metric_outliers(metrics, config=cfg) if have_metrics else None  # type: ignore[arg-type]
    alerts = list(findings.alerts) if findings else []
    report: StragglerReport | None = (
        find_stragglers(timings, topology, config=cfg.stragglers) if have_timings else None  # type: ignore[arg-type]
    )
    sources = tuple(s for s, ok in (("metrics", have_metrics), ("timings", have_timings)) if ok)
    evidence: list[Evidence] = []
    reasons: list[str] = (list(findings.notes) if findings else []) + (list(report.notes) if report else [])
    drivers: dict[str, list[str]] = {}
    onset: dict[str, Any] = {}

    metric_nodes: dict[str, MetricAlert] = {}
    for a in alerts:
        metric_nodes.setdefault(a.node, a)
        drivers.setdefault(a.node, [])
        drivers[a.node] += [d for d in a.drivers if d not in drivers[a.node]]
        onset[a.node] = min(onset.get(a.node, _iso(a.onset_s)), _iso(a.onset_s))
        evidence.append(Evidence("metrics", "peer-outlier",
                                 f"{a.unit} unlike its {a.level} peers since {_iso(a.onset_s)} (score {a.score:.1f}; "
                                 f"driven by {', '.join(a.drivers)})", nodes=(a.node,), weight=min(1.0, a.score / 50)))
    metric_reasons: list[str] = []
    for a in list(metric_nodes.values())[:5]:
        metric_reasons.append(f"{a.unit} has behaved unlike its peers since {_iso(a.onset_s)} (score {a.score:.1f}, "
                       f"threshold {cfg.threshold:g}), driven by {', '.join(a.drivers)}")

    slow_nodes: tuple[str, ...] = ()
    slow_ranks: tuple[int, ...] = ()
    step_onset: dict[str, int] = {}
    if report is not None:
        slow_nodes = report.slow_nodes
        slow_ranks = tuple(sorted(s.rank for s in report.slow_ranks))
        for s in report.slow_ranks:
            drivers.setdefault(s.node, [])
            drivers[s.node] += [f"op:{o}" for o in s.ops if f"op:{o}" not in drivers[s.node]]
            step_onset[s.node] = min(step_onset.get(s.node, s.onset_step), s.onset_step)
            evidence.append(Evidence("timings", "slow-rank",
                                     f"rank {s.rank} {s.ratio:.2f}x slower than its peers from step {s.onset_step} "
                                     f"in {', '.join(s.ops)}", ranks=(s.rank,), nodes=(s.node,),
                                     weight=min(1.0, (s.ratio - 1) * 2)))
    timing_reasons: list[str] = []
    if report is not None:
        for node in slow_nodes[:5]:
            worst = max((s for s in report.slow_ranks if s.node == node), key=lambda s: s.ratio)
            n_r = sum(1 for s in report.slow_ranks if s.node == node)
            timing_reasons.append(f"{node}: {n_r} rank(s) up to {worst.ratio:.2f}x slower than their symmetric peers "
                                  f"({report.peer_kind}) from step {step_onset[node]}, in {', '.join(worst.ops)}")
        for imb in report.imbalances:
            evidence.append(Evidence("timings", f"{imb.kind}-imbalance", imb.reason, weight=0.5))

    details: dict[str, Any] = {"drivers": drivers, "onset": None, "onset_by_node": onset, "onset_step": step_onset,
                               "metric_alerts": [a.to_dict() for a in alerts],
                               "timings": report.to_dict() if report is not None else None}
    if slow_nodes:
        both = tuple(n for n in slow_nodes if n in metric_nodes)
        suspects = merge_nodes(slow_nodes, tuple(metric_nodes))
        culprits = both or slow_nodes[:1] + tuple(n for n in slow_nodes[1:] if _close(report, n, slow_nodes[0]))
        first_step = min(step_onset[n] for n in culprits)
        secs = [s.onset_s for s in report.slow_ranks if s.node in culprits and s.onset_s is not None]  # type: ignore[union-attr]
        details["onset"] = (min(onset[n] for n in culprits if n in onset) if any(n in onset for n in culprits)
                            else f"step {first_step}" + (f" (t={min(secs):g} s)" if secs else ""))
        reasons = ([f"timings and metrics agree on {', '.join(both)}"] if both else []) + timing_reasons \
            + metric_reasons + reasons
        return Verdict("fail-slow", job=job, confidence=0.9 if both else 0.75, suspect_nodes=suspects,
                       culprit_nodes=culprits, suspect_ranks=slow_ranks,
                       culprit_ranks=tuple(s.rank for s in report.slow_ranks if s.node in culprits),  # type: ignore[union-attr]
                       reasons=tuple(reasons), evidence=tuple(evidence), sources=sources,
                       world_size=report.n_ranks if report else 0, details=details)
    reasons = metric_reasons + reasons
    if metric_nodes:
        suspects = tuple(metric_nodes)
        top = metric_nodes[suspects[0]].score
        culprits = tuple(n for n in suspects if metric_nodes[n].score >= 0.5 * top)
        health = all(_is_health_only(metric_nodes[n].drivers) for n in culprits)
        details["onset"] = min(onset[n] for n in culprits)
        if report is not None and report.imbalances:
            reasons += [i.reason for i in report.imbalances]
        if report is not None:
            reasons.append("the timings show no straggler: the outlier has not (yet) slowed training")
        return Verdict("degraded" if health or report is not None else "fail-slow", job=job,
                       confidence=0.7 if not health else 0.6, suspect_nodes=suspects, culprit_nodes=culprits,
                       reasons=tuple(reasons), evidence=tuple(evidence), sources=sources,
                       world_size=report.n_ranks if report else 0, details=details)
    if report is not None and report.imbalances:
        reasons += [i.reason for i in report.imbalances]
        reasons.append("no machine is blamed")
        return Verdict("imbalance", job=job, confidence=0.7, reasons=tuple(reasons), evidence=tuple(evidence),
                       sources=sources, world_size=report.n_ranks, details=details)
    if report is None and findings is not None and findings.n_units == 0:
        return Verdict("inconclusive", job=job, confidence=0.0, reasons=tuple(reasons) or ("no usable metrics",),
                       sources=sources, details=details)
    reasons.append("no machine behaves unlike its peers" + (" and no rank is slower than its peers" if report else ""))
    return Verdict("healthy", job=job, confidence=0.8, reasons=tuple(reasons), evidence=tuple(evidence),
                   sources=sources, world_size=report.n_ranks if report else 0, details=details)


def _close(report: StragglerReport | None, node: str, top: str) -> bool:
    """True when ``node`` is about as slow as the slowest node (independent stragglers are all culprits)."""
    if report is None:
        return False
    best = {s.node: s.ratio for s in sorted(report.slow_ranks, key=lambda s: s.ratio)}
    return best.get(node, 0) - 1 >= 0.5 * (best.get(top, 0) - 1)
