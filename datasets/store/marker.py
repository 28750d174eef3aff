"""What makes a directory a rankscope store (standard library only: telling a store from a dump directory
must not import pyarrow)."""

from __future__ import annotations

import os
from pathlib import Path

MARKER = "rankscope-store.json"


def is_store(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is the root of a rankscope store."""
    return (Path(path) / MARKER).is_file()
