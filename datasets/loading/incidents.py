"""Which incident of a store job to diagnose: the latest one, by capture time, else by ingest time.

A store job accumulates incidents: every ``rankscope ingest`` is one (its rows carry an ``ingest_id``, its
snapshot ids are its own), and the agent's captures are grouped into series (snapshots at most
``series_gap_seconds`` apart). The latest incident wins; the older ones are ignored with a note, so an old
hang never explains today's. Flight Recorder rows follow their ingest through the ledger's file names.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankscope.datasets.domain.stacks import ProcStacks
from rankscope.datasets.store.store import Store


@dataclass(frozen=True)
class Incident:
    """One incident of a store job."""

    key: str  # an ingest id, or "agent"
    time: float  # capture time, else ingest time (epoch seconds)
    snapshots: frozenset[int]
    timed_by: str  # capture | ingest


@dataclass(frozen=True)
class Choice:
    procs: list[ProcStacks]
    snapshot_times: dict[int, float]
    fr_sources: frozenset[str] | None  # FR source files of the chosen ingest; None: the agent's (not ingested)
    notes: list[str]
    ingest_id: str | None = None  # the chosen incident's ingest (its own topology rows win); None: the agent's


def _utc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _split(stacks: Any) -> tuple[dict[str, set[int]], set[int]]:
    """The snapshots of each ingest, and those the agent wrote (no ingest id)."""
    ids = stacks.column("ingest_id").to_pylist() if "ingest_id" in stacks.column_names else [None] * stacks.num_rows
    by_ingest: dict[str, set[int]] = {}
    agent: set[int] = set()
    for s, i in zip(stacks.column("snapshot").to_pylist(), ids):
        if i is None:
            agent.add(s)
        else:
            by_ingest.setdefault(i, set()).add(s)
    return by_ingest, agent


def agent_series(agent: set[int], snapshot_times: Mapping[int, float], gap_s: float) -> list[set[int]]:
    """The agent's snapshots cut into capture series (consecutive snapshots at most ``gap_s`` apart), oldest
    first; snapshots without a time form one series of their own."""
    timed = sorted((snapshot_times[s], s) for s in agent if s in snapshot_times)
    out: list[set[int]] = []
    last = float("-inf")
    for t, s in timed:
        if not out or t - last > gap_s:
            out.append(set())
        out[-1].add(s)
        last = t
    untimed = {s for s in agent if s not in snapshot_times}
    return ([untimed] if untimed else []) + out


def incidents_of(
    store: Store, job: str, stacks: Any, snapshot_times: Mapping[int, float], gap_s: float
) -> tuple[list[Incident], Any]:
    """Every incident of a store job (each ingest; each capture series of the agent, keyed
    ``capture-<first snapshot>``), and the ingest ledger (None without one)."""
    by_ingest, agent = _split(stacks)
    ledger = store.read("ingests", job=job) if store.files("ingests", job=job) else None
    out = _ingests(by_ingest, snapshot_times, ledger)
    if ledger is not None:  # ingests without stacks (Flight Recorder, metrics, logs only) are incidents too
        seen = set(by_ingest)
        for key, when in _ledger_times(ledger).items():
            if key not in seen:
                out.append(Incident(key, when, frozenset(), "ingest"))
    for series in agent_series(agent, snapshot_times, gap_s):
        t = max((snapshot_times[s] for s in series if s in snapshot_times), default=float("-inf"))
        out.append(Incident(f"capture-{min(series)}", t, frozenset(series), "capture"))
    return sorted(out, key=lambda i: (i.time, i.key)), ledger


def _ledger_times(ledger: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for i, w, c in zip(ledger["ingest_id"], ledger["ingest_time"], ledger["capture_time"]):
        t = c if c is not None else w
        if t is not None:
            out[i] = max(out.get(i, float("-inf")), t.timestamp())
    return out


def choose(
    store: Store,
    job: str,
    stacks: Any,
    procs: list[ProcStacks],
    snapshot_times: dict[int, float],
    latest_series: Callable[[Mapping[int, float]], set[int]],
    *,
    incident: str | None = None,
    gap_s: float = 120.0,
) -> Choice:
    """The procs and snapshot times of the latest incident (or of ``incident``, a key of
    :func:`incidents_of`), and notes on the ones ignored."""
    if incident is not None:
        return _chosen(store, job, stacks, procs, snapshot_times, incident, gap_s)
    by_ingest, agent = _split(stacks)
    ledger = store.read("ingests", job=job) if store.files("ingests", job=job) else None
    incidents = _ingests(by_ingest, snapshot_times, ledger)
    series: set[int] = set()
    if agent:
        agent_times = {s: t for s, t in snapshot_times.items() if s in agent}
        series = latest_series(agent_times) if agent_times else set(agent)
        t = max((agent_times[s] for s in series if s in agent_times), default=float("-inf"))
        incidents.append(Incident("agent", t, frozenset(series), "capture"))
    notes: list[str] = []
    if not incidents:  # no stacks: the latest ingest of Flight Recorder dumps, if any (else the agent's)
        fr_key = _latest_fr_ingest(ledger)
        return Choice(procs, snapshot_times, _fr_sources(ledger, fr_key) if fr_key else None, notes, fr_key)
    best = max(incidents, key=lambda i: i.time)
    older = [i for i in incidents if i is not best]
    if older:
        what = f"ingest {best.key}" if best.key != "agent" else "the agent's latest capture"
        notes.append(
            f"{len(older)} older incident(s) in the store ignored: the latest ({what}, {best.timed_by} time "
            f"{_utc(best.time) if best.time > float('-inf') else 'unknown'}) is diagnosed"
        )
    if best.key == "agent" and len(series) < len(agent):
        agent_times = {s: t for s, t in snapshot_times.items() if s in agent}
        if len(series) < len(agent_times):
            notes.append(
                f"{len(agent_times) - len(series)} snapshot(s) of earlier captures ignored: the latest capture (from "
                f"{_utc(min(agent_times[s] for s in series))}) is diagnosed"
            )
    keep = best.snapshots
    chosen = [p for p in procs if p.snapshot in keep]
    times = {s: t for s, t in snapshot_times.items() if s in keep}
    fr = _fr_sources(ledger, best.key)
    return Choice(chosen, times, fr, notes, None if best.key == "agent" else best.key)


def _chosen(
    store: Store,
    job: str,
    stacks: Any,
    procs: list[ProcStacks],
    snapshot_times: Mapping[int, float],
    key: str,
    gap_s: float,
) -> Choice:
    """The evidence of incident ``key`` (an InputError naming the valid keys when it is not one)."""
    from rankscope.spine import InputError

    incidents, ledger = incidents_of(store, job, stacks, snapshot_times, gap_s)
    best = next((i for i in incidents if i.key == key), None)
    if best is None:
        valid = ", ".join(i.key for i in incidents[-10:]) or "none"
        raise InputError(f"{store.root}: job {job!r} has no incident {key!r} (latest: {valid})")
    chosen = [p for p in procs if p.snapshot in best.snapshots]
    times = {s: t for s, t in snapshot_times.items() if s in best.snapshots}
    agent = best.key.startswith("capture-")
    return Choice(chosen, times, None if agent else _fr_sources(ledger, best.key), [], None if agent else best.key)


def _ingests(by_ingest: Mapping[str, set[int]], snapshot_times: Mapping[int, float], ledger: Any) -> list[Incident]:
    ingest_time: dict[str, float] = {}
    capture: dict[str, float] = {}
    if ledger is not None:
        for i, w, c in zip(ledger["ingest_id"], ledger["ingest_time"], ledger["capture_time"]):
            if w is not None:
                ingest_time[i] = min(ingest_time.get(i, w.timestamp()), w.timestamp())
            if c is not None:
                capture[i] = max(capture.get(i, c.timestamp()), c.timestamp())
    out = []
    for i, snaps in by_ingest.items():
        content = [snapshot_times[s] for s in snaps if s in snapshot_times]
        if content or i in capture:
            out.append(Incident(i, max([*content, capture.get(i, float("-inf"))]), frozenset(snaps), "capture"))
        else:
            out.append(Incident(i, ingest_time.get(i, float("-inf")), frozenset(snaps), "ingest"))
    return out


def _latest_fr_ingest(ledger: Any) -> str | None:
    """The ingest that wrote Flight Recorder dumps last (by ingest time), None when none did."""
    if ledger is None:
        return None
    best: tuple[float, str] | None = None
    for i, w, k in zip(ledger["ingest_id"], ledger["ingest_time"], ledger["kind"]):
        if k == "flight_recorder" and i:
            t = w.timestamp() if w is not None else float("-inf")
            if best is None or (t, i) > best:
                best = (t, i)
    return best[1] if best else None


def _fr_sources(ledger: Any, key: str) -> frozenset[str] | None:
    if ledger is None or key == "agent":
        return None
    return frozenset(
        f
        for f, i, k in zip(ledger["source_file"], ledger["ingest_id"], ledger["kind"])
        if i == key and k == "flight_recorder"
    )


def keep_fr_rows(table: Any, ledger: Any, sources: frozenset[str] | None) -> Any:
    """Collectives rows of the chosen incident: its own FR files, or (for the agent) the rows no ingest wrote."""
    if table.num_rows == 0:
        return table
    import pyarrow as pa
    import pyarrow.compute as pc

    files = table.column("source_file")
    if sources is not None:
        return table.filter(pc.is_in(files, value_set=pa.array(sorted(sources), type=pa.string())))
    ingested: Sequence[str] = sorted(
        {f for f, k in zip(ledger["source_file"], ledger["kind"]) if k == "flight_recorder" and f}
    )
    if not ingested:
        return table
    return table.filter(pc.invert(pc.is_in(files, value_set=pa.array(ingested, type=pa.string()))))
