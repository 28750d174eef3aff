"""Several verdicts into one: the stacks fused with the Flight Recorder, and every source combined.

Both follow the one severity order of :class:`~rankscope.analytics.verdict.Severity` (crash > mismatch >
hang > fail-slow > degraded > imbalance > inconclusive > healthy).

:func:`fuse`: each source alone passes through. With both: the more severe decision leads; suspect nodes
are the union (over-eviction is the safe
side); culprit nodes both sources name are kept and raise the confidence (independent evidence:
``1 - (1 - c1)(1 - c2)``); when the sources name different culprits, both are kept, the confidence
drops and the disagreement is stated in ``reasons`` and ``details["disagreements"]``.
``details["support"]`` says, per suspect node, which sources named it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rankscope.analytics.verdict import (
    Severity,
    Verdict,
    merge_nodes,
    rank_ranges,
)

_SOURCE_NAMES = {"stacks": "stacks", "flight_recorder": "Flight Recorder"}


@dataclass
class _Pair:
    """The two verdicts being fused, which leads, and what they agree and disagree on."""

    s: Verdict  # stacks
    f: Verdict  # Flight Recorder
    lead: Verdict
    other: Verdict
    agreed: tuple[str, ...]  # culprit nodes both name
    agreed_ranks: tuple[int, ...]
    disagreements: list[str]


_Decision = tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], float]  # suspects, culprits, culprit ranks, conf


def _mismatch_lead(p: _Pair) -> _Decision:
    """A mismatch is a code/config fault: nothing is evicted, whatever the other source says."""
    if p.other.culprit_nodes or p.other.suspect_nodes:
        p.disagreements.append(
            f"{_name(p.other)} point(s) at node(s) {', '.join(p.other.suspect_nodes[:8])}, but "
            "mismatched collectives are a code/config fault; nothing is evicted"
        )
    return (), (), p.lead.culprit_ranks, p.lead.confidence


def _quiet_lead(p: _Pair) -> _Decision:
    """Neither source names a fault (healthy or inconclusive): nothing to isolate."""
    same = p.s.verdict == p.f.verdict
    return (), (), (), min(p.s.confidence, p.f.confidence) if same else p.lead.confidence * 0.7


def _fault_lead(p: _Pair) -> _Decision:
    """A fault leads: suspects are the union (over-eviction is the safe side); agreed culprits raise the
    confidence, different culprits are both kept at a lower one."""
    s, f, lead, other = p.s, p.f, p.lead, p.other
    s_cul, f_cul = set(s.culprit_nodes), set(f.culprit_nodes)
    both_faulty = other.verdict.is_fault
    suspect_nodes = merge_nodes(lead.suspect_nodes, other.suspect_nodes if both_faulty else ())
    if p.agreed:
        culprit_nodes = p.agreed
        culprit_ranks = p.agreed_ranks or tuple(sorted(set(s.culprit_ranks) | set(f.culprit_ranks)))
        confidence = 1.0 - (1.0 - s.confidence) * (1.0 - f.confidence)
    else:
        culprit_nodes = merge_nodes(lead.culprit_nodes, other.culprit_nodes if both_faulty else ())
        culprit_ranks = tuple(sorted(set(lead.culprit_ranks) | (set(other.culprit_ranks) if both_faulty else set())))
        confidence = lead.confidence * (0.7 if (s_cul and f_cul) or not both_faulty else 0.9)
        if s_cul and f_cul:
            p.disagreements.append(
                f"stacks name culprit(s) {', '.join(sorted(s_cul)[:8])}; the Flight Recorder "
                f"names {', '.join(sorted(f_cul)[:8])}: both kept"
            )
    in_suspects = set(suspect_nodes)
    culprit_nodes = tuple(n for n in culprit_nodes if n in in_suspects)
    only_s = sorted(set(s.suspect_nodes) - set(f.suspect_nodes))
    only_f = sorted(set(f.suspect_nodes) - set(s.suspect_nodes))
    if both_faulty and (only_s or only_f) and s.suspect_nodes and f.suspect_nodes:
        p.disagreements.append(
            f"suspects only from stacks: {', '.join(only_s[:8]) or 'none'}; only from the "
            f"Flight Recorder: {', '.join(only_f[:8]) or 'none'}"
        )
    return suspect_nodes, culprit_nodes, culprit_ranks, confidence


def _pair(s: Verdict, f: Verdict) -> _Pair:
    lead, other = (s, f) if s.verdict.rank <= f.verdict.rank else (f, s)
    disagreements = [f"stacks say {s.verdict}, the Flight Recorder says {f.verdict}"] if s.verdict != f.verdict else []
    s_cul, f_cul = set(s.culprit_nodes), set(f.culprit_nodes)
    agreed = tuple(n for n in merge_nodes(s.culprit_nodes, f.culprit_nodes) if n in s_cul and n in f_cul)
    agreed_ranks = tuple(sorted(set(s.culprit_ranks) & set(f.culprit_ranks)))
    return _Pair(s, f, lead, other, agreed, agreed_ranks, disagreements)


def _support(s: Verdict, f: Verdict, suspect_nodes: tuple[str, ...]) -> dict[str, list[str]]:
    """Per suspect node (every named node when none is suspect), which sources named it."""
    support: dict[str, list[str]] = {}
    for v, src in ((s, "stacks"), (f, "flight_recorder")):
        for n in merge_nodes(v.suspect_nodes, v.culprit_nodes):
            support.setdefault(n, []).append(src)
    return {n: support.get(n, []) for n in suspect_nodes} if suspect_nodes else support


def fuse(stack_verdict: Verdict | None, fr_verdict: Verdict | None) -> Verdict:
    """One verdict from the stack and Flight Recorder verdicts (either may be None)."""
    if stack_verdict is None:
        if fr_verdict is None:
            return Verdict(Severity.INCONCLUSIVE, reasons=("no evidence: neither stacks nor Flight Recorder dumps",))
        return _alone(fr_verdict)
    if fr_verdict is None:
        return _alone(stack_verdict)
    p = _pair(stack_verdict, fr_verdict)
    s, f, lead = p.s, p.f, p.lead
    if lead.verdict is Severity.MISMATCH:
        decide = _mismatch_lead
    elif not lead.verdict.is_fault:
        decide = _quiet_lead
    else:
        decide = _fault_lead
    suspect_nodes, culprit_nodes, culprit_ranks, confidence = decide(p)
    reasons: list[str] = []
    if p.agreed and lead.verdict.is_fault and lead.verdict is not Severity.MISMATCH:
        ranks = f" (rank(s) {rank_ranges(p.agreed_ranks)})" if p.agreed_ranks else ""
        reasons.append(f"Stacks and the Flight Recorder agree on culprit node(s) {', '.join(p.agreed[:8])}{ranks}.")
    reasons += [f"[stacks] {r}" for r in s.reasons] + [f"[flight recorder] {r}" for r in f.reasons]
    reasons += [f"Disagreement: {d}." for d in p.disagreements]
    details: dict[str, Any] = {
        **s.details,
        **{k: v for k, v in f.details.items() if k not in s.details},
        "support": _support(s, f, suspect_nodes),
        "disagreements": p.disagreements,
        "stack_verdict": s.verdict.value,
        "fr_verdict": f.verdict.value,
    }
    if s.verdict.is_fault and not s.details.get("stuck_on_premise"):
        details.pop("stuck_on_premise", None)  # the stacks' rounds showed it stuck: the FR premise is met
    wide = bool(suspect_nodes) or lead.verdict is Severity.MISMATCH
    return Verdict(
        lead.verdict,
        job=s.job or f.job,
        confidence=round(min(max(confidence, 0.0), 0.99), 3),
        suspect_nodes=suspect_nodes,
        culprit_nodes=culprit_nodes,
        suspect_ranks=tuple(sorted(set(s.suspect_ranks) | set(f.suspect_ranks))) if wide else lead.suspect_ranks,
        culprit_ranks=culprit_ranks,
        reasons=tuple(reasons),
        suspect_group=(lead.suspect_group or p.other.suspect_group) if suspect_nodes else None,
        clusters=s.clusters,
        evidence=s.evidence + f.evidence,
        sources=tuple(dict.fromkeys((*s.sources, *f.sources, "stacks", "flight_recorder"))),
        world_size=max(s.world_size, f.world_size),
        n_snapshots=s.n_snapshots,
        details=details,
    )


def _alone(v: Verdict) -> Verdict:
    """A single source passes through, with its support recorded."""
    src = v.sources[0] if v.sources else "flight_recorder"
    support = {n: [src] for n in v.suspect_nodes}
    return v.with_updates(details={**v.details, "support": support, "disagreements": []}, sources=v.sources or (src,))


def _name(v: Verdict) -> str:
    return " and ".join(_SOURCE_NAMES.get(s, s) for s in v.sources) or "the other source"


def combine(verdicts: Sequence[Verdict]) -> Verdict:
    """The most severe verdict leads; the others' reasons and evidence are kept beside it."""
    ordered = sorted(verdicts, key=lambda v: v.verdict.rank)
    lead = ordered[0]
    if len(ordered) == 1:
        return lead
    reasons = list(lead.reasons)
    evidence = list(lead.evidence)
    sources = list(lead.sources)
    for v in ordered[1:]:
        # beside a fault another source found, a source that saw none says so, not that the job is healthy
        label = "no fault seen here" if v.verdict is Severity.HEALTHY else v.verdict.value
        reasons.append(f"[{'/'.join(v.sources) or 'other'}] {label}: " + (v.reasons[0] if v.reasons else ""))
        reasons.extend(v.reasons[1:4])
        evidence.extend(v.evidence)
        sources.extend(s for s in v.sources if s not in sources)
    # a verdict without stacks (crash from exits, perf) still shows the clusters the stacks found
    clustered = next((v for v in ordered if v.clusters), lead)
    return lead.with_updates(
        reasons=tuple(reasons),
        evidence=tuple(evidence),
        sources=tuple(sources),
        clusters=lead.clusters or clustered.clusters,
        n_snapshots=max(v.n_snapshots for v in ordered),
        world_size=lead.world_size or max(v.world_size for v in ordered),
        details={**lead.details, "other_verdicts": [v.to_dict() for v in ordered[1:]]},
    )
