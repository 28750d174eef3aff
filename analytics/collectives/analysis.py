"""Collective-trace analysis of Flight Recorder dumps: who did not join, who disagrees, who is slow.

Named steps, each in its own module: one dump per rank (:func:`.tables.dedupe`), group membership and
kind (:mod:`.groups`), progress tables per group and rank (:mod:`.tables`), the wait graph and the
stalled groups (:mod:`.waits`), late arrivals and mismatches (:mod:`.slow`), then one finding from
small pure classifiers (:mod:`.decide`). The stopped group is the first group, in the order
model-parallel, data-parallel, default, whose missing ranks hold a culprit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from rankscope.analytics.collectives.decide import CollectiveFacts, classify
from rankscope.analytics.collectives.groups import group_keys, resolve_groups
from rankscope.analytics.collectives.result import CollectiveAnalysis
from rankscope.analytics.collectives.slow import (
    mismatches,
    pair_p2p_durations,
    slow_scores,
    strongest_per_group,
)
from rankscope.analytics.collectives.tables import build_tables, dedupe, world_from
from rankscope.analytics.collectives.waits import MissingAt, group_stalls, wait_graph
from rankscope.analytics.faultdomain import node_lookup
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
    ``memberships`` maps a pg name or description to its global ranks (the live hook's record).
    """
    if not dumps:
        raise InputError("Flight Recorder analysis: no Flight Recorder dumps")
    cfg = config or CollectivesConfig()
    with paused_gc():
        f, dropped = _facts(dumps, topology, memberships, cfg)
        result = classify(f)
    if dropped:
        note = f"{len(dropped)} rank(s) had two dumps; one kept each ({'; '.join(dropped[:3])})."
        result = replace(result, reasons=result.reasons + (note,))
    return result


def _facts(
    dumps: Sequence[FRDump],
    topology: Topology | None,
    memberships: Mapping[str, Sequence[int]] | None,
    cfg: CollectivesConfig,
) -> tuple[CollectiveFacts, list[str]]:
    by_rank, dropped = dedupe(dumps)
    unique = list(by_rank.values())
    keys, cfg_members = group_keys(unique)
    world = topology.world_size if topology is not None else world_from(unique, memberships)
    if topology is not None and max(by_rank) >= world:
        raise InputError(
            f"Flight Recorder dump of rank {max(by_rank)} but the topology has {world} ranks; check the layout"
        )
    groups = resolve_groups(unique, keys, cfg_members, world, topology, memberships)
    tables = build_tables(by_rank, keys, groups)
    missing_at = MissingAt(tables, groups, by_rank)
    graph = wait_graph(tables, groups, missing_at)
    stalls = group_stalls(tables, groups, by_rank, graph.stuck, missing_at)
    pair_p2p_durations(tables)
    scores = slow_scores(tables.durations)
    slow = strongest_per_group([r for r, s in scores.items() if s >= cfg.slow_min_score], scores, groups, keys)

    def node(r: int) -> tuple[str, ...]:
        return (topology.node_of(r),) if topology is not None and r < topology.world_size else ()

    return CollectiveFacts(
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
    ), dropped
