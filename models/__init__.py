"""Detectors, scikit-learn + pyod style: ``fit(X) -> self``, ``decision_function`` higher = more anomalous.

Peer mode (``input_ndim == 3``): :class:`PeerChangeDetector` (the default: a persistent change in a
machine's relation to its peers, calibrated per job), :class:`PeerDistance` (Minder-style) and
:class:`PeerMad` score each machine against the other machines. :class:`StragglerDetector` does the same
on per-worker step times. Temporal mode (``input_ndim == 2``): :class:`MadZScore`,
:class:`IsolationForestDetector` and :class:`LstmVae` score each sample against a machine's history.
torch is imported only when an LSTM-VAE is trained.
"""

from __future__ import annotations

from rankscope.models.base import BaseDetector, NotFittedError, check_is_fitted
from rankscope.models.iforest import IsolationForestDetector
from rankscope.models.lstm_vae import LstmVae
from rankscope.models.mad import MadZScore
from rankscope.models.peer_change import PeerChangeDetector
from rankscope.models.peer_distance import PeerDistance
from rankscope.models.peer_mad import PeerMad
from rankscope.models.registry import DETECTORS, make_detector
from rankscope.models.straggler import StragglerDetector

__all__ = [
    "DETECTORS",
    "BaseDetector",
    "IsolationForestDetector",
    "LstmVae",
    "MadZScore",
    "NotFittedError",
    "PeerChangeDetector",
    "PeerDistance",
    "PeerMad",
    "StragglerDetector",
    "check_is_fitted",
    "make_detector",
]
