"""One parametrized conformance suite over every registered detector (scikit-learn + pyod contract)."""

from __future__ import annotations

import numpy as np
import pytest

from rankscope.models import DETECTORS, NotFittedError, make_detector
from rankscope.spine import InputError, RankscopeError

SMALL = {
    "peer-change": {"continuity_s": 60.0, "baseline_s": 60.0, "min_baseline_s": 30.0},
    "peer-distance": {"window_s": 10.0, "continuity_s": 60.0},
    "peer-mad": {"window_s": 10.0, "continuity_s": 60.0},
    "mad": {},
    "iforest": {"n_estimators": 30},
    "lstm-vae": {"epochs": 2, "max_windows": 128, "seq_len": 6, "hidden": 8},
}


def _params():
    out = []
    for name in DETECTORS:
        marks = [pytest.mark.torch] if DETECTORS[name].requires_torch else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def _detector(name):
    if DETECTORS[name].requires_torch:
        pytest.importorskip("torch")
    return make_detector(name, **SMALL[name])


def _data(det, seed=0):
    """Inliers plus obvious outliers; returns X and the outlier indices (samples or machines)."""
    rng = np.random.default_rng(seed)
    if det.input_ndim == 3:
        X = rng.normal(size=(12, 300, 3)).astype(np.float32)
        X[:, :, 1] += np.sin(np.arange(300) / 5.0)  # shared "training" periodicity
        X[0, 120:, 0] += 8.0  # a lasting change from t=120 (peer-change sees changes, not static offsets)
        return X, np.array([0])
    X = rng.normal(size=(240, 4))
    X[[50, 120, 200], :] += 9.0
    return X, np.array([50, 120, 200])


def test_every_detector_is_covered():
    assert set(SMALL) == set(DETECTORS)


@pytest.mark.parametrize("name", _params())
def test_fit_returns_self_and_sets_outputs(name):
    det = _detector(name)
    X, _ = _data(det)
    assert det.fit(X) is det
    n = X.shape[0]
    assert det.decision_scores_.shape == (n,)
    assert np.isfinite(det.threshold_)
    np.testing.assert_array_equal(det.labels_, (det.decision_scores_ > det.threshold_).astype(int))
    assert det.n_features_in_ == X.shape[-1]


@pytest.mark.parametrize("name", _params())
def test_higher_score_means_more_anomalous(name):
    det = _detector(name)
    X, out = _data(det)
    scores = det.fit(X).decision_function(X)
    inliers = np.setdiff1d(np.arange(X.shape[0]), out)
    assert scores[out].min() > np.median(scores[inliers])
    assert det.predict(X)[out].all()


@pytest.mark.parametrize("name", _params())
def test_use_before_fit_is_a_clear_error(name):
    det = _detector(name)
    X, _ = _data(det)
    with pytest.raises(NotFittedError, match="not fitted"):
        det.decision_function(X)
    assert issubclass(NotFittedError, RankscopeError)


@pytest.mark.parametrize("name", _params())
def test_bad_shapes_are_rejected_naming_the_shape(name):
    det = _detector(name)
    X, _ = _data(det)
    wrong = X.reshape(X.shape[0], -1) if X.ndim == 3 else X[..., None]
    with pytest.raises(InputError, match=r"X must have shape"):
        det.fit(wrong)
    det.fit(X)
    with pytest.raises(InputError, match="features"):
        det.decision_function(X[..., :-1])
    with pytest.raises(InputError, match="X"):
        det.fit(np.full_like(X, np.inf))


@pytest.mark.parametrize("name", _params())
def test_params_round_trip(name):
    det = _detector(name)
    params = det.get_params()
    assert params and all(k in repr(det) for k in params)
    clone = type(det)(**params)
    assert clone.get_params() == params
    with pytest.raises(InputError, match="unknown parameter"):
        det.set_params(no_such_knob=1)


@pytest.mark.parametrize("name", [n for n in DETECTORS if DETECTORS[n].input_ndim == 3])
def test_peer_detectors_need_three_machines_and_tolerate_gaps(name):
    det = _detector(name)
    X, _ = _data(det)
    with pytest.raises(InputError, match="at least 3"):
        det.fit(X[:2])
    X = X.copy()
    X[3, 10:20, :] = np.nan
    assert det.fit(X).labels_[0] == 1


def test_peer_alert_needs_continuity():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(20, 600, 2)).astype(np.float32)
    X[4, 100:130, 0] += 20  # a 30 s blip: shorter than the 120 s continuity window
    X[7, 300:, 1] += 20  # a lasting fault from t=300
    det = make_detector("peer-distance", window_s=10.0, continuity_s=120.0).fit(X)
    alerts = det.detect(X)
    assert list(alerts.alerted) == [7]
    assert 290 <= alerts.onset_index[7] <= 310
    assert alerts.alert_index[7] - alerts.onset_index[7] >= 0.8 * 120 - 10  # quorum: 80 % of the continuity
    assert alerts.drivers(7)[0] == 1


def test_registry_lists_valid_names():
    with pytest.raises(InputError, match="valid detectors: .*peer-distance"):
        make_detector("nope")
    with pytest.raises(InputError, match="detector 'mad'"):
        make_detector("mad", bogus=1)


def test_invalid_hyperparameters_name_the_parameter():
    with pytest.raises(InputError, match="contamination"):
        make_detector("mad", contamination=0.9).fit(np.zeros((10, 2)))
    with pytest.raises(InputError, match="window_s"):
        make_detector("peer-distance", window_s=-1).fit(np.zeros((5, 50, 1)))
    with pytest.raises(InputError, match="denoiser"):
        make_detector("peer-distance", denoiser="gru").fit(np.zeros((5, 50, 1)))


@pytest.mark.torch
def test_peer_distance_with_lstm_vae_denoiser():
    pytest.importorskip("torch")
    X, _ = _data(make_detector("peer-distance"))
    det = make_detector(
        "peer-distance",
        window_s=10.0,
        continuity_s=60.0,
        denoiser="lstm-vae",
        denoiser_epochs=2,
        denoiser_max_windows=64,
    )
    det.fit(X)
    assert len(det.denoisers_) == X.shape[2]
    assert det.labels_[0] == 1


def test_importing_detectors_does_not_need_torch():
    # scikit-learn is imported: the detectors subclass its BaseEstimator (issue 9); torch stays lazy
    import subprocess
    import sys

    code = "import sys, rankscope.models, rankscope.analytics.performance.decide; print(int('torch' in sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.split() == ["0"]
