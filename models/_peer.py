"""Shared machinery of the peer-mode detectors: normalize across machines, window, demand continuity.

In a training job every machine runs the same step at the same time, so subtracting the per-second
median over machines removes the training periodicity and leaves each machine's deviation from its
peers. Detectors then turn deviations into per-window scores; an alert needs the same machine above
the threshold for ``continuity_s`` in a row (Minder's continuity rule), so a blip blames no one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rankscope.models.base import BaseDetector, check_is_fitted, check_positive
from rankscope.spine import InputError

MIN_MACHINES = 3


@dataclass(frozen=True)
class PeerAlerts:
    """Per machine: sustained score, alert flag, onset/alert sample index and the driving metrics.

    ``window_scores`` is ``(n_machines, n_windows)``; ``metric_scores`` ``(n_machines, n_metrics)`` is
    each metric's mean score over the alert run (0 for machines without an alert).
    """

    scores: np.ndarray
    labels: np.ndarray
    threshold: float
    onset_index: np.ndarray  # sample index where the alert run starts, -1 without an alert
    alert_index: np.ndarray  # sample index where continuity was first met, -1 without an alert
    metric_scores: np.ndarray
    window_scores: np.ndarray
    window_samples: int

    @property
    def alerted(self) -> np.ndarray:
        """Indices of alerted machines, highest score first."""
        idx = np.flatnonzero(self.labels)
        return idx[np.argsort(-self.scores[idx], kind="stable")]

    def drivers(self, machine: int, top: int = 3) -> list[int]:
        """Metric indices that drove ``machine``'s alert, strongest first."""
        ms = self.metric_scores[machine]
        order = np.argsort(-ms, kind="stable")
        return [int(i) for i in order[:top] if ms[i] > 0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "alerted": [int(i) for i in self.alerted],
            "scores": {int(i): round(float(self.scores[i]), 3) for i in self.alerted},
            "onset_index": {int(i): int(self.onset_index[i]) for i in self.alerted},
            "alert_index": {int(i): int(self.alert_index[i]) for i in self.alerted},
            "drivers": {int(i): self.drivers(int(i)) for i in self.alerted},
        }


def fill_missing(X: np.ndarray) -> np.ndarray:
    """Replace NaN by the peers' median at that time (no evidence either way); all-NaN -> 0."""
    mask = np.isnan(X)
    if not mask.any():
        return X
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(X, axis=0)
    med = np.where(np.isnan(med), 0.0, med).astype(X.dtype)
    out = X.copy()
    out[mask] = np.broadcast_to(med, X.shape)[mask]
    return out


def peer_normalize(X: np.ndarray, *, min_scale_ratio: float, min_scale_abs: float) -> np.ndarray:
    """Deviation from the peers at each second, in units of the peers' spread.

    Machines sample their counters a fraction of a second apart, so at a phase change of the training
    step (compute -> communication) healthy machines legitimately read anything up to half-way to the
    peer medians of the neighbouring seconds: the deviation is the distance from that band (0 inside).
    The spread is the per-second MAD across machines (noise grows with the load), floored at the
    metric's typical (median over time) MAD and at ``min_scale_ratio`` of its level, so a metric that
    is constant across machines (a counter at 0 everywhere) cannot divide by zero.
    """
    # peer statistics from an evenly strided sample of at most ~256 machines: the median and MAD of
    # hundreds of peers are as good as of thousands, at a fraction of the cost
    stride = max(1, X.shape[0] // 256)
    peers = np.ascontiguousarray(np.moveaxis(X[::stride], 0, -1))  # (T, M, n): medians along the last axis
    med = np.median(peers, axis=-1)  # (T, M)
    padded = np.concatenate([med[:1], med, med[-1:]])
    prev, nxt = 0.5 * (padded[:-2] + med), 0.5 * (padded[2:] + med)
    lo = np.minimum(np.minimum(prev, med), nxt)
    hi = np.maximum(np.maximum(prev, med), nxt)
    mad = np.median(np.abs(peers - med[..., None]), axis=-1) * 1.4826  # (T, M): the spread at each second
    typical = np.median(mad, axis=0)  # (M,): the steady-state spread
    level = np.median(np.abs(med), axis=0)
    floor = np.maximum(typical, np.maximum(level * min_scale_ratio, min_scale_abs))
    scale = np.maximum(mad, floor[None, :]).astype(np.float32)
    dev = X - np.clip(X, lo[None].astype(X.dtype), hi[None].astype(X.dtype))
    dev /= scale[None]
    return dev  # (N, T, M)


def windows(Z: np.ndarray, w: int) -> np.ndarray:
    """``(N, T, M)`` -> ``(N, n_windows, w, M)``, non-overlapping, dropping the incomplete tail."""
    n, t, m = Z.shape
    k = t // w
    return Z[:, : k * w].reshape(n, k, w, m)


def robust_z_across_machines(d: np.ndarray, min_spread: float) -> np.ndarray:
    """Per window and metric, the robust z-score of each machine's value among all machines."""
    med = np.median(d, axis=0)
    mad = np.median(np.abs(d - med), axis=0) * 1.4826
    return (d - med) / np.maximum(mad, min_spread)


def sustained_alerts(
    window_metric_scores: np.ndarray,
    *,
    threshold: float,
    continuity: int,
    window_samples: int,
    quorum: float = 0.8,
) -> PeerAlerts:
    """Alerts that need ``quorum`` of ``continuity`` consecutive windows above ``threshold`` for one machine.

    ``window_metric_scores`` is ``(N, n_windows, M)``; a window's score is its largest metric score.
    The sustained score is the best rolling ``1 - quorum`` quantile over ``continuity`` windows.
    """
    n, k, m = window_metric_scores.shape
    ws = window_metric_scores.max(axis=2)  # (N, K)
    c = min(continuity, k)
    if c > 1:
        # the score a machine holds in at least `quorum` of `c` consecutive windows: one dip does not reset
        q = int(np.floor((1.0 - quorum) * c))
        roll = np.partition(np.lib.stride_tricks.sliding_window_view(ws, c, axis=1), q, axis=2)[..., q]
    else:
        roll = ws
    scores = roll.max(axis=1)
    labels = (scores > threshold).astype(np.int64)
    onset = np.full(n, -1, dtype=np.int64)
    alert = np.full(n, -1, dtype=np.int64)
    metric_scores = np.zeros((n, m), dtype=np.float64)
    for i in np.flatnonzero(labels):
        first = int(np.flatnonzero(roll[i] > threshold)[0])  # span [first, first + c) meets the quorum
        above = np.flatnonzero(ws[i, first : first + c] > threshold)
        start = first + int(above[0])
        while start > 0 and ws[i, start - 1] > threshold:
            start -= 1
        end = first + int(above[-1]) + 1
        onset[i] = start * window_samples
        alert[i] = end * window_samples - 1
        metric_scores[i] = np.clip(window_metric_scores[i, start:end], 0, None).mean(axis=0)
    return PeerAlerts(scores, labels, float(threshold), onset, alert, metric_scores, ws, window_samples)


class PeerDetector(BaseDetector):
    """Base of peer-mode detectors: ``X`` is ``(n_machines, n_times, n_metrics)``, one score per machine."""

    input_ndim = 3

    window_s: float
    continuity_s: float
    sample_interval_s: float
    threshold: float
    min_scale_ratio: float
    min_scale_abs: float

    def _allow_nan(self) -> bool:
        return True

    def _validate_peer_params(self) -> None:
        name = type(self).__name__
        for p in ("window_s", "continuity_s", "sample_interval_s", "threshold"):
            check_positive(name, p, getattr(self, p))
        if self.window_s < self.sample_interval_s:
            raise InputError(
                f"{name}: window_s={self.window_s} is shorter than sample_interval_s={self.sample_interval_s}"
            )
        check_positive(name, "min_scale_abs", self.min_scale_abs)
        if self.min_scale_ratio < 0:
            raise InputError(f"{name}: min_scale_ratio={self.min_scale_ratio!r} must be >= 0")

    @property
    def window_samples(self) -> int:
        return max(1, int(round(self.window_s / self.sample_interval_s)))

    @property
    def continuity_windows(self) -> int:
        return max(1, int(np.ceil(self.continuity_s / (self.window_samples * self.sample_interval_s))))

    def _prepare(self, X: Any, *, fitting: bool) -> np.ndarray:
        arr = self._check_X(X, fitting=fitting)
        if arr.shape[0] < MIN_MACHINES:
            raise InputError(
                f"{type(self).__name__}: X has {arr.shape[0]} machines; peer comparison needs at least {MIN_MACHINES}"
            )
        if arr.shape[1] < self.window_samples:
            raise InputError(
                f"{type(self).__name__}: X has {arr.shape[1]} time points, fewer than one window "
                f"(window_s={self.window_s} at sample_interval_s={self.sample_interval_s})"
            )
        arr = fill_missing(arr)
        return peer_normalize(arr, min_scale_ratio=self.min_scale_ratio, min_scale_abs=self.min_scale_abs)

    def _window_metric_scores(self, Z: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def detect(self, X: Any) -> PeerAlerts:
        """Score ``X`` and return the alerts with onset and driving metrics."""
        check_is_fitted(self)
        return self._alerts(self._prepare(X, fitting=False))

    def _alerts(self, Z: np.ndarray) -> PeerAlerts:
        return sustained_alerts(
            self._window_metric_scores(Z),
            threshold=self.threshold,
            continuity=self.continuity_windows,
            window_samples=self.window_samples,
        )

    def _fit_from(self, Z: np.ndarray) -> None:
        """Hook for detectors that learn something (the denoiser); default: nothing to learn."""

    def fit(self, X: Any, y: Any = None) -> PeerDetector:
        self._validate_peer_params()
        self._validate_params()
        Z = self._prepare(X, fitting=True)
        self._fit_from(Z)
        self.threshold_ = float(self.threshold)
        alerts = self._alerts(Z)
        self._set_outputs(alerts.scores, self.threshold)
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        return self.detect(X).scores
