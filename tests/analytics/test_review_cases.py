"""A reviewer's counter-examples to the rules added from the outside testers' cases (``tests/data/review``,
see its README): each once named a wrong or non-existent machine, missed a culprit, or refused input."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rankscope.analytics import diagnose
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.spine import InputError

REVIEW = Path(__file__).parents[1] / "data" / "review"


@pytest.mark.parametrize(
    ("case", "gpus", "node", "rank"),
    [
        ("s1", 4, "trn-a02", 6),  # a missing dump in one round: the host folders stay machines
        ("s3", 4, "node8", None),  # two pods per host repeating pids: pods, not rounds (ranks by pid order)
        ("s4", 4, "node8", 6),  # one process per file, every pid 42: one snapshot
        ("s5", 4, "trn-a02", 6),  # a hang spreading between rounds stays a hang
        ("s6", 2, "dgx-h100-0744", 3),  # NCCL's container id never replaces the file's machine name
    ],
)
def test_the_hang_and_its_machine_hold(case, gpus, node, rank):
    v = diagnose(load_inputs(REVIEW / case, gpus_per_node=gpus))
    assert v.verdict.value == "hang" and v.culprit_nodes == (node,), v.explain()
    assert rank is None or v.culprit_ranks == (rank,), v.explain()


def test_two_hosts_local_rank_files_are_no_rounds():
    with pytest.raises(InputError, match="claimed by two processes"):
        load_inputs(REVIEW / "s2b", gpus_per_node=4)


def test_nobody_is_named():
    """An abort inside a wait is the cascade, not a culprit."""
    v = diagnose(load_inputs(REVIEW / "s8", gpus_per_node=4))
    assert not v.suspect_nodes and not v.culprit_ranks, v.explain()


def test_srun_label_tasks_are_read_and_srun_names_their_machine():
    """``srun --label`` (``1: [rank1]: ...``): each task's lines are read as its own; the task number is no
    machine, srun's own ``srun: error: gpu-b-014: task 1: Exited`` names it. Rank 1's CUDA error, the one
    failure that reports no lost peer, is the crash (the lines were not read before: nobody was named)."""
    v = diagnose(load_inputs(REVIEW / "s7", gpus_per_node=4))
    assert v.verdict.value == "crash" and v.culprit_nodes == ("gpu-b-014",) and v.culprit_ranks == (1,), v.explain()
    assert "1" not in v.suspect_nodes


def test_py_spy_on_a_stopped_process_says_it_is_stopped():
    """py-spy's error on a SIGSTOPped process read as "two tools attached to the process at once"."""
    from rankscope.analytics.stacks.collection import capture_problem
    from rankscope.datasets.domain.stacks import ProcStacks

    err = (
        "Error: Failed to get stack traces (caused by: Failed to suspend process; unexpected waitpid result "
        "PtraceEvent(Pid(8128), SIGSTOP, 128) to 8128)"
    )
    p = ProcStacks(0, 2, "trn-b01", "trainer", 8128, "failed", err, None, (), "r2.txt", "pyspy-text")
    problem = capture_problem(p)
    assert problem.kind == "stopped" and "SIGSTOP" in problem.advice and "two tools" not in problem.advice


def test_cpp_abort_lines_in_a_console_are_no_restart():
    """Consoles of a job the NCCL watchdog took down: the c10 lines carry ``[rankN]:``, the C++ exception and
    ``terminate called after throwing ...`` do not (libstdc++ writes them to the inherited stderr), then the
    launcher's ``failed (exitcode: -6)`` and its summary. The unprefixed stream went on after the failure
    line (the launcher's own traceback), which read as a failed worker speaking again: a restart, every
    watchdog line dropped, and the SIGABRTs called a code fault (``crash``)."""
    v = diagnose(load_inputs(REVIEW / "s9", layout="tp=4,dp=2", gpus_per_node=4))
    assert v.verdict.value == "hang" and v.suspect_nodes == ("dgx-h100-0742",), v.explain()
    assert "restart" not in v.explain(), v.explain()


def test_an_empty_log_of_a_later_attempt_still_says_the_job_restarted():
    """``--log-dir`` trees of a restarted job: attempt_0 holds rank 3's CUDA error (error.json), attempt_1 is
    the current run; on ml-gpu-018 attempt_1's logs are empty. Only the read files counted, so that host's
    attempt_0 looked current and a healthy machine was named (``crash``, 0.95)."""
    v = diagnose(load_inputs(REVIEW / "s10"))
    assert not v.suspect_nodes and not v.culprit_ranks and v.verdict.value != "crash", v.explain()


def test_the_restart_note_names_the_trees_whose_earlier_attempt_it_left_out(tmp_path):
    """It named the first three restarted trees, whether or not their earlier attempt left a file (an outside
    tester's note listed three hosts holding nothing, not the one that did)."""
    root = tmp_path / "s10"
    shutil.copytree(REVIEW / "s10", root)
    shutil.rmtree(root / "ml-gpu-017" / "llama_ft_4c1" / "attempt_0")
    v = diagnose(load_inputs(root))
    (note,) = [n for n in v.details["notes"] if "earlier attempts not used" in n]
    assert "(ml-gpu-018/llama_ft_4c1: latest attempt 1)" in note, note


def test_gloo_timeouts_give_gloo_dumps_a_clock_when_they_tie():
    """A real 4-rank gloo job on 2 hosts: rank 2 (``trn-a02``) sleeps instead of calling all_reduce #11; each
    rank dumped Flight Recorder on demand 4 s into the wait; ranks 0, 1, 3 then failed with gloo's "Timed out
    waiting 25000ms" at 05:40:39, 24.6 s after the op in flight in their dumps was created. Gloo dumps carry
    no time, so this was inconclusive; the timeouts show that op never completed."""
    v = diagnose(load_inputs(REVIEW / "s11", gpus_per_node=2))
    assert v.verdict.value == "hang" and v.culprit_ranks == (2,) and v.suspect_nodes == ("trn-a02",), v.explain()


def test_gloo_timeouts_of_another_moment_give_no_clock(tmp_path):
    """The same dumps beside consoles whose failures came 7 minutes later (a dump of another moment): the
    op in flight is not the one that timed out, and the dumps stay without a clock."""
    root = tmp_path / "job"
    shutil.copytree(REVIEW / "s11", root)
    for log in (root / "logs").iterdir():
        text = log.read_text().replace("2026-12-02_05:40:", "2026-12-02_05:47:").replace("E1202 05:40:", "E1202 05:47:")
        log.write_text(text)
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert not v.suspect_nodes and "gloo timeouts in the logs" not in v.explain(), v.explain()


@pytest.mark.parametrize(
    "case, why",
    [
        ("s12", "the console goes on with a requeued run's steps after the captured processes were SIGTERMed"),
        ("s13", "the rounds are stamped in UTC, the console logs in UTC+8: its last step reads as 8 h later"),
    ],
)
def test_steps_of_another_run_or_clock_are_no_progress_at_a_stamped_round(case, why):
    """A real hang (rank 6 spinning on ``trn-a02``, two frozen rounds in ``<host>/pyspy-<stamp>/``) beside a
    console whose later step lines are not the captured processes' progress: it read as fail-slow."""
    v = diagnose(load_inputs(REVIEW / case))
    assert v.verdict.value == "hang" and v.suspect_nodes == ("trn-a02",), (why, v.explain())


def test_a_suspended_node_is_not_evicted():
    """Both ranks of ``gpu-node-a`` stopped (a scheduler suspending the node, ``kill -STOP``), the other host's
    ranks wait in the all_reduce: the stopped ranks are named, the machine is not evicted."""
    v = diagnose(load_inputs(REVIEW / "s14", gpus_per_node=2))
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes and set(v.suspect_ranks) == {0, 1}, v.explain()


def test_a_gloo_dump_one_op_behind_its_timed_out_peers_gets_no_clock():
    """``s11`` with rank 0's dump as taken 0.3 s earlier (in all_reduce #10, #11 not yet enqueued): its failure
    still came one timeout after its oldest op in flight, but its peers wait in #11. Tied, it was read as
    frozen at #10 and its healthy machine evicted beside the culprit's."""
    v = diagnose(load_inputs(REVIEW / "s15"))
    assert "trn-a01" not in v.suspect_nodes and "gloo timeouts in the logs" not in v.explain(), v.explain()


def test_the_launchers_failed_pid_tells_an_earlier_attempts_crash_without_tee():
    """The real ``restart-then-hang`` consoles without torchrun's ``[defaultN]:`` tee prefix: the workers'
    own lines are unprefixed, so no restart can be seen from them; attempt 0's rank 1 CUDA error evicted
    ``trn-b01`` while attempt 1 hangs on rank 6. The launcher's "failed (exitcode: 1) local_rank: 1 (pid:
    12044)" gives the failed process's pid; the stacks show rank 1 running as pid 12261."""
    v = diagnose(load_inputs(REVIEW / "s16"))
    assert v.verdict.value == "hang" and v.suspect_nodes == ("trn-b02",) and v.culprit_ranks == (6,), v.explain()


def test_a_heartbeat_monitors_abort_of_the_silent_rank_is_its_hang_not_a_crash():
    """NCCL-format consoles (an outside tester's): rank 3's GPU wedged, its watchdog thread stuck; after 480 s
    its heartbeat monitor aborts it (SIGABRT, no error of its own), and 600 s in every other rank's watchdog
    times out. The logs named rank 3 the hang's laggard, but the abort led as a crash."""
    v = diagnose(load_inputs(REVIEW / "s17", layout="tp=4,dp=2", gpus_per_node=4))
    assert v.verdict.value == "hang" and v.suspect_nodes == ("dgx-h100-0801",) and v.culprit_ranks == (3,), v.explain()


@pytest.mark.parametrize(
    "case, why",
    [
        ("s18", "every node's torchrun writes its own run folder under one shared --log-dir, at the same time"),
        ("s19", "rank 2's CUDA error, no step for 23 minutes, then scancel: the stop proves no survival"),
        ("s20", "logger.exception(...); raise prints the fatal error twice while the other ranks lose their peer"),
    ],
)
def test_a_real_crash_is_not_explained_away(case, why):
    """A second reviewer's counter-examples to the rules that tell history and handled errors from crashes:
    each hid a real crash of rank 2 (inconclusive)."""
    v = diagnose(load_inputs(REVIEW / case, gpus_per_node=2))
    assert v.verdict.value == "crash" and v.culprit_ranks == (2,), (why, v.explain())


def test_rank_0_slow_in_model_compute_is_no_main_process_duty():
    """``failslow-5rounds`` with the slow process laid out as rank 0, caught in ``Linear.forward``: the others
    are never caught in forward because they always wait for it, so "code no other rank ran" excused it."""
    v = diagnose(load_inputs(REVIEW / "s21", gpus_per_node=2))
    assert v.verdict.value == "fail-slow" and v.culprit_ranks == (0,), v.explain()


def _timed_copy(tmp_path, case: str, stacks_at: str, logs_at: str):
    """``case`` copied with its files' modification times as the reviewer left them (a checkout resets them):
    stack dumps (``*.txt``) at ``stacks_at``, logs at ``logs_at`` (UTC)."""
    import calendar
    import os
    import shutil
    import time

    root = tmp_path / case
    shutil.copytree(REVIEW / case, root)
    for p in root.rglob("*"):
        if p.is_file():
            t = calendar.timegm(time.strptime(stacks_at if p.suffix == ".txt" else logs_at, "%Y-%m-%d %H:%M:%S"))
            os.utime(p, (t, t))
    return root


def test_a_long_checkpoint_caught_in_many_rounds_is_no_hang():
    v = diagnose(load_inputs(REVIEW / "s22", gpus_per_node=2))
    assert not v.suspect_nodes and v.verdict.value != "hang", v.explain()


def test_a_straggler_in_the_checkpoints_first_round_changes_nothing(tmp_path):
    import shutil

    root = tmp_path / "s29"
    shutil.copytree(REVIEW / "s22", root)
    shutil.copy(REVIEW / "s29" / "round-135-cn0203-rank5.txt", root / "round-135" / "cn0203" / "rank5.txt")
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert not v.suspect_nodes and v.verdict.value != "hang", v.explain()


@pytest.mark.parametrize(
    ("case", "stacks_at", "logs_at"),
    [
        ("s23", "2026-12-02 09:44:00", "2026-12-02 09:44:20"),  # naive CET stamps: the log times precede their lines
        ("s24", "2026-12-02 08:47:03", "2026-12-02 08:49:44"),  # a resubmission after the launcher's stop
        ("s25", "2026-12-02 08:53:00", "2026-12-02 08:57:30"),  # a restarted attempt after the agent's failure
        ("s30", "2026-12-02 09:44:00", "2026-12-02 09:50:00"),  # killed an hour on: its lines postdate the file
        ("s31", "2026-12-02 09:44:00", "2026-12-02 09:47:05"),  # an hour's timeout: its lines postdate the file
    ],
)
def test_steps_after_a_round_s_file_times_that_are_no_progress(tmp_path, case, stacks_at, logs_at):
    v = diagnose(load_inputs(_timed_copy(tmp_path, case, stacks_at, logs_at), gpus_per_node=2))
    assert v.verdict.value == "hang" and v.culprit_nodes == ("cn0104",) and v.culprit_ranks == (6,), v.explain()


def test_pods_with_identical_container_pids_are_no_rounds():
    v = diagnose(load_inputs(REVIEW / "s26", gpus_per_node=2))
    assert v.verdict.value == "hang" and v.culprit_nodes == ("llm-train-worker-1",) and v.culprit_ranks == (3,), (
        v.explain()
    )


def test_a_slurm_task_name_is_no_machine():
    """``llm-81234-3.out`` is job 81234's task 3: no machine; the batch log's ``3: cn0104`` names it."""
    v = diagnose(load_inputs(REVIEW / "s27", gpus_per_node=2))
    assert v.verdict.value == "hang" and v.culprit_ranks == (6,) and v.culprit_nodes == ("cn0104",), v.explain()


def test_a_batch_log_whose_steps_stopped_before_the_scancel_is_not_healthy():
    v = diagnose(load_inputs(REVIEW / "s28", gpus_per_node=2))
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes, v.explain()
    assert "no step for" in v.explain()


def test_kubectl_logs_fetched_later_keep_their_utc_stamps(tmp_path):
    """The logs' files written 20 minutes after their last lines (fetched after the incident): their lines'
    own ``...Z`` stamps agree with the Megatron stamps inside, so the steps are UTC and the dumps' times count."""
    root = _timed_copy(tmp_path, "s32", "2026-12-02 08:46:09", "2026-12-02 09:06:42")
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert v.verdict.value in ("healthy", "inconclusive") and not v.suspect_nodes, v.explain()


@pytest.mark.parametrize("case", ["s33", "s34", "s35"])
def test_host_names_tasks_printed_count_only_as_one_consistent_map(case):
    """Two tasks printing one host (a two-per-node hostname step), a task printing two names (a requeued run
    appended, ``uname -r`` first): no map; the launcher's summary names the crash's machine."""
    v = diagnose(load_inputs(REVIEW / case, gpus_per_node=2))
    assert v.verdict.value == "crash" and v.culprit_nodes == ("cn0102",) and v.culprit_ranks == (2,), v.explain()


def test_worker_pods_repeating_pids_under_a_job_folder_are_no_rounds():
    v = diagnose(load_inputs(REVIEW / "s36"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (4,) and v.culprit_nodes == ("mixtral-pt-worker-2",)
    assert v.n_snapshots == 1, v.explain()


def test_stamped_files_are_rounds_only_when_every_host_holds_as_many():
    with pytest.raises(InputError, match="other hosts hold a different number"):
        load_inputs(REVIEW / "s37")


def test_a_process_caught_exiting_in_a_console_stream_is_no_trainer(tmp_path):
    v = diagnose(load_inputs(REVIEW / "s38"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (6,) and v.culprit_nodes == ("cn0418",), v.explain()
    text = (REVIEW / "s38" / "slurm-4412871.out").read_text()
    odd = text.replace("0: Thread 15902 (active+gil)", "0: Thread 15902 (active+gil)\n0:     f (x.py:1)", 1)
    assert odd != text
    (tmp_path / "slurm-4412871.out").write_text(odd)  # a fifth numbered process in task 0: left out, never a refusal
    inputs = load_inputs(tmp_path)
    assert any("py-spy dumps inside consoles left out" in n for n in inputs.notes)


def test_a_round_that_reached_no_trainer_is_left_out():
    """The second round of a console's py-spy dumps was cut by ``scancel`` after the agents: a snapshot holding
    no trainer made the verdict "no usable trainer stack dumps" (0.0) beside a complete first round."""
    inputs = load_inputs(REVIEW / "s39")
    assert any("no trainer's dump in them" in n for n in inputs.notes)
    v = diagnose(inputs)
    assert v.verdict.value == "hang" and v.culprit_ranks == (6,) and v.culprit_nodes == ("cn0418",), v.explain()


def test_a_batch_size_ramp_up_is_no_slowdown():
    """Megatron's batch-size ramp-up doubles the step time by design; read as the job slowing down it turned off
    the rank-0 duty rule and evicted rank 0's machine as fail-slow. The time per sample did not change."""
    v = diagnose(load_inputs(REVIEW / "s40"))
    assert v.verdict.value == "healthy" and not v.suspect_nodes, v.explain()


def test_hosts_stamped_in_their_folder_names_are_no_older_incident():
    """``<host>-<stamp>/local0.txt``: with the stamped folders stripped, every host's local rank 0 claimed one
    slot, the hosts captured first were dropped as an older incident and the job called healthy at 0.90."""
    inputs = load_inputs(REVIEW / "s41")
    assert not any("older incident" in n for n in inputs.notes), inputs.notes
    v = diagnose(inputs)
    assert v.verdict.value != "healthy" and all(n.startswith("a100-r3-n2") for n in v.suspect_nodes), v.explain()
