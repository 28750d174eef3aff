"""Whether the job moved while its stacks were captured: time evidence first, then the stacks.

Step records that kept completing up to the last snapshot mean the job progressed; a snapshot taken long
after the last step means it was stuck. Then the stacks: waiters released between consecutive snapshots
(progress), or the same waiters in the same waits (frozen). A single snapshot has no time: a majority
running its own code was running when captured; a majority blocked in waits is stuck only on the premise
that the job was stuck when captured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rankscope.analytics.performance.failslow import StepEvidence
from rankscope.analytics.stacks.facts import Progress, StackFacts
from rankscope.analytics.stacks.frames import WAIT_STATES
from rankscope.analytics.stacks.report import dominant_words
from rankscope.analytics.stacks.snapshot import SnapshotAnalysis


@dataclass
class Motion:
    """Whether the job was moving when captured: ``progressing`` (waiters released, or steps completing),
    ``running`` (a majority running its own code), ``stuck`` (frozen across snapshots, or a capture long
    after the last step), ``still`` (every rank at the very same line through three snapshots or more, none
    waiting on peers: not seen to move, stuck alike) or ``premise`` (one snapshot of a blocked majority: stuck if
    the user says so)."""

    kind: str
    reasons: list[str] = field(default_factory=list)


def motion(facts: StackFacts, steps: StepEvidence | None = None, *, max_running_fraction: float = 0.2) -> Motion:
    """How the job moved across the snapshots (time evidence first, then the stacks).

    ``max_running_fraction``: one snapshot in which more of the trainers than this (and more than one) run
    their own code was taken from a running job (a hang spreads to every rank that depends on the stuck one
    within seconds; what keeps running is the stuck rank, or the few ranks of one faulty machine).
    """
    last = facts.analyses[-1]
    prog = facts.progress
    step_words = list(steps.words) if steps is not None else []
    if steps is not None and steps.progressing:
        if prog is not None and not prog.progressing:
            return Motion(
                "progressing",
                [
                    f"The stacks barely move between the snapshots ({prog.words()}), but "
                    f"{'the step records show' if steps.source == 'steps' else 'time evidence shows'} "
                    f"the job kept going ({'; '.join(step_words)}): the job is slow, not hung."
                ],
            )
        return Motion("progressing", [f"The job was progressing: {'; '.join(step_words)}."])
    if prog is not None and prog.progressing:
        return Motion("progressing", [f"{prog.words()}: the job progresses (not a hang)."] + _also(step_words))
    if steps is not None and steps.stuck:
        return Motion("stuck", [f"Time evidence: {'; '.join(step_words)}."] + _frozen_words(prog))
    if prog is not None and prog.frozen_late and last.blocked_fraction >= 0.5:
        return Motion(
            "stuck-weak",
            [
                f"{prog.words()}: waiters were released until the last pair of snapshots and none in it, yet no rank "
                "sat at one place through the last three: a phase of a running job caught twice (every rank waiting "
                "on one rank's periodic checkpoint or evaluation) looks alike. More rounds, or step times, would tell."
            ]
            + _also(step_words),
        )
    if prog is not None and prog.frozen and last.blocked_fraction >= 0.5:
        return Motion("stuck", _frozen_words(prog) + _also(step_words))
    if prog is not None and prog.frozen and _held_fraction(prog, last) >= 0.5:
        return Motion("stuck", _frozen_words(prog) + [_held_words(prog)] + _also(step_words))
    if prog is not None and prog.peers_frozen and last.blocked_fraction >= 0.5:
        return Motion(
            "stuck",
            [
                f"{prog.words()}: no rank ever left a wait on its peers (only waits of a rank's own, a device sync "
                "or a sleep, came and went): the collectives never completed, so the job is not progressing."
            ]
            + _also(step_words),
        )
    if prog is not None and prog.all_still(last.n_trainers):  # no wait on peers (that is frozen, above)
        return _still(prog, last, step_words)
    if last.blocked_fraction < 0.5:
        dom = last.dominant_states()
        running = sum(n for st, n in dom.items() if st not in WAIT_STATES)
        words = [
            f"{running} of the {sum(dom.values())} ranks in the dominant stack(s) were running their own code "
            f"({dominant_words(last)}), not waiting: the job was running when captured, not stuck."
        ]
        if prog is not None:
            words.insert(0, f"{prog.words()}.")
        return Motion("running", words + _also(step_words))
    n = round(last.running_fraction * last.n_trainers)
    if prog is None and n > max(1.0, max_running_fraction * last.n_trainers):
        return Motion(
            "running",
            [
                f"{n} of {last.n_trainers} ranks were running their own code, not waiting: a hang leaves few ranks "
                "running (every rank that depends on the stuck one blocks within seconds), so the job was "
                "running when captured, not stuck."
            ]
            + _also(step_words),
        )
    words = (
        [
            f"{prog.words()}: too few waiters released to prove progress, nor the same waits in every snapshot "
            "to prove a hang (a step that calls one collective line several times looks alike either way)."
        ]
        if prog
        else []
    )
    return Motion("premise" if prog is None else "stuck-weak", words + _also(step_words))


def _sat_still(prog: Progress) -> frozenset[int]:
    """Ranks running their own code at one place through every snapshot (three or more), while ranks waited on
    their peers at every snapshot and none was ever released: nothing about them moved either."""
    frozen = prog.peers_frozen and all(w > 0 for w in prog.waiters) and not any(prog.released)
    if not frozen or len(prog.still_where) != prog.pairs:
        return frozenset()
    return frozenset.intersection(*prog.still)


def _held_fraction(prog: Progress, last: SnapshotAnalysis) -> float:
    """The share of the dominant ranks that wait, or that sat at one place running their own code through every
    snapshot while the waiters stayed in their waits. A majority running its own code is a running job only
    when it moves: ranks of another duty sleep-polling at one line (evaluators waiting for a checkpoint), or
    a stalled file system, are no sign of life, and the frozen waiters beside them are a hang."""
    sat = _sat_still(prog)
    if not sat:
        return 0.0
    dominant = last.dominant_clusters()
    total = sum(c.size for c in dominant)
    held = sum(c.size if c.state in WAIT_STATES else sum(1 for r in c.ranks if r in sat) for c in dominant)
    return held / total if total else 0.0


def _held_words(prog: Progress) -> str:
    return (
        f"The ranks not waiting sat at one place through all {prog.n_snapshots} snapshots, as the waiters sat in "
        "their waits: nothing in the job moved, so those running their own code are no sign of a running job."
    )


def _still(prog: Progress, last: SnapshotAnalysis, step_words: Sequence[str]) -> Motion:
    return Motion(
        "still",
        [
            f"{prog.words()}: every rank sat at the very same line through the {prog.n_snapshots} snapshots "
            f"({dominant_words(last)}), none waiting on its peers: the job was not seen to move (a stalled file "
            "system, a lock or a sleep-poll on every rank look alike), so it is not called running."
        ]
        + _also(step_words),
    )


def _also(step_words: Sequence[str]) -> list[str]:
    return [f"Steps: {'; '.join(step_words)}."] if step_words else []


def _frozen_words(prog: Progress | None) -> list[str]:
    if prog is None:
        return []
    since = prog.frozen_since
    if since > 0:
        return [
            f"{prog.words()}: waiters were released until snapshot {since}, none after: a hang that began "
            "during the capture; the last snapshot is analysed, so the job is not progressing."
        ]
    return [f"{prog.words()}: the same ranks wait in the same places in every snapshot, so the job is not progressing."]
