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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rankscope.datasets.domain.bounds import check_regular, read_bounded
from rankscope.datasets.domain.metrics import METRIC_FORMATS, MetricSet
from rankscope.datasets.readers.metric_long import (
    CHUNK_ROWS,
    TsScale,
    conform_long,
    long_chunks,
    long_columns,
    machine_column,
)
from rankscope.datasets.readers.sniff import TABLE_SUFFIXES
from rankscope.spine import InputError, ParseError

TEXT_SUFFIXES = (".prom", ".txt", ".metrics", ".openmetrics")


def sniff_metric_file(path: Path, head: bytes | None = None) -> str:
    """The format of one metric file from its name and first bytes; a ParseError when nothing fits."""
    name = path.name.lower()
    if name.endswith((".parquet", ".pq", ".gz")):
        return "long"
    if head is None:
        head = read_bounded(path, head=4096)  # a regular file (no FIFO or device), or a ParseError naming it
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff").lstrip()
    if text.startswith("{"):
        if '"resultType"' in text or '"status"' in text:
            return "prometheus-json"
        raise ParseError(path, "JSON but not a Prometheus query result (no data.resultType)")
    from rankscope.datasets.readers.prometheus import looks_like_exposition

    if looks_like_exposition(head):
        return "prometheus-text"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if name.endswith(TABLE_SUFFIXES) or "," in first:
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
        if low.endswith(TABLE_SUFFIXES):
            if low.startswith("metrics"):
                out.append(p)
            continue
        if not low.endswith((*TEXT_SUFFIXES, ".json")):
            continue
        try:
            head = read_bounded(p, head=4096)
        except InputError:  # a FIFO, a device, unreadable: not metrics
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
    check_regular(path)  # a FIFO, a device or a file over limits.max_file_bytes is never handed to a reader
    if fmt != "long":
        return
    columns = long_columns(path)
    missing = [c for c in ("ts", "metric", "value") if c not in columns]
    if missing:
        raise ParseError(
            path,
            f"not a long-form metrics file: missing column(s) {missing} (required: ts, node, metric, value; "
            "optional: gpu and labels)",
        )
    machine_column(path, columns, node_label)


def iter_chunks(ms: MetricSet) -> Iterator[tuple[pa.Table, dict[str, str], list[str]]]:
    """Every sample of ``ms`` as chunks in the long layout (see the module docstring), each with the
    ``# TYPE`` declarations and the notes of the file it came from (empty for the long form)."""
    if ms.frame is not None and ms.frame.height:
        table = ms.frame.to_arrow()
        scale = TsScale()
        for off in range(0, table.num_rows, CHUNK_ROWS):
            yield conform_long(Path("metrics"), table.slice(off, CHUNK_ROWS), ms.node_label, scale), {}, []
    failed: list[InputError] = []
    for run in _scrape_runs(ms.files):
        yield from _run_chunks(run, ms, failed)
    if failed and len(failed) == len(ms.files) and (ms.frame is None or not ms.frame.height):
        raise failed[0]


_BISECT_MIN = 16
"""A run of scrape files the batch reader refuses is halved down to this many files before they are read one by
one: a truncated file among 2,560 costs a few batch attempts, not the whole run file by file (16 s against 3 s)."""


def _run_chunks(
    run: list[tuple[Path, str]], ms: MetricSet, failed: list[InputError]
) -> Iterator[tuple[pa.Table, dict[str, str], list[str]]]:
    """A run of small scrape files read as one, else its halves, else file by file (in order, so the samples,
    types and notes are those of reading every file alone)."""
    if len(run) > 1:  # small scrape files: read as one, unless one of them is not the plain case
        from rankscope.datasets.readers.prometheus_batch import read_exposition_batch

        chunk = read_exposition_batch([p for p, _ in run], node_label=ms.node_label)
        if chunk is not None:
            yield chunk
            return
        if len(run) >= 2 * _BISECT_MIN:
            half = len(run) // 2
            yield from _run_chunks(run[:half], ms, failed)
            yield from _run_chunks(run[half:], ms, failed)
            return
    for path, fmt in run:
        try:
            yield from _file_chunks(path, fmt, ms.node_label)
        except InputError as exc:  # one bad file (cut mid-line, an interrupted copy) loses only itself
            if len(ms.files) == 1 and ms.frame is None:
                raise
            failed.append(exc)
            yield _EMPTY, {}, [f"{exc}: skipped (the other metric files are read)"]


def _scrape_runs(files: Iterable[tuple[Path, str]]) -> Iterator[list[tuple[Path, str]]]:
    """``files`` in order, consecutive small Prometheus text files grouped (up to
    :data:`~.prometheus_batch.BATCH_FILES` files and ``BATCH_BYTES`` bytes), every other file alone."""
    from rankscope.datasets.readers.prometheus_batch import BATCH_BYTES, BATCH_FILES, SMALL_FILE

    run: list[tuple[Path, str]] = []
    size = 0
    for path, fmt in files:
        try:
            n = os.stat(path).st_size if fmt == "prometheus-text" else -1
        except OSError:
            n = -1
        if not 0 < n <= SMALL_FILE:
            if run:
                yield run
                run, size = [], 0
            yield [(path, fmt)]
            continue
        if run and (len(run) >= BATCH_FILES or size + n > BATCH_BYTES):
            yield run
            run, size = [], 0
        run.append((path, fmt))
        size += n
    if run:
        yield run


def _file_chunks(path: Path, fmt: str, node_label: str | None) -> Iterator[tuple[pa.Table, dict[str, str], list[str]]]:
    check_regular(path)  # still a regular file when it is streamed
    if fmt == "long":
        for chunk in long_chunks(path, node_label):
            yield chunk, {}, []
    else:
        from rankscope.datasets.readers.prometheus import read_exposition, read_query_result

        read = read_exposition if fmt == "prometheus-text" else read_query_result
        yield read(path, node_label=node_label)


_EMPTY = pa.table({"ts": pa.array([], pa.float64())})
"""A chunk with no rows: carries a skipped file's note (the stream skips empty chunks after their notes)."""


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
                pair = TsScale().seconds(pair)
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
