"""Flight Recorder dumps as evidence: facts in (:func:`facts`: who waits for whom, stalls, mismatches,
late ranks, and the finding they support), a verdict out (:func:`verdict`)."""

from __future__ import annotations

from rankscope.analytics.collectives.analysis import facts
from rankscope.analytics.collectives.result import (
    CollectiveAnalysis,
    GroupStall,
    Mismatch,
)
from rankscope.analytics.collectives.verdict import verdict

__all__ = ["CollectiveAnalysis", "GroupStall", "Mismatch", "facts", "verdict"]
