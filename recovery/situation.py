"""What the decision ladder decides on: the :class:`Situation` (one job at one moment), its thresholds
(:class:`LadderConfig`), and the shapes a rule reads and returns (:class:`Facts`, :class:`Decision`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rankscope.spine import InputError

from .classify import DEFAULT_TABLE, Classification, LogLine, RuleTable
from .plan import Action
from .records import ActionRecord, Checkpoint, ExitRecord, HealthEvent, MetricRecord, VerdictFacts


@dataclass(frozen=True, kw_only=True)
class LadderConfig:
    """Thresholds of the ladder; units in the names. Defaults follow ByteRobust where it gives one."""

    machine_min_confidence: float = 0.85
    network_repeat_count: int = 2
    network_window_seconds: float = 300.0
    event_window_seconds: float = 3600.0
    widespread_fraction: float = 0.25
    widespread_min_ranks: int = 2
    metric_jump_factor: float = 5.0
    metric_baseline_steps: int = 20
    min_verdict_confidence: float = 0.6
    escalation_window_seconds: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("machine_min_confidence", "widespread_fraction", "min_verdict_confidence"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise InputError(f"ladder config: {name}={v} is outside 0..1")
        for name in ("network_window_seconds", "event_window_seconds", "escalation_window_seconds"):
            if getattr(self, name) <= 0:
                raise InputError(f"ladder config: {name}={getattr(self, name)} must be > 0 seconds")
        if self.network_repeat_count < 1 or self.widespread_min_ranks < 1 or self.metric_baseline_steps < 1:
            raise InputError(
                "ladder config: network_repeat_count, widespread_min_ranks and metric_baseline_steps must be >= 1"
            )
        if self.metric_jump_factor <= 1.0:
            raise InputError(f"ladder config: metric_jump_factor={self.metric_jump_factor} must be > 1 (e.g. 5)")


@dataclass(frozen=True)
class Situation:
    """Everything the ladder and the guardrails decide on, for one job at one moment."""

    job: str = ""
    verdict: VerdictFacts | None = None
    events: tuple[HealthEvent, ...] = ()
    exits: tuple[ExitRecord, ...] = ()
    logs: tuple[Classification, ...] = ()
    history: tuple[ActionRecord, ...] = ()
    metrics: tuple[MetricRecord, ...] = ()
    checkpoints: tuple[Checkpoint, ...] = ()
    code_versions: tuple[str, ...] = ()  # oldest first; the last one is running
    machines: tuple[str, ...] = ()  # the job's machines now
    standby: tuple[str, ...] = ()  # warm standby machines, in the order they are to be used
    quarantine: frozenset[str] = field(default_factory=frozenset)
    now: float | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, table: RuleTable = DEFAULT_TABLE, where: str = "input") -> Situation:
        """From a JSON object: ``verdict`` (diagnose's JSON), ``events``, ``exits``, ``logs`` (strings or
        objects with ``text``; classified here), ``metrics``, ``checkpoints``, ``code_versions``,
        ``history``, ``machines``, ``standby``, ``quarantine``, ``now``."""
        if not isinstance(d, Mapping):
            raise InputError(f"{where}: expected a JSON object")
        known = {
            "job",
            "verdict",
            "events",
            "exits",
            "logs",
            "metrics",
            "checkpoints",
            "code_versions",
            "history",
            "machines",
            "standby",
            "quarantine",
            "now",
        }
        extra = sorted(set(d) - known)
        if extra:
            raise InputError(f"{where}: unknown key(s) {extra}; known: {sorted(known)}")

        def items(name: str) -> list[Any]:
            v = d.get(name) or []
            if not isinstance(v, list):
                raise InputError(f"{where}: '{name}' must be a list")
            return v

        from .records import parse_time

        verdict = VerdictFacts.from_dict(d["verdict"], where=f"{where}: verdict") if d.get("verdict") else None
        lines = [
            LogLine(x) if isinstance(x, str) else LogLine.from_dict(x, where=f"{where}: logs[{i}]")
            for i, x in enumerate(items("logs"))
        ]
        return cls(
            job=str(d.get("job") or (verdict.job if verdict else "")),
            verdict=verdict,
            events=tuple(
                HealthEvent.from_dict(x, where=f"{where}: events[{i}]") for i, x in enumerate(items("events"))
            ),
            exits=tuple(ExitRecord.from_dict(x, where=f"{where}: exits[{i}]") for i, x in enumerate(items("exits"))),
            logs=table.classify_lines(lines),
            history=tuple(
                ActionRecord.from_dict(x, where=f"{where}: history[{i}]") for i, x in enumerate(items("history"))
            ),
            metrics=tuple(
                MetricRecord.from_dict(x, where=f"{where}: metrics[{i}]") for i, x in enumerate(items("metrics"))
            ),
            checkpoints=tuple(
                Checkpoint.from_dict(x, where=f"{where}: checkpoints[{i}]") for i, x in enumerate(items("checkpoints"))
            ),
            code_versions=tuple(str(v) for v in items("code_versions")),
            machines=tuple(dict.fromkeys(str(v) for v in items("machines"))),
            standby=tuple(dict.fromkeys(str(v) for v in items("standby"))),
            quarantine=frozenset(str(v) for v in items("quarantine")),
            now=parse_time(d.get("now"), f"{where}: now"),
        )


@dataclass(frozen=True)
class Facts:
    """What the rules read, computed once from the situation."""

    s: Situation
    cfg: LadderConfig
    table: RuleTable
    now: float
    incident: str
    events: tuple[HealthEvent, ...]  # within the event window
    signals: tuple[Classification, ...]  # classified log lines and exits
    history: tuple[ActionRecord, ...]  # other incidents' actions only


@dataclass(frozen=True)
class Decision:
    category: str
    confidence: float
    actions: tuple[Action, ...]
    reasons: tuple[str, ...] = ()
    suspect_nodes: tuple[str, ...] = ()


RuleFn = Callable[[Facts], Decision | None]


@dataclass(frozen=True)
class LadderRule:
    id: str
    summary: str
    evaluate: RuleFn
