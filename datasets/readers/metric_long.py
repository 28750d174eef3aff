"""The long form of metric files (CSV/Parquet ``ts, node, metric, value[, gpu, labels...]``), chunk by chunk.

Used by :mod:`.metric_files` (see its docstring for the layout of a chunk). The machine column may be
``node``, ``Hostname`` (dcgm-exporter), ``hostname``, ``instance`` or the user's ``--node-label``;
``ts`` is epoch seconds, milliseconds, microseconds or nanoseconds (told apart by magnitude), a timestamp
or an ISO string; a ``labels`` column holding JSON objects (the store's) is expanded into columns.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rankscope.datasets.domain.bounds import epoch_range, limits
from rankscope.spine import ParseError

MACHINE_LABELS: tuple[str, ...] = ("node", "Hostname", "hostname", "instance")
"""Columns/labels that name the machine, in order of preference (after a user-chosen ``node_label``)."""
CHUNK_ROWS = 1 << 20
_NOT_LABELS = frozenset({"ts", "value", "metric", "gpu"})


def machine_column(path: Path, columns: Sequence[str], node_label: str | None) -> str:
    """The column (or label) that names the machine; a ParseError naming the choices when there is none."""
    if node_label:
        if node_label not in columns:
            shown = ", ".join(c for c in columns if c not in ("ts", "metric", "value")) or "none"
            raise ParseError(path, f"--node-label {node_label!r} is not a column or label here (labels: {shown})")
        return node_label
    for c in MACHINE_LABELS:
        if c in columns:
            return c
    raise ParseError(
        path,
        f"no machine column: need one of {', '.join(MACHINE_LABELS)} or a --node-label (columns: {', '.join(columns)})",
    )


def long_columns(path: Path) -> list[str]:
    low = path.name.lower()
    try:
        if low.endswith((".parquet", ".pq")):
            import pyarrow.parquet as pq

            return list(pq.read_schema(path).names)
        import polars as pl

        return list(pl.read_csv(path, n_rows=1, infer_schema=False).columns)
    except Exception as exc:  # pyarrow and polars raise their own error kinds for a broken file
        kind = "Parquet" if low.endswith((".parquet", ".pq")) else "CSV"
        raise ParseError(path, f"unreadable {kind} ({str(exc).splitlines()[0][:200] if str(exc) else exc})") from None


def long_chunks(path: Path, node_label: str | None) -> Iterator[pa.Table]:
    low = path.name.lower()
    scale = TsScale()
    try:
        if low.endswith((".parquet", ".pq")):
            yield from _parquet_chunks(path, node_label, scale)
            return
        from rankscope.datasets.readers.tables import read_csv_typed

        table = read_csv_typed(path).to_arrow()
    except ParseError:
        raise
    except Exception as exc:
        kind = "Parquet" if low.endswith((".parquet", ".pq")) else "CSV"
        raise ParseError(path, f"unreadable {kind} ({str(exc).splitlines()[0][:200] if str(exc) else exc})") from None
    for off in range(0, table.num_rows, CHUNK_ROWS):
        yield conform_long(path, table.slice(off, CHUNK_ROWS), node_label, scale)


def _parquet_chunks(path: Path, node_label: str | None, scale: TsScale) -> Iterator[pa.Table]:
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    pf = pq.ParquetFile(path, read_dictionary=strings)
    mcol = machine_column(path, schema.names, node_label)
    skip = {"job"} if "job" in schema.names else set()  # one job per store partition: no information
    cols = [c for c in schema.names if c not in skip or c == mcol]
    meta = pf.metadata
    small = all(meta.row_group(i).num_rows <= 4 * CHUNK_ROWS for i in range(meta.num_row_groups))
    if small:
        for i in range(meta.num_row_groups):
            yield conform_long(path, pf.read_row_group(i, columns=cols), node_label, scale)
    else:
        for batch in pf.iter_batches(batch_size=CHUNK_ROWS, columns=cols):
            yield conform_long(path, pa.Table.from_batches([batch]), node_label, scale)


class TsScale:
    """Seconds per unit of a numeric ``ts`` column, decided once per file from its first values."""

    def __init__(self) -> None:
        self.factor: float | None = None

    def seconds(self, ts: np.ndarray) -> np.ndarray:
        if self.factor is None:
            head = np.abs(ts[:10_000])
            head = head[np.isfinite(head)]
            med = float(np.median(head)) if head.size else 0.0
            self.factor = 1e-9 if med > 1e17 else 1e-6 if med > 1e14 else 1e-3 if med > 1e11 else 1.0
        return ts if self.factor == 1.0 else ts * self.factor


def _ts_seconds(path: Path, col: pa.ChunkedArray, scale: TsScale) -> np.ndarray:
    t = col.type
    if pa.types.is_dictionary(t):
        col = col.cast(t.value_type)
        t = col.type
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        if pa.types.is_date(t):
            col = col.cast(pa.timestamp("s"))
            t = col.type
        per = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[t.unit]
        raw = col.cast(pa.int64()).to_numpy()
        out = raw.astype(np.float64) * per
    elif pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        out = scale.seconds(col.cast(pa.float64()).to_numpy())
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        out = _parse_time_strings(path, col, scale)
    else:
        raise ParseError(path, f"column 'ts' must hold seconds or timestamps, not {t}")
    if col.null_count:
        raise ParseError(path, f"column 'ts' has {col.null_count} empty value(s)")
    lo, hi = epoch_range()  # before anything is sized by the time range (a year-1 sample: a 2 TiB cube)
    bad = ~((out >= lo) & (out < hi))
    if bad.any():
        lim = limits()
        raise ParseError(
            path,
            f"column 'ts' has {int(bad.sum())} time(s) outside the years {lim.min_year}-{lim.max_year} "
            f"(limits.min_year/max_year), e.g. {float(out[bad][0])!r} s since the epoch",
        )
    return out


def _parse_time_strings(path: Path, col: pa.ChunkedArray, scale: TsScale) -> np.ndarray:
    import polars as pl

    s = pl.Series(col.cast(pa.string()))
    num = s.cast(pl.Float64, strict=False)
    if num.null_count() == s.null_count():
        return scale.seconds(num.to_numpy())
    parsed = s.str.to_datetime(time_zone="UTC", strict=False)
    bad = parsed.is_null() & s.is_not_null()
    if bad.any():
        raise ParseError(
            path,
            f"column 'ts' has a value that is neither seconds nor a timestamp: {s.filter(bad)[0]!r} "
            f"(first of {int(bad.sum())})",
        )
    return np.asarray(parsed.dt.epoch("us").cast(pl.Float64).to_numpy() / 1e6)


def _values(path: Path, col: pa.ChunkedArray) -> np.ndarray:
    t = col.type
    if pa.types.is_dictionary(t):
        col = col.cast(t.value_type)
        t = col.type
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return np.asarray(col.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    if pa.types.is_null(t):
        return np.full(len(col), np.nan)
    text = pc.utf8_trim_whitespace(col.cast(pa.string()))
    try:
        return np.asarray(text.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        import polars as pl

        s = pl.Series(text)
        num = s.str.replace(r"^\+", "").cast(pl.Float64, strict=False)
        bad = num.is_null() & s.is_not_null()
        if bad.any():
            raise ParseError(
                path, f"column 'value' has a non-numeric value {s.filter(bad)[0]!r} (first of {int(bad.sum())})"
            ) from None
        return np.asarray(num.fill_null(float("nan")).to_numpy(), dtype=np.float64)


def as_dictionary(col: pa.ChunkedArray | pa.Array) -> pa.DictionaryArray:
    """A column as one dictionary-encoded string array (nulls kept)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type):
        if not (pa.types.is_string(arr.type.value_type) or pa.types.is_large_string(arr.type.value_type)):
            arr = pa.DictionaryArray.from_arrays(arr.indices, arr.dictionary.cast(pa.string()))
        return arr
    if pa.types.is_null(arr.type):
        return pa.DictionaryArray.from_arrays(pa.nulls(len(arr), pa.int32()), pa.array([], pa.string()))
    enc = pc.dictionary_encode(arr)
    if not pa.types.is_string(enc.type.value_type):
        enc = pa.DictionaryArray.from_arrays(enc.indices, enc.dictionary.cast(pa.string()))
    return enc


def strip_port(arr: pa.DictionaryArray) -> pa.DictionaryArray:
    """``host:9100`` -> ``host``; ``[::1]:9100`` -> ``::1``; anything else unchanged (on the dictionary only)."""
    d = arr.dictionary.cast(pa.string())
    d = pc.replace_substring_regex(d, r"^\[(.*)\]:\d+$", r"\1")
    d = pc.replace_substring_regex(d, r"^([^:\[\]]+):\d+$", r"\1")
    return pa.DictionaryArray.from_arrays(arr.indices, d)


def conform_long(path: Path, table: pa.Table, node_label: str | None, scale: TsScale) -> pa.Table:
    """One chunk of a long-form table in the common layout (module docstring)."""
    names = table.column_names
    missing = [c for c in ("ts", "metric", "value") if c not in names]
    if missing:
        raise ParseError(path, f"not a long-form metrics file: missing column(s) {missing}")
    mcol = machine_column(path, names, node_label)
    node = as_dictionary(table.column(mcol))
    if mcol == "instance":
        node = strip_port(node)
    metric = as_dictionary(table.column("metric"))
    for label, arr in (("machine column " + repr(mcol), node), ("column 'metric'", metric)):
        if arr.null_count:
            raise ParseError(path, f"{label} has {arr.null_count} empty value(s)")
    n = table.num_rows
    gpu = _gpu_labels(table.column("gpu")) if "gpu" in names else as_dictionary(pa.nulls(n))
    cols: dict[str, Any] = {
        "ts": _ts_seconds(path, table.column("ts"), scale),
        "value": _values(path, table.column("value")),
        "node": node,
        "metric": metric,
        "gpu": gpu,
    }
    for c in names:
        if c in _NOT_LABELS or c == mcol:
            continue
        if c == "labels":
            cols.update(_json_labels(table.column(c)))
        elif c == "node":
            cols["node_column"] = as_dictionary(table.column(c))
        else:
            cols[c] = as_dictionary(table.column(c))
    return pa.table(cols)


def _gpu_labels(col: pa.ChunkedArray) -> pa.DictionaryArray:
    """The ``gpu`` column as labels; small non-negative integers (GPU indices) without hashing."""
    arr = col.combine_chunks()
    if pa.types.is_integer(arr.type) and len(arr):
        top = pc.max(arr).as_py()
        low = pc.min(arr).as_py()
        if top is not None and low is not None and low >= 0 and top < 4096:
            return pa.DictionaryArray.from_arrays(arr.cast(pa.int32()), pa.array([str(i) for i in range(top + 1)]))
    return as_dictionary(arr)


def _json_labels(col: pa.ChunkedArray) -> dict[str, pa.DictionaryArray]:
    """A column of JSON objects (the store's ``labels``) as one dictionary column per key."""
    import json

    arr = as_dictionary(col)
    if arr.null_count == len(arr):
        return {}
    parsed = []
    for text in arr.dictionary.to_pylist():
        try:
            obj = json.loads(text) if text else {}
        except ValueError:
            obj = {}
        parsed.append(obj if isinstance(obj, dict) else {})
    keys = sorted({k for obj in parsed for k in obj})
    out = {}
    for k in keys:
        values = pa.array([None if k not in obj else str(obj[k]) for obj in parsed], pa.string())
        out[k] = as_dictionary(pc.take(values, arr.indices))
    return out
