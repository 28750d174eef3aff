"""Many small Prometheus scrape files read as one: the way a scrape directory usually looks.

A scrape saved every 15-30 s per machine is thousands of files of a few hundred lines each (64 machines for
20 minutes: 2,560 files). Read one by one, each file pays the vectorised reader's fixed cost (some forty
small frame operations, about 15 ms) and the stream's per-chunk cost: 40 s for that directory. Here a run of
such files is parsed as one frame with a ``_file`` column, in the same steps as :mod:`.prometheus` (one
expression splits the lines, labels are cut out per label-key signature), and what is per file (its scrape
time, its machine, its notes, its duplicate check) is done per ``_file`` group.

Only the plain case is taken: every file readable UTF-8 text with samples, well-formed ``# TYPE`` lines and
values, sample timestamps on all of a file's lines or on none, no series twice in a file, and one machine
label for the whole run (a node_exporter file without one is named from its path, as one by one). Anything
else returns None and the caller reads the run file by file, so errors and notes name the same file with
the same words as before (:func:`.metric_files.iter_chunks`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from rankscope.datasets.domain.bounds import read_bounded
from rankscope.datasets.readers.metric_long import MACHINE_LABELS
from rankscope.datasets.readers.prometheus import (
    SAMPLE,
    as_chunk,
    instance_host,
    label_columns,
    machine_from_name,
    path_named_note,
    scrape_time,
    type_declarations,
)
from rankscope.spine import RankscopeError

BATCH_FILES = 512
BATCH_BYTES = 64 << 20
SMALL_FILE = 4 << 20  # larger files go one by one: the vectorised reader's fixed cost is nothing beside them


def read_exposition_batch(
    paths: list[Path], *, node_label: str | None = None
) -> tuple[pa.Table, dict[str, str], list[str]] | None:
    """The samples of every file in ``paths`` as one chunk (with the declared types, later files' declarations
    winning, and each file's notes), or None when one of them is not the plain case (module docstring)."""
    import polars as pl

    texts: list[str] = []
    for p in paths:
        try:
            text = read_bounded(p).decode("utf-8")
        except (RankscopeError, UnicodeDecodeError):
            return None
        if not text.strip() or "\x1f" in text:
            return None
        texts.append(text)
    lines = (
        pl.DataFrame({"_file": pl.Series(range(len(paths)), dtype=pl.UInt32), "line": texts})
        .with_columns(pl.col("line").str.split("\n"))
        .explode("line")
        .with_columns(pl.col("line").str.strip_chars())
        .filter(pl.col("line") != "")
    )
    types = _types(lines)
    if types is None:
        return None
    parsed = _samples(lines)
    if parsed is None:
        return None
    notes: list[str] = []
    parsed = _times(parsed, paths, notes)
    if parsed is None:
        return None
    frame = label_columns(parsed)
    key = [c for c in frame.columns if c not in ("value", "_row")]
    if frame.select(key).is_duplicated().any():  # a series twice in one file: one by one says which
        return None
    out = _machines(frame, paths, node_label, notes)
    if out is None:
        return None
    return out, types, notes


def _types(lines: Any) -> dict[str, str] | None:
    types, bad = type_declarations(lines)
    return None if bad is not None else types


def _samples(lines: Any) -> Any:
    import polars as pl

    samples = lines.filter(~pl.col("line").str.starts_with("#"))
    parsed = samples.select("_file", pl.col("line").str.extract_groups(SAMPLE).alias("g")).unnest("g")
    if parsed.select("_file").n_unique() < lines.select("_file").n_unique():
        return None  # a file with no sample
    if parsed["name"].null_count():
        return None
    value = pl.col("value").str.replace(r"^\+", "").cast(pl.Float64, strict=False)
    parsed = parsed.with_columns(value.alias("v"), (pl.col("ts").cast(pl.Float64, strict=False) / 1e3).alias("t"))
    if parsed["v"].null_count():
        return None
    return parsed.select(
        "_file", pl.col("t").alias("ts"), pl.col("name").alias("metric"), pl.col("v").alias("value"), "labels"
    ).with_row_index("_row")


def _times(parsed: Any, paths: list[Path], notes: list[str]) -> Any:
    """Each file's samples stamped, or its scrape time (from its name, else its mtime) on every sample."""
    import polars as pl

    per = parsed.group_by("_file").agg(pl.len().alias("n"), pl.col("ts").null_count().alias("nulls"))
    if per.filter((pl.col("nulls") > 0) & (pl.col("nulls") < pl.col("n"))).height:
        return None  # some stamped, some not: one by one says which file
    unstamped = per.filter(pl.col("nulls") == pl.col("n"))
    if unstamped.height == 0:
        return parsed
    file_notes: list[str] = []
    ids = sorted(unstamped["_file"].to_list())
    when = [scrape_time(paths[i], 0, file_notes) for i in ids]
    notes.extend(file_notes)
    scrape = pl.DataFrame({"_file": pl.Series(ids, dtype=pl.UInt32), "_scrape": when})
    return (
        parsed.join(scrape, on="_file", how="left")
        .with_columns(pl.coalesce("ts", "_scrape").alias("ts"))
        .drop("_scrape")
    )


def _machines(frame: Any, paths: list[Path], node_label: str | None, notes: list[str]) -> pa.Table | None:
    """The chunk, with each file's machine as :func:`.prometheus.assign_machine` picks it."""
    import polars as pl

    labels = [c for c in (node_label,) if c] or [c for c in MACHINE_LABELS if c in frame.columns]
    present = [c for c in labels if c in frame.columns]
    has = frame.group_by("_file").agg(*[pl.col(c).is_not_null().any().alias(c) for c in present]) if present else None
    chosen: dict[int, str | None] = dict.fromkeys(range(len(paths)))
    if has is not None:
        for row in has.iter_rows(named=True):
            chosen[row["_file"]] = next((c for c in present if row[c]), None)
    mcols = {c for c in chosen.values() if c is not None}
    if len(mcols) > 1 or (node_label and None in chosen.values()):
        return None  # files that name their machine by different labels, or a --node-label some lack
    mcol = next(iter(mcols), None)
    unnamed = sorted(i for i, c in chosen.items() if c is None)
    names = {i: machine_from_name(paths[i]) for i in unnamed}
    for i in unnamed:
        notes.append(path_named_note(paths[i], names[i]))
    node = pl.lit(None, pl.Utf8)
    if mcol is not None:
        frame = _fill_within_file(frame, mcol, [i for i, c in chosen.items() if c == mcol], paths, notes)
        node = pl.col(mcol).cast(pl.Utf8)
        if mcol == "instance":
            node = instance_host(node)
    if names:
        by_file = pl.DataFrame({"_file": pl.Series(list(names), dtype=pl.UInt32), "_name": list(names.values())})
        frame = frame.join(by_file, on="_file", how="left")
        node = pl.coalesce(node, pl.col("_name"))
    frame = frame.with_columns(node.alias("_node"))
    drop = [c for c in ("_name",) if c in frame.columns] + ([mcol] if mcol not in (None, "instance") else [])
    frame = frame.drop(drop)
    if "node" in frame.columns:
        frame = frame.rename({"node": "node_column"})
    return as_chunk(frame.rename({"_node": "node"}).sort("_row").drop("_file", "_row"))  # in the files' order


def _fill_within_file(frame: Any, mcol: str, files: list[int], paths: list[Path], notes: list[str]) -> Any:
    """Samples of a file without the machine label: its one machine's (dcgm-exporter labels ``Hostname``,
    node_exporter lines beside it do not), or skipped when the file holds several machines."""
    import polars as pl

    mine = frame.filter(pl.col("_file").is_in(files))
    per = (
        mine.group_by("_file")
        .agg(
            pl.col(mcol).null_count().alias("missing"),
            pl.col(mcol).drop_nulls().n_unique().alias("machines"),
            pl.col(mcol).drop_nulls().first().alias("one"),
            pl.col("metric").filter(pl.col(mcol).is_null()).first().alias("example"),
        )
        .filter(pl.col("missing") > 0)
        .sort("_file")
    )
    if per.height == 0:
        return frame
    fill = per.filter(pl.col("machines") == 1)
    for i, one in zip(fill["_file"].to_list(), fill["one"].to_list()):
        notes.append(f"{paths[i].name}: samples without the {mcol!r} label belong to the file's one machine {one!r}")
    skip = per.filter(pl.col("machines") != 1)
    for i, n, ex in zip(skip["_file"].to_list(), skip["missing"].to_list(), skip["example"].to_list()):
        notes.append(f"{paths[i].name}: {n} sample(s) without the {mcol!r} label skipped (e.g. {ex})")
    if fill.height:
        ones = fill.select("_file", pl.col("one").alias("_one"))
        frame = (
            frame.join(ones, on="_file", how="left").with_columns(pl.coalesce(mcol, "_one").alias(mcol)).drop("_one")
        )
    if skip.height:
        frame = frame.filter(~(pl.col("_file").is_in(skip["_file"].to_list()) & pl.col(mcol).is_null()))
    return frame
