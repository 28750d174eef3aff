"""Hang localization on every synthetic fault kind: truth inside the suspects, suspects inside the
culprit's minimal group, healthy jobs get no suspects; plus the real gloo probe."""

from __future__ import annotations

import pytest

from rankscope.analytics import diagnose as run_diagnose
from rankscope.analytics import stacks
from rankscope.config import StackConfig
from rankscope.datasets.domain.inputs import Inputs
from rankscope.datasets.domain.stacks import from_dumps
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.harness.synthetic import FAULTS, generate_job
from rankscope.spine import ConfigError


def diagnose_stacks(procs, topology, *, job="", config=None):
    """The stack-only verdict."""
    return stacks.verdict(stacks.facts(procs, topology, config=config), topology, job=job)


def diagnose(procs, topology, **kw):
    """The one entry point over partial inputs (as the tests build them)."""
    return run_diagnose(Inputs(job=kw.pop("job", ""), topology=topology, procs=tuple(procs), **kw))


LAYOUTS = [("tp=4,pp=2,dp=4", 4), ("tp=2,cp=2,pp=2,dp=4", 8), ("tp=1,pp=4,dp=8", 4), ("tp=4,dp=8", 8)]


def _verdict(job):
    procs = from_dumps((d.dump, d.snapshot, d.rank, d.node, d.role) for d in job.dumps)
    return diagnose_stacks(procs, job.topology, job="t")


def _supported(layout, fault):
    mp = 1
    for part in layout.split(","):
        k, v = part.split("=")
        if k in ("tp", "cp", "ep"):
            mp *= int(v)
    pp = dict(p.split("=") for p in layout.split(",")).get("pp", "1")
    if fault == "p2p-hang" and pp == "1":
        return False
    return not (fault == "collective-hang" and mp == 1)


@pytest.mark.parametrize("layout,gpn", LAYOUTS)
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_fault_kind_is_localized(layout, gpn, fault, seed):
    if not _supported(layout, fault):
        pytest.skip(f"{fault} needs more parallel dimensions than {layout}")
    job = generate_job(layout, gpus_per_node=gpn, fault=fault, seed=seed)
    v = _verdict(job)
    truth = job.truth
    assert v.verdict == truth.expected_verdict, v.explain()
    if truth.expected_verdict == "healthy":
        assert v.suspect_nodes == () and v.culprit_nodes == ()
        return
    # the true culprit is inside the set to isolate, and named as (one of) the culprits
    assert set(truth.culprit_nodes) <= set(v.suspect_nodes), v.explain()
    assert set(truth.culprit_nodes) & set(v.culprit_nodes), v.explain()
    assert set(v.culprit_nodes) <= set(v.suspect_nodes)
    # the suspects stay inside the culprit's data-parallel replica (its minimal covering group)
    allowed = set(job.topology.group_of("mp", truth.fault_rank).nodes) | set(truth.culprit_nodes)
    assert set(v.suspect_nodes) <= allowed, (v.suspect_nodes, allowed)
    assert 0.0 < v.confidence <= 1.0
    assert v.reasons and v.evidence


def test_hang_at_512_ranks_isolates_the_culprit_node_and_names_its_victims():
    # the culprit computes while its TP peers and its replica's other stages wait for it: they are its
    # victims (named in the evidence), not suspects; the fault domain is the culprit's own node
    job = generate_job("tp=8,pp=4,dp=16", gpus_per_node=8, fault="compute-hang", seed=3)
    v = _verdict(job)
    assert v.verdict == "hang"
    assert v.suspect_group.kind == "node" and v.suspect_nodes == job.truth.culprit_nodes
    assert v.culprit_nodes == job.truth.culprit_nodes
    assert v.culprit_ranks == (job.truth.fault_rank,)
    assert any("not waiting" in r for r in v.reasons)
    victims = {r for e in v.evidence if e.kind == "victim" for r in e.ranks}
    replica = set(job.topology.group_of("mp", job.truth.fault_rank).ranks)
    assert victims and victims <= replica and job.truth.fault_rank not in victims
    tree = v.details["prefix_tree"]
    assert any(line["diverges"] for line in tree)


def test_static_snapshots_are_a_hang_and_moving_ones_are_not():
    hang = generate_job("tp=2,pp=2,dp=4", gpus_per_node=4, fault="crash", n_snapshots=3, seed=1)
    v = _verdict(hang)
    assert v.verdict == "hang" and v.n_snapshots == 3
    assert "not progressing" in v.reasons[0]
    ok = generate_job("tp=2,pp=2,dp=4", gpus_per_node=4, fault="none", seed=1)
    v = _verdict(ok)
    assert v.verdict == "healthy" and "progresses" in v.reasons[0]


def test_config_is_validated():
    with pytest.raises(ConfigError, match="dominance"):
        StackConfig(dominance_fraction=0)


def test_real_gloo_probe_names_node_3(probe_dir):
    for fmt in ("text", "json"):
        inputs = load_inputs(probe_dir / "pyspy" / fmt, gpus_per_node=1)
        v = diagnose_stacks(inputs.procs, inputs.topology)
        assert v.verdict == "hang"
        assert v.culprit_nodes == ("node-3",) and v.suspect_nodes == ("node-3",)
        assert v.culprit_ranks == (3,)


def test_busy_side_threads_of_outliers_are_evidence(tmp_path, probe_dir):
    for r in range(3):
        (tmp_path / f"rank{r}.txt").write_text((probe_dir / "pyspy/text" / f"rank{r}.txt").read_text())
    rank3 = (probe_dir / "pyspy/text/rank3.txt").read_text()
    rank3 += (
        'Thread 11950 (active): "ckpt-writer"\n    write (torch/serialization.py:880)\n'
        "    _save (torch/serialization.py:1200)\n    run (threading.py:982)\n"
    )
    (tmp_path / "rank3.txt").write_text(rank3)
    inputs = load_inputs(tmp_path, gpus_per_node=1)
    v = diagnose_stacks(inputs.procs, inputs.topology)
    notes = [e for e in v.evidence if e.kind == "other-thread"]
    assert notes and notes[0].ranks == (3,) and "ckpt-writer" in notes[0].detail and "write" in notes[0].detail


def _fh(*frames: str) -> str:
    """faulthandler text of one main thread; ``frames`` innermost first, as ``function@file:line``."""
    lines = ["Current thread 0x00007f0000000001 (most recent call first):"]
    for f in frames:
        fn, where = f.split("@")
        file, line = where.split(":")
        lines.append(f'  File "{file}", line {line} in {fn}')
    return "\n".join(lines) + "\n"


def test_a_collective_waiting_on_a_stuck_pipeline_transfer_blames_the_transfer(tmp_path):
    # TP=2, PP=2, DP=2 (rank = tp + 2*dp + 4*pp): rank 1 (stage 0) skipped its send to rank 5 (stage 1).
    # Rank 5 waits to receive from 1, rank 1 waits for 5's gradient, rank 4 waits for rank 5 in a TP
    # all_reduce, rank 0 for rank 4's gradient; the other replica waits in the DP all_reduce.
    dp_wait = _fh("all_reduce@/t/distributed_c10d.py:3252", "main@/job/train.py:201", "<module>@/job/train.py:332")
    recv_grad = _fh("recv@/t/distributed_c10d.py:2799", "main@/job/train.py:183", "<module>@/job/train.py:332")
    recv_act = _fh("recv@/t/distributed_c10d.py:2799", "main@/job/train.py:187", "<module>@/job/train.py:332")
    tp_wait = _fh(
        "all_reduce@/t/distributed_c10d.py:3252",
        "forward@/job/train.py:249",
        "main@/job/train.py:190",
        "<module>@/job/train.py:332",
    )
    stacks = {0: recv_grad, 1: recv_grad, 2: dp_wait, 3: dp_wait, 4: tp_wait, 5: recv_act, 6: dp_wait, 7: dp_wait}
    for r, text in stacks.items():
        (tmp_path / f"rank{r}.txt").write_text(text)
    inp = load_inputs(tmp_path, layout="tp=2,pp=2,dp=2", gpus_per_node=2)
    v = diagnose_stacks(inp.procs, inp.topology, job="t")
    assert v.verdict == "hang" and v.culprit_ranks == (1, 5), v.reasons
    assert v.culprit_nodes == ("node-0", "node-2") and set(v.suspect_nodes) == {"node-0", "node-2"}


def test_frozen_stacks_while_steps_complete_are_fail_slow_not_a_hang(tmp_path):
    import polars as pl

    wait = _fh("all_reduce@/t/distributed_c10d.py:3252", "main@/job/train.py:201", "<module>@/job/train.py:332")
    slow = _fh("sleep@/job/train.py:105", "main@/job/train.py:172", "<module>@/job/train.py:332")
    for snap in (0, 1):
        (tmp_path / f"snapshot-{snap}").mkdir()
        for r in range(8):
            (tmp_path / f"snapshot-{snap}" / f"rank{r}.txt").write_text(slow if r == 2 else wait)
    inp = load_inputs(tmp_path, layout="tp=2,pp=2,dp=2", gpus_per_node=2)
    times = {0: 1000.0, 1: 1010.0}
    hung = pl.DataFrame(
        {
            "rank": [2] * 3,
            "step": [1, 2, 3],
            "op": ["step"] * 3,
            "duration_s": [2.0] * 3,
            "start_s": [990.0, 992.0, 994.0],
        }
    )
    v = diagnose(inp.procs, inp.topology, job="t", timings=hung, snapshot_times=times)
    assert v.verdict == "hang"  # the last step ended before the first snapshot
    moving = hung.vstack(
        pl.DataFrame(
            {"rank": [2, 2], "step": [4, 5], "op": ["step"] * 2, "duration_s": [4.0] * 2, "start_s": [1000.0, 1004.0]}
        )
    )
    v = diagnose(inp.procs, inp.topology, job="t", timings=moving, snapshot_times=times)
    assert v.verdict == "fail-slow" and v.culprit_ranks == (2,) and "slow, not hung" in v.reasons[0]
    # an outside tester's real capture: three rounds 2 s apart inside one 6 s DataLoader stall of rank 2, the steps
    # completing only after the last: the rounds sampled the job once, and fail-slow evicted its machine
    after = hung.vstack(
        pl.DataFrame(
            {"rank": [2, 2], "step": [4, 5], "op": ["step"] * 2, "duration_s": [2.0] * 2, "start_s": [1010.5, 1012.5]}
        )
    )
    v = diagnose(inp.procs, inp.topology, job="t", timings=after, snapshot_times=times)
    assert v.verdict != "fail-slow" and not v.suspect_nodes, v.explain()
    assert "No step completed between the 2 rounds" in v.explain()
    # five rounds 1 s apart inside one stall: the vote's five rounds are still one sample
    for snap in (2, 3, 4):
        (tmp_path / f"snapshot-{snap}").mkdir()
        for r in range(8):
            (tmp_path / f"snapshot-{snap}" / f"rank{r}.txt").write_text(slow if r == 2 else wait)
    five = load_inputs(tmp_path, layout="tp=2,pp=2,dp=2", gpus_per_node=2)
    stall = {s: 1000.0 + s for s in range(5)}
    late = hung.vstack(
        pl.DataFrame(
            {"rank": [2, 2], "step": [4, 5], "op": ["step"] * 2, "duration_s": [2.0] * 2, "start_s": [1006.0, 1008.0]}
        )
    )
    v = diagnose(five.procs, five.topology, job="t", timings=late, snapshot_times=stall)
    assert v.verdict != "fail-slow" and not v.suspect_nodes, v.explain()


def test_a_dump_cut_short_joins_the_stack_it_is_the_inner_part_of(tmp_path):
    # faulthandler writes innermost first: a second SIGTERM during the write loses the outer frames
    wait = _fh("all_reduce@/t/distributed_c10d.py:3252", "main@/job/train.py:201", "<module>@/job/train.py:332")
    busy = _fh("matmul@/job/train.py:95", "main@/job/train.py:171", "<module>@/job/train.py:332")
    for r in range(8):
        (tmp_path / f"rank{r}.txt").write_text(busy if r == 5 else wait)
    (tmp_path / "rank6.txt").write_text(wait[: wait.index("line 332")])  # ends mid-line
    inp = load_inputs(tmp_path, layout="tp=2,pp=2,dp=2", gpus_per_node=2)
    assert next(p for p in inp.procs if p.rank == 6).status == "partial"
    v = diagnose_stacks(inp.procs, inp.topology, job="t")
    assert v.culprit_ranks == (5,) and 6 not in v.suspect_ranks, v.reasons
