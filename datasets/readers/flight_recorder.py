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
import operator
import os
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from rankscope.datasets.domain.bounds import FOREIGN, INT64_MAX, INT64_MIN, MAX_LINE_NO, to_float, to_int
from rankscope.datasets.domain.flight_recorder import DUMP_TIME_KEY, FRDump, FREntry
from rankscope.datasets.domain.stacks import Frame
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
_P2P = re.compile(r"^(send|recv)\s+(-?\d+)\s*(->|<-)\s*(-?\d+)$")


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
    frame_cache: dict[int, tuple[Frame, ...]] = {}
    try:  # the hot path: one comprehension; a bad entry is found again below to name it
        entries = [_entry(e, frame_cache) for e in entries_raw]
    except FOREIGN:
        entries = []
        for i, e in enumerate(entries_raw):
            if type(e) is not dict and not isinstance(e, Mapping):
                raise ParseError(path, f"entry {i} is a {type(e).__name__}, not a dict") from None
            try:
                entries.append(_entry(e, frame_cache))
            except FOREIGN as exc:
                raise ParseError(path, f"entry {i}: {exc}") from None
    notes: list[str] = []
    try:
        pg_config = _pg_config(raw.get("pg_config"))
        pg_status = _pg_status(raw.get("pg_status"), {e.pg_id: e.pg_name for e in entries}, notes)
        dump_time = _opt_i64(raw.get(DUMP_TIME_KEY))
    except _GROUP_ERRORS as exc:
        raise ParseError(path, f"bad pg_config/pg_status/{DUMP_TIME_KEY}: {exc}") from None
    return FRDump(
        rank=int(rank),
        entries=tuple(entries),
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
    the corrupt dumps skipped: ``"FILE: why"``; without it a corrupt dump is the error)."""
    seen: dict[int, str] = {}
    dumps = []
    skipped = []
    bad: list[str] = []
    with paused_gc():
        for p in progress(paths, "reading Flight Recorder dumps"):
            try:
                data = read_bytes(p)
                if skip_non_fr and not is_fr_bytes(data[:SNIFF_BYTES]):
                    skipped.append(p)
                    continue
                raw, fmt = load_raw(p, data)
                d = parse_dump(raw, path=str(p), source_format=fmt)
            except InputError as exc:  # corrupt, over a limit, not a regular file
                if not skip_non_fr or "refused pickle" in str(exc):
                    raise  # code in a pickle: refuse the whole input
                bad.append(str(exc))
                continue
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


# -- field parsing ----------------------------------------------------------------------------
@lru_cache(maxsize=65536)
def split_profiling_name(name: str) -> tuple[str, str, int | None, int | None]:
    """``"nccl:send 0->1"`` -> ``("nccl", "send", 0, 1)``;
    ``"gloo:all_reduce"`` -> ``("gloo", "all_reduce", None, None)``."""
    backend, _, rest = name.partition(":") if ":" in name else ("", "", name)
    rest = rest.strip()
    m = _P2P.match(rest)
    if m:
        a, b = int(m.group(2)), int(m.group(4))
        src, dst = (a, b) if m.group(3) == "->" else (b, a)
        return backend, m.group(1), src, dst
    return backend, rest.split(" ", 1)[0] if rest else "", None, None


def shapes(v: Any) -> tuple[tuple[int, ...], ...]:
    """Tensor shapes as tuples of ints; anything else (deeper nesting, strings, huge numbers) a ValueError.
    Validated shapes are interned (a job repeats a few shapes millions of times: one lookup, one tuple)."""
    if not v:
        return ()
    try:
        out = tuple(map(tuple, v))
        hit = _SHAPES.get(out)
        if hit is not None:
            return hit  # equal to a validated all-int shape (1.0 == 1: the int one is returned)
        if all(x.__class__ is _INT for s in out for x in s):  # what PyTorch writes: plain ints
            if len(_SHAPES) < _INTERN_MAX:
                _SHAPES[out] = out
            return out
    except TypeError:  # not a list of lists, or an unhashable dimension
        pass
    return tuple(tuple(_i64(x) for x in s) if isinstance(s, (list, tuple)) else (_i64(s),) for s in v)


_SHAPES: dict[tuple[tuple[Any, ...], ...], tuple[tuple[int, ...], ...]] = {}
_DTYPES: dict[tuple[Any, ...], tuple[str, ...]] = {}
_STACKS: dict[tuple[tuple[Any, Any, Any], ...], tuple[Frame, ...]] = {}
_INTERN_MAX = 1 << 16
_new_frame = tuple.__new__


def _i64(v: Any, default: int | None = None) -> int:
    """A 64-bit integer field (``default`` when absent); anything else is a ValueError naming the value."""
    if v is None and default is not None:
        return default
    out = to_int(v)
    if out is None:
        raise ValueError(f"{str(v)[:40]!r} is not a 64-bit integer")
    return out


def _opt_i64(v: Any) -> int | None:
    return None if v is None or v == "" else _i64(v)


def _duration(v: Any) -> float | None:
    return None if v is None else to_float(v)


def _frames(v: Any, cache: dict[int, tuple[Frame, ...]]) -> tuple[Frame, ...]:
    if not v:
        return ()
    hit = cache.get(id(v))  # pickles share one list for identical stacks; v stays alive while parsing
    if hit is not None:
        return hit
    try:
        # torch writes each entry's frames anew: interned by value, one tuple per distinct stack, checked once
        key = tuple([(f["name"], f["filename"], f["line"]) for f in v])
        out = _STACKS.get(key)  # TypeError: an unhashable field (a list for a name): the careful way below
        if out is None:
            out = tuple([_new_frame(Frame, k) for k in key])
            if not all(_plain_frame(f) for f in out):  # a line out of range, a number for a name
                raise TypeError("odd frame fields")
            if len(_STACKS) < _INTERN_MAX:
                _STACKS[key] = out
    except (KeyError, TypeError):
        out = tuple(
            Frame(
                str(f.get("name", f.get("function", "?"))),
                str(f.get("filename", f.get("file", ""))),
                to_int(f.get("line"), lo=0, hi=MAX_LINE_NO),
            )
            for f in v
            if isinstance(f, Mapping)
        )
    cache[id(v)] = out
    return out


def _plain_frame(f: Frame) -> bool:
    line = f.line
    return (
        f.function.__class__ is str
        and f.file.__class__ is str
        and (line is None or (line.__class__ is _INT and 0 <= line <= MAX_LINE_NO))
    )


def _dtypes(v: Any) -> tuple[str, ...]:
    out = tuple(v)
    try:
        if (hit := _DTYPES.get(out)) is not None:
            return hit
    except TypeError:  # a list inside: the careful way
        return tuple(map(str, out))
    if all(x.__class__ is str for x in out):
        if len(_DTYPES) < _INTERN_MAX:
            _DTYPES[out] = out
        return out
    return tuple(map(str, out))


_new_entry = tuple.__new__
_MODERN = operator.itemgetter(
    "record_id",
    "pg_id",
    "process_group",
    "collective_seq_id",
    "p2p_seq_id",
    "op_id",
    "profiling_name",
    "time_created_ns",
    "input_sizes",
    "input_dtypes",
    "output_sizes",
    "output_dtypes",
    "state",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "retired",
    "timeout_ms",
    "is_p2p",
)
"""The keys every entry has since FR format 2.x, fetched in one C call (the loader's hot path)."""


_SPLIT: dict[str, tuple[str, str, int | None, int | None]] = {}
_PG_ID: dict[object, str] = {}
_INT = int
_NONE = type(None)
_LO, _HI = INT64_MIN, INT64_MAX


def _entry(e: Mapping[str, Any], frame_cache: dict[int, tuple[Frame, ...]]) -> FREntry:
    """One raw FR record -> :class:`FREntry` (hot: called once per record of every rank). The fast path takes
    the values as PyTorch writes them (ints, strings, lists); anything else goes the tolerant way."""
    try:
        (
            record_id,
            pg_id,
            pg,
            seq,
            p2p_seq,
            op_id,
            pname,
            t0,
            ins,
            in_dt,
            outs,
            out_dt,
            state,
            t1,
            t2,
            retired,
            tmo,
            is_p2p,
        ) = _MODERN(e)
    except (KeyError, TypeError):
        return _entry_tolerant(e, frame_cache)
    if (
        record_id.__class__ is not _INT
        or seq.__class__ is not _INT
        or p2p_seq.__class__ is not _INT
        or op_id.__class__ is not _INT
        or pname.__class__ is not str
        or state.__class__ is not str
        or pg.__class__ not in (tuple, list)
        or len(pg) != 2
        or t0.__class__ not in (_INT, _NONE)
        or t1.__class__ not in (_INT, _NONE)
        or t2.__class__ not in (_INT, _NONE)
        or tmo.__class__ not in (_INT, _NONE)
        or not (_LO <= seq <= _HI and _LO <= record_id <= _HI and _LO <= op_id <= _HI and _LO <= p2p_seq <= _HI)
        or not (t0 is None or _LO <= t0 <= _HI)
        or not (t1 is None or _LO <= t1 <= _HI)
        or not (t2 is None or _LO <= t2 <= _HI)
        or not (tmo is None or _LO <= tmo <= _HI)
    ):
        return _entry_tolerant(e, frame_cache)  # checks each field: a value out of 64 bits is a ValueError
    split = _SPLIT.get(pname)
    if split is None:
        split = _SPLIT[pname] = split_profiling_name(pname)
    pid = _PG_ID.get(pg_id)
    if pid is None:
        pid = _PG_ID[pg_id] = str(pg_id) if pg_id is not None else ""
    pg_name, pg_desc = pg
    get = e.get
    duration, frames = get("duration_ms"), get("frames")
    return _new_entry(
        FREntry,
        (
            record_id,
            pid or str(pg_name),
            pg_name if pg_name.__class__ is str else str(pg_name),
            pg_desc if pg_desc.__class__ is str else str(pg_desc),
            seq,
            p2p_seq,
            op_id,
            pname,
            *split[:2],
            bool(is_p2p),
            *split[2:],
            state,
            bool(retired),
            t0,
            t1,
            t2,
            None if duration is None else _duration(duration),
            tmo,
            shapes(ins) if ins else (),
            _dtypes(in_dt) if in_dt else (),
            shapes(outs) if outs else (),
            _dtypes(out_dt) if out_dt else (),
            _frames(frames, frame_cache) if frames else (),
        ),
    )


def _entry_tolerant(e: Mapping[str, Any], frame_cache: dict[int, tuple[Frame, ...]]) -> FREntry:
    """Any FR record, old or odd: every field optional, with defaults."""
    get = e.get
    pg = get("process_group")
    pg_id = get("pg_id")
    if isinstance(pg, (list, tuple)) and pg:
        pg_name, pg_desc = str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
    else:
        pg_name, pg_desc = (str(pg_id) if pg_id is not None else ""), ""
    pname = str(get("profiling_name") or "")
    backend, op, src, dst = split_profiling_name(pname)
    is_p2p = get("is_p2p")
    seq = get("collective_seq_id")
    if seq is None:
        seq = get("seq_id")
    p2p_seq, op_id, duration = get("p2p_seq_id"), get("op_id"), get("duration_ms")
    in_dt, out_dt = get("input_dtypes"), get("output_dtypes")
    return FREntry(
        _i64(get("record_id"), -1),
        str(pg_id) if pg_id is not None else pg_name,
        pg_name,
        pg_desc,
        _i64(seq, -1),
        _i64(p2p_seq, -1),
        _i64(op_id, -1),
        pname,
        backend,
        op,
        bool(is_p2p) if is_p2p is not None else op in ("send", "recv"),
        src,
        dst,
        str(get("state") or ""),
        bool(get("retired", False)),
        _opt_i64(get("time_created_ns")),
        _opt_i64(get("time_discovered_started_ns")),
        _opt_i64(get("time_discovered_completed_ns")),
        _duration(duration),
        _opt_i64(get("timeout_ms")),
        shapes(get("input_sizes")),
        tuple(map(str, in_dt)) if in_dt else (),
        shapes(get("output_sizes")),
        tuple(map(str, out_dt)) if out_dt else (),
        _frames(get("frames"), frame_cache),
    )
