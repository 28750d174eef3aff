"""One verdict from every kind of evidence a job left behind: ``diagnose(inputs, config)``.

Each evidence source is a subpackage with the same surface, facts in and a verdict out:
:mod:`.stacks` (hang or fail-slow), :mod:`.collectives` (Flight Recorder, fused with the stacks by
:mod:`.fusion`), :mod:`.logs` (watchdog timeouts and laggards in training logs), :mod:`.performance`
(metrics and timings) and :mod:`.crashes` (process exits, which lead when present; exits that only
report a lost peer become context when stacks, Flight Recorder dumps or the logs' timeouts say more).
:func:`~rankscope.analytics.fusion.combine` orders the verdicts by the one severity order
(:class:`~rankscope.analytics.verdict.Severity`). Pure: an in-memory
:class:`~rankscope.datasets.domain.inputs.Inputs` in, a frozen
:class:`~rankscope.analytics.verdict.Verdict` out. The CLI's ``diagnose``, ``detect`` and ``fr``
commands all call it (``detect`` and ``fr`` with fewer ``sources``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rankscope.analytics import crashes, stacks
from rankscope.analytics.fusion import combine, fuse
from rankscope.analytics.verdict import Severity, Verdict
from rankscope.config import Config
from rankscope.datasets.domain.inputs import Inputs
from rankscope.spine import InputError

if TYPE_CHECKING:
    from rankscope.analytics.logs import LogFacts
    from rankscope.datasets.domain.exits import ProcessExit
    from rankscope.datasets.domain.flight_recorder import FRDump
    from rankscope.datasets.domain.stacks import ProcStacks
    from rankscope.datasets.domain.topology import Topology

SOURCES = ("stacks", "flight_recorder", "metrics", "timings", "exits", "logs")
"""The evidence ``diagnose`` can use; ``sources=`` picks some of them."""


def diagnose(inputs: Inputs, config: Config | None = None, *, sources: Collection[str] | None = None) -> Verdict:
    """Diagnose one job from whatever evidence is present (all of ``SOURCES`` unless ``sources`` is given).

    Abnormal process exits give a ``crash`` verdict that leads: the first failure is the culprit and
    the hang the stacks show after it is its consequence. Step records are time evidence for the stacks:
    steps that kept completing up to the last snapshot mean the job was moving (slow, not stuck), a
    snapshot taken long after the last step means it was stuck.
    """
    cfg = config or Config()
    use = set(SOURCES if sources is None else sources)
    job, topology = inputs.job, inputs.topology
    verdicts: list[Verdict] = []
    context: list[str] = []
    procs = inputs.procs if "stacks" in use else ()
    fr_dumps = inputs.fr_dumps if "flight_recorder" in use else ()
    log_facts = _log_facts(inputs) if "logs" in use else None
    logs_read = "logs" in use and inputs.logs is not None
    if inputs.exits and "exits" in use:
        crash_v = _exits_verdict(inputs, cfg, context, procs, bool(procs or fr_dumps or logs_read), log_facts)
        if crash_v is not None:
            verdicts.append(crash_v)
    stack_v = fr_v = steps = fr_facts = None
    timings = inputs.timings if "timings" in use else None
    if fr_dumps and topology is not None:
        fr_facts = _fr_facts(inputs, fr_dumps, topology, cfg, log_facts, context)
    if procs and topology is not None:
        stack_facts = stacks.facts(
            procs, topology, config=cfg.stacks, limits=cfg.limits, expected=sorted(inputs.expected_ranks)
        )
        steps = _steps(inputs, timings, stack_facts) or _logged_steps(inputs, log_facts, stack_facts)
        moved = _fr_moved(inputs, fr_dumps, fr_facts, stack_facts) if steps is None and fr_facts is not None else None
        stack_v = stacks.verdict(stack_facts, topology, job=job, steps=steps or moved, config=cfg.stacks)
    if fr_facts is not None and topology is not None:
        fr_v = _fr_verdict(inputs, fr_facts, topology, steps)
    if stack_v is not None and fr_v is not None:
        verdicts.append(fuse(stack_v, fr_v))
    elif stack_v is not None:
        verdicts.append(stack_v)
    elif fr_v is not None:
        verdicts.append(fr_v)
    if log_facts is not None:
        from rankscope.analytics import logs

        log_v = logs.verdict(log_facts, topology, job=job)
        if log_v.details.get("silent") and verdicts:  # no timeout, no step: nothing to weigh against the rest
            context.append(f"[logs] {log_v.reasons[0]}")
        else:
            verdicts.append(log_v)
    notes = list(inputs.notes)
    perf_v = _performance(inputs, cfg, use, notes)
    if perf_v is not None:
        verdicts.append(perf_v)
    if not verdicts:
        return Verdict(
            Severity.INCONCLUSIVE,
            job=job,
            reasons=(
                "no evidence: no stacks, Flight Recorder dumps, exits, metrics or timings were found"
                if not context
                else "no failure of its own: every process exit reports a lost peer or a deliberate stop",
                *context,
                *notes,
            ),
            world_size=topology.world_size if topology is not None else 0,
        )
    v = combine(verdicts)
    v = _premise_held(v, log_facts)
    if context:
        v = v.with_updates(reasons=tuple(v.reasons) + tuple(context))
    if notes:
        v = v.with_updates(details={**v.details, "notes": notes})
    if inputs.inferred_nodes:  # nobody named these machines: say so where a machine reads the verdict
        v = v.with_updates(details={**v.details, "inferred_node_names": list(inputs.inferred_nodes)})
    return v


def _premise_held(v: Verdict, log_facts: LogFacts | None) -> Verdict:
    """A hang on one snapshot's premise (the job was stuck when captured) whose logs time out: the logs'
    timeouts are the time evidence the snapshot lacked."""
    if v.verdict is not Severity.HANG or not v.details.get("stuck_on_premise"):
        return v
    if log_facts is None or not log_facts.hang_evidence:
        return v
    return v.with_updates(
        details={k: x for k, x in v.details.items() if k != "stuck_on_premise"},
        reasons=(
            *v.reasons,
            "The logs' collective or transport timeouts show the job was stuck: the one snapshot's premise holds.",
        ),
    )


def _log_facts(inputs: Inputs) -> LogFacts | None:
    if inputs.logs is None:
        return None
    from rankscope.analytics import logs

    return logs.facts(inputs.logs, inputs.topology)


def _fr_facts(
    inputs: Inputs,
    fr_dumps: Sequence[FRDump],
    topology: Topology,
    cfg: Config,
    log_facts: LogFacts | None,
    context: list[str],
) -> Any:
    """The Flight Recorder dumps' facts, with the time the logs give them (an NCCL timeout dumps at once;
    gloo's logged timeouts clock dumps taken on demand)."""
    from rankscope.analytics import collectives  # only with Flight Recorder dumps (start-up of a stack probe)
    from rankscope.analytics.collectives.gloo_clock import gloo_timeout_clock

    fr_cfg = cfg.collectives
    nccl_dumps = any(d.backend == "nccl" for d in fr_dumps)
    if log_facts is not None and log_facts.hang_evidence and log_facts.nccl_timeouts and nccl_dumps:
        # NCCL's watchdog timed out: torch dumps Flight Recorder on that timeout (TORCH_NCCL_DUMP_ON_TIMEOUT);
        # gloo has no dump on timeout: its dumps were taken on demand, at a time they do not say
        fr_cfg = replace(fr_cfg, dumped_on_timeout=True)
    elif inputs.logs is not None and inputs.logs.gloo:
        clocked, tie = gloo_timeout_clock(fr_dumps, inputs.logs.gloo, inputs.exits)
        fr_dumps = tuple(clocked)
        context += [tie] if tie else []
    return collectives.facts(list(fr_dumps), topology, inputs.memberships, config=fr_cfg)


def _fr_verdict(inputs: Inputs, fr_facts: Any, topology: Topology, steps: Any) -> Verdict:
    """The Flight Recorder's verdict; a hang is not one while steps kept coming."""
    from rankscope.analytics import collectives

    fr_v = collectives.verdict(fr_facts, topology, job=inputs.job)
    if fr_v.verdict is Severity.HANG and steps is not None and steps.progressing:
        fr_v = _kept_stepping(fr_v, steps)
    return fr_v


def _fr_moved(inputs: Inputs, fr_dumps: Sequence[FRDump], fr_facts: Any, f: stacks.StackFacts) -> Any:
    """Time evidence for the stacks from the Flight Recorder: its two latest captures were taken with two stack
    snapshots, the later one the last, and every rank waiting now advanced in between into ops issued since.
    The stacks' own reading of motion (the same waiters at the same lines) cannot tell one step's collective
    from the next one's at the same line; the Flight Recorder's sequence numbers can, so they overrule it."""
    from rankscope.analytics.collectives.captures import stack_rounds_of
    from rankscope.analytics.performance.failslow import StepEvidence

    p = fr_facts.progress  # (see CollectiveFacts.moved)
    if not p.get("moved") or not f.analyses:
        return None
    pair = stack_rounds_of(fr_dumps, inputs.procs, inputs.snapshot_times, p["previous_capture"])
    if pair is None or pair[1] != f.analyses[-1].snapshot:
        return None
    words = (
        f"the Flight Recorder dumps taken with snapshots {pair[0]} and {pair[1]} show every waiting rank advanced "
        f"in between ({p['n_advanced']} of {p['n_ranks_in_both']} ranks issued or finished ops), into ops issued "
        "since",
    )
    return StepEvidence(float("nan"), 0.0, 0, True, False, None, words, source="flight_recorder", between_rounds=True)


def _steps(inputs: Inputs, timings: Any, f: stacks.StackFacts) -> Any:
    """What the step records say about the stack snapshots (None without step times): time evidence that
    overrules the stacks' own reading of whether the job moved."""
    if timings is None or not f.analyses:
        return None
    from rankscope.analytics.performance.failslow import step_evidence

    return step_evidence(
        timings,
        inputs.snapshot_times,
        inputs.snapshot_latest,
        last_snapshot=f.analyses[-1].snapshot,
    )


STEP_AFTER_MAX_S = 300.0
"""A logged step counts as progress at the last snapshot only this soon after its time: later ones are as
likely another run's (a requeued job appends to the same console) or another clock's (a zone is 900 s+)."""


def _logged_steps(inputs: Inputs, log_facts: LogFacts | None, f: stacks.StackFacts) -> Any:
    """A step the logs recorded soon after the latest moment the last snapshot can have been taken (a bound,
    never an exact time), with no process failing in between: the captured processes were moving then. Only
    progress is read here (never a hang: the bound is late)."""
    if log_facts is None or inputs.logs is None or not f.analyses:
        return None
    snap = f.analyses[-1].snapshot
    bound = inputs.snapshot_times.get(snap) or inputs.snapshot_latest.get(snap)
    after = [s.time for s in inputs.logs.steps if s.time is not None and bound is not None and s.time > bound]
    if bound is None or not after or min(after) - bound > STEP_AFTER_MAX_S:
        return None
    first = min(after)
    ended = [e.time for e in inputs.exits if e.timed]
    ended += [x.time for x in inputs.logs.launcher if x.time is not None] + list(inputs.logs.stopped)
    if any(bound - 1.0 <= t <= first for t in ended):  # the captured processes ended before that step
        return None
    from rankscope.analytics.performance.failslow import StepEvidence, logged_slowdown, stepped_between

    words = [f"the logs show a step completed {first - bound:.0f} s after the last snapshot's time"]
    slow = logged_slowdown(inputs.logs.steps)  # and, where they time each step, whether the steps slowed
    if slow is not None:
        per = " per sample" if any(r.batch for r in inputs.logs.steps) else ""
        words.append(f"the logged step time{per} rose {slow[1] / slow[0]:.1f}x at step {slow[2]}")
    ends = [s.time for s in inputs.logs.steps if s.time is not None]
    snaps = {a.snapshot for a in f.analyses}
    between = stepped_between(ends, inputs.snapshot_times, inputs.snapshot_latest, snaps)
    return StepEvidence(first, 0.0, 0, True, False, slow, tuple(words), between_rounds=between)


def _kept_stepping(fr_v: Verdict, steps: Any) -> Verdict:
    """A Flight Recorder "hang" while the step records prove the job kept stepping through the snapshots: the
    collectives in flight were the running job's; the dump names no machine (it stays as context)."""
    return fr_v.with_updates(
        verdict=Severity.INCONCLUSIVE,
        confidence=round(fr_v.confidence * 0.5, 3),
        suspect_nodes=(),
        culprit_nodes=(),
        suspect_ranks=(),
        culprit_ranks=(),
        suspect_group=None,
        reasons=(
            f"The step records show the job kept stepping ({'; '.join(steps.words)}): the collectives in "
            "flight in the Flight Recorder dumps are not a hang.",
            *fr_v.reasons,
        ),
    )


def _exits_verdict(
    inputs: Inputs,
    cfg: Config,
    context: list[str],
    procs: Sequence[ProcStacks],
    other_evidence: bool,
    log_facts: LogFacts | None = None,
) -> Verdict | None:
    """The crash verdict, or None when the exits are only context (their words go to ``context``); ``procs``:
    the stacks in use."""
    crash_v = _crash(inputs, cfg)
    if crash_v is None:
        return None
    replaced = (
        _replaced(inputs.exits, procs, crash_v)
        or _stepped_after(inputs, procs, crash_v)
        or _hung(inputs, log_facts, crash_v)
    )
    if replaced:  # the failed process is not the one the stacks show running: an earlier run's failure
        context.append(f"[events] {replaced} " + " ".join(crash_v.reasons[:1]))
        return None
    if crash_v.details["crash"]["n_primary"] == 0 and other_evidence:
        # every exit reports a lost peer or a deliberate stop (a hung job torn down with SIGTERM, watchdog
        # timeouts): the stacks, Flight Recorder or logs say more than the exits (context)
        context.append("[events] " + " ".join(crash_v.reasons))
        return None
    return crash_v


def _replaced(exits: Sequence[ProcessExit], procs: Sequence[ProcStacks], v: Verdict) -> str:
    """Words when every culprit's failed process (its pid known) is not the process the stacks captured
    running for that rank (another pid): the failure belongs to an earlier run (a console left from yesterday
    beside today's stacks), and the stacks say what the job does now. "" otherwise."""
    live: dict[int, set[int]] = {}
    for p in procs:
        if p.role == "trainer" and p.rank is not None and p.pid is not None and p.status not in ("failed", "cut"):
            live.setdefault(p.rank, set()).add(p.pid)
    gone = [e for e in exits if e.rank in v.culprit_ranks and e.role == "trainer"]
    if not gone or any(e.pid is None or e.rank not in live or e.pid in live[e.rank] for e in gone):
        return ""
    e = gone[0]
    now = min(live[e.rank])
    return (
        f"not this run's failure: rank {e.rank}'s failed process (pid {e.pid}) is not the one its stacks show "
        f"running (pid {now});"
    )


STEPPED_AFTER_S = 60.0
"""Steps logged this long after every culprit's failure mean the job went on without it (a restart, or a later
run writing to the same files): a synchronous job cannot step once a rank is dead."""


def _hung(inputs: Inputs, log_facts: LogFacts | None, v: Verdict) -> str:
    """Words when every culprit died of an abort (SIGABRT, no error of its own) and the logs name it the hang's
    laggard (it never entered the collective its peers timed out in; its heartbeat monitor aborted it): the
    abort is how a hung process is torn down, and the hang is the fault. "" otherwise."""
    if log_facts is None or not log_facts.hang_evidence or not v.culprit_ranks:
        return ""
    laggards = {lg.rank for lg in log_facts.laggards}
    gone = [e for e in inputs.exits if e.rank in v.culprit_ranks]
    if not gone or not set(v.culprit_ranks) <= laggards or not all("SIGABRT" in f"{e.kind} {e.message}" for e in gone):
        return ""
    return (
        "an abort, not a crash: the logs show the process hung (the laggard of the collective its peers timed out in);"
    )


def _stepped_after(inputs: Inputs, procs: Sequence[ProcStacks], v: Verdict) -> str:
    """Words when the logs show training steps well after every culprit's (timed) failure and the stacks show
    each culprit rank running, "" otherwise."""
    alive = {p.rank for p in procs if p.role == "trainer" and p.status in ("ok", "partial")}
    if inputs.logs is None or not set(v.culprit_ranks) <= alive:
        return ""
    failed = [e.time for e in inputs.exits if e.rank in v.culprit_ranks and e.timed]
    steps = [s.time for s in inputs.logs.steps if s.time is not None]
    if not failed or len(failed) < len(v.culprit_ranks) or not steps or max(steps) - max(failed) < STEPPED_AFTER_S:
        return ""
    gap = max(steps) - max(failed)
    return f"not this run's failure: the logs show training steps {gap:.0f} s after it, so the job went on without it;"


def _crash(inputs: Inputs, cfg: Config) -> Verdict | None:
    anchor = max(inputs.snapshot_times.values()) if inputs.snapshot_times else None
    f = crashes.facts(inputs.exits, inputs.topology, config=cfg.crashes, anchor=anchor)
    return crashes.verdict(f, inputs.topology, job=inputs.job) if f is not None else None


def _performance(inputs: Inputs, cfg: Config, use: set[str], notes: list[str]) -> Verdict | None:
    """The metrics-and-timings verdict (metrics of machines outside the job are dropped, with a note)."""
    metrics = inputs.metrics if "metrics" in use else None
    timings = inputs.timings if "timings" in use else None
    if metrics is None and timings is None:
        return None
    from rankscope.analytics import performance

    # metrics of machines outside the job are left out inside (a note says which)
    try:
        f = performance.facts(metrics, timings, inputs.topology, config=cfg.performance)
    except InputError as exc:  # a metric file found bad as it streams: the other evidence still decides
        if not (inputs.procs or inputs.fr_dumps or inputs.exits):
            raise
        notes.append(f"metrics and timings not used: {exc}")
        return None
    return performance.verdict(f, inputs.topology, job=inputs.job) if f is not None else None
