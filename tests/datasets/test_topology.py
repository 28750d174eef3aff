"""Topology: coordinates, groups and layouts (property tests with hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankscope.datasets.domain.topology import (
    DIMS,
    KINDS,
    Layout,
    Topology,
    parse_layout,
    parse_order,
)
from rankscope.spine import LayoutError

sizes = st.sampled_from([1, 2, 3, 4])


@st.composite
def layouts(draw):
    order = draw(st.permutations(list(DIMS)))
    lay = Layout(
        tp=draw(sizes),
        cp=draw(st.sampled_from([1, 2])),
        ep=draw(st.sampled_from([1, 2])),
        dp=draw(sizes),
        pp=draw(sizes),
        order=tuple(order),
    )
    gpn = draw(st.sampled_from([d for d in (1, 2, 4, 8) if lay.world_size % d == 0]))
    return lay, gpn


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_each_kind_of_group_partitions_the_ranks(arg):
    lay, gpn = arg
    topo = Topology.from_layout(lay, gpus_per_node=gpn)
    assert topo.world_size == lay.world_size
    for kind in KINDS:
        groups = topo.groups(kind)
        seen = np.concatenate([np.asarray(g.ranks) for g in groups])
        assert sorted(seen.tolist()) == list(range(topo.world_size))
        assert all(len(g.ranks) == topo.group_size(kind) for g in groups)
        assert len(groups) * topo.group_size(kind) == topo.world_size


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_sizes_multiply_to_world_and_coordinates_are_unique(arg):
    lay, gpn = arg
    topo = Topology.from_layout(lay, gpus_per_node=gpn)
    assert np.prod([topo.sizes[d] for d in DIMS]) == topo.world_size
    key = np.zeros(topo.world_size, dtype=np.int64)
    for d in DIMS:
        assert topo.coords[d].max(initial=0) < topo.sizes[d]
        key = key * topo.sizes[d] + topo.coords[d]
    assert np.unique(key).size == topo.world_size
    # members of one group differ only along that dimension
    for kind in ("tp", "pp", "dp"):
        for g in topo.groups(kind)[:3]:
            r = np.asarray(g.ranks)
            for d in DIMS:
                if d != kind:
                    assert np.unique(topo.coords[d][r]).size == 1


@settings(max_examples=30, deadline=None)
@given(layouts())
def test_from_table_with_coordinates_round_trips(arg):
    lay, gpn = arg
    topo = Topology.from_layout(lay, gpus_per_node=gpn)
    rows = topo.to_rows("j")
    again = Topology.from_table(
        [r["rank"] for r in rows], [r["node"] for r in rows], coords={d: [r[d] for r in rows] for d in DIMS}
    )
    for kind in ("tp", "pp", "dp"):
        a = {frozenset(g.ranks) for g in topo.groups(kind)}
        b = {frozenset(g.ranks) for g in again.groups(kind)}
        assert a == b
    assert again.node_names == topo.node_names


def test_megatron_default_order_puts_tp_on_consecutive_ranks():
    topo = Topology.from_layout(Layout.parse("tp=8,pp=4,dp=32"), gpus_per_node=8)
    assert topo.group_of("tp", 13).ranks == tuple(range(8, 16))
    assert topo.group_of("pp", 0).ranks == (0, 256, 512, 768)
    assert topo.group_of("dp", 0).ranks == tuple(range(0, 256, 8))
    assert topo.group_of("tp", 13).nodes == ("node-1",)
    assert len(topo.group_of("mp", 0).nodes) == 4


def test_order_override_changes_groups():
    topo = Topology.from_layout(Layout.parse("tp=2,dp=2,pp=2", order="pp-tp-dp"), gpus_per_node=2)
    assert topo.group_of("pp", 0).ranks == (0, 1)


@pytest.mark.parametrize(
    "text, msg",
    [
        ("tp=0,dp=2", "at least 1"),
        ("xx=2", "unknown dimension"),
        ("tp=2,tp=4", "twice"),
        ("tp:2", "cannot read"),
        ("", "no dimensions"),
    ],
)
def test_bad_layouts_get_clear_errors(text, msg):
    with pytest.raises(LayoutError, match=msg):
        parse_layout(text)


def test_bad_order_and_gpus_per_node():
    with pytest.raises(LayoutError, match="unknown dimension"):
        parse_order("tp-zz")
    with pytest.raises(LayoutError, match="twice"):
        parse_order("tp-tp")
    with pytest.raises(LayoutError, match="not a multiple"):
        Topology.from_layout(Layout.parse("tp=3,dp=1"), gpus_per_node=2)


def test_inconsistent_tables_are_rejected():
    with pytest.raises(LayoutError, match="appears twice"):
        Topology.from_table([0, 0, 1], ["a", "a", "b"])
    with pytest.raises(LayoutError, match="missing"):
        Topology.from_table([0, 2], ["a", "b"])
    with pytest.raises(LayoutError, match="world size"):
        Topology.from_table([0, 1, 2], ["a", "a", "b"], layout=Layout.parse("tp=2,dp=2"))
    with pytest.raises(LayoutError, match="multiply"):
        Topology.from_table([0, 1, 2], ["a", "a", "b"], coords={"tp": [0, 1, 0], "dp": [0, 0, 1]})
