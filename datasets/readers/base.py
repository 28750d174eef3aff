"""What every stack reader returns: processes, their threads, and frames innermost first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple


class Frame(NamedTuple):
    """One stack frame as the tool printed it (``file`` not yet normalized). A tuple: cheap at 10^7."""

    function: str
    file: str
    line: int | None = None


LAUNCH_FILES = frozenset({"<frozen runpy>", "runpy.py"})


def is_launcher_frame(f: Frame) -> bool:
    """A ``python -m`` start-up frame (runpy): the same on every rank, and the first thing a dump cut
    short loses (dumps are written innermost first)."""
    return f.file.rsplit("/", 1)[-1] in LAUNCH_FILES


_HOOK_THREAD_FUNCTIONS = frozenset({"_control_loop", "_requested_dump"})  # only ever on its own thread


def is_hook_idle_frame(f: Frame) -> bool:
    """The rankscope hook's control thread: waiting for a request on its FIFO (a blocking read, which
    no stack shows) or answering one. Not training's work (idle), and never a process's main thread."""
    return f.function in _HOOK_THREAD_FUNCTIONS and f.file.replace("\\", "/").endswith("collectors/hook.py")


class ThreadDump(NamedTuple):
    """One thread's stack, ``frames[0]`` the innermost (currently executing) frame."""

    frames: tuple[Frame, ...]
    thread_id: int | None = None
    thread_name: str | None = None
    active: bool | None = None
    is_main: bool = False


@dataclass(frozen=True, slots=True)
class ProcessDump:
    """One process's dump. ``status`` is ``ok``, ``partial`` (truncated file), ``failed`` (no stack:
    the capture failed, itself evidence) or ``cut`` (no usable stack and no evidence either way: the
    process was killed while it wrote its dump, before the first frame or the main thread was out,
    or left an empty or stale stack file)."""

    threads: tuple[ThreadDump, ...]
    pid: int | None = None
    cmdline: str | None = None
    status: str = "ok"
    error: str | None = None
    source_format: str = ""
    source_file: str = ""

    @property
    def main_thread(self) -> ThreadDump | None:
        """The thread that matters for a trainer: the main thread, else the first listed."""
        for t in self.threads:
            if t.is_main:
                return t
        return self.threads[0] if self.threads else None


class Interner:
    """Shares one frames tuple among all threads with the same stack text.

    In a hang, most of 100,000 ranks print the very same stack: parsing it once and sharing the
    tuple makes reading cheap and lets the analysis memoize per tuple. Bounded: cleared when full.
    """

    def __init__(self, max_entries: int = 200_000) -> None:
        self.max_entries = max_entries
        self._stacks: dict[object, tuple[Frame, ...]] = {}

    def get(self, key: object) -> tuple[Frame, ...] | None:
        return self._stacks.get(key)

    def put(self, key: object, frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
        if len(self._stacks) >= self.max_entries:
            self._stacks.clear()
        self._stacks[key] = frames
        return frames


def cut_dump(source: str, pid: int | None, why: str) -> ProcessDump:
    """A dump with no usable stack, ``why`` says how (status ``cut``: no evidence either way)."""
    return ProcessDump((), pid=pid, status="cut", error=why, source_format="faulthandler", source_file=source)


def failed_dump(source_file: str, source_format: str, error: str, pid: int | None = None) -> ProcessDump:
    """A dump that produced no stack (py-spy error, empty file, unreadable file)."""
    return ProcessDump((), pid=pid, status="failed", error=error, source_format=source_format,
                       source_file=source_file)


def mark_main(threads: Sequence[ThreadDump], pid: int | None) -> tuple[ThreadDump, ...]:
    """Flag the main thread: named MainThread, else thread id == pid, else the one running ``<module>``."""
    pick = None
    for i, t in enumerate(threads):
        if t.is_main:
            return tuple(threads)
        if pick is None and t.thread_name == "MainThread":
            pick = i
    if pick is None and pid is not None:
        pick = next((i for i, t in enumerate(threads) if t.thread_id == pid), None)
    if pick is None:
        pick = next((i for i, t in enumerate(threads) if t.frames and t.frames[-1].function == "<module>"), None)
    if pick is None:
        if not threads:
            return ()
        pick = 0
    out = list(threads)
    t = out[pick]
    out[pick] = ThreadDump(t.frames, t.thread_id, t.thread_name, t.active, True)
    return tuple(out)


def to_rows(
    dump: ProcessDump,
    *,
    job: str,
    snapshot: int = 0,
    rank: int | None = None,
    node: str | None = None,
    role: str | None = None,
    time: datetime | None = None,
) -> list[dict[str, Any]]:
    """Rows of the ``stacks`` table for one process dump (one row per thread; one row if failed)."""
    base = {"job": job, "snapshot": snapshot, "time": time, "node": node, "rank": rank, "pid": dump.pid,
            "role": role, "source_format": dump.source_format, "source_file": dump.source_file,
            "status": dump.status, "error": dump.error}
    if not dump.threads:
        return [{**base, "frames": [], "thread_id": None, "thread_name": None, "is_main_thread": None,
                 "active": None}]
    return [
        {**base, "thread_id": t.thread_id, "thread_name": t.thread_name, "is_main_thread": t.is_main,
         "active": t.active,
         "frames": [{"function": f.function, "file": f.file, "line": f.line} for f in t.frames]}
        for t in dump.threads
    ]
