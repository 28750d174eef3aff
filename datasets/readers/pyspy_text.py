"""Reader for ``py-spy dump`` text output (one or several processes, all threads, innermost first).

Sample (py-spy 0.4.3)::

    Process 11903: /opt/venv/bin/python3 -u /opt/job/fr_gloo.py hang
    Python v3.11.7 (/usr/local/bin/python3.11)

    Thread 11903 (idle): "MainThread"
        all_reduce (torch/distributed/distributed_c10d.py:3252)
        <module> (fr_gloo.py:29)

Handles ``--subprocesses`` (several ``Process`` sections), ``--locals`` (indented argument blocks,
skipped), ``--native`` frames without line numbers, idle/active/gil markers, py-spy's own error
output (a failed dump) and files cut short (status ``partial``).
"""

from __future__ import annotations

import re
from typing import Any

from rankscope.datasets.domain.stacks import Frame, ProcessDump, ThreadDump
from rankscope.datasets.readers.base import Interner, failed_dump, mark_main

FORMAT = "pyspy-text"

_PROCESS = re.compile(r"^Process (\d+): ?(.*)$")
_THREAD = re.compile(r'^Thread (0[xX][0-9a-fA-F]+|\d+)(?: \(([^)]*)\))?(?:: "(.*)")?\s*$')
_FRAME = re.compile(r"^ {4}(\S.*?) \(([^()]*?)(?::(\d+))?\)\s*$")
_ERROR = re.compile(r"^(Error|error|Permission Denied|Failed)\b[: ]?(.*)$")


def _thread_id(token: str) -> int:
    return int(token, 16) if token.lower().startswith("0x") else int(token)


_INTERN = Interner()


def _frames(lines: list[str]) -> tuple[Frame, ...]:
    key = tuple(lines)
    frames = _INTERN.get(key)
    if frames is None:
        out = []
        for line in lines:
            m = _FRAME.match(line)
            if m:
                out.append(Frame(m.group(1), m.group(2), int(m.group(3)) if m.group(3) else None))
        frames = _INTERN.put(key, tuple(out))
    return frames


def parse_pyspy_text(text: str, source_file: str = "") -> list[ProcessDump]:
    """Every process in a ``py-spy dump`` text; a file with no stack yields one failed dump."""
    if not text.strip():
        return [failed_dump(source_file, FORMAT, "empty dump file")]
    truncated = not text.endswith("\n")
    procs: list[ProcessDump] = []
    pid: int | None = None
    cmdline: str | None = None
    threads: list[ThreadDump] = []
    cur: dict[str, Any] | None = None
    errors: list[str] = []

    def close_thread() -> None:
        nonlocal cur
        if cur is not None:
            threads.append(
                ThreadDump(_frames(cur["frames"]), cur["tid"], cur["name"], cur["active"], cur["name"] == "MainThread")
            )
            cur = None

    def close_process(final: bool = False) -> None:
        nonlocal threads, pid, cmdline
        close_thread()
        if pid is None and not threads:
            return
        status = "ok"
        err = None
        if final and truncated:
            status, err = "partial", "file ends mid-line (truncated dump)"
        if not threads:
            procs.append(failed_dump(source_file, FORMAT, "; ".join(errors) or "no threads in dump", pid))
        else:
            procs.append(ProcessDump(mark_main(threads, pid), pid, cmdline, status, err, FORMAT, source_file))
        threads, pid, cmdline = [], None, None

    for line in text.splitlines():
        if line.startswith("    "):
            if cur is not None and line[4] != " ":  # a frame; deeper indents are --locals blocks
                cur["frames"].append(line)
            continue
        if not line.strip():
            continue
        m = _THREAD.match(line)
        if m:
            close_thread()
            marker = (m.group(2) or "").lower()
            active = None if not marker else ("active" in marker)
            cur = {"tid": _thread_id(m.group(1)), "name": m.group(3), "active": active, "frames": []}
            continue
        m = _PROCESS.match(line)
        if m:
            close_process()
            pid, cmdline = int(m.group(1)), m.group(2).strip() or None
            continue
        if line.startswith("Python v"):
            continue
        m = _ERROR.match(line.strip())
        if m and not line.startswith(" "):
            errors.append(line.strip())
            continue
        # anything else (locals blocks, "..." elisions, unknown lines) is not a frame; ignore it
    close_process(final=True)
    if not procs:
        what = "; ".join(errors) if errors else "no 'Process'/'Thread' sections (not py-spy text?)"
        return [failed_dump(source_file, FORMAT, what)]
    return procs
