"""What a store holds: its jobs and their verdicts (``rankscope jobs`` / ``rankscope verdicts``), and when an
incident happened, so that a saved verdict records the incident's time and not only when it was analysed.

- :func:`list_jobs`: one :class:`JobSummary` per job (first and last capture, the tables it has rows in,
  its latest verdict and the machines it named), newest first.
- :func:`list_verdicts`: the saved verdicts (``verdicts`` table), newest incident first.
- :func:`incident_time`: when the evidence in an :class:`Inputs` was produced, with where that time comes from.
- :func:`verdict_row`: a verdict's store row (``Verdict.to_row()``) with the incident's time added.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rankscope.datasets.domain.inputs import Inputs
from rankscope.datasets.store.schemas import TABLES
from rankscope.datasets.store.store import Store

CAPTURE_COLUMNS: Mapping[str, str] = {"stacks": "time", "metrics": "ts", "events": "ts", "processes": "time"}
"""The time column of each table with one: what "first/last capture" of a job is measured on."""
MAX_STAT_FILES = 2000
"""At most this many dump files are stat'ed for their modification time (a 100k-file directory: a sample)."""


# -- when the incident happened -------------------------------------------------------------------------
def incident_time(inputs: Inputs, *, onset: str | None = None) -> tuple[datetime | None, str]:
    """When the evidence was produced, and the source of that time, in order of precedence:

    ``capture`` (the latest stack snapshot's wall time, the agent's), ``first-failure`` (the earliest
    abnormal exit), ``metric-onset`` (``onset``: the verdict's metric onset, ISO 8601),
    ``flight-recorder`` (the newest entry the dumps recorded), ``timings`` (the last step's start),
    ``dump-files`` (the newest modification time of the dump files read), else ``(None, "unknown")``.
    """
    if inputs.snapshot_times:
        return _utc(max(inputs.snapshot_times.values())), "capture"
    if inputs.exits:
        return _utc(min(e.time for e in inputs.exits)), "first-failure"
    if onset:
        try:
            t = datetime.fromisoformat(onset.replace("Z", "+00:00"))
            return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)), "metric-onset"
        except ValueError:
            pass
    fr_ns = [e.time_created_ns for d in inputs.fr_dumps for e in d.entries if e.time_created_ns]
    if fr_ns:
        return _utc(max(fr_ns) / 1e9), "flight-recorder"
    timings = inputs.timings
    if timings is not None and "start_s" in timings.columns and timings["start_s"].null_count() < timings.height:
        last = float(timings["start_s"].max())
        if last > 1e9:  # epoch seconds, not seconds since the job started
            return _utc(last), "timings"
    newest = _newest_file(inputs)
    if newest is not None:
        return _utc(newest), "dump-files"
    return None, "unknown"


def _newest_file(inputs: Inputs) -> float | None:
    root = Path(inputs.source) if inputs.source else None
    if root is None or not root.is_dir():
        return None
    names = [*(p.source for p in inputs.procs[:MAX_STAT_FILES]), *(d.source_file for d in inputs.fr_dumps[:100])]
    best: float | None = None
    for name in names:
        if not name:
            continue
        path = Path(name) if os.path.isabs(name) else root / name
        try:
            m = path.stat().st_mtime
        except OSError:
            continue
        best = m if best is None else max(best, m)
    return best


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def verdict_row(row: Mapping[str, Any], inputs: Inputs) -> dict[str, Any]:
    """``Verdict.to_row()`` with ``incident_time`` and ``incident_source`` (the store never imports analytics)."""
    details = json.loads(row.get("verdict_json") or "{}").get("details") or {}
    onset = details.get("onset") if isinstance(details, Mapping) else None
    when, source = incident_time(inputs, onset=onset if isinstance(onset, str) else None)
    return {**row, "incident_time": when, "incident_source": source}


# -- listing -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobSummary:
    """One job of a store."""

    job: str
    first_capture: datetime | None
    last_capture: datetime | None
    tables: tuple[str, ...]  # the tables with rows for the job
    latest_verdict: str | None
    latest_incident: datetime | None
    machines: tuple[str, ...]  # the latest verdict's culprit machines, else its suspects

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "first_capture": _iso(self.first_capture),
            "last_capture": _iso(self.last_capture),
            "tables": list(self.tables),
            "latest_verdict": self.latest_verdict,
            "latest_incident": _iso(self.latest_incident),
            "machines": list(self.machines),
        }


@dataclass(frozen=True)
class VerdictSummary:
    """One saved verdict."""

    job: str
    incident_time: datetime | None
    incident_source: str
    analysed: datetime | None
    verdict: str
    confidence: float | None
    culprit_nodes: tuple[str, ...]
    suspect_nodes: tuple[str, ...]
    summary: str
    verdict_json: str = ""  # the full verdict (not in to_dict: ``rankscope verdicts`` lists, it does not dump)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "incident_time": _iso(self.incident_time),
            "incident_source": self.incident_source,
            "analysed": _iso(self.analysed),
            "verdict": self.verdict,
            "confidence": self.confidence,
            "culprit_nodes": list(self.culprit_nodes),
            "suspect_nodes": list(self.suspect_nodes),
            "summary": self.summary,
        }


def _iso(t: datetime | None) -> str | None:
    return t.isoformat().replace("+00:00", "Z") if t is not None else None


def list_verdicts(store: Store, *, job: str | None = None) -> list[VerdictSummary]:
    """The saved verdicts (of ``job``), newest incident first (a verdict without one: when it was analysed)."""
    df = store.read("verdicts", job=job)
    out = [
        VerdictSummary(
            job=str(r["job"]),
            incident_time=_aware(r.get("incident_time")),
            incident_source=str(r.get("incident_source") or "unknown"),
            analysed=_aware(r.get("time")),
            verdict=str(r["verdict"]),
            confidence=r.get("confidence"),
            culprit_nodes=tuple(r.get("culprit_nodes") or ()),
            suspect_nodes=tuple(r.get("suspect_nodes") or ()),
            summary=str(r.get("summary") or "").split("\n", 1)[0],
            verdict_json=str(r.get("verdict_json") or ""),
        )
        for r in df.iter_rows(named=True)
    ]
    return sorted(out, key=_newest_first)


def _newest_first(v: VerdictSummary) -> tuple[float, float]:
    when = v.incident_time or v.analysed
    return (-(when.timestamp() if when else float("-inf")), -(v.analysed.timestamp() if v.analysed else 0.0))


def _aware(t: Any) -> datetime | None:
    if not isinstance(t, datetime):
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def list_jobs(store: Store) -> list[JobSummary]:
    """Every job with rows in any table, newest first (by its last capture, else its latest incident)."""
    import polars as pl

    tables: dict[str, list[str]] = {}
    for name in TABLES:
        for job in store.jobs(name):
            tables.setdefault(job, []).append(name)
    spans: dict[str, list[datetime]] = {}
    for name, col in CAPTURE_COLUMNS.items():
        if not store.files(name):
            continue
        agg = (
            store.scan(name)
            .group_by("job")
            .agg(pl.col(col).min().alias("first"), pl.col(col).max().alias("last"))
            .collect()
        )
        for r in agg.iter_rows(named=True):
            spans.setdefault(str(r["job"]), []).extend(t for t in (_aware(r["first"]), _aware(r["last"])) if t)
    latest: dict[str, VerdictSummary] = {}
    for v in list_verdicts(store):  # newest first: the first seen per job is its latest
        latest.setdefault(v.job, v)
    out = []
    for job in sorted(tables):
        times = spans.get(job, [])
        last = latest.get(job)
        out.append(
            JobSummary(
                job=job,
                first_capture=min(times) if times else None,
                last_capture=max(times) if times else None,
                tables=tuple(tables[job]),
                latest_verdict=last.verdict if last else None,
                latest_incident=(last.incident_time or last.analysed) if last else None,
                machines=(last.culprit_nodes or last.suspect_nodes) if last else (),
            )
        )
    return sorted(out, key=lambda j: -_stamp(j.last_capture or j.latest_incident))


def _stamp(t: datetime | None) -> float:
    return t.timestamp() if t is not None else float("-inf")


def rows(items: Sequence[JobSummary] | Sequence[VerdictSummary]) -> list[dict[str, Any]]:
    """The items as plain dicts (for ``--format json`` and tables)."""
    return [i.to_dict() for i in items]
