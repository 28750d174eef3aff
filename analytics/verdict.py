"""The verdict: what rankscope concluded, which machines to isolate, and why.

Every analysis (stacks, Flight Recorder, metrics, timings) ends in a frozen :class:`Verdict`; the
CLI renders it, the recovery executor acts on it, the store keeps it. Pure data plus pure methods.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from rankscope.spine import InputError


class Severity(str, Enum):
    """The kind of a verdict, most severe first; str-valued, so JSON and comparisons with text are unchanged.

    ``crash``: a rank died (the first failure is named, the cascade after it is not). ``mismatch``:
    members of a collective disagree, definite evidence of a code/config fault (no machine evicted).
    ``hang``: ranks stopped. ``fail-slow``: the job advances, slowed by a machine. ``degraded``: a part
    wears out. ``imbalance``: slowness that is no single machine's. ``inconclusive``: not enough
    evidence, never hidden behind ``healthy``. ``healthy``: nothing stands out.
    """

    CRASH = "crash"
    MISMATCH = "mismatch"
    HANG = "hang"
    FAIL_SLOW = "fail-slow"
    DEGRADED = "degraded"
    IMBALANCE = "imbalance"
    INCONCLUSIVE = "inconclusive"
    HEALTHY = "healthy"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @property
    def rank(self) -> int:
        """Position in the one severity order (0 = most severe); the combiner and the fusion both sort by it."""
        return _ORDER[self]

    @property
    def is_fault(self) -> bool:
        """A decision that points at something wrong (everything above ``inconclusive``)."""
        return self.rank < _ORDER[Severity.INCONCLUSIVE]


_ORDER = {s: i for i, s in enumerate(Severity)}
VERDICTS = tuple(s.value for s in Severity)
"""Possible decisions, most severe first (:class:`Severity`)."""


def severity(kind: str | Severity) -> Severity:
    """``kind`` as a :class:`Severity`; an unknown kind is an InputError listing the valid ones."""
    try:
        return Severity(kind)
    except ValueError:
        raise InputError(f"verdict {kind!r} is not one of {', '.join(VERDICTS)}") from None


SOURCES = ("stacks", "flight_recorder", "metrics", "timings", "events")


def rank_ranges(ranks: Iterable[int]) -> str:
    """STAT-style compact rank list: ``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"``."""
    rs = sorted(set(ranks))
    if not rs:
        return ""
    out, start, prev = [], rs[0], rs[0]
    for r in rs[1:]:
        if r == prev + 1:
            prev = r
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        start = prev = r
    out.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ",".join(out)


@dataclass(frozen=True)
class Evidence:
    """One observation that supports (or weakens) a suspicion, in words, with where it came from."""

    source: str  # one of SOURCES
    kind: str  # e.g. not-in-collective, missing-dump, io-stall, missing-from-collective, slow-rank
    detail: str
    ranks: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    weight: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranks"] = list(self.ranks)
        d["nodes"] = list(self.nodes)
        return d


@dataclass(frozen=True)
class ClusterSummary:
    """One equivalence class of processes (same signature), STAT's "process equivalence class"."""

    id: int
    role: str
    size: int
    ranks: tuple[int, ...]
    n_nodes: int
    healthy: bool
    state: str  # collective | p2p | compute | io | dataloader-wait | checkpoint-wait | idle | missing | failed
    representative: tuple[str, ...]  # frames, outermost first, "function (file:line)"
    snapshot: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role,
            "size": self.size,
            "ranks": rank_ranges(self.ranks),
            "n_nodes": self.n_nodes,
            "healthy": self.healthy,
            "state": self.state,
            "representative": list(self.representative),
            "snapshot": self.snapshot,
        }


@dataclass(frozen=True)
class SuspectGroup:
    """The fault domain chosen for isolation: groups of one kind that cover every outlier."""

    kind: str  # tp | cp | ep | pp | dp | mp | node
    indices: tuple[int, ...]
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "indices": list(self.indices),
            "ranks": rank_ranges(self.ranks),
            "nodes": list(self.nodes),
        }


@dataclass(frozen=True)
class Verdict:
    """A diagnosis. ``suspect_nodes`` is the set to isolate; ``culprit_nodes`` the likeliest roots in it."""

    verdict: Severity
    job: str = ""
    confidence: float = 0.0
    suspect_nodes: tuple[str, ...] = ()
    culprit_nodes: tuple[str, ...] = ()
    suspect_ranks: tuple[int, ...] = ()
    culprit_ranks: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ()
    suspect_group: SuspectGroup | None = None
    clusters: tuple[ClusterSummary, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    sources: tuple[str, ...] = ()
    world_size: int = 0
    n_snapshots: int = 0
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", severity(self.verdict))
        if not 0.0 <= self.confidence <= 1.0:
            raise InputError(f"verdict confidence={self.confidence!r} is outside 0..1")
        if not set(self.culprit_nodes) <= set(self.suspect_nodes):
            extra = sorted(set(self.culprit_nodes) - set(self.suspect_nodes))
            raise InputError(f"verdict culprit_nodes {extra[:8]} are not among suspect_nodes")

    def with_updates(self, **changes: Any) -> Verdict:
        """A copy with some fields changed (the verdict is frozen)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "job": self.job,
            "confidence": round(float(self.confidence), 3),
            "suspect_nodes": list(self.suspect_nodes),
            "culprit_nodes": list(self.culprit_nodes),
            "suspect_ranks": list(self.suspect_ranks),
            "culprit_ranks": list(self.culprit_ranks),
            "suspect_group": self.suspect_group.to_dict() if self.suspect_group else None,
            "reasons": list(self.reasons),
            "sources": list(self.sources),
            "world_size": self.world_size,
            "n_snapshots": self.n_snapshots,
            "clusters": [c.to_dict() for c in self.clusters],
            "evidence": [e.to_dict() for e in self.evidence],
            "details": _jsonable(self.details),
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def to_row(self, *, time: datetime | None = None) -> dict[str, Any]:
        """This verdict as one row of the store's ``verdicts`` table (the store never imports analytics)."""
        return {
            "job": self.job or "unknown",
            "time": time or datetime.now(timezone.utc),
            "verdict": self.verdict.value,
            "confidence": self.confidence,
            "suspect_nodes": list(self.suspect_nodes),
            "culprit_nodes": list(self.culprit_nodes),
            "suspect_ranks": list(self.suspect_ranks),
            "summary": self.explain(),
            "verdict_json": self.to_json(),
        }

    def explain(self) -> str:
        """The decision in a few sentences."""
        head = f"{self.verdict.value.upper()} (confidence {self.confidence:.2f})"
        if self.suspect_nodes:
            head += f": isolate {len(self.suspect_nodes)} node(s) {', '.join(self.suspect_nodes[:8])}"
            if len(self.suspect_nodes) > 8:
                head += ", ..."
        if self.culprit_nodes:
            head += f"; likeliest culprit {', '.join(self.culprit_nodes[:8])}"
        return "\n".join([head + "."] + [f"- {r}" for r in self.reasons])


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    return obj


def merge_nodes(*groups: Sequence[str]) -> tuple[str, ...]:
    """Union of node lists, first-seen order."""
    return tuple(dict.fromkeys(n for g in groups for n in g))
