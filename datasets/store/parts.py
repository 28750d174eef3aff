"""Writing one part file of a table: rows conformed to the declared schema, then an atomic Parquet write."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rankscope.datasets.store.schemas import TableSpec
from rankscope.spine import InputError, atomic_write_with

_PART_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def conform(rows: Rows, spec: TableSpec) -> pa.Table:
    """``rows`` as an Arrow table with exactly ``spec``'s schema (missing nullable columns are null)."""
    pl = sys.modules.get("polars")
    if pl is not None and isinstance(rows, pl.DataFrame):
        rows = rows.to_arrow()
    if not isinstance(rows, pa.Table):
        try:
            rows = pa.Table.from_pylist(list(rows)) if rows else spec.schema.empty_table()
        except (OverflowError, pa.ArrowException) as exc:  # a value no Arrow column holds (an int over 64 bits)
            raise InputError(f"table {spec.name}: a value cannot be stored ({exc})") from None
    n = rows.num_rows
    columns = []
    for field in spec.schema:
        if field.name in rows.column_names:
            col = rows.column(field.name)
            try:
                col = col.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OverflowError) as exc:
                raise InputError(
                    f"table {spec.name}: column {field.name!r} cannot be stored as {field.type} ({exc})"
                ) from None
        elif field.nullable:
            col = pa.nulls(n, field.type)
        else:
            raise InputError(f"table {spec.name}: required column {field.name!r} is missing")
        if not field.nullable and col.null_count:
            raise InputError(f"table {spec.name}: column {field.name!r} has {col.null_count} null values")
        columns.append(col)
    extra = set(rows.column_names) - set(spec.schema.names)
    if extra:
        raise InputError(f"table {spec.name}: unknown columns {sorted(extra)}; valid: {spec.schema.names}")
    return pa.Table.from_arrays(columns, schema=spec.schema)


def atomic_write_parquet(tbl: pa.Table, path: Path) -> None:
    """Write ``tbl`` to ``path`` so that ``path`` either does not exist or is complete (zstd, fsynced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, lambda fh: pq.write_table(tbl, fh, compression="zstd"))


Rows = Any  # a pyarrow Table, a polars DataFrame, or a sequence of row mappings
