"""Stacks of a stuck job whose outliers a known pattern explains: stopped processes, rank 0's own duty, a
data-bound job, and the two ends of a pipeline transfer that never completed (see :mod:`.hang`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rankscope.analytics.faultdomain import node_group, node_limit
from rankscope.analytics.stacks.culprits import pipeline_ends
from rankscope.analytics.stacks.duties import duty_who, stuck_duty_words
from rankscope.analytics.stacks.report import dominant_words
from rankscope.analytics.verdict import Severity, Verdict, rank_ranges

if TYPE_CHECKING:
    from rankscope.analytics.stacks.hang import Hang


def pipeline_ends_verdict(h: Hang) -> Verdict | None:
    """Two adjacent pipeline stages blocked on the link between them (:func:`pipeline_ends`): both ends of a
    transfer that never completed are the culprits, every other waiter in their pipeline is behind them."""
    ends = pipeline_ends(h.a.clusters, h.topology)
    if not ends:
        return None
    a = h.a
    h.reasons.append(
        f"{a.healthy_trainers} of {h.topology.world_size} ranks share the dominant stack(s): {dominant_words(a)}."
    )
    h.reasons.append(
        f"Rank(s) {rank_ranges(ends)[:100]}: adjacent pipeline stages blocked on the link between them (each posted "
        "a transfer the other has not, or both wait only on a matched transfer between them): both ends of a "
        "transfer that never completed (a lost message, a broken link, or a schedule that deadlocks); the other "
        "stages wait behind them."
    )
    group = node_group(ends, h.topology)
    if len(group.nodes) > node_limit(h.topology, h.cfg.max_cover_fraction):
        h.reasons.append("They span too many of the job's nodes to isolate: nothing evicted; look at them first.")
        return h.verdict(Severity.INCONCLUSIVE, 0.3, suspect_ranks=ends, evidence=h.evidence(ends))
    nodes = group.nodes
    h.cover(group, "The culprits are")
    h.culprit_words(ends)
    victims = [r for r in range(h.topology.world_size) if r not in set(ends) and a.state_of(r) in WAITS_ON_PEERS]
    if victims:
        h.reasons.append(f"Rank(s) {rank_ranges(victims)[:200]} wait behind them: named here, not evicted.")
    return h.verdict(
        Severity.HANG,
        round(0.6 + 0.1 * (len(nodes) == 1), 3),
        suspect_nodes=nodes,
        culprit_nodes=nodes,
        suspect_ranks=ends,
        culprit_ranks=ends,
        suspect_group=group,
        evidence=h.evidence(ends, victims),
    )


def stopped_verdict(h: Hang, ranks: Sequence[int]) -> Verdict:
    """The ranks the others wait for are stopped processes: the hang's cause, but no machine's fault."""
    h.culprit_words(ranks)
    h.reasons.append(
        f"Rank(s) {rank_ranges(ranks)[:100]} are stopped (SIGSTOP, state T): a person, a debugger, job control or the "
        "scheduler (a suspended node) stopped them, never a hardware fault. Nothing to evict: resume them "
        "(kill -CONT) or find who stopped them."
    )
    return h.verdict(Severity.INCONCLUSIVE, 0.5, suspect_ranks=tuple(ranks), evidence=h.evidence(ranks))


def main_duty_verdict(h: Hang, ranks: Sequence[int]) -> Verdict:
    """Rank 0 (or replica 0 as a whole) alone stands out, in code no other rank ran: the job's own duties, which
    the job waits on by design."""
    best = h.a.best()
    for r in ranks[:3]:
        f = best.get(r)
        if f is not None:
            h.reasons.append(f"Rank {r} on {h.topology.node_of(r)}: {f.detail}.")
    rounds = len(h.facts.analyses) if h.facts is not None else 1
    duty = h.duty_of(ranks)
    h.reasons.append(stuck_duty_words(rounds, duty, h.a.state_of(ranks[0]) or "compute", duty_who(ranks)))
    suspects = tuple(sorted(set(h.a.outlier_ranks) | set(ranks)))
    return h.verdict(Severity.INCONCLUSIVE, 0.4, suspect_ranks=suspects, evidence=h.evidence(tuple(ranks)))


WAITS_ON_PEERS = ("backward", "collective", "p2p")  # DDP's gradient all-reduce waits inside the autograd engine


def busy_input_verdict(h: Hang, ranks: Sequence[int]) -> Verdict:
    """Ranks wait on their own DataLoader, whose workers are at work as every rank's are, and every other rank
    that stands out waits on its peers (a collective, a transfer, DDP's backward): they wait for those batches,
    a data-bound job. In rounds that do not move, a slow and a stuck input pipeline look alike; neither is a
    machine's fault (the workers run the dataset's code)."""
    stuck = " in every round" if h.frozen else ""
    h.reasons.append(
        f"Rank(s) {rank_ranges(ranks)[:100]} wait for their next batch{stuck} while their DataLoader workers are at "
        "work, as the other ranks' workers are: the input pipeline is producing, more slowly than the step, and the "
        "other ranks wait on their peers (collectives, DDP's backward) for it. A data-bound job, not a machine "
        "fault: nothing evicted. Look at the input pipeline (num_workers, storage, preprocessing, the dataset's "
        "code) first" + ("; if the steps stopped, the dataset's code may loop." if stuck else ".")
    )
    return h.verdict(Severity.INCONCLUSIVE, 0.35, suspect_ranks=tuple(ranks), evidence=h.evidence(ranks))
