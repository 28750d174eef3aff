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
from typing import Any

from rankscope.analytics.verdict import (
    Evidence,
    Severity,
    Verdict,
    merge_nodes,
    rank_ranges,
)

_SOURCE_NAMES = {"stacks": "stacks", "flight_recorder": "Flight Recorder"}


def fuse(stack_verdict: Verdict | None, fr_verdict: Verdict | None) -> Verdict:
    """One verdict from the stack and Flight Recorder verdicts (either may be None)."""
    if stack_verdict is None and fr_verdict is None:
        return Verdict(Severity.INCONCLUSIVE, reasons=("no evidence: neither stacks nor Flight Recorder dumps",))
    if stack_verdict is None:
        return _alone(fr_verdict)  # type: ignore[arg-type]  # not both None: checked above
    if fr_verdict is None:
        return _alone(stack_verdict)
    s, f = stack_verdict, fr_verdict
    lead, other = (s, f) if s.verdict.rank <= f.verdict.rank else (f, s)
    disagreements: list[str] = []
    if s.verdict != f.verdict:
        disagreements.append(f"stacks say {s.verdict}, the Flight Recorder says {f.verdict}")

    support: dict[str, list[str]] = {}
    for v, src in ((s, "stacks"), (f, "flight_recorder")):
        for n in merge_nodes(v.suspect_nodes, v.culprit_nodes):
            support.setdefault(n, []).append(src)
    s_cul, f_cul = set(s.culprit_nodes), set(f.culprit_nodes)
    agreed = tuple(n for n in merge_nodes(s.culprit_nodes, f.culprit_nodes) if n in s_cul and n in f_cul)
    sr_cul, fr_cul = set(s.culprit_ranks), set(f.culprit_ranks)
    agreed_ranks = tuple(sorted(sr_cul & fr_cul))

    if lead.verdict == "mismatch":
        suspect_nodes: tuple[str, ...] = ()
        culprit_nodes: tuple[str, ...] = ()
        if other.culprit_nodes or other.suspect_nodes:
            disagreements.append(
                f"{_name(other)} point(s) at node(s) {', '.join(other.suspect_nodes[:8])}, but "
                "mismatched collectives are a code/config fault; nothing is evicted"
            )
        culprit_ranks = lead.culprit_ranks
        confidence = lead.confidence
    elif lead.verdict in ("healthy", "inconclusive"):
        suspect_nodes, culprit_nodes, culprit_ranks = (), (), ()
        confidence = min(s.confidence, f.confidence) if s.verdict == f.verdict else lead.confidence * 0.7
    else:
        both_faulty = other.verdict.is_fault
        suspect_nodes = merge_nodes(lead.suspect_nodes, other.suspect_nodes if both_faulty else ())
        if agreed:
            culprit_nodes = agreed
            culprit_ranks = agreed_ranks or tuple(sorted(sr_cul | fr_cul))
            confidence = 1.0 - (1.0 - s.confidence) * (1.0 - f.confidence)
        else:
            culprit_nodes = merge_nodes(lead.culprit_nodes, other.culprit_nodes if both_faulty else ())
            culprit_ranks = tuple(
                sorted(set(lead.culprit_ranks) | (set(other.culprit_ranks) if both_faulty else set()))
            )
            confidence = lead.confidence * (0.7 if (s_cul and f_cul) or not both_faulty else 0.9)
            if s_cul and f_cul:
                disagreements.append(
                    f"stacks name culprit(s) {', '.join(sorted(s_cul)[:8])}; the Flight Recorder "
                    f"names {', '.join(sorted(f_cul)[:8])}: both kept"
                )
        in_suspects = set(suspect_nodes)
        culprit_nodes = tuple(n for n in culprit_nodes if n in in_suspects)
        only_s = sorted(set(s.suspect_nodes) - set(f.suspect_nodes))
        only_f = sorted(set(f.suspect_nodes) - set(s.suspect_nodes))
        if both_faulty and (only_s or only_f) and s.suspect_nodes and f.suspect_nodes:
            disagreements.append(
                f"suspects only from stacks: {', '.join(only_s[:8]) or 'none'}; only from the "
                f"Flight Recorder: {', '.join(only_f[:8]) or 'none'}"
            )

    reasons: list[str] = []
    if agreed and lead.verdict not in ("mismatch", "healthy", "inconclusive"):
        reasons.append(
            f"Stacks and the Flight Recorder agree on culprit node(s) {', '.join(agreed[:8])}"
            + (f" (rank(s) {rank_ranges(agreed_ranks)})" if agreed_ranks else "")
            + "."
        )
    reasons += [f"[stacks] {r}" for r in s.reasons] + [f"[flight recorder] {r}" for r in f.reasons]
    reasons += [f"Disagreement: {d}." for d in disagreements]
    support = {n: support.get(n, []) for n in suspect_nodes} if suspect_nodes else support
    details: dict[str, Any] = {
        **s.details,
        **{k: v for k, v in f.details.items() if k not in s.details},
        "support": support,
        "disagreements": disagreements,
        "stack_verdict": s.verdict,
        "fr_verdict": f.verdict,
    }
    evidence: tuple[Evidence, ...] = s.evidence + f.evidence
    sources = tuple(dict.fromkeys((*s.sources, *f.sources, "stacks", "flight_recorder")))
    return Verdict(
        lead.verdict,
        job=s.job or f.job,
        confidence=round(min(max(confidence, 0.0), 0.99), 3),
        suspect_nodes=suspect_nodes,
        culprit_nodes=culprit_nodes,
        suspect_ranks=tuple(sorted(set(s.suspect_ranks) | set(f.suspect_ranks)))
        if suspect_nodes or lead.verdict == "mismatch"
        else lead.suspect_ranks,
        culprit_ranks=culprit_ranks,
        reasons=tuple(reasons),
        suspect_group=(lead.suspect_group or other.suspect_group) if suspect_nodes else None,
        clusters=s.clusters,
        evidence=evidence,
        sources=sources,
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
        reasons.append(f"[{'/'.join(v.sources) or 'other'}] {v.verdict.value}: " + (v.reasons[0] if v.reasons else ""))
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
