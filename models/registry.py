"""The explicit registry of detectors: name -> factory. An unknown name lists the valid ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rankscope.models._peer import PeerDetector
from rankscope.models.base import BaseDetector
from rankscope.models.iforest import IsolationForestDetector
from rankscope.models.lstm_vae import LstmVae
from rankscope.models.mad import MadZScore
from rankscope.models.peer_change import PeerChangeDetector
from rankscope.models.peer_distance import PeerDistance
from rankscope.models.peer_mad import PeerMad
from rankscope.spine import InputError

DETECTORS: dict[str, Callable[..., BaseDetector]] = {
    "peer-change": PeerChangeDetector,  # peer mode: a change in a machine's relation to its peers (the default)
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


PEER_DETECTORS = tuple(d for d in DETECTORS if d != "peer-change")
"""The windowed detectors of machines among peers: the peer ones directly, the temporal ones through
:class:`~rankscope.models.pooled.PooledWindows` (``peer-change`` has its own decision)."""


def make_peer_detector(name: str, *, threshold: float | None = None, **peer_params: Any) -> PeerDetector:
    """A detector of machines among peers (``fit(X).detect(X)`` on ``(machines, times, metrics)``) by ``name``.

    ``peer-distance`` and ``peer-mad`` are peer detectors; ``mad``, ``iforest`` and ``lstm-vae`` are
    wrapped in :class:`~rankscope.models.pooled.PooledWindows`. ``threshold`` None keeps each one's own
    default (its scores are on different scales).
    """
    from rankscope.models.pooled import TEMPORAL, PooledWindows

    if name not in DETECTORS:
        raise InputError(f"unknown detector {name!r}; valid detectors: {', '.join(DETECTORS)}")
    if name == "peer-change":
        raise InputError("peer-change is not a windowed peer detector; fit PeerChangeDetector on a MetricCube")
    extra: dict[str, Any] = {} if threshold is None else {"threshold": threshold}
    if name in TEMPORAL:
        return PooledWindows(detector=name, **peer_params, **extra)
    det = make_detector(name, **peer_params, **extra)
    assert isinstance(det, PeerDetector)
    return det
