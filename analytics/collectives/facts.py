"""Everything a set of Flight Recorder dumps says, before a decision (:mod:`.decide` decides)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankscope.analytics.collectives.captures import Progress
from rankscope.analytics.collectives.clock import AGING, OVERDUE, UNKNOWN, YOUNG, Clock
from rankscope.analytics.collectives.groups import GroupInfo, GroupKey
from rankscope.analytics.collectives.result import GroupStall, Mismatch
from rankscope.analytics.collectives.waits import WaitGraph


@dataclass(frozen=True)
class CollectiveFacts:
    """Everything the dumps say, before a decision."""

    graph: WaitGraph
    stalls: tuple[GroupStall, ...]
    groups: Mapping[GroupKey, GroupInfo]
    mismatches: tuple[Mismatch, ...]
    slow: tuple[int, ...]
    slow_scores: Mapping[int, float]
    world: int
    dumped: tuple[int, ...]
    no_dump: tuple[int, ...]
    n_entries: int
    node: Callable[[int], tuple[str, ...]]  # rank -> its node (empty without a topology)
    nodes: Callable[[Sequence[int]], tuple[str, ...]]  # ranks -> their nodes
    clock: Clock
    progress: Progress | None = None
    pp_neighbors: Callable[[int], tuple[int, ...]] = lambda r: ()
    """Adjacent pipeline stages of a rank, where send/recv go unrecorded (gloo): empty otherwise."""
    unstarted: bool = False
    """NCCL dumps that record no op's start (``TORCH_NCCL_ENABLE_TIMING`` off): the op a rank is blocked in is
    inferred from the order it issued them."""
    unrecorded: tuple[int, ...] = ()
    """Ranks that ran ops their dump does not record: a group's status counters run ahead of every op the rank
    recorded on it (gloo counts its send/recv there and records none); a wait in those cannot be seen."""

    def moved(self) -> bool:
        """An earlier capture shows every waiting rank advanced since, into waits that are all new (none aging):
        the job was running when captured."""
        p = self.progress
        waits = list(self.graph.all_waits())
        if p is None or not self.graph.waits or any(w.timing.state == AGING for w in waits):
            return False
        if not set(self.graph.waits) <= set(p.advanced):
            return False
        return not any(w.entry.record_id in p.pending_before.get(w.rank, ()) for w in waits)

    def time_evidence(self) -> dict[str, Any]:
        waits = list(self.graph.all_waits())
        states = Counter(w.timing.state for w in waits)
        ages = [w.timing.age_s for w in waits if w.timing.age_s is not None]
        timeouts = [w.entry.timeout_ms / 1e3 for w in waits if w.timing.state == OVERDUE and w.entry.timeout_ms]
        now = self.clock.now.values()
        kind = "none" if not now else "explicit" if self.clock.explicit else "lower-bound"
        if now and not self.clock.explicit and any(ex for _, ex in now):
            kind = "partial"
        return {
            "clock": kind,
            "n_waits": len(waits),
            **{k: states.get(k, 0) for k in (OVERDUE, AGING, YOUNG, UNKNOWN)},
            "oldest_wait_seconds": round(max(ages), 3) if ages else None,
            "timeout_seconds": min(timeouts, default=None),  # the job's own: overdue waits younger may be a pause
            "dump_pass_ranks": len(self.clock.upper),  # ranks whose capture time NCCL's own stamps bound
        }

    def common(self) -> dict[str, Any]:
        """The fields of every :class:`CollectiveAnalysis`, whatever the finding."""
        return dict(
            world_size=self.world,
            dumped_ranks=self.dumped,
            stalls=self.stalls,
            mismatches=self.mismatches,
            slow_ranks=self.slow,
            slow_scores=dict(self.slow_scores),
            no_dump_ranks=self.no_dump,
            waits=self.graph.most_specific(),
            n_groups=len(self.groups),
            n_entries=self.n_entries,
            time_evidence=self.time_evidence(),
            progress={**self.progress.to_dict(), "moved": self.moved()} if self.progress is not None else {},
        )
