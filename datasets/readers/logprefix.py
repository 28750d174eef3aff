"""Line prefixes of consoles that hold several machines' lines (pdsh, as DeepSpeed's launcher runs it)."""

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


def is_pdsh(head: bytes) -> bool:
    """Whether most of a file's first lines (``head``, its first bytes) carry pdsh's ``<host>: `` prefix."""
    lines = [ln for ln in head.decode("utf-8", errors="replace").splitlines()[:400] if ln.strip()]
    return len(lines) >= 4 and sum(pdsh_host(ln) is not None for ln in lines) >= 0.5 * len(lines)
