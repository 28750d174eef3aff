"""The store: Parquet schemas (:mod:`.schemas`), the :class:`~.store.Store`, its part writing (:mod:`.parts`)
and what it holds (:mod:`.catalog`). :func:`is_store` needs no pyarrow (a dump directory never loads it)."""

from __future__ import annotations

import os
from pathlib import Path

MARKER = "rankscope-store.json"
"""The file that makes a directory a store (format and version)."""


def is_store(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is the root of a rankscope store."""
    return (Path(path) / MARKER).is_file()
