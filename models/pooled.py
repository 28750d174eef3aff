"""A temporal detector (``mad``, ``iforest``, ``lstm-vae``) used among peers: :class:`PooledWindows`.

The metrics of a training job are compared across machines (:mod:`rankscope.models._peer`): the per-time
median over machines is subtracted, so what is left is each machine's deviation from its peers. A
temporal detector then learns what a window of those deviations looks like from the windows of *every*
machine (the many healthy ones dominate), and scores each machine's windows. Scores are put on one scale
as robust z-scores against all windows' scores (median and MAD), so ``threshold`` means the same for every
inner detector; Minder's continuity rule then turns a machine that stays above it into an alert, with
the metrics that deviated most as its drivers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rankscope.models._peer import PeerDetector, windows
from rankscope.models.base import BaseDetector
from rankscope.spine import InputError

TEMPORAL = ("mad", "iforest", "lstm-vae")


class PooledWindows(PeerDetector):
    """A temporal detector fitted on all machines' peer-normalized windows; per-window robust z of its score."""

    def __init__(
        self,
        *,
        detector: str = "mad",
        window_s: float = 10.0,
        continuity_s: float = 240.0,
        sample_interval_s: float = 1.0,
        threshold: float = 6.0,
        min_scale_ratio: float = 1e-3,
        min_scale_abs: float = 1e-6,
        random_state: int = 0,
    ) -> None:
        self.detector = detector
        self.window_s = window_s
        self.continuity_s = continuity_s
        self.sample_interval_s = sample_interval_s
        self.threshold = threshold
        self.min_scale_ratio = min_scale_ratio
        self.min_scale_abs = min_scale_abs
        self.random_state = random_state

    def _validate_params(self) -> None:
        if self.detector not in TEMPORAL:
            raise InputError(f"PooledWindows: detector={self.detector!r} is not one of {', '.join(TEMPORAL)}")

    def _inner(self) -> BaseDetector:
        from rankscope.models.registry import make_detector

        params: dict[str, Any] = {"random_state": self.random_state} if self.detector != "mad" else {}
        return make_detector(self.detector, **params)

    @staticmethod
    def _features(Z: np.ndarray, w: int) -> np.ndarray:
        """``(N, K, M)``: each window's mean deviation per metric."""
        return np.asarray(windows(Z, w).mean(axis=2), dtype=np.float64)

    def _fit_from(self, Z: np.ndarray) -> None:
        F = self._features(Z, self.window_samples)
        n, k, m = F.shape
        self.model_ = self._inner().fit(F.reshape(n * k, m))
        scores = np.asarray(self.model_.decision_scores_, dtype=np.float64)
        self.score_median_ = float(np.median(scores))
        mad = float(np.median(np.abs(scores - self.score_median_))) * 1.4826
        self.score_scale_ = max(mad, abs(self.score_median_) * 1e-3, 1e-12)

    def _window_metric_scores(self, Z: np.ndarray) -> np.ndarray:
        F = self._features(Z, self.window_samples)
        n, k, m = F.shape
        s = np.asarray(self.model_.decision_function(F.reshape(n * k, m)), dtype=np.float64).reshape(n, k)
        z = (s - self.score_median_) / self.score_scale_
        # each metric's share of the window's deviation: the window score on the metric that deviated most
        mag = np.abs(F)
        share = mag / np.maximum(mag.max(axis=2, keepdims=True), 1e-12)
        return np.asarray(z[..., None] * share)
