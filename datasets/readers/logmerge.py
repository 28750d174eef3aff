"""Logs and TorchElastic error files of one job, merged: global ranks, machines, times, exits, stacks.

:func:`read_logs` reads every log (:mod:`.logs`) and error file (:mod:`.torchelastic`), then resolves
identities across files: a ``[rank<N>]:`` tag is the global rank; a local rank (``[default<L>]:``, a
``--log-dir`` ``<local_rank>/`` folder, an error file's folder) on a host is mapped through the lines that
carry both tags and the launcher's summary (``rank : 5 (local_rank: 1)``), else ``host index * G + L``
over the sorted host names (with a note). Times: glog stamps carry no year (the logs' full dates supply
it) and, like the launcher's summary, no time zone; when an error file's epoch time and a summary time
describe the same failure, their difference corrects the zone of every naive time.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rankscope.datasets.domain.bounds import FOREIGN
from rankscope.datasets.domain.exits import ProcessExit
from rankscope.datasets.domain.logs import GlooRecord, LauncherFailure, LogEvidence, StepRecord, WatchdogRecord
from rankscope.datasets.domain.stacks import ProcessDump
from rankscope.datasets.readers.faulthandler import parse_traceback_text
from rankscope.datasets.readers.identity import natural, path_facts
from rankscope.datasets.readers.loghosts import (
    failed_pid,
    file_mtime,
    is_machine_name,
    latest_attempts,
    launcher_key,
    lived_on,
    machine_names,
    repeated,
    unused_note,
    year_of,
    zone_offset,
)
from rankscope.datasets.readers.logs import _LAUNCHER_EXC, FileRead, Stream, read_log_files, to_epoch
from rankscope.datasets.readers.torchelastic import SIGNALS, ElasticError, read_error_file, split_exception
from rankscope.spine import InputError


@dataclass
class LogRead:
    """What the logs of one job gave: evidence for the log analysis, exits, stacks and machine names."""

    evidence: LogEvidence
    exits: list[ProcessExit] = field(default_factory=list)
    stacks: list[tuple[int, str, ProcessDump]] = field(default_factory=list)  # (rank, node, dump): one snapshot
    names: dict[int, tuple[str, str]] = field(default_factory=dict)  # rank -> (node, provenance)
    notes: list[str] = field(default_factory=list)
    assumed_ranks: list[int] = field(default_factory=list)  # global ranks mapped by host order


class _Ranks:
    """Local-to-global rank maps learnt from every file, and the host-order fallback."""

    def __init__(self, reads: Sequence[FileRead], gpus_per_node: int | None) -> None:
        self.map: dict[tuple[str, int], int] = {}
        self.hosts: set[str] = set()
        self.g = gpus_per_node
        self.assumed: set[tuple[str, int]] = set()
        self.alias: dict[str, str] = {}
        for f in reads:
            host = self.host_of(f)
            if host is None:
                continue
            # a machine's slot in the host order: a file that shows its workers, its launcher's summary or its
            # --log-dir tree; a batch log, or a text file a log word sent here (README.txt), holds none
            if f.workers or f.summary or f.path_local is not None:
                self.hosts.add(host)
            for local, rank in f.pairs.items():
                self.map.setdefault((host, local), rank)
            for e in f.summary:  # one launcher's summary: its own host's workers
                if e.local_rank is not None:
                    self.map.setdefault((host, e.local_rank), e.rank)
            if f.path_local is not None:  # a --log-dir file: its [rank<N>] lines name its global rank
                tagged = {st.rank for st in f.streams.values() if st.rank is not None}
                if len(tagged) == 1:
                    self.map.setdefault((host, f.path_local), tagged.pop())
        self._one_launcher()
        self._same_launcher()

    def _same_launcher(self) -> None:
        """A console that names no machine and a named host's files that tag one global rank with the same local
        rank are one launcher's (a global rank runs on one machine): the console is that host's, not another
        machine's slot in the host order (``launcher.log`` beside its ``--log-dir`` tree under ``trn-a01/``)."""
        pairs: defaultdict[str, dict[int, int]] = defaultdict(dict)
        for (h, local), rank in self.map.items():
            pairs[h][local] = rank
        named = [h for h in self.hosts if not h.startswith(UNNAMED)]
        for u in [h for h in self.hosts if h.startswith(UNNAMED) and pairs.get(h)]:
            same = [
                h
                for h in named
                if set(pairs[u].items()) & set(pairs[h].items())
                and all(pairs[h].get(k, r) == r for k, r in pairs[u].items())
            ]
            if len(same) == 1:
                self.alias[u] = same[0]
                self.hosts.discard(u)
                for k, r in pairs[u].items():
                    self.map.setdefault((same[0], k), r)
                self.map = {key: r for key, r in self.map.items() if key[0] != u}

    def _one_launcher(self) -> None:
        """Logs that name no machine at all (a console and a ``--log-dir`` tree of one torchrun, say) are one
        launcher's when what they say of their ranks agrees (no local rank tagged with two global ranks) and
        their local ranks fit ``--gpus-per-node``: then an untagged file's local rank is that launcher's, not a
        rank of another machine."""
        unnamed = {h for h in self.hosts if h.startswith(UNNAMED)}
        if len(unnamed) < 2 or unnamed != self.hosts:
            return
        seen: dict[int, int] = {}
        for (_h, local), rank in self.map.items():
            if seen.setdefault(local, rank) != rank:
                return
        if self.g is not None and seen and max(seen) >= self.g:
            return
        self.alias = dict.fromkeys(unnamed, "logs:one-launcher")
        self.map = {(self.alias[h], local): rank for (h, local), rank in self.map.items()}
        self.hosts = {"logs:one-launcher"}

    def host_of(self, f: FileRead) -> str | None:
        """The machine a file's processes ran on; ``file:<path>`` when nothing names it (one launcher's
        file still maps its own local ranks)."""
        if f.host:
            return f.host
        hosts = {e.host for e in f.summary if is_machine_name(e.host)}
        if len(hosts) == 1:
            return hosts.pop()
        key = launcher_key(f.rel) or f"file:{f.rel}"
        return self.alias.get(key, key)

    def key(self, host: str | None) -> str | None:
        """``host`` as the maps know it (unnamed launchers merged into one)."""
        return self.alias.get(host, host) if host is not None else None

    def of_error_file(self, facts: Any) -> int | None:
        """The global rank of a TorchElastic error file from its path facts (its rank, else host + local rank)."""
        if facts.rank is not None:
            return int(facts.rank)
        return self.map.get((self.key(facts.host) or "", facts.local_rank)) if facts.host else None

    def global_rank(self, host: str | None, local: int) -> int | None:
        if host is None:
            return None
        if (host, local) in self.map:
            return self.map[(host, local)]
        self.assumed.add((host, local))
        return None

    def assume(self) -> str | None:
        """Map the local ranks nothing named by host order; returns the note saying so."""
        if not self.assumed:
            return None
        g = self.g or max(loc for _, loc in self.assumed | set(self.map)) + 1
        hosts = sorted(self.hosts | {h for h, _ in self.assumed}, key=natural)
        idx = {h: i for i, h in enumerate(hosts)}
        for host, local in sorted(self.assumed):
            self.map[(host, local)] = idx[host] * g + local
        return (
            f"logs: global ranks of {len(self.assumed)} process(es) assumed from sorted host names (rank = host "
            f"index x {g} + local rank); a [rank<N>] tag, the launcher's failure summary or a manifest makes it exact"
        )


UNNAMED = ("file:", "logdir:", "logs:")  # launcher keys that name no machine


def _stream_rank(f: FileRead, key: tuple[str, int] | None, st: Stream, ranks: _Ranks) -> int | None:
    host = ranks.host_of(f)
    if st.rank is not None:
        return st.rank
    if key is not None and key[0] == "L":
        return ranks.global_rank(host, key[1])
    if f.path_local is not None:  # a --log-dir file holds one process
        return ranks.global_rank(host, f.path_local)
    if f.path_rank is not None:
        return f.path_rank
    return None  # the launcher's own lines


def _with_launcher(facts: Any, rel: str) -> Any:
    """An error file's path facts, its host the launcher's ``--log-dir`` tree when no host folder names one."""
    return facts if facts.host else replace(facts, host=launcher_key(rel))


def read_logs(
    files: Sequence[tuple[str, str]],
    elastic: Sequence[tuple[str, str]],
    *,
    gpus_per_node: int | None,
    attempt_files: Sequence[str] = (),
) -> LogRead:
    """Every log and TorchElastic error file of the input, merged (``attempt_files``: every file under an
    ``attempt_<k>/`` folder, read or not: an empty log of a later attempt still says the job restarted)."""
    notes: list[str] = []
    reads: list[FileRead] = []
    for path, rel in files:
        try:
            reads += read_log_files(path, rel)
        except OSError as exc:
            notes.append(f"log {rel} unreadable ({exc.strerror})")
        except InputError as exc:  # not a regular file, over the size limit
            notes.append(f"log {rel} not read ({exc})")
        except FOREIGN as exc:  # a line the parser did not expect: the file is skipped, the others kept
            notes.append(f"log {rel} unreadable ({type(exc).__name__}: {str(exc)[:80]})")
    machine_names(reads, notes)
    errors = [(rel, e) for path, rel in elastic if (e := read_error_file(path, rel)) is not None]
    mtimes = {rel: t for path, rel in files if (t := file_mtime(path)) is not None}
    reads, errors = latest_attempts(reads, errors, notes, attempt_files, mtimes)
    fallback = next((time.gmtime(e.time).tm_year for _, e in errors if e.time), time.gmtime().tm_year)
    year = year_of(reads, fallback)
    ranks = _Ranks(reads, gpus_per_node)
    for rel, _e in errors:
        facts = path_facts(rel)
        host = facts.host or launcher_key(rel)
        if host:
            ranks.hosts.add(host)
    # first pass: which global rank each stream and error file is (local ranks may need host order)
    plan: list[tuple[FileRead, tuple[str, int] | None, Stream]] = [
        (f, k, st) for f in reads for k, st in f.streams.items()
    ]
    for f, k, st in plan:
        _stream_rank(f, k, st, ranks)
    err_local = [(rel, e, _with_launcher(path_facts(rel), rel)) for rel, e in errors]
    for _rel, _e, facts in err_local:
        if facts.rank is None and facts.local_rank is not None:
            ranks.global_rank(ranks.key(facts.host), facts.local_rank)
    note = ranks.assume()
    if note:
        notes.append(note)
    written = max((t for p, _ in (*files, *elastic) if (t := file_mtime(p)) is not None), default=None)
    out = _build(reads, plan, err_local, ranks, year, notes, written)
    out.assumed_ranks = sorted(ranks.map[k] for k in ranks.assumed)
    return out


def _build(
    reads: list[FileRead],
    plan: list[tuple[FileRead, tuple[str, int] | None, Stream]],
    err_local: list[tuple[str, ElasticError, Any]],
    ranks: _Ranks,
    year: int,
    notes: list[str],
    written: float | None = None,
) -> LogRead:
    out = LogRead(LogEvidence(), notes=notes)
    seen: dict[int, str] = {}
    last: dict[int, float] = {}
    wd: list[WatchdogRecord] = []
    gloo: list[GlooRecord] = []
    steps: list[StepRecord] = []
    found_exits: dict[int, dict[str, Any]] = {}
    lived: set[tuple[int, str, str]] = set()  # (rank, kind, message) of exceptions a process lived through
    twice: dict[int, tuple[dict[str, Any], str]] = {}  # an error a rank printed twice: handled, or logged and raised
    blocks: dict[int, list[ProcessDump]] = defaultdict(list)
    launcher: list[LauncherFailure] = [e for f in reads for e in f.summary]
    offset = zone_offset(launcher, err_local, ranks)
    used: set[str] = set()  # files that told something of a rank
    for f, key, st in plan:
        rank = _stream_rank(f, key, st, ranks)
        key_host = ranks.host_of(f) or ""
        host = "" if key_host.startswith(UNNAMED) else key_host  # a machine name, or none
        if rank is None:
            continue
        used.add(f.rel)
        seen.setdefault(rank, host)
        if host:
            out.names.setdefault(rank, (host, f.host_source if f.host else "log"))
        if st.last_stamp is not None:
            t = to_epoch(st.last_stamp, year)
            if t is not None:
                last[rank] = max(last.get(rank, t), t + offset)
        for rec in st.records:
            t = to_epoch(rec.pop("stamp", None), year)
            t = t + offset if t is not None else None
            kind = rec.pop("type")
            if kind == "watchdog":
                wd.append(WatchdogRecord(rank=rank, node=host, time=t, **rec))
            elif kind == "gloo":
                gloo.append(GlooRecord(rank=rank, node=host, time=t, **rec))
            else:
                steps.append(StepRecord(rank=rank, node=host, time=t, **rec))
        for ex in st.exits:
            if ex["kind"] in _LAUNCHER_EXC:
                continue
            why = lived_on(f, st, ex)
            t = to_epoch(ex["stamp"], year)
            when = t + offset if t is not None else None
            rec = {**ex, "time": when, "node": host, "pid": failed_pid(f, st, rank, ex["line"])}
            if why:
                notes.append(f"rank {rank}{why}")
                lived.add((rank, ex["kind"], ex["message"]))
            elif repeated(st, ex):  # handled, unless other ranks failed too (then: logged, then raised)
                handled = "it printed the same error again later: a handled error"
                twice.setdefault(
                    rank, (rec, f"rank {rank} logged {ex['kind']} at {ex['source']} and lived on ({handled})")
                )
            else:
                found_exits.setdefault(rank, rec)
        for text in st.stacks:
            blocks[rank].extend(d for d in parse_traceback_text(text, f.rel) if d.status in ("ok", "partial"))
    for r in [r for r, ex in found_exits.items() if (r, ex["kind"], ex["message"]) in lived]:  # a copy lived on
        del found_exits[r]
    for r, (rec, note) in twice.items():
        if found_exits.keys() - {r} or any(e.rank != r for e in launcher):
            found_exits.setdefault(r, rec)  # the job died: an error logged and raised again is this rank's exit
        else:
            notes.append(note)
    _exits(out, found_exits, launcher, err_local, ranks, wd, offset, gloo, written)
    for e in launcher:
        if is_machine_name(e.host):
            out.names.setdefault(e.rank, (e.host, "log"))
        seen.setdefault(e.rank, e.host if is_machine_name(e.host) else "")
    _stacks(out, blocks, seen)
    notes += unused_note(reads, used)
    out.evidence = LogEvidence(
        tuple(wd),
        tuple(gloo),
        tuple(sorted(steps, key=lambda s: (s.time or 0.0, s.step))),
        tuple(launcher),
        seen,
        last,
        tuple(f.rel for f in reads) + tuple(rel for rel, _, _ in err_local),
        tuple(sorted({r for r, _, _ in out.stacks})),
        tuple(notes),
        offset,
        tuple(sorted(t + offset for f in reads for st in f.stop_stamps if (t := to_epoch(st, year)) is not None)),
    )
    return out


def _exits(
    out: LogRead,
    found: dict[int, dict[str, Any]],
    launcher: list[LauncherFailure],
    err_local: list[tuple[str, ElasticError, Any]],
    ranks: _Ranks,
    wd: list[WatchdogRecord],
    offset: float,
    gloo: Sequence[GlooRecord] = (),
    written: float | None = None,
) -> None:
    """One exit per rank: the exception (its traceback, else its error file, else the launcher's line), timed
    by its error file, else the launcher's summary, else the log line's stamp. An exit known only from the
    launcher's summary (an exit code, a signal, "To enable traceback see ...") carries the rank's own gloo
    transport error when it logged one (it timed out waiting for a peer, or a peer closed the connection): a
    process that caught that error and exited is a victim of the cascade, not its cause."""
    summary: dict[int, LauncherFailure] = {}
    for e in launcher:
        cur = summary.get(e.rank)
        if cur is None or (e.time or 0) < (cur.time or 0):
            summary[e.rank] = e
    files: dict[int, ElasticError] = {}
    orphans = []
    for rel, one, facts in err_local:
        r = ranks.of_error_file(facts)
        if r is None:
            orphans.append(rel)
        else:
            files.setdefault(r, one)
            if facts.host and not facts.host.startswith(UNNAMED):
                out.names.setdefault(r, (facts.host, "host-folder"))
    if orphans:
        out.notes.append(
            f"{len(orphans)} TorchElastic error file(s) with no rank (an error file says no rank; its path must: "
            f"<host>/<run_id>/attempt_<k>/<local_rank>/error.json) not used: {', '.join(orphans[:3])}"
        )
    timed_out = {w.rank: w for w in wd if w.kind == "timeout" and w.rank is not None}
    untimed: list[ProcessExit] = []
    gloo_error: dict[int, GlooRecord] = {}
    for rec in gloo:
        if rec.rank is not None:
            gloo_error.setdefault(rec.rank, rec)
    for rank in sorted(set(found) | set(summary) | set(files)):
        ex, s, err = found.get(rank), summary.get(rank), files.get(rank)
        kind = message = where = ""
        source = ""
        if ex is not None:
            kind, message, where, source = ex["kind"], ex["message"], ex["where"], ex["source"]
        elif err is not None:
            kind, message, where, source = err.kind, err.message, err.where, err.source
        elif s is not None:
            exc = split_exception(s.error) if s.error else None
            if exc is not None:
                kind, message = exc
            else:
                code = -(s.exitcode or 0)
                kind = SIGNALS.get(code, f"exit code {s.exitcode}")
                message = s.error or f"exit code {s.exitcode}"
            source = s.source
        if not kind:
            continue
        ge = gloo_error.get(rank) if ex is None and err is None else None
        if ge is not None:
            message += (
                f"; its log: gloo timed out waiting {ge.timeout_ms or '?'}ms for a {ge.op or 'transport'} operation"
                if ge.kind == "timeout"
                else "; its log: gloo connection closed by peer"
            )
        w = timed_out.get(rank)
        if w is not None and "watchdog" not in message.lower():
            message += "; the NCCL watchdog took the process down: Watchdog caught collective operation timeout"
            message += f" (SeqNum={w.seq})"
        when, how = None, "log"
        if err is not None and err.time is not None:
            when, how = err.time, "error-file"
        elif s is not None and s.time is not None:
            when, how = s.time + offset, "launcher"
        elif ex is not None and ex["time"] is not None:
            when = ex["time"]
        node = (s.host if s is not None and is_machine_name(s.host) else None) or (ex or {}).get("node") or ""
        node = node or out.names.get(rank, ("",))[0]
        pid = s.pid if s else (ex or {}).get("pid")
        x = ProcessExit(rank, when or 0.0, kind, message, where, node, pid, "trainer", how, source)
        (out.exits if when is not None else untimed).append(x)
    if untimed and not out.exits and written is not None:
        # no failure carries a time (a --log-dir tree without error files or stamps): their order is unknown,
        # yet which of them only report a lost peer is not; all are put at the logs' newest modification time
        out.exits += [replace(x, time=written, time_source="unordered") for x in untimed]
        out.notes.append(
            f"{len(untimed)} failure(s) in the logs carry no time: taken as simultaneous (their order is unknown)"
        )
    elif untimed and out.exits:
        # a failure with no time beside timed ones (a faulthandler dump in an unstamped stderr.log): put at the
        # incident's first failure, marked; the crash analysis uses it only when every timed failure is a cascade
        t0 = min(x.time for x in out.exits)
        out.exits += [replace(x, time=t0, time_source="untimed") for x in untimed]
        out.notes += [
            f"rank {x.rank}: {x.kind} in {x.source} has no time: not ordered with the other failures" for x in untimed
        ]


def _stacks(out: LogRead, blocks: dict[int, list[ProcessDump]], seen: dict[int, str]) -> None:
    """The faulthandler blocks of the logs as one snapshot, when every rank the logs show has one (a
    snapshot of a few ranks would make every other rank look missing)."""
    if not blocks:
        return
    have = [r for r in seen if blocks.get(r)]
    if len(have) < len(seen):
        out.notes.append(
            f"logs: faulthandler stacks of {len(have)} of {len(seen)} ranks ({', '.join(map(str, sorted(have)[:8]))}) "
            "not used as a stack snapshot: a snapshot needs every rank's stack"
        )
        return
    for r in sorted(have):
        out.stacks.append((r, seen[r], blocks[r][-1]))
