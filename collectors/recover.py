"""The agent closes the loop: after a capture, ``rankscope recover STORE --job J --backend B [--apply]``.

The daemon stays lean and never imports analytics (collectors never do): the verdict, the plan and the
actions are made by a separate process, started argv-only (no shell), in a session of its own, with a
timeout (the process group is killed past it). One at a time: captures that arrive while one runs are
handled by the next. The executor it runs holds the job's lock, so agents on several nodes that fire
for the same incident act once; re-running an incident changes nothing (its idempotency key).

Stopping the job is part of an eviction, and the agent sees the trainers die: captures that start while
its own recovery runs, or within ``quiet_seconds`` after, are the recovery's doing, not a new incident,
and start nothing. A run the cool-down deferred (exit 3, "held until T") is run again at T. A plan that only
collects (exit 4: the verdict was too weak to act on) makes the agent take another capture series of
:data:`COLLECT_ROUNDS` rounds (at most :data:`MAX_COLLECTS` in a row), whose verdict is planned again. Each run's
output is kept in ``RUN_DIR/recover-<time>.log`` and its outcome becomes a ``recovery`` event in the store.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rankscope.collectors.events import Event
from rankscope.config import AgentConfig

DEFERRED = 3  # rankscope recover's exit code when the cool-down held the plan's disruptive actions
COLLECT = 4  # ... when the plan only asks for more evidence (a weak verdict): capture again, then plan again
MAX_COLLECTS = 2
"""Capture series the loop asks for in a row on "collect" plans before it leaves the job to a person."""
COLLECT_ROUNDS = 3
"""Rounds of such a series (several snapshots of a stuck job say more than one)."""
BOOTSTRAP = "import sys; del sys.path[0]; sys.argv[0] = 'rankscope'; from rankscope.cli.main import app; app()"
"""Runs the CLI with the working directory off ``sys.path`` (as the daemon itself does)."""


class RecoveryLoop:
    """Starts ``rankscope recover`` after each complete capture series; reports how each run ended."""

    def __init__(
        self,
        cfg: AgentConfig,
        run_dir: Path,
        *,
        flush: Callable[[], Any] = lambda: None,
        timeout_seconds: float = 600.0,
        quiet_seconds: float | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.flush = flush
        self.timeout_seconds = timeout_seconds
        self.quiet_seconds = (
            quiet_seconds
            if quiet_seconds is not None
            else max(15.0, 3 * cfg.crash_grace_seconds + cfg.discovery_interval_seconds)
        )
        self.handled = 0  # captures already acted on (or ignored)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.log: Path | None = None
        self.quiet_until = 0.0
        self.retry_at: float | None = None  # a run the cool-down deferred is re-planned then
        self.collect_rounds = 0  # >0: the last plan asked for more evidence: the agent captures this many rounds
        self.collects = 0  # such requests in a row
        self.runs = 0

    def argv(self) -> list[str]:
        cfg = self.cfg
        return [
            sys.executable,
            "-c",
            BOOTSTRAP,
            "recover",
            cfg.store,
            "--job",
            cfg.job,
            "--backend",
            cfg.recover,
            *cfg.recover_args,
        ]

    def tick(self, now: float, captures: Sequence[Any], busy: bool) -> list[Event]:
        """Reap a finished (or overdue) run; start one for a new complete capture series."""
        events = self._reap(now, len(captures))
        if self.proc is None and len(captures) > self.handled and not busy:
            new = captures[self.handled :]
            self.handled = len(captures)
            if any(c.snapshot > self.quiet_until for c in new):
                events.append(self._start(now, new[-1]))
        elif self.proc is None and self.retry_at is not None and now >= self.retry_at and captures:
            events.append(self._start(now, captures[-1], "re-planning after the cool-down"))
        return events

    def _start(self, now: float, capture: Any, why: str = "") -> Event:
        self.retry_at = None
        self.flush()  # the recover process reads the store: timings and metrics too, not only the capture
        self.runs += 1
        self.log = self.run_dir / f"recover-{int(now)}-{self.runs}.log"
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.started = now
        self.quiet_until = float("inf")  # while it runs
        mode = "apply" if "--apply" in self.cfg.recover_args else "dry run"
        return Event(
            "recovery",
            f"started rankscope recover --backend {self.cfg.recover} ({mode}) after capture {capture.snapshot} "
            f"({capture.reason}{'; ' + why if why else ''}); output in {self.log}",
            labels={"pid": self.proc.pid, "backend": self.cfg.recover, "apply": mode == "apply"},
        )

    def _reap(self, now: float, n_captures: int) -> list[Event]:
        if self.proc is None:
            return []
        code = self.proc.poll()
        if code is None and now - self.started < self.timeout_seconds:
            return []
        if code is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            what, severity = f"killed after {self.timeout_seconds:g} s (timeout)", "warning"
        else:
            what = {
                0: "done",
                1: "a step failed",
                DEFERRED: "deferred by the cool-down",
                COLLECT: "asked for more evidence",
            }.get(code, f"exit {code}")
            severity = "info" if code in (0, DEFERRED, COLLECT) else "warning"
        tail = _tail(self.log)
        if code == DEFERRED:
            try:
                text = self.log.read_text(errors="replace")[-20000:] if self.log else ""
            except OSError:
                text = ""
            held = re.findall(r"held until (\d+(?:\.\d+)?)", text)
            self.retry_at = float(held[-1]) + 1.0 if held else now + self.quiet_seconds
        self.proc = None
        self.handled = max(self.handled, n_captures)  # what fired meanwhile was the recovery's own doing
        self.quiet_until = time.time() + self.quiet_seconds
        if code == COLLECT and self.collects < MAX_COLLECTS:
            self.collects += 1
            self.collect_rounds = COLLECT_ROUNDS
            self.quiet_until = time.time()  # nothing was stopped: the next capture is evidence, not our doing
            what += f"; capturing {COLLECT_ROUNDS} more rounds ({self.collects} of {MAX_COLLECTS})"
        elif code != COLLECT:
            self.collects = 0
        return [
            Event(
                "recovery",
                f"rankscope recover {what} in {now - self.started:.1f} s: {tail}",
                severity=severity,
                labels={"exit_code": code, "log": str(self.log), "seconds": round(now - self.started, 3)},
            )
        ]


def _tail(path: Path | None, limit: int = 600) -> str:
    if path is None:
        return ""
    try:
        text = path.read_bytes()[-4000:].decode(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-4:])[-limit:]
