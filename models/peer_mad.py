"""Peer median/MAD z-score: the robust baseline of peer mode.

Each machine's window mean of its per-second robust z-score against the other machines (median and
MAD across machines at that second); the largest absolute value over metrics, with the same
continuity rule as :class:`~rankscope.models.peer_distance.PeerDistance`.
"""

from __future__ import annotations

import numpy as np

from rankscope.models._peer import PeerDetector, windows


class PeerMad(PeerDetector):
    """Window-averaged robust z-score of each machine among its peers."""

    def __init__(
        self,
        *,
        window_s: float = 10.0,
        continuity_s: float = 240.0,
        sample_interval_s: float = 1.0,
        threshold: float = 5.0,
        min_scale_ratio: float = 1e-3,
        min_scale_abs: float = 1e-6,
    ) -> None:
        self.window_s = window_s
        self.continuity_s = continuity_s
        self.sample_interval_s = sample_interval_s
        self.threshold = threshold
        self.min_scale_ratio = min_scale_ratio
        self.min_scale_abs = min_scale_abs

    def _window_metric_scores(self, Z: np.ndarray) -> np.ndarray:
        return np.abs(windows(Z, self.window_samples).mean(axis=2))
