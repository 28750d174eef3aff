"""One snapshot's stack facts: clusters of every role, the outlier ranks, and why each is suspect.

ByteRobust's aggregation analysis, step by step: split processes by role (:func:`split_roles`; captures
that failed are set apart as collection problems), cluster the trainers (the dominant clusters are
healthy), give each outlier rank a finding, give a missing rank (known to exist, no live process) a
finding when its parallel group waits for it, cluster each child role among its own kind (a stuck
dataloader or checkpoint process makes its rank suspect unless the rank itself is healthy), and note
busy non-main threads. Findings are scored by how likely the rank is the root rather than a
victim (:data:`SCORES`); :mod:`.culprits` and :mod:`rankscope.analytics.faultdomain` take it from there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rankscope.analytics.faultdomain import waited_for
from rankscope.analytics.stacks.clustering import Cluster, cluster
from rankscope.analytics.stacks.collection import CaptureProblem, capture_problem
from rankscope.analytics.stacks.frames import STATES, WAIT_STATES, classify, display
from rankscope.datasets.domain.stacks import ProcStacks
from rankscope.datasets.domain.topology import Topology

CHILD_ROLES = ("dataloader", "checkpoint", "other")
BUSY_INPUT = "waits-on-busy-dataloader"
"""The finding of a rank waiting on its DataLoader whose workers are at work as the other ranks' are."""
STATE_CODE = {st: i for i, st in enumerate(STATES)}
"""Each main-thread state as a small integer (:attr:`SnapshotAnalysis.states`); -1 is no usable stack."""
NO_STACK = -1
_RUNNING_CODES = np.array([STATE_CODE[s] for s in ("compute", "io", "idle")], dtype=np.int8)

# How strongly each observation points at a rank being the root cause (1 = certain).
SCORES = {
    "missing-dump": 1.0,
    "missing-shared-wait": 0.85,  # no file, its peers waiting where every rank waits: maybe a collection gap
    "child-stuck": 0.95,
    "not-in-collective": 0.9,
    "local-wait": 0.8,
    "waits-on-dataloader": 0.7,
    "waits-on-busy-dataloader": 0.3,  # its workers at work, as the other ranks' are: slow input, not stuck
    "waits-on-checkpoint": 0.7,
    "waits-on-device": 0.8,
    "child-outlier": 0.5,
    "collective-wait": 0.25,
    "p2p-wait": 0.2,
}


@dataclass(frozen=True)
class Finding:
    """Why one rank is suspect."""

    rank: int
    kind: str  # a key of SCORES
    detail: str

    @property
    def score(self) -> float:
        return SCORES[self.kind]


@dataclass(frozen=True, eq=False)
class SnapshotAnalysis:
    """One snapshot: clusters of every role, outliers, missing ranks and per-rank findings.

    Captures that failed (py-spy's error output, an empty file, a dump cut off as the process was
    stopped) are no evidence: they are not clustered and give no finding; they are listed in
    ``problems``. ``missing_ranks`` are ranks known to exist with no live process to dump (no dump,
    or py-spy found the process gone); only those whose parallel group waits for them are findings.
    """

    snapshot: int
    clusters: tuple[Cluster, ...]
    n_trainers: int  # trainers with a usable stack
    healthy_trainers: int
    outlier_ranks: tuple[int, ...]
    missing_ranks: tuple[int, ...]
    findings: tuple[Finding, ...]  # best finding per outlier rank
    thread_notes: tuple[tuple[int, str], ...] = ()  # (rank, words) for busy non-main threads of outliers
    cut: tuple[int, ...] = ()  # ranks whose dump was cut off as they died: present, no evidence
    problems: tuple[CaptureProblem, ...] = ()  # captures that gave no evidence (failed, empty, cut)
    states: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8))  # per rank, STATE_CODE or -1
    busy_input: tuple[int, ...] = ()  # ranks waiting on their DataLoader whose workers are at work (as others')

    @property
    def dominant_fraction(self) -> float:
        total = self.n_trainers + len(self.missing_ranks)
        return self.healthy_trainers / total if total else 0.0

    def best(self) -> dict[int, Finding]:
        return {f.rank: f for f in self.findings}

    def state_of(self, rank: int) -> str | None:
        """The main-thread state of ``rank``, or None without a usable stack."""
        if not 0 <= rank < self.states.size or self.states[rank] < 0:
            return None
        return STATES[int(self.states[rank])]

    def dominant_clusters(self) -> list[Cluster]:
        """The healthy (dominant) trainer clusters; every trainer cluster when none is healthy."""
        healthy = [c for c in self.clusters if c.role == "trainer" and c.healthy]
        return healthy or [c for c in self.clusters if c.role == "trainer"]

    def dominant_states(self) -> dict[str, int]:
        """Ranks per state in the dominant trainer clusters (:meth:`dominant_clusters`)."""
        out: dict[str, int] = {}
        for c in self.dominant_clusters():
            out[c.state] = out.get(c.state, 0) + c.size
        return out

    @property
    def blocked_fraction(self) -> float:
        """The share of the dominant ranks blocked in a wait (collective, p2p, their DataLoader or checkpoint
        writer). A stuck job is one whose majority waits; a majority running its own code was not stuck."""
        dom = self.dominant_states()
        total = sum(dom.values())
        return sum(n for st, n in dom.items() if st in WAIT_STATES) / total if total else 0.0

    @property
    def largest_share(self) -> float:
        """The share of the trainers with a stack that sit in the largest trainer cluster."""
        sizes = [c.size for c in self.clusters if c.role == "trainer"]
        return max(sizes) / self.n_trainers if sizes and self.n_trainers else 0.0

    @property
    def running_fraction(self) -> float:
        """The share of all trainers with a stack that run their own code (compute, I/O, a local sleep). A hang
        spreads: within seconds every rank that depends on the stuck one blocks, so a stuck job leaves few
        ranks running; a running job caught at one instant leaves many."""
        if not self.n_trainers:
            return 0.0
        return int(np.count_nonzero(np.isin(self.states, _RUNNING_CODES))) / self.n_trainers

    @property
    def startup_fraction(self) -> float:
        """The share of trainers with a stack that are still starting (importing, joining the process group)."""
        if not self.n_trainers:
            return 0.0
        return int(np.count_nonzero(self.states == STATE_CODE["startup"])) / self.n_trainers


_STATE_KIND = {
    "compute": "not-in-collective",
    "io": "not-in-collective",
    "empty": "not-in-collective",
    "idle": "local-wait",
    "dataloader-wait": "waits-on-dataloader",
    "checkpoint-wait": "waits-on-checkpoint",
    "device-wait": "waits-on-device",
    "backward": "not-in-collective",
    "collective": "collective-wait",
    "p2p": "p2p-wait",
    "startup": "not-in-collective",
}


_DETAIL = {
    "not-in-collective": "not waiting in any collective: in {}",
    "local-wait": "blocked locally, not in a collective: in {}",
    "waits-on-dataloader": "main thread waits on its dataloader: in {}",
    "waits-on-busy-dataloader": "main thread waits on its dataloader, whose workers are at work as the other "
    "ranks' are (the input pipeline is slow, not stuck): in {}",
    "waits-on-checkpoint": "main thread waits on its checkpoint writer: in {}",
    "waits-on-device": "main thread waits on its GPU, not in a collective: in {}",
    "collective-wait": "waits in a collective the healthy ranks are not in: {}",
    "p2p-wait": "waits in a pipeline send/recv: {}",
}


@dataclass(frozen=True)
class _Roles:
    """One snapshot's processes by role: one trainer per rank with a usable stack, children by role, and
    the captures that gave no evidence."""

    trainers: list[ProcStacks]
    children: dict[str, list[ProcStacks]]
    seen: set[int]  # trainer ranks with any dump, usable or not
    cut: list[int]
    problems: list[CaptureProblem]
    gone: list[int]  # trainer ranks whose process was gone (or its listed dump absent) when captured


def split_roles(procs: Sequence[ProcStacks]) -> _Roles:
    """The first process of each trainer rank; captures that gave no evidence (failed, empty, cut off as the
    process died) are kept apart with why; children by role (a child without a usable stack is dropped)."""
    trainers: list[ProcStacks] = []
    seen: set[int] = set()
    children: dict[str, list[ProcStacks]] = defaultdict(list)
    cut: list[int] = []
    problems: list[CaptureProblem] = []
    gone: list[int] = []
    for p in procs:
        if p.role != "trainer":
            if p.status in ("failed", "cut"):
                if p.status == "failed":
                    problems.append(capture_problem(p))
                continue
            children[p.role if p.role in CHILD_ROLES else "other"].append(p)
            continue
        if p.rank is None or p.rank in seen:
            continue
        seen.add(p.rank)
        if p.status in ("failed", "cut"):
            prob = capture_problem(p)
            problems.append(prob)
            if p.status == "cut":
                cut.append(p.rank)
            elif prob.gone:
                gone.append(p.rank)
        else:
            trainers.append(p)
    return _Roles(trainers, children, seen, cut, problems, gone)


class _Findings(dict[int, Finding]):
    """The strongest finding per rank."""

    def add(self, f: Finding) -> None:
        cur = self.get(f.rank)
        if cur is None or f.score > cur.score:
            self[f.rank] = f


def _trainer_findings(clusters: Sequence[Cluster], findings: _Findings) -> int:
    """A finding for every rank of an outlier trainer cluster; the number of healthy trainers."""
    healthy = 0
    for c in clusters:
        if c.healthy:
            healthy += c.size
            continue
        kind = _STATE_KIND.get(c.state, "not-in-collective")
        for r in c.ranks:
            findings.add(Finding(r, kind, _DETAIL[kind].format(c.state_frame)))
    return healthy


def _child_findings(
    children: dict[str, list[ProcStacks]],
    healthy_rank: np.ndarray,
    *,
    lines: bool,
    dominance: float,
    start_id: int,
    replica_of: np.ndarray | None,
    findings: _Findings,
) -> list[Cluster]:
    """Cluster each child role among its own kind; a stuck or odd child makes its trainer rank suspect, unless
    the trainer itself is in a healthy state (a DataLoader worker reading ahead, a checkpoint writer saving
    while training goes on: not what the job waits for)."""
    out: list[Cluster] = []
    world = healthy_rank.size
    for role in CHILD_ROLES:
        kids = children.get(role)
        if not kids:
            continue
        cc = cluster(
            kids, role=role, lines=lines, dominance=dominance, start_id=start_id + len(out), replica_of=replica_of
        )
        out.extend(cc)
        for c in (c for c in cc if not c.healthy):
            stuck = c.state in ("io", "compute")
            for i in c.members:
                p = kids[i]
                if p.rank is None or not 0 <= p.rank < world or healthy_rank[p.rank]:
                    continue
                if stuck:
                    findings.add(
                        Finding(p.rank, "child-stuck", f"its {role} process (pid {p.pid}) is stuck: in {c.state_frame}")
                    )
                else:
                    findings.add(
                        Finding(
                            p.rank,
                            "child-outlier",
                            f"its {role} process (pid {p.pid}) differs from its peers: in {c.state_frame}",
                        )
                    )
    return out


def _busy_loaders(
    workers: Sequence[ProcStacks], clusters: Sequence[Cluster], states: np.ndarray, findings: _Findings
) -> tuple[int, ...]:
    """The ranks whose main thread waits on their DataLoader while their own workers were captured at work
    (reading, computing) in the state the other ranks' workers share (their dominant cluster), none of them
    stuck apart: their input pipeline is producing, slowly, which a snapshot of a data-bound job shows for
    whichever ranks are next to wait. No evidence against their machines: such an outlier's finding says so
    (a worker stuck apart keeps its own finding)."""
    if not workers:
        return ()
    busy = {
        workers[i].rank
        for c in clusters
        if c.role == "dataloader" and c.healthy and c.state in ("compute", "io") and len(set(c.ranks)) > 1
        for i in c.members
    }
    busy -= {workers[i].rank for c in clusters if c.role == "dataloader" and not c.healthy for i in c.members}
    waiting = {r for r in busy if r is not None and 0 <= r < states.size and states[r] == _LOADER_WAIT}
    for r in waiting & set(findings):
        f = findings[r]
        if f.kind == "waits-on-dataloader":
            findings[r] = Finding(r, BUSY_INPUT, _DETAIL[BUSY_INPUT].format(f.detail.rsplit(": in ", 1)[-1]))
    return tuple(sorted(waiting))


_LOADER_WAIT = STATE_CODE["dataloader-wait"]


def _thread_notes(outliers: Sequence[int], trainers: Sequence[ProcStacks]) -> tuple[tuple[int, str], ...]:
    """Busy non-main threads of outlier ranks, in words."""
    by_rank = {p.rank: p for p in trainers}
    notes = []
    for r in outliers:
        p = by_rank.get(r)
        for t in p.others if p is not None else ():
            state, i = classify(t.frames, role="other")
            if state in ("io", "compute") and i >= 0:
                notes.append(
                    (r, f"thread {t.thread_name or t.thread_id!s} is running ({state}): {display(t.frames[i])}")
                )
    return tuple(notes)


def _states(clusters: Sequence[Cluster], world: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: its main thread's state code (-1 without a usable stack) and whether it is healthy."""
    states = np.full(world, NO_STACK, dtype=np.int8)
    healthy = np.zeros(world, dtype=bool)
    for c in clusters:
        if c.role != "trainer" or not c.ranks:
            continue
        r = np.asarray(c.ranks, dtype=np.int64)
        r = r[(r >= 0) & (r < world)]
        states[r] = STATE_CODE.get(c.state, STATE_CODE["compute"])
        if c.healthy:
            healthy[r] = True
    return states, healthy


def _missing_findings(
    missing: np.ndarray,
    states: np.ndarray,
    healthy: np.ndarray,
    topology: Topology,
    findings: _Findings,
    *,
    stopped: set[int],
    absent: set[int],
    gone: set[int],
) -> None:
    """A finding for each rank without a live process whose parallel group waits for it.

    With no file at all, the absence may be the collection's (py-spy timed out, a node's copy was lost): when
    the peers that wait for it wait where the healthy majority waits (the job-wide collective every rank
    reaches behind any laggard), they would wait there with it too, so that absence is weaker evidence
    (``missing-shared-wait``) than a process seen gone or stopped, or peers held in a wait of their own."""
    has, coll, p2p = states >= 0, states == STATE_CODE["collective"], states == STATE_CODE["p2p"]
    grad = states == STATE_CODE["backward"]
    waits = waited_for(missing, has, coll, p2p, topology, grad)
    own = (
        waited_for(missing, has, coll & ~healthy, p2p & ~healthy, topology, grad & ~healthy) if healthy.any() else waits
    )
    for r, why, own_why in zip(missing.tolist(), waits, own):
        if not why:
            continue
        if r in stopped:
            what = "its process is stopped (SIGSTOP, state T: py-spy could not sample it; it runs no code)"
        elif r in absent:
            what = "its dump is listed in the manifest but absent (its machine unreachable, or it crashed)"
        elif r in gone:
            what = "its process was gone when captured (crashed, exited, or unreachable)"
        else:
            what = "no stack dump for this rank (crashed, exited, or unreachable)"
        if own_why or r in stopped or (r in gone and r not in absent):
            findings.add(Finding(int(r), "missing-dump", f"{what}, and {own_why or why}"))
        else:
            where = "where the healthy majority waits"
            findings.add(Finding(int(r), "missing-shared-wait", f"{what}, and {why}, {where}"))


def analyze_snapshot(
    procs: Sequence[ProcStacks],
    topology: Topology,
    *,
    snapshot: int = 0,
    lines: bool = False,
    dominance: float = 0.5,
    expected: Sequence[int] | np.ndarray | None = None,
) -> SnapshotAnalysis:
    """Cluster one snapshot and explain every outlier rank.

    ``expected``: the ranks known to exist from a source independent of the dumps (the layout's world, a
    manifest, the hook's identities, Flight Recorder); every rank of the topology when not given. A rank
    of it without a live process to dump is *missing*; it is a finding only when its parallel group waits
    for it (a gap in the dumps alone is a collection problem, not evidence).
    """
    roles = split_roles(procs)
    world = topology.world_size
    replica_of = topology.coords["dp"] if topology.sizes["dp"] > 1 else None
    clusters = cluster(roles.trainers, role="trainer", lines=lines, dominance=dominance, replica_of=replica_of)
    findings = _Findings()
    healthy = _trainer_findings(clusters, findings)
    states, healthy_rank = _states(clusters, world)
    known = topology.ranks if expected is None else np.asarray(expected, dtype=np.int64)
    stopped = {p.rank for p in roles.problems if p.kind == "stopped" and p.rank is not None}  # in state T
    absent = {p.rank for p in roles.problems if p.kind == "absent" and p.rank is not None}
    gone = set(roles.gone)
    known = np.union1d(known, np.fromiter(stopped, dtype=np.int64, count=len(stopped)))  # its own capture says so
    known = known[(known >= 0) & (known < world)]
    gone |= stopped  # a stopped process runs no code: for its waiting peers it is as absent as a dead one
    dumped = np.fromiter((r for r in roles.seen if r not in gone), dtype=np.int64, count=len(roles.seen) - len(gone))
    missing = np.setdiff1d(known, dumped)
    if missing.size:
        _missing_findings(missing, states, healthy_rank, topology, findings, stopped=stopped, absent=absent, gone=gone)
    clusters.extend(
        _child_findings(
            roles.children,
            healthy_rank,
            lines=lines,
            dominance=dominance,
            start_id=len(clusters),
            replica_of=replica_of,
            findings=findings,
        )
    )
    busy = _busy_loaders(roles.children.get("dataloader", ()), clusters, states, findings)
    outliers = tuple(sorted(findings))
    return SnapshotAnalysis(
        snapshot,
        tuple(clusters),
        len(roles.trainers),
        healthy,
        outliers,
        tuple(int(r) for r in missing.tolist()),
        tuple(findings[r] for r in outliers),
        _thread_notes(outliers, roles.trainers),
        tuple(sorted(roles.cut)),
        tuple(roles.problems),
        states,
        busy,
    )
