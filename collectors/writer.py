"""The agent's batched store writer: bounded buffers, atomic files, drop-and-count on failure.

Rows wait in one bounded buffer per table and are written as one Parquet file per table per
flush through :meth:`rankscope.datasets.store.store.Store.write` (temp file + fsync + rename, so a
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
    """Buffers rows per table and flushes them to a store; never raises.

    Rows are kept column by column (one deque of values per schema column), not as the dicts they
    arrive as: a buffered metric row then costs a few pointers instead of a ~600-byte dict, which
    keeps the agent's memory flat between flushes.
    """

    def __init__(self, store_root: str | os.PathLike[str], *, max_rows: int = 100_000) -> None:
        self.root = Path(store_root)
        self.max_rows = max_rows
        self.buffers: dict[str, dict[str, deque[Any]]] = {}
        self.dropped: dict[str, int] = {}
        self.written: dict[str, int] = {}
        self.write_errors = 0
        self.last_error = ""
        self._store: Any = None

    def _get_store(self) -> Any:
        if self._store is None:
            from rankscope.datasets.store.store import Store

            self._store = Store(self.root, create=True)
        return self._store

    def _drop(self, table: str, n: int, why: str = "") -> None:
        self.dropped[table] = self.dropped.get(table, 0) + n
        if why:
            self.last_error = why[:500]

    def add(self, table: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Buffer ``rows`` (dicts keyed by the table's columns; missing keys are null)."""
        cols = self.buffers.get(table)
        if cols is None:
            try:
                from rankscope.datasets.store.schemas import table as spec_of

                names = spec_of(table).schema.names
            except Exception as exc:
                self._drop(table, sum(1 for _ in rows), f"{table}: {type(exc).__name__}: {exc}")
                return
            cols = self.buffers[table] = {name: deque() for name in names}
        known = cols.keys()
        appenders = [(name, col.append) for name, col in cols.items()]  # hot path: ~20k rows a minute
        n = len(next(iter(cols.values())))
        for row in rows:
            if not row.keys() <= known:
                self._drop(table, 1, f"{table}: unknown columns {sorted(row.keys() - known)}")
                continue
            if n >= self.max_rows:
                for col in cols.values():
                    col.popleft()
                self._drop(table, 1)
            else:
                n += 1
            for name, append in appenders:
                append(row.get(name))

    @property
    def pending(self) -> int:
        return sum(len(next(iter(c.values()))) for c in self.buffers.values() if c)

    def flush(self, tables: Iterable[str] | None = None) -> int:
        """Write the buffered rows (of ``tables``, or all); returns rows written. Never raises."""
        total = 0
        for table in list(tables if tables is not None else self.buffers):
            cols = self.buffers.get(table)
            if not cols:
                continue
            n = len(next(iter(cols.values())))
            if not n:
                continue
            values = {name: list(col) for name, col in cols.items()}
            for col in cols.values():
                col.clear()
            try:
                self._get_store().write(table, _columns(table, values))
            except Exception as exc:
                self.write_errors += 1
                self._drop(table, n, f"{table}: {type(exc).__name__}: {exc}")
                continue
            self.written[table] = self.written.get(table, 0) + n
            total += n
        return total

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


def _columns(table: str, values: Mapping[str, list[Any]]) -> Any:
    """``values`` (column name -> list) as an Arrow table of the table's schema (no type inference)."""
    import pyarrow as pa

    from rankscope.datasets.store.schemas import table as spec_of

    spec = spec_of(table)
    return pa.Table.from_arrays([pa.array(values[f.name], type=f.type) for f in spec.schema], schema=spec.schema)
