"""The caller's side of a report: :class:`ReportEvidence` from the loaded evidence (:class:`Inputs`).

The renderer never reads dumps or stores; ``rankscope report`` loads the evidence
(``rankscope.datasets.loading.inputs.load_inputs``), diagnoses it, and calls :func:`evidence_from_inputs`
with the inputs and the verdict to build each figure's table: the topology for the rank grid, per-rank
Flight Recorder progress for the wavefront, the suspect's metrics against its peers, the step times, and
the process exits when the verdict does not carry them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import polars as pl

from rankscope.datasets.domain.exits import ProcessExit
from rankscope.datasets.domain.flight_recorder import FRDump
from rankscope.datasets.domain.inputs import Inputs
from rankscope.datasets.domain.topology import Topology
from rankscope.reports.evidence import ReportEvidence

MAX_METRIC_UNITS = 2
MAX_DRIVERS_PER_UNIT = 3


def topology_table(topology: Topology | None) -> pl.DataFrame | None:
    """``rank, node, tp, cp, ep, dp, pp`` from a :class:`Topology`."""
    if topology is None:
        return None
    names = list(topology.node_names)
    cols: dict[str, Any] = {"rank": topology.ranks, "node": [names[i] for i in topology.node_index.tolist()]}
    for d in ("tp", "cp", "ep", "dp", "pp"):
        if d in topology.coords:
            cols[d] = topology.coords[d]
    return pl.DataFrame(cols)


def timings_table(timings: pl.DataFrame | None) -> pl.DataFrame | None:
    """The ``timings`` table (``rank, step, op, duration_s``) as the heatmap takes it."""
    if timings is None or timings.height == 0:
        return None
    keep = [c for c in ("rank", "step", "op", "duration_s") if c in timings.columns]
    return timings.select(keep).filter(pl.col("rank").is_not_null())


def fr_progress_table(dumps: Sequence[FRDump]) -> pl.DataFrame | None:
    """Per rank and process group: the last enqueued/started/completed collective sequence id.

    From each dump's ``pg_status`` (what FR records for exactly this); without it, from the entries:
    the highest sequence id recorded (enqueued) and the highest completed one. FR keys ``pg_status`` by
    the rank's local pg id; the reader has already filed it under the pg name, which names the same group
    on every member. With several captures, the latest is shown.
    """
    rows: list[dict[str, Any]] = []
    latest = max((d.capture for d in dumps), default=0)
    for d in (d for d in dumps if d.capture == latest):
        desc = {pg: info.desc for pg, info in (d.pg_config or {}).items()}
        by_pg: dict[str, list[Any]] = {}
        for e in d.entries:
            desc.setdefault(e.pg_name, e.pg_desc)
            if not e.is_p2p:
                by_pg.setdefault(e.pg_name, []).append(e)
        status = dict(d.pg_status or {})
        for pg in set(status) | set(by_pg):
            s = status.get(pg)
            ents = by_pg.get(pg, [])
            enq = (
                s.last_enqueued
                if s is not None and s.last_enqueued is not None
                else (max((e.collective_seq_id for e in ents), default=None))
            )
            done = (
                s.last_completed
                if s is not None and s.last_completed is not None
                else (max((e.collective_seq_id for e in ents if e.state == "completed"), default=None))
            )
            started = s.last_started if s is not None else None
            if enq is None:
                continue
            rows.append(
                {
                    "rank": int(d.rank),
                    "pg": str(pg),
                    "pg_desc": desc.get(pg) or "",
                    "last_enqueued": int(enq),
                    "last_started": None if started is None else int(started),
                    "last_completed": None if done is None else int(done),
                }
            )
    return pl.DataFrame(rows) if rows else None


def _rates(df: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Counters (``*_total``) as per-second rates; a counter reset gives no value, not a negative rate."""
    rate = (pl.col("value").diff() / pl.col("ts").diff()).over(keys)
    return df.sort([*keys, "ts"]).with_columns(pl.when(rate >= 0).then(rate).otherwise(None).alias("value"))


def _epoch_seconds(metrics: pl.DataFrame | None) -> pl.DataFrame | None:
    """``ts`` as float seconds since the epoch (the store keeps a datetime, CSV/Parquet inputs a number)."""
    if metrics is None or metrics.height == 0 or "ts" not in metrics.columns:
        return metrics
    if metrics.schema["ts"].is_temporal():
        return metrics.with_columns((pl.col("ts").dt.epoch("us") / 1e6).alias("ts"))
    return metrics.with_columns(pl.col("ts").cast(pl.Float64))


def metric_bands(
    metrics: pl.DataFrame | None,
    verdict: Mapping[str, Any],
    *,
    bucket_seconds: float = 15.0,
    max_units: int = MAX_METRIC_UNITS,
    max_drivers: int = MAX_DRIVERS_PER_UNIT,
) -> pl.DataFrame | None:
    """The suspect units' driving metrics against all peers, bucketed: the ``metric_bands`` table.

    Units and drivers come from the verdict's ``details.metric_alerts`` on the suspect nodes (culprits
    first, by score; every alert when the verdict names no machine). A unit
    ``node/gpuK`` is compared with every other GPU, a node with every other node (GPU metrics averaged
    over the node's GPUs). Per bucket: the unit's mean, and the peers' median and quartiles.
    """
    details = verdict.get("details") or {}
    alerts = (
        [a for a in details.get("metric_alerts") or () if isinstance(a, Mapping)]
        if isinstance(details, Mapping)
        else []
    )
    metrics = _epoch_seconds(metrics)
    if metrics is None or metrics.height == 0 or not alerts:
        return None
    culprits = set(verdict.get("culprit_nodes") or ())
    suspects = set(verdict.get("suspect_nodes") or ()) | culprits
    if suspects:  # the machines the verdict names; other alerts stay in the reasons
        alerts = [a for a in alerts if a.get("node") in suspects]
    alerts.sort(key=lambda a: (a.get("node") not in culprits, -float(a.get("score") or 0)))
    units: list[Mapping[str, Any]] = []
    for a in alerts:
        if a.get("node") not in {u.get("node") for u in units}:
            units.append(a)
        if len(units) >= max_units:
            break
    has_gpu = "gpu" in metrics.columns
    out: list[pl.DataFrame] = []
    for a in units:
        unit, node = str(a["unit"]), str(a["node"])
        tail = unit.rsplit("/gpu", 1)[1] if "/gpu" in unit else ""
        gpu = int(tail) if tail.isdigit() and len(tail) < 10 else None
        for metric in list(a.get("drivers") or ())[:max_drivers]:
            m = metrics.filter(pl.col("metric") == metric)
            if m.height == 0:
                continue
            if gpu is not None and has_gpu and m["gpu"].null_count() < m.height:
                m = m.filter(pl.col("gpu").is_not_null()).with_columns(
                    pl.concat_str(pl.col("node"), pl.lit("/gpu"), pl.col("gpu").cast(pl.String)).alias("u")
                )
            else:
                m = m.with_columns(pl.col("node").alias("u"))
            if metric.endswith("_total"):
                keys = ["u", "gpu"] if has_gpu and "gpu" in m.columns else ["u"]
                m = _rates(m, keys).filter(pl.col("value").is_not_null())
            b = (
                m.with_columns(((pl.col("ts") / bucket_seconds).floor() * bucket_seconds).alias("bucket"))
                .group_by(["u", "bucket"])
                .agg(pl.col("value").mean())
            )
            me = b.filter(pl.col("u") == unit)
            if me.height == 0:
                continue
            peers = (
                b.filter(pl.col("u") != unit)
                .group_by("bucket")
                .agg(
                    pl.col("value").median().alias("peer_median"),
                    pl.col("value").quantile(0.25, "linear").alias("peer_q25"),
                    pl.col("value").quantile(0.75, "linear").alias("peer_q75"),
                    pl.col("u").n_unique().cast(pl.Int64).alias("n_peers"),
                )
            )
            out.append(
                me.join(peers, on="bucket", how="inner")
                .sort("bucket")
                .select(
                    pl.lit(unit).alias("unit"),
                    pl.lit(node).alias("node"),
                    pl.lit(metric).alias("metric"),
                    pl.col("bucket").alias("ts"),
                    "value",
                    "peer_median",
                    "peer_q25",
                    "peer_q75",
                    "n_peers",
                )
            )
    return pl.concat(out) if out else None


def exits_table(exits: Sequence[ProcessExit], verdict: Mapping[str, Any]) -> pl.DataFrame | None:
    """Exits for the time line when the verdict does not carry them (``details.crash`` does)."""
    details = verdict.get("details") or {}
    if not exits or (isinstance(details, Mapping) and isinstance(details.get("crash"), Mapping)):
        return None
    from rankscope.analytics.crashes.verdict import is_cascade

    t0 = min(e.time for e in exits)
    return pl.DataFrame(
        [
            {
                "rank": e.rank,
                "after_s": e.time - t0,
                "cause": "cascade" if is_cascade(e) else "primary",
                "node": e.node,
                "kind": e.kind,
                "message": e.message,
            }
            for e in exits
        ]
    )


def evidence_from_inputs(
    inputs: Inputs, verdict: Mapping[str, Any], *, bucket_seconds: float | None = None
) -> ReportEvidence:
    """Everything the figures need from the loaded :class:`Inputs` and the verdict (its JSON form)."""
    from rankscope.datasets.readers.metric_files import metric_frame

    metrics = _epoch_seconds(metric_frame(inputs.metrics) if inputs.metrics is not None else None)
    if bucket_seconds is None and metrics is not None and metrics.height:
        ts = metrics["ts"]
        span = float(cast(float, ts.max())) - float(cast(float, ts.min()))
        bucket_seconds = max(1.0, math.ceil(span / 240))  # about 240 points per series
    return ReportEvidence(
        topology=topology_table(inputs.topology) if verdict.get("world_size") else None,
        timings=timings_table(inputs.timings),
        fr_progress=fr_progress_table(inputs.fr_dumps) if inputs.fr_dumps else None,
        metric_bands=metric_bands(metrics, verdict, bucket_seconds=bucket_seconds or 15.0),
        exits=exits_table(inputs.exits, verdict),
    )
