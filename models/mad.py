"""Median/MAD z-score: the robust baseline; each sample is scored against the training distribution.

Per feature, ``z = |x - median| / (1.4826 * MAD)`` (MAD floored so a constant feature cannot divide
by zero); a sample's score is the largest (``aggregate="max"``) or mean ``|z|`` over features.
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

_AGGREGATES = ("max", "mean")


class MadZScore(BaseDetector):
    """Robust z-score per feature against the training data's median and MAD."""

    input_ndim = 2

    def __init__(self, *, contamination: float = 0.01, aggregate: str = "max", min_scale: float = 1e-6) -> None:
        self.contamination = contamination
        self.aggregate = aggregate
        self.min_scale = min_scale

    def _validate_params(self) -> None:
        check_contamination("MadZScore", self.contamination)
        if self.aggregate not in _AGGREGATES:
            raise InputError(f"MadZScore: aggregate={self.aggregate!r} is not one of {_AGGREGATES}")
        check_positive("MadZScore", "min_scale", self.min_scale)

    def fit(self, X: Any, y: Any = None) -> MadZScore:
        self._validate_params()
        arr = self._check_X(X, fitting=True)
        self.median_ = np.median(arr, axis=0)
        mad = np.median(np.abs(arr - self.median_), axis=0) * 1.4826
        spread = np.maximum(np.abs(self.median_), 1.0) * self.min_scale
        # a feature with MAD 0 (mostly constant) falls back on its standard deviation
        self.scale_ = np.where(mad > spread, mad, np.maximum(arr.std(axis=0), spread))
        self._set_outputs(self._score(arr))
        return self

    def _score(self, arr: np.ndarray) -> np.ndarray:
        z = np.abs(arr - self.median_) / self.scale_
        return z.max(axis=1) if self.aggregate == "max" else z.mean(axis=1)

    def decision_function(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        return self._score(self._check_X(X, fitting=False))
