"""Flight Recorder analysis: injected culprits found (and only them), mismatches, clean runs, the gloo probe."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.analytics import collectives
from rankscope.datasets.domain.flight_recorder import FRDump, PGInfo
from rankscope.datasets.domain.topology import Layout, Topology
from rankscope.datasets.readers.flight_recorder import read_fr_dir
from rankscope.harness.synthetic_fr import generate_fr
from rankscope.spine import InputError

LAYOUTS = ("tp=2,pp=4,dp=8", "tp=4,pp=2,dp=8", "tp=8,dp=8", "pp=4,dp=16")


def test_real_gloo_probe_names_rank_3(probe_dir: Path) -> None:
    """torchfrtrace crashes on these dumps (gloo leaves pg_config empty); rankscope names rank 3."""
    for dumps in (read_fr_dir(probe_dir / "fr"), read_fr_dir(probe_dir / "fr", prefix="fr_hang_rank")):
        a = collectives.facts(dumps)
        assert a.status == "hang" and a.culprit_ranks == (3,) and a.missing_ranks == (3,)
        assert a.stopped_pg == "0" and a.stopped_kind == "world"
        assert a.stalls[0].seq == 6 and a.stalls[0].waiting_ranks == (0, 1, 2)
        assert a.stalls[0].progress[3] == (5, 5, 5) and a.stalls[0].progress[0][::2] == (6, 5)  # enqueued, completed
        assert a.evidence[0].source == "flight_recorder" and a.evidence[0].ranks == (3,)
    topo = Topology.from_layout(Layout.parse("dp=4"), gpus_per_node=1)
    v = collectives.verdict(collectives.facts(read_fr_dir(probe_dir / "fr"), topo), topo, job="probe")
    assert v.verdict == "hang" and v.culprit_nodes == ("node-3",) and v.suspect_nodes == ("node-3",)
    assert v.sources == ("flight_recorder",) and "rank(s) 3 never enqueued" in v.explain()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fault", ["missing", "p2p_behind"])
@pytest.mark.parametrize("seed", [0, 1])
def test_injected_hang_culprits_are_named_and_only_them(layout: str, fault: str, seed: int) -> None:
    if fault == "p2p_behind" and "pp" not in layout:
        pytest.skip("no pipeline")
    syn = generate_fr(layout, fault=fault, seed=seed, n_culprits=1 + seed)
    a = collectives.facts(syn.dumps(), syn.topology)
    assert a.status == "hang"
    assert a.culprit_ranks == syn.truth.culprit_ranks
    v = collectives.verdict(a, syn.topology)
    assert v.verdict == "hang" and set(v.culprit_nodes) == set(syn.topology.nodes_of(syn.truth.culprit_ranks))
    assert set(v.culprit_nodes) <= set(v.suspect_nodes)
    if a.stopped_kind in ("tp", "pp"):  # a model-parallel group is the fault domain: isolate it whole
        assert v.suspect_group is not None and v.suspect_group.kind == a.stopped_kind
        assert set(syn.topology.group_of(a.stopped_kind, a.culprit_ranks[0]).nodes) <= set(v.suspect_nodes)


def test_wavefront_prefers_the_model_parallel_group() -> None:
    syn = generate_fr("tp=2,pp=4,dp=8", fault="missing", seed=0, at="tp")
    assert syn.truth.pg_kind == "tp"
    a = collectives.facts(syn.dumps(), syn.topology)
    assert a.stopped_kind == "tp" and a.stopped_pg == syn.truth.pg_name
    assert len(a.stalls) > 1  # DP and default groups stall too, downstream of the TP stall


@pytest.mark.parametrize(
    "fault, field", [("size_mismatch", "sizes"), ("op_mismatch", "op"), ("dtype_mismatch", "dtypes")]
)
def test_mismatch_is_a_code_fault_not_a_machine(fault: str, field: str) -> None:
    syn = generate_fr("tp=2,pp=2,dp=8", fault=fault, seed=3)
    a = collectives.facts(syn.dumps(), syn.topology)
    assert a.status == "mismatch" and a.culprit_ranks == ()
    assert a.mismatch_ranks == syn.truth.culprit_ranks and a.mismatches[0].field == field
    assert a.mismatches[0].majority
    v = collectives.verdict(a, syn.topology)
    assert v.verdict == "mismatch" and v.suspect_nodes == () and v.culprit_ranks == syn.truth.culprit_ranks
    assert "code or configuration fault" in v.explain()


def test_a_two_member_mismatch_names_both_without_a_majority() -> None:
    syn = generate_fr("tp=2,dp=2", fault="size_mismatch", seed=0)
    a = collectives.facts(syn.dumps(), syn.topology)
    assert a.status == "mismatch" and not a.mismatches[0].majority
    assert set(syn.truth.culprit_ranks) < set(a.mismatch_ranks)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_clean_run_has_no_culprit(layout: str) -> None:
    syn = generate_fr(layout, fault="clean", seed=0)
    a = collectives.facts(syn.dumps(), syn.topology)
    assert a.status == "healthy" and a.culprit_ranks == () and a.mismatches == () and a.stalls == ()
    assert collectives.verdict(a, syn.topology).verdict == "healthy"


def test_slow_rank_from_durations() -> None:
    syn = generate_fr("tp=2,pp=4,dp=8", fault="slow", seed=1)
    a = collectives.facts(syn.dumps(), syn.topology)
    assert a.status == "fail-slow" and a.slow_ranks == syn.truth.culprit_ranks
    assert max(a.slow_scores, key=a.slow_scores.get) == syn.truth.culprit_ranks[0]  # type: ignore[arg-type]
    assert collectives.verdict(a, syn.topology).verdict == "fail-slow"


@pytest.mark.parametrize("fault", ["missing", "p2p_behind", "size_mismatch"])
def test_wrapped_ring_buffers(fault: str) -> None:
    syn = generate_fr("tp=2,pp=4,dp=8", fault=fault, seed=2, buffer_entries=5)
    a = collectives.facts(syn.dumps(), syn.topology)
    got = a.mismatch_ranks if fault.endswith("mismatch") else a.culprit_ranks
    assert got == syn.truth.culprit_ranks


def test_missing_dumps_of_bystanders_and_of_the_culprit() -> None:
    syn = generate_fr("tp=2,pp=4,dp=8", fault="missing", seed=4)
    culprit = syn.truth.culprit_ranks[0]
    dumps = syn.dumps()
    bystanders = [d for d in dumps if d.rank % 5 != 0 or d.rank == culprit]
    a = collectives.facts(bystanders, syn.topology)
    assert a.culprit_ranks == (culprit,)
    dead = [d for d in dumps if d.rank != culprit]  # the culprit's process died: no dump
    a = collectives.facts(dead, syn.topology)
    assert a.culprit_ranks == (culprit,) and culprit in a.no_dump_ranks
    assert any(e.kind == "missing-dump" for e in a.evidence)


def _as_gloo(dumps: list[FRDump]) -> list[FRDump]:
    """What gloo writes: no pg_config."""
    from dataclasses import replace

    return [replace(d, pg_config={}) for d in dumps]


def test_membership_without_pg_config_from_topology_or_memberships() -> None:
    syn = generate_fr("tp=4,pp=2,dp=4", fault="missing", seed=5)
    gloo = _as_gloo(syn.dumps())
    a = collectives.facts(gloo, syn.topology)
    assert a.culprit_ranks == syn.truth.culprit_ranks
    memberships = {}  # what the live hook records: every group's members (here: from the generator)
    for d in syn.raw.values():
        for name, cfg in d["pg_config"].items():
            memberships[name] = [int(x) for x in cfg["ranks"].strip("[]").split(",")]
    b = collectives.facts(gloo, None, memberships=memberships)
    assert b.culprit_ranks == syn.truth.culprit_ranks


def test_split_group_reusing_a_name_keeps_groups_apart() -> None:
    syn = generate_fr("tp=2,dp=2", fault="clean", steps=1)
    dumps = syn.dumps()
    renamed = []
    for d in dumps:  # both TP groups renamed "tp": pg_config members tell them apart
        tp_name = next(n for n, k in syn.pg_kinds.items() if k == "tp" and n in d.pg_config)
        cfg = {
            ("tp" if n == tp_name else n): (PGInfo("tp", c.desc, c.ranks) if n == tp_name else c)
            for n, c in d.pg_config.items()
        }
        entries = tuple(e._replace(pg_name="tp") if e.pg_name == tp_name else e for e in d.entries)
        renamed.append(FRDump(d.rank, entries, d.version, cfg, {}, source_file=d.source_file))
    a = collectives.facts(renamed, syn.topology)
    assert a.status == "healthy" and a.mismatches == ()


def test_bad_input() -> None:
    with pytest.raises(InputError, match="no Flight Recorder dumps"):
        collectives.facts([])
    syn = generate_fr("dp=8", fault="clean", steps=1)
    with pytest.raises(InputError, match="topology has 4 ranks"):
        collectives.facts(syn.dumps(), Topology.from_layout(Layout.parse("dp=4"), gpus_per_node=4))


def test_result_is_frozen_and_serializable() -> None:
    import json

    a = collectives.facts(generate_fr("tp=2,dp=4", fault="missing").dumps())
    json.dumps(a.to_dict())
    assert a.explain().startswith("Flight Recorder: HANG")
    with pytest.raises(AttributeError):
        a.status = "healthy"  # type: ignore[misc]


_MISSING = re.compile(r"missing ranks: \{([\d,\s]*)\}")
_CULPRIT = re.compile(r"Culprit rank (\d+)")


def _torchfrtrace(directory: Path) -> tuple[int, set[int], set[int], str]:
    code = "import sys; from torch.distributed.flight_recorder.fr_trace import main; main(sys.argv[1:])"
    p = subprocess.run(
        [sys.executable, "-c", code, str(directory)], check=False, capture_output=True, text=True, timeout=240
    )
    text = p.stdout + p.stderr
    missing = {int(x) for m in _MISSING.finditer(text) for x in m.group(1).replace(" ", "").split(",") if x}
    culprits = {int(m.group(1)) for m in _CULPRIT.finditer(text)}
    return p.returncode, missing, culprits, text


@pytest.mark.torch
@pytest.mark.slow
def test_agrees_with_torchfrtrace_where_it_names_a_culprit(tmp_path: Path) -> None:
    """Small, pipeline-free dumps (torchfrtrace misreads 3+ stage pipelines); one run per case."""
    pytest.importorskip("torch")
    cases = [("missing", 0), ("size_mismatch", 1), ("clean", 0)]
    for fault, seed in cases:
        syn = generate_fr("tp=2,dp=4", fault=fault, seed=seed)
        d = tmp_path / fault
        syn.write(d)
        rc, missing, culprits, text = _torchfrtrace(d)
        assert rc == 0, text[-500:]
        a = collectives.facts(read_fr_dir(d), syn.topology)
        if fault == "clean":
            assert not missing and not culprits and a.status == "healthy"
        elif fault == "size_mismatch":
            assert culprits == set(a.mismatch_ranks) == set(syn.truth.culprit_ranks)
        else:
            assert set(a.culprit_ranks) <= missing  # it names the culprit among every group's missing ranks
            assert a.culprit_ranks == syn.truth.culprit_ranks


def test_a_member_that_never_used_the_group_is_missing_from_it() -> None:
    """NCCL records a group in pg_config/pg_status only once the rank used it: absence = never reached."""
    from dataclasses import replace

    syn = generate_fr("tp=4,dp=2", fault="missing", steps=1, at="tp", seed=1)
    culprit = syn.truth.culprit_ranks[0]
    dumps = []
    for d in syn.dumps():
        if d.rank == culprit:
            tp = next(n for n, k in syn.pg_kinds.items() if k == "tp" and n in d.pg_config)
            assert not any(e.pg_name == tp for e in d.entries)  # it stopped before its first TP collective
            d = replace(
                d,
                pg_config={n: c for n, c in d.pg_config.items() if n != tp},
                pg_status={n: s for n, s in d.pg_status.items() if n != tp},
            )
        dumps.append(d)
    a = collectives.facts(dumps, syn.topology)
    assert a.culprit_ranks == (culprit,) and a.stopped_kind == "tp"
