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
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rankscope.datasets.store import MARKER, is_store
from rankscope.datasets.store.parts import (
    _PART_VALUE,
    Rows,
    atomic_write_parquet,
    conform,
)
from rankscope.datasets.store.schemas import TABLES, TableSpec, table
from rankscope.spine import InputError, StoreError, atomic_write, progress, remove_stale_temps

FORMAT_VERSION = 1

# polars is imported lazily: the node agent writes through this module and must stay small.


class Store:
    """A store rooted at a directory. ``Store(path, create=True)`` makes a new one if needed."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False) -> None:
        self.root = Path(root)
        marker = self.root / MARKER
        if not marker.exists():
            if not create:
                raise StoreError(f"{self.root}: not a rankscope store (no {MARKER})")
            self.root.mkdir(parents=True, exist_ok=True)
            atomic_write(
                marker, json.dumps({"format": "rankscope-store", "version": FORMAT_VERSION}) + "\n", durable=False
            )
        try:
            meta = json.loads(marker.read_text())
            version = int(meta["version"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"{marker}: unreadable store marker ({exc})") from None
        if version > FORMAT_VERSION:
            raise StoreError(f"{marker}: store format {version} is newer than this rankscope ({FORMAT_VERSION})")
        self._checked: dict[Path, tuple[int, int]] = {}
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
                remove_stale_temps(subdir)
                self._swept.add(subdir)
            atomic_write_parquet(part, path)
            written.append(path)
        return written

    @staticmethod
    def _partitions(spec: TableSpec, tbl: pa.Table) -> Iterable[tuple[tuple[str, ...], pa.Table]]:
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
    def files(self, name: str, *, job: str | None = None) -> list[Path]:
        """The complete Parquet files of table ``name`` (optionally of one job), checked readable."""
        spec = table(name)
        base = self.root / spec.name
        if job is not None and "job" in spec.partition_by:
            base = base / f"job={job}"
        if not base.is_dir():
            return []
        paths = sorted(base.rglob("part-*.parquet"))
        for path in progress(paths, f"checking {spec.name} files"):
            self._check(path)
        return paths

    def _check(self, path: Path) -> None:
        try:
            st = path.stat()
        except OSError as exc:
            raise StoreError(f"{path}: unreadable ({exc.strerror})") from None
        sig = (st.st_size, st.st_mtime_ns)
        if self._checked.get(path) == sig:
            return
        try:
            pq.read_metadata(path)
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(f"{path}: corrupt or truncated Parquet file ({exc})") from None
        self._checked[path] = sig

    def scan(self, name: str, *, job: str | None = None) -> Any:
        """Table ``name`` as a polars LazyFrame (empty, with the schema, when nothing was written)."""
        import polars as pl

        spec = table(name)
        paths = self.files(name, job=job)
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
        except pl.exceptions.PolarsError as exc:
            raise StoreError(f"{self.root / name}: unreadable table ({exc})") from None

    def read_arrow(self, name: str, *, job: str | None = None) -> pa.Table:
        """Table ``name`` as one Arrow table with the declared schema."""
        spec = table(name)
        parts = []
        for path in progress(self.files(name, job=job), f"reading {spec.name}"):
            try:
                parts.append(conform(pq.read_table(path), spec))
            except (OSError, pa.ArrowException) as exc:
                raise StoreError(f"{path}: corrupt or truncated Parquet file ({exc})") from None
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
                paths = self.files(name)
                if paths:
                    files = ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths)
                    con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet([{files}], union_by_name=true)")
                else:
                    con.register(name, spec.schema.empty_table())
            rel = con.sql(query)
            if rel is None:  # a statement without a result
                return pl.DataFrame()
            return pl.from_arrow(rel.to_arrow_table())
        except duckdb.Error as exc:
            raise InputError(f"SQL over {self.root}: {' '.join(str(exc).split())}") from None
        finally:
            con.close()
