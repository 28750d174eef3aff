"""A parsed Flight Recorder dump: entries, process-group config and status (see ``readers.flight_recorder``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from rankscope.datasets.domain.stacks import Frame


class FREntry(NamedTuple):
    """One FR record. A NamedTuple, not a dataclass: a large job has millions of them.

    ``op`` is the profiling name without its backend prefix and peer suffix (``all_reduce``,
    ``send``); for p2p, ``src``/``dst`` are the group-local ranks of ``send 0->1``/``recv 1<-0``.
    Sizes are tuples of shapes; frames are innermost first, as in the stacks table.
    """

    record_id: int
    pg_id: str
    pg_name: str
    pg_desc: str
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    profiling_name: str
    backend: str
    op: str
    is_p2p: bool
    src: int | None
    dst: int | None
    state: str
    retired: bool
    time_created_ns: int | None
    time_discovered_started_ns: int | None
    time_discovered_completed_ns: int | None
    duration_ms: float | None
    timeout_ms: int | None
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    frames: tuple[Frame, ...] = ()


@dataclass(frozen=True)
class PGInfo:
    """One process group as a rank's ``pg_config`` describes it; ``ranks`` is None when unknown."""

    name: str
    desc: str
    ranks: tuple[int, ...] | None


class PGStatus(NamedTuple):
    """A rank's ``pg_status`` for one group: the last enqueued/started/completed op's sequence id.

    PyTorch keys ``pg_status`` by **pg_id** (``FlightRecorder::getPgStatusJson``); the reader files it
    under the group's name, translated through the dump's own entries, and keeps the id here. On a group
    that carries send/recv the counters may be p2p sequence ids: never compare them with collective ones.
    """

    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None
    pg_id: str = ""


DUMP_TIME_KEY = "rankscope_dump_time_ns"
"""The top-level key the rankscope hook adds to the dumps it writes: when the dump was taken (epoch ns)."""


@dataclass(frozen=True)
class FRDump:
    """One rank's Flight Recorder dump.

    ``pg_status`` is keyed by pg name (see :class:`PGStatus`). ``dump_time_ns`` is when the dump was
    taken, where a collector recorded it (the hook's :data:`DUMP_TIME_KEY`, the agent's capture time);
    FR itself records no dump time. ``capture`` orders several captures of one job (a larger number is
    later: snapshot folders, the agent's captures). ``notes`` are what the reader dropped and why.
    """

    rank: int
    entries: tuple[FREntry, ...]
    version: str = ""
    pg_config: Mapping[str, PGInfo] = field(default_factory=dict)
    pg_status: Mapping[str, PGStatus] = field(default_factory=dict)
    comm_lib_version: str = ""
    source_file: str = ""
    source_format: str = ""  # fr-pickle | fr-json | store
    dump_time_ns: int | None = None
    capture: int = 0
    notes: tuple[str, ...] = ()

    @property
    def backend(self) -> str:
        """The communication backend of the entries (``nccl``, ``gloo``, ...), ``""`` without entries."""
        return next((e.backend for e in self.entries if e.backend), "")
