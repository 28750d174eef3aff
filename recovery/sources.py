"""Where a plan's inputs come from: a verdict or situation JSON file, a store, or a dump directory.

- a JSON file: what ``rankscope diagnose --format json`` printed (a verdict), or a situation object
  (``verdict``, ``events``, ``exits``, ``logs``, ``metrics``, ``checkpoints``, ``code_versions``, ...);
- a store (``--job``): diagnosed now, exactly as ``rankscope diagnose STORE --job J`` does (the latest
  capture, the process exits around it), plus the job's health events from the ``events`` table;
- a dump directory (or the hook's run directory): diagnosed first, as ``rankscope diagnose DIR`` does.

Diagnosis goes through the same two calls as the CLI's ``diagnose`` (``rankscope.datasets.loading.load_inputs``,
then ``analytics.diagnose``); nothing is loaded another way. Evidence older than the job's last applied
disruptive action (an eviction, a restart) belongs to an earlier incident the executor already handled
and is left out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rankscope.config import Config
from rankscope.spine import InputError

from .audit import AuditRecord
from .plan import DISRUPTIVE


@dataclass(frozen=True)
class Source:
    """The situation's raw object (for ``Situation.from_dict``) and where it came from."""

    obj: dict[str, Any]
    kind: str  # json | store | dumps
    path: Path
    job: str


def last_applied(records: list[AuditRecord], job: str) -> float | None:
    """When the executor last changed the job (an applied evict, restart, rollback or stop), if ever."""
    times = [r.when for r in records if r.job == job and not r.dry_run and r.outcome == "ok" and r.what in DISRUPTIVE]
    return max(times) if times else None


def _since(rows: list[dict[str, Any]], since: float | None, key: str) -> list[dict[str, Any]]:
    if since is None:
        return rows
    out = []
    for r in rows:
        t = r.get(key)
        ts = t.timestamp() if isinstance(t, datetime) else (float(t) if t is not None else None)
        if ts is None or ts > since:
            out.append(r)
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(obj, Mapping) and isinstance(obj.get("verdict"), str):
        return {"verdict": dict(obj)}
    if not isinstance(obj, Mapping):
        raise InputError(
            f"{path}: expected a JSON object (a verdict from `rankscope diagnose --format json`, or "
            "a situation with a 'verdict' key)"
        )
    return dict(obj)


def load_source(
    path: str | os.PathLike[str],
    *,
    job: str | None = None,
    layout: str | None = None,
    order: str | None = None,
    gpus_per_node: int | None = None,
    config: Config | None = None,
    since: float | None = None,
) -> Source:
    """The situation object for SOURCE (see the module docstring); ``since`` drops older events and exits."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or directory")
    if p.is_file():
        given = _read_json(p)
        if job and not given.get("job"):
            given["job"] = job
        v = given.get("verdict")
        name = str(given.get("job") or (v.get("job") if isinstance(v, Mapping) else "") or "")
        return Source(given, "json", p, name)
    from rankscope.analytics import diagnose
    from rankscope.datasets.loading.inputs import load_inputs
    from rankscope.datasets.store.store import Store

    cfg = config or Config()
    inputs = load_inputs(p, layout=layout, order=order, gpus_per_node=gpus_per_node, job=job, config=cfg.inputs)
    if since is not None:
        inputs = current_launch(inputs, since, Store(p) if Store.is_store(p) else None)
    verdict = diagnose(inputs, cfg).to_dict()
    if inputs.snapshot_times:
        verdict["time"] = max(inputs.snapshot_times.values())
    exits = [
        {"rank": x.rank, "time": x.time, "kind": x.kind, "message": x.message, "node": x.node} for x in inputs.exits
    ]
    obj: dict[str, Any] = {"job": inputs.job, "verdict": verdict, "exits": _since(exits, since, "time")}
    machines = [str(n) for n in inputs.topology.node_names] if inputs.topology is not None else []
    if machines:
        obj["machines"] = machines
    kind = "dumps"
    if Store.is_store(p):
        kind = "store"
        store = Store(p)
        if store.files("events", job=inputs.job):
            cols = ("ts", "node", "kind", "severity", "action", "gpu", "rank", "message", "labels")
            rows = [{k: r.get(k) for k in cols} for r in store.read("events", job=inputs.job).to_dicts()]
            obj["events"] = _since([r for r in rows if r.get("ts") is not None], since, "ts")
    return Source(obj, kind, p, inputs.job)


def current_launch(inputs: Any, since: float, store: Any = None) -> Any:
    """The evidence of the job as it runs since ``since`` (the executor's last restart): a store keeps every
    capture, and a capture after a restart still carries the previous launch's dead ranks (post-mortem
    stacks), its Flight Recorder dumps, exits, step timings and metrics. Kept: snapshots taken after
    ``since``, processes the agent first saw after it (the ``processes`` table), exits, step timings and
    metric samples after it, Flight Recorder dumps with an entry after it."""
    from dataclasses import replace

    new_pids: set[int] | None = None
    if store is not None and store.files("processes", job=inputs.job):
        first: dict[int, float] = {}
        for row in store.read("processes", job=inputs.job).select("pid", "time").to_dicts():
            if row["pid"] is not None and row["time"] is not None:
                t = row["time"].timestamp()
                first[int(row["pid"])] = min(t, first.get(int(row["pid"]), t))
        new_pids = {pid for pid, t in first.items() if t > since}
    times = inputs.snapshot_times

    def keep(p: Any) -> bool:
        if times.get(p.snapshot, since + 1) <= since:
            return False
        return new_pids is None or p.pid is None or p.pid in new_pids

    def recent(d: Any) -> bool:
        stamps = [e.time_created_ns for e in d.entries if e.time_created_ns]
        return not stamps or max(stamps) / 1e9 > since

    procs = tuple(p for p in inputs.procs if keep(p))
    timings, metrics = inputs.timings, inputs.metrics
    if timings is not None or metrics is not None:
        import polars as pl

        if timings is not None and "start_s" in timings.columns:  # the agent's step times: wall-clock starts
            timings = timings.filter(pl.col("start_s").is_null() | (pl.col("start_s") > since))
        if metrics is not None and hasattr(metrics, "after"):  # a MetricSet: older samples skipped as it streams
            metrics = metrics.after(since)
        elif metrics is not None and isinstance(metrics.schema.get("ts"), pl.Datetime):
            cut = datetime.fromtimestamp(since, timezone.utc)
            metrics = metrics.filter(pl.col("ts") > pl.lit(cut).cast(metrics.schema["ts"]))
    notes = (*inputs.notes, f"{len(inputs.procs) - len(procs)} process stack(s) from before the last restart ignored")
    return replace(
        inputs,
        procs=procs,
        timings=timings,
        metrics=metrics,
        fr_dumps=tuple(d for d in inputs.fr_dumps if recent(d)),
        exits=tuple(
            x for x in inputs.exits if x.time > since and (new_pids is None or x.pid is None or x.pid in new_pids)
        ),
        snapshot_times={s: t for s, t in times.items() if t > since},
        notes=notes if len(procs) < len(inputs.procs) else inputs.notes,
    )
