"""Training progress: tail the hook's ``pid<PID>.steps.jsonl`` files into metrics, timings and events.

Each :func:`rankscope.collectors.hook.log_step` call is one JSON line; this module reads only the
bytes appended since the last poll (a stat per file when nothing changed), keeps each rank's last
step, and turns numbers into ``train_*`` metrics, ``step`` timings and NaN events.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rankscope.collectors.events import Event
from rankscope.datasets.readers import runfiles as rf
from rankscope.datasets.readers.rundir import step_seconds

METRIC_NAMES = {"loss": "train_loss", "grad_norm": "train_grad_norm", "step_time_seconds": "train_step_time_seconds"}


@dataclass
class StepRecord:
    """One ``log_step`` line."""

    t: float
    step: int
    rank: int | None
    pid: int
    values: dict[str, Any] = field(default_factory=dict)


class StepTailer:
    """Reads new step lines from every steps file in ``run_dir`` (optionally only some pids)."""

    def __init__(self, run_dir: str | os.PathLike[str], *, max_line_bytes: int = 65536) -> None:
        self.run_dir = Path(run_dir)
        self.max_line_bytes = max_line_bytes
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self.last_step: dict[int, int] = {}  # rank -> step
        self.last_time: dict[int, float] = {}  # rank -> wall time of that step
        self.bad_lines = 0

    def skip_existing(self) -> None:
        """Start from the current end of every existing file (ignore steps of earlier runs)."""
        for path in self.run_dir.glob(rf.pattern(rf.STEPS)):
            try:
                self._offsets[path] = path.stat().st_size
            except OSError:
                continue

    def poll(self, pids: Iterable[int] | None = None) -> list[StepRecord]:
        """New records since the last poll (from the files of ``pids``, or all files)."""
        paths = (
            [rf.path(self.run_dir, p, rf.STEPS) for p in pids]
            if pids is not None
            else sorted(self.run_dir.glob(rf.pattern(rf.STEPS)))
        )
        out: list[StepRecord] = []
        for path in paths:
            try:
                size = path.stat().st_size
            except OSError:
                continue
            off = self._offsets.get(path, 0)
            if size <= off:
                continue
            try:
                with open(path, "rb") as fh:
                    fh.seek(off)
                    data = self._partial.pop(path, b"") + fh.read(size - off)
            except OSError:
                continue
            self._offsets[path] = size
            *lines, rest = data.split(b"\n")
            if rest and len(rest) < self.max_line_bytes:
                self._partial[path] = rest
            pid = int(path.name[3:].split(".", 1)[0])
            for line in lines:
                rec = self._parse(line, pid)
                if rec is not None:
                    out.append(rec)
        for rec in out:
            if rec.rank is not None and rec.step >= self.last_step.get(rec.rank, -1):
                self.last_step[rec.rank] = rec.step
                self.last_time[rec.rank] = rec.t
        return out

    def _parse(self, line: bytes, pid: int) -> StepRecord | None:
        if not line.strip():
            return None
        try:
            d = json.loads(line)
            t, step = float(d.pop("t")), int(d.pop("step"))
            rank = d.pop("rank", None)
            return StepRecord(t, step, int(rank) if rank is not None else None, pid, d)
        except (ValueError, KeyError, TypeError, OverflowError):
            self.bad_lines += 1
            return None


def _float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return None


def to_metric_rows(records: Iterable[StepRecord], *, job: str, node_of: Any) -> list[dict[str, Any]]:
    """``train_*`` metrics (loss, grad norm, step time, extras) in the metrics table's long form."""
    rows = []
    for r in records:
        ts = datetime.fromtimestamp(r.t, tz=timezone.utc)
        node = node_of(r.rank, r.pid)
        for key, v in r.values.items():  # the step number itself lives in the timings table
            f = _float(v)
            if f is None:
                continue
            metric = METRIC_NAMES.get(key, f"train_{key}")
            rows.append(
                {
                    "job": job,
                    "ts": ts,
                    "node": node,
                    "metric": metric,
                    "value": f,
                    "rank": r.rank,
                    "pid": r.pid,
                    "gpu": None,
                    "labels": None,
                }
            )
    return rows


def to_timing_rows(records: Iterable[StepRecord], *, job: str, node_of: Any) -> list[dict[str, Any]]:
    """``timings`` rows (op ``step``) for records that carry a step time."""
    rows = []
    for r in records:
        d = step_seconds(r.values.get("step_time_seconds"))
        if d is None or r.rank is None:
            continue
        rows.append(
            {
                "job": job,
                "rank": r.rank,
                "step": r.step,
                "op": "step",
                "duration_s": d,
                "start_s": r.t - d,
                "node": node_of(r.rank, r.pid),
            }
        )
    return rows


class NanWatch:
    """Reports a NaN/inf loss or gradient norm once per (rank, quantity) until it is finite again."""

    def __init__(self) -> None:
        self.active: set[tuple[int | None, str]] = set()

    def events(self, records: Iterable[StepRecord], *, node_of: Any) -> list[Event]:
        out: list[Event] = []
        for r in sorted(records, key=lambda rec: rec.t):
            for key in ("loss", "grad_norm"):
                v = _float(r.values.get(key))
                if v is None:
                    continue
                if math.isfinite(v):
                    self.active.discard((r.rank, key))
                elif (r.rank, key) not in self.active:
                    self.active.add((r.rank, key))
                    out.append(
                        Event(
                            "nan",
                            f"rank {r.rank}: {key} is {v} at step {r.step}",
                            ts=r.t,
                            rank=r.rank,
                            pid=r.pid,
                            node=node_of(r.rank, r.pid),
                            labels={"quantity": key, "step": r.step},
                        )
                    )
        return out


def nan_events(records: Iterable[StepRecord], *, node_of: Any) -> list[Event]:
    """The NaN events of one batch of records (a fresh :class:`NanWatch`)."""
    return NanWatch().events(records, node_of=node_of)
