"""Captures: what the agent does when a stall, a crash or a trigger fires (see :class:`Capturing`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rankscope.collectors import discovery, hook, stacks
from rankscope.collectors.events import Event
from rankscope.collectors.stall import Firing, StallDetector
from rankscope.collectors.trigger import Trigger
from rankscope.collectors.writer import BatchWriter
from rankscope.config import AgentConfig
from rankscope.datasets.readers import runfiles as rf


@dataclass(frozen=True)
class CaptureSummary:
    """What one capture round did."""

    snapshot: int
    reason: str
    round: int
    rounds: int
    n_processes: int
    n_failed: int
    methods: dict[str, int]
    seconds: float
    fr_dumps: int = 0
    detail: str = ""


def _release_freed_memory() -> None:
    """Give the heap a capture freed back to the OS (glibc keeps it otherwise): a capture's stack rows and
    their Arrow conversion are a transient the daemon should not keep for weeks."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to do
        pass


class Capturing:
    """The agent's captures: stacks of every watched process in parallel, the hooks' timestamped dumps and
    Flight Recorder dumps, each capture flushed at once. A mixin of :class:`~rankscope.collectors.agent.Agent`
    (the attributes below are the agent's)."""

    cfg: AgentConfig
    run_dir: Path
    writer: BatchWriter
    detector: StallDetector
    trigger: Trigger | None
    known: dict[int, Any]
    alive: dict[int, discovery.ProcInfo]
    captures: list[CaptureSummary]
    _last_snapshot: int
    _crash_since: float | None
    _crash_captured: bool
    _urgent: bool
    _event: Callable[[Event], None]
    _fail: Callable[[str, BaseException], None]
    _node_of: Callable[..., str]

    def _maybe_capture(self, now: float) -> None:
        if self.trigger is not None:
            opts = self.trigger.poll()
            if opts is not None:
                rounds = int(opts.get("rounds", self.cfg.capture_rounds) or 1)
                self.detector.rounds = max(1, rounds)
                self.detector.schedule(now, "trigger", f"requested by {opts.get('source')}")
                self.detector.rounds = self.cfg.capture_rounds
        if self._crash_since is not None:
            trainers_alive = any(p.role == "trainer" for p in self.alive.values())
            if not trainers_alive or now - self._crash_since >= self.cfg.crash_grace_seconds:
                self._crash_since = None
                self._crash_captured = True
                self.capture(Firing("crash", 1, 1, "a trainer process exited"))
                return
        if not any(p.role == "trainer" for p in self.alive.values()):
            return  # nothing alive to stall; a crash is handled above
        firing = self.detector.check(now)
        if firing is not None:
            self.capture(firing)

    def capture(self, firing: Firing) -> CaptureSummary:
        """Capture every known process now (py-spy, fallbacks, post-mortem) and flush the snapshot."""
        t0 = time.perf_counter()
        now = time.time()
        snapshot = max(int(now), self._last_snapshot + 1)
        self._last_snapshot = snapshot
        live = [
            stacks.Target(p.pid, p.rank, p.role, self._node_of(p.rank, p.pid))
            for p in self.alive.values()
            if p.role != "launcher"
        ]
        sig = hook._signal_number(os.environ.get(hook.ENV_STACK_SIGNAL, hook.DEFAULT_STACK_SIGNAL))
        caps = stacks.capture_all(
            live,
            run_dir=str(self.run_dir),
            timeout_seconds=self.cfg.stack_timeout_seconds,
            pyspy=self.cfg.pyspy,
            signum=sig,
        )
        for pid, k in self.known.items():
            if k.dead_since is None or k.info.role != "trainer":
                continue
            dump, method = stacks.post_mortem(pid, self.run_dir, offset=k.stack_offset)
            caps.append(stacks.Capture(stacks.Target(pid, k.info.rank, "trainer", k.node), dump, method, 0.0))
        for c in caps:
            known = self.known.get(c.target.pid)
            if known is not None and c.method == "faulthandler":  # later fallbacks and post-mortems must not re-read it
                try:
                    known.stack_offset = stacks.stack_file(self.run_dir, c.target.pid).stat().st_size
                except OSError:
                    pass
            # then a timestamped dump from each live trainer's hook too: the run directory's evidence if
            # the dump SIGTERM writes at teardown is cut off (post-mortems skip it by its time line)
            if c.target.role == "trainer" and c.method in ("py-spy", "faulthandler"):
                hook.request(self.run_dir, c.target.pid, "stack")
        when = datetime.fromtimestamp(now, tz=timezone.utc)
        self.writer.add("stacks", stacks.capture_rows(caps, job=self.cfg.job, snapshot=snapshot, when=when))
        fr = 0
        if self.cfg.capture_flight_recorder and firing.round == 1:
            try:
                fr = self._flight_recorder(now)
            except Exception as exc:
                self._fail("flight_recorder", exc)
        methods: dict[str, int] = {}
        for c in caps:
            methods[c.method] = methods.get(c.method, 0) + 1
        summary = CaptureSummary(
            snapshot,
            firing.reason,
            firing.round,
            firing.rounds,
            len(caps),
            sum(c.dump.status == "failed" for c in caps),
            methods,
            time.perf_counter() - t0,
            fr,
            firing.detail,
        )
        self.captures.append(summary)
        kind = {"stall": "stall", "fail-slow": "fail_slow"}.get(firing.reason, "capture")
        self._event(
            Event(
                kind,
                f"captured snapshot {snapshot} ({firing.reason} {firing.round}/{firing.rounds}): "
                f"{summary.n_processes} processes, {summary.n_failed} failed; {firing.detail}",
                labels={"snapshot": snapshot, "methods": methods, "seconds": round(summary.seconds, 3)},
            )
        )
        self.writer.flush(["processes", "topology", "stacks", "fr_dumps", "events"])
        _release_freed_memory()
        return summary

    def _flight_recorder(self, now: float) -> int:
        """Ask every live trainer's hook for a Flight Recorder dump and keep the ones that arrive, raw: the
        bytes go into the store unparsed (the ``fr_dumps`` index says where), so a capture costs the agent a
        streamed file copy, not a decode of every rank's ring buffer."""
        from rankscope.datasets.store.fr_dumps import keep_dump

        trainers = [p for p in self.alive.values() if p.role == "trainer"]
        asked = {p.pid: p for p in trainers if hook.request(self.run_dir, p.pid, "fr")}
        deadline = time.monotonic() + self.cfg.stack_timeout_seconds
        done: dict[int, Path] = {}
        while asked and len(done) < len(asked) and time.monotonic() < deadline:
            for pid in asked:
                if pid in done:
                    continue
                for kind in (rf.FR, rf.FR_PICKLE):  # the hook pickles when torch has no JSON dump
                    path = rf.path(self.run_dir, pid, kind)
                    if path.exists() and path.stat().st_mtime >= now - 1:
                        done[pid] = path
            time.sleep(0.05)
        rows = []
        for pid, path in done.items():
            p = asked[pid]
            if p.rank is None:
                continue
            try:
                rows.append(
                    keep_dump(
                        self.cfg.store,
                        path,
                        job=self.cfg.job,
                        capture_time=now,
                        rank=p.rank,
                        node=self._node_of(p.rank, pid),
                        pid=pid,
                    )
                )
            except Exception as exc:
                self._fail("flight_recorder.keep", exc)
        if rows:
            self.writer.add("fr_dumps", rows)
        return len(rows)
