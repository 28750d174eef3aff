"""What a file is, from its first few KB: one content sniffer for every evidence format.

File names lie (a ``.txt`` py-spy dump that starts with collector log lines, a ``.json`` holding
py-spy's error text), so the content decides and the suffix only breaks ties. Per-line log prefixes
are stripped first (glog ``I1129 10:00:00.123456 tid file:line]``, c10's ``[E1129 10:00:00.1 file:line]``,
``[2026-11-30 10:00:01,123]`` timestamps, torchrun's ``[rank3]:`` / ``[default3]:`` worker prefixes),
then the first structural line decides:

=====================  ==========================================================================
``pyspy-text``         ``Process 123: cmdline`` / py-spy's ``Thread 123 (idle): "MainThread"``
``pyspy-error``        py-spy's own failure (``Error: ...``, ``Permission Denied: ...``)
``traceback``          faulthandler (``Thread 0x... (most recent call first):``) or a Python traceback
``pyspy-json``         a JSON array of thread objects (possibly several arrays concatenated)
``json``               a JSON object: classified by its keys (:func:`json_kind`)
``pickle``             a pickle (a Flight Recorder dump candidate)
``log``                a training or launcher log: worker prefixes, glog lines, NCCL/gloo/torchrun text
``empty`` / ``unknown`` nothing usable
=====================  ==========================================================================

Only the head is read (:data:`HEAD_BYTES`), so sniffing costs nothing beside reading the file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from rankscope.datasets.readers.logprefix import prefix_kind

HEAD_BYTES = 1 << 12

# torchrun's worker prefixes: [rank<GLOBAL>]: and [<role><LOCAL>]: (role "default" unless --role), repeated
WORKER_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z_][A-Za-z0-9_-]*?)(?P<n>\d+)\]:")


def worker_tag(text: str) -> tuple[str, int, int] | None:
    """torchrun's worker prefix at the start of ``text``: (``"rank"`` for ``[rank5]:``, a global rank, or
    ``"local_rank"`` for ``[<role>5]:``, a launcher's local rank; the number; where the prefix ends), else None."""
    m = WORKER_PREFIX.match(text)
    if m is None:
        return None
    return "rank" if m.group("role").lower() == "rank" else "local_rank", int(m.group("n")), m.end()


# glog as torch's Python logging prints it ("W1201 15:30:21.521000 10673 torch/distributed/run.py:874] ")
GLOG = re.compile(r"^(?P<lvl>[IWEF])(?P<md>\d{3,4}) (?P<hms>\d\d:\d\d:\d\d(?:\.\d+)?) +\d+ +[^\]\s]+:\d+\] ?")
# c10's C++ log prefix ("[E1201 04:51:27.502991676 ProcessGroupNCCL.cpp:632] ", older "[E ProcessGroupNCCL.cpp:574] ").
# c10 writes the month unpadded and the day padded (c10/util/Logging.cpp: ``tm_mon + 1``, then ``setw(2)``
# for the day): "[E321 02:07:08.408271257 ...]" is March 21.
C10_LOG = re.compile(r"^\[(?P<lvl>[IWEF])(?:(?P<md>\d{3,4}) (?P<hms>\d\d:\d\d:\d\d(?:\.\d+)?))? *[^\]\s]+:\d+\] ?")
# "[2026-11-30 10:00:01,123] ", "2026-11-30T10:00:01.123Z ", "[2026-12-03 12:13:35] "
STAMP = re.compile(
    r"^ ?\[?(?P<date>\d{4}-\d\d-\d\d)[ T_](?P<hms>\d\d:\d\d:\d\d(?:[.,]\d+)?)(?P<tz>Z|[+-]\d\d:?\d\d)?\]?:? ?"
)
# Ray's "(WorkerDict pid=3490362) " and similar process tags in front of forwarded output
RAY = re.compile(r"^\([A-Za-z_][\w.]* pid=\d+(?:, ip=[\d.]+)?\) ")

PYSPY_PROCESS = re.compile(r"^Process \d+: ")
PYSPY_THREAD = re.compile(r'^Thread (?:0[xX][0-9a-fA-F]+|\d+) \((?:idle|active|gil|[a-z +]+)\)(?:: ".*")?\s*$')
# py-spy's own failures (its wordings, not any line starting with "Error")
PYSPY_ERROR = re.compile(
    r"^(?:Permission Denied: |Error: (?:Failed to|No such|Process \d+|Timed out|Couldn't|Unable to|"
    r"Operation not permitted|Error getting|No python processes))"
)
TRACEBACK = re.compile(
    r"^(?:(?:Current thread|Thread) 0[xX][0-9a-fA-F]+(?: \[.*?\])? \(most recent call first\):"
    r"|Traceback \(most recent call last\):|Stack \(most recent call last\):|Fatal Python error: )"
)
_LOG_MARKERS = re.compile(
    r"ProcessGroupNCCL|Watchdog caught|ChildFailedError|torch\.distributed\.elastic|torch/distributed/run\.py"
    r"|Timed out waiting \d+ms|Connection closed by peer|iteration\s+\d+\s*/\s*\d+|NCCL (?:INFO|WARN)"
)
LOG_SUFFIXES = (".log", ".out", ".err", ".stderr", ".stdout")
TABLE_SUFFIXES = (".csv", ".parquet", ".pq", ".csv.gz")
"""Tables (``metrics*`` and ``timings*`` files): CSV or Parquet."""
LINES_SUFFIXES = (".jsonl", ".ndjson")
"""JSON Lines, one record per line (``timings*`` files)."""
LOG_NAMES = frozenset({"stdout", "stderr", "stdout.txt", "stderr.txt", "console", "output"})


@dataclass(frozen=True)
class Sniffed:
    """What the head of a file says it is."""

    kind: str  # pyspy-text | pyspy-error | traceback | pyspy-json | json | pickle | log | empty | unknown
    prefixed: bool = False  # structural lines carry a log prefix to strip before parsing
    why: str = ""  # for unknown: what the head looked like


def strip_prefix(line: str) -> tuple[str, bool]:
    """``line`` without its log prefixes (worker, glog, c10, timestamp, Ray tags), and whether it had any."""
    out, changed = line, False
    for _ in range(4):  # prefixes nest: "[default1]:[rank5]:[E1201 ...] text"
        m = WORKER_PREFIX.match(out) or GLOG.match(out) or C10_LOG.match(out) or STAMP.match(out) or RAY.match(out)
        if m is None or m.end() == 0:
            break
        out, changed = out[m.end() :], True
    return out, changed


def _structural(line: str) -> str | None:
    if PYSPY_PROCESS.match(line) or PYSPY_THREAD.match(line):
        return "pyspy-text"
    if TRACEBACK.match(line):
        return "traceback"
    if PYSPY_ERROR.match(line):
        return "pyspy-error"
    return None


_EMPTY, _PICKLE, _JSON = Sniffed("empty"), Sniffed("pickle"), Sniffed("json")
_PYSPY_JSON, _PYSPY_TEXT, _TRACEBACK = Sniffed("pyspy-json"), Sniffed("pyspy-text"), Sniffed("traceback")


def sniff(head: bytes, name: str = "") -> Sniffed:
    """Classify a file from its first bytes (``HEAD_BYTES`` are enough) and, to break ties, its name."""
    body = head.lstrip()
    if body.startswith(b"\xef\xbb\xbf"):
        body = body[3:].lstrip()
    if not body:
        return _EMPTY
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return _PICKLE
    if body[:1] == b"{":
        return _JSON
    if body[:1] == b"[" and body[1:].lstrip()[:1] in (b"{", b"]", b""):
        return _PYSPY_JSON
    low = name.lower().rsplit("/", 1)[-1]
    log_suffix = low.endswith(LOG_SUFFIXES) or low in LOG_NAMES
    if body.startswith(b"Process ") and PYSPY_PROCESS.match(body[:64].decode("utf-8", "replace")):
        return _PYSPY_TEXT  # the common case, decided without splitting lines
    if not log_suffix and body.startswith((b"Thread 0x", b"Current thread 0x", b"Traceback (most recent call last)")):
        return _TRACEBACK
    text = head.decode("utf-8", errors="replace")
    worker = log_lines = 0
    for raw in text.splitlines()[:200]:
        if not raw.strip():
            continue
        if WORKER_PREFIX.match(raw):
            worker += 1
        line, prefixed = strip_prefix(raw)
        kind = _structural(line)
        if kind is not None and not worker:
            if kind == "traceback" and log_suffix:  # a process's stderr: tracebacks, warnings, prints
                return Sniffed("log")
            return Sniffed(kind, prefixed=prefixed)
        if prefixed or _LOG_MARKERS.search(line):
            log_lines += 1
    if worker or log_lines or (log_suffix and text.strip()):
        return Sniffed("log")
    if prefix_kind(head) is not None:  # a console of several machines (pdsh, kubectl --prefix, srun --label),
        return Sniffed("log")  # whatever its name: the console reader splits its streams
    if "\ufffd" in text[:512]:
        return Sniffed("unknown", why="binary data")
    first = text.strip().splitlines()[0][:80] if text.strip() else ""
    return Sniffed("unknown", why=f"no stack, log or dump format recognised (first line: {first!r})")


# -- JSON objects by their keys ---------------------------------------------------------------------------
def json_kind(obj: Any) -> tuple[str, str]:
    """``(kind, why)`` of a decoded JSON value: ``fr`` (Flight Recorder), ``torchelastic-error``
    (TORCHELASTIC_ERROR_FILE), ``prometheus`` (an HTTP API query result), ``hook-exit``, ``hook-identity``,
    ``pyspy-json`` (a ``{"threads": [...]}`` wrapper), else ``other`` with what it looks like."""
    if isinstance(obj, list):
        return ("pyspy-json", "") if all(isinstance(t, dict) for t in obj) else ("other", "a JSON list")
    if not isinstance(obj, dict):
        return "other", f"a JSON {type(obj).__name__}"
    keys = set(obj)
    if keys & {"entries", "pg_config", "pg_status"}:
        return "fr", ""
    msg = obj.get("message")
    if isinstance(msg, dict) and ("extraInfo" in msg or "message" in msg):
        return "torchelastic-error", ""
    if isinstance(msg, str) and isinstance(obj.get("extraInfo"), dict):
        return "torchelastic-error", ""
    if "status" in keys and isinstance(obj.get("data"), dict) and "resultType" in obj["data"]:
        return "prometheus", ""
    if "threads" in keys and isinstance(obj["threads"], list):
        return "pyspy-json", ""
    if {"type", "time"} <= keys and ("rank" in keys or "frames" in keys):
        return "hook-exit", ""
    if "pid" in keys and ("rank" in keys or "role" in keys):
        return "hook-identity", ""
    shown = ", ".join(sorted(map(str, keys))[:5])
    return "other", f"a JSON object with keys {shown}" + (", ..." if len(keys) > 5 else "")


def json_kind_from_head(head: bytes) -> str | None:
    """The kind of a JSON object when its first bytes already tell (big Flight Recorder dumps are not
    decoded twice); None when the whole object must be decoded."""
    if any(k in head for k in (b'"entries"', b'"pg_config"', b'"pg_status"')):
        return "fr"
    return None


def load_json(data: bytes) -> Any:
    """``data`` decoded as JSON; raises ValueError when it is not."""
    return json.loads(data)
