"""Stack capture: ``py-spy dump --json`` of many processes in parallel, with fallbacks.

Order of preference per process: py-spy (outside the process, works on a deadlocked interpreter);
if py-spy fails or times out, the hook's faulthandler (signal ``RANKSCOPE_STACK_SIGNAL`` makes the
process append its stacks to ``pid<PID>.stack.txt``), with the py-spy failure kept in ``error``.
For a process that is already gone, :func:`post_mortem` reads what the hook left: the uncaught
exception (``pid<PID>.exit.json``) or the last faulthandler dump (SIGTERM or a fatal signal).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rankscope.datasets.domain.stacks import ProcessDump
from rankscope.datasets.readers import runfiles as rf
from rankscope.datasets.readers.base import cut_dump, failed_dump, to_rows
from rankscope.datasets.readers.faulthandler import parse_traceback_text
from rankscope.datasets.readers.pyspy_json import parse_pyspy_json
from rankscope.datasets.readers.rundir import (
    exception_dump,
    last_faulthandler_dump,
    main_thread_id,
    own_dumps,
    split_faulthandler_dumps,
)


@dataclass(frozen=True)
class Target:
    """A process to capture, with what the stacks table needs to know about it."""

    pid: int
    rank: int | None
    role: str
    node: str


@dataclass(frozen=True)
class Capture:
    """One process's stack, how it was obtained and how long it took."""

    target: Target
    dump: ProcessDump
    method: str  # py-spy | faulthandler | exception | post-mortem | none
    seconds: float


def pyspy_dump(pid: int, *, timeout_seconds: float = 5.0, pyspy: str = "py-spy") -> ProcessDump:
    """``py-spy dump --json --pid PID`` parsed; a failed dump (never an exception) on any error."""
    src = f"py-spy:{pid}"
    try:
        proc = subprocess.run(
            [pyspy, "dump", "--json", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return failed_dump(src, "py-spy-json", f"py-spy timed out after {timeout_seconds:g}s", pid)
    except OSError as exc:
        return failed_dump(src, "py-spy-json", f"py-spy could not run ({exc.strerror or exc})", pid)
    if proc.returncode != 0 or not proc.stdout.strip():
        err = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return failed_dump(src, "py-spy-json", f"py-spy failed: {err[:300]}", pid)
    dumps = parse_pyspy_json(proc.stdout, source_file=src)
    dump = dumps[0] if dumps else failed_dump(src, "py-spy-json", "py-spy printed no stacks", pid)
    return dump if dump.pid is not None else replace(dump, pid=pid)


def stack_file(run_dir: str | os.PathLike[str], pid: int) -> Path:
    return rf.path(run_dir, pid, rf.STACK)


def faulthandler_dump(
    pid: int, run_dir: str | os.PathLike[str], *, timeout_seconds: float = 2.0, signum: int = signal.SIGUSR2
) -> ProcessDump:
    """Signal the hook of ``pid`` and read the stacks it appends to its file (a failed dump if none)."""
    path = stack_file(run_dir, pid)
    src = str(path)
    if not path.exists():
        return failed_dump(src, "faulthandler", "no hook stack file (hook not installed?)", pid)
    start = path.stat().st_size
    try:
        os.kill(pid, signum)
    except OSError as exc:
        return failed_dump(src, "faulthandler", f"cannot signal pid {pid} ({exc.strerror})", pid)
    deadline = time.monotonic() + timeout_seconds
    size, stable_since = start, None
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now_size = path.stat().st_size
        if now_size > start and now_size == size:
            if stable_since and time.monotonic() - stable_since > 0.05:
                break
            stable_since = stable_since or time.monotonic()
        else:
            stable_since = None
        size = now_size
    if size <= start:
        return failed_dump(src, "faulthandler", f"no faulthandler output within {timeout_seconds:g}s", pid)
    with open(path, "rb") as fh:
        fh.seek(start)
        text = fh.read(size - start).decode(errors="replace")
    # only what the signal wrote: not an earlier requested dump still being written when we took the offset
    chunks = split_faulthandler_dumps(own_dumps(text))
    if not chunks:
        return failed_dump(src, "faulthandler", f"no faulthandler output within {timeout_seconds:g}s", pid)
    dumps = parse_traceback_text(chunks[-1], source_file=src, main_thread_id=_main_thread_id(run_dir, pid))
    return replace(dumps[0], pid=pid) if dumps else failed_dump(src, "faulthandler", "unparsable output", pid)


def _main_thread_id(run_dir: str | os.PathLike[str], pid: int) -> int | None:
    """The main thread id the hook recorded in ``pid<PID>.json``, if any."""
    try:
        return main_thread_id(json.loads((rf.path(run_dir, pid, rf.IDENTITY)).read_text()))
    except (OSError, ValueError):
        return None


def post_mortem(pid: int, run_dir: str | os.PathLike[str], *, offset: int = 0) -> tuple[ProcessDump, str]:
    """The last stack a dead process left: its uncaught exception, else its last faulthandler dump."""
    exit_path = rf.path(run_dir, pid, rf.EXIT)
    try:
        rec = json.loads(exit_path.read_text())
    except (OSError, ValueError):
        rec = None
    if isinstance(rec, dict) and rec.get("type") == "exit":
        return failed_dump(str(exit_path), "exception", "process exited normally", pid), "none"
    dump = exception_dump(rec, pid, str(exit_path))
    if dump is not None:
        return dump, "exception"
    path = stack_file(run_dir, pid)
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
    except OSError:
        text = ""
    text = own_dumps(text)  # what it wrote as it died, not the agent's requests
    last = last_faulthandler_dump(text, pid, str(path), main_thread_id=_main_thread_id(run_dir, pid))
    if last is not None and last.status == "cut":  # stopped while faulthandler wrote (a second SIGTERM)
        return replace(last, error=f"exited; {last.error}"), "post-mortem"
    if last is not None:
        return replace(last, error="exited; last faulthandler dump (SIGTERM or fatal signal)"), "post-mortem"
    if text.strip():  # a fragment that is no dump at all
        return cut_dump(
            str(path), pid, "exited; what faulthandler wrote as it died holds no stack: no evidence either way"
        ), "post-mortem"
    return failed_dump(str(path), "none", "process exited and left no stack", pid), "none"


def death_signal(
    pid: int, run_dir: str | os.PathLike[str], *, offset: int = 0, since: float = 0.0
) -> tuple[str, str, float] | None:
    """How a process that left no exit record died, from the dump faulthandler wrote as it died.

    ``("fatal signal", "Segmentation fault", t)`` for faulthandler's fatal-error dump (SIGSEGV,
    SIGABRT, SIGBUS, SIGFPE, SIGILL); ``("SIGTERM", ..., t)`` for a plain dump (the hook registers
    faulthandler on SIGTERM: the launcher or scheduler stopped it); None when nothing was written
    after ``offset`` (SIGKILL, the OOM killer, ``os._exit``). ``t`` is the dump file's mtime; a file
    last written before ``since`` (when the process was last seen alive) holds an older dump (a
    stack request), not one written at death, and also gives None.
    """
    path = stack_file(run_dir, pid)
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
        mtime = os.stat(path).st_mtime
    except OSError:
        return None
    text = own_dumps(text)  # not the agent's requests
    if not text.strip() or mtime < since:
        return None
    fatal = [line for line in text.splitlines() if line.startswith("Fatal Python error: ")]
    if fatal:
        return "fatal signal", fatal[-1].removeprefix("Fatal Python error: ").strip(), mtime
    return "SIGTERM", "terminated by a signal (faulthandler dumped its stack as it stopped)", mtime


def _capture_one(
    target: Target, run_dir: str | None, timeout_seconds: float, pyspy: str, signum: int | None
) -> Capture:
    t0 = time.perf_counter()
    dump = pyspy_dump(target.pid, timeout_seconds=timeout_seconds, pyspy=pyspy)
    method = "py-spy"
    if dump.status == "failed" and run_dir and signum is not None:
        fh = faulthandler_dump(target.pid, run_dir, timeout_seconds=min(2.0, timeout_seconds), signum=signum)
        if fh.status != "failed":
            dump, method = replace(fh, error=f"{dump.error}; used the hook's faulthandler dump"), "faulthandler"
        else:
            dump = replace(dump, error=f"{dump.error}; faulthandler fallback: {fh.error}")
    return Capture(target, dump, method if dump.status != "failed" else "none", time.perf_counter() - t0)


def capture_all(
    targets: Sequence[Target],
    *,
    run_dir: str | None = None,
    timeout_seconds: float = 5.0,
    pyspy: str = "py-spy",
    signum: int | None = signal.SIGUSR2,
    max_workers: int = 32,
) -> list[Capture]:
    """Capture every target in parallel (one thread per process, each with its own timeout)."""
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(max_workers, len(targets))) as pool:
        futures = [pool.submit(_capture_one, t, run_dir, timeout_seconds, pyspy, signum) for t in targets]
        return [f.result() for f in futures]


def capture_rows(
    captures: Sequence[Capture], *, job: str, snapshot: int, when: datetime | None = None
) -> list[dict[str, Any]]:
    """Rows of the ``stacks`` table for one snapshot."""
    when = when or datetime.now(timezone.utc)
    rows: list[dict[str, Any]] = []
    for c in captures:
        rows.extend(
            to_rows(
                c.dump,
                job=job,
                snapshot=snapshot,
                rank=c.target.rank,
                node=c.target.node,
                role=c.target.role,
                time=when,
            )
        )
    return rows
