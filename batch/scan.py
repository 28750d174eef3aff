"""Which jobs have evidence newer than their watermark, without reading a single Parquet file.

The store is append-only: new evidence is a new part file renamed into ``ROOT/<table>/job=<job>/``, which
changes that folder's modification time. A scan therefore stats one folder per (evidence table, job):
about 30,000 stats for 10,000 jobs. Only a folder whose time differs from the watermark's is listed, and
the job is new only when the list of part files differs (a temp file that came and went changes the
time, not the list). A time within :data:`RACY_SECONDS` of the scan is not trusted (a file renamed in
the same clock tick would not move it): it is recorded as unknown, so the next scan lists that folder.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.datasets.store.schemas import TABLES

DERIVED_TABLES = frozenset({"verdicts", "batch_runs", "actions"})
"""Tables rankscope writes about the evidence (verdicts, its own runs, the recovery audit): never evidence."""
RACY_SECONDS = 2.0


def evidence_tables() -> list[str]:
    """Every table of the store that holds evidence (whatever tables later versions add)."""
    return [name for name, spec in TABLES.items() if name not in DERIVED_TABLES and "job" in spec.partition_by]


@dataclass
class JobScan:
    """One job as the scan found it."""

    job: str
    sig: dict[str, int] = field(default_factory=dict)  # table -> folder mtime_ns (-1: too recent to trust)
    newest: float = 0.0  # the newest folder time (epoch seconds): when evidence last arrived
    parts: str | None = None  # digest of the part-file names, computed only when the folder times moved


def scan_jobs(root: str | os.PathLike[str], *, now: float | None = None) -> dict[str, JobScan]:
    """Every job with an evidence folder, with its folder times (one ``stat`` per folder)."""
    base = Path(root)
    now_ns = int((time.time() if now is None else now) * 1e9)
    racy_ns = int(RACY_SECONDS * 1e9)
    jobs: dict[str, JobScan] = {}
    for table in evidence_tables():
        try:
            entries = os.scandir(base / table)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with entries:
            for entry in entries:
                if not entry.name.startswith("job="):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                job = entry.name[4:]
                js = jobs.get(job)
                if js is None:
                    js = jobs[job] = JobScan(job)
                m = st.st_mtime_ns
                js.sig[table] = m if now_ns - m >= racy_ns else -1
                js.newest = max(js.newest, m / 1e9)
    return jobs


def part_digest(root: str | os.PathLike[str], job: str, tables: Mapping[str, Any] | None = None) -> str:
    """A digest of the names of the job's part files in every evidence table (part files are never
    rewritten: a new name is new evidence)."""
    h = hashlib.blake2b(digest_size=16)
    for table in sorted(tables if tables is not None else evidence_tables()):
        folder = Path(root) / table / f"job={job}"
        try:
            names = sorted(e.name for e in os.scandir(folder) if e.name.startswith("part-"))
        except (FileNotFoundError, NotADirectoryError):
            continue
        h.update(f"{table}\0{len(names)}\0".encode())
        for n in names:
            h.update(n.encode() + b"\0")
    return h.hexdigest()


def is_new(js: JobScan, mark: Mapping[str, Any] | None, root: str | os.PathLike[str]) -> bool:
    """True when the job's evidence differs from its watermark ``mark`` (lists its folders only when their
    times moved; the digest is kept on ``js.parts`` for the next watermark)."""
    if mark is None:
        js.parts = part_digest(root, js.job, js.sig)
        return True
    old_sig = mark.get("sig") or {}
    if old_sig == js.sig and -1 not in js.sig.values():
        js.parts = mark.get("parts")
        return False
    js.parts = part_digest(root, js.job, js.sig)
    return js.parts != mark.get("parts")
