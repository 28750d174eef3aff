"""What the ladder's rules read from a situation: machine and network signals, the same error on many
ranks, a crash's first failures, the onset of a loss or gradient-norm jump, and the actions they share."""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from rankscope.datasets.domain.xid import xid_info

from .catalog import DRAIN_XIDS
from .classify import Classification
from .plan import Action
from .records import Checkpoint, VerdictFacts
from .situation import Facts

MACHINE_EVENT_KINDS: dict[str, float] = {
    "gpu_lost": 0.98,
    "gpu_fallen_off_bus": 0.98,
    "ecc_uncorrectable": 0.95,
    "row_remap_failure": 0.9,
    "gpu_driver_hang": 0.9,
    "disk_fault": 0.95,
    "fs_readonly": 0.95,
    "disk_full": 0.85,
    "kernel_panic": 0.95,
    "node_failure": 0.9,
}
"""Health-event kinds that name a broken machine by themselves, with how sure they are. ``xid`` events
count by the Xid table (:mod:`rankscope.datasets.domain.xid`): ``evict`` Xids at their confidence."""

NETWORK_EVENT_KINDS = frozenset(
    {
        "nic_down",
        "nic_flap",
        "link_down",
        "link_flap",
        "port_flap",
        "switch_down",
        "packet_loss",
        "ib_link_down",
        "network",
    }
)
NUMERIC_EVENT_KINDS = frozenset({"nan", "inf", "loss_spike"})
CAPTURE_FAILURE_EVIDENCE = frozenset({"failed-dump", "dump-cut-off", "capture-failed", "cut-dump"})
MACHINE_VERDICTS = ("hang", "fail-slow", "crash")
NOT_A_MACHINE = frozenset({"code", "data", "resources", "numerics"})

STOP_TIME_CHECKS = (
    "DCGM diagnostics level 2 on the suspect machines (dcgmi diag -r 2)",
    "nccl-tests all_reduce_perf between node pairs (bisect: NCCL_TESTS_MIN_BW fails a slow pair)",
    "a bitwise-alignment step (fixed seed, weights and batch) compared across machines",
)
AGGREGATION_EVIDENCE = (
    "stack captures of every rank (py-spy dump, or the in-process hook's faulthandler dump)",
    "Flight Recorder dumps (TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE > 0)",
    "then `rankscope diagnose` on the captures: the rank that stopped first is the culprit",
)


def _newest_complete(checkpoints: Sequence[Checkpoint], before_step: int | None = None) -> Checkpoint | None:
    ok = [c for c in checkpoints if c.complete and (before_step is None or c.step < before_step)]
    return max(ok, key=lambda c: (c.step, c.path)) if ok else None


def _restart(f: Facts, reason: str, exclude: Sequence[str] = ()) -> Action:
    ck = _newest_complete(f.s.checkpoints)
    where = (
        f"from the newest complete checkpoint ({ck.path}, step {ck.step})"
        if ck
        else "from the newest complete checkpoint (none recorded here: the job's own resume logic picks it)"
    )
    return Action(
        "restart",
        f"{reason}; restart {where}",
        checkpoint=ck.path if ck else "",
        step=ck.step if ck else None,
        exclude=tuple(exclude),
    )


def _machine_signals(f: Facts) -> tuple[dict[str, tuple[float, str]], list[str]]:
    """node -> (confidence, what) for high-confidence machine events and lines; and unlocated ones."""
    found: dict[str, tuple[float, str]] = {}
    unlocated: list[str] = []

    def add(node: str, conf: float, what: str) -> None:
        if conf < f.cfg.machine_min_confidence:
            return
        if not node:
            unlocated.append(what)
        elif node not in found or conf > found[node][0]:
            found[node] = (conf, what)

    for e in f.events:
        if e.kind == "xid" and e.xid is not None:
            info = xid_info(e.xid, e.message)
            if info.action == "evict":
                gpu = f" on GPU {e.gpu}" if e.gpu is not None else ""
                add(e.node, info.confidence, f"Xid {e.xid} ({info.meaning}){gpu}")
        elif e.kind in MACHINE_EVENT_KINDS:
            add(e.node, MACHINE_EVENT_KINDS[e.kind], f"{e.kind}" + (f": {e.message[:120]}" if e.message else ""))
    for c in f.signals:
        if c.domain == "machine":
            add(c.node, c.confidence, f"{c.category} ({c.rule}): {c.text[:120]}")
    return found, unlocated


def _drain_signals(f: Facts) -> dict[str, str]:
    """node -> what, for GPUs that need a reset at their next opportunity but still work (Xid 63, 92)."""
    found: dict[str, str] = {}
    for e in f.events:
        if e.kind == "xid" and e.xid is not None and e.node and xid_info(e.xid, e.message).action == "drain":
            found.setdefault(e.node, f"Xid {e.xid} ({xid_info(e.xid).meaning})")
    for c in f.signals:
        if c.node and c.xid in DRAIN_XIDS and c.category == "gpu_hardware":
            found.setdefault(c.node, f"Xid {c.xid} ({DRAIN_XIDS[c.xid][1]})")
    return found


def _network_alerts(f: Facts) -> dict[str, list[float]]:
    """node -> distinct alert times within the network window (events, plus earlier tolerated alerts)."""
    lo = f.now - f.cfg.network_window_seconds
    by_node: dict[str, list[float]] = defaultdict(list)
    for e in f.events:
        if e.kind in NETWORK_EVENT_KINDS and e.node and lo <= e.time <= f.now:
            by_node[e.node].append(e.time)
    for c in f.signals:
        if c.domain == "network" and c.node and c.time is not None and lo <= c.time <= f.now:
            by_node[c.node].append(c.time)
    for h in f.s.history:  # alerts tolerated earlier (this incident's own record included: same alert)
        if h.kind == "tolerate" and h.rule.startswith("network") and lo <= h.time <= f.now:
            for n in h.nodes:
                by_node[n].append(h.time)
    out = {}
    for node, times in by_node.items():
        distinct: list[float] = []
        for t in sorted(times):
            if not distinct or t - distinct[-1] > 1.0:  # the same alert seen by two monitors is one alert
                distinct.append(t)
        out[node] = distinct
    return out


_NUM = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)?")


def _signature(c: Classification) -> str:
    return f"{c.category}|{_NUM.sub('N', ' '.join(c.text.split()))[:200]}"


def _world(f: Facts) -> int:
    v = f.s.verdict
    return v.world_size if v is not None and v.world_size else 0


def _widespread(f: Facts) -> tuple[str, list[Classification]] | None:
    """The same non-machine error (user code, data, OOM, a CUDA error, NaN) on many ranks."""
    groups: dict[str, dict[Any, Classification]] = defaultdict(dict)
    for c in f.signals:
        # an exit code alone says too little (every rank aborts with SIGABRT after an NCCL timeout), and
        # a native crash everywhere may be that same teardown: only an error's own words count here
        if c.rule.startswith("exit-") or c.category == "crash_signal":
            continue
        if c.domain in NOT_A_MACHINE | {"ambiguous"}:
            who = c.rank if c.rank is not None else c.node
            if who is not None and who != "":
                groups[_signature(c)].setdefault(who, c)
    if not groups:
        return None
    sig, members = max(groups.items(), key=lambda kv: (len(kv[1]), kv[0]))
    world = _world(f) or len({w for g in groups.values() for w in g})
    need = max(f.cfg.widespread_min_ranks, math.ceil(f.cfg.widespread_fraction * world))
    if len(members) < need:
        return None
    nodes = {c.node for c in members.values()}
    if len(nodes) == 1 and "" not in nodes:
        return None  # every rank of one machine failing alike follows that machine, not the code
    return sig, list(members.values())


def _code_actions(f: Facts, why: str) -> tuple[Action, ...]:
    versions = f.s.code_versions
    if len(versions) >= 2:
        prev = versions[-2]
        return (
            Action(
                "rollback",
                f"{why}: roll back the code from {versions[-1]} to {prev} (hot update, no machine replaced)",
                code_version=prev,
            ),
            _restart(f, "after the rollback"),
        )
    return (
        Action(
            "stop",
            f"{why}: restarting would fail the same way, and no previous code version is recorded to roll back to",
        ),
        Action("collect", "for the job's owners", collect=("the failing traceback and the change that introduced it",)),
    )


def _culprit_evidence(v: VerdictFacts) -> list[str]:
    ranks, nodes = set(v.culprit_ranks), set(v.culprit_nodes)
    return [e.kind for e in v.evidence if set(e.ranks) & ranks or set(e.nodes) & nodes]


def _crash_culprits(f: Facts) -> list[tuple[Classification | None, str]]:
    """The crash verdict's primary failures, classified."""
    v = f.s.verdict
    if v is None or v.kind != "crash":
        return []
    culprits = set(v.culprit_ranks)
    out = []
    for x in v.crash_exits:
        if x.cause == "primary" and (not culprits or x.rank in culprits):
            c = f.table.classify_exit(kind=x.kind, message=x.message, node=x.node, rank=x.rank)
            out.append((c, f"rank {x.rank} on {x.node}: {x.kind}: {' '.join(x.message.split())[:120]}"))
    return out


def _metric_onset(f: Facts) -> tuple[int | None, float | None, str] | None:
    """(step, time, what) of the first NaN/Inf or jump of ``metric_jump_factor`` over the running median."""
    best: tuple[int, float | None, str] | None = None
    ms = sorted(f.s.metrics, key=lambda m: m.step)
    for name in ("loss", "grad_norm"):
        prev: list[float] = []
        for m in ms:
            x = getattr(m, name)
            if x is None:
                continue
            hit = ""
            if not math.isfinite(x):
                hit = f"{name} is {x} at step {m.step}"
            elif len(prev) >= 3:
                base = statistics.median(prev[-f.cfg.metric_baseline_steps :])
                if base > 0 and x >= f.cfg.metric_jump_factor * base:
                    hit = f"{name} jumped to {x:.4g} at step {m.step}, {x / base:.1f}x its running median {base:.4g}"
            if hit:
                if best is None or m.step < best[0]:
                    best = (m.step, m.time, hit)
                break
            prev.append(x)
    if best is not None:
        return best
    ev = sorted((e for e in f.events if e.kind in NUMERIC_EVENT_KINDS), key=lambda e: e.time)
    lines = sorted((c for c in f.signals if c.domain == "numerics"), key=lambda c: c.time or 0.0)
    if ev:
        return None, ev[0].time, f"{ev[0].kind} event on {ev[0].node or '?'}: {ev[0].message[:120]}"
    if lines:
        return None, lines[0].time, f"log line: {lines[0].text[:120]}"
    return None
