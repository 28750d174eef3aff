"""The append-only audit trail: who did what, when, why, and what came of it.

:class:`AuditLog` is the interface the executor writes through; :class:`StoreAuditLog` keeps it in the
store's ``actions`` table (``rankscope sql STORE "SELECT * FROM actions"``), :class:`JsonlAuditLog` in a
JSON-lines file where there is no store.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from .records import ActionRecord


@dataclass(frozen=True)
class AuditRecord:
    """One action, as the audit trail keeps it: who, what, when, why, outcome."""

    job: str
    incident: str
    what: str  # the action kind
    why: str
    outcome: str  # planned | dry-run | ok | failed | skipped
    when: float
    who: str
    backend: str
    dry_run: bool
    nodes: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    detail: str = ""
    rule: str = ""
    suspect_nodes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes"] = list(self.nodes)
        d["commands"] = list(self.commands)
        d["suspect_nodes"] = list(self.suspect_nodes)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AuditRecord:
        return cls(
            str(d["job"]),
            str(d["incident"]),
            str(d["what"]),
            str(d.get("why", "")),
            str(d["outcome"]),
            float(d["when"]),
            str(d.get("who", "")),
            str(d.get("backend", "")),
            bool(d.get("dry_run", False)),
            tuple(d.get("nodes") or ()),
            tuple(d.get("commands") or ()),
            str(d.get("detail", "")),
            str(d.get("rule", "")),
            tuple(d.get("suspect_nodes") or ()),
        )

    def to_action_record(self) -> ActionRecord:
        return ActionRecord(
            self.when,
            self.what,
            self.incident,
            self.nodes,
            self.rule,
            executed=not self.dry_run and self.outcome == "ok",
            suspect_nodes=self.suspect_nodes,
        )


def whoami() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


class AuditLog(Protocol):
    """An append-only trail of actions. The store's ``actions`` table implements the same interface."""

    def append(self, record: AuditRecord) -> None: ...

    def records(self, job: str | None = None) -> list[AuditRecord]: ...


class JsonlAuditLog:
    """The audit trail as a JSON-lines file: one record per line, appended under ``flock`` and fsync'd.

    Nothing is ever rewritten. A line that does not parse (a torn write from a crash) is skipped on read.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def append(self, record: AuditRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(record.to_dict(), sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # close a line torn by a crash, so this record stays whole
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _lines(self) -> Iterator[dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        for raw in text.splitlines():
            try:
                d = json.loads(raw)
            except ValueError:
                continue
            if isinstance(d, dict):
                yield d

    def records(self, job: str | None = None) -> list[AuditRecord]:
        out = []
        for d in self._lines():
            try:
                r = AuditRecord.from_dict(d)
            except (KeyError, TypeError, ValueError):
                continue
            if job is None or r.job == job:
                out.append(r)
        return out

    def history(self, job: str | None = None) -> tuple[ActionRecord, ...]:
        """The records as the ladder's action history."""
        return tuple(r.to_action_record() for r in self.records(job))


class StoreAuditLog:
    """The audit trail in the store's ``actions`` table: one Parquet part per action, written atomically and
    never rewritten (the store is append-only), partitioned by job. ``when`` is the ``ts`` column."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        from rankscope.datasets.store.store import Store

        self.store = Store(root, create=True)

    def append(self, record: AuditRecord) -> None:
        row = record.to_dict()
        row["ts"] = datetime.fromtimestamp(row.pop("when"), tz=timezone.utc)
        self.store.write("actions", [row])

    def records(self, job: str | None = None) -> list[AuditRecord]:
        rows = self.store.read_arrow("actions", job=job).to_pylist()
        out = []
        for row in sorted(rows, key=lambda r: r["ts"]):
            ts = row.pop("ts")
            row["when"] = (ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)).timestamp()
            out.append(AuditRecord.from_dict({k: ("" if v is None else v) for k, v in row.items()}))
        return out

    def history(self, job: str | None = None) -> tuple[ActionRecord, ...]:
        """The records as the ladder's action history."""
        return tuple(r.to_action_record() for r in self.records(job))
