"""The rules of the decision ladder, one function each, and :data:`RULES`, the table the ladder reads
top to bottom (see :mod:`.ladder` for the order and why)."""

from __future__ import annotations

from .evidence import (
    AGGREGATION_EVIDENCE,
    CAPTURE_FAILURE_EVIDENCE,
    MACHINE_VERDICTS,
    NOT_A_MACHINE,
    STOP_TIME_CHECKS,
    _code_actions,
    _crash_culprits,
    _culprit_evidence,
    _drain_signals,
    _machine_signals,
    _metric_onset,
    _network_alerts,
    _newest_complete,
    _restart,
    _widespread,
)
from .plan import Action
from .situation import Decision, Facts, LadderRule


def machine_event(f: Facts) -> Decision | None:
    found, unlocated = _machine_signals(f)
    if not found and unlocated:
        why = f"a machine fault was reported without naming the machine ({unlocated[0]})"
        return Decision(
            "machine",
            0.5,
            (
                Action(
                    "collect",
                    why + ": nothing can be evicted yet",
                    collect=(
                        "which machine logged it (the log file's host, the agent's node name, nvidia-smi -q on each)",
                    ),
                ),
            ),
            (why,),
        )
    if not found:
        return None
    nodes = tuple(sorted(found))
    what = "; ".join(f"{n}: {found[n][1]}" for n in nodes)
    reason = f"high-confidence machine fault ({what}): evict now, skip stop-time checks"
    return Decision(
        "machine",
        max(c for c, _ in found.values()),
        (Action("evict", reason, nodes=nodes), _restart(f, "on warm standbys", exclude=nodes)),
        (f"machine events name {', '.join(nodes)}; the fault follows the machine",),
        nodes,
    )


def network_repeat(f: Facts) -> Decision | None:
    alerts = _network_alerts(f)
    rep = {n: t for n, t in alerts.items() if len(t) >= f.cfg.network_repeat_count}
    if not rep:
        return None
    nodes = tuple(sorted(rep))
    win = f.cfg.network_window_seconds
    reason = (
        f"network alerts repeated within {win:g} s ({', '.join(f'{n}: {len(rep[n])}x' for n in nodes)}): "
        "not a flap that recovers by itself"
    )
    return Decision(
        "network",
        0.85,
        (Action("evict", reason, nodes=nodes), _restart(f, "on warm standbys", exclude=nodes)),
        (f"ByteRobust tolerates a network alert once and evicts on a repeat within {win:g} s",),
        nodes,
    )


def code_fault(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is not None and v.kind == "mismatch":
        why = "the ranks disagree on the collectives they call (mismatch): a code or configuration fault"
        return Decision("code", max(v.confidence, 0.7), _code_actions(f, why), (why, "no machine is evicted"))
    if v is not None and v.kind == "crash" and any(e.kind == "widespread-crash" for e in v.evidence):
        why = f"{len(v.culprit_ranks)} ranks failed with the same error: a code, data or configuration fault"
        return Decision("code", max(v.confidence, 0.7), _code_actions(f, why), (why, "no machine is evicted"))
    ws = _widespread(f)
    if ws is None:
        return None
    sig, members = ws
    cat = members[0].category
    who = sorted({str(c.rank) if c.rank is not None else c.node for c in members})
    why = (
        f"the same {cat} error on {len(members)} ranks/nodes ({', '.join(who[:8])}"
        f"{', ...' if len(who) > 8 else ''}): {members[0].text[:160]}"
    )
    category = {"data": "data", "resources": "resources"}.get(members[0].domain, "code")
    return Decision(
        category,
        0.8,
        _code_actions(f, why),
        (why, "an error every rank hits is in the code, data or configuration, not in one machine"),
    )


def crash_not_machine(f: Facts) -> Decision | None:
    culprits = _crash_culprits(f)
    if not culprits:
        return None
    classes = [c for c, _ in culprits]
    if not all(c is not None and c.domain in NOT_A_MACHINE for c in classes):
        return None
    c0 = classes[0]
    assert c0 is not None
    what = culprits[0][1]
    if c0.domain == "resources":
        why = f"the first failure ran out of memory ({what})"
        actions: tuple[Action, ...] = (
            Action("stop", f"{why}: the job asks for more memory than it has; a restart fails the same way"),
            Action(
                "collect",
                "to size the job",
                collect=(
                    "memory per rank (torch.cuda.max_memory_allocated, RSS)",
                    "the batch size and activation checkpointing settings",
                ),
            ),
        )
    elif c0.domain == "data":
        why = f"the first failure is a data error ({what})"
        actions = (
            Action("stop", f"{why}: skip or repair the sample before restarting"),
            Action("collect", "to find the bad input", collect=("the sample / shard index the error names",)),
        )
    else:
        why = f"the first failure is an error in the code ({what})"
        actions = _code_actions(f, why)
    cat = {"resources": "resources", "data": "data", "numerics": "numerics"}.get(c0.domain, "code")
    return Decision(cat, 0.75, actions, (why, f"classified {c0.category} by rule {c0.rule}: not a machine fault"))


def capture_failed(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind not in MACHINE_VERDICTS or not v.isolate_nodes:
        return None
    kinds = _culprit_evidence(v)
    only_failed = (kinds and all(k in CAPTURE_FAILURE_EVIDENCE for k in kinds)) or (not kinds and v.failed_clusters)
    if not only_failed:
        return None
    ranks = ",".join(map(str, v.culprit_ranks[:16])) or "?"
    why = (
        f"the only evidence against {', '.join(v.culprit_nodes or v.suspect_nodes)} is a stack capture that "
        f"failed or was cut off (ranks {ranks}): a failed capture is not a fault"
    )
    return Decision(
        "evidence",
        v.confidence,
        (
            Action(
                "collect",
                why,
                collect=(
                    f"a fresh capture of ranks {ranks} through the in-process hook (faulthandler / SIGUSR2), "
                    "not ptrace",
                    "py-spy's own error for those ranks (ptrace permission, a process in uninterruptible sleep)",
                    f"the kernel log of {', '.join(v.culprit_nodes or v.suspect_nodes)} (Xid, hung task)",
                ),
            ),
        ),
        (why, "no eviction on a failed capture"),
        v.isolate_nodes,
    )


def verdict_machine(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind not in MACHINE_VERDICTS or not v.isolate_nodes:
        return None
    if v.confidence < f.cfg.min_verdict_confidence or v.on_premise:
        return None  # too weak, or a hang only if the job was stuck when its one snapshot was taken: collect
    if v.kind == "crash" and v.crash_n_primary == 0:
        return None  # every failure reports a lost peer: no machine culprit
    nodes = v.isolate_nodes
    lead = v.reasons[0] if v.reasons else f"{v.kind} verdict"
    reason = (
        f"{v.kind} verdict (confidence {v.confidence:.2f}) isolates {', '.join(nodes)}"
        + (
            f" (the {v.group_kind.upper()} group{'s' if v.group_count > 1 else ''} of the outliers)"
            if v.group_kind and v.group_kind != "node"
            else ""
        )
        + (f"; likeliest culprit {', '.join(v.culprit_nodes)}" if v.culprit_nodes else "")
    )
    return Decision(
        "machine",
        v.confidence,
        (Action("evict", reason, nodes=nodes), _restart(f, "on warm standbys", exclude=nodes)),
        (lead, "over-evict the fault domain rather than chase the exact culprit"),
        nodes,
    )


def low_confidence(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind not in MACHINE_VERDICTS or not v.isolate_nodes:
        return None
    weak = v.confidence < f.cfg.min_verdict_confidence or (v.kind == "crash" and v.crash_n_primary == 0)
    if not weak and not v.on_premise:
        return None
    why = f"{v.kind} verdict names {', '.join(v.isolate_nodes)} " + (
        f"with confidence {v.confidence:.2f} (< {f.cfg.min_verdict_confidence:.2f}): too weak to evict a machine"
        if weak
        else "from one snapshot with no time: stuck only if the job was stuck when it was captured (a running job "
        "caught at that instant looks alike); a second round settles it before a machine is evicted"
    )
    more = ("another capture round (5 rounds 10 s apart for a slowdown)",) + AGGREGATION_EVIDENCE[1:]
    return Decision("evidence", v.confidence, (Action("collect", why, collect=more),), (why,), v.isolate_nodes)


def numerics(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is not None and v.kind in MACHINE_VERDICTS and v.isolate_nodes:
        return None
    onset = _metric_onset(f)
    if onset is None:
        return None
    step, _, what = onset
    ck = _newest_complete(f.s.checkpoints, before_step=step)
    if ck is not None:
        rb = Action(
            "rollback",
            f"{what}: roll back to the newest complete checkpoint before the onset",
            checkpoint=ck.path,
            step=ck.step,
        )
    elif step is not None:
        rb = Action(
            "rollback",
            f"{what}: roll back to the newest complete checkpoint before step {step} (none recorded here)",
            step=step,
        )
    else:
        rb = Action("rollback", f"{what}: roll back to the newest complete checkpoint before the first NaN")
    return Decision(
        "numerics",
        0.8,
        (
            rb,
            Action(
                "collect",
                "if it recurs from the same checkpoint",
                collect=("the data batch at the onset step (skip it on the replay)",) + STOP_TIME_CHECKS[2:],
            ),
        ),
        (what, "no machine verdict: the training trajectory itself went wrong"),
    )


def network_once(f: Facts) -> Decision | None:
    alerts = _network_alerts(f)
    if not alerts:
        return None
    nodes = tuple(sorted(alerts))
    why = (
        f"network alert on {', '.join(nodes)}, not repeated within {f.cfg.network_window_seconds:g} s: "
        "NIC and switch flaps often recover by themselves"
    )
    return Decision(
        "network",
        0.6,
        (Action("tolerate", why, nodes=nodes),),
        (why, f"evict on alert number {f.cfg.network_repeat_count} within the window"),
        nodes,
    )


def machine_drain(f: Facts) -> Decision | None:
    drains = _drain_signals(f)
    if not drains:
        return None
    nodes = tuple(sorted(drains))
    what = "; ".join(f"{n}: {drains[n]}" for n in nodes)
    why = f"a GPU needs a reset at its next opportunity but still works ({what})"
    return Decision(
        "machine",
        0.6,
        (
            Action("tolerate", why + ": a working machine is not evicted from a running job", nodes=nodes),
            Action(
                "collect",
                "before the job next restarts",
                nodes=nodes,
                collect=(
                    f"drain {', '.join(nodes)} from the scheduler and reset the GPU (nvidia-smi -r) before the next "
                    "restart places work there",
                    "nvidia-smi -q -d ROW_REMAPPER,ECC: pending remaps and the corrected-error counts",
                ),
            ),
        ),
        (why, "NVIDIA's catalog: the fix is a GPU reset, which a running job does not need yet"),
        nodes,
    )


def symptom_only(f: Facts) -> Decision | None:
    v = f.s.verdict
    cascade_crash = v is not None and v.kind == "crash" and v.crash_n_primary == 0
    symptoms = [c for c in f.signals if c.domain == "symptom"]
    if not symptoms and not cascade_crash:
        return None
    if v is not None and v.kind not in ("crash", "inconclusive", "healthy"):
        return None  # a stack or FR verdict already did the aggregation; its own rule decides
    what = symptoms[0].text[:160] if symptoms else "every crashed rank reports a lost peer"
    why = (
        f"only symptoms of a fault elsewhere ({len(symptoms)} line(s)/exit(s) of collective timeouts, lost "
        f"peers or teardown; first: {what}): a timeout is never a verdict by itself"
    )
    return Decision(
        "symptom",
        0.5,
        (Action("collect", why + "; route to the aggregation analysis", collect=AGGREGATION_EVIDENCE),),
        (why,),
    )


def degraded(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind != "degraded":
        return None
    nodes = v.isolate_nodes
    why = (
        f"degraded: {', '.join(nodes) or 'some machines'} behave unlike their peers (health metrics) but "
        "training is not slower yet"
    )
    return Decision(
        "degraded",
        v.confidence,
        (
            Action("tolerate", why + ": no eviction while training keeps pace", nodes=nodes),
            Action(
                "collect",
                "before the next planned restart",
                collect=tuple(f"{c} on {', '.join(nodes)}" if nodes else c for c in STOP_TIME_CHECKS[:1])
                + ("step times per rank over the next rounds (a slowdown turns this into fail-slow)",),
            ),
        ),
        (why,),
        nodes,
    )


def imbalance(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind != "imbalance":
        return None
    why = "imbalance: the work is uneven across ranks (stages, shards, sequence lengths); no machine is at fault"
    return Decision(
        "imbalance",
        v.confidence,
        (
            Action(
                "collect",
                why,
                collect=(
                    "per-rank step and stage times with the parallel layout (--layout tp=..,pp=..,dp=..)",
                    "tokens / samples per rank per step (data-loader balance)",
                ),
            ),
        ),
        (why, "no eviction"),
    )


def inconclusive(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind != "inconclusive":
        return None
    why = "inconclusive: the evidence does not single out a machine"
    more = tuple(r for r in v.reasons[:3])
    return Decision(
        "evidence",
        v.confidence,
        (
            Action(
                "collect",
                why,
                collect=AGGREGATION_EVIDENCE + ("the agent's health events and process exits for the same minutes",),
            ),
        ),
        (why,) + more,
    )


def healthy(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind != "healthy":
        return None
    return Decision(
        "healthy",
        v.confidence,
        (Action("tolerate", "healthy: no fault found; keep training"),),
        ("the verdict finds no machine unlike its peers",),
    )


def no_signal(f: Facts) -> Decision | None:
    why = "no verdict, machine event or recognised log line: nothing to act on"
    return Decision(
        "evidence",
        0.0,
        (
            Action(
                "collect",
                why,
                collect=("a verdict: `rankscope diagnose` on the job's dumps or store",) + AGGREGATION_EVIDENCE[:2],
            ),
        ),
        (why,),
    )


RULES: tuple[LadderRule, ...] = (
    LadderRule("machine-event", "high-confidence machine event -> evict that machine now", machine_event),
    LadderRule("network-repeat", "network alert repeated within the window -> evict", network_repeat),
    LadderRule("code-fault", "mismatch, or the same error on many ranks -> roll back code or stop", code_fault),
    LadderRule("crash-not-machine", "the first failure is code, data or OOM -> no eviction", crash_not_machine),
    LadderRule("capture-failed", "only a failed stack capture -> collect again", capture_failed),
    LadderRule(
        "verdict-machine", "hang/fail-slow/crash with a machine culprit -> evict suspects, restart", verdict_machine
    ),
    LadderRule("low-confidence", "machine verdict too weak -> collect", low_confidence),
    LadderRule("numerics", "NaN or 5x loss/grad-norm jump, no machine verdict -> roll back", numerics),
    LadderRule("network-once", "first network alert -> tolerate", network_once),
    LadderRule("machine-drain", "a GPU needs a reset but works (Xid 63, 92) -> tolerate, drain", machine_drain),
    LadderRule("symptom-only", "collective timeouts / lost peers only -> aggregation analysis", symptom_only),
    LadderRule("degraded", "degraded -> tolerate, check at the next restart", degraded),
    LadderRule("imbalance", "imbalance -> no eviction, collect timings", imbalance),
    LadderRule("inconclusive", "inconclusive -> no eviction, collect evidence", inconclusive),
    LadderRule("healthy", "healthy -> keep training", healthy),
    LadderRule("no-signal", "nothing recognised -> collect", no_signal),
)
