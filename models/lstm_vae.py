"""A small LSTM-VAE: Minder's per-metric denoiser, and a reconstruction-error detector on its own.

torch is imported lazily (only here, only when a model is trained), so the diagnosis CLI and the node
sidecar work without it. The network is deliberately tiny (one LSTM layer of ``hidden`` units, a
``latent``-dimensional code): it trains on CPU in seconds to minutes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rankscope.models.base import (
    BaseDetector,
    check_contamination,
    check_is_fitted,
    check_positive,
)
from rankscope.spine import InputError


def _torch() -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the install
        raise InputError("the LSTM-VAE needs torch: install rankscope[torch], or use another detector") from None
    return torch


def _build(n_features: int, hidden: int, latent: int) -> Any:
    torch = _torch()
    nn = torch.nn

    class LstmVaeNet(nn.Module):  # type: ignore[name-defined]  # torch is loaded at run time (lazy)
        """Encoder LSTM -> (mu, logvar) -> repeated code -> decoder LSTM -> per-step reconstruction."""

        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.LSTM(n_features, hidden, batch_first=True)
            self.mu = nn.Linear(hidden, latent)
            self.logvar = nn.Linear(hidden, latent)
            self.dec = nn.LSTM(latent, hidden, batch_first=True)
            self.out = nn.Linear(hidden, n_features)

        def forward(self, x: Any, sample: bool = True) -> tuple[Any, Any, Any]:
            _, (h, _) = self.enc(x)
            h = h[-1]
            mu, logvar = self.mu(h), self.logvar(h).clamp(-8, 8)
            z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if sample else mu
            y, _ = self.dec(z.unsqueeze(1).expand(-1, x.shape[1], -1))
            return self.out(y), mu, logvar

    return LstmVaeNet()


def train_vae(
    seqs: np.ndarray,
    *,
    epochs: int = 20,
    hidden: int = 16,
    latent: int = 4,
    batch_size: int = 256,
    learning_rate: float = 5e-3,
    beta: float = 0.1,
    random_state: int = 0,
) -> Any:
    """Train on ``seqs`` of shape ``(n, seq_len, n_features)``; returns the model in eval mode."""
    torch = _torch()
    torch.manual_seed(random_state)
    x = torch.as_tensor(np.ascontiguousarray(seqs, dtype=np.float32))
    model = _build(x.shape[2], hidden, latent)
    opt = torch.optim.Adam(model.parameters(), lr=learning_rate)
    gen = torch.Generator().manual_seed(random_state)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(x.shape[0], generator=gen).split(batch_size):
            xb = x[idx]
            rec, mu, logvar = model(xb)
            kl = -0.5 * torch.mean(1 + logvar - mu.pow(2) - logvar.exp())
            loss = torch.mean((rec - xb) ** 2) + beta * kl
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    return model


def reconstruct(model: Any, seqs: np.ndarray, *, batch_size: int = 8192) -> np.ndarray:
    """The model's mean reconstruction of ``seqs`` (no sampling), as float32 numpy."""
    torch = _torch()
    x = torch.as_tensor(np.ascontiguousarray(seqs, dtype=np.float32))
    out = []
    with torch.no_grad():
        for xb in x.split(batch_size):
            out.append(model(xb, sample=False)[0].numpy())
    return np.concatenate(out) if out else np.empty_like(seqs, dtype=np.float32)


class LstmVae(BaseDetector):
    """Reconstruction error of the window ending at each sample (a machine against its own history)."""

    input_ndim = 2
    requires_torch = True

    def __init__(
        self,
        *,
        contamination: float = 0.01,
        seq_len: int = 16,
        hidden: int = 16,
        latent: int = 4,
        epochs: int = 10,
        max_windows: int = 4096,
        random_state: int = 0,
    ) -> None:
        self.contamination = contamination
        self.seq_len = seq_len
        self.hidden = hidden
        self.latent = latent
        self.epochs = epochs
        self.max_windows = max_windows
        self.random_state = random_state

    def _validate_params(self) -> None:
        check_contamination("LstmVae", self.contamination)
        for p in ("seq_len", "hidden", "latent", "epochs", "max_windows"):
            check_positive("LstmVae", p, getattr(self, p), integer=True)

    def _windows(self, arr: np.ndarray) -> np.ndarray:
        z = ((arr - self.mean_) / self.scale_).astype(np.float32)
        pad = np.repeat(z[:1], self.seq_len - 1, axis=0)  # the first samples reuse the first row as history
        z = np.concatenate([pad, z])
        return np.lib.stride_tricks.sliding_window_view(z, self.seq_len, axis=0).transpose(0, 2, 1)

    def fit(self, X: Any, y: Any = None) -> LstmVae:
        self._validate_params()
        arr = self._check_X(X, fitting=True)
        self.mean_ = arr.mean(axis=0)
        self.scale_ = np.where(arr.std(axis=0) > 1e-9, arr.std(axis=0), 1.0)
        seqs = self._windows(arr)
        rng = np.random.default_rng(self.random_state)
        train = (
            seqs
            if seqs.shape[0] <= self.max_windows
            else seqs[rng.choice(seqs.shape[0], self.max_windows, replace=False)]
        )
        self.model_ = train_vae(
            train, epochs=self.epochs, hidden=self.hidden, latent=self.latent, random_state=self.random_state
        )
        self._set_outputs(self._score(seqs))
        return self

    def _score(self, seqs: np.ndarray) -> np.ndarray:
        rec = reconstruct(self.model_, seqs)
        return np.mean((rec[:, -1, :] - seqs[:, -1, :]) ** 2, axis=1).astype(np.float64)

    def decision_function(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        return self._score(self._windows(self._check_X(X, fitting=False)))
