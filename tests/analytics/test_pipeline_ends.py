"""Which adjacent pipeline stages are both ends of a stuck transfer (:func:`pipeline_ends`), from the Megatron
call each stage is blocked in: one pipeline of 4 stages (pp=4, one rank a stage), stage s = rank s."""

from __future__ import annotations

import pytest

from rankscope.analytics.stacks.clustering import Cluster
from rankscope.analytics.stacks.culprits import pipeline_ends
from rankscope.datasets.domain.topology import Layout, Topology

TOPO = Topology.from_layout(Layout.parse("pp=4"), gpus_per_node=1)


def _clusters(calls: dict[int, str]) -> list[Cluster]:
    """One cluster per stage: blocked in ``calls[stage]`` (a p2p function), or computing when absent."""
    out = []
    for rank in range(4):
        fn = calls.get(rank)
        sig = (
            ("train@train.py", f"{fn}@p2p_communication.py", "_communicate@p2p_communication.py")
            if fn
            else ("train@train.py", "forward@model.py")
        )
        out.append(Cluster(rank, "trainer", sig, (rank,), (rank,), "p2p" if fn else "compute", "", False, ()))
    return out


@pytest.mark.parametrize(
    ("calls", "ends"),
    [
        # mutual receives: stage 1 waits for gradients from 2, stage 2 for activations from 1: a deadlock
        ({1: "recv_backward", 2: "recv_forward"}, (1, 2)),
        # mutual sends with no receive posted on either side
        ({1: "send_forward", 2: "send_backward"}, (1, 2)),
        # 1F1B steady state at the last link: both ends' transfers on that link alone, matched, never completing
        ({2: "send_forward_recv_backward", 3: "send_backward_recv_forward"}, (2, 3)),
        # a send met by its receive, the sender waiting for the reply that needs the receiver: a lost message
        ({2: "send_forward_recv_backward", 3: "recv_forward"}, (2, 3)),
        # a chain toward stage 2, which computes: stages 0-1 wait for gradients, stage 3 for activations
        ({0: "send_backward_recv_backward", 1: "send_backward_recv_backward", 3: "send_forward_recv_forward"}, ()),
        # the same chain toward stage 1 on the other side
        ({0: "send_forward_recv_forward", 2: "send_forward_recv_forward", 3: "send_forward_recv_forward"}, ()),
        # a stage waits on a neighbour that computes: that neighbour is where the wait ends, not a link
        ({1: "send_forward_recv_backward"}, ()),
        # the four-way call in the middle, its neighbours in matched chains on both sides
        (
            {
                1: "send_backward_recv_backward",
                2: "send_forward_backward_recv_forward_backward",
                3: "send_forward_recv_forward",
            },
            (),
        ),
    ],
)
def test_pipeline_ends(calls, ends):
    assert pipeline_ends(_clusters(calls), TOPO) == ends
