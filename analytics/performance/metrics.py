"""Metrics among peers: the metric evidence read into a cube and scored by a detector, decided per job.

The metrics (a :class:`~rankscope.datasets.domain.metrics.MetricSet` of files in any supported format,
or a long-form polars frame) are streamed into a :class:`~rankscope.datasets.domain.metrics.MetricCube`
(counters as rates, gauges as block means; blocks of an eighth of the continuity window and at least
1.5 sampling intervals). The default detector, :class:`~rankscope.models.peer_change.PeerChangeDetector`,
names a machine only for a calibrated, persistent change in its relation to its peers
(:mod:`.metrics_decide`); the other registered detectors (``detect --detector``) score the same cube's
blocks and name the units they alert on, under the same rule that a handful of machines can be a fault
and a large share of the job cannot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from rankscope.config import PerfConfig
from rankscope.datasets.domain.metrics import MetricCube, MetricSet
from rankscope.datasets.domain.topology import Topology

HEALTH_WORDS = ("ecc", "remap", "retired", "xid", "temperature", "temp", "errors", "error", "replay", "retrans", "crc")
"""Metrics that say a part is wearing out rather than that training is slower: ``degraded``."""


def iso(t: float | None) -> str | None:
    if t is None or not math.isfinite(t):
        return None
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class MetricAlert:
    """One machine's (or unit's) evidence: score, onset and alert time (epoch seconds), driving metrics."""

    unit: str  # "node" or "node/gpu<i>"
    node: str
    score: float
    onset_s: float | None
    alert_s: float | None
    drivers: tuple[str, ...]
    level: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "node": self.node,
            "score": round(self.score, 2),
            "onset": iso(self.onset_s),
            "alert": iso(self.alert_s),
            "drivers": list(self.drivers),
            "level": self.level,
        }


@dataclass(frozen=True)
class MetricFindings:
    """What the metrics say: a kind (``fail-slow``, ``degraded``, ``imbalance``, ``healthy``,
    ``inconclusive``), the machines named (only for the first two), reasons, and the evidence."""

    kind: str
    named: tuple[str, ...]
    alerts: tuple[MetricAlert, ...]
    reasons: tuple[str, ...]
    confidence: float
    n_units: int
    notes: tuple[str, ...] = ()
    detector: str = "peer-change"
    threshold: float = float("nan")
    details: dict[str, Any] = field(default_factory=dict)


def choose_block_s(continuity_s: float, intervals: dict[str, float]) -> float:
    """Block length: an eighth of the continuity window, and at least 1.5 sampling intervals of the slowest
    metric (jitter never leaves a block without a sample)."""
    slowest = max(intervals.values(), default=1.0)
    return float(max(continuity_s / 8.0, 1.5 * slowest))


def as_metric_set(metrics: Any) -> MetricSet:
    """A MetricSet as it is, or a long-form polars frame wrapped in one."""
    return metrics if isinstance(metrics, MetricSet) else MetricSet(frame=metrics)


def metric_cube(metrics: Any, config: PerfConfig) -> MetricCube:
    """The cube of ``metrics`` (a MetricSet or a long-form frame) with this configuration's blocks."""
    from rankscope.datasets.readers.metric_cube import build_cube

    continuity = config.continuity_seconds
    return build_cube(as_metric_set(metrics), block_s=lambda iv: choose_block_s(continuity, iv))


def job_machines_only(cube: MetricCube, topology: Topology | None) -> tuple[MetricCube, list[str]]:
    """Keep the machines of the job (a sidecar may also report its host under another name). Only when some
    metric machines are job machines: with disjoint names (hostnames vs node-N) every machine is kept."""
    if topology is None:
        return cube, []
    names = set(cube.machines)
    inside = names & set(topology.node_names)
    if not inside or inside == names:
        return cube, []
    return cube.only_machines(sorted(inside)), sorted(names - inside)


def detect_metric_outliers(
    metrics: Any, *, config: PerfConfig | None = None, topology: Topology | None = None
) -> MetricFindings:
    """Read, score and decide the metrics of one job (see the module docstring)."""
    from rankscope.analytics.performance.metrics_decide import decide_alerts, decide_peer_change, inconclusive

    cfg = config or PerfConfig()
    from rankscope.datasets.readers.metric_cube import NoMetricSamples

    try:
        cube = metric_cube(metrics, cfg)
    except NoMetricSamples as exc:  # nothing usable in the metric files: the other evidence still counts
        return inconclusive(f"{exc}", 0, list(getattr(metrics, "notes", ())), cfg)
    cube, outside = job_machines_only(cube, topology)
    notes = list(cube.notes) + (
        [f"metrics of machine(s) outside the job ignored: {', '.join(outside[:10])}"] if outside else []
    )
    n = len(cube.machines)
    if n < cfg.min_machines:
        return inconclusive(f"{n} machine(s) in the metrics: a peer comparison needs {cfg.min_machines}", n, notes, cfg)
    span = cube.n_blocks * cube.block_s
    need = cfg.min_baseline_seconds + cfg.continuity_seconds
    if span < need:
        return inconclusive(
            f"{span:.0f} s of metrics: a change needs {cfg.min_baseline_seconds:g} s of baseline and "
            f"{cfg.continuity_seconds:g} s of continuity ({need:g} s)",
            n,
            notes,
            cfg,
        )
    if cfg.detector == "peer-change":
        return decide_peer_change(cube, cfg, notes)
    return decide_alerts(cube, cfg, notes)


def is_health_only(drivers: tuple[str, ...]) -> bool:
    """True when every driver is a wear metric (ECC, temperature, retransmits, ...), not a throughput one."""
    return bool(drivers) and all(any(w in d.lower() for w in HEALTH_WORDS) for d in drivers)
