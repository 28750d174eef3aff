"""Metrics among peers: long-form metrics as a cube per level, counters as rates, units unlike their peers.

Metrics become a cube per level (one row per GPU for GPU metrics, per node for node metrics; counters
``*_total`` become rates) scored by the Minder-style :class:`~rankscope.models.PeerDistance`; an alert
needs the same unit on top for the continuity window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import polars as pl

from rankscope.config import PerfConfig
from rankscope.datasets.domain.topology import Topology
from rankscope.models.registry import make_peer_detector
from rankscope.spine import InputError

SELF_PREFIX = "rankscope_"
"""The agent's own health metrics: they describe the monitor, not the machine, and are not compared."""


HEALTH_WORDS = ("ecc", "remap", "retired", "xid", "temperature", "errors", "error")
"""Metrics that say a part is wearing out rather than that training is slower: ``degraded``."""


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
        return {
            "unit": self.unit,
            "node": self.node,
            "score": round(self.score, 2),
            "onset": iso(self.onset_s),
            "alert": iso(self.alert_s),
            "drivers": list(self.drivers),
            "level": self.level,
        }


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="seconds")


def _seconds(ts: pl.Series) -> np.ndarray:
    if ts.dtype.is_temporal():
        return ts.dt.epoch("us").cast(pl.Float64).to_numpy() / 1e6
    try:
        return ts.cast(pl.Float64).to_numpy()
    except pl.exceptions.PolarsError:
        raise InputError(f"metrics: column 'ts' must be a timestamp or seconds, not {ts.dtype}") from None


def metric_cubes(
    metrics: pl.DataFrame, *, rate_window_seconds: float = 120.0, counter_allowance: float = 2.0
) -> list[MetricCube]:
    """Long-form metrics as one cube per level (GPU rows, node rows), counters turned into rates."""
    missing = [c for c in ("ts", "node", "metric", "value") if c not in metrics.columns]
    if missing:
        raise InputError(f"metrics: missing column(s) {missing}; required: ts, node, metric, value")
    df = metrics.select(
        pl.col("node").cast(pl.Utf8),
        pl.col("metric").cast(pl.Utf8),
        pl.col("value").cast(pl.Float64, strict=False),
        (pl.col("gpu").cast(pl.Int64, strict=False) if "gpu" in metrics.columns else pl.lit(None, pl.Int64)).alias(
            "gpu"
        ),
    ).with_columns(pl.Series("t", _seconds(metrics["ts"])))
    df = df.filter(
        pl.col("value").is_finite()
        & pl.col("node").is_not_null()
        & pl.col("t").is_not_null()
        & ~pl.col("metric").str.starts_with(SELF_PREFIX)
    )
    if df.height == 0:
        return []
    # the sampling interval of each node (nodes sample at different offsets), then the typical one
    per_node = df.group_by("node").agg(pl.col("t").unique().sort().diff().median().alias("dt"))
    dts = per_node["dt"].drop_nulls().to_numpy()
    interval = max(float(np.median(dts)) if dts.size else 1.0, 1e-3)
    t0 = float(df["t"].min())  # type: ignore[arg-type]  # a float column: its min is a float
    gpu_metrics = set(df.filter(pl.col("gpu").is_not_null())["metric"].unique().to_list())
    cubes = []
    for level in ("gpu", "node"):
        part = df.filter(pl.col("metric").is_in(sorted(gpu_metrics)) == (level == "gpu"))
        if part.height == 0:
            continue
        unit = (
            (pl.col("node") + "/gpu" + pl.col("gpu").fill_null(-1).cast(pl.Utf8)) if level == "gpu" else pl.col("node")
        )
        part = part.with_columns(
            unit.alias("unit"), ((pl.col("t") - t0) / interval).round().cast(pl.Int64).alias("bin")
        )
        part = part.group_by("unit", "node", "metric", "bin").agg(pl.col("value").mean())
        units = part.select("unit", "node").unique().sort("unit")
        names = tuple(sorted(part["metric"].unique().to_list()))
        n_t = int(part["bin"].max()) + 1  # type: ignore[arg-type]  # an integer column: its max is an int
        ui = {u: i for i, u in enumerate(units["unit"].to_list())}
        mi = {m: i for i, m in enumerate(names)}
        cube = np.full((len(ui), n_t, len(names)), np.nan, dtype=np.float32)
        cube[
            np.fromiter((ui[u] for u in part["unit"].to_list()), np.int64, part.height),
            part["bin"].to_numpy(),
            np.fromiter((mi[m] for m in part["metric"].to_list()), np.int64, part.height),
        ] = part["value"].to_numpy()
        cube = _ffill(cube)
        cube = counters_to_rates(
            cube, names, interval_s=interval, rate_window_s=rate_window_seconds, allowance=counter_allowance
        )
        cubes.append(
            MetricCube(cube, tuple(units["unit"].to_list()), tuple(units["node"].to_list()), names, t0, interval, level)
        )
    return cubes


def _ffill(cube: np.ndarray) -> np.ndarray:
    """Carry each unit's last sample forward over gaps (leading gaps stay NaN: the detector fills them)."""
    mask = np.isnan(cube)
    if not mask.any():
        return cube
    idx = np.where(~mask, np.arange(cube.shape[1])[None, :, None], 0)
    np.maximum.accumulate(idx, axis=1, out=idx)
    return np.take_along_axis(cube, idx, axis=1)


def counters_to_rates(
    values: np.ndarray,
    names: tuple[str, ...] | list[str],
    *,
    interval_s: float,
    rate_window_s: float,
    allowance: float = 0.0,
) -> np.ndarray:
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
    detector: str = "peer-distance"  # the rankscope.models detector that scored the units
    threshold: float = 12.0  # the score it alerts above


def detect_metric_outliers(metrics: pl.DataFrame, *, config: PerfConfig | None = None) -> MetricFindings:
    """Units whose metrics stay unlike their peers' for the continuity window."""
    cfg = config or PerfConfig()
    alerts: list[MetricAlert] = []
    notes: list[str] = []
    n_units = 0
    threshold = cfg.threshold
    for cube in metric_cubes(
        metrics, rate_window_seconds=cfg.rate_window_seconds, counter_allowance=cfg.counter_allowance
    ):
        n, t = cube.values.shape[:2]
        if n < cfg.min_machines:
            notes.append(f"{cube.level} metrics: only {n} {cube.level}(s), peer comparison needs {cfg.min_machines}")
            continue
        if t * cube.interval_s < max(cfg.window_seconds, cube.interval_s):
            notes.append(
                f"{cube.level} metrics: {t * cube.interval_s:g} s of data, shorter than one "
                f"{cfg.window_seconds:g} s window"
            )
            continue
        n_units += n
        det = make_peer_detector(
            cfg.detector,
            window_s=max(cfg.window_seconds, cube.interval_s),
            continuity_s=cfg.continuity_seconds,
            sample_interval_s=cube.interval_s,
            threshold=cfg.threshold if cfg.detector == "peer-distance" else None,
        )
        threshold = float(det.threshold)
        found = det.fit(cube.values).detect(cube.values)
        for i in found.alerted:
            alerts.append(
                MetricAlert(
                    cube.units[i],
                    cube.unit_nodes[i],
                    float(found.scores[i]),
                    cube.t0_s + found.onset_index[i] * cube.interval_s,
                    cube.t0_s + found.alert_index[i] * cube.interval_s,
                    tuple(cube.metrics[j] for j in found.drivers(int(i))),
                    cube.level,
                )
            )
    return MetricFindings(tuple(sorted(alerts, key=lambda a: -a.score)), n_units, tuple(notes), cfg.detector, threshold)


def is_health_only(drivers: tuple[str, ...]) -> bool:
    """True when the strongest driver is a wear metric (ECC, temperature, ...), not a throughput one."""
    return bool(drivers) and any(w in drivers[0] for w in HEALTH_WORDS)


def job_nodes_only(metrics: Any, topology: Topology) -> tuple[Any, list[str]]:
    """Keep the metrics of the job's nodes (a sidecar may also report its host under another name).

    Only when some metric nodes are job nodes: with disjoint names (hostnames vs node-N) nothing
    can be matched, and every node is kept.
    """
    import polars as pl

    names = set(metrics.get_column("node").unique().to_list())
    inside = names & set(topology.node_names)
    if not inside or inside == names:
        return metrics, []
    return metrics.filter(pl.col("node").is_in(sorted(inside))), sorted(str(n) for n in names - inside)
