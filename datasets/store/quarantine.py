"""The quarantine list of a store: machines the fleet view found blamed too often to receive new work.

``rankscope fleet`` (and every ``rankscope batch`` run that wrote verdicts) scores the machines its verdicts
named across jobs and writes the ones above the threshold to ``ROOT/quarantine.json`` atomically::

    {"format": "rankscope-quarantine", "version": 1, "written": "2026-12-01T10:00:00Z",
     "threshold": 1.5, "window_seconds": 604800.0,
     "machines": [{"machine": "gpu-node-17", "risk": 2.4, "incidents": 3, "jobs": 2,
                   "last_seen": "2026-11-30T22:14:03Z", "kinds": {"hang": 2, "crash": 1}}]}

The recovery executor consults :func:`load_quarantine` before it places a job or a standby on a machine.
Standard library only (the recovery side and the agent may read it without pyarrow).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rankscope.spine import StoreError, atomic_write

QUARANTINE_FILE = "quarantine.json"
FORMAT = "rankscope-quarantine"


def quarantine_path(store_root: str | os.PathLike[str]) -> Path:
    """Where a store's quarantine list lives."""
    return Path(store_root) / QUARANTINE_FILE


def read_quarantine(store_root: str | os.PathLike[str]) -> dict[str, Any]:
    """The whole quarantine document (an empty one when none was written yet); StoreError when unreadable."""
    path = quarantine_path(store_root)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {"format": FORMAT, "version": 1, "machines": []}
    except OSError as exc:
        raise StoreError(f"{path}: unreadable quarantine list ({exc.strerror})") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise StoreError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("machines"), list):
        raise StoreError(f"{path}: not a rankscope quarantine list (expected format {FORMAT!r} and a machines list)")
    return doc


def load_quarantine(store_root: str | os.PathLike[str]) -> set[str]:
    """The machines quarantined in the store at ``store_root`` (an empty set when there is no list)."""
    return {str(m["machine"]) for m in read_quarantine(store_root)["machines"] if isinstance(m, Mapping)}


def write_quarantine(store_root: str | os.PathLike[str], machines: Sequence[Mapping[str, Any]], **meta: Any) -> Path:
    """Replace the store's quarantine list with ``machines`` (each a mapping with at least ``machine``)."""
    doc = {"format": FORMAT, "version": 1, **meta, "machines": [dict(m) for m in machines]}
    return atomic_write(quarantine_path(store_root), json.dumps(doc, indent=1, default=str) + "\n")
