"""From Flight Recorder facts to one finding: small pure classifiers, tried from the most definite.

1. :func:`mismatch`: members of one collective disagree (a code/config fault, nothing evicted).
2. :func:`hang`: an op on the wavefront is *overdue* (time evidence, :mod:`.clock`); following who
   waits for whom from the overdue waits ends at the culprits. Every member inside an overdue
   collective nobody is missing from: the fault is inside it (network, NIC, GPU).
3. :func:`progressing`: with an earlier capture, every waiting rank advanced since: a running job.
4. :func:`fail_slow`: completed kernels say some ranks arrive late (``duration_ms``): their nodes.
5. :func:`quiet`: healthy when nothing waits or an explicit clock proves every wait young; otherwise
   ``inconclusive`` naming nobody, with where the waits end *if* the job is known to be stuck.

A running job's dump always shows ops in flight and ranks one op apart: the wavefront alone is never
a hang.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from rankscope.analytics.collectives.clock import AGING, OVERDUE, YOUNG
from rankscope.analytics.collectives.facts import CollectiveFacts
from rankscope.analytics.collectives.result import CollectiveAnalysis, GroupStall
from rankscope.analytics.collectives.waits import P2PWait, Wait, unrecorded_p2p_victims
from rankscope.analytics.collectives.wording import UNSTARTED_WORDS, culprit_words, pg_words, wait_words
from rankscope.analytics.verdict import Evidence, Severity, rank_ranges


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
                (),
                0.5,
            )
        )
    # two captures that show the job moving refute "dumped on a timeout" (an assumed clock, not a measured one)
    rules = (mismatch, progressing, hang, fail_slow) if f.clock.watchdog else (mismatch, hang, progressing, fail_slow)
    for rule in rules:
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


def _stopped(
    f: CollectiveFacts, cset: set[int], p2p: Sequence[P2PWait], culprits: tuple[int, ...], reasons: list[str]
) -> tuple[GroupStall | None, dict[str, Any]]:
    """Where the wavefront stops: the first stalled group holding a culprit, else the stuck p2p transfer."""
    stop = next((s for s in f.stalls if cset & (set(s.missing_ranks) | set(s.no_dump_ranks))), None)
    if stop is not None:
        missing = tuple(sorted(cset & (set(stop.missing_ranks) | set(stop.no_dump_ranks))))
        gone = [r for r in missing if r in stop.no_dump_ranks]
        words = (
            [f"rank(s) {rank_ranges(sorted(set(missing) - set(gone)))} {stop.missing_words}"]
            if set(missing) - set(gone)
            else []
        )
        words += [f"rank(s) {rank_ranges(gone)} left no dump"] if gone else []
        reasons.append(
            f"The wavefront stops in {pg_words(stop.pg, stop.desc, stop.kind)}: collective "
            f"#{stop.seq} ({stop.op or '?'}) has {len(stop.waiting_ranks)} of {len(stop.members)} members "
            f"waiting in it; {' and '.join(words)}."
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
            f"{rank_ranges(missing)} have not started the send/recv their pipeline peer waits in."
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
    overdue = [w for w in f.graph.all_waits() if w.timing.state == OVERDUE]
    if not overdue:
        return None
    at = len(reasons)
    culprits, _ = f.graph.sinks_from(overdue)
    culprits = _without_unrecorded_p2p_victims(f, culprits, reasons)
    direct = [w for w in overdue if set(w.waited_for) & set(culprits)] or overdue
    oldest = max(direct, key=lambda w: w.timing.age_s or 0.0)
    reasons.insert(at, f"Time evidence: {wait_words(f, oldest)}.")
    if not culprits:
        if all(not w.waited_for for w in overdue):
            return stuck_inside(f, overdue, reasons, evidence)
        culprits = tuple(sorted({x for w in overdue for x in w.waited_for}))
        reasons.append(
            "Every stuck rank waits for another stuck rank (a circular wait): collectives were probably "
            "issued in different orders; the culprits below are a best guess."
        )
        strong = False
    else:
        strong = True
    scattered = _scattered(f, culprits)
    if scattered:
        reasons.append(scattered)
        return _inconclusive(f, reasons, evidence, 0.3)
    cset = set(culprits)
    p2p = [(g, r, peer, op) for g, r, peer, op in f.graph.p2p_waits if peer in cset]
    inside = _inside_one(f, culprits) if strong else None
    head = f"{len(f.graph.waits)} rank(s) wait in unfinished ops ({len(overdue)} overdue); following who waits for"
    if inside is None:
        stop, stopped = _stopped(f, cset, p2p, culprits, reasons)
        reasons.append(
            f"{head} whom ends at rank(s) {rank_ranges(culprits)[:200]}, which wait for nobody: the culprit(s)."
        )
    else:
        g = f.groups[inside.group]
        stop, stopped = (
            None,
            dict(stopped_pg=g.name, stopped_kind=g.kind, stopped_index=g.index, stopped_members=g.ranks),
        )
        reasons.append(
            f"{head} whom ends inside {pg_words(g.name, g.desc, g.kind)}: all {len(culprits)} of its members entered "
            f"{inside.entry.profiling_name or inside.entry.op} and none finished it, so the fault is inside it "
            "(network, NVLink/NIC or GPU of its ranks), not a rank that failed to join."
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
    if f.unstarted:  # a rank queued behind a transfer looks like a wait's end: a lead, not grounds to evict
        reasons.append(UNSTARTED_WORDS)
    return CollectiveAnalysis(
        Severity.HANG,
        culprit_ranks=culprits,
        confidence=min((0.9 if strong else 0.5) - (0.1 if gone else 0.0), 0.5 if f.unstarted else 1.0),
        reasons=tuple(reasons),
        evidence=tuple(evidence),
        **stopped,
        **f.common(),
    )


def _inside_one(f: CollectiveFacts, culprits: Sequence[int]) -> Wait | None:
    """The wait of the culprits when they are exactly one group's members, all in the same collective of it and
    blocked by nobody (they all entered it and it never completed); else None."""
    first = f.graph.waits.get(culprits[0]) if len(culprits) > 1 else None
    if not first:
        return None
    w0 = first[0]
    if w0.entry.is_p2p or tuple(sorted(culprits)) != tuple(sorted(f.groups[w0.group].ranks)):
        return None
    key = (w0.group, w0.entry.collective_seq_id)

    def entered(r: int) -> bool:  # waits in that collective, for nobody: every member started it
        return any((w.group, w.entry.collective_seq_id) == key and not w.waited_for for w in f.graph.waits.get(r, ()))

    return w0 if all(map(entered, culprits)) else None


MAX_CULPRIT_NODE_FRACTION = 0.25
"""Waits ending on more than this share of the job's machines (and more than :data:`_HINT_MAX_NODES`) are
no machine fault: one stuck machine stops its groups, and every wait leads back to it."""


def _scattered(f: CollectiveFacts, culprits: Sequence[int]) -> str:
    """Why the culprits are not one fault domain (empty when they are)."""
    mine = set(f.nodes(culprits))
    every = set(f.nodes(range(f.world)))
    if not every or len(mine) <= max(_HINT_MAX_NODES, MAX_CULPRIT_NODE_FRACTION * len(every)):
        return ""
    return (
        f"The overdue waits end at {len(culprits)} ranks on {len(mine)} of {len(every)} machines: not one "
        "machine's fault (one stuck machine stops its groups and every wait leads back to it). A job-wide stop, "
        "or dumps of a running job read with a wrong clock: nobody is named."
    )


def _without_unrecorded_p2p_victims(f: CollectiveFacts, sinks: tuple[int, ...], reasons: list[str]) -> tuple[int, ...]:
    """Sinks blocked in a send/recv the dumps cannot show are victims, not culprits (see
    :func:`.waits.unrecorded_p2p_victims`)."""
    stuck = {r for r, ws in f.graph.waits.items() if any(w.timing.state == OVERDUE for w in ws)}
    last = f.clock.last_active
    victims = unrecorded_p2p_victims(f.graph, sinks, stuck, f.no_dump, last, f.pp_neighbors)
    if not victims:
        return sinks
    reasons.append(
        "Send/recv are not recorded by this backend: "
        + "; ".join(
            f"rank {b} went quiet {(last[b] - last[p]) / 1e6:.0f} ms after its pipeline neighbour rank {p} was "
            "stuck, so it most likely waits in a send/recv to it"
            for b, p in sorted(victims.items())[:5]
        )
        + " (not a culprit)."
    )
    return tuple(r for r in sinks if r not in victims)


def stuck_inside(
    f: CollectiveFacts, overdue: list[Wait], reasons: list[str], evidence: list[Evidence]
) -> CollectiveAnalysis:
    """Overdue ops every member (or both ends) started: the fault is inside the collective."""
    w = max(overdue, key=lambda x: x.timing.age_s or 0.0)
    info = f.groups[w.group]
    members = info.ranks
    if w.entry.is_p2p:
        members = tuple(sorted({w.rank, *(p for g, r, p, _ in f.graph.p2p_waits if r == w.rank and g == w.group)}))
    reasons.append(
        f"Every member of {pg_words(info.name, info.desc, info.kind)} entered "
        f"{w.entry.profiling_name or w.entry.op} but it never completed: the fault is inside it (network, "
        f"NIC or GPU of one of its {len(members)} ranks), not a rank that failed to join."
    )
    evidence.append(
        Evidence(
            "flight_recorder",
            "stuck-collective",
            f"pg {info.name} {w.entry.op} entered by every member, unfinished {w.timing.words()}",
            members[:1000],
            f.nodes(members),
            0.6,
        )
    )
    return CollectiveAnalysis(
        Severity.HANG,
        stopped_pg=info.name,
        stopped_kind=info.kind,
        stopped_index=info.index,
        stopped_members=members,
        confidence=0.6,
        reasons=tuple(reasons),
        evidence=tuple(evidence),
        **f.common(),
    )


def progressing(f: CollectiveFacts, reasons: list[str], evidence: list[Evidence]) -> CollectiveAnalysis | None:
    """An earlier capture shows every waiting rank advanced since, into waits that are all new."""
    p = f.progress
    if p is None or not f.moved():
        return None
    reasons.append(
        f"Between capture {p.previous} and this one, every waiting rank advanced ({len(p.advanced)} of "
        f"{len(p.ranks)} ranks issued or finished ops) and every op in flight now was issued since: the "
        "job was running when it was captured."
    )
    return _running(f, reasons, evidence, 0.6)


def _running(f: CollectiveFacts, reasons: list[str], evidence: list[Evidence], conf: float) -> CollectiveAnalysis:
    """A running job: healthy, or fail-slow when completed kernels say some ranks arrive late."""
    slow = fail_slow(f, reasons, evidence)
    if slow is not None:
        return slow
    return CollectiveAnalysis(
        Severity.HEALTHY,
        confidence=conf if not f.no_dump else conf - 0.2,
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
                f"rank {r} arrives last at its group's collectives far more often than chance; its peers "
                f"spend {f.slow_scores[r]:.0%} of the group's recorded time waiting for it",
                (r,),
                f.node(r),
                min(1.0, 0.5 + float(f.slow_scores[r])),
            )
        )
    reasons.append(
        f"Completed collectives show rank(s) {rank_ranges(f.slow)} arriving late (their peers' kernels "
        "wait for them): fail-slow, not a hang."
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
    """No overdue op: healthy where nothing waits or the clock proves every wait young; else inconclusive."""
    if len(f.no_dump) > f.world // 2:
        reasons.append("Too few dumps to tell a healthy job from a hang.")
        return _inconclusive(f, reasons, evidence, 0.2)
    waits = list(f.graph.all_waits())
    if not waits:
        behind = [s for s in f.stalls if s.missing_ranks]
        if behind:
            s = behind[0]
            reasons.append(
                f"Nobody waits in an unfinished op, yet rank(s) {rank_ranges(s.missing_ranks)} are behind in "
                f"{pg_words(s.pg, s.desc, s.kind)} (#{s.seq})."
            )
            return _inconclusive(f, reasons, evidence, 0.3)
        reasons.append("No rank waits in an unfinished collective; members agree on op, sizes and dtypes.")
        if f.clock.watchdog:  # "written on a timeout", yet nothing in flight: the timed-out op looks finished
            reasons.append(
                "Yet the dumps were written on a timeout (--dumped-on-timeout, or a timeout in the logs): gloo "
                "retires an op that timed out as if it had finished, so these dumps cannot show the wait"
                + (f"; rank(s) {rank_ranges(f.no_dump)} left no dump." if f.no_dump else ".")
            )
            return _inconclusive(f, reasons, evidence, 0.3)
        if f.unrecorded:
            reasons.append(
                f"But rank(s) {rank_ranges(f.unrecorded)} ran ops their dumps do not record (their groups' counters "
                "run ahead of every recorded op: gloo's send/recv): the dumps cannot tell whether one of those waits."
            )
            return _inconclusive(f, reasons, evidence, 0.3)
        return _running(f, reasons, evidence, 0.8)
    states = Counter(w.timing.state for w in waits)
    if states.keys() == {YOUNG}:
        oldest = max(waits, key=lambda w: w.timing.age_s or 0.0)
        against = (
            "the recorded capture time"
            if all(w.timing.explicit for w in waits)
            else "the capture time the dumps' own stamps bound (NCCL stamps the entries it finds started or "
            "completed, not yet retired, while it dumps)"
        )
        reasons.append(
            f"All {len(waits)} op(s) in flight are young against {against} (the oldest: "
            f"{wait_words(f, oldest)}): a running job."
        )
        return _running(f, reasons, evidence, 0.7)
    if states.get(AGING):
        oldest = max((w for w in waits if w.timing.state == AGING), key=lambda w: w.timing.age_s or 0.0)
        reasons.append(f"An op has been in flight longer than usual but is not overdue yet: {wait_words(f, oldest)}.")
    else:
        reasons.append(
            f"{len(waits)} op(s) are in flight, as in any running job, and the dumps carry no capture time "
            "to tell how long they have waited (FR records none; the rankscope hook and agent add one): no "
            "time evidence of a hang."
        )
    return _inconclusive(f, reasons, evidence, 0.3, hint=True)


_HINT_MAX_NODES = 4
"""A wavefront ending on more nodes than this is the ordinary skew of a running job, not a place to look."""


def _inconclusive(
    f: CollectiveFacts, reasons: list[str], evidence: list[Evidence], conf: float, *, hint: bool = False
) -> CollectiveAnalysis:
    if_stuck: tuple[int, ...] = ()
    if hint:
        sinks, _ = f.graph.sinks_from(f.graph.all_waits())
        victims = unrecorded_p2p_victims(
            f.graph, sinks, set(f.graph.waits), f.no_dump, f.clock.last_active, f.pp_neighbors
        )
        if_stuck = tuple(r for r in sinks if r not in victims)
        where = ", ".join(n for n in f.nodes(if_stuck[:8]) if n) or "?"
        if if_stuck and len(f.nodes(if_stuck)) <= _HINT_MAX_NODES:
            reasons.append(
                f"If the job is known to be stuck, look at rank(s) {rank_ranges(if_stuck)[:200]} ({where}): the "
                "waits end there. Nothing is named without time evidence."
            )
        elif if_stuck:
            reasons.append(
                f"The waits end at {len(if_stuck)} ranks on {len(f.nodes(if_stuck))} nodes, ranks one op behind their "
                "peers, as in a running job: no single place to look."
            )
    if f.slow:
        reasons.append(f"Completed collectives show rank(s) {rank_ranges(f.slow)} arriving late.")
    return CollectiveAnalysis(
        Severity.INCONCLUSIVE,
        confidence=conf,
        reasons=tuple(reasons),
        evidence=tuple(evidence),
        if_stuck_ranks=if_stuck,
        **f.common(),
    )
