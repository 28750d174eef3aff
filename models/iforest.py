"""IsolationForest behind the rankscope detector contract (one adapter over scikit-learn)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rankscope.models.base import (
    BaseDetector,
    check_contamination,
    check_is_fitted,
    check_positive,
)


class IsolationForestDetector(BaseDetector):
    """scikit-learn's IsolationForest; score = ``-score_samples`` so higher is more anomalous."""

    input_ndim = 2

    def __init__(
        self,
        *,
        contamination: float = 0.01,
        n_estimators: int = 100,
        max_samples: int = 256,
        random_state: int = 0,
        n_jobs: int = 1,
    ) -> None:
        self.contamination = contamination
        self.n_estimators = n_estimators
        self.max_samples = max_samples
        self.random_state = random_state
        self.n_jobs = n_jobs

    def _validate_params(self) -> None:
        check_contamination("IsolationForestDetector", self.contamination)
        check_positive("IsolationForestDetector", "n_estimators", self.n_estimators, integer=True)
        check_positive("IsolationForestDetector", "max_samples", self.max_samples, integer=True)

    def fit(self, X: Any, y: Any = None) -> IsolationForestDetector:
        from sklearn.ensemble import (
            IsolationForest,  # lazy: keeps `import rankscope.models` light
        )

        self._validate_params()
        arr = self._check_X(X, fitting=True)
        self.model_ = IsolationForest(
            n_estimators=self.n_estimators,
            max_samples=min(self.max_samples, arr.shape[0]),
            random_state=self.random_state,
            n_jobs=self.n_jobs,
        ).fit(arr)
        self._set_outputs(-self.model_.score_samples(arr))
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        return -self.model_.score_samples(self._check_X(X, fitting=False))
