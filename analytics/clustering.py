"""Cluster processes by stack signature (ByteRobust's string matching, STAT's equivalence classes).

Processes of one role in one snapshot are grouped by the signature of their main thread. The
largest cluster is healthy, and so is every cluster at least ``dominance`` times its size (jobs
legitimately sit in a few states at once, e.g. one per pipeline stage); the rest are outliers.
Failed dumps are a cluster of their own and never healthy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..datasets.stackset import ProcStacks
from .frames import classify, display, signature


@dataclass(frozen=True)
class Cluster:
    """Processes with one signature. ``members`` index into the list that was clustered."""

    id: int
    role: str
    signature: tuple[str, ...]
    members: tuple[int, ...]
    ranks: tuple[int, ...]
    state: str
    state_frame: str  # the frame that decided the state, "function (file:line)"
    healthy: bool
    representative: tuple[str, ...]  # outermost first, for people

    @property
    def size(self) -> int:
        return len(self.members)


def _state_frame(p: ProcStacks, state: str, idx: int) -> str:
    if state in ("failed", "missing") or idx < 0 or not p.main:
        return p.error or state
    return display(p.main[idx])


def cluster(procs: Sequence[ProcStacks], *, role: str = "trainer", lines: bool = False,
            dominance: float = 0.5, start_id: int = 0) -> list[Cluster]:
    """Cluster ``procs`` (one role, one snapshot) by signature, largest first, flagging healthy ones."""
    if not 0.0 < dominance <= 1.0:
        raise ValueError(f"dominance={dominance} must be in (0, 1]")
    groups: dict[tuple[str, ...] | None, list[int]] = {}
    for i, p in enumerate(procs):
        key = None if p.status == "failed" else signature(p.main, lines=lines)
        groups.setdefault(key, []).append(i)
    ordered = sorted(groups.items(), key=lambda kv: (kv[0] is None, -len(kv[1]), kv[0] or ()))
    sizes = [len(m) for k, m in ordered if k is not None]
    largest = max(sizes) if sizes else 0
    out = []
    for n, (sig, members) in enumerate(ordered):
        rep = procs[members[0]]
        if sig is None:
            state, frame, idx = "failed", rep.error or "stack capture failed", -1
        else:
            state, idx = classify(rep.main, role=role)
            frame = _state_frame(rep, state, idx)
        healthy = sig is not None and largest >= 2 and len(members) >= dominance * largest
        ranks = tuple(sorted({procs[i].rank for i in members if procs[i].rank is not None}))
        representative = tuple(display(f) for f in reversed(rep.main)) if sig is not None else (frame,)
        out.append(Cluster(start_id + n, role, sig or (), tuple(members), ranks, state, frame, healthy,
                           representative))
    return out
