"""The in-process hook's run directory, read post mortem (no agent needed).

``rankscope.collectors.hook`` leaves, per process, ``pid<PID>.json`` (identity: rank, node, role,
parallel-group coordinates), ``pid<PID>.stack.txt`` (faulthandler dumps: on request, on SIGTERM,
on fatal errors), ``pid<PID>.exit.json`` (the uncaught exception), ``pid<PID>.steps.jsonl``
(``log_step``) and ``pid<PID>.fr.json`` (Flight Recorder; ``pid<PID>.fr.pkl`` when torch can only
pickle it). When a hung job is torn down, SIGTERM makes every rank write its last stack, so the run
directory alone is a dump directory:

- each process's stack at the stop is the exception that ended it, else the **last** faulthandler
  dump in its stack file; a dump cut off as the process was stopped (no frame, or no main thread: a
  second SIGTERM while faulthandler wrote), an empty stack file or a stale requested dump is no
  evidence (status ``cut``), unless a dump the agent requested after the rank's last logged step can
  stand in (only for ranks that log steps: without them an older dump may be stale);
- the dumps the agent requested earlier (each after a ``# rankscope: stack requested at <time>``
  line) are rounds before the stop (:func:`stack_rounds`): progress between them, and a fail-slow vote;
- ranks, nodes and roles come from the identities (the newest process per rank and role when a
  directory was reused across restarts), and the topology from their coordinates;
- step records become per-rank ``timings`` (op ``step``): with the request times and the stack files'
  modification times they tell a stop while progressing from a hang.

The functions here classify and parse; :mod:`.dumpdir` calls them while it walks a directory.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rankscope.datasets.domain.bounds import (
    MAX_LINE_NO,
    limits,
    load_json,
    load_json_file,
    open_regular,
    plausible_epoch,
    read_bounded,
    to_float,
    to_int,
)
from rankscope.datasets.domain.stacks import Frame, ProcessDump, ThreadDump
from rankscope.datasets.readers import runfiles as rf
from rankscope.datasets.readers.base import cut_dump, failed_dump
from rankscope.datasets.readers.faulthandler import parse_traceback_text
from rankscope.spine import InputError, ParseError

_ROLES = {"trainer": "trainer", "dataloader": "dataloader", "checkpoint": "checkpoint"}


@dataclass
class HookProcess:
    """The files one hooked process left."""

    pid: int
    files: dict[str, str] = field(default_factory=dict)  # kind (json, stack.txt, ...) -> absolute path
    rel: dict[str, str] = field(default_factory=dict)  # kind -> path relative to the dump root


@dataclass(frozen=True)
class RunDirProcess:
    """One process of a run directory, resolved."""

    pid: int
    rank: int
    node: str
    role: str
    started: float
    stack_rel: str
    dump: ProcessDump
    identity: Mapping[str, Any]


def _load_json(path: str) -> Any:
    """A hook file's JSON within the size and depth limits (an InputError otherwise)."""
    return load_json_file(path)


def identity(path: str) -> dict[str, Any] | None:
    """The hook identity in ``path``, or None when the file is not one (any JSON object with a rank or role)."""
    try:
        data = _load_json(path)
    except InputError:
        return None
    if isinstance(data, dict) and "pid" in data and ("rank" in data or "role" in data):
        return data
    return None


def exception_dump(rec: Any, pid: int, source: str) -> ProcessDump | None:
    """The stack in a hook exit record (the uncaught exception's frames), or None when it has none."""
    if not isinstance(rec, dict) or rec.get("type") in (None, "exit") or not isinstance(rec.get("frames"), list):
        return None
    frames = tuple(
        Frame(str(f.get("function")), str(f.get("file")), to_int(f.get("line"), lo=0, hi=MAX_LINE_NO))
        for f in rec["frames"]
        if isinstance(f, dict)
    )
    if not frames:
        return None
    thread = ThreadDump(frames, thread_id=pid, thread_name="MainThread", active=False, is_main=True)
    return ProcessDump(
        (thread,),
        pid=pid,
        status="ok",
        error=f"exited: {rec.get('type')}: {str(rec.get('message', ''))[:300]}",
        source_format="exception",
        source_file=source,
    )


_FH_HEADER = re.compile(r"^(?:Current thread|Thread) (0[xX][0-9a-fA-F]*)")  # a cut header has a short id
STACK_REQUEST = rf.STACK_REQUEST
_REQUEST = re.compile(r"^# rankscope: stack requested at (\d+(?:\.\d*)?)\s*$")


def split_faulthandler_dumps(text: str) -> list[str]:
    """The separate dumps in a file faulthandler appended to. Inside one dump a blank line precedes
    every thread header but the first, so a header right after a frame line starts the next dump;
    so do a thread id seen again, a ``Fatal Python error`` line and the hook's stack-request line."""
    chunks: list[list[str]] = [[]]
    seen: set[str] = set()
    prev = ""
    for line in text.splitlines(keepends=True):
        m = _FH_HEADER.match(line)
        new_dump = line.startswith(("Fatal Python error", STACK_REQUEST)) or bool(
            m
            and chunks[-1]
            and (m.group(1) in seen or prev.strip())
            and not prev.startswith(("Fatal Python error", STACK_REQUEST))
        )
        if new_dump:
            chunks.append([])
            seen = set()
        if m:
            seen.add(m.group(1))
        chunks[-1].append(line)
        prev = line
    return ["".join(c) for c in chunks if "".join(c).strip()]


def requested_at(chunk: str) -> float | None:
    """When the dump in ``chunk`` was requested through the hook (``stack`` on its FIFO), or None
    (a dump faulthandler wrote by itself: on SIGTERM, a signal or a fatal error)."""
    m = _REQUEST.match(chunk.split("\n", 1)[0])
    t = to_float(m.group(1)) if m else None
    return t if t is not None and plausible_epoch(t) else None


def own_dumps(text: str) -> str:
    """``text`` without the dumps the hook wrote on request: what faulthandler wrote by itself (on a
    signal, at SIGTERM, at a fatal error)."""
    return "".join(c for c in split_faulthandler_dumps(text) if requested_at(c) is None)


def last_faulthandler_dump(
    text: str,
    pid: int,
    source: str,
    *,
    last_step: float | Callable[[], float | None] | None = None,
    main_thread_id: int | None = None,
    not_before: float | None = None,
) -> ProcessDump | None:
    """The newest faulthandler dump in ``text`` (at SIGTERM, a fatal error or the last request); None
    when ``text`` holds none. When that dump cannot be used, a dump with status ``cut`` (no evidence)
    says why: cut off before its main thread (a second SIGTERM while faulthandler wrote), or stale.

    An older dump is stale evidence, save one: a dump requested (by the agent, at a stall) after the
    rank's last logged step (``last_step``, epoch seconds, or a function that reads it; without step
    records no older dump is trusted); the rank has not moved since. A requested dump followed by
    steps is stale even when it is the newest (the SIGTERM dump was never written), and so is one
    requested before ``not_before`` (the process started: an earlier process with the same pid).
    ``main_thread_id`` (from the hook identity) tells the main thread exactly.
    """
    chunks = split_faulthandler_dumps(text)
    if not chunks:
        return None
    last: Callable[[], float | None] = (  # read at most once
        functools.cache(last_step) if callable(last_step) else lambda: last_step
    )

    def stale(t: float) -> bool:  # requested before the process started or before its last step
        step = last()
        return (not_before is not None and t < not_before) or (step is not None and t < step)

    t = requested_at(chunks[-1])
    if t is not None and stale(t):
        return cut_dump(
            source,
            pid,
            f"its newest stack dump (requested at {t:.3f}) is older than its last step "
            "or its start, and nothing was written as it stopped: no evidence either way",
        )
    newest = usable(chunks[-1], pid, source, main_thread_id)
    if newest.status != "cut":
        return newest
    for chunk in reversed(chunks[:-1]):
        t = requested_at(chunk)
        if t is None or last() is None or stale(t):  # without steps, an older dump may be stale
            break
        older = usable(chunk, pid, source, main_thread_id)
        if older.status != "cut":
            return replace(
                older,
                error=f"its last dump was cut off as it stopped; the stack requested at "
                f"{t:.3f}, after its last step, is used",
            )
    return newest


def usable(chunk: str, pid: int, source: str, main_thread_id: int | None) -> ProcessDump:
    """The dump in ``chunk``, or a ``cut`` dump saying why there is none (no frame, no main thread)."""
    dumps = parse_traceback_text(chunk, source_file=source, main_thread_id=main_thread_id)
    good = [d for d in dumps if d.status not in ("failed", "cut")]
    if good:
        return replace(good[-1], pid=pid, source_file=source)
    cut = [d for d in dumps if d.status == "cut"]
    return (
        replace(cut[-1], pid=pid, source_file=source)
        if cut
        else cut_dump(
            source,
            pid,
            "its stack dump was cut off before its first frame as it was stopped (e.g. a second "
            "SIGTERM while faulthandler wrote): no evidence either way",
        )
    )


def last_step_time(path: str | None) -> float | None:
    """The time (``t``) of the last step record in a ``steps.jsonl`` file, or None."""
    if not path:
        return None
    try:
        with open_regular(path) as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            lines = fh.read().splitlines()
    except (OSError, InputError):
        return None
    for line in reversed(lines):
        t = _record_time(line, path)
        if t is not None:
            return t
    return None


def _record_time(line: bytes, path: str) -> float | None:
    """The ``t`` of one step record when it is a plausible wall-clock time (see ``limits.min_year``)."""
    try:
        d = load_json(line, path)
    except InputError:
        return None
    t = to_float(d.get("t")) if isinstance(d, dict) else None
    return t if t is not None and plausible_epoch(t) else None


def main_thread_id(ident: Mapping[str, Any] | None) -> int | None:
    """The main thread's id a hook identity recorded (what faulthandler prints for it), or None."""
    v = ident.get("main_thread_id") if isinstance(ident, Mapping) else None
    return to_int(v, lo=0) if isinstance(v, int) else None


def process_dump(proc: HookProcess, *, main_thread_id: int | None = None, started: float | None = None) -> ProcessDump:
    """The stack a hooked process left: its uncaught exception, else its last faulthandler dump
    (``main_thread_id`` and ``started`` from its identity)."""
    exit_path = proc.files.get(rf.EXIT)
    if exit_path:
        try:
            dump = exception_dump(_load_json(exit_path), proc.pid, proc.rel[rf.EXIT])
        except InputError:
            dump = None
        if dump is not None:
            return dump
    stack_path, rel = proc.files.get(rf.STACK), proc.rel.get(rf.STACK, rf.name(proc.pid, rf.STACK))
    text = ""
    if stack_path:
        try:
            text = read_bounded(stack_path).decode(errors="replace")
        except InputError as exc:
            return failed_dump(rel, "faulthandler", exc.what if isinstance(exc, ParseError) else str(exc), proc.pid)
    if not text.strip():  # stopped before faulthandler wrote a byte (SIGKILL, a second SIGTERM), or never asked
        return cut_dump(
            rel,
            proc.pid,
            "the hook wrote no stack for this process: no evidence either way (it was "
            "stopped before faulthandler wrote, or never asked: send it RANKSCOPE_STACK_SIGNAL, "
            "SIGUSR2 by default, or run the agent)",
        )
    steps = proc.files.get(rf.STEPS)
    return last_faulthandler_dump(
        text, proc.pid, rel, last_step=lambda: last_step_time(steps), main_thread_id=main_thread_id, not_before=started
    ) or cut_dump(rel, proc.pid, "its stack file holds no dump: no evidence either way")


def resolve(procs: Mapping[int, HookProcess], *, gpus_per_node: int, notes: list[str]) -> list[RunDirProcess]:
    """The processes of a run directory with their rank, node, role and stack (newest per rank and role)."""
    newest: dict[tuple[int, str, int], RunDirProcess] = {}
    no_identity, no_rank, silent_children, identities = [], 0, 0, 0
    for proc in procs.values():  # torch without _dump_fr_trace_json: the hook pickled its Flight Recorder dump
        if rf.FR_PICKLE in proc.files and rf.FR not in proc.files:
            proc.files[rf.FR] = proc.files.pop(rf.FR_PICKLE)
            proc.rel[rf.FR] = proc.rel.pop(rf.FR_PICKLE)
    for pid, proc in sorted(procs.items()):
        ident = identity(proc.files[rf.IDENTITY]) if rf.IDENTITY in proc.files else None
        if ident is None:
            if rf.STACK in proc.files:  # (an exit record alone still counts: it names its rank)
                no_identity.append(proc.rel[rf.STACK])
            continue
        identities += 1
        if ident.get("rank") is None:
            no_rank += 1
            continue
        rank = to_int(ident["rank"], lo=0, hi=limits().max_world_size - 1)  # negative, 2**63, text: not a rank
        if rank is None:
            no_rank += 1
            continue
        role = _ROLES.get(str(ident.get("role")), "other")
        node = str(ident.get("node") or f"node-{rank // gpus_per_node}")
        started = to_float(ident.get("started")) or 0.0  # unknown start: loses to any process of the rank with one
        dump = process_dump(proc, main_thread_id=main_thread_id(ident), started=started or None)
        if role != "trainer" and dump.status in ("failed", "cut"):
            silent_children += 1  # a worker that wrote no stack is no evidence either way
            continue
        rp = RunDirProcess(pid, rank, node, role, started, proc.rel.get(rf.STACK, rf.name(pid, rf.STACK)), dump, ident)
        key = (rank, role, pid if role != "trainer" else -1)  # one trainer per rank; children stay apart
        cur = newest.get(key)
        if cur is None or rp.started > cur.started:
            newest[key] = rp
    trainer_pids = {p.pid for p in newest.values() if p.role == "trainer"}
    for key, p in list(newest.items()):  # children of an older incarnation of a rank go with it
        parent = p.identity.get("ppid")
        if p.role != "trainer" and parent is not None and parent not in trainer_pids:
            del newest[key]
    kept = len(newest)
    if no_identity:
        notes.append(
            f"run directory: {len(no_identity)} hook file set(s) without an identity ignored: "
            + ", ".join(no_identity[:3])
            + (" ..." if len(no_identity) > 3 else "")
        )
    if no_rank:
        notes.append(f"run directory: {no_rank} process(es) without a rank ignored (not torchrun workers)")
    stale = identities - kept - no_rank - silent_children
    if stale > 0:
        notes.append(
            f"run directory: {stale} older process(es) of the same ranks ignored (the directory "
            "was reused across restarts; the newest process per rank is used)"
        )
    return sorted(newest.values(), key=lambda p: (p.rank, p.role != "trainer", p.pid))


def coords_of(procs: list[RunDirProcess]) -> dict[int, dict[str, int]]:
    """Parallel-group coordinates per trainer rank, from the identities (empty when any is missing)."""
    out = {}
    for p in procs:
        if p.role == "trainer":
            c = p.identity.get("coords")
            if not isinstance(c, dict) or not c:
                return {}
            vals = {str(k): to_int(v, lo=0, hi=limits().max_world_size - 1) for k, v in c.items()}
            if any(v is None for v in vals.values()):  # a negative, huge or non-integer coordinate: none used
                return {}
            out[p.rank] = {k: int(v) for k, v in vals.items() if v is not None}
    return out


def step_seconds(value: Any) -> float | None:
    """A ``log_step`` step time as seconds, or None when absent or not a finite non-negative number
    (the hook writes inf/NaN as text)."""
    try:
        d = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return d if math.isfinite(d) and d >= 0 else None


def read_steps(paths: list[tuple[str, str]], nodes: Mapping[int, str]) -> Any:
    """Per-rank ``timings`` (op ``step``) from ``(path, rel)`` steps files: one row per ``log_step``
    that carried ``step_time_seconds``; malformed lines are skipped."""
    import polars as pl

    cols: dict[str, list[Any]] = {"rank": [], "step": [], "op": [], "duration_s": [], "start_s": [], "node": []}
    for path, _rel in paths:
        try:
            lines = read_bounded(path).splitlines()
        except InputError:
            continue
        for line in lines:
            try:
                d = load_json(line, path)
            except InputError:
                continue
            if not isinstance(d, dict):
                continue
            rank = to_int(d.get("rank"), lo=0, hi=limits().max_world_size - 1)
            step, t = to_int(d.get("step"), lo=0), to_float(d.get("t"))
            dur = step_seconds(d.get("step_time_seconds"))
            if rank is None or step is None or t is None or dur is None or not plausible_epoch(t):
                continue
            cols["rank"].append(rank)
            cols["step"].append(step)
            cols["op"].append("step")
            cols["duration_s"].append(dur)
            cols["start_s"].append(t - dur)
            cols["node"].append(nodes.get(rank))
    if not cols["rank"]:
        return None
    return pl.DataFrame(
        cols,
        schema={
            "rank": pl.Int64,
            "step": pl.Int64,
            "op": pl.Utf8,
            "duration_s": pl.Float64,
            "start_s": pl.Float64,
            "node": pl.Utf8,
        },
    )
