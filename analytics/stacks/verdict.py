"""Stacks -> Verdict: is the job stuck, slow or running, and which machine is at fault.

Decision procedure:

1. **Start-up.** Most ranks still importing or joining the process group: ``inconclusive``, nothing named.
2. **Motion.** Time evidence first: step records that kept completing up to the last snapshot mean the
   job progressed; a snapshot taken long after the last step means it was stuck. Then the stacks:
   waiters released between consecutive snapshots (progress), or the same waiters in the same waits
   (frozen). A single snapshot has no time: a majority running its own code was running when captured
   (no hang); a majority blocked in waits is analysed as a hang on the premise that the job was stuck
   when captured, and the reasons say so.
3. **Progressing or running:** the fail-slow vote over the rounds (:mod:`..performance.failslow`);
   ``fail-slow`` when a rank stands out, else ``healthy``.
4. **Stuck:** localize from the strong culprits outward. A rank that does not wait on anyone (compute,
   I/O, a stuck child, a missing process its group waits for) is a culprit; outliers that wait in a
   group containing it are its victims (named, not evicted); the suspects are the culprits' nodes,
   extended to the smallest group holding them while that stays a small share of the job. Culprits in
   unrelated groups: ``inconclusive``. When everyone waits, the smallest cover of the outliers by
   groups of one kind is isolated (ByteRobust's over-eviction), the likeliest origin named.

Failed captures (py-spy errors, empty files, dumps cut off as a process died) are never evidence:
they are listed under collection problems with what to do about them.
"""

from __future__ import annotations

import numpy as np

from rankscope.analytics.performance.failslow import StepEvidence
from rankscope.analytics.stacks.facts import StackFacts
from rankscope.analytics.stacks.hang import hang_verdict
from rankscope.analytics.stacks.motion import Motion, motion
from rankscope.analytics.stacks.moving import moving_verdict
from rankscope.analytics.stacks.report import common_fields, details, problem_words, problems_of, round_states
from rankscope.analytics.stacks.snapshot import STATE_CODE
from rankscope.analytics.verdict import Severity, Verdict, rank_ranges
from rankscope.config import StackConfig
from rankscope.datasets.domain.topology import Topology

__all__ = ["round_states", "verdict"]


def verdict(
    facts: StackFacts,
    topology: Topology,
    *,
    job: str = "",
    steps: StepEvidence | None = None,
    config: StackConfig | None = None,
) -> Verdict:
    """The stack verdict: start-up, progressing (fail-slow or healthy), or stuck (hang, localized).

    ``steps``: what the job's step records say about the snapshots (time evidence, which overrules the
    stacks' own reading of motion).
    """
    if not facts.analyses:
        return Verdict(
            Severity.INCONCLUSIVE,
            job=job,
            confidence=0.0,
            reasons=("no stack dumps",),
            world_size=topology.world_size,
            sources=("stacks",),
        )
    last = facts.analyses[-1]
    if last.n_trainers == 0:  # no usable stack at all (every capture failed): inconclusive, with the problems
        return hang_verdict(facts, topology, Motion("premise"), job)
    if last.startup_fraction >= 0.5:
        return _startup_verdict(facts, topology, job, steps)
    m = motion(facts, steps, max_running_fraction=(config or StackConfig()).max_running_fraction)
    if m.kind in ("progressing", "running"):
        return moving_verdict(facts, topology, m, job, steps)
    if m.kind == "stuck-weak" and facts.progress is not None and facts.progress.moving_pairs > 0:
        # the job moved in some pairs, not in others: a rank ByteRobust's rounds vote names is a slow rank
        v = moving_verdict(facts, topology, m, job, steps)
        if v.verdict is Severity.FAIL_SLOW:
            return v
    return hang_verdict(facts, topology, m, job)


def _startup_verdict(facts: StackFacts, topology: Topology, job: str, steps: StepEvidence | None) -> Verdict:
    a = facts.analyses[-1]
    n = int(np.count_nonzero(a.states == STATE_CODE["startup"]))
    reasons = [
        f"{n} of {a.n_trainers} ranks were still starting (importing modules or joining the process group) when "
        "captured"
        + (" and no step was logged" if steps is None else f"; {steps.n_steps} step(s) were logged")
        + ": stopped during start-up. A slow start is not a machine fault a stack can name; nothing is evicted.",
    ]
    others = [r for r in range(a.states.size) if a.states[r] >= 0 and a.states[r] != STATE_CODE["startup"]]
    if others and len(others) <= 8:
        reasons.append(
            f"Rank(s) {rank_ranges(others)} were not in start-up code but elsewhere (their own code, or a wait "
            "after it): if the others wait in the rendezvous or init_process_group, those are the ranks that have "
            "not joined; look at them first."
        )
    reasons += problem_words(problems_of(facts))
    return Verdict(
        Severity.INCONCLUSIVE,
        confidence=0.3,
        reasons=tuple(reasons),
        details=details(facts, {"startup_ranks": n}),
        **common_fields(facts, topology, job, a),
    )
