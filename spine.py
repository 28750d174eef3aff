"""The one exception hierarchy of rankscope.

The library raises these and never prints or exits; the CLI turns them into one stderr line and
exit code 2. Every message names the offending file or parameter and what is wrong with it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


class RankscopeError(Exception):
    """Base class of every error rankscope raises on purpose."""


class InputError(RankscopeError):
    """Bad user input: a malformed file, an unknown option value, an inconsistent layout."""


class LayoutError(InputError):
    """A parallel layout that cannot describe the job (sizes, order, world size, GPUs per node)."""


class StoreError(RankscopeError):
    """The store is unreadable: a corrupt or truncated Parquet file, a missing or foreign root."""


class ParseError(InputError):
    """A dump file that no reader can make sense of."""

    def __init__(self, path: object, what: str) -> None:
        self.path = str(path)
        self.what = what
        super().__init__(f"{path}: {what}")


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while building millions of acyclic objects (it would rescan
    them again and again; torchfrtrace's loader does the same); the previous state is restored."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
