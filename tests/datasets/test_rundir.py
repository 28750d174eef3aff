"""The hook's run directory read post mortem, as a dump directory (no agent, no --layout)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rankscope.analytics import diagnose as run_diagnose
from rankscope.datasets.domain.inputs import Inputs
from rankscope.datasets.domain.stacks import Frame
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.datasets.readers.faulthandler import parse_traceback_text


def diagnose(procs, topology, **kw):
    """The one entry point over partial inputs (as the tests build them)."""
    return run_diagnose(Inputs(job=kw.pop("job", ""), topology=topology, procs=tuple(procs), **kw))


WAIT = """Thread 0x00007f00000000c1 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f00000000c2 (most recent call first):
  File "/opt/rankscope/collectors/hook.py", line 377 in _control_loop
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007f00000000c3 (most recent call first):
  File "/venv/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/venv/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/job/train.py", line 201 in main
  File "/job/train.py", line 332 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in _run_module_as_main
"""
BUSY = WAIT.replace(
    'distributed_c10d.py", line 3252 in all_reduce\n  File "/venv/torch/distributed/c10d_logger.py", '
    "line 83 in wrapper",
    'functional.py", line 2201 in linear',
)


def hooked(
    run: Path,
    pid: int,
    rank: int,
    node: str,
    *,
    started: float = 100.0,
    stack: str | None = None,
    role: str = "trainer",
    coords: dict | None = None,
    steps: list[float] = (),
    ppid: int = 1,
) -> None:
    ident = {
        "pid": pid,
        "ppid": ppid,
        "rank": rank,
        "node": node,
        "role": role,
        "world_size": 4,
        "started": started,
        "coords": coords if coords is not None else {"tp": rank % 2, "dp": rank // 2, "pp": 0},
    }
    (run / f"pid{pid}.json").write_text(json.dumps(ident))
    (run / f"pid{pid}.stack.txt").write_text(stack or "")
    if steps:
        (run / f"pid{pid}.steps.jsonl").write_text(
            "".join(
                json.dumps({"t": 1000.0 + i, "step": i, "rank": rank, "step_time_seconds": d}) + "\n"
                for i, d in enumerate(steps)
            )
            + "{truncated"
        )


def test_run_directory_is_a_dump_directory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for rank in range(4):
        hooked(run, 100 + rank, rank, f"host-{rank // 2}", stack=BUSY if rank == 2 else WAIT, steps=[0.1, 0.1, 0.1])
    hooked(run, 50, 0, "host-0", started=10.0, stack=BUSY)  # an earlier incarnation of rank 0: ignored
    hooked(run, 200, 1, "host-0", role="child", ppid=101)  # a DataLoader worker that wrote nothing: no evidence
    hooked(run, 51, 0, "host-0", role="dataloader", ppid=50, stack=BUSY)  # the old rank 0's worker: ignored
    (run / "pid77.json").write_text("{truncated")  # an identity cut short: its stack cannot be placed
    (run / "pid77.stack.txt").write_text(WAIT)
    os.mkfifo(run / "pid100.ctl")  # the hook's control FIFO must not be opened
    (run / "manifest.json").write_text(json.dumps({"layout": "tp=2,dp=2", "nodes": {}}))
    inp = load_inputs(run, gpus_per_node=2)
    assert inp.topology is not None and inp.topology.sizes["tp"] == 2 and inp.topology.sizes["dp"] == 2
    assert inp.topology.node_names == ("host-0", "host-1")
    trainers = sorted((p.rank, p.pid) for p in inp.procs if p.role == "trainer")
    assert trainers == [(0, 100), (1, 101), (2, 102), (3, 103)]
    assert not [p for p in inp.procs if p.role != "trainer"]
    assert any("2 older process(es)" in n for n in inp.notes), inp.notes
    assert any("without an identity" in n and "pid77.stack.txt" in n for n in inp.notes), inp.notes
    assert inp.timings is not None and inp.timings.height == 12
    # the steps end at t=1003 and the stack files were written "now": their modification time only bounds
    # the stop from above, so nothing tells a stop while progressing from a hang. One snapshot of a blocked
    # majority with rank 2 computing: a hang on the premise that the job was stuck, and the reasons say so.
    v = diagnose(inp.procs, inp.topology, job=inp.job, timings=inp.timings, snapshot_latest=inp.snapshot_latest)
    assert v.verdict == "hang" and v.culprit_ranks == (2,) and v.culprit_nodes == ("host-1",), v.reasons
    assert any("premise that the job was stuck" in r for r in v.reasons), v.reasons
    assert any("cannot tell a stop while progressing from a hang" in r for r in v.reasons), v.reasons
    # the same directory left as written: the stack files' times are just after the last step
    for rank in range(4):
        os.utime(run / f"pid{100 + rank}.stack.txt", (1002.3, 1002.3))
    inp = load_inputs(run, gpus_per_node=2)
    v = diagnose(inp.procs, inp.topology, job=inp.job, timings=inp.timings, snapshot_latest=inp.snapshot_latest)
    assert v.verdict == "healthy" and v.suspect_nodes == (), v.reasons
    assert any("stopped while progressing" in r for r in v.reasons), v.reasons


def test_faulthandler_main_thread_is_the_one_not_started_by_threading() -> None:
    (dump,) = parse_traceback_text(WAIT.replace(" in <module>", " in run_script"))
    assert dump.main_thread is not None and dump.main_thread.frames[0].function == "all_reduce"


def test_bad_identity_values_and_stale_exit_records(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for rank in range(4):
        hooked(
            run,
            100 + rank,
            rank,
            f"host-{rank // 2}",
            stack=WAIT,
            started=1000.0,
            coords={"TENSOR_MODEL_PARALLEL_GROUP": rank},
        )  # not our dimension names
    ident = json.loads((run / "pid102.json").read_text())
    (run / "pid102.json").write_text(json.dumps({**ident, "started": "yesterday"}))
    (run / "pid999.exit.json").write_text(
        json.dumps(  # an earlier run's crash, identity long gone
            {"pid": 999, "rank": 3, "time": 500.0, "type": "RuntimeError", "message": "old", "frames": []}
        )
    )
    inp = load_inputs(run, layout="tp=2,dp=2", gpus_per_node=2)
    assert inp.exits == () and any("exit record(s) from before this run" in n for n in inp.notes), inp.notes
    inp = load_inputs(run, gpus_per_node=2)  # no --layout: the unusable coordinates are a note, not an error
    assert inp.topology is not None and inp.topology.world_size == 4
    assert any("coordinates were not used" in n for n in inp.notes), inp.notes


def test_faulthandler_importing_thread_is_not_the_main_one() -> None:
    text = (
        'Thread 0x02 (most recent call first):\n  File "/x/lib.py", line 3 in <module>\n'
        '  File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed\n'
        '  File "/usr/lib/python3.11/threading.py", line 982 in run\n'
        '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
        'Current thread 0x01 (most recent call first):\n  File "/job/train.py", line 9 in step\n'
        '  File "/job/train.py", line 20 in <module>\n  File "<frozen runpy>", line 88 in _run_code\n'
    )
    (dump,) = parse_traceback_text(text)
    assert dump.main_thread is not None and dump.main_thread.frames[0].function == "step"


def test_a_dump_cut_off_before_its_first_frame_is_no_evidence(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for rank in range(8):
        hooked(run, 100 + rank, rank, f"host-{rank // 2}", stack=BUSY if rank == 2 else WAIT)
    (run / "pid101.stack.txt").write_text("Thread 0x")  # a second SIGTERM killed it mid-write
    inp = load_inputs(run, gpus_per_node=2)
    assert next(p for p in inp.procs if p.rank == 1).status == "cut"
    v = diagnose(inp.procs, inp.topology, job=inp.job)
    assert v.culprit_ranks == (2,) and 1 not in v.suspect_ranks and 1 not in v.culprit_ranks
    assert any(e.kind == "dump-cut-off" and e.ranks == (1,) for e in v.evidence)


def test_the_newest_of_several_appended_dumps_is_used() -> None:
    from rankscope.datasets.readers.rundir import (
        last_faulthandler_dump,
        split_faulthandler_dumps,
    )

    older = WAIT.replace("all_reduce", "broadcast")  # an earlier stack request
    assert len(split_faulthandler_dumps(older + WAIT)) == 2  # faulthandler appends with no separator
    dump = last_faulthandler_dump(older + WAIT, 7, "pid7.stack.txt")
    assert dump is not None and dump.main_thread.frames[0].function == "all_reduce"
    assert last_faulthandler_dump(older + "Thread 0x", 7, "x").status == "cut"  # the newest was cut: no stale stack
    fatal = "Fatal Python error: Segmentation fault\n\n" + WAIT.replace("all_reduce", "segv_here")
    dump = last_faulthandler_dump(older + fatal, 7, "x")
    assert dump is not None and dump.main_thread.frames[0].function == "segv_here"


# faulthandler lists the main thread (the oldest) last; a second SIGTERM stopped this one inside the hook's thread
CUT_BEFORE_MAIN = """Thread 0x00007f2abb8546c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/usr/lib/python3.11/multiprocessing/queues.py", line 231 in _feed
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007f2af7b676c0 (most recent call first):
  File "/opt/venv/lib/python3.11/site-packages/rankscope/collectors/hook.py", line 377 in _control_loop
  File "/usr/lib/python3.11/threading.py", line """


def test_a_dump_cut_off_before_the_main_thread_is_no_evidence() -> None:
    (dump,) = parse_traceback_text(CUT_BEFORE_MAIN, "pid9.stack.txt")
    assert dump.status == "cut" and dump.main_thread is None and "main thread" in (dump.error or "")
    # cut inside the main thread itself: the main thread is the last one, its outer frames lost
    main_cut = WAIT[: WAIT.index('  File "/job/train.py", line 332')] + '  File "/job/tr'
    (dump,) = parse_traceback_text(main_cut)
    assert dump.status == "partial" and dump.main_thread is not None
    assert dump.main_thread.frames[0].function == "all_reduce"


def test_hook_control_thread_is_idle_not_a_busy_thread() -> None:
    from rankscope.analytics.stacks.frames import classify

    (dump,) = parse_traceback_text(WAIT)
    hook_thread = next(t for t in dump.threads if t.frames[0].function == "_control_loop")
    assert classify(hook_thread.frames, role="other")[0] == "idle"
    answering = (Frame("_requested_dump", "/x/rankscope/collectors/hook.py", 401), *hook_thread.frames)
    assert classify(answering, role="other")[0] == "idle"  # writing the dump the agent asked for


def test_a_requested_dump_stands_in_for_a_cut_sigterm_dump_only_if_no_step_followed() -> None:
    from rankscope.datasets.readers.rundir import STACK_REQUEST, last_faulthandler_dump

    requested = f"{STACK_REQUEST}1005.25\n" + BUSY  # the agent asked at the stall
    text = requested + CUT_BEFORE_MAIN  # then the SIGTERM dump at teardown was cut
    dump = last_faulthandler_dump(text, 7, "pid7.stack.txt", last_step=1004.0)
    assert dump is not None and dump.main_thread.frames[0].function == "linear" and "requested at" in dump.error
    assert last_faulthandler_dump(text, 7, "x", last_step=1006.0).status == "cut"  # the rank moved on after it
    assert last_faulthandler_dump(text, 7, "x").status == "cut"  # no steps to tell: an older dump may be stale
    # from an earlier process with the same pid (the run directory was reused): stale
    assert last_faulthandler_dump(text, 7, "x", last_step=1004.0, not_before=1010.0).status == "cut"
    # a requested dump that is the newest but older than the last step: stale as well, and said so
    stale = last_faulthandler_dump(requested, 7, "x", last_step=1006.0)
    assert stale.status == "cut" and "older than its last step" in stale.error
    assert last_faulthandler_dump(requested, 7, "x", last_step=1005.0).status == "ok"
    assert last_faulthandler_dump(requested, 7, "x", last_step=lambda: 1005.0).status == "ok"  # read lazily


def test_teardown_cuts_and_empty_stack_files_do_not_name_a_culprit(tmp_path: Path) -> None:
    # seen on the fault-injection job: torchrun's SIGTERM and the scheduler's arrive together; the second
    # kills a rank while faulthandler writes (or before it writes a byte)
    run = tmp_path / "run"
    run.mkdir()
    for rank in range(8):
        hooked(
            run,
            100 + rank,
            rank,
            f"host-{rank // 2}",
            stack=BUSY if rank == 5 else WAIT,
            coords={"tp": rank % 2, "dp": rank // 2, "pp": 0},
            steps=[0.1, 0.1],
        )
    (run / "pid100.stack.txt").write_text(CUT_BEFORE_MAIN)
    (run / "pid102.stack.txt").write_text("")
    inp = load_inputs(run, gpus_per_node=2)
    assert {p.rank: p.status for p in inp.procs if p.rank in (0, 2)} == {0: "cut", 2: "cut"}
    v = diagnose(inp.procs, inp.topology, job=inp.job)
    assert v.verdict == "hang" and v.culprit_ranks == (5,) and v.culprit_nodes == ("host-2",), v.reasons
    assert any(e.kind == "dump-cut-off" and e.ranks == (0, 2) for e in v.evidence)
    assert not any(e.kind == "other-thread" for e in v.evidence)  # the hook's own thread is idle
    # the agent's dump at the stall (after rank 5's last step) stands in for its cut SIGTERM dump
    (run / "pid105.stack.txt").write_text(f"# rankscope: stack requested at 1003.0\n{BUSY}Thread 0x")
    inp = load_inputs(run, gpus_per_node=2)
    v = diagnose(inp.procs, inp.topology, job=inp.job)
    assert v.culprit_ranks == (5,), v.reasons


def test_the_hook_recorded_main_thread_id_names_the_main_thread_exactly() -> None:
    (dump,) = parse_traceback_text(WAIT, main_thread_id=0x7F00000000C3)
    assert dump.main_thread is not None and dump.main_thread.thread_id == 0x7F00000000C3
    # a spawned thread's innermost frame alone looks like any main thread; the id says it is not one
    one_frame = WAIT.split("\n\n")[0].split("\n")[0] + '\n  File "/job/train.py", line 5 in <lambda>'
    assert parse_traceback_text(one_frame, main_thread_id=0x7F00000000C3)[0].status == "cut"
    assert parse_traceback_text(one_frame)[0].status == "partial"  # without the id: a guess


def test_a_rank_killed_outright_is_not_hidden_behind_a_healthy_verdict(tmp_path: Path) -> None:
    # the OOM killer takes rank 2 (no SIGTERM, so no dump); the others wait in the all_reduce it never joins
    run = tmp_path / "run"
    run.mkdir()
    for rank in range(8):
        hooked(
            run,
            100 + rank,
            rank,
            f"host-{rank // 2}",
            stack="" if rank == 2 else WAIT,
            coords={"tp": rank % 2, "dp": rank // 2, "pp": 0},
            steps=[0.1, 0.1],
        )
    (run / "pid103.steps.jsonl").write_text('{"t": 1e999999, "step": 9, "rank": 3}\n{"t": ' + "9" * 400 + "}\n")
    inp = load_inputs(run, gpus_per_node=2)
    v = diagnose(inp.procs, inp.topology, job=inp.job)
    assert v.verdict == "inconclusive" and v.suspect_ranks == (2,), v.reasons
    assert any("left no usable stack" in r and "2" in r for r in v.reasons), v.reasons


def test_faulthandler_lists_at_most_100_threads() -> None:
    spawned = (
        'Thread 0x{:016x} (most recent call first):\n  File "/usr/lib/python3.11/threading.py", line 327 in wait\n'
        '  File "/usr/lib/python3.11/threading.py", line 982 in run\n'
        '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n'
    )
    text = "\n".join(spawned.format(0x7F0000001000 + i) for i in range(100)) + "...\n"
    for main_id in (0x7F0000000B80, None):
        (dump,) = parse_traceback_text(text, main_thread_id=main_id)
        assert dump.status == "cut" and "at most 100 threads" in (dump.error or ""), dump.error


# -- run directories as users bring them: stopped while progressing, during start-up, slowed ---------

IMPORTING = """Current thread 0x00007f00000000c3 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/_ops.py", line 1100 in <module>
  File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed
  File "<frozen importlib._bootstrap_external>", line 940 in exec_module
  File "<frozen importlib._bootstrap>", line 690 in _load_unlocked
  File "<frozen importlib._bootstrap>", line 1147 in _find_and_load_unlocked
  File "<frozen importlib._bootstrap>", line 1176 in _find_and_load
  File "/venv/lib/python3.11/site-packages/torch/__init__.py", line 1500 in <module>
  File "/job/train.py", line 3 in <module>
"""


def _run_dir(tmp_path: Path, stacks: dict[int, str], steps: list[tuple[float, float]], stop: float) -> Path:
    """4 ranks (tp=2, dp=2) on host-0/host-1: each rank's stack file written at ``stop``, its steps
    ``(end time, step time)``."""
    run = tmp_path / "run"
    run.mkdir()
    for rank, stack in stacks.items():
        hooked(run, 100 + rank, rank, f"host-{rank // 2}", started=stop - 600, stack=stack)
        if steps:
            (run / f"pid{100 + rank}.steps.jsonl").write_text(
                "".join(
                    json.dumps({"t": t, "step": i, "rank": rank, "step_time_seconds": d}) + "\n"
                    for i, (t, d) in enumerate(steps)
                )
            )
        os.utime(run / f"pid{100 + rank}.stack.txt", (stop, stop))
    return run


def _verdict(run: Path):
    inp = load_inputs(run, gpus_per_node=2)
    return run_diagnose(inp)


def test_a_run_stopped_while_progressing_is_not_a_hang(tmp_path: Path) -> None:
    # 1 s steps up to 0.4 s before the SIGTERM; rank 2 caught computing while the others wait for it: one
    # snapshot cannot tell a slow rank from the last one to finish its step, and the steps are steady
    stop = 10_000.0
    steps = [(stop - 500 + i, 1.0) for i in range(500)]
    v = _verdict(_run_dir(tmp_path, {r: BUSY if r == 2 else WAIT for r in range(4)}, steps, stop))
    assert v.verdict == "healthy" and v.suspect_nodes == (), v.explain()
    assert any("stopped while progressing" in r for r in v.reasons)
    assert any("Rank(s) 2 ran their own code" in r for r in v.reasons)


def test_a_run_stopped_during_start_up_is_inconclusive_and_names_nobody(tmp_path: Path) -> None:
    stacks = {r: IMPORTING.replace("_ops.py", "nn/modules/linear.py") if r == 3 else IMPORTING for r in range(4)}
    v = _verdict(_run_dir(tmp_path, stacks, [], 10_000.0))
    assert v.verdict == "inconclusive" and v.suspect_nodes == () and v.suspect_ranks == (), v.explain()
    assert any("stopped during start-up" in r for r in v.reasons)


def test_a_run_whose_steps_slowed_and_kept_completing_is_fail_slow_on_the_busy_rank(tmp_path: Path) -> None:
    # steps 1 s, then 3 s up to the stop; the stacks show rank 2 computing while the others wait for it
    stop, t, steps = 10_000.0, 9_000.0, []
    while t < stop - 1:
        d = 1.0 if t < 9_300 else 3.0
        t += d
        steps.append((t, d))
    v = _verdict(_run_dir(tmp_path, {r: BUSY if r == 2 else WAIT for r in range(4)}, steps, stop))
    assert v.verdict == "fail-slow" and v.culprit_ranks == (2,) and v.culprit_nodes == ("host-1",), v.explain()
    assert v.suspect_nodes == ("host-1",)
    assert any("slowed from 1.00 s to 3.00 s" in r for r in v.reasons)


def _requested(t: float, stack: str) -> str:
    return f"# rankscope: stack requested at {t:.3f}\n{stack}"


def test_every_dump_in_a_stack_file_is_a_round(tmp_path: Path) -> None:
    # the agent asked for 4 rounds 10 s apart, then SIGTERM: rank 2 computes in every round while the
    # others wait for it, the others' waits move (other collectives), the steps keep completing
    stop = 10_050.0
    wait2 = WAIT.replace("line 201 in main", "line 205 in main")
    stacks = {}
    for rank in range(4):
        rounds = [
            _requested(10_000.0 + 10 * k + 0.01 * rank, BUSY if rank == 2 else (WAIT if k % 2 else wait2))
            for k in range(4)
        ]
        stacks[rank] = "".join(rounds) + (BUSY if rank == 2 else WAIT)
    steps = [(9_000.0 + 2 * i, 2.0) for i in range(525)]
    run = _run_dir(tmp_path, stacks, steps, stop)
    inp = load_inputs(run, gpus_per_node=2)
    assert sorted({p.snapshot for p in inp.procs}) == [0, 1, 2, 3, 4]
    assert inp.snapshot_times[0] == pytest.approx(10_000.0, abs=0.1) and 4 in inp.snapshot_latest
    assert any("4 round(s) of stacks the agent requested" in n for n in inp.notes), inp.notes
    v = run_diagnose(inp)
    assert v.verdict == "fail-slow" and v.culprit_ranks == (2,) and v.suspect_nodes == ("host-1",), v.explain()
    # the same rounds with the steps stopped long before the first request: the job was stuck
    (tmp_path / "stuck").mkdir()
    run = _run_dir(tmp_path / "stuck", stacks, [(9_000.0 + 2 * i, 2.0) for i in range(100)], stop)
    v = run_diagnose(load_inputs(run, gpus_per_node=2))
    assert v.verdict == "hang" and v.culprit_ranks == (2,), v.explain()
    assert not any("premise" in r for r in v.reasons)  # time evidence, not the premise


def test_the_hooks_pickled_flight_recorder_dump_is_read(tmp_path: Path, probe_dir: Path) -> None:
    # torch without _dump_fr_trace_json: the hook writes pid<PID>.fr.pkl
    run = tmp_path / "run"
    run.mkdir()
    for rank in range(4):
        hooked(run, 100 + rank, rank, f"host-{rank}", stack=BUSY if rank == 3 else WAIT, coords={"dp": rank})
        (run / f"pid{100 + rank}.fr.pkl").write_bytes((probe_dir / "fr" / f"rank_{rank}").read_bytes())
    inp = load_inputs(run, gpus_per_node=1)
    assert sorted(d.rank for d in inp.fr_dumps) == [0, 1, 2, 3]
    assert not any("fr.pkl" in n for n in inp.notes), inp.notes


# -- REAL hook run directories (tests/data/stacks) -----------------------------------------------------

HOOK_DATA = Path(__file__).resolve().parents[1] / "data" / "stacks"


def _real_run(tmp_path: Path, name: str, *, as_left: bool) -> Path:
    """A real run directory copied; ``as_left``: with the modification times it had where it was captured."""
    run = tmp_path / name
    shutil.copytree(HOOK_DATA / name, run)
    if as_left:
        for f, t in json.loads((HOOK_DATA / f"{name}.mtimes.json").read_text()).items():
            os.utime(run / f, (t, t))
    return run


@pytest.mark.parametrize("as_left", [True, False])
def test_real_run_stopped_while_progressing_names_nobody(tmp_path: Path, as_left: bool) -> None:
    v = run_diagnose(load_inputs(_real_run(tmp_path, "hook_sigterm_progress", as_left=as_left)))
    assert v.verdict == "healthy" and v.suspect_nodes == (), v.explain()
    if as_left:
        assert any("stopped while progressing" in r for r in v.reasons), v.reasons


@pytest.mark.parametrize("as_left", [True, False])
def test_real_run_stopped_while_importing_is_inconclusive(tmp_path: Path, as_left: bool) -> None:
    v = run_diagnose(load_inputs(_real_run(tmp_path, "hook_sigterm_importing", as_left=as_left)))
    assert v.verdict == "inconclusive" and v.suspect_nodes == () and v.suspect_ranks == (), v.explain()


def test_real_slow_run_one_snapshot(tmp_path: Path) -> None:
    # rank 5 (gpu-node-c) spins 0.7 s extra every step; steps are steady (slow from the first step), stopped
    # by SIGTERM. As left: the steps prove the job was progressing; one snapshot cannot tell the rank the
    # others wait for from the last to finish a step (the real healthy 8-rank job shows one rank computing
    # while all others wait in 1 of its 3 py-spy rounds), so it is named as a hint, nothing is evicted.
    v = run_diagnose(load_inputs(_real_run(tmp_path, "hook_slow", as_left=True)))
    assert v.verdict == "healthy" and v.suspect_nodes == (), v.explain()
    assert any("Rank(s) 5 ran their own code" in r for r in v.reasons), v.reasons
    # copied (file times later than any step): nothing tells a stop while progressing from a hang; one
    # snapshot of a blocked majority names rank 5's node on the premise that the job was stuck
    v = run_diagnose(load_inputs(_real_run(tmp_path / "copy", "hook_slow", as_left=False)))
    assert v.verdict == "hang" and v.culprit_ranks == (5,) and v.suspect_nodes == ("gpu-node-c",), v.explain()
    assert any("premise" in r for r in v.reasons)
    assert "gpu-node-a" not in v.suspect_nodes and "gpu-node-b" not in v.suspect_nodes  # the steps blame nobody
