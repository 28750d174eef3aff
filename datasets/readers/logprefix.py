"""Line prefixes of consoles that hold several machines' lines: pdsh (as DeepSpeed's launcher runs it),
``kubectl logs --prefix`` (every pod of a job in one stream) and ``srun --label`` (every task of a Slurm step)."""

from __future__ import annotations

import re
from typing import Any

_PDSH = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9._-]{0,62}): ")
"""pdsh's prefix on every remote line (``worker-3: ...``: DeepSpeed's multi-node launcher)."""


def line_of(rec: dict[str, Any]) -> int:
    """The line number in a record's ``file:line`` source."""
    tail = str(rec.get("source", "")).rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def pdsh_host(line: str) -> str | None:
    m = _PDSH.match(line)
    host = m.group("host") if m else ""
    # a host name has a digit (worker-3, node017) and a letter (srun --label prefixes a bare task number)
    return host if any(c.isdigit() for c in host) and any(c.isalpha() for c in host) else None


_KUBECTL = re.compile(r"^\[pod/(?P<host>[a-z0-9][a-z0-9.-]{0,252})/[a-z0-9][a-z0-9-]{0,62}\] ")
"""``kubectl logs --prefix``: ``[pod/<pod>/<container>] `` (the pod is the machine a worker group ran on)."""
_SRUN = re.compile(r"^ {0,6}(?P<task>\d{1,6}): ")
"""``srun --label``: the task number (one launcher per task; no machine: the task's own lines may name it)."""


def line_source(line: str, kind: str) -> tuple[str, str | None, int] | None:
    """(the stream's key, its machine or None, the prefix's length) of a line of a ``kind`` console."""
    if kind == "pdsh":
        host = pdsh_host(line)
        return None if host is None else (host, host, len(host) + 2)
    m = (_KUBECTL if kind == "kubectl" else _SRUN).match(line)
    if m is None:
        return None
    if kind == "kubectl":
        return m.group("host"), m.group("host"), m.end()
    return f"task {int(m.group('task'))}", None, m.end()


def prefix_kind(head: bytes) -> str | None:
    """``pdsh``, ``kubectl`` or ``srun`` when most of a file's first lines (``head``, its first bytes) carry that
    console's per-line prefix, else None."""
    lines = [ln for ln in head.decode("utf-8", errors="replace").splitlines()[:400] if ln.strip()]
    if len(lines) < 4:
        return None
    for kind in ("pdsh", "kubectl", "srun"):
        if sum(line_source(ln, kind) is not None for ln in lines) >= 0.5 * len(lines):
            return kind
    return None


def is_pdsh(head: bytes) -> bool:
    """Whether most of a file's first lines (``head``, its first bytes) carry pdsh's ``<host>: `` prefix."""
    return prefix_kind(head) == "pdsh"
