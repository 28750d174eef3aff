"""The agent's batched store writer: bounded buffers, atomic files, drop-and-count on failure.

Rows wait in one bounded buffer per table and are written as one Parquet file per table per
flush through :meth:`rankscope.datasets.store.Store.write` (temp file + fsync + rename, so a
``kill -9`` never leaves a partial visible file). When the buffer is full the oldest rows are
dropped; when a write fails (ENOSPC, EROFS, anything) the batch is dropped. Both are counted,
never raised: the agent must outlive a full disk.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


class BatchWriter:
    """Buffers rows per table and flushes them to a store; never raises."""

    def __init__(self, store_root: str | os.PathLike[str], *, max_rows: int = 100_000) -> None:
        self.root = Path(store_root)
        self.max_rows = max_rows
        self.buffers: dict[str, deque[Mapping[str, Any]]] = {}
        self.dropped: dict[str, int] = {}
        self.written: dict[str, int] = {}
        self.write_errors = 0
        self.last_error = ""
        self._store: Any = None

    def _get_store(self) -> Any:
        if self._store is None:
            from ..datasets.store import Store

            self._store = Store(self.root, create=True)
        return self._store

    def add(self, table: str, rows: Iterable[Mapping[str, Any]]) -> None:
        buf = self.buffers.setdefault(table, deque())
        for row in rows:
            if len(buf) >= self.max_rows:
                buf.popleft()
                self.dropped[table] = self.dropped.get(table, 0) + 1
            buf.append(row)

    @property
    def pending(self) -> int:
        return sum(len(b) for b in self.buffers.values())

    def flush(self, tables: Iterable[str] | None = None) -> int:
        """Write the buffered rows (of ``tables``, or all); returns rows written. Never raises."""
        total = 0
        for table in list(tables if tables is not None else self.buffers):
            buf = self.buffers.get(table)
            if not buf:
                continue
            rows = list(buf)
            buf.clear()
            try:
                self._get_store().write(table, _columns(table, rows))
            except Exception as exc:  # noqa: BLE001 - full disk, read-only fs, bad row: drop and count
                self.write_errors += 1
                self.dropped[table] = self.dropped.get(table, 0) + len(rows)
                self.last_error = f"{table}: {type(exc).__name__}: {exc}"[:500]
                continue
            self.written[table] = self.written.get(table, 0) + len(rows)
            total += len(rows)
        return total

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


def _columns(table: str, rows: list[Mapping[str, Any]]) -> Any:
    """``rows`` as an Arrow table of the table's schema, built column by column (no type inference)."""
    import pyarrow as pa

    from ..datasets.schemas import table as spec_of

    spec = spec_of(table)
    unknown = set(rows[0]) - set(spec.schema.names) if rows else set()
    if unknown:
        raise ValueError(f"table {table}: unknown columns {sorted(unknown)}")
    return pa.Table.from_arrays([pa.array([r.get(f.name) for r in rows], type=f.type) for f in spec.schema],
                                schema=spec.schema)
