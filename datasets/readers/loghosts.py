"""Which machine each log file ran on, where its path misleads (see :func:`machine_names`)."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from rankscope.datasets.readers.identity import POD_DIR, natural, slurm_task
from rankscope.datasets.readers.logs import FileRead, Stream, to_epoch


def machine_names(reads: Sequence[FileRead], notes: list[str]) -> None:
    """Which machine each log file ran on, where the path misleads. A folder holding several per-host
    consoles (each several workers' lines, each named after another machine: ``pods/<pod>.log``,
    ``slurm-<jobid>/<host>.out``) is a collection, not a machine: each console's own name is (else NCCL's).
    NCCL's debug lines name the machine they ran on (``gethostname()``): that names a file whose path names
    none, and beats a SLURM task file's name (``%x-%j-%t.out``); never a folder or file the user named after
    a machine, and never a container's id. Without NCCL's lines, the launcher's own failure summary in a
    file (``host : cn0102``) names it the same way."""
    by_folder: defaultdict[str, list[FileRead]] = defaultdict(list)
    for f in reads:
        if f.host_from == "folder" and f.path_local is None:
            by_folder[f.rel.rsplit("/", 1)[0] if "/" in f.rel else ""].append(f)
    for folder, fs in by_folder.items():
        own = {f.rel: f.name_host or _nccl(f) for f in fs if f.workers >= 2 or _nccl(f)}
        if len(fs) < 2 or len(own) < len(fs) or len(set(own.values()) - {None}) < len(fs):
            continue
        for f in fs:
            by_nccl = f.name_host is None
            f.host, f.host_from = own[f.rel], "nccl" if by_nccl else "file"
            f.host_source = "log" if by_nccl else "host-folder"
        notes.append(
            f"logs: {folder}/ holds {len(fs)} consoles of different machines: each is named by its own "
            "(NCCL's host name, else the file name), not by the folder"
        )
    batch = {  # (job id, task) -> machine, from `srun --label hostname` in a batch log (slurm-<jobid>.out)
        (m.group(1), int(k.split()[1])): h
        for f in reads
        if f.task_hosts and (m := _BATCH_LOG.search(f.rel))
        for k, h in f.task_hosts.items()
    }
    for f in reads:
        # a name a task printed, a Slurm task file's name: the launcher's own summary (or NCCL) names better
        task = slurm_task(f.rel)
        unnamed = f.host_from in ("", "task", "hostname") or (f.host_from == "file" and task is not None)
        if unnamed and task and (host := batch.get(task)):
            f.host, f.host_from, f.host_source = host, "srun", "log"
            continue
        nccl = _nccl(f)
        if nccl and unnamed:
            f.host, f.host_from, f.host_source = nccl, "nccl", "log"
        elif unnamed and (summary_host := _summary_host(f)) is not None:
            f.host, f.host_from, f.host_source = summary_host, "summary", "log"


def _summary_host(f: FileRead) -> str | None:
    """The one machine the launcher's own failure summary in this file names (``host : cn0102``): one torchrun
    agent's console lists its own workers, on its own machine."""
    hosts = {e.host for e in f.summary if is_machine_name(e.host)}
    return hosts.pop() if len(hosts) == 1 else None


_BATCH_LOG = re.compile(r"(?:^|/)slurm-(\d+)(?:_\d+)?\.out$")
"""The batch log ``sbatch`` writes by default (``slurm-%j.out``, an array's ``slurm-%A_%a.out``)."""
_CONTAINER_ID = re.compile(r"^(?:[0-9a-f]{12}|[0-9a-f]{64})$")
"""docker's default host name inside a container (its id): no machine."""


def _nccl(f: FileRead) -> str | None:
    """The machine NCCL's lines name, unless it is a container's id."""
    host = f.nccl_host
    return host if host and not _CONTAINER_ID.match(host) else None


def is_machine_name(host: str | None) -> bool:
    """A host name worth naming (torchrun prints ``localhost`` when it knows no better)."""
    return bool(host) and host not in ("localhost", "127.0.0.1", "::1", "<N/A>")


_ATTEMPT_DIR = re.compile(r"^(.*?)/attempt[-_]?(\d+)/", re.I)


_LOG_DIR_TREE = re.compile(r"^(.*?[^/]+/attempt[-_]?\d+)/\d+/[^/]+$", re.I)


_POD_LOG = re.compile(rf"^(?P<run>.*?(?:^|/){POD_DIR}/[^/]+)/(?P<k>\d+)\.log(?:\.\d{{8}}-\d{{6}}(?:\.gz)?)?$")
"""A kubelet's pod log, ``<namespace>_<pod>_<uid>/<container>/<restart count>.log`` (rotated:
``<n>.log.<YYYYMMDD-HHMMSS>[.gz]``): the kubelet keeps the log of the container before the running one beside it."""


def generation(rel: str) -> tuple[str, int] | None:
    """Which run of a restarted job the file ``rel`` is of: (its launcher's ``<run_id>`` folder of
    ``attempt_<k>/``, k), or (its pod's container folder, the container's restart count), else None."""
    if m := _ATTEMPT_DIR.match(rel):
        return m.group(1), int(m.group(2))
    if m := _POD_LOG.match(rel):
        return m.group("run"), int(m.group("k"))
    return None


def _dropped_note(
    what: str,
    why: str,
    unit: str,
    rels: Sequence[str],
    gens: Mapping[str, tuple[str, int] | None],
    latest: Mapping[str, int],
) -> list[str]:
    """The note on the files ``rels`` of runs that a restart replaced (``why``: what restarted; ``gens``: each
    file's :func:`generation`), naming up to three runs and the latest attempt or restart of each."""
    if not rels:
        return []
    runs = sorted({g[0] for rel in rels if (g := gens[rel])}, key=natural)
    latest_of = ", ".join(str(latest[r]) for r in runs[:3])
    return [
        f"{len(rels)} {what} not used: {why} ({', '.join(runs[:3])}: latest {unit} {latest_of}); the verdict is "
        "about the latest"
    ]


def launcher_key(rel: str) -> str | None:
    """The one launcher a ``--log-dir`` file belongs to when no host folder names it: its
    ``<run_id>/attempt_<k>`` folder (every local rank of one torchrun agent writes below it), else None."""
    m = _LOG_DIR_TREE.match(rel)
    return f"logdir:{m.group(1)}" if m else None


def latest_attempts(
    reads: list[FileRead],
    errors: list[tuple[str, Any]],
    notes: list[str],
    also: Sequence[str] = (),
    mtimes: Mapping[str, float] | None = None,
) -> tuple[list[FileRead], list[tuple[str, Any]]]:
    """Only the latest attempt of a restarted job (``torchrun --max-restarts``): the files of a ``--log-dir``
    tree's ``attempt_<k>/`` when a later attempt of the same run exists, and what a console logged before its
    launcher's last "will restart worker group", belong to processes the restart already replaced."""
    gens = {rel: generation(rel) for rel in [f.rel for f in reads] + [rel for rel, _ in errors] + list(also)}
    latest: dict[str, int] = {}
    for g in gens.values():
        if g:
            latest[g[0]] = max(latest.get(g[0], 0), g[1])

    def old(rel: str) -> bool:
        g = gens[rel]
        return g is not None and g[1] < latest[g[0]]

    stale = _earlier_runs(reads, mtimes or {})
    kept = [f for f in reads if not old(f.rel) and not _under(f.rel, stale)]
    kept_errors = [(rel, e) for rel, e in errors if not old(rel) and not _under(rel, stale)]
    if stale:
        notes.append(
            f"{len(stale)} earlier run(s) in a reused --log-dir ({', '.join(sorted(stale)[:3])}) not used: a later "
            "run of the same launcher logged after them"
        )
    dropped = [rel for rel in [f.rel for f in reads] + [rel for rel, _ in errors] if old(rel)]
    pods = {rel for rel in dropped if _POD_LOG.match(rel)}
    attempts = [rel for rel in dropped if rel not in pods]
    notes += _dropped_note(
        "log or error file(s) of earlier attempts", "the job restarted", "attempt", attempts, gens, latest
    )
    notes += _dropped_note(
        "pod log file(s) of earlier containers", "their containers restarted", "restart", sorted(pods), gens, latest
    )
    for f in kept:
        if f.restarted_at:
            f.drop_before(f.restarted_at)
    if any(f.restarted_at for f in kept):
        notes.append(
            "a console's lines before its launcher's last 'will restart worker group' are of an attempt the restart "
            "replaced: not used"
        )
    return kept, kept_errors


def failed_pid(f: FileRead, st: Stream, rank: int, line: int) -> int | None:
    """The pid the launcher's "failed (exitcode: N) local_rank: L (pid: P)" line, after ``line``, gives this
    rank's process: its local rank from its tag, else its place among the file's ranks (torchrun numbers one
    agent's workers consecutively)."""
    ranks = sorted({s.rank for s in f.streams.values() if s.rank is not None})
    local = st.local if st.local is not None else (rank - ranks[0] if ranks else None)
    return next((pid for ln, lr, pid in f.failed_pids if lr == local and ln > line), None)


def zone_offset(launcher: Sequence[Any], err_local: Sequence[tuple[str, Any, Any]], ranks: Any) -> float:
    """Seconds to add to the logs' naive (local) times so they compare with epoch times, from failures that
    both the launcher's summary and an error file timed; 0 when none."""
    by_rank = {e.rank: e.time for e in launcher if e.time is not None}
    diffs = []
    for _rel, one, facts in err_local:
        r = ranks.of_error_file(facts)
        if r is not None and r in by_rank and one.time is not None:
            diffs.append(one.time - by_rank[r])
    if not diffs:
        return 0.0
    diffs.sort()
    return round(diffs[len(diffs) // 2] / 900.0) * 900.0  # time zones are whole quarter hours


def lived_on(f: FileRead, st: Stream, ex: dict[str, Any]) -> str:
    """Why the exception ``ex`` (one of ``st.exits``) ended no process, as the end of a note ("" when it may
    have): a thread other than the main one died; the launcher later reported its group finished, or was itself
    stopped from outside with no failure before; or the rank logged training steps after it (never after
    faulthandler's "Fatal Python error": ``--tee`` tails stdout and stderr apart, so a step printed before the
    crash can follow its block)."""
    line, kind, message = ex["line"], ex["kind"], ex["message"]
    if ex.pop("thread", ""):
        msg = " ".join(message.split())[:160]
        return f": a thread died with {kind}: {msg} ({ex['source']}); its process lived on"
    if f.lived_on(line):
        then = "the worker group finished" if line < f.finished_ok else "no failure before it was stopped from outside"
        why = f"its launcher then reported {then}"
    elif line < st.last_step_at and kind != "Fatal Python error":  # (a fatal error ends its process: a step
        why = "it logged training steps after it"  # line after it was printed before it, tailed from stdout later)
    else:
        return ""
    return f" logged {kind} at {ex['source']} and lived on ({why}): not a failure"


def repeated(st: Stream, ex: dict[str, Any]) -> bool:
    """Whether the stream printed the error ``ex`` more than once: a process ends once, so one that repeats an
    error handles it and goes on, unless it logged it before raising it (``logger.exception(...); raise``)."""
    return sum(1 for e in st.exits if e["kind"] == ex["kind"] and e["message"] == ex["message"]) > 1


def _under(rel: str, folders: set[str]) -> bool:
    return any(rel.startswith(d + "/") for d in folders)


def _earlier_runs(reads: Sequence[FileRead], mtimes: Mapping[str, float]) -> set[str]:
    """The run folders (``<parent>/<run_id>``) of a ``--log-dir`` root reused by several launches that ended
    before the last one began: each launch writes a new ``<run_id>/attempt_<k>/`` beside the old ones. The
    spans of time each run logged (its stamped lines: one clock, the node's; else its files' modification
    times, a minute apart at least) must not overlap: the nodes of one launch sharing a --log-dir run at once,
    and a copy that reset every file time ties; both are left alone."""
    spans: dict[str, dict[str, list[float]]] = defaultdict(dict)  # parent -> run -> [first, last] stamped
    by_mtime: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for f in reads:
        m = _ATTEMPT_DIR.match(f.rel)
        if m is None:
            continue
        parent, run = m.group(1).rpartition("/")[0], m.group(1)
        times = [
            t
            for st in f.streams.values()
            for s in (st.first_stamp, st.last_stamp)
            if (t := to_epoch(s, 2000)) is not None
        ]
        _widen(spans[parent], run, times)
        _widen(by_mtime[parent], run, [mtimes[f.rel]] if f.rel in mtimes else [])
    stale: set[str] = set()
    for parent, runs in spans.items():
        timed = runs if len(runs) > 1 and all(runs.values()) else by_mtime[parent]
        gap = 0.0 if timed is runs else 60.0
        if len(timed) < 2 or len(timed) != len(runs) or not all(timed.values()):
            continue
        last = max(timed, key=lambda r: timed[r][1])
        if all(timed[r][1] + gap < timed[last][0] for r in timed if r != last):
            stale |= {r for r in timed if r != last}
    return stale


def _widen(spans: dict[str, list[float]], run: str, times: Sequence[float]) -> None:
    span = spans.setdefault(run, [])
    if times:
        span[:] = [min([*span[:1], *times]), max([*span[1:], *times])]


def year_of(files: list[FileRead], fallback: int) -> int:
    """The year of the logs: the most common full date in them, else ``fallback``."""
    years: dict[int, int] = defaultdict(int)
    for f in files:
        for y in f.years:
            years[y] += 1
    return max(years, key=lambda y: years[y]) if years else fallback


def file_mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def unused_note(reads: Sequence[FileRead], used: set[str]) -> list[str]:
    """The note listing log files that held nothing tied to a rank and nothing of a launcher (no failure summary,
    stop or finish line): read, and not used."""
    told = used | {f.rel for f in reads if f.summary or f.stop_stamps or f.stopped_at or f.finished_ok or f.failures}
    unused = sorted({f.rel for f in reads} - told)
    if not unused:
        return []
    shown = ", ".join(unused[:3]) + (", ..." if len(unused) > 3 else "")
    return [
        f"{len(unused)} log file(s) read ({shown}) held nothing tied to a rank: no torchrun [rank<N>]:/"
        "[default<N>]: tag, <host>/<run_id>/attempt_<k>/<local_rank>/ folder, [Rank <N>] or launcher lines "
        "(see the README's inputs for the log layouts read); not used"
    ]
