"""Timing stragglers: a slow machine is blamed; a slow stage, data imbalance or job-wide slowdown is not."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from rankscope.analytics.performance.stragglers import find_stragglers
from rankscope.config import StragglerConfig
from rankscope.datasets.domain.topology import Layout, Topology
from rankscope.harness.synthetic_metrics import make_timings
from rankscope.spine import InputError


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("layout, gpus", [("tp=2,pp=4,dp=8", 8), ("tp=2,pp=2,dp=4", 4)])  # 4 or 2 nodes per stage
def test_slow_machine_is_blamed_with_onset(seed, layout, gpus):
    df, topo, truth = make_timings(layout, scenario="slow-machine", gpus_per_node=gpus, seed=seed)
    rep = find_stragglers(df, topo)
    assert rep.slow_nodes == truth.slow_nodes
    assert {s.onset_step for s in rep.slow_ranks} == {truth.onset_step}
    assert all(1.3 < s.ratio < 1.5 for s in rep.slow_ranks)
    assert not rep.imbalances
    assert set(rep.slow_ranks[0].ops) == {"forward", "backward"}


@pytest.mark.parametrize(
    "scenario, kind", [("slow-stage", "stage"), ("data-imbalance", "data"), ("global-slowdown", "job-wide")]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_imbalance_blames_no_machine(scenario, kind, seed):
    df, topo, truth = make_timings("tp=2,pp=4,dp=8", scenario=scenario, seed=seed)
    rep = find_stragglers(df, topo)
    assert rep.slow_ranks == ()
    assert kind in {i.kind for i in rep.imbalances}
    if scenario == "slow-stage":
        assert any(f"stage {truth.slow_stage}" in i.reason for i in rep.imbalances)


def test_healthy_job_has_nothing():
    df, topo, _ = make_timings("tp=2,pp=2,dp=4", scenario="healthy", seed=3)
    rep = find_stragglers(df, topo)
    assert rep.slow_ranks == () and rep.imbalances == ()


def test_one_noisy_step_blames_no_one():
    df, topo, _ = make_timings("tp=1,pp=1,dp=16", scenario="healthy", gpus_per_node=1, seed=4)
    df = df.with_columns(
        pl.when((pl.col("rank") == 5) & (pl.col("step") == 50))
        .then(pl.col("duration_s") * 10)
        .otherwise(pl.col("duration_s"))
        .alias("duration_s")
    )
    assert find_stragglers(df, topo).slow_ranks == ()


def test_topology_from_columns_and_pure_data_parallel():
    df, _, truth = make_timings("tp=2,pp=4,dp=8", scenario="slow-machine", seed=5)
    assert find_stragglers(df).slow_nodes == truth.slow_nodes  # tp/pp/dp columns give the layout
    bare = df.drop("tp", "pp", "dp", "node", "start_s")
    rep = find_stragglers(bare)
    assert rep.peer_kind == "all ranks"
    assert rep.slow_nodes and all(n.startswith("rank-") for n in rep.slow_nodes)


def test_unfit_topology_falls_back_on_the_timing_columns():
    df, _, truth = make_timings("tp=2,pp=2,dp=4", scenario="slow-machine", gpus_per_node=4, seed=0)
    small = find_stragglers(df, Topology.from_layout(Layout.parse("dp=8"), gpus_per_node=8))
    assert "outside the given topology" in small.notes[0] and small.slow_nodes == truth.slow_nodes
    flat = find_stragglers(df, Topology.from_layout(Layout.parse("dp=16"), gpus_per_node=4))
    assert "pure data parallel" in flat.notes[0] and flat.peer_kind.startswith("same pipeline stage")
    with pytest.raises(InputError, match="ranks must be"):
        find_stragglers(df.filter(pl.col("rank") != 3), Topology.from_layout(Layout.parse("dp=8"), gpus_per_node=8))


def test_bad_input_is_named():
    with pytest.raises(InputError, match="missing column"):
        find_stragglers(pl.DataFrame({"rank": [0], "step": [1]}))
    with pytest.raises(InputError, match="negative"):
        find_stragglers(
            pl.DataFrame({"rank": [0, 1, 2], "step": [0, 0, 0], "op": ["f"] * 3, "duration_s": [1.0, -1.0, 1.0]})
        )
    with pytest.raises(InputError, match="min_slowdown_ratio"):
        StragglerConfig(min_slowdown_ratio=0.9)


def test_report_is_serializable():
    df, topo, _ = make_timings("tp=2,pp=2,dp=4", scenario="slow-machine", gpus_per_node=4, seed=1)
    rep = find_stragglers(df, topo)
    d = rep.to_dict()
    assert d["slow_ranks"] and isinstance(rep.explain(), str)
    assert np.isfinite(d["slow_ranks"][0]["ratio"])


def test_waiting_in_collectives_is_not_blamed():
    from rankscope.analytics.performance.timings import is_comm_op

    assert is_comm_op("dp-allreduce") and is_comm_op("pp_send") and not is_comm_op("backward")
    df, topo, truth = make_timings("tp=2,pp=4,dp=8", scenario="slow-machine", seed=6)
    # the other node of the slow node's data-parallel groups waits ~0.4 s longer in every all-reduce
    rep = find_stragglers(df, topo)
    assert rep.slow_nodes == truth.slow_nodes
    only_comm = find_stragglers(df.filter(pl.col("op") == "dp-allreduce"), topo)
    assert only_comm.ops == ("dp-allreduce",)  # with nothing else, the comm op is analyzed as it is
