"""What training and launcher logs say, as facts with a rank, a machine and a time.

The log reader (:mod:`rankscope.datasets.readers.logs`) turns torchrun consoles, ``--log-dir`` trees and
training logs into these records; the log analysis (:mod:`rankscope.analytics.logs`) decides. Stacks found
in logs (faulthandler blocks) become ordinary stacks, and exceptions ordinary process exits
(:class:`~rankscope.datasets.domain.exits.ProcessExit`), so they feed the stack and crash analyses.

Ranks are global ranks. A record's ``pg_rank`` is the rank *within* its process group (c10d's
``[PG ID p PG GUID g(desc) Rank r]`` prefix); ``rank`` is the global one (torchrun's ``[rank<N>]:``
prefix, or the file's identity), None when unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WatchdogRecord:
    """One ProcessGroupNCCL watchdog / heartbeat-monitor line.

    ``kind``: ``timeout`` ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=S, OpType=..,
    Timeout(ms)=T) ran for X milliseconds"), ``failure`` ("failure detected by watchdog at work sequence id: S
    PG status: last enqueued work: E, last completed work: C", and the older "Exception (either an error or
    timeout) detected by watchdog at work: S, last enqueued NCCL work: E, ..." and "Timeout at NCCL work:
    S, ..."), ``dump-signal`` (the heartbeat monitor's "Received a dump signal ... Last enqueued NCCL work: E,
    last completed NCCL work: C": the counters of the PG in its prefix when the job timed out), ``periodic``
    ("NCCL Work update periodically": counters at the rank's own moment, never compared across ranks),
    ``heartbeat`` ("Heartbeat monitor timed out! Process will be terminated ...": the rank's own watchdog thread
    stopped, its process is aborted; by default 8 minutes, before its peers' 10-minute collective timeouts).
    """

    kind: str
    rank: int | None
    node: str
    time: float | None  # epoch seconds (the line's glog stamp), None when the line has none
    pg_id: str | None = None
    pg_name: str | None = None  # the PG GUID (the group's name: the same on every member)
    pg_desc: str | None = None
    pg_rank: int | None = None
    seq: int | None = None
    op: str | None = None
    timeout_ms: int | None = None
    ran_for_ms: int | None = None
    last_enqueued: int | None = None
    last_completed: int | None = None
    source: str = ""  # file:line

    @property
    def group(self) -> str:
        """A key for the process group: its GUID (the same on every member), else its id."""
        return self.pg_name or (f"id:{self.pg_id}" if self.pg_id is not None else "?")


@dataclass(frozen=True)
class GlooRecord:
    """A gloo transport error: ``timeout`` ("Timed out waiting 40000ms for send operation to complete": the
    rank waited that long) or ``closed`` ("Connection closed by peer [ip]:port": a peer went away first)."""

    kind: str
    rank: int | None
    node: str
    time: float | None
    op: str | None = None  # send / recv
    timeout_ms: int | None = None
    peer: str | None = None  # the address of the peer that closed
    source: str = ""


@dataclass(frozen=True)
class StepRecord:
    """A training step line (Megatron ``iteration N/M | ... elapsed time per iteration (ms): X``)."""

    rank: int | None
    node: str
    time: float | None
    step: int
    elapsed_ms: float | None = None
    source: str = ""
    batch: int | None = None  # the global batch size the line states (Megatron's ramp-up changes it)


@dataclass(frozen=True)
class LauncherFailure:
    """One entry of torchrun's ``ChildFailedError`` summary (context: in a hang it names a peer's timeout)."""

    rank: int
    local_rank: int | None
    host: str
    time: float | None
    exitcode: int | None
    pid: int | None
    root_cause: bool  # listed under "Root Cause (first observed failure)"
    error: str = ""  # the traceback's last line, or "Signal 6 (SIGABRT) received by PID ..."
    source: str = ""


@dataclass(frozen=True)
class LogEvidence:
    """Everything the logs of one job said, merged over files."""

    watchdog: tuple[WatchdogRecord, ...] = ()
    gloo: tuple[GlooRecord, ...] = ()
    steps: tuple[StepRecord, ...] = ()
    launcher: tuple[LauncherFailure, ...] = ()
    ranks: Mapping[int, str] = field(default_factory=dict)  # every global rank whose lines were seen -> its node
    last_time: Mapping[int, float] = field(default_factory=dict)  # per rank, the time of its last stamped line
    files: tuple[str, ...] = ()
    stack_ranks: tuple[int, ...] = ()  # ranks whose faulthandler blocks became stacks
    notes: tuple[str, ...] = ()
    zone_offset_s: float = 0.0  # added to the logs' naive times to make them epoch times (0: assumed UTC)
    stopped: tuple[float, ...] = ()  # when launchers were stopped (a signal: scancel) or saw their workers fail

    @property
    def empty(self) -> bool:
        return not (self.watchdog or self.gloo or self.steps or self.launcher)
