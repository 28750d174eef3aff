"""The ladder's inputs as plain frozen records, read from the dicts the rest of rankscope produces.

- the verdict: the object ``rankscope diagnose --format json`` prints (:class:`VerdictFacts`);
- health events: the agent's ``events`` rows (kind, severity, action, node, gpu, xid, message, time);
- process exits: the hook's exit records / the agent's ``process_exit`` rows (rank, time, kind, message);
- training metrics (step, loss, grad_norm), checkpoints (step, path, complete), and the action history
  the audit trail keeps.

Nothing here reads a clock or a file: a record is what it was given, checked, with one clear error
naming the field when it is malformed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from rankscope.spine import InputError

VERDICT_KINDS = ("crash", "mismatch", "hang", "fail-slow", "degraded", "imbalance", "inconclusive", "healthy")


def parse_time(value: Any, where: str) -> float | None:
    """Seconds since the epoch from a number, an ISO-8601 string or a datetime; None stays None."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    if isinstance(value, bool):
        raise InputError(f"{where}: time {value!r} is not a time")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise InputError(f"{where}: time {value!r} is not finite")
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        try:
            dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InputError(f"{where}: time {value!r} is neither seconds since the epoch nor ISO-8601") from None
        return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
    raise InputError(f"{where}: time {value!r} is not a time")


def _int(value: Any, where: str, name: str) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InputError(f"{where}: {name} {value!r} is not an integer")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {name} {value!r} is not an integer") from None
    if not f.is_integer():
        raise InputError(f"{where}: {name} {value!r} is not an integer")
    return int(f)


def _float(value: Any, where: str, name: str) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InputError(f"{where}: {name} {value!r} is not a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {name} {value!r} is not a number") from None


def _mapping(d: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(d, Mapping):
        raise InputError(f"{where}: expected an object, got {type(d).__name__}")
    return d


def _names(value: Any, where: str, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InputError(f"{where}: {name} must be a list of names, got {value!r}")
    return tuple(dict.fromkeys(str(v) for v in value))


def _labels(value: Any) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    if isinstance(value, str) and value:
        try:
            v = json.loads(value)
        except ValueError:
            return {}
        return v if isinstance(v, Mapping) else {}
    return {}


@dataclass(frozen=True)
class HealthEvent:
    """One health event from a node agent (or any monitor that speaks the same fields)."""

    kind: str
    node: str
    time: float
    severity: str = ""
    action: str = ""
    gpu: int | None = None
    xid: int | None = None
    rank: int | None = None
    message: str = ""

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "event") -> HealthEvent:
        d = _mapping(d, where)
        kind = d.get("kind")
        if not isinstance(kind, str) or not kind:
            raise InputError(f"{where}: 'kind' is missing")
        t = parse_time(d.get("time", d.get("ts")), where)
        if t is None:
            raise InputError(f"{where}: 'time' (or 'ts') is missing")
        labels = _labels(d.get("labels"))
        return cls(
            kind,
            str(d.get("node") or ""),
            t,
            str(d.get("severity") or ""),
            str(d.get("action") or ""),
            _int(d.get("gpu"), where, "gpu"),
            _int(d.get("xid", labels.get("xid")), where, "xid"),
            _int(d.get("rank"), where, "rank"),
            str(d.get("message") or ""),
        )

    def key(self) -> tuple[Any, ...]:
        return (self.time, self.node, self.kind, self.xid, self.gpu, self.message[:200])


@dataclass(frozen=True)
class ExitRecord:
    """One process that ended abnormally (the hook's or the agent's record)."""

    rank: int
    time: float
    kind: str  # exception type name, or "vanished"
    message: str = ""
    node: str = ""
    exit_code: int | None = None
    where: str = ""

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "exit") -> ExitRecord:
        d = _mapping(d, where)
        rank = _int(d.get("rank"), where, "rank")
        t = parse_time(d.get("time", d.get("ts")), where)
        if rank is None or t is None:
            raise InputError(f"{where}: 'rank' and 'time' are required")
        code = d.get("exit_code", d.get("exitcode"))
        return cls(
            rank,
            t,
            str(d.get("kind") or d.get("type") or ("vanished" if code is None else "exit")),
            str(d.get("message") or ""),
            str(d.get("node") or ""),
            _int(code, where, "exit_code"),
            str(d.get("where") or ""),
        )

    def key(self) -> tuple[Any, ...]:
        return (self.time, self.rank, self.kind, self.exit_code, self.message[:200])


@dataclass(frozen=True)
class MetricRecord:
    """One training step's loss and/or gradient norm (from wandb, TensorBoard or the step log)."""

    step: int
    loss: float | None = None
    grad_norm: float | None = None
    time: float | None = None

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "metric") -> MetricRecord:
        d = _mapping(d, where)
        step = _int(d.get("step"), where, "step")
        if step is None:
            raise InputError(f"{where}: 'step' is required")
        return cls(
            step,
            _float(d.get("loss"), where, "loss"),
            _float(d.get("grad_norm", d.get("grad-norm")), where, "grad_norm"),
            parse_time(d.get("time", d.get("ts")), where),
        )


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint directory: its training step, where it is, and whether every shard was written."""

    step: int
    path: str
    complete: bool = True
    time: float | None = None

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "checkpoint") -> Checkpoint:
        d = _mapping(d, where)
        step = _int(d.get("step"), where, "step")
        if step is None or not d.get("path"):
            raise InputError(f"{where}: 'step' and 'path' are required")
        return cls(step, str(d["path"]), bool(d.get("complete", True)), parse_time(d.get("time"), where))


@dataclass(frozen=True)
class ActionRecord:
    """One action an executor took (or planned) for the job, as the audit trail keeps it."""

    time: float
    kind: str
    incident: str
    nodes: tuple[str, ...] = ()
    rule: str = ""
    executed: bool = True  # False for a dry run or a failed step: nothing changed on the cluster
    suspect_nodes: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "history") -> ActionRecord:
        d = _mapping(d, where)
        t = parse_time(d.get("time", d.get("when")), where)
        kind = d.get("kind", d.get("what"))
        if t is None or not isinstance(kind, str):
            raise InputError(f"{where}: 'time' and 'kind' are required")
        executed = d.get("executed")
        if executed is None:
            executed = not d.get("dry_run", False) and d.get("outcome", "ok") in ("ok", "done", "applied")
        return cls(
            t,
            kind,
            str(d.get("incident") or ""),
            _names(d.get("nodes"), where, "nodes"),
            str(d.get("rule") or ""),
            bool(executed),
            _names(d.get("suspect_nodes"), where, "suspect_nodes"),
        )


@dataclass(frozen=True)
class EvidenceFact:
    source: str
    kind: str
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class CrashExit:
    """One row of a crash verdict's ``details.crash.exits``."""

    rank: int
    node: str
    kind: str
    message: str
    cause: str  # primary | cascade
    after_s: float


@dataclass(frozen=True)
class VerdictFacts:
    """The parts of a verdict the ladder decides on, read from ``diagnose --format json``."""

    kind: str
    job: str = ""
    confidence: float = 0.0
    suspect_nodes: tuple[str, ...] = ()
    culprit_nodes: tuple[str, ...] = ()
    suspect_ranks: tuple[int, ...] = ()
    culprit_ranks: tuple[int, ...] = ()
    group_kind: str = ""
    group_nodes: tuple[str, ...] = ()
    group_count: int = 0
    world_size: int = 0
    reasons: tuple[str, ...] = ()
    evidence: tuple[EvidenceFact, ...] = ()
    failed_clusters: bool = False  # an unhealthy cluster whose stacks could not be captured
    crash_exits: tuple[CrashExit, ...] = ()
    crash_first_time: float | None = None
    crash_n_primary: int | None = None
    time: float | None = None
    on_premise: bool = False  # a hang from one snapshot with no time: stuck only if it was stuck when captured

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "verdict") -> VerdictFacts:
        if hasattr(d, "to_dict") and callable(d.to_dict):  # a Verdict object
            d = d.to_dict()
        d = _mapping(d, where)
        kind = d.get("verdict", d.get("kind"))
        if kind not in VERDICT_KINDS:
            raise InputError(f"{where}: 'verdict' is {kind!r}, expected one of {', '.join(VERDICT_KINDS)}")
        conf = _float(d.get("confidence", 0.0), where, "confidence") or 0.0
        if not 0.0 <= conf <= 1.0:
            raise InputError(f"{where}: confidence {conf} is outside 0..1")
        ranks = []
        for name in ("suspect_ranks", "culprit_ranks"):
            v = d.get(name) or []
            if not isinstance(v, Sequence) or isinstance(v, str):
                raise InputError(f"{where}: {name} must be a list of ranks")
            ranks.append(tuple(_int(r, where, name) or 0 for r in v))
        group = d.get("suspect_group") or {}
        group = _mapping(group, f"{where}: suspect_group")
        indices = group.get("indices") or []
        evidence = []
        for i, e in enumerate(d.get("evidence") or []):
            e = _mapping(e, f"{where}: evidence[{i}]")
            evidence.append(
                EvidenceFact(
                    str(e.get("source", "")),
                    str(e.get("kind", "")),
                    tuple(_int(r, where, "evidence rank") or 0 for r in e.get("ranks") or []),
                    _names(e.get("nodes"), where, "evidence nodes"),
                )
            )
        failed = any(
            isinstance(c, Mapping) and not c.get("healthy", True) and c.get("state") == "failed"
            for c in d.get("clusters") or []
        )
        details = _mapping(d.get("details") or {}, f"{where}: details")
        crash = _mapping(details.get("crash") or {}, f"{where}: details.crash")
        exits = []
        for i, x in enumerate(crash.get("exits") or []):
            x = _mapping(x, f"{where}: details.crash.exits[{i}]")
            exits.append(
                CrashExit(
                    _int(x.get("rank"), where, "crash rank") or 0,
                    str(x.get("node") or ""),
                    str(x.get("kind") or ""),
                    str(x.get("message") or ""),
                    str(x.get("cause") or "primary"),
                    _float(x.get("after_s"), where, "after_s") or 0.0,
                )
            )
        suspects = _names(d.get("suspect_nodes"), where, "suspect_nodes")
        culprits = _names(d.get("culprit_nodes"), where, "culprit_nodes")
        if not set(culprits) <= set(suspects) | set(_names(group.get("nodes"), where, "suspect_group.nodes")):
            raise InputError(f"{where}: culprit_nodes {list(culprits)} are not among suspect_nodes {list(suspects)}")
        return cls(
            str(kind),
            str(d.get("job") or ""),
            conf,
            suspects,
            culprits,
            ranks[0],
            ranks[1],
            str(group.get("kind") or ""),
            _names(group.get("nodes"), where, "suspect_group.nodes"),
            len(indices) if isinstance(indices, Sequence) else 0,
            _int(d.get("world_size"), where, "world_size") or 0,
            tuple(str(r) for r in d.get("reasons") or []),
            tuple(evidence),
            failed,
            tuple(exits),
            parse_time(crash.get("first_failure_time"), where),
            _int(crash.get("n_primary"), where, "n_primary"),
            parse_time(d.get("time"), where),
            details.get("stuck_on_premise") is True,
        )

    @property
    def isolate_nodes(self) -> tuple[str, ...]:
        """The verdict's over-eviction: its suspect group (the fault domain) and every suspect node."""
        return tuple(dict.fromkeys(self.group_nodes + self.suspect_nodes))

    def key(self) -> tuple[Any, ...]:
        return (
            self.kind,
            self.job,
            round(self.confidence, 3),
            self.suspect_nodes,
            self.culprit_nodes,
            self.suspect_ranks,
            self.culprit_ranks,
            self.group_kind,
            self.group_nodes,
            self.crash_first_time,
            tuple((e.rank, e.kind, e.cause) for e in self.crash_exits),
            self.time,
        )
