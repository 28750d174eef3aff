"""From Flight Recorder facts to one finding: small pure classifiers, tried from the most definite.

1. :func:`mismatch`: members of one collective disagree (a code/config fault, nothing evicted).
2. :func:`hang`: ranks wait; following who waits for whom ends at the culprits (the wavefront).
3. :func:`stuck_inside`: every member entered a collective that never finished (network, NIC, GPU).
4. :func:`fail_slow`: everything completed, but some ranks arrive late.
5. :func:`quiet`: too few dumps (inconclusive), ranks behind with nobody waiting (inconclusive), or healthy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankscope.analytics.collectives.groups import GroupInfo, GroupKey
from rankscope.analytics.collectives.result import (
    CollectiveAnalysis,
    GroupStall,
    Mismatch,
)
from rankscope.analytics.collectives.waits import P2PWait, WaitGraph
from rankscope.analytics.verdict import Evidence, Severity, rank_ranges


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
            waits=dict(self.graph.waits),
            n_groups=len(self.groups),
            n_entries=self.n_entries,
        )


def pg_words(name: str, desc: str, kind: str) -> str:
    d = f" {desc}" if desc and desc != "undefined" else ""
    return f"pg {name}{d} [{kind}]"


def classify(f: CollectiveFacts) -> CollectiveAnalysis:
    """The first classifier that applies decides."""
    reasons = [
        f"{len(f.dumped)} of {f.world} ranks left a Flight Recorder dump ({f.n_entries} entries, "
        f"{len(f.groups)} process groups)."
    ]
    evidence: list[Evidence] = []
    if f.no_dump:
        evidence.append(
            Evidence(
                "flight_recorder",
                "missing-dump",
                f"no Flight Recorder dump from rank(s) {rank_ranges(f.no_dump)[:200]}",
                f.no_dump[:1000],
                f.nodes(f.no_dump[:1000]),
                0.5,
            )
        )
    for rule in (mismatch, hang, stuck_inside, fail_slow):
        found = rule(f, reasons, evidence)
        if found is not None:
            return found
    return quiet(f, reasons, evidence)


def mismatch(f: CollectiveFacts, reasons: list[str], evidence: list[Evidence]) -> CollectiveAnalysis | None:
    decided = [m for m in f.mismatches if m.majority] or list(f.mismatches)
    if not decided:
        return None
    for m in decided[:10]:
        reasons.append(
            f"{pg_words(m.pg, m.desc, m.kind)} collective #{m.seq}: rank(s) {rank_ranges(m.ranks)} "
            f"issue {m.found} where {'the other members issue' if m.majority else 'others issue'} "
            f"{m.expected} ({m.field} mismatch)."
        )
        evidence.append(
            Evidence(
                "flight_recorder",
                "collective-mismatch",
                f"{m.field} mismatch in pg {m.pg} #{m.seq}: {m.found} vs {m.expected}",
                m.ranks,
                f.nodes(m.ranks),
                1.0 if m.majority else 0.5,
            )
        )
    reasons.append(
        "Members of one collective disagree: a code or configuration fault (ranks run different "
        "code paths, shapes or dtypes), not a machine fault; evicting machines will not fix it."
    )
    return CollectiveAnalysis(
        Severity.MISMATCH,
        confidence=0.9 if decided[0].majority else 0.6,
        reasons=tuple(reasons),
        evidence=tuple(evidence),
        **f.common(),
    )


def wavefront_culprits(f: CollectiveFacts, reasons: list[str]) -> tuple[tuple[int, ...], bool]:
    """The ranks the waits end at (waited for, waiting for nobody), and whether that is strong evidence."""
    targets: set[int] = set()
    unique = {id(t): t for srcs in f.graph.all_sources.values() for t in srcs}  # each op's missing set once
    for t in unique.values():
        targets.update(t)
    sinks = sorted(t for t in targets if t not in f.graph.waits)
    no_dump_set = set(f.no_dump)
    alive = tuple(r for r in sinks if r not in no_dump_set)  # seen alive, waiting for nobody: strongest
    culprits = alive or tuple(sinks)
    if alive and len(alive) < len(sinks):
        reasons.append(
            f"Rank(s) {rank_ranges(sorted(no_dump_set & set(sinks)))[:200]} left no dump and are "
            "waited for too; whether they reached their collective is unknown."
        )
    if culprits:
        return culprits, True
    first = next((s for s in f.stalls if s.missing_ranks), None)  # everyone waits for someone: a circular wait
    reasons.append(
        "Every stuck rank waits for another stuck rank (a circular wait): collectives were "
        "probably issued in different orders; the culprits below are a best guess."
    )
    return (first.missing_ranks if first else ()), False


def _stopped(
    f: CollectiveFacts, cset: set[int], p2p: Sequence[P2PWait], culprits: tuple[int, ...], reasons: list[str]
) -> tuple[GroupStall | None, dict[str, Any]]:
    """Where the wavefront stops: the first stalled group holding a culprit, else the stuck p2p transfer."""
    stop = next((s for s in f.stalls if cset & (set(s.missing_ranks) | set(s.no_dump_ranks))), None)
    if stop is not None:
        missing = tuple(sorted(cset & (set(stop.missing_ranks) | set(stop.no_dump_ranks))))
        reasons.append(
            f"The wavefront stops in {pg_words(stop.pg, stop.desc, stop.kind)}: collective "
            f"#{stop.seq} ({stop.op or '?'}) was reached by {len(stop.waiting_ranks)} of "
            f"{len(stop.members)} members; rank(s) {rank_ranges(missing)} never enqueued it."
        )
        return stop, dict(
            stopped_pg=stop.pg,
            stopped_kind=stop.kind,
            stopped_index=stop.index,
            stopped_members=stop.members,
            missing_ranks=missing,
        )
    if p2p:
        info = f.groups[p2p[0][0]]
        missing = tuple(sorted({peer for _, _, peer, _ in p2p}))
        reasons.append(
            f"The wavefront stops in {pg_words(info.name, info.desc, info.kind)}: rank(s) "
            f"{rank_ranges(missing)} never posted the send/recv their pipeline peer waits in."
        )
        return None, dict(
            stopped_pg=info.name,
            stopped_kind=info.kind,
            stopped_index=info.index,
            stopped_members=info.ranks,
            missing_ranks=missing,
        )
    return None, dict(missing_ranks=culprits)


def hang(f: CollectiveFacts, reasons: list[str], evidence: list[Evidence]) -> CollectiveAnalysis | None:
    if not f.graph.waits:
        return None
    culprits, strong = wavefront_culprits(f, reasons)
    cset = set(culprits)
    p2p = [(g, r, peer, op) for g, r, peer, op in f.graph.p2p_waits if peer in cset]
    stop, stopped = _stopped(f, cset, p2p, culprits, reasons)
    reasons.append(
        f"{len(f.graph.waits)} rank(s) wait in unfinished collectives; following who waits for whom "
        f"ends at rank(s) {rank_ranges(culprits)[:200]}, which wait for nobody: the culprit(s)."
    )
    for r in culprits[:50]:
        evidence.append(Evidence("flight_recorder", *culprit_words(f, r, p2p), (r,), f.node(r), 1.0 if strong else 0.5))
    if stop is not None and stop.waiting_ranks:
        evidence.append(
            Evidence(
                "flight_recorder",
                "waiting-in-collective",
                f"{len(stop.waiting_ranks)} rank(s) wait in pg {stop.pg} #{stop.seq} ({stop.op})",
                stop.waiting_ranks[:1000],
                (),
                0.2,
            )
        )
    gone = cset & set(f.no_dump)
    if gone:
        reasons.append(f"Rank(s) {rank_ranges(sorted(gone))} left no dump: their process or node is probably gone.")
    conf = (0.9 if strong else 0.5) - (0.1 if gone else 0.0)
    return CollectiveAnalysis(
        Severity.HANG,
        culprit_ranks=culprits,
        confidence=conf,
        reasons=tuple(reasons),
        evidence=tuple(evidence),
        **stopped,
        **f.common(),
    )


def stuck_inside(f: CollectiveFacts, reasons: list[str], evidence: list[Evidence]) -> CollectiveAnalysis | None:
    joined = [s for s in f.stalls if s.waiting_ranks and not s.missing_ranks]
    if not joined:
        return None
    s = joined[0]
    reasons.append(
        f"Every dumped member of {pg_words(s.pg, s.desc, s.kind)} entered collective #{s.seq} "
        f"({s.op}) but it never completed: the fault is inside the collective (network, NIC or GPU "
        f"of one of its {len(s.members)} ranks), not a rank that failed to join."
    )
    evidence.append(
        Evidence(
            "flight_recorder",
            "stuck-collective",
            f"pg {s.pg} #{s.seq} ({s.op}) entered by all {len(s.waiting_ranks)} dumped members, never completed",
            s.members[:1000],
            f.nodes(s.members),
            0.6,
        )
    )
    return CollectiveAnalysis(
        Severity.HANG,
        stopped_pg=s.pg,
        stopped_kind=s.kind,
        stopped_index=s.index,
        stopped_members=s.members,
        confidence=0.6,
        reasons=tuple(reasons),
        evidence=tuple(evidence),
        **f.common(),
    )


def fail_slow(f: CollectiveFacts, reasons: list[str], evidence: list[Evidence]) -> CollectiveAnalysis | None:
    if not f.slow:
        return None
    for r in f.slow[:20]:
        evidence.append(
            Evidence(
                "flight_recorder",
                "slow-rank",
                f"rank {r}'s collective kernels are {f.slow_scores[r]:.0%} shorter than its peers' "
                "(everyone waits for it to arrive)",
                (r,),
                f.node(r),
                float(f.slow_scores[r]),
            )
        )
    reasons.append(
        f"Every collective completed, but rank(s) {rank_ranges(f.slow)} arrive late at their "
        "collectives (their peers' kernels wait for them): fail-slow."
    )
    return CollectiveAnalysis(
        Severity.FAIL_SLOW,
        culprit_ranks=f.slow,
        confidence=0.7,
        reasons=tuple(reasons),
        evidence=tuple(evidence),
        **f.common(),
    )


def quiet(f: CollectiveFacts, reasons: list[str], evidence: list[Evidence]) -> CollectiveAnalysis:
    if len(f.no_dump) > f.world // 2:
        reasons.append("Too few dumps to tell a healthy job from a hang.")
        return CollectiveAnalysis(
            Severity.INCONCLUSIVE, confidence=0.2, reasons=tuple(reasons), evidence=tuple(evidence), **f.common()
        )
    behind = [s for s in f.stalls if s.missing_ranks]
    if behind:
        s = behind[0]
        reasons.append(
            f"Nobody waits in an unfinished collective, yet rank(s) {rank_ranges(s.missing_ranks)} are "
            f"behind in {pg_words(s.pg, s.desc, s.kind)} (#{s.seq}): dumps taken mid-step?"
        )
        return CollectiveAnalysis(
            Severity.INCONCLUSIVE, confidence=0.3, reasons=tuple(reasons), evidence=tuple(evidence), **f.common()
        )
    reasons.append("Every recorded collective completed on every member and members agree on op, sizes and dtypes.")
    return CollectiveAnalysis(
        Severity.HEALTHY,
        confidence=0.8 if not f.no_dump else 0.6,
        reasons=tuple(reasons),
        evidence=tuple(evidence),
        **f.common(),
    )


def culprit_words(f: CollectiveFacts, r: int, p2p: Sequence[P2PWait]) -> tuple[str, str]:
    """Why rank ``r`` is a culprit: (evidence kind, words)."""
    for s in f.stalls:
        if r in s.missing_ranks:
            return (
                "missing-from-collective",
                f"rank {r} never enqueued collective #{s.seq} ({s.op}) of "
                f"{pg_words(s.pg, s.desc, s.kind)}, which {len(s.waiting_ranks)} member(s) wait in",
            )
    for g, waiter, peer, op in p2p:
        if peer == r:
            other = "send" if op == "recv" else "recv"
            info = f.groups[g]
            return (
                "p2p-peer-behind",
                f"rank {r} never posted the {other} that rank {waiter} waits for in {op} "
                f"({pg_words(info.name, info.desc, info.kind)})",
            )
    if r in f.no_dump:
        return ("missing-dump", f"rank {r} left no Flight Recorder dump and other ranks wait for it")
    return ("waited-for", f"ranks wait for rank {r}, which waits for nobody")
