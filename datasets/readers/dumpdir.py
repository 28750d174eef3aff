"""A raw dump directory: one file per process, an optional manifest, optional snapshot folders.

Rules (what ``rankscope diagnose PATH`` accepts):

- ``*.txt``: py-spy text, or faulthandler / traceback text. ``*.json``: ``py-spy dump --json``
  (a JSON list). A JSON *object* or an extension-less ``<prefix><rank>`` pickle is a Flight Recorder
  dump and is handed to the Flight Recorder reader. Files named ``metrics*`` / ``timings*``
  (CSV/Parquet) are metrics and timings. ``*.exit.json`` files are the in-process hook's exit records
  (the exception that ended a process, and when): the crash analysis orders them.
- ``manifest.csv`` (optional): header ``file,rank,node`` plus optional ``role,pid,snapshot``; ``file``
  relative to PATH. With a manifest, stack files it does not list are ignored (and reported).
- Without a manifest: rank from the file name (``rank17``, ``rank-17``, ``rank_17``), node
  ``node-<rank // gpus_per_node>``, role from the name (``dataloader``, ``checkpoint``) or the stack.
- Several snapshots: a ``snapshot`` column, or sub-directories ``snapshot-0/``, ``snapshot-1/``, ...
- The in-process hook's run directory (``pid<PID>.json`` identities beside ``pid<PID>.stack.txt``,
  ``.exit.json``, ``.steps.jsonl``, ``.fr.json``): read as described in :mod:`.rundir`.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rankscope.datasets.domain.stacks import ROLES, ProcessDump, ProcStacks, from_dump
from rankscope.datasets.readers import runfiles as rf
from rankscope.datasets.readers.base import failed_dump
from rankscope.datasets.readers.faulthandler import (
    looks_like_traceback,
    parse_traceback_text,
)
from rankscope.datasets.readers.fr_files import is_fr_file
from rankscope.datasets.readers.pyspy_json import parse_pyspy_json
from rankscope.datasets.readers.pyspy_text import parse_pyspy_text
from rankscope.datasets.readers.rundir import HookProcess, coords_of, resolve
from rankscope.spine import InputError, paused_gc, progress

MANIFEST = "manifest.csv"
# the run directory's other files: the launcher's rank -> node map the hook reads (RANKSCOPE_MANIFEST),
# the agent's pid file and its trigger file
_RANK = re.compile(r"rank[-_]?(\d+)", re.I)
_SNAPSHOT_DIR = re.compile(r"^snap(?:shot)?[-_]?(\d+)$", re.I)
_STACK_SUFFIXES = (".txt", ".json")
_DATALOADER_FRAMES = ("_worker_loop",)
_CHECKPOINT_HINTS = ("checkpoint", "async_save", "filesystem.py", "write_data")


@dataclass(frozen=True)
class DumpFile:
    """One parsed stack file and what we know about the process(es) in it."""

    path: str  # relative to the dump root
    snapshot: int
    rank: int | None
    node: str | None
    role: str | None
    pid: int | None
    processes: tuple[ProcessDump, ...]


@dataclass(frozen=True)
class DumpDir:
    """Everything found under a dump root."""

    root: Path
    files: tuple[DumpFile, ...]
    fr_files: tuple[Path, ...] = ()
    metric_files: tuple[Path, ...] = ()
    timing_files: tuple[Path, ...] = ()
    exit_files: tuple[Path, ...] = ()
    has_manifest: bool = False  # nodes are named (manifest.csv, or the hook's identities)
    notes: tuple[str, ...] = field(default=())
    step_files: tuple[tuple[str, str], ...] = ()  # the hook's pid<PID>.steps.jsonl: (path, relative path)
    coords: dict[int, dict[str, int]] = field(default_factory=dict)  # rank -> parallel coordinates (hook)
    hook_fr_files: tuple[tuple[Path, int], ...] = ()  # the hook's pid<PID>.fr.json with the rank of PID


def read_stack_file(
    path: str | os.PathLike[str], display: str | None = None, *, raw: bytes | None = None
) -> list[ProcessDump]:
    """Parse one stack dump file of any supported format (decided by suffix and content)."""
    path = os.fspath(path)
    name = display or path
    if raw is None:
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            return [failed_dump(name, "unknown", f"unreadable ({exc.strerror})")]
    text = raw.decode("utf-8", errors="replace")
    stripped = text.lstrip()
    if path.endswith(".json") or stripped.startswith("["):
        if stripped.startswith("[") or not stripped.startswith("{"):
            return parse_pyspy_json(text, name)
        return [failed_dump(name, "pyspy-json", "JSON object, not a py-spy thread list")]
    if not stripped.startswith("Process ") and looks_like_traceback(text):
        return parse_traceback_text(text, name)
    return parse_pyspy_text(text, name)


def _role_from(name: str, dump: ProcessDump, first: bool) -> str:
    low = name.lower()
    if "dataloader" in low:
        return "dataloader"
    if "checkpoint" in low or "ckpt" in low:
        return "checkpoint"
    main = dump.main_thread
    funcs = [f.function for f in main.frames] if main else []
    if any(f in _DATALOADER_FRAMES for f in funcs):
        return "dataloader"
    if not first and main and any(h in (f.file + f.function) for f in main.frames for h in _CHECKPOINT_HINTS):
        return "checkpoint"
    return "trainer" if first else "other"


_MANIFEST_COLUMNS = ("file", "rank", "node", "role", "pid", "snapshot")


def _read_manifest(path: Path) -> list[dict[str, str]]:
    """Rows of manifest.csv, validated (one clear error naming the line); plain csv.reader for speed."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = [h.strip() for h in next(reader, [])]
            missing = {"file", "rank", "node"} - set(header)
            if missing:
                raise InputError(f"{path}: header must have file,rank,node (missing {', '.join(sorted(missing))})")
            idx = {c: header.index(c) for c in _MANIFEST_COLUMNS if c in header}
            width = len(header)
            rows = []
            for i, rec in enumerate(reader, start=2):
                if not rec:
                    continue
                if len(rec) < width:
                    rec = rec + [""] * (width - len(rec))
                row = {c: rec[j].strip() for c, j in idx.items()}
                if not row["file"]:
                    raise InputError(f"{path}: line {i}: empty 'file'")
                rank = row["rank"]
                if not rank.isdigit():
                    raise InputError(f"{path}: line {i}: rank {rank!r} is not a non-negative integer")
                if not row["node"]:
                    raise InputError(f"{path}: line {i}: empty 'node'")
                role = row.get("role")
                if role and role not in ROLES:
                    raise InputError(f"{path}: line {i}: role {role!r} is not one of {', '.join(ROLES)}")
                for col in ("pid", "snapshot"):
                    v = row.get(col)
                    if v and not v.isdigit():
                        raise InputError(f"{path}: line {i}: {col} {v!r} is not an integer")
                rows.append(row)
            return rows
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a UTF-8 CSV file") from None
    except csv.Error as exc:
        raise InputError(f"{path}: malformed CSV ({exc})") from None


def _walk(root: Path) -> Iterable[tuple[str, str, int]]:
    """(absolute path, path relative to root with '/', snapshot) of every file under root.

    Plain strings and os.walk: at 100,000 files pathlib's object churn costs more than parsing.
    """
    base = str(root)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel_dir = os.path.relpath(dirpath, base)
        parts = [] if rel_dir == "." else rel_dir.split(os.sep)
        snap = 0
        for part in parts:
            m = _SNAPSHOT_DIR.match(part)
            if m:
                snap = int(m.group(1))
        prefix = "/".join(parts) + "/" if parts else ""
        for fn in sorted(filenames):
            if not fn.startswith("."):
                yield os.path.join(dirpath, fn), prefix + fn, snap


def scan_dump_dir(path: str | os.PathLike[str], *, gpus_per_node: int = 8) -> DumpDir:
    """Find and parse every dump under ``path``. Raises InputError when there is nothing usable.

    The cyclic garbage collector is paused meanwhile: parsing allocates millions of small acyclic
    objects, and its full collections would make reading 100,000 files superlinear.
    """
    with paused_gc():
        return _scan(path, gpus_per_node=gpus_per_node)


def _scan(path: str | os.PathLike[str], *, gpus_per_node: int) -> DumpDir:
    root = Path(path)
    if not root.exists():
        raise InputError(f"{root}: no such file or directory")
    if root.is_file():
        raise InputError(f"{root}: expected a directory of dumps or a rankscope store, got a file")
    if gpus_per_node < 1:
        raise InputError(f"--gpus-per-node {gpus_per_node}: must be at least 1")
    manifest_path = root / MANIFEST
    manifest = {r["file"]: r for r in _read_manifest(manifest_path)} if manifest_path.is_file() else None
    files: list[DumpFile] = []
    fr_found: list[tuple[int, Path]] = []
    metrics: list[Path] = []
    timings: list[Path] = []
    exits: list[Path] = []
    notes: list[str] = []
    ignored = []
    hooked: dict[tuple[str, int], HookProcess] = {}
    for path, rel, snap in progress(_walk(root), f"reading {root.name or root}"):
        if rel == MANIFEST or rel.rsplit("/", 1)[-1] in rf.AUX:  # identities carry what these say
            continue
        fname = rel.rsplit("/", 1)[-1]
        hm = rf.HOOK_FILE.match(fname) if manifest is None else None
        if hm is not None:
            hp = hooked.setdefault((rel[: len(rel) - len(fname)], int(hm.group(1))), HookProcess(int(hm.group(1))))
            hp.files[hm.group(2)] = path
            hp.rel[hm.group(2)] = rel
            continue
        name = fname.lower()
        stem, suffix = os.path.splitext(fname)
        if name.startswith("metrics") and suffix in (".csv", ".parquet"):
            metrics.append(Path(path))
            continue
        if name.startswith("timings") and suffix in (".csv", ".parquet"):
            timings.append(Path(path))
            continue
        if name.endswith(".exit.json"):
            exits.append(Path(path))
            continue
        raw = None
        if suffix == ".json":  # read once: a JSON object is a Flight Recorder dump, a list is py-spy
            try:
                with open(path, "rb") as fh:
                    raw = fh.read()
            except OSError:
                raw = None
            if raw is not None and raw.lstrip()[:1] == b"{":
                fr_found.append((snap, Path(path)))
                continue
        elif suffix in ("", ".pkl", ".pickle") and os.path.isfile(path) and is_fr_file(path):
            fr_found.append((snap, Path(path)))
            continue
        if suffix not in _STACK_SUFFIXES:
            ignored.append(rel)
            continue
        meta = manifest.get(rel) if manifest is not None else None
        if manifest is not None and meta is None:
            ignored.append(rel)
            continue
        if meta is not None:
            rank = int(meta["rank"])
            node = meta["node"]
            role = meta.get("role") or None
            pid = int(meta["pid"]) if meta.get("pid") else None
            if meta.get("snapshot"):
                snap = int(meta["snapshot"])
        else:
            m = _RANK.search(stem)
            if not m:
                ignored.append(rel)
                continue
            rank = int(m.group(1))
            node = f"node-{rank // gpus_per_node}"
            role, pid = None, None
        procs = read_stack_file(path, rel, raw=raw)
        files.append(DumpFile(rel, snap, rank, node, role, pid, tuple(procs)))
    if manifest is not None:
        present = {f.path for f in files}
        absent = [f for f in manifest if f not in present and not (root / f).exists()]
        for f in absent:  # listed but not there: the process's dump is missing
            meta = manifest[f]
            files.append(
                DumpFile(
                    f,
                    int(meta.get("snapshot") or 0),
                    int(meta["rank"]),
                    meta["node"],
                    meta.get("role") or None,
                    int(meta["pid"]) if meta.get("pid") else None,
                    (failed_dump(f, "unknown", "listed in manifest.csv but the file is absent"),),
                )
            )
    steps: list[tuple[str, str]] = []
    coords: dict[int, dict[str, int]] = {}
    hook_named = False
    hook_fr: list[tuple[Path, int]] = []
    if hooked:
        hook_named, coords = _add_hook_processes(
            hooked, files, hook_fr, exits, steps, notes, ignored, gpus_per_node=gpus_per_node
        )
    if ignored:
        shown = ", ".join(ignored[:5]) + (", ..." if len(ignored) > 5 else "")
        why = "not in manifest.csv" if manifest is not None else "no rank in the name or unknown type"
        notes.append(f"ignored {len(ignored)} file(s) ({why}): {shown}")
    if not files and not fr_found and not hook_fr and not metrics and not timings and not exits and not steps:
        raise InputError(
            f"{root}: no stack dumps found (expected rank<N>.txt / rank<N>.json files, a manifest.csv, "
            "or Flight Recorder / metrics / timings files)"
        )
    fr: list[Path] = [p for _, p in fr_found]
    if fr_found:
        last = max(snap for snap, _ in fr_found)
        if any(snap != last for snap, _ in fr_found):
            notes.append(f"Flight Recorder dumps from several snapshots: using snapshot {last}")
        fr = [p for snap, p in fr_found if snap == last]
    return DumpDir(
        root,
        tuple(files),
        tuple(fr),
        tuple(metrics),
        tuple(timings),
        tuple(exits),
        manifest is not None or hook_named,
        tuple(notes),
        tuple(steps),
        coords,
        tuple(hook_fr),
    )


def _add_hook_processes(
    hooked: dict[tuple[str, int], HookProcess],
    files: list[DumpFile],
    fr: list[tuple[Path, int]],
    exits: list[Path],
    steps: list[tuple[str, str]],
    notes: list[str],
    ignored: list[str],
    *,
    gpus_per_node: int,
) -> tuple[bool, dict[int, dict[str, int]]]:
    """The hook's per-process files (a run directory) as dump files, exits, FR dumps and step files."""
    by_dir: dict[str, dict[int, HookProcess]] = {}
    for (d, pid), hp in hooked.items():
        by_dir.setdefault(d, {})[pid] = hp
    named, coords = False, dict[int, dict[str, int]]()
    for d, procs in sorted(by_dir.items()):
        snap = 0
        for part in d.strip("/").split("/"):
            m = _SNAPSHOT_DIR.match(part)
            if m:
                snap = int(m.group(1))
        resolved = resolve(procs, gpus_per_node=gpus_per_node, notes=notes)
        by_pid = {p.pid: p for p in resolved}
        keep = set(by_pid)
        run_start = min((p.started for p in resolved if p.role == "trainer" and p.started), default=None)
        stale_exits = 0
        for p in resolved:
            named = True
            files.append(DumpFile(p.stack_rel, snap, p.rank, p.node, p.role, p.pid, (p.dump,)))
        for pid, hp in procs.items():
            if pid not in keep:
                if rf.IDENTITY not in hp.files and rf.EXIT in hp.files:  # an exit record names its own rank
                    if run_start is not None and _record_time(hp.files[rf.EXIT]) < run_start:
                        stale_exits += 1  # from a run before the processes found here started
                    else:
                        exits.append(Path(hp.files[rf.EXIT]))
                continue
            if rf.EXIT in hp.files:
                exits.append(Path(hp.files[rf.EXIT]))
            if rf.FR in hp.files and by_pid[pid].role == "trainer":
                fr.append((Path(hp.files[rf.FR]), by_pid[pid].rank))
            if rf.STEPS in hp.files:
                steps.append((hp.files[rf.STEPS], hp.rel[rf.STEPS]))
        if stale_exits:
            notes.append(f"run directory: {stale_exits} exit record(s) from before this run started ignored")
        coords = coords or coords_of(resolved)
        if not resolved:
            ignored.extend(rel for hp in procs.values() for k, rel in hp.rel.items() if k not in (rf.CTL, rf.EXIT))
    return named, coords


def _record_time(path: str) -> float:
    """The ``time`` of a hook exit record; +inf when unreadable (kept, and reported by the exit reader)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return float(json.load(fh)["time"])
    except (OSError, ValueError, KeyError, TypeError):
        return float("inf")


def assign_roles(df: DumpFile) -> list[tuple[ProcessDump, str]]:
    """Each process of a file with its role: the manifest's, else from the name and the stack."""
    out = []
    for i, proc in enumerate(df.processes):
        if df.role and i == 0:
            role = df.role
        else:
            role = _role_from(Path(df.path).name, proc, first=(i == 0))
        out.append((proc, role))
    return out


def from_dump_dir(dd: DumpDir) -> list[ProcStacks]:
    """Every process of a scanned dump directory (GC paused: see ``scan_dump_dir``)."""
    with paused_gc():
        return [
            from_dump(proc, snapshot=f.snapshot, rank=f.rank, node=f.node, role=role, pid=f.pid)
            for f in dd.files
            for proc, role in assign_roles(f)
        ]
