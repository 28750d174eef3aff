"""The store for Prometheus: node_exporter's textfile-collector format, written atomically.

:func:`write_textfile` builds a dedicated ``CollectorRegistry`` (never the global one) whose collector reads
the store once per export, and writes ``DIR/NAME.prom`` with ``prometheus_client.write_to_textfile`` (a temp
file renamed into place: node_exporter never reads half a file; alert on ``node_textfile_mtime_seconds``
for staleness). Names: ``rankscope_`` prefix, base units, ``_total`` for counters, no rank label.

Per job (latest verdict, newest incident first): ``rankscope_job_verdict{job,verdict}`` (1),
``rankscope_job_verdict_confidence{job}``, ``rankscope_job_incident_timestamp_seconds{job}``,
``rankscope_job_machines_named{job,role}`` (culprit | suspect) and ``rankscope_job_machine_named{job,machine,
role}`` (1; at most :data:`MAX_MACHINES_PER_JOB` per job). Per machine: ``rankscope_machine_blamed_incidents_total
{machine,role}`` (every incident that named it, ever), ``rankscope_machine_risk_score{machine}`` and
``rankscope_machine_quarantined{machine}`` (the fleet window). Batch: ``rankscope_batch_runs_total``,
``rankscope_batch_job_failures_total``, ``rankscope_batch_last_run_{duration_seconds,timestamp_seconds,
jobs_done,failed_jobs,verdicts_written,success}``; ``rankscope_fleet_quarantined_machines``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from rankscope.config import BatchConfig
from rankscope.spine import InputError

MAX_MACHINES_PER_JOB = 64
"""Machines listed per job in ``rankscope_job_machine_named`` (the count metric has them all)."""
EVER = 100 * 365 * 86400.0


class StoreCollector:
    """A prometheus_client collector over one store (read when collected)."""

    def __init__(self, store: Any, config: BatchConfig | None = None) -> None:
        self.store = store
        self.config = config or BatchConfig()

    def describe(self) -> list[Any]:
        return []  # families are known only once the store is read; no registration-time collect

    def collect(self) -> Iterator[Any]:
        yield from self._jobs()
        yield from self._machines()
        yield from self._batch()

    def _jobs(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from rankscope.datasets.store.catalog import list_verdicts

        kind = GaugeMetricFamily("rankscope_job_verdict", "Latest verdict of each job (1).", labels=["job", "verdict"])
        conf = GaugeMetricFamily(
            "rankscope_job_verdict_confidence", "Confidence of the latest verdict.", labels=["job"]
        )
        when = GaugeMetricFamily(
            "rankscope_job_incident_timestamp_seconds", "When the latest verdict's incident happened.", labels=["job"]
        )
        count = GaugeMetricFamily(
            "rankscope_job_machines_named", "Machines the latest verdict names.", labels=["job", "role"]
        )
        named = GaugeMetricFamily(
            "rankscope_job_machine_named", "A machine the latest verdict names (1).", labels=["job", "machine", "role"]
        )
        seen: set[str] = set()
        for v in list_verdicts(self.store):  # newest incident first: the first row of a job is its latest
            if v.job in seen:
                continue
            seen.add(v.job)
            kind.add_metric([v.job, v.verdict], 1.0)
            conf.add_metric([v.job], float(v.confidence or 0.0))
            t = v.incident_time or v.analysed
            if t is not None:
                when.add_metric([v.job], t.timestamp())
            collateral = [n for n in v.suspect_nodes if n not in v.culprit_nodes]
            for role, nodes in (("culprit", v.culprit_nodes), ("suspect", collateral)):
                count.add_metric([v.job, role], float(len(nodes)))
                for n in nodes[:MAX_MACHINES_PER_JOB]:
                    named.add_metric([v.job, n, role], 1.0)
        yield from (kind, conf, when, count, named)

    def _machines(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from rankscope.batch.fleet import fleet_view

        blamed = CounterMetricFamily(
            "rankscope_machine_blamed_incidents",
            "Incidents whose verdict named the machine, ever (made-up names excluded).",
            labels=["machine", "role"],
        )
        for m in fleet_view(self.store, replace(self.config, fleet_window_seconds=EVER)).machines:
            blamed.add_metric([m.machine, "culprit"], float(m.culprit))
            blamed.add_metric([m.machine, "suspect"], float(m.suspect))
        risk = GaugeMetricFamily("rankscope_machine_risk_score", "Fleet risk score in the window.", labels=["machine"])
        quar = GaugeMetricFamily(
            "rankscope_machine_quarantined", "1 when the machine is above the threshold.", labels=["machine"]
        )
        view = fleet_view(self.store, self.config)
        for m in view.machines:
            risk.add_metric([m.machine], m.risk)
            quar.add_metric([m.machine], 1.0 if m.quarantined else 0.0)
        total = GaugeMetricFamily("rankscope_fleet_quarantined_machines", "Machines above the quarantine threshold.")
        total.add_metric([], float(len(view.quarantine)))
        yield from (blamed, risk, quar, total)

    def _batch(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        runs = self.store.read("batch_runs")  # empty, with its columns, before the first run
        total = CounterMetricFamily("rankscope_batch_runs", "rankscope batch runs recorded in the store.")
        total.add_metric([], float(runs.height))
        failures = CounterMetricFamily("rankscope_batch_job_failures", "Job failures over every batch run.")
        failures.add_metric([], float(runs["jobs_failed"].sum() or 0) if runs.height else 0.0)
        yield from (total, failures)
        if not runs.height:
            return
        last = runs.sort("started").row(-1, named=True)
        for name, doc, value in (
            ("duration_seconds", "How long the last run took.", last["duration_seconds"]),
            ("timestamp_seconds", "When the last run finished.", (last["finished"] or last["started"]).timestamp()),
            ("jobs_done", "Jobs the last run finished.", last["jobs_done"]),
            ("failed_jobs", "Jobs that failed in the last run.", last["jobs_failed"]),
            ("verdicts_written", "Verdicts the last run wrote.", last["verdicts_written"]),
            ("success", "1 when the last run finished every job.", 1.0 if last["status"] == "ok" else 0.0),
        ):
            g = GaugeMetricFamily(f"rankscope_batch_last_run_{name}", doc)
            g.add_metric([], float(value or 0.0))
            yield g


def registry_for(store: Any, config: BatchConfig | None = None) -> Any:
    """A dedicated registry holding the store's collector."""
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(store, config))
    return reg


def write_textfile(
    store: Any, directory: str | os.PathLike[str], *, name: str = "rankscope", config: BatchConfig | None = None
) -> Path:
    """Write ``DIRECTORY/NAME.prom`` atomically; the path."""
    from prometheus_client import write_to_textfile

    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"{d}: no such directory (node_exporter's --collector.textfile.directory)")
    if not name or "/" in name or name.startswith("."):
        raise InputError(f"--name {name!r} must be a plain file name (e.g. rankscope or rankscope-prod)")
    path = d / f"{name}.prom"
    write_to_textfile(str(path), registry_for(store, config))
    return path
