"""Every evidence source of a scanned dump directory read into memory, each failure a note.

One unreadable file is a note, never an abort: a bad Flight Recorder dump, metrics or timings file, exit
record or log is skipped with its reason, and the input is refused only when nothing usable is left. A
pickle that names code is the exception: it is refused outright (the input may have been tampered with).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rankscope.datasets.domain.exits import ProcessExit
from rankscope.datasets.domain.flight_recorder import FRDump
from rankscope.datasets.domain.logs import LogEvidence
from rankscope.datasets.domain.stacks import ProcStacks, from_dump
from rankscope.datasets.loading.names import Names
from rankscope.datasets.readers.dumpdir import DumpDir, from_dump_dir
from rankscope.datasets.readers.exits import read_exit_records
from rankscope.datasets.readers.identity import _dir_facts, folders_not_machines, folders_note
from rankscope.spine import InputError, ParseError, paused_gc


@dataclass
class Sources:
    """What :func:`read_sources` read."""

    procs: list[ProcStacks]
    fr: list[FRDump] = field(default_factory=list)
    exits: list[ProcessExit] = field(default_factory=list)
    metrics: Any = None
    timings: Any = None
    logs: LogEvidence | None = None
    names: Names = field(default_factory=Names)
    notes: list[str] = field(default_factory=list)
    assumed_ranks: list[int] = field(default_factory=list)


def read_sources(
    dd: DumpDir, *, gpus_per_node: int | None, node_label: str | None = None, metric_format: str = "auto"
) -> Sources:
    """Stacks, Flight Recorder dumps, logs, exits, metrics and timings of ``dd``, with machine names. Metric
    files are checked here (a bad one is a note) and streamed when analysed (:class:`MetricSet`)."""
    src = Sources([], notes=list(dd.notes))
    src.procs = _rounds_with_trainers(from_dump_dir(dd), src.notes)
    for rank, (node, how) in dd.named_nodes.items():
        src.names.add(rank, node, how)
    src.fr = _read_fr(dd, src, gpus_per_node) + _read_hook_fr(dd.hook_fr_files, src.notes)
    if dd.log_files or dd.elastic_files:
        _read_logs(dd, src, gpus_per_node)
    nodes = src.names.nodes()
    exit_notes: list[str] = []
    src.exits = read_exit_records(dd.exit_files, nodes=nodes, notes=exit_notes) + src.exits
    src.notes += exit_notes
    src.metrics = _metric_set(dd, node_label, metric_format, src.notes)
    src.timings = _read_tables(dd, nodes, src.notes)
    for df, how in ((src.timings, "timings"),):  # their node column names machines too
        if df is not None and "node" in df.columns and "rank" in df.columns:
            pairs = df.select("rank", "node").drop_nulls().unique().iter_rows()
            src.names.add_all((int(r), str(n), how) for r, n in pairs)
    bad_only = not (src.procs or src.fr or src.exits or src.metrics is not None or src.timings is not None)
    if bad_only and (src.logs is None or src.logs.empty) and not dd.log_files and _table_errors(src):
        raise InputError(_table_errors(src)[0])
    return src


def _rounds_with_trainers(procs: list[ProcStacks], notes: list[str]) -> list[ProcStacks]:
    """The stack snapshots that hold a trainer's dump: a round that reached only launchers and helpers (a
    console whose capture was cut by ``scancel`` after the agents) shows nothing of the job and is left out,
    with a note, when another round shows the trainers."""
    snaps = {p.snapshot for p in procs}
    with_trainers = {p.snapshot for p in procs if p.role == "trainer"}
    empty = sorted(snaps - with_trainers)
    if not with_trainers or not empty:
        return procs
    notes.append(
        f"stack snapshot(s) {', '.join(map(str, empty[:5]))} left out: no trainer's dump in them (only launchers "
        "or helpers: the capture did not reach the training processes)"
    )
    return [p for p in procs if p.snapshot in with_trainers]


def _table_errors(src: Sources) -> list[str]:
    return [n.removeprefix("unreadable: ") for n in src.notes if n.startswith("unreadable: ")]


def _read_fr(dd: DumpDir, src: Sources, gpus_per_node: int | None) -> list[FRDump]:
    """One Flight Recorder dump per rank and snapshot (one name family when a rank was dumped in several
    formats); a bad dump is a note. A dump's snapshot (``snapshot-N/``, a manifest's column) is its capture:
    the analysis diagnoses the latest and compares it with the one before. Machine names come from each
    file's manifest row or host folder."""
    if not dd.fr_files:
        return []
    from rankscope.datasets.readers.flight_recorder import read_fr_each
    from rankscope.datasets.readers.fr_files import select_fr_files

    chosen = [str(p) for p in select_fr_files(dd.fr_files)]
    if len(chosen) < len(dd.fr_files):
        src.notes.append(
            f"Flight Recorder: read {len(chosen)} of {len(dd.fr_files)} dump files (one per rank; the other "
            "files are the same ranks in another format)"
        )
    idents = {p: dd.fr_identities.get(p) for p in chosen}
    ranks = {  # a manifest's rank wins over the file's
        p: i.rank for p, i in idents.items() if i is not None and i.source("rank") == "manifest" and i.rank is not None
    }
    dumps, bad = read_fr_each(chosen, ranks)  # corrupt, over a limit, not a regular file: a note each
    dumps = _other_runs_left_out(dumps, src.notes)
    read: list[tuple[FRDump, Any]] = [(d, dd.fr_identities.get(d.source_file)) for d in dumps]
    with paused_gc():
        folders, machines = _capture_folders(read, src.notes)
        not_hosts = _folders_not_hosts(read, folders, machines, gpus_per_node, src.notes)
        out: dict[tuple[int, int], FRDump] = {}
        for d, ident in read:
            folder = os.path.dirname(d.source_file)
            snap = folders.get(folder, ident.snapshot if ident is not None else 0)
            key = (snap, d.rank)
            if key in out:
                bad.append(f"{d.source_file}: a second dump of rank {d.rank} (kept {out[key].source_file})")
                continue
            out[key] = replace(d, capture=key[0])
            if ident is not None and ident.node is not None:
                how = ident.sources.get("node", "host-folder")
                if how == "host-folder" and ((folder in folders and folder not in machines) or ident.node in not_hosts):
                    # the folder is a capture (the same ranks in each) or the dump folder, not a machine; a
                    # capture folder each host holds a share of (``<host>/fr-dump-1/``): the folder above is
                    up = _host_above(dd.root, folder) if folder in folders else None
                    if up and up not in not_hosts:
                        src.names.add(d.rank, up, "host-folder")
                    continue
                src.names.add(d.rank, ident.node, how)
    if bad:
        src.notes.append(f"{len(bad)} Flight Recorder file(s) skipped: {bad[0]}" + (" ..." if len(bad) > 1 else ""))
    snapshots = sorted({snap for snap, _ in out})
    if len(snapshots) > 1:
        src.notes.append(
            f"Flight Recorder dumps of {len(snapshots)} snapshots: snapshot {snapshots[-1]} is diagnosed, "
            f"snapshot {snapshots[-2]} tells whether the job moved in between"
        )
    return sorted(out.values(), key=lambda d: (d.capture, d.rank))


STALE_S = 300.0
"""Dumps whose whole history ended this long before any record of the other dumps began are another run's (a
node-local dump path an earlier, larger job also wrote): within one incident the ranks' records interleave, the
same collective created by every member within seconds, and a stuck rank stops the others within a step."""


def _other_runs_left_out(dumps: list[FRDump], notes: list[str]) -> list[FRDump]:
    spans = []
    for d in dumps:  # records are appended as ops are created: the first and last with a time bound the rest
        first = next((e.time_created_ns for e in d.entries if e.time_created_ns), None)
        last = next((e.time_created_ns for e in reversed(d.entries) if e.time_created_ns), None)
        if first and last:
            spans.append((max(first, last), min(first, last), d))
    if len(spans) < 2:
        return dumps
    spans.sort(key=lambda x: x[0])
    first_after = [0] * len(spans)  # the earliest record of the dumps that end later than dump i
    low = spans[-1][1]
    for i in range(len(spans) - 1, -1, -1):
        first_after[i] = low
        low = min(low, spans[i][1])
    for i in range(len(spans) - 1):  # the earliest split: the dumps ending by spans[i] against those after
        if spans[i + 1][0] == spans[i][0] or first_after[i] - spans[i][0] <= STALE_S * 1e9:
            continue
        old, new = [x[2] for x in spans[: i + 1]], [x[2] for x in spans[i + 1 :]]
        if {d.rank for d in old} & {d.rank for d in new}:
            continue
        shown = ", ".join(os.path.basename(d.source_file) for d in old[:4]) + (" ..." if len(old) > 4 else "")
        gap_min = (first_after[i] - spans[i][0]) / 6e10
        if _same_collectives(old, new):
            notes.append(
                f"Flight Recorder: {len(old)} dump(s) ({shown}) record times {gap_min:.0f}"
                " min before the other dumps' first record, yet their ranks are members of the other dumps' groups "
                "and hold the same collectives (sequence ids and ops): one run, their machine's clock is off; kept"
            )
            return dumps
        notes.append(
            f"Flight Recorder: {len(old)} dump(s) left out as another run's ({shown}): their last record is "
            f"{gap_min:.0f} min older than the first record of the other dumps, and "
            "those hold other ranks"
        )
        gone = {id(d) for d in old}
        return [d for d in dumps if id(d) not in gone]
    return dumps


def _same_collectives(old: list[FRDump], new: list[FRDump]) -> bool:
    """Whether ``old`` are dumps of the same run as ``new`` whose clock is off: every rank of ``old`` is a member
    of ``new``'s groups (``pg_config``), the collectives both hold (group, sequence id) are the same ops, at
    least :data:`SAME_RUN_MIN` of them, and they stopped at the same point (:func:`_same_progress`). Another
    run's dumps (a larger job's ranks; an earlier attempt of the same job, which numbers the same collectives
    alike but stopped elsewhere) fail one of these. Dumps without group members (gloo) are left out."""
    members = {r for d in new for g in d.pg_config.values() for r in (g.ranks or ())}
    if not members or any(d.rank not in members for d in old):
        return False
    ops = {
        (e.pg_name, e.pg_desc, e.collective_seq_id): e.profiling_name
        for d in new
        for e in d.entries
        if not e.is_p2p and e.collective_seq_id > 0
    }
    shared = [
        ops.get((e.pg_name, e.pg_desc, e.collective_seq_id)) == e.profiling_name
        for d in old
        for e in d.entries
        if not e.is_p2p and (e.pg_name, e.pg_desc, e.collective_seq_id) in ops
    ]
    if len(shared) < SAME_RUN_MIN or not all(shared):
        return False
    return _same_progress(old, new)


def _last_ids(dumps: list[FRDump]) -> dict[tuple[str, str], list[int]]:
    """Per group (name, description), each dump's last collective sequence id in it."""
    out: dict[tuple[str, str], list[int]] = {}
    for d in dumps:
        last: dict[tuple[str, str], int] = {}
        for e in d.entries:
            if not e.is_p2p and e.collective_seq_id > 0:
                key = (e.pg_name, e.pg_desc)
                last[key] = max(last.get(key, 0), e.collective_seq_id)
        for key, v in last.items():
            out.setdefault(key, []).append(v)
    return out


def _same_progress(old: list[FRDump], new: list[FRDump]) -> bool:
    """Whether ``old`` stopped where ``new`` did: in every group both hold, each old dump's last collective is
    within the spread of the new dumps' last ones (at least :data:`SAME_RUN_MIN` ids either side). An earlier
    attempt of the same job numbers the same collectives alike (sequence ids restart with the process group),
    but it stopped at another step, unless by chance."""
    mine, theirs = _last_ids(old), _last_ids(new)
    common = mine.keys() & theirs.keys()
    for key in common:
        lo, hi = min(theirs[key]), max(theirs[key])
        slack = max(SAME_RUN_MIN, hi - lo)
        if any(v < lo - slack or v > hi + slack for v in mine[key]):
            return False
    return bool(common)


SAME_RUN_MIN = 8


def _folders_not_hosts(
    read: Sequence[tuple[FRDump, Any]],
    captures: dict[str, int],
    machines: set[str],
    gpus_per_node: int | None,
    notes: list[str],
) -> set[str]:
    """Host-folder names of the dumps that name no machine (:func:`folders_not_machines`: the one folder
    holding every dump, one holding more ranks than a machine has GPUs); capture folders are not counted, the
    machine folders inside captures are, per capture."""
    per: defaultdict[str, defaultdict[int, set[object]]] = defaultdict(lambda: defaultdict(set))
    for d, ident in read:
        folder = os.path.dirname(d.source_file)
        hosted = ident is not None and ident.node is not None and (folder not in captures or folder in machines)
        if hosted and ident.sources.get("node", "host-folder") == "host-folder":
            per[ident.node][captures.get(folder, ident.snapshot)].add(d.rank)
    bad, why = folders_not_machines(per, gpus_per_node)
    if bad:
        notes.append(f"Flight Recorder: {folders_note(bad, why)}")
    return bad


def _capture_folders(read: Sequence[tuple[FRDump, Any]], notes: list[str]) -> tuple[dict[str, int], set[str]]:
    """Folders that are captures, not machines: sibling folders holding dumps of the same rank (a watchdog's
    dumps in ``wd/``, later ones in ``on-error/``; ``step-10/`` and ``step-20/``), none of them a
    ``snapshot-N/`` folder or manifest snapshot. Host folders split the ranks; capture folders repeat them.
    Each gets a capture number in the order of its newest recorded time (the dump's own time, else its
    entries' newest; then the files' modification time), so the latest is diagnosed and the one before
    tells whether the job moved; ({}, ...) when no rank was dumped in two folders. The set: the dump folders
    that are machines inside a capture folder (``<stamp>/<host>/``)."""
    by_path: dict[str, set[int]] = {}
    for d, ident in read:
        if ident is not None and ident.snapshot:  # snapshot-N folders or a manifest column number the captures
            return {}, set()
        by_path.setdefault(os.path.dirname(d.source_file), set()).add(d.rank)
    key_of = _capture_keys(by_path)
    by_folder: dict[str, set[int]] = {}
    for path, ranks in by_path.items():
        by_folder.setdefault(key_of[path], set()).update(ranks)
    if len(by_folder) < 2:
        return {}, set()
    seen: dict[int, int] = {}
    for ranks in by_folder.values():
        for r in ranks:
            seen[r] = seen.get(r, 0) + 1
    if not any(n > 1 for n in seen.values()):
        return {}, set()
    common = set.intersection(*by_folder.values()) or set(seen)  # compare folders on the ranks they share
    newest: dict[str, tuple[int, float]] = {}
    for d, _ in read:
        if d.rank not in common:
            continue
        t = d.dump_time_ns or max((e.time_created_ns or 0 for e in d.entries), default=0)
        try:
            written = os.stat(d.source_file).st_mtime  # ties (no op created in between): when it was written
        except OSError:
            written = 0.0
        f = key_of[os.path.dirname(d.source_file)]
        old = newest.get(f, (0, 0.0))
        newest[f] = (max(old[0], t), max(old[1], written))
    order = sorted(by_folder, key=lambda f: (newest.get(f, (0, 0.0)), f))
    names = [os.path.basename(f) or f for f in order]
    notes.append(
        f"Flight Recorder: {len(order)} folders hold dumps of the same ranks ({', '.join(names[:4])}): read as "
        f"{len(order)} captures in the order of their newest recorded time, not as machines; {names[-1]} is "
        "diagnosed"
    )
    index = {f: i for i, f in enumerate(order)}
    machines = {path for path, key in key_of.items() if key == os.path.dirname(path)}
    return {path: index[key] for path, key in key_of.items()}, machines


def _host_above(root: Path, folder: str) -> str | None:
    """The machine the folder above a capture folder names (none at the input's top)."""
    rel = os.path.relpath(folder, root).replace(os.sep, "/")
    parent = rel.rpartition("/")[0]
    return _dir_facts(parent)[3] if parent and not rel.startswith("..") else None


def _capture_keys(by_path: Mapping[str, set[int]]) -> dict[str, str]:
    """Each dump folder's capture: folders of one name under several parents holding disjoint ranks
    (``<host>/fr-dump-1/``: each host's share of one capture) are one capture, named by that name; folders
    under one parent holding disjoint ranks, the parent one of several holding the same folders and ranks
    (``<stamp>/<host>/``: a capture with a folder per machine inside) are one capture, the parent."""
    by_name: dict[str, list[str]] = {}
    by_parent: dict[str, dict[str, frozenset[int]]] = {}
    for path in by_path:
        by_name.setdefault(os.path.basename(path), []).append(path)
        parent, _, name = path.rpartition(os.sep)
        by_parent.setdefault(parent, {})[name] = frozenset(by_path[path])
    key_of = {}
    for name, paths in by_name.items():
        sets = [by_path[p] for p in paths]
        shared = len(paths) > 1 and sum(map(len, sets)) == len(set().union(*sets))
        for p in paths:
            key_of[p] = f"*/{name}" if shared else p
    split = {  # parents whose folders split their ranks (machines), laid out alike under several parents
        parent: kids
        for parent, kids in by_parent.items()
        if len(kids) > 1 and sum(map(len, kids.values())) == len(frozenset().union(*kids.values()))
    }
    for parent, kids in split.items():
        if sum(other == kids for other in split.values()) > 1:
            for name in kids:
                key_of[os.path.join(parent, name)] = parent
    return key_of


def _read_hook_fr(files: Sequence[tuple[Path, int]], notes: list[str]) -> list[FRDump]:
    """The hook's Flight Recorder dumps (the rank is known from the identity); a bad one is a note."""
    if not files:
        return []
    from rankscope.datasets.readers.flight_recorder import read_fr_file

    out, bad = [], []
    for path, rank in files:
        try:
            out.append(read_fr_file(path, rank=rank))
        except Exception as exc:
            bad.append(f"{path.name}: {exc}")
    if bad:
        notes.append(f"{len(bad)} Flight Recorder dump(s) of the run directory skipped: {bad[0]}"[:300])
    return out


def _read_logs(dd: DumpDir, src: Sources, gpus_per_node: int | None) -> None:
    """Logs and TorchElastic error files: log evidence, exits, machine names, and a stack snapshot."""
    from rankscope.datasets.readers.logmerge import read_logs

    lr = read_logs(dd.log_files, dd.elastic_files, gpus_per_node=gpus_per_node, attempt_files=dd.attempt_files)
    src.notes += lr.notes
    src.logs = lr.evidence
    src.exits += lr.exits
    src.assumed_ranks += lr.assumed_ranks
    for rank, (node, how) in lr.names.items():
        src.names.add(rank, node, how)
    if lr.stacks:
        snap = max((p.snapshot for p in src.procs), default=-1) + 1  # after the dump files' snapshots
        have = {p.rank for p in src.procs if p.role == "trainer"}
        if not have:
            src.procs += [
                from_dump(d, snapshot=snap, rank=r, node=node or None, role="trainer") for r, node, d in lr.stacks
            ]
            src.notes.append(
                f"logs: the faulthandler stacks of {len(lr.stacks)} ranks in the logs are a stack snapshot"
            )
        else:
            src.notes.append("logs: faulthandler stacks in the logs not used (the stack dump files are)")


def _metric_set(dd: DumpDir, node_label: str | None, metric_format: str, notes: list[str]) -> Any:
    """The metric files as a MetricSet (each file's format from its content unless forced; a file that
    cannot be metrics is a note)."""
    if not dd.metric_files:
        return None
    from rankscope.datasets.domain.metrics import MetricSet
    from rankscope.datasets.readers.metric_files import check_metric_file, sniff_metric_file

    files = []
    for p in dd.metric_files:
        try:
            fmt = sniff_metric_file(p) if metric_format == "auto" else metric_format
            check_metric_file(p, fmt, node_label)
        except (ParseError, InputError) as exc:
            notes.append(f"unreadable: {exc}")
            continue
        files.append((p, fmt))
    return MetricSet(tuple(files), node_label=node_label) if files else None


def _read_tables(dd: DumpDir, nodes: dict[int, str], notes: list[str]) -> Any:
    """Timings files (each bad file a note) and the hook's step records."""
    if not dd.timing_files and not dd.step_files:
        return None
    import polars as pl

    from rankscope.datasets.readers import tables

    frames = []
    for p in dd.timing_files:
        try:
            frames.append(tables.read_timings([p]))
        except (ParseError, InputError) as exc:
            notes.append(f"unreadable: {exc}")
    timings = pl.concat(frames, how="diagonal_relaxed") if frames else None
    if dd.step_files:  # the hook's log_step records: per-rank step times
        from rankscope.datasets.readers.rundir import read_steps

        steps = read_steps(list(dd.step_files), nodes)
        if steps is not None:
            timings = steps if timings is None else pl.concat([timings, steps], how="diagonal_relaxed")
    return timings
