"""Stacks as evidence: facts in (:func:`facts`: clusters, outliers, progress), a verdict out (:func:`verdict`).

Modules, in the order the analysis runs: :mod:`.frames` (normalize and classify frames),
:mod:`.collection` (failed captures, in words), :mod:`.clustering` (STAT-style equivalence classes),
:mod:`.snapshot` (one snapshot's outliers and findings), :mod:`.facts` (every snapshot, and the waiters
released between them), :mod:`.motion` (did the job move: time evidence, then the stacks),
:mod:`.culprits` (the likeliest root ranks), :mod:`.hang` (a stuck job, localized), :mod:`.moving`
(a moving job: fail-slow or healthy), :mod:`.prefix_tree` (the merged call-prefix tree),
:mod:`.report` (shared words), :mod:`.verdict` (the entry point).
"""

from __future__ import annotations

from rankscope.analytics.stacks.facts import StackFacts, facts
from rankscope.analytics.stacks.verdict import verdict

__all__ = ["StackFacts", "facts", "verdict"]
