"""ByteRobust's decision ladder, pure: a :class:`Situation` in, one :class:`~.plan.Plan` out.

The ladder is a table (:data:`RULES`) read top to bottom; the first rule that matches decides, the
others that also matched are listed in the plan (``also_matched``), and every action carries its reason.
Cheapest and surest first, as in the paper (§3.2 of the digest):

1. ``machine-event``: a high-confidence machine event (GPU lost, fatal Xid, uncorrectable ECC, disk fault,
   read-only filesystem) -> evict that machine now, no analysis, restart from the newest complete
   checkpoint;
2. ``network-repeat``: a network alert seen again within the window (twice within 5 minutes) -> evict;
3. ``code-fault``: a ``mismatch`` verdict, or the same error on many ranks -> code or configuration: no
   eviction; roll back to the previous code version if one is recorded, else stop;
4. ``crash-not-machine``: a crash whose first failure is user code, data or out-of-memory -> no eviction;
5. ``capture-failed``: the only evidence against the culprit is a stack capture that failed -> collect;
6. ``verdict-machine``: ``hang`` / ``fail-slow`` / ``crash`` with a machine culprit -> evict the suspect
   machines (the verdict's over-eviction) and restart; a job that fails again right after such an
   eviction escalates: first widen to the suspect groups of both incidents, then stop and ask for
   stop-time checks;
7. ``low-confidence``: a machine verdict below the confidence floor -> collect;
8. ``numerics``: NaN/Inf or a 5x loss / grad-norm jump with no machine verdict -> roll back to the
   newest complete checkpoint before the onset;
9. ``network-once``: a first network alert -> tolerate;
10. ``machine-drain``: a GPU that needs a reset but works (Xid 63 row remap pending, 92 high corrected
    error rate) -> tolerate; drain and reset it before the next restart;
11. ``symptom-only``: only collective timeouts / lost peers (or a crash made only of cascades) -> never a
    verdict by itself: collect stacks and Flight Recorder dumps for the aggregation analysis;
12. ``degraded``, ``imbalance``, ``inconclusive``, ``healthy``, ``no-signal``: no eviction; say what
    evidence to collect next.

Nothing here reads a clock, a file or the network: ``now`` is an input (or the newest input time), so
the same situation always gives the same plan.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from .classify import DEFAULT_TABLE, Classification, RuleTable
from .evidence import STOP_TIME_CHECKS, _metric_onset, _restart
from .plan import Action, Plan
from .rules import RULES
from .situation import Decision, Facts, LadderConfig, LadderRule, Situation

__all__ = ["RULES", "LadderConfig", "Situation", "evaluate", "incident_key"]

# ----------------------------------------------------------------------------------------------------------
# escalation


def _escalate(f: Facts, d: Decision) -> tuple[str, int, Decision]:
    """The job failed again right after an eviction: widen to both incidents' suspects, then stop.

    "Right after" is within ``escalation_window_seconds`` and before the job completed a checkpoint
    after the eviction: a job that trained to a new complete checkpoint on its new machines was fixed,
    and a later fault is a new one (when checkpoint times are known)."""
    lo = f.now - f.cfg.escalation_window_seconds
    prior = [h for h in f.history if h.executed and h.kind == "evict" and lo <= h.time <= f.now]
    if not prior:
        return "verdict-machine", 0, d
    last = max(h.time for h in prior)
    since = [(c.step, c.time) for c in f.s.checkpoints if c.complete and c.time is not None and last < c.time <= f.now]
    if since:
        step, when = max(since)
        why = (
            f"the job completed checkpoint step {step} {when - last:.0f} s after the last eviction: it trained again, "
            "so this is a new fault, not the last one coming back"
        )
        return "verdict-machine", 0, Decision(d.category, d.confidence, d.actions, d.reasons + (why,), d.suspect_nodes)
    incidents = sorted({h.incident for h in prior})
    widened_before = any(h.rule == "escalate-widen" for h in prior)
    if len(incidents) == 1 and not widened_before:
        evicted = {n for h in prior for n in h.nodes}
        extra = tuple(n for h in prior for n in h.suspect_nodes if n not in evicted)
        nodes = tuple(dict.fromkeys(d.suspect_nodes + extra))
        why = (
            f"the job failed again {f.now - max(h.time for h in prior):.0f} s after evicting "
            f"{', '.join(sorted(evicted))} (incident {incidents[0]}): widen the eviction to the suspect groups of "
            f"both incidents ({', '.join(nodes)})"
        )
        if nodes == d.suspect_nodes:
            why += "; the verdict's suspect group is already the widest domain it names"
        return (
            "escalate-widen",
            1,
            Decision(
                d.category,
                d.confidence,
                (Action("evict", why, nodes=nodes), _restart(f, "on warm standbys", exclude=nodes)),
                d.reasons + (why,),
                nodes,
            ),
        )
    why = (
        f"the job failed again after {len(incidents)} eviction(s) within "
        f"{f.cfg.escalation_window_seconds:g} s: stop evicting and run stop-time checks"
    )
    collect = STOP_TIME_CHECKS + (
        (f"if the checks pass, roll back the code to {f.s.code_versions[-2]}",) if len(f.s.code_versions) >= 2 else ()
    )
    return (
        "escalate-stop",
        2,
        Decision(
            d.category,
            d.confidence,
            (
                Action("stop", why),
                Action(
                    "collect",
                    "stop-time checks",
                    collect=tuple(
                        c + (f" ({', '.join(d.suspect_nodes)})" if i == 0 and d.suspect_nodes else "")
                        for i, c in enumerate(collect)
                    ),
                ),
            ),
            d.reasons + (why,),
            d.suspect_nodes,
        ),
    )


# ----------------------------------------------------------------------------------------------------------
# entry points


def incident_key(s: Situation, cfg: LadderConfig | None = None, table: RuleTable = DEFAULT_TABLE) -> str:
    """A stable id for the incident: a hash of the evidence (not of the history, the clock or the plan),
    so re-planning the same incident gives the same key and the executor can refuse to act twice."""
    cfg = cfg or LadderConfig()
    now = _now(s)
    lo = now - cfg.event_window_seconds
    signals = _signals(s, table)
    onset = None
    if s.metrics:
        f = Facts(s, cfg, table, now, "", (), (), ())
        o = _metric_onset(f)
        onset = (o[0], o[2]) if o else None
    body = {
        "job": s.job,
        "verdict": list(s.verdict.key()) if s.verdict else None,
        "events": sorted(list(e.key()) for e in s.events if lo <= e.time <= now),
        "exits": sorted(list(x.key()) for x in s.exits),
        "signals": sorted(
            [c.rule, c.node, c.rank if c.rank is not None else -1, c.time or 0.0, c.text[:200]] for c in signals
        ),
        "metric_onset": onset,
    }
    raw = json.dumps(body, sort_keys=True, default=str).encode()
    return "inc-" + hashlib.sha256(raw).hexdigest()[:16]


def _now(s: Situation) -> float:
    t = _input_time(s)
    return 0.0 if t is None else t


def _input_time(s: Situation) -> float | None:
    """``--now``, else the newest time in the inputs; None when nothing carries a time (a plan then says no
    time, never the epoch)."""
    if s.now is not None:
        return s.now
    times = [e.time for e in s.events] + [x.time for x in s.exits] + [c.time for c in s.logs if c.time is not None]
    times += [m.time for m in s.metrics if m.time is not None]
    if s.verdict is not None:
        times += [t for t in (s.verdict.time, s.verdict.crash_first_time) if t is not None]
    return max(times) if times else None


def _signals(s: Situation, table: RuleTable) -> tuple[Classification, ...]:
    out = list(s.logs)
    for x in s.exits:
        c = table.classify_exit(
            exit_code=x.exit_code, kind=x.kind, message=x.message, node=x.node, rank=x.rank, time=x.time
        )
        if c is not None:
            out.append(c)
    return tuple(out)


def evaluate(
    s: Situation,
    cfg: LadderConfig | None = None,
    *,
    table: RuleTable = DEFAULT_TABLE,
    rules: Sequence[LadderRule] = RULES,
) -> Plan:
    """Run the ladder: the first matching rule decides. Pure and deterministic."""
    now = _now(s)
    cfg = cfg or LadderConfig()
    key = incident_key(s, cfg, table)
    lo = now - cfg.event_window_seconds
    f = Facts(
        s,
        cfg,
        table,
        now,
        key,
        tuple(e for e in s.events if lo <= e.time <= now),
        _signals(s, table),
        tuple(h for h in s.history if h.incident != key),
    )
    chosen: tuple[str, Decision] | None = None
    also = []
    for rule in rules:
        d = rule.evaluate(f)
        if d is None:
            continue
        if chosen is None:
            chosen = (rule.id, d)
        elif rule.id != "no-signal":
            also.append(rule.id)
    assert chosen is not None  # no-signal always matches
    rule_id, d = chosen
    escalation = 0
    if rule_id == "verdict-machine":
        rule_id, escalation, d = _escalate(f, d)
    inputs = {
        "events": len(f.events),
        "exits": len(s.exits),
        "log_signals": len(s.logs),
        "history": len(s.history),
        "metrics": len(s.metrics),
        "checkpoints": len(s.checkpoints),
        "machines": len(s.machines),
        "standby": len(s.standby),
    }
    return Plan(
        job=s.job,
        incident=key,
        category=d.category,
        rule=rule_id,
        confidence=round(d.confidence, 3),
        actions=d.actions,
        reasons=d.reasons,
        also_matched=tuple(also),
        escalation=escalation,
        time=_input_time(s),
        suspect_nodes=d.suspect_nodes,
        inputs=inputs,
    )
