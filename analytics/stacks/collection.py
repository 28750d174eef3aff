"""Collection problems: stack captures that failed, in words a user can act on.

A failed capture (py-spy's own error output, an empty or unreadable file, a dump cut off as the
process was stopped) says nothing about the process: it is never clustered, never a finding, never
a culprit. It is reported with a reason line ("rank 1: py-spy failed: Permission Denied - rerun
with CAP_SYS_PTRACE"). One kind says something after all: the process was *gone* when py-spy looked
(no such process). A rank whose process is gone, that is known to exist and whose parallel group
waits for it, is a missing dump (see :mod:`.snapshot`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rankscope.datasets.domain.stacks import ProcStacks


@dataclass(frozen=True)
class CaptureProblem:
    """One process whose stack capture gave no evidence."""

    rank: int | None
    role: str
    # stopped | concurrent-attach | permission | process-gone | not-python | timeout | empty | unreadable | absent |
    # cut | failed
    kind: str
    detail: str  # what the capture said, one line
    advice: str  # what to do about it
    source: str

    @property
    def gone(self) -> bool:
        """No live process of the job was there to capture: it was not running, its dump is absent, or py-spy
        found no Python at its pid (``not-python``: the trainer exited and the pid went to another program; a
        collection that names the wrong pids fails for every rank, not one)."""
        return self.kind in ("process-gone", "absent", "not-python")

    def line(self) -> str:
        """One line for people: ``rank 1: py-spy failed: Permission Denied: ... - rerun py-spy with ...``."""
        who = f"rank {self.rank}" if self.rank is not None else self.source or "a process"
        role = "" if self.role == "trainer" else f" ({self.role})"
        what = {"cut": "stack dump cut off", "empty": "empty dump", "absent": "no dump"}.get(
            self.kind, "capture failed"
        )
        detail = self.detail if self.detail.startswith("py-spy failed") else f"{what}: {self.detail}"
        return f"{who}{role}: {detail}" + (f" - {self.advice}" if self.advice else "")


# (kind, pattern over the error text, advice); the first match wins
_KINDS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (
        "stopped",
        re.compile(r"waitpid result PtraceEvent\(.{0,40}?\bSIGSTOP\b|process is stopped|\(stopped\)", re.I),
        "the process is stopped (SIGSTOP, state T): it runs no code at all; if its peers wait for it, look at it "
        "first (who stopped it: a debugger, a job-control signal, the scheduler?)",
    ),
    (
        "concurrent-attach",
        re.compile(r"failed to suspend process|already being traced|ptrace.*busy", re.I),
        "two tools attached to the process at once; capture one process at a time",
    ),
    (
        "permission",
        re.compile(r"permission denied|operation not permitted|eperm|elevated permissions|ptrace_scope", re.I),
        "rerun py-spy with CAP_SYS_PTRACE (or as root; check kernel.yama.ptrace_scope)",
    ),
    (
        "process-gone",
        re.compile(
            r"failed to (?:get process executable name|open process)|check (?:that|if) (?:the process|it) is "
            r"running|no such process|process \d+ (?:not found|exited)",
            re.I,
        ),
        "the process was not running when it was captured (exited, crashed, or a stale pid)",
    ),
    (
        "not-python",
        re.compile(r"failed to find python (?:version|interpreter)|not a python process", re.I),
        "no Python at that pid: the trainer exited (its pid reused), or py-spy was pointed at the launcher's or a "
        "shell's pid (then every rank fails alike)",
    ),
    ("timeout", re.compile(r"timed? ?out|timeout", re.I), "py-spy timed out (a process stuck in the kernel?)"),
    ("absent", re.compile(r"file is absent|listed in manifest", re.I), "the dump file is missing"),
    ("empty", re.compile(r"\bempty\b|no (?:stack|thread)s? (?:found|in)|0 bytes", re.I), "the dump file is empty"),
    ("unreadable", re.compile(r"unreadable|invalid|unexpected|malformed|not a", re.I), ""),
)
_GONE_KINDS = ("gone", "not-running", "no-process", "exited", "absent", "missing")


def _one_line(text: str) -> str:
    """The first non-blank line of an error (py-spy's own message; its "Caused by:" lines follow)."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:200]


def capture_problem(p: ProcStacks) -> CaptureProblem:
    """Why ``p`` (status ``failed`` or ``cut``) gives no evidence, and what to do about it.

    The reader's ``failure_kind`` (when it sets one) is used as is; otherwise the kind is read from
    the error text py-spy or the reader left.
    """
    error = p.error or ""
    if p.status == "cut":
        return CaptureProblem(p.rank, p.role, "cut", _one_line(error) or "cut off", "", p.source)
    declared = getattr(p, "failure_kind", None)
    kind, advice = "failed", ""
    for k, pattern, adv in _KINDS:
        if pattern.search(error):
            kind, advice = k, adv
            break
    if isinstance(declared, str) and declared:
        low = declared.lower()
        if any(g in low for g in _GONE_KINDS):
            kind = "process-gone" if kind != "absent" else kind
        elif kind in ("failed", "unreadable", "empty") or kind == low:
            kind = low
    detail = _one_line(error) if error.strip() else "no stack in the file"
    prefix = "py-spy failed: " if p.source_format.startswith("pyspy") and kind not in ("empty", "unreadable") else ""
    return CaptureProblem(p.rank, p.role, kind, prefix + detail, advice, p.source)
