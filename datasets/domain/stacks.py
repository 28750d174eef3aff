"""The in-memory form of a job's stacks that the analysis works on, from any source.

A :class:`ProcStacks` is one process in one snapshot: where it runs (rank, node, role), whether
its dump worked, its main thread's frames (innermost first) and its other threads. Sources: a
raw dump directory, the store's ``stacks`` table, or in-memory :class:`ProcessDump` objects.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

ROLES = ("trainer", "dataloader", "checkpoint", "other")
"""Process roles: a torchrun worker, a DataLoader worker, a checkpoint writer, anything else."""


@dataclass(frozen=True, slots=True)
class ProcStacks:
    snapshot: int
    rank: int | None
    node: str | None
    role: str
    pid: int | None
    status: str  # ok | partial | failed
    error: str | None
    main_thread: ThreadDump | None
    others: tuple[ThreadDump, ...]
    source: str
    source_format: str = ""
    failure_kind: str | None = None  # why a failed capture failed (see ProcessDump.failure_kind)
    capture_time: float | None = None  # wall time the stack was taken, when the content says (epoch seconds)

    @property
    def main(self) -> tuple[Frame, ...]:
        """The main thread's frames, innermost first (empty for a failed dump)."""
        return self.main_thread.frames if self.main_thread is not None else ()


def from_dump(
    dump: ProcessDump,
    *,
    snapshot: int,
    rank: int | None,
    node: str | None,
    role: str,
    pid: int | None = None,
    capture_time: float | None = None,
) -> ProcStacks:
    threads = dump.threads
    main = dump.main_thread
    others = threads[1:] if threads and threads[0] is main else tuple(t for t in threads if t is not main)
    status, error, kind = dump.status, dump.error, dump.failure_kind
    if status == "ok" and threads and (main is None or not main.frames) and not any(t.frames for t in threads):
        # a header and threads without a frame: py-spy caught the process exiting (SIGKILL, teardown); no state
        status, error, kind = "cut", "no frame in any thread (the process was exiting or gone when captured)", "cut"
    return ProcStacks(
        snapshot,
        rank,
        node,
        role,
        dump.pid if dump.pid is not None else pid,
        status,
        error,
        main,
        others,
        dump.source_file,
        dump.source_format,
        kind,
        capture_time,
    )


def from_dumps(items: Iterable[tuple[ProcessDump, int, int | None, str | None, str]]) -> list[ProcStacks]:
    """From ``(dump, snapshot, rank, node, role)`` tuples (synthetic jobs, the live agent)."""
    return [from_dump(d, snapshot=s, rank=r, node=n, role=role) for d, s, r, n, role in items]


class FrameLike(Protocol):
    """Anything with a frame's fields (a :class:`Frame`, a Flight Recorder frame, a test double)."""

    @property
    def function(self) -> str: ...

    @property
    def file(self) -> str: ...

    @property
    def line(self) -> int | None: ...


class Frame(NamedTuple):
    """One stack frame as the tool printed it (``file`` not yet normalized). A tuple: cheap at 10^7."""

    function: str
    file: str
    line: int | None = None


LAUNCH_FILES = frozenset({"<frozen runpy>", "runpy.py"})


def is_launcher_frame(f: FrameLike) -> bool:
    """A ``python -m`` start-up frame (runpy): the same on every rank, and the first thing a dump cut
    short loses (dumps are written innermost first)."""
    return f.file.rsplit("/", 1)[-1] in LAUNCH_FILES


_HOOK_THREAD_FUNCTIONS = frozenset({"_control_loop", "_requested_dump"})  # only ever on its own thread


def is_hook_idle_frame(f: FrameLike) -> bool:
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
    the capture failed) or ``cut`` (no usable stack and no evidence either way: the
    process was killed while it wrote its dump, before the first frame or the main thread was out,
    or left an empty or stale stack file).

    ``failure_kind`` says why a ``failed`` capture failed, as the capturing tool reported it:
    ``permission`` (ptrace refused), ``process-gone`` (no such process), ``not-python``,
    ``concurrent-attach`` (another tracer held the process), ``timeout``, ``empty`` (an empty file),
    ``unreadable`` (the file could not be read or parsed) or ``other``. A failed capture is a collection
    problem: the readers classify and report it; what it means is the analysis's call."""

    threads: tuple[ThreadDump, ...]
    pid: int | None = None
    cmdline: str | None = None
    status: str = "ok"
    error: str | None = None
    source_format: str = ""
    source_file: str = ""
    failure_kind: str | None = None
    instance: int | None = None
    """Which process instance this is, where the dump tells one beyond its pid: py-spy JSON's ``thread_id`` of
    the main thread (a pthread address, different in every process: ASLR). Two dumps with the same pid and
    instance are one process dumped twice, even in containers whose pid namespaces repeat pids."""
    header: tuple[tuple[str, str], ...] = ()
    """``(key, value)`` pairs a wrapper wrote before the dump (``RANK=5 LOCAL_RANK=1 HOST=trn-b02``): the
    process's identity as its own environment told it."""

    @property
    def main_thread(self) -> ThreadDump | None:
        """The thread that matters for a trainer: the main thread, else the first listed."""
        for t in self.threads:
            if t.is_main:
                return t
        return self.threads[0] if self.threads else None
