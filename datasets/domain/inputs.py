"""The :class:`Inputs` bundle: everything loaded for one job, handed to ``analytics.diagnose``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankscope.datasets.domain.exits import ProcessExit
from rankscope.datasets.domain.flight_recorder import FRDump
from rankscope.datasets.domain.logs import LogEvidence
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
    logs: LogEvidence | None = None  # what training and launcher logs said (watchdog, gloo, steps, summary)
    expected_ranks: Mapping[int, str] = field(default_factory=dict)
    """Ranks known to exist from a source independent of the stack files (a manifest row, the hook's
    identity, the layout's world size, a Flight Recorder pg_config, the logs): rank -> that source. A rank
    missing from the stacks is a *missing dump* only when it is here; a gap in file numbering is not."""
    inferred_nodes: tuple[str, ...] = ()  # machine names nobody gave (node-<rank // G>): not to act on blindly
    source_files: tuple[tuple[str, str], ...] = ()  # (path as the rows name it, kind): what was read (ingest)
    assumed_ranks: tuple[int, ...] = ()
    """Ranks whose global number was assumed (sibling trainers numbered by pid, local ranks mapped by host
    order): their machine is exact, their parallel group only if the assumption holds."""
    # snapshot -> the latest it can have been taken (a stack file's modification time: copying only makes it
    # later, so it proves a job progressed up to a stop, never that it hung)
    snapshot_latest: Mapping[int, float] = field(default_factory=dict)
