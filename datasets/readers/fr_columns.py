"""A Flight Recorder dump's records field by field: the hot path of the FR reader. Each field's types are one set,
its range one min and max, its conversions one map, all in C; only what a record carries beyond its fields
(sizes, dtypes, stack: mostly a repeat of a recent record's) is looked at one record at a time
(:mod:`.fr_entries` holds the record-by-record way and the caches both share)."""

from __future__ import annotations

from itertools import repeat
from typing import Any

from rankscope.datasets.domain.flight_recorder import FREntry
from rankscope.datasets.readers.fr_entries import (
    _HI,
    _MODERN,
    _SPLIT,
    FrameCache,
    _duration,
    _group,
    _pg_id,
    _recent_static,
    _split,
    _word,
    new_entry,
)


def entries(raw: list[Any] | tuple[Any, ...], frame_cache: FrameCache) -> list[FREntry] | None:
    """A dump's records at once, field by field: :func:`entry`'s checks and conversions run in C over each
    field's column (its types in one set, its range in one min and max), and only what a record carries
    beyond its fields (sizes, dtypes, stack: mostly a repeat of a recent record's) is looked at one record
    at a time. The same entries as ``[entry(e) for e in raw]``; None when any record is not as PyTorch
    writes it (a key missing, a value of another type or out of range): the caller then takes them one by
    one, the careful way. A value the static part refuses raises as :func:`entry` does."""
    if not raw:
        return []
    if set(map(type, raw)) != _DICT:
        return None
    try:
        cols = tuple(zip(*map(_MODERN, raw)))
    except (KeyError, TypeError):
        return None
    rid, pg_id, pg, seq, p2p, op_id, names, t0, ins, in_dt, outs, out_dt, state, t1, t2, ret, tmo, is_p2p = cols
    ints = rid + seq + p2p + op_id
    times = t0 + t1 + t2 + tmo
    if set(map(type, ints)) != _JUST_INT or min(ints) < 0 or max(ints) > _HI:
        return None
    if not set(map(type, times)) <= _INT_OR_NONE or not _in_range(times):
        return None
    if set(map(type, names)) != _JUST_STR or set(map(type, state)) != _JUST_STR:
        return None
    if not set(map(type, pg_id)) <= _PG_ID_TYPES or not set(map(type, pg)) <= _PAIR_TYPES:
        return None
    if set(map(len, pg)) != _JUST_TWO:
        return None
    pg_name, pg_desc = zip(*pg)
    if set(map(type, pg_name + pg_desc)) != _JUST_STR:
        return None
    splits = list(map(_SPLIT.get, names))
    if None in splits:
        splits = [s or _split(n) for s, n in zip(splits, names)]
    backend, op, src, dst, names = zip(*splits)
    groups = {g: _group(g) for g in set(zip(pg_name, pg_desc))}
    pg_name, pg_desc = zip(*map(groups.__getitem__, zip(pg_name, pg_desc)))
    ids = {i: _pg_id(i) for i in set(pg_id)}
    pids = [ids[i] or n for i, n in zip(pg_id, pg_name)] if "" in ids.values() else list(map(ids.__getitem__, pg_id))
    words = {w: _word(w) for w in set(state)}
    state = tuple(map(words.__getitem__, state))
    dur = tuple(map(dict.get, raw, repeat("duration_ms")))
    if not set(map(type, dur)) <= _FLOAT_OR_NONE:
        dur = tuple(d if d.__class__ is float or d is None else _duration(d) for d in dur)
    frames = tuple(map(dict.get, raw, repeat("frames")))
    static = map(_recent_static, splits, ins, outs, in_dt, out_dt, frames, repeat(frame_cache))
    in_sizes, in_types, out_sizes, out_types, stack = zip(*static)
    return list(
        map(
            new_entry,
            repeat(FREntry),
            zip(
                rid, pids, pg_name, pg_desc, seq, p2p, op_id, names, backend, op, map(bool, is_p2p), src, dst,
                state, map(bool, ret), t0, t1, t2, dur, tmo, in_sizes, in_types, out_sizes, out_types, stack,
            ),
        )
    )  # fmt: skip


_DICT = {dict}
_JUST_INT = {int}
_JUST_STR = {str}
_JUST_TWO = {2}
_INT_OR_NONE = {int, type(None)}
_FLOAT_OR_NONE = {float, type(None)}
_PG_ID_TYPES = {int, str, type(None)}
_PAIR_TYPES = {tuple, list}


def _in_range(times: tuple[int | None, ...]) -> bool:
    """Whether the ints among ``times`` (None aside) are in ``[0, 2**63)``."""
    some = [t for t in times if t is not None]
    return not some or (min(some) >= 0 and max(some) <= _HI)
