"""Read long-form metrics and per-rank timings from CSV or Parquet files in a directory.

Files whose names start with ``metrics`` hold ``ts, node, metric, value[, gpu]``; files whose names
start with ``timings`` hold ``rank, step, op, duration_s[, start_s, node, tp, pp, dp]`` (what Megatron
timers, per-op traces and the hook's ``log_step`` produce). A bad file is a :class:`ParseError`
naming the file and the problem.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from rankscope.datasets.domain.bounds import check_regular, epoch_range, limits
from rankscope.datasets.readers.sniff import LINES_SUFFIXES, TABLE_SUFFIXES
from rankscope.spine import InputError, ParseError

METRIC_COLUMNS = {"ts": None, "node": pl.Utf8, "metric": pl.Utf8, "value": pl.Float64}
METRIC_OPTIONAL = {"gpu": pl.Int32, "rank": pl.Int32, "job": pl.Utf8}
TIMING_COLUMNS = {"rank": pl.Int32, "step": pl.Int64, "op": pl.Utf8, "duration_s": pl.Float64}
TIMING_OPTIONAL = {
    "start_s": pl.Float64,
    "node": pl.Utf8,
    "tp": pl.Int32,
    "pp": pl.Int32,
    "dp": pl.Int32,
    "cp": pl.Int32,
    "ep": pl.Int32,
    "job": pl.Utf8,
}


def _find(directory: str | os.PathLike[str], prefix: str, suffixes: tuple[str, ...] = TABLE_SUFFIXES) -> list[Path]:
    root = Path(directory)
    if not root.is_dir():
        raise InputError(f"{root}: not a directory")
    return sorted(
        p
        for p in root.rglob(f"{prefix}*")
        if p.is_file() and p.name.lower().endswith(suffixes) and not p.name.startswith(".")
    )


def find_metric_files(directory: str | os.PathLike[str]) -> list[Path]:
    """CSV/Parquet files under ``directory`` whose names start with ``metrics``."""
    return _find(directory, "metrics")


def find_timing_files(directory: str | os.PathLike[str]) -> list[Path]:
    """CSV/Parquet/JSON Lines files under ``directory`` whose names start with ``timings``."""
    return _find(directory, "timings", TABLE_SUFFIXES + LINES_SUFFIXES)


MEASURED = ("value", "duration_s", "start_s")
"""Columns that hold measurements: floats, though a file's first thousands of rows may all be whole numbers (a
long-form metrics file written metric by metric: utilisation and clocks, then power)."""


def read_csv_typed(path: Path, **kwargs: Any) -> pl.DataFrame:
    """A CSV with :data:`MEASURED` columns read as floats and the others' types guessed from the first 10,000 rows,
    else, when a later row does not fit the guess (whole numbers, then text), from every row."""
    floats = dict.fromkeys(MEASURED, pl.Float64)
    try:
        return pl.read_csv(path, infer_schema_length=10000, schema_overrides=floats, **kwargs)
    except pl.exceptions.ComputeError:
        return pl.read_csv(path, infer_schema_length=None, schema_overrides=floats, **kwargs)


def _read_lines(path: Path) -> pl.DataFrame:
    """A JSON Lines file; a last line cut short (a job killed while it wrote) is left out, any other bad line
    refuses the file."""
    try:
        return pl.read_ndjson(path, infer_schema_length=None)
    except pl.exceptions.ComputeError:
        lines = path.read_bytes().splitlines()
        while lines and not lines[-1].strip():
            lines.pop()
        if len(lines) < 2:
            raise
        return pl.read_ndjson(io.BytesIO(b"\n".join(lines[:-1])), infer_schema_length=None)


def _load(path: Path) -> pl.DataFrame:
    check_regular(path)  # never hand a FIFO, a device or an oversized file to polars
    try:
        if path.name.lower().endswith((".parquet", ".pq")):
            return pl.read_parquet(path)
        if path.name.lower().endswith(LINES_SUFFIXES):  # every row's keys and types, not the first rows'
            df = _read_lines(path)
            return df.with_columns(pl.col(c).cast(pl.Float64, strict=False) for c in MEASURED if c in df.columns)
        return read_csv_typed(path, try_parse_dates=True)
    except (pl.exceptions.PolarsError, OSError, ValueError, pl.exceptions.PanicException) as exc:  # a panic too
        why = " ".join(str(exc).split())[:200]
        fmt = (
            "Parquet"
            if "parquet" in path.suffix
            else "JSON Lines"
            if path.name.lower().endswith(LINES_SUFFIXES)
            else "CSV"
        )
        raise ParseError(path, f"unreadable {fmt} ({why})") from None


def _conform(
    path: Path, df: pl.DataFrame, required: dict[str, Any], optional: dict[str, Any], kind: str
) -> pl.DataFrame:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ParseError(path, f"not a {kind} file: missing column(s) {missing} (required: {', '.join(required)})")
    cols = []
    for name, dtype in {**required, **optional}.items():
        if name not in df.columns:
            continue
        if dtype is None:
            cols.append(pl.col(name))
            continue
        bad = df.filter(pl.col(name).is_not_null() & pl.col(name).cast(dtype, strict=False).is_null())
        if bad.height:
            raise ParseError(path, f"column {name!r} has a non-{dtype} value {bad[name][0]!r} (first of {bad.height})")
        cols.append(pl.col(name).cast(dtype))
    out = df.select(cols)
    for name in required:
        nulls = out[name].null_count()
        if nulls:
            raise ParseError(path, f"column {name!r} has {nulls} empty value(s)")
    return out


def _timestamp(path: Path, df: pl.DataFrame) -> pl.DataFrame:
    ts = df["ts"]
    if ts.dtype == pl.Utf8:
        parsed = ts.str.to_datetime(time_zone="UTC", strict=False)
        if parsed.null_count() > ts.null_count():
            first = ts.filter(parsed.is_null() & ts.is_not_null())[0]  # the first value that did not parse
            raise ParseError(path, f"column 'ts' has a value that is neither seconds nor a timestamp: {first[:60]!r}")
        return df.with_columns(parsed.alias("ts"))
    if ts.dtype.is_temporal():
        if ts.dtype == pl.Date:
            return df.with_columns(pl.col("ts").cast(pl.Datetime("us", "UTC")))
        tz = getattr(ts.dtype, "time_zone", None)
        col = pl.col("ts").dt.cast_time_unit("us")
        col = col.dt.convert_time_zone("UTC") if tz else col.dt.replace_time_zone("UTC")
        return df.with_columns(col)
    if ts.dtype.is_numeric():
        lo, hi = epoch_range()
        bad = df.filter(~pl.col("ts").cast(pl.Float64).is_between(lo, hi, closed="left"))
        if bad.height:
            raise ParseError(path, f"column 'ts' has {bad.height} value(s) outside {_years()}, e.g. {bad['ts'][0]!r}")
        return df.with_columns((pl.col("ts").cast(pl.Float64) * 1e6).cast(pl.Int64).cast(pl.Datetime("us", "UTC")))
    raise ParseError(path, f"column 'ts' must hold seconds or timestamps, not {ts.dtype}")


def _years() -> str:
    return f"the years {limits().min_year}-{limits().max_year} (limits.min_year/max_year)"


def _check_years(path: Path, ts: pl.Series) -> None:
    """Timestamps in the years the limits allow, before anything sizes an array by the time range."""
    lo, hi = (datetime.fromtimestamp(t, timezone.utc) for t in epoch_range())
    bad = ts.filter(~ts.is_between(lo, hi, closed="left"))
    if bad.len():
        raise ParseError(
            path, f"column 'ts' has {bad.len()} timestamp(s) outside {_years()}, e.g. {bad.cast(pl.Utf8)[0]}"
        )


def _check_finite(path: Path, df: pl.DataFrame) -> None:
    """Durations and start times are finite numbers; ranks within limits.max_world_size."""
    for name in ("duration_s", "start_s"):
        if name in df.columns and df.filter(~pl.col(name).is_finite()).height:
            raise ParseError(path, f"column {name!r} has infinite or NaN values")
    if df.filter(pl.col("rank") >= limits().max_world_size).height:
        raise ParseError(path, f"column 'rank' has a rank over limits.max_world_size ({limits().max_world_size:,})")


def read_metrics(paths: Iterable[str | os.PathLike[str]]) -> pl.DataFrame:
    """Long-form metrics from ``paths``: ``ts`` (UTC timestamp), ``node``, ``metric``, ``value`` [, ``gpu``]."""
    frames = []
    for p in map(Path, paths):
        df = _conform(p, _load(p), METRIC_COLUMNS, METRIC_OPTIONAL, "metrics")
        df = _timestamp(p, df)
        if df["ts"].null_count():
            raise ParseError(p, f"column 'ts' has {df['ts'].null_count()} empty value(s)")
        _check_years(p, df["ts"])
        frames.append(df)
    if not frames:
        return pl.DataFrame(
            schema={"ts": pl.Datetime("us", "UTC"), "node": pl.Utf8, "metric": pl.Utf8, "value": pl.Float64}
        )
    return pl.concat(frames, how="diagonal_relaxed")


def read_timings(paths: Iterable[str | os.PathLike[str]]) -> pl.DataFrame:
    """Per-rank timings from ``paths``: ``rank, step, op, duration_s`` [, ``start_s, node, tp, pp, dp``]."""
    frames = []
    for p in map(Path, paths):
        df = _conform(p, _load(p), TIMING_COLUMNS, TIMING_OPTIONAL, "timings")
        neg = df.filter(pl.col("duration_s") < 0)
        if neg.height:
            raise ParseError(p, f"column 'duration_s' has {neg.height} negative value(s), e.g. {neg['duration_s'][0]}")
        if df.filter(pl.col("rank") < 0).height:
            raise ParseError(p, "column 'rank' has negative values")
        _check_finite(p, df)
        frames.append(df)
    if not frames:
        return pl.DataFrame(schema=dict(TIMING_COLUMNS))
    return pl.concat(frames, how="diagonal_relaxed")
