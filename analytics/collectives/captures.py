"""Two captures of one job: did anything move between them?

A rank *advanced* between two captures when it issued new ops (its newest ``record_id`` grew) or
finished some (fewer unfinished entries). An op still unfinished in both captures has been in flight
at least as long as the interval between them, when both captures carry an explicit time: no counter
advancing over an interval far longer than the job's cadence is a hang even where the entries carry
no usable timestamps. Waits that are all new since the earlier capture, on ranks that all advanced,
show a job that was running when it was captured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankscope.analytics.collectives.tables import is_done, tracks_state
from rankscope.datasets.domain.flight_recorder import FRDump
from rankscope.datasets.domain.stacks import ProcStacks


def _state(d: FRDump) -> tuple[int, int]:
    tracks = tracks_state(d)
    newest = max((e.record_id for e in d.entries), default=-1)
    return newest, sum(1 for e in d.entries if not is_done(e, tracks))


def _pending_ids(d: FRDump) -> set[int]:
    tracks = tracks_state(d)
    return {e.record_id for e in d.entries if not is_done(e, tracks)}


@dataclass(frozen=True)
class Progress:
    """What changed between the previous capture and the latest."""

    previous: int  # the earlier capture's number
    ranks: tuple[int, ...]  # ranks in both captures
    advanced: tuple[int, ...]  # ranks that issued or finished ops in between
    interval_s: Mapping[int, float] = field(default_factory=dict)  # rank -> explicit seconds between its dumps
    pending_before: Mapping[int, frozenset[int]] = field(default_factory=dict)  # rank -> record ids unfinished then

    def to_dict(self) -> dict[str, Any]:
        iv = sorted(self.interval_s.values())
        return {
            "previous_capture": self.previous,
            "n_ranks_in_both": len(self.ranks),
            "n_advanced": len(self.advanced),
            "interval_seconds": round(iv[0], 3) if iv else None,
        }


def compare(previous: Mapping[int, FRDump], latest: Mapping[int, FRDump], capture: int) -> Progress:
    """Rank by rank, the latest capture against the previous one."""
    both = tuple(sorted(set(previous) & set(latest)))
    advanced = []
    interval: dict[int, float] = {}
    pending: dict[int, frozenset[int]] = {}
    for r in both:
        a, b = previous[r], latest[r]
        if _state(a) != _state(b):
            advanced.append(r)
        if a.dump_time_ns and b.dump_time_ns and b.dump_time_ns > a.dump_time_ns:
            interval[r] = (b.dump_time_ns - a.dump_time_ns) / 1e9
        pending[r] = frozenset(_pending_ids(a))
    return Progress(capture, both, tuple(advanced), interval, pending)


def split_captures(dumps: list[FRDump]) -> tuple[list[FRDump], list[FRDump], int | None]:
    """(the latest capture's dumps, the previous capture's dumps, the previous capture's number)."""
    caps = sorted({d.capture for d in dumps})
    if len(caps) < 2:
        return dumps, [], None
    latest, prev = caps[-1], caps[-2]
    return [d for d in dumps if d.capture == latest], [d for d in dumps if d.capture == prev], prev


CO_CAPTURE_S = 30.0
"""A Flight Recorder capture and a stack snapshot whose recorded times lie this close were taken together."""


def stack_rounds_of(
    dumps: Sequence[FRDump],
    procs: Sequence[ProcStacks],
    snapshot_times: Mapping[int, float],
    previous: int,
) -> tuple[int, int] | None:
    """The stack snapshots taken together with the previous and the latest Flight Recorder capture, when each
    has one: dumps in the same folder as that snapshot's stack files (a capture round's folder per host), else
    the snapshot nearest its recorded time, within :data:`CO_CAPTURE_S`. Then what the Flight Recorder saw move
    between its captures moved between those snapshots too; captures from another time (a periodic dump hours
    earlier) pair with none.
    """
    latest = max((d.capture for d in dumps), default=previous)
    if latest == previous:
        return None
    folders: dict[int, set[str]] = {}
    for p in procs:
        folder = p.source.rsplit("/", 1)[0] if "/" in p.source else ""
        if folder:
            folders.setdefault(p.snapshot, set()).add(folder)

    def snapshot_of(capture: int) -> int | None:
        mine = [d for d in dumps if d.capture == capture]
        where = {d.source_file.rsplit("/", 1)[0] for d in mine if "/" in d.source_file}
        found = {
            s
            for s, fs in folders.items()
            if any(w == f or w.endswith("/" + f) or f.endswith("/" + w) for w in where for f in fs)
        }
        if len(found) == 1:
            return found.pop()
        times = [d.dump_time_ns / 1e9 for d in mine if d.dump_time_ns]
        if found or not times or not snapshot_times:
            return None
        t = max(times)  # the nearest snapshot in time (rounds may be seconds apart), if near enough
        s, st = min(snapshot_times.items(), key=lambda x: abs(x[1] - t))
        return s if abs(st - t) <= CO_CAPTURE_S else None

    before, now = snapshot_of(previous), snapshot_of(latest)
    if before is None or now is None or before >= now:
        return None
    return before, now
