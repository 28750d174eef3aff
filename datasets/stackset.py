"""The in-memory form of a job's stacks that the analysis works on, from any source.

A :class:`ProcStacks` is one process in one snapshot: where it runs (rank, node, role), whether
its dump worked, its main thread's frames (innermost first) and its other threads. Sources: a
raw dump directory, the store's ``stacks`` table, or in-memory :class:`ProcessDump` objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from .readers.base import Frame, ProcessDump, ThreadDump
from .readers.dumpdir import DumpDir, assign_roles


@dataclass(frozen=True, slots=True)
class ProcStacks:
    snapshot: int
    rank: int | None
    node: str | None
    role: str
    pid: int | None
    status: str  # ok | partial | failed
    error: str | None
    main_thread: ThreadDump | None
    others: tuple[ThreadDump, ...]
    source: str
    source_format: str = ""

    @property
    def main(self) -> tuple[Frame, ...]:
        """The main thread's frames, innermost first (empty for a failed dump)."""
        return self.main_thread.frames if self.main_thread is not None else ()


def from_dump(dump: ProcessDump, *, snapshot: int, rank: int | None, node: str | None, role: str,
              pid: int | None = None) -> ProcStacks:
    main = dump.main_thread
    others = tuple(t for t in dump.threads if t is not main)
    return ProcStacks(snapshot, rank, node, role, dump.pid if dump.pid is not None else pid, dump.status,
                      dump.error, main, others, dump.source_file, dump.source_format)


def from_dump_dir(dd: DumpDir) -> list[ProcStacks]:
    """Every process of a scanned dump directory."""
    out = []
    for f in dd.files:
        for proc, role in assign_roles(f):
            out.append(from_dump(proc, snapshot=f.snapshot, rank=f.rank, node=f.node, role=role, pid=f.pid))
    return out


def from_dumps(items: Iterable[tuple[ProcessDump, int, int | None, str | None, str]]) -> list[ProcStacks]:
    """From ``(dump, snapshot, rank, node, role)`` tuples (synthetic jobs, the live agent)."""
    return [from_dump(d, snapshot=s, rank=r, node=n, role=role) for d, s, r, n, role in items]


def from_table(tbl: pa.Table) -> list[ProcStacks]:
    """From rows of the ``stacks`` table (one row per thread; grouped back into processes)."""
    cols = {name: tbl.column(name).to_pylist() for name in
            ("snapshot", "rank", "node", "role", "pid", "status", "error", "thread_id", "thread_name",
             "is_main_thread", "active", "frames", "source_file", "source_format")}
    procs: dict[tuple, dict] = {}
    for i in range(tbl.num_rows):
        key = (cols["snapshot"][i], cols["rank"][i], cols["pid"][i], cols["source_file"][i], cols["role"][i])
        p = procs.get(key)
        if p is None:
            p = procs[key] = {"i": i, "main": None, "others": []}
        frames = tuple(Frame(f["function"], f["file"], f["line"]) for f in (cols["frames"][i] or ()))
        if cols["status"][i] == "failed" and not frames:
            continue
        t = ThreadDump(frames, cols["thread_id"][i], cols["thread_name"][i], cols["active"][i],
                       bool(cols["is_main_thread"][i]))
        if t.is_main and p["main"] is None:
            p["main"] = t
        else:
            p["others"].append(t)
    out = []
    for key, p in procs.items():
        i = p["i"]
        main = p["main"] or (p["others"].pop(0) if p["others"] else None)
        out.append(ProcStacks(int(cols["snapshot"][i] or 0), cols["rank"][i], cols["node"][i],
                              cols["role"][i] or "trainer", cols["pid"][i], cols["status"][i] or "ok",
                              cols["error"][i], main, tuple(p["others"]),
                              cols["source_file"][i] or "", cols["source_format"][i] or ""))
    return out


def to_rows(procs: Sequence[ProcStacks], job: str) -> list[dict]:
    """Rows of the ``stacks`` table (for ingesting a dump directory into the store)."""
    rows = []
    for p in procs:
        base = {"job": job, "snapshot": p.snapshot, "node": p.node, "rank": p.rank, "pid": p.pid, "role": p.role,
                "status": p.status, "error": p.error, "source_file": p.source,
                "source_format": p.source_format or None}
        threads = ([p.main_thread] if p.main_thread else []) + list(p.others)
        if not threads:
            rows.append({**base, "frames": []})
        for t in threads:
            rows.append({**base, "thread_id": t.thread_id, "thread_name": t.thread_name,
                         "is_main_thread": t is p.main_thread, "active": t.active,
                         "frames": [{"function": f.function, "file": f.file, "line": f.line} for f in t.frames]})
    return rows
