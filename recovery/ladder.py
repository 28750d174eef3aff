"""ByteRobust's decision ladder, pure: a :class:`Situation` in, one :class:`~.plan.Plan` out.

The ladder is a table (:data:`RULES`) read top to bottom; the first rule that matches decides, the
others that also matched are listed in the plan (``also_matched``), and every action carries its reason.
Cheapest and surest first, as in the paper (§3.2 of the digest):

1. ``machine-event``: a high-confidence machine event (GPU lost, fatal Xid, uncorrectable ECC, disk fault,
   read-only filesystem) -> evict that machine now, no analysis, restart from the newest complete
   checkpoint;
2. ``network-repeat``: a network alert seen again within the window (twice within 5 minutes) -> evict;
3. ``code-fault``: a ``mismatch`` verdict, or the same error on many ranks -> code or configuration: no
   eviction; roll back to the previous code version if one is recorded, else stop;
4. ``crash-not-machine``: a crash whose first failure is user code, data or out-of-memory -> no eviction;
5. ``capture-failed``: the only evidence against the culprit is a stack capture that failed -> collect;
6. ``verdict-machine``: ``hang`` / ``fail-slow`` / ``crash`` with a machine culprit -> evict the suspect
   machines (the verdict's over-eviction) and restart; a job that fails again right after such an
   eviction escalates: first widen to the suspect groups of both incidents, then stop and ask for
   stop-time checks;
7. ``low-confidence``: a machine verdict below the confidence floor -> collect;
8. ``numerics``: NaN/Inf or a 5x loss / grad-norm jump with no machine verdict -> roll back to the
   newest complete checkpoint before the onset;
9. ``network-once``: a first network alert -> tolerate;
10. ``symptom-only``: only collective timeouts / lost peers (or a crash made only of cascades) -> never a
    verdict by itself: collect stacks and Flight Recorder dumps for the aggregation analysis;
11. ``degraded``, ``imbalance``, ``inconclusive``, ``healthy``, ``no-signal``: no eviction; say what
    evidence to collect next.

Nothing here reads a clock, a file or the network: ``now`` is an input (or the newest input time), so
the same situation always gives the same plan.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._compat import InputError
from .classify import DEFAULT_TABLE, FATAL_XIDS, Classification, LogLine, RuleTable
from .plan import Action, Plan
from .records import (ActionRecord, Checkpoint, ExitRecord, HealthEvent, MetricRecord, VerdictFacts)

MACHINE_EVENT_KINDS: dict[str, float] = {
    "gpu_lost": 0.98, "gpu_fallen_off_bus": 0.98, "ecc_uncorrectable": 0.95, "row_remap_failure": 0.9,
    "gpu_driver_hang": 0.9, "disk_fault": 0.95, "fs_readonly": 0.95, "disk_full": 0.85, "kernel_panic": 0.95,
    "node_failure": 0.9,
}
"""Health-event kinds that name a broken machine by themselves, with how sure they are. ``xid`` events
count when their Xid is in :data:`~.classify.FATAL_XIDS`."""

NETWORK_EVENT_KINDS = frozenset({"nic_down", "nic_flap", "link_down", "link_flap", "port_flap", "switch_down",
                                 "packet_loss", "ib_link_down", "network"})
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


@dataclass(frozen=True, kw_only=True)
class LadderConfig:
    """Thresholds of the ladder; units in the names. Defaults follow ByteRobust where it gives one."""

    machine_min_confidence: float = 0.85
    network_repeat_count: int = 2
    network_window_seconds: float = 300.0
    event_window_seconds: float = 3600.0
    widespread_fraction: float = 0.25
    widespread_min_ranks: int = 2
    metric_jump_factor: float = 5.0
    metric_baseline_steps: int = 20
    min_verdict_confidence: float = 0.6
    escalation_window_seconds: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("machine_min_confidence", "widespread_fraction", "min_verdict_confidence"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise InputError(f"ladder config: {name}={v} is outside 0..1")
        for name in ("network_window_seconds", "event_window_seconds", "escalation_window_seconds"):
            if getattr(self, name) <= 0:
                raise InputError(f"ladder config: {name}={getattr(self, name)} must be > 0 seconds")
        if self.network_repeat_count < 1 or self.widespread_min_ranks < 1 or self.metric_baseline_steps < 1:
            raise InputError("ladder config: network_repeat_count, widespread_min_ranks and metric_baseline_steps "
                             "must be >= 1")
        if self.metric_jump_factor <= 1.0:
            raise InputError(f"ladder config: metric_jump_factor={self.metric_jump_factor} must be > 1 (e.g. 5)")


@dataclass(frozen=True)
class Situation:
    """Everything the ladder and the guardrails decide on, for one job at one moment."""

    job: str = ""
    verdict: VerdictFacts | None = None
    events: tuple[HealthEvent, ...] = ()
    exits: tuple[ExitRecord, ...] = ()
    logs: tuple[Classification, ...] = ()
    history: tuple[ActionRecord, ...] = ()
    metrics: tuple[MetricRecord, ...] = ()
    checkpoints: tuple[Checkpoint, ...] = ()
    code_versions: tuple[str, ...] = ()  # oldest first; the last one is running
    machines: tuple[str, ...] = ()  # the job's machines now
    standby: tuple[str, ...] = ()  # warm standby machines, in the order they are to be used
    quarantine: frozenset[str] = field(default_factory=frozenset)
    now: float | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, table: RuleTable = DEFAULT_TABLE, where: str = "input") -> Situation:
        """From a JSON object: ``verdict`` (diagnose's JSON), ``events``, ``exits``, ``logs`` (strings or
        objects with ``text``; classified here), ``metrics``, ``checkpoints``, ``code_versions``,
        ``history``, ``machines``, ``standby``, ``quarantine``, ``now``."""
        if not isinstance(d, Mapping):
            raise InputError(f"{where}: expected a JSON object")
        known = {"job", "verdict", "events", "exits", "logs", "metrics", "checkpoints", "code_versions", "history",
                 "machines", "standby", "quarantine", "now"}
        extra = sorted(set(d) - known)
        if extra:
            raise InputError(f"{where}: unknown key(s) {extra}; known: {sorted(known)}")

        def items(name: str) -> list[Any]:
            v = d.get(name) or []
            if not isinstance(v, list):
                raise InputError(f"{where}: '{name}' must be a list")
            return v

        from .records import parse_time  # noqa: PLC0415

        verdict = VerdictFacts.from_dict(d["verdict"], where=f"{where}: verdict") if d.get("verdict") else None
        lines = [LogLine(x) if isinstance(x, str) else LogLine.from_dict(x, where=f"{where}: logs[{i}]")
                 for i, x in enumerate(items("logs"))]
        return cls(
            job=str(d.get("job") or (verdict.job if verdict else "")), verdict=verdict,
            events=tuple(HealthEvent.from_dict(x, where=f"{where}: events[{i}]") for i, x in enumerate(items("events"))),
            exits=tuple(ExitRecord.from_dict(x, where=f"{where}: exits[{i}]") for i, x in enumerate(items("exits"))),
            logs=table.classify_lines(lines),
            history=tuple(ActionRecord.from_dict(x, where=f"{where}: history[{i}]")
                          for i, x in enumerate(items("history"))),
            metrics=tuple(MetricRecord.from_dict(x, where=f"{where}: metrics[{i}]")
                          for i, x in enumerate(items("metrics"))),
            checkpoints=tuple(Checkpoint.from_dict(x, where=f"{where}: checkpoints[{i}]")
                              for i, x in enumerate(items("checkpoints"))),
            code_versions=tuple(str(v) for v in items("code_versions")),
            machines=tuple(dict.fromkeys(str(v) for v in items("machines"))),
            standby=tuple(dict.fromkeys(str(v) for v in items("standby"))),
            quarantine=frozenset(str(v) for v in items("quarantine")),
            now=parse_time(d.get("now"), f"{where}: now"),
        )


@dataclass(frozen=True)
class Facts:
    """What the rules read, computed once from the situation."""

    s: Situation
    cfg: LadderConfig
    table: RuleTable
    now: float
    incident: str
    events: tuple[HealthEvent, ...]  # within the event window
    signals: tuple[Classification, ...]  # classified log lines and exits
    history: tuple[ActionRecord, ...]  # other incidents' actions only


@dataclass(frozen=True)
class Decision:
    category: str
    confidence: float
    actions: tuple[Action, ...]
    reasons: tuple[str, ...] = ()
    suspect_nodes: tuple[str, ...] = ()


RuleFn = Callable[[Facts], Decision | None]


@dataclass(frozen=True)
class LadderRule:
    id: str
    summary: str
    evaluate: RuleFn


# ----------------------------------------------------------------------------------------------------------
# helpers


def _newest_complete(checkpoints: Sequence[Checkpoint], before_step: int | None = None) -> Checkpoint | None:
    ok = [c for c in checkpoints if c.complete and (before_step is None or c.step < before_step)]
    return max(ok, key=lambda c: (c.step, c.path)) if ok else None


def _restart(f: Facts, reason: str, exclude: Sequence[str] = ()) -> Action:
    ck = _newest_complete(f.s.checkpoints)
    where = f"from the newest complete checkpoint ({ck.path}, step {ck.step})" if ck else \
        "from the newest complete checkpoint (none recorded here: the job's own resume logic picks it)"
    return Action("restart", f"{reason}; restart {where}", checkpoint=ck.path if ck else "",
                  step=ck.step if ck else None, exclude=tuple(exclude))


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
        if e.kind == "xid" and e.xid in FATAL_XIDS:
            conf, meaning = FATAL_XIDS[e.xid]
            add(e.node, conf, f"Xid {e.xid} ({meaning})" + (f" on GPU {e.gpu}" if e.gpu is not None else ""))
        elif e.kind in MACHINE_EVENT_KINDS:
            add(e.node, MACHINE_EVENT_KINDS[e.kind], f"{e.kind}" + (f": {e.message[:120]}" if e.message else ""))
    for c in f.signals:
        if c.domain == "machine":
            add(c.node, c.confidence, f"{c.category} ({c.rule}): {c.text[:120]}")
    return found, unlocated


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
    return (sig, list(members.values())) if len(members) >= need else None


def _code_actions(f: Facts, why: str) -> tuple[Action, ...]:
    versions = f.s.code_versions
    if len(versions) >= 2:
        prev = versions[-2]
        return (Action("rollback", f"{why}: roll back the code from {versions[-1]} to {prev} (hot update, no "
                                   "machine replaced)", code_version=prev),
                _restart(f, "after the rollback"))
    return (Action("stop", f"{why}: restarting would fail the same way, and no previous code version is "
                           "recorded to roll back to"),
            Action("collect", "for the job's owners", collect=("the failing traceback and the change that "
                                                                "introduced it",)))


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
                base = statistics.median(prev[-f.cfg.metric_baseline_steps:])
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
    lines = sorted((c for c in f.signals if c.domain == "numerics"), key=lambda c: (c.time or 0.0))
    if ev:
        return None, ev[0].time, f"{ev[0].kind} event on {ev[0].node or '?'}: {ev[0].message[:120]}"
    if lines:
        return None, lines[0].time, f"log line: {lines[0].text[:120]}"
    return None


# ----------------------------------------------------------------------------------------------------------
# the rules


def machine_event(f: Facts) -> Decision | None:
    found, unlocated = _machine_signals(f)
    if not found and unlocated:
        why = f"a machine fault was reported without naming the machine ({unlocated[0]})"
        return Decision("machine", 0.5, (Action("collect", why + ": nothing can be evicted yet", collect=(
            "which machine logged it (the log file's host, the agent's node name, nvidia-smi -q on each)",)),),
            (why,))
    if not found:
        return None
    nodes = tuple(sorted(found))
    what = "; ".join(f"{n}: {found[n][1]}" for n in nodes)
    reason = f"high-confidence machine fault ({what}): evict now, skip stop-time checks"
    return Decision("machine", max(c for c, _ in found.values()),
                    (Action("evict", reason, nodes=nodes), _restart(f, "on warm standbys", exclude=nodes)),
                    (f"machine events name {', '.join(nodes)}; the fault follows the machine",), nodes)


def network_repeat(f: Facts) -> Decision | None:
    alerts = _network_alerts(f)
    rep = {n: t for n, t in alerts.items() if len(t) >= f.cfg.network_repeat_count}
    if not rep:
        return None
    nodes = tuple(sorted(rep))
    win = f.cfg.network_window_seconds
    reason = (f"network alerts repeated within {win:g} s ({', '.join(f'{n}: {len(rep[n])}x' for n in nodes)}): "
              "not a flap that recovers by itself")
    return Decision("network", 0.85, (Action("evict", reason, nodes=nodes), _restart(f, "on warm standbys",
                                                                                      exclude=nodes)),
                    (f"ByteRobust tolerates a network alert once and evicts on a repeat within {win:g} s",), nodes)


def code_fault(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is not None and v.kind == "mismatch":
        why = "the ranks disagree on the collectives they call (mismatch): a code or configuration fault"
        return Decision("code", max(v.confidence, 0.7), _code_actions(f, why), (why, "no machine is evicted"))
    if v is not None and v.kind == "crash" and any(e.kind == "widespread-crash" for e in v.evidence):
        why = f"{len(v.culprit_ranks)} ranks failed with the same error: a code, data or configuration fault"
        return Decision("code", max(v.confidence, 0.7), _code_actions(f, why), (why, "no machine is evicted"))
    ws = _widespread(f)
    if ws is None:
        return None
    sig, members = ws
    cat = members[0].category
    who = sorted({str(c.rank) if c.rank is not None else c.node for c in members})
    why = (f"the same {cat} error on {len(members)} ranks/nodes ({', '.join(who[:8])}"
           f"{', ...' if len(who) > 8 else ''}): {members[0].text[:160]}")
    category = {"data": "data", "resources": "resources"}.get(members[0].domain, "code")
    return Decision(category, 0.8, _code_actions(f, why),
                    (why, "an error every rank hits is in the code, data or configuration, not in one machine"))


def crash_not_machine(f: Facts) -> Decision | None:
    culprits = _crash_culprits(f)
    if not culprits:
        return None
    classes = [c for c, _ in culprits]
    if not all(c is not None and c.domain in NOT_A_MACHINE for c in classes):
        return None
    c0 = classes[0]
    assert c0 is not None
    what = culprits[0][1]
    if c0.domain == "resources":
        why = f"the first failure ran out of memory ({what})"
        actions: tuple[Action, ...] = (
            Action("stop", f"{why}: the job asks for more memory than it has; a restart fails the same way"),
            Action("collect", "to size the job", collect=("memory per rank (torch.cuda.max_memory_allocated, RSS)",
                                                          "the batch size and activation checkpointing settings")))
    elif c0.domain == "data":
        why = f"the first failure is a data error ({what})"
        actions = (Action("stop", f"{why}: skip or repair the sample before restarting"),
                   Action("collect", "to find the bad input", collect=("the sample / shard index the error names",)))
    else:
        why = f"the first failure is an error in the code ({what})"
        actions = _code_actions(f, why)
    cat = {"resources": "resources", "data": "data", "numerics": "numerics"}.get(c0.domain, "code")
    return Decision(cat, 0.75, actions, (why, f"classified {c0.category} by rule {c0.rule}: not a machine fault"))


def capture_failed(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind not in MACHINE_VERDICTS or not v.isolate_nodes:
        return None
    kinds = _culprit_evidence(v)
    only_failed = (kinds and all(k in CAPTURE_FAILURE_EVIDENCE for k in kinds)) or (not kinds and v.failed_clusters)
    if not only_failed:
        return None
    ranks = ",".join(map(str, v.culprit_ranks[:16])) or "?"
    why = (f"the only evidence against {', '.join(v.culprit_nodes or v.suspect_nodes)} is a stack capture that "
           f"failed or was cut off (ranks {ranks}): a failed capture is not a fault")
    return Decision("evidence", v.confidence, (Action("collect", why, collect=(
        f"a fresh capture of ranks {ranks} through the in-process hook (faulthandler / SIGUSR2), not ptrace",
        "py-spy's own error for those ranks (ptrace permission, a process in uninterruptible sleep)",
        f"the kernel log of {', '.join(v.culprit_nodes or v.suspect_nodes)} (Xid, hung task)")),),
        (why, "no eviction on a failed capture"), v.isolate_nodes)


def verdict_machine(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind not in MACHINE_VERDICTS or not v.isolate_nodes:
        return None
    if v.confidence < f.cfg.min_verdict_confidence:
        return None
    if v.kind == "crash" and v.crash_n_primary == 0:
        return None  # every failure reports a lost peer: no machine culprit
    nodes = v.isolate_nodes
    lead = v.reasons[0] if v.reasons else f"{v.kind} verdict"
    reason = (f"{v.kind} verdict (confidence {v.confidence:.2f}) isolates {', '.join(nodes)}"
              + (f" (the {v.group_kind.upper()} group{'s' if v.group_count > 1 else ''} of the outliers)"
                 if v.group_kind and v.group_kind != "node" else "")
              + (f"; likeliest culprit {', '.join(v.culprit_nodes)}" if v.culprit_nodes else ""))
    return Decision("machine", v.confidence, (Action("evict", reason, nodes=nodes),
                                              _restart(f, "on warm standbys", exclude=nodes)),
                    (lead, "over-evict the fault domain rather than chase the exact culprit"), nodes)


def low_confidence(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind not in MACHINE_VERDICTS or not v.isolate_nodes:
        return None
    if v.confidence >= f.cfg.min_verdict_confidence and not (v.kind == "crash" and v.crash_n_primary == 0):
        return None
    why = (f"{v.kind} verdict names {', '.join(v.isolate_nodes)} with confidence {v.confidence:.2f} "
           f"(< {f.cfg.min_verdict_confidence:.2f}): too weak to evict a machine")
    return Decision("evidence", v.confidence, (Action("collect", why, collect=(
        "another capture round (5 rounds 10 s apart for a slowdown)",) + AGGREGATION_EVIDENCE[1:]),),
        (why,), v.isolate_nodes)


def numerics(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is not None and v.kind in MACHINE_VERDICTS and v.isolate_nodes:
        return None
    onset = _metric_onset(f)
    if onset is None:
        return None
    step, _, what = onset
    ck = _newest_complete(f.s.checkpoints, before_step=step)
    if ck is not None:
        rb = Action("rollback", f"{what}: roll back to the newest complete checkpoint before the onset",
                    checkpoint=ck.path, step=ck.step)
    elif step is not None:
        rb = Action("rollback", f"{what}: roll back to the newest complete checkpoint before step {step} "
                                "(none recorded here)", step=step)
    else:
        rb = Action("rollback", f"{what}: roll back to the newest complete checkpoint before the first NaN")
    return Decision("numerics", 0.8, (rb, Action("collect", "if it recurs from the same checkpoint", collect=(
        "the data batch at the onset step (skip it on the replay)",) + STOP_TIME_CHECKS[2:])),
        (what, "no machine verdict: the training trajectory itself went wrong"))


def network_once(f: Facts) -> Decision | None:
    alerts = _network_alerts(f)
    if not alerts:
        return None
    nodes = tuple(sorted(alerts))
    why = (f"network alert on {', '.join(nodes)}, not repeated within {f.cfg.network_window_seconds:g} s: "
           "NIC and switch flaps often recover by themselves")
    return Decision("network", 0.6, (Action("tolerate", why, nodes=nodes),),
                    (why, f"evict on alert number {f.cfg.network_repeat_count} within the window"), nodes)


def symptom_only(f: Facts) -> Decision | None:
    v = f.s.verdict
    cascade_crash = v is not None and v.kind == "crash" and v.crash_n_primary == 0
    symptoms = [c for c in f.signals if c.domain == "symptom"]
    if not symptoms and not cascade_crash:
        return None
    if v is not None and v.kind not in ("crash", "inconclusive", "healthy"):
        return None  # a stack or FR verdict already did the aggregation; its own rule decides
    what = symptoms[0].text[:160] if symptoms else "every crashed rank reports a lost peer"
    why = (f"only symptoms of a fault elsewhere ({len(symptoms)} line(s)/exit(s) of collective timeouts, lost "
           f"peers or teardown; first: {what}): a timeout is never a verdict by itself")
    return Decision("symptom", 0.5, (Action("collect", why + "; route to the aggregation analysis",
                                            collect=AGGREGATION_EVIDENCE),), (why,))


def degraded(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind != "degraded":
        return None
    nodes = v.isolate_nodes
    why = (f"degraded: {', '.join(nodes) or 'some machines'} behave unlike their peers (health metrics) but "
           "training is not slower yet")
    return Decision("degraded", v.confidence, (
        Action("tolerate", why + ": no eviction while training keeps pace", nodes=nodes),
        Action("collect", "before the next planned restart", collect=tuple(
            f"{c} on {', '.join(nodes)}" if nodes else c for c in STOP_TIME_CHECKS[:1]) + (
            "step times per rank over the next rounds (a slowdown turns this into fail-slow)",))),
        (why,), nodes)


def imbalance(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind != "imbalance":
        return None
    why = "imbalance: the work is uneven across ranks (stages, shards, sequence lengths); no machine is at fault"
    return Decision("imbalance", v.confidence, (Action("collect", why, collect=(
        "per-rank step and stage times with the parallel layout (--layout tp=..,pp=..,dp=..)",
        "tokens / samples per rank per step (data-loader balance)")),), (why, "no eviction"))


def inconclusive(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind != "inconclusive":
        return None
    why = "inconclusive: the evidence does not single out a machine"
    more = tuple(r for r in v.reasons[:3])
    return Decision("evidence", v.confidence, (Action("collect", why, collect=AGGREGATION_EVIDENCE + (
        "the agent's health events and process exits for the same minutes",)),), (why,) + more)


def healthy(f: Facts) -> Decision | None:
    v = f.s.verdict
    if v is None or v.kind != "healthy":
        return None
    return Decision("healthy", v.confidence, (Action("tolerate", "healthy: no fault found; keep training"),),
                    ("the verdict finds no machine unlike its peers",))


def no_signal(f: Facts) -> Decision | None:
    why = "no verdict, machine event or recognised log line: nothing to act on"
    return Decision("evidence", 0.0, (Action("collect", why, collect=(
        "a verdict: `rankscope diagnose` on the job's dumps or store",) + AGGREGATION_EVIDENCE[:2]),), (why,))


RULES: tuple[LadderRule, ...] = (
    LadderRule("machine-event", "high-confidence machine event -> evict that machine now", machine_event),
    LadderRule("network-repeat", "network alert repeated within the window -> evict", network_repeat),
    LadderRule("code-fault", "mismatch, or the same error on many ranks -> roll back code or stop", code_fault),
    LadderRule("crash-not-machine", "the first failure is code, data or OOM -> no eviction", crash_not_machine),
    LadderRule("capture-failed", "only a failed stack capture -> collect again", capture_failed),
    LadderRule("verdict-machine", "hang/fail-slow/crash with a machine culprit -> evict suspects, restart",
               verdict_machine),
    LadderRule("low-confidence", "machine verdict too weak -> collect", low_confidence),
    LadderRule("numerics", "NaN or 5x loss/grad-norm jump, no machine verdict -> roll back", numerics),
    LadderRule("network-once", "first network alert -> tolerate", network_once),
    LadderRule("symptom-only", "collective timeouts / lost peers only -> aggregation analysis", symptom_only),
    LadderRule("degraded", "degraded -> tolerate, check at the next restart", degraded),
    LadderRule("imbalance", "imbalance -> no eviction, collect timings", imbalance),
    LadderRule("inconclusive", "inconclusive -> no eviction, collect evidence", inconclusive),
    LadderRule("healthy", "healthy -> keep training", healthy),
    LadderRule("no-signal", "nothing recognised -> collect", no_signal),
)


# ----------------------------------------------------------------------------------------------------------
# escalation


def _escalate(f: Facts, d: Decision) -> tuple[str, int, Decision]:
    """The job failed again right after an eviction: widen to both incidents' suspects, then stop."""
    lo = f.now - f.cfg.escalation_window_seconds
    prior = [h for h in f.history if h.executed and h.kind == "evict" and lo <= h.time <= f.now]
    if not prior:
        return "verdict-machine", 0, d
    incidents = sorted({h.incident for h in prior})
    widened_before = any(h.rule == "escalate-widen" for h in prior)
    if len(incidents) == 1 and not widened_before:
        evicted = {n for h in prior for n in h.nodes}
        extra = tuple(n for h in prior for n in h.suspect_nodes if n not in evicted)
        nodes = tuple(dict.fromkeys(d.suspect_nodes + extra))
        why = (f"the job failed again {f.now - max(h.time for h in prior):.0f} s after evicting "
               f"{', '.join(sorted(evicted))} (incident {incidents[0]}): widen the eviction to the suspect groups of "
               f"both incidents ({', '.join(nodes)})")
        if nodes == d.suspect_nodes:
            why += "; the verdict's suspect group is already the widest domain it names"
        return "escalate-widen", 1, Decision(d.category, d.confidence, (
            Action("evict", why, nodes=nodes), _restart(f, "on warm standbys", exclude=nodes)),
            d.reasons + (why,), nodes)
    why = (f"the job failed again after {len(incidents)} eviction(s) within "
           f"{f.cfg.escalation_window_seconds:g} s: stop evicting and run stop-time checks")
    collect = STOP_TIME_CHECKS + ((f"if the checks pass, roll back the code to {f.s.code_versions[-2]}",)
                                  if len(f.s.code_versions) >= 2 else ())
    return "escalate-stop", 2, Decision(d.category, d.confidence, (
        Action("stop", why), Action("collect", "stop-time checks", collect=tuple(
            c + (f" ({', '.join(d.suspect_nodes)})" if i == 0 and d.suspect_nodes else "")
            for i, c in enumerate(collect)))), d.reasons + (why,), d.suspect_nodes)


# ----------------------------------------------------------------------------------------------------------
# entry points


def incident_key(s: Situation, cfg: LadderConfig = LadderConfig(), table: RuleTable = DEFAULT_TABLE) -> str:
    """A stable id for the incident: a hash of the evidence (not of the history, the clock or the plan),
    so re-planning the same incident gives the same key and the executor can refuse to act twice."""
    now = _now(s)
    lo = now - cfg.event_window_seconds
    signals = _signals(s, table)
    onset = None
    if s.metrics:
        f = Facts(s, cfg, table, now, "", (), (), ())
        o = _metric_onset(f)
        onset = (o[0], o[2]) if o else None
    body = {
        "job": s.job,
        "verdict": list(s.verdict.key()) if s.verdict else None,
        "events": sorted(list(e.key()) for e in s.events if lo <= e.time <= now),
        "exits": sorted(list(x.key()) for x in s.exits),
        "signals": sorted([c.rule, c.node, c.rank if c.rank is not None else -1, c.time or 0.0, c.text[:200]]
                          for c in signals),
        "metric_onset": onset,
    }
    raw = json.dumps(body, sort_keys=True, default=str).encode()
    return "inc-" + hashlib.sha256(raw).hexdigest()[:16]


def _now(s: Situation) -> float:
    if s.now is not None:
        return s.now
    times = [e.time for e in s.events] + [x.time for x in s.exits] + [c.time for c in s.logs if c.time is not None]
    times += [m.time for m in s.metrics if m.time is not None]
    if s.verdict is not None:
        times += [t for t in (s.verdict.time, s.verdict.crash_first_time) if t is not None]
    return max(times) if times else 0.0


def _signals(s: Situation, table: RuleTable) -> tuple[Classification, ...]:
    out = list(s.logs)
    for x in s.exits:
        c = table.classify_exit(exit_code=x.exit_code, kind=x.kind, message=x.message, node=x.node, rank=x.rank,
                                time=x.time)
        if c is not None:
            out.append(c)
    return tuple(out)


def evaluate(s: Situation, cfg: LadderConfig = LadderConfig(), *, table: RuleTable = DEFAULT_TABLE,
             rules: Sequence[LadderRule] = RULES) -> Plan:
    """Run the ladder: the first matching rule decides. Pure and deterministic."""
    now = _now(s)
    key = incident_key(s, cfg, table)
    lo = now - cfg.event_window_seconds
    f = Facts(s, cfg, table, now, key, tuple(e for e in s.events if lo <= e.time <= now), _signals(s, table),
              tuple(h for h in s.history if h.incident != key))
    chosen: tuple[str, Decision] | None = None
    also = []
    for rule in rules:
        d = rule.evaluate(f)
        if d is None:
            continue
        if chosen is None:
            chosen = (rule.id, d)
        elif rule.id != "no-signal":
            also.append(rule.id)
    assert chosen is not None  # no-signal always matches
    rule_id, d = chosen
    escalation = 0
    if rule_id == "verdict-machine":
        rule_id, escalation, d = _escalate(f, d)
    inputs = {"events": len(f.events), "exits": len(s.exits), "log_signals": len(s.logs), "history": len(s.history),
              "metrics": len(s.metrics), "checkpoints": len(s.checkpoints), "machines": len(s.machines),
              "standby": len(s.standby)}
    return Plan(job=s.job, incident=key, category=d.category, rule=rule_id, confidence=round(d.confidence, 3),
                actions=d.actions, reasons=d.reasons, also_matched=tuple(also), escalation=escalation, time=now,
                suspect_nodes=d.suspect_nodes, inputs=inputs)
