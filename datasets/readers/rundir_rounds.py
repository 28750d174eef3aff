"""The stacks of the hook's run directory as rounds: every dump each process appended to its stack file.

The agent asks every hooked process for a dump (``stack`` on its FIFO) at a stall and for each fail-slow
round; the hook writes each after a ``# rankscope: stack requested at <time>`` line. At the stop
(SIGTERM, a fatal error) faulthandler appends one more. :func:`stack_rounds` turns them into snapshots:
the requested rounds in time order, then the dumps written at the stop, with the times the evidence
itself carries (the request lines) and the latest each can have been taken (file modification times,
which copying only makes later).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from rankscope.datasets.domain.bounds import read_bounded, to_float
from rankscope.datasets.domain.stacks import ProcStacks, from_dump
from rankscope.datasets.readers import runfiles as rf
from rankscope.datasets.readers.rundir import identity, main_thread_id, requested_at, split_faulthandler_dumps, usable
from rankscope.spine import InputError

ROUND_GAP_SECONDS = 2.0
"""Stack requests more than this apart (and more than half a rank's own interval) start a new round."""


@dataclass(frozen=True)
class RunRounds:
    """A run directory's stacks as snapshots: the agent's requested rounds first (in time order), then the
    dumps written at the stop (SIGTERM, a fatal error) as the last snapshot."""

    procs: list[ProcStacks]
    times: dict[int, float]  # snapshot -> when it was requested (written in the stack file: exact)
    latest: dict[int, float]  # snapshot -> the latest it can have been taken (file modification times)


def _hook_stack(p: ProcStacks) -> int | None:
    """The pid of a process whose stack came from the hook's ``pid<PID>.stack.txt``, else None."""
    parsed = rf.parse(p.source.rsplit("/", 1)[-1]) if p.source else None
    return parsed[0] if parsed is not None and parsed[1] == rf.STACK else None


def _identity_of(stack_path: str) -> tuple[float | None, int | None]:
    """The start time and main thread id the hook recorded beside ``pid<PID>.stack.txt``."""
    ident = identity(stack_path[: -len(rf.STACK)] + rf.IDENTITY)
    started = to_float(ident.get("started")) if ident else None
    return started, main_thread_id(ident)


def _round_of(times: list[float], per_rank_gaps: list[float]) -> list[tuple[float, float]]:
    """Time windows of the request rounds: requests sorted, split where they are far apart."""
    if not times:
        return []
    ts = sorted(times)
    gap = ROUND_GAP_SECONDS
    if per_rank_gaps:
        gap = max(gap, 0.5 * sorted(per_rank_gaps)[len(per_rank_gaps) // 2]) if min(per_rank_gaps) > 2 * gap else gap
    windows = [[ts[0], ts[0]]]
    for t in ts[1:]:
        if t - windows[-1][1] > gap:
            windows.append([t, t])
        else:
            windows[-1][1] = t
    return [(a, b) for a, b in windows]


def stack_rounds(procs: list[ProcStacks], root: str | os.PathLike[str], notes: list[str]) -> RunRounds:
    """Every dump in each hooked process's stack file as rounds: the dumps the agent requested (each with its
    time line), then the dumps written at the stop. A round is kept when at least half of the trainer ranks
    have a dump in it; the stop's dumps are the last snapshot when at least half of the ranks wrote one
    (the reader's choice per rank stands there: a cut dump, or a requested dump standing in for it).

    Only a pure run directory (every stack from the hook, one folder) is split; anything else is returned
    as it is. The file modification times bound the stop from above (copying makes them later).
    """
    if not procs or (_hook_stack(procs[0]) is None and procs[0].source_format != "exception"):
        return RunRounds(list(procs), {}, {})  # not a run directory (checked on the first process: cheap)
    trainers = [p for p in procs if p.role == "trainer" and p.rank is not None]
    crashed = {p.rank for p in trainers if p.source_format == "exception"}  # the exit record's stack
    if (
        not trainers
        or any(_hook_stack(p) is None for p in trainers if p.rank not in crashed)
        or len({p.snapshot for p in procs}) > 1
    ):
        return RunRounds(list(procs), {}, {})
    base = os.fspath(root)
    thread_ids: dict[int, int | None] = {}
    requested: dict[int, list[tuple[float, str]]] = {}  # rank -> (time, chunk)
    final: dict[int, bool] = {}  # rank -> wrote a dump of its own at the stop
    mtimes: list[float] = []
    for p in trainers:
        if p.rank is None or p.rank in crashed:
            continue
        path = os.path.join(base, p.source)
        try:
            text = read_bounded(path).decode(errors="replace")
            mtimes.append(os.stat(path).st_mtime)
        except (OSError, InputError):  # gone, not a regular file, over the size limit: not a round
            continue
        chunks = split_faulthandler_dumps(text)
        started, thread_ids[p.rank] = _identity_of(path)
        reqs = []
        for c in chunks:
            t = requested_at(c)
            if t is not None and (started is None or t >= started):
                reqs.append((t, c))
        requested[p.rank] = reqs
        final[p.rank] = bool(chunks) and requested_at(chunks[-1]) is None
    latest = min(mtimes) if mtimes else None
    n_ranks = len(trainers) - len(crashed)
    gaps = [b[0] - a[0] for reqs in requested.values() for a, b in zip(reqs, reqs[1:])]
    windows = _round_of([t for reqs in requested.values() for t, _ in reqs], gaps)
    rounds: list[dict[int, tuple[float, str]]] = []
    for lo, hi in windows:
        rnd = {
            r: max(x for x in reqs if lo <= x[0] <= hi)
            for r, reqs in requested.items()
            if any(lo <= t <= hi for t, _ in reqs)
        }
        if 2 * len(rnd) >= n_ranks:
            rounds.append(rnd)
    with_final = n_ranks > 0 and 2 * sum(final.values()) >= n_ranks
    if not rounds:
        return RunRounds(list(procs), {}, {procs[0].snapshot: latest} if latest is not None and with_final else {})
    by_rank = {p.rank: p for p in trainers}
    out: list[ProcStacks] = []
    times: dict[int, float] = {}
    for k, rnd in enumerate(rounds):
        ts = sorted(t for t, _ in rnd.values())
        times[k] = ts[len(ts) // 2]
        for r, (_t, chunk) in sorted(rnd.items()):
            p = by_rank[r]
            pid = _hook_stack(p) or p.pid or 0
            dump = usable(chunk, pid, p.source, thread_ids.get(r))
            out.append(from_dump(dump, snapshot=k, rank=r, node=p.node, role="trainer", pid=p.pid))
    last = len(rounds)
    if with_final:
        for p in procs:
            if (
                p.role == "trainer"
                and p.rank is not None
                and not final.get(p.rank, True)
                and p.status == "ok"
                and not (p.error or "")
            ):
                # its newest dump is a requested one, already in its round: nothing was written at the stop
                p = replace(
                    p,
                    main_thread=None,
                    others=(),
                    status="cut",
                    error="no dump written at the stop (its last dump is an earlier round's)",
                )
            out.append(replace(p, snapshot=last))
    else:  # the stop left no dumps worth a snapshot: the last round is the latest evidence
        last -= 1
        out.extend(replace(p, snapshot=last) for p in procs if p.role != "trainer" or p.rank in crashed)
    notes.append(
        f"run directory: {len(rounds)} round(s) of stacks the agent requested"
        + (" and the dumps written at the stop" if with_final else "")
        + f" are read as {last + 1} snapshot(s)"
    )
    return RunRounds(out, times, {last: latest} if latest is not None and with_final else {})
