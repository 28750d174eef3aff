"""The last step of reading a dump directory: identities resolved, the hook's run directory added, notes
written, and the refusal when nothing usable is left (see :mod:`.dumpdir`)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.datasets.domain.bounds import load_json_file, open_regular, to_float
from rankscope.datasets.domain.identity import Identity
from rankscope.datasets.readers import runfiles as rf
from rankscope.datasets.readers.base import failed_dump
from rankscope.datasets.readers.identity import Manifests, host_from_log_name, natural, path_facts
from rankscope.datasets.readers.stackid import NO_RANK, Found, identify
from rankscope.spine import InputError, RankscopeError

PACKED = (".gz", ".tgz", ".zip", ".tar", ".xz", ".bz2", ".zst", ".7z")
"""Compressed files and archives: not read (the note says to unpack them); a compressed dump named for a rank
stands for that rank as a capture not read (:func:`packed_dump`)."""


def packed_dump(rel: str, rows: Any) -> list[Found]:
    """One rank's dump, compressed (``rank3.txt.gz``, not an archive of several): a capture not read, as a
    failed one, never a rank "missing"; [] when its name numbers no rank."""
    if path_facts(rel).rank is None or rel.lower().endswith((".tgz", ".tar", ".7z", ".zip")):
        return []
    return [
        Found(rel, failed_dump(rel, "unknown", "compressed, not read: unpack it first", kind="unreadable"), rows, 0)
    ]


if TYPE_CHECKING:
    from rankscope.datasets.readers.dumpdir import DumpDir, DumpFile, _Scan
    from rankscope.datasets.readers.rundir import HookProcess


def listed(
    sc: _Scan, hooked: dict[tuple[str, int], object], manifests: Manifests, classify: Callable[..., None]
) -> None:
    """What the manifests say about the files the batches read without them: a stack file takes its manifest
    rows; one in a manifest's folder that its manifest does not list is ignored (``unlisted``); a file named
    like the hook's (``pid<PID>.<kind>``) that a manifest lists is a stack file after all (``classify``: the
    scan's ``(scan, abs_path, rel, manifests, hooked)``, with the manifests this time)."""
    if not manifests:
        return
    kept: list[Found] = []
    rel, rows, out = None, None, False
    for f in sc.found:  # the processes of one file are consecutive
        if f.rel != rel:
            rel = f.rel
            rows = manifests.rows(rel) or None
            out = rows is None and manifests.scope_of(rel) is not None
            if out:
                sc.unlisted.append(rel)
        if not out:
            f.rows = rows
            kept.append(f)
    sc.found = kept
    for key, hp in list(hooked.items()):
        files, rels = hp.files, hp.rel  # type: ignore[attr-defined]
        for kind in [k for k, r in rels.items() if manifests.rows(r)]:
            classify(sc, files.pop(kind), rels.pop(kind), manifests, hooked)
        if not files:
            del hooked[key]


def finish(
    sc: _Scan, manifests: Manifests, hooked: dict[tuple[str, int], object], *, gpus_per_node: int | None
) -> DumpDir:
    from rankscope.datasets.readers.dumpdir import DumpDir, DumpFile

    notes = list(sc.notes)
    kept = _identify(sc, notes, gpus_per_node, _hook_identities(hooked))
    _file_name_hosts(kept, sc.logs, gpus_per_node, notes)
    files: list[DumpFile] = [
        DumpFile(
            f.rel, f.ident.snapshot, f.ident.rank, f.ident.node, f.role or "trainer", f.ident.pid, (f.dump,), f.ident
        )
        for f in kept
    ]
    expected: dict[int, str] = {}
    for rows in manifests.by_file.values():
        for r in rows:
            if r.role in (None, "trainer"):
                expected.setdefault(r.rank, f"a row of {r.manifest}")
    steps: list[tuple[str, str]] = []
    coords: dict[int, dict[str, int]] = {}
    hook_fr: list[tuple[Path, int]] = []
    if hooked:
        coords = _add_hook_processes(
            hooked, files, hook_fr, sc.exits, steps, notes, sc.skipped, gpus_per_node=gpus_per_node or 8
        )
        for f in files:
            if f.identity.source("rank") == "hook" and f.rank is not None:
                expected.setdefault(f.rank, "the hook's identity")
        files = _one_per_process(files, notes)
    named: dict[int, tuple[str, str]] = {}
    for f in files:
        if f.rank is not None and f.node is not None and f.role == "trainer":
            named.setdefault(f.rank, (f.node, f.identity.sources.get("node", "path")))
    if sc.unlisted:
        shown = ", ".join(sc.unlisted[:5]) + (", ..." if len(sc.unlisted) > 5 else "")
        notes.append(
            f"ignored {len(sc.unlisted)} stack file(s) not in manifest.csv (a manifest covers their folder): {shown}"
        )
    if sc.skipped:
        shown = "; ".join(sc.skipped[:6]) + ("; ..." if len(sc.skipped) > 6 else "")
        notes.append(f"skipped {len(sc.skipped)} file(s) that are not evidence: {shown}")
    fr_ids = {abs_path: _file_identity(rel, manifests) for abs_path, rel in sc.fr}
    read = any(not f.path.endswith(PACKED) for f in files)  # compressed dumps stand for ranks, unread
    if not (read or sc.fr or hook_fr or sc.metrics or sc.timings or sc.exits or steps or sc.logs or sc.elastic):
        lost = next((n for n in notes if n.startswith("ignored ") and NO_RANK in n), None)
        if lost:  # stack dumps were found: say why none is used, not that there were none
            raise InputError(
                f"{sc.root}: {lost.removeprefix('ignored ')}: none can be used; add a manifest.csv with "
                "file,rank,node (or rank<N> in the file or folder names)"
            )
        raise InputError(
            f"{sc.root}: no stack dumps or other evidence found (expected py-spy / faulthandler stack dumps, "
            "Flight Recorder dumps, "
            "logs, TorchElastic error files, metrics* / timings* files or a run directory"
            + (f"; skipped: {'; '.join(sc.skipped[:3])}" if sc.skipped else "")
            + ")"
        )
    return DumpDir(
        sc.root,
        tuple(files),
        tuple(Path(a) for a, _ in sc.fr),
        tuple(sc.metrics),
        tuple(sc.timings),
        tuple(sc.exits),
        any(ident_named(f.identity) for f in files) or bool(manifests),
        tuple(notes),
        tuple(steps),
        coords,
        tuple(hook_fr),
        fr_ids,
        tuple(sc.logs),
        tuple(sc.elastic),
        expected,
        named,
        sc.attempt_files,
        _host_width(kept),
    )


def _identify(sc: _Scan, notes: list[str], gpus_per_node: int | None, hook_ids: Mapping[int, Any]) -> list[Found]:
    """:func:`.stackid.identify`; when the processes of py-spy dumps found inside consoles cannot be numbered
    (a stray process in a stream), they are left out with a note rather than refusing the whole input."""
    before = list(notes)
    try:
        return identify(sc.found, gpus_per_node=gpus_per_node, notes=notes, hook_ids=hook_ids)
    except InputError as exc:
        if not any(f.hint is not None for f in sc.found):
            raise
        notes[:] = before
        notes.append(f"py-spy dumps inside consoles left out: {exc}")
        sc.found = [f for f in sc.found if f.hint is None]
        return identify(sc.found, gpus_per_node=gpus_per_node, notes=notes, hook_ids=hook_ids)


def _host_width(kept: list[Found]) -> int | None:
    """How many trainers each machine (named or not: a host's file, a console's stream) holds per snapshot,
    when the stack files show one count for all: how many ranks a machine no source names holds."""
    width: Counter[tuple[int, str]] = Counter()
    for f in kept:
        if f.role is None and f.host is not None:
            width[(f.ident.snapshot, f.host)] += 1
    counts = set(width.values())
    return counts.pop() if len(counts) == 1 else None


def _one_per_process(files: list[DumpFile], notes: list[str]) -> list[DumpFile]:
    """A process the hook and another tool both dumped is kept once (the dump with a stack wins)."""
    order = {"ok": 0, "partial": 1, "cut": 2, "failed": 3}
    best: dict[tuple[int, int], DumpFile] = {}
    for f in files:
        if f.role != "trainer" or f.rank is None:
            continue
        cur = best.get((f.snapshot, f.rank))
        if cur is None:
            best[(f.snapshot, f.rank)] = f
            continue
        if cur.pid is not None and f.pid is not None and cur.pid != f.pid:
            raise InputError(
                f"rank {f.rank} (snapshot {f.snapshot}) is claimed by two processes: {cur.path} (pid {cur.pid}) and "
                f"{f.path} (pid {f.pid}); keep one, or give each its rank in a manifest.csv (file,pid,rank,node)"
            )
        a, b = order.get(cur.processes[0].status, 4), order.get(f.processes[0].status, 4)
        best[(f.snapshot, f.rank)] = f if b < a else cur
    keep = {id(f) for f in best.values()}
    out = [f for f in files if f.role != "trainer" or f.rank is None or id(f) in keep]
    if len(out) < len(files):
        notes.append(
            f"{len(files) - len(out)} process(es) both the hook and another capture dumped: one dump kept each"
        )
    return out


def _hook_identities(hooked: dict[tuple[str, int], object]) -> dict[int, dict[str, object]]:
    """The hook's identity of every pid that has one (a py-spy dump of that pid gets its rank and node)."""
    from rankscope.datasets.readers.rundir import identity

    out: dict[int, dict[str, object]] = {}
    for (_d, pid), hp in hooked.items():
        path = getattr(hp, "files", {}).get(rf.IDENTITY)
        ident = identity(path) if path else None
        if ident is not None:
            out[pid] = ident
    return out


def ident_named(ident: Identity) -> bool:
    return ident.node_is_named


def _file_identity(rel: str, manifests: Manifests) -> Identity:
    """What the manifest and the path say about a non-stack evidence file (a Flight Recorder dump)."""
    facts = path_facts(rel)
    ident = Identity().with_field("snapshot", facts.snapshot, "path")
    rows = manifests.rows(rel)
    if rows:
        r = rows[0]
        ident = ident.with_field("rank", r.rank, "manifest").with_field("node", r.node, "manifest")
        ident = ident.with_field("snapshot", r.snapshot, "manifest")
    ident = ident.fill("rank", facts.rank, "path").fill("local_rank", facts.local_rank, "path")
    return ident.fill("node", facts.host, "host-folder")


def _add_hook_processes(
    hooked: dict[tuple[str, int], object],
    files: list[DumpFile],
    fr: list[tuple[Path, int]],
    exits: list[Path],
    steps: list[tuple[str, str]],
    notes: list[str],
    ignored: list[str],
    *,
    gpus_per_node: int,
) -> dict[int, dict[str, int]]:
    """The hook's per-process files (a run directory) as dump files, exits, FR dumps and step files."""
    from rankscope.datasets.readers.dumpdir import DumpFile
    from rankscope.datasets.readers.rundir import coords_of, resolve

    by_dir: dict[str, dict[int, HookProcess]] = {}
    for (d, pid), hp in hooked.items():
        by_dir.setdefault(d, {})[pid] = hp  # type: ignore[assignment]
    coords = dict[int, dict[str, int]]()
    for d, procs in sorted(by_dir.items()):
        snap = path_facts(d + "x").snapshot or 0
        resolved = resolve(procs, gpus_per_node=gpus_per_node, notes=notes)
        by_pid = {p.pid: p for p in resolved}
        keep = set(by_pid)
        run_start = min((p.started for p in resolved if p.role == "trainer" and p.started), default=None)
        stale_exits = 0
        for p in resolved:
            ident = Identity(snapshot=snap).with_field("rank", p.rank, "hook").with_field("pid", p.pid, "hook")
            if p.identity.get("node"):  # the hook names the machine (RANKSCOPE_NODE or the hostname)
                ident = ident.with_field("node", p.node, "hook")
            ident = ident.with_field("local_rank", _int(p.identity.get("local_rank")), "hook")
            files.append(DumpFile(p.stack_rel, snap, p.rank, ident.node, p.role, p.pid, (p.dump,), ident))
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
            ignored.extend(
                f"{rel} (hook file without a usable identity)"
                for hp in procs.values()
                for k, rel in hp.rel.items()
                if k not in (rf.CTL, rf.EXIT)
            )
    return coords


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _record_time(path: str) -> float:
    """The ``time`` of a hook exit record; +inf when unreadable (kept, and reported by the exit reader)."""
    try:
        rec = load_json_file(path)
    except InputError:
        return float("inf")
    t = to_float(rec.get("time")) if isinstance(rec, dict) else None
    return float("inf") if t is None else t


def _file_name_hosts(
    kept: list[Found], logs: list[tuple[str, str]], gpus_per_node: int | None, notes: list[str]
) -> None:
    """Machines named in front of the rank in stack file names (``llm-train-worker-0-rank3.txt``, as
    ``kubectl exec <pod> -- py-spy dump`` per pod leaves them), taken only when the logs' own file names name
    the same machines (``llm-train-worker-0.log``, or the pods ``kubectl logs --prefix`` names in its lines),
    every unnamed trainer has one, and none holds more ranks in a snapshot than a machine has GPUs: a prefix
    alone (``run42-rank3``) names no machine."""
    trainers = [f for f in kept if f.role is None and f.ident.node is None]
    if not trainers or not logs:
        return
    known = {h for h in (host_from_log_name(rel) for _, rel in logs) if h} | _pods_in(logs)
    prefixes = [_name_prefix(f.rel) for f in trainers]
    hosts = [h for h in prefixes if h is not None and h in known]
    if len(hosts) < len(trainers):
        return
    per: Counter[tuple[str, int | None]] = Counter((h, f.ident.snapshot) for h, f in zip(hosts, trainers))
    if len(set(hosts)) < 2 or max(per.values()) > (gpus_per_node or 8):
        return
    for h, f in zip(hosts, trainers):
        f.ident = f.ident.with_field("node", h, "host-folder")
    notes.append(
        f"machine names of {len(trainers)} stack file(s) read in front of the rank in their names "
        f"({', '.join(sorted(set(hosts), key=natural)[:3])}{', ...' if len(set(hosts)) > 3 else ''}), as the logs "
        "name them"
    )


def _name_prefix(rel: str) -> str | None:
    stem = rel.rsplit("/", 1)[-1].split(".", 1)[0]
    m = _RANK_TOKEN.search(stem)
    return (stem[: m.start()].rstrip("-_ ") or None) if m else None


_RANK_TOKEN = re.compile(r"[-_ ](?:local[-_]?)?rank[-_]?\d+$", re.I)


def _pods_in(logs: list[tuple[str, str]]) -> set[str]:
    """The pods ``kubectl logs --prefix`` consoles name in their first 64 KiB (``[pod/<pod>/<container>] ``)."""
    from rankscope.datasets.readers.logprefix import line_source, prefix_kind

    out: set[str] = set()
    for abs_path, _ in logs[:64]:
        try:
            with open_regular(abs_path) as fh:  # a regular file only (never a FIFO swapped in since the walk)
                head = fh.read(1 << 16)
        except (OSError, RankscopeError):
            continue
        if prefix_kind(head) == "kubectl":
            lines = head.decode("utf-8", errors="replace").splitlines()
            out |= {src[0] for ln in lines if (src := line_source(ln, "kubectl")) is not None}
    return out


__all__ = ["Found", "finish", "listed"]
