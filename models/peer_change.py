"""The peer-change detector: a machine whose relation to its peers changed after an onset, and stayed changed.

What it assumes (and therefore what it can and cannot see):

- Every machine of a training job does the same work, so at each moment the machines' values of a metric
  are comparable. Per time block and feature, each unit (a machine, or a GPU) is a robust z-score among
  its peers: ``z = (x - peer median) / peer MAD``. A change every machine shares (a power cap, a slower
  phase, a checkpoint pause, the waiting that one slow machine imposes on all the others) moves the peer
  median, not ``z``: nobody stands out.
- A machine that was different from the start (a hotter GPU, a slower clock bin, a host with background
  retransmits) has a steady ``z`` offset. That is not a fault: each unit is compared with *its own*
  baseline relation (the median ``z`` over the ``baseline_s`` seconds before a candidate onset), and only
  a move *away* from the peers counts (rejoining the pack, as offsets do when a power cap clips every GPU
  to the same watts, is not a fault). A fault present from the first sample is invisible by design.
- A fault persists (Minder's continuity): the window mean's shift counts only as far as a ``quorum``
  (75 %) of the window's blocks held it, and the window is ``(continuity_s / block + 2) / quorum`` blocks
  long, so an event shorter than ``continuity_s`` (plus the exporter's own smoothing: a ``*:rate1m`` rule
  adds a minute, and so does a temperature's thermal lag; ``node_load1``'s exponential damping is undone
  first) can never fill the quorum: a
  temperature blip, a retransmit burst, a CPU burst, a clock dip or a short stall never names a machine.
  Everything is in seconds, so it holds for any sampling interval. The price: a fault is named once it
  has lasted about ``1.75 x continuity_s`` (7 minutes by default).
- Direction matters per metric: clocks are suspicious when they fall; temperature, retransmits,
  replay/ECC/Xid/violation counters, CPU and load when they rise; utilisation, power and byte rates
  either way (a slow GPU keeps computing while its peers wait; a starved one idles).
- Per-GPU metrics on machines with at least 3 GPUs are tested twice: the machine's median GPU against the
  other machines (the whole machine changed) and each GPU against the other GPUs of its machine (one GPU
  changed; siblings are sampled at the same instant and run in lockstep, so step-phase noise cancels). A
  machine takes its worst GPU, and the GPU is kept as evidence.
- Not one machine's: a change that ``max_shared_fraction`` (5 %) or more of the other units made at the
  same time, a change by the same factor as the whole job's level (a congested fabric multiplying every
  host's retransmits), or a GPU change that came with a move of its whole machine, cannot name anyone.
- Physically large: at least ``min_effect`` peer MADs and ``min_relative_effect`` of the metric's level.
- The threshold is calibrated on the job's own data: per test (feature, direction, reference) the
  per-machine maxima of the change statistic follow an extreme-value (Gumbel) law, fitted robustly from
  the upper half of the machines (median, 75th and 90th percentiles: up to 10 % faulty machines do not
  move it). The threshold is the Gumbel quantile for ``false_alarms_per_1000_machine_hours`` false
  machines per 1,000 machine-hours of data, split evenly (Bonferroni) over the tests.

It cannot see: a fault present from the start of the data, one younger than ~1.75 continuity windows, a
fault that every machine (or a large part of the job) shares, one on a metric nobody exported, or one
smaller than a few MADs of the job's own spread. It needs at least 3 machines and a baseline plus a
continuity window of data.

scikit-learn/pyod contract: keyword-only hyperparameters stored unchanged; ``fit(X) -> self``;
``decision_function`` higher = more anomalous (the largest calibrated Gumbel score of a machine among the
tests that may name it); ``decision_scores_``, ``threshold_``, ``labels_`` after ``fit``. ``X`` is a
:class:`~rankscope.datasets.domain.metrics.MetricCube` (GPU and host levels) or an array
``(n_machines, n_times, n_metrics)`` with ``sample_interval_s`` seconds per time step.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import numpy as np

from rankscope.datasets.domain.metrics import LevelCube, MetricCube
from rankscope.models._change import gumbel_fit
from rankscope.models._change_tests import Calibration, FeatureTests, feature_tests, threads, window_blocks
from rankscope.models.base import BaseDetector, check_is_fitted, check_positive
from rankscope.spine import InputError

__all__ = ["Calibration", "PeerChangeDetector", "window_blocks"]


class PeerChangeDetector(BaseDetector):
    """Machines whose relation to their peers changed after an onset and persisted (see the module docstring)."""

    input_ndim: ClassVar[int] = 3

    def __init__(
        self,
        *,
        continuity_s: float = 240.0,
        baseline_s: float = 300.0,
        min_baseline_s: float = 120.0,
        sample_interval_s: float = 1.0,
        false_alarms_per_1000_machine_hours: float = 1.0,
        min_effect: float = 3.0,
        min_relative_effect: float = 0.02,
        coverage: float = 0.75,
        quorum: float = 0.75,
        min_gumbel_scale: float = 0.25,
        max_shared_fraction: float = 0.05,
        directions: dict[str, str] | None = None,
        max_peers: int = 2048,
        n_jobs: int | None = None,
        random_state: int = 0,
    ) -> None:
        self.continuity_s = continuity_s
        self.baseline_s = baseline_s
        self.min_baseline_s = min_baseline_s
        self.sample_interval_s = sample_interval_s
        self.false_alarms_per_1000_machine_hours = false_alarms_per_1000_machine_hours
        self.min_effect = min_effect
        self.min_relative_effect = min_relative_effect
        self.coverage = coverage
        self.quorum = quorum
        self.min_gumbel_scale = min_gumbel_scale
        self.max_shared_fraction = max_shared_fraction
        self.directions = directions
        self.max_peers = max_peers
        self.n_jobs = n_jobs
        self.random_state = random_state

    # -- input ---------------------------------------------------------------------------------------
    def _allow_nan(self) -> bool:
        return True  # a missing block (an exporter gap) counts as no deviation

    def _validate_params(self) -> None:
        name = "PeerChangeDetector"
        for p in (
            "continuity_s",
            "baseline_s",
            "min_baseline_s",
            "sample_interval_s",
            "false_alarms_per_1000_machine_hours",
            "min_gumbel_scale",
        ):
            check_positive(name, p, getattr(self, p))
        for p in ("coverage", "quorum"):
            v = getattr(self, p)
            if not isinstance(v, (int, float)) or not 0.5 <= v <= 1:
                raise InputError(f"{name}: {p}={v!r} must be in [0.5, 1], e.g. 0.75")
        for p in ("min_effect", "min_relative_effect", "max_shared_fraction"):
            v = getattr(self, p)
            if not isinstance(v, (int, float)) or v < 0:
                raise InputError(f"{name}: {p}={v!r} must be a number >= 0")
        check_positive(name, "max_peers", self.max_peers, integer=True)
        bad = {k: v for k, v in (self.directions or {}).items() if v not in ("up", "down", "both")}
        if bad:
            raise InputError(f"{name}: directions {bad} must be 'up', 'down' or 'both'")

    def _as_cube(self, X: Any, *, fitting: bool) -> MetricCube:
        if isinstance(X, MetricCube):
            n_feat = len(X.features)
            if fitting:
                self.n_features_in_ = n_feat
            elif n_feat != self.n_features_in_:
                raise InputError(
                    f"PeerChangeDetector: X has {n_feat} features, but the detector was fitted with "
                    f"{self.n_features_in_}"
                )
            cube = X
        else:
            arr = self._check_X(X, fitting=fitting)
            n, t, f = arr.shape
            level = LevelCube(
                "node",
                arr,
                np.arange(n),
                tuple(None for _ in range(n)),
                tuple(f"feature_{j}" for j in range(f)),
                tuple("gauge" for _ in range(f)),
            )
            cube = MetricCube(tuple(f"machine-{i}" for i in range(n)), (level,), 0.0, float(self.sample_interval_s), t)
        if len(cube.machines) < 3:
            raise InputError(
                f"PeerChangeDetector: X has {len(cube.machines)} machine(s); peer comparison needs at least 3"
            )
        return cube

    # -- the statistic ---------------------------------------------------------------------------------
    def _raw(self, cube: MetricCube) -> FeatureTests:
        """Per machine x test: statistic, effect, onset, GPU, shared fraction (features on ``n_jobs`` threads)."""
        jobs = []
        for li, lv in enumerate(cube.levels):
            order = np.argsort(lv.unit_machine, kind="stable")
            um = lv.unit_machine[order]
            starts = np.flatnonzero(np.r_[True, um[1:] != um[:-1]])
            jobs += [(li, lv, j, order, um, starts) for j in range(len(lv.features))]

        def run(jb: tuple[int, LevelCube, int, np.ndarray, np.ndarray, np.ndarray]) -> FeatureTests:
            return feature_tests(self, cube, *jb)

        n_threads = threads(self.n_jobs)
        if n_threads > 1 and len(jobs) > 1:
            with ThreadPoolExecutor(n_threads) as pool:
                parts = list(pool.map(run, jobs))
        else:
            parts = [run(jb) for jb in jobs]
        return FeatureTests.concat(parts, len(cube.machines))

    def significant(self, effect: Any, scale: Any, level: Any) -> Any:
        """Physically large enough: ``min_effect`` peer MADs and ``min_relative_effect`` of the metric's level."""
        return (effect >= self.min_effect) & (effect * scale >= self.min_relative_effect * level)

    # -- the contract ------------------------------------------------------------------------------------
    def fit(self, X: Any, y: Any = None) -> PeerChangeDetector:
        """Score every machine of ``X`` and calibrate the threshold on the same job."""
        self._validate_params()
        cube = self._as_cube(X, fitting=True)
        raw = self._raw(cube)
        cal: list[Calibration] = []
        bulk = np.zeros((2, len(raw.tests)))
        for j, (feat, d, _, ref) in enumerate(raw.tests):
            col = raw.stat[:, j]
            finite = col[np.isfinite(col)]
            if finite.size < 3:
                loc, sc, fl = 0.0, 1.0, True
                bulk[:, j] = loc, sc
            else:
                loc, sc, fl = gumbel_fit(col, min_scale=self.min_gumbel_scale)
                bulk[:, j] = gumbel_fit(col, min_scale=self.min_gumbel_scale, bulk_only=True)[:2]
            name = feat if ref == "peers" else f"{feat} vs sibling GPUs"
            cal.append(Calibration(name, d, loc, sc, int(finite.size), fl))
        self.calibration_ = cal
        self.tests_ = raw.tests
        hours = cube.hours
        self.machine_hours_ = len(cube.machines) * hours
        self.alpha_machine_ = self.false_alarms_per_1000_machine_hours / 1000.0 * max(hours, 1e-6)
        self.alpha_test_ = self.alpha_machine_ / max(1, len(raw.tests))
        self.threshold_ = float(-math.log(-math.log1p(-self.alpha_test_)))
        self.machines_ = cube.machines
        self.block_s_, self.t0_s_, self.n_blocks_ = cube.block_s, cube.t0_s, cube.n_blocks
        self._store(raw)
        # machines whose change stands out from the unchanged bulk of the job, per test: when they are many,
        # the job changed in part (a stage, a rack, staggered power caps): nobody is named for it, but it is
        # an imbalance, not a healthy job
        if raw.stat.shape[1]:
            with np.errstate(invalid="ignore"):
                bs = (raw.stat - bulk[0][None, :]) / bulk[1][None, :]
            self.bulk_exceed_ = np.where(np.isfinite(bs), bs > self.threshold_, False) & self.test_strong_
        else:
            self.bulk_exceed_ = np.zeros_like(raw.stat, dtype=bool)
        return self

    def _standardize(self, raw: FeatureTests) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(standardised scores, whether each test may name its machine, scores capped where it may not)."""
        loc = np.array([c.loc for c in self.calibration_])
        sc = np.array([c.scale for c in self.calibration_])
        with np.errstate(invalid="ignore"):
            s = (raw.stat - loc[None, :]) / sc[None, :]
        s = np.where(np.isfinite(s), s, -np.inf)
        strong = self.significant(raw.effect, raw.peer_scale[None, :], raw.level[None, :])
        eligible = strong & (raw.shared <= self.max_shared_fraction)
        return s, strong, np.where(eligible, s, np.minimum(s, self.threshold_))

    def _store(self, raw: FeatureTests) -> None:
        s, strong, capped = self._standardize(raw)
        self.test_scores_ = s
        self.test_effects_ = raw.effect
        self.test_onsets_ = raw.first
        self.test_shared_ = raw.shared
        self.test_gpus_ = raw.gpu
        self.test_peer_scales_ = raw.peer_scale
        self.test_levels_ = raw.level
        self.test_strong_ = strong
        scores = capped.max(axis=1) if capped.shape[1] else np.full(capped.shape[0], -np.inf)
        self._set_outputs(np.where(np.isfinite(scores), scores, -10.0), self.threshold_)
        eligible = np.where(strong & (raw.shared <= self.max_shared_fraction), s, -np.inf)
        # the best score among tests that could name the machine (large enough, not shared): the margin
        self.eligible_scores_ = eligible.max(axis=1) if s.shape[1] else np.full(s.shape[0], -np.inf)

    def decision_function(self, X: Any) -> np.ndarray:
        """Calibrated score per machine of ``X`` (the fitted calibration; its features must match)."""
        check_is_fitted(self)
        raw = self._raw(self._as_cube(X, fitting=False))
        if raw.tests != self.tests_:
            raise InputError("PeerChangeDetector: X has other features than the data it was fitted on")
        _, _, capped = self._standardize(raw)
        scores = capped.max(axis=1) if capped.shape[1] else np.full(capped.shape[0], -np.inf)
        return np.where(np.isfinite(scores), scores, -10.0)

    # -- evidence ------------------------------------------------------------------------------------------
    def evidence(self, machine: int, top: int = 4) -> list[dict[str, Any]]:
        """The tests that drive ``machine``'s score, strongest first, with onset time, GPU and effect."""
        check_is_fitted(self)
        s = self.test_scores_[machine]
        out = []
        for j in np.argsort(-np.where(np.isfinite(s), s, -1e9), kind="stable")[:top]:
            if not np.isfinite(s[j]):
                continue
            feat, d, level, ref = self.tests_[j]
            onset = int(self.test_onsets_[machine, j])
            eff = float(self.test_effects_[machine, j])
            out.append(
                {
                    "feature": feat,
                    "direction": d,
                    "level": level,
                    "reference": ref,
                    "score": float(s[j]),
                    "shared_fraction": float(self.test_shared_[machine, j]),
                    "effect_peer_mads": eff,
                    "effect_units": eff * float(self.test_peer_scales_[j]),
                    "gpu": self.test_gpus_[j][machine],
                    "onset_s": self.t0_s_ + onset * self.block_s_ if onset >= 0 else None,
                    "level_units": float(self.test_levels_[j]),
                    "significant": bool(self.test_strong_[machine, j]),
                    "over_threshold": bool(
                        s[j] > self.threshold_
                        and self.test_strong_[machine, j]
                        and self.test_shared_[machine, j] <= self.max_shared_fraction
                    ),
                }
            )
        return out
