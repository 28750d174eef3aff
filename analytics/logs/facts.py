"""What the logs prove: a hang's time evidence, and whose collective sequence stopped first.

NCCL's watchdog fires after a collective ran past its timeout: every member that *entered* the collective
reports ``Watchdog caught collective operation timeout: WorkNCCL(SeqNum=S, ...)`` with the group's counters
(``last enqueued work: E``). The member everyone waits for is the one that never enqueued work S: its own
counter for that group is below S (it printed it in a ``failure detected`` or heartbeat ``dump signal``
line), or it printed no timeout at all while every peer did. Waits chain across groups (a data-parallel
reduce waits for members stuck in their tensor-parallel all-reduce), so the analysis follows the chain to
the ranks that wait for nobody.

Precision rules: a member's silence alone names no one; it is a suspect only when corroborated (it was
alive after its peers timed out, and every wait in the job leads to it). Cascade lines (gloo's
"Connection closed by peer", SIGTERM from the launcher) never name anyone. gloo timeouts prove a hang
(time evidence) but say nothing about who is late.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rankscope.datasets.domain.logs import LogEvidence, StepRecord, WatchdogRecord
from rankscope.datasets.domain.topology import Topology


@dataclass(frozen=True)
class GroupStall:
    """One process group whose members timed out in a collective."""

    group: str  # the PG GUID (name), else "id:<pg id>"
    desc: str
    seq: int  # the work they are stuck in (the highest timed-out seq)
    op: str
    waiters: tuple[int, ...]  # members that timed out in it
    members: tuple[int, ...]  # every member known (observed, inferred from pg ranks, or the world for default_pg)
    lagging: tuple[int, ...]  # members whose own counter is below seq: they never enqueued it
    silent: tuple[int, ...]  # members that printed no timeout anywhere
    blocked_elsewhere: tuple[int, ...]  # members that did not reach it because they time out in another group
    first_time: float | None
    timeout_ms: int | None
    ops: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """When the waiters time out in different collectives at this work (a desync): each op and its ranks."""


@dataclass(frozen=True)
class Laggard:
    """A rank the logs point at, and how strongly."""

    rank: int
    why: str
    strong: bool  # its own counter says it never enqueued the work (else: silence, corroborated)
    groups: tuple[str, ...]


@dataclass(frozen=True)
class LogFacts:
    """The logs' evidence about one job, before a decision."""

    stalls: tuple[GroupStall, ...]
    laggards: tuple[Laggard, ...]
    unresolved: tuple[int, ...]  # silent members that could not be corroborated (named in words only)
    nccl_timeouts: int
    gloo_timeouts: tuple[int, ...]  # ranks that timed out waiting in gloo
    cascade: tuple[int, ...]  # ranks that saw a peer close the connection
    first_timeout: float | None
    last_step_time: float | None
    progressing_after: bool  # steps logged after the first timeout (then the timeouts are not a hang)
    periodic: int  # healthy "NCCL Work update periodically" lines seen
    world: int
    notes: tuple[str, ...] = field(default=())
    quiet_before_stop: tuple[float, float] | None = None
    """(seconds, the job's usual seconds between steps) when the launchers were stopped or failed far longer after
    the last logged step than the job's steps came: it was not stepping when it was stopped."""

    @property
    def hang_evidence(self) -> bool:
        """A collective or transport wait ran past its timeout: time evidence of a hang."""
        return bool(self.nccl_timeouts or self.gloo_timeouts) and not self.progressing_after


def _membership(group: str, recs: list[WatchdogRecord], world: int, topology: Topology | None) -> dict[int, int]:
    """pg rank -> global rank for ``group``: what the lines show, the world for the default group, the
    topology's group when one matches every observed member in order, else the gaps below the highest pg
    rank seen when at least three members fit one arithmetic progression (TP groups are consecutive, DP
    groups strided; pg ranks start at 0, and nothing says how many members lie above the highest seen)."""
    seen: dict[int, int] = {}
    for r in recs:
        if r.pg_rank is not None and r.rank is not None:
            seen.setdefault(r.pg_rank, r.rank)
    first = recs[0]
    if first.pg_desc == "default_pg" or first.pg_id == "0":  # PG ID 0 is the default group: the world
        return {r: r for r in range(world)} if world else seen
    if not seen:
        return seen
    if topology is not None:
        for kind in topology.kinds():
            g = topology.group_of(kind, next(iter(seen.values())))
            if len(g.ranks) > max(seen) and all(g.ranks[p] == r for p, r in seen.items()):
                return dict(enumerate(g.ranks))
    if len(seen) >= 3:
        (p0, r0), (p1, r1) = sorted(seen.items())[:2]
        step = (r1 - r0) // (p1 - p0) if p1 != p0 else 0
        base = r0 - p0 * step  # pg ranks start at 0: the progression reaches back to it
        if step and base >= 0 and all(r == base + p * step for p, r in seen.items()):
            return {p: base + p * step for p in range(max(seen) + 1)}
    return seen


def _counters(recs: list[WatchdogRecord]) -> dict[int, int]:
    """Each member's last enqueued work in the group, from the lines printed when the job timed out."""
    out: dict[int, int] = {}
    for r in recs:
        if r.rank is not None and r.last_enqueued is not None and r.kind in ("failure", "dump-signal"):
            out[r.rank] = min(out.get(r.rank, r.last_enqueued), r.last_enqueued)
    return out


def _groups(logs: LogEvidence) -> dict[str, list[WatchdogRecord]]:
    """Watchdog records by process group; a timeout line (which names no group) joins the group of the
    failure line of the same rank and sequence number."""
    by_rank_seq = {(w.rank, w.seq): w for w in logs.watchdog if w.kind == "failure" and (w.pg_name or w.pg_id)}
    out: dict[str, list[WatchdogRecord]] = defaultdict(list)
    for w in logs.watchdog:
        if w.kind in ("periodic", "heartbeat"):
            continue
        if w.pg_name is None and w.pg_id is None and w.kind == "timeout":
            f = by_rank_seq.get((w.rank, w.seq))
            key = f.group if f is not None else "?"
            out[key].append(w)
            continue
        out[w.group].append(w)
    return out


_P2P_OP = re.compile(r"send|recv", re.I)


def _one_unnamed_group(groups: Mapping[str, list[WatchdogRecord]], waits: list[WatchdogRecord], world: int) -> bool:
    """Whether timeouts whose lines name no process group (torch before 2.3: "[Rank 3] Watchdog caught collective
    operation timeout: WorkNCCL(SeqNum=1121, OpType=ALLREDUCE, ...)") are one stall of the whole job: no line
    names any group, every one is the same work (sequence number and op), and at least half the world timed out
    in it. Several groups of one job stall at different works; a subgroup's stall holds less of the world."""
    if set(groups) != {"?"} or not world:
        return False
    works = {(w.seq, w.op) for w in waits if w.kind == "timeout"} | {
        (w.seq, None) for w in waits if w.kind != "timeout"
    }
    seqs = {s for s, _ in works}
    ops = {o for _, o in works if o is not None}
    ranks = {w.rank for w in waits if w.rank is not None}
    return len(seqs) == 1 and len(ops) <= 1 and 2 * len(ranks) >= world


def stalls(logs: LogEvidence, topology: Topology | None, world: int) -> list[GroupStall]:
    """Every group with a timeout, with its waiters, lagging and silent members."""
    groups = _groups(logs)
    timed_out = {w.rank for w in logs.watchdog if w.kind in ("timeout", "failure") and w.rank is not None}
    out = []
    for key, recs in groups.items():
        waits = [w for w in recs if w.kind in ("timeout", "failure") and w.seq is not None]
        if not waits or (key == "?" and not _one_unnamed_group(groups, waits, world)):
            continue
        seq = max(w.seq for w in waits if w.seq is not None)
        if key == "?":  # torch before 2.3 names no group; one stall of most of the world is the world's group
            members = {r: r for r in range(world)}
        else:
            members = _membership(key, [w for w in recs if w.pg_rank is not None] or recs, world, topology)
        counters = _counters(recs)
        waiters = sorted({w.rank for w in waits if w.rank is not None})
        mem = sorted(set(members.values()) | set(waiters))
        lagging = sorted(r for r, e in counters.items() if e < seq and r in mem)
        outside = [r for r in mem if r not in waiters and r not in lagging]
        t = [w.time for w in waits if w.time is not None]
        tos = [w.timeout_ms for w in recs if w.timeout_ms]
        by_op: dict[str, set[int]] = defaultdict(set)
        for w in waits:
            # a pipeline link's two ends wait in SEND and RECV at one p2p sequence number: no desync
            if w.kind == "timeout" and w.op and w.seq == seq and w.rank is not None and not _P2P_OP.search(w.op):
                by_op[w.op].add(w.rank)
        out.append(
            GroupStall(
                key,
                next((w.pg_desc for w in recs if w.pg_desc), ""),
                seq,
                next((w.op for w in recs if w.op), ""),
                tuple(waiters),
                tuple(mem),
                tuple(lagging),
                tuple(r for r in outside if r not in timed_out),
                tuple(r for r in outside if r in timed_out),
                min(t) if t else None,
                max(tos) if tos else None,
                tuple(sorted((op, tuple(sorted(rs))) for op, rs in by_op.items())) if len(by_op) > 1 else (),
            )
        )
    return sorted(out, key=lambda s: (s.first_time or 0.0, s.group))


def sinks(
    found: list[GroupStall], alive_after: Mapping[int, float], stuck_watchdog: frozenset[int] = frozenset()
) -> tuple[list[Laggard], list[int]]:
    """Follow who waits for whom to the ranks that wait for nobody: counter laggards (strong) and silent
    members corroborated by the chain (every wait leads to them, and they were alive after the timeouts, or
    their heartbeat monitor aborted them: their own watchdog thread was stuck, the mark of a hung device)."""
    stuck = {r for s in found for r in s.waiters}
    strong: dict[int, list[str]] = defaultdict(list)
    silent: dict[int, list[str]] = defaultdict(list)
    for s in found:
        for r in s.lagging:
            if r not in stuck:
                strong[r].append(s.group)
        for r in s.silent:
            silent[r].append(s.group)
    lags = [
        Laggard(
            r,
            f"never enqueued work {_seq_of(found, g[0])} of {_name(found, g[0])}, which its peers time out in",
            True,
            tuple(g),
        )
        for r, g in sorted(strong.items())
    ]
    if lags:
        return lags, sorted(r for r in silent if r not in strong)
    first = min((s.first_time for s in found if s.first_time is not None), default=None)
    leads = {r for r in silent if _leads_everywhere(found, r)}
    # untimed logs corroborate silence only where the lines named its group: the group of lines that name none
    # is itself inferred (see _one_unnamed_group), and two inferences make no eviction
    named = {r for r in leads if all(g != "?" for g in silent[r])}
    ok = [
        r
        for r in leads
        if (r in named if first is None else alive_after.get(r, float("-inf")) >= first - 1.0) or r in stuck_watchdog
    ]
    # several silent (its machine's other ranks torn down with it), one whose heartbeat monitor aborted it
    beats = [r for r in leads if r in stuck_watchdog]
    if (len(ok) == 1 and len(silent) == 1) or len(beats) == 1:
        r = beats[0] if len(beats) == 1 else ok[0]
        how = (
            "its heartbeat monitor aborted it (its own watchdog thread was stuck)"
            if r in stuck_watchdog
            else "was still logging after them"
            if first is not None
            else "these logs carry no time to show it gone before them"
        )
        return [
            Laggard(
                r,
                f"printed no timeout while every other member of {_name(found, silent[r][0])} timed out in work "
                f"{_seq_of(found, silent[r][0])}, and {how}: it never entered that collective",
                False,
                tuple(silent[r]),
            )
        ], sorted(q for q in silent if q != r)
    return [], sorted(silent)


def _leads_everywhere(found: list[GroupStall], rank: int) -> bool:
    """The first group to time out waits for ``rank``, and so does every group whose wait points anywhere
    (directly, or through members stuck in a group that waits for it); groups whose members all timed out
    together point nowhere and are left out."""
    direct = {s.group for s in found if rank in s.silent}
    blocked_by = {r for s in found if s.group in direct for r in s.waiters}
    pointing = [s for s in found if s.silent or s.lagging or s.blocked_elsewhere]
    timed = [s for s in found if s.first_time is not None]
    first = min(timed, key=lambda s: s.first_time or 0.0) if timed else None
    if first is not None and first.group not in direct:
        return False
    return all(s.group in direct or any(r in blocked_by for r in s.blocked_elsewhere) for s in pointing)


def _seq_of(found: list[GroupStall], group: str) -> int:
    return next(s.seq for s in found if s.group == group)


def _name(found: list[GroupStall], group: str) -> str:
    s = next(s for s in found if s.group == group)
    return group_name(s)


def group_name(s: GroupStall) -> str:
    """How the words name a stalled group: ``pg <GUID or id> (<desc>)``, or the one group of lines that name none."""
    if s.group == "?":
        return "the job's group (its lines name none, as before torch 2.3)"
    return f"pg {s.group}" + (f" ({s.desc})" if s.desc and s.desc != s.group else "")


def quiet_before_stop(steps: Sequence[StepRecord], stopped: tuple[float, ...]) -> tuple[float, float] | None:
    """See :attr:`LogFacts.quiet_before_stop`: the gap from the last step to the first stop after it, when over
    both 10 s and 20 of the job's usual step times (its lines' own ``elapsed time per iteration``, else the
    median gap between stamps): "not stepping" (a checkpoint or evaluation that long is possible: the answer is
    then inconclusive, never a culprit)."""
    times = sorted({s.time for s in steps if s.time is not None})
    after = [t for t in stopped if times and t > times[-1]]
    if not after:
        return None
    own = sorted(s.elapsed_ms / 1000.0 for s in steps if s.elapsed_ms)
    gaps = own or sorted(b - a for a, b in zip(times, times[1:]) if b > a)
    if not gaps:
        return None
    usual = gaps[len(gaps) // 2]
    quiet = min(after) - times[-1]
    return (quiet, usual) if quiet > max(10.0, 20.0 * usual) else None
