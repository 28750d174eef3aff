"""Rank lists back from the verdict JSON: ``"0-3,8"`` -> ranks (``analytics.verdict.rank_ranges`` goes the
other way). The verdict carries cluster and group ranks as range strings; figures need them as arrays.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np

from rankscope.analytics.verdict import rank_ranges
from rankscope.reports.errors import ReportInputError

_PART = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")


def parse_ranks(value: object, *, field: str = "ranks") -> np.ndarray:
    """Ranks from a range string (``"0-3,8"``), a list of ints or None, as a sorted int64 array."""
    if value is None or value == "":
        return np.zeros(0, dtype=np.int64)
    if isinstance(value, (list, tuple, np.ndarray)):
        try:
            return np.unique(np.asarray(value, dtype=np.int64))
        except (TypeError, ValueError):
            raise ReportInputError(f"{field}: {value!r:.80} is not a list of ranks (expected e.g. [0, 1, 5])") from None
    if not isinstance(value, str):
        raise ReportInputError(f'{field}: {value!r:.80} is not a rank list (expected e.g. "0-3,8")')
    parts: list[np.ndarray] = []
    for part in value.split(","):
        m = _PART.fullmatch(part)
        if not m:
            raise ReportInputError(f'{field}: cannot read {part!r:.40} in {value!r:.80} (expected e.g. "0-3,8")')
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ReportInputError(f"{field}: range {part.strip()!r} runs backwards")
        parts.append(np.arange(lo, hi + 1, dtype=np.int64))
    return np.unique(np.concatenate(parts))


def short_ranges(ranks: Iterable[int] | str, limit: int = 120) -> str:
    """A range string cut to ``limit`` characters at a comma, with the rank count when cut."""
    text = ranks if isinstance(ranks, str) else rank_ranges(ranks)
    if len(text) <= limit:
        return text
    n = parse_ranks(text).size
    cut = text[:limit].rsplit(",", 1)[0]
    return f"{cut},... ({n} ranks)"
