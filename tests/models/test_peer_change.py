"""The peer-change detector (ported from proto-metrics): contract, and the physics it promises (offsets and blips
name nobody, a job-wide change names nobody, one bad GPU and one bad NIC are found); the decision on top of it
(one machine named with reasons, many machines an imbalance, a healthy job healthy)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone

from rankscope.analytics.performance.metrics_decide import decide_peer_change
from rankscope.config import PerfConfig
from rankscope.datasets.domain.metrics import LevelCube, MetricCube
from rankscope.models import PeerChangeDetector
from rankscope.models._change import direction_of
from rankscope.spine import InputError


def _cube(x_gpu: np.ndarray, x_node: np.ndarray, block_s: float = 30.0) -> MetricCube:
    """x_gpu (machines, gpus, blocks, features), x_node (machines, blocks, 1)."""
    m, g, k, f = x_gpu.shape
    gpu = LevelCube(
        "gpu",
        x_gpu.reshape(m * g, k, f).astype(np.float32),
        np.repeat(np.arange(m), g),
        tuple(str(i % g) for i in range(m * g)),
        ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_SM_CLOCK")[:f],
        ("gauge",) * f,
    )
    node = LevelCube(
        "node", x_node.astype(np.float32), np.arange(m), (None,) * m, ("node_netstat_Tcp_RetransSegs",), ("counter",)
    )
    return MetricCube(tuple(f"m{i}" for i in range(m)), (gpu, node), 0.0, block_s, k)


def _healthy(rng, m=64, g=8, k=80):
    util = 90 + rng.normal(0, 1.5, (m, 1, k, 1)) + rng.normal(0, 0.4, (m, g, k, 1)) + rng.normal(0, 3, (m, g, 1, 1))
    clock = np.full((m, g, k, 1), 1410.0) - 15 * rng.integers(0, 3, (m, g, 1, 1))
    retr = rng.poisson(30, (m, k, 1)) / 30.0 * rng.lognormal(0, 0.5, (m, 1, 1))
    return np.concatenate([util, clock], axis=3), retr


def test_contract():
    det = PeerChangeDetector(continuity_s=300, false_alarms_per_1000_machine_hours=2.0)
    p = det.get_params()
    assert p["continuity_s"] == 300 and p["false_alarms_per_1000_machine_hours"] == 2.0
    assert clone(det).get_params() == p
    with pytest.raises(TypeError):
        PeerChangeDetector(300)  # keyword-only
    g, n = _healthy(np.random.default_rng(0))
    cube = _cube(g, n)
    assert det.fit(cube) is det
    assert det.decision_scores_.shape == (64,) and det.labels_.shape == (64,)
    assert np.isfinite(det.threshold_)
    np.testing.assert_allclose(det.decision_function(cube), det.decision_scores_)
    with pytest.raises(InputError, match="coverage"):
        PeerChangeDetector(coverage=2).fit(cube)


def test_array_input_in_seconds_per_step():
    X = np.random.default_rng(0).normal(size=(10, 50, 2))
    assert PeerChangeDetector(sample_interval_s=30).fit(X).labels_.shape == (10,)


def test_static_offsets_and_blips_name_nobody():
    g, n = _healthy(np.random.default_rng(1))
    g[3, :, :, 0] -= 12  # a machine that always ran slower: an offset, not a fault
    n[5] *= 20  # a host with background retransmits all along
    g[7, 2, 40:43, 1] = 1000  # a 90 s clock dip on one GPU
    n[9, 30:33, 0] += 50  # a 90 s retransmit burst
    assert PeerChangeDetector().fit(_cube(g, n)).labels_.sum() == 0


def test_job_wide_change_names_nobody():
    g, n = _healthy(np.random.default_rng(2))
    g[:, :, 40:, 0] -= 25  # everybody waits: a power cap, a slower phase
    g[:, :, 40:, 1] -= 200
    assert PeerChangeDetector().fit(_cube(g, n)).labels_.sum() == 0


def test_one_bad_gpu_and_one_bad_nic_are_found():
    g, n = _healthy(np.random.default_rng(3))
    g[11, 5, 40:, 1] -= 300  # one GPU throttles for the rest of the job
    n[20, 45:, 0] += 40  # one host starts retransmitting
    det = PeerChangeDetector().fit(_cube(g, n))
    assert set(np.flatnonzero(det.labels_)) == {11, 20}
    ev = det.evidence(11)[0]
    assert ev["feature"] == "DCGM_FI_DEV_SM_CLOCK" and ev["gpu"] == "5" and ev["direction"] == "down"
    assert abs(ev["onset_s"] - 40 * 30) <= 60


def test_the_onset_is_where_the_change_held_not_an_earlier_noisy_block():
    """A NIC's throughput falls at block 50 and stays down; ten minutes before, one noisy block dipped as far.
    The reported onset was that block (an outside tester's node_exporter case said 12:02 for a 12:07 fault)."""
    g, n = _healthy(np.random.default_rng(4))
    n[20, 50:, 0] += 40  # retransmits from block 50
    n[20, 38, 0] += 40  # one 30 s burst, 12 blocks (6 minutes) before
    det = PeerChangeDetector().fit(_cube(g, n))
    assert set(np.flatnonzero(det.labels_)) == {20}
    ev = det.evidence(20)[0]
    assert ev["feature"] == "node_netstat_Tcp_RetransSegs" and abs(ev["onset_s"] - 50 * 30) <= 60, ev


def test_directions():
    assert direction_of("DCGM_FI_DEV_SM_CLOCK") == "down"
    assert direction_of("DCGM_FI_DEV_GPU_TEMP") == "up"
    assert direction_of("node_netstat_Tcp_RetransSegs") == "up"
    assert direction_of("DCGM_FI_DEV_GPU_UTIL") == "both"
    assert direction_of("DCGM_FI_DEV_GPU_UTIL", {"UTIL": "down"}) == "down"


# -- the decision -------------------------------------------------------------------------------------


def _decide(cube, **params):
    det = PeerChangeDetector(**params).fit(cube)
    return decide_peer_change(cube, PerfConfig(), [], det=det), det


def test_one_machine_named_with_reasons_and_calibration():
    g, n = _healthy(np.random.default_rng(5))
    n[20, 45:, 0] += 40
    f, det = _decide(_cube(g, n))
    assert f.kind == "degraded" and f.named == ("m20",)
    assert any("node_netstat_Tcp_RetransSegs" in r and "rose" in r for r in f.reasons)
    cal = f.details["calibration"]
    assert cal["threshold"] == round(det.threshold_, 3) and cal["machines"] == 64 and cal["gumbel"]
    assert 0.5 <= f.confidence <= 0.99


def test_many_machines_are_an_imbalance_not_a_list():
    g, n = _healthy(np.random.default_rng(6))
    g[:20, :, 40:, 1] -= 300  # a third of the machines throttle together: not one machine's fault
    f, _ = _decide(_cube(g, n))
    assert f.named == () and f.kind == "imbalance"
    # with the shared-change check off, the count rule still refuses to name 20 machines
    f2, _ = _decide(_cube(g, n), max_shared_fraction=1.0)
    assert f2.named == () and f2.kind == "imbalance"
    assert "no machine is named" in " ".join(f2.reasons)


def test_healthy_job():
    g, n = _healthy(np.random.default_rng(7))
    f, _ = _decide(_cube(g, n))
    assert f.kind == "healthy" and f.named == ()


def test_small_healthy_job_names_nobody():
    # fewer than 11 machines: the calibration leans on q75 only; a healthy job still names nobody
    for seed in range(5):
        g, n = _healthy(np.random.default_rng(100 + seed), m=6)
        f, _ = _decide(_cube(g, n))
        assert f.named == (), (seed, f.reasons)


def test_four_machines_name_a_throttled_gpu_and_a_healthy_four_names_nobody():
    """With 4 machines q75 of the per-machine maxima lies between the second strongest and the strongest: a
    faulty machine set its own threshold, and an outside tester's 4-host DCGM scrapes with one GPU at 1350 MHz
    (or a whole host) were `healthy` (best score 3.9 against 11.1). The second strongest bounds the fit now."""
    for seed in range(5):
        g, n = _healthy(np.random.default_rng(200 + seed), m=4)
        f, _ = _decide(_cube(g, n))
        assert f.named == (), (seed, f.reasons)
        g[2, 5, 40:, 1] -= 600  # one GPU of m2 throttles for the rest of the job
        f, _ = _decide(_cube(g, n))
        assert f.named == ("m2",), (seed, f.reasons)
        g[2, :, 40:, 1] -= 600  # its whole machine
        f, _ = _decide(_cube(g, n))
        assert f.named == ("m2",), (seed, f.reasons)
