"""A Flight Recorder dump's process groups: ``pg_config`` (members by pg name) and ``pg_status`` (counters by
pg_id, filed under pg names through the dump's own entries)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from rankscope.datasets.domain.bounds import limits, to_int
from rankscope.datasets.domain.flight_recorder import PGInfo, PGStatus


def opt_int(v: Any) -> int | None:
    """An optional 64-bit integer field (None or ``""`` is None; JSON dumps write counters as strings);
    anything else is a ValueError."""
    if v is None or v == "":
        return None
    out = to_int(v)
    if out is None:
        raise ValueError(f"{str(v)[:40]!r} is not a 64-bit integer")
    return out


def _rank(r: Any) -> int:
    out = to_int(r, lo=0, hi=limits().max_world_size - 1)
    if out is None:
        raise ValueError(f"group member {str(r)[:40]!r} is not a rank (0 .. limits.max_world_size - 1)")
    return out


def _ranks(v: Any) -> tuple[int, ...] | None:
    if v is None:
        return None
    ranks = _ranks_text(v) if isinstance(v, str) else tuple(_rank(r) for r in v)
    return ranks or None  # gloo writes '[]' (unknown), never a real empty group


_RANK_LIST = re.compile(r"^\s*((?:[-+]?\w+\s*,\s*)*[-+]?\w+)?\s*,?\s*$")
_PAIRS = {"[": "]", "(": ")", "{": "}"}


@lru_cache(maxsize=4096)
def _ranks_text(text: str) -> tuple[int, ...]:
    """``"[0, 1, 2]"`` (JSON or a Python tuple/set's text) -> ``(0, 1, 2)``; cached: every member of the default
    group repeats the same string. Parsed by a flat pattern (no eval, no nesting); anything else a ValueError."""
    text = text.strip()
    if text[:1] in _PAIRS:
        text = text[1:-1] if len(text) > 1 and text[-1] == _PAIRS[text[0]] else "?"
    m = _RANK_LIST.match(text)
    if m is None:
        raise ValueError(f"group members {text[:40]!r} are not a list of ranks")
    return tuple(_rank(t) for t in re.split(r"\s*,\s*", m.group(1))) if m.group(1) else ()


def pg_config(v: Any) -> dict[str, PGInfo]:
    if not v:
        return {}
    if not isinstance(v, Mapping):
        raise TypeError(f"pg_config is a {type(v).__name__}, not a dict")
    out = {}
    for key, cfg in v.items():
        if cfg.__class__ is not dict and not isinstance(cfg, Mapping):
            continue
        name = str(cfg.get("name", key) or key)
        if not name:
            continue  # gloo's placeholder {'': {'name': '', 'desc': '', 'ranks': '[]'}}: names no group
        desc, text = str(cfg.get("desc", "") or ""), cfg.get("ranks")
        if isinstance(text, str):  # every member lists its groups the same way: one PGInfo per group, shared
            info = _PG_INFOS.get((name, desc, text))
            if info is None:
                info = _PG_INFOS[(name, desc, text)] = PGInfo(name=name, desc=desc, ranks=_ranks(text))
        else:
            info = PGInfo(name=name, desc=desc, ranks=_ranks(text))
        out[name] = info
    return out


_PG_INFOS: dict[tuple[str, str, str], PGInfo] = {}


def _count(v: Any) -> int | None:
    return v if v.__class__ is int else opt_int(v)


def pg_status(v: Any, id_to_name: Mapping[str, str], notes: list[str]) -> dict[str, PGStatus]:
    """``pg_status`` (keyed by pg_id) filed under pg names; ids no entry names are dropped."""
    if not v:
        return {}
    if not isinstance(v, Mapping):
        raise TypeError(f"pg_status is a {type(v).__name__}, not a dict")
    out = {}
    dropped = []
    for key, st in v.items():
        if st.__class__ is not dict and not isinstance(st, Mapping):
            continue
        get = st.get
        status = PGStatus(
            _count(get("last_enqueued_collective")),
            _count(get("last_started_collective")),
            _count(get("last_completed_collective")),
            key if key.__class__ is str else str(key),
        )
        name = id_to_name.get(status.pg_id)
        if name is not None:
            out[name] = status
        elif any((c or 0) > 0 for c in status[:3]):
            dropped.append(status.pg_id)
    if dropped:
        notes.append(
            f"pg_status of pg_id {', '.join(dropped[:8])} ignored: pg_status is keyed by pg_id and no entry "
            "in the ring buffer names that group"
        )
    return out
