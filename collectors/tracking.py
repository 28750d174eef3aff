"""Tracking the watched processes: who is alive, and what a dead one left behind (see :class:`Tracking`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.collectors import discovery, stacks
from rankscope.collectors.events import Event
from rankscope.collectors.stall import StallDetector
from rankscope.config import AgentConfig
from rankscope.datasets.readers import runfiles as rf


def _exit_labels(rec: dict[str, Any]) -> dict[str, Any]:
    """Structured facts of an exit for the ``events`` row (rankscope.datasets.domain.exits reads them back)."""
    if not rec:
        return {"time_source": "detected"}  # no record: the time is when the agent noticed (<= 1 tick late)
    frames = rec.get("frames") or []
    top = frames[0] if frames and isinstance(frames[0], dict) else {}
    where = f"{top.get('function')} ({os.path.basename(str(top.get('file')))}:{top.get('line')})" if top else ""
    return {
        "exception": rec.get("type"),
        "message": str(rec.get("message", ""))[:500],
        "where": where,
        "time_source": rec.get("time_source", "hook"),
    }


@dataclass
class _Known:
    """A process the agent has seen, kept after it dies (for post-mortem stacks)."""

    info: discovery.ProcInfo
    node: str
    stack_offset: int = 0
    dead_since: float | None = None
    identity: dict[str, Any] = field(default_factory=dict)
    exit_reported: bool = False  # its exception was recorded before the process was gone


class Tracking:
    """The agent's liveness checks: a watched process that is gone has its exit recorded (with the hook's
    exception record when there is one); a trainer's death arms the crash capture. A mixin of
    :class:`~rankscope.collectors.agent.Agent` (the attributes below are the agent's)."""

    cfg: AgentConfig
    run_dir: Path
    proc_root: str
    known: dict[int, _Known]
    alive: dict[int, discovery.ProcInfo]
    detector: StallDetector
    _crash_since: float | None
    _last_alive_check: float
    _crash_captured: bool
    _urgent: bool
    _next_discovery: float
    _event: Callable[[Event], None]
    _fail: Callable[[str, BaseException], None]
    _node_of: Callable[..., str]

    def _liveness(self, now: float) -> None:
        """A signal-0 probe per process (no file read); the periodic /proc walk catches PID reuse."""
        for pid, info in list(self.alive.items()):
            if self.proc_root != "/proc":  # a fake tree (tests): its pids are not real processes
                gone = not discovery.alive(pid, info.start_ticks, self.proc_root)
            else:
                try:
                    os.kill(pid, 0)
                    gone = False
                except PermissionError:
                    gone = False  # exists, owned by another user
                except OSError:
                    gone = True
            if gone:
                self._mark_dead(pid, info, now)
            elif info.role == "trainer":
                self._exception_written(pid, info, now)
        self._last_alive_check = now  # the survivors were alive at this moment

    def _exception_written(self, pid: int, info: discovery.ProcInfo, now: float) -> None:
        """A trainer whose hook wrote its uncaught exception is dying, however long its teardown takes (torch
        destroying process groups, atexit handlers): record the exit now, so a capture that fires meanwhile
        (the peers stall at once) already holds the first failure."""
        k = self.known.get(pid)
        if k is None or k.exit_reported or not rf.path(self.run_dir, pid, rf.EXIT).exists():
            return
        rec = self._exit_record(pid)
        if not rec or rec.get("type") == "exit":
            return  # a normal exit (or a record still being written): the liveness check records it
        k.exit_reported = True
        self._exit_event(pid, info, rec, now)

    def _mark_dead(self, pid: int, info: discovery.ProcInfo, now: float) -> None:
        """``pid`` is gone: record the exit (and its exception, if the hook saw one); a trainer's arms the
        crash capture."""
        self.alive.pop(pid, None)
        k = self.known.get(pid)
        if k is not None:
            k.dead_since = now
        if info.role == "trainer" and k is not None and k.exit_reported:
            self._next_discovery = 0.0  # its exit is already recorded (it wrote its exception while alive)
        elif info.role == "trainer":
            exit_rec = self._exit_record(pid)
            if not exit_rec:  # no exception record: did faulthandler write a dump as it died?
                how = stacks.death_signal(
                    pid, self.run_dir, offset=k.stack_offset if k is not None else 0, since=self._last_alive_check - 1.0
                )  # 1 s: mtime granularity
                if how is not None:
                    exit_rec = {"type": how[0], "message": how[1], "time": how[2], "time_source": "stack-dump"}
            self._exit_event(pid, info, exit_rec, now)
            self._next_discovery = 0.0

    def _exit_event(self, pid: int, info: discovery.ProcInfo, exit_rec: dict[str, Any], now: float) -> None:
        """The ``process_exit`` event of a trainer (arms the crash capture unless it exited normally)."""
        normal = exit_rec.get("type") == "exit"
        msg = (
            f"rank {info.rank} (pid {pid}) exited: {exit_rec.get('type')}: {exit_rec.get('message')}"
            if exit_rec
            else f"rank {info.rank} (pid {pid}) vanished (signal or os._exit)"
        )
        self._event(
            Event(
                "process_exit",
                msg,
                severity="info" if normal else "",
                action="none" if normal else "",
                rank=info.rank,
                pid=pid,
                node=self._node_of(info.rank, pid),
                ts=float(exit_rec.get("time", now)) if exit_rec else now,
                labels=_exit_labels(exit_rec),
            )
        )
        if not normal and self._crash_since is None and not self._crash_captured:
            self._crash_since = now

    def _exit_record(self, pid: int) -> dict[str, Any]:
        try:
            return json.loads((rf.path(self.run_dir, pid, rf.EXIT)).read_text())
        except (OSError, ValueError):
            return {}

    def _identity(self, pid: int) -> dict[str, Any]:
        try:
            return json.loads((rf.path(self.run_dir, pid, rf.IDENTITY)).read_text())
        except (OSError, ValueError):
            return {}
