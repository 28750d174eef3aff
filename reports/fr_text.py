"""Flight Recorder entries as text, the way ``torchfrtrace -j`` prints them, for ``rankscope fr``.

One column per selected rank, one row per recorded entry (oldest first), each cell
``<group>:<op> #<seq> <state>`` with a stack id; ``--print-stack-trace`` adds the stack of each id
(innermost frame first). Selection by rank (``--selected-ranks``) and by process group name or
description (``--pg-filters``) applies to what is printed; the verdict always uses every dump.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from rankscope.datasets.domain.flight_recorder import FRDump, FREntry
from rankscope.datasets.domain.stacks import Frame

MAX_CELL = 42


def _keep(e: FREntry, pg_filters: Collection[str]) -> bool:
    return not pg_filters or e.pg_name in pg_filters or e.pg_desc in pg_filters or e.pg_id in pg_filters


def _cell(e: FREntry, stack_id: int | None) -> str:
    group = e.pg_desc or e.pg_name or e.pg_id
    seq = f"p2p #{e.p2p_seq_id}" if e.is_p2p else f"#{e.collective_seq_id}"
    text = f"{group}:{e.op} {seq} {e.state}"
    if len(text) > MAX_CELL:
        text = text[: MAX_CELL - 1] + "…"
    return text + (f" [s{stack_id}]" if stack_id is not None else "")


def _stack_text(frames: Sequence[Frame]) -> str:
    return "\n".join(f"    {f.function} ({f.file}" + (f":{f.line})" if f.line else ")") for f in frames)


def selected(dumps: Iterable[FRDump], ranks: Collection[int] | None) -> list[FRDump]:
    return [d for d in dumps if ranks is None or d.rank in ranks]


def entries_rows(
    dumps: Sequence[FRDump], *, ranks: Collection[int] | None = None, pg_filters: Collection[str] = ()
) -> list[dict[str, Any]]:
    """The selected entries as records (``--format json``), oldest first per rank."""
    return [
        {
            "rank": d.rank,
            "record_id": e.record_id,
            "pg_id": e.pg_id,
            "pg_name": e.pg_name,
            "pg_desc": e.pg_desc,
            "collective_seq_id": e.collective_seq_id,
            "p2p_seq_id": e.p2p_seq_id,
            "op": e.op,
            "profiling_name": e.profiling_name,
            "state": e.state,
            "input_sizes": [list(s) for s in e.input_sizes],
            "input_dtypes": list(e.input_dtypes),
            "frames": [f"{f.function} ({f.file}:{f.line})" for f in e.frames],
        }
        for d in selected(dumps, ranks)
        for e in d.entries
        if _keep(e, pg_filters)
    ]


def render_entries(
    dumps: Sequence[FRDump],
    *,
    ranks: Collection[int] | None = None,
    pg_filters: Collection[str] = (),
    stacks: bool = False,
    max_rows: int = 0,
) -> str:
    """A table of the selected ranks' entries (columns: ranks), and the stacks they reference."""
    chosen = selected(dumps, ranks)
    if not chosen:
        return "entries: no dump of the selected rank(s)"
    columns = [[e for e in d.entries if _keep(e, pg_filters)] for d in chosen]
    stack_ids: dict[tuple[Frame, ...], int] = {}
    if stacks:
        for col in columns:
            for e in col:
                if e.frames:
                    stack_ids.setdefault(e.frames, len(stack_ids))
    depth = max((len(c) for c in columns), default=0)
    start = max(0, depth - max_rows) if max_rows else 0
    headers = [f"rank {d.rank}" for d in chosen]
    body = [
        [_cell(c[i], stack_ids.get(c[i].frames) if stacks else None) if i < len(c) else "" for c in columns]
        for i in range(start, depth)
    ]
    widths = [max([len(h), *(len(r[j]) for r in body)]) for j, h in enumerate(headers)]
    lines = [
        "entries (oldest first" + (f"; the last {depth - start} of {depth}" if start else "") + "):",
        "  " + "  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(),
        "  " + "  ".join("-" * w for w in widths),
    ]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in body]
    if not body:
        lines.append("  (no entry matches" + (f" --pg-filters {', '.join(pg_filters)}" if pg_filters else "") + ")")
    if stacks:
        lines.append("")
        lines.append("stack traces (innermost frame first):" if stack_ids else "stack traces: none recorded")
        for frames, sid in stack_ids.items():
            lines.append(f"  s{sid}:")
            lines.append(_stack_text(frames))
    return "\n".join(lines)
