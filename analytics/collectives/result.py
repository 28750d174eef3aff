"""Results of the Flight Recorder analysis: stalled groups, mismatches and the overall finding."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rankscope.analytics.verdict import Evidence, Severity, rank_ranges


@dataclass(frozen=True)
class GroupStall:
    """A group whose members did not all reach one collective."""

    pg: str
    desc: str
    kind: str
    index: int
    seq: int  # the first collective_seq_id not every member reached (or the stuck one)
    op: str
    members: tuple[int, ...]
    missing_ranks: tuple[int, ...]  # dumped members that did not reach ``seq`` (start it, else enqueue it)
    no_dump_ranks: tuple[int, ...]  # members without a dump (unknown)
    waiting_ranks: tuple[int, ...]  # members stuck in ``seq``
    membership: str  # where the members came from
    progress: Mapping[int, tuple[int, int, int]] = field(default_factory=dict)
    """Per dumped member: its last enqueued, started and completed collective seq id in this group."""
    starts: bool = False  # the members' dumps record starts: ``missing_ranks`` did not *start* ``seq``

    @property
    def missing_words(self) -> str:
        """What the missing members did not do: start the collective, or enqueue it."""
        return "have not started it" if self.starts else "never enqueued it"

    def to_dict(self) -> dict[str, Any]:
        by_state: dict[str, list[int]] = {}
        for r, (enq, start, done) in sorted(self.progress.items()):
            by_state.setdefault(f"enqueued {enq} / started {start} / completed {done}", []).append(r)
        return {
            "pg": self.pg,
            "desc": self.desc,
            "kind": self.kind,
            "index": self.index,
            "seq": self.seq,
            "op": self.op,
            "n_members": len(self.members),
            "missing_ranks": list(self.missing_ranks),
            "no_dump_ranks": rank_ranges(self.no_dump_ranks),
            "waiting_ranks": rank_ranges(self.waiting_ranks),
            "membership": self.membership,
            "progress": {k: rank_ranges(v) for k, v in list(by_state.items())[:20]},
        }


@dataclass(frozen=True)
class Mismatch:
    """Members of one collective that disagree on op, sizes or dtypes (a code/config fault)."""

    pg: str
    desc: str
    kind: str
    seq: int
    field: str  # op | sizes | dtypes
    ranks: tuple[int, ...]  # the odd ones out (all of them when no majority)
    expected: str
    found: str
    majority: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "pg": self.pg,
            "desc": self.desc,
            "kind": self.kind,
            "seq": self.seq,
            "field": self.field,
            "ranks": list(self.ranks),
            "expected": self.expected,
            "found": self.found,
            "majority": self.majority,
        }


@dataclass(frozen=True)
class CollectiveAnalysis:
    """What the Flight Recorder dumps say. ``status``: hang | mismatch | fail-slow | healthy | inconclusive."""

    status: Severity
    world_size: int
    dumped_ranks: tuple[int, ...]
    culprit_ranks: tuple[int, ...] = ()
    missing_ranks: tuple[int, ...] = ()  # missing from the stopped group's collective
    stopped_pg: str | None = None
    stopped_kind: str = ""
    stopped_index: int = -1
    stopped_members: tuple[int, ...] = ()
    stalls: tuple[GroupStall, ...] = ()
    mismatches: tuple[Mismatch, ...] = ()
    slow_ranks: tuple[int, ...] = ()
    slow_scores: Mapping[int, float] = field(default_factory=dict)
    no_dump_ranks: tuple[int, ...] = ()
    waits: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # rank -> who it waits for (its most
    # specific unfinished op: the missing members, or the p2p peer)
    n_groups: int = 0
    n_entries: int = 0
    confidence: float = 0.0
    reasons: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    time_evidence: Mapping[str, Any] = field(default_factory=dict)
    """The clock used (explicit capture time, a lower bound from inside the dumps, or none), how many
    waits were overdue/young/aging/unknown, the oldest wait and the overdue threshold."""
    if_stuck_ranks: tuple[int, ...] = ()
    """Without time evidence: where the waits end *if* the job is known to be stuck (never suspects)."""
    progress: Mapping[str, Any] = field(default_factory=dict)
    """With two captures: which ranks advanced between them and over what interval."""

    @property
    def mismatch_ranks(self) -> tuple[int, ...]:
        """The ranks whose collective differs from the majority's (all members of a tie)."""
        return tuple(sorted({r for m in self.mismatches for r in m.ranks}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "world_size": self.world_size,
            "n_dumps": len(self.dumped_ranks),
            "culprit_ranks": list(self.culprit_ranks),
            "missing_ranks": list(self.missing_ranks),
            "stopped_pg": self.stopped_pg,
            "stopped_kind": self.stopped_kind,
            "stopped_index": self.stopped_index,
            "stopped_members": rank_ranges(self.stopped_members),
            "stalls": [s.to_dict() for s in self.stalls[:50]],
            "n_stalls": len(self.stalls),
            "mismatches": [m.to_dict() for m in self.mismatches[:50]],
            "slow_ranks": list(self.slow_ranks),
            "slow_scores": {
                str(r): round(s, 3) for r, s in sorted(self.slow_scores.items(), key=lambda kv: -kv[1])[:20]
            },
            "no_dump_ranks": rank_ranges(self.no_dump_ranks),
            "n_groups": self.n_groups,
            "n_entries": self.n_entries,
            "confidence": round(self.confidence, 3),
            "time_evidence": dict(self.time_evidence),
            "if_stuck_ranks": list(self.if_stuck_ranks),
            "progress": dict(self.progress),
            "reasons": list(self.reasons),
            "evidence": [e.to_dict() for e in self.evidence],
        }

    def explain(self) -> str:
        head = f"Flight Recorder: {self.status.value.upper()}"
        if self.culprit_ranks:
            head += f"; culprit rank(s) {rank_ranges(self.culprit_ranks)}"
        if self.stopped_pg is not None:
            head += f"; stopped in pg {self.stopped_pg} ({self.stopped_kind})"
        return "\n".join([head + "."] + [f"- {r}" for r in self.reasons])
