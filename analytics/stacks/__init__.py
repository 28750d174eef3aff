"""Stacks as evidence: facts in (:func:`facts`: clusters, outliers, progress), a verdict out (:func:`verdict`).

Modules, in the order the analysis runs: :mod:`.frames` (normalize and classify frames),
:mod:`.clustering` (STAT-style equivalence classes), :mod:`.snapshot` (one snapshot's outliers and
findings), :mod:`.facts` (every snapshot, and progress between them), :mod:`.culprits` (the likeliest
root ranks), :mod:`.prefix_tree` (the merged call-prefix tree), :mod:`.verdict` (hang or fail-slow).
"""

from __future__ import annotations

from rankscope.analytics.stacks.facts import StackFacts, facts
from rankscope.analytics.stacks.verdict import verdict

__all__ = ["StackFacts", "facts", "verdict"]
