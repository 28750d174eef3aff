"""Detectors, scikit-learn + pyod style: ``fit(X) -> self``, ``decision_function`` higher = more anomalous.

Peer mode (``input_ndim == 3``): :class:`PeerDistance` (Minder-style) and :class:`PeerMad` score each
machine against the other machines. Temporal mode (``input_ndim == 2``): :class:`MadZScore`,
:class:`IsolationForestDetector` and :class:`LstmVae` score each sample against a machine's history.
torch is imported only when an LSTM-VAE is trained.
"""

from __future__ import annotations

from .base import BaseDetector, NotFittedError, check_is_fitted
from .iforest import IsolationForestDetector
from .lstm_vae import LstmVae
from .mad import MadZScore
from .peer_distance import PeerDistance
from .peer_mad import PeerMad
from .registry import DETECTORS, make_detector

__all__ = [
    "DETECTORS", "BaseDetector", "IsolationForestDetector", "LstmVae", "MadZScore", "NotFittedError",
    "PeerDistance", "PeerMad", "check_is_fitted", "make_detector",
]
