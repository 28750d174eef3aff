"""``py-spy dump`` output inside a console that interleaves several machines' lines.

An operator on Slurm runs ``srun --label py-spy dump --pid ...`` (or ``pdsh``, or reads ``kubectl logs
--prefix``) and the dumps of every node land in one batch log, each line behind its stream's prefix
(``1: Process 15684: python train.py``), interleaved with the other nodes' lines and the job's own output.
Read as one file, the prefixes hide every ``Process`` header. This module splits such a console into its
streams (:mod:`.logprefix`: a Slurm task, a pod, a pdsh host) and reads the py-spy sections of each. A
stream's machine is what the console says of it (the pod, the pdsh host, or the host name a task printed or
srun named); a stream that names none stays unnamed (one machine per stream, numbered later with a note).
A process seen again in its stream (the same pid) starts the next capture round. The console is also read
as a log, as before.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import replace
from typing import NamedTuple

from rankscope.datasets.domain.bounds import MAX_LINE_CHARS, read_bounded
from rankscope.datasets.domain.stacks import ProcessDump
from rankscope.datasets.readers.base import occurrence_rounds
from rankscope.datasets.readers.identity import host_from_log_name
from rankscope.datasets.readers.logprefix import TaskHosts, demux, prefix_kind
from rankscope.datasets.readers.pyspy_text import parse_pyspy_text
from rankscope.datasets.readers.sniff import worker_tag
from rankscope.datasets.readers.stackid import Found
from rankscope.spine import InputError

_RFC3339 = r"\d{4}-\d\d-\d\dT[\d:.]{8,20}(?:Z|[+-]\d\d:?\d\d) "
"""The stamp ``kubectl logs --timestamps`` puts after its prefix."""
_HEADER = re.compile(rb"(?m)^ {0,6}\S{1,260}?[:\]] ?(?:" + _RFC3339.encode() + rb")?Process \d+: ")
"""A py-spy process header behind a console prefix (``1: Process``, ``[pod/p/c] Process``, ``host: Process``), and
behind a kubectl stamp."""
_STAMP = re.compile("^" + _RFC3339)


class StreamDump(NamedTuple):
    """The py-spy processes of one stream and capture round of a console."""

    label: str  # "slurm-123.out [task 1]", "... [task 1, round 2]": where they were found, for people
    stream: str  # the stream's key ("task 1", the pod): one machine
    node: str | None  # its machine, when the console names it
    snapshot: int | None  # the capture round within the stream (None: one round)
    processes: tuple[ProcessDump, ...]


def _torchrun_console(head: bytes) -> bool:
    """Most of a file's first lines carry torchrun's worker prefix (:func:`.sniff.worker_tag`)."""
    lines = [ln for ln in head.decode("utf-8", errors="replace").splitlines()[:400] if ln.strip()]
    return len(lines) >= 4 and sum(worker_tag(ln) is not None for ln in lines) >= 0.5 * len(lines)


def console_found(abs_path: str, rel: str, head: bytes) -> list[Found]:
    """The processes of the py-spy dumps inside the console at ``abs_path`` (``head``: its first bytes), each
    stream and round found as a file of its own (:attr:`.stackid.Found.hint`); [] for any other log. A torchrun
    console's streams are its workers (``[rank3]:`` names the rank, ``[default3]:`` the launcher's local rank,
    the file's name its machine when it names one)."""
    kind = prefix_kind(head) or ("torchrun" if _torchrun_console(head) else None)
    if kind is None:
        return []
    try:
        data = read_bounded(abs_path)
    except InputError:  # over the size limit, gone: the console is still read as a log, its stacks are not
        return []
    if b"Process " not in data or _HEADER.search(data) is None:
        return []
    return [
        Found(s.label, proc, None, i, hint=(s.node, s.snapshot, s.stream))
        for s in console_dumps(data.decode("utf-8", errors="replace"), rel, kind)
        for i, proc in enumerate(s.processes)
    ]


def console_dumps(text: str, rel: str, kind: str) -> list[StreamDump]:
    """The py-spy dumps in a ``kind`` console (``srun``, ``kubectl`` or ``pdsh``: see :func:`.logprefix.prefix_kind`),
    per stream and capture round, in stream order; [] when no stream holds one."""
    lines: defaultdict[str, list[str]] = defaultdict(list)
    hosts: dict[str, str | None] = {}
    tasks = TaskHosts()
    pairs = _torchrun_streams(text, rel) if kind == "torchrun" else None
    for _lineno, key, host, line in pairs or demux(text.splitlines(), kind, tasks, MAX_LINE_CHARS):
        if key is not None:
            lines[key].append(_STAMP.sub("", line, count=1) if line[:1].isdigit() else line)
            hosts.setdefault(key, host)
    named = {t: h for t, (h, _how) in tasks.resolved(list(lines)).items()}
    out: list[StreamDump] = []
    for key, stream in lines.items():
        body = "\n".join(stream) + "\n"
        if "Process " not in body:
            continue
        # a process caught exiting (a header, threads with no frame) or a failed attach says nothing here
        procs = [p for p in parse_pyspy_text(body, rel) if any(t.frames for t in p.threads)]
        if kind == "torchrun":  # the worker's prefix numbers its processes, as a wrapper's RANK= header does
            tag, _, n = key.partition(" ")
            procs = [replace(p, header=((tag, n), *p.header)) for p in procs]
        if not procs:
            continue
        rounds: list[list[ProcessDump]] = []
        for p, k in zip(procs, occurrence_rounds([p.pid for p in procs])):  # a pid seen again: the next round
            while len(rounds) <= k:
                rounds.append([])
            rounds[k].append(p)
        node = hosts.get(key) or named.get(key)
        for k, group in enumerate(rounds):
            where = f"{key}, round {k}" if len(rounds) > 1 else key
            label = f"{rel} [{where}]"
            out.append(StreamDump(label, key, node, k if len(rounds) > 1 else None, tuple(group)))
    return out


def _torchrun_streams(text: str, rel: str) -> list[tuple[int, str | None, str | None, str]]:
    """(line number, ``"rank N"`` / ``"local_rank N"``, the file's machine, the line without its prefix)."""
    host = host_from_log_name(rel)
    out: list[tuple[int, str | None, str | None, str]] = []
    spaced: dict[str, bool] = {}  # "[rank3]: Process ...": a space on every line of a worker is the prefix's
    for lineno, raw in enumerate(text.splitlines(), 1):
        line, tags = raw[:MAX_LINE_CHARS], {}
        while (tag := worker_tag(line)) is not None:  # [default0]:[rank0]: both, as torch may print them
            tags[tag[0]] = tag[1]
            line = line[tag[2] :]
        if not tags:
            out.append((lineno, None, None, line))
            continue
        kind = "rank" if "rank" in tags else "local_rank"
        key = f"{kind} {tags[kind]}"
        if line:
            spaced[key] = spaced.get(key, True) and line[:1] == " "
        out.append((lineno, key, host, line))
    if not any(spaced.values()):
        return out
    return [(n, k, h, ln[1:] if k is not None and spaced.get(k) else ln) for n, k, h, ln in out]


__all__ = ["StreamDump", "console_dumps", "console_found"]
