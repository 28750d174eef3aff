"""Reader for ``py-spy dump`` text output (one or several processes, all threads, innermost first).

Sample (py-spy 0.4.3)::

    Process 11903: /opt/venv/bin/python3 -u /opt/job/fr_gloo.py hang
    Python v3.11.7 (/usr/local/bin/python3.11)

    Thread 11903 (idle): "MainThread"
        all_reduce (torch/distributed/distributed_c10d.py:3252)
        <module> (fr_gloo.py:29)

Handles ``--subprocesses`` and concatenated dumps (several ``Process`` sections: one process each),
``--locals`` (indented argument blocks, skipped), ``--native`` frames without line numbers (an unsymbolized
``0x7f0911aa3f16 (libc.so.6)`` becomes ``0x? (libc.so.6)``: addresses differ in every process),
idle/active/gil markers, log prefixes on every line (``prefixed``: stripped first), files cut short
(status ``partial``) and py-spy's own error output, a failed dump whose ``failure_kind`` says why::

    Permission Denied: Try running again with elevated permissions by going 'sudo env "PATH=$PATH" !!'
    Error: Failed to get process executable name. Check that the process is running.
    Error: Failed to find python version from target process
    Process 457211: ... / Python v3.11.7 ... / Error: Failed to get stack traces
    Caused by:
        0: Failed to suspend process
        1: EPERM: Operation not permitted
    Stack backtrace:                      (RUST_BACKTRACE=1: skipped)
       0: <E as anyhow::context::ext::StdError>::ext_context
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from rankscope.datasets.domain.bounds import MAX_LINE_CHARS, MAX_LINE_NO, int_text
from rankscope.datasets.domain.stacks import Frame, ProcessDump, ThreadDump
from rankscope.datasets.readers.base import Interner, block_readable, failed_dump, mark_main, native_name

FORMAT = "pyspy-text"

_PROCESS = re.compile(r"^Process (\d+): ?(.*)$")
_THREAD = re.compile(r'^Thread (0[xX][0-9a-fA-F]+|\d+)(?: \(([^)]*)\))?(?:: "(.*)")?\s*$')
_FRAME = re.compile(r"^ {4}(\S.*?) \(([^()]*?)(?::(\d+))?\)\s*$")
_ERROR = re.compile(r"^(Error|error|Permission Denied|Failed)\b[: ]?(.*)$")
_CAUSE = re.compile(r"^\s+\d+: (.*\S)\s*$")


# The common whole file, matched block by block: one process header, then threads whose frame lines (and
# --locals blocks) are all indented. Anything else (errors, several processes, odd line breaks) goes line by line.
_FAST_HEAD = re.compile(r"Process (\d+): ?([^\n]*)\n(?:Python v[^\n]*\n)?\n*")
_FAST_THREAD = re.compile(
    r'Thread (0[xX][0-9a-fA-F]+|\d+)(?: \(([^)\n]*)\))?(?:: "([^\n]*)")?[ \t]*\n((?: {4}[^\n]*\n)*)\n*'
)


def _thread_id(token: str) -> int | None:
    return int_text(token, lo=0)


_INTERN = Interner()


def _frames(lines: list[str]) -> tuple[Frame, ...]:
    key = tuple(lines)
    frames = _INTERN.get(key)
    if frames is None:
        out = []
        for line in lines:
            m = _FRAME.match(line)
            if m:
                name = native_name(m.group(1))
                out.append(Frame(name, m.group(2), int_text(m.group(3), lo=0, hi=MAX_LINE_NO)))
        frames = _INTERN.put(key, tuple(out))
    return frames


def _block_frames(block: str) -> tuple[Frame, ...]:
    """The frames of one thread's indented lines (as the line-by-line parser keeps them), interned by text."""
    frames = _INTERN.get(block)
    if frames is None:
        kept = [ln for ln in block.split("\n") if ln[4:5] not in (" ", "") and len(ln) <= MAX_LINE_CHARS]
        frames = _INTERN.put(block, _frames(kept))
    return frames


def _fast(text: str, source_file: str) -> list[ProcessDump] | None:
    """One whole process dump read thread block by thread block, or None when ``text`` is anything else."""
    if not block_readable(text):
        return None
    m = _FAST_HEAD.match(text)
    if m is None:
        return None
    pid, cmdline = int_text(m.group(1), lo=0), m.group(2).strip() or None
    pos, end = m.end(), len(text)
    threads = []
    for t in _FAST_THREAD.finditer(text, pos):
        if t.start() != pos:
            return None
        pos = t.end()
        marker = (t.group(2) or "").lower()
        name = t.group(3)
        threads.append(
            ThreadDump(
                _block_frames(t.group(4)),
                _thread_id(t.group(1)),
                name,
                None if not marker else ("active" in marker),
                name == "MainThread",
            )
        )
    if pos != end or not threads:
        return None
    return [ProcessDump(mark_main(threads, pid), pid, cmdline, "ok", None, FORMAT, source_file)]


def _error_text(errors: list[str], causes: list[str]) -> str:
    text = "; ".join(errors)
    return f"{text} (caused by: {'; '.join(dict.fromkeys(causes))})" if causes else text


def parse_pyspy_text(text: str, source_file: str = "", *, prefixed: bool = False) -> list[ProcessDump]:
    """Every process in a ``py-spy dump`` text; a file with no stack yields one failed dump.

    ``prefixed``: every line may carry a log prefix (glog, timestamp, torchrun worker tag) to strip first.
    """
    if not text.strip():
        return [failed_dump(source_file, FORMAT, "empty dump file", kind="empty")]
    if prefixed:
        from rankscope.datasets.readers.sniff import strip_prefix

        text = "\n".join(strip_prefix(line)[0] for line in text.split("\n"))
    fast = _fast(text, source_file)
    if fast is not None:
        return fast
    if text.startswith("----") and _DSHBAK.match(text):
        return _by_host(text, source_file)
    procs = _parse(text, source_file)
    header = _header(text) if len(procs) == 1 and not text.startswith("Process ") else ()
    return [replace(procs[0], header=header)] if header else procs


_DSHBAK = re.compile(r"^-{4,}\n([A-Za-z0-9][A-Za-z0-9._-]{0,62})\n-{4,}\n", re.M)
"""``dshbak``'s header over each host's share of ``pdsh`` output (``pdsh -w gpu[01-02] py-spy dump ... | dshbak``)."""


def _by_host(text: str, source_file: str) -> list[ProcessDump]:
    """Each host section of ``dshbak`` output parsed alone, its processes marked with their machine."""
    parts = _DSHBAK.split(text)  # [before, host, section, host, section, ...]
    out: list[ProcessDump] = []
    for host, section in zip(parts[1::2], parts[2::2]):
        out += [replace(p, header=(("host", host),)) for p in parse_pyspy_text(section, source_file)]
    return out


_HEADER_KEY = re.compile(
    r"(?<![A-Za-z0-9_])(RANK|LOCAL_RANK|HOST|HOSTNAME|NODE_NAME|NODENAME)=([A-Za-z0-9][A-Za-z0-9_.:-]*)"
)
_PROCESS_LINE = re.compile(r"^Process \d+:", re.M)


def _header(text: str) -> tuple[tuple[str, str], ...]:
    """``RANK=``, ``LOCAL_RANK=`` and host words a wrapper printed before the one dump of a file (``echo "RANK=$RANK
    HOST=$(hostname)"; py-spy dump --pid $p``); the first of each key."""
    m = _PROCESS_LINE.search(text[:4096])
    if m is None or m.start() == 0:
        return ()
    found: dict[str, str] = {}
    for k, v in _HEADER_KEY.findall(text[: m.start()]):
        key = "host" if k in ("HOST", "HOSTNAME", "NODE_NAME", "NODENAME") else k.lower()
        if key != "host" and not v.isdigit():
            continue
        found.setdefault(key, v)
    return tuple(found.items())


def _parse(text: str, source_file: str) -> list[ProcessDump]:
    truncated = not text.endswith("\n")
    procs: list[ProcessDump] = []
    pid: int | None = None
    cmdline: str | None = None
    threads: list[ThreadDump] = []
    cur: dict[str, Any] | None = None
    errors: list[str] = []
    causes: list[str] = []
    section = ""  # "caused" after py-spy's "Caused by:", "backtrace" in a Rust backtrace

    def close_thread() -> None:
        nonlocal cur
        if cur is not None:
            threads.append(
                ThreadDump(_frames(cur["frames"]), cur["tid"], cur["name"], cur["active"], cur["name"] == "MainThread")
            )
            cur = None

    def close_process(final: bool = False) -> None:
        nonlocal threads, pid, cmdline, section
        close_thread()
        if pid is None and not threads:
            if errors:  # py-spy's error for a process it never attached to (no header)
                procs.append(failed_dump(source_file, FORMAT, _error_text(errors, causes)))
            errors.clear()
            causes.clear()
            section = ""
            return
        status = "ok"
        err = None
        if final and truncated:
            status, err = "partial", "file ends mid-line (truncated dump)"
        if not threads:
            if errors:
                procs.append(failed_dump(source_file, FORMAT, _error_text(errors, causes), pid))
            else:  # py-spy printed the header, then failed on stderr (not kept here)
                why = "py-spy printed the process header but no thread (its error went elsewhere)"
                procs.append(failed_dump(source_file, FORMAT, why, pid, kind="other"))
        else:
            procs.append(ProcessDump(mark_main(threads, pid), pid, cmdline, status, err, FORMAT, source_file))
        threads, pid, cmdline, section = [], None, None, ""
        errors.clear()
        causes.clear()

    for line in text.splitlines():
        if section and cur is None and line[:1] in (" ", "\t"):
            m = _CAUSE.match(line)
            if m and section == "caused":
                causes.append(m.group(1))
            continue  # a cause, or a frame of the Rust backtrace
        if line.startswith("    "):
            # a frame; deeper indents are --locals blocks, lines beyond any real frame's length are garbage
            if cur is not None and line[4:5] not in (" ", "") and len(line) <= MAX_LINE_CHARS:
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
            pid, cmdline = int_text(m.group(1), lo=0), m.group(2).strip() or None
            continue
        if line.startswith("Python v"):
            continue
        stripped = line.strip()
        if stripped == "Caused by:" and errors:
            section = "caused"
            continue
        if stripped == "Stack backtrace:":
            section = "backtrace"
            continue
        m = _ERROR.match(stripped)
        if m and not line.startswith(" "):
            if pid is None and errors and section != "error":
                close_process()  # the previous process's error is complete: this one is another's
            errors.append(stripped)
            section = "error"
            continue
        # anything else (locals blocks, "..." elisions, unknown lines) is not a frame; ignore it
    close_process(final=True)
    if not procs:
        return [
            failed_dump(source_file, FORMAT, "no 'Process'/'Thread' sections (not py-spy text?)", kind="unreadable")
        ]
    return procs
