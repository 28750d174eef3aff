"""Stacks of a stuck job: localize from the strong culprits outward.

A rank that does not wait on anyone (compute, I/O, a stuck child, a missing process its group waits for)
is a culprit; outliers that wait in a group shared with it are its victims (named, not evicted); the
suspects are the culprits' nodes, extended to the smallest group holding them while that stays a small
share of the job. Culprits in unrelated groups: ``inconclusive``. When everyone waits, the smallest cover
of the outliers by groups of one kind is isolated (ByteRobust's over-eviction) and the likeliest origin
named; without time evidence only a single group holding every outlier is a fault domain."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rankscope.analytics.faultdomain import cover, related_mask, smallest_group
from rankscope.analytics.stacks.collection import CaptureProblem
from rankscope.analytics.stacks.culprits import STRONG, culprits
from rankscope.analytics.stacks.duties import DUTY_STATES, duty_ranks, main_process_duty
from rankscope.analytics.stacks.evidence import stack_evidence
from rankscope.analytics.stacks.facts import StackFacts
from rankscope.analytics.stacks.frames import PEER_WAIT_STATES
from rankscope.analytics.stacks.frozen import frozen_runner_words, frozen_runners
from rankscope.analytics.stacks.mismatch import lone_collectives, mismatch_words
from rankscope.analytics.stacks.motion import Motion
from rankscope.analytics.stacks.patterns import (
    WAITS_ON_PEERS,
    busy_input_verdict,
    main_duty_verdict,
    pipeline_ends_verdict,
    stopped_verdict,
)
from rankscope.analytics.stacks.prefix_tree import build
from rankscope.analytics.stacks.report import (
    blind_wait_words,
    common_fields,
    cover_words,
    culprits_first,
    details,
    dominant_words,
    problem_words,
    problems_of,
)
from rankscope.analytics.stacks.snapshot import SnapshotAnalysis
from rankscope.analytics.verdict import Evidence, Severity, SuspectGroup, Verdict, rank_ranges
from rankscope.config import Limits, StackConfig
from rankscope.datasets.domain.topology import Topology

PREMISE = (
    "One snapshot carries no time: this verdict rests on the premise that the job was stuck when it was "
    "captured (a running job caught at the same instant looks alike). Step records, Flight Recorder dumps "
    "or a second snapshot overrule it."
)
PREMISE_ROUNDS = (
    "The snapshots neither show the job progressing nor frozen (a waiter or two released): this verdict rests "
    "on the premise that the job was stuck when it was captured. Step records or more rounds would settle it."
)


@dataclass
class Hang:
    """One snapshot of a job that does not progress, and the words and fields every outcome shares."""

    a: SnapshotAnalysis
    topology: Topology
    cfg: StackConfig
    limits: Limits
    premise: str  # without time evidence: the words saying the job is stuck only if it was stuck when captured
    reasons: list[str]
    details: dict[str, Any]
    common: dict[str, Any]
    problems: list[CaptureProblem]
    frozen: bool = False  # time evidence says the job was stuck (frozen rounds, or long after the last step)
    facts: StackFacts | None = None

    def duty_of(self, ranks: Sequence[int]) -> str:
        """A frame ``ranks`` (rank 0, or replica 0 as a whole) ran in this snapshot that no other rank ran in any
        snapshot: the job's own duty (see :mod:`.duties`); "" otherwise."""
        if self.facts is None:
            return ""
        return main_process_duty(self.facts, ranks, {self.a.snapshot}, duty_ranks(self.topology))

    def verdict(self, kind: Severity, confidence: float, **fields: Any) -> Verdict:
        reasons = list(self.reasons)
        details = self.details
        if self.premise == PREMISE_ROUNDS and kind is Severity.HANG:
            return self._rounds_name_no_machine(reasons, fields)
        if self.premise and kind is Severity.HANG:
            reasons.append(self.premise)
            confidence = max(0.05, confidence - 0.1)
            # machine-readable: no time evidence says the job was stuck (the recovery ladder reads this)
            details = {**details, "stuck_on_premise": True}
        reasons += problem_words(self.problems)
        return Verdict(kind, confidence=confidence, reasons=tuple(reasons), details=details, **fields, **self.common)

    def _rounds_name_no_machine(self, reasons: list[str], fields: dict[str, Any]) -> Verdict:
        """Rounds that neither show the job moving nor frozen name no machine: a healthy job with uneven work
        (evaluation, a sleep, waiting for data) caught in a few rounds looks alike. The likeliest culprits in words."""
        ranks = tuple(fields.get("culprit_ranks") or fields.get("suspect_ranks") or ())
        if ranks:
            nodes = ", ".join(self.topology.nodes_of(ranks)[:5])
            reasons.append(
                f"If the job is known to be stuck, look at rank(s) {rank_ranges(ranks)[:200]} on {nodes} first; the "
                "rounds neither show it progressing nor frozen, so no machine is isolated (a healthy job with uneven "
                "work caught in a few rounds looks alike). More rounds, step records or Flight Recorder dumps tell."
            )
        reasons += problem_words(self.problems)
        return Verdict(
            Severity.INCONCLUSIVE,
            confidence=0.3,
            reasons=tuple(reasons),
            details=self.details,
            suspect_ranks=ranks,
            evidence=fields.get("evidence", ()),
            **self.common,
        )

    @property
    def tentative(self) -> bool:
        """Whether a hang found here will name no machine (rounds neither moving nor frozen): its words then say
        where to look, never "culprit" or "fault domain" as fact."""
        return self.premise == PREMISE_ROUNDS

    def cover(self, group: SuspectGroup, subject: str = "The outliers are") -> None:
        if not self.tentative:
            self.reasons.append(cover_words(group, subject))

    def culprit_words(self, culprit_ranks: Sequence[int]) -> None:
        best = self.a.best()
        label = "Outlier" if self.tentative else "Culprit"
        for r in culprit_ranks[:5]:
            f = best.get(r)
            if f is not None:
                self.reasons.append(f"{label} rank {r} on {self.topology.node_of(r)}: {f.detail}.")
        if len(culprit_ranks) > 5:
            more = f"{len(culprit_ranks) - 5} more {label.lower()} rank(s)"
            self.reasons.append(f"... and {more}: {rank_ranges(culprit_ranks)[:200]}.")

    def evidence(self, culprit_ranks: Sequence[int] = (), victims: Sequence[int] = ()) -> tuple[Evidence, ...]:
        return stack_evidence(self.a, self.topology, culprit_ranks, victims, self.limits.max_evidence_items)


def hang_verdict(facts: StackFacts, topology: Topology, m: Motion, job: str) -> Verdict:
    """The first classifier that applies decides: too little evidence, no outlier, or the outliers localized."""
    a = facts.analyses[-1]
    tree = build([c for c in a.clusters if c.role == "trainer"])
    h = Hang(
        a,
        topology,
        facts.config,
        facts.limits,
        {"premise": PREMISE, "stuck-weak": PREMISE_ROUNDS, "still": PREMISE_ROUNDS}.get(m.kind, ""),
        list(m.reasons),
        details(facts, {"prefix_tree": tree.to_dict()[:200], "dominant_fraction": round(a.dominant_fraction, 4)}),
        common_fields(facts, topology, job, a),
        problems_of(facts),
        m.kind in ("stuck", "still"),
        facts,
    )
    return _too_little(h) or pipeline_ends_verdict(h) or _no_outlier(h) or _localized(h)


def _too_little(h: Hang) -> Verdict | None:
    """No trainer dump at all, or too many ranks without a usable one: inconclusive."""
    a, total = h.a, h.topology.world_size
    if a.n_trainers == 0:
        h.reasons.append("no usable trainer stack dumps")
        return h.verdict(Severity.INCONCLUSIVE, 0.0)
    if len(a.missing_ranks) > h.cfg.max_missing_fraction * total:
        h.reasons.append(
            f"dumps are missing for {len(a.missing_ranks)} of {total} ranks "
            f"({rank_ranges(a.missing_ranks)[:200]}): too few to localize; check the layout "
            "(--layout, --gpus-per-node) and that every node's dumps were collected."
        )
        return h.verdict(Severity.INCONCLUSIVE, 0.2)
    if a.n_trainers < (1 - h.cfg.max_missing_fraction) * total:
        h.reasons.append(
            f"only {a.n_trainers} of {total} ranks left a usable stack: too few to localize (see the collection "
            "problems below)."
        )
        return h.verdict(Severity.INCONCLUSIVE, 0.2)
    return None


def _no_outlier(h: Hang) -> Verdict | None:
    """Every rank with a stack looks healthy: healthy, or inconclusive when some ranks left no usable stack."""
    a = h.a
    h.reasons.append(
        f"{a.healthy_trainers} of {h.topology.world_size} ranks share the dominant stack(s): {dominant_words(a)}."
    )
    if a.outlier_ranks:
        return None
    if a.cut:
        # a rank killed outright (OOM, SIGKILL) leaves no dump while the others wait in the collective it
        # never joined: that looks healthy. The ranks without a usable stack are where to look.
        h.reasons.append(
            f"No outlier among the ranks with a stack, but {len(a.cut)} rank(s) left no usable stack "
            f"(cut off or never written as they stopped): {rank_ranges(a.cut)[:200]}. If the job was "
            "stuck, look at them first (killed outright? the kernel log, the exit records)."
        )
        return h.verdict(Severity.INCONCLUSIVE, 0.3, suspect_ranks=a.cut, evidence=h.evidence())
    blind = sorted({p.rank for p in h.problems if p.rank is not None} | set(a.missing_ranks))
    if blind:
        h.reasons.append(
            f"No outlier among the ranks with a stack; {len(blind)} rank(s) gave no evidence "
            f"({rank_ranges(blind)[:200]}). If the job was stuck, check them first; a failed capture names no "
            "machine by itself."
        )
        return h.verdict(Severity.INCONCLUSIVE, 0.3, evidence=h.evidence())
    if h.frozen:
        return _stuck_alike(h)
    h.reasons.append(
        "No outlier: every rank is in a healthy state. If the job is stuck, the cause is not "
        "visible as a machine-specific stack (all ranks wait alike); take several snapshots "
        "to tell a hang from progress, and check the network and the Flight Recorder."
    )
    return h.verdict(Severity.HEALTHY, round(min(0.5 + 0.4 * a.dominant_fraction, 0.55 if h.premise else 0.95), 3))


def _stuck_alike(h: Hang) -> Verdict:
    """A job the time evidence shows stuck, with no rank apart from its peers: never healthy. The waits other
    than the largest one are where to look (a stage pair waiting on each other, one replica's transfer)."""
    a = h.a
    runners = frozen_runners(a, h.facts.progress if h.facts is not None else None)
    if runners:
        # replica 0 as a whole is excused only at work in its own code (a lock or queue wait is no duty)
        if h.duty_of(runners) and (runners == (0,) or all(h.a.state_of(r) in DUTY_STATES for r in runners)):
            return main_duty_verdict(h, runners)
        h.reasons.append(frozen_runner_words(runners))
        return _strong(h, runners, [])
    trainer = [c for c in a.clusters if c.role == "trainer"]
    others = sorted({r for c in trainer[1:] for r in c.ranks})
    words = (
        f"; look first at the ranks outside the largest wait: {rank_ranges(others)[:200]} "
        f"({', '.join(sorted({c.state for c in trainer[1:]}))})"
        if others
        else ""
    )
    h.reasons.append(
        "The job is stuck, yet no rank stands apart from its peers (every state recurs in the job): nothing "
        f"machine-specific to isolate{words}. The Flight Recorder, the network, or more rounds would tell more."
    )
    return h.verdict(Severity.INCONCLUSIVE, 0.3, suspect_ranks=tuple(others), evidence=h.evidence())


def _victims(h: Hang, culprit_ranks: Sequence[int]) -> tuple[list[int], list[int]]:
    """The other outliers split into victims (waiting on peers, in a group or on a node shared with a
    culprit) and the unexplained rest."""
    best, culprit_set = h.a.best(), set(culprit_ranks)
    others = np.asarray([r for r in h.a.outlier_ranks if r not in culprit_set], dtype=np.int64)
    if others.size == 0:
        return [], []
    waiting = np.asarray([best[int(r)].score < STRONG and h.a.state_of(int(r)) in PEER_WAIT_STATES for r in others])
    related = related_mask(culprit_ranks, others, h.topology)
    while True:  # a waiter in a group with a victim waits behind the culprit too (a chain of waits)
        more = waiting & ~related & related_mask(others[waiting & related], others, h.topology, nodes=False)
        if not more.any():
            break
        related |= more
    # no dump, its peers waiting where every rank waits: where it would wait too, behind the culprit
    shared = np.asarray([best[int(r)].kind == "missing-shared-wait" for r in others])
    ok = (waiting & related) | shared
    return [int(r) for r in others[ok]], [int(r) for r in others[~ok]]


def _in_own_duty(h: Hang, ranks: Sequence[int]) -> bool:
    """Whether ``ranks`` (rank 0, or replica 0 as a whole) are all at work in their own code (not a stuck child,
    a device wait or a missing dump), code no other rank ran: the job's duty."""
    best = h.a.best()
    own_code = all(
        (f := best.get(r)) is not None and f.kind == "not-in-collective" and h.a.state_of(r) in DUTY_STATES
        for r in ranks
    )
    return own_code and bool(h.duty_of(ranks))


def _localized(h: Hang) -> Verdict:
    """Outliers mapped onto a fault domain (hang) with their likeliest culprits, or inconclusive."""
    a, topology = h.a, h.topology
    n_out_clusters = sum(1 for c in h.common["clusters"] if not c.healthy)
    h.reasons.append(
        f"{len(a.outlier_ranks)} outlier rank(s) in {n_out_clusters} cluster(s): {rank_ranges(a.outlier_ranks)[:300]}."
    )
    culprit_ranks, strong = culprits(a, topology)
    stopped = {p.rank for p in h.problems if p.kind == "stopped"}
    if strong and culprit_ranks and set(culprit_ranks) <= stopped:
        return stopped_verdict(h, culprit_ranks)
    if strong and _in_own_duty(h, culprit_ranks):
        return main_duty_verdict(h, culprit_ranks)
    if a.busy_input and all(r in a.busy_input or a.state_of(r) in WAITS_ON_PEERS for r in a.outlier_ranks):
        return busy_input_verdict(h, a.busy_input)
    if strong:
        victims, unexplained = _victims(h, culprit_ranks)
        if not unexplained:
            return _strong(h, culprit_ranks, victims)
    # everyone waits (or strong culprits beside unexplained outliers): cover the outliers with groups of one kind
    group: SuspectGroup | None
    blind = sorted({p.rank for p in h.problems if p.rank is not None and p.role == "trainer" and not p.gone})
    if not strong and blind and not set(blind) <= {p.rank for p in h.problems if p.kind == "stopped"}:
        h.reasons.append(blind_wait_words(blind, topology.nodes_of(blind)))  # the waits may end at them
        return h.verdict(Severity.INCONCLUSIVE, 0.3, suspect_ranks=tuple(blind), evidence=h.evidence())
    if h.premise and not strong and a.largest_share < 0.5:
        h.reasons.append(
            "Every outlier waits on someone, and no single wait holds most ranks (the largest cluster has "
            f"{a.largest_share:.0%} of them): a stuck job converges on one wait within seconds, a running "
            "job caught mid-step spreads over several. With no time evidence, nothing to isolate"
            + (
                f"; if the job is known to be stuck, look at rank(s) {rank_ranges(culprit_ranks)[:100]} first."
                if culprit_ranks
                else "."
            )
        )
        return h.verdict(Severity.INCONCLUSIVE, 0.2, evidence=h.evidence())
    if not strong and lone_collectives(a, topology):
        return _mismatch_like(h)
    if h.premise:  # no time evidence: only one group holding every outlier is a fault domain
        group = smallest_group(a.outlier_ranks, topology, max_fraction=h.cfg.max_cover_fraction)
        if group is None:
            h.reasons.append(
                "The outliers are in unrelated parallel groups and every one of them waits on someone: with no "
                "time evidence, no single fault domain to isolate (a running job caught in several waits looks "
                "like this)."
            )
            return h.verdict(Severity.INCONCLUSIVE, 0.25, evidence=h.evidence())
    else:
        group = cover(a.outlier_ranks, topology, max_fraction=h.cfg.max_cover_fraction)
        if group is None:
            h.reasons.append("The outliers are spread over most of the job's nodes: no single fault domain to isolate.")
            return h.verdict(Severity.INCONCLUSIVE, 0.25, suspect_ranks=a.outlier_ranks, evidence=h.evidence())
    if not strong and (stuck := _whole_group_stuck(h, culprit_ranks, group)) is not None:
        return stuck
    suspects = set(group.nodes)
    culprit_ranks = tuple(r for r in culprit_ranks if topology.node_of(r) in suspects) or culprit_ranks
    culprit_nodes = tuple(n for n in topology.nodes_of(culprit_ranks) if n in suspects)
    h.cover(group)
    h.culprit_words(culprit_ranks)
    if not strong and culprit_ranks and not h.tentative:
        h.reasons.append(
            "Every outlier is waiting on someone else; the culprit above is the likeliest origin "
            "of the wait (weak evidence: isolate the whole suspect group)."
        )
    conf = _weak_confidence(a, group, strong)
    return h.verdict(
        Severity.HANG,
        round(max(0.05, min(conf, 0.99)), 3),
        suspect_nodes=culprits_first(group.nodes, culprit_nodes),
        culprit_nodes=culprit_nodes,
        suspect_ranks=a.outlier_ranks,
        culprit_ranks=tuple(culprit_ranks),
        suspect_group=group,
        evidence=h.evidence(culprit_ranks),
    )


def _weak_confidence(a: SnapshotAnalysis, group: SuspectGroup, strong: bool) -> float:
    conf = 0.35 + 0.3 * a.dominant_fraction + (0.2 if strong else 0.05)
    return conf + (0.1 if group.kind != "node" and len(group.indices) == 1 else 0.05)


def _whole_group_stuck(h: Hang, ranks: Sequence[int], around: SuspectGroup) -> Verdict | None:
    """Every member of one tensor-, context- or expert-parallel group, and no other rank, waits in one
    collective (the wait the healthy majority is not in), and every other outlier waits on a group holding
    them: the group's collective itself does not complete (a link, a GPU or NCCL inside it) and the rest wait
    behind it. Its nodes are the fault domain, named with the confidence the group ``around`` that covers the
    outliers would have had (the evidence is no stronger)."""
    a, topology = h.a, h.topology
    members = set(ranks)
    if len(members) < 2 or any(a.state_of(r) != "collective" for r in members):
        return None
    if not any(members == set(c.ranks) for c in a.clusters):
        return None  # one wait: exactly one cluster of stacks
    kind = next((k for k in ("tp", "cp", "ep") if k in topology.kinds() and _one_group(topology, k, ranks)), None)
    if kind is None:
        return None
    victims, unexplained = _victims(h, ranks)
    if unexplained:
        return None
    h.reasons.append(
        f"Rank(s) {rank_ranges(ranks)[:100]}, the whole {kind.upper()} group, wait in one collective no other rank "
        "is in, and every other outlier waits on a group holding them: that group's collective does not complete "
        "(a link, a GPU or NCCL inside it); the rest wait behind it (weak evidence: every outlier waits)."
    )
    return _strong(h, ranks, victims, confidence=_weak_confidence(a, around, False))


def _one_group(topology: Topology, kind: str, ranks: Sequence[int]) -> bool:
    """Whether ``ranks`` are exactly the members of one group of ``kind``."""
    gid = topology.group_ids(kind)
    ids = {int(gid[r]) for r in ranks}
    return len(ids) == 1 and int(np.count_nonzero(gid == ids.pop())) == len(set(ranks))


def _mismatch_like(h: Hang) -> Verdict:
    h.reasons.append(mismatch_words(h.a))
    out = h.a.outlier_ranks
    return h.verdict(Severity.INCONCLUSIVE, 0.3, suspect_ranks=out, evidence=h.evidence(out))


def _strong(h: Hang, culprit_ranks: Sequence[int], victims: Sequence[int], confidence: float | None = None) -> Verdict:
    """Strong culprits, every other outlier their victim: the culprits' nodes, extended to the smallest group
    holding them while that stays within the fault-domain share of the job; unrelated culprits: inconclusive."""
    a, topology = h.a, h.topology
    group = smallest_group(culprit_ranks, topology, max_fraction=h.cfg.max_cover_fraction)
    if group is None:
        h.reasons.append(
            f"{len(culprit_ranks)} ranks do not wait on anyone ({rank_ranges(culprit_ranks)[:200]}), in unrelated "
            "parallel groups on several nodes: no single fault domain to isolate."
        )
        h.culprit_words(culprit_ranks)
        return h.verdict(Severity.INCONCLUSIVE, 0.3, evidence=h.evidence(culprit_ranks, victims))
    culprit_nodes = topology.nodes_of(culprit_ranks)
    h.cover(group, "The culprits are" if len(culprit_ranks) > 1 else "The culprit is")
    h.culprit_words(culprit_ranks)
    best = a.best()
    gaps = [r for r in victims if r in best and best[r].kind == "missing-shared-wait"]
    victims = [r for r in victims if r not in gaps]
    if victims:
        h.reasons.append(
            f"{len(victims)} other outlier rank(s) wait in a group shared with the culprit(s): its victims, named "
            f"here, not evicted: {rank_ranges(victims)[:200]}."
        )
    if gaps:
        h.reasons.append(
            f"Rank(s) {rank_ranges(gaps)[:200]} left no dump, and their peers wait where the healthy majority "
            "waits, behind the culprit: where they would wait too. A gap in the collection, not evicted; check "
            "them if the culprit's machine is not the cause."
        )
    conf = (
        confidence
        if confidence is not None
        else 0.55 + 0.3 * a.dominant_fraction + (0.1 if len(group.nodes) == 1 else 0.05)
    )
    suspects = set(group.nodes)
    suspect_ranks = tuple(sorted(set(culprit_ranks) | {r for r in a.outlier_ranks if topology.node_of(r) in suspects}))
    return h.verdict(
        Severity.HANG,
        round(max(0.05, min(conf, 0.99)), 3),
        suspect_nodes=culprits_first(group.nodes, culprit_nodes),
        culprit_nodes=tuple(n for n in culprit_nodes if n in suspects),
        suspect_ranks=suspect_ranks,
        culprit_ranks=tuple(culprit_ranks),
        suspect_group=group,
        evidence=h.evidence(culprit_ranks, victims),
    )
