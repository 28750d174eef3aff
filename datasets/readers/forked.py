"""Reading a large incident on several cores: small contiguous batches of the files, claimed by forked workers.

Parsing dumps is pure-Python work per file (a 10,000-rank incident is 30,000 stack files; a 1,024-rank
Flight Recorder capture is a million dict lookups), so on an analysis host with idle cores the readers
cut their file list into small contiguous batches and this process and forked children share them: each
takes the next batch from a queue (a pipe holding the batch numbers, so whoever is free takes more and all
finish together), and each child sends every batch's result back pickled through its own pipe as soon as
it has it (its own bytes, produced by this code, so unpickling them is safe), which this process decodes
between batches of its own. Results are returned in batch order, so the read returns exactly what the
sequential one does.

Nothing is lost or changed when a worker cannot help: a batch whose result does not come back (its child
raised, was killed by a signal or the out-of-memory killer, sent bytes that do not decode, could not be
forked, or was still running :data:`STUCK_AFTER_S` after this process ran out of batches) is read again here,
in batch order, so an error is raised by the same file, with the same words, as without workers. Workers are
used only where forking is safe and worth it: on Linux, from a process with no other thread (the sidecar
agent, a Ray worker or a notebook with threads read sequentially), for at least ``min_per_worker`` files per
worker, up to the cores this process may use (CPU affinity and the cgroup's CPU quota), at most
:data:`MAX_WORKERS`. ``RANKSCOPE_READ_WORKERS=N`` sets the number (``1``: never fork).
"""

from __future__ import annotations

import math
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from rankscope.spine import current_reporter, reporting_progress

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 8
ENV = "RANKSCOPE_READ_WORKERS"
STUCK_AFTER_S = 10.0
"""A worker not done this long (or four times the parent's own reading, if longer) after the queue ran empty is
killed and its batch read here."""


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


def batches(items: Sequence[T], size: int) -> list[Sequence[T]]:
    """``items`` in contiguous batches of ``size`` (the last one shorter), in order."""
    size = max(1, size)
    return [items[i : i + size] for i in range(0, len(items), size)]


def map_batches(
    items: Sequence[T],
    work: Callable[[Sequence[T]], R],
    *,
    workers: int,
    batch: int,
    encode: Callable[[R], Any] | None = None,
    decode: Callable[[Any], R] | None = None,
    label: str | None = None,
    prepare: Callable[[], object] | None = None,
) -> list[R]:
    """``[work(b) for b in batches(items, batch)]`` shared by this process and ``workers - 1`` forked children
    (``[work(items)]`` with one worker, or one batch).

    ``encode`` turns a child's result into something that pickles fast (plain tuples rather than classes
    that pickle through Python code) and ``decode`` turns it back here. A batch whose result does not come
    back is done again here, in order, so exceptions and results are those of the sequential loop. ``label``:
    the progress reported over all items (the batches' own progress loops are silenced, even here).
    ``prepare``: work of this process that the batches do not depend on, run once after the children are
    forked and before this process takes a batch, so that it overlaps their reading (sequentially: first).
    Its exception is raised (the children are stopped).
    """
    parts = batches(items, batch)
    if workers <= 1 or len(parts) <= 1:
        if prepare is not None:
            prepare()
        return [work(items)]
    return _Pool(parts, work, encode, decode, label).run(workers - 1, prepare)


_INDEX = struct.Struct("<I")
_FRAME = struct.Struct("<Q")
_PIPE_BYTES = 1 << 20  # room for a child's results while this process is busy with a batch of its own


class _Pool:
    """One shared read: a queue of batch numbers, the children's result pipes, the results so far."""

    def __init__(
        self,
        parts: list[Sequence[T]],
        work: Callable[[Sequence[T]], R],
        encode: Callable[[R], Any] | None,
        decode: Callable[[Any], R] | None,
        label: str | None,
    ) -> None:
        self.parts, self.work, self.encode, self.decode = parts, work, encode, decode
        self.results: dict[int, Any] = {}
        self.kids: list[tuple[int, int]] = []  # (pid, read end of its results); (0, -1) once collected
        self.buffers: dict[int, bytearray] = {}  # child -> the bytes of its next result so far
        self.failed = False  # a batch raised (here or in a child): stop taking batches, redo up to it here
        self.task = _task(label, sum(len(p) for p in parts))

    def run(self, n_children: int, prepare: Callable[[], object] | None = None) -> list[Any]:
        queue = self._queue()
        try:
            if queue >= 0:
                for _ in range(min(n_children, len(self.parts) - 1)):
                    self.kids.append(_spawn(queue, self.parts, self.work, self.encode, keep=prepare is not None))
            t0 = time.monotonic()
            if prepare is not None:
                prepare()  # the children read meanwhile (they keep what their pipes cannot take yet)
            with reporting_progress(None):
                while not self.failed and queue >= 0 and (i := _claim(queue)) is not None:
                    try:
                        self._done(i, self.work(self.parts[i]))
                    except Exception:
                        self.failed = True  # read again below, in order: an earlier batch's error comes first
                        break
                    self._poll(0.0)
                # a child holds one batch at most now: past several times this process's time, it is stuck
                deadline = time.monotonic() + max(STUCK_AFTER_S, 4 * (time.monotonic() - t0))
                while not self.failed and any(pid for pid, _ in self.kids):
                    if (left := deadline - time.monotonic()) <= 0:
                        break
                    self._poll(left)
                self._poll(0.0)
                self._stop_children()  # stuck, or no longer needed after an error here: their batches are redone
                for i, part in enumerate(self.parts):
                    if i not in self.results:  # its child failed, or it was never claimed: here, in order
                        self._done(i, self.work(part))
            return [self.results[i] for i in range(len(self.parts))]
        finally:
            if queue >= 0:
                os.close(queue)
            self._stop_children()  # an exception here (a refused input, Ctrl-C): no child outlives the read
            if self.task is not None:
                self.task.close()

    def _stop_children(self) -> None:
        for k, (pid, fd) in enumerate(self.kids):
            if pid:
                _reap(pid, fd)
                self.kids[k] = (0, -1)

    def _queue(self) -> int:
        """The read end of a pipe holding every batch number (its write end closed: empty reads as EOF)."""
        try:
            r, w = os.pipe()
        except OSError:
            return -1
        try:
            data = b"".join(_INDEX.pack(i) for i in range(len(self.parts)))
            if len(data) > 65536:  # more batches than a pipe holds by default (Linux: it may grow)
                import fcntl

                fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, len(data))
            os.set_blocking(w, False)  # a pipe smaller than the queue (a user past its pipe pages): never
            if os.write(w, data) != len(data):  # wait on a reader that is this very process: read here
                raise BlockingIOError("the queue does not fit its pipe")
        except OSError:
            os.close(r)
            return -1
        finally:
            os.close(w)
        return r

    def _done(self, i: int, res: Any) -> None:
        self.results[i] = res
        if self.task is not None:
            self.task.advance(len(self.parts[i]))

    def _poll(self, timeout: float) -> None:
        """Take in what the children sent (waiting up to ``timeout`` seconds for something); a child that
        closed its pipe is reaped."""
        fds = {fd: k for k, (pid, fd) in enumerate(self.kids) if pid}
        if not fds:
            return
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        try:
            ready = poller.poll(max(0, int(timeout * 1000)))
        except OSError:
            return
        for fd, _ in ready:
            k = fds[fd]
            self._read(k, *self.kids[k])

    def _read(self, k: int, pid: int, fd: int) -> None:
        buf = self.buffers.setdefault(k, bytearray())
        try:
            while block := os.read(fd, _PIPE_BYTES):
                buf += block
            eof = True
        except BlockingIOError:
            eof = False
        except OSError:
            eof = True
        while len(buf) >= _FRAME.size and len(buf) >= _FRAME.size + (n := _FRAME.unpack_from(buf)[0]):
            payload = bytes(buf[_FRAME.size : _FRAME.size + n])
            del buf[: _FRAME.size + n]
            try:
                i, ok, data = pickle.loads(payload)
                if not ok:  # a child's batch raised: what follows it in file order is not needed
                    self.failed = True
                    continue
                self._done(i, self.decode(data) if self.decode is not None else data)
            except Exception:
                pass  # not decoded: read again here
        if eof:  # the child is done (or died): whatever it did not send is read here
            _reap(pid, fd)
            self.kids[k] = (0, -1)


def _task(label: str | None, total: int) -> Any:
    reporter = current_reporter()
    return reporter(label, total) if reporter is not None and label else None


def _claim(queue: int) -> int | None:
    """The next batch number from the queue, None when it is empty."""
    try:
        b = os.read(queue, _INDEX.size)
    except OSError:
        return None
    return _INDEX.unpack(b)[0] if len(b) == _INDEX.size else None


def _spawn(
    queue: int,
    parts: list[Sequence[T]],
    work: Callable[[Sequence[T]], R],
    encode: Callable[[R], Any] | None,
    *,
    keep: bool = False,
) -> tuple[int, int]:
    """(pid, non-blocking read end of its results) of a child taking batches from ``queue`` until it is empty;
    (0, -1) when no child could be started. Each result goes back as it is done: a length, then a pickle of
    ``(batch number, True, encoded result)``; a batch that raises sends ``(batch number, False, None)`` and ends
    the child (the parent stops taking batches and reads up to that one itself). ``keep`` (this process has
    work of its own first: ``prepare``): what the pipe cannot take yet is kept and sent later, so the child
    never waits while batches are left; otherwise it writes each result whole (measured faster on a Flight
    Recorder read, where this process reads its pipe between batches of its own)."""
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
            os.set_blocking(w, not keep)
            pending = bytearray()
            with reporting_progress(None):  # only the parent draws
                while (i := _claim(queue)) is not None:
                    try:
                        res = work(parts[i])
                        sent: tuple[int, bool, Any] = (i, True, encode(res) if encode is not None else res)
                    except Exception:
                        sent = (i, False, None)
                    payload = pickle.dumps(sent, pickle.HIGHEST_PROTOCOL)
                    pending += _FRAME.pack(len(payload))
                    pending += payload
                    _send_some(w, pending)
                    if not sent[1]:
                        break
            os.set_blocking(w, True)
            _send_some(w, pending)
            code = 0
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    try:
        import fcntl

        fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except (OSError, ImportError, AttributeError):
        pass  # a smaller pipe: the child waits for this process to read more often
    os.set_blocking(r, False)
    return pid, r


def _send_some(fd: int, pending: bytearray) -> None:
    """Write what ``fd`` takes of ``pending`` (all of it on a blocking ``fd``) and drop it from ``pending``."""
    try:
        while pending:
            n = os.write(fd, pending)
            del pending[:n]
    except BlockingIOError:
        pass


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
