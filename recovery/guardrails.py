"""Guardrails between a plan and the cluster.

Pure part (:func:`apply`): the eviction caps (one parallel group per incident, never more than
``max_evict_fraction`` of the job, per incident and per hour), the cool-down between disruptive actions,
the idempotency check (an incident already acted on is not acted on again), the warm-standby pool (never
left empty without saying so) and the quarantine list (no restart or standby placed on a quarantined
machine). Each guardrail adds its decision to the plan, whether it passed or changed something.

The side effects live beside it: :mod:`.procs` (one executor per job, argv-only subprocesses) and
:mod:`.audit` (the append-only audit trail).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rankscope.spine import InputError, RecoveryError

from .ladder import Situation
from .plan import DISRUPTIVE, Action, GuardrailDecision, Plan
from .records import ActionRecord


@dataclass(frozen=True, kw_only=True)
class GuardrailConfig:
    max_evict_fraction: float = 1 / 8
    min_evict_machines: int = 1  # a job of fewer than 8 machines may still lose one
    hourly_window_seconds: float = 3600.0
    cooldown_seconds: float = 300.0

    def __post_init__(self) -> None:
        if not 0.0 < self.max_evict_fraction <= 1.0:
            raise InputError(f"guardrails: max_evict_fraction={self.max_evict_fraction} is outside (0, 1]")
        if self.min_evict_machines < 0 or self.cooldown_seconds < 0 or self.hourly_window_seconds <= 0:
            raise InputError(
                "guardrails: min_evict_machines and cooldown_seconds must be >= 0, hourly_window_seconds > 0"
            )


def _job_size(s: Situation, plan: Plan) -> tuple[int, str]:
    if s.machines:
        return len(s.machines), "the job's machine list"
    seen = set(plan.suspect_nodes) | {e.node for e in s.events if e.node} | {x.node for x in s.exits if x.node}
    if s.verdict is not None:
        seen |= set(s.verdict.isolate_nodes)
    return len(seen), "a lower bound: the machines named in the inputs (pass the job's machine list)"


def _cap(s: Situation, plan: Plan, cfg: GuardrailConfig) -> tuple[int, str]:
    n, source = _job_size(s, plan)
    frac = max(cfg.min_evict_machines, math.floor(n * cfg.max_evict_fraction))
    text = (
        f"{frac} = max({cfg.min_evict_machines}, floor({n} x {cfg.max_evict_fraction:.3g})) of {n} machines ({source})"
    )
    v = s.verdict
    if (
        plan.rule.startswith(("verdict-machine", "escalate"))
        and v is not None
        and v.group_count > 1
        and v.group_kind not in ("", "node")
    ):
        one_group = math.ceil(len(v.group_nodes) / v.group_count)
        if one_group < frac:
            return (
                one_group,
                f"one {v.group_kind.upper()} group ({one_group} machines; the verdict names "
                f"{v.group_count}), within {text}",
            )
    return frac, text


def _recent(
    s: Situation, now: float, window: float, kinds: frozenset[str] | set[str], incident: str
) -> list[ActionRecord]:
    return [
        h
        for h in s.history
        if h.executed and h.kind in kinds and h.incident != incident and now - window <= h.time <= now
    ]


def apply(plan: Plan, s: Situation, cfg: GuardrailConfig = GuardrailConfig()) -> Plan:
    """The plan after every guardrail, each decision recorded in ``plan.guardrails``. Pure."""
    now = plan.time or 0.0
    decisions: list[GuardrailDecision] = []
    actions = list(plan.actions)

    # idempotency: an incident already acted on is done
    done = [h for h in s.history if h.incident == plan.incident and h.executed]
    if done:
        last = max(done, key=lambda h: h.time)
        decisions.append(
            GuardrailDecision(
                "idempotency",
                "skipped",
                (
                    f"incident {plan.incident} was already acted on ({len(done)} action(s), last {last.kind} at "
                    f"{last.time:.0f}): re-running changes nothing"
                ),
            )
        )
        return plan.with_actions((), *decisions)
    decisions.append(GuardrailDecision("idempotency", "pass", f"incident {plan.incident} not acted on before"))

    # membership: a machine no longer in the job (evicted earlier) is never evicted again; evidence that
    # names only such machines is stale (a dead rank of the previous launch), not a new fault
    if plan.evicted and s.machines:
        gone = [n for n in plan.evicted if n not in s.machines]
        if gone:
            why = (
                f"{', '.join(gone)} {'is' if len(gone) == 1 else 'are'} not among the job's machines now "
                "(evicted earlier, or never part of it): not evicted again"
            )
            stay = tuple(n for n in plan.evicted if n in s.machines)
            culprits = s.verdict.culprit_nodes if s.verdict is not None else ()
            if not stay or (culprits and not set(culprits) & set(s.machines)):
                decisions.append(GuardrailDecision("membership", "skipped", why + "; the evidence is stale"))
                keep = [a for a in actions if a.kind not in ("evict", "restart")]
                keep.append(
                    Action(
                        "collect",
                        why,
                        nodes=tuple(gone),
                        collect=(
                            "a fresh capture of the job as it runs now (the evidence named machines it no longer has)",
                        ),
                    )
                )
                return plan.with_actions(tuple(keep), *decisions)
            decisions.append(GuardrailDecision("membership", "trimmed", why))
            actions = [
                replace(a, nodes=tuple(n for n in a.nodes if n in stay)) if a.kind == "evict" else a for a in actions
            ]
            plan = replace(plan, actions=tuple(actions))

    # cool-down: no disruptive action within cooldown_seconds of the last one (another incident)
    recent = _recent(s, now, cfg.cooldown_seconds, DISRUPTIVE, plan.incident)
    if plan.disruptive and recent:
        last_t = max(h.time for h in recent)
        until = last_t + cfg.cooldown_seconds
        held = ", ".join(a.kind for a in actions if a.kind in DISRUPTIVE)
        why = (
            f"a disruptive action ran {now - last_t:.0f} s ago (< cool-down {cfg.cooldown_seconds:g} s): "
            f"{held} held until {until:.0f}; re-plan then"
        )
        decisions.append(GuardrailDecision("cooldown", "deferred", why))
        keep = [a for a in actions if a.kind not in DISRUPTIVE]
        keep.append(
            Action("collect", why, nodes=plan.evicted, collect=("the same evidence again after the cool-down",))
        )
        return plan.with_actions(tuple(keep), *decisions)
    decisions.append(
        GuardrailDecision("cooldown", "pass", f"no disruptive action in the last {cfg.cooldown_seconds:g} s")
    )

    evict = plan.evicted
    if evict:
        cap, cap_text = _cap(s, plan, cfg)
        hourly = _recent(s, now, cfg.hourly_window_seconds, {"evict"}, plan.incident)
        already = len({n for h in hourly for n in h.nodes})
        room = max(0, cap - already)
        if len(evict) > room:
            why = f"evicting {len(evict)} machine(s) ({', '.join(evict)}) exceeds the cap: {cap_text}" + (
                f", {already} already evicted in the last {cfg.hourly_window_seconds:g} s" if already else ""
            )
            decisions.append(GuardrailDecision("evict-cap", "blocked", why + "; stop and ask a person"))
            keep = [a for a in actions if a.kind not in ("evict", "restart")]
            keep.insert(0, Action("stop", why + ": an eviction this large needs a person"))
            keep.append(
                Action(
                    "collect",
                    "for the person deciding",
                    nodes=evict,
                    collect=("the verdict's evidence per suspect machine",) + ("stop-time checks on the suspects",),
                )
            )
            return plan.with_actions(tuple(keep), *decisions)
        decisions.append(
            GuardrailDecision(
                "evict-cap",
                "pass",
                f"{len(evict)} machine(s) within the cap: {cap_text}"
                + (f" ({already} already evicted this hour)" if already else ""),
            )
        )
        # standby pool and quarantine
        quarantined = [m for m in s.standby if m in s.quarantine or m in evict]
        usable = [m for m in s.standby if m not in s.quarantine and m not in evict]
        if quarantined:
            decisions.append(
                GuardrailDecision(
                    "quarantine",
                    "warn",
                    (f"standby machine(s) {', '.join(quarantined)} are quarantined or being evicted: not used"),
                )
            )
        else:
            decisions.append(
                GuardrailDecision(
                    "quarantine", "pass", f"{len(s.quarantine)} quarantined machine(s) kept out of the placement"
                )
            )
        pairs = tuple(zip(evict, usable, strict=False))  # fewer standbys than evictions: see below
        short = len(evict) - len(pairs)
        if not s.standby:
            decisions.append(
                GuardrailDecision(
                    "standby",
                    "warn",
                    (
                        "no warm standby pool given: the restart waits for the scheduler to find replacements "
                        f"for {len(evict)} machine(s)"
                    ),
                )
            )
        elif short > 0:
            decisions.append(
                GuardrailDecision(
                    "standby",
                    "warn",
                    (
                        f"the standby pool is EMPTY after this: {len(usable)} usable standby(s) for {len(evict)} "
                        f"evicted machine(s), {short} short; replenish the pool (the restart waits for the shortfall)"
                    ),
                )
            )
        elif len(usable) == len(evict):
            decisions.append(
                GuardrailDecision(
                    "standby", "warn", (f"the standby pool is EMPTY after this ({len(usable)} used): replenish it now")
                )
            )
        else:
            decisions.append(
                GuardrailDecision("standby", "pass", (f"{len(pairs)} standby(s) used, {len(usable) - len(pairs)} left"))
            )
        exclude = tuple(sorted(set(evict) | set(s.quarantine)))
        actions = [
            Action(a.kind, a.reason, a.nodes, a.checkpoint, a.step, a.code_version, a.collect, pairs, exclude)
            if a.kind == "restart"
            else a
            for a in actions
        ]
    elif s.quarantine and any(a.kind in ("restart", "rollback") for a in actions):
        exclude = tuple(sorted(s.quarantine))
        actions = [
            Action(a.kind, a.reason, a.nodes, a.checkpoint, a.step, a.code_version, a.collect, a.replacements, exclude)
            if a.kind in ("restart", "rollback")
            else a
            for a in actions
        ]
        decisions.append(
            GuardrailDecision("quarantine", "pass", f"restart kept off {len(exclude)} quarantined machine(s)")
        )
    return plan.with_actions(tuple(actions), *decisions)


def check_placement(machines: Sequence[str], quarantine: Sequence[str] | frozenset[str]) -> None:
    """Refuse to place a job or a standby on a quarantined machine."""
    bad = sorted(set(machines) & set(quarantine))
    if bad:
        raise RecoveryError(f"refusing to place work on quarantined machine(s) {', '.join(bad)}")
