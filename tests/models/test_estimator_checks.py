"""scikit-learn's own estimator checks over every registered detector, where they apply.

The detectors are scikit-learn estimators (``BaseEstimator``) with pyod's outputs, but they take their
own input (3-D ``(machines, times, metrics)`` for the peer detectors) and raise rankscope's ``InputError``
rather than ``ValueError`` for bad input, so the checks that feed arbitrary 2-D data with targets do not
apply. The parameter protocol checks do, for every detector: get/set params invariance, nothing set in
``__init__``, default-constructible, ``clone``, and the unfitted check (``NotFittedError``).
"""

from __future__ import annotations

import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.utils import estimator_checks as ec

from rankscope.models import DETECTORS, NotFittedError

CHECKS = (
    ec.check_get_params_invariance,
    ec.check_set_params,
    ec.check_no_attributes_set_in_init,
    ec.check_parameters_default_constructible,
    ec.check_estimators_unfitted,
)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_sklearn_check(name: str, check) -> None:
    check(DETECTORS[name].__name__, DETECTORS[name]())


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_clone_keeps_every_parameter(name: str) -> None:
    det = DETECTORS[name]()
    assert clone(det).get_params() == det.get_params()
    assert issubclass(NotFittedError, SklearnNotFittedError)  # scikit-learn's tools recognise it
