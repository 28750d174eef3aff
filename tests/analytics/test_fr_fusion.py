"""Fusing the stack verdict with the Flight Recorder verdict."""

from __future__ import annotations

from pathlib import Path

from rankscope.analytics import collectives
from rankscope.analytics.fusion import fuse
from rankscope.analytics.verdict import Evidence, Verdict
from rankscope.datasets.domain.topology import Layout, Topology
from rankscope.datasets.readers.flight_recorder import read_fr_dir
from rankscope.harness.synthetic_fr import generate_fr


def _stacks(
    verdict: str = "hang",
    suspects: tuple[str, ...] = (),
    culprits: tuple[str, ...] = (),
    ranks: tuple[int, ...] = (),
    confidence: float = 0.7,
) -> Verdict:
    return Verdict(
        verdict,
        confidence=confidence,
        suspect_nodes=suspects,
        culprit_nodes=culprits,
        culprit_ranks=ranks,
        suspect_ranks=ranks,
        sources=("stacks",),
        reasons=("stack outliers",),
        evidence=(Evidence("stacks", "not-in-collective", "rank outside the collective", ranks),),
        n_snapshots=1,
    )


def _probe_fr(fr_gloo: Path) -> Verdict:
    """The probe's job re-captured through the hook (its dumps carry their capture time): a hang, rank 3."""
    topo = Topology.from_layout(Layout.parse("dp=4"), gpus_per_node=1)
    return collectives.verdict(collectives.facts(read_fr_dir(fr_gloo / "hang"), topo), topo, job="probe")


def test_agreement_raises_confidence_and_records_support(fr_gloo: Path) -> None:
    fr = _probe_fr(fr_gloo)
    st = _stacks(suspects=("node-3",), culprits=("node-3",), ranks=(3,))
    v = fuse(st, fr)
    assert v.verdict == "hang" and v.culprit_nodes == ("node-3",) and v.culprit_ranks == (3,)
    assert v.confidence > max(st.confidence, fr.confidence)
    assert v.sources == ("stacks", "flight_recorder")
    assert v.details["support"] == {"node-3": ["stacks", "flight_recorder"]}
    assert v.details["disagreements"] == []
    assert {e.source for e in v.evidence} == {"stacks", "flight_recorder"}
    assert "agree" in v.reasons[0]


def test_disagreement_is_stated_and_both_kept(fr_gloo: Path) -> None:
    fr = _probe_fr(fr_gloo)
    st = _stacks(suspects=("node-1", "node-2"), culprits=("node-2",), ranks=(2,))
    v = fuse(st, fr)
    assert v.verdict == "hang"
    assert set(v.culprit_nodes) == {"node-2", "node-3"} and set(v.suspect_nodes) == {"node-1", "node-2", "node-3"}
    assert v.confidence < max(st.confidence, fr.confidence)
    assert v.details["support"]["node-3"] == ["flight_recorder"] and v.details["support"]["node-2"] == ["stacks"]
    assert any("node-2" in d and "node-3" in d for d in v.details["disagreements"])
    assert any(r.startswith("Disagreement:") for r in v.reasons)


def test_single_source_passes_through(fr_gloo: Path) -> None:
    fr = _probe_fr(fr_gloo)
    v = fuse(None, fr)
    assert (v.verdict, v.culprit_nodes, v.confidence) == (fr.verdict, fr.culprit_nodes, fr.confidence)
    assert v.details["support"] == {"node-3": ["flight_recorder"]}
    st = _stacks(suspects=("node-1",), culprits=("node-1",), ranks=(1,))
    assert fuse(st, None).culprit_nodes == ("node-1",) and fuse(st, None).sources == ("stacks",)
    assert fuse(None, None).verdict == "inconclusive"


def test_fr_mismatch_leads_and_evicts_nothing() -> None:
    syn = generate_fr("tp=2,pp=2,dp=8", fault="size_mismatch", seed=3)
    fr = collectives.verdict(collectives.facts(syn.dumps(), syn.topology), syn.topology)
    st = _stacks(suspects=("node-0",), culprits=("node-0",), ranks=(0,))
    v = fuse(st, fr)
    assert v.verdict == "mismatch" and v.suspect_nodes == () and v.culprit_nodes == ()
    assert v.culprit_ranks == syn.truth.culprit_ranks
    assert any("code/config fault" in d for d in v.details["disagreements"])


def test_healthy_stacks_and_hung_fr_keep_the_hang_with_less_confidence(fr_gloo: Path) -> None:
    fr = _probe_fr(fr_gloo)
    v = fuse(_stacks("healthy", confidence=0.8), fr)
    assert v.verdict == "hang" and v.culprit_nodes == ("node-3",) and v.confidence < fr.confidence
    assert "stacks say healthy, the Flight Recorder says hang" in v.details["disagreements"]
    both_ok = fuse(
        _stacks("healthy", confidence=0.8),
        fr.with_updates(verdict="healthy", suspect_nodes=(), culprit_nodes=(), confidence=0.6),
    )
    assert both_ok.verdict == "healthy" and both_ok.suspect_nodes == () and both_ok.confidence == 0.6


def test_synthetic_hang_both_sources_agree() -> None:
    syn = generate_fr("tp=2,pp=4,dp=8", fault="missing", seed=0, at="tp", dumped_after_s=30)
    fr = collectives.verdict(collectives.facts(syn.dumps(), syn.topology), syn.topology, job="j")
    culprit = syn.truth.culprit_ranks[0]
    group = syn.topology.group_of("tp", culprit)
    st = _stacks(suspects=group.nodes, culprits=(syn.topology.node_of(culprit),), ranks=(culprit,))
    v = fuse(st, fr)
    assert v.culprit_ranks == (culprit,) and v.culprit_nodes == (syn.topology.node_of(culprit),)
    assert set(group.nodes) <= set(v.suspect_nodes)
    assert all("flight_recorder" in v.details["support"][n] for n in fr.suspect_nodes)
    assert v.to_dict()["details"]["support"]


def test_one_severity_order_for_fusion_and_combination() -> None:
    """crash > mismatch > hang > fail-slow > degraded > imbalance > inconclusive > healthy, in both places
    (issue 9: fusion used to put healthy above inconclusive, the combiner hang above mismatch)."""
    from rankscope.analytics.fusion import combine
    from rankscope.analytics.verdict import VERDICTS, Severity

    assert VERDICTS == ("crash", "mismatch", "hang", "fail-slow", "degraded", "imbalance", "inconclusive", "healthy")
    healthy = Verdict("healthy", confidence=0.9, sources=("stacks",))
    unsure = Verdict("inconclusive", confidence=0.3, sources=("flight_recorder",))
    assert fuse(healthy, unsure).verdict is Severity.INCONCLUSIVE  # never hidden behind healthy
    hang = Verdict("hang", confidence=0.9, suspect_nodes=("node-1",), culprit_nodes=("node-1",), sources=("stacks",))
    mismatch = Verdict("mismatch", confidence=0.9, culprit_ranks=(3,), sources=("flight_recorder",))
    assert combine([hang, mismatch]).verdict == "mismatch"  # definite evidence of a code fault leads
    assert combine([mismatch, Verdict("crash", confidence=0.9, sources=("events",))]).verdict == "crash"
    assert fuse(hang, mismatch).verdict == "mismatch" and fuse(hang, mismatch).suspect_nodes == ()


def test_probe_fr_without_a_clock_leaves_the_stacks_to_lead(probe_dir: Path) -> None:
    """The probe's own FR dumps carry no capture time: inconclusive, naming nobody; its stacks still lead."""
    topo = Topology.from_layout(Layout.parse("dp=4"), gpus_per_node=1)
    fr = collectives.verdict(collectives.facts(read_fr_dir(probe_dir / "fr"), topo), topo, job="probe")
    assert fr.verdict == "inconclusive" and fr.suspect_nodes == () and fr.culprit_nodes == ()
    v = fuse(_stacks(suspects=("node-3",), culprits=("node-3",), ranks=(3,)), fr)
    assert v.verdict == "hang" and v.culprit_nodes == ("node-3",) and v.suspect_nodes == ("node-3",)
