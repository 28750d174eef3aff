"""Public data loaders (skipped when ../shared/data is absent) and their error when it is."""

from __future__ import annotations

import pytest

from rankscope.analytics.performance.stragglers import find_stragglers
from rankscope.harness import public
from rankscope.spine import InputError


def _root_or_skip():
    try:
        return public.data_root()
    except InputError:
        pytest.skip("shared data folder absent")


def test_absent_folder_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="not found"):
        public.data_root(tmp_path / "missing")
    with pytest.raises(InputError, match="absent"):
        public.load_asd("omi-1", root=tmp_path)


def test_alibaba_job1_names_worker_6_and_its_onset():
    _root_or_skip()
    df = public.load_alibaba_job(1)
    assert df["rank"].n_unique() == 10 and df.height == 3000
    rep = find_stragglers(df)
    assert rep.slow_ranks[0].rank == 6
    assert 1780 <= rep.slow_ranks[0].onset_step <= 1850
    with pytest.raises(InputError, match="no such job"):
        public.load_alibaba_job(9)


def test_asd_and_jumpstarter_shapes():
    _root_or_skip()
    names = public.asd_entities()
    assert names[0] == "omi-1" and len(names) == 12
    e = public.load_asd("omi-1")
    assert e.train.shape[1] == e.test.shape[1] == 19 and e.labels.shape == (e.test.shape[0],)
    svc = public.jumpstarter_services(2)
    assert len(svc) == 30
    j = public.load_jumpstarter(2, svc[0])
    assert j.test.shape == (7200, 19) and set(j.labels.tolist()) <= {0, 1}
