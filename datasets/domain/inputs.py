"""The :class:`Inputs` bundle: everything loaded for one job, handed to ``analytics.diagnose``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankscope.datasets.domain.exits import ProcessExit
from rankscope.datasets.domain.flight_recorder import FRDump
from rankscope.datasets.domain.stacks import ProcStacks
from rankscope.datasets.domain.topology import Topology


@dataclass(frozen=True)
class Inputs:
    """One job's evidence, in memory: whatever a dump directory, run directory or store held."""

    job: str
    topology: Topology | None  # None when only node metrics / timings without ranks were found
    procs: tuple[ProcStacks, ...]
    fr_dumps: tuple[FRDump, ...] = ()
    metrics: Any = None  # polars DataFrame or None
    timings: Any = None
    notes: tuple[str, ...] = ()
    source: str = ""
    memberships: Mapping[str, Sequence[int]] = field(default_factory=dict)
    exits: tuple[ProcessExit, ...] = ()  # abnormal process exits (hook records or the agent's events)
    snapshot_times: Mapping[int, float] = field(default_factory=dict)  # snapshot -> wall time (the agent's)
    # snapshot -> the latest it can have been taken (a stack file's modification time: copying only makes it
    # later, so it proves a job progressed up to a stop, never that it hung)
    snapshot_latest: Mapping[int, float] = field(default_factory=dict)
