"""Collectives that can never match, seen in stacks alone.

A collective completes when every member of its group calls it. When each outlier waits in a collective that no
member of any of its parallel groups is in, and every other rank waits in another one, neither side can ever
complete: the ranks called different collectives (a collective called on some ranks only, a desync: a code or
configuration fault), or the lone rank left a collective the others are still in (a message lost on its way).
Neither names a machine on stacks alone; Flight Recorder dumps tell them apart (a mismatch shows in the
sequence numbers and op types, see :mod:`rankscope.analytics.collectives`).
"""

from __future__ import annotations

import numpy as np

from rankscope.analytics.faultdomain import related_mask
from rankscope.analytics.stacks.frames import WAIT_STATES
from rankscope.analytics.stacks.snapshot import SnapshotAnalysis
from rankscope.analytics.verdict import rank_ranges
from rankscope.datasets.domain.topology import Topology


def lone_collectives(a: SnapshotAnalysis, topology: Topology) -> bool:
    """Every outlier waits in a collective (no two outliers share a parallel group), and every healthy cluster
    waits too (in a collective, a transfer, DDP's backward, a device sync)."""
    out = np.asarray(a.outlier_ranks, dtype=np.int64)
    if out.size == 0 or any(a.state_of(int(r)) != "collective" for r in out):
        return False
    if out.size > 1 and any(related_mask([int(r)], out[out != r], topology, nodes=False).any() for r in out):
        return False
    others = [c for c in a.clusters if c.role == "trainer" and c.healthy and c.ranks]
    return bool(others) and all(c.state in WAIT_STATES for c in others)


def mismatch_words(a: SnapshotAnalysis) -> str:
    best = a.best()
    where = "; ".join(f"rank {r}: {best[r].detail}" for r in a.outlier_ranks[:3] if r in best)
    return (
        f"Rank(s) {rank_ranges(a.outlier_ranks)[:100]} wait alone in a collective that no member of their parallel "
        f"groups is in ({where[:300]}), while every other rank waits in another: collectives that can never match. "
        "That is a code or configuration fault (a collective called on some ranks only, a desync) or a message "
        "lost after the lone rank left the collective the others are in; no machine is evicted on stacks alone "
        "(Flight Recorder dumps tell a mismatch by its sequence numbers)."
    )
