"""Scheduled batch analysis over the store, the fleet view across jobs, and scale-out on Ray.

- :func:`~rankscope.batch.run.run_batch` (``rankscope batch``): every job whose evidence is newer than its
  watermark, each incident diagnosed once, verdicts written idempotently; a lock against overlapping
  runs; safe under SIGKILL (:mod:`.state`, :mod:`.scan`).
- :func:`~rankscope.batch.job.analyse_job`: the per-job function, engine-agnostic (a plain function of
  the store root and the job); :mod:`.runners` schedules it locally or on Ray.
- :func:`~rankscope.batch.fleet.fleet_view` (``rankscope fleet``): machines blamed across jobs, a risk
  score, the quarantine list; :func:`load_quarantine` reads that list (the recovery executor's input).

Imports the floor and analytics; never the CLI, the collectors, the reports or recovery (which may import it).
"""

from __future__ import annotations

from rankscope.datasets.store.quarantine import load_quarantine

__all__ = ["load_quarantine"]
