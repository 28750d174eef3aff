"""Who each process of the stack files is: role, rank, local rank, machine, with provenance.

:func:`identify` takes every process found in the stack files (several per file for concatenated or
``--subprocesses`` dumps) and resolves them in the order of :mod:`.identity`: manifest rows (by pid when
given), the path (rank and local-rank tokens, the host folder, ``snapshot-N/``), the command line
(``--local-rank``), then the job-level steps: sibling trainers of a host numbered by pid, local ranks
mapped to global ranks over the sorted host names. Duplicates are never dropped silently: one process
dumped twice (same pid) is kept once with a note; two processes claiming one rank are refused with one
line naming both files.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from rankscope.datasets.domain.identity import Identity
from rankscope.datasets.domain.stacks import ProcessDump
from rankscope.datasets.readers.base import occurrence_rounds
from rankscope.datasets.readers.capturefolders import (
    machines_above_recurring,
    older_incidents,
    rounds_from_outer_folders,
    rounds_from_repeated_files,
    rounds_from_repeated_pids,
    rounds_from_sibling_folders,
)
from rankscope.datasets.readers.identity import (
    ManifestRow,
    folders_not_machines,
    folders_note,
    host_from_log_name,
    local_rank_from_cmdline,
    natural,
    path_facts,
)
from rankscope.spine import InputError

_DATALOADER_FRAMES = ("_worker_loop",)
_LAUNCHER_FILES = ("elastic/agent/server/api.py", "distributed/launcher/api.py", "torch/distributed/run.py")
_CHECKPOINT_HINTS = ("checkpoint", "async_save", "filesystem.py", "write_data")
_CHILD_FILES = ("multiprocessing/process.py", "multiprocessing/spawn.py", "multiprocessing/forkserver.py")
_CHILD_FUNCS = frozenset({"spawn_main", "_process_worker", "_bootstrap"})
_STATUS_RANK = {"ok": 0, "partial": 1, "cut": 2, "failed": 3}


_UNKNOWN = Identity()


@dataclass(slots=True)
class Found:
    """One process found in a stack file, before its identity is resolved."""

    rel: str
    dump: ProcessDump
    rows: Sequence[ManifestRow] | None  # the manifest rows of its file (None: no manifest lists it)
    index: int  # its position in the file
    ident: Identity = _UNKNOWN
    role: str | None = None  # dataloader / checkpoint / other; None: a trainer
    host: str | None = None  # the machine (its name, or "file:<rel>" for a per-host file without one)
    siblings: int = 1  # trainer processes in its file
    hint: tuple[str | None, int | None, str] | None = None
    """What the file's content says of its stream (a console interleaving machines, see :mod:`.consolestacks`):
    (its machine or None, its capture round or None, the stream's key: one machine)."""


_ROLE_MEMO: dict[tuple[int, bool], tuple[object, str | None]] = {}  # frames tuples are interned by the readers


def _stack_role(dump: ProcessDump, name: str, single: bool, first: bool) -> str | None:
    """dataloader / checkpoint / other (a child process) from the name and the stack; None: trainer-like."""
    low = name.lower()
    if single and "dataloader" in low:
        return "dataloader"
    if single and ("checkpoint" in low or "ckpt" in low):
        return "checkpoint"
    main = dump.main_thread
    frames = main.frames if main else ()
    key = (id(frames), first)
    hit = _ROLE_MEMO.get(key)
    if hit is not None and hit[0] is frames:
        return hit[1]
    if len(_ROLE_MEMO) > 100_000:
        _ROLE_MEMO.clear()
    role = _frames_role(frames, first)
    _ROLE_MEMO[key] = (frames, role)
    return role


_LOCAL_ARG = re.compile(r"\s--?local[-_]rank[= ]\d+")


def _strangers(group: Sequence[Found]) -> None:
    """In one file of several processes (``py-spy dump`` of every python process of a host), trainer-like
    processes whose command line is not the one most of them share are no ranks (a sidecar, a monitoring
    script): role ``other``. Only when two or more share the common command line, and it is clearly the most."""
    lines = Counter(_LOCAL_ARG.sub("", f.dump.cmdline) for f in group if f.role is None and f.dump.cmdline)
    if len(lines) < 2:
        return
    (common, n), (_, second) = lines.most_common(2)
    if n < 2 or n == second:
        return
    for f in group:
        if f.role is None and f.dump.cmdline and _LOCAL_ARG.sub("", f.dump.cmdline) != common:
            f.role = "other"


def _frames_role(frames: Sequence[Any], first: bool) -> str | None:
    if any(f.function in _DATALOADER_FRAMES for f in frames):
        return "dataloader"
    if any(f.function == "launch_agent" or f.file.replace("\\", "/").endswith(_LAUNCHER_FILES) for f in frames[-8:]):
        return "other"  # torchrun's own agent process (py-spy of a node's whole process tree), never a rank
    child = any(f.function in _CHILD_FUNCS and f.file.replace("\\", "/").endswith(_CHILD_FILES) for f in frames)
    if (child or not first) and any(h in (f.file + f.function) for f in frames for h in _CHECKPOINT_HINTS):
        return "checkpoint"
    return "other" if child else None


_ROW_SOURCES = {
    (snap, pid): MappingProxyType(
        {"rank": "manifest", "node": "manifest", "local_rank": "manifest", "pid": pid}
        | ({"snapshot": snap} if snap else {})  # no snapshot column nor snapshot-N folder: capture folders may say
    )
    for snap in ("manifest", "path", "")
    for pid in ("manifest", "content")
}


def _from_row(f: Found, row: ManifestRow) -> bool:
    """The common case, fast: one process in a file a manifest row fully describes."""
    if row.node is None:
        return False
    snap = row.snapshot if row.snapshot is not None else path_facts(f.rel).snapshot
    pid = row.pid if row.pid is not None else f.dump.pid
    told = "manifest" if row.snapshot is not None else "path" if snap is not None else ""
    how = (told, "manifest" if row.pid is not None else "content")
    src = _ROW_SOURCES[how]
    f.ident = Identity(snap or 0, row.rank, row.local_rank, row.node, None, pid, src)
    if row.role:
        f.role = None if row.role == "trainer" else row.role
    f.host = row.node
    return True


def _base(f: Found, n_in_file: int, n_trainers: int, hook_ids: Mapping[int, Mapping[str, Any]]) -> None:
    """Identity from the manifest row(s), the hook's identity of the pid, the path and the command line
    (roles are already known). Fields are gathered first and the identity built once: this runs per process."""
    if n_in_file == 1 and f.rows and len(f.rows) == 1 and _from_row(f, f.rows[0]):
        return
    facts = path_facts(f.rel)
    v: dict[str, Any] = {}
    src: dict[str, str] = {}

    def put(name: str, value: Any, how: str, *, override: bool = False) -> None:
        if value is not None and (override or v.get(name) is None):
            v[name], src[name] = value, how

    put("snapshot", facts.snapshot, "path")
    if f.hint is not None:  # a stream of a console: its machine and round, as the console tells them
        put("node", f.hint[0], "log")
        put("snapshot", f.hint[1], "log", override=True)
    rows = f.rows or ()
    if rows:
        by_pid = [r for r in rows if r.pid is not None and r.pid == f.dump.pid]
        file_rows = [r for r in rows if r.pid is None]
        row = by_pid[0] if by_pid else (file_rows[0] if file_rows and (f.role is None or n_in_file == 1) else None)
        if row is None and len(rows) == 1 and n_in_file == 1:  # one process, one row: its pid may be another
            row = rows[0]  # namespace's (a container) or absent from the dump (faulthandler prints none)
        if row is not None:
            for name in ("rank", "node", "local_rank", "pid", "snapshot"):
                put(name, getattr(row, name), "manifest", override=True)
            if row.role:
                f.role = None if row.role == "trainer" else row.role
        else:  # a process of a listed file that no row names: same machine, rank unknown
            put("node", rows[0].node, "manifest")
    hook = hook_ids.get(f.dump.pid) if hook_ids and f.dump.pid is not None else None
    if hook is not None and v.get("rank") is None and isinstance(hook.get("rank"), int):
        put("rank", hook["rank"], "hook")
        put("node", hook.get("node") or None, "hook")
        put("local_rank", hook.get("local_rank") if isinstance(hook.get("local_rank"), int) else None, "hook")
    if f.dump.header:  # what a wrapper printed before the dump (RANK=, LOCAL_RANK=, HOST=), or dshbak's host
        head = dict(f.dump.header)
        if n_in_file == 1:
            put("rank", int(head["rank"]) if "rank" in head else None, "header")
            put("local_rank", int(head["local_rank"]) if "local_rank" in head else None, "header")
        put("node", head.get("host"), "header")
    if facts.rank is not None and (n_trainers <= 1 or f.role is not None):
        put("rank", facts.rank, "path")  # (not for sibling trainers sharing one file)
    if facts.local_rank is not None and n_trainers <= 1:
        put("local_rank", facts.local_rank, "path")
    if f.dump.cmdline:
        put("local_rank", local_rank_from_cmdline(f.dump.cmdline), "cmdline")
    if facts.host is not None:
        put("node", facts.host, "host-folder")
    elif n_trainers > 1:  # one file per host (py-spy of a node's processes concatenated)
        put("node", host_from_log_name(f.rel), "host-folder")
    put("pid", f.dump.pid, "content")
    f.ident = Identity(sources=src, **v)
    if f.ident.node is not None:
        f.host = f.ident.node
    elif n_trainers > 1:  # an unnamed host: the file (a console's stream, whatever its round) holds one host's
        f.host = f"file:{f.rel}" if f.hint is None else f"stream:{f.hint[2]}"


def _rounds_in_file(group: list[Found], hooks: Mapping[int, Mapping[str, Any]]) -> None:
    """One file holding the same processes again (``py-spy dump`` appended to one file per host, round after
    round): a pid's k-th dump is its capture round k (as in a console, :func:`.base.occurrence_rounds`), where
    nothing else numbers the file's rounds. Only when every pid of the file is there as many times, round after
    round. Each process is then identified as in a file of one round (``rank3.txt`` numbers its one trainer)."""
    pids = [f.ident.pid for f in group]
    if None in pids or len(set(pids)) == len(pids) or any("snapshot" in f.ident.sources for f in group):
        return
    rounds = occurrence_rounds(pids)
    if len(set(Counter(pids).values())) != 1 or rounds != sorted(rounds):
        return
    trainers = sum(g.role is None for g, k in zip(group, rounds) if k == 0)  # in one round
    for f, k in zip(group, rounds):
        f.siblings = trainers
        _base(f, rounds.count(0), trainers, hooks)
        f.ident = f.ident._replace(snapshot=k, sources={**f.ident.sources, "snapshot": "content"})


NO_RANK = "process dump(s) with no rank"
"""The words of the note for dumps nothing numbers (a refusal quotes it when no other evidence is left)."""


def identify(
    found: list[Found],
    *,
    gpus_per_node: int | None,
    notes: list[str],
    hook_ids: Mapping[int, Mapping[str, Any]] | None = None,
) -> list[Found]:
    """Resolve every process's identity; returns the processes kept (unattributable ones are reported)."""
    hooks = hook_ids or {}
    n, i = len(found), 0
    while i < n:  # the processes of one file are consecutive
        rel, j = found[i].rel, i + 1
        while j < n and found[j].rel == rel:
            j += 1
        name, size = rel.rsplit("/", 1)[-1], j - i
        if size == 1:  # the common case: one process per file
            f = found[i]
            rows = f.rows
            if rows is not None and len(rows) == 1 and rows[0].role and _from_row(f, rows[0]):
                f.siblings = int(f.role is None)  # the manifest said everything (fastest path)
            else:
                f.role = _stack_role(f.dump, name, True, True)
                f.siblings = int(f.role is None)
                _base(f, 1, f.siblings, hooks)
            i = j
            continue
        group = found[i:j]
        for f in group:
            f.role = _stack_role(f.dump, name, False, f.index == 0)
        _strangers(group)
        trainers = sum(f.role is None for f in group)
        for f in group:
            f.siblings = trainers
            _base(f, size, trainers, hooks)
        _rounds_in_file(group, hooks)
        i = j
    found = older_incidents(found, notes)  # before capture rounds are numbered: an older incident's are no rounds
    # the path rules for capture folders concern only what no manifest numbered or named (one pass at 100k ranks)
    loose = [f for f in found if "snapshot" not in f.ident.sources or f.ident.sources.get("node") == "host-folder"]
    if loose:
        machines_above_recurring(loose, notes)
        rounds_from_sibling_folders(loose, notes)
        rounds_from_outer_folders(loose, notes)
        rounds_from_repeated_pids(loose, notes, gpus_per_node)
        rounds_from_repeated_files(loose, notes)
    if any(f.ident.rank is None for f in found):  # the job-level steps, only when some rank is still unknown
        _children_follow_their_trainer(found)
        _pid_named_files_of_one_host(found, gpus_per_node)
        _siblings_by_pid(found, gpus_per_node, notes)
        _local_to_global(found, gpus_per_node, notes)
    _folders_that_are_not_machines(found, gpus_per_node, notes)
    kept, lost = [], []
    for f in found:
        if f.ident.rank is None and f.role is None:
            lost.append(f.rel)
        else:
            kept.append(f)
    if lost:
        shown = ", ".join(list(dict.fromkeys(lost))[:5])
        notes.append(
            f"ignored {len(lost)} {NO_RANK} (no manifest row, hook identity, rank<N> in the "
            f"path or host folder to number them on): {shown}"
        )
    return _dedupe(kept, notes)


def _folders_that_are_not_machines(found: list[Found], gpus_per_node: int | None, notes: list[str]) -> None:
    """Host-folder names that cannot be machines (:func:`folders_not_machines`) lose that role: the ranks keep
    their numbers, and their machines are named from other evidence, else ``node-<k>`` with a note."""
    ranks: defaultdict[str, defaultdict[int, set[object]]] = defaultdict(lambda: defaultdict(set))
    for f in found:
        if f.role is None and f.ident.node is not None and f.ident.sources.get("node") == "host-folder":
            # distinct ranks (a copy of a dump is one rank twice); a rank still unknown counts as itself
            ranks[f.ident.node][f.ident.snapshot].add(f.ident.rank if f.ident.rank is not None else id(f))
    bad, why = folders_not_machines(ranks, gpus_per_node)
    if not bad:
        return
    for f in found:
        if f.ident.node in bad and f.ident.sources.get("node") == "host-folder":
            f.ident = f.ident._replace(node=None, sources={k: v for k, v in f.ident.sources.items() if k != "node"})
    notes.append(folders_note(bad, why))


def _children_follow_their_trainer(found: list[Found]) -> None:
    """A child process (DataLoader worker, checkpoint writer) in a file with one trainer shares its rank
    (with several sibling trainers in a file, a child's parent is unknown)."""
    trainer_of = {f.rel: f for f in found if f.role is None and f.siblings == 1}
    for f in found:
        t = trainer_of.get(f.rel)
        if f.role is not None and t is not None and f.ident.rank is None:
            f.ident = f.ident.fill("rank", t.ident.rank, t.ident.sources.get("rank", "path"))
            f.ident = f.ident.fill("local_rank", t.ident.local_rank, t.ident.sources.get("local_rank", "path"))


def _pid_named_files_of_one_host(found: list[Found], gpus_per_node: int | None) -> None:
    """One folder of files named by their process's pid (``for p in $(pgrep -f train.py); do py-spy dump --pid $p
    > $p.txt; done``), nothing else telling ranks or a machine: one host's trainers, numbered by pid as siblings
    are. Only as many as one machine holds (``--gpus-per-node``, else 8), with distinct pids: pid-named dumps of
    several machines gathered in one folder would be numbered across machines, so those stay unnumbered."""
    folders: dict[tuple[int, str], list[Found]] = defaultdict(list)
    for f in found:
        ident = f.ident
        if f.role is None and f.host is None and ident.rank is None and ident.local_rank is None and ident.node is None:
            folders[(f.ident.snapshot, f.rel.rsplit("/", 1)[0] if "/" in f.rel else "")].append(f)
    for (_snap, folder), procs in folders.items():
        pids = [f.dump.pid for f in procs]
        if len(procs) < 2 or len(procs) > (gpus_per_node or 8) or None in pids or len(set(pids)) != len(pids):
            continue
        templates = {f.rel.rsplit("/", 1)[-1].replace(str(f.dump.pid), "{pid}", 1) for f in procs}
        if len(templates) != 1 or "{pid}" not in next(iter(templates)):
            continue
        for f in procs:
            f.host = f"folder:{folder or '(the dump folder)'}"


def _siblings_by_pid(found: list[Found], gpus_per_node: int | None, notes: list[str]) -> None:
    """Trainers of one host with neither rank nor local rank: numbered by pid when every host holds the
    same count (``--gpus-per-node`` when given); otherwise refused with one line."""
    groups: dict[tuple[int, str], list[Found]] = defaultdict(list)
    for f in found:
        if f.role is not None or f.ident.rank is not None or f.ident.local_rank is not None:
            continue
        if f.host is not None and f.ident.pid is not None:
            groups[(f.ident.snapshot, f.host)].append(f)
        elif f.siblings > 1:
            raise InputError(
                f"{f.rel}: {f.siblings} trainer processes in one file and nothing tells their ranks (no "
                "manifest row with their pid, no --local-rank in their command line, no pid to order them by); "
                "add a manifest.csv with file,pid,rank,node"
            )
    if not groups:
        return
    counts = {len(v) for v in groups.values()}
    want = gpus_per_node if gpus_per_node is not None else (min(counts) if len(counts) == 1 else None)
    bad = [(k, v) for k, v in groups.items() if want is None or len(v) != want]
    if bad:
        (_snap, host), procs = bad[0]
        raise InputError(
            f"{procs[0].rel}: {len(procs)} trainer process(es) on {host.removeprefix('file:')} without a rank, but "
            + (f"--gpus-per-node is {want}" if want is not None else "other hosts hold a different number")
            + "; numbering them by pid needs one process per GPU: add a manifest.csv with file,pid,rank,node "
            "or pass --gpus-per-node"
        )
    for procs in groups.values():
        for i, f in enumerate(sorted(procs, key=lambda g: g.ident.pid or 0)):
            f.ident = f.ident.with_field("local_rank", i, "pid-order")
    notes.append(
        f"{sum(len(v) for v in groups.values())} trainer process(es) on {len({k[1] for k in groups})} host(s) had no "
        "rank: local ranks assumed from pid order (torchrun starts local ranks in order); add a manifest.csv "
        "with file,pid,rank,node to be exact"
    )


def _local_to_global(found: list[Found], gpus_per_node: int | None, notes: list[str]) -> None:
    """Local ranks on known hosts become global ranks: ``host index * G + local rank`` over sorted hosts."""
    todo = [f for f in found if f.ident.rank is None and f.ident.local_rank is not None and f.host is not None]
    if not todo:
        return
    g = gpus_per_node if gpus_per_node is not None else max(f.ident.local_rank or 0 for f in todo) + 1
    over = [f for f in todo if (f.ident.local_rank or 0) >= g]
    if over:
        f = over[0]
        raise InputError(
            f"{f.rel}: local rank {f.ident.local_rank} on {(f.host or '').removeprefix('file:')} does not fit "
            f"--gpus-per-node {g}; pass the number of GPUs per node (or a manifest.csv with file,rank,node)"
        )
    hosts = sorted({f.host for f in found if f.host is not None and f.role is None}, key=natural)
    index = {h: i for i, h in enumerate(hosts)}
    for f in todo:
        assert f.host is not None and f.ident.local_rank is not None
        f.ident = f.ident.with_field("rank", index[f.host] * g + f.ident.local_rank, "host-order")
    shown = ", ".join(h.removeprefix("file:").removeprefix("folder:") for h in hosts[:4]) + (
        ", ..." if len(hosts) > 4 else ""
    )
    notes.append(
        f"global ranks assumed from sorted host names: rank = host index x {g} + local rank ({shown}); the "
        "culprit's host is exact, its parallel group only if the hosts are in rank order (add a manifest.csv "
        "with file,rank,node to be sure)"
    )


def _better(a: Found, b: Found) -> Found:
    """Of two dumps of one process, the one with more to say."""
    ka = (_STATUS_RANK.get(a.dump.status, 4), -len(a.dump.threads), a.rel)
    kb = (_STATUS_RANK.get(b.dump.status, 4), -len(b.dump.threads), b.rel)
    return a if ka <= kb else b


def _dedupe(found: list[Found], notes: list[str]) -> list[Found]:
    """One trainer per (snapshot, rank): a process dumped twice is kept once (note); two processes are refused."""
    best: dict[tuple[int, int], Found] = {}
    twice: list[str] = []
    for f in found:
        if f.role is not None or f.ident.rank is None:
            continue
        key = (f.ident.snapshot, f.ident.rank)
        cur = best.get(key)
        if cur is None:
            best[key] = f
            continue
        pa, pb = cur.ident.pid, f.ident.pid
        if pa is not None and pb is not None and pa != pb:
            raise InputError(
                f"rank {f.ident.rank} (snapshot {f.ident.snapshot}) is claimed by two processes: {cur.rel} "
                f"(pid {pa}) and {f.rel} (pid {pb}); keep one, or give each its rank in a manifest.csv "
                "(file,pid,rank,node)"
            )
        keep = _better(cur, f)
        twice.append(f"{cur.rel} and {f.rel}")
        best[key] = keep
    if twice:
        notes.append(
            f"{len(twice)} process(es) dumped twice in one snapshot (same pid, or no pid to tell them apart); "
            f"one dump kept for each: {'; '.join(twice[:3])}" + (" ..." if len(twice) > 3 else "")
        )
    winners = {id(f) for f in best.values()}
    return [f for f in found if f.role is not None or f.ident.rank is None or id(f) in winners]
