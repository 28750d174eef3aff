"""TorchElastic's own records: error files (``@record`` / ``TORCHELASTIC_ERROR_FILE``) and the launcher's
``ChildFailedError`` summary.

An error file (torch 2.x)::

    {"message": {"message": "OSError: [Errno 5] Input/output error: '/data/shards/train-00005.bin'",
                 "extraInfo": {"py_callstack": "Traceback (most recent call last):\\n ...", "timestamp": "1796139047"}}}

carries no rank: the rank is the path (``<log_dir>/<run_id>/attempt_<k>/<local_rank>/error.json`` on a host).
The summary torchrun prints when a worker fails::

    Root Cause (first observed failure):
    [0]:
      time      : 2026-12-01_15:30:47
      host      : dgx-h100-0743
      rank      : 5 (local_rank: 1)
      exitcode  : 1 (pid: 10759)
      error_file: /var/log/torchelastic/.../attempt_0/1/error.json
      traceback : Traceback (most recent call last): ...

Each agent reports its *own* first local failure, and in a hang it names a peer's timeout: the summary is
context (times, hosts, local-to-global ranks), never a culprit by itself.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass

from rankscope.datasets.domain.bounds import load_json_file, plausible_epoch, to_float
from rankscope.datasets.domain.logs import LauncherFailure
from rankscope.spine import InputError

_SUMMARY_TIME = re.compile(r"^(\d{4})-(\d\d)-(\d\d)_(\d\d):(\d\d):(\d\d)$")
_FIELD = re.compile(r"^\s{2}(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_RANK = re.compile(r"^(\d+)(?: \(local_rank: (\d+)\))?")
_EXIT = re.compile(r"^(-?\d+)(?: \(pid: (\d+)\))?")
_EXC = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*([A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure|Timeout|Abort)\w*)(?::\s?(.*))?$"
)
SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


@dataclass(frozen=True)
class ElasticError:
    """One TorchElastic error file, its rank still to be resolved from its path."""

    kind: str  # the exception type
    message: str
    time: float | None  # epoch seconds
    where: str  # innermost frame "function (file:line)"
    source: str


def summary_time(text: str) -> float | None:
    """``2026-12-01_15:30:47`` (the launcher's local time; read as UTC) as epoch seconds."""
    m = _SUMMARY_TIME.match(text.strip())
    if not m:
        return None
    y, mo, d, hh, mm, ss = map(int, m.groups())
    return float(calendar.timegm((y, mo, d, hh, mm, ss, 0, 0, 0)))


def split_exception(line: str) -> tuple[str, str] | None:
    """``("OSError", "[Errno 5] ...")`` for an exception line (``module.Type: message`` too), else None."""
    m = _EXC.match(line.strip())
    return (m.group(1), m.group(2) or "") if m else None


def innermost(callstack: str) -> str:
    """The innermost frame of a Python traceback text, ``function (file:line)``."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', callstack)
    if not frames:
        return ""
    f, line, fn = frames[-1]
    return f"{fn} ({f.rsplit('/', 1)[-1]}:{line})"


def read_error_file(path: str, display: str) -> ElasticError | None:
    """One TorchElastic error file; None when the file is not one (or is unreadable)."""
    try:
        obj = load_json_file(path)
    except InputError:  # unreadable, not a regular file, too big, too deep, not JSON
        return None
    if not isinstance(obj, dict):
        return None
    msg = obj.get("message")
    extra = obj.get("extraInfo")
    if isinstance(msg, dict):
        extra = msg.get("extraInfo", extra)
        msg = msg.get("message")
    if not isinstance(msg, str):
        return None
    extra = extra if isinstance(extra, dict) else {}
    stamp = extra.get("timestamp")
    when = to_float(stamp)
    if when is not None and not plausible_epoch(when):  # a zeroed or corrupt clock: no time
        when = None
    exc = split_exception(msg.splitlines()[0] if msg else "")
    kind, text = exc if exc else ("Error", msg)
    stack = str(extra.get("py_callstack") or "")
    return ElasticError(kind, text, when, innermost(stack), display)


class SummaryParser:
    """Feeds on the launcher's lines (prefixes stripped) and collects ``ChildFailedError`` entries."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.entries: list[LauncherFailure] = []
        self._cur: dict[str, str] | None = None
        self._root = False
        self._active = False
        self._last_field = ""
        self._at = 0  # the line of the entry being read

    def feed(self, line: str, lineno: int) -> bool:
        """Consume ``line`` when it belongs to a summary; returns True when it did."""
        s = line.rstrip("\n")
        if "ChildFailedError" in s or (s.endswith(" FAILED") and not s.startswith(" ")):
            self._active = True
            return True
        if not self._active:
            return False
        st = s.strip()
        if st.startswith("Root Cause"):
            self._close()
            self._root = True
            return True
        if st in ("Failures:", "<NO_OTHER_FAILURES>") or set(st) <= {"-"} and st:
            self._close()
            if st == "Failures:":
                self._root = False
            return True
        if set(st) <= {"="} and st:
            self._close()
            if self.entries:
                self._active = False
            return True
        if re.match(r"^\[\d+\]:$", st):
            self._close()
            self._cur, self._at = {}, lineno
            return True
        m = _FIELD.match(s)
        if m and self._cur is not None:
            self._cur[m.group(1)] = m.group(2).strip()
            self._last_field = m.group(1)
            return True
        if self._cur is not None and self._last_field == "traceback" and (s.startswith("    ") or s.startswith("  ")):
            if st:
                self._cur["last"] = st  # the exception is the traceback's last non-empty line
            return True
        return bool(self._cur is not None)

    def _close(self) -> None:
        c, self._cur, self._last_field = self._cur, None, ""
        if not c or "rank" not in c:
            return
        m = _RANK.match(c["rank"])
        if not m:
            return
        e = _EXIT.match(c.get("exitcode", ""))
        code = int(e.group(1)) if e else None
        error = c.get("last") or c.get("traceback", "")
        if code is not None and code < 0 and (not error or error.startswith("Signal")):
            error = error or f"Signal {-code} ({SIGNALS.get(-code, 'signal')})"
        self.entries.append(
            LauncherFailure(
                int(m.group(1)),
                int(m.group(2)) if m.group(2) else None,
                c.get("host", ""),
                summary_time(c.get("time", "")),
                code,
                int(e.group(2)) if e and e.group(2) else None,
                self._root,
                error,
                f"{self.source}:{self._at}" if self._at else self.source,
            )
        )

    def close(self) -> list[LauncherFailure]:
        self._close()
        return self.entries
