"""Pure analysis: in-memory evidence in, a frozen :class:`~rankscope.analytics.verdict.Verdict` out.

One subpackage per evidence source, each with the same surface (``facts(...)``, then ``verdict(...)``):
:mod:`.stacks`, :mod:`.collectives` (Flight Recorder), :mod:`.performance` (metrics, timings and every
fail-slow classifier) and :mod:`.crashes` (process exits). :mod:`.verdict` holds the verdict and the one
:class:`~rankscope.analytics.verdict.Severity` order, :mod:`.faultdomain` the mapping from ranks to the
machines to isolate, :mod:`.fusion` the combination of verdicts, and :func:`diagnose` (in
:mod:`.diagnosis`) is the one entry point. Submodules load on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["diagnose"]


def __getattr__(name: str) -> Any:
    if name == "diagnose":
        from rankscope.analytics.diagnosis import diagnose

        return diagnose
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
