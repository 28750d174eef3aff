"""The one place recovery/ imports from the rest of rankscope.

The executor takes the verdict as the JSON dict ``rankscope diagnose --format json`` prints and the
agent's events and exits as plain records, so it needs nothing else from the library: only the error
hierarchy (its home is moving from ``rankscope.errors`` to ``rankscope.spine``).
"""

from __future__ import annotations

try:  # the restructured layout
    from ..spine import InputError, RankscopeError  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - the layout before the restructure
    from ..errors import InputError, RankscopeError

__all__ = ["InputError", "RankscopeError", "RecoveryError"]


class RecoveryError(RankscopeError):
    """An executor step that could not be carried out (a backend command failed, the lock is held)."""
