"""Tables for people and for other tools, like duckdb's and sqlite-utils' CLIs print them.

``text``: an aligned table (numbers right-aligned, NULL for missing, long cells cut, at most ``max_rows``
rows with a count of the rest); ``csv``: RFC 4180 with a header; ``json``: one array of objects, nested
values as JSON; ``markdown``: a GitHub table. Nested values (lists, structs) are JSON-encoded in every
format but ``json``; times are ISO 8601.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any

MAX_CELL = 60


class TableFormat(str, Enum):
    text = "text"
    csv = "csv"
    json = "json"
    markdown = "markdown"


def _plain(value: Any) -> Any:
    """A JSON-ready value: times as ISO strings, Decimals as floats, bytes as hex, nested values recursively."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def cell(value: Any, *, null: str = "NULL") -> str:
    """One value as text: nested values JSON-encoded, times ISO 8601."""
    if value is None:
        return null
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(_plain(value), ensure_ascii=False)
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return str(value)


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def render(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    fmt: TableFormat = TableFormat.text,
    *,
    max_rows: int = 0,
    max_cell: int = MAX_CELL,
) -> str:
    """``rows`` under ``columns`` in ``fmt`` (``max_rows`` applies to text only; 0 = every row)."""
    if fmt is TableFormat.json:
        return json.dumps(
            [{c: _plain(v) for c, v in zip(columns, r)} for r in rows], ensure_ascii=False, indent=1, default=str
        )
    if fmt is TableFormat.csv:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        w.writerows([cell(v, null="") for v in r] for r in rows)
        return buf.getvalue().rstrip("\n")
    if fmt is TableFormat.markdown:
        esc = [[cell(v, null="").replace("|", "\\|").replace("\n", " ") for v in r] for r in rows]
        head = "| " + " | ".join(c.replace("|", "\\|") for c in columns) + " |"
        rule = "|" + "|".join("---:" if rows and _numeric(rows[0][i]) else "---" for i in range(len(columns))) + "|"
        return "\n".join([head, rule, *("| " + " | ".join(r) + " |" for r in esc)])
    return _aligned(columns, rows, max_rows=max_rows, max_cell=max_cell)


def _aligned(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, max_rows: int, max_cell: int) -> str:
    shown = list(rows)
    cut = 0
    if max_rows and len(rows) > max_rows:
        half = max_rows // 2
        shown = [*rows[:half], *rows[len(rows) - (max_rows - half) :]]
        cut = len(rows) - len(shown)
    text = [[_clip(cell(v), max_cell) for v in r] for r in shown]
    right = [
        any(_numeric(r[i]) for r in shown) and all(r[i] is None or _numeric(r[i]) for r in shown)
        for i in range(len(columns))
    ]
    widths = [max([len(c), *(len(r[i]) for r in text)]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if right[i] else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [line(columns), "  ".join("-" * w for w in widths)]
    if cut:
        half = max_rows // 2
        out += [line(r) for r in text[:half]]
        out.append(f"... {cut:,} more row(s) ...")
        out += [line(r) for r in text[half:]]
    else:
        out += [line(r) for r in text]
    out.append(f"({len(rows):,} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def _clip(text: str, n: int) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= n else text[: n - 1] + "…"
