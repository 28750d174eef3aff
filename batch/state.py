"""The batch's own state beside the store's tables, in ``ROOT/_batch/``: the run lock and the watermarks.

- ``lock`` (+ ``lock.json``, who holds it): an exclusive ``flock``. A second run that finds it held exits
  at once with :class:`LockHeld`; the kernel releases it when the holder dies, even by SIGKILL, so a
  killed run never blocks the next one.
- ``watermarks.json`` + ``watermarks.jsonl``: per job, the evidence it was last analysed at (each evidence
  table's ``job=`` folder modification time and a digest of its part-file names) and whether that
  analysis succeeded. A finished job is appended to the journal (fsynced) only after its verdicts are
  durable in the store; the run ends by folding the journal into the snapshot (written atomically,
  then the journal truncated; a crash between the two replays the same records). A line torn by a
  kill is ignored and closed before the next append.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rankscope.spine import RankscopeError, StoreError, atomic_write, remove_stale_temps

STATE_DIR = "_batch"
STALE_TEMP_SECONDS = 60.0
"""Temp files of killed batch writers older than this are removed by the next run (its writes take ms)."""


class LockHeld(RankscopeError):
    """Another batch run holds the store's lock."""


def state_dir(root: str | os.PathLike[str]) -> Path:
    d = Path(root) / STATE_DIR
    d.mkdir(exist_ok=True)
    return d


class BatchLock:
    """The store's batch lock (``with BatchLock(root):``); :class:`LockHeld` names the holder."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.dir = state_dir(root)
        self.path = self.dir / "lock"
        self.fd: int | None = None

    def __enter__(self) -> BatchLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockHeld(f"another batch run holds {self.path} ({self.holder()}); this run does nothing") from None
        self.fd = fd
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": _iso(time.time())}
        atomic_write(self.dir / "lock.json", json.dumps(info) + "\n", durable=False)
        remove_stale_temps(self.dir, older_than_seconds=STALE_TEMP_SECONDS)
        return self

    def holder(self) -> str:
        try:
            info = json.loads((self.dir / "lock.json").read_text())
            return f"pid {info['pid']} on {info['host']} since {info['since']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "holder unknown"

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Watermarks:
    """Per-job watermarks: ``load()`` -> {job: record}; ``append(records)``; ``compact()`` at the end of a run.

    A record: ``{"job", "sig": {table: mtime_ns}, "parts": digest, "status": "done" | "failed", "error",
    "at"}``. Callers hold the :class:`BatchLock`.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.dir = state_dir(root)
        self.snapshot = self.dir / "watermarks.json"
        self.journal = self.dir / "watermarks.jsonl"
        self.marks: dict[str, dict[str, Any]] = {}
        self.dirty = False  # anything to fold into the snapshot (a run with nothing new rewrites nothing)

    def load(self) -> dict[str, dict[str, Any]]:
        marks: dict[str, dict[str, Any]] = {}
        try:
            doc = json.loads(self.snapshot.read_text(encoding="utf-8"))
            marks = {str(k): v for k, v in doc.get("jobs", {}).items() if isinstance(v, dict)}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError) as exc:
            raise StoreError(f"{self.snapshot}: unreadable batch watermarks ({exc}); remove it to start over") from None
        try:
            with open(self.journal, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue  # a line torn by a kill: that job is analysed again (idempotently)
                    if isinstance(rec, dict) and isinstance(rec.get("job"), str):
                        marks[rec["job"]] = rec
                        self.dirty = True
        except FileNotFoundError:
            pass
        self.marks = marks
        return marks

    def append(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append records to the journal durably (one write and one fsync for the lot)."""
        recs = [dict(r) for r in records]
        lines = [json.dumps(r, separators=(",", ":")) for r in recs]
        if not lines:
            return
        with open(self.journal, "a+b") as fh:
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    fh.write(b"\n")  # close a line torn by a kill before the next record
            fh.write(("\n".join(lines) + "\n").encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        for r in recs:
            self.marks[str(r["job"])] = r
        self.dirty = True

    def update(self, job: str, **fields: Any) -> None:
        """Change a record in memory only (kept by the next :meth:`compact`): e.g. a refreshed signature."""
        self.marks[job] = {**self.marks.get(job, {"job": job}), **fields}
        self.dirty = True

    def compact(self) -> None:
        """Fold the journal into the snapshot (atomic), then empty the journal."""
        if not self.dirty:
            return
        atomic_write(self.snapshot, json.dumps({"version": 1, "jobs": self.marks}, separators=(",", ":")))
        with open(self.journal, "wb") as fh:
            fh.flush()
            os.fsync(fh.fileno())
        self.dirty = False
