"""Stack verdicts on REAL captures: a healthy job names nobody, a hang needs a blocked majority, failed
captures are no evidence, fail-slow comes from rounds (tests/data/stacks/README.md says where each came from)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from rankscope.analytics import diagnose as run_diagnose
from rankscope.analytics import stacks
from rankscope.analytics.performance.failslow import flag_round, vote
from rankscope.analytics.stacks.verdict import round_states
from rankscope.datasets.domain.inputs import Inputs
from rankscope.datasets.loading.inputs import load_inputs

DATA = Path(__file__).resolve().parents[1] / "data" / "stacks"


def stack_verdict(inp: Inputs):
    return stacks.verdict(stacks.facts(inp.procs, inp.topology), inp.topology, job=inp.job)


def no_suspect(v) -> bool:
    return v.suspect_nodes == () and v.culprit_nodes == () and v.verdict in ("healthy", "inconclusive")


# -- a hang needs a blocked majority ---------------------------------------------------------------


def test_real_healthy_gloo_job_names_nobody_from_any_snapshot_or_all_rounds() -> None:
    # each snapshot: rank 0 (or none) waits in all_reduce while the others compute; the job was running
    root = DATA / "healthy_gloo_pyspy_3rounds"
    v = stack_verdict(load_inputs(root, gpus_per_node=1))
    assert no_suspect(v) and v.n_snapshots == 3, v.explain()
    for snap in sorted(root.iterdir()):
        v = stack_verdict(load_inputs(snap, gpus_per_node=1))
        assert v.verdict == "healthy" and no_suspect(v), v.explain()
        assert any("running when captured" in r for r in v.reasons), v.reasons


def test_probe_hang_names_rank_3_and_says_it_rests_on_the_premise(probe_dir: Path) -> None:
    v = stack_verdict(load_inputs(probe_dir / "pyspy" / "text", gpus_per_node=1))
    assert v.verdict == "hang" and v.culprit_ranks == (3,) and v.suspect_nodes == ("node-3",)
    assert any("premise that the job was stuck" in r for r in v.reasons), v.reasons


def _probe_rounds(tmp_path: Path, probe_dir: Path, busy_rounds: set[int], n: int = 5) -> Path:
    """The probe's real stacks re-laid as ``n`` rounds: ranks 0-2 wait in the all_reduce in every round, rank
    3 computes in ``busy_rounds`` and waits in the all_reduce (rank 0's stack) in the others."""
    text = probe_dir / "pyspy" / "text"
    for k in range(n):
        d = tmp_path / f"snapshot-{k}"
        d.mkdir(parents=True)
        for r in range(3):
            shutil.copy(text / f"rank{r}.txt", d / f"rank{r}.txt")
        shutil.copy(text / ("rank3.txt" if k in busy_rounds else "rank0.txt"), d / "rank3.txt")
    return tmp_path


def _steps(times: list[float], ranks: int = 4, step_s: float = 2.0) -> pl.DataFrame:
    """Step records of every rank, one step ending every ``step_s`` seconds over ``times``."""
    ends = [times[0] - 5.0 + i * step_s for i in range(int((times[-1] - times[0] + 6) / step_s))]
    rows = [(r, i, "step", step_s, e - step_s) for i, e in enumerate(ends) for r in range(ranks)]
    return pl.DataFrame(rows, schema=["rank", "step", "op", "duration_s", "start_s"], orient="row")


def test_probe_re_laid_as_five_rounds_is_fail_slow_when_steps_complete_and_a_hang_when_they_do_not(
    tmp_path: Path, probe_dir: Path
) -> None:
    inp = load_inputs(_probe_rounds(tmp_path, probe_dir, busy_rounds={0, 1, 3, 4}), gpus_per_node=1)
    # the vote alone: rank 3 is the busy stack outlier in 4 of 5 rounds, its peers never
    f = stacks.facts(inp.procs, inp.topology)
    v = vote([round_states(a) for a in f.analyses], inp.topology)
    assert v.degrader is not None and v.degrader.culprit_ranks == (3,) and v.degrader.flags == 4
    times = {k: 1000.0 + 10 * k for k in range(5)}
    moving = run_diagnose(
        Inputs(
            job="p", topology=inp.topology, procs=inp.procs, timings=_steps(list(times.values())), snapshot_times=times
        )
    )
    assert moving.verdict == "fail-slow" and moving.culprit_nodes == ("node-3",), moving.explain()
    assert moving.suspect_nodes == ("node-3",) and moving.culprit_ranks == (3,)
    # the same stacks with steps that stopped long before the rounds: rank 3 left its wait once, then the job
    # froze with it computing - a hang that began during the capture
    stuck = run_diagnose(
        Inputs(job="p", topology=inp.topology, procs=inp.procs, timings=_steps([900.0, 960.0]), snapshot_times=times)
    )
    assert stuck.verdict == "hang" and stuck.culprit_ranks == (3,), stuck.explain()
    assert any("stuck" in r for r in stuck.reasons), stuck.reasons


def test_a_rank_back_at_its_work_after_waiting_with_everyone_proves_the_job_moved(
    tmp_path: Path, probe_dir: Path
) -> None:
    # ZeRO-3 fetches every layer's parameters from one all_gather line, so a slow rank's peers wait at the
    # same call site in every round: no peer is seen released. The slow rank caught once in that wait and
    # then back at the very same work is: its wait completed (an outside tester's 64-rank ZeRO-3 case was
    # a hang on the premise). Rank 3 computes in rounds 0-2 and 4 and waits with everyone in round 3.
    inp = load_inputs(_probe_rounds(tmp_path / "a", probe_dir, busy_rounds={0, 1, 2, 4}), gpus_per_node=1)
    v = stack_verdict(inp)
    assert v.verdict == "fail-slow" and v.culprit_ranks == (3,) and v.suspect_nodes == ("node-3",), v.explain()
    # computing in every round at the same stack, never back from a wait: nothing shows the job moved
    frozen = stack_verdict(load_inputs(_probe_rounds(tmp_path / "b", probe_dir, busy_rounds={0, 1, 2, 3, 4})))
    assert frozen.verdict == "hang" and frozen.culprit_ranks == (3,), frozen.explain()
    # back at its work, then frozen there for the last round: a hang that began during the capture
    late = stack_verdict(load_inputs(_probe_rounds(tmp_path / "c", probe_dir, busy_rounds={0, 1, 3, 4})))
    assert late.verdict != "fail-slow", late.explain()


def test_a_culprit_looping_through_its_own_code_is_no_return(tmp_path: Path) -> None:
    # a hung job whose culprit loops through its own code and a device sync (a retry or skip-bad-batch loop)
    # while every peer sits in one all_reduce: the culprit moves, the job does not (a reviewer's case: counting
    # returns from any wait called it healthy)
    wait = "    all_reduce (torch/distributed/distributed_c10d.py:2950)\n    train_step (train.py:80)\n"
    busy = "    forward (model.py:70)\n    train_step (train.py:78)\n"
    sync = "    synchronize (torch/cuda/__init__.py:1219)\n    train_step (train.py:79)\n"
    for k in range(5):
        d = tmp_path / f"snapshot-{k}"
        d.mkdir(parents=True)
        for r in range(8):
            body = (busy if k % 2 == 0 else sync) if r == 0 else wait
            text = (
                f'Process {100 + r}: python train.py\nPython v3.11.7\n\nThread {100 + r} (idle): "MainThread"\n{body}'
            )
            (d / f"rank{r}.txt").write_text(text)
    v = stack_verdict(load_inputs(tmp_path, gpus_per_node=1))
    assert v.verdict == "hang" and v.culprit_ranks == (0,), v.explain()


# -- fail-slow from rounds -------------------------------------------------------------------------


@pytest.mark.parametrize("capture", ["rank0_eval_loop_3rounds", "rank0_eval_sleep_3rounds"])
def test_rank_0_s_own_evaluation_caught_in_three_frozen_rounds_evicts_nobody(capture: str) -> None:
    """A healthy 4-rank gloo job whose rank 0 evaluates for 16 s (``if rank == 0: evaluate()``, then a barrier),
    three py-spy rounds 3 s apart: the others sit in the barrier throughout, rank 0 in ``evaluate`` (its stack
    moving through forward and scoring, or one sleep). It was a hang isolating rank 0's machine at 0.88."""
    v = run_diagnose(load_inputs(DATA / capture))
    assert v.verdict.value == "inconclusive" and no_suspect(v) and v.suspect_ranks == (0,), v.explain()
    assert "own duties" in v.explain() and "evaluate" in v.explain()


def test_the_same_evaluation_on_another_rank_than_0_stays_a_hang(tmp_path: Path) -> None:
    """Only rank 0 has duties of its own: the same rounds with the files of ranks 0 and 2 swapped (rank 2 alone
    in ``evaluate``, the rest in the barrier) are a hang on rank 2."""
    swap = {0: 2, 2: 0}
    for rnd in sorted((DATA / "rank0_eval_sleep_3rounds").iterdir()):
        (tmp_path / rnd.name).mkdir()
        for r in range(4):
            shutil.copy(rnd / f"rank{r}.txt", tmp_path / rnd.name / f"rank{swap.get(r, r)}.txt")
    v = run_diagnose(load_inputs(tmp_path))
    assert v.verdict.value == "hang" and v.culprit_ranks == (2,), v.explain()


def _throttled(tmp_path: Path, *, prefixes: bool) -> Path:
    """The real throttled job's 5 rounds with one manifest (hosts gpu-node-q..t, rank 6 on gpu-node-t);
    with ``prefixes`` the odd hosts' install prefix is rewritten, as nodes of one job differ."""
    out = tmp_path / "throttled"
    rows = ["file,rank,node,snapshot"]
    for rnd in sorted((DATA / "throttled_mp8").iterdir()):
        k = int(rnd.name.split("-")[1])
        for f in sorted(rnd.iterdir()):
            r = int(re.search(r"rank(\d+)", f.name).group(1))
            host = "gpu-node-" + "qrst"[r // 2]
            text = f.read_text()
            if prefixes and (r // 2) % 2:
                text = text.replace(
                    "/opt/rankscope/.venv/lib/python3.11/site-packages/", "/opt/conda/lib/python3.11/site-packages/"
                )
            dst = out / f"snapshot-{k}" / host / f.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(text)
            rows.append(f"snapshot-{k}/{host}/{f.name},{r},{host},{k}")
    (out / "manifest.csv").write_text("\n".join(rows) + "\n")
    return out


@pytest.mark.parametrize("prefixes", [False, True])
def test_real_throttled_rank_over_five_rounds_is_fail_slow_on_its_node(tmp_path: Path, prefixes: bool) -> None:
    # mixed text/JSON dumps; the outliers shift from round to round (rank 6 is caught in spin_compute in 3
    # rounds, receiving its batch in one); its TP peer rank 7 on the same node
    inp = load_inputs(_throttled(tmp_path, prefixes=prefixes), layout="tp=2,pp=2,dp=2", gpus_per_node=2)
    assert {p.source_format for p in inp.procs} >= {"pyspy-text", "pyspy-json"}
    v = stack_verdict(inp)
    assert v.verdict == "fail-slow", v.explain()
    assert v.culprit_ranks == (6,) and v.culprit_nodes == ("gpu-node-t",) and v.suspect_nodes == ("gpu-node-t",)
    per_round = [set(r["flagged"]) for r in v.details["rounds"]]
    assert len({frozenset(s) for s in per_round}) > 1  # the flagged set shifts between rounds


@pytest.mark.parametrize("folder", ["2026-12-01T10-0{k}-00", "10-0{k}-00", "t{k}", "{k}"])
def test_rounds_each_with_its_own_manifest_in_folders_named_any_way(tmp_path: Path, folder: str) -> None:
    # the real throttled job, each round in a folder of its own with its own manifest.csv (no snapshot column):
    # named by time or by hand, not snapshot-N. The manifest's rows took snapshot 0 "from the path": the five
    # rounds were read as one snapshot dumped five times (608 dumps dropped) and the verdict was inconclusive.
    out = tmp_path / "incident"
    for rnd in sorted((DATA / "throttled_mp8").iterdir()):
        k = int(rnd.name.split("-")[1])
        where = out / folder.format(k=k)
        rows = ["file,rank,node,role,pid"]
        for f in sorted(rnd.iterdir()):
            r = int(re.search(r"rank(\d+)", f.name).group(1))
            host = "gpu-node-" + "qrst"[r // 2]
            pid = re.search(r'(?:Process |"pid": )(\d+)', f.read_text()).group(1)
            (where / f"rank_{r:04d}").mkdir(parents=True)
            name = f"rank_{r:04d}/trainer-{pid}{f.suffix}"
            shutil.copy(f, where / name)
            rows.append(f"{name},{r},{host},trainer,{pid}")
        (where / "manifest.csv").write_text("\n".join(rows) + "\n")
    v = stack_verdict(load_inputs(out, layout="tp=2,pp=2,dp=2", gpus_per_node=2))
    assert v.verdict == "fail-slow" and v.n_snapshots == 5, v.explain()
    assert v.culprit_ranks == (6,) and v.suspect_nodes == ("gpu-node-t",), v.explain()


def test_healthy_rounds_flag_nobody_more_than_once(tmp_path: Path) -> None:
    root = DATA / "healthy_gloo_pyspy_3rounds"
    inp = load_inputs(root, gpus_per_node=1)
    f = stacks.facts(inp.procs, inp.topology)
    counts: dict[int, int] = {}
    for a in f.analyses:
        for r in flag_round(round_states(a)).nonzero()[0].tolist():
            counts[r] = counts.get(r, 0) + 1
    assert max(counts.values(), default=0) <= 1, counts


# -- failed captures are no evidence ---------------------------------------------------------------


@pytest.mark.parametrize("error", ["permission_denied", "concurrent_eperm", "not_python"])
def test_a_failed_capture_in_a_healthy_job_names_nobody(tmp_path: Path, error: str) -> None:
    snap = DATA / "healthy_gloo_pyspy_3rounds" / "snapshot-1"
    for f in snap.iterdir():
        shutil.copy(f, tmp_path / f.name)
    shutil.copy(DATA / "pyspy_errors" / f"{error}.txt", tmp_path / "rank2.txt")
    v = stack_verdict(load_inputs(tmp_path, gpus_per_node=1))
    assert no_suspect(v), v.explain()
    problems = v.details["collection_problems"]
    assert [p["rank"] for p in problems] == [2]
    assert any(r.startswith("  rank 2: py-spy failed") for r in v.reasons), v.reasons


def test_a_permission_error_in_a_hang_is_reported_and_the_culprit_still_named(tmp_path: Path, probe_dir: Path) -> None:
    for r in (0, 2, 3):
        shutil.copy(probe_dir / "pyspy/text" / f"rank{r}.txt", tmp_path / f"rank{r}.txt")
    shutil.copy(DATA / "pyspy_errors" / "permission_denied.txt", tmp_path / "rank1.txt")
    v = stack_verdict(load_inputs(tmp_path, gpus_per_node=1))
    assert v.verdict == "hang" and v.culprit_ranks == (3,) and v.suspect_nodes == ("node-3",), v.explain()
    assert 1 not in v.suspect_ranks
    line = next(r for r in v.reasons if r.startswith("  rank 1:"))
    assert "Permission Denied" in line and "CAP_SYS_PTRACE" in line


def test_a_process_gone_whose_group_waits_for_it_is_a_missing_dump(tmp_path: Path, probe_dir: Path) -> None:
    # py-spy found rank 3's process gone; ranks 0-2 wait in the all_reduce it never joins
    for r in range(3):
        shutil.copy(probe_dir / "pyspy/text" / f"rank{r}.txt", tmp_path / f"rank{r}.txt")
    shutil.copy(DATA / "pyspy_errors" / "nonexistent_pid.txt", tmp_path / "rank3.txt")
    v = stack_verdict(load_inputs(tmp_path, gpus_per_node=1))
    assert v.verdict == "hang" and v.culprit_ranks == (3,) and v.suspect_nodes == ("node-3",), v.explain()
    assert any(e.kind == "missing-dump" and "gone" in e.detail for e in v.evidence)


def test_a_process_gone_in_a_running_job_is_only_a_collection_problem(tmp_path: Path) -> None:
    snap = DATA / "healthy_gloo_pyspy_3rounds" / "snapshot-0"
    for f in snap.iterdir():
        shutil.copy(f, tmp_path / f.name)
    shutil.copy(DATA / "pyspy_errors" / "nonexistent_pid.txt", tmp_path / "rank3.txt")
    v = stack_verdict(load_inputs(tmp_path, gpus_per_node=1))
    assert no_suspect(v), v.explain()
    assert v.details["collection_problems"][0]["kind"] == "process-gone"


def test_expected_ranks_decide_whether_a_rank_without_a_dump_is_missing(tmp_path: Path, probe_dir: Path) -> None:
    # rank 2 has no file: evidence only when the rank is known to exist from an independent source
    for r in (0, 1, 3):
        shutil.copy(probe_dir / "pyspy/text" / f"rank{r}.txt", tmp_path / f"rank{r}.txt")
    inp = load_inputs(tmp_path, gpus_per_node=1)
    known = stacks.facts(inp.procs, inp.topology, expected=[0, 1, 2, 3]).analyses[-1]
    assert 2 in known.missing_ranks and 2 in known.outlier_ranks
    unknown = stacks.facts(inp.procs, inp.topology, expected=[0, 1, 3]).analyses[-1]
    assert 2 not in unknown.missing_ranks and 2 not in unknown.outlier_ranks


# -- localize from the strong culprits outward -----------------------------------------------------


def _fh(*frames: str) -> str:
    lines = ["Current thread 0x00007f0000000001 (most recent call first):"]
    for f in frames:
        fn, where = f.split("@")
        file, line = where.split(":")
        lines.append(f'  File "{file}", line {line} in {fn}')
    return "\n".join(lines) + "\n"


def test_a_culprit_whose_replica_spans_most_nodes_is_named_and_its_victims_are_not_evicted(tmp_path: Path) -> None:
    # tp=2,pp=3,dp=2 on 3 nodes x 4 (investigation s6): rank 1 computes; its TP peer and the pipeline stages
    # of replica 0 wait in TP all_reduce / recv; replica 1 waits in the DP all_reduce
    busy = _fh("matmul@/job/train.py:95", "forward@/job/train.py:171", "<module>@/job/train.py:332")
    tp_wait = _fh("all_reduce@/t/distributed_c10d.py:3252", "forward@/job/train.py:249", "<module>@/job/train.py:332")
    recv = _fh("recv@/t/distributed_c10d.py:2799", "main@/job/train.py:187", "<module>@/job/train.py:332")
    dp_wait = _fh("all_reduce@/t/distributed_c10d.py:3252", "main@/job/train.py:201", "<module>@/job/train.py:332")
    # rank = tp + 2*dp + 4*pp: replica 0 = 0,1,4,5,8,9; replica 1 = 2,3,6,7,10,11
    stack = {0: tp_wait, 1: busy, 4: recv, 5: recv, 8: recv, 9: recv}
    for r in range(12):
        (tmp_path / f"rank{r}.txt").write_text(stack.get(r, dp_wait))
    inp = load_inputs(tmp_path, layout="tp=2,pp=3,dp=2", gpus_per_node=4)
    v = stack_verdict(inp)
    assert v.verdict == "hang" and v.culprit_ranks == (1,), v.explain()
    assert v.suspect_nodes == ("node-0",) and v.culprit_nodes == ("node-0",)
    victims = {r for e in v.evidence if e.kind == "victim" for r in e.ranks}
    assert victims == {0, 4, 5, 8, 9}


def _checkpoint_round(tmp_path: Path, writers: range) -> Inputs:
    """tp=4,dp=16 on 16 nodes x 4: ``writers`` in Megatron's save_checkpoint -> torch.save, the rest in its barrier."""
    write = _fh(
        "_write_files_from_queue@/t/distributed/checkpoint/filesystem.py:323",
        "save@/t/serialization.py:967",
        "save_checkpoint@/m/megatron/training/checkpointing.py:512",
        "train@/m/megatron/training/training.py:1402",
    )
    barrier = _fh(
        "barrier@/t/distributed/distributed_c10d.py:4635",
        "save_checkpoint@/m/megatron/training/checkpointing.py:540",
        "train@/m/megatron/training/training.py:1402",
    )
    for r in range(64):
        (tmp_path / f"rank{r}.txt").write_text(write if r in writers else barrier)
    return load_inputs(tmp_path, layout="tp=4,dp=16", gpus_per_node=4)


def test_a_checkpoint_data_parallel_replica_0_writes_alone_evicts_nobody(tmp_path: Path) -> None:
    """Megatron's (and DeepSpeed's) checkpoint writers are the model-parallel ranks of data-parallel rank 0; one
    round caught them writing while 60 ranks waited in the barrier after it (an outside tester's 512-rank case):
    a hang evicting their machine, as only rank 0 alone was taken for the job's own duty."""
    v = stack_verdict(_checkpoint_round(tmp_path, range(4)))
    assert v.verdict == "inconclusive" and no_suspect(v), v.explain()
    assert "Data-parallel replica 0 (ranks 0-3)" in v.explain() and "_write_files_from_queue" in v.explain()


def test_the_same_checkpoint_code_on_another_replica_stays_a_hang(tmp_path: Path) -> None:
    v = stack_verdict(_checkpoint_round(tmp_path, range(4, 8)))
    assert v.verdict == "hang" and v.culprit_ranks == (4, 5, 6, 7) and v.suspect_nodes == ("node-1",), v.explain()


def test_strong_culprits_in_unrelated_groups_are_inconclusive(tmp_path: Path) -> None:
    busy = _fh("matmul@/job/train.py:95", "forward@/job/train.py:171", "<module>@/job/train.py:332")
    wait = _fh("all_reduce@/t/distributed_c10d.py:3252", "main@/job/train.py:201", "<module>@/job/train.py:332")
    for r in range(16):
        (tmp_path / f"rank{r}.txt").write_text(busy if r in (1, 14) else wait)
    v = stack_verdict(load_inputs(tmp_path, layout="tp=2,pp=2,dp=4", gpus_per_node=2))
    assert v.verdict == "inconclusive" and v.suspect_nodes == (), v.explain()
    assert any("unrelated" in r for r in v.reasons)


def test_c10d_work_wait_is_a_collective_wait() -> None:
    from rankscope.analytics.stacks.frames import classify
    from rankscope.datasets.domain.stacks import Frame

    frames = (
        Frame("wait", "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2833),
        Frame("finish_grad_sync", "/m/megatron/core/distributed/param_and_grad_buffer.py", 536),
    )
    assert classify(frames)[0] == "collective"
    importing = (
        Frame("<module>", "/venv/torch/_ops.py", 1100),
        Frame("_find_and_load", "<frozen importlib._bootstrap>", 1176),
        Frame("<module>", "/job/train.py", 3),
    )
    assert classify(importing)[0] == "startup"
    # with NCCL the CPU blocks in the next device sync: waiting on its own GPU, not running its own code
    sync = (
        Frame("synchronize", "/venv/lib/python3.11/site-packages/torch/cuda/__init__.py", 1219),
        Frame("train_step", "/job/train.py", 80),
    )
    assert classify(sync)[0] == "device-wait"
    in_p2p = (sync[0], Frame("_communicate", "/m/megatron/core/pipeline_parallel/p2p_communication.py", 398))
    assert classify(in_p2p)[0] == "p2p"
    # torch.distributed.checkpoint's _DistWrapper.all_reduce runs the rank's write, then its own c10d call:
    # a rank writing its shard is doing I/O, not waiting in a collective (an outside tester's dcp.save hang)
    dcp = "/venv/lib/python3.12/site-packages/torch/distributed/checkpoint/"
    writing = (
        Frame("_save", "/venv/lib/python3.12/site-packages/torch/serialization.py", 1216),
        Frame("_write_item", dcp + "filesystem.py", 306),
        Frame("write_data", dcp + "state_dict_saver.py", 336),
        Frame("all_reduce", dcp + "utils.py", 288),
        Frame("_save_state_dict", dcp + "state_dict_saver.py", 347),
    )
    assert classify(writing)[0] == "io"
    waiting = (
        Frame("gather_object", "/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", 3130),
        Frame("gather_object", dcp + "utils.py", 116),
        *writing[3:],
    )
    assert classify(waiting)[0] == "collective"


_PIPE = "/venv/lib/python3.12/site-packages/torch/distributed/pipelining/schedules.py"
_PIPE_WAIT = f"""    _wait_batch_p2p ({_PIPE}:683)
    _step_microbatches ({_PIPE}:776)
    step ({_PIPE}:640)
    train_step (torchtitan/train.py:466)
    train (torchtitan/train.py:551)
    <module> (torchtitan/train.py:700)
"""
_PIPE_BUSY = """    forward (torch/nn/modules/linear.py:125)
    _call_impl (torch/nn/modules/module.py:1762)
    forward (torchtitan/models/llama3/model.py:412)
    forward_one_chunk (torch/distributed/pipelining/stage.py:628)
    _step_microbatches (torch/distributed/pipelining/schedules.py:781)
    step (torch/distributed/pipelining/schedules.py:640)
    train_step (torchtitan/train.py:466)
    train (torchtitan/train.py:551)
    <module> (torchtitan/train.py:700)
"""


@pytest.mark.parametrize(
    ("function", "file"),
    [
        ("all_gather_single", "distributed_c10d.py"),  # FSDP2's unshard in torch 2.13
        ("reduce_scatter_single", "distributed_c10d.py"),  # its gradient reduce-scatter
        ("all_gather_into_tensor_coalesced", "distributed_c10d.py"),
        ("wait_tensor", "_functional_collectives.py"),  # DTensor tensor parallel's wait on its collective
        ("reduce_scatter_tensor", "_functional_collectives.py"),
    ],
)
def test_collectives_of_fsdp2_and_tensor_parallel_are_waits_on_peers(function: str, file: str) -> None:
    """An outside tester's real FSDP2 and FSDP2 x TP captures: ranks blocked in ``all_gather_single`` and in
    ``wait_tensor`` (under ``OpOverloadPacket.__call__``) were read as running their own code, so a rank asleep
    before its forward was no hang and a throttled one no fail-slow."""
    from rankscope.analytics.stacks.frames import classify
    from rankscope.datasets.domain.stacks import Frame

    frames = (
        Frame("OpOverloadPacket.__call__", "/venv/lib/python3.11/site-packages/torch/_ops.py", 1279),
        Frame(function, f"/venv/lib/python3.11/site-packages/torch/distributed/{file}", 142),
        Frame("forward", "/job/train.py", 102),
    )
    assert classify(frames)[0] == "collective"
    own = (Frame("all_gather_rows", "/job/train.py", 12), Frame("forward", "/job/train.py", 102))
    assert classify(own)[0] == "compute"  # a name alone, outside torch.distributed, is the job's own code
    fc = "/venv/lib/python3.11/site-packages/torch/distributed/_functional_collectives.py"
    meta = (Frame("all_gather_tensor_meta", fc, 700), Frame("forward", "/job/train.py", 102))
    assert classify(meta)[0] == "compute"  # torch.compile's fake-tensor shapes: no wait on peers


def test_torch_pipelining_stage_waiting_on_its_p2p_work_is_a_p2p_wait(tmp_path: Path) -> None:
    # torch.distributed.pipelining waits with ``for w in work: w.wait()`` (C++ below): py-spy's innermost
    # frame is _wait_batch_p2p. Read as compute, a pipeline hang looked like a running job (an outside
    # tester's torchtitan pp=8 case: healthy, culprit missed).
    for r in range(8):
        body = _PIPE_BUSY if r == 5 else _PIPE_WAIT
        head = f"Process {9000 + r}: python -m torchtitan.train\nPython v3.12.3\n\n"
        text = f'{head}Thread {9000 + r} (idle): "MainThread"\n{body}'
        (tmp_path / f"node{r // 2}").mkdir(exist_ok=True)
        (tmp_path / f"node{r // 2}" / f"rank{r}.txt").write_text(text)
    v = stack_verdict(load_inputs(tmp_path, layout="pp=4,dp=2", gpus_per_node=2))
    assert v.verdict == "hang" and v.culprit_ranks == (5,) and v.suspect_nodes == ("node2",), v.explain()


def test_verdict_json_carries_the_collection_problems(tmp_path: Path) -> None:
    snap = DATA / "healthy_gloo_pyspy_3rounds" / "snapshot-2"
    for f in snap.iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "rank1.txt").write_text("")
    v = stack_verdict(load_inputs(tmp_path, gpus_per_node=1))
    d = json.loads(v.to_json())
    assert d["details"]["collection_problems"][0]["kind"] == "empty" and d["suspect_nodes"] == []


# -- one snapshot of a running pipeline job (tp=2,pp=2,dp=2) --------------------------------------------


@pytest.mark.parametrize("snap", ["round-0", "round-2"])
def test_one_snapshot_of_a_real_running_pipeline_job_names_nobody(snap: str) -> None:
    # a healthy 8-rank job caught mid-step: several ranks compute (forward, zero_grad, between steps) while the
    # others wait in different places (TP all_reduce, pipeline send/recv, DP all_reduce)
    inp = load_inputs(DATA / "healthy_mp8" / snap, layout="tp=2,pp=2,dp=2")
    v = run_diagnose(inp)
    assert no_suspect(v), v.explain()


def test_the_rounds_of_a_real_running_pipeline_job_name_nobody() -> None:
    v = run_diagnose(load_inputs(DATA / "healthy_mp8", layout="tp=2,pp=2,dp=2"))
    assert no_suspect(v) and v.n_snapshots == 3, v.explain()


def test_one_snapshot_that_looks_exactly_like_a_hang_says_it_rests_on_the_premise() -> None:
    # round-1 caught the healthy job with rank 3 between steps and every rank that depends on it waiting: one
    # snapshot cannot tell that from a hang (no time in it). The verdict must say it rests on the premise that
    # the job was stuck when captured, so that the caller (and the recovery ladder) knows what it stands on.
    v = run_diagnose(load_inputs(DATA / "healthy_mp8" / "round-1", layout="tp=2,pp=2,dp=2"))
    assert v.verdict == "hang" and any("premise" in r for r in v.reasons), v.explain()
    assert v.details["stuck_on_premise"] is True


@pytest.mark.parametrize("snap", ["round-0", "round-1"])
def test_one_snapshot_of_a_real_compute_hang_still_names_the_stuck_rank(snap: str) -> None:
    # rank 5 spins in compute at step 25 while its peers block: a stuck job leaves one rank running
    v = run_diagnose(load_inputs(DATA / "hang_compute_mp8" / snap, layout="tp=2,pp=2,dp=2", gpus_per_node=2))
    assert v.verdict == "hang" and v.culprit_ranks == (5,), v.explain()
    assert v.suspect_nodes[0] == "node-2", v.suspect_nodes


@pytest.mark.parametrize("gap", [1, 3])
def test_a_rank_without_a_dump_whose_peers_wait_with_everyone_is_a_collection_gap(tmp_path: Path, gap: int) -> None:
    # the real compute hang (rank 5 spins) with one healthy rank's dump lost in both rounds: its peers wait where
    # the healthy majority waits (or behind the culprit's victims), where it would wait too. It named the gap's
    # machine beside the culprit's (rank 1) or, as a rival culprit, nobody (rank 3).
    root = tmp_path / "hang"
    shutil.copytree(DATA / "hang_compute_mp8", root)
    for f in root.glob(f"round-*/rank{gap}.txt"):
        f.unlink()
    v = run_diagnose(load_inputs(root, layout="tp=2,pp=2,dp=2", gpus_per_node=2))
    assert v.verdict == "hang" and v.culprit_ranks == (5,) and v.suspect_nodes == ("node-2",), v.explain()
    assert any(r.startswith(f"Rank(s) {gap} left no dump") for r in v.reasons), v.explain()


def test_a_rank_without_a_dump_whose_peer_waits_apart_from_everyone_stays_a_rival_culprit(tmp_path: Path) -> None:
    # rank 6's TP peer (7) sits in a wait of its own: rank 6 may have crashed as well as rank 5 be stuck; two
    # unrelated culprits evict nobody
    root = tmp_path / "hang"
    shutil.copytree(DATA / "hang_compute_mp8", root)
    for f in root.glob("round-*/rank6.txt"):
        f.unlink()
    v = run_diagnose(load_inputs(root, layout="tp=2,pp=2,dp=2", gpus_per_node=2))
    assert v.verdict == "inconclusive" and not v.suspect_nodes, v.explain()
    assert "Culprit rank 6" in v.explain() and "Culprit rank 5" in v.explain()


def test_the_probe_with_a_healthy_rank_s_dump_lost_still_names_the_stuck_rank(tmp_path: Path, probe_dir: Path) -> None:
    # the real 4-rank gloo hang (rank 3 never joins the all_reduce) with rank 1's dump lost: ranks 0 and 2 wait
    # in the all_reduce rank 1 would be in too; it was inconclusive (two rival culprits)
    for r in (0, 2, 3):
        shutil.copy(probe_dir / "pyspy" / "text" / f"rank{r}.txt", tmp_path / f"rank{r}.txt")
    v = run_diagnose(load_inputs(tmp_path, layout="dp=4", gpus_per_node=1))
    assert v.verdict == "hang" and v.culprit_ranks == (3,) and v.suspect_nodes == ("node-3",), v.explain()
    assert any(r.startswith("Rank(s) 1 left no dump") for r in v.reasons), v.explain()


def test_a_group_laggard_is_the_rank_every_other_member_of_its_group_waits_for() -> None:
    """tp=4: in group 0 rank 2 computes while 0, 1, 3 wait in a collective (a laggard); in group 1 two ranks
    compute (nobody is waited for alone); a rank in the collective itself is never a laggard."""
    import numpy as np

    from rankscope.analytics.stacks.report import group_laggards
    from rankscope.analytics.stacks.snapshot import STATE_CODE
    from rankscope.datasets.domain.topology import Layout, Topology

    topo = Topology.from_layout(Layout.parse("tp=4,dp=2"), gpus_per_node=4)
    c, w = STATE_CODE["collective"], STATE_CODE["compute"]
    states = np.array([c, c, w, c, w, c, w, c], dtype=np.int8)
    assert group_laggards(states, topo).nonzero()[0].tolist() == [2]
    assert not group_laggards(np.full(8, c, dtype=np.int8), topo).any()


def test_py_spy_finding_no_python_at_a_rank_s_pid_is_no_live_trainer(tmp_path: Path, probe_dir: Path) -> None:
    """py-spy's "Failed to find python version" is `not-python` (its words: a zombie says "Failed to get process
    executable name" instead), yet for one rank among good dumps it means the same as a process gone: no live
    trainer at that pid. Its waiting peers make it the culprit; the words say what py-spy found."""
    for r in range(3):
        shutil.copy(probe_dir / "pyspy/text" / f"rank{r}.txt", tmp_path / f"rank{r}.txt")
    shutil.copy(DATA / "pyspy_errors" / "not_python.txt", tmp_path / "rank3.txt")
    v = stack_verdict(load_inputs(tmp_path, gpus_per_node=1))
    assert v.details["collection_problems"][0]["kind"] == "not-python", v.details["collection_problems"]
    assert v.verdict == "hang" and v.culprit_ranks == (3,), v.explain()
    assert "no Python at that pid" in v.explain(), v.explain()
