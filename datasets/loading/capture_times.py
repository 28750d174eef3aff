"""Capture times a dump directory's round folders carry in their names, checked against its logs."""

from __future__ import annotations

import calendar
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rankscope.datasets.domain.bounds import open_regular
from rankscope.datasets.domain.stacks import ProcStacks
from rankscope.datasets.readers.dumpdir import DumpDir
from rankscope.spine import RankscopeError


def log_starts(dd: DumpDir, logs: Any) -> dict[str, float | None]:
    """Each log file's first timed step (naive, as written), None when it logged none."""
    out: dict[str, float | None] = {rel: None for _, rel in dd.log_files}
    for s in logs.steps if logs is not None else ():
        rel = s.source.rpartition(":")[0]
        if s.time is not None and rel in out:
            t = s.time - logs.zone_offset_s
            prev = out[rel]
            out[rel] = t if prev is None else min(t, prev)
    return out


def folder_capture_times(
    procs: Sequence[ProcStacks], notes: list[str], zone_s: float, logs: Mapping[str, float | None]
) -> dict[int, float]:
    """Capture rounds whose folders carry their capture time (``pyspy-20261202-055119/``): latest bounds, in
    the zone the logs' naive times were found to be in (``zone_s``)."""
    from rankscope.datasets.readers.capturefolders import folder_times

    out = {s: t + zone_s for s, t in folder_times(procs, logs).items()}
    if out:
        notes.append(
            f"capture times of {len(out)} round(s) read from their folder names (as the node's clock writes them): "
            "steps logged after a round's time show the job moving then"
        )
    return out


def file_capture_times(procs: Sequence[ProcStacks], root: str, notes: list[str], logs: Any) -> dict[int, float]:
    """The last snapshot's latest possible capture time from its stack files' modification times (epoch
    seconds): a capture tool writes its output as it takes it, and a copy without ``-p`` only makes the time
    later, so the newest modification time of the snapshot's trainer dumps is a bound the capture cannot be
    after; like a folder's stamp, only ever evidence that the job moved after it. Only when some log file's own
    modification time follows its last logged step within :data:`LOG_END_S` (written on the clock, and in the
    zone, its lines are read in: a copy resets it, and naive local times read as UTC are hours off): else file
    times and logged times are not comparable."""
    last = max((p.snapshot for p in procs if p.role == "trainer"), default=None)
    if last is None or not _clocks_agree(root, logs):
        return {}
    times = []
    for p in procs:
        if p.role != "trainer" or p.snapshot != last:
            continue
        try:
            times.append(os.stat(os.path.join(root, p.source)).st_mtime)
        except (OSError, ValueError):  # listed in a manifest but absent, or not a file's path
            continue
    if not times:
        return {}
    notes.append(
        "the last snapshot's latest possible capture time read from its files' modification times: steps logged "
        "after it show the job moving then"
    )
    return {last: max(times)}


LOG_END_S = 900.0
"""A log written to after its last step at most this long (a watchdog's timeout, the teardown): less than the
offset of any time zone from UTC (the smallest, a quarter-hour zone's from its whole hour, is 30 minutes off
UTC)."""


def _clocks_agree(root: str, logs: Any) -> bool:
    """Whether the logs' clock is the files' clock: the logs' steps are UTC (their lines' leading UTC stamps say
    so, :func:`_utc_by_content`) or some log file's modification time lies within [its last logged step - 60 s,
    + LOG_END_S]; and no time the logs hold (steps, launcher stops and failures, each rank's last stamped line)
    is later than the newest log file's modification time + 60 s (a file holds no line written after it was
    last written: naive local times east of UTC read as UTC do, and so does a file clock behind UTC)."""
    if logs is None:
        return False
    last_step: dict[str, float] = {}
    for s in logs.steps:
        rel = s.source.rpartition(":")[0]
        if s.time is not None and s.time > last_step.get(rel, float("-inf")):
            last_step[rel] = s.time
    utc = bool(last_step) and all(_utc_by_content(os.path.join(root, rel)) for rel in last_step)
    mtimes: dict[str, float] = {}
    for rel in {*logs.files, *last_step}:
        try:
            mtimes[rel] = os.stat(os.path.join(root, rel)).st_mtime
        except (OSError, ValueError):
            continue
    if not mtimes or not (utc or any(-60.0 <= mtimes[r] - t <= LOG_END_S for r, t in last_step.items() if r in mtimes)):
        return False
    held = [*last_step.values(), *logs.stopped, *logs.last_time.values()]
    held += [e.time for e in logs.launcher if e.time is not None]
    return max(held) <= max(mtimes.values()) + 60.0


_UTC_LEAD = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(?:\.\d+)?(?:Z|[+-]00:?00) ")
"""A line's leading UTC stamp (``kubectl logs --timestamps``, journald's ``--output=short-iso-precise``)."""
_INNER = re.compile(r"\[(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)")


def _utc_by_content(path: str) -> bool:
    """Whether a log's own naive stamps are UTC: in its first 64 KiB, lines carrying both a leading UTC stamp and
    an inner naive one (``2026-12-02T08:46:06.04Z [default0]: [2026-12-02 08:46:06] iteration ...``) agree
    within two minutes, every one of them (naive local times elsewhere are whole zones off)."""
    try:
        with open_regular(path) as fh:
            head = fh.read(1 << 16).decode("utf-8", errors="replace")
    except (OSError, RankscopeError):
        return False
    diffs = []
    for line in head.splitlines():
        lead = _UTC_LEAD.match(line)
        inner = _INNER.search(line, lead.end()) if lead else None
        if lead and inner:
            try:  # (a hostile date, 2026-13-45, is no stamp)
                a, b = (
                    calendar.timegm(time.strptime(f"{d} {t}", "%Y-%m-%d %H:%M:%S"))
                    for d, t in (lead.groups(), inner.groups())
                )
            except ValueError:
                return False
            diffs.append(abs(a - b))
    return bool(diffs) and max(diffs) <= 120
