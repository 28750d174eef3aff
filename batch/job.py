"""The per-job work of ``rankscope batch``: a plain function, so any engine can schedule it.

``analyse_job(store_root, job, config=..., not_before=...)`` lists the job's incidents (each ``ingest``;
each capture series of the agent, ``capture-<first snapshot>``; ``live`` for a job with neither), skips
those already diagnosed at the same evidence, diagnoses the others with ``analytics.diagnose`` and appends
their verdicts to the store in ONE atomic part file (a kill leaves all of them or none). It returns a
plain dict (picklable for a process pool, serialisable for Ray) and never raises: an error is the
job's one-line ``error``.

Idempotency: a verdict row carries ``incident_id`` and ``input_fingerprint`` (a digest of the incident's
own evidence: the ingest ledger's file digests; the capture series' stack rows and the job's Flight
Recorder and topology files; for ``live``, the job's part files). A (job, incident, fingerprint) that has
a row is never diagnosed again; more evidence of an incident (another capture round) is diagnosed again
and written only when the conclusion (verdict, culprits, suspects) changed.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rankscope.config import Config
from rankscope.spine import RankscopeError, os_error_words

LIVE = "live"
"""The incident of a job with no stack capture and no ingest (the agent's metrics, timings and events)."""
DIAGNOSABLE = ("stacks", "collectives", "fr_dumps", "metrics", "timings")
"""Tables ``diagnose`` reads a job from (a job with rows only in others has nothing to diagnose)."""
FP_TABLES = ("collectives", "fr_dumps", "topology")
"""Tables whose part files belong to the fingerprint of an agent capture (written at captures, not streamed)."""


def analyse_job(
    store_root: str | os.PathLike[str], job: str, *, config: Config | None = None, not_before: float | None = None
) -> dict[str, Any]:
    """Diagnose every incident of ``job`` not yet diagnosed at its evidence; write the verdicts; report."""
    t0 = time.perf_counter()
    out: dict[str, Any] = {"job": job, "status": "done", "error": None, "transient": False}
    out.update(incidents=0, diagnosed=0, written=0, verdicts=[])
    try:
        _analyse(Path(store_root), job, config or Config(), not_before, out)
    except RankscopeError as exc:
        out.update(status="failed", error=_one_line(str(exc)))
    except OSError as exc:  # an NFS hiccup, a full disk: try again next run
        out.update(status="failed", error=_one_line(os_error_words(exc)), transient=True)
    except Exception as exc:  # a bug: one line, like the CLI's error edge
        out.update(status="failed", error=_one_line(f"internal error: {type(exc).__name__}: {exc}"))
    out["seconds"] = time.perf_counter() - t0
    return out


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]


def _analyse(root: Path, job: str, cfg: Config, not_before: float | None, out: dict[str, Any]) -> None:
    import polars as pl

    from rankscope.analytics import diagnose
    from rankscope.datasets.loading.incidents import incidents_of
    from rankscope.datasets.loading.inputs import load_inputs
    from rankscope.datasets.store.catalog import verdict_row
    from rankscope.datasets.store.schemas import TABLES
    from rankscope.datasets.store.store import Store

    store = Store(root)
    if not any(store.files(t, job=job) for t in DIAGNOSABLE if t in TABLES):
        out["note"] = "nothing to diagnose (no stacks, Flight Recorder, metrics or timings rows)"
        return
    gap = cfg.inputs.series_gap_seconds
    cols = ["snapshot", "time", "ingest_id", "node", "rank", "pid", "status"]
    stacks = store.scan("stacks", job=job).select(cols).collect().to_arrow()
    times = _snapshot_times(stacks)
    incidents, ledger = incidents_of(store, job, stacks, times, gap)
    keyed = [(i.key, i.time, _fingerprint(root, job, i.key, i.snapshots, stacks, ledger)) for i in incidents]
    if not keyed:
        keyed = [(LIVE, float("nan"), _parts_fingerprint(root, job, None))]
    out["incidents"] = len(keyed)
    done, latest = _saved(store, job, pl)
    rows = []
    for key, when, fp in keyed:
        if (key, fp) in done or (not_before is not None and not when >= not_before and key != LIVE):
            continue
        inputs = load_inputs(root, job=job, config=cfg.inputs, incident=None if key == LIVE else key)
        verdict = diagnose(inputs, cfg)
        out["diagnosed"] += 1
        decision = (verdict.verdict.value, tuple(sorted(verdict.culprit_nodes)), tuple(sorted(verdict.suspect_nodes)))
        out["verdicts"].append([key, decision[0], list(decision[1])])
        if latest.get(key) == decision:
            continue  # more evidence of the same incident, the same conclusion: nothing to add
        row = verdict_row(verdict.to_row(), inputs)
        if row["incident_time"] is None and when == when and abs(when) != float("inf"):
            row.update(incident_time=datetime.fromtimestamp(when, timezone.utc), incident_source=_timed_by(key))
        rows.append({**row, "job": job, "incident_id": key, "input_fingerprint": fp})
        latest[key] = decision
    if rows:
        store.write("verdicts", rows)  # one part file: every verdict of this job or none
        out["written"] = len(rows)


def _timed_by(key: str) -> str:
    """Where an incident's time comes from when its evidence carries none: the capture, or the ingest."""
    return "capture" if key.startswith("capture-") else "ingest"


def _snapshot_times(stacks: Any) -> dict[int, float]:
    out: dict[int, float] = {}
    for snap, t in zip(stacks.column("snapshot").to_pylist(), stacks.column("time").to_pylist()):
        if snap is not None and t is not None:
            ts = t.timestamp()
            if snap not in out or ts < out[snap]:
                out[snap] = ts
    return out


def _saved(store: Any, job: str, pl: Any) -> tuple[set[tuple[str, str]], dict[str, tuple[Any, ...]]]:
    """The (incident, fingerprint) pairs with a verdict row, and each incident's latest saved decision."""
    if not store.files("verdicts", job=job):
        return set(), {}
    cols = ["time", "incident_id", "input_fingerprint", "verdict", "culprit_nodes", "suspect_nodes"]
    df = store.scan("verdicts", job=job).select(cols).filter(pl.col("incident_id").is_not_null()).collect()
    done: set[tuple[str, str]] = set()
    latest: dict[str, tuple[Any, ...]] = {}
    for r in df.sort("time", nulls_last=False).iter_rows(named=True):
        done.add((r["incident_id"], r["input_fingerprint"]))
        latest[r["incident_id"]] = (
            r["verdict"],
            tuple(sorted(r["culprit_nodes"] or ())),
            tuple(sorted(r["suspect_nodes"] or ())),
        )
    return done, latest


def _digest(items: Iterable[str]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for item in items:
        h.update(item.encode("utf-8", "replace") + b"\0")
    return h.hexdigest()


def _fingerprint(root: Path, job: str, key: str, snapshots: frozenset[int], stacks: Any, ledger: Any) -> str:
    if not key.startswith("capture-"):  # an ingest: the content digests of its files, from the ledger
        rows = ledger.filter(ledger["ingest_id"] == key) if ledger is not None else None
        if rows is not None and rows.height:
            files = zip(rows["source_file"].to_list(), rows["source_digest"].to_list())
            return "ingest:" + _digest(sorted(f"{f}={d}" for f, d in files))
        return "ingest:" + _parts_fingerprint(root, job, None)
    cols = [stacks.column(c).to_pylist() for c in ("snapshot", "node", "rank", "pid", "status")]
    mine = sorted(repr(t) for t in zip(*cols) if t[0] in snapshots)
    return "capture:" + _digest([*mine, _parts_fingerprint(root, job, FP_TABLES)])


def _parts_fingerprint(root: Path, job: str, tables: Iterable[str] | None) -> str:
    from rankscope.batch.scan import part_digest

    return part_digest(root, job, dict.fromkeys(tables) if tables is not None else None)
