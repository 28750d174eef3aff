"""Process-group membership and kind for Flight Recorder analysis.

Members come from ``pg_config`` when the dump has it; else from recorded ``memberships`` (pg name
or description -> ranks, as the live hook records them); else the default group is the world and
any other group is the smallest topology group (smaller than the job) that contains every rank seen
using it; else the ranks seen using it. The kind (tp, cp, ep, pp, mp, dp, world, other) orders the wavefront search:
model-parallel groups first, data-parallel next, the default group last.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from rankscope.datasets.domain.flight_recorder import FRDump
from rankscope.datasets.domain.topology import Topology

KIND_ORDER = {"tp": 0, "cp": 1, "ep": 2, "pp": 3, "mp": 4, "other": 5, "dp": 6, "world": 7}
"""Wavefront order: model-parallel groups stop first, data-parallel next, the default group last."""

_DESC_KINDS = (
    ("default_pg", "world"),
    ("tensor", "tp"),
    ("pipeline", "pp"),
    ("context", "cp"),
    ("expert", "ep"),
    ("data", "dp"),
    ("model_parallel", "mp"),
    ("mesh_tp", "tp"),
    ("mesh_pp", "pp"),
    ("mesh_cp", "cp"),
    ("mesh_ep", "ep"),
    ("mesh_dp", "dp"),
)

GroupKey = str
"""A group's identity: its pg name, plus ``#i`` when split_group reused the name for other members."""


@dataclass(frozen=True)
class GroupInfo:
    """One process group: name, description, members, where the members came from, and its kind."""

    key: GroupKey
    name: str
    desc: str
    ranks: tuple[int, ...]
    source: str  # pg_config | memberships | default | topology | observed
    kind: str
    index: int = -1  # the topology group index when kind is a topology kind

    @property
    def label(self) -> str:
        return f"pg {self.name}" + (f" ({self.desc})" if self.desc and self.desc != "undefined" else "")


_PG_NAME = attrgetter("pg_name")  # (mapped in C over every entry of every rank)


def group_keys(dumps: Sequence[FRDump]) -> tuple[dict[int, dict[str, GroupKey]], dict[GroupKey, tuple[int, ...]]]:
    """Per rank, its pg name -> group key; and each key's members where a pg_config gave them.

    Keys are short strings (hashing a member tuple of a world-sized group on every lookup is slow).
    """
    variants: dict[str, dict[tuple[int, ...], int]] = {}  # pg name -> its distinct member lists, numbered
    known: dict[tuple[str, int], GroupKey] = {}  # (pg name, id of a member tuple) -> key: readers share one
    members: dict[GroupKey, tuple[int, ...]] = {}  # tuple per group, so most lookups never hash one
    out: dict[int, dict[str, GroupKey]] = {}
    for d in dumps:
        keys: dict[str, GroupKey] = {}
        for n, cfg in d.pg_config.items():
            ranks = cfg.ranks
            if ranks is None:
                keys[n] = n
                continue
            key = known.get((n, id(ranks)))
            if key is None:
                seen = variants.setdefault(n, {})
                i = seen.setdefault(ranks, len(seen))
                key = n if i == 0 else f"{n}#{i}"
                known[(n, id(ranks))] = key
                members.setdefault(key, ranks)
            keys[n] = key
        for n in (*d.pg_status, *set(map(_PG_NAME, d.entries))):  # groups no pg_config lists: by name
            if n not in keys:
                keys[n] = n
        out[d.rank] = keys
    return out, members


def resolve_groups(
    dumps: Sequence[FRDump],
    keys_by_rank: Mapping[int, Mapping[str, GroupKey]],
    cfg_members: Mapping[GroupKey, tuple[int, ...]],
    world_size: int,
    topology: Topology | None,
    memberships: Mapping[str, Sequence[int]] | None,
) -> dict[GroupKey, GroupInfo]:
    """Every group seen in the dumps with its members and kind."""
    observed: dict[GroupKey, set[int]] = defaultdict(set)
    descs: dict[GroupKey, str] = {}
    for d in dumps:
        k = keys_by_rank[d.rank]
        done: set[str] = set()
        for n, key in k.items():
            observed[key].add(d.rank)
            cfg = d.pg_config.get(n)
            if cfg is not None and cfg.desc:
                descs.setdefault(key, cfg.desc)
        if all(key in descs for key in k.values()):
            continue  # every group of this rank is described already: its entries cannot change that
        for e in d.entries:
            if e.pg_desc and e.pg_name not in done:
                descs.setdefault(k[e.pg_name], e.pg_desc)
                done.add(e.pg_name)
    mem = {str(k): tuple(sorted(int(r) for r in v)) for k, v in (memberships or {}).items()}
    groups = {}
    for key, seen in observed.items():
        name, cfg_ranks = key.split("#", 1)[0], cfg_members.get(key)
        desc = descs.get(key, "")
        if cfg_ranks is not None:
            ranks, source = tuple(sorted(cfg_ranks)), "pg_config"
        elif name in mem or (desc and desc in mem and desc not in ("undefined", "")):
            ranks, source = mem[name] if name in mem else mem[desc], "memberships"
        elif desc == "default_pg" or (name == "0" and not desc):
            ranks, source = tuple(range(world_size)), "default"
        else:
            ranks, source = _from_topology(seen, topology)
        kind, index = group_kind(ranks, desc, world_size, topology)
        groups[key] = GroupInfo(key, name, desc, ranks, source, kind, index)
    return groups


def _from_topology(seen: set[int], topology: Topology | None) -> tuple[tuple[int, ...], str]:
    """The smallest topology group holding every observed rank, else the observed ranks.

    A group as large as the job is no guess (the pure data-parallel topology assumed without a layout
    has only that one): a non-default group that spans the world would have been the default group."""
    obs = np.fromiter(sorted(seen), dtype=np.int64)
    if topology is not None and obs.size and obs.max() < topology.world_size:
        best: tuple[int, str, int] | None = None
        for kind in topology.kinds():
            gid = topology.group_ids(kind)[obs]
            if (gid == gid[0]).all():
                size = topology.group_size(kind)
                if size < topology.world_size and (best is None or size < best[0]):
                    best = (size, kind, int(gid[0]))
        if best is not None:
            return topology.group(best[1], best[2]).ranks, "topology"
    return tuple(int(r) for r in obs), "observed"


def group_kind(ranks: Sequence[int], desc: str, world_size: int, topology: Topology | None) -> tuple[str, int]:
    """The group's kind and topology index: by comparing members with the topology, else by description."""
    if len(ranks) == world_size and world_size > 0:
        return "world", 0
    if topology is not None and ranks:
        found = topology.kind_of_members(ranks)
        if found is not None:
            return found
    low = desc.lower()
    for word, kind in _DESC_KINDS:
        if word in low:
            return kind, -1
    return "other", -1
