"""The simulation behind ``synthetic_fr``: every rank runs its program of collectives and p2p ops, in
lock step where the group is complete, and records Flight Recorder entries as PyTorch does."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rankscope.datasets.domain.topology import Topology


def _simulate(
    topo: Topology,
    programs: Sequence[list[_Op]],
    stop_at: list[int],
    bad_op: dict[int, tuple[int, _Op]],
    slow: set[int],
    pg_of: dict,
    groups_of: list[list[str]],
    pg_members: dict[str, tuple[int, ...]],
    pg_kinds: dict[str, str],
    timing: bool,
    *,
    hang_on_op_mismatch: bool,
) -> tuple[dict[int, dict[str, Any]], list[int]]:
    """Run every rank's program until all finish or block; return each rank's FR dump dict."""
    world = topo.world_size
    entries: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    coll_seq = [dict.fromkeys(groups_of[r], 0) for r in range(world)]  # per rank, per pg
    p2p_seq = [dict.fromkeys(groups_of[r], 0) for r in range(world)]
    op_ids = [dict.fromkeys(groups_of[r], 0) for r in range(world)]
    clock = [0.0] * world  # ms of virtual time at which each rank is free
    pc = [0] * world
    arrived: dict[tuple, list[tuple[int, dict[str, Any]]]] = {}
    p2p_count: dict[tuple, int] = {}
    local = {name: {r: i for i, r in enumerate(sorted(m))} for name, m in pg_members.items()}
    frames = _FRAMES
    work = deque(range(world))
    while work:
        r = work.popleft()
        if pc[r] >= stop_at[r]:
            continue
        op = programs[r][pc[r]]
        if r in bad_op and bad_op[r][0] == pc[r]:
            op = bad_op[r][1]
        pg = pg_of[(op.kind, r)]
        op_ids[r][pg] += 1
        compute = 4.0 * (4.0 if r in slow else 1.0)
        clock[r] += compute
        if op.kind == "pp":
            p2p_seq[r][pg] += 1
            assert op.peer is not None  # a p2p op always names its peer
            me, peer = local[pg][r], local[pg][op.peer]
            pname = f"nccl:send {me}->{peer}" if op.send else f"nccl:recv {me}<-{peer}"
            pair = (pg, r, op.peer) if op.send else (pg, op.peer, r)
            k = p2p_count.get((pair, op.send), 0)
            p2p_count[(pair, op.send)] = k + 1
            key: tuple = ("p2p", pair, k)
            need = 2
        else:
            coll_seq[r][pg] += 1
            pname = f"nccl:{op.name}"
            key = ("coll", pg, coll_seq[r][pg])
            need = len(pg_members[pg])
        e = {
            "record_id": len(entries[r]),
            "pg_id": int(pg),
            "process_group": (pg, _desc(pg, pg_kinds)),
            "collective_seq_id": coll_seq[r][pg],
            "p2p_seq_id": p2p_seq[r][pg],
            "op_id": op_ids[r][pg],
            "profiling_name": pname,
            "time_created_ns": _T0_NS + int(clock[r] * 1e6),
            "input_sizes": op.in_sizes,
            "input_dtypes": [op.dtype] * len(op.in_sizes),
            "output_sizes": op.out_sizes,
            "output_dtypes": [op.dtype] * len(op.out_sizes),
            "state": "started" if timing else "scheduled",
            "time_discovered_started_ns": _T0_NS + int(clock[r] * 1e6) + 1000 if timing else None,
            "time_discovered_completed_ns": None,
            "retired": False,
            "timeout_ms": 600000,
            "is_p2p": op.kind == "pp",
            "frames": [dict(f) for f in frames[op.frames]],  # torch writes every entry's frames anew
            "thread_id": str(140000000000000 + r),
            "thread_name": "pt_main_thread",
        }
        if timing:
            e["duration_ms"] = None
        entries[r].append(e)
        group = arrived.setdefault(key, [])
        group.append((r, e))
        if len(group) < need:
            continue
        if hang_on_op_mismatch and key[0] == "coll" and len({x[1]["profiling_name"] for x in group}) > 1:
            continue  # NCCL cannot pair different ops: every member waits forever
        del arrived[key]
        end = max(clock[x] for x, _ in group) + 1.0
        for x, ex in group:
            ex["state"] = "completed"
            ex["retired"] = True
            ex["time_discovered_completed_ns"] = _T0_NS + int(end * 1e6) + 1000
            if timing:
                ex["duration_ms"] = round(end - clock[x], 3)
            clock[x] = end
            pc[x] += 1
            work.append(x)
    raw = {}
    ranks_text = {name: str(list(m)) for name, m in pg_members.items()}
    for r in range(world):
        mine = groups_of[r]
        pg_config = {name: {"name": name, "desc": _desc(name, pg_kinds), "ranks": ranks_text[name]} for name in mine}
        pg_status = {}
        for name in mine:
            done = [
                e["collective_seq_id"]
                for e in entries[r]
                if e["process_group"][0] == name and not e["is_p2p"] and e["state"] == "completed"
            ]
            pg_status[name] = {
                "last_enqueued_collective": coll_seq[r][name],
                "last_started_collective": coll_seq[r][name] if timing else -1,
                "last_completed_collective": max(done, default=0),
            }
        raw[r] = {
            "version": FR_VERSION,
            "comm_lib_version": "2.27.3",
            "pg_config": pg_config,
            "pg_status": pg_status,
            "entries": entries[r],
        }
    return raw, pc


def _desc(pg: str, pg_kinds: dict[str, str]) -> str:
    kind = pg_kinds[pg]
    return "default_pg" if kind == "world" else _DESCS.get(kind, "undefined")


FR_VERSION = "2.10"


_DESCS = {
    "tp": "TENSOR_MODEL_PARALLEL_GROUP",
    "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
    "dp": "DATA_PARALLEL_GROUP",
    "cp": "CONTEXT_PARALLEL_GROUP",
    "ep": "EXPERT_MODEL_PARALLEL_GROUP",
}


_T0_NS = 1_790_000_000_000_000_000


_FRAMES = {
    "fwd": [
        {"name": "all_reduce", "filename": "torch/distributed/distributed_c10d.py", "line": 2950},
        {"name": "forward", "filename": "megatron/core/tensor_parallel/layers.py", "line": 612},
        {"name": "forward_step", "filename": "megatron/core/pipeline_parallel/schedules.py", "line": 275},
    ],
    "bwd": [
        {"name": "all_reduce", "filename": "torch/distributed/distributed_c10d.py", "line": 2950},
        {"name": "backward", "filename": "torch/autograd/__init__.py", "line": 353},
        {"name": "backward_step", "filename": "megatron/core/pipeline_parallel/schedules.py", "line": 398},
    ],
    "p2p": [
        {"name": "send", "filename": "torch/distributed/distributed_c10d.py", "line": 2420},
        {"name": "_communicate", "filename": "megatron/core/pipeline_parallel/p2p_communication.py", "line": 341},
    ],
    "opt": [
        {"name": "reduce_scatter_tensor", "filename": "torch/distributed/distributed_c10d.py", "line": 4212},
        {"name": "step", "filename": "megatron/core/optimizer/distrib_optimizer.py", "line": 1740},
    ],
    "log": [
        {"name": "all_reduce", "filename": "torch/distributed/distributed_c10d.py", "line": 2950},
        {"name": "training_log", "filename": "megatron/training/training.py", "line": 1012},
    ],
}


@dataclass
class _Op:
    kind: str  # tp | pp | dp | world
    name: str  # profiling op name
    frames: str
    peer: int | None = None  # global peer rank for p2p
    send: bool = False
    in_sizes: list = field(default_factory=list)
    out_sizes: list = field(default_factory=list)
    dtype: str = "BFloat16"
