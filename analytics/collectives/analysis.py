"""Collective-trace analysis of Flight Recorder dumps: who waits for whom, for how long, who disagrees,
who is slow.

Named steps, each in its own module: the latest capture and the one before (:mod:`.captures`), one dump
per rank (:func:`.tables.dedupe`), group membership and kind (:mod:`.groups`), progress tables per group
and rank (:mod:`.tables`), the clock (:mod:`.clock`), the wait graph and the stalled groups
(:mod:`.waits`), late arrivals and mismatches (:mod:`.slow`), then one finding from small pure
classifiers (:mod:`.decide`). A hang needs time evidence: an overdue op on the wavefront.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from rankscope.analytics.collectives.captures import compare, split_captures
from rankscope.analytics.collectives.clock import Clock
from rankscope.analytics.collectives.decide import classify
from rankscope.analytics.collectives.facts import CollectiveFacts
from rankscope.analytics.collectives.groups import group_keys, resolve_groups
from rankscope.analytics.collectives.result import CollectiveAnalysis
from rankscope.analytics.collectives.slow import lateness, mismatches, slow_ranks
from rankscope.analytics.collectives.tables import build_tables, dedupe, world_from
from rankscope.analytics.collectives.waits import group_stalls, wait_graph
from rankscope.analytics.faultdomain import node_lookup
from rankscope.analytics.verdict import rank_ranges
from rankscope.config import CollectivesConfig
from rankscope.datasets.domain.flight_recorder import FRDump
from rankscope.datasets.domain.topology import Topology
from rankscope.spine import InputError, paused_gc


def facts(
    dumps: Sequence[FRDump],
    topology: Topology | None = None,
    memberships: Mapping[str, Sequence[int]] | None = None,
    *,
    config: CollectivesConfig | None = None,
) -> CollectiveAnalysis:
    """Analyze every rank's FR dump: the facts and the finding they support (see the module docstring).

    ``topology`` maps ranks to parallel groups and nodes (and fills in members gloo does not record);
    ``memberships`` maps a pg name or description to its global ranks (the live hook's record). Dumps of
    several captures (:attr:`FRDump.capture`) are compared: the latest is diagnosed.
    """
    if not dumps:
        raise InputError("Flight Recorder analysis: no Flight Recorder dumps")
    cfg = config or CollectivesConfig()
    with paused_gc():
        f, notes = _facts(list(dumps), topology, memberships, cfg)
        result = classify(f)
    if notes:
        result = replace(result, reasons=result.reasons + tuple(notes))
    return result


def _facts(
    dumps: list[FRDump],
    topology: Topology | None,
    memberships: Mapping[str, Sequence[int]] | None,
    cfg: CollectivesConfig,
) -> tuple[CollectiveFacts, list[str]]:
    latest, previous, prev_no = split_captures(dumps)
    by_rank, dropped = dedupe(latest)
    unique = list(by_rank.values())
    keys, cfg_members = group_keys(unique)
    world = topology.world_size if topology is not None else world_from(unique, memberships)
    if topology is not None and max(by_rank) >= world:
        raise InputError(
            f"Flight Recorder dump of rank {max(by_rank)} but the topology has {world} ranks; check the layout"
        )
    groups = resolve_groups(unique, keys, cfg_members, world, topology, memberships)
    tables = build_tables(by_rank, keys, groups)
    clock = Clock(by_rank, tables, groups, keys, cfg)
    progress = None
    if previous and prev_no is not None:
        progress = compare(dedupe(previous)[0], by_rank, prev_no)
        clock.progress = progress
    graph = wait_graph(tables, groups, by_rank, clock)
    stalls = group_stalls(tables, groups, by_rank, graph)
    lates = lateness(tables.durations, tables.created_at, groups, cfg.slow_min_score)
    slow, scores = slow_ranks(lates, groups, cfg.slow_min_wait_fraction)

    def node(r: int) -> tuple[str, ...]:
        return (topology.node_of(r),) if topology is not None and r < topology.world_size else ()

    notes = _dump_notes(unique) + clock.notes
    if dropped:
        notes.append(f"{len(dropped)} rank(s) had two dumps; one kept each ({'; '.join(dropped[:3])}).")
    f = CollectiveFacts(
        graph,
        tuple(stalls),
        groups,
        mismatches(tables.sigs, groups),
        slow,
        scores,
        world,
        tuple(sorted(by_rank)),
        tuple(r for r in range(world) if r not in by_rank),
        tables.n_entries,
        node,
        node_lookup(topology),
        clock,
        progress,
        _unrecorded_p2p_neighbors(topology, tables.tracks),
        unstarted=any(tables.tracks.values()) and not any(tables.starts.values()),
        unrecorded=tuple(sorted(tables.unrecorded)),
    )
    return f, notes


def _unrecorded_p2p_neighbors(
    topology: Topology | None, tracks: Mapping[int, bool]
) -> Callable[[int], tuple[int, ...]]:
    """Adjacent pipeline stages of each rank when send/recv go unrecorded (gloo's FR records collectives
    only) and the topology has a pipeline; else nobody."""
    if topology is None or topology.sizes.get("pp", 1) < 2 or any(tracks.values()):
        return lambda r: ()
    topo = topology
    stage = topo.coords["pp"]

    def neighbors(r: int) -> tuple[int, ...]:
        if r >= topo.world_size:
            return ()
        return tuple(m for m in topo.group_of("pp", r).ranks if abs(int(stage[m]) - int(stage[r])) == 1)

    return neighbors


def _dump_notes(dumps: Sequence[FRDump], most: int = 5) -> list[str]:
    """The readers' notes on the dumps, each said once with the ranks it holds for ("rank 3: pg_status of pg_id
    0 ignored ..." on every rank of a wrapped buffer is one note, not one per rank)."""
    by_text: dict[str, list[int]] = {}
    loose: list[str] = []
    for d in dumps:
        for n in d.notes:
            head, sep, text = n.partition(": ")
            if sep and head == f"rank {d.rank}":
                by_text.setdefault(text, []).append(d.rank)
            else:
                loose.append(n)
    said = [
        f"rank(s) {rank_ranges(rs)}: {text}" if len(rs) > 1 else f"rank {rs[0]}: {text}" for text, rs in by_text.items()
    ]
    return (said + loose)[:most]
