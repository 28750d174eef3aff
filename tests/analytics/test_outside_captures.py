"""Real torchrun/py-spy captures an outside tester made (``tests/data/outside``, see its README), each of which
once gave a wrong answer."""

from __future__ import annotations

import calendar
import os
import shutil
import time
from pathlib import Path

import pytest

from rankscope.analytics import diagnose
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.spine import InputError

OUTSIDE = Path(__file__).parents[1] / "data" / "outside"


def test_a_rank_released_from_the_collective_its_peers_sit_in_is_not_named_on_premise():
    """Two rounds of a healthy job: the rank outside the all_reduce in round 1 sat in it in round 0, so it
    completed during the capture. A machine was evicted here ("hang" on the premise, 0.81)."""
    v = diagnose(load_inputs(OUTSIDE / "healthy-2rounds-json", gpus_per_node=4))
    assert not v.suspect_nodes and not v.culprit_ranks and v.verdict.value in ("healthy", "inconclusive"), v.explain()


def test_the_same_rank_stuck_in_both_rounds_is_still_named(tmp_path):
    """The rule above spares only a rank that moved: round 1 taken twice (the job frozen between two captures)
    names rank 4."""
    root = tmp_path / "frozen"
    for k in (0, 1):
        shutil.copytree(OUTSIDE / "healthy-2rounds-json" / "round-1", root / f"round-{k}")
    v = diagnose(load_inputs(root, gpus_per_node=4))
    assert v.verdict.value == "hang" and v.culprit_ranks == (4,) and v.culprit_nodes == ("trn-a02",), v.explain()


def test_a_frozen_job_whose_every_wait_recurs_is_never_called_healthy():
    """A pipeline send/recv deadlock in a dp=2 job: both rounds identical, and the three ranks in `recv` (one
    replica) recur enough to count as a healthy state. It was `healthy` at 0.90; stuck with nobody apart from
    their peers is inconclusive, pointing at the ranks outside the largest wait."""
    v = diagnose(load_inputs(OUTSIDE / "pp-deadlock-2rounds", layout="tp=2,dp=2,pp=2", gpus_per_node=2))
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes, v.explain()
    assert "0-1,5" in v.explain()


def test_an_untimed_segfault_is_the_culprit_when_every_timed_failure_is_a_cascade():
    """The segfault's stderr.log has no time, every error file (timed) reports a lost peer: the segfault was
    left out as unordered and nobody was named; it is the only failure that does not report a lost peer."""
    v = diagnose(load_inputs(OUTSIDE / "segfault-logdir", gpus_per_node=4))
    assert v.verdict.value == "crash" and v.culprit_ranks == (2,) and v.culprit_nodes == ("trn-a01",), v.explain()
    assert v.confidence <= 0.7


@pytest.mark.parametrize("capture", ["dumps_{k}", "job-1234-{k}", "2026-12-02T02-3{k}"])
def test_capture_folders_under_host_folders_name_neither_machines_nor_one_snapshot(tmp_path, capture):
    """``<host>/dumps_<k>/rankN.txt``: the capture folder was taken for the machine (then refused, and
    ``node-1`` invented) and the two rounds read as one snapshot dumped twice."""
    root = tmp_path / "job"
    for src in (OUTSIDE / "host-capture-folders").rglob("*"):
        if src.is_file():
            parts = src.relative_to(OUTSIDE / "host-capture-folders").parts
            if len(parts) == 3:
                parts = (parts[0], capture.format(k=parts[1][-1]), parts[2])
            dst = root.joinpath(*parts)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
    v = diagnose(load_inputs(root, gpus_per_node=4))
    assert v.verdict.value == "hang" and v.culprit_ranks == (6,) and v.culprit_nodes == ("trn-a02",), v.explain()
    assert v.n_snapshots == 2 and not v.details.get("inferred_node_names"), v.explain()


def test_per_host_files_holding_the_same_processes_are_rounds():
    """``<host>/pyspy-all-0.txt`` and ``pyspy-all-1.txt``: the same pids twice on one host were refused ("4
    trainer process(es) on trn-a01 without a rank, but --gpus-per-node is 2")."""
    v = diagnose(load_inputs(OUTSIDE / "host-pyspy-rounds", gpus_per_node=2))
    assert v.verdict.value == "hang" and v.culprit_ranks == (3,) and v.culprit_nodes == ("trn-a02",), v.explain()
    assert v.n_snapshots == 2


def test_a_copy_of_a_dump_is_no_round(tmp_path):
    """Sibling folders whose names differ in more than digits (a copy) stay one snapshot dumped twice, never
    two rounds (identical rounds read as a frozen job)."""
    root = tmp_path / "job"
    for host in ("trn-a01", "trn-a02"):
        for name in ("dumps", "dumps-copy"):
            shutil.copytree(OUTSIDE / "host-capture-folders" / host / "dumps_1", root / host / name)
    v = diagnose(load_inputs(root, gpus_per_node=4))
    assert v.n_snapshots == 1 and v.culprit_nodes == ("trn-a02",), v.explain()


def test_a_slow_rank_caught_in_its_slow_part_every_round_is_fail_slow():
    """Waiters released 0/3, 2/3, 1/2, 0/3: the last pair frozen read as a hang that began during the capture,
    though the second pair released waiters while the slow rank sat at the very same stack."""
    v = diagnose(load_inputs(OUTSIDE / "failslow-5rounds", gpus_per_node=2))
    assert v.verdict.value == "fail-slow" and v.culprit_nodes == ("trn-a02",), v.explain()


def test_a_console_and_its_log_dir_tree_are_one_launcher():
    """The console names no machine; its [rank<N>] tags match the tree's under ``trn-a01/``. It took a second
    machine's slot: 5 ranks for a 4-rank job, and ranks renumbered by host order."""
    v = diagnose(load_inputs(OUTSIDE / "console-and-logdir"))
    assert v.verdict.value == "crash" and v.culprit_ranks == (2,) and v.culprit_nodes == ("trn-a01",), v.explain()
    assert v.world_size == 4 and not v.details.get("inferred_node_names"), v.explain()


@pytest.mark.parametrize("case", ["healthy-eval-4rounds", "healthy-uneven-3rounds", "healthy-2rounds-json"])
def test_rounds_that_neither_move_nor_freeze_evict_no_one(case):
    """Healthy jobs with uneven work caught in 2-4 rounds: the rounds' premise isolated a machine at 0.66-0.81
    (a sweep of a tester's healthy captures gave 10 such evictions in 112 inputs)."""
    v = diagnose(load_inputs(OUTSIDE / case, gpus_per_node=4))
    assert not v.suspect_nodes and not v.culprit_nodes, v.explain()


def test_a_restarted_job_is_diagnosed_by_its_latest_attempt():
    """attempt_0's crash on trn-b01 led (crash 0.95) and evicted it while attempt_1 hung on trn-b02."""
    v = diagnose(load_inputs(OUTSIDE / "restart-then-hang", gpus_per_node=4))
    assert v.verdict.value == "hang" and v.culprit_nodes == ("trn-b02",), v.explain()


def test_dumps_of_exiting_processes_are_no_healthy_cluster():
    """py-spy caught two processes exiting (threads without a frame): they were the "dominant healthy cluster
    (empty in empty)" and a job with half its processes gone was healthy at 0.70."""
    v = diagnose(load_inputs(OUTSIDE / "sigkill-stacks-only", gpus_per_node=4))
    assert v.verdict.value != "healthy" and not v.suspect_nodes, v.explain()
    assert "empty in empty" not in v.explain()


@pytest.mark.parametrize(
    ("case", "verdict", "nodes"), [("stale-console", None, ()), ("two-incidents", "hang", ("trn-b01",))]
)
def test_a_failure_of_a_process_the_stacks_no_longer_show_is_not_this_run_s(case, verdict, nodes):
    """The crashed process (its pid in the launcher's summary) is not the process the stacks show running for
    that rank: an earlier run's failure led (crash 0.80, the wrong machine) over today's stacks."""
    v = diagnose(load_inputs(OUTSIDE / case, gpus_per_node=4))
    assert v.verdict.value != "crash" and v.culprit_nodes == nodes, v.explain()
    assert verdict is None or v.verdict.value == verdict, v.explain()


def test_gloo_timeouts_do_not_make_on_demand_dumps_watchdog_dumps():
    """Any timeout in the logs took the Flight Recorder dumps as written by NCCL's watchdog at the timeout;
    gloo dumps only on demand: the earliest stale dump's rank was named at 0.90 (the wrong machine)."""
    v = diagnose(load_inputs(OUTSIDE / "stale-gloo-fr", gpus_per_node=4))
    assert "trn-b01" not in v.suspect_nodes, v.explain()


def test_names_typed_with_spaces_are_read(tmp_path):
    """``round 0/``, ``rank 3.json``: a space for the separator was refused as too many ranks without one."""
    root = tmp_path / "incident 2026-12-02"
    for src in (OUTSIDE / "pp-deadlock-2rounds").rglob("*.json"):
        snap, host, name = src.relative_to(OUTSIDE / "pp-deadlock-2rounds").parts
        dst = root / snap.replace("snapshot-", "round ") / host / name.replace("rank", "rank ")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)
    v = diagnose(load_inputs(root, layout="tp=2,dp=2,pp=2", gpus_per_node=2))
    assert v.n_snapshots == 2 and v.world_size == 8 and not v.suspect_nodes, v.explain()


def test_a_dump_reached_through_a_link_and_directly_is_one_dump(tmp_path):
    """``by-host/round-N/<host>/rankK.txt`` links to ``pool/<time>/<name>.txt``: every dump was read twice,
    and the pool copies (no rank in their names) were refused as too many ranks for the host."""
    root = tmp_path / "job"
    pool = root / "pool" / "2026-12-02T03-40"
    pool.mkdir(parents=True)
    for k in (0, 1):
        for host in ("trn-a01", "trn-a02"):
            for src in sorted((OUTSIDE / "host-capture-folders" / host / f"dumps_{k}").glob("rank*.txt")):
                real = pool / f"r{k}-{host}-{src.stem.replace('rank', 'p')}.txt"
                shutil.copy(src, real)
                link = root / "by-host" / f"round-{k}" / host / src.name
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(os.path.relpath(real, link.parent))
    v = diagnose(load_inputs(root, gpus_per_node=4))
    assert v.verdict.value == "hang" and v.culprit_ranks == (6,) and v.culprit_nodes == ("trn-a02",), v.explain()
    assert v.n_snapshots == 2


def test_a_stopped_rank_its_peers_wait_for_is_named_but_its_machine_not_evicted():
    """4 ranks (one per machine); rank 2 SIGSTOPped mid-training, the others block in the all_reduce; py-spy
    cannot sample a stopped process ("Failed to suspend process; unexpected waitpid result PtraceEvent(...,
    SIGSTOP, ...)"). Its own capture proves the process exists and runs nothing: the rank the others wait for.
    A stop comes from a person, a debugger or the scheduler, never from the hardware: nothing to evict."""
    v = diagnose(load_inputs(OUTSIDE / "sigstop-2rounds", gpus_per_node=1))
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes and v.suspect_ranks == (2,), v.explain()
    assert any("stopped (SIGSTOP" in r and "kill -CONT" in r for r in v.reasons), v.explain()


def test_a_stopped_rank_nobody_waits_for_is_not_named(tmp_path):
    """The same capture with the peers' dumps of a healthy round instead (all computing): the stopped rank is
    still only a collection problem."""
    root = tmp_path / "job"
    shutil.copytree(OUTSIDE / "sigstop-2rounds" / "round-1", root)
    for r in (0, 1, 3):
        text = (root / f"rank{r}.txt").read_text()
        head, _, _ = text.partition("    all_reduce")
        computing = "    forward (torch/nn/modules/linear.py:125)\n    <module> (train.py:7)\n"
        (root / f"rank{r}.txt").write_text(head + computing)
    v = diagnose(load_inputs(root, gpus_per_node=1))
    assert not v.suspect_nodes and not v.culprit_ranks, v.explain()


def test_steps_logged_after_a_stamped_round_mean_the_job_was_moving():
    """8 ranks on 4 hosts, rank 4 slow every step; five py-spy rounds in ``<host>/pyspy-<YYYYmmdd-HHMMSS>/``
    and each host's torchrun console with timed step lines. The last two rounds showed no waiter released,
    which read as a hang beginning during the capture and named rank 0's machine (caught in its backward). The
    folder names carry the capture times, and the console logged a step after the last of them."""
    v = diagnose(load_inputs(OUTSIDE / "failslow-stamped-rounds", gpus_per_node=2))
    assert v.verdict.value != "hang" and "hpc-gpu0115" not in v.suspect_nodes, v.explain()
    assert "after the last snapshot" in v.explain(), v.explain()


def test_a_stamp_shared_by_every_round_is_no_capture_time(tmp_path):
    """The same rounds under one folder named by the job's launch time: one stamp for all rounds proves
    nothing about when each was taken (the old reading, a hang, stands)."""
    src = OUTSIDE / "failslow-stamped-rounds"
    root = tmp_path / "incident"
    run = root / "run-20261202-050000"
    for host in sorted(p for p in src.iterdir() if p.is_dir()):
        for k, rnd in enumerate(sorted(q for q in host.iterdir() if q.is_dir())):
            shutil.copytree(rnd, run / host.name / f"round-{k}")
        shutil.copy(host / "torchrun-console.log", run / host.name / "torchrun-console.log")
    now = time.time()
    for p in root.rglob("*"):  # copied without their times (the capture's times would say when it was taken)
        os.utime(p, (now, now))
    inputs = load_inputs(root, gpus_per_node=2)
    assert now - 1 <= inputs.snapshot_latest.get(4, now) <= now + 1 and len({p.snapshot for p in inputs.procs}) == 5
    v = diagnose(inputs)
    assert "after the last snapshot" not in v.explain(), v.explain()


def test_a_thread_s_traceback_is_no_exit_of_its_process():
    """Rank 0's prefetch thread died with an I/O error ("Exception in thread batch-prefetch:" and its
    traceback in the console), the process lived on, logged steps, then blocked in ``Queue.get`` while its
    peers waited in the all_reduce. It was a ``crash`` (the thread's traceback read as the process's exit)."""
    inputs = load_inputs(OUTSIDE / "thread-exception-queue", gpus_per_node=2)
    v = diagnose(inputs)
    assert v.verdict.value == "hang" and v.culprit_ranks == (0,) and v.suspect_nodes == ("gpu-node-a",), v.explain()
    assert any("rank 0: a thread died with OSError: [Errno 5]" in n for n in inputs.notes), inputs.notes


def test_a_manifest_row_whose_file_is_absent_keeps_its_rank_and_machine():
    """8 ranks on 4 hosts named by a manifest; the collection could not reach ``trn-a03`` (its two rows listed,
    their files absent), rank 5 there stuck in compute, the other six in the all_reduce. The absent rows lost
    their manifest identity: "dumps with no rank", and the culprit machine invented as ``node-2``."""
    v = diagnose(load_inputs(OUTSIDE / "manifest-absent-host", gpus_per_node=2))
    assert v.verdict.value == "hang" and v.suspect_nodes == ("trn-a03",) and v.culprit_ranks == (4, 5), v.explain()
    assert "listed in the manifest but absent" in v.explain() and "node-2" not in v.explain(), v.explain()


def test_ddp_ranks_leaving_backward_together_are_released_by_their_peers():
    """A 4-rank DDP job on 2 hosts still training, rank 2 (``gpu-node-b``) ~3x slow every step; five concatenated
    per-host py-spy rounds. DDP waits for its gradient all-reduce inside the autograd engine, so the fast ranks
    wait in ``backward``, not in a collective: their leaving it never counted as a release, and three rounds
    without one read as a frozen job (``hang``)."""
    v = diagnose(load_inputs(OUTSIDE / "ddp-failslow-5rounds", gpus_per_node=2))
    assert v.verdict.value == "fail-slow" and v.culprit_ranks == (2,) and "gpu-node-b" in v.suspect_nodes, v.explain()


def test_one_frozen_pair_after_progress_is_no_hang_when_nobody_sat_still_through_three_rounds():
    """A healthy 4-rank job on 2 hosts: rank 0 saves a ~120 MB checkpoint every 5 steps while the others wait
    in a barrier; three ``--json`` rounds, the last two catching two different checkpoints with identical
    stacks (the job went from step 7 to 19 to 29). It was a hang on ``gpu-node-a``: "a hang that began
    during the capture"."""
    v = diagnose(load_inputs(OUTSIDE / "checkpoint-caught-twice", gpus_per_node=2))
    assert not v.suspect_nodes and not v.culprit_ranks and v.verdict.value != "hang", v.explain()


def test_the_same_rounds_with_the_checkpoint_already_running_in_the_first_name_rank_0_but_no_machine(tmp_path):
    """Round 1 taken in place of round 0 too: rank 0 in its checkpoint and the others in the barrier through
    three snapshots is frozen from the start. Rank 0 alone in code no other rank ran is its own duty (a long
    save and a stuck one look alike): it was a hang isolating rank 0's machine; now rank 0 is named in words."""
    root = tmp_path / "job"
    for k, src in enumerate(("round-1", "round-1", "round-2")):
        shutil.copytree(OUTSIDE / "checkpoint-caught-twice" / src, root / f"round-{k}")
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes and 0 in v.suspect_ranks, v.explain()
    assert "own duties" in v.explain() and "save_checkpoint" in v.explain()


def test_round_folders_on_one_host_are_never_machine_names(tmp_path):
    """``<host>/pyspy-0/`` and ``<host>/pyspy-1/`` on a single host: the rounds were read as rounds, yet the
    round folder stayed the machine's name ("Culprit rank 2 on pyspy-0")."""
    for k in (0, 1):
        shutil.copytree(OUTSIDE / "sigstop-2rounds" / f"round-{k}", tmp_path / "gpu-node-a" / f"pyspy-{k}")
    inputs = load_inputs(tmp_path, gpus_per_node=4)
    assert len({p.snapshot for p in inputs.procs}) == 2
    assert not any(p.node and p.node.startswith("pyspy") for p in inputs.procs), {p.node for p in inputs.procs}


def test_rounds_in_which_nobody_waited_prove_no_frozen_collective():
    """A fourth tester's healthy 4-rank job evaluating: every rank computes in rounds 0 and 1, in round 2 three
    wait in the all_reduce for rank 0's larger shard. "No rank ever left a wait on its peers" held because no
    rank had been waiting at all, and rank 0's machine was named (hang, 0.88)."""
    v = diagnose(load_inputs(OUTSIDE / "eval-uneven-3rounds", gpus_per_node=2))
    assert not v.suspect_nodes and not v.culprit_ranks, v.explain()


def test_rank_0_lagging_behind_its_own_duties_is_no_degraded_machine():
    """A fourth tester's healthy 4-rank job on 2 hosts: rank 0 writes a metrics JSONL line (json.dumps, fsync)
    after every step while the others wait in the next all_reduce; five ``--json`` rounds 2 s apart in
    ``<host>/pyspy-<stamp>/``. Rank 0 stood out in 4 of 5 rounds (caught in ``log_metrics``, or behind in
    its compute because of it), and the vote called it a fail-slow machine (0.85)."""
    v = diagnose(load_inputs(OUTSIDE / "rank0-metrics-5rounds", gpus_per_node=2))
    assert not v.suspect_nodes and v.verdict.value != "fail-slow", v.explain()


@pytest.mark.parametrize(
    "case, why",
    [
        ("handled-errors-console", "the launcher was stopped from outside (scancel) with no failure of its own"),
        ("handled-errors-logdir", "rank 2 printed the same ConnectionError twice: a process ends once"),
    ],
)
def test_tracebacks_a_healthy_job_lived_through_name_no_machine(case, why):
    """A fourth tester's healthy 4-rank job on 2 hosts: rank 2 prints the traceback of a caught ConnectionError
    (a metrics push) at steps 5 and 12 and trains on, a daemon thread of it dies at step 8; the job is stopped
    with SIGTERM. Its traceback read as its exit: a crash on ``trn-a02``."""
    v = diagnose(load_inputs(OUTSIDE / case, gpus_per_node=2))
    assert not v.suspect_nodes and v.verdict.value != "crash", (why, v.explain())


def test_whole_host_dumps_with_the_launcher_in_stamped_round_folders():
    """A fourth tester's healthy 4-rank job (DataLoader num_workers=2) on 2 hosts: every python process of each
    host's launcher tree (torchrun's agent, 2 trainers, 4 DataLoader workers) py-spy'd into one file per round,
    ``<host>/pyspy-<stamp>/<host>.txt``, three rounds, plus consoles. The agent counted as a trainer and the
    round folder (recurring under both hosts, before any rank was known) as the machine: refused."""
    inputs = load_inputs(OUTSIDE / "whole-host-stamped-rounds", gpus_per_node=2)
    trainers = [p for p in inputs.procs if p.role == "trainer"]
    assert len(trainers) == 12 and {p.node for p in trainers} == {"trn-a01", "trn-a02"}
    v = diagnose(inputs)
    assert not v.suspect_nodes, v.explain()


def test_an_older_incident_kept_beside_the_current_capture_is_left_out():
    """A fourth tester's healthy job captured in five stamped rounds (``<host>/pyspy-20261202-0626xx/``) beside
    yesterday's hang (``incident-20261201/round-N/<host>/rankK.json``: rank 1 stuck, other pids). Both claimed
    each rank, and the input was refused; the latest incident is diagnosed, the older one left out with a note."""
    inputs = load_inputs(OUTSIDE / "older-incident-beside", gpus_per_node=2)
    assert not any(p.source.startswith("incident-20261201/") for p in inputs.procs)
    assert any("incident-20261201 left out" in n for n in inputs.notes), inputs.notes
    v = diagnose(inputs)
    assert not v.suspect_nodes, v.explain()


def test_a_crash_the_job_stepped_on_after_is_not_the_current_fault():
    """A fourth tester's ``--log-dir`` root reused across submissions: each host folder holds the previous run's
    tree (rank 2 on ``trn-a02`` died of a DataLoader bus error, error.json at 06:20) and today's healthy run
    (another run id, steps to 06:27), plus today's five stamped py-spy rounds showing rank 2 training. The
    old error file led (crash, 0.95) and evicted ``trn-a02``."""
    v = diagnose(load_inputs(OUTSIDE / "reused-logdir-old-crash", gpus_per_node=2))
    assert not v.suspect_nodes and v.verdict.value != "crash", v.explain()
    assert "the job went on without it" in v.explain(), v.explain()


def test_a_sidecar_in_a_whole_host_dump_is_no_rank():
    """``for p in $(pgrep python); do py-spy dump --pid $p; done`` per host and round: torchrun's agent, an
    unrelated ``python -m http.server`` and the 2 trainers. The sidecar counted as a third trainer per host, and
    the input was refused (9 trainers on one host with --gpus-per-node 2)."""
    inputs = load_inputs(OUTSIDE / "whole-host-sidecar", gpus_per_node=2)
    trainers = [p for p in inputs.procs if p.role == "trainer"]
    assert len(trainers) == 12 and len({p.snapshot for p in trainers}) == 3
    assert not diagnose(inputs).suspect_nodes


def test_one_stamped_round_and_steps_soon_after_it_are_no_hang():
    """One py-spy round in ``<host>/pyspy-<stamp>/`` during rank 0's 9 s validation (ranks 1-3 in a barrier) and
    the consoles, whose iteration lines resume 8 s after the stamp. One snapshot was analysed on the premise
    that the job was stuck, and rank 0's machine named."""
    v = diagnose(load_inputs(OUTSIDE / "one-stamped-round-validation", gpus_per_node=2))
    assert not v.suspect_nodes and v.verdict.value != "hang", v.explain()


def test_an_earlier_launch_in_a_reused_log_dir_is_not_the_current_run(tmp_path):
    """``--log-dir`` trees only, the root reused by two launches on each host: the first launch's run (rank 2 on
    ``trn-a02`` died of a DataLoader bus error, error files at 06:20) beside the second, healthy one (steps to
    06:27; on ``trn-a02`` its logs carry no time stamp). The first launch's error files led (crash, 0.95).
    Which run is later: its logs' stamps, else its files' times when a minute or more apart (a git checkout
    resets them, so they are set here as the capture left them)."""
    root = tmp_path / "job"
    shutil.copytree(OUTSIDE / "reused-logdir-logs-only", root)
    first = {"none_10ozi8y_", "none_t1xray_c"}  # the first launch's run folders (trn-a01, trn-a02)
    for p in root.rglob("*"):
        t = 1796192424.0 if first & set(p.parts) else 1796192808.0
        os.utime(p, (t, t))
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert not v.suspect_nodes and v.verdict.value != "crash", v.explain()


def test_an_older_incident_in_stamped_folders_on_the_same_hosts_is_left_out(tmp_path):
    """Stamped capture folders of two incidents on the same hosts: an earlier job's hang (2 rounds at 06:22,
    other pids) beside today's healthy job (5 rounds at 06:26-06:27). Only the first folder of the older
    incident was left out, and the input was refused as two processes per rank. The same with a date alone on
    the older side, on the same day, is left as it was: which came first is unknown."""
    v = diagnose(load_inputs(OUTSIDE / "two-stamped-incidents", gpus_per_node=2))
    assert not v.suspect_nodes, v.explain()
    root = tmp_path / "job"
    shutil.copytree(OUTSIDE / "two-stamped-incidents", root)
    for host in root.iterdir():
        for k, old in enumerate(sorted(host.glob("pyspy-20261202-0622*"))):
            old.rename(host / f"incident-20261202-r{k}")
    with pytest.raises(InputError, match="claimed by two processes"):
        load_inputs(root, gpus_per_node=2)


def test_a_console_appended_across_submissions_is_read_for_the_last_one():
    """Each host's console appended across two submissions (``tee -a <host>/train.log``): the first one's rank 2
    dies of a DataLoader bus error (the launcher's failure summary follows), then a new launcher and minutes of
    healthy training until SIGTERM. The summary, printed after the failure line, survived the restart cut and
    led (crash 0.95 on ``trn-a02``)."""
    v = diagnose(load_inputs(OUTSIDE / "appended-console-two-submissions", gpus_per_node=2))
    assert not v.suspect_nodes and v.verdict.value != "crash", v.explain()


def test_flight_recorder_captures_kept_per_host_are_whole_captures():
    """A fourth tester's gloo Flight Recorder JSON dumps of a healthy 4-rank job taken at 3 moments, kept per
    host and moment (``<host>/fr-dump-K/rankN.json``): each host's ``fr-dump-K`` held half a capture, read as a
    capture of its own ("2 of 4 ranks left a dump"), and the machines were invented (``node-0``)."""
    inputs = load_inputs(OUTSIDE / "fr-per-host-captures", gpus_per_node=2)
    last = max(d.capture for d in inputs.fr_dumps)
    assert sorted(d.rank for d in inputs.fr_dumps if d.capture == last) == [0, 1, 2, 3]
    assert inputs.topology is not None and set(inputs.topology.nodes) == {"trn-a01", "trn-a02"}
    assert not diagnose(inputs).suspect_nodes


def _k8s_checkpoint(tmp_path, mtime: float, log_mtime: float) -> Path:
    root = tmp_path / "k8s"
    shutil.copytree(OUTSIDE / "k8s-checkpoint-one-round", root)
    for p in root.rglob("*"):  # a checkout resets modification times: set them
        t = log_mtime if p.suffix == ".log" else mtime
        os.utime(p, (t, t))
    return root


def test_one_round_whose_files_predate_logged_steps_is_a_moving_job(tmp_path):
    """One py-spy round during rank 0's checkpoint (the others in a barrier), no capture time in any name, but
    the files' modification times (08:46:09 UTC, when py-spy wrote them) are followed by logged iterations:
    the job moved after the capture. It was `hang` isolating the pod holding rank 0."""
    capture = calendar.timegm((2026, 12, 2, 8, 46, 9, 0, 0, 0))
    logs_end = calendar.timegm((2026, 12, 2, 8, 46, 42, 0, 0, 0))  # the pods deleted: the consoles' last lines
    v = diagnose(load_inputs(_k8s_checkpoint(tmp_path, capture, logs_end), gpus_per_node=2))
    assert v.verdict.value in ("healthy", "inconclusive") and not v.suspect_nodes, v.explain()
    assert "after the last snapshot" in v.explain()


def test_modification_times_after_the_last_step_prove_nothing(tmp_path):
    """Copied without keeping times (a checkout, `cp` without -p), the files are newer than every logged step
    (and the logs' own times no longer follow their last lines): no progress is read from them and the single
    round is judged on its stacks alone: rank 0 alone in its checkpoint, code no other rank ran, names no
    machine (it was a hang isolating llm-train-master-0)."""
    v = diagnose(load_inputs(_k8s_checkpoint(tmp_path, time.time(), time.time()), gpus_per_node=2))
    assert "after the last snapshot" not in v.explain()
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes and 0 in v.suspect_ranks, v.explain()


def test_pod_names_in_front_of_the_rank_name_the_machines():
    """``<pod>-rank<k>.txt`` beside ``<pod>.log``: the pod is the machine (it was named ``node-1``)."""
    v = diagnose(load_inputs(OUTSIDE / "k8s-pod-named-files", gpus_per_node=2))
    assert v.verdict.value == "hang" and v.culprit_nodes == ("llm-train-worker-0",) and v.culprit_ranks == (3,), (
        v.explain()
    )


def test_a_name_prefix_no_log_corroborates_names_no_machine(tmp_path):
    """Without the pods' logs the prefix is only a file name: the machine stays an inferred one."""
    root = tmp_path / "stacks"
    root.mkdir()
    for p in (OUTSIDE / "k8s-pod-named-files").glob("*.txt"):
        shutil.copy(p, root / p.name)
    inputs = load_inputs(root, gpus_per_node=2)
    assert not any(n.startswith("llm-train") for n in inputs.topology.node_names), inputs.notes


@pytest.mark.parametrize(
    ("case", "node", "rank"),
    [("k8s-kubectl-prefix-crash", "llm-train-worker-1", 4), ("slurm-label-crash", "cn0102", 2)],
)
def test_consoles_of_several_pods_or_tasks_are_read_per_prefix(case, node, rank):
    """``kubectl logs --prefix`` (``[pod/<pod>/pytorch] ``) and ``srun --label`` (``<task>: ``) interleave every
    launcher's lines in one file: each prefix is one launcher's console (a pod names its machine; a task's
    own failure summary names its host). Both were "no evidence"."""
    v = diagnose(load_inputs(OUTSIDE / case, gpus_per_node=2))
    assert v.verdict.value == "crash" and v.culprit_nodes == (node,) and v.culprit_ranks == (rank,), v.explain()


def test_a_slurm_task_file_is_named_by_its_launcher_summary():
    """``%x-%j-%t.out`` names a task: the torchrun failure summary inside (``host : cn0102``) names the machine
    (it was ``llm-81235-1``)."""
    v = diagnose(load_inputs(OUTSIDE / "slurm-task-files-crash", gpus_per_node=2))
    assert v.verdict.value == "crash" and v.culprit_nodes == ("cn0102",), v.explain()


def test_a_frozen_tail_at_a_place_never_worked_at_before_proves_no_hang():
    """45 rounds: 15 of a training job, then 30 in which nobody is released while rank 5 computes in code it
    never ran while the job moved. A long phase of one rank (rank 0's evaluation, a checkpoint) looks alike
    without time evidence, so no hang is called from the stacks; only rank 5's machine may be named."""
    v = diagnose(load_inputs(OUTSIDE / "slurm-long-capture-then-stuck", gpus_per_node=2))
    assert v.verdict.value != "healthy" and set(v.suspect_nodes) <= {"cn0203"}, v.explain()
    assert v.verdict.value != "hang", v.explain()


def test_a_slow_ranks_rhythm_keeps_its_pauses():
    """Releases every fourth pair (a rank four capture intervals slow every step, quiet runs of 3), the slow
    rank at its usual place: a quiet tail of 8 pairs is within the rhythm; of 16, past it (stuck in the job's
    own work). The same tail with the rank somewhere it never worked while the job moved is no proof."""
    from rankscope.analytics.stacks.facts import Progress

    def prog(released, tail_place="forward"):
        n = len(released)
        quiet = max(i + 1 for i, r in enumerate(released) if r)  # the quiet tail starts here
        where = tuple(frozenset({(5, "forward" if i < quiet else tail_place)}) for i in range(n))
        return Progress(n + 1, (7,) * n, tuple(released), still_where=where)

    rhythm = [3, 0, 0, 0] * 4
    assert not prog(rhythm + [0] * 5).stalled_past_rhythm and not prog(rhythm + [0] * 5).frozen
    assert prog(rhythm + [0] * 13).stalled_past_rhythm and prog(rhythm + [0] * 13).frozen
    assert not prog(rhythm + [0] * 13, "save_checkpoint").stalled_past_rhythm


def test_local_rank_files_in_numbered_round_folders():
    """``<pod>/py-spy-<k>/local<L>.txt``: ``local0`` is local rank 0, and sibling folders holding the same local
    ranks and pids are rounds (the input was refused: 6 trainers without a rank on a 2-GPU machine)."""
    inputs = load_inputs(OUTSIDE / "k8s-local-rounds", gpus_per_node=2)
    v = diagnose(inputs)
    assert len({p.snapshot for p in inputs.procs}) == 3, inputs.notes
    assert v.verdict.value == "hang" and v.culprit_nodes == ("llm-train-worker-0",) and v.culprit_ranks == (3,), (
        v.explain()
    )


def test_pods_a_prefixed_kubectl_log_names_confirm_the_file_names():
    """``<pod>-rank<k>.txt`` beside one ``kubectl logs --prefix`` file: the pods its lines name confirm the
    file names' machines (they were ``node-1``)."""
    v = diagnose(load_inputs(OUTSIDE / "k8s-prefix-log-rounds", gpus_per_node=2))
    assert v.verdict.value == "hang" and v.culprit_nodes == ("llm-train-worker-0",) and v.culprit_ranks == (3,), (
        v.explain()
    )


def test_file_times_on_another_clock_than_the_logs_prove_nothing(tmp_path):
    """The consoles' own modification times an hour off the last lines they hold (naive local times read as
    UTC, or another machine's clock): file times and logged times are not comparable, so no step counts as
    "after" the capture, though the logged steps fall within minutes after the dumps' times."""
    capture = calendar.timegm((2026, 12, 2, 8, 46, 9, 0, 0, 0))
    logs_end = calendar.timegm((2026, 12, 2, 7, 46, 42, 0, 0, 0))  # an hour before the last line it holds
    v = diagnose(load_inputs(_k8s_checkpoint(tmp_path, capture, logs_end), gpus_per_node=2))
    assert "after the last snapshot" not in v.explain(), v.explain()


def test_py_spy_native_frames_do_not_hide_the_ranks_waiting_in_ddp_backward():
    """``py-spy dump --native`` of each host's 4 workers in one file per host: the 7 waiting ranks sit in
    ``pthread_cond_wait`` under ``c10d::Reducer::finalize_backward`` under Python's ``backward``. Read as native
    leaves, every rank looked busy in its own code ("compute in 0x? (libc.so.6)") and the hang was `healthy`."""
    v = diagnose(load_inputs(OUTSIDE / "native-per-host-files"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (3,) and v.culprit_nodes == ("hgx-h100-112",), v.explain()
    assert v.suspect_nodes == ("hgx-h100-112",)


def test_numbered_capture_folders_under_pod_folders_are_rounds_not_machines():
    """Kubeflow pods ``<pod>/py-spy-1/stack-<pid>.txt`` and ``py-spy-2/``, pids repeating across pods (their
    own pid namespaces): the round folders were taken for two machines holding 12 ranks, and the hang was
    inconclusive with rank 0 on "py-spy-1" named. The healthy run laid out the same names nobody."""
    v = diagnose(load_inputs(OUTSIDE / "k8s-pod-round-folders"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (4,) and v.culprit_nodes == ("mixtral-pt-worker-1",)
    assert v.n_snapshots == 2 and v.suspect_nodes == ("mixtral-pt-worker-1",), v.explain()
    healthy = diagnose(load_inputs(OUTSIDE / "k8s-pod-round-folders-healthy"))
    assert healthy.verdict.value == "healthy" and not healthy.suspect_nodes, healthy.explain()
    assert healthy.n_snapshots == 2 and healthy.world_size == 6


def test_json_round_files_of_one_host_are_the_same_processes_without_gpus_per_node():
    """``<host>/pyspy-all-0.json`` and ``-1.json`` (``py-spy dump --json`` of a host's 4 workers, twice): without
    ``--gpus-per-node`` the two files were read as two pods' 8 ranks, naming ranks 10-11. py-spy JSON's main
    thread ids (pthread addresses, one per process) show they are the same processes."""
    v = diagnose(load_inputs(OUTSIDE / "json-host-round-files"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (5,) and v.culprit_nodes == ("dgx-b200-0519",), v.explain()
    assert v.n_snapshots == 2 and v.world_size == 8


def test_a_weights_and_biases_run_folder_beside_the_evidence_is_skipped():
    """Flight Recorder JSON dumps, a ``kubectl logs --prefix`` console and a ``wandb/`` run folder whose
    ``files/output.log`` copies rank 0's console without a prefix: the ``files`` folder was taken for a machine,
    which shifted the host-ordered ranks (world 8, rank 3 "on llama-ft-master-0")."""
    inputs = load_inputs(OUTSIDE / "fr-json-beside-wandb")
    v = diagnose(inputs)
    assert v.world_size == 6 and not v.suspect_nodes, v.explain()
    assert "look at rank(s) 3 (llama-ft-worker-0)" in v.explain()
    assert any("Weights & Biases" in n and "output.log" in n for n in inputs.notes)


def test_py_spy_dumps_inside_an_srun_label_console_are_read_per_task():
    """``srun --label`` ran torchrun on 2 nodes and then py-spy on each; every line of ``slurm-<jobid>.out`` is
    behind its task's ``N: `` label, the two nodes' dumps interleaved with the job's output. The stacks were
    dropped without a word (a log only: inconclusive). Each task's stream is its machine (``srun --label
    hostname`` printed it)."""
    inputs = load_inputs(OUTSIDE / "slurm-label-console-hang")
    v = diagnose(inputs)
    assert v.verdict.value == "hang" and v.culprit_ranks == (6,) and v.culprit_nodes == ("cn0418",), v.explain()
    assert v.suspect_nodes == ("cn0418",) and not inputs.inferred_nodes


def test_an_unnamed_task_is_one_machine_of_its_own_stream_size(tmp_path):
    """Without the ``hostname`` lines no source names the tasks' machines: each task's stream is still one
    machine of 4 ranks (``node-1`` for ranks 4-7, said to be inferred), never one ``node-0`` of 8."""
    text = (OUTSIDE / "slurm-label-console-hang" / "slurm-4412871.out").read_text()
    kept = [ln for ln in text.splitlines() if ln not in ("0: cn0417", "1: cn0418")]
    (tmp_path / "slurm-4412871.out").write_text("\n".join(kept) + "\n")
    inputs = load_inputs(tmp_path)
    v = diagnose(inputs)
    assert v.verdict.value == "hang" and v.culprit_ranks == (6,) and v.culprit_nodes == ("node-1",), v.explain()
    assert inputs.inferred_nodes == ("node-0", "node-1")


def test_a_healthy_job_sampled_three_times_through_srun_label_names_nobody():
    inputs = load_inputs(OUTSIDE / "slurm-label-console-healthy-rounds")
    v = diagnose(inputs)
    assert v.verdict.value == "healthy" and not v.suspect_nodes and v.n_snapshots == 3, v.explain()


def test_stamped_files_of_one_host_holding_the_same_pids_are_rounds():
    """``<host>/pyspy-20261202-145141.txt`` and two more 5 s apart, each the py-spy text of the host's 2
    trainers: without ``--gpus-per-node`` the three files were read as 6 trainers of one snapshot (12 ranks)
    and the hang as `healthy`. Names stamped to the second are capture times: the same pids, three rounds."""
    v = diagnose(load_inputs(OUTSIDE / "host-stamped-round-files"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (3,), v.explain()
    assert v.culprit_nodes == ("gpu-st-p4d-24xlarge-18",) and v.world_size == 4 and v.n_snapshots == 3


def test_a_readme_with_log_words_beside_log_dir_trees_holds_no_machine_slot():
    """``--log-dir`` trees of a segfault (rank 3, local 1, on -18) beside a ``README.txt`` that quotes
    "Connection closed by peer": read as a log of a machine "README" sorting first, it shifted the host-ordered
    ranks (rank 5 in a 4-rank job). A file showing no worker, launcher summary or --log-dir tree holds no slot."""
    v = diagnose(load_inputs(OUTSIDE / "logdir-trees-beside-readme"))
    assert v.verdict.value == "crash" and v.culprit_ranks == (3,), v.explain()
    assert v.culprit_nodes == ("gpu-st-p4d-24xlarge-18",) and v.world_size == 4


def test_capture_folders_above_the_machine_folders_are_captures_of_both_sources():
    """A fifth tester's deadlock (rank 1 skipped a world all_reduce and waits in its pair group's), captured
    twice 9 s apart as ``<stamp>/<host>/{nccl_trace_rank_R, py-spy_rankR.json}``: the stacks of both captures
    were one snapshot "dumped twice", and the Flight Recorder read each of the four host folders as a capture
    ("2 of 4 ranks left a dump"). Stamped folders above the machines' are captures: two snapshots of 4 ranks,
    the machines named by their folders, nobody evicted for a code fault."""
    inputs = load_inputs(OUTSIDE / "stamp-first-capture-folders")
    caps = sorted({d.capture for d in inputs.fr_dumps})
    ranks = [sorted(d.rank for d in inputs.fr_dumps if d.capture == c) for c in caps]
    assert ranks == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert inputs.topology is not None and inputs.topology.node_of(1) == "gpu-st-p4d-24xlarge-17"
    assert inputs.topology.node_of(2) == "gpu-st-p4d-24xlarge-18"
    v = diagnose(inputs)
    assert v.n_snapshots == 2 and v.world_size == 4 and not v.culprit_nodes, v.explain()


def test_capture_word_folders_above_the_machine_folders_are_captures_too(tmp_path):
    """The same captures in ``capture-1/`` and ``capture-2/`` (an operator's numbering, no stamp)."""
    root = tmp_path / "incident"
    shutil.copytree(OUTSIDE / "stamp-first-capture-folders", root)
    for k, stamp in enumerate(("2026-12-02T14-50-09", "2026-12-02T14-50-18"), start=1):
        (root / stamp).rename(root / f"capture-{k}")
    v = diagnose(load_inputs(root))
    assert v.n_snapshots == 2 and v.world_size == 4 and not v.culprit_nodes, v.explain()
    assert any("4 of 4 ranks left a Flight Recorder dump" in r for r in v.reasons), v.explain()


def test_a_step_line_tailed_after_a_segfault_is_no_sign_the_rank_lived_on():
    """``--tee`` tails a worker's stdout and stderr apart: a step line printed before the segfault followed
    faulthandler's "Fatal Python error" block in the console, and a note said rank 3 "lived on (it logged
    training steps after it)". A fatal error ends its process."""
    inputs = load_inputs(OUTSIDE / "segfault-tee-step-after")
    assert not any("lived on" in n for n in inputs.notes), inputs.notes
    v = diagnose(inputs)
    assert v.verdict.value == "crash" and v.culprit_ranks == (3,), v.explain()
    assert v.culprit_nodes == ("gpu-st-p4d-24xlarge-18",)


def test_an_older_incident_beside_today_s_capture_is_left_out_by_local_rank_too():
    """Yesterday's hang (rank 2 on ``a100-r3-n2``) and today's healthy relaunch, laid out alike under dated
    folders with local-rank file names: both were read as five rounds of one job and ``a100-r3-n2`` evicted as
    fail-slow. The same host and local rank with another pid, in folders dated a day apart, is another run."""
    inputs = load_inputs(OUTSIDE / "older-incident-local-ranks" / "job-77120", gpus_per_node=2)
    assert any("under incident-20261201-1637 left out" in n for n in inputs.notes), inputs.notes
    v = diagnose(inputs)
    assert v.n_snapshots == 2 and not v.suspect_nodes and v.verdict.value == "healthy", v.explain()


def test_steps_the_logs_time_show_a_slowed_job_so_rank_0_is_no_duty(tmp_path):
    """Rank 0's machine throttled: rank 0 stood out in 4 of 5 rounds in model code, and was taken for the main
    process's duties because "no step record shows the job slowing down", while the consoles' "elapsed time per
    iteration (ms)" rose from ~240 to ~900. Step times the logs write are step records too."""
    root = tmp_path / "job-5521"
    shutil.copytree(OUTSIDE / "rank0-throttled-logged-steps" / "job-5521", root)
    for p in root.rglob("*"):  # the capture's own file times (a clone has its checkout time): rounds 3.2 s apart
        if p.is_file():
            k = int(p.parent.name.rsplit("-", 1)[1]) - 1 if p.parent.name.startswith("py-spy-") else 13.5
            t = 1796230092.2 + 3.2 * k
            os.utime(p, (t, t))
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert v.verdict.value == "fail-slow" and v.culprit_ranks == (0,), v.explain()
    assert v.culprit_nodes == ("sxm5-gpu-n101",) and any("logged step time per sample rose" in r for r in v.reasons)


def test_peers_back_in_the_wait_a_slow_rank_left_are_in_a_later_step():
    """A throttled rank left DDP's backward its 7 peers sat in (the all-reduce completed for all) and ran on at
    other stacks; the peers, back in backward in the next rounds, were counted as sitting still through three
    snapshots: a hang at 0.91. Without step times the rounds cannot prove the job moved either."""
    v = diagnose(load_inputs(OUTSIDE / "slow-pod-rounds-json" / "captures", gpus_per_node=2))
    assert v.verdict.value != "hang", v.explain()
    assert set(v.suspect_nodes) <= {"llm-pretrain-worker-3"}


def test_rounds_stamped_by_each_host_s_own_clock_line_up_by_their_order(tmp_path):
    """Each host's sidecar stamps its rounds on its own clock: one host's five ``pyspy-<stamp>`` folders a second
    after the others' were numbered among all hosts' names together (ten snapshots of half the job each).
    Rounds are numbered within each machine's folder."""
    root = tmp_path / "skew"
    shutil.copytree(OUTSIDE / "failslow-stamped-rounds", root)
    for d in sorted((root / "hpc-gpu0116").glob("pyspy-*")):
        day, hms = d.name.rsplit("-", 1)
        d.rename(d.with_name(f"{day}-{int(hms) + 1:06d}"))
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert v.n_snapshots == 5 and v.world_size == 8 and "hpc-gpu0115" not in v.suspect_nodes, v.explain()


@pytest.mark.parametrize("case", ["host-round-named-files", "host-pid-epoch-files"])
def test_one_file_per_process_and_round_in_a_host_folder_is_rounds(case):
    """``<host>/pyspy_round{N}_local{L}.txt`` and ``<host>/pyspy_<pid>_<epoch>.txt``: a healthy job's three
    rounds were one snapshot dumped three times (round 0 kept: a hang on the premise, gpu-02 evicted) or, with
    pid names, three times as many ranks (a 12-rank job, rank 6 on gpu-02 evicted)."""
    v = diagnose(load_inputs(OUTSIDE / case))
    assert v.n_snapshots == 3 and len({p.rank for p in load_inputs(OUTSIDE / case).procs}) == 4, v.explain()
    assert not v.suspect_nodes and v.verdict.value in ("healthy", "inconclusive"), v.explain()


def test_whole_host_dumps_named_for_the_capture_are_rounds_without_gpus_per_node():
    """``<host>/pyspy-all-<k>.txt`` (the agent and its 4 trainers, the same pids each time): without
    ``--gpus-per-node`` the three rounds were read as one snapshot of 24 trainers, the culprit as ranks 18-20."""
    v = diagnose(load_inputs(OUTSIDE / "host-pyspy-all-rounds"))
    assert v.verdict.value == "hang" and v.n_snapshots == 3, v.explain()
    assert v.culprit_ranks == (6,) and v.suspect_nodes == ("dgx-b200-08",), v.explain()


def test_a_rank_alone_in_a_collective_its_peers_are_not_in_evicts_nobody():
    """A stray ``dist.barrier()`` on rank 1 while the others run DDP's all_reduce (both on the world group), two
    frozen py-spy rounds and the gloo timeouts in the logs: collectives that can never match, a code fault.
    The barrier was "a collective the healthy ranks are not in" and rank 1's machine was evicted (0.68)."""
    v = diagnose(load_inputs(OUTSIDE / "stray-barrier-stacks-logs"))
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes and v.suspect_ranks == (1,), v.explain()
    assert any("can never match" in r for r in v.reasons), v.explain()


def test_every_rank_at_the_same_line_through_three_rounds_is_never_running():
    """Every rank sleep-polls shared storage for a file that never comes (py-spy: idle, the same line in all three
    rounds), no collective pending: "6 of the 6 ranks were running their own code ... not stuck", healthy."""
    v = diagnose(load_inputs(OUTSIDE / "shared-fs-poll-3rounds"))
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes and v.n_snapshots == 3, v.explain()
    assert any("not seen to move" in r for r in v.reasons), v.explain()


def test_an_older_incident_in_round_folders_with_local_rank_names_is_left_out():
    """``incident-20261201/<host>/round-N/local_rankK.txt`` beside the current ``<host>/pyspy-<stamp>/local_rankK.txt``:
    the older incident's ``round-0/`` folder made its local ranks claim another place than the current dumps, so
    the clash surfaced only as a refusal ("rank 0 (snapshot 0) is claimed by two processes")."""
    inputs = load_inputs(OUTSIDE / "older-incident-round-folders-local-ranks")
    assert any("under incident-20261201 left out" in n for n in inputs.notes), inputs.notes
    v = diagnose(inputs)
    assert v.verdict.value == "healthy" and not v.suspect_nodes and v.n_snapshots == 3, v.explain()


def test_py_spy_json_appended_per_host_round_after_round_is_rounds():
    """``py-spy dump --json`` of both trainers appended to one file per host, six times: the arrays were merged
    into one thread list per pid, one snapshot (confidence 0.6)."""
    inputs = load_inputs(OUTSIDE / "json-appended-per-host")
    assert len({p.snapshot for p in inputs.procs}) == 6 and len({p.rank for p in inputs.procs}) == 4
    v = diagnose(inputs)  # fail-slow with the capture's file times, a hang on the rounds alone: rank 1 either way
    assert v.verdict.value in ("fail-slow", "hang") and v.culprit_ranks == (1,), v.explain()
    assert v.suspect_nodes == ("gpu-h100-017",), v.explain()


def test_py_spy_text_appended_per_host_round_after_round_is_rounds(tmp_path):
    """The five text rounds of ``failslow-5rounds`` appended per host (``<host>/<host>-pyspy.txt``)."""
    for k in range(5):
        for host in ("trn-a01", "trn-a02"):
            out = tmp_path / host / f"{host}-pyspy.txt"
            out.parent.mkdir(exist_ok=True)
            with out.open("a") as fh:
                for f in sorted((OUTSIDE / "failslow-5rounds" / f"round-{k}" / host).iterdir()):
                    fh.write(f.read_text())
    v = diagnose(load_inputs(tmp_path, gpus_per_node=2))
    assert v.verdict.value == "fail-slow" and v.n_snapshots == 5 and v.culprit_ranks == (3,), v.explain()


@pytest.mark.parametrize("stamp", ["20261203-03021{k}", "2026-12-03T03-02-1{k}"])
def test_hostname_date_folders_are_the_machine_s_rounds(tmp_path, stamp):
    """A sidecar's ``$(hostname)-$(date ...)`` folder per machine and round: each folder was a machine (the verdict
    named ``trn-a02-20261203-030210``, a machine no scheduler knows) and the five rounds one snapshot."""
    for k in range(5):
        for host in ("trn-a01", "trn-a02"):
            src = OUTSIDE / "failslow-5rounds" / f"round-{k}" / host
            shutil.copytree(src, tmp_path / f"{host}-{stamp.format(k=k)}")
    v = diagnose(load_inputs(tmp_path))
    assert v.verdict.value == "fail-slow" and v.n_snapshots == 5, v.explain()
    assert v.culprit_ranks == (3,) and v.suspect_nodes == ("trn-a02",), v.explain()


def test_steps_a_training_loop_logs_itself_after_the_rounds_mean_the_job_was_moving():
    """A healthy DDP job doing gradient accumulation (0.8 s steps), rank 1 caught in its forward in three rounds
    1.2 s apart; the console logs every rank's ``step N loss ... step_time ...`` (Python logging) for 6 s after
    the last round. Only Megatron's ``iteration N/M`` lines counted as steps: a hang, rank 1's machine evicted."""
    v = diagnose(load_inputs(OUTSIDE / "grad-accum-stamped-rounds-console"))
    assert v.verdict.value in ("healthy", "inconclusive") and not v.suspect_nodes, v.explain()


def test_consoles_of_a_job_stepping_until_the_scheduler_s_sigterm_are_no_fault():
    v = diagnose(load_inputs(OUTSIDE / "sigterm-consoles-plain-steps"))
    assert v.verdict.value in ("healthy", "inconclusive") and not v.suspect_nodes, v.explain()
    assert v.verdict.value == "healthy", v.explain()  # its steps are read: "no evidence" (0.0) before


def test_torchrun_s_own_error_file_folders_are_no_machines():
    """Each host's console beside the error files its failure summary points to, kept as
    ``<host>/torchelastic_<random>/<run_id>_<random>/attempt_0/<local>/error.json``: ``torchelastic_vnzjghi8`` was
    taken for a machine, rank 3's error file for a rank 13 of an 8-rank job, and both evicted."""
    v = diagnose(load_inputs(OUTSIDE / "consoles-and-torchelastic-error-files"))
    assert v.verdict.value == "crash" and v.culprit_ranks == (3,), v.explain()
    assert v.suspect_nodes == ("sjc-a100-1105",) and v.world_size == 8, v.explain()


def test_a_stuck_stage_of_a_pipeline_without_replicas_is_named():
    """pp=4, dp=1: stage 2 stuck in its own code before its send, stages 0-1 blocked sending, stage 3 receiving,
    three frozen rounds. Each stage's stack is its own, so every cluster counted as common and nobody was named
    ("no rank stands apart"); without ``--layout`` (read as data parallel) it was named."""
    v = diagnose(load_inputs(OUTSIDE / "pp4-stage-stuck-3rounds", layout="pp=4"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (2,) and v.suspect_nodes == ("g2-pp-018",), v.explain()
    healthy = diagnose(load_inputs(OUTSIDE / "pp4-healthy-3rounds", layout="pp=4"))
    assert healthy.verdict.value == "healthy" and not healthy.suspect_nodes, healthy.explain()


def test_the_rank_its_heartbeat_monitor_aborted_is_the_laggard_among_its_machine_s_silent_ranks():
    """NCCL consoles of a 16-rank job on 4 hosts (written from PyTorch's own wording): rank 9's heartbeat monitor
    aborted it at 480 s, its agent tore down ranks 8, 10, 11, the rest timed out at 600 s in one all_reduce. Four
    silent ranks left no laggard, and the abort was called a crash."""
    v = diagnose(load_inputs(OUTSIDE / "nccl-heartbeat-abort-consoles"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (9,) and v.suspect_nodes == ("hgx-h200-03",), v.explain()


def test_ranks_sleep_polling_at_one_line_beside_a_frozen_collective_are_no_sign_of_life():
    """Ranks 0-3 train, 4-7 are evaluators sleep-polling for a checkpoint; rank 2 hangs in its data loading and
    0, 1, 3 sit in the all_reduce through three stamped rounds. The evaluators made the running code a majority:
    `inconclusive` ("every rank sat at one line, none waiting on its peers"); without them, a hang of rank 2."""
    v = diagnose(load_inputs(OUTSIDE / "evaluators-sleep-poll-beside-hang-3rounds"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (2,), v.explain()
    assert v.culprit_nodes == ("llm-sft-worker-0",) and v.suspect_nodes == ("llm-sft-worker-0",), v.explain()


def test_flight_recorder_captures_taken_with_the_stack_rounds_overrule_the_stacks_reading_of_motion(tmp_path):
    """Two capture rounds of a healthy job (rank 3 in a 4 s step in the first, its 0.1 s one in the second): the
    peers sat in the all_reduce at the same line both times, so the stacks read "frozen" and evicted rank 3's
    machine, while the Flight Recorder captured with them shows every rank 9-10 ops further."""
    root = OUTSIDE / "slow-step-fr-pyspy-2captures"
    v = diagnose(load_inputs(root))
    assert v.verdict.value == "healthy" and not v.suspect_nodes, v.explain()
    assert any("Flight Recorder dumps taken with snapshots 0 and 1" in r for r in v.reasons), v.reasons
    # the same Flight Recorder captures kept apart from the stack rounds (another folder tree, no times) pair
    # with no snapshot: they say nothing about when the stacks were taken, and the stacks decide alone
    apart = tmp_path / "apart"
    for k in (0, 1):
        for f in (root / f"capture-{k}").rglob("*"):
            if f.is_file():
                side = "fr" if f.suffix == ".pkl" else "stacks"
                dest = apart / side / f"capture-{k}" / f.parent.name / f.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, dest)
    v = diagnose(load_inputs(apart))
    assert not any("Flight Recorder dumps taken with snapshots" in r for r in v.reasons), v.reasons


def test_a_wrapper_s_rank_and_host_header_before_each_dump_names_them():
    """``dump-<pid>.log`` flat in one folder, each opening with the wrapper's ``=== RANK=5 LOCAL_RANK=1
    HOST=trn-b02 ===`` before the py-spy text: refused with "no stack dumps or other evidence found"."""
    v = diagnose(load_inputs(OUTSIDE / "wrapper-header-pid-named-flat"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (5,) and v.culprit_nodes == ("trn-b02",), v.explain()


def test_one_host_s_pid_named_dumps_are_numbered_by_pid():
    """``for p in $(pgrep -f train.py); do py-spy dump --pid $p > $p.txt; done`` on a single node: refused with
    "no stack dumps or other evidence found"; the four trainers are its local ranks in pid order."""
    v = diagnose(load_inputs(OUTSIDE / "one-host-pid-named-flat"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (2,), v.explain()
    notes = " ".join(v.details.get("notes", []))
    assert "pid order" in notes and v.details.get("inferred_node_names"), notes


def test_dumps_no_rule_numbers_are_refused_with_the_reason_not_as_missing():
    """``stack_<ip>_<N>.txt`` (a rank or a pid? nothing says): one refusal that says the dumps were found and why
    none can be used (it said "no stack dumps or other evidence found")."""
    with pytest.raises(InputError, match=r"8 process dump\(s\) with no rank.*none can be used"):
        load_inputs(OUTSIDE / "flat-ip-rank-names-no-rank")


def test_the_only_host_folder_collected_is_that_machine():
    """Only ``gpu-st-a12/rank4..7.txt`` were collected: the lone folder was taken for the job's dump folder, the
    machine invented (``node-1``) with a note that the folder "holds every rank's dump"."""
    v = diagnose(load_inputs(OUTSIDE / "only-culprit-host-collected"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (5,) and v.culprit_nodes == ("gpu-st-a12",), v.explain()
    # only the machine of the ranks nobody collected (0-3) is unnamed
    assert v.details.get("inferred_node_names") == ["node-0"], v.details.get("inferred_node_names")


def test_a_pdsh_console_is_read_by_its_content_whatever_its_name():
    """pdsh output (every line ``gpu01: ...``) saved as ``pyspy-all.txt`` was skipped ("no format recognised"); the
    same bytes named ``pdsh.log`` were read."""
    v = diagnose(load_inputs(OUTSIDE / "pdsh-prefixed-txt"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (5,) and v.culprit_nodes == ("gpu02",), v.explain()


def test_torchtitan_s_tagged_step_lines_are_steps():
    """``[titan] 2026-12-03 06:12:12,582 - root - INFO - step:  1  loss: ...``: the tag hid the time, the steps
    went unread, and "no watchdog or transport timeout" turned three healthy rounds into `inconclusive`."""
    v = diagnose(load_inputs(OUTSIDE / "torchtitan-consoles-3rounds"))
    assert v.verdict.value == "healthy" and not v.suspect_nodes, v.explain()


def test_flight_recorder_dumps_an_earlier_job_left_in_the_dump_folder_are_left_out():
    """A 4-rank job's `nccl_trace_rank_0..3` beside `nccl_trace_rank_4..7` an earlier 8-rank job left in the same
    node-local folder (their last record 11 min before this job's first): read as one 8-rank job, every
    collective a size "mismatch" (a code fault, nothing evicted) and the stuck rank 1 overruled."""
    v = diagnose(load_inputs(OUTSIDE / "fr-stale-dumps-of-an-older-job"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (1,) and v.world_size == 4, v.explain()
    assert any("left out as another run's" in n for n in v.details.get("notes", [])), v.details.get("notes")


def test_gloo_s_counters_of_unrecorded_send_recv_put_no_pipeline_stage_behind():
    """A healthy 4-stage gloo pipeline, two captures 6 s apart: gloo counts its send/recv in the group's status
    counters (150-255) but records none (entries at ~50), so the end stages, which send or receive once per
    step, looked "behind" (`inconclusive`, "Nobody waits, yet rank(s) 0,3 are behind (#151)")."""
    v = diagnose(load_inputs(OUTSIDE / "gloo-pipeline-fr-two-captures", layout="pp=4", gpus_per_node=2))
    assert v.verdict.value == "healthy" and not v.suspect_nodes, v.explain()
    assert not any("behind" in r for r in v.reasons), v.reasons


def test_gloo_dumps_blind_to_a_send_recv_wait_never_vouch_for_a_job():
    """A pipeline on `batch_isend_irecv`, rank 1 stuck after its irecv: py-spy shows the others at the Python line
    that calls `req.wait()`, gloo records no send/recv, and its collectives are all done. Nobody can be named;
    the dumps are no proof of health either (unrecorded ops may wait)."""
    v = diagnose(load_inputs(OUTSIDE / "gloo-batch-isend-irecv-hang", layout="pp=4"))
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes, v.explain()
    assert any("do not record" in r for r in v.reasons), v.reasons


def test_logs_that_say_nothing_either_way_do_not_outweigh_stacks_and_flight_recorder():
    """A healthy tp=2,dp=4 job: two capture rounds of FR + py-spy that both show it moving, and its own
    `--log-dir` logs with neither a timeout nor a step line. "No watchdog or transport timeout" (inconclusive)
    led the verdict over two sources that saw the job run."""
    v = diagnose(load_inputs(OUTSIDE / "healthy-tp2dp4-fr-pyspy-logdir-2captures", layout="tp=2,dp=4"))
    assert v.verdict.value == "healthy" and not v.suspect_nodes, v.explain()
    assert any(r.startswith("[logs] no watchdog") for r in v.reasons), v.reasons


def test_rounds_that_name_no_machine_call_no_culprit_or_fault_domain():
    """A healthy all_reduce-heavy job, three rounds, rank 0 at its own code in the last: `inconclusive`, nobody
    isolated, yet the words said "The culprit is on trn-a01: that machine is the fault domain"."""
    v = diagnose(load_inputs(OUTSIDE / "allreduce-heavy-3rounds-uneven"))
    assert v.verdict.value in ("inconclusive", "healthy") and not v.suspect_nodes, v.explain()
    text = v.explain()
    assert "fault domain" not in text and "Culprit rank" not in text and "look at rank(s) 0 on trn-a01" in text, text


def test_waits_that_end_at_ranks_whose_capture_failed_evict_none_of_the_waiters():
    """A Megatron tp=8,pp=4,dp=4 hang (128 ranks, 16 nodes) whose stuck rank's node refused py-spy (Permission
    Denied on ranks 40-47): its three neighbouring stages wait in p2p towards it, the rest in the DP
    reduce_scatter. The waiters' three nodes were evicted as the cover of the outliers (a templated case of an
    eighth tester, from real py-spy text)."""
    v = diagnose(load_inputs(OUTSIDE / "megatron-128-culprit-node-ptrace-denied", layout="tp=8,pp=4,dp=4"))
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes and not v.culprit_nodes, v.explain()
    assert "rank(s) 40-47 on gpu-a100-022 gave no stack" in v.explain()


def test_dshbak_s_host_sections_name_each_process_s_machine():
    """`pdsh -w gpu0[1-2] 'py-spy dump ...' | dshbak` (a dashed header over each host's output) in one file: all 8
    processes were put on one invented machine and numbered by pid across both hosts (rank 2 on `node-0`,
    confidently wrong); each section is its host's, local ranks in pid order there."""
    v = diagnose(load_inputs(OUTSIDE / "pdsh-dshbak-grouped"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (5,) and v.culprit_nodes == ("gpu02",), v.explain()


def test_a_rank_caught_in_c10d_s_logging_wrapper_is_inside_the_collective():
    """One round of a healthy tp=2,dp=4 job: seven ranks in `all_reduce`, rank 6 with `_exception_logger.<locals>
    .wrapper (torch/distributed/c10d_logger.py)` on top, the line every `dist.all_reduce` passes through. It was
    "not waiting in any collective": a hang of its machine at 0.81."""
    v = diagnose(load_inputs(OUTSIDE / "tp2dp4-rank-in-c10d-logger-wrapper", layout="tp=2,dp=4", gpus_per_node=4))
    assert v.verdict.value in ("healthy", "inconclusive") and not v.suspect_nodes, v.explain()


def test_rank_0_s_own_evaluation_under_a_model_forward_is_its_duty():
    """One round of a healthy job: rank 0 in `Sequential.forward` under `evaluate()`, a function no other rank
    ran, the others in backward. Model compute was never a duty, whatever called it: a hang of rank 0's machine
    at 0.78."""
    v = diagnose(load_inputs(OUTSIDE / "rank0-eval-model-forward-1round"))
    assert v.verdict.value in ("healthy", "inconclusive") and not v.suspect_nodes, v.explain()
    assert "evaluate" in v.explain()


def test_rank_0_in_a_forward_called_from_the_training_loop_is_no_duty(tmp_path):
    """The same round with rank 0's forward called from `main` itself (a line the others ran past): no code of
    its own, so it is judged like any rank, on the one-snapshot premise."""
    src = OUTSIDE / "rank0-eval-model-forward-1round" / "trn-03" / "pyspy-20261203-074207"
    dst = tmp_path / "trn-03" / src.name
    shutil.copytree(src, dst)
    text = (dst / "rank0.txt").read_text()
    text = text.replace("    evaluate (job.py:40)\n", "").replace("main (job.py:108)", "main (job.py:99)")
    (dst / "rank0.txt").write_text(text)
    v = diagnose(load_inputs(tmp_path))
    assert v.verdict.value == "hang" and v.culprit_ranks == (0,), v.explain()


BUSY_LOADERS = OUTSIDE / "dataloader-bound-busy-workers-1round" / "trn-19" / "pyspy-20261203-074748"


def test_a_rank_waiting_on_its_busy_dataloader_is_no_hang():
    """Rank 1 waits for its batch, the others for rank 1 in their all_reduce, and every rank's DataLoader worker
    (rank 1's too) is in the dataset's `__getitem__`: the input pipeline at work, slower than the step. It was a
    hang of the machine on the one-snapshot premise (0.78)."""
    v = diagnose(load_inputs(BUSY_LOADERS.parents[1]))
    assert v.verdict.value in ("healthy", "inconclusive") and not v.suspect_nodes, v.explain()
    assert "data-bound" in v.explain()


def _relaid(tmp_path: Path, drop: tuple[str, ...] = (), replace: dict[str, str] | None = None) -> Path:
    dst = tmp_path / "trn-19" / BUSY_LOADERS.name
    shutil.copytree(BUSY_LOADERS, dst)
    for name in drop:
        (dst / name).unlink()
    for name, text in (replace or {}).items():
        (dst / name).write_text(text)
    return tmp_path


def test_without_its_workers_dumps_the_wait_on_the_dataloader_stays_on_the_premise(tmp_path):
    """The same round without the workers' dumps: nothing says the input pipeline is at work, so the rank the
    others wait for is named, on the premise that the job was stuck."""
    workers = tuple(p.name for p in BUSY_LOADERS.glob("*_worker0.txt"))
    v = diagnose(load_inputs(_relaid(tmp_path, drop=workers)))
    assert v.verdict.value == "hang" and v.culprit_ranks == (1,), v.explain()
    assert v.details.get("stuck_on_premise"), v.explain()


def test_a_worker_stuck_apart_from_the_others_still_names_its_rank(tmp_path):
    """Rank 1's worker blocked in a file read while the other workers compute: its worker is stuck apart, and
    that is evidence against rank 1 whatever the other workers do."""
    text = (BUSY_LOADERS / "rank1_worker0.txt").read_text()
    head, _, _ = text.partition("    DS.__getitem__ (job.py:27)\n")
    frames = "    BufferedReader.read (shards.py:88)\n    DS.__getitem__ (job.py:25)\n"
    stuck = head.replace("(active)", "(idle)") + frames
    rest = text.split("    DS.__getitem__ (job.py:27)\n", 1)[1]
    v = diagnose(load_inputs(_relaid(tmp_path, replace={"rank1_worker0.txt": stuck + rest})))
    assert v.verdict.value == "hang" and v.culprit_ranks == (1,), v.explain()
    assert "stuck" in v.explain()


def _unpacked(name: str, tmp_path: Path) -> Path:
    import tarfile

    with tarfile.open(OUTSIDE / name) as tar:
        tar.extractall(tmp_path, filter="data")
    (case,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return case


@pytest.mark.parametrize(
    ("name", "layout", "order", "ranks", "nodes"),
    [
        (
            "megatron-cp-ring-step-stuck-tp4cp4ep2dp4.tar.xz",
            "tp=4,cp=4,ep=2,dp=4",
            "tp-cp-ep-dp-pp",
            (82, 86, 90, 94),
            {"ip-10-142-166-31", "ip-10-9-86-116"},
        ),
        (
            "megatron-cp-ring-inside-node-tp2cp4ep4pp2dp2.tar.xz",
            "tp=2,cp=4,ep=4,dp=2,pp=2",
            "tp-cp-ep-pp-dp",
            (80, 82, 84, 86),
            {"ip-10-251-127-21"},
        ),
    ],
)
def test_a_whole_context_parallel_group_stuck_in_its_ring_step_is_the_fault_domain(
    tmp_path, name, layout, order, ranks, nodes
):
    """One snapshot of a Megatron MoE job with context parallelism (an outside tester's, py-spy text and JSON):
    the whole CP group waits in its ring step (``batch_isend_irecv`` in TransformerEngine's
    ``AttnFuncWithCPAndKVP2P``), which no other rank is in; their TP peers wait in a reduce_scatter, the expert
    groups in all_to_all, the other stage in recv_forward, the other replicas in the grad sync. Every outlier
    waits, so the whole model-parallel group was isolated: 8 of 16 machines, 6 of them healthy (dp=2). The
    group whose collective does not complete is the fault domain; the rest wait behind it."""
    case = _unpacked(name, tmp_path)
    v = diagnose(load_inputs(case, layout=layout, order=order, gpus_per_node=8))
    assert v.verdict.value == "hang" and v.culprit_ranks == ranks, v.explain()
    assert set(v.suspect_nodes) == nodes, v.explain()
    assert any("the whole CP group" in r for r in v.reasons), v.explain()
    assert v.confidence < 0.65, v.confidence  # no stronger than the model-parallel groups' weak verdict


def test_a_rank_its_tp_group_waits_for_round_after_round_is_fail_slow(tmp_path):
    """128 ranks, five rounds of a healthy pipeline, but rank 101 computes in four of them while its 7 TP peers
    wait for it in the TP all_reduce. Its stack is the one whole TP groups elsewhere run at the same time, so it
    was never a stack outlier: `healthy`. Its group waiting on it is the flag, against that flag's own rate."""
    case = _unpacked("megatron-128-straggler-5rounds.tar.xz", tmp_path)
    v = diagnose(load_inputs(case, layout="tp=8,pp=4,dp=4", gpus_per_node=8))
    assert v.verdict.value == "fail-slow" and v.culprit_ranks == (101,), v.explain()
    assert v.culprit_nodes == ("gpu-a100-029",) and v.suspect_nodes == ("gpu-a100-029",), v.explain()


def test_a_healthy_pipeline_s_groups_waiting_by_turns_name_nobody(tmp_path):
    """The same job healthy: every round some TP group waits for one of its ranks, a different one each time."""
    case = _unpacked("megatron-128-healthy-5rounds.tar.xz", tmp_path)
    v = diagnose(load_inputs(case, layout="tp=8,pp=4,dp=4", gpus_per_node=8))
    assert v.verdict.value in ("healthy", "inconclusive") and not v.suspect_nodes, v.explain()


def test_two_stages_waiting_on_each_other_are_the_ends_of_the_transfer(tmp_path):
    """Replica 5's stage 3 waits to hear back from stage 4 (`send_forward_recv_backward`) and stage 4 to hear from
    stage 3 (`recv_forward`): that transfer never completed. The stages before and after wait on them in a chain;
    the culprits were stages 4-7, the downstream side."""
    case = _unpacked("megatron-256-p2p-link-3rounds.tar.xz", tmp_path)
    v = diagnose(load_inputs(case, layout="tp=4,pp=8,dp=8", order="tp-cp-ep-pp-dp", gpus_per_node=8))
    assert v.verdict.value == "hang" and v.culprit_ranks == tuple(range(172, 180)), v.explain()
    assert v.culprit_nodes == ("nid00207", "nid00211") and v.suspect_nodes[:2] == ("nid00207", "nid00211"), v.explain()


@pytest.mark.parametrize("case", ["databound-two-ranks-on-loaders-1round", "databound-same-rank-on-loader-3rounds"])
def test_ranks_waiting_on_busy_loaders_while_the_rest_wait_in_backward_are_data_bound(case):
    """Healthy data-bound DDP jobs, every worker in `__getitem__`: two ranks on their loaders and two in DDP's
    backward (the loaders' wait the largest cluster: the backward ranks became culprits), or the same rank on
    its loader in three identical rounds (frozen-looking). Both evicted `trn-d02`."""
    v = diagnose(load_inputs(OUTSIDE / case))
    assert v.verdict.value in ("healthy", "inconclusive") and not v.suspect_nodes, v.explain()
    assert "data-bound" in v.explain()


@pytest.mark.parametrize(
    ("case", "layout", "gpn", "ranks", "nodes"),
    [
        ("pp4-mutual-recv-3rounds", "pp=4", 1, (1, 2), ("trn-p02", "trn-p03")),
        ("pp4dp2-mutual-recv-1round", "pp=4,dp=2", 2, (4, 6), ("trn-p03", "trn-p04")),
    ],
)
def test_pipeline_stages_receiving_from_each_other_are_both_ends(case, layout, gpn, ranks, nodes):
    """A real gloo pipeline deadlock: stage s in `recv_backward` from s+1 while s+1 is in `recv_forward` from s.
    With one stage per rank its wait was the largest cluster (no outlier: inconclusive, pointing at the sender
    behind it), and with replicas the waits were "unrelated parallel groups"."""
    v = diagnose(load_inputs(OUTSIDE / case, layout=layout, gpus_per_node=gpn))
    assert v.verdict.value == "hang" and v.culprit_ranks == ranks, v.explain()
    assert v.culprit_nodes == nodes and v.suspect_nodes == nodes, v.explain()


def test_bare_aborts_in_the_second_of_their_peers_timeouts_are_the_watchdog_s_teardown_not_a_first_failure():
    """Consoles filtered with ``--local-ranks-filter`` hide local rank 7 of each host: those four ranks are known
    only from their agents' summaries, SIGABRT in the same second as 27 peers' watchdog timeouts. They were the
    "first failure" and all 4 machines were evicted; the logs' laggard (rank 10, never enqueued work 1121) is
    the fault."""
    v = diagnose(load_inputs(OUTSIDE / "nccl-local-ranks-filter-hidden-aborts"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (10,) and v.suspect_nodes == ("gpu-g02",), v.explain()


def test_pod_log_files_as_the_kubelet_keeps_them_are_read_and_named_by_their_pod():
    """``/var/log/pods/<namespace>_<pod>_<uid>/<container>/0.log``: each line behind the container runtime's time and
    ``stderr F``. Nothing was read ("no evidence"); the pod, not the container folder, is the machine."""
    v = diagnose(load_inputs(OUTSIDE / "k8s-var-log-pods-cri"))
    assert v.verdict.value == "hang" and v.culprit_ranks == (14,), v.explain()
    assert v.suspect_nodes == ("gpt-pretrain-worker-1",), v.explain()


def test_pod_logs_of_an_earlier_container_are_left_out(tmp_path):
    """The kubelet writes each restart of a container to the next ``<n>.log`` and keeps the one before. The pods'
    earlier containers (``0.log``) timed out waiting for rank 14; the running ones (``1.log``) train on. Both were
    read as one stream: the old timeouts made the job ``inconclusive``. Only the running container counts."""
    root = tmp_path / "pods"
    shutil.copytree(OUTSIDE / "k8s-var-log-pods-cri", root)
    for k, old in enumerate(sorted(root.glob("var/log/pods/*/pytorch/0.log"))):
        lines = [
            f"2026-12-01T09:{30 + s // 60:02d}:{s % 60:02d}.000000000Z stderr F [rank{8 * k}]:[2026-12-01 "
            f"09:{30 + s // 60:02d}:{s % 60:02d},000] train INFO: step {s // 2} loss 2.5 step_time 2.010s"
            for s in range(20, 1200, 2)
        ]
        (old.parent / "1.log").write_text("\n".join(lines) + "\n")
    rotated = sorted(root.glob("var/log/pods/*/pytorch/0.log"))[1]  # the kubelet rotated one earlier container's log
    shutil.copy(rotated, rotated.with_name("0.log.20261201-091130"))
    v = diagnose(load_inputs(root))
    assert v.verdict.value == "healthy" and not v.suspect_nodes, v.explain()
    (note,) = [n for n in v.details["notes"] if "pod log file(s) of earlier containers" in n]
    assert note.startswith("5 pod log") and "latest restart 1" in note, note


def test_a_console_with_nothing_tied_to_a_rank_says_which_logs_were_read():
    v = diagnose(load_inputs(OUTSIDE / "deepspeed-pdsh-console-no-rank-tags"))
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes, v.explain()
    assert "1 log file(s) read (deepspeed-launch.log) held nothing tied to a rank" in v.explain(), v.explain()


def test_timeouts_of_lines_that_name_no_group_are_the_job_s_one_stall():
    """torch 2.1 names no process group in its watchdog lines: the 15 ranks' timeouts in work 1121 were dropped
    as "group unknown", and the silent rank 5 went unmentioned; one work most of the world times out in is the
    job's group. The group inferred and the logs untimed, rank 5's silence is pointed at, not evicted."""
    v = diagnose(load_inputs(OUTSIDE / "nccl-torch21-unnamed-group-silent-rank"))
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes, v.explain()
    assert "lines name none" in v.explain() and "rank(s) 5 printed no timeout" in v.explain(), v.explain()


@pytest.mark.parametrize(
    ("capture", "layout", "verdict", "ranks", "node"),
    [
        ("fsdp2-rank-asleep-before-forward-5rounds", None, "hang", (2,), "gpu-a17"),
        ("fsdp2-tp-rank-asleep-5rounds", "tp=4,dp=2", "hang", (1,), "gpu-a17"),
        ("fsdp2-tp-throttled-rank-5rounds", "tp=4,dp=2", "fail-slow", (6,), "gpu-b03"),
        ("fsdp2-healthy-3rounds", None, "healthy", (), None),
    ],
)
def test_real_fsdp2_and_tensor_parallel_captures(capture, layout, verdict, ranks, node):
    """Real FSDP2 and FSDP2 x DTensor tensor-parallel gloo jobs, five py-spy rounds: the peers wait in
    ``all_gather_single`` or in a functional collective's ``wait_tensor``. Those waits were read as compute:
    the hangs were inconclusive and the throttled rank healthy."""
    v = diagnose(load_inputs(OUTSIDE / capture, layout=layout))
    assert v.verdict.value == verdict and v.culprit_ranks == ranks, v.explain()
    assert v.suspect_nodes == ((node,) if node else ()), v.explain()


@pytest.mark.parametrize(
    ("name", "rank", "node"),
    [
        ("megatron-interleaved-compute-hang-tp4pp6dp4.tar.xz", 54, "gh200-0807"),
        ("megatron-interleaved-dataloader-hang-tp4pp6dp4.tar.xz", 8, "gpu-m235"),
        ("megatron-interleaved-missing-dump-tp4pp6dp4.tar.xz", 41, "gpu-q338"),
    ],
)
def test_stages_waiting_in_a_chain_toward_the_culprit_are_not_a_stuck_link(tmp_path, name, rank, node):
    """An outside tester's Megatron jobs with the interleaved schedule (tp=4 on 4-GPU nodes, pp=6, dp=4): one
    rank computes, waits on its stuck DataLoader, or left no dump; its TP peers wait for it, the stages before
    it in `send_backward_recv_backward` and the stages after it in `send_forward_recv_forward` (a step's start
    and end). Each pair of those stages looked like two stages waiting on each other: the 5 other stage
    nodes were isolated and the culprit's node stayed. Their transfers toward each other are matched; each
    also waits on its other neighbour, so the waits form a chain that ends at the culprit."""
    case = _unpacked(name, tmp_path)
    v = diagnose(load_inputs(case, layout="tp=4,pp=6,dp=4", gpus_per_node=4))
    assert v.verdict.value == "hang" and v.culprit_ranks == (rank,), v.explain()
    assert v.suspect_nodes == (node,), v.explain()
    assert not any("blocked on the link between them" in r for r in v.reasons), v.explain()


@pytest.mark.parametrize(
    ("name", "verdict", "nodes"),
    [
        ("fr-fsdp2-node-clock-7min-behind-healthy-dp32.tar.xz", "healthy", ()),
        ("fr-fsdp2-node-clock-7min-behind-culprit-dp32.tar.xz", "hang", ("node-1",)),
    ],
)
def test_a_node_whose_clock_is_behind_keeps_its_flight_recorder_dumps(tmp_path, name, verdict, nodes):
    """An outside tester's FSDP2 job of 32 ranks (NCCL-format dumps): node-1's clock runs 7 minutes behind, so
    its dumps' records all end minutes before the others' begin, and its 8 dumps were left out as another
    run's. Its ranks are members of the other dumps' groups, and the collectives both hold are the same ops:
    one run, a clock off. They are kept (the culprit, rank 10, was seen as a missing dump, not as itself)."""
    inputs = load_inputs(_unpacked(name, tmp_path), layout="dp=32", gpus_per_node=8)
    v = diagnose(inputs)
    assert v.verdict.value == verdict and v.suspect_nodes == nodes, v.explain()
    assert not any("another run's" in n for n in inputs.notes), inputs.notes
    assert any("clock is off; kept" in n for n in inputs.notes), inputs.notes
    if nodes:
        assert v.culprit_ranks == (10,) and "missing" not in " ".join(v.reasons).lower(), v.explain()


def test_a_rank_gone_while_its_data_parallel_peers_are_in_backward_is_the_culprit(tmp_path):
    """An outside tester's DDP job (48 ranks, one snapshot): py-spy found rank 31's process gone ("Failed to get
    process executable name"), the other 47 are in `loss.backward()`, where DDP's reducer waits for the
    gradient all-reduce. Their wait was not counted, so the verdict was `inconclusive`, nobody named. It is the
    same hang as a gone rank whose peers wait in a collective: named, on the one-snapshot premise."""
    case = _unpacked("ddp-rank-gone-peers-in-backward-dp48.tar.xz", tmp_path)
    v = diagnose(load_inputs(case, gpus_per_node=8))
    assert v.verdict.value == "hang" and v.culprit_ranks == (31,), v.explain()
    assert v.suspect_nodes == ("hpc-gpu0729",) and v.details.get("stuck_on_premise"), v.explain()


def test_a_stale_pid_beside_a_ddp_job_that_moves_names_nobody(tmp_path):
    """The tester's healthy DDP job (32 ranks, two rounds, backward then the all_reduce) with rank 17's capture
    failed in both rounds as a stale pid would ("Check that the process is running"): the job moves, so the
    gone process is a collection problem, never a culprit."""
    case = _unpacked("ddp-stale-pid-healthy-2rounds.tar.xz", tmp_path)
    v = diagnose(load_inputs(case, gpus_per_node=4))
    assert v.verdict.value == "healthy" and not v.suspect_nodes, v.explain()


def test_the_rank_a_framework_logs_from_is_its_duty_not_a_slow_machine(tmp_path):
    """An outside tester's healthy torchtitan job (pp=4 x FSDP 8, five rounds): torchtitan logs metrics from the
    first rank of the last pipeline stage (rank 24), which was caught in wandb's `Run.log` in 3 of 5 rounds while
    its FSDP peers waited in the all-gather. Only rank 0 or replica 0 counted as running the job's duties, so rank
    24's node was evicted as fail-slow. A rank alone in a logging library's code no other rank ran is a duty."""
    case = _unpacked("torchtitan-wandb-logging-rank-healthy-5rounds.tar.xz", tmp_path)
    v = diagnose(load_inputs(case, layout="tp=1,pp=4,dp=8", gpus_per_node=8))
    assert v.verdict.value == "healthy" and not v.suspect_nodes, v.explain()
    assert any("Rank 24 stood out" in r and "wandb" in r for r in v.reasons), v.explain()


def test_a_rank_its_fsdp_group_waits_for_round_after_round_is_fail_slow(tmp_path):
    """The tester's torchtitan job with rank 21 (stage 2) computing in 4 of 5 rounds while its 7 FSDP peers wait in
    the all-gather; in 3 of those rounds other ranks were caught at the same line, so it was no lone outlier. The
    group-waits-for-it tally looked only at TP, CP or EP groups: `healthy`. Without them it is the FSDP group."""
    case = _unpacked("torchtitan-fsdp-straggler-5rounds.tar.xz", tmp_path)
    v = diagnose(load_inputs(case, layout="tp=1,pp=4,dp=8", gpus_per_node=8))
    assert v.verdict.value == "fail-slow" and v.culprit_ranks == (21,), v.explain()
    assert v.suspect_nodes == ("gpu-b35-085",), v.explain()


def test_hot_spares_that_join_the_job_are_not_slow_machines():
    """An outside tester's 128-machine H100 fleet (DCGM GPU utilisation only, every 10 s): two hot spares idle at
    0.4 % for 11 minutes, then trained like everyone else. Their robust z among GPUs at 96-100 % swung as the
    peers' spread breathed (a spread near 0 at saturation makes the same distance a larger z), and a swing read
    as a fall of 18.5 percentage points: both spares were evicted. Their distance to the peer median never grew."""
    v = diagnose(load_inputs(OUTSIDE / "metrics-spares-join-util-only", gpus_per_node=8))
    assert v.verdict.value == "healthy" and not v.suspect_nodes, v.explain()


def test_an_earlier_attempt_s_dumps_that_stopped_elsewhere_are_left_out(tmp_path):
    """The same dumps, with node-1's 8 made an earlier attempt of the same job: sequence ids restart with the
    process group, so its collectives carry the same ids and ops, but it stopped at collective 25, the others
    at 78-125. Clock skew cannot explain that: another run's, left out."""
    import dataclasses

    from rankscope.datasets.loading.sources import _other_runs_left_out
    from rankscope.datasets.readers.flight_recorder import read_fr_dir

    dumps = read_fr_dir(_unpacked("fr-fsdp2-node-clock-7min-behind-healthy-dp32.tar.xz", tmp_path) / "dumps")
    notes: list[str] = []
    assert len(_other_runs_left_out(dumps, notes)) == 32 and "clock is off" in notes[0], notes
    earlier = [
        dataclasses.replace(d, entries=tuple(e for e in d.entries if e.collective_seq_id <= 25))
        if 8 <= d.rank < 16
        else d
        for d in dumps
    ]
    notes = []
    kept = _other_runs_left_out(earlier, notes)
    assert len(kept) == 24 and "another run's" in notes[0], notes
