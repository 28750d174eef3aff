"""Reader of PyTorch Flight Recorder (FR) dumps: pickle or JSON, one file per rank (``<prefix><rank>``).

FR dumps are untrusted input, so pickles go through :class:`SafeUnpickler`, which admits only plain
containers and scalars: a pickle that names any other global is refused before anything runs.
Every field of the format (``version``, ``pg_config``, ``pg_status``, ``entries``) is read, with
defaults for fields older or newer versions lack; a file no version explains is a :class:`ParseError`.

``pg_status`` is keyed by **pg_id** in PyTorch (``FlightRecorder::getPgStatusJson``) while
``pg_config`` and the entries name groups by pg name: the reader translates each id through the
dump's own entries (``pg_id`` -> ``process_group[0]``) and drops an id no entry names (its group's
entries left the ring buffer), with a note when its counters said something.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rankscope.datasets.domain.bounds import FOREIGN, to_int
from rankscope.datasets.domain.flight_recorder import DUMP_TIME_KEY, FRDump, FREntry
from rankscope.datasets.readers.forked import map_batches, worker_count
from rankscope.datasets.readers.fr_batches import with_batch_states
from rankscope.datasets.readers.fr_columns import entries as all_entries
from rankscope.datasets.readers.fr_entries import FrameCache, entry, new_entry, opt_i64
from rankscope.datasets.readers.fr_files import (
    SNIFF_BYTES,
    is_fr_bytes,
    load_raw,
    rank_from_name,
    read_bytes,
    select_fr_files,
)
from rankscope.datasets.readers.fr_groups import pg_config as _pg_config
from rankscope.datasets.readers.fr_groups import pg_status as _pg_status
from rankscope.datasets.readers.walk import walk
from rankscope.spine import InputError, ParseError, paused_gc, progress

_GROUP_ERRORS: tuple[type[Exception], ...] = (*FOREIGN, SyntaxError)


def read_fr_file(path: str | os.PathLike[str], rank: int | None = None) -> FRDump:
    """One rank's dump. The rank is ``rank``, else the dump's own ``rank`` field, else the file name's."""
    raw, fmt = load_raw(path)
    return parse_dump(raw, path=str(path), rank=rank, source_format=fmt)


def parse_dump(
    raw: Mapping[str, Any], *, path: str = "<dump>", rank: int | None = None, source_format: str = ""
) -> FRDump:
    """An :class:`FRDump` from an already decoded FR dict (e.g. the bytes of ``_dump_fr_trace``)."""
    if rank is None and isinstance(raw.get("rank"), int):
        rank = to_int(raw["rank"], lo=0)
    if rank is None:
        rank = rank_from_name(path)
    if rank is None or rank < 0:
        raise ParseError(path, "cannot tell the rank: the file name does not end in a rank number")
    entries_raw = raw.get("entries", [])
    if entries_raw is None:
        entries_raw = []
    if not isinstance(entries_raw, (list, tuple)):
        raise ParseError(path, f"'entries' is a {type(entries_raw).__name__}, not a list")
    frame_cache: FrameCache = {}
    try:  # the hot path: field by field, else one by one; a bad entry is found again below to name it
        entries = all_entries(entries_raw, frame_cache)
        if entries is None:
            entries = [entry(e, frame_cache) for e in entries_raw]
    except FOREIGN:
        entries = []
        for i, e in enumerate(entries_raw):
            if type(e) is not dict and not isinstance(e, Mapping):
                raise ParseError(path, f"entry {i} is a {type(e).__name__}, not a dict") from None
            try:
                entries.append(entry(e, frame_cache))
            except FOREIGN as exc:
                raise ParseError(path, f"entry {i}: {exc}") from None
    batched = with_batch_states(entries)
    notes: list[str] = []
    try:
        pg_config = _pg_config(raw.get("pg_config"))
        pg_status = _pg_status(raw.get("pg_status"), {e.pg_id: e.pg_name for e in entries}, notes)
        dump_time = opt_i64(raw.get(DUMP_TIME_KEY))
    except _GROUP_ERRORS as exc:
        raise ParseError(path, f"bad pg_config/pg_status/{DUMP_TIME_KEY}: {exc}") from None
    return FRDump(
        rank=int(rank),
        entries=tuple(batched),
        version=str(raw.get("version", "") or ""),
        pg_config=pg_config,
        pg_status=pg_status,
        comm_lib_version=str(raw.get("comm_lib_version", "") or raw.get("nccl_version", "") or ""),
        source_file=path,
        source_format=source_format,
        dump_time_ns=dump_time if dump_time is not None and dump_time > 0 else None,
        notes=tuple(f"rank {int(rank)}: {n}" for n in notes),
    )


def read_fr_dir(path: str | os.PathLike[str], *, prefix: str | None = None) -> list[FRDump]:
    """Every rank's dump under ``path`` (recursively, hidden entries skipped), sorted by rank.

    See :func:`read_fr_files` for how one family of files is chosen; files that are not FR dumps
    are skipped, and so is a corrupt dump beside good ones (:func:`read_fr_dir_noted` says which).
    """
    return read_fr_dir_noted(path, prefix=prefix)[0]


def read_fr_dir_noted(path: str | os.PathLike[str], *, prefix: str | None = None) -> tuple[list[FRDump], list[str]]:
    """:func:`read_fr_dir` with the notes on what was left out: corrupt dumps (named, with why), links that
    leave the directory, FIFOs and devices (never opened). A corrupt dump with no good one beside it is the
    error; a pickle that names code is always the error (the input is refused, never skipped past)."""
    root = Path(path)
    if not root.exists():
        raise InputError(f"{root}: no such file or directory")
    if root.is_file():
        return [read_fr_file(root)], []
    w = walk(str(root))  # confined: links that leave the directory are not followed, FIFOs/devices not listed
    notes = w.notes()
    paths = [a for a, rel in w.files if rank_from_name(rel.rsplit("/", 1)[-1]) is not None]
    while paths:  # the chosen family's files are sniffed as they are read (one open each)
        dumps, not_fr, bad = _read(select_fr_files(paths, prefix=prefix), freeze=True, skip_non_fr=True)
        if dumps:
            if bad:
                notes.append(f"{len(bad)} Flight Recorder file(s) skipped: {bad[0]}" + (" ..." if len(bad) > 1 else ""))
            return dumps, notes
        if bad:
            raise ParseError(bad[0].split(": ", 1)[0], bad[0].split(": ", 1)[-1])
        paths = [p for p in paths if p not in set(not_fr)]
    raise InputError(f"{root}: no Flight Recorder dumps (files named <prefix><rank>)")


def read_fr_files(
    paths: Sequence[str | os.PathLike[str]], *, prefix: str | None = None, freeze: bool = True
) -> list[FRDump]:
    """The dumps of :func:`select_fr_files`, sorted by rank; a rank seen twice is an :class:`InputError`.

    ``freeze``: the parsed dumps (millions of small tuples at scale, all acyclic, alive for the whole
    analysis) are moved out of the cyclic collector's sight with ``gc.freeze()``, which would otherwise scan
    them all again on its next run; refcounting still frees them. A long-lived process that reads dumps
    again and again can pass ``freeze=False``.
    """
    return _read(select_fr_files(paths, prefix=prefix), freeze=freeze, skip_non_fr=False)[0]


def _read(paths: Sequence[str], *, freeze: bool, skip_non_fr: bool) -> tuple[list[FRDump], list[str], list[str]]:
    """(the dumps of ``paths`` sorted by rank, the paths skipped as not FR dumps, and, when ``skip_non_fr``,
    the corrupt dumps skipped: ``"FILE: why"``; without it a corrupt dump is the error). A large capture is
    read by several processes (:mod:`.forked`); the result is the same."""
    seen: dict[int, str] = {}
    dumps: list[FRDump] = []
    skipped: list[str] = []
    bad: list[str] = []
    with paused_gc():
        for part_dumps, part_skipped, part_bad in _parts(paths, skip_non_fr):
            skipped += part_skipped
            bad += part_bad
            for p, d in part_dumps:
                if d.rank in seen:
                    raise InputError(
                        f"rank {d.rank} has two Flight Recorder dumps, {seen[d.rank]} and {p}; "
                        "pass prefix= to pick one family of files"
                    )
                seen[d.rank] = str(p)
                dumps.append(d)
        if freeze and dumps:
            gc.freeze()
    return sorted(dumps, key=lambda d: d.rank), skipped, bad


def read_fr_each(paths: Sequence[str], ranks: Mapping[str, int] | None = None) -> tuple[list[FRDump], list[str]]:
    """Each file of ``paths`` as one rank's dump (``ranks``: a file's rank where something else knows it, a
    manifest), read by several processes when there are many (:mod:`.forked`): (the dumps in the order of
    ``paths``, ``"FILE: why"`` of each file that is corrupt or no dump). The same rank may come twice (the
    captures of a dump directory). A pickle that names code is raised: the input is refused, never skipped."""
    dumps: list[FRDump] = []
    bad: list[str] = []
    with paused_gc():
        for part_dumps, skipped, part_bad in _parts(paths, True, ranks):
            dumps += [d for _, d in part_dumps]
            bad += part_bad + [f"{p}: not a Flight Recorder dump" for p in skipped]
    return dumps, bad


def _parts(paths: Sequence[str], skip_non_fr: bool, ranks: Mapping[str, int] | None = None) -> list[_Part]:
    """:func:`_read_part` of ``paths`` in batches, shared by this process and forked workers, in order."""
    label = "reading Flight Recorder dumps"
    return map_batches(
        list(paths),
        lambda part: _read_part(part, skip_non_fr, label, ranks),
        workers=worker_count(_units(paths), min_per_worker=FILES_PER_WORKER),
        batch=BATCH,
        encode=_encode_part,
        decode=_decode_part,
        label=label,
    )


FILES_PER_WORKER = 256  # below this a fork and the result's trip through a pipe cost more than they save
UNIT_BYTES = 16 << 10  # ... counted in files of this size: 128 ranks of deep ring buffers (100 kB each) are many


def _units(paths: Sequence[str]) -> int:
    """The files to read, counted by size too (in :data:`UNIT_BYTES`): a few large dumps are as much work as
    many small ones."""
    size = 0
    for p in paths:
        try:
            size += os.stat(p).st_size
        except OSError:
            pass
    return max(len(paths), size // UNIT_BYTES)


BATCH = 16  # dumps a worker takes at a time: small enough that all finish together, large enough to amortise
_Part = tuple[list[tuple[str, FRDump]], list[str], list[str]]


def _read_part(paths: Sequence[str], skip_non_fr: bool, label: str, ranks: Mapping[str, int] | None = None) -> _Part:
    dumps = []
    skipped = []
    bad: list[str] = []
    for p in progress(paths, label):
        try:
            data = read_bytes(p)
            if skip_non_fr and not is_fr_bytes(data[:SNIFF_BYTES]):
                skipped.append(p)
                continue
            raw, fmt = load_raw(p, data)
            d = parse_dump(raw, path=str(p), rank=ranks.get(p) if ranks else None, source_format=fmt)
        except InputError as exc:  # corrupt, over a limit, not a regular file
            if not skip_non_fr or "refused pickle" in str(exc):
                raise  # code in a pickle: refuse the whole input
            bad.append(str(exc))
            continue
        dumps.append((p, d))
    return dumps, skipped, bad


def _encode_part(part: _Part) -> Any:
    """A part's dumps as their fields, with entries as plain tuples: a dataclass and a NamedTuple pickle through
    Python code, a dict and a tuple do not (a million entries at 1,024 ranks)."""
    dumps, skipped, bad = part
    return [(p, {**vars(d), "entries": list(map(tuple, d.entries))}) for p, d in dumps], skipped, bad


def _decode_part(data: Any) -> _Part:
    """:func:`_encode_part` undone: the same fields of a dump already built and checked in the child."""
    dumps, skipped, bad = data
    out = []
    for p, fields in dumps:
        fields["entries"] = tuple([new_entry(FREntry, e) for e in fields["entries"]])
        d = object.__new__(FRDump)
        vars(d).update(fields)
        out.append((p, d))
    return out, skipped, bad
