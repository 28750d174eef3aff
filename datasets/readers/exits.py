"""Process exits from the hook's ``pid<PID>.exit.json`` records and the agent's ``events`` table.

Only abnormal exits are returned (:class:`~rankscope.datasets.domain.exits.ProcessExit`); an unreadable
record is an :class:`~rankscope.spine.InputError` naming the file (a note when reading many).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rankscope.datasets.domain.bounds import limits, load_json_file, plausible_epoch, to_float, to_int
from rankscope.datasets.domain.exits import ProcessExit
from rankscope.spine import InputError, ParseError

_EVENT_TEXT = re.compile(r"exited: (?P<type>[^:]+): (?P<message>.*)", re.S)


def _where(frames: Any) -> str:
    if not isinstance(frames, list) or not frames or not isinstance(frames[0], dict):
        return ""
    f = frames[0]
    return f"{f.get('function')} ({os.path.basename(str(f.get('file')))}:{f.get('line')})"


def read_exit_record(path: str | os.PathLike[str], *, node: str = "") -> ProcessExit | None:
    """The abnormal exit in one hook ``*.exit.json`` file; None for a normal exit or a record without
    a rank. Raises ParseError (naming the file and the reason) when the file is not an exit record."""
    p = Path(path)
    rec = load_json_file(p, what="exit record")  # a ParseError/LimitError naming the file
    if not isinstance(rec, dict) or "type" not in rec or "time" not in rec:
        raise ParseError(p, "not an exit record (expected 'type' and 'time' keys)")
    if rec["type"] == "exit" or rec.get("rank") is None:
        return None
    rank = to_int(rec["rank"], lo=0, hi=limits().max_world_size - 1)
    when = to_float(rec["time"])
    if rank is None or when is None or not plausible_epoch(when):
        raise ParseError(
            p, f"rank {str(rec.get('rank'))[:40]!r} / time {str(rec.get('time'))[:40]!r} are not a rank and a time"
        )
    return ProcessExit(
        rank,
        when,
        str(rec["type"]),
        str(rec.get("message", "")),
        _where(rec.get("frames")),
        node,
        rec.get("pid"),
        str(rec.get("role") or "trainer"),
        "hook",
        str(p),
    )


def read_exit_records(
    paths: Iterable[str | os.PathLike[str]], *, nodes: dict[int, str] | None = None, notes: list[str] | None = None
) -> list[ProcessExit]:
    """Abnormal exits from many record files; unreadable ones become a note, never an error."""
    out = []
    bad = []
    for path in paths:
        try:
            e = read_exit_record(path)
        except InputError as exc:  # not an exit record, over a limit, not a regular file
            bad.append(str(exc))
            continue
        if e is not None:
            out.append(e if e.node or not nodes else replace(e, node=nodes.get(e.rank, "")))
    if bad and notes is not None:
        notes.append(f"{len(bad)} exit record(s) skipped: {bad[0]}" + (" ..." if len(bad) > 1 else ""))
    return out


def exits_from_events(events: Any) -> list[ProcessExit]:
    """Abnormal trainer exits in an ``events`` table (a polars DataFrame): the agent's ``process_exit`` rows."""
    import polars as pl

    rows = events.filter(
        (pl.col("kind") == "process_exit") & (pl.col("severity") != "info") & pl.col("rank").is_not_null()
    )
    out = []
    for r in rows.iter_rows(named=True):
        try:
            labels = json.loads(r["labels"]) if r.get("labels") else {}
        except ValueError:
            labels = {}
        if not isinstance(labels, dict):
            labels = {}
        kind, message = labels.get("exception"), labels.get("message")
        m = _EVENT_TEXT.search(r.get("message") or "")
        if kind is None and m:  # rows from agents that stored the facts only in the message text
            kind = m.group("type")
        if message is None:
            message = m.group("message") if m else ""
        ts = r["ts"]
        out.append(
            ProcessExit(
                int(r["rank"]),
                ts.timestamp() if ts is not None else 0.0,
                str(kind or "vanished"),
                str(message),
                str(labels.get("where") or ""),
                r.get("node") or "",
                r.get("pid"),
                "trainer",
                str(labels.get("time_source") or ("hook" if kind else "detected")),
                "events",
            )
        )
    return out
