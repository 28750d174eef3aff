"""Flight Recorder analysis: injected culprits found (and only them), mismatches, clean runs, the gloo probe."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rankscope.analytics import collectives
from rankscope.datasets.domain.flight_recorder import FRDump, FREntry, PGInfo
from rankscope.datasets.domain.topology import Layout, Topology
from rankscope.datasets.readers.flight_recorder import parse_dump, read_fr_dir
from rankscope.datasets.readers.fr_entries import split_profiling_name
from rankscope.harness.synthetic_fr import generate_fr
from rankscope.spine import InputError

LAYOUTS = ("tp=2,pp=4,dp=8", "tp=4,pp=2,dp=8", "tp=8,dp=8", "pp=4,dp=16")


HUNG = 30.0
"""Seconds between a synthetic job's last activity and its dumps' recorded capture time: overdue."""


def test_real_gloo_probe_without_a_clock_is_inconclusive_and_names_nobody(probe_dir: Path) -> None:
    """The probe's dumps (``_dump_fr_trace*`` called 2 s into the hang) carry no capture time, and nothing inside
    them is newer than the stuck all_reduce: no time evidence, so no hang and no machine named; the
    wavefront is reported as where to look if the job is known to be stuck."""
    for dumps in (read_fr_dir(probe_dir / "fr"), read_fr_dir(probe_dir / "fr", prefix="fr_hang_rank")):
        a = collectives.facts(dumps)
        assert a.status == "inconclusive" and a.culprit_ranks == () and a.missing_ranks == ()
        assert a.if_stuck_ranks == (3,) and a.time_evidence["clock"] == "lower-bound"
        assert a.stalls[0].seq == 6 and a.stalls[0].waiting_ranks == (0, 1, 2)
        assert a.stalls[0].progress[3] == (5, 5, 5) and a.stalls[0].progress[0][::2] == (6, 5)  # enqueued, completed
    topo = Topology.from_layout(Layout.parse("dp=4"), gpus_per_node=1)
    v = collectives.verdict(collectives.facts(read_fr_dir(probe_dir / "fr"), topo), topo, job="probe")
    assert v.verdict == "inconclusive" and v.suspect_nodes == () and v.culprit_nodes == () and v.suspect_ranks == ()
    assert "If the job is known to be stuck, look at rank(s) 3 (node-3)" in v.explain()


def test_real_gloo_hang_dumped_by_the_hook_names_rank_3(fr_gloo: Path) -> None:
    """The probe's job re-captured through the hook, 8 s into the hang: the dump time makes the stuck all_reduce
    overdue (its group's ops take milliseconds; the floor is 5 s), so it is a hang and rank 3 the culprit."""
    a = collectives.facts(read_fr_dir(fr_gloo / "hang"))
    assert a.status == "hang" and a.culprit_ranks == (3,) and a.missing_ranks == (3,)
    assert a.stopped_pg == "0" and a.stopped_kind == "world"
    assert a.time_evidence["clock"] == "explicit" and a.time_evidence["overdue"] == 3
    assert 7.5 < a.time_evidence["oldest_wait_seconds"] < 12
    assert a.evidence[0].source == "flight_recorder" and a.evidence[0].ranks == (3,)
    topo = Topology.from_layout(Layout.parse("dp=4"), gpus_per_node=1)
    v = collectives.verdict(collectives.facts(read_fr_dir(fr_gloo / "hang"), topo), topo, job="probe")
    assert v.verdict == "hang" and v.culprit_nodes == ("node-3",) and v.suspect_nodes == ("node-3",)
    assert v.sources == ("flight_recorder",) and "rank(s) 3 never enqueued it" in v.explain()
    assert "Time evidence: rank 0 has waited" in v.explain()


def test_real_gloo_jobs_captured_while_healthy_name_nobody(fr_gloo: Path) -> None:
    """Real 4-rank gloo jobs dumped mid-run: with the recorded dump time the in-flight all_reduce is 0.1 s old
    against a 0.2 s cadence (healthy); without it nothing is named; a capture between steps is healthy too."""
    a = collectives.facts(read_fr_dir(fr_gloo / "healthy_inflight"))
    assert a.status == "healthy" and a.culprit_ranks == () and a.time_evidence["young"] == 2
    blind = [replace(d, dump_time_ns=None) for d in read_fr_dir(fr_gloo / "healthy_inflight")]
    b = collectives.facts(blind)
    assert b.status == "inconclusive" and b.culprit_ranks == () and b.missing_ranks == ()
    c = collectives.facts(read_fr_dir(fr_gloo / "healthy"))
    assert c.status == "healthy" and c.stalls == ()  # pg 1 is [0, 1] only: ranks 2-3 are not "behind" in it


MP8 = Topology.from_layout(Layout.parse("tp=2,pp=2,dp=2"), gpus_per_node=2)


def test_real_8_rank_gloo_hang_with_pg_ids_unlike_names(fr_gloo: Path) -> None:
    """A real TP=2/PP=2/DP=2 gloo job, rank 5 spinning in compute, dumped 11 s in (the capture driver's time).
    pg_status is keyed by pg_id (1, 2) while every TP/DP group has its own name: translated, not mixed up.
    gloo records no send/recv: ranks 1 and 3, blocked sending to stage 1, went quiet after their
    neighbours were stuck and are not culprits."""
    dumps = read_fr_dir(fr_gloo / "mp8_hang")
    assert {d.pg_status["2" if d.rank in (2, 3) else "1"].pg_id for d in dumps if d.rank < 4} == {"1"}
    a = collectives.facts(dumps, MP8)
    assert a.status == "hang" and a.culprit_ranks == (5,) and a.stopped_kind == "tp"
    v = collectives.verdict(a, MP8)
    assert v.suspect_nodes == ("node-2",) and v.culprit_nodes == ("node-2",)
    assert any("rank 1 went quiet" in r for r in a.reasons)
    blind = collectives.facts([replace(d, dump_time_ns=None) for d in dumps], MP8)
    assert blind.status == "inconclusive" and blind.culprit_ranks == () and 5 in blind.if_stuck_ranks


def test_real_ddp_job_stuck_in_its_dataloader(fr_gloo: Path) -> None:
    """A real 4-rank DDP gloo job whose rank 2 is stuck in a DataLoader read, dumped 157 s in."""
    a = collectives.facts(read_fr_dir(fr_gloo / "ddp4_iostall"))
    assert a.status == "hang" and a.culprit_ranks == (2,) and a.time_evidence["oldest_wait_seconds"] > 150


def test_two_real_captures_of_a_running_job(fr_gloo: Path) -> None:
    """Two dumps of a healthy 8-rank job 3.7 s apart: every waiting rank advanced in between (healthy even
    without capture times); with them, every wait is young."""
    caps = [replace(d, capture=i) for i in (0, 1) for d in read_fr_dir(fr_gloo / "mp8_healthy" / f"snapshot-{i}")]
    a = collectives.facts(caps, MP8)
    assert a.status == "healthy" and a.progress["n_advanced"] == 8
    blind = collectives.facts([replace(d, dump_time_ns=None) for d in caps], MP8)
    assert blind.status == "healthy" and any("every waiting rank advanced" in r for r in blind.reasons)
    alone = collectives.facts([replace(d, dump_time_ns=None) for d in caps if d.capture == 1], MP8)
    assert alone.status == "inconclusive" and alone.culprit_ranks == ()


def test_the_same_capture_twice_is_no_progress_and_no_hang(fr_gloo: Path) -> None:
    """Two copies of one dump: nothing advanced, but their interval is unknown: no hang."""
    one = [replace(d, dump_time_ns=None) for d in read_fr_dir(fr_gloo / "mp8_healthy" / "snapshot-1")]
    a = collectives.facts([replace(d, capture=c) for c in (0, 1) for d in one], MP8)
    assert a.status == "inconclusive" and a.progress["n_advanced"] == 0 and a.culprit_ranks == ()


def test_pg_ids_renumbered_give_the_same_verdict(fr_gloo: Path) -> None:
    """PyTorch keys pg_status by pg_id; a dump whose pg_ids differ from its pg names reads the same."""
    import json

    renamed = []
    for path in sorted((fr_gloo / "hang").iterdir()):
        raw = json.loads(path.read_text())
        ids = {"0": 7, "1": 9}
        for e in raw["entries"]:
            e["pg_id"] = ids[str(e["pg_id"])]
        raw["pg_status"] = {str(ids[k]): v for k, v in raw["pg_status"].items()}
        renamed.append(parse_dump(raw, path=str(path)))
    a, b = collectives.facts(read_fr_dir(fr_gloo / "hang")), collectives.facts(renamed)
    assert (a.status, a.culprit_ranks, a.missing_ranks) == (b.status, b.culprit_ranks, b.missing_ranks)
    assert b.stalls[0].progress == a.stalls[0].progress
    assert renamed[0].pg_status["0"].pg_id == "7"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fault", ["missing", "p2p_behind"])
@pytest.mark.parametrize("seed", [0, 1])
def test_injected_hang_culprits_are_named_and_only_them(layout: str, fault: str, seed: int) -> None:
    if fault == "p2p_behind" and "pp" not in layout:
        pytest.skip("no pipeline")
    syn = generate_fr(layout, fault=fault, seed=seed, n_culprits=1 + seed, dumped_after_s=HUNG)
    a = collectives.facts(syn.dumps(), syn.topology)
    assert a.status == "hang"
    assert a.culprit_ranks == syn.truth.culprit_ranks
    v = collectives.verdict(a, syn.topology)
    assert v.verdict == "hang" and set(v.culprit_nodes) == set(syn.topology.nodes_of(syn.truth.culprit_ranks))
    # the wait-for chain ends at the culprits: their machines only, never their healthy model-parallel peers'
    # (an outside tester's 512-rank tp=8,cp=2,pp=2 case isolated the culprit's healthy pipeline-stage node too)
    assert set(v.suspect_nodes) == set(v.culprit_nodes)
    assert v.suspect_group is not None and v.suspect_group.kind == "node"


def test_wavefront_prefers_the_model_parallel_group() -> None:
    syn = generate_fr("tp=2,pp=4,dp=8", fault="missing", seed=0, at="tp", dumped_after_s=HUNG)
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
    syn = generate_fr("tp=2,pp=4,dp=8", fault=fault, seed=2, buffer_entries=5, dumped_after_s=HUNG)
    a = collectives.facts(syn.dumps(), syn.topology)
    got = a.mismatch_ranks if fault.endswith("mismatch") else a.culprit_ranks
    assert got == syn.truth.culprit_ranks


def test_missing_dumps_of_bystanders_and_of_the_culprit() -> None:
    syn = generate_fr("tp=2,pp=4,dp=8", fault="missing", seed=4, dumped_after_s=HUNG)
    culprit = syn.truth.culprit_ranks[0]
    dumps = syn.dumps()
    bystanders = [d for d in dumps if d.rank % 5 != 0 or d.rank == culprit]
    a = collectives.facts(bystanders, syn.topology)
    assert culprit in a.culprit_ranks  # a bystander with no dump that others wait for is a suspect too
    assert set(a.culprit_ranks) - {culprit} <= set(a.no_dump_ranks)
    dead = [d for d in dumps if d.rank != culprit]  # the culprit's process died: no dump
    a = collectives.facts(dead, syn.topology)
    assert a.culprit_ranks == (culprit,) and culprit in a.no_dump_ranks
    assert any(e.kind == "missing-dump" for e in a.evidence)


def _as_gloo(dumps: list[FRDump]) -> list[FRDump]:
    """What gloo writes: no pg_config."""
    from dataclasses import replace

    return [replace(d, pg_config={}) for d in dumps]


def test_membership_without_pg_config_from_topology_or_memberships() -> None:
    syn = generate_fr("tp=4,pp=2,dp=4", fault="missing", seed=5, dumped_after_s=HUNG)
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

    a = collectives.facts(generate_fr("tp=2,dp=4", fault="missing", dumped_after_s=HUNG).dumps())
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
        syn = generate_fr("tp=2,dp=4", fault=fault, seed=seed, dumped_after_s=HUNG)
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

    syn = generate_fr("tp=4,dp=2", fault="missing", steps=1, at="tp", seed=1, dumped_after_s=HUNG)
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


def _e(record_id: int, pg: str, op: str, state: str, t_s: float, seq: int = 0, p2p: str = "") -> FREntry:
    """An NCCL entry with timing (started states recorded); ``p2p`` is ``"0->1"`` / ``"1<-0"`` for send/recv."""
    name = f"nccl:{op} {p2p}" if p2p else f"nccl:{op}"
    _, base, src, dst = split_profiling_name(name)
    t = int(1_796_000_000e9 + t_s * 1e9)
    done = state == "completed"
    return FREntry(
        record_id,
        pg,
        pg,
        "",
        seq,
        1 if p2p else 0,
        record_id,
        name,
        "nccl",
        base,
        bool(p2p),
        src,
        dst,
        state,
        done,
        t,
        t + 1000 if state != "scheduled" else None,
        t + 2_000_000 if done else None,
        1.0 if done else None,
        600_000,
        ((4,),),
        ("Float",),
        ((4,),),
        ("Float",),
    )


def test_a_peer_behind_its_own_started_collective_is_followed_to_the_rank_without_a_dump() -> None:
    """Stream order (the dev missing-dump case in miniature): rank 2's send to rank 0 is started; rank 0 has
    *posted* the matching recv, but it is scheduled behind its started TP all_reduce, which waits for rank 1,
    whose dump is missing. The send waits for rank 0 (recv not started), rank 0 for rank 1: rank 1 is the
    culprit, not rank 2 or rank 0."""
    tp = PGInfo("tp", "TENSOR_MODEL_PARALLEL_GROUP", (0, 1))
    pp = PGInfo("pp", "PIPELINE_MODEL_PARALLEL_GROUP", (0, 2))
    when = int(1_796_000_000e9 + 100 * 1e9)  # dumped 100 s after the stall: overdue
    history = [_e(i, "tp", "all_reduce", "completed", i * 0.01, seq=i + 1) for i in range(20)]
    r0 = FRDump(
        0,
        (
            *history,
            _e(20, "tp", "all_reduce", "started", 0.3, seq=21),
            _e(21, "pp", "recv", "scheduled", 0.31, p2p="0<-1"),
        ),
        pg_config={"tp": tp, "pp": pp},
        dump_time_ns=when,
    )
    r2 = FRDump(2, (_e(0, "pp", "send", "started", 0.29, p2p="1->0"),), pg_config={"pp": pp}, dump_time_ns=when)
    a = collectives.facts([r0, r2], Topology.from_layout(Layout.parse("dp=3"), gpus_per_node=1))
    assert a.status == "hang" and a.culprit_ranks == (1,) and a.no_dump_ranks == (1,)
    assert a.waits[2] == (0,) and a.waits[0] == (1,)
    assert any("rank 1 left no Flight Recorder dump" in e.detail for e in a.evidence)
    assert not any("never enqueued" in r for r in a.reasons)  # it has no dump: nobody knows what it enqueued


def _ring(n: int, rank: int, steps: range, state: str, t0: float, first_id: int = 0) -> list[FREntry]:
    """Rank ``rank``'s ``batch_isend_irecv`` steps of a context-parallel ring of ``n`` (send to the next member,
    receive from the one before), both ops of a step under one p2p sequence id, as NCCL numbers them."""
    out = []
    for i, step in enumerate(steps):
        for j, (op, spec) in enumerate((("send", f"{rank}->{(rank + 1) % n}"), ("recv", f"{rank}<-{(rank - 1) % n}"))):
            e = _e(first_id + 2 * i + j, "cp", op, state, t0 + 0.01 * i, p2p=spec)
            out.append(e._replace(p2p_seq_id=step))
    return out


def _ring_dump(rank: int, entries: list[FREntry], extra: dict[str, PGInfo] | None = None) -> FRDump:
    cp = PGInfo("cp", "CONTEXT_PARALLEL_GROUP", (0, 1, 2, 3))
    when = int(1_796_000_000e9 + 900 * 1e9)  # dumped 900 s after the stall: overdue
    return FRDump(rank, tuple(entries), pg_config={"cp": cp, **(extra or {})}, dump_time_ns=when)


def test_a_ring_member_one_step_ahead_waits_for_the_member_behind_it() -> None:
    """A context-parallel ring stalls behind rank 0, which waits in an expert-parallel all_to_all for rank 4 (no
    dump). Rank 2 finished step 6 (its neighbours had posted it) and waits in step 7 for ranks 1 and 3, still in
    step 6: they are in *a* transfer with it, not in this one. The link's sequence ids say which: rank 2 waits
    for them, they for rank 0, rank 0 for rank 4. Matched by direction alone, rank 2 was a culprit (a healthy
    machine named)."""
    ep = {"ep": PGInfo("ep", "EXPERT_MODEL_PARALLEL_GROUP", (0, 4))}
    done = range(1, 6)
    r0 = [
        *_ring(4, 0, done, "completed", 0.0),
        _e(10, "ep", "all_to_all", "started", 0.2, seq=1),
        *_ring(4, 0, range(6, 7), "scheduled", 0.21, first_id=11),
    ]
    r1 = [*_ring(4, 1, done, "completed", 0.0), *_ring(4, 1, range(6, 7), "started", 0.2, first_id=10)]
    r2 = [
        *_ring(4, 2, range(1, 7), "completed", 0.0),
        *_ring(4, 2, range(7, 8), "started", 0.2, first_id=12),
    ]
    r3 = [*_ring(4, 3, done, "completed", 0.0), *_ring(4, 3, range(6, 7), "started", 0.2, first_id=10)]
    dumps = [_ring_dump(0, r0, ep), _ring_dump(1, r1), _ring_dump(2, r2), _ring_dump(3, r3)]
    a = collectives.facts(dumps, Topology.from_layout(Layout.parse("dp=5"), gpus_per_node=1))
    assert a.status == "hang" and a.culprit_ranks == (4,), a.reasons
    assert set(a.waits[2]) <= {1, 3} and a.waits[1] == (0,) and a.waits[0] == (4,)


def test_a_ring_member_inside_transfers_with_stalled_neighbours_waits_behind_them() -> None:
    """Rank 0 of a ring left no dump. Ranks 1 and 3 wait for it; rank 2 is inside step 6's transfers with both
    of them (each end started the same step), which cannot finish while their batches wait for rank 0; rank 4
    waits for rank 2 in an all_to_all that rank 2 queued behind its ring step. Rank 2 waits behind its
    neighbours: rank 0 is the culprit, not rank 2 (only two ends that wait for nobody else are a stuck link)."""
    ep = {"ep": PGInfo("ep", "EXPERT_MODEL_PARALLEL_GROUP", (2, 4))}
    done = range(1, 6)
    dumps = [
        _ring_dump(r, [*_ring(4, r, done, "completed", 0.0), *_ring(4, r, range(6, 7), "started", 0.2, first_id=10)])
        for r in (1, 3)
    ]
    r2 = [
        *_ring(4, 2, done, "completed", 0.0),
        *_ring(4, 2, range(6, 7), "started", 0.2, first_id=10),
        _e(12, "ep", "all_to_all", "scheduled", 0.21, seq=1),
    ]
    r4 = FRDump(
        4, (_e(0, "ep", "all_to_all", "started", 0.2, seq=1),), pg_config=ep, dump_time_ns=dumps[0].dump_time_ns
    )
    a = collectives.facts(
        [*dumps, _ring_dump(2, r2, ep), r4], Topology.from_layout(Layout.parse("dp=5"), gpus_per_node=1)
    )
    assert a.status == "hang" and a.culprit_ranks == (0,) and a.no_dump_ranks == (0,), a.reasons
    assert a.waits[4] == (2,)  # and rank 2, inside transfers, waits behind ranks 1 and 3


def test_a_rank_inside_a_transfer_is_never_sent_round_a_cycle_back_to_itself() -> None:
    """Rank 0's send to rank 1 is stuck inside the transfer (both ends started it) and rank 0 never enqueued the
    DP all_gather rank 2 waits in; rank 1 also waits in a TP all_reduce rank 2 queued behind that all_gather.
    Rank 1's end of the transfer waits for someone (rank 2, then rank 0): an edge from rank 0 to it would close a
    cycle back to rank 0, and the "circular wait" best guess named healthy rank 2 beside it."""
    pp = PGInfo("pp", "PIPELINE_MODEL_PARALLEL_GROUP", (0, 1))
    tp = PGInfo("tp", "TENSOR_MODEL_PARALLEL_GROUP", (1, 2))
    dp = PGInfo("dp", "DATA_PARALLEL_GROUP", (0, 2))
    when = int(1_796_000_000e9 + 900 * 1e9)

    def p2p(i: int, op: str, spec: str, state: str) -> FREntry:
        return _e(i, "pp", op, state, 0.01 * i, p2p=spec)._replace(p2p_seq_id=i)

    r0 = [*(p2p(i, "send", "0->1", "completed" if i < 4 else "started") for i in range(1, 5))]
    r0 += [_e(5 + s, "dp", "all_gather", "completed", 0.01 * s, seq=s) for s in (1, 2)]
    r1 = [*(p2p(i, "recv", "1<-0", "completed" if i < 4 else "started") for i in range(1, 5))]
    r1 += [_e(5 + s, "tp", "all_reduce", "completed", 0.01 * s, seq=s) for s in range(1, 7)]
    r1 += [_e(20, "tp", "all_reduce", "started", 0.21, seq=7)]
    r2 = [_e(5 + s, "tp", "all_reduce", "completed", 0.01 * s, seq=s) for s in range(1, 7)]
    r2 += [_e(30 + s, "dp", "all_gather", "completed", 0.01 * s, seq=s) for s in (1, 2)]
    r2 += [_e(40, "dp", "all_gather", "started", 0.22, seq=3)]
    dumps = [
        FRDump(0, tuple(r0), pg_config={"pp": pp, "dp": dp}, dump_time_ns=when),
        FRDump(1, tuple(r1), pg_config={"pp": pp, "tp": tp}, dump_time_ns=when),
        FRDump(2, tuple(r2), pg_config={"tp": tp, "dp": dp}, dump_time_ns=when),
    ]
    a = collectives.facts(dumps, Topology.from_layout(Layout.parse("dp=3"), gpus_per_node=1))
    assert a.status == "hang" and a.culprit_ranks == (0,), a.reasons
    assert not any("circular wait" in r for r in a.reasons), a.reasons


def test_a_ring_member_inside_transfers_learns_the_wait_whatever_the_order_of_the_dumps() -> None:
    """A ring of 8 whose rank 4 left no dump; ranks 3 and 5 wait for it, the others are inside started steps with
    their neighbours, and rank 9 waits for rank 0 in an all_to_all rank 0 queued behind its ring step. The wait
    reaches rank 0 through its neighbours only after they learn it from theirs: taken once, in dump order, the
    sorted dumps named healthy rank 0 beside rank 4."""
    n = 8
    cp = PGInfo("cp", "CONTEXT_PARALLEL_GROUP", tuple(range(n)))
    ep = PGInfo("ep", "EXPERT_MODEL_PARALLEL_GROUP", (0, 9))
    when = int(1_796_000_000e9 + 900 * 1e9)
    dumps = []
    for r in (0, 1, 2, 3, 5, 6, 7):
        es = [*_ring(n, r, range(1, 6), "completed", 0.0), *_ring(n, r, range(6, 7), "started", 0.2, first_id=10)]
        if r == 0:
            es.append(_e(12, "ep", "all_to_all", "scheduled", 0.21, seq=1))
        dumps.append(FRDump(r, tuple(es), pg_config={"cp": cp, "ep": ep}, dump_time_ns=when))
    dumps.append(
        FRDump(9, (_e(0, "ep", "all_to_all", "started", 0.2, seq=1),), pg_config={"ep": ep}, dump_time_ns=when)
    )
    topology = Topology.from_layout(Layout.parse("dp=10"), gpus_per_node=1)
    for order in (dumps, dumps[::-1]):
        a = collectives.facts(order, topology)
        assert a.status == "hang" and a.culprit_ranks == (4,), a.reasons


def test_link_ids_offset_by_ops_before_the_ring_buffers_are_not_matched() -> None:
    """Rank 1 numbered two p2p ops of the group that its ring buffer no longer holds: its receive k is rank 0's
    send k - 2, and both runs of ids are unbroken, so the ids over the span both hold agree. The last ids done on
    the two ends are two apart: not aligned, and the transfer both ends started is stuck inside the link (nobody
    named), not a send rank 0 "has not started"."""
    pp = PGInfo("pp", "PIPELINE_MODEL_PARALLEL_GROUP", (0, 1))
    when = int(1_796_000_000e9 + 900 * 1e9)

    def p2p(k: int, op: str, spec: str, last: int) -> FREntry:
        return _e(k, "pp", op, "completed" if k < last else "started", 0.01 * k, p2p=spec)._replace(p2p_seq_id=k)

    r0 = tuple(p2p(k, "send", "0->1", 10) for k in range(1, 11))
    r1 = tuple(p2p(k, "recv", "1<-0", 12) for k in range(3, 13))
    dumps = [
        FRDump(0, r0, pg_config={"pp": pp}, dump_time_ns=when),
        FRDump(1, r1, pg_config={"pp": pp}, dump_time_ns=when),
    ]
    a = collectives.facts(dumps, Topology.from_layout(Layout.parse("dp=2"), gpus_per_node=1))
    assert a.culprit_ranks == (), a.reasons


def test_fail_slow_needs_a_persistent_and_costly_late_arrival() -> None:
    """Kernel durations of one TP group of 4 over 24 collectives (created 20 ms apart): in a healthy job the
    last member is a different rank each time; rank 0 arrives last every time but costs its peers 2 ms a
    collective (logging: 10% of the group's time); rank 3, a throttled GPU, makes them wait 12 ms (60%)."""
    from rankscope.analytics.collectives.groups import GroupInfo
    from rankscope.analytics.collectives.slow import lateness, slow_ranks

    groups = {"tp": GroupInfo("tp", "tp", "TENSOR", (0, 1, 2, 3), "pg_config", "tp", 0)}

    def run(late_rank: int | None, wait_ms: float) -> tuple[tuple[int, ...], dict[int, float]]:
        durations, created = {}, {}
        for seq in range(24):
            last = late_rank if late_rank is not None else seq % 4
            durations[("tp", seq)] = [(r, 1.0 if r == last else 1.0 + wait_ms) for r in range(4)]
            created[("tp", seq)] = [int(1e18 + seq * 20e6)] * 4
        lates = lateness(durations, created, groups, 0.5)
        return slow_ranks(lates, groups, 0.3)

    assert run(None, 12.0)[0] == ()  # everyone is last now and then: arrival order is noise
    slow, scores = run(0, 2.0)
    assert slow == () and 0.05 < scores[0] < 0.3  # last every time, but cheap: not a fault
    slow, scores = run(3, 12.0)
    assert slow == (3,) and scores[3] > 0.5


def test_snapshot_folders_of_a_dump_directory_are_captures(fr_gloo: Path, tmp_path: Path) -> None:
    """``snapshot-0/``, ``snapshot-1/`` FR dumps of a dump directory: the latest is diagnosed, the one before
    tells whether the job moved (here it did: healthy, even with the capture times stripped)."""
    import json
    import shutil

    from rankscope.analytics import diagnose
    from rankscope.datasets.loading.inputs import load_inputs

    shutil.copytree(fr_gloo / "mp8_healthy", tmp_path / "d")
    for p in (tmp_path / "d").rglob("*.json"):
        raw = json.loads(p.read_text())
        raw.pop("rankscope_dump_time_ns")
        p.write_text(json.dumps(raw))
    inputs = load_inputs(tmp_path / "d", layout="tp=2,pp=2,dp=2", gpus_per_node=2)
    assert sorted({d.capture for d in inputs.fr_dumps}) == [0, 1] and len(inputs.fr_dumps) == 16
    v = diagnose(inputs, sources=("flight_recorder",))
    assert v.verdict == "healthy" and v.suspect_nodes == ()
    assert any("every waiting rank advanced" in r for r in v.reasons)


def test_lateness_binomial_tail_holds_past_a_thousand_collectives() -> None:
    """A 2,000-entry ring buffer with timing on holds groups of over a thousand timed collectives: the tail
    probability once overflowed a float (``math.comb(2000, 1000)`` ~ 1e600) and the diagnosis crashed."""
    import math
    from fractions import Fraction

    from rankscope.analytics.collectives.slow import _binom_tail

    def exact(k: int, n: int, p: float) -> float:
        q = Fraction(p)
        return float(sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k, n + 1)))

    for k, n, p in ((1, 7, 0.125), (4, 20, 0.25), (60, 400, 0.125), (360, 400, 0.125), (0, 9, 0.5), (10, 9, 0.5)):
        assert _binom_tail(k, n, p) == pytest.approx(exact(k, n, p), rel=1e-9)
    assert _binom_tail(5, 2000, 0.5) == pytest.approx(1.0)
    assert 0.0 <= _binom_tail(1100, 2000, 0.5) < 1e-4
    assert _binom_tail(300, 5000, 0.125) == pytest.approx(exact(300, 5000, 0.125), rel=1e-6)


def test_a_rank_with_two_records_of_one_collective_disagrees_with_ranks_that_have_one() -> None:
    """A collective's signature per rank is every record it holds of it: a rank that recorded one collective
    twice (a replayed op) differs from its peers, two records alike do not differ from each other."""
    from rankscope.analytics.collectives.groups import group_keys, resolve_groups
    from rankscope.analytics.collectives.tables import build_tables

    syn = generate_fr("tp=2,dp=2", fault="clean", seed=0)
    dumps = {d.rank: d for d in syn.dumps()}
    e = next(x for x in dumps[0].entries if not x.is_p2p and "TENSOR" in x.pg_desc)  # ranks 0 and 1's group
    twice = {**dumps, 0: replace(dumps[0], entries=(*dumps[0].entries, e))}
    keys, members = group_keys(list(twice.values()))
    groups = resolve_groups(list(twice.values()), keys, members, 4, syn.topology, None)
    t = build_tables(twice, keys, groups)
    key = (keys[0][e.pg_name], e.collective_seq_id)
    assert sorted((len(sig), ranks) for sig, ranks in t.sigs[key].items()) == [(1, [1]), (2, [0])]
    again = {**twice, 1: replace(dumps[1], entries=(*dumps[1].entries, e))}  # the same pair on its peer
    assert key not in build_tables(again, keys, groups).sigs


def _as_rooted(dumps: list[FRDump], op: str, dtype_of: dict[int, str] | None = None) -> list[FRDump]:
    """Each rank's first collective turned into ``op`` (gather or scatter) rooted at rank 0: only the root holds
    the gathered output (gather) or the scattered input (scatter), the others an empty list, as PyTorch records."""
    out = []
    for d in dumps:
        entries = list(d.entries)
        i = next(i for i, e in enumerate(entries) if not e.is_p2p)
        mine = ((dtype_of or {}).get(d.rank, "Byte"),)
        root = mine if d.rank == 0 else ()
        ins, outs = (mine, root) if op == "gather" else (root, mine)
        entries[i] = entries[i]._replace(
            op=op,
            profiling_name=f"{entries[i].backend}:{op}",
            input_dtypes=ins,
            output_dtypes=outs,
            input_sizes=((8,),) if ins else (),
            output_sizes=((8,),) if outs else (),
        )
        out.append(replace(d, entries=tuple(entries)))
    return out


@pytest.mark.parametrize("op", ["gather", "scatter"])
def test_rooted_collectives_whose_members_hold_one_side_empty_are_no_mismatch(op: str) -> None:
    """torch.distributed.checkpoint gathers and scatters through rank 0: only the root holds the output of a
    gather (the input of a scatter). A healthy 8-rank DCP job's dumps were a `mismatch` ("dtypes mismatch")."""
    syn = generate_fr("dp=8", fault="clean", seed=0)
    a = collectives.facts(_as_rooted(syn.dumps(), op), syn.topology)
    assert a.status == "healthy" and a.mismatches == (), [m.expected for m in a.mismatches]
    odd = collectives.facts(_as_rooted(syn.dumps(), op, {5: "Float"}), syn.topology)  # rank 5 sends Float
    assert odd.status == "mismatch" and odd.mismatch_ranks == (5,)
