"""The verdict's stack clusters, with their rank lists parsed, and frame labels short enough to draw."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rankscope.reports.errors import ReportInputError
from rankscope.reports.ranges import parse_ranks


@dataclass(frozen=True)
class ClusterInfo:
    id: int
    role: str
    size: int
    ranks: np.ndarray
    healthy: bool
    state: str
    representative: tuple[str, ...]
    snapshot: int


def clusters_of(verdict: Mapping[str, Any]) -> list[ClusterInfo]:
    """The verdict's clusters with their ranks parsed."""
    out = []
    for i, c in enumerate(verdict.get("clusters") or ()):
        if not isinstance(c, Mapping):
            raise ReportInputError(f"verdict.clusters[{i}]: not an object")
        out.append(
            ClusterInfo(
                int(c.get("id", i)),
                str(c.get("role", "trainer")),
                int(c.get("size", 0)),
                parse_ranks(c.get("ranks"), field=f"verdict.clusters[{i}].ranks"),
                bool(c.get("healthy", False)),
                str(c.get("state", "")),
                tuple(str(f) for f in c.get("representative") or ()),
                int(c.get("snapshot", 0)),
            )
        )
    return out


def latest_trainer_clusters(verdict: Mapping[str, Any]) -> list[ClusterInfo]:
    """Trainer clusters of the latest snapshot in the verdict (what the rank grid colours by)."""
    tr = [c for c in clusters_of(verdict) if c.role == "trainer"]
    if not tr:
        return []
    last = max(c.snapshot for c in tr)
    return [c for c in tr if c.snapshot == last]


def innermost(frames: Sequence[str]) -> str:
    return frames[-1] if frames else "(no frame)"


def short_frame(frame: str, n: int = 50) -> str:
    """``func (path/to/file.py:12)`` cut to ``n`` characters: the file's directory goes first, then the
    end of the function name."""
    frame = " ".join(str(frame).split())
    if len(frame) <= n:
        return frame
    if frame.endswith(")") and " (" in frame:
        func, loc = frame[:-1].rsplit(" (", 1)
        loc = loc.rsplit("/", 1)[-1]
        if len(func) + len(loc) + 3 <= n:
            return f"{func} ({loc})"
        func = func[: max(11, n - len(loc) - 4)] + "…"
        return f"{func} ({loc})"
    return frame[: n - 1] + "…"
