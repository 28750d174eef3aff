"""One ``rankscope batch`` run over a store, and the ``--every`` loop.

A run: take the store's lock (:class:`~rankscope.batch.state.BatchLock`; held: :class:`LockHeld`, the CLI
exits 75), load the watermarks, scan the evidence folders (:mod:`.scan`), hand every job with new evidence
to the runner (one :func:`~rankscope.batch.job.analyse_job` per job), and as each job finishes record its
watermark (after its verdicts are durable: a kill in between only makes the next run look again, and the
verdict keys make that look add nothing). The run ends with its own row in ``batch_runs`` and, when it
wrote verdicts (or the list is over an hour old), a fresh quarantine list. ``stop()`` is polled between
jobs (SIGTERM): jobs in flight finish, the rest wait for the next run.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rankscope.batch.job import analyse_job
from rankscope.batch.runners import make_runner
from rankscope.batch.scan import is_new, scan_jobs
from rankscope.batch.state import STALE_TEMP_SECONDS, BatchLock, Watermarks
from rankscope.config import BatchConfig, Config
from rankscope.spine import remove_stale_temps

JOURNAL_EVERY_SECONDS = 1.0
"""Finished jobs' watermarks are appended (one fsync) at most this often; a kill loses at most that much."""
QUARANTINE_REFRESH_SECONDS = 3600.0
MAX_RUN_PARTS = 256
"""batch_runs part files beyond this are merged into one at the end of a run (a 5-minute timer makes 288 a day)."""


@dataclass
class BatchReport:
    """What one run did."""

    run_id: str
    started: float
    duration_seconds: float = 0.0
    runner: str = "local"
    workers: int = 1
    jobs_total: int = 0
    jobs_new: int = 0
    jobs_done: int = 0
    jobs_older: int = 0  # new evidence, but older than --since: left for a run without it
    jobs_failed_before: int = 0  # failed at this same evidence in an earlier run (--retry-failed)
    incidents_diagnosed: int = 0
    verdicts_written: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    stopped: bool = False
    quarantined: int | None = None

    @property
    def status(self) -> str:
        return "stopped" if self.stopped else ("failed" if self.failures else "ok")

    @property
    def exit_code(self) -> int:
        """0 all done, 1 some jobs failed (the others done), 143 stopped by a signal with work left."""
        return 143 if self.stopped else (1 if self.failures else 0)

    def lines(self) -> list[str]:
        out = [
            f"batch: {self.jobs_new} of {self.jobs_total} job(s) with new evidence; {self.jobs_done} done, "
            f"{len(self.failures)} failed; {self.incidents_diagnosed} incident(s) diagnosed, "
            f"{self.verdicts_written} verdict(s) written ({self.runner}, {self.workers} worker(s), "
            f"{self.duration_seconds:.1f} s)"
        ]
        if self.jobs_older:
            out.append(f"batch: {self.jobs_older} job(s) with evidence older than --since left alone")
        if self.jobs_failed_before:
            out.append(
                f"batch: {self.jobs_failed_before} job(s) failed before at the same evidence: not retried "
                "(--retry-failed)"
            )
        if self.quarantined is not None:
            out.append(f"batch: quarantine list refreshed: {self.quarantined} machine(s)")
        if self.stopped:
            out.append("batch: stopped by a signal between jobs; the rest is picked up by the next run")
        out += [f"batch: failed: {job}: {error}" for job, error in self.failures]
        return out

    def to_row(self) -> dict[str, Any]:
        utc = timezone.utc
        return {
            "run_id": self.run_id,
            "started": datetime.fromtimestamp(self.started, utc),
            "finished": datetime.fromtimestamp(self.started + self.duration_seconds, utc),
            "duration_seconds": self.duration_seconds,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "runner": self.runner,
            "workers": self.workers,
            "jobs_total": self.jobs_total,
            "jobs_new": self.jobs_new,
            "jobs_done": self.jobs_done,
            "jobs_failed": len(self.failures),
            "incidents_diagnosed": self.incidents_diagnosed,
            "verdicts_written": self.verdicts_written,
            "failures": [f"{j}: {e}" for j, e in self.failures],
            "status": self.status,
        }


def run_batch(
    root: str | os.PathLike[str],
    config: Config | None = None,
    *,
    retry_failed: bool = False,
    stop: Callable[[], bool] = lambda: False,
    now: float | None = None,
) -> BatchReport:
    """One run (see the module doc). Raises StoreError for a path that is no store, LockHeld when busy."""
    from rankscope.datasets.store.store import Store

    cfg = config or Config()
    bc: BatchConfig = cfg.batch
    store = Store(root)  # a path that is no store: StoreError (exit 2) before any lock file is made
    workers = bc.workers or ((os.cpu_count() or 1) if bc.runner == "ray" else 1)
    report = BatchReport(uuid.uuid4().hex[:16], time.time(), runner=bc.runner, workers=workers)
    t0 = time.perf_counter()
    with BatchLock(store.root):
        marks = Watermarks(store.root)
        known = marks.load()
        scanned = scan_jobs(store.root)
        report.jobs_total = len(scanned)
        since = (now or time.time()) - bc.since_seconds if bc.since_seconds else None
        todo = []
        for job in sorted(scanned):
            js, mark = scanned[job], known.get(job)
            if not is_new(js, mark, store.root):
                assert mark is not None
                if mark.get("sig") != js.sig:
                    marks.update(job, sig=js.sig)  # the folder time moved, its parts did not
                if mark.get("status") != "failed":
                    continue
                if not retry_failed:  # the same evidence would fail the same way
                    report.jobs_failed_before += 1
                    continue
            if since is not None and js.newest < since:
                report.jobs_older += 1
                continue
            todo.append(job)
        report.jobs_new = len(todo) + report.jobs_older
        _sweep(store.root, todo)
        if todo:
            _run_jobs(store.root, todo, scanned, marks, cfg, since, report, stop)
        marks.compact()
        report.duration_seconds = time.perf_counter() - t0
        _record_run(store, report)
        if report.verdicts_written or _quarantine_age(store.root) > QUARANTINE_REFRESH_SECONDS:
            from rankscope.batch.fleet import refresh_quarantine

            report.quarantined = len(refresh_quarantine(store, cfg.batch))
    return report


def _sweep(root: Path, jobs: list[str]) -> None:
    """Temp files of killed verdict writers in the partitions this run writes to (a verdict write takes ms)."""
    for job in jobs:
        remove_stale_temps(root / "verdicts" / f"job={job}", older_than_seconds=STALE_TEMP_SECONDS)
    remove_stale_temps(root / "batch_runs", older_than_seconds=STALE_TEMP_SECONDS)


def _run_jobs(
    root: Path,
    todo: list[str],
    scanned: dict[str, Any],
    marks: Watermarks,
    cfg: Config,
    since: float | None,
    report: BatchReport,
    stop: Callable[[], bool],
) -> None:
    bc = cfg.batch
    runner = make_runner(bc.runner, bc.workers, address=bc.ray_address, object_store_bytes=bc.ray_object_store_bytes)
    queued: list[dict[str, Any]] = []
    last_flush = time.monotonic()

    def on_result(res: dict[str, Any]) -> None:
        nonlocal last_flush
        job = res["job"]
        report.incidents_diagnosed += int(res.get("diagnosed", 0))
        report.verdicts_written += int(res.get("written", 0))
        at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        js = scanned[job]
        if res["status"] == "done":
            report.jobs_done += 1
            queued.append({"job": job, "sig": js.sig, "parts": js.parts, "status": "done", "error": None, "at": at})
        else:
            report.failures.append((job, str(res.get("error"))))
            if not res.get("transient"):  # the same evidence fails the same way: not again until it changes
                queued.append(
                    {
                        "job": job,
                        "sig": js.sig,
                        "parts": js.parts,
                        "status": "failed",
                        "error": res.get("error"),
                        "at": at,
                    }
                )
        if queued and time.monotonic() - last_flush >= JOURNAL_EVERY_SECONDS:
            marks.append(queued)
            queued.clear()
            last_flush = time.monotonic()

    kwargs = {"config": cfg, "not_before": since}
    try:
        with runner:
            report.workers = runner.workers
            runner.run(analyse_job, str(root), todo, kwargs, on_result, stop)
    finally:
        marks.append(queued)
    done = report.jobs_done + len(report.failures)
    report.stopped = done < len(todo)


def _record_run(store: Any, report: BatchReport) -> None:
    """The run's own row in ``batch_runs``; many small parts are merged into one now and then."""
    store.write("batch_runs", [report.to_row()])
    parts = store.files("batch_runs")
    if len(parts) > MAX_RUN_PARTS:
        import pyarrow as pa
        import pyarrow.parquet as pq

        merged = pa.concat_tables([pq.read_table(p) for p in parts], promote_options="default")
        store.write("batch_runs", merged)
        for p in parts:
            p.unlink(missing_ok=True)


def _quarantine_age(root: Path) -> float:
    from rankscope.datasets.store.quarantine import quarantine_path

    try:
        return time.time() - quarantine_path(root).stat().st_mtime
    except OSError:
        return float("inf")


def run_every(
    root: str | os.PathLike[str],
    config: Config,
    *,
    every_seconds: float,
    say: Callable[[str], None],
    stop: Callable[[], bool],
    retry_failed: bool = False,
    sleep: Callable[[float], None] | None = None,
) -> int:
    """Run every ``every_seconds`` (fixed rate; a run longer than the period starts the next at once) until
    ``stop()``; each run's lines go to ``say``. A run that finds the lock held says so and waits for the
    next tick. Returns 0 (stopped cleanly)."""
    from rankscope.batch.state import LockHeld

    wait = sleep or _sleeper(stop)
    next_start = time.monotonic()
    while not stop():
        try:
            rep = run_batch(root, config, retry_failed=retry_failed, stop=stop)
            for line in rep.lines():
                say(line)
        except LockHeld as exc:
            say(f"batch: {exc}")
        next_start += every_seconds
        now = time.monotonic()
        if next_start < now:
            next_start = now
        wait(next_start - now)
    return 0


def _sleeper(stop: Callable[[], bool]) -> Callable[[float], None]:
    def sleep(seconds: float) -> None:
        end = time.monotonic() + seconds
        while not stop() and time.monotonic() < end:
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))

    return sleep
