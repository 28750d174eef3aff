"""What every stack reader returns: processes, their threads, and frames innermost first."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rankscope.datasets.domain.stacks import Frame, ProcessDump, ThreadDump

_ADDRESS = re.compile(r"^0x[0-9a-fA-F]+$")


_ODD_BREAKS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e")  # str.splitlines() breaks there too


def block_readable(text: str) -> bool:
    """Whether a block-by-block fast path may read ``text``: ASCII, ending in a newline, and with no line
    break but ``\\n`` (the line-by-line readers split on every break ``str.splitlines()`` knows)."""
    return text.isascii() and text.endswith("\n") and not any(c in text for c in _ODD_BREAKS)


def native_name(name: str) -> str:
    """A frame's function name, an unsymbolized ``py-spy --native`` address (``0x7f0911aa3f16``, different in
    every process: ASLR) as ``0x?`` so that the same place compares equal across ranks."""
    return "0x?" if name.startswith("0x") and _ADDRESS.match(name) else name


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


def occurrence_rounds(pids: Sequence[int | None]) -> list[int]:
    """Per process of a file or console stream, in order, its capture round: how many dumps of the same pid came
    before it (a pid seen again starts the next round); a process without a pid joins the latest round so far."""
    seen: dict[int, int] = {}
    out: list[int] = []
    top = 0
    for pid in pids:
        k = top if pid is None else seen.get(pid, 0)
        if pid is not None:
            seen[pid] = k + 1
        top = max(top, k)
        out.append(k)
    return out


def cut_dump(source: str, pid: int | None, why: str) -> ProcessDump:
    """A dump with no usable stack, ``why`` says how (status ``cut``: no evidence either way)."""
    return ProcessDump((), pid=pid, status="cut", error=why, source_format="faulthandler", source_file=source)


# py-spy's own failure wordings (py-spy 0.3-0.4, with and without RUST_BACKTRACE=1), the agent's and the
# readers' words for a capture that gave no stack; first match wins
_FAILURES = (
    (
        "permission",
        re.compile(r"permission denied|elevated permissions|operation not permitted \(os error 1\)|ptrace", re.I),
    ),
    ("concurrent-attach", re.compile(r"failed to suspend process|EPERM", re.I)),
    (
        "process-gone",
        re.compile(
            r"failed to get process executable name|check that the process is running|no such process"
            r"|process \d+ (?:not found|exited|is gone)|process exited",
            re.I,
        ),
    ),
    (
        "not-python",
        re.compile(r"failed to find python version|not a python process|failed to find python interpreter", re.I),
    ),
    ("timeout", re.compile(r"timed out|timeout", re.I)),
    ("empty", re.compile(r"^empty (?:dump )?file|printed no stacks|no threads in dump", re.I)),
    ("unreadable", re.compile(r"unreadable|invalid JSON|not UTF-8|unexpected py-spy JSON|expected a JSON list", re.I)),
)


def failure_kind(error: str | None) -> str:
    """Why a capture failed, from the words of its error (see :class:`ProcessDump`)."""
    text = error or ""
    for kind, pat in _FAILURES:
        if pat.search(text):
            return kind
    return "other"


def failed_dump(
    source_file: str, source_format: str, error: str, pid: int | None = None, *, kind: str | None = None
) -> ProcessDump:
    """A dump that produced no stack (py-spy error, empty file, unreadable file); ``kind`` is classified
    from ``error`` when not given."""
    return ProcessDump(
        (),
        pid=pid,
        status="failed",
        error=error,
        source_format=source_format,
        source_file=source_file,
        failure_kind=kind or failure_kind(error),
    )


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
    base = {
        "job": job,
        "snapshot": snapshot,
        "time": time,
        "node": node,
        "rank": rank,
        "pid": dump.pid,
        "role": role,
        "source_format": dump.source_format,
        "source_file": dump.source_file,
        "status": dump.status,
        "error": dump.error,
    }
    if not dump.threads:  # a failed capture: one row, saying why it failed (the optional failure_kind column)
        return [
            {
                **base,
                "failure_kind": dump.failure_kind,
                "frames": [],
                "thread_id": None,
                "thread_name": None,
                "is_main_thread": None,
                "active": None,
            }
        ]
    return [
        {
            **base,
            "thread_id": t.thread_id,
            "thread_name": t.thread_name,
            "is_main_thread": t.is_main,
            "active": t.active,
            "frames": [{"function": f.function, "file": f.file, "line": f.line} for f in t.frames],
        }
        for t in dump.threads
    ]
