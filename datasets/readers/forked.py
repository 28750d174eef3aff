"""Reading a large incident on several cores: contiguous chunks of the files, each chunk in a forked worker.

Parsing dumps is pure-Python work per file (a 10,000-rank incident is 30,000 stack files; a 1,024-rank
Flight Recorder capture is a million dict lookups), so on an analysis host with idle cores the readers
split their file list into contiguous chunks: this process reads the first, forked children read the
rest, and each child sends its result back pickled through a pipe (its own bytes, produced by this
code, so unpickling them is safe). Results come back in chunk order, so a chunked read returns exactly
what the sequential one does.

Nothing is lost or changed when a worker cannot help: a child that fails in any way (an exception, a
signal, the out-of-memory killer, a result that does not decode, a fork refused, a child still running
:data:`STUCK_AFTER_S` after this process finished its own chunk) has its chunk read again here, so an
error is raised by the same file, with the same words, as without workers. Workers are used only where
forking is safe and worth it: on Linux, from a process with no other thread (the sidecar agent, a Ray
worker or a notebook with threads read sequentially), for at least ``min_per_worker`` files per worker,
up to the cores this process may use (CPU affinity and the cgroup's CPU quota), at most
:data:`MAX_WORKERS`. ``RANKSCOPE_READ_WORKERS=N`` sets the number (``1``: never fork).
"""

from __future__ import annotations

import math
import os
import pickle
import select
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from rankscope.spine import reporting_progress

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 8
ENV = "RANKSCOPE_READ_WORKERS"
STUCK_AFTER_S = 10.0
"""A worker not done this long (or four times the parent's own part, if longer) after the parent is killed and
its part read here."""


def usable_cpus() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (containers)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(n, quota) if quota else n)


def _cgroup_quota() -> int | None:
    """``ceil(quota / period)`` of cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``; None when unlimited."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as fh:
            quota, period = fh.read().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as fq, open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as fp:
            quota_us, period_us = int(fq.read()), int(fp.read())
        return None if quota_us <= 0 else max(1, math.ceil(quota_us / period_us))
    except (OSError, ValueError):
        return None


def worker_count(n_items: int, *, min_per_worker: int) -> int:
    """How many processes (this one included) should share ``n_items`` files; 1: read them here."""
    forced = os.environ.get(ENV, "").strip()
    if forced:
        try:
            want = max(1, int(forced))
        except ValueError:
            want = 1
    else:
        want = min(usable_cpus(), MAX_WORKERS, n_items // max(1, min_per_worker))
    if want <= 1 or not _fork_safe():
        return 1
    return max(1, min(want, n_items))


def _fork_safe() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "fork") and threading.active_count() == 1


def chunks(items: Sequence[T], n: int, *, lead: float = 1.0) -> list[Sequence[T]]:
    """``items`` in ``n`` contiguous chunks, in order: the first ``lead`` times the size of each other one
    (this process also decodes what the workers send back, while they encode it: ``lead`` > 1 balances
    that), the others nearly equal."""
    n = max(1, min(n, len(items)))
    if n == 1:
        return [items]
    first = min(len(items) - (n - 1), max(1, round(len(items) * lead / (lead + n - 1))))
    size, extra = divmod(len(items) - first, n - 1)
    out, start = [items[:first]], first
    for i in range(n - 1):
        end = start + size + (i < extra)
        out.append(items[start:end])
        start = end
    return out


def map_chunks(
    parts: Sequence[Sequence[T]],
    work: Callable[[Sequence[T]], R],
    *,
    encode: Callable[[R], Any] | None = None,
    decode: Callable[[Any], R] | None = None,
) -> list[R]:
    """``[work(p) for p in parts]``, ``parts[1:]`` in forked children and ``parts[0]`` here.

    ``encode`` turns a child's result into something that pickles fast (plain tuples rather than classes
    that pickle through Python code) and ``decode`` turns it back here. A child that fails has its part
    done again here, so exceptions and results are those of the sequential loop.
    """
    kids: list[tuple[int, int]] = []
    try:
        for part in parts[1:]:
            kids.append(_spawn(part, work, encode))
        t0 = time.monotonic()
        results = [work(parts[0])]
        # a worker's part is no larger than this one: past several times this part's time, it is stuck
        deadline = time.monotonic() + max(STUCK_AFTER_S, 4 * (time.monotonic() - t0))
        sent = [_collect(kids, i, deadline) for i in range(len(kids))]  # every child's bytes first, then decode
        for part, data in zip(parts[1:], sent):
            res: Any = _FAILED
            if data:
                try:
                    res = pickle.loads(data)
                    res = decode(res) if decode is not None else res
                except Exception:
                    res = _FAILED
            results.append(work(part) if res is _FAILED else res)  # a failed or unstarted child: read here
        return results
    finally:
        for pid, fd in kids:  # an exception here (a refused input, Ctrl-C): no child outlives the read
            if pid:
                _reap(pid, fd)


_FAILED = object()


def _collect(kids: list[tuple[int, int]], i: int, deadline: float) -> bytes:
    """Child ``i``'s result bytes once it exited cleanly, else ``b""``; it is reaped either way."""
    pid, fd = kids[i]
    if not pid:  # the fork itself failed (no memory, a process limit)
        return b""
    data = _drain(fd, deadline)
    if not data:
        _kill(pid)
    _, status = os.waitpid(pid, 0)
    kids[i] = (0, -1)
    return data if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else b""


def _spawn(part: Sequence[T], work: Callable[[Sequence[T]], R], encode: Callable[[R], Any] | None) -> tuple[int, int]:
    """(pid, read end) of a child computing ``work(part)``; (0, -1) when no child could be started."""
    try:
        r, w = os.pipe()
    except OSError:
        return 0, -1
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return 0, -1
    if pid == 0:  # the child: compute, send, and leave without running the parent's exit handlers
        code = 1
        try:
            os.close(r)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            warnings.simplefilter("ignore")
            with reporting_progress(None):  # only the parent draws
                res = work(part)
            payload = pickle.dumps(encode(res) if encode is not None else res, protocol=pickle.HIGHEST_PROTOCOL)
            view = memoryview(payload)
            while view:
                view = view[os.write(w, view) :]
            code = 0
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _drain(fd: int, deadline: float) -> bytes:
    """Everything the child writes until it closes the pipe; ``b""`` (a failed child) when it has not done
    so by ``deadline`` (``time.monotonic()``): a child that hangs (a lock some library's thread held when
    the process forked) costs a bounded wait, never a hung diagnosis."""
    parts = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return b""
            block = os.read(fd, 1 << 20)
            if not block:
                break
            parts.append(block)
    except OSError:
        return b""
    finally:
        os.close(fd)
    return b"".join(parts)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _reap(pid: int, fd: int) -> None:
    _kill(pid)
    try:
        os.close(fd)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except OSError:
        pass
