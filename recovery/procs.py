"""The executor's side effects on this host: one executor per job (:class:`JobLock`, stale locks taken
over) and argv-only subprocesses with a timeout (:func:`run_argv`: never a shell string)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankscope.spine import RecoveryError


class JobLock:
    """An exclusive lock file per job: ``flock`` while held, and the holder's pid/host/time inside.

    A lock left by a dead process (same host, pid gone) or older than ``stale_seconds`` is taken over;
    a live holder makes :meth:`acquire` raise :class:`RecoveryError` naming it.
    """

    def __init__(self, path: str | os.PathLike[str], *, stale_seconds: float = 3600.0) -> None:
        self.path = Path(path)
        self.stale_seconds = stale_seconds
        self._fd: int | None = None

    def _holder(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            return {}

    def _stale(self, holder: dict[str, Any]) -> bool:
        if not holder:
            return True
        if time.time() - float(holder.get("time", 0)) > self.stale_seconds:
            return True
        if holder.get("host") == socket.gethostname():
            try:
                os.kill(int(holder.get("pid", -1)), 0)
            except ProcessLookupError:
                return True
            except (PermissionError, ValueError, OverflowError):
                return False
        return False

    def acquire(self) -> JobLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            holder = self._holder()
            raise RecoveryError(
                f"{self.path}: another executor holds this job's lock (pid {holder.get('pid')} on "
                f"{holder.get('host')} since {holder.get('time')})"
            ) from None
        holder = self._holder()
        if holder and not self._stale(holder) and int(holder.get("pid", -1)) != os.getpid():
            # flock is free but a live process on this host wrote the file: it uses another lock
            # mechanism (or another mount); respect it.
            os.close(fd)
            raise RecoveryError(f"{self.path}: held by live pid {holder.get('pid')} on {holder.get('host')}")
        os.ftruncate(fd, 0)
        os.write(
            fd,
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "time": time.time(),
                    "stale_taken_over": bool(holder),
                }
            ).encode(),
        )
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> JobLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_argv(
    argv: Sequence[str], *, timeout_seconds: float = 60.0, env: dict[str, str] | None = None, check: bool = False
) -> CommandResult:
    """Run one command as an argv list (never through a shell) with a timeout.

    A string (which a shell would split) is refused, so a node name or a reason can never become a
    command. A timeout kills the command and raises :class:`RecoveryError`.
    """
    if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
        raise RecoveryError(f"run_argv needs a non-empty list of strings, not {argv!r}")
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            env=env,
            shell=False,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise RecoveryError(f"{argv[0]}: timed out after {timeout_seconds:g} s ({' '.join(argv)})") from None
    except OSError as exc:
        raise RecoveryError(f"{argv[0]}: cannot run ({exc.strerror})") from None
    res = CommandResult(tuple(argv), p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
    if check and p.returncode != 0:
        raise RecoveryError(f"{' '.join(argv)}: exit {p.returncode}: {(p.stderr or p.stdout).strip()[:300]}")
    return res


# -- processes this host runs for a job (the local backend) ------------------------------------------------


def proc_start_time(pid: int, proc_root: str = "/proc") -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), or None when it
    is gone or a zombie: with the pid it identifies one process, so a reused pid is never signalled."""
    try:
        stat = Path(proc_root, str(pid), "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else None


def descendants(pid: int, proc_root: str = "/proc") -> list[int]:
    """Every live process below ``pid`` (children in other sessions included: torchrun starts each worker
    in its own session, so a process-group signal misses them)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = Path(proc_root, name, "stat").read_text()
            ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def signal_tree(pids: Sequence[int], sig: int) -> None:
    """Send ``sig`` to each pid that still exists (gone ones are skipped)."""
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass
