"""Line prefixes of consoles that hold several machines' lines: pdsh (as DeepSpeed's launcher runs it),
``kubectl logs --prefix`` (every pod of a job in one stream) and ``srun --label`` (every task of a Slurm step)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
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


_BARE_HOST = re.compile(r"^(?=[^ ]*[A-Za-z])(?=[^ ]*\d)[A-Za-z0-9][A-Za-z0-9.-]{0,62}\s*$")
"""A line that is one host name and nothing else (``cn0101``: what ``srun --label hostname`` prints)."""


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


_SRUN_HOST = re.compile(r"^srun: error: (?P<host>[A-Za-z0-9][A-Za-z0-9._-]{0,62}): tasks? (?P<tasks>[\d,\-]{1,64}): ")
"""srun's own report of a task's end (``srun: error: gpu-b-014: task 1: Exited with exit code 1``)."""


def srun_task_hosts(line: str) -> dict[str, str]:
    """The machine of each task srun names in one of its error lines (``tasks 0-3``, ``task 1``), else {}."""
    m = _SRUN_HOST.match(line)
    if m is None:
        return {}
    out = {}
    for part in m.group("tasks").split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()) and int(hi or lo) - int(lo) < 4096:
            out.update({f"task {t}": m.group("host") for t in range(int(lo), int(hi or lo) + 1)})
    return out


@dataclass
class TaskHosts:
    """The machines of an ``srun --label`` console's tasks: what srun itself said (``srun: error: <host>: task
    N: ...``) and what each task printed as a bare host name (``srun --label hostname`` before the job step)."""

    said: dict[str, str] = field(default_factory=dict)
    printed: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def resolved(self, talking: Collection[str]) -> dict[str, tuple[str, str]]:
        """task -> (machine, "srun" | "hostname"). Printed names count only as one consistent map: one name per
        task, no machine named by two tasks (a two-tasks-per-node ``hostname`` step before a one-per-node job
        step), and the tasks that printed one are the tasks that talk (``talking``; none: a batch log of host
        names only). Another word printed alone (``uname -r``, a requeued run's host) spoils it: srun's own word
        and the launchers' failure summaries remain."""
        names = {t: next(iter(v)) for t, v in self.printed.items() if len(v) == 1}
        ok = (
            names
            and len(names) == len(self.printed)
            and len(set(names.values())) == len(names)
            and (not talking or set(names) == set(talking))
        )
        out = {t: (h, "hostname") for t, h in names.items()} if ok else {}
        out.update({t: (h, "srun") for t, h in self.said.items()})
        return out


def demux(
    lines: Iterable[str], kind: str | None, tasks: TaskHosts, max_line: int
) -> Iterator[tuple[int, str | None, str | None, str]]:
    """(line number, stream key, its machine, the line without its prefix) of each line of a ``kind`` console
    (None: one stream, key None); lines are cut at ``max_line``. srun's lines fill ``tasks``."""
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")[:max_line]
        src = line_source(line, kind) if kind else None
        if src is not None:
            rest = line[src[2] :]
            if kind == "srun" and _BARE_HOST.match(rest):  # `srun --label hostname`: no process's line
                tasks.printed[src[0]].add(rest.strip())
                continue
            yield lineno, src[0], src[1], rest
            continue
        if kind == "srun" and line.startswith("srun: "):
            tasks.said.update(srun_task_hosts(line))
        yield lineno, None, None, line


def name_tasks(reads: Mapping[str | None, Any], tasks: TaskHosts) -> None:
    """Each task read whose machine srun named or the task printed (see :meth:`TaskHosts.resolved`); the file's
    own read (key None) keeps the whole map (per-task files name their task through it)."""
    resolved = tasks.resolved([k for k in reads if k is not None])
    if reads.get(None) is not None and resolved:
        reads[None].task_hosts = {t: h for t, (h, _) in resolved.items()}
    for key, (host, how) in resolved.items():
        f = reads.get(key)
        if f is not None and f.host is None:
            f.host, f.host_from = host, how
