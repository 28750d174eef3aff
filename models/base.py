"""The detector contract shared by every model: scikit-learn's estimator API plus pyod's outputs.

``__init__`` only stores keyword-only hyperparameters; ``fit(X) -> self`` learns state whose names
end in ``_``; ``decision_function(X)`` returns one score per sample, **higher = more anomalous**;
after fitting, ``decision_scores_`` (scores of the training data), ``threshold_`` and ``labels_``
(``decision_scores_ > threshold_``) are set in one place, :meth:`BaseDetector._set_outputs`.

A detector declares the array rank it takes in ``input_ndim``: 2 for ``(n_samples, n_features)``
(a machine against its own history), 3 for ``(n_machines, n_times, n_metrics)`` (peer mode: one
score per machine).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import sklearn
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.utils.validation import check_is_fitted as sklearn_check_is_fitted

from rankscope.spine import InputError, RankscopeError


class NotFittedError(RankscopeError, SklearnNotFittedError):
    """A detector was used before ``fit`` (also scikit-learn's ``NotFittedError``, for its tools)."""


class BaseDetector(BaseEstimator):  # scikit-learn ships no types: BaseEstimator is Any to mypy
    """Common plumbing: scikit-learn's parameter protocol (``get_params``, ``set_params``, ``clone``,
    ``repr``), input checks, threshold and labels."""

    input_ndim: ClassVar[int] = 2
    requires_torch: ClassVar[bool] = False

    decision_scores_: np.ndarray
    threshold_: float
    labels_: np.ndarray
    n_features_in_: int

    def set_params(self, **params: Any) -> BaseDetector:
        """scikit-learn's ``set_params``; an unknown parameter is an :class:`InputError` naming the valid ones."""
        valid = self.get_params(deep=False)
        unknown = sorted(k for k in params if k.split("__", 1)[0] not in valid)
        if unknown:
            raise InputError(f"{type(self).__name__}: unknown parameter {unknown[0]!r}; valid: {', '.join(valid)}")
        super().set_params(**params)
        return self

    def __repr__(self, N_CHAR_MAX: int = 700) -> str:
        """scikit-learn's repr with every parameter, not only the changed ones (logs stay complete)."""
        with sklearn.config_context(print_changed_only=False):
            return str(super().__repr__(N_CHAR_MAX))

    # -- the contract -------------------------------------------------------------------------
    def fit(self, X: Any, y: Any = None) -> BaseDetector:  # pragma: no cover - abstract
        raise NotImplementedError

    def decision_function(self, X: Any) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def predict(self, X: Any) -> np.ndarray:
        """1 for anomalous samples, 0 otherwise (pyod convention)."""
        check_is_fitted(self)
        return (self.decision_function(X) > self.threshold_).astype(np.int64)

    def fit_predict(self, X: Any, y: Any = None) -> np.ndarray:
        return self.fit(X, y).labels_

    # -- helpers for subclasses ---------------------------------------------------------------
    def _validate_params(self) -> None:
        """Override to check hyperparameters; raise InputError naming the parameter."""

    def _check_X(self, X: Any, *, fitting: bool) -> np.ndarray:
        """``X`` as a float array of the declared rank; NaN allowed only where ``allow_nan``."""
        try:
            arr = np.asarray(X, dtype=np.float64 if self.input_ndim == 2 else np.float32)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{type(self).__name__}: X must be numeric ({exc})") from None
        shape_doc = "(n_samples, n_features)" if self.input_ndim == 2 else "(n_machines, n_times, n_metrics)"
        if arr.ndim != self.input_ndim:
            raise InputError(f"{type(self).__name__}: X must have shape {shape_doc}, got an array of shape {arr.shape}")
        if min(arr.shape) < 1:
            raise InputError(f"{type(self).__name__}: X has an empty dimension (shape {arr.shape})")
        if np.isinf(arr).any():
            raise InputError(f"{type(self).__name__}: X contains infinite values")
        if not self._allow_nan() and np.isnan(arr).any():
            raise InputError(f"{type(self).__name__}: X contains NaN; fill or drop missing values first")
        n_feat = arr.shape[-1]
        if fitting:
            self.n_features_in_ = int(n_feat)
        elif n_feat != self.n_features_in_:
            raise InputError(
                f"{type(self).__name__}: X has {n_feat} features, but the detector was fitted with "
                f"{self.n_features_in_}"
            )
        return arr

    def _allow_nan(self) -> bool:
        return False

    def _default_threshold(self, scores: np.ndarray) -> float:
        """pyod's rule: the (1 - contamination) quantile of the training scores."""
        contamination = float(getattr(self, "contamination", 0.01))
        return float(np.quantile(scores, 1.0 - contamination))

    def _set_outputs(self, scores: np.ndarray, threshold: float | None = None) -> None:
        """Set ``decision_scores_``, ``threshold_`` and ``labels_`` together."""
        self.decision_scores_ = np.asarray(scores, dtype=np.float64)
        self.threshold_ = float(self._default_threshold(self.decision_scores_) if threshold is None else threshold)
        self.labels_ = (self.decision_scores_ > self.threshold_).astype(np.int64)


def check_is_fitted(detector: BaseDetector) -> None:
    """scikit-learn's ``check_is_fitted`` (on ``threshold_``), raising rankscope's :class:`NotFittedError`."""
    try:
        sklearn_check_is_fitted(detector, "threshold_")
    except SklearnNotFittedError:
        raise NotFittedError(
            f"{type(detector).__name__} is not fitted yet; call fit(X) before decision_function or predict"
        ) from None


def check_contamination(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not 0.0 < float(value) <= 0.5:
        raise InputError(f"{name}: contamination={value!r} must be in (0, 0.5], e.g. 0.01")


def check_positive(owner: str, name: str, value: Any, *, integer: bool = False) -> None:
    ok = isinstance(value, (int, np.integer)) if integer else isinstance(value, (int, float, np.number))
    if not ok or isinstance(value, bool) or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise InputError(f"{owner}: {name}={value!r} must be {kind}")
