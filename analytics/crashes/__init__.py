"""Process exits as evidence: facts in (:func:`facts`: the latest incident, primary failures and their
cascade), a verdict out (:func:`verdict`: ``crash``)."""

from __future__ import annotations

from rankscope.analytics.crashes.verdict import (
    CrashFacts,
    facts,
    is_cascade,
    latest_incident,
    verdict,
)

__all__ = ["CrashFacts", "facts", "is_cascade", "latest_incident", "verdict"]
