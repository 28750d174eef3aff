"""The explicit registry of detectors: name -> factory. An unknown name lists the valid ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rankscope.models.base import BaseDetector
from rankscope.models.iforest import IsolationForestDetector
from rankscope.models.lstm_vae import LstmVae
from rankscope.models.mad import MadZScore
from rankscope.models.peer_distance import PeerDistance
from rankscope.models.peer_mad import PeerMad
from rankscope.spine import InputError

DETECTORS: dict[str, Callable[..., BaseDetector]] = {
    "peer-distance": PeerDistance,  # peer mode (machines x time x metrics), Minder-style
    "peer-mad": PeerMad,  # peer mode, robust baseline
    "mad": MadZScore,  # temporal mode (each machine against its own history)
    "iforest": IsolationForestDetector,  # temporal mode
    "lstm-vae": LstmVae,  # temporal mode, needs torch
}


def make_detector(name: str, **params: Any) -> BaseDetector:
    """A new detector ``name`` with ``params``; unknown names and parameters are InputErrors."""
    try:
        factory = DETECTORS[name]
    except KeyError:
        raise InputError(f"unknown detector {name!r}; valid detectors: {', '.join(DETECTORS)}") from None
    try:
        return factory(**params)
    except TypeError as exc:
        raise InputError(f"detector {name!r}: {exc}") from None
