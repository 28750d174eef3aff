"""The local backend's checkpoint contract: ``ROOT/step-<N>/`` directories, complete once ``COMPLETE`` exists
in one (written after every rank finished writing, behind a barrier)."""

from __future__ import annotations

import os
import re
from pathlib import Path

COMPLETE_MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def newest_complete_checkpoint(root: str | os.PathLike[str], *, before_step: int | None = None) -> Path | None:
    """The ``step-<N>`` directory with the highest N that has its ``COMPLETE`` marker (N < before_step)."""
    best: tuple[int, Path] | None = None
    for step, d, complete in checkpoints(root):
        if complete and (before_step is None or step < before_step) and (best is None or step > best[0]):
            best = (step, d)
    return best[1] if best else None


def checkpoints(root: str | os.PathLike[str]) -> list[tuple[int, Path, bool]]:
    """Every ``step-<N>`` directory under ``root``: (N, path, complete), oldest first."""
    try:
        entries = list(Path(root).iterdir())
    except OSError:
        return []
    out = []
    for d in entries:
        m = _STEP_DIR.match(d.name)
        if m and d.is_dir():
            out.append((int(m.group(1)), d, (d / COMPLETE_MARKER).is_file()))
    return sorted(out)
