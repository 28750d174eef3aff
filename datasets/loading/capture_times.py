"""Capture times a dump directory's round folders carry in their names, checked against its logs."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from rankscope.datasets.domain.stacks import ProcStacks
from rankscope.datasets.readers.dumpdir import DumpDir


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


def file_capture_times(procs: Sequence[ProcStacks], root: str, notes: list[str]) -> dict[int, float]:
    """The last snapshot's latest possible capture time from its stack files' modification times (epoch
    seconds): a capture tool writes its output as it takes it, and a copy without ``-p`` only makes the time
    later, so the newest modification time of the snapshot's trainer dumps is a bound the capture cannot be
    after; like a folder's stamp, only ever evidence that the job moved after it."""
    last = max((p.snapshot for p in procs if p.role == "trainer"), default=None)
    if last is None:
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
