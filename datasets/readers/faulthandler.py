"""Reader for Python ``faulthandler`` dumps and ``traceback``-style stack text.

faulthandler prints innermost first::

    Thread 0x00007f2a1c1fe640 (most recent call first):
      File "/usr/lib/python3.11/threading.py", line 320 in wait
    Current thread 0x00007f2a2a3b4740 (most recent call first):
      File "/opt/job/train.py", line 33 in <module>

``traceback.print_stack`` / exceptions print outermost first (``Traceback (most recent call last):``,
``Stack (most recent call last):``, ``  File "x.py", line 3, in f``) and are reversed here. Thread
headers of the common ``sys._current_frames`` recipe (``# Thread: NAME(ID)``, ``# ThreadID: ID``)
start a new thread.
"""

from __future__ import annotations

import re
from typing import Any

from rankscope.datasets.domain.bounds import MAX_LINE_CHARS, MAX_LINE_NO, int_text
from rankscope.datasets.domain.stacks import (
    Frame,
    ProcessDump,
    ThreadDump,
    is_hook_idle_frame,
    is_launcher_frame,
)
from rankscope.datasets.readers.base import Interner, block_readable, cut_dump, failed_dump, mark_main

_INTERN = Interner()

FORMAT = "faulthandler"

_FH_THREAD = re.compile(r"^(Current thread|Thread) (0[xX][0-9a-fA-F]+)(?: \[(.*?)\])? \(most recent call first\):")
# frame lines are matched right-stripped, so no lazy group is followed by a trailing-space run (the
# ``(.+?)\s*$`` shape backtracks quadratically on a long run of spaces before a final character)
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.+)$')
_TB_HEAD = re.compile(r"^(Traceback|Stack) \(most recent call last\):")
_TB_FRAME = re.compile(r'^\s+File "(.*)", line (\d+), in (.+)$')
_PARTIAL_FILE = re.compile(r'^\s+File "([^"]+)"')  # a frame line cut in half (the dump stopped there)
_RECIPE_THREAD = re.compile(r"^#\s*Thread(?:ID)?:\s*(?:(.*?)\s*\((\d+)\)|(\d+))\s*$")


def _int(x: str) -> int | None:
    return int_text(x, lo=0, hi=MAX_LINE_NO) if x.isdigit() else None


def _frame(line: str) -> Frame | None:
    if len(line) > MAX_LINE_CHARS:  # no frame line is this long: garbage, never handed to a pattern
        return None
    line = line.rstrip()
    m = _FH_FRAME.match(line) or _TB_FRAME.match(line)
    return Frame(m.group(3), m.group(1), _int(m.group(2))) if m else None


def _spawned(t: ThreadDump, tail_file: str = "") -> bool:
    """Started by ``threading`` (a ``run``/``_bootstrap`` frame of threading.py below its code, or, for a thread
    cut short, as the next frame), or the rankscope hook's own control thread."""
    for f in t.frames:
        if f.file.endswith("threading.py") and f.function in ("run", "_bootstrap_inner", "_bootstrap"):
            return True
        if is_hook_idle_frame(f):
            return True
    return tail_file.endswith("threading.py")


def _guess_main(
    threads: list[ThreadDump],
    current: list[int],
    *,
    cut: bool = False,
    tail_file: str = "",
    faulthandler_order: bool = False,
) -> int | None:
    """Which thread is the main one; faulthandler does not say (frames are innermost first).

    The one whose outermost frame is module-level code; else the only thread not started by ``threading`` (whose
    outermost frame is ``threading._bootstrap``); else the thread that took the signal; else the
    last listed (faulthandler lists the newest threads first, and the main thread is the oldest).

    A faulthandler dump ``cut`` short (the process was stopped while it wrote) ends in the thread it was
    writing; the main thread, listed last, is that one unless it was started by ``threading`` (``tail_file``:
    the file of the frame line cut in half): then the main thread was never written, and None says so.
    So does a faulthandler dump (``faulthandler_order``) of threads that were all started by ``threading``.
    """

    def outermost(t: ThreadDump) -> Frame | None:  # skipping python -m's runpy frames
        for f in reversed(t.frames):
            if not is_launcher_frame(f):
                return f
        return None

    tops = [outermost(t) for t in threads]
    for i, top in enumerate(tops):  # a script's module level (an import in a thread is not outermost)
        if top is not None and top.function == "<module>":
            return i
    if cut:
        return None if _spawned(threads[-1], tail_file) else len(threads) - 1
    if faulthandler_order and all(_spawned(t) for t in threads):
        return None  # cut at a line's end, before the main thread
    not_spawned = [i for i, (t, top) in enumerate(zip(threads, tops)) if top is not None and not _spawned(t)]
    if len(not_spawned) == 1:
        return not_spawned[0]
    if current and (not not_spawned or current[0] in not_spawned):
        return current[0]
    return not_spawned[-1] if not_spawned else len(threads) - 1


def parse_traceback_text(text: str, source_file: str = "", *, main_thread_id: int | None = None) -> list[ProcessDump]:
    """One process with every thread found in faulthandler or traceback text.

    ``main_thread_id`` (the rankscope hook records it) names the main thread exactly; a faulthandler
    dump without that thread was cut off before it (status ``cut``). Otherwise the main thread is guessed.
    """
    if not text.strip():
        return [failed_dump(source_file, FORMAT, "empty dump file")]
    scanned = _blocks(text)
    threads, current, last_innermost_first, dropped = scanned if scanned is not None else _lines(text)
    if not threads:
        first = text.strip().splitlines()[0][:200]
        return [failed_dump(source_file, FORMAT, f"no Python stack found (first line: {first!r})")]
    if main_thread_id is not None and last_innermost_first:
        if not any(t.thread_id == main_thread_id for t in threads):
            return [_no_main_thread(text, source_file)]
        threads = [t._replace(is_main=t.thread_id == main_thread_id) for t in threads]
    last_line = text.rstrip("\n").rsplit("\n", 1)[-1]
    truncated = not text.endswith("\n") or bool(_FH_THREAD.match(last_line))  # ends mid-line or on a bare header
    if not any(t.is_main for t in threads):
        # the file of the frame line cut in half, when it belongs to the last thread kept
        tail = _PARTIAL_FILE.match(text[text.rfind("\n") + 1 :]) if truncated and not dropped else None
        fh_order = all(t.thread_id is not None for t in threads) and last_innermost_first
        i = (
            None
            if truncated and dropped and last_innermost_first
            else _guess_main(
                threads,
                current,
                cut=truncated and last_innermost_first,
                tail_file=tail.group(1) if tail else "",
                faulthandler_order=fh_order,
            )
        )  # cut in a thread after the last one kept: that one is not the main
        if i is None:
            return [_no_main_thread(text, source_file)]
        t = threads[i]
        threads[i] = ThreadDump(t.frames, t.thread_id, t.thread_name, t.active, True)
    status, error = ("partial", "file ends mid-line (truncated dump)") if truncated else ("ok", None)
    return [ProcessDump(mark_main(threads, None), None, None, status, error, FORMAT, source_file)]


_Scanned = tuple[list[ThreadDump], list[int], bool, bool]
"""(the threads, the indexes of the ones marked current, whether the last one kept was listed innermost first,
whether the last thread block was dropped for want of a whole frame)."""

# A whole faulthandler dump, matched thread block by thread block (the common case, without a line loop).
_FH_BLOCK = re.compile(
    r"(Current thread|Thread) (0[xX][0-9a-fA-F]+)(?: \[([^\n]*?)\])? \(most recent call first\):[^\n]*\n"
    r"((?:  File [^\n]*\n)*)\n*"
)


def _blocks(text: str) -> _Scanned | None:
    """A plain faulthandler dump's threads (as :func:`_lines` reads them), or None for anything else."""
    if not block_readable(text):
        return None
    pos = 0
    threads: list[ThreadDump] = []
    current: list[int] = []
    dropped = False
    for m in _FH_BLOCK.finditer(text):
        if m.start() != pos:
            return None
        pos = m.end()
        block = m.group(4)
        frames = _INTERN.get(block)
        if frames is None:
            frames = _INTERN.put(block, tuple([f for f in map(_frame, block.split("\n")[:-1]) if f is not None]))
        dropped = not frames
        if frames:
            threads.append(ThreadDump(frames, int_text(m.group(2), lo=0), m.group(3), None, False))
            if m.group(1) == "Current thread":
                current.append(len(threads) - 1)
    if pos != len(text):
        return None
    return threads, current, True, dropped


def _lines(text: str) -> _Scanned:
    """The threads of any faulthandler or traceback text, line by line."""
    threads: list[ThreadDump] = []
    current: list[int] = []
    cur: dict[str, Any] | None = None
    last_innermost_first = False
    dropped = False  # the last thread block had no whole frame (or none) and was dropped

    def close() -> None:
        nonlocal cur, last_innermost_first, dropped
        if cur is not None and not cur["frames"]:
            dropped = True  # a header with no frame line (yet): the thread being written is unknown
        if cur is not None and cur["frames"]:
            key = (cur["innermost_first"], tuple(cur["frames"]))
            frames = _INTERN.get(key)
            if frames is None:
                parsed = [f for f in map(_frame, cur["frames"]) if f is not None]
                frames = _INTERN.put(key, tuple(parsed if cur["innermost_first"] else reversed(parsed)))
            dropped = not frames
            if not frames:  # its only frame line was cut in half: nothing to show
                cur = None
                return
            threads.append(ThreadDump(frames, cur["tid"], cur["name"], None, cur["main"]))
            last_innermost_first = cur["innermost_first"]
            if cur.get("current"):
                current.append(len(threads) - 1)
        cur = None

    for line in text.splitlines():
        if line.startswith("  File "):
            if cur is not None:
                cur["frames"].append(line)  # parsed once per distinct thread block, in close()
            continue
        if line.startswith("    "):  # source lines under traceback frames
            continue
        m = _FH_THREAD.match(line)
        if m:
            close()
            cur = {
                "tid": int_text(m.group(2), lo=0),
                "name": m.group(3),
                "innermost_first": True,
                "frames": [],
                "main": False,
                "current": m.group(1) == "Current thread",
            }
            continue
        m = _RECIPE_THREAD.match(line.strip())
        if m:
            close()
            tid = m.group(2) or m.group(3)
            cur = {
                "tid": int_text(tid, lo=0),
                "name": m.group(1),
                "innermost_first": False,
                "frames": [],
                "main": False,
            }
            continue
        m = _TB_HEAD.match(line)
        if m:
            if cur is None or cur["frames"]:
                close()
                cur = {"tid": None, "name": None, "innermost_first": False, "frames": [], "main": False}
            else:
                cur["innermost_first"] = False
            continue
        if cur is not None and line.lstrip().startswith("File "):
            cur["frames"].append(line)
    close()
    return threads, current, last_innermost_first, dropped


def _no_main_thread(text: str, source_file: str) -> ProcessDump:
    """A faulthandler dump without its main thread: no evidence either way (status ``cut``)."""
    if text.rstrip().rsplit("\n", 1)[-1].strip() == "...":  # faulthandler stops after 100 threads, newest first
        why = (
            "faulthandler lists at most 100 threads, newest first, and the main thread was not among them "
            "(py-spy shows every thread): no evidence either way"
        )
    else:
        why = (
            "its stack dump was cut off before the main thread (the process was stopped while faulthandler "
            "wrote): no evidence either way"
        )
    return cut_dump(source_file, None, why)


def looks_like_traceback(text: str) -> bool:
    """True when ``text`` holds faulthandler or traceback stacks rather than py-spy output."""
    head = text[:4096]
    return bool(re.search(r"\(most recent call (first|last)\):", head) or re.search(r'^\s+File "', head, re.M))
