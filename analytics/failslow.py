"""Several snapshots of one job: is it progressing, and if so, which group keeps it waiting?

Progress: a rank whose stack (with line numbers) changes between consecutive snapshots is
moving; when most ranks move, the job is not hung. Fail-slow (ByteRobust's MFU-decline mode,
every 10 s for 5 rounds): each round flags the parallel group holding the most outlier ranks
(ties go to the smaller group); after all rounds the group flagged most often is the degrader.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..datasets.stackset import ProcStacks
from ..datasets.topology import KINDS, Topology
from .frames import signature
from .localize import SnapshotAnalysis


@dataclass(frozen=True)
class Progress:
    """How many ranks' stacks changed between consecutive snapshots."""

    n_snapshots: int
    compared: int  # rank-pairs compared
    changed: int

    @property
    def fraction_changed(self) -> float:
        return self.changed / self.compared if self.compared else 0.0

    @property
    def progressing(self) -> bool:
        return self.compared > 0 and self.fraction_changed > 0.5


def progress(by_snapshot: Mapping[int, Sequence[ProcStacks]]) -> Progress:
    """Compare each trainer's main-thread stack (with lines) across consecutive snapshots."""
    snaps = sorted(by_snapshot)
    prev: dict[int, tuple[str, ...]] | None = None
    compared = changed = 0
    for s in snaps:
        cur = {p.rank: signature(p.main, lines=True) for p in by_snapshot[s]
               if p.role == "trainer" and p.rank is not None and p.status != "failed"}
        if prev is not None:
            for r, sig in cur.items():
                if r in prev:
                    compared += 1
                    changed += sig != prev[r]
        prev = cur
    return Progress(len(snaps), compared, changed)


@dataclass(frozen=True)
class RoundFlag:
    snapshot: int
    kind: str
    group: int
    n_outliers: int


@dataclass(frozen=True)
class Degrader:
    """The group flagged most often over the rounds, and the ranks inside it that were not waiting."""

    kind: str
    group: int
    flags: int
    rounds: int
    per_round: tuple[RoundFlag, ...]
    culprit_ranks: tuple[int, ...]
    culprit_counts: Mapping[int, int]


def flag_round(a: SnapshotAnalysis, topology: Topology) -> RoundFlag | None:
    """The group of any kind with the most outliers in one round (ties: smaller group, kind order)."""
    if not a.outlier_ranks:
        return None
    out = np.asarray(a.outlier_ranks, dtype=np.int64)
    best = None
    for order, kind in enumerate(k for k in KINDS if k in topology.kinds()):
        counts = np.bincount(topology.group_ids(kind)[out], minlength=topology.n_groups(kind))
        g = int(np.argmax(counts))
        key = (-int(counts[g]), topology.group_size(kind), order)
        if best is None or key < best[0]:
            best = (key, RoundFlag(a.snapshot, kind, g, int(counts[g])))
    return best[1] if best else None


def degrader(rounds: Sequence[SnapshotAnalysis], topology: Topology) -> Degrader | None:
    """Vote over rounds; ``None`` when no round had outliers."""
    flags = [f for f in (flag_round(a, topology) for a in rounds) if f is not None]
    if not flags:
        return None
    votes = Counter((f.kind, f.group) for f in flags)
    (kind, group), n = max(votes.items(), key=lambda kv: (kv[1], -topology.group_size(kv[0][0])))
    members = set(topology.group(kind, group).ranks)
    counts: Counter[int] = Counter()
    for a in rounds:
        for f in a.findings:
            if f.rank in members and f.score >= 0.7:
                counts[f.rank] += 1
    top = max(counts.values(), default=0)
    culprits = tuple(sorted(r for r, c in counts.items() if c == top and c * 2 >= len(rounds)))
    return Degrader(kind, group, n, len(rounds), tuple(flags), culprits, dict(counts))
