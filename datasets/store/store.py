"""The rankscope store: a directory of append-only, partitioned Parquet tables.

Layout::

    ROOT/rankscope-store.json                     marker + format version
    ROOT/<table>/job=<job>/part-<utc>-<uuid>.parquet

Every write goes to a hidden temporary file in the same directory, is fsynced, then renamed into
place (``rankscope.spine.atomic_write_with``), so a reader (or a ``kill -9`` of the writer) never sees a
partial file: readers only look at ``part-*.parquet``; temp files a killed writer left are removed
(after an hour) by the next write to that partition. Files are never rewritten. Tables are read lazily with
polars (:meth:`Store.scan`) or queried with DuckDB (:meth:`Store.sql`), where every table is a view.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rankscope.datasets.domain.bounds import check_regular, load_json_file, to_int
from rankscope.datasets.store import MARKER, is_store
from rankscope.datasets.store.parts import (
    _PART_VALUE,
    Rows,
    atomic_write_parquet,
    conform,
)
from rankscope.datasets.store.schemas import TABLES, TableSpec, table
from rankscope.spine import InputError, StoreError, atomic_write, progress, remove_stale_temps


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def _why(exc: BaseException, path: Path) -> str:
    text = _one_line(exc)
    return text[len(str(path)) + 2 :] if text.startswith(f"{path}: ") else text


FORMAT_VERSION = 1

# polars is imported lazily: the node agent writes through this module and must stay small.


class Store:
    """A store rooted at a directory. ``Store(path, create=True)`` makes a new one if needed."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False, skip_bad: bool = False) -> None:
        """``skip_bad``: a corrupt or foreign part file is left out of every read (and remembered in
        :attr:`skipped`) instead of being the error; a table whose every file is bad is still the error."""
        self.root = Path(root)
        self.skip_bad = skip_bad
        marker = self.root / MARKER
        if not marker.exists():
            if not create:
                raise StoreError(f"{self.root}: not a rankscope store (no {MARKER})")
            self.root.mkdir(parents=True, exist_ok=True)
            atomic_write(
                marker, json.dumps({"format": "rankscope-store", "version": FORMAT_VERSION}) + "\n", durable=False
            )
        try:
            meta = load_json_file(marker, what="store marker")
        except InputError as exc:  # not a regular file, too big, too deep, not JSON
            raise StoreError(f"{marker}: unreadable store marker ({_why(exc, marker)})") from None
        version = to_int(meta.get("version"), lo=0) if isinstance(meta, dict) else None
        if version is None:
            raise StoreError(f"{marker}: unreadable store marker (no integer 'version')")
        if version > FORMAT_VERSION:
            raise StoreError(f"{marker}: store format {version} is newer than this rankscope ({FORMAT_VERSION})")
        self._checked: dict[Path, tuple[int, int]] = {}
        self.skipped: dict[Path, str] = {}  # corrupt or foreign files left out of every read, and why
        self._swept: set[Path] = set()  # partition directories cleared of temp files killed writers left

    @staticmethod
    def is_store(path: str | os.PathLike[str]) -> bool:
        """True when ``path`` is the root of a rankscope store."""
        return is_store(path)

    # -- writing -----------------------------------------------------------------------------
    def write(self, name: str, rows: Rows) -> list[Path]:
        """Append ``rows`` to table ``name``; returns the files written (one per partition)."""
        spec = table(name)
        tbl = conform(rows, spec)
        if tbl.num_rows == 0:
            return []
        written = []
        for key, part in self._partitions(spec, tbl):
            subdir = self.root / spec.name
            for col, value in zip(spec.partition_by, key):
                subdir = subdir / f"{col}={value}"
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            path = subdir / f"part-{stamp}-{uuid.uuid4().hex[:12]}.parquet"
            if subdir not in self._swept:
                self._sweep(self.root / spec.name)  # every partition of the table: a killed writer's other jobs too
                remove_stale_temps(subdir)
                self._swept.add(subdir)
            atomic_write_parquet(part, path)
            written.append(path)
        return written

    def _sweep(self, table_dir: Path) -> None:
        """Remove the temp files killed writers left in any partition of a table (once per store object)."""
        if table_dir in self._swept:
            return
        self._swept.add(table_dir)
        for dirpath, dirnames, _ in os.walk(table_dir):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            remove_stale_temps(dirpath)

    @staticmethod
    def _partitions(spec: TableSpec, tbl: pa.Table) -> Iterable[tuple[tuple[str, ...], pa.Table]]:
        if not spec.partition_by:  # a store-wide table (batch_runs): one file under ROOT/<table>/
            yield (), tbl
            return
        cols = [tbl.column(c).to_pylist() for c in spec.partition_by]
        keys = list(zip(*cols))
        for key in dict.fromkeys(keys):
            for col, value in zip(spec.partition_by, key):
                if not _PART_VALUE.match(str(value)):
                    raise InputError(
                        f"table {spec.name}: {col}={value!r} cannot name a partition "
                        "(use letters, digits, '.', '_' or '-', e.g. 'llama-70b.run3')"
                    )
            if len(dict.fromkeys(keys)) == 1:
                yield tuple(map(str, key)), tbl
                return
            mask = pa.array([k == key for k in keys])
            yield tuple(map(str, key)), tbl.filter(mask)

    # -- reading -----------------------------------------------------------------------------
    def files(self, name: str, *, job: str | None = None, skip_bad: bool | None = None) -> list[Path]:
        """The complete Parquet files of table ``name`` (optionally of one job), checked to be regular files,
        readable and of this table's schema. A bad file is a :class:`StoreError` naming the file and the table,
        or, with ``skip_bad`` (default: the store's), left out and remembered in :attr:`skipped`: the rest of
        the store stays usable, and its readers say what was left out."""
        skip = self.skip_bad if skip_bad is None else skip_bad
        spec = table(name)
        base = self.root / spec.name
        if job is not None and "job" in spec.partition_by:
            base = base / f"job={job}"
        if not base.is_dir():
            return []
        good = []
        for path in progress(sorted(base.rglob("part-*.parquet")), f"checking {spec.name} files"):
            try:
                self._check(path, spec)
            except StoreError as exc:
                if not skip:
                    raise
                self.skipped[path] = str(exc)
                continue
            good.append(path)
        return good

    def _check(self, path: Path, spec: TableSpec) -> None:
        try:
            size = check_regular(path)  # no FIFO, device or oversized file is handed to Arrow
            sig = (size, path.stat().st_mtime_ns)
        except (InputError, OSError) as exc:
            raise StoreError(f"{path}: table {spec.name}: {_why(exc, path)}") from None
        if self._checked.get(path) == sig:
            return
        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(
                f"{path}: table {spec.name}: corrupt or truncated Parquet file ({_one_line(exc)})"
            ) from None
        foreign = [c for c in schema.names if c not in spec.schema.names]
        missing = [f.name for f in spec.schema if not f.nullable and f.name not in schema.names]
        if foreign or missing:
            what = f"columns {', '.join(foreign[:4])} are not in it" if foreign else f"no {', '.join(missing)} column"
            raise StoreError(f"{path}: table {spec.name}: not a {spec.name} file ({what}; another table's file?)")
        self._checked[path] = sig

    def skipped_in(self, name: str, job: str | None = None) -> list[str]:
        """Why each file of table ``name`` (of ``job``) was left out (see :meth:`files`)."""
        base = self.root / table(name).name
        if job is not None:
            base = base / f"job={job}"
        return [why for p, why in self.skipped.items() if p.is_relative_to(base)]

    def _usable(self, name: str, job: str | None) -> list[Path]:
        """The table's good files; when every file of it is bad, that is the error (one line naming one)."""
        paths = self.files(name, job=job)
        bad = self.skipped_in(name, job)
        if not paths and bad:
            raise StoreError(bad[0] + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
        return paths

    def scan(self, name: str, *, job: str | None = None) -> Any:
        """Table ``name`` as a polars LazyFrame (empty, with the schema, when nothing was written)."""
        import polars as pl

        spec = table(name)
        paths = self._usable(name, job)
        if not paths:
            return pl.from_arrow(spec.schema.empty_table()).lazy()  # type: ignore[union-attr]
        lf = pl.scan_parquet(paths, missing_columns="insert", extra_columns="ignore")
        if job is not None and "job" in spec.schema.names:
            lf = lf.filter(pl.col("job") == job)
        return lf

    def read(self, name: str, *, job: str | None = None) -> Any:
        """Table ``name`` as a polars DataFrame; a corrupt file is reported by name."""
        import polars as pl

        try:
            return self.scan(name, job=job).collect()
        except (pl.exceptions.PolarsError, pl.exceptions.PanicException, OSError) as exc:  # a panic too
            raise StoreError(f"{self.root / name}: table {name}: unreadable ({_one_line(exc)})") from None

    def read_arrow(self, name: str, *, job: str | None = None) -> pa.Table:
        """Table ``name`` as one Arrow table with the declared schema."""
        spec = table(name)
        parts = []
        for path in progress(self._usable(name, job), f"reading {spec.name}"):
            try:
                parts.append(conform(pq.read_table(path), spec))
            except (OSError, pa.ArrowException, InputError) as exc:  # like a file that fails the check
                why = f"{path}: table {spec.name}: corrupt Parquet file ({_one_line(exc)})"
                if not self.skip_bad:
                    raise StoreError(why) from None
                self.skipped[path] = why
        if not parts and self.skipped_in(name, job):
            raise StoreError(self.skipped_in(name, job)[0])
        tbl = pa.concat_tables(parts) if parts else spec.schema.empty_table()
        if job is not None:
            import pyarrow.compute as pc  # not at import: the node agent writes through this module

            tbl = tbl.filter(pc.equal(tbl.column("job"), job))
        return tbl

    def jobs(self, name: str = "stacks") -> list[str]:
        """The jobs that have rows in table ``name``."""
        base = self.root / table(name).name
        if not base.is_dir():
            return []
        return sorted(p.name.split("=", 1)[1] for p in base.glob("job=*") if any(p.rglob("part-*.parquet")))

    def sql(self, query: str) -> Any:
        """Run DuckDB SQL over the store (a polars DataFrame). Every table is a view, with its declared
        columns even when nothing was written to it yet."""
        import duckdb
        import polars as pl

        con = duckdb.connect()
        try:
            for name, spec in TABLES.items():
                paths = self.files(name, skip_bad=True)  # a bad file of one table leaves the others usable
                if paths:
                    files = ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths)
                    con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet([{files}], union_by_name=true)")
                else:
                    con.register(name, spec.schema.empty_table())
            for name in TABLES:  # a query on a table with a bad file says so, the other tables stay usable
                bad = self.skipped_in(name)
                if bad and re.search(rf"\b{name}\b", query, re.I):
                    raise StoreError(bad[0] + " (left out of every read; move it away)")
            rel = con.sql(query)
            if rel is None:  # a statement without a result
                return pl.DataFrame()
            return pl.from_arrow(rel.to_arrow_table())
        except duckdb.Error as exc:
            raise InputError(f"SQL over {self.root}: {' '.join(str(exc).split())}") from None
        finally:
            con.close()
