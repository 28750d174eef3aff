"""Metrics as evidence: where the samples are (:class:`MetricSet`) and the binned cube the detectors read
(:class:`MetricCube`).

A :class:`MetricSet` does not hold the samples of a large job in memory: it names the files (or holds a
small in-memory frame, e.g. a store table or a test's), the format of each, the label that names the
machine, the metric types a Prometheus exposition declared, and the notes the readers made. The
readers (:mod:`rankscope.datasets.readers.metric_files`) stream it chunk by chunk into a
:class:`MetricCube`, one value per unit, time block and feature (:mod:`rankscope.datasets.readers.metric_binning`).

A *unit* is a GPU (``node``, ``gpu``) for per-GPU series and a machine for the others; a *feature* is a
metric, split by any label that distinguishes several series of one metric on one unit
(``node_network_receive_bytes_total{device="ib0"}``). Counters are per-second rates, gauges block means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from rankscope.datasets.domain.counters import Kind

METRIC_FORMATS = ("auto", "long", "prometheus-text", "prometheus-json")
"""``auto`` decides per file from its content; the others force a format."""


@dataclass(frozen=True)
class MetricSet:
    """Metric samples of one job: files to stream (each with its format) and/or an in-memory frame.

    ``frame`` is a polars DataFrame in long form (``ts, node, metric, value[, gpu, labels...]``) or None;
    ``types`` the ``# TYPE`` declarations found so far (metric family -> counter/gauge/...).
    """

    files: tuple[tuple[Path, str], ...] = ()
    frame: Any = None
    node_label: str | None = None
    types: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    after_s: float = float("-inf")  # samples at or before this time (epoch seconds) are skipped when streamed

    @property
    def empty(self) -> bool:
        return not self.files and (self.frame is None or self.frame.height == 0)

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(p for p, _ in self.files)

    def after(self, t: float) -> MetricSet:
        """The same set, keeping only samples after ``t`` (epoch seconds): e.g. the job as it runs since its
        last restart."""
        return replace(self, after_s=max(self.after_s, float(t)))

    def with_notes(self, notes: Sequence[str]) -> MetricSet:
        return replace(self, notes=tuple(self.notes) + tuple(notes))


@dataclass(frozen=True, eq=False)
class LevelCube:
    """One level's values: ``values`` is ``(n_units, n_blocks, n_features)`` float32, NaN where no sample."""

    level: str  # "gpu" | "node"
    values: np.ndarray
    unit_machine: np.ndarray  # (n_units,) index into MetricCube.machines
    unit_gpu: tuple[str | None, ...]
    features: tuple[str, ...]
    kinds: tuple[Kind, ...]

    def take_units(self, keep: np.ndarray, remap: np.ndarray) -> LevelCube:
        """The units in ``keep`` (indices), their machine indices mapped through ``remap``."""
        return replace(
            self,
            values=self.values[keep],
            unit_machine=remap[self.unit_machine[keep]],
            unit_gpu=tuple(self.unit_gpu[i] for i in keep),
        )


@dataclass(frozen=True, eq=False)
class MetricCube:
    """Both levels on one time grid: block ``k`` covers ``[t0_s + k*block_s, t0_s + (k+1)*block_s)``."""

    machines: tuple[str, ...]
    levels: tuple[LevelCube, ...]
    t0_s: float
    block_s: float
    n_blocks: int
    sample_interval_s: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    rows: int = 0  # samples read

    def block_time(self, k: int) -> float:
        """Start time (epoch seconds) of block ``k``."""
        return self.t0_s + k * self.block_s

    @property
    def features(self) -> tuple[str, ...]:
        return tuple(f for lv in self.levels for f in lv.features)

    @property
    def hours(self) -> float:
        return self.n_blocks * self.block_s / 3600.0

    def kinds(self) -> dict[str, Kind]:
        return {f: k for lv in self.levels for f, k in zip(lv.features, lv.kinds)}

    def only_machines(self, names: Sequence[str]) -> MetricCube:
        """The cube restricted to the machines in ``names`` (order kept)."""
        wanted = set(names)
        keep_m = np.array([i for i, m in enumerate(self.machines) if m in wanted], dtype=np.int64)
        remap = np.full(len(self.machines), -1, dtype=np.int64)
        remap[keep_m] = np.arange(keep_m.size)
        levels = []
        for lv in self.levels:
            keep = np.flatnonzero(remap[lv.unit_machine] >= 0)
            if keep.size:
                levels.append(lv.take_units(keep, remap))
        return replace(self, machines=tuple(self.machines[i] for i in keep_m), levels=tuple(levels))
