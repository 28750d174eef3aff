"""Carry a plan out through a backend: one executor per job, each action audited, never twice."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankscope.spine import RecoveryError

from .audit import AuditLog, AuditRecord, whoami
from .backends.base import Backend, StepResult
from .plan import Plan
from .procs import JobLock


@dataclass(frozen=True)
class ExecutionReport:
    plan: Plan
    backend: str
    apply: bool
    steps: tuple[StepResult, ...]
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return not any(s.outcome in ("failed", "refused") for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.plan.job,
            "incident": self.plan.incident,
            "backend": self.backend,
            "apply": self.apply,
            "ok": self.ok,
            "skipped": self.skipped,
            "steps": [s.to_dict() for s in self.steps],
        }

    def explain(self) -> str:
        mode = "APPLY" if self.apply else "DRY RUN (nothing changed; --apply makes these calls)"
        lines = [f"{mode}: backend {self.backend}, job {self.plan.job or '?'}, incident {self.plan.incident}"]
        if self.skipped:
            lines.append(f"- skipped: {self.skipped}")
        for s in self.steps:
            lines.append(f"- [{s.outcome}] {s.action}: {s.command}" + (f"  ({s.detail})" if s.detail else ""))
        return "\n".join(lines)


def execute(
    plan: Plan,
    backend: Backend,
    *,
    audit: AuditLog,
    lock_dir: str | os.PathLike[str],
    apply: bool = False,
    who: str | None = None,
    clock: Callable[[], float] = time.time,
) -> ExecutionReport:
    """Run the plan's actions in order (dry run unless ``apply``), recording each in the audit trail.

    Holds the job's lock throughout. An incident the audit trail shows as already applied is skipped
    (idempotency). When an applied action fails, the actions after it are not attempted and are
    recorded as skipped: a restart must not follow a failed eviction.
    """
    who = who or whoami()
    job = plan.job or "job"
    with JobLock(Path(lock_dir) / f"{_safe(job)}.lock"):
        if apply:
            done = [
                r
                for r in audit.records(plan.job)
                if r.incident == plan.incident and not r.dry_run and r.outcome == "ok"
            ]
            if done:
                why = (
                    f"incident {plan.incident} was already applied ({len(done)} action(s)): re-running changes nothing"
                )
                audit.append(
                    AuditRecord(
                        plan.job,
                        plan.incident,
                        "skip",
                        why,
                        "skipped",
                        clock(),
                        who,
                        backend.name,
                        False,
                        rule=plan.rule,
                    )
                )
                return ExecutionReport(plan, backend.name, apply, (), why)
        steps: list[StepResult] = []
        failed = ""
        for action in plan.actions:
            if failed:
                audit.append(
                    AuditRecord(
                        plan.job,
                        plan.incident,
                        action.kind,
                        action.reason,
                        "skipped",
                        clock(),
                        who,
                        backend.name,
                        not apply,
                        action.nodes,
                        (),
                        f"not attempted: {failed}",
                        plan.rule,
                        plan.suspect_nodes,
                    )
                )
                steps.append(StepResult(action.kind, "(not attempted)", "failed", f"after: {failed}"))
                continue
            try:
                got = backend.carry_out(action, plan, apply=apply)
            except RecoveryError as exc:
                got = [StepResult(action.kind, "", "failed", str(exc))]
            steps.extend(got)
            bad = [s for s in got if s.outcome in ("failed", "refused")]
            outcome = "dry-run" if not apply else ("failed" if bad else "ok")
            if apply and bad:
                failed = f"{action.kind} failed: {bad[0].detail or bad[0].command}"
            audit.append(
                AuditRecord(
                    plan.job,
                    plan.incident,
                    action.kind,
                    action.reason,
                    outcome,
                    clock(),
                    who,
                    backend.name,
                    not apply,
                    action.nodes,
                    tuple(s.command for s in got),
                    "; ".join(s.detail for s in got if s.detail)[:2000],
                    plan.rule,
                    plan.suspect_nodes,
                )
            )
        return ExecutionReport(plan, backend.name, apply, tuple(steps))


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)[:200] or "job"


def recover(
    situation: Any,
    backend: Backend,
    *,
    audit: AuditLog,
    lock_dir: str | os.PathLike[str],
    apply: bool = False,
    ladder: Any = None,
    guards: Any = None,
    table: Any = None,
    clock: Callable[[], float] = time.time,
) -> ExecutionReport:
    """Plan (ladder + guardrails) and carry the plan out: what ``rankscope recover`` and the agent's
    ``--recover`` call. The audit trail's records for the job are the plan's action history, so a
    re-run of an incident already applied changes nothing. Acting happens now: a situation without
    ``now`` is decided at the clock's time (cool-down and hourly caps count from it)."""
    from dataclasses import replace

    from .classify import DEFAULT_TABLE
    from .planner import make_plan

    history = tuple(r.to_action_record() for r in audit.records(situation.job or None))
    s = replace(
        situation,
        history=tuple(situation.history) + history,
        now=situation.now if situation.now is not None else clock(),
    )
    plan = make_plan(s, ladder=ladder, guards=guards, table=table or DEFAULT_TABLE)
    return execute(plan, backend, audit=audit, lock_dir=lock_dir, apply=apply)
