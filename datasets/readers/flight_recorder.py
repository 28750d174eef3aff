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

import ast
import json
import operator
import os
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from rankscope.datasets.domain.flight_recorder import DUMP_TIME_KEY, FRDump, FREntry, PGInfo, PGStatus
from rankscope.datasets.domain.stacks import Frame
from rankscope.datasets.readers.fr_files import is_fr_file, load_raw, rank_from_name, select_fr_files
from rankscope.spine import InputError, ParseError, paused_gc

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
        rank = int(raw["rank"])
    if rank is None:
        rank = rank_from_name(path)
    if rank is None or rank < 0:
        raise ParseError(path, "cannot tell the rank: the file name does not end in a rank number")
    entries_raw = raw.get("entries", [])
    if entries_raw is None:
        entries_raw = []
    if not isinstance(entries_raw, (list, tuple)):
        raise ParseError(path, f"'entries' is a {type(entries_raw).__name__}, not a list")
    entries = []
    frame_cache: dict[int, tuple[Frame, ...]] = {}
    for i, e in enumerate(entries_raw):
        if type(e) is not dict and not isinstance(e, Mapping):
            raise ParseError(path, f"entry {i} is a {type(e).__name__}, not a dict")
        try:
            entries.append(_entry(e, frame_cache))
        except (TypeError, ValueError, KeyError) as exc:
            raise ParseError(path, f"entry {i}: {exc}") from None
    notes: list[str] = []
    try:
        pg_config = _pg_config(raw.get("pg_config"))
        pg_status = _pg_status(raw.get("pg_status"), {e.pg_id: e.pg_name for e in entries}, notes)
        dump_time = _opt_int(raw.get(DUMP_TIME_KEY))
    except (TypeError, ValueError, SyntaxError) as exc:
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
    are skipped.
    """
    root = Path(path)
    if not root.exists():
        raise InputError(f"{root}: no such file or directory")
    if root.is_file():
        return [read_fr_file(root)]
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        paths += [
            os.path.join(dirpath, n)
            for n in sorted(filenames)
            if not n.startswith(".") and rank_from_name(n) is not None
        ]
    paths = [p for p in paths if is_fr_file(p)]
    if not paths:
        raise InputError(f"{root}: no Flight Recorder dumps (files named <prefix><rank>)")
    return read_fr_files(paths, prefix=prefix)


def read_fr_files(paths: Sequence[str | os.PathLike[str]], *, prefix: str | None = None) -> list[FRDump]:
    """The dumps of :func:`select_fr_files`, sorted by rank; a rank seen twice is an :class:`InputError`."""
    seen: dict[int, str] = {}
    dumps = []
    with paused_gc():
        for p in select_fr_files(paths, prefix=prefix):
            d = read_fr_file(p)
            if d.rank in seen:
                raise InputError(
                    f"rank {d.rank} has two Flight Recorder dumps, {seen[d.rank]} and {p}; "
                    "pass prefix= to pick one family of files"
                )
            seen[d.rank] = str(p)
            dumps.append(d)
    return sorted(dumps, key=lambda d: d.rank)


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


def _opt_int(v: Any) -> int | None:
    if v is None or v == "":
        return None
    return int(v)


def shapes(v: Any) -> tuple[tuple[int, ...], ...]:
    if not v:
        return ()
    try:
        return tuple(map(tuple, v))  # the decoders only produce plain scalars, so no per-number check
    except TypeError:
        pass
    return tuple(tuple(int(x) for x in s) if isinstance(s, (list, tuple)) else (int(s),) for s in v)


def _frames(v: Any, cache: dict[int, tuple[Frame, ...]]) -> tuple[Frame, ...]:
    if not v:
        return ()
    hit = cache.get(id(v))  # pickles share one list for identical stacks; v stays alive while parsing
    if hit is not None:
        return hit
    try:
        out = tuple([Frame(f["name"], f["filename"], f["line"]) for f in v])
    except (KeyError, TypeError):
        out = tuple(
            Frame(
                str(f.get("name", f.get("function", "?"))),
                str(f.get("filename", f.get("file", ""))),
                int(f["line"]) if f.get("line") is not None else None,
            )
            for f in v
            if isinstance(f, Mapping)
        )
    cache[id(v)] = out
    return out


_new_entry = tuple.__new__


def _int(v: Any) -> int | None:
    return v if v.__class__ is int else _opt_int(v)


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


def _entry(e: Mapping[str, Any], frame_cache: dict[int, tuple[Frame, ...]]) -> FREntry:
    """One raw FR record -> :class:`FREntry` (hot: called once per record of every rank)."""
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
    except KeyError:
        return _entry_tolerant(e, frame_cache)
    if pname.__class__ is not str or pg.__class__ not in (tuple, list) or len(pg) != 2:
        return _entry_tolerant(e, frame_cache)
    backend, op, src, dst = split_profiling_name(pname)
    get = e.get
    duration, frames = get("duration_ms"), get("frames")
    pg_name, pg_desc = pg
    return _new_entry(
        FREntry,
        (
            record_id if record_id.__class__ is int else int(record_id),
            str(pg_id) if pg_id is not None else pg_name,
            pg_name if pg_name.__class__ is str else str(pg_name),
            pg_desc if pg_desc.__class__ is str else str(pg_desc),
            _int(seq) if seq is not None else -1,
            _int(p2p_seq) if p2p_seq is not None else -1,
            _int(op_id) if op_id is not None else -1,
            pname,
            backend,
            op,
            bool(is_p2p),
            src,
            dst,
            state if state.__class__ is str else str(state or ""),
            bool(retired),
            None if t0 is None else _int(t0),
            None if t1 is None else _int(t1),
            None if t2 is None else _int(t2),
            float(duration) if duration is not None else None,
            None if tmo is None else _int(tmo),
            shapes(ins) if ins else (),
            tuple(in_dt) if in_dt else (),
            shapes(outs) if outs else (),
            tuple(out_dt) if out_dt else (),
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
        int(get("record_id", -1)),
        str(pg_id) if pg_id is not None else pg_name,
        pg_name,
        pg_desc,
        int(seq) if seq is not None else -1,
        int(p2p_seq) if p2p_seq is not None else -1,
        int(op_id) if op_id is not None else -1,
        pname,
        backend,
        op,
        bool(is_p2p) if is_p2p is not None else op in ("send", "recv"),
        src,
        dst,
        str(get("state") or ""),
        bool(get("retired", False)),
        _opt_int(get("time_created_ns")),
        _opt_int(get("time_discovered_started_ns")),
        _opt_int(get("time_discovered_completed_ns")),
        float(duration) if duration is not None else None,
        _opt_int(get("timeout_ms")),
        shapes(get("input_sizes")),
        tuple(map(str, in_dt)) if in_dt else (),
        shapes(get("output_sizes")),
        tuple(map(str, out_dt)) if out_dt else (),
        _frames(get("frames"), frame_cache),
    )


def _ranks(v: Any) -> tuple[int, ...] | None:
    if v is None:
        return None
    ranks = _ranks_text(v) if isinstance(v, str) else tuple(int(r) for r in v)
    return ranks or None  # gloo writes '[]' (unknown), never a real empty group


@lru_cache(maxsize=4096)
def _ranks_text(text: str) -> tuple[int, ...]:
    """``"[0, 1, 2]"`` -> ``(0, 1, 2)``; cached: every member of the default group repeats the same string."""
    text = text.strip() or "[]"
    try:
        v = json.loads(text)
    except ValueError:
        v = ast.literal_eval(text)
    return tuple(int(r) for r in v)


def _pg_config(v: Any) -> dict[str, PGInfo]:
    if not v:
        return {}
    if not isinstance(v, Mapping):
        raise TypeError(f"pg_config is a {type(v).__name__}, not a dict")
    out = {}
    for key, cfg in v.items():
        if not isinstance(cfg, Mapping):
            continue
        name = str(cfg.get("name", key) or key)
        if not name:
            continue  # gloo's placeholder {'': {'name': '', 'desc': '', 'ranks': '[]'}}: names no group
        ranks = _ranks(cfg.get("ranks"))
        out[name] = PGInfo(name=name, desc=str(cfg.get("desc", "") or ""), ranks=ranks)
    return out


def _pg_status(v: Any, id_to_name: Mapping[str, str], notes: list[str]) -> dict[str, PGStatus]:
    """``pg_status`` (keyed by pg_id) filed under pg names; ids no entry names are dropped."""
    if not v:
        return {}
    if not isinstance(v, Mapping):
        raise TypeError(f"pg_status is a {type(v).__name__}, not a dict")
    out = {}
    dropped = []
    for key, st in v.items():
        if not isinstance(st, Mapping):
            continue
        status = PGStatus(
            _opt_int(st.get("last_enqueued_collective")),
            _opt_int(st.get("last_started_collective")),
            _opt_int(st.get("last_completed_collective")),
            str(key),
        )
        name = id_to_name.get(str(key))
        if name is not None:
            out[name] = status
        elif any((c or 0) > 0 for c in (status.last_enqueued, status.last_started, status.last_completed)):
            dropped.append(str(key))
    if dropped:
        notes.append(
            f"pg_status of pg_id {', '.join(dropped[:8])} ignored: pg_status is keyed by pg_id and no entry "
            "in the ring buffer names that group"
        )
    return out
