"""Logs as evidence: facts in (:func:`facts`: watchdog stalls, laggards, time evidence of a hang), a
verdict out (:func:`verdict`).

:mod:`.facts` reads the NCCL watchdog and heartbeat lines (who timed out in which work of which group,
and whose counters stopped first), gloo timeouts and step lines; :mod:`.verdict` decides. Exceptions in
the logs are process exits and go to the crash analysis; faulthandler blocks are stacks and go to the
stack analysis (both handled by the loader and ``analytics.diagnose``).
"""

from __future__ import annotations

from rankscope.analytics.logs.facts import GroupStall, Laggard, LogFacts, quiet_before_stop, sinks, stalls
from rankscope.analytics.logs.verdict import verdict
from rankscope.datasets.domain.logs import LogEvidence
from rankscope.datasets.domain.topology import Topology

__all__ = ["GroupStall", "Laggard", "LogFacts", "facts", "verdict"]


def facts(logs: LogEvidence | None, topology: Topology | None) -> LogFacts | None:
    """What the logs prove, or None when they hold no watchdog, transport or step lines."""
    if logs is None or not (logs.watchdog or logs.gloo or logs.steps):
        return None
    world = topology.world_size if topology is not None else (max(logs.ranks) + 1 if logs.ranks else 0)
    found = stalls(logs, topology, world)
    beat = frozenset(w.rank for w in logs.watchdog if w.kind == "heartbeat" and w.rank is not None)
    lags, unresolved = sinks(found, logs.last_time, beat) if found else ([], [])
    gloo_to = sorted({g.rank for g in logs.gloo if g.kind == "timeout" and g.rank is not None})
    closed = sorted({g.rank for g in logs.gloo if g.kind == "closed" and g.rank is not None} - set(gloo_to))
    times = [s.first_time for s in found if s.first_time is not None]
    times += [g.time for g in logs.gloo if g.kind == "timeout" and g.time is not None]
    first = min(times) if times else None
    steps = [s.time for s in logs.steps if s.time is not None]
    last_step = max(steps) if steps else None
    nccl = sum(1 for w in logs.watchdog if w.kind in ("timeout", "failure"))
    after = first is not None and last_step is not None and last_step > first + 1.0
    return LogFacts(
        tuple(found),
        tuple(lags),
        tuple(unresolved),
        nccl,
        tuple(gloo_to),
        tuple(closed),
        first,
        last_step,
        after,
        sum(1 for w in logs.watchdog if w.kind == "periodic"),
        world,
        quiet_before_stop=quiet_before_stop(logs.steps, logs.stopped),
    )
