"""Training and launcher logs, read as evidence (streaming, line-prefix aware).

Accepted: torchrun consoles (``--tee 3``: every worker line prefixed ``[default<LOCAL>]:``, an exception's
traceback lines also ``[rank<GLOBAL>]:``; without ``--tee`` only the ``[rank<N>]:`` lines), per-process
files of a ``--log-dir`` tree (``<run_id>/attempt_<k>/<local_rank>/{stdout,stderr}.log``) and plain
training logs. Lines of different processes interleave, so each line is routed by its prefix to its
process's stream before blocks are parsed. Per stream:

- faulthandler blocks (``Thread 0x... (most recent call first):`` ...) become stacks;
- Python tracebacks become exits (type, message, innermost frame), and so do uncaught C++ exceptions
  (``terminate called after throwing an instance of 'gloo::EnforceNotMet'`` + ``what(): ...``); the
  launcher's own tracebacks (``ChildFailedError``, ``SignalException``) do not;
- ProcessGroupNCCL watchdog and heartbeat-monitor lines (:class:`~rankscope.datasets.domain.logs.WatchdogRecord`),
  gloo transport errors, Megatron ``iteration N/M`` lines, with the time of their glog / timestamp prefix;
- the launcher's ``ChildFailedError`` summary (times, hosts, local-to-global ranks), as context.

Ranks: ``[rank<N>]:`` is the global rank; ``[<role><L>]:`` a local rank on the file's host, mapped to the
global rank by the lines that carry both, by the launcher's summary, else by host order (with a note).
"""

from __future__ import annotations

import calendar
import io
import re
import time
from dataclasses import dataclass, field
from typing import Any

from rankscope.datasets.domain.bounds import open_regular
from rankscope.datasets.readers.identity import host_from_log_name, path_facts
from rankscope.datasets.readers.logprefix import TaskHosts, demux, line_of, name_tasks, prefix_kind
from rankscope.datasets.readers.logsteps import step_record
from rankscope.datasets.readers.sniff import C10_LOG, GLOG, RAY, STAMP, worker_tag
from rankscope.datasets.readers.torchelastic import SummaryParser, split_exception

_PG = re.compile(
    r"\[(?:PG ID (?P<pgid>\d+) PG GUID (?P<guid>[^\s(\]]+)(?:\((?P<desc>[^)]*)\))?|PG (?P<pgid2>\d+)"
    r"(?: \((?P<desc2>[^)]*)\))?) Rank (?P<pgrank>\d+)\]"
)
_RANK_TAG = re.compile(r"\[Rank (\d+)\]")
_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
    r"(?:, [^)]*?Timeout\(ms\)=(?P<to>\d+))?[^)]*\) ran for (?P<ran>\d+) milliseconds"
)
_FAILURE = re.compile(
    r"failure detected by watchdog at work sequence id: (?P<seq>\d+) PG status: last enqueued work: (?P<e>-?\d+), "
    r"last completed work: (?P<c>-?\d+)"
)
_FAILURE_OLD = re.compile(
    r"(?:Exception(?: \(either an error or timeout\))? detected by watchdog at work|Timeout at NCCL work): "
    r"(?P<seq>\d+), last enqueued NCCL work: (?P<e>-?\d+), last completed NCCL work: (?P<c>-?\d+)"
)
_DUMP = re.compile(
    r"Received a dump signal .*?Last enqueued NCCL work: (?P<e>-?\d+), last completed NCCL work: (?P<c>-?\d+)"
)
_PERIODIC = re.compile(
    r"NCCL Work update periodically: last enqueued NCCL work: (?P<e>-?\d+), last completed NCCL work: (?P<c>-?\d+)"
)
_NCCL_HOST = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9._-]{0,252}):\d+:\d+ \[\d+\] NCCL (?:INFO|WARN|TRACE) ")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (?P<ms>\d+)ms for (?P<op>\w+) operation to complete")
_GLOO_CLOSED = re.compile(r"(?:Connection closed by peer|Connection reset by peer) \[(?P<addr>[^\]]+)\]:(?P<port>\d+)")
_FH_HEAD = re.compile(r"^(?:Current thread|Thread) 0[xX][0-9a-fA-F]+(?: \[.*?\])? \(most recent call first\):")
_FATAL = re.compile(r"^Fatal Python error: (.*)$")
_TB_HEAD = re.compile(r"^(?:Traceback|Stack) \(most recent call last\):")
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
_TERMINATE = re.compile(r"^terminate called after throwing an instance of '([^']{1,200})'")
_WHAT = re.compile(r"^\s+what\(\):\s+(.*)$")
_LAUNCHER_EXC = frozenset({"ChildFailedError", "SignalException"})
_GROUP_OK = "worker group successfully finished"  # torch.distributed.elastic's agent: every worker exited 0
_GROUP_FAILED = ("Worker group FAILED", "will restart worker group", "ChildFailedError", "failed (exitcode")
_STOPPED = re.compile(r"SignalException: Process \d+ got signal|Received (?:Signals\.SIG\w+|\d+) death signal")
_FAILED_PID = re.compile(r"failed \(exitcode: -?\d+\) local_rank: (\d+) \(pid: (\d+)\)")

Stamp = tuple[int, int, float] | tuple[int, int, int, float]  # (month, day, secs) or (year, month, day, secs)


def _hms(text: str) -> float:
    h, m, s = text.replace(",", ".").split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


@dataclass
class Stream:
    """One process's lines in one file: its tags, its blocks in progress, what it said."""

    rank: int | None = None  # global, from a [rank<N>]: tag
    local: int | None = None  # from a [<role><L>]: tag
    mode: str = ""  # "" | "fh" | "tb"
    block: list[str] = field(default_factory=list)
    chain: bool = False
    stacks: list[str] = field(default_factory=list)  # faulthandler block texts
    exits: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)  # watchdog / gloo / step records
    last_stamp: Stamp | None = None
    first_stamp: Stamp | None = None
    lines: int = 0
    cxx: str = ""  # the type of a C++ exception that ended the process, until its ``what():`` line
    ignored: str = ""  # "Exception ignored ..." / "Exception in thread NAME:": the traceback ends no process
    at: int = 0  # the line number being fed
    last_step_at: int = 0  # the line of its last training-step record: an exception before it ended nothing
    nccl_hosts: set[str] = field(default_factory=set)  # gethostname() in NCCL's own debug lines


@dataclass
class FileRead:
    """One log file, parsed; identities are resolved across files by :mod:`.logmerge`."""

    rel: str
    host: str | None  # from the path (host folder, per-host file name)
    host_source: str
    path_local: int | None  # torchrun --log-dir <local_rank> folder
    path_rank: int | None
    streams: dict[tuple[str, int] | None, Stream] = field(default_factory=dict)
    summary: list[Any] = field(default_factory=list)
    pairs: dict[int, int] = field(default_factory=dict)  # local -> global seen on one line
    years: list[int] = field(default_factory=list)
    host_from: str = ""  # "folder" | "file" (its name) | "" (nothing in the path names the machine)
    name_host: str | None = None  # a machine name in the file's name (``dgx-h100-0743.log``)
    finished_ok: int = 0  # the line of the launcher's last "worker group successfully finished" (0: none)
    restarted_at: int = 0  # the line of the launcher's last "will restart worker group" (0: none)
    failed_pids: list[tuple[int, int, int]] = field(default_factory=list)  # (line, local rank, pid): "failed (exitcode"
    failures: list[int] = field(default_factory=list)  # the lines of the launcher's failures and restarts
    stopped_at: int = 0  # the line where the launcher itself got a signal (the job stopped from outside; 0: none)
    stop_stamps: list[Stamp] = field(default_factory=list)  # the stamps of the launcher's stop and failure lines
    task_hosts: dict[str, str] = field(default_factory=dict)  # srun --label: "task N" -> the machine it named

    def drop_before(self, line: int) -> None:
        """Forget what the workers said before ``line`` (an attempt a restart replaced)."""
        for st in self.streams.values():
            st.exits = [e for e in st.exits if e["line"] > line]
            st.records = [r for r in st.records if line_of(r) > line]
            st.stacks = [] if st.stacks and st.at <= line else st.stacks
        self.summary = [e for e in self.summary if line_of({"source": e.source}) > line]

    @property
    def nccl_host(self) -> str | None:
        """The one machine NCCL's debug lines in this file name (``<host>:<pid>:<tid> [<dev>] NCCL INFO``: NCCL
        prints ``gethostname()``), or None when they name none or several."""
        hosts = {h for st in self.streams.values() for h in st.nccl_hosts}
        return hosts.pop() if len(hosts) == 1 else None

    @property
    def workers(self) -> int:
        """Worker processes whose lines carry a ``[<role><L>]:`` or ``[rank<N>]:`` tag (a per-host console: several)."""
        return sum(1 for k in self.streams if k is not None)

    @property
    def failed_before_ok(self) -> int:
        """The line of the launcher's last failure or restart (0: none)."""
        return self.failures[-1] if self.failures else 0

    def lived_on(self, line: int) -> bool:
        """Whether an exception logged at ``line`` ended no process: this file's launcher then reported its group
        finished, or was stopped by a signal (``scancel``) after training steps it logged later, no failure between."""
        if self.failed_before_ok < line < self.finished_ok:
            return True
        stepped = max((st.last_step_at for st in self.streams.values()), default=0) > line
        return stepped and line < self.stopped_at and not any(line < f < self.stopped_at for f in self.failures)


def _parse_stamp(m: re.Match[str]) -> Stamp | None:
    g = m.groupdict()
    try:
        if g.get("date"):
            y, mo, d = (int(x) for x in g["date"].split("-"))
            return (y, mo, d, _hms(g["hms"]))
        if g.get("md") and g.get("hms"):  # MMDD, or MDD: c10 leaves the month unpadded ("E321" is March 21)
            month, day = int(g["md"][:-2]), int(g["md"][-2:])
            return (month, day, _hms(g["hms"])) if 1 <= month <= 12 and 1 <= day <= 31 else None
    except ValueError:
        return None
    return None


def _split(line: str) -> tuple[str, int | None, int | None, Stamp | None]:
    """The line's text without prefixes, its [rank<N>] tag, its [<role><L>] tag and its time stamp."""
    rank = local = None
    stamp: Stamp | None = None
    text = line
    for _ in range(5):
        tag = worker_tag(text)
        if tag:
            kind, n, end = tag
            if kind == "rank":
                rank = n
                end += text[end : end + 1] == " "  # torch prints "[rank5]: " before a worker's traceback
            else:
                local = n
            text = text[end:]
            continue
        m = GLOG.match(text) or C10_LOG.match(text) or STAMP.match(text)
        if m:
            stamp = _parse_stamp(m) or stamp
            text = text[m.end() :]
            continue
        m = RAY.match(text) or _TAG_BEFORE_STAMP.match(text) or (_CRI_STREAM.match(text) if stamp else None)
        if m:
            text = text[m.end() :]
            continue
        break
    return text, rank, local, stamp


_TAG_BEFORE_STAMP = re.compile(r"^\[[A-Za-z][\w.-]{0,30}\] (?=\d{4}-\d\d-\d\d[ T_]\d\d:)")
"""A logger's tag in front of its time stamp (torchtitan's ``[titan] 2026-12-03 06:12:12,582 - root - INFO - ...``)."""


_CRI_STREAM = re.compile(r"^(?:stdout|stderr) [FP] ")
"""The stream and tag the container runtime puts after its time stamp in the node's pod log files
(``/var/log/pods/<ns>_<pod>_<uid>/<container>/0.log``: ``2026-12-01T09:00:00.38Z stderr F <the line>``)."""


MAX_LOG_LINE = 1 << 16
"""Log lines are matched on their first 64 KiB: every record the patterns look for is far shorter."""


def read_log_file(path: str, rel: str) -> FileRead:
    """Parse one log file into per-process streams (identities still local to the file)."""
    return read_log_files(path, rel)[0]


def read_log_files(path: str, rel: str) -> list[FileRead]:
    """One log file's streams; a console of several machines' or tasks' lines (pdsh's ``worker-3: [rank29]: ...``,
    ``kubectl logs --prefix``'s ``[pod/<pod>/<container>] ...``, ``srun --label``'s ``3: ...``) is one read per
    prefix, named by it (a pod or host; a Slurm task is no machine)."""
    with open_regular(path) as raw_fh:
        kind = prefix_kind(raw_fh.read(1 << 16))  # the head (a regular file: read again from its start below)
        raw_fh.seek(0)
        reads = _read_streams(io.TextIOWrapper(raw_fh, encoding="utf-8", errors="replace"), rel, kind)
    out = []
    for f, summary in reads.values():
        for st in f.streams.values():
            _close_block(st)
        f.summary = summary.close()
        f.years += [time.gmtime(e.time).tm_year for e in f.summary if e.time is not None]
        out.append(f)
    return out if len(out) == 1 or out[0].streams else out[1:]


def _read_streams(fh: io.TextIOWrapper, rel: str, kind: str | None) -> dict[str | None, tuple[FileRead, SummaryParser]]:
    facts = path_facts(rel)
    # a console of several machines' lines: its own path names none of them
    path_host, name_host = (None, None) if kind else (facts.host, host_from_log_name(rel))
    fr = FileRead(
        rel, path_host or name_host, "host-folder", facts.local_rank if facts.log_dir_layout else None, facts.rank
    )
    fr.host_from, fr.name_host = ("folder" if path_host else "file" if name_host else ""), name_host
    reads: dict[str | None, tuple[FileRead, SummaryParser]] = {None: (fr, SummaryParser(rel))}
    tasks = TaskHosts()
    for lineno, key, host, line in demux(fh, kind, tasks, MAX_LOG_LINE):
        if key not in reads:
            one = FileRead(rel, host, "log", None, None)
            one.host_from = "task" if host is None else str(kind)
            reads[key] = (one, SummaryParser(rel))
        _line(*reads[key], line, lineno, rel)
    name_tasks({k: f for k, (f, _) in reads.items()}, tasks)
    return reads


def _line(fr: FileRead, summary: SummaryParser, line: str, lineno: int, rel: str) -> None:
    text, rank, local, stamp = _split(line)
    if rank is not None and local is not None:
        fr.pairs.setdefault(local, rank)
    key: tuple[str, int] | None = ("L", local) if local is not None else ("R", rank) if rank is not None else None
    st = fr.streams.get(key)
    if st is None:
        st = fr.streams[key] = Stream()
    st.rank = rank if rank is not None else st.rank
    st.local = local if local is not None else st.local
    st.lines += 1
    if stamp is not None:
        st.first_stamp = st.first_stamp or stamp
        st.last_stamp = stamp
        if len(stamp) == 4:
            fr.years.append(stamp[0])
    if key is None:
        if _GROUP_OK in text:
            fr.finished_ok = lineno
        elif _STOPPED.search(text):
            fr.stopped_at = fr.stopped_at or lineno
            fr.stop_stamps += [stamp] if stamp is not None else []
        elif any(f in text for f in _GROUP_FAILED):
            fr.failures.append(lineno)
            fr.stop_stamps += [stamp] if stamp is not None else []
            if m := _FAILED_PID.search(text):
                fr.failed_pids.append((lineno, int(m.group(1)), int(m.group(2))))
            if "will restart worker group" in text:
                fr.restarted_at = lineno
        if summary.feed(text, lineno):
            return
    if (
        key is not None
        and fr.failed_before_ok > fr.restarted_at
        and st.exits
        and st.exits[-1]["line"] < fr.failed_before_ok
    ):
        # a failed worker speaks again (its own stream; the unprefixed one mixes the launcher's and C++'s lines):
        # a restart; what came before, the launcher's summary of the failure included, is the replaced attempt's
        fr.restarted_at = lineno - 1
    st.at = lineno
    _feed(st, text, stamp, f"{rel}:{lineno}")


def _feed(st: Stream, text: str, stamp: Stamp | None, where: str) -> None:
    """One line of one stream: blocks (faulthandler, traceback) and one-line records."""
    if st.mode == "fh":
        if text.startswith("  File ") or not text.strip() or _FH_HEAD.match(text):
            st.block.append(text)
            return
        _close_block(st)
    elif st.mode == "tb":
        if text.startswith(" ") or not text.strip() or _TB_HEAD.match(text):
            st.block.append(text)
            return
        exc = split_exception(text)
        if exc is not None:
            if not st.ignored.startswith("Exception ignored"):  # a thread's end is kept, marked with its name
                _exit(st, exc[0], exc[1], st.block, stamp, where, st.ignored[len("Exception in thread ") :].strip(":"))
            st.mode, st.block, st.ignored = "", [], ""
            _records(st, text, stamp, where)
            return
        if text.startswith(_CHAIN):
            return
        st.mode, st.block = "", []
    if _FH_HEAD.match(text):
        st.mode, st.block = "fh", [text]
        return
    if st.cxx:  # std::terminate's report of an uncaught C++ exception (gloo's enforce, c10::Error): two lines
        kind, st.cxx = st.cxx, ""
        m = _WHAT.match(text)
        if m:
            _exit(st, kind, m.group(1), [], stamp, where)
            return
    m = _TERMINATE.match(text)
    if m:
        st.cxx = m.group(1)
        return
    m = _FATAL.match(text)
    if m:
        _exit(st, "Fatal Python error", m.group(1), [], stamp, where)
        return
    if _TB_HEAD.match(text):
        st.mode, st.block = "tb", [text]
        return
    # "Exception ignored in: <function X.__del__>" (a finalizer, an atexit callback) and "Exception in thread
    # NAME:" (threading's excepthook: a thread other than the main one died): CPython printed the traceback
    # that follows and the process went on; it is never the process's exit
    st.ignored = text if text.startswith(("Exception ignored ", "Exception in thread ")) else ""
    if st.ignored:
        return
    if text.startswith(_CHAIN):
        st.chain = True
        return
    _records(st, text, stamp, where)


def _exit(
    st: Stream, kind: str, message: str, block: list[str], stamp: Stamp | None, where: str, thread: str = ""
) -> None:
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', "\n".join(block))
    inner = f"{frames[-1][2]} ({frames[-1][0].rsplit('/', 1)[-1]}:{frames[-1][1]})" if frames else ""
    rec = {
        "kind": kind,
        "message": message,
        "where": inner,
        "stamp": stamp or st.last_stamp,
        "source": where,
        "line": st.at,
        "thread": thread,  # a thread other than the main one died: its process lived on
    }
    if st.chain and st.exits:
        st.exits[-1] = rec  # the last exception of a chain is the one that ended the process
    else:
        st.exits.append(rec)
    st.chain = False


def _close_block(st: Stream) -> None:
    if st.mode == "fh" and st.block:
        st.stacks.append("\n".join(st.block) + "\n")
    st.mode, st.block = "", []


def _records(st: Stream, text: str, stamp: Stamp | None, where: str) -> None:
    """Watchdog, gloo and step records on one line."""
    if "NCCL" in text or "Watchdog" in text or "watchdog" in text or "Heartbeat monitor" in text:
        m = _NCCL_HOST.match(text)
        if m and len(st.nccl_hosts) < 4:
            st.nccl_hosts.add(m.group("host"))
        _watchdog(st, text, stamp, where)
        return
    m = _GLOO_TIMEOUT.search(text)
    if m:
        rec = {"type": "gloo", "kind": "timeout", "op": m.group("op"), "timeout_ms": int(m.group("ms"))}
        st.records.append({**rec, "stamp": stamp, "source": where})
        return
    m = _GLOO_CLOSED.search(text)
    if m:
        rec = {"type": "gloo", "kind": "closed", "peer": f"{m.group('addr')}:{m.group('port')}"}
        st.records.append({**rec, "stamp": stamp, "source": where})
        return
    step = step_record(text)
    if step is not None:
        st.last_step_at = st.at
        st.records.append({**step, "stamp": stamp, "source": where})


def _watchdog(st: Stream, text: str, stamp: Stamp | None, where: str) -> None:
    rec: dict[str, Any] = {"type": "watchdog", "stamp": stamp, "source": where}
    pg = _PG.search(text)
    if pg:
        rec["pg_id"] = pg.group("pgid") or pg.group("pgid2")
        rec["pg_name"] = pg.group("guid")
        rec["pg_desc"] = pg.group("desc") or pg.group("desc2")
        rec["pg_rank"] = int(pg.group("pgrank"))
    else:
        r = _RANK_TAG.search(text)
        rec["pg_rank"] = int(r.group(1)) if r else None
    m = _TIMEOUT.search(text)
    if m:
        rec.update(kind="timeout", seq=int(m.group("seq")), op=m.group("op"), ran_for_ms=int(m.group("ran")))
        rec["timeout_ms"] = int(m.group("to")) if m.group("to") else None
    elif (m := _FAILURE.search(text) or _FAILURE_OLD.search(text)) is not None:
        rec.update(
            kind="failure", seq=int(m.group("seq")), last_enqueued=int(m.group("e")), last_completed=int(m.group("c"))
        )
    elif (m := _DUMP.search(text)) is not None:
        rec.update(kind="dump-signal", last_enqueued=int(m.group("e")), last_completed=int(m.group("c")))
    elif (m := _PERIODIC.search(text)) is not None:
        rec.update(kind="periodic", last_enqueued=int(m.group("e")), last_completed=int(m.group("c")))
    elif "Heartbeat monitor timed out" in text:  # its own watchdog thread stopped beating: this rank is stuck
        rec.update(kind="heartbeat")
    else:
        return
    st.records.append(rec)


def to_epoch(stamp: Stamp | None, year: int) -> float | None:
    """A stamp as epoch seconds (glog stamps carry no year: ``year`` supplies it; read as UTC)."""
    if stamp is None:
        return None
    if len(stamp) == 4:
        y, mo, d, secs = stamp
    else:
        (mo, d, secs), y = stamp, year
    try:
        return float(calendar.timegm((int(y), int(mo), int(d), 0, 0, 0, 0, 0, 0))) + float(secs)
    except (ValueError, OverflowError):
        return None
