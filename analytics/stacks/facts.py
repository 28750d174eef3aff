"""Stack facts: per snapshot, the clusters and outliers (:mod:`.snapshot`), and across snapshots, progress."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rankscope.analytics.stacks.frames import signature
from rankscope.analytics.stacks.snapshot import SnapshotAnalysis, analyze_snapshot
from rankscope.config import Limits, StackConfig
from rankscope.datasets.domain.stacks import ProcStacks
from rankscope.datasets.domain.topology import Topology


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
        cur = {
            p.rank: signature(p.main, lines=True)
            for p in by_snapshot[s]
            if p.role == "trainer" and p.rank is not None and p.status not in ("failed", "cut")
        }
        if prev is not None:
            for r, sig in cur.items():
                if r in prev:
                    compared += 1
                    changed += sig != prev[r]
        prev = cur
    return Progress(len(snaps), compared, changed)


@dataclass(frozen=True)
class StackFacts:
    """What the stacks of one job say before any decision: progress across snapshots and the analysis of
    each snapshot that matters (every snapshot of a progressing job, else the last one)."""

    analyses: tuple[SnapshotAnalysis, ...]
    progress: Progress | None  # None with a single snapshot
    n_snapshots: int
    config: StackConfig
    limits: Limits


def facts(
    procs: Sequence[ProcStacks], topology: Topology, *, config: StackConfig | None = None, limits: Limits | None = None
) -> StackFacts:
    """Split ``procs`` by snapshot, measure progress, and analyze the snapshots the verdict needs."""
    cfg = config or StackConfig()
    by_snap: dict[int, list[ProcStacks]] = defaultdict(list)
    for p in procs:
        by_snap[p.snapshot].append(p)
    snaps = sorted(by_snap)
    prog = progress(by_snap) if len(snaps) > 1 else None
    wanted = snaps if prog is not None and prog.progressing else snaps[-1:]
    analyses = tuple(
        analyze_snapshot(by_snap[s], topology, snapshot=s, lines=cfg.lines, dominance=cfg.dominance_fraction)
        for s in wanted
    )
    return StackFacts(analyses, prog, len(snaps), cfg, limits or Limits())
