"""Metric files as operators export them, read chunk by chunk into one long layout.

Formats (per file, from its content when ``fmt="auto"``; :func:`sniff_metric_file`):

- ``long``: CSV/Parquet with ``ts, node, metric, value[, gpu, labels...]`` (rankscope's store and its
  earlier input); the machine column may also be ``Hostname`` (dcgm-exporter), ``hostname``,
  ``instance`` (``10.0.0.7:9100`` -> ``10.0.0.7``) or the user's ``--node-label``. ``ts`` is epoch
  seconds, milliseconds, microseconds or nanoseconds (told apart by magnitude), a timestamp or an ISO
  string. Every other column is a label; a ``labels`` column holding JSON objects (the store's) is
  expanded into one column per key.
- ``prometheus-text`` and ``prometheus-json``: see :mod:`.prometheus`.

A chunk is a pyarrow Table: ``ts`` (float64 epoch seconds), ``value`` (float64, NaN kept), ``node``,
``metric``, ``gpu`` and every label as dictionary-encoded strings (nullable). Parquet is read one row
group at a time with only the needed columns and strings as dictionaries, so memory stays bounded by a
chunk whatever the file size. Bad input raises :class:`~rankscope.spine.ParseError` naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rankscope.datasets.domain.metrics import METRIC_FORMATS, MetricSet
from rankscope.spine import InputError, ParseError

MACHINE_LABELS: tuple[str, ...] = ("node", "Hostname", "hostname", "instance")
"""Columns/labels that name the machine, in order of preference (after a user-chosen ``node_label``)."""
LONG_SUFFIXES = (".csv", ".csv.gz", ".parquet", ".pq")
TEXT_SUFFIXES = (".prom", ".txt", ".metrics", ".openmetrics")
CHUNK_ROWS = 1 << 20
_NOT_LABELS = frozenset({"ts", "value", "metric", "gpu"})


def sniff_metric_file(path: Path, head: bytes | None = None) -> str:
    """The format of one metric file from its name and first bytes; a ParseError when nothing fits."""
    name = path.name.lower()
    if name.endswith((".parquet", ".pq", ".gz")):
        return "long"
    if head is None:
        try:
            with open(path, "rb") as fh:
                head = fh.read(4096)
        except OSError as exc:
            raise ParseError(path, f"cannot read ({exc.strerror or exc})") from None
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff").lstrip()
    if text.startswith("{"):
        if '"resultType"' in text or '"status"' in text:
            return "prometheus-json"
        raise ParseError(path, "JSON but not a Prometheus query result (no data.resultType)")
    from rankscope.datasets.readers.prometheus import looks_like_exposition

    if looks_like_exposition(head):
        return "prometheus-text"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if name.endswith(LONG_SUFFIXES) or "," in first:
        return "long"
    raise ParseError(path, f"neither CSV/Parquet long form nor Prometheus text/JSON (first line {first[:60]!r})")


def find_metric_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Metric files under ``directory``: long form named ``metrics*``, Prometheus text (``*.prom``,
    ``*.metrics``, or ``*.txt`` that parses as exposition text) and query results (JSON holding ``resultType``)."""
    root = Path(directory)
    out: list[Path] = []
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.name.startswith("."):
            continue
        low = p.name.lower()
        if low.endswith(LONG_SUFFIXES):
            if low.startswith("metrics"):
                out.append(p)
            continue
        if not low.endswith((*TEXT_SUFFIXES, ".json")):
            continue
        try:
            with open(p, "rb") as fh:
                head = fh.read(4096)
        except OSError:
            continue
        from rankscope.datasets.readers.prometheus import looks_like_exposition

        if b'"resultType"' in head or looks_like_exposition(head):
            out.append(p)
    return out


def open_metrics(
    source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    node_label: str | None = None,
    fmt: str = "auto",
) -> MetricSet:
    """A :class:`MetricSet` over a directory, a file or a list of files; each file's format is checked
    now (a cheap look at its head or schema), its samples are read when the set is streamed."""
    if fmt not in METRIC_FORMATS:
        raise InputError(f"--metric-format {fmt!r} is not one of {', '.join(METRIC_FORMATS)}")
    if isinstance(source, (str, os.PathLike)):
        src = Path(source)
        if src.is_dir():
            paths = find_metric_files(src)
            if not paths:
                raise InputError(f"{src}: no metric files (metrics*.csv|parquet, *.prom, query-result *.json)")
        elif src.is_file():
            paths = [src]
        else:
            raise InputError(f"{src}: no such file or directory")
    else:
        paths = [Path(p) for p in source]
    return MetricSet(
        tuple((p, sniff_metric_file(p) if fmt == "auto" else fmt) for p in paths), node_label=node_label or None
    )


def check_metric_file(path: Path, fmt: str, node_label: str | None) -> None:
    """Raise a ParseError now when a file cannot be metrics (wrong columns, unreadable), before streaming."""
    if fmt != "long":
        return
    columns = _long_columns(path)
    missing = [c for c in ("ts", "metric", "value") if c not in columns]
    if missing:
        raise ParseError(
            path,
            f"not a long-form metrics file: missing column(s) {missing} (required: ts, node, metric, value; "
            "optional: gpu and labels)",
        )
    machine_column(path, columns, node_label)


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


def iter_chunks(ms: MetricSet) -> Iterator[tuple[pa.Table, dict[str, str], list[str]]]:
    """Every sample of ``ms`` as chunks in the long layout (see the module docstring), each with the
    ``# TYPE`` declarations and the notes of the file it came from (empty for the long form)."""
    if ms.frame is not None and ms.frame.height:
        table = ms.frame.to_arrow()
        scale = _TsScale()
        for off in range(0, table.num_rows, CHUNK_ROWS):
            yield conform_long(Path("metrics"), table.slice(off, CHUNK_ROWS), ms.node_label, scale), {}, []
    for path, fmt in ms.files:
        if fmt == "long":
            for chunk in _long_chunks(path, ms.node_label):
                yield chunk, {}, []
        else:
            from rankscope.datasets.readers.prometheus import read_exposition, read_query_result

            read = read_exposition if fmt == "prometheus-text" else read_query_result
            yield read(path, node_label=ms.node_label)


def size_hint(ms: MetricSet) -> tuple[int, float, float] | None:
    """(rows, first and last time in seconds) of a set of Parquet files, from their metadata (no data
    read); None when some input is not Parquet or its statistics do not say."""
    if not ms.files or ms.frame is not None:
        return None
    import pyarrow.parquet as pq

    rows, lo, hi = 0, np.inf, -np.inf
    for path, fmt in ms.files:
        if fmt != "long" or not path.name.lower().endswith((".parquet", ".pq")):
            return None
        try:
            meta = pq.read_metadata(path)
            j = meta.schema.names.index("ts")
            field = meta.schema.to_arrow_schema().field("ts")
        except (OSError, ValueError, pa.ArrowException):
            return None
        rows += meta.num_rows
        for i in range(meta.num_row_groups):
            stats = meta.row_group(i).column(j).statistics
            if stats is None or not stats.has_min_max:
                return None
            pair = np.array([_stat_seconds(stats.min, field.type), _stat_seconds(stats.max, field.type)], float)
            if pa.types.is_integer(field.type) or pa.types.is_floating(field.type):
                pair = _TsScale().seconds(pair)
            if not np.isfinite(pair).all():
                return None
            lo, hi = min(lo, float(pair[0])), max(hi, float(pair[1]))
    return rows, lo, hi


def _stat_seconds(v: Any, t: pa.DataType) -> float:
    if hasattr(v, "timestamp"):  # a datetime from a timestamp column's statistics
        return float(v.timestamp())
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


# -- the long form ---------------------------------------------------------------------------------


def _long_columns(path: Path) -> list[str]:
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


def _long_chunks(path: Path, node_label: str | None) -> Iterator[pa.Table]:
    low = path.name.lower()
    scale = _TsScale()
    try:
        if low.endswith((".parquet", ".pq")):
            yield from _parquet_chunks(path, node_label, scale)
            return
        import polars as pl

        table = pl.read_csv(path, infer_schema_length=10000).to_arrow()
    except ParseError:
        raise
    except Exception as exc:
        kind = "Parquet" if low.endswith((".parquet", ".pq")) else "CSV"
        raise ParseError(path, f"unreadable {kind} ({str(exc).splitlines()[0][:200] if str(exc) else exc})") from None
    for off in range(0, table.num_rows, CHUNK_ROWS):
        yield conform_long(path, table.slice(off, CHUNK_ROWS), node_label, scale)


def _parquet_chunks(path: Path, node_label: str | None, scale: _TsScale) -> Iterator[pa.Table]:
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


class _TsScale:
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


def _ts_seconds(path: Path, col: pa.ChunkedArray, scale: _TsScale) -> np.ndarray:
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
    return out


def _parse_time_strings(path: Path, col: pa.ChunkedArray, scale: _TsScale) -> np.ndarray:
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


def conform_long(path: Path, table: pa.Table, node_label: str | None, scale: _TsScale) -> pa.Table:
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


def metric_frame(ms: MetricSet | Any) -> Any:
    """Every sample of ``ms`` as one polars frame: ``ts`` (float epoch seconds), ``node``, ``metric``,
    ``value``, ``gpu`` and the labels (strings). For reports and small inputs: it holds every row."""
    import polars as pl

    if not isinstance(ms, MetricSet):
        return ms
    frames = [pl.from_arrow(t) for t, _, _ in iter_chunks(ms) if t.num_rows]
    if not frames:
        return pl.DataFrame(schema={"ts": pl.Float64, "node": pl.Utf8, "metric": pl.Utf8, "value": pl.Float64})
    out = pl.concat([f for f in frames if isinstance(f, pl.DataFrame)], how="diagonal_relaxed")
    return out.with_columns([pl.col(c).cast(pl.Utf8) for c in out.columns if c not in ("ts", "value")])


def store_frame(ms: MetricSet | Any) -> Any:
    """``ms`` in the store's ``metrics`` layout: ``ts`` a UTC timestamp, ``gpu`` an integer where it is
    one, every other label in the JSON ``labels`` column."""
    import polars as pl

    df = metric_frame(ms)
    if not isinstance(ms, MetricSet):
        return df
    core = {"ts", "node", "metric", "value", "gpu", "rank", "pid"}
    extra = [c for c in df.columns if c not in core]
    cols = [
        (pl.col("ts") * 1e6).cast(pl.Int64).cast(pl.Datetime("us", "UTC")).alias("ts"),
        pl.col("node"),
        pl.col("metric"),
        pl.col("value"),
        (pl.col("gpu").cast(pl.Int32, strict=False) if "gpu" in df.columns else pl.lit(None, pl.Int32)).alias("gpu"),
    ]
    if extra:
        cols.append(pl.struct(extra).struct.json_encode().alias("labels"))
    return df.select(cols)
