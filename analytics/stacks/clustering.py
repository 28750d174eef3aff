"""Cluster processes by stack signature (ByteRobust's string matching, STAT's equivalence classes).

Processes of one role in one snapshot are grouped by the signature of their main thread. The
largest cluster is healthy, and so is every cluster at least ``dominance`` times its size (jobs
legitimately sit in a few states at once, e.g. one per pipeline stage); the rest are outliers.
Failed dumps, when given, are a cluster of their own and never healthy (the snapshot analysis never gives
them: a failed capture is no evidence, see :mod:`.collection`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rankscope.analytics.stacks.frames import classify, display, signature
from rankscope.datasets.domain.stacks import Frame, ProcStacks
from rankscope.spine import InputError


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


def _complete_truncated(procs: Sequence[ProcStacks], keys: list[tuple[str, ...] | None]) -> None:
    """Give a truncated dump (``partial``: the file ends mid-line) the signature of the complete
    stack it is the inner part of. Dumps are written innermost frame first, so a dump cut short
    (a second SIGTERM during faulthandler's write, a full disk) lost its *outermost* frames: its
    signature is a suffix of the full one. The most common complete stack with that suffix wins;
    with none, the dump keeps its own signature."""
    partial = [i for i, p in enumerate(procs) if p.status == "partial" and keys[i]]
    if not partial:
        return
    counts: dict[tuple[str, ...], int] = {}
    for p, k in zip(procs, keys):
        if k is not None and p.status == "ok":
            counts[k] = counts.get(k, 0) + 1
    by_count = sorted(counts, key=lambda k: -counts[k])
    resolved: dict[tuple[str, ...], tuple[str, ...]] = {}
    for i in partial:
        k = keys[i]
        assert k is not None
        if k not in resolved:
            resolved[k] = next((c for c in by_count if len(c) > len(k) and c[len(c) - len(k) :] == k), k)
        keys[i] = resolved[k]


def cluster(
    procs: Sequence[ProcStacks],
    *,
    role: str = "trainer",
    lines: bool = False,
    dominance: float = 0.5,
    start_id: int = 0,
    replica_of: np.ndarray | None = None,
) -> list[Cluster]:
    """Cluster ``procs`` (one role, one snapshot) by signature, largest first, flagging healthy ones.

    Healthy: the largest cluster, and any cluster that shares a data-parallel replica with it and
    is either at least ``dominance`` times its size or spread over at least half as many replicas
    (and at least three): healthy replicas all do the same thing, so a healthy state recurs across
    replicas, while a fault confines its outliers to the replica it stopped. ``replica_of`` maps
    rank -> dp index.
    """
    if not 0.0 < dominance <= 1.0:
        raise InputError(f"dominance={dominance!r} must be in (0, 1]")
    groups: dict[tuple[str, ...] | None, list[int]] = {}
    empty: tuple[Frame, ...] = ()
    keys: list[tuple[str, ...] | None] = []
    for p in procs:
        if p.status == "failed":
            keys.append(None)
        else:
            t = p.main_thread
            keys.append(signature(t.frames if t is not None else empty, lines=lines))
    _complete_truncated(procs, keys)
    for i, key in enumerate(keys):
        g = groups.get(key)
        if g is None:
            groups[key] = [i]
        else:
            g.append(i)
    ordered = sorted(groups.items(), key=lambda kv: (kv[0] is None, -len(kv[1]), kv[0] or ()))
    sizes = [len(m) for k, m in ordered if k is not None]
    largest = max(sizes) if sizes else 0

    def replicas(members: list[int]) -> set[int]:
        if replica_of is None:
            return set()
        rs = np.fromiter((r for r in (procs[i].rank for i in members) if r is not None), dtype=np.int64)
        rs = rs[(rs >= 0) & (rs < len(replica_of))]
        return set(np.unique(replica_of[rs]).tolist())

    top_replicas = replicas(ordered[0][1]) if ordered and ordered[0][0] is not None else set()
    out = []
    for n, (sig, members) in enumerate(ordered):
        rep = next((procs[i] for i in members if procs[i].status == "ok"), procs[members[0]])
        if sig is None:
            state, frame, idx = "failed", rep.error or "stack capture failed", -1
        else:
            state, idx = classify(rep.main, role=role)
            frame = _state_frame(rep, state, idx)
        if sig is None or largest < 2:
            healthy = False
        elif n == 0:
            healthy = True
        elif replica_of is None or not top_replicas:
            healthy = len(members) >= dominance * largest
        else:
            mine = replicas(members)
            healthy = bool(mine & top_replicas) and (
                len(members) >= dominance * largest or len(mine) >= max(3, len(top_replicas) / 2)
            )
        rk = np.fromiter((r for r in (procs[i].rank for i in members) if r is not None), dtype=np.int64)
        ranks = tuple(np.unique(rk).tolist())
        representative = tuple(display(f) for f in reversed(rep.main)) if sig is not None else (frame,)
        out.append(Cluster(start_id + n, role, sig or (), tuple(members), ranks, state, frame, healthy, representative))
    return out
