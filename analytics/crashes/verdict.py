"""Crash verdicts: which rank failed first, and which failures only followed it.

When one rank of a collective job dies, its peers fail after it: gloo raises "Connection closed by
peer" within a second, NCCL's watchdog aborts the communicator after its timeout, torchrun
SIGTERMs the rest. Reading every rank's traceback, the root cause drowns in the cascade. The rule
here is the one people apply by hand (and torchrun's "first observed failure"), made explicit:

1. Keep the latest incident: abnormal exits at most ``incident_window_seconds`` (1 h, longer than any
   collective timeout) before the last one, the earliest exit per rank.
2. An exit whose error says a *peer* failed (connection closed or reset by peer, communicator
   aborted, collective timeout, broken pipe, ...) is a **cascade**; the others are **primary**.
3. The culprit is the earliest primary exit (plus any other primary within ``tie_seconds``, as clocks of
   different hosts differ by milliseconds). With no primary at all, the earliest exit, at lower
   confidence. A rank that vanished without a record (SIGKILL, the OOM killer) is primary.
   A bare abort (SIGABRT with no error of its own) no earlier than its peers' collective timeouts is cascade
   too: that is how the NCCL watchdog takes a rank down, and a process still alive when the others' waits
   timed out did not cause them by dying (if it hung, the hang's evidence names it).
4. The same primary error on many ranks (``widespread_fraction`` of the world, at least 2) is a
   code, data or configuration fault, not a machine: the verdict names the ranks and evicts nothing.
   So is a first failure whose error says the ranks disagreed on a collective (:data:`CODE_FAULT_PATTERNS`:
   gloo's "collective mismatch", torch's "Detected mismatch between collectives").

Pure: :class:`~rankscope.datasets.domain.exits.ProcessExit` records and a topology in, a
:class:`~rankscope.analytics.verdict.Verdict` (``crash``) out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rankscope.analytics.verdict import (
    Evidence,
    Severity,
    SuspectGroup,
    Verdict,
    merge_nodes,
    rank_ranges,
)
from rankscope.config import CrashConfig
from rankscope.datasets.domain.exits import ProcessExit
from rankscope.datasets.domain.topology import Topology

CASCADE_PATTERNS = (
    r"connection (?:closed|reset) by peer",
    r"remote (?:worker|process|peer)",
    r"broken pipe",
    r"communicator (?:was )?abort",
    r"nccl.*abort",
    r"watchdog caught collective operation timeout",
    r"(?:collective|operation|recv|send|wait).{0,40}tim(?:ed )?out",
    r"timed out (?:waiting|after)",
    r"socket (?:closed|timeout)",
    r"distnetworkerror",
    r"sigterm|terminated by signal 15|received signal 15",
    r"peer .{0,40}(?:exited|died|crashed|failed)",
)
_CASCADE = re.compile("|".join(f"(?:{p})" for p in CASCADE_PATTERNS), re.I)
CODE_FAULT_PATTERNS = (
    r"collective mismatch",  # gloo: "Is there a distributed collective mismatch in your code?"
    r"mismatch between collectives",  # TORCH_DISTRIBUTED_DEBUG=DETAIL's check
    r"detected mismatch",
    r"received data size doesn't match expected size",
)
"""Errors that say the program itself is wrong (the ranks called different collectives or sizes): the rank
that raised it only noticed first; no machine is at fault."""
_CODE_FAULT = re.compile("|".join(f"(?:{p})" for p in CODE_FAULT_PATTERNS), re.I)
_NUMBERS = re.compile(r"\d+")
_UNINFORMATIVE = re.compile(r"^\s*(?:exit code -?\d+|<N/A>)?\s*$|^\s*To enable traceback see", re.I)
"""An exit known only by its exit code or torchrun's placeholder: not an error two ranks can share."""


_STOPS = frozenset({"KeyboardInterrupt"})  # someone stopped the job on purpose: not a machine's fault


def is_cascade(e: ProcessExit) -> bool:
    """True when ``e``'s error says a peer failed first (a consequence, not a cause), or the job was
    stopped on purpose (Ctrl-C)."""
    if e.kind == "vanished":
        return False
    if e.kind.rsplit(".", 1)[-1] in _STOPS:
        return True
    return bool(_CASCADE.search(f"{e.kind}: {e.message}"))


_OWN_SIGNALS = ("Segmentation fault", "Bus error", "Illegal instruction", "Floating point exception")
_WAITS = re.compile(r"all_reduce|all_gather|reduce_scatter|broadcast|barrier|\bwait|recv|send|all_to_all|synchronize")


_TIMED_OUT = re.compile(r"time ?out|timed out", re.I)


def _bare_abort(e: ProcessExit) -> bool:
    """An abort known only as such: SIGABRT with no error of its own (torchrun's "Signal 6 (SIGABRT) received
    by PID ..."), or faulthandler's "Fatal Python error: Aborted"."""
    if e.kind == "Fatal Python error":
        return e.message.startswith("Aborted")
    return e.kind == "SIGABRT" and (e.message.startswith("Signal 6") or bool(_UNINFORMATIVE.search(e.message)))


def _aborted_with_timeouts(incident: Sequence[ProcessExit], tie_s: float) -> set[int]:
    """The ids of the bare aborts no earlier than the first collective timeout among the cascade (within
    ``tie_s``): the watchdog's teardown of a rank that was alive through its peers' waits, not their cause."""
    timeouts = [e.time for e in incident if e.timed and is_cascade(e) and _TIMED_OUT.search(e.message)]
    if not timeouts:
        return set()
    first = min(timeouts)
    return {id(e) for e in incident if e.timed and _bare_abort(e) and e.time >= first - tie_s}


def _own_fault(e: ProcessExit) -> bool:
    """A failure of the process itself (a fault signal in its own code, an exception that is no cascade); not
    an abort (SIGABRT is how the NCCL watchdog takes a victim down) nor anything raised inside a wait."""
    if e.kind == "Fatal Python error" and not e.message.startswith(_OWN_SIGNALS):
        return False
    return not is_cascade(e) and not _WAITS.search(e.where or "")


def _signature(e: ProcessExit) -> str:
    """The error with its numbers blanked: the same fault on different ranks compares equal."""
    return f"{e.kind}: {_NUMBERS.sub('N', ' '.join(e.message.split())[:200])}"


def latest_incident(exits: Sequence[ProcessExit], window_s: float, *, anchor: float | None = None) -> list[ProcessExit]:
    """The trainer exits of the latest incident, the earliest per rank, oldest first.

    ``anchor`` (the time of the evidence being diagnosed, e.g. the latest stack capture) keeps
    only exits from ``window_s`` before it to ``window_s`` after it: a crash from an earlier run
    of the job must not explain today's hang.
    """
    trainers = [e for e in exits if e.role == "trainer"]
    if anchor is not None:
        trainers = [e for e in trainers if anchor - window_s <= e.time <= anchor + window_s]
    if not trainers:
        return []
    last = max(e.time for e in trainers)
    first_per_rank: dict[int, ProcessExit] = {}
    for e in sorted(trainers, key=lambda e: e.time):
        if e.time >= last - window_s:
            first_per_rank.setdefault(e.rank, e)
    return sorted(first_per_rank.values(), key=lambda e: (e.time, e.rank))


@dataclass(frozen=True)
class CrashFacts:
    """The latest incident's exits, split into primary failures and their cascade, before a decision."""

    incident: tuple[ProcessExit, ...]  # earliest exit per rank, oldest first
    primary: tuple[ProcessExit, ...]
    cascade: tuple[ProcessExit, ...]
    world: int
    node_of_rank: Mapping[int, str]
    widespread: tuple[ProcessExit, ...]  # the same primary error on many ranks (a code fault), or ()
    culprits: tuple[ProcessExit, ...]  # the first failure (and ties), when not widespread

    def node_of(self, e: ProcessExit) -> str:
        return self.node_of_rank[e.rank]

    @property
    def torn_down(self) -> bool:
        """No primary failure, and the watchdog's aborts among the cascade: a hang torn down at its timeouts."""
        return not self.primary and any(map(_bare_abort, self.cascade))


def facts(
    exits: Sequence[ProcessExit],
    topology: Topology | None,
    *,
    config: CrashConfig | None = None,
    anchor: float | None = None,
) -> CrashFacts | None:
    """The latest incident in ``exits`` (near ``anchor`` when given), or None when no trainer exited abnormally."""
    cfg = config or CrashConfig()
    incident = latest_incident(exits, cfg.incident_window_seconds, anchor=anchor)
    if not incident:
        return None
    world = topology.world_size if topology is not None else max(e.rank for e in incident) + 1
    incident = [e for e in incident if 0 <= e.rank < world]
    if any(e.time_source != "untimed" and not is_cascade(e) for e in incident):
        incident = [e for e in incident if e.time_source != "untimed"]  # a timed first failure: order known
    else:  # an untimed failure explains the cascade only when it is the process's own fault
        incident = [e for e in incident if e.time_source != "untimed" or _own_fault(e)]
    if not incident:
        return None
    node_of = {
        e.rank: (
            topology.node_names[int(topology.node_index[e.rank])]
            if topology is not None
            else e.node or f"rank-{e.rank}"
        )
        for e in incident
    }
    torn_down = _aborted_with_timeouts(incident, cfg.tie_seconds)
    primary = tuple(e for e in incident if not is_cascade(e) and id(e) not in torn_down)
    cascade = tuple(e for e in incident if is_cascade(e) or id(e) in torn_down)
    by_sig: dict[str, list[ProcessExit]] = {}
    for e in primary:
        if not _UNINFORMATIVE.search(e.message):  # "exit code 1" on many ranks says nothing of a shared cause
            by_sig.setdefault(_signature(e), []).append(e)
    widespread: list[list[ProcessExit]] = [
        g for g in by_sig.values() if len(g) >= max(2, cfg.widespread_fraction * world) and g[0].kind != "vanished"
    ]
    biggest: list[ProcessExit] = max(widespread, key=len) if widespread else []
    pool = primary or tuple(incident)
    culprits = tuple(e for e in pool if e.time - pool[0].time <= cfg.tie_seconds)
    if not biggest and any(_CODE_FAULT.search(f"{e.kind}: {e.message}") for e in culprits):
        biggest = list(culprits)  # a code fault the first failure reports itself: nothing to evict
    return CrashFacts(
        tuple(incident),
        primary,
        cascade,
        world,
        node_of,
        tuple(biggest),
        culprits,
    )


def verdict(f: CrashFacts, topology: Topology | None, *, job: str = "") -> Verdict:
    """``crash``: a code fault when the same error is widespread (``mismatch`` when the error says the ranks
    disagreed on a collective), else the first failure's machine.
    ``details["crash"]["n_primary"] == 0`` means every failure reported a lost peer or a deliberate stop:
    context for another verdict, not a cause."""
    if f.widespread:
        return _widespread(f, job)
    return _first_failure(f, topology, job)


def _details(f: CrashFacts) -> dict[str, object]:
    t0 = f.incident[0].time
    prim = {id(e) for e in f.primary}
    return {
        "first_failure_time": t0,
        "exits": [
            {
                "rank": e.rank,
                "node": f.node_of(e),
                "after_s": round(e.time - t0, 3),
                "kind": e.kind,
                "message": " ".join(e.message.split())[:300],
                "where": e.where,
                "cause": "primary" if id(e) in prim else "cascade",
                "time_source": e.time_source,
            }
            for e in f.incident
        ],
        "n_primary": len(f.primary),
        "n_cascade": len(f.cascade),
    }


def _widespread(f: CrashFacts, job: str) -> Verdict:
    g = f.widespread
    ranks = tuple(sorted(e.rank for e in g))
    severity, kind = Severity.CRASH, "widespread-crash"
    if _CODE_FAULT.search(f"{g[0].kind}: {g[0].message}"):
        severity, kind = Severity.MISMATCH, "collective-mismatch"
        what = f"Rank(s) {rank_ranges(ranks)} failed first ({g[0].describe()})"
        reasons: tuple[str, ...] = (
            f"{what}: the ranks disagreed on a collective (op, size or dtype), a code fault, not a machine; "
            "nothing to evict. Fix the program (TORCH_DISTRIBUTED_DEBUG=DETAIL names the collectives).",
        )
    else:
        reasons = (
            f"{len(g)} of {f.world} ranks failed with the same error ({g[0].describe()}): a code, data "
            "or configuration fault, not a machine; nothing to evict.",
        )
    evidence = (Evidence("events", kind, g[0].describe(), ranks, merge_nodes([f.node_of(e) for e in g])),)
    return Verdict(
        severity,
        job=job,
        confidence=0.8,
        suspect_ranks=tuple(sorted(e.rank for e in f.incident)),
        # the ranks whose check caught a mismatch are not the rank whose sequence went astray (unknown here)
        culprit_ranks=() if severity == Severity.MISMATCH else ranks,
        reasons=reasons,
        evidence=evidence,
        sources=("events",),
        world_size=f.world,
        details={"crash": _details(f)},
    )


def _first_failure_words(f: CrashFacts) -> tuple[float, list[str]]:
    """The confidence and the reasons of a first-failure verdict."""
    first, culprits, cascade = f.culprits[0], f.culprits, f.cascade
    later = [e for e in f.incident if e not in culprits]
    gap = (later[0].time - first.time) if later else None
    if f.primary:
        confidence = 0.95 if (gap is None or gap >= 0.5) and len(culprits) == 1 else 0.8
        if first.time_source == "detected" and later:
            confidence = min(confidence, 0.8)  # its time is when the agent noticed, not when it died
        reasons = [f"Rank {first.rank} on {f.node_of(first)} failed first: {first.describe()}."]
        if not first.timed:  # only which failures are a cascade is known
            confidence = min(confidence, 0.7)
            why = (
                "no failure carries a time: their order is unknown"
                if first.time_source == "unordered"
                else "it carries no time; every failure with a time reports a lost peer"
            )
            reasons = [
                f"Rank {first.rank} on {f.node_of(first)} is the failure that does not report a lost peer: "
                f"{first.describe()} ({why})."
            ]
    elif all(e.kind.rsplit(".", 1)[-1] in _STOPS for e in f.incident):
        confidence = 0.5
        reasons = [
            f"Every failure is a deliberate stop ({first.kind}: Ctrl-C, or a SIGINT to the job), the earliest "
            f"on rank {first.rank}: no fault of a machine."
        ]
    else:
        confidence = 0.5
        torn = " or is an abort at its peers' collective timeouts" if f.torn_down else ""
        reasons = [
            f"Every failure reports a lost peer{torn}; the earliest is rank {first.rank} on {f.node_of(first)} "
            f"({first.describe()}). The root cause left no record here (its process may have been killed)."
        ]
    for e in culprits[1:3]:
        reasons.append(f"Rank {e.rank} on {f.node_of(e)} failed at the same moment: {e.describe()}.")
    if len(culprits) > 3:
        rest = culprits[3:]
        reasons.append(
            f"{len(rest)} more rank(s) ({rank_ranges(e.rank for e in rest)[:200]}) failed at the same moment "
            f"({_short_kind(rest[0])})."
        )
    if cascade and f.primary:
        lo, hi = min(e.time for e in cascade) - first.time, max(e.time for e in cascade) - first.time
        when = _when(lo, hi)
        if not first.timed:
            when = "too"
        lost = [e for e in cascade if is_cascade(e)]
        peer = f"with errors that report a lost peer ({_short_kind(lost[0])})" if lost else ""
        aborts = f"{len(cascade) - len(lost)} aborted at their peers' collective timeouts (the watchdog's teardown)"
        how = f" {peer}" if len(lost) == len(cascade) else f", {len(lost)} {peer}, {aborts}" if lost else f", {aborts}"
        reasons.append(
            f"{len(cascade)} other rank(s) ({rank_ranges(e.rank for e in cascade)}) failed {when}{how}: a cascade, "
            "not separate faults."
        )
    others = [e for e in f.primary if e not in culprits]
    if others:
        reasons.append(
            f"{len(others)} later failure(s) not recognised as a cascade: ranks "
            f"{rank_ranges(e.rank for e in others)} (first: {others[0].describe()})."
        )
    return confidence, reasons


def _when(lo: float, hi: float) -> str:
    """When the cascade failed, from its earliest and latest offsets to the first failure (another host's clock
    may put some of it, or all of it, before)."""

    def one(x: float) -> str:
        return f"{x:.1f} s later" if x >= 0 else f"{-x:.1f} s before it (by another clock)"

    if round(lo, 1) == round(hi, 1):
        return one(lo)
    if lo >= 0:
        return f"{lo:.1f}-{hi:.1f} s later"
    if hi < 0:
        return f"{-hi:.1f}-{-lo:.1f} s before it (by another clock)"
    return f"between {-lo:.1f} s before and {hi:.1f} s after it"


def _first_failure(f: CrashFacts, topology: Topology | None, job: str) -> Verdict:
    confidence, reasons = _first_failure_words(f)
    if f.torn_down:
        # the ranks ended together at their collective timeouts: the earliest of them is no cause, and naming
        # its machine would evict by the order of a teardown; the hang's own evidence names the culprit
        return _torn_down(f, confidence, reasons, job)
    nodes = merge_nodes([f.node_of(e) for e in f.culprits])
    ranks = tuple(sorted(e.rank for e in f.culprits))
    evidence = [
        Evidence(
            "events", "first-failure" if f.primary else "earliest-failure", e.describe(), (e.rank,), (f.node_of(e),)
        )
        for e in f.culprits
    ]
    if f.cascade:
        evidence.append(_cascade_evidence(f, merge_nodes([f.node_of(e) for e in f.cascade])))
    group = None
    if topology is not None:
        idx = tuple(sorted({int(topology.node_index[r]) for r in ranks}))
        group_ranks = tuple(int(r) for r in topology.ranks if int(topology.node_index[r]) in idx)
        group = SuspectGroup("node", idx, group_ranks, nodes)
    return Verdict(
        Severity.CRASH,
        job=job,
        confidence=confidence,
        suspect_nodes=nodes,
        culprit_nodes=nodes,
        suspect_ranks=ranks,
        culprit_ranks=ranks,
        reasons=tuple(reasons),
        suspect_group=group,
        evidence=tuple(evidence),
        sources=("events",),
        world_size=f.world,
        details={"crash": _details(f)},
    )


def _torn_down(f: CrashFacts, confidence: float, reasons: list[str], job: str) -> Verdict:
    """Every exit a collective timeout or the watchdog's abort at them: a hang torn down, its culprit unknown here."""
    reasons.append(
        "The job was torn down at its collective timeouts (a hang): which rank it waited for is not in the exits; "
        "the stacks, Flight Recorder dumps or the watchdog lines' counters name it. Nothing evicted from the exits."
    )
    return Verdict(
        Severity.CRASH,
        job=job,
        confidence=min(confidence, 0.3),
        suspect_ranks=tuple(sorted(e.rank for e in f.culprits)),
        reasons=tuple(reasons),
        evidence=(_cascade_evidence(f, ()),),
        sources=("events",),
        world_size=f.world,
        details={"crash": _details(f)},
    )


def _cascade_evidence(f: CrashFacts, nodes: tuple[str, ...]) -> Evidence:
    """The cascade as evidence, in the words of its first error that reports a lost peer."""
    kind = _short_kind(next((e for e in f.cascade if is_cascade(e)), f.cascade[0]))
    return Evidence("events", "cascade-failure", kind, tuple(e.rank for e in f.cascade), nodes, 0.2)


def _short_kind(e: ProcessExit) -> str:
    m = _CASCADE.search(f"{e.kind}: {e.message}")
    return f"{e.kind}: ...{m.group(0)}..." if m else e.kind
