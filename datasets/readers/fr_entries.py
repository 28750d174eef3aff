"""One Flight Recorder record -> :class:`FREntry`: the hot path of the FR reader (once per record of every
rank) and its tolerant twin for old or odd records. Values as PyTorch writes them take the fast path;
anything else is checked field by field, and a value out of 64 bits is a ValueError naming it.
Shapes, dtype lists and stacks repeat millions of times in a large job: each distinct one is validated once
and interned."""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from rankscope.datasets.domain.bounds import INT64_MAX, INT64_MIN, MAX_LINE_NO, to_float, to_int
from rankscope.datasets.domain.flight_recorder import FREntry
from rankscope.datasets.domain.stacks import Frame

_P2P = re.compile(r"^(send|recv)\s+(-?\d+)\s*(->|<-)\s*(-?\d+)$")


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
        if all(x.__class__ is _INT for s in out for x in s):  # what PyTorch writes: plain ints (checked before
            hit = _SHAPES.get(out)  # hashing: hashing a tuple nested a million deep overflows the C stack)
            if hit is not None:
                return hit
            if len(_SHAPES) < _INTERN_MAX:
                _SHAPES[out] = out
            return out
    except TypeError:  # not a list of lists
        pass
    return tuple(tuple(_i64(x) for x in s) if isinstance(s, (list, tuple)) else (_i64(s),) for s in v)


_SHAPES: dict[tuple[tuple[Any, ...], ...], tuple[tuple[int, ...], ...]] = {}
_DTYPES: dict[tuple[Any, ...], tuple[str, ...]] = {}
_STACKS: dict[tuple[tuple[Any, Any, Any], ...], tuple[Frame, ...]] = {}
_INTERN_MAX = 1 << 16
_new_frame = tuple.__new__
_FRAME_FIELDS = operator.itemgetter("name", "filename", "line")


def _i64(v: Any, default: int | None = None) -> int:
    """A 64-bit integer field (``default`` when absent); anything else is a ValueError naming the value."""
    if v is None and default is not None:
        return default
    out = to_int(v)
    if out is None:
        raise ValueError(f"{str(v)[:40]!r} is not a 64-bit integer")
    return out


def opt_i64(v: Any) -> int | None:
    return None if v is None or v == "" else _i64(v)


def _duration(v: Any) -> float | None:
    return None if v is None else to_float(v)


FrameCache = dict[object, Any]
"""One dump's frame memo: ``id(raw list)`` -> frames (pickles that share one list for identical stacks), and
profiling name -> (raw list, frames) of the last plain stack seen under that name."""


def _frames(v: Any, cache: FrameCache, name: str = "") -> tuple[Frame, ...]:
    if not v:
        return ()
    hit = cache.get(id(v))  # pickles share one list for identical stacks; v stays alive while parsing
    if hit is not None:
        return hit
    last = cache.get(name) if name else None
    if last is not None and last[0] == v:  # torch writes each entry's frames anew: an op from the same
        return last[1]  # call site as the last one (a training step repeats them) compares equal, no hashing
    try:
        # interned by value, one tuple per distinct stack
        key = tuple(map(_FRAME_FIELDS, v))
        if not all(_plain_frame(k) for k in key):  # a line out of range, a number or a nested value for a
            raise TypeError("odd frame fields")  # name: the careful way (checked before hashing the fields)
        out = _STACKS.get(key)
        if out is None:
            out = tuple([_new_frame(Frame, k) for k in key])
            if len(_STACKS) < _INTERN_MAX:
                _STACKS[key] = out
        if name and all(len(f) == 3 for f in v):  # only name, filename, line, of str and int: comparing
            cache[name] = (v, out)  # another list with it never recurses (a nested value is unequal at once)
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


def _plain_frame(f: tuple[Any, Any, Any]) -> bool:
    """A raw (name, file, line) as torch writes it: two strings and a line number in range, or no line."""
    name, file, line = f
    return (
        name.__class__ is str
        and file.__class__ is str
        and (line is None or (line.__class__ is _INT and 0 <= line <= MAX_LINE_NO))
    )


def _dtypes(v: Any) -> tuple[str, ...]:
    out = tuple(v)
    if not all(x.__class__ is str for x in out):  # checked before hashing (a deeply nested tuple)
        return tuple(map(str, out))
    if (hit := _DTYPES.get(out)) is not None:
        return hit
    if len(_DTYPES) < _INTERN_MAX:
        _DTYPES[out] = out
    return out


new_entry = tuple.__new__
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


_SPLIT: dict[str, tuple[str, str, int | None, int | None, str]] = {}  # + the name itself, shared
_PG_ID: dict[object, str] = {}
_WORDS: dict[object, Any] = {}
"""States and process groups as shared objects: one string per state and one pair per group for a million
records (less memory, and records a worker sends back pickle each of them once)."""
_LAST: dict[tuple[Any, ...], tuple[tuple[Any, ...], ...]] = {}
"""Per profiling name (its shared split): the raw sizes, dtypes and stack of the last :data:`_RECENT` distinct
records checked, newest first, and what they became (a ring buffer repeats them: a record is compared with them
in C before anything is converted)."""
_RECENT = 4  # an op name carries a few sizes in a step (TP activations and DP gradients both all_reduce)
_INT = int
_NONE = type(None)
_LO, _HI = INT64_MIN, INT64_MAX


def entry(e: Mapping[str, Any], frame_cache: FrameCache) -> FREntry:
    """One raw FR record -> :class:`FREntry`, for a dump :func:`entries` declines (some record is odd): a record
    as PyTorch writes it (ints, strings, lists) the quick way, anything else the tolerant way."""
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
        or not 0 <= (seq | record_id | op_id | p2p_seq | (t0 or 0) | (t1 or 0) | (t2 or 0) | (tmo or 0)) <= _HI
    ):  # (all ints: their OR is in [0, 2**63) when each one is; a negative one is checked the careful way)
        return _entry_tolerant(e, frame_cache)  # checks each field: a value out of 64 bits is a ValueError
    split = _split(pname)
    backend, op, src, dst, pname = split
    if pg_id.__class__ is not _INT and pg_id.__class__ is not str and pg_id is not None:
        return _entry_tolerant(e, frame_cache)  # (never hash what might be a tuple nested a million deep)
    pid, state = _pg_id(pg_id), _word(state)
    pg_name, pg_desc = pg
    if pg_name.__class__ is str and pg_desc.__class__ is str:  # one shared pair per group (strings only:
        pg_name, pg_desc = _group((pg_name, pg_desc))  # 1.0 == 1 must not mix groups up)
    duration = e.get("duration_ms")
    in_sizes, in_types, out_sizes, out_types, stack = _recent_static(
        split, ins, outs, in_dt, out_dt, e.get("frames"), frame_cache
    )
    return new_entry(
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
            backend,
            op,
            bool(is_p2p),
            src,
            dst,
            state,
            bool(retired),
            t0,
            t1,
            t2,
            duration if duration.__class__ is float or duration is None else _duration(duration),
            tmo,
            in_sizes,
            in_types,
            out_sizes,
            out_types,
            stack,
        ),
    )


def _split(name: str) -> tuple[str, str, int | None, int | None, str]:
    split = _SPLIT.get(name)
    if split is None:
        split = (*split_profiling_name(name), name)
        if len(_SPLIT) < _INTERN_MAX:
            _SPLIT[name] = split
    return split


def _pg_id(pg_id: int | str | None) -> str:
    pid = _PG_ID.get(pg_id)
    if pid is None:
        pid = _PG_ID[pg_id] = str(pg_id) if pg_id is not None else ""
    return pid


def _word(state: str) -> str:
    shared = _WORDS.get(state)
    if shared is None and len(_WORDS) < _INTERN_MAX:
        shared = _WORDS[state] = state
    return shared or state


def _group(key: tuple[str, str]) -> tuple[str, str]:
    group = _WORDS.get(key)
    if group is None:
        group = key
        if len(_WORDS) < _INTERN_MAX:
            _WORDS[key] = key
    return group


def _recent_static(
    split: tuple[Any, ...], ins: Any, outs: Any, in_dt: Any, out_dt: Any, frames: Any, frame_cache: FrameCache
) -> _Static:
    """A record's sizes, dtypes and stack: those of one of the last records of its op that had the same
    raw values (compared in C), else converted, checked and remembered."""
    for last in _LAST.get(split, ()):
        if last[0] == ins and last[1] == outs and last[2] == in_dt and last[3] == out_dt and last[4] == frames:
            return last[5]
    static = _static(ins, outs, in_dt, out_dt, frames, split[4], frame_cache)
    if _plain_static(static, frames, split[4], frame_cache) and len(_LAST) < _INTERN_MAX:
        _LAST[split] = ((ins, outs, in_dt, out_dt, frames, static), *_LAST.get(split, ())[: _RECENT - 1])
    return static


_Shapes = tuple[tuple[int, ...], ...]
_Static = tuple[_Shapes, tuple[str, ...], _Shapes, tuple[str, ...], tuple[Frame, ...]]


def _static(ins: Any, outs: Any, in_dt: Any, out_dt: Any, frames: Any, pname: str, frame_cache: FrameCache) -> _Static:
    """A record's sizes, dtypes and stack, checked and interned."""
    in_sizes = shapes(ins) if ins else ()
    in_types = _dtypes(in_dt) if in_dt else ()
    return (
        in_sizes,
        in_types,
        in_sizes if outs == ins else shapes(outs) if outs else (),  # equal lists: one conversion
        in_types if out_dt == in_dt else _dtypes(out_dt) if out_dt else (),
        _frames(frames, frame_cache, pname) if frames else (),
    )


def _plain_static(static: _Static, frames: Any, pname: str, frame_cache: FrameCache) -> bool:
    """Whether the raw values behind ``static`` are as PyTorch writes them (lists of ints, of strings, of
    3-key frame dicts): only those are kept to compare the next records with, as a comparison with them
    never recurses past their own depth (a nested value is unequal at once)."""
    in_sizes, in_types, out_sizes, out_types, stack = static
    return (
        (not in_sizes or _SHAPES.get(in_sizes) is in_sizes)
        and (not out_sizes or _SHAPES.get(out_sizes) is out_sizes)
        and (not in_types or _DTYPES.get(in_types) is in_types)
        and (not out_types or _DTYPES.get(out_types) is out_types)
        and (not frames or (frame_cache.get(pname) or (None,))[0] is frames)
    )


def _entry_tolerant(e: Mapping[str, Any], frame_cache: FrameCache) -> FREntry:
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
        opt_i64(get("time_created_ns")),
        opt_i64(get("time_discovered_started_ns")),
        opt_i64(get("time_discovered_completed_ns")),
        _duration(duration),
        opt_i64(get("timeout_ms")),
        shapes(get("input_sizes")),
        tuple(map(str, in_dt)) if in_dt else (),
        shapes(get("output_sizes")),
        tuple(map(str, out_dt)) if out_dt else (),
        _frames(get("frames"), frame_cache),
    )
