"""The node agent: one daemon per training node that watches, samples, and captures evidence.

Every tick (``metric_interval_seconds``) it checks its trainers are alive, samples host, process
and GPU metrics, polls health events, tails training steps, and asks the stall detector and the
trigger whether to capture stacks now. The full /proc walk runs every
``discovery_interval_seconds`` (and at once when a trainer disappears). Rows go to a bounded
:class:`~rankscope.collectors.writer.BatchWriter` flushed every ``flush_interval_seconds`` and
right after a capture. Nothing raises out of a tick: each failure is counted in
:attr:`Agent.failures` and reported once in :attr:`Agent.messages`. SIGTERM/SIGINT stop the loop
and flush what it holds. Captures run in this process, each target in parallel.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rankscope.collectors import discovery, stacks
from rankscope.collectors.capture import CaptureSummary, Capturing
from rankscope.collectors.events import (
    DiskWatcher,
    Event,
    KernelLog,
    NicWatcher,
    NvmlEvents,
)
from rankscope.collectors.gpu_metrics import GpuSampler
from rankscope.collectors.host_metrics import HostSampler, Sample, self_usage
from rankscope.collectors.recover import RecoveryLoop
from rankscope.collectors.stall import StallDetector
from rankscope.collectors.steps import (
    NanWatch,
    StepTailer,
    to_metric_rows,
    to_timing_rows,
)
from rankscope.collectors.tracking import Tracking, _Known
from rankscope.collectors.trigger import Trigger
from rankscope.collectors.writer import BatchWriter
from rankscope.config import AgentConfig
from rankscope.datasets.readers import runfiles as rf
from rankscope.spine import atomic_write, remove_stale_temps


@dataclass(frozen=True)
class AgentReport:
    """The agent's account of one run (returned by :meth:`Agent.run`)."""

    ticks: int
    runtime_seconds: float
    cpu_seconds: float
    peak_rss_bytes: int
    captures: tuple[CaptureSummary, ...]
    rows_written: dict[str, int]
    rows_dropped: dict[str, int]
    write_errors: int
    events: int
    failures: dict[str, int]
    messages: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["captures"] = [asdict(c) for c in self.captures]
        d["messages"] = list(self.messages)
        return d

    def explain(self) -> str:
        caps = (
            ", ".join(
                f"#{c.snapshot} {c.reason} {c.round}/{c.rounds} ({c.n_processes} procs, "
                f"{c.n_failed} failed, {c.seconds:.2f}s)"
                for c in self.captures
            )
            or "none"
        )
        return (
            f"agent ran {self.runtime_seconds:.1f}s ({self.ticks} ticks, {self.cpu_seconds:.2f} CPU s, "
            f"peak RSS {self.peak_rss_bytes / 2**20:.0f} MiB); captures: {caps}; "
            f"rows written {sum(self.rows_written.values())}, dropped {sum(self.rows_dropped.values())}"
        )


class Agent(Tracking, Capturing):
    """The daemon. ``Agent(config).run()`` blocks until stopped; :meth:`tick` is one iteration."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
        launcher_pid: int | None = None,
        nvml: Any = None,
    ) -> None:
        self.cfg = config
        self.proc_root, self.sys_root = proc_root, sys_root
        self.launcher_pid = launcher_pid or config.launcher_pid or None
        self.run_dir = Path(config.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.writer = BatchWriter(config.store, max_rows=config.max_buffer_rows)
        disk_paths = (config.store, config.run_dir, *config.disk_paths)
        self.host = HostSampler(proc_root=proc_root, sys_root=sys_root, disk_paths=disk_paths)
        self.gpu = GpuSampler(enabled=config.gpu, nvml=nvml)
        self.watchers: list[Any] = [
            NicWatcher(sys_root),
            DiskWatcher(disk_paths, min_free_bytes=config.min_free_bytes),
            NvmlEvents(self.gpu),
        ]
        self.kernel_log = KernelLog(config.kernel_log)
        self.steps = StepTailer(config.run_dir)
        self.steps.skip_existing()
        self.nan_watch = NanWatch()
        self.detector = StallDetector(
            config.stall_seconds,
            rounds=config.capture_rounds,
            round_interval_seconds=config.round_interval_seconds,
            slow_factor=config.slow_factor,
        )
        self.trigger: Trigger | None = None
        self.recovery = RecoveryLoop(config, self.run_dir, flush=self.writer.flush) if config.recover else None
        self.known: dict[int, _Known] = {}
        self.alive: dict[int, discovery.ProcInfo] = {}
        self.exclude = discovery.self_and_ancestors(proc_root=proc_root)
        self.failures: dict[str, int] = {}
        self.collector_ok: dict[str, bool] = {}  # each collector's last run (the --metrics-port "up" gauge)
        self._metrics_server: Any = None
        self.messages: list[str] = []
        self.captures: list[CaptureSummary] = []
        self.n_events = 0
        self.ticks = 0
        self._next_discovery = 0.0
        self._next_flush = 0.0
        self._crash_since = None
        self._last_alive_check = 0.0
        self._crash_captured = False
        self._topology_written = False
        self._last_snapshot = 0
        self._urgent = False
        self._stop = threading.Event()
        self._started = time.time()
        for msg in (self.gpu.message, self.kernel_log.error):
            if msg:
                self._say(msg)

    # -- bookkeeping -------------------------------------------------------------------------
    def _say(self, message: str) -> None:
        if message not in self.messages and len(self.messages) < 100:  # bounded: each distinct failure once
            self.messages.append(message)

    def _fail(self, where: str, exc: BaseException) -> None:
        self.failures[where] = self.failures.get(where, 0) + 1
        self._say(f"{where}: {type(exc).__name__}: {exc}")

    def _event(self, ev: Event) -> None:
        self.n_events += 1
        if ev.severity == "critical":
            self._urgent = True  # the recovery side must see it this tick, not at the next flush
        self.writer.add("events", [ev.to_row(job=self.cfg.job, node=self.cfg.node)])

    def _node_of(self, rank: int | None, pid: int | None = None) -> str:
        k = self.known.get(pid) if pid is not None else None
        if k is not None:
            return k.node
        for k in self.known.values():
            if k.info.role == "trainer" and k.info.rank == rank and rank is not None:
                return k.node
        return self.cfg.node

    def stop(self) -> None:
        """Ask the loop to finish (it flushes first)."""
        self._stop.set()

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> AgentReport:
        """Tick until stopped (signal, :meth:`stop`, ``exit_after_captures``, ``max_runtime_seconds``)."""
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda s, f: self._stop.set())
            self.trigger = Trigger(self.cfg.trigger_file)
        else:
            self.trigger = Trigger(self.cfg.trigger_file, signum=None)
        try:
            remove_stale_temps(self.run_dir)  # what killed writers (hooks, triggers) left behind
            atomic_write(self.run_dir / rf.AGENT_PID, f"{os.getpid()}\n", durable=False)
        except OSError as exc:
            self._fail("pidfile", exc)
        if self.cfg.metrics_port:  # prometheus_client is imported only when asked for (the daemon stays lean)
            from rankscope.collectors.health import serve

            try:
                self._metrics_server = serve(self, self.cfg.metrics_port)
            except OSError as exc:
                self._fail("metrics_port", exc)
        self._event(Event("agent", f"agent started (pid {os.getpid()}, job {self.cfg.job})", pid=os.getpid()))
        for msg in self.messages:  # startup notes (no NVML, unreadable kernel log) are stored once too
            self._event(Event("agent", msg, pid=os.getpid()))
        try:
            while not self._stop.is_set():
                t0 = time.monotonic()
                self.tick()
                if (
                    self.cfg.exit_after_captures
                    and len(self.captures) >= self.cfg.exit_after_captures
                    and not self.detector.busy
                ):
                    break
                if self.cfg.max_runtime_seconds and time.time() - self._started >= self.cfg.max_runtime_seconds:
                    break
                self._stop.wait(max(0.0, self.cfg.metric_interval_seconds - (time.monotonic() - t0)))
        finally:
            self._health_metrics()
            self._event(Event("agent", "agent stopped", pid=os.getpid()))
            self.writer.flush()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if self.trigger is not None:
                self.trigger.close()
            self.kernel_log.close()
            self.gpu.close()
            if self._metrics_server is not None:
                self._metrics_server.shutdown()
                self._metrics_server = None
        return self.report()

    def report(self) -> AgentReport:
        cpu, rss = self_usage()
        return AgentReport(
            self.ticks,
            time.time() - self._started,
            cpu,
            rss,
            tuple(self.captures),
            dict(self.writer.written),
            dict(self.writer.dropped),
            self.writer.write_errors,
            self.n_events,
            dict(self.failures),
            tuple(self.messages),
        )

    def tick(self) -> None:
        """One iteration; every step is guarded so one failure never stops the others."""
        now = time.time()
        self.ticks += 1
        for name, step in (
            ("liveness", self._liveness),
            ("discovery", self._discovery),
            ("metrics", self._metrics),
            ("events", self._events),
            ("steps", self._steps),
            ("capture", self._maybe_capture),
            ("recovery", self._recover),
        ):
            try:
                step(now)
                self.collector_ok[name] = True
            except Exception as exc:
                self.collector_ok[name] = False
                self._fail(name, exc)
        if now >= self._next_flush:
            self._next_flush = now + self.cfg.flush_interval_seconds
            self._health_metrics()
            self.writer.flush()
        elif self._urgent:
            self.writer.flush(["processes", "events"])
        self._urgent = False

    # -- discovery and liveness ----------------------------------------------------------------

    def _discovery(self, now: float) -> None:
        if now < self._next_discovery:
            return
        self._next_discovery = now + self.cfg.discovery_interval_seconds
        declared = {}
        idents: dict[int, dict[str, Any]] = {}
        found = discovery.discover(self.proc_root, only_under=self.launcher_pid)
        for p in found:
            if p.pid in self.exclude:
                continue
            ident = self._identity(p.pid) if p.pid not in self.known else self.known[p.pid].identity
            idents[p.pid] = ident
            if ident.get("role") in ("dataloader", "checkpoint"):
                declared[p.pid] = ident["role"]
        if declared:
            found = discovery.discover(self.proc_root, only_under=self.launcher_pid, declared_roles=declared)
        new_rows = []
        current = {}
        for p in found:
            if p.pid in self.exclude:
                continue
            current[p.pid] = p
            k = self.known.get(p.pid)
            if k is not None and k.info == p:
                if not k.identity and p.role == "trainer":  # the hook may have started since
                    k.identity = self._identity(p.pid)
                    if k.identity.get("node"):
                        k.node = k.identity["node"]
                        self._renode_children(p.pid, k.node)
                        new_rows.append(p.to_row(job=self.cfg.job, node=k.node, time=datetime.now(timezone.utc)))
                continue
            ident = idents.get(p.pid) or self._identity(p.pid)
            if p.role == "trainer":
                node = ident.get("node") or self.cfg.node
            elif p.trainer_pid is not None and p.trainer_pid in self.known:
                node = self.known[p.trainer_pid].node
            else:
                node = self.cfg.node
            try:
                offset = stacks.stack_file(self.run_dir, p.pid).stat().st_size
            except OSError:
                offset = 0
            if p.role == "trainer" and k is None:
                self._crash_captured = False  # a new (or restarted) trainer re-arms the crash capture
                if not any(x.info.role == "trainer" and x.dead_since is None for x in self.known.values()):
                    self.detector.restart()  # a relaunched job: its startup is no stall, its steps count anew
                    self._topology_written = False  # and its ranks may run on other machines (standbys)
            self.known[p.pid] = _Known(p, node, offset, None, ident)
            new_rows.append(p.to_row(job=self.cfg.job, node=node, time=datetime.now(timezone.utc)))
        for pid, info in list(self.alive.items()):
            if pid not in current:  # died between the liveness check and this walk
                self._mark_dead(pid, info, now)
        self.alive = current
        for pid in [p for p, k in self.known.items() if k.dead_since is not None and now - k.dead_since > 3600]:
            del self.known[pid]  # bounded memory across restarts: forget processes dead for an hour
        if new_rows:
            self.writer.add("processes", new_rows)
        self._maybe_topology()

    def _renode_children(self, trainer_pid: int, node: str) -> None:
        for k in self.known.values():
            if k.info.trainer_pid == trainer_pid:
                k.node = node

    def _maybe_topology(self) -> None:
        """Write the topology table once every rank of the job has reported its coordinates."""
        if self._topology_written:
            return
        trainers = [k for k in self.known.values() if k.info.role == "trainer"]
        if not trainers:
            return
        world = trainers[0].info.world_size or 0
        by_rank = {}
        for k in trainers:
            if not k.identity.get("coords"):
                k.identity = self._identity(k.info.pid) or k.identity
                if k.identity.get("node"):
                    k.node = k.identity["node"]
            if k.info.rank is not None:
                by_rank[k.info.rank] = k
        if world <= 0 or len(by_rank) < world:
            return
        if not all(by_rank[r].identity.get("coords") for r in by_rank):
            return
        rows = []
        for r, k in sorted(by_rank.items()):
            coords = k.identity["coords"]
            rows.append(
                {
                    "job": self.cfg.job,
                    "rank": r,
                    "node": k.node,
                    "local_rank": k.info.local_rank,
                    **{d: int(coords.get(d, 0)) for d in ("tp", "cp", "ep", "dp", "pp")},
                }
            )
        self.writer.add("topology", rows)
        self._topology_written = True

    # -- metrics, events, steps ----------------------------------------------------------------
    def _metrics(self, now: float) -> None:
        ts = datetime.fromtimestamp(now, tz=timezone.utc)
        procs = [(p.pid, p.rank) for p in self.alive.values() if p.role != "launcher"]
        samples = self.host.sample(procs) + self.gpu.sample()
        rows = []
        for s in samples:
            node = self._node_of(s.rank, s.pid) if s.pid is not None else self.cfg.node
            rows.append(s.to_row(job=self.cfg.job, node=node, ts=ts))
        self.writer.add("metrics", rows)

    def _events(self, now: float) -> None:
        for source in (self.kernel_log, *self.watchers):
            where = f"events.{type(source).__name__}"
            try:
                for ev in source.poll():
                    self._event(ev)
                self.collector_ok[where] = True
            except Exception as exc:
                self.collector_ok[where] = False
                self._fail(where, exc)

    def _steps(self, now: float) -> None:
        pids = [p.pid for p in self.alive.values() if p.role == "trainer"]
        pids += [pid for pid, k in self.known.items() if k.info.role == "trainer" and pid not in self.alive]
        records = self.steps.poll(pids)
        if not records:
            return
        self.writer.add("metrics", to_metric_rows(records, job=self.cfg.job, node_of=self._node_of))
        self.writer.add("timings", to_timing_rows(records, job=self.cfg.job, node_of=self._node_of))
        for ev in self.nan_watch.events(records, node_of=self._node_of):
            self._event(ev)
        for rec in sorted(records, key=lambda r: r.t):
            self.detector.progress(rec.step, rec.t)

    def _recover(self, now: float) -> None:
        if self.recovery is not None:
            for ev in self.recovery.tick(now, self.captures, self.detector.busy):
                self._event(ev)
            if self.recovery.collect_rounds and not self.detector.busy:
                self.detector.rounds = self.recovery.collect_rounds
                self.detector.schedule(now, "collect", "the recovery plan asked for more evidence")
                self.detector.rounds = self.cfg.capture_rounds
                self.recovery.collect_rounds = 0

    # -- capture -------------------------------------------------------------------------------

    def _health_metrics(self) -> None:
        cpu, rss = self_usage()
        lab = {"component": "agent"}
        samples = [
            Sample("rankscope_agent_cpu_seconds_total", cpu, lab, pid=os.getpid()),
            Sample("rankscope_agent_peak_resident_memory_bytes", rss, lab, pid=os.getpid()),
            Sample("rankscope_agent_dropped_rows_total", self.writer.dropped_total, lab),
            Sample("rankscope_agent_write_errors_total", self.writer.write_errors, lab),
            Sample("rankscope_agent_failures_total", sum(self.failures.values()), lab),
            Sample("rankscope_agent_captures_total", len(self.captures), lab),
        ]
        ts = datetime.now(timezone.utc)
        self.writer.add("metrics", [s.to_row(job=self.cfg.job, node=self.cfg.node, ts=ts) for s in samples])
