"""Metrics and timings as evidence, and every fail-slow classifier: facts in (:func:`facts`), a verdict
out (:func:`verdict`).

:mod:`.metrics` (units unlike their peers), :mod:`.stragglers` and :mod:`.episodes` (ranks slower than
their symmetric peers), :mod:`.failslow` (stack rounds voted over, steps that overrule a "hang"),
:mod:`.decide` (one verdict from metrics and timings). ``facts`` and ``verdict`` are loaded on first
use: the stack analysis imports :mod:`.failslow` and must not pay for polars.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PerfFacts", "facts", "verdict"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rankscope.analytics.performance import decide

        return getattr(decide, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
