"""Minder-style peer distance: score each machine by how far its metric windows lie from its peers'.

Per metric and window, each machine's window of peer-normalized values (optionally denoised: an
LSTM-VAE per metric, trained on the calmer half of the windows, reconstructs the window's shape
around its mean, so level shifts pass through untouched)
is compared with the peer median (the RMS distance), the distances are z-scored across machines, and
an alert needs the same machine on top for ``continuity_s`` (Minder uses 4 minutes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rankscope.models._peer import PeerDetector, robust_z_across_machines, windows
from rankscope.models.base import check_positive
from rankscope.spine import InputError

DENOISERS = (None, "lstm-vae")


class PeerDistance(PeerDetector):
    """Distance of each machine's metric windows to its peers', z-scored across machines."""

    def __init__(
        self,
        *,
        window_s: float = 10.0,
        continuity_s: float = 240.0,
        sample_interval_s: float = 1.0,
        threshold: float = 12.0,
        min_spread: float = 0.25,
        min_scale_ratio: float = 1e-3,
        min_scale_abs: float = 1e-6,
        denoiser: str | None = None,
        denoiser_epochs: int = 10,
        denoiser_max_windows: int = 1024,
        random_state: int = 0,
    ) -> None:
        self.window_s = window_s
        self.continuity_s = continuity_s
        self.sample_interval_s = sample_interval_s
        self.threshold = threshold
        self.min_spread = min_spread
        self.min_scale_ratio = min_scale_ratio
        self.min_scale_abs = min_scale_abs
        self.denoiser = denoiser
        self.denoiser_epochs = denoiser_epochs
        self.denoiser_max_windows = denoiser_max_windows
        self.random_state = random_state

    def _validate_params(self) -> None:
        check_positive("PeerDistance", "min_spread", self.min_spread)
        if self.denoiser not in DENOISERS:
            raise InputError(f"PeerDistance: denoiser={self.denoiser!r} is not one of {DENOISERS}")
        check_positive("PeerDistance", "denoiser_epochs", self.denoiser_epochs, integer=True)
        check_positive("PeerDistance", "denoiser_max_windows", self.denoiser_max_windows, integer=True)

    def _fit_from(self, Z: np.ndarray) -> None:
        self.denoisers_: list[Any] = []
        if self.denoiser is None:
            return
        from rankscope.models.lstm_vae import (
            train_vae,  # lazy: only the denoiser needs torch
        )

        W = windows(Z, self.window_samples)  # (N, K, w, M)
        d = np.sqrt(np.mean(W * W, axis=2))  # (N, K, M)
        rng = np.random.default_rng(self.random_state)
        for m in range(W.shape[-1]):
            seqs = W[..., m].reshape(-1, W.shape[2])
            seqs = seqs - seqs.mean(axis=1, keepdims=True)  # the denoiser learns shapes; levels pass through
            healthy = d[..., m].reshape(-1) <= np.median(d[..., m])  # train on the calmer half
            seqs = seqs[healthy]
            if seqs.shape[0] > self.denoiser_max_windows:
                seqs = seqs[rng.choice(seqs.shape[0], self.denoiser_max_windows, replace=False)]
            self.denoisers_.append(
                train_vae(seqs[..., None], epochs=self.denoiser_epochs, random_state=self.random_state + m)
            )

    def _window_metric_scores(self, Z: np.ndarray) -> np.ndarray:
        W = windows(Z, self.window_samples)
        if self.denoisers_:
            from rankscope.models.lstm_vae import reconstruct

            W = W.copy()
            n, k, w, m = W.shape
            for j, model in enumerate(self.denoisers_):
                level = W[..., j].mean(axis=2, keepdims=True)
                shape = (W[..., j] - level).reshape(-1, w, 1)
                W[..., j] = level + reconstruct(model, shape).reshape(n, k, w)
        d = np.sqrt(np.mean(W * W, axis=2))  # (N, K, M): RMS distance to the peer median
        return robust_z_across_machines(d, self.min_spread)
