"""Engines that schedule the per-job function (:func:`rankscope.batch.job.analyse_job`); they only schedule it.

- :class:`LocalRunner`: in this process (``workers=1``) or a pool of ``workers`` processes (forkserver:
  polars' thread pool must not be forked). Workers ignore SIGINT/SIGTERM: a stop is the driver's
  decision, taken between jobs, and the jobs in flight finish.
- :class:`RayRunner`: one ``@ray.remote`` task per job (never a ``map_groups`` over the store: that would
  shuffle every row through the object store). Without an address it starts a local instance with
  ``workers`` CPUs, a capped object store and no dashboard; ``address`` joins an existing cluster (a
  KubeRay head: ``ray://head:10001`` or ``auto`` inside the cluster), whose workers need rankscope
  installed and the store mounted at the same path.

Both keep a bounded number of jobs in flight (a few per worker) and hand each result to ``on_result`` in
the driver as it arrives, so the driver records watermarks as jobs finish, not at the end.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

from rankscope.spine import InputError

JobFn = Callable[..., dict[str, Any]]
OnResult = Callable[[dict[str, Any]], None]
Stop = Callable[[], bool]
IN_FLIGHT_PER_WORKER = 4


def _failed(job: str, error: str) -> dict[str, Any]:
    """The result of a job whose worker died under it (retried next run)."""
    return {
        "job": job,
        "status": "failed",
        "error": error,
        "transient": True,
        "incidents": 0,
        "diagnosed": 0,
        "written": 0,
        "verdicts": [],
        "seconds": 0.0,
    }


def _ignore_stop_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class LocalRunner:
    """Serial in this process, or a process pool of ``workers``."""

    name = "local"

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self.pool: Any = None

    def __enter__(self) -> LocalRunner:
        if self.workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            ctx = multiprocessing.get_context("forkserver")
            self.pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_ignore_stop_signals)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def run(
        self, fn: JobFn, root: str, jobs: Sequence[str], kwargs: dict[str, Any], on_result: OnResult, stop: Stop
    ) -> None:
        if self.pool is None:
            for job in jobs:
                if stop():
                    return
                on_result(fn(root, job, **kwargs))
            return
        from concurrent.futures import FIRST_COMPLETED, wait

        pending = list(reversed(jobs))
        running: dict[Any, str] = {}
        while pending or running:
            while pending and len(running) < self.workers * IN_FLIGHT_PER_WORKER and not stop():
                job = pending.pop()
                running[self.pool.submit(fn, root, job, **kwargs)] = job
            if not running:
                return
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in finished:
                job = running.pop(fut)
                try:
                    result = fut.result()
                except Exception as exc:  # the worker process died (OOM kill, ...): BrokenProcessPool
                    result = _failed(job, f"worker died: {type(exc).__name__}: {exc}")
                on_result(result)
            if stop():
                pending.clear()


class RayRunner:
    """One Ray task per job, on a local instance or the cluster at ``address``."""

    name = "ray"

    def __init__(self, workers: int = 2, *, address: str = "", object_store_bytes: int = 200_000_000) -> None:
        self.workers = workers
        self.address = address
        self.object_store_bytes = object_store_bytes
        self.started = False
        self.ray: Any = None

    def __enter__(self) -> RayRunner:
        try:
            import ray
        except ImportError:
            raise InputError("--runner ray needs Ray: pip install 'rankscope[ray]' (or ray)") from None
        self.ray = ray
        if not ray.is_initialized():
            import logging

            opts: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
            if self.address:
                ray.init(address=self.address, **opts)
            else:
                ray.init(num_cpus=self.workers, object_store_memory=self.object_store_bytes, **opts)
            self.started = True
        if not self.address:
            self.workers = max(1, int(self.ray.cluster_resources().get("CPU", self.workers)))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started and self.ray is not None:
            self.ray.shutdown()
            self.started = False

    def run(
        self, fn: JobFn, root: str, jobs: Sequence[str], kwargs: dict[str, Any], on_result: OnResult, stop: Stop
    ) -> None:
        ray = self.ray
        task = ray.remote(num_cpus=1, max_retries=1)(fn)
        window = max(1, int(ray.cluster_resources().get("CPU", self.workers))) * IN_FLIGHT_PER_WORKER
        pending = list(reversed(jobs))
        running: dict[Any, str] = {}
        while pending or running:
            while pending and len(running) < window and not stop():
                job = pending.pop()
                running[task.remote(root, job, **kwargs)] = job
            if not running:
                return
            finished, _ = ray.wait(list(running), num_returns=1)
            for ref in finished:
                job = running.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as exc:  # the task's worker died (RayTaskError, WorkerCrashedError)
                    words = " ".join(str(exc).split())[:300]
                    result = _failed(job, f"ray task failed: {type(exc).__name__}: {words}")
                on_result(result)
            if stop():
                pending.clear()


def make_runner(name: str, workers: int, *, address: str = "", object_store_bytes: int = 200_000_000) -> Any:
    """The runner called ``name`` (local or ray)."""
    if name == "local":
        if address:
            raise InputError("--ray-address needs --runner ray")
        return LocalRunner(max(1, workers))
    if name == "ray":
        return RayRunner(workers or os.cpu_count() or 1, address=address, object_store_bytes=object_store_bytes)
    raise InputError(f"--runner {name!r} is not one of local, ray")
