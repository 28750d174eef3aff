"""A raw dump directory: whatever evidence files a user collected, in whatever layout.

Every file is classified by its content (:mod:`.sniff`; the suffix only breaks ties) and every process
is given an identity with its provenance (:mod:`.identity`):

- stack dumps: ``py-spy dump`` text or JSON (one file may hold several processes, concatenated or
  ``--subprocesses``: one process each), faulthandler / traceback text, py-spy's own error output (a
  failed capture, with a ``failure_kind``);
- Flight Recorder dumps (pickle or JSON objects with FR keys), handed to the Flight Recorder reader;
- logs (torchrun consoles, ``--log-dir`` trees, training logs) and TorchElastic error files, handed to
  :mod:`.logs` and :mod:`.torchelastic`;
- ``metrics*`` / ``timings*`` CSV/Parquet, Prometheus text exposition (``*.prom``, or text that parses as
  one) and Prometheus query results (JSON with ``data.resultType``): metrics evidence, read by
  :mod:`.metric_files`; the hook's ``*.exit.json`` records and run directory;
- ``manifest.csv`` at any depth (see :mod:`.identity`). Under a manifest's folder, stack files it does
  not list are ignored (and reported); a listed file that is absent is a failed capture.

What is not evidence (a training ``config.json``, W&B metadata, unknown text)
is skipped with one note saying why; one unreadable file is a note, never an abort. Two different
processes claiming one rank are resolved (host + local rank) or refused with one line naming both files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rankscope.datasets.domain.bounds import (
    FOREIGN,
    limits,
    load_json,
    open_regular_fd,
    read_bounded,
    read_fd,
    read_to_end,
)
from rankscope.datasets.domain.identity import Identity
from rankscope.datasets.domain.stacks import ProcessDump, ProcStacks, ThreadDump, from_dump
from rankscope.datasets.readers import runfiles as rf
from rankscope.datasets.readers import sniff as formats
from rankscope.datasets.readers.base import failed_dump
from rankscope.datasets.readers.consolestacks import console_found
from rankscope.datasets.readers.dumpscan import PACKED, finish, listed, packed_dump
from rankscope.datasets.readers.faulthandler import looks_like_traceback, parse_traceback_text
from rankscope.datasets.readers.forked import map_batches, worker_count
from rankscope.datasets.readers.identity import MANIFEST, Manifests, path_facts, read_manifest
from rankscope.datasets.readers.pyspy_json import parse_pyspy_json
from rankscope.datasets.readers.pyspy_text import parse_pyspy_text
from rankscope.datasets.readers.sniff import HEAD_BYTES, json_kind, json_kind_from_head, sniff
from rankscope.datasets.readers.stackid import Found
from rankscope.datasets.readers.walk import walk
from rankscope.spine import InputError, LimitError, RankscopeError, paused_gc, progress

_STACK_KINDS = ("pyspy-text", "pyspy-error", "traceback", "pyspy-json")
_READ_WHOLE = frozenset((*_STACK_KINDS, "json", "empty"))
_ONE_READ = 1 << 20  # files smaller than this are read whole at once (their kind is sniffed from the bytes)
_COMMON_SUFFIXES = frozenset((".txt", ".json"))  # stack dumps: go straight to the content
_EXPOSITION_SUFFIXES = (".prom", ".metrics", ".openmetrics")  # Prometheus text exposition by name
_PACKED = frozenset(PACKED)
_PACKED_WHY = "compressed or an archive: unpack it first, e.g. gunzip -r or tar xf, and point rankscope at the folder"
_NOT_EVIDENCE = frozenset((".csv", ".parquet", ".pq", ".png", ".jpg", ".svg", ".html", ".md")) | _PACKED
_WANDB = re.compile(r"(?:^|/)wandb/(?:(?:offline-)?run-[^/]*/|latest-run/|debug[^/]*\.log$)")
"""A Weights & Biases run folder (``wandb/run-<date>_<time>-<id>/files/output.log``, ``wandb/debug.log``): copies
of one process's console and W&B's own metadata, with no rank or machine of their own."""
_JSON_WHOLE_LIMIT = 8 << 20  # a JSON object whose kind the head does not tell is decoded up to this size


class DumpFile(NamedTuple):
    """One process of a stack file and what we know about it (``identity`` says where each field came from).
    A tuple: one per process, 100,000 of them for a large job."""

    path: str  # relative to the dump root
    snapshot: int
    rank: int | None
    node: str | None
    role: str | None
    pid: int | None
    processes: tuple[ProcessDump, ...]
    identity: Identity = Identity()


@dataclass(frozen=True)
class DumpDir:
    """Everything found under a dump root."""

    root: Path
    files: tuple[DumpFile, ...]
    fr_files: tuple[Path, ...] = ()
    metric_files: tuple[Path, ...] = ()
    timing_files: tuple[Path, ...] = ()
    exit_files: tuple[Path, ...] = ()
    has_manifest: bool = False  # some nodes are named (a manifest, the hook's identities)
    notes: tuple[str, ...] = field(default=())
    step_files: tuple[tuple[str, str], ...] = ()  # the hook's pid<PID>.steps.jsonl: (path, relative path)
    coords: dict[int, dict[str, int]] = field(default_factory=dict)  # rank -> parallel coordinates (hook)
    hook_fr_files: tuple[tuple[Path, int], ...] = ()  # the hook's pid<PID>.fr.json with the rank of PID
    fr_identities: dict[str, Identity] = field(default_factory=dict)  # FR file path -> its path/manifest identity
    log_files: tuple[tuple[str, str], ...] = ()  # (absolute, relative) logs for the log reader
    elastic_files: tuple[tuple[str, str], ...] = ()  # TorchElastic error files
    expected_ranks: dict[int, str] = field(default_factory=dict)  # rank -> the source that says it exists
    named_nodes: dict[int, tuple[str, str]] = field(default_factory=dict)  # rank -> (node, provenance)
    attempt_files: tuple[str, ...] = ()  # every file under an attempt_<k>/ folder, evidence or not (restarts)
    host_width: int | None = None  # trainers per machine and snapshot, where the stack files show one count


def read_stack_file(
    path: str | os.PathLike[str], display: str | None = None, *, raw: bytes | None = None
) -> list[ProcessDump]:
    """Parse one stack dump file of any supported format (decided by its content, the suffix breaking ties)."""
    path = os.fspath(path)
    name = display or path
    if raw is None:
        try:
            raw = read_bounded(path)
        except InputError as exc:
            return [failed_dump(name, "unknown", _why(exc, path), kind="unreadable")]
    s = sniff(raw[:HEAD_BYTES], name)
    return parse_stack_bytes(raw, name, s.kind, prefixed=s.prefixed)


def parse_stack_bytes(raw: bytes, name: str, kind: str, *, prefixed: bool = False) -> list[ProcessDump]:
    """The processes in a stack file already classified as ``kind`` (see :mod:`.sniff`)."""
    if kind == "pyspy-json":
        return parse_pyspy_json(raw, name)
    text = raw.decode("utf-8", errors="replace")
    if kind == "json":
        return [failed_dump(name, "pyspy-json", "JSON object, not a py-spy thread list", kind="unreadable")]
    if kind == "traceback" or (kind not in ("pyspy-text", "pyspy-error") and looks_like_traceback(text)):
        if prefixed:
            from rankscope.datasets.readers.sniff import strip_prefix

            text = "\n".join(strip_prefix(line)[0] for line in text.split("\n"))
        return parse_traceback_text(text, name)
    return parse_pyspy_text(text, name, prefixed=prefixed)


def scan_dump_dir(
    path: str | os.PathLike[str], *, gpus_per_node: int | None = 8, follow_symlinks: bool = False
) -> DumpDir:
    """Find and parse every piece of evidence under ``path``. Raises InputError when nothing is usable.

    ``gpus_per_node`` None means "not given": sibling trainers and local ranks are then numbered with the
    count each host holds. The cyclic garbage collector is paused meanwhile: parsing allocates millions of
    small acyclic objects, and its full collections would make reading 100,000 files superlinear.
    """
    with paused_gc():
        return _scan(path, gpus_per_node=gpus_per_node, follow_symlinks=follow_symlinks)


@dataclass
class _Scan:
    """What the walk collected, by kind."""

    root: Path
    found: list[Found] = field(default_factory=list)
    fr: list[tuple[str, str]] = field(default_factory=list)  # (abs, rel)
    metrics: list[Path] = field(default_factory=list)
    timings: list[Path] = field(default_factory=list)
    exits: list[Path] = field(default_factory=list)
    logs: list[tuple[str, str]] = field(default_factory=list)
    elastic: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "rel (why)"
    unlisted: list[str] = field(default_factory=list)  # stack files a manifest covers but does not list
    notes: list[str] = field(default_factory=list)
    attempt_files: tuple[str, ...] = ()


def _scan(path: str | os.PathLike[str], *, gpus_per_node: int | None, follow_symlinks: bool = False) -> DumpDir:
    root = Path(path)
    if not root.exists():
        raise InputError(f"{root}: no such file or directory")
    if root.is_file():
        raise InputError(f"{root}: expected a directory of dumps or a rankscope store, got a file")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise InputError(f"--gpus-per-node {gpus_per_node}: must be at least 1")
    w = walk(str(root), follow_outside=follow_symlinks)
    cap = limits().max_files
    if len(w.files) > cap:
        raise LimitError(
            f"{root}: {len(w.files):,} files is over the {cap:,}-file limit (limits.max_files; raise it with "
            "RANKSCOPE_LIMITS_MAX_FILES, or point rankscope at one incident's folder)"
        )
    present = {rel for _, rel in w.files}
    manifests = Manifests()

    def read_manifests() -> None:  # while the forked workers read the dumps (they do not need it: see dumpscan.listed)
        for abs_path, rel in w.files:
            if rel.rsplit("/", 1)[-1] == MANIFEST:
                manifests.add(rel, read_manifest(abs_path, rel), present)

    sc = _Scan(root, notes=w.notes(), attempt_files=tuple(rel for _, rel in w.files if "attempt" in rel.lower()))
    hooked: dict[tuple[str, int], object] = {}
    label = f"reading {root.name or root}"
    for part, part_hooked in map_batches(
        w.files,
        lambda files: _classify_all(files, root, label),
        workers=worker_count(len(w.files), min_per_worker=FILES_PER_WORKER),
        batch=BATCH,
        encode=_encode_part,
        decode=_decode_part,
        label=label,
        prepare=read_manifests,
    ):
        _merge(sc, part, hooked, part_hooked)
    listed(sc, hooked, manifests, _classify_one)
    for row in manifests.absent(present):  # listed but not there: that process's capture is missing
        why = f"listed in {row.manifest} but the file is absent"
        sc.found.append(Found(row.file, failed_dump(row.file, "unknown", why, row.pid, kind="absent"), [row], 0))
    return finish(sc, manifests, hooked, gpus_per_node=gpus_per_node)


_Hooked = dict[tuple[str, int], object]  # (folder, pid) -> the hook files one process left (HookProcess)
FILES_PER_WORKER = 1000  # below this a fork and the results' trip through a pipe cost more than they save
BATCH = 64  # files a worker takes at a time: small enough that all finish together, large enough to amortise
_BUCKETS = ("found", "fr", "metrics", "timings", "exits", "logs", "elastic", "skipped", "unlisted")


def _classify_all(files: Sequence[tuple[str, str]], root: Path, label: str) -> tuple[_Scan, _Hooked]:
    """:func:`_classify` over one batch of the walk's files, into a scan and hook table of its own, as if there
    were no manifest (:func:`.dumpscan.listed` applies them after)."""
    sc = _Scan(root)
    hooked: _Hooked = {}
    for abs_path, rel in progress(files, label):
        _classify_one(sc, abs_path, rel, _NO_MANIFEST, hooked)
    return sc, hooked


_NO_MANIFEST = Manifests()


def _classify_one(sc: _Scan, abs_path: str, rel: str, manifests: Manifests, hooked: _Hooked) -> None:
    try:
        _classify(sc, abs_path, rel, manifests, hooked)
    except RankscopeError as exc:  # one bad file never loses the others: it is a note
        sc.skipped.append(f"{rel} ({_why(exc, abs_path)})")
    except FOREIGN as exc:  # a reader's bug on hostile bytes: the file is skipped, named, with the cause
        sc.skipped.append(f"{rel} (unreadable: {type(exc).__name__}: {str(exc)[:80]})")


def _merge(sc: _Scan, part: _Scan, hooked: _Hooked, part_hooked: _Hooked) -> None:
    """A chunk's buckets after the previous chunks' (file order is kept)."""
    for name in _BUCKETS:
        getattr(sc, name).extend(getattr(part, name))
    for key, hp in part_hooked.items():
        have = hooked.get(key)
        if have is None:
            hooked[key] = hp
        else:  # one process's hook files split between two chunks
            have.files.update(hp.files)  # type: ignore[attr-defined]
            have.rel.update(hp.rel)  # type: ignore[attr-defined]


def _encode_part(res: tuple[_Scan, _Hooked]) -> tuple[Any, ...]:
    """A batch's scan as plain tuples (NamedTuples and slotted dataclasses pickle through Python code, one
    call per object). Its processes have no manifest rows yet (see :func:`.dumpscan.listed`)."""
    sc, hooked = res
    found = [
        (
            f.rel,
            tuple(map(tuple, d.threads)),
            (d.pid, d.cmdline, d.status, d.error, d.source_format, d.source_file, d.failure_kind, d.instance, d.header),
            f.index,
            f.hint,
        )
        for f in sc.found
        for d in (f.dump,)
    ]
    return found, tuple(getattr(sc, n) for n in _BUCKETS[1:]), hooked


def _decode_part(data: tuple[Any, ...]) -> tuple[_Scan, _Hooked]:
    found, buckets, hooked = data
    sc = _Scan(Path("."))
    new_thread = tuple.__new__
    for rel, threads, fields, index, hint in found:
        dump = ProcessDump(tuple([new_thread(ThreadDump, t) for t in threads]), *fields)
        sc.found.append(Found(rel, dump, None, index, hint=hint))
    for name, items in zip(_BUCKETS[1:], buckets):
        setattr(sc, name, items)
    return sc, hooked


def _why(exc: Exception, abs_path: str) -> str:
    text = str(exc)
    return text[len(abs_path) + 2 :] if text.startswith(abs_path + ": ") else text


def _classify(sc: _Scan, abs_path: str, rel: str, manifests: Manifests, hooked: dict[tuple[str, int], object]) -> None:
    """Put one file in its bucket (reading stack dumps on the way)."""
    fname = rel.rsplit("/", 1)[-1]
    if fname == MANIFEST or fname in rf.AUX:
        return
    if "wandb/" in rel and _WANDB.search(rel):
        sc.skipped.append(f"{rel} (a Weights & Biases run file: a copy of one process's console or W&B metadata)")
        return
    hm = rf.HOOK_FILE.match(fname) if fname.startswith("pid") else None
    if hm is not None and not manifests.rows(rel):
        from rankscope.datasets.readers.rundir import HookProcess

        key = (rel[: len(rel) - len(fname)], int(hm.group(1)))
        hp = hooked.setdefault(key, HookProcess(int(hm.group(1))))
        assert isinstance(hp, HookProcess)
        hp.files[hm.group(2)] = abs_path
        hp.rel[hm.group(2)] = rel
        return
    low = fname.lower()
    suffix = low[low.rfind(".") :] if "." in low else ""
    if suffix not in _COMMON_SUFFIXES:
        if low.startswith("metrics") and low.endswith(formats.TABLE_SUFFIXES):
            sc.metrics.append(Path(abs_path))
            return
        if low.startswith("timings") and low.endswith(formats.TABLE_SUFFIXES + formats.LINES_SUFFIXES):
            sc.timings.append(Path(abs_path))
            return
        if low.endswith(_EXPOSITION_SUFFIXES):
            sc.metrics.append(Path(abs_path))
            return
        if suffix in _NOT_EVIDENCE:
            why = _PACKED_WHY if suffix in _PACKED else f"a {suffix[1:]} file that is neither metrics* nor timings*"
            sc.skipped.append(f"{rel} ({why})")
            sc.found += packed_dump(rel, manifests.rows(rel)) if suffix in _PACKED else []
            return
    elif low.endswith(".exit.json"):
        sc.exits.append(Path(abs_path))
        return
    fd, size, cap = open_regular_fd(abs_path)  # a regular file within the size limit, or a ParseError: skipped
    try:  # a small file (nearly every stack dump) in one read; a large one's head first, the rest if needed
        first = read_fd(fd, size + 1 if size < _ONE_READ else HEAD_BYTES)
        head = first[:HEAD_BYTES]
        s = sniff(head, rel)
        whole = s.kind in _READ_WHOLE and not (s.kind == "json" and b'"resultType"' in head)  # metrics: later
        data = head
        if whole:
            data = first if len(first) <= size < _ONE_READ else read_to_end(fd, first, size, cap + 1)
            if len(data) > cap:  # grew past the limit while read
                raise LimitError(f"{abs_path}: over the {cap:,}-byte limit per file while read (limits.max_file_bytes)")
    except OSError as exc:
        sc.skipped.append(f"{rel} (unreadable: {exc.strerror})")
        return
    finally:
        os.close(fd)
    kind = s.kind
    if kind == "json":
        routed = _json_bucket(sc, abs_path, rel, head, data)
        if routed is None:
            return
        kind = routed
    if kind in _STACK_KINDS:
        rows = manifests.rows(rel) or None
        if rows is None and manifests.scope_of(rel) is not None:
            sc.unlisted.append(rel)
            return
        try:
            procs = parse_stack_bytes(data, rel, kind, prefixed=s.prefixed)
        except FOREIGN as exc:  # the capture exists but cannot be read: no evidence either way, not "missing"
            why = f"unreadable ({type(exc).__name__}: {str(exc)[:80]})"
            procs = [failed_dump(rel, kind, why, kind="unreadable")]
        for i, proc in enumerate(procs):
            sc.found.append(Found(rel, proc, rows, i))
    elif kind == "pickle":
        if any(k in head for k in (b"entries", b"pg_config", b"pg_status", b"version")):
            sc.fr.append((abs_path, rel))
        else:  # a checkpoint or other pickle: never unpickled
            sc.skipped.append(f"{rel} (a pickle that is not a Flight Recorder dump: not unpickled)")
    elif kind == "log":
        sc.logs.append((abs_path, rel))
        sc.found += console_found(abs_path, rel, head)
    elif kind == "empty":
        if suffix in (".txt", ".json"):  # a stack file the capture left empty
            sc.found.append(
                Found(rel, failed_dump(rel, "unknown", "empty dump file", kind="empty"), manifests.rows(rel), 0)
            )
        else:
            sc.skipped.append(f"{rel} (empty)")
    elif kind == "unknown" and _exposition(head):
        sc.metrics.append(Path(abs_path))
    else:
        sc.skipped.append(f"{rel} ({s.why or 'not a recognised format'})")


def _exposition(head: bytes) -> bool:
    from rankscope.datasets.readers.prometheus import looks_like_exposition

    return looks_like_exposition(head)


def _json_bucket(sc: _Scan, abs_path: str, rel: str, head: bytes, data: bytes) -> str | None:
    """Route a JSON object by its keys; returns ``pyspy-json`` when it is a stack dump after all."""
    if json_kind_from_head(head) == "fr":
        sc.fr.append((abs_path, rel))
        return None
    if b'"resultType"' in head:  # a Prometheus query result (query_range / query): metrics evidence
        sc.metrics.append(Path(abs_path))
        return None
    if len(data) > _JSON_WHOLE_LIMIT:
        sc.skipped.append(f"{rel} (a large JSON object with no Flight Recorder keys)")
        return None
    try:
        obj = load_json(data, rel)
    except InputError as exc:
        sc.skipped.append(f"{rel} (not valid JSON: {_why(exc, rel)[:80]})")
        return None
    kind, why = json_kind(obj)
    if kind == "fr":
        sc.fr.append((abs_path, rel))
    elif kind == "torchelastic-error":
        sc.elastic.append((abs_path, rel))
    elif kind == "hook-exit":
        sc.exits.append(Path(abs_path))
    elif kind == "pyspy-json":
        return "pyspy-json"
    elif kind == "prometheus":
        sc.metrics.append(Path(abs_path))
    elif kind == "hook-identity":
        sc.skipped.append(f"{rel} (a process identity without the hook's pid<PID>.json name)")
    else:
        sc.skipped.append(f"{rel} ({why}: not evidence)")
    return None


def from_dump_dir(dd: DumpDir) -> list[ProcStacks]:
    """Every process of a scanned dump directory (GC paused: see ``scan_dump_dir``)."""
    with paused_gc():
        out = []
        for f in dd.files:  # roles were resolved while scanning; no list per file (hot at 100,000 ranks)
            snapshot, rank, node, role, pid = f.snapshot, f.rank, f.node, f.role or "trainer", f.pid
            for proc in f.processes:
                out.append(from_dump(proc, snapshot=snapshot, rank=rank, node=node, role=role, pid=pid))
        return out


def stack_files(dd: DumpDir) -> Iterable[str]:
    """The relative paths of the stack files read."""
    return dict.fromkeys(f.path for f in dd.files)


__all__ = [
    "DumpDir",
    "DumpFile",
    "from_dump_dir",
    "parse_stack_bytes",
    "path_facts",
    "read_stack_file",
    "scan_dump_dir",
]
