"""Reader for ``py-spy dump --json``: a list of thread objects (several pids with ``--subprocesses``).

Each thread: ``pid, thread_id, thread_name, os_thread_id, active, owns_gil, frames`` with frames
``{name, filename, short_filename, line, module, locals, is_entry, is_shim_entry}`` innermost first.
Several arrays one after the other (``for p in ...; do py-spy dump --json --pid $p; done > node.json``)
are read as one list, one process per pid. A file cut short keeps every complete thread object
(status ``partial``); non-JSON text (py-spy's own error message) is a failed dump.
"""

from __future__ import annotations

import json
import operator
from typing import Any

import orjson

from rankscope.datasets.domain.bounds import FOREIGN, MAX_LINE_NO, json_too_deep, limits, to_int
from rankscope.datasets.domain.stacks import Frame, ProcessDump, ThreadDump
from rankscope.datasets.readers.base import Interner, failed_dump, mark_main, native_name
from rankscope.datasets.readers.pyspy_text import parse_pyspy_text

_INTERN = Interner()

FORMAT = "pyspy-json"


def _salvage(text: str) -> list[Any]:
    """Complete objects of a JSON array that was cut short."""
    dec = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        return []
    i += 1
    out = []
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except (ValueError, RecursionError):  # cut here, or a value no reader takes
            break
        out.append(obj)
    return out


def _concatenated(text: str) -> list[list[Any]] | None:
    """Several complete JSON arrays written one after another (``py-spy dump --json`` appended to one file, one
    array per dump), each a list of threads, or None when ``text`` is not that (one array cut short, or not
    JSON at all)."""
    dec = json.JSONDecoder()
    i, n, out, arrays = 0, len(text), [], 0
    while True:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, list):
            return None
        out.append(obj)
        arrays += 1
    return out if arrays > 1 else None


def _frame(f: Any) -> Frame:
    if not isinstance(f, dict):
        raise TypeError("frame is not an object")
    name = f.get("name") or "?"
    if isinstance(name, str):
        name = native_name(name)
    file = f.get("filename") or f.get("short_filename") or "?"
    line = f.get("line")
    return Frame(str(name), str(file), to_int(line, lo=1, hi=MAX_LINE_NO) if isinstance(line, int) else None)


_FRAME_KEY = operator.itemgetter("name", "filename", "line")


def parse_pyspy_json(text: str | bytes, source_file: str = "") -> list[ProcessDump]:
    """Every process in a ``py-spy dump --json`` output (text, or the file's bytes); bad input yields one
    failed dump.

    Well-formed UTF-8 JSON is decoded by orjson (about twice the standard library's speed on py-spy's
    pretty-printed frames); anything orjson refuses (a number past 64 bits, lone surrogates, a cut or
    concatenated file) goes the standard library's way, which says what is wrong and salvages what it can."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if not raw.strip():
        return [failed_dump(source_file, FORMAT, "empty dump file")]
    status, error = "ok", None
    try:  # orjson stops at 1,024 levels without recursing in Python, and _processes never recurses either
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if data is not None:
        return _processes(data, source_file, status, error)
    depth = limits().max_json_depth  # the standard library recurses: its input is checked first
    if json_too_deep(raw, depth):
        return [
            failed_dump(source_file, FORMAT, f"invalid JSON (nested deeper than {depth} levels)", kind="unreadable")
        ]
    if not isinstance(text, str):
        text = text.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except RecursionError:
        return [failed_dump(source_file, FORMAT, "invalid JSON (nested too deeply)", kind="unreadable")]
    except ValueError as exc:
        if not isinstance(exc, json.JSONDecodeError):  # a number over Python's 4,300-digit limit
            return [failed_dump(source_file, FORMAT, f"invalid JSON ({str(exc)[:80]})", kind="unreadable")]
        dumps = _concatenated(text) if exc.msg == "Extra data" else None
        if dumps is not None:  # one dump after another: the same pid again is that process captured again
            return [p for d in dumps for p in _processes(d, source_file, status, error)]
        data = _salvage(text)
        if not data:
            first = text.strip().splitlines()[0][:200]
            if text.lstrip().startswith("["):
                return [failed_dump(source_file, FORMAT, f"invalid JSON ({exc.msg} at line {exc.lineno})")]
            if first.startswith(("Error", "Permission Denied", "Process ")):  # py-spy's error text
                return parse_pyspy_text(text, source_file)
            return [failed_dump(source_file, FORMAT, first)]
        status, error = "partial", f"truncated JSON: kept {len(data)} complete thread(s)"
    return _processes(data, source_file, status, error)


def _processes(data: Any, source_file: str, status: str, error: str | None) -> list[ProcessDump]:
    """The processes of decoded py-spy JSON (a thread list, or ``{"threads": [...]}``)."""
    if isinstance(data, dict) and "threads" in data:  # tolerate {"threads": [...]} wrappers
        data = data["threads"]
    if not isinstance(data, list):
        return [failed_dump(source_file, FORMAT, "expected a JSON list of threads")]
    by_pid: dict[Any, list[ThreadDump]] = {}
    instance: dict[Any, int] = {}
    try:
        for t in data:
            if not isinstance(t, dict):
                raise TypeError("thread is not an object")
            raw = t.get("frames") or []
            key: tuple[tuple[Any, Any, Any], ...] | None
            try:
                key = tuple(map(_FRAME_KEY, raw))
                frames = _INTERN.get(key)  # TypeError: an unhashable field: frame by frame below
            except (KeyError, TypeError):
                key = frames = None
            if frames is None:
                frames = tuple(_frame(f) for f in raw)
                if key is not None and not any(k[0].__class__ is str and k[0].startswith("0x") for k in key):
                    _INTERN.put(key, frames)  # native addresses are normalized frame by frame, never interned
            tid = t.get("os_thread_id") or t.get("thread_id")
            pthread = t.get("thread_id")
            if t.get("thread_name") == "MainThread" and pthread.__class__ is int and 1 << 32 < pthread < 1 << 64:
                instance[t.get("pid")] = pthread  # its pthread_t: an address, one per process (ASLR)
            by_pid.setdefault(t.get("pid"), []).append(
                ThreadDump(
                    frames,
                    to_int(tid, lo=0) if isinstance(tid, int) else None,
                    t.get("thread_name"),
                    t.get("active") if isinstance(t.get("active"), bool) else None,
                    t.get("thread_name") == "MainThread",
                )
            )
    except FOREIGN as exc:
        return [failed_dump(source_file, FORMAT, f"unexpected py-spy JSON structure ({exc})")]
    if not by_pid:
        return [failed_dump(source_file, FORMAT, "no threads in dump")]
    return [
        ProcessDump(
            mark_main(threads, pid if isinstance(pid, int) else None),
            pid if isinstance(pid, int) else None,
            None,
            status,
            error,
            FORMAT,
            source_file,
            None,
            instance.get(pid),
        )
        for pid, threads in by_pid.items()
    ]
