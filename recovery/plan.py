"""The plan: what to do about one incident, every action with its reason, every guardrail's decision.

Frozen data with pure methods. ``to_json()`` is canonical (sorted keys, fixed float rounding), so the
same inputs give a byte-identical plan and the plan's ``incident`` key identifies the incident.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

ACTION_KINDS = ("evict", "restart", "rollback", "stop", "tolerate", "collect")
DISRUPTIVE = frozenset({"evict", "restart", "rollback", "stop"})
GUARDRAIL_DECISIONS = ("pass", "blocked", "trimmed", "deferred", "skipped", "warn")


@dataclass(frozen=True)
class Action:
    """One step of a plan. ``nodes`` for evict; ``checkpoint``/``step`` or ``code_version`` for rollback and
    restart; ``collect`` names the evidence to gather next; ``replacements`` maps an evicted machine to the
    warm standby that takes its place; ``exclude`` is what a restart must not be placed on."""

    kind: str
    reason: str
    nodes: tuple[str, ...] = ()
    checkpoint: str = ""
    step: int | None = None
    code_version: str = ""
    collect: tuple[str, ...] = ()
    replacements: tuple[tuple[str, str], ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"action kind {self.kind!r} is not one of {ACTION_KINDS}")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "reason": self.reason}
        if self.nodes or self.kind == "evict":
            d["nodes"] = list(self.nodes)
        if self.checkpoint:
            d["checkpoint"] = self.checkpoint
        if self.step is not None:
            d["step"] = self.step
        if self.code_version:
            d["code_version"] = self.code_version
        if self.collect:
            d["collect"] = list(self.collect)
        if self.replacements:
            d["replacements"] = dict(self.replacements)
        if self.exclude:
            d["exclude"] = list(self.exclude)
        return d


@dataclass(frozen=True)
class GuardrailDecision:
    name: str
    decision: str  # one of GUARDRAIL_DECISIONS
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "decision": self.decision, "reason": self.reason}


@dataclass(frozen=True)
class Plan:
    """The ladder's decision after the guardrails."""

    job: str
    incident: str
    category: str
    rule: str
    confidence: float
    actions: tuple[Action, ...]
    reasons: tuple[str, ...] = ()
    guardrails: tuple[GuardrailDecision, ...] = ()
    also_matched: tuple[str, ...] = ()
    escalation: int = 0
    time: float | None = None
    suspect_nodes: tuple[str, ...] = ()
    inputs: Mapping[str, int] = field(default_factory=dict)

    @property
    def evicted(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for a in self.actions if a.kind == "evict" for n in a.nodes))

    @property
    def disruptive(self) -> bool:
        return any(a.kind in DISRUPTIVE for a in self.actions)

    def with_actions(self, actions: tuple[Action, ...], *guardrails: GuardrailDecision) -> Plan:
        return replace(self, actions=actions, guardrails=self.guardrails + guardrails)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "incident": self.incident,
            "category": self.category,
            "rule": self.rule,
            "confidence": round(float(self.confidence), 3),
            "time": self.time,
            "escalation": self.escalation,
            "actions": [a.to_dict() for a in self.actions],
            "reasons": list(self.reasons),
            "guardrails": [g.to_dict() for g in self.guardrails],
            "also_matched": list(self.also_matched),
            "suspect_nodes": list(self.suspect_nodes),
            "inputs": dict(sorted(self.inputs.items())),
        }

    def to_json(self) -> str:
        """Canonical JSON: the same plan is always the same bytes."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2, ensure_ascii=False) + "\n"

    def explain(self) -> str:
        """The plan in a few lines, for people."""
        when = (
            ""
            if self.time is None
            else " at " + datetime.fromtimestamp(self.time, timezone.utc).isoformat(timespec="milliseconds")
        )
        head = (
            f"{self.category.upper()} ({self.rule}, confidence {self.confidence:.2f}) job {self.job or '?'} "
            f"incident {self.incident}{when}"
        )
        lines = [head]
        for a in self.actions:
            what = a.kind + (f" {', '.join(a.nodes)}" if a.nodes else "")
            if a.kind == "rollback":
                what += f" to {a.code_version or a.checkpoint or 'step ' + str(a.step)}"
            lines.append(f"- {what}: {a.reason}")
            for c in a.collect:
                lines.append(f"    collect: {c}")
        if not self.actions:
            lines.append("- nothing to do")
        for r in self.reasons:
            lines.append(f"  because {r}")
        for g in self.guardrails:
            lines.append(f"  guardrail {g.name}: {g.decision}: {g.reason}")
        return "\n".join(lines)
