"""Synthetic Flight Recorder dumps in the exact NCCL format, with injected faults and ground truth.

A small Megatron-like training step is simulated for every rank of a layout: per micro-batch a
pipeline recv, a TP all_reduce and a pipeline send (forward, then backward in reverse), then a
distributed-optimizer reduce-scatter/all-gather on the DP group and a scalar all_reduce on the
default group. Collectives complete when every member has enqueued them, sends/recvs when both
sides have; a faulty rank stops (or issues a wrong op), and everyone else runs until blocked.
The dumps are the dicts ``_dump_nccl_trace`` pickles (``version`` 2.10, ``pg_config`` with member
lists, ``pg_status``, ``entries`` with frames), so the installed ``torchfrtrace`` can read them.
"""

from __future__ import annotations

import json
import os
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.datasets.domain.flight_recorder import DUMP_TIME_KEY, FRDump
from rankscope.datasets.domain.topology import Layout, Topology
from rankscope.datasets.readers.flight_recorder import parse_dump
from rankscope.harness.synthetic_fr_sim import _Op, _simulate
from rankscope.spine import InputError

FAULTS = ("clean", "missing", "p2p_behind", "size_mismatch", "op_mismatch", "dtype_mismatch", "slow")


@dataclass(frozen=True)
class FRTruth:
    """What was injected: the fault kind, the ranks at fault and where."""

    fault: str
    culprit_ranks: tuple[int, ...] = ()
    pg_name: str = ""
    pg_kind: str = ""
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "fault": self.fault,
            "culprit_ranks": list(self.culprit_ranks),
            "pg_name": self.pg_name,
            "pg_kind": self.pg_kind,
            "description": self.description,
        }


@dataclass(frozen=True)
class SyntheticFR:
    """Generated dumps (raw FR dicts by rank), the job's topology and the ground truth."""

    raw: dict[int, dict[str, Any]]
    topology: Topology
    truth: FRTruth
    pg_kinds: dict[str, str] = field(default_factory=dict)  # pg name -> tp/pp/dp/world

    def dumps(self) -> list[FRDump]:
        """The dumps parsed in memory (no files)."""
        return [
            parse_dump(self.raw[r], path=f"synthetic/rank_{r}", rank=r, source_format="synthetic")
            for r in sorted(self.raw)
        ]

    def write(
        self, directory: str | os.PathLike[str], *, prefix: str = "nccl_trace_rank_", fmt: str = "pickle"
    ) -> list[Path]:
        """Write one file per rank, ``<prefix><rank>`` (``.json`` appended for fmt='json')."""
        if fmt not in ("pickle", "json"):
            raise InputError(f"fmt={fmt!r} must be 'pickle' or 'json'")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for rank in sorted(self.raw):
            if fmt == "pickle":
                path = out / f"{prefix}{rank}"
                path.write_bytes(pickle.dumps(self.raw[rank], protocol=2))  # as torch's C++ pickler writes
            else:
                path = out / f"{prefix}{rank}.json"
                d = dict(self.raw[rank])
                d["entries"] = [{k: v for k, v in e.items() if k != "frames"} for e in d["entries"]]
                path.write_text(json.dumps(d))
            paths.append(path)
        return paths


def _program(rank: int, topo: Topology, pp_group: tuple[int, ...], *, steps: int, micro: int, hidden: int) -> list[_Op]:
    """The ordered collectives and p2p ops one rank issues (GPipe schedule, blocking p2p)."""
    pp, tp, dp = topo.sizes["pp"], topo.sizes["tp"], topo.sizes["dp"]
    stage = int(topo.coords["pp"][rank])
    act = [[2, 1024, hidden]]
    tp_ar = [[2 * 512, hidden]]
    ops: list[_Op] = []
    for _ in range(steps):
        for _m in range(micro):  # forward
            if stage > 0:
                ops.append(_Op("pp", "recv", "p2p", pp_group[stage - 1], False, act, act))
            if tp > 1:
                ops.append(_Op("tp", "all_reduce", "fwd", in_sizes=tp_ar, out_sizes=tp_ar))
            if stage < pp - 1:
                ops.append(_Op("pp", "send", "p2p", pp_group[stage + 1], True, act, act))
        for _m in range(micro):  # backward
            if stage < pp - 1:
                ops.append(_Op("pp", "recv", "p2p", pp_group[stage + 1], False, act, act))
            if tp > 1:
                ops.append(_Op("tp", "all_reduce", "bwd", in_sizes=tp_ar, out_sizes=tp_ar))
            if stage > 0:
                ops.append(_Op("pp", "send", "p2p", pp_group[stage - 1], True, act, act))
        if dp > 1:
            n = 4096 * dp
            ops.append(_Op("dp", "_reduce_scatter_base", "opt", in_sizes=[[n]], out_sizes=[[n // dp]], dtype="Float"))
            ops.append(_Op("dp", "_all_gather_base", "opt", in_sizes=[[n // dp]], out_sizes=[[n]], dtype="Float"))
        ops.append(_Op("world", "all_reduce", "log", in_sizes=[[1]], out_sizes=[[1]], dtype="Float"))
    return ops


def generate_fr(
    layout: Layout | str,
    *,
    fault: str = "missing",
    n_culprits: int = 1,
    steps: int = 2,
    micro_batches: int = 2,
    gpus_per_node: int = 8,
    buffer_entries: int | None = None,
    timing: bool = False,
    at: str | None = None,
    seed: int = 0,
    dumped_after_s: float | None = None,
) -> SyntheticFR:
    """Simulate ``steps`` training steps on ``layout`` and inject ``fault`` (one of :data:`FAULTS`).

    ``missing``: ``n_culprits`` ranks stop before a TP/DP/default collective (``at``: tp, dp or
    world; random when None) of the last step;
    ``p2p_behind``: a pipeline rank stops before a send; ``*_mismatch``: a rank issues a DP
    collective with the wrong size/op/dtype (the op mismatch hangs it); ``slow``: a rank computes 4x
    slower (``duration_ms`` recorded). ``buffer_entries`` keeps only each rank's last N entries,
    like a wrapped ring buffer. ``dumped_after_s``: each dump carries the capture time the rankscope
    hook records (:data:`DUMP_TIME_KEY`), this many seconds after the job's last recorded activity
    (None: no capture time, as FR itself writes dumps).
    """
    if fault not in FAULTS:
        raise InputError(f"fault={fault!r} is not one of {FAULTS}")
    lay = Layout.parse(layout) if isinstance(layout, str) else layout
    topo = Topology.from_layout(lay, gpus_per_node=min(gpus_per_node, lay.world_size))
    world = topo.world_size
    rng = random.Random(seed)
    timing = timing or fault == "slow"

    # process groups, named like new_group does: a global counter in creation order
    pg_of: dict[tuple[str, int], str] = {}
    pg_members: dict[str, tuple[int, ...]] = {"0": tuple(range(world))}
    pg_kinds = {"0": "world"}
    kinds = [k for k in ("tp", "pp", "dp") if topo.sizes[k] > 1]
    for k in kinds:
        for g in topo.groups(k):
            name = str(len(pg_members))
            pg_members[name] = g.ranks
            pg_kinds[name] = k
            for r in g.ranks:
                pg_of[(k, r)] = name
    for r in range(world):
        pg_of[("world", r)] = "0"
    groups_of = [["0"] + [pg_of[(k, r)] for k in kinds] for r in range(world)]

    pp_groups = {r: pg_members[pg_of[("pp", r)]] for r in range(world)} if topo.sizes["pp"] > 1 else {}
    programs = [
        _program(r, topo, pp_groups.get(r, ()), steps=steps, micro=micro_batches, hidden=4096) for r in range(world)
    ]
    stop_at = [len(p) for p in programs]
    bad_op: dict[int, tuple[int, _Op]] = {}
    slow: set[int] = set()
    last_step_start = [len(p) - len(p) // steps for p in programs]
    truth = FRTruth("clean", description="no fault: every collective completes")

    if fault == "missing":
        kinds_ok = [k for k in ("tp", "dp", "world") if k == "world" or topo.sizes[k] > 1]
        if at is not None and at not in kinds_ok:
            raise InputError(f"at={at!r}: layout {lay} has no such collective; valid: {kinds_ok}")
        pick_kind = at or rng.choice(kinds_ok)
        culprits = _spread(rng, topo, n_culprits)
        for c in culprits:
            idx = next(i for i in range(last_step_start[c], len(programs[c])) if programs[c][i].kind == pick_kind)
            stop_at[c] = idx
        truth = FRTruth(
            "missing",
            tuple(sorted(culprits)),
            pg_of[(pick_kind, culprits[0])],
            pick_kind,
            f"rank(s) {sorted(culprits)} stop before a {pick_kind} collective of the last step",
        )
    elif fault == "p2p_behind":
        if topo.sizes["pp"] < 2:
            raise InputError(f"fault='p2p_behind' needs pipeline parallelism; layout {lay} has pp=1")
        c = rng.choice([r for r in range(world) if topo.coords["pp"][r] < topo.sizes["pp"] - 1])
        stop_at[c] = next(i for i in range(last_step_start[c], len(programs[c])) if programs[c][i].send)
        truth = FRTruth(
            "p2p_behind",
            (c,),
            pg_of[("pp", c)],
            "pp",
            f"rank {c} stops before sending to rank {programs[c][stop_at[c]].peer}",
        )
    elif fault.endswith("_mismatch"):
        kind = "dp" if topo.sizes["dp"] > 1 else "world"
        c = rng.randrange(world)
        idx = next(i for i in range(last_step_start[c], len(programs[c])) if programs[c][i].kind == kind)
        op = programs[c][idx]
        if fault == "size_mismatch":
            wrong = _Op(
                op.kind,
                op.name,
                op.frames,
                in_sizes=[[op.in_sizes[0][0] + 8]],
                out_sizes=[[op.out_sizes[0][0] + 8]],
                dtype=op.dtype,
            )
        elif fault == "dtype_mismatch":
            wrong = _Op(op.kind, op.name, op.frames, in_sizes=op.in_sizes, out_sizes=op.out_sizes, dtype="Half")
        else:
            wrong = _Op(
                op.kind,
                "all_reduce" if op.name != "all_reduce" else "broadcast",
                op.frames,
                in_sizes=op.in_sizes,
                out_sizes=op.in_sizes,
                dtype=op.dtype,
            )
        bad_op[c] = (idx, wrong)
        truth = FRTruth(
            fault,
            (c,),
            pg_of[(kind, c)],
            kind,
            f"rank {c} issues {wrong.name} {wrong.in_sizes} {wrong.dtype} where its peers issue "
            f"{op.name} {op.in_sizes} {op.dtype}",
        )
    elif fault == "slow":
        c = rng.randrange(world)
        slow.add(c)
        truth = FRTruth("slow", (c,), "", "", f"rank {c} computes 4x slower than its peers")

    raw, pc = _simulate(
        topo,
        programs,
        stop_at,
        bad_op,
        slow,
        pg_of,
        groups_of,
        pg_members,
        pg_kinds,
        timing,
        hang_on_op_mismatch=fault == "op_mismatch",
    )
    if fault in ("missing", "p2p_behind"):  # a rank blocked before its stop point never shows its own fault
        reached = tuple(r for r in truth.culprit_ranks if pc[r] == stop_at[r])
        masked = sorted(set(truth.culprit_ranks) - set(reached))
        if masked:
            truth = FRTruth(
                truth.fault,
                reached,
                truth.pg_name,
                truth.pg_kind,
                truth.description + f"; rank(s) {masked} blocked before reaching their stop point",
            )
    if dumped_after_s is not None:
        stamps = [
            t
            for d in raw.values()
            for e in d["entries"]
            for t in (e["time_created_ns"], e["time_discovered_started_ns"], e["time_discovered_completed_ns"])
            if t
        ]
        when = max(stamps) + int(dumped_after_s * 1e9)
        for d in raw.values():
            d[DUMP_TIME_KEY] = when
    if buffer_entries is not None:
        for d in raw.values():
            d["entries"] = d["entries"][-buffer_entries:]
    return SyntheticFR(raw, topo, truth, pg_kinds)


def _spread(rng: random.Random, topo: Topology, n: int) -> list[int]:
    """``n`` distinct ranks, no two in the same TP group (so each one is a separate root cause)."""
    tp_ids = topo.group_ids("tp") if topo.sizes["tp"] > 1 else list(range(topo.world_size))
    out: list[int] = []
    used: set[int] = set()
    for r in rng.sample(range(topo.world_size), topo.world_size):
        if int(tp_ids[r]) not in used:
            out.append(r)
            used.add(int(tp_ids[r]))
        if len(out) == n:
            break
    return out
