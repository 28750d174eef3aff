"""Loaders for the public data sets in ``../shared/data`` (see each folder's README for provenance).

- ``alibaba_pai_minibatch`` (CC BY 4.0): per-worker mini-batch times of real PAI jobs, returned as
  timings (``rank`` = worker, ``step`` = iteration, ``op`` = ``minibatch``, ``duration_s`` = the
  **normalised** 0-1000 time: only ratios between workers mean anything).
- ``asd`` (MIT, InterFusion): 12 servers x 19 metrics, train/test split, point labels.
- ``jumpstarter`` (MIT): Dataset2/Dataset3, 30 services x 19 raw metrics each, point labels.

The folder is found from ``RANKSCOPE_SHARED_DATA``, else ``../shared/data`` next to the checkout;
a missing folder is an :class:`InputError` that says where it looked.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from rankscope.spine import InputError, ParseError

ENV = "RANKSCOPE_SHARED_DATA"


def data_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The shared data folder; an InputError when it is absent."""
    candidates = (
        [Path(root)]
        if root is not None
        else (
            [Path(os.environ[ENV])]
            if os.environ.get(ENV)
            else [Path(__file__).resolve().parents[2] / "shared" / "data", Path.cwd().parent / "shared" / "data"]
        )
    )
    for c in candidates:
        if c.is_dir():
            return c
    raise InputError(
        f"public data folder not found (looked in {', '.join(map(str, candidates))}); "
        f"set {ENV} to the folder that holds alibaba_pai_minibatch/, asd/, jumpstarter/"
    )


def _folder(name: str, root: str | os.PathLike[str] | None) -> Path:
    path = data_root(root) / name
    if not path.is_dir():
        raise InputError(f"{path}: public data set {name!r} is absent")
    return path


@dataclass(frozen=True, eq=False)
class Entity:
    """One machine/service of a labelled data set: train and test matrices (time x metrics), test labels."""

    name: str
    train: np.ndarray
    test: np.ndarray
    labels: np.ndarray
    metrics: tuple[str, ...]


def load_alibaba_job(job: int = 1, *, root: str | os.PathLike[str] | None = None) -> pl.DataFrame:
    """Job ``job`` (1-4) of the PAI mini-batch trace as timings (normalised durations)."""
    path = _folder("alibaba_pai_minibatch", root) / f"job_{job}_norm.csv"
    if not path.is_file():
        raise InputError(f"{path}: no such job (jobs 1-4 exist)")
    try:
        df = pl.read_csv(path)
        out = df.select(
            pl.col("worker").cast(pl.Int32).alias("rank"),
            pl.col("time").cast(pl.Int64).alias("step"),
            pl.lit("minibatch").alias("op"),
            pl.col("batch_time_norm").cast(pl.Float64).alias("duration_s"),
            ("worker-" + pl.col("worker").cast(pl.Utf8)).alias("node"),
        )
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise ParseError(path, f"unexpected format ({exc})") from None
    return out.sort("step", "rank")


def _entity(train_path: Path, test_path: Path, name: str) -> Entity:
    for p in (train_path, test_path):
        if not p.is_file():
            raise InputError(f"{p}: missing file of entity {name!r}")
    try:
        tr, te = pl.read_parquet(train_path), pl.read_parquet(test_path)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise ParseError(test_path, f"unreadable Parquet ({exc})") from None
    metrics = tuple(c for c in tr.columns if re.fullmatch(r"m\d+", c))
    if "label" not in te.columns or not metrics:
        raise ParseError(test_path, "expected columns m01..mNN and a label column")
    return Entity(
        name,
        tr.select(metrics).to_numpy().astype(np.float64),
        te.select(metrics).to_numpy().astype(np.float64),
        te["label"].to_numpy().astype(np.int8),
        metrics,
    )


def asd_entities(*, root: str | os.PathLike[str] | None = None) -> list[str]:
    """Names of the ASD servers (``omi-1`` ..), in numeric order."""
    folder = _folder("asd", root) / "data"
    names = {p.name.rsplit("_", 1)[0] for p in folder.glob("omi-*_test.parquet")}
    return sorted(names, key=lambda n: int(n.split("-")[1]))


def load_asd(entity: str, *, root: str | os.PathLike[str] | None = None) -> Entity:
    """One ASD server: 30 days train, 15 days test, 5-minute samples, min-max normalised metrics."""
    folder = _folder("asd", root) / "data"
    return _entity(folder / f"{entity}_train.parquet", folder / f"{entity}_test.parquet", entity)


def jumpstarter_services(dataset: int = 2, *, root: str | os.PathLike[str] | None = None) -> list[str]:
    """Service names of JumpStarter Dataset ``dataset`` (2 or 3)."""
    folder = _folder("jumpstarter", root) / f"Dataset{dataset}"
    if not folder.is_dir():
        raise InputError(f"{folder}: no such JumpStarter dataset (2 and 3 exist)")
    names = {p.name.rsplit("_", 1)[0] for p in folder.glob("service*_test.parquet")}
    return sorted(names, key=lambda n: int(n.removeprefix("service")))


def load_jumpstarter(dataset: int, service: str, *, root: str | os.PathLike[str] | None = None) -> Entity:
    """One JumpStarter service: raw (not normalised) metrics, 20 days train, 25 days test."""
    folder = _folder("jumpstarter", root) / f"Dataset{dataset}"
    return _entity(folder / f"{service}_train.parquet", folder / f"{service}_test.parquet", f"D{dataset}/{service}")
