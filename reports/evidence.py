"""What a report needs beyond the verdict: plain tables the caller assembles from the loaded evidence.

The verdict (its JSON form, ``Verdict.to_dict()``) carries the decision, the clusters, the prefix
tree, the fail-slow rounds and the crash exits. Figures that look at raw evidence take it here, as
polars frames with documented columns, so the renderer never reads dumps, stores or Parquet itself:

=============== ============================================================ ===========================
table           required columns (optional)                                  figure
=============== ============================================================ ===========================
``topology``    rank, node (tp, cp, ep, dp, pp)                              rank grid
``timings``     rank, step, duration_s (op)                                  step-time heatmap
``fr_progress`` rank, pg, last_enqueued, last_started, last_completed        Flight Recorder wavefront
                (pg_desc)
``metric_bands``unit, metric, ts, value, peer_median, peer_q25, peer_q75      metrics vs peers
                (node, n_peers)
``exits``       rank, after_s, cause (node, kind, message)                   crash time line
=============== ============================================================ ===========================

Each table may be given as a polars DataFrame or a list of records (dicts). Missing tables mean
"no such evidence": the figure is left out. :func:`save_case` / :func:`load_case` keep a verdict and
its evidence in one directory (``verdict.json`` + one Parquet file per table).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import IO, Any

import polars as pl

from rankscope.reports.errors import ReportInputError
from rankscope.spine import InputError, atomic_write, atomic_write_with

SCHEMAS: dict[str, tuple[dict[str, type[pl.DataType]], dict[str, type[pl.DataType]]]] = {
    # table: (required columns, optional columns) -> the dtype each is cast to
    "topology": (
        {"rank": pl.Int64, "node": pl.String},
        {"tp": pl.Int64, "cp": pl.Int64, "ep": pl.Int64, "dp": pl.Int64, "pp": pl.Int64},
    ),
    "timings": ({"rank": pl.Int64, "step": pl.Int64, "duration_s": pl.Float64}, {"op": pl.String}),
    "fr_progress": (
        {
            "rank": pl.Int64,
            "pg": pl.String,
            "last_enqueued": pl.Int64,
            "last_started": pl.Int64,
            "last_completed": pl.Int64,
        },
        {"pg_desc": pl.String},
    ),
    "metric_bands": (
        {
            "unit": pl.String,
            "metric": pl.String,
            "ts": pl.Float64,
            "value": pl.Float64,
            "peer_median": pl.Float64,
            "peer_q25": pl.Float64,
            "peer_q75": pl.Float64,
        },
        {"node": pl.String, "n_peers": pl.Int64},
    ),
    "exits": (
        {"rank": pl.Int64, "after_s": pl.Float64, "cause": pl.String},
        {"node": pl.String, "kind": pl.String, "message": pl.String},
    ),
}
EXAMPLES = {
    "topology": "rank=0, node='node-0', tp=0, pp=0, dp=0",
    "timings": "rank=0, step=12, duration_s=1.84, op='step'",
    "fr_progress": "rank=3, pg='0', pg_desc='default_pg', last_enqueued=5, last_started=5, last_completed=5",
    "metric_bands": "unit='node-7/gpu0', metric='DCGM_FI_DEV_SM_CLOCK', ts=1785251997.0, value=1410.0, "
    "peer_median=1980.0, peer_q25=1965.0, peer_q75=1995.0",
    "exits": "rank=6, after_s=0.0, cause='primary', node='node-3', kind='RuntimeError', message='...'",
}


def as_table(name: str, data: pl.DataFrame | Sequence[Mapping[str, Any]] | None) -> pl.DataFrame | None:
    """``data`` as a polars frame with the columns and dtypes of table ``name``, or None when absent/empty."""
    if data is None:
        return None
    required, optional = SCHEMAS[name]
    if not isinstance(data, pl.DataFrame):
        try:
            data = pl.DataFrame(list(data), infer_schema_length=None)
        except (TypeError, ValueError, pl.exceptions.PolarsError) as exc:
            raise ReportInputError(
                f"evidence.{name}: not a table of records ({exc}); expected rows like {EXAMPLES[name]}"
            ) from None
    if data.height == 0:
        return None
    missing = [c for c in required if c not in data.columns]
    if missing:
        raise ReportInputError(
            f"evidence.{name}: missing column(s) {', '.join(missing)} (have "
            f"{', '.join(data.columns[:12])}); expected rows like {EXAMPLES[name]}"
        )
    cols = []
    for col, dtype in {**required, **optional}.items():
        if col not in data.columns:
            continue
        try:
            cols.append(data[col].cast(dtype, strict=True))
        except pl.exceptions.PolarsError:
            bad = data[col].cast(dtype, strict=False).is_null() & data[col].is_not_null()
            example = data[col].filter(bad).head(1).to_list()
            raise ReportInputError(
                f"evidence.{name}: column {col} holds {example[0]!r:.60}, not {dtype.__name__}"
            ) from None
    return pl.DataFrame(cols)


@dataclass(frozen=True, kw_only=True)
class ReportEvidence:
    """The evidence tables a report draws beyond the verdict; any may be None (figure left out)."""

    topology: pl.DataFrame | None = None
    timings: pl.DataFrame | None = None
    fr_progress: pl.DataFrame | None = None
    metric_bands: pl.DataFrame | None = None
    exits: pl.DataFrame | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, as_table(f.name, getattr(self, f.name)))
        topo = self.topology
        if topo is not None:
            ranks = topo["rank"]
            if ranks.is_duplicated().any():
                dup = ranks.filter(ranks.is_duplicated()).head(1).item()
                raise ReportInputError(f"evidence.topology: rank {dup} appears twice")
            low = int(ranks.min())  # type: ignore[arg-type]
            if low < 0:
                raise ReportInputError(f"evidence.topology: negative rank {low}")

    def tables(self) -> dict[str, pl.DataFrame]:
        """The tables present, by name."""
        return {f.name: t for f in fields(self) if (t := getattr(self, f.name)) is not None}


def save_case(directory: str | os.PathLike[str], verdict: Mapping[str, Any], evidence: ReportEvidence | None) -> Path:
    """Write ``verdict.json`` and one Parquet file per evidence table under ``directory`` (atomically)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write(root / "verdict.json", json.dumps(verdict, indent=1, ensure_ascii=False))
    for name in SCHEMAS:
        (root / f"{name}.parquet").unlink(missing_ok=True)
    for name, table in (evidence.tables() if evidence else {}).items():
        atomic_write_with(root / f"{name}.parquet", partial(_write_parquet, table))
    return root


def _write_parquet(table: pl.DataFrame, fh: IO[bytes]) -> None:
    table.write_parquet(fh, compression="zstd", compression_level=19)


def load_verdict(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A verdict JSON file (``rankscope diagnose --format json``), checked for the fields a report needs."""
    from rankscope.datasets.domain.bounds import load_json_file

    p = Path(path)
    try:
        verdict = load_json_file(p, what="verdict JSON")  # a regular file, within the size and depth limits
    except InputError as exc:
        raise ReportInputError(f"{p}: not a readable verdict JSON ({str(exc).removeprefix(f'{p}: ')})") from None
    if not isinstance(verdict, dict) or not isinstance(verdict.get("verdict"), str):
        raise ReportInputError(
            f"{p}: not a verdict (expected an object with a 'verdict' field, as "
            "`rankscope diagnose --format json` prints)"
        )
    return verdict


def load_case(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], ReportEvidence]:
    """The verdict and evidence :func:`save_case` wrote."""
    root = Path(directory)
    verdict = load_verdict(root / "verdict.json")
    tables: dict[str, pl.DataFrame] = {}
    for name in SCHEMAS:
        f = root / f"{name}.parquet"
        if f.exists():
            try:
                tables[name] = pl.read_parquet(f)
            except (OSError, pl.exceptions.PolarsError) as exc:
                raise ReportInputError(f"{f}: unreadable Parquet ({str(exc).splitlines()[0]})") from None
    return verdict, ReportEvidence(**tables)
