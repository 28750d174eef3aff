"""The Flight Recorder captures the agent kept in a store, read back through the Flight Recorder reader.

Each capture is a set of raw per-rank dumps indexed in the ``fr_dumps`` table (see
:mod:`rankscope.datasets.store.fr_dumps`). The latest two captures are read (the analysis diagnoses the
latest and compares it with the one before); each dump's capture time is the hook's recorded dump time,
else the agent's capture time. A missing or unreadable dump is a note, never an abort.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from rankscope.datasets.domain.flight_recorder import FRDump
from rankscope.datasets.readers.flight_recorder import read_fr_file
from rankscope.spine import InputError


def read_fr_captures(
    store: Any, job: str, *, last: int = 2, not_before: float | None = None
) -> tuple[list[FRDump], list[str], dict[int, str]]:
    """(the dumps of the latest ``last`` captures, numbered oldest first; notes; rank -> node)."""
    if not store.files("fr_dumps", job=job):
        return [], [], {}
    rows = store.read_arrow("fr_dumps", job=job).to_pylist()
    by_time: dict[datetime, dict[int, dict[str, Any]]] = {}
    for row in rows:
        by_time.setdefault(row["capture_time"], {})[int(row["rank"])] = row  # a re-indexed rank: the last row
    times = sorted(by_time)
    notes: list[str] = []
    if not_before is not None:
        old = [t for t in times if t.timestamp() < not_before]
        if old:
            notes.append(f"{len(old)} Flight Recorder capture(s) from before the latest incident ignored")
        times = [t for t in times if t.timestamp() >= not_before]
    dumps: list[FRDump] = []
    nodes: dict[int, str] = {}
    bad: list[str] = []
    for i, t in enumerate(times[-last:]):
        for rank, row in sorted(by_time[t].items()):
            path = store.root / row["path"]
            try:
                d = read_fr_file(path, rank=rank)
            except (InputError, OSError) as exc:
                bad.append(str(exc))
                continue
            when = d.dump_time_ns or int(t.timestamp() * 1e9)
            dumps.append(replace(d, capture=i, dump_time_ns=when, source_format=f"store/{d.source_format}"))
            if row.get("node"):
                nodes[rank] = row["node"]
    if bad:
        notes.append(f"{len(bad)} kept Flight Recorder dump(s) unreadable: {bad[0]}"[:300])
    return dumps, notes, nodes
