"""Crash verdicts: the first failure is the culprit, the cascade after it is not."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest

from rankscope.analytics import crashes
from rankscope.analytics import diagnose as run_diagnose
from rankscope.analytics.crashes import is_cascade, latest_incident
from rankscope.collectors.stacks import death_signal
from rankscope.datasets.domain.exits import ProcessExit
from rankscope.datasets.domain.inputs import Inputs
from rankscope.datasets.domain.topology import Layout, Topology
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.datasets.readers.exits import exits_from_events, read_exit_record


def diagnose(procs, topology, **kw):
    """The one entry point over partial inputs (as the tests build them)."""
    return run_diagnose(Inputs(job=kw.pop("job", ""), topology=topology, procs=tuple(procs), **kw))


def crash_verdict(exits, topology, *, job="", anchor=None):
    """The crash verdict of ``exits`` (None when no trainer exited abnormally)."""
    f = crashes.facts(exits, topology, anchor=anchor)
    return crashes.verdict(f, topology, job=job) if f is not None else None


GLOO_PEER = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:13001. This is typically caused by a remote worker crashing."
)
NCCL_TIMEOUT = (
    "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, "
    "NumelIn=1048576, Timeout(ms)=600000) ran for 600023 milliseconds before timing out."
)
TOPO = Topology.from_layout(Layout.parse("tp=2,pp=2,dp=2"), gpus_per_node=2)


def ex(rank: int, t: float, kind: str = "RuntimeError", message: str = "boom", **kw: object) -> ProcessExit:
    return ProcessExit(rank, 1_000_000.0 + t, kind, message, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "message", "cascade"),
    [
        ("RuntimeError", GLOO_PEER, True),
        ("DistBackendError", NCCL_TIMEOUT, True),
        ("SIGTERM", "terminated by a signal (faulthandler dumped its stack as it stopped)", True),
        ("RuntimeError", "Connection reset by peer", True),
        ("RuntimeError", "CUDA error: an illegal memory access was encountered", False),
        ("torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", False),
        ("fatal signal", "Segmentation fault", False),
        ("vanished", "", False),
    ],
)
def test_cascade_classification(kind: str, message: str, cascade: bool) -> None:
    assert is_cascade(ex(0, 0, kind, message)) is cascade


def test_first_primary_failure_is_the_culprit_and_the_cascade_is_not() -> None:
    exits = [
        ex(6, 0.0, message="injected crash on rank 6 at step 4", where="injected_crash (faultjob.py:109)"),
        *(ex(r, 0.6 + 0.1 * r, message=GLOO_PEER) for r in (0, 2, 4, 7)),
        *(ex(r, 1.5, "SIGTERM", "terminated by a signal") for r in (1, 3, 5)),
    ]
    v = crash_verdict(exits, TOPO, job="j")
    assert v is not None and v.verdict == "crash"
    assert v.culprit_ranks == (6,) and v.culprit_nodes == ("node-3",) and v.suspect_nodes == ("node-3",)
    assert v.confidence >= 0.9
    assert "failed first" in v.reasons[0] and "injected_crash (faultjob.py:109)" in v.reasons[0]
    assert "7 other rank(s)" in v.reasons[1] and "cascade" in v.reasons[1]
    causes = {e["rank"]: e["cause"] for e in v.details["crash"]["exits"]}
    assert causes[6] == "primary" and {causes[r] for r in (0, 1, 2, 3, 4, 5, 7)} == {"cascade"}


def test_a_killed_rank_beats_earlier_peer_errors() -> None:
    # the OOM killer's SIGKILL leaves no record: the agent notices it a tick late, after the gloo errors
    exits = [ex(r, 0.2, message=GLOO_PEER) for r in (0, 1, 2)] + [ex(5, 0.5, "vanished", time_source="detected")]
    v = crash_verdict(exits, TOPO)
    assert v is not None and v.culprit_ranks == (5,) and v.culprit_nodes == ("node-2",)
    assert v.confidence <= 0.8  # its time is only when it was noticed


def test_only_cascade_errors_name_the_earliest_at_low_confidence() -> None:
    v = crash_verdict([ex(3, 0.3, message=GLOO_PEER), ex(1, 0.1, message=GLOO_PEER)], TOPO)
    assert v is not None and v.culprit_ranks == (1,) and v.confidence == 0.5
    assert "left no record" in v.reasons[0]


BARE_ABORT = "Signal 6 (SIGABRT) received by PID 4242"  # torchrun's summary of a rank with no error of its own


def test_a_bare_abort_with_its_peers_collective_timeouts_is_their_teardown_not_their_cause() -> None:
    # the NCCL watchdog aborts the process: a rank whose log was cut is known only by its SIGABRT, in the same
    # second as its peers' timeouts; it was alive through their 600 s wait, so its death did not cause it
    exits = [ex(r, 0.0, "DistBackendError", NCCL_TIMEOUT) for r in (0, 1, 2, 4, 6, 7)]
    exits += [ex(r, 0.4, "SIGABRT", BARE_ABORT) for r in (3, 5)]
    f = crashes.facts(exits, TOPO)
    assert f is not None and f.primary == () and len(f.cascade) == 8
    v = crashes.verdict(f, TOPO)
    assert v.details["crash"]["n_primary"] == 0 and v.confidence <= 0.3
    assert "abort at its peers' collective timeouts" in v.reasons[0]
    # exits alone: the teardown's order names no machine (it named all 4, the earliest timeouts' nodes)
    alone = diagnose([], TOPO, exits=tuple(exits))
    assert not alone.suspect_nodes and not alone.culprit_nodes, alone.explain()
    one = [ex(r, 0.0, "DistBackendError", NCCL_TIMEOUT) for r in (0, 1, 2, 4, 5, 6, 7)] + [
        ex(3, 0.5, "SIGABRT", BARE_ABORT)
    ]
    assert not diagnose([], TOPO, exits=tuple(one)).suspect_nodes


def test_a_bare_abort_before_its_peers_timeouts_or_without_any_is_still_the_first_failure() -> None:
    early = [ex(5, 0.0, "SIGABRT", BARE_ABORT)] + [ex(r, 600.0, "DistBackendError", NCCL_TIMEOUT) for r in (0, 1, 2)]
    v = crash_verdict(early, TOPO)
    assert v is not None and v.culprit_ranks == (5,) and v.details["crash"]["n_primary"] == 1
    torn = [ex(5, 0.0, "SIGABRT", BARE_ABORT)] + [ex(r, 0.5, "SIGTERM", "terminated by a signal") for r in (0, 1)]
    v = crash_verdict(torn, TOPO)  # its agent SIGTERMed the others: no timeout, the abort is the first failure
    assert v is not None and v.culprit_ranks == (5,) and v.confidence >= 0.9


def test_the_same_error_on_many_ranks_is_a_code_fault_not_a_machine() -> None:
    exits = [ex(r, 0.01 * r, "ValueError", f"bad shape [4, {r}] in layer 12") for r in range(6)]
    v = crash_verdict(exits, TOPO)
    assert v is not None and v.verdict == "crash"
    assert v.suspect_nodes == () and v.culprit_nodes == () and v.culprit_ranks == tuple(range(6))
    assert "not a machine" in v.reasons[0]


def test_only_the_latest_incident_counts() -> None:
    old = ex(2, -7200.0, message="yesterday's crash")
    new = [ex(4, 0.0, message="today's crash"), ex(4, 5.0, message="again"), ex(0, 1.0, message=GLOO_PEER)]
    inc = latest_incident([old, *new], 3600.0)
    assert [(e.rank, e.message) for e in inc] == [(4, "today's crash"), (0, GLOO_PEER)]
    v = crash_verdict([old, *new], TOPO)
    assert v is not None and v.culprit_ranks == (4,)


def test_no_abnormal_trainer_exit_no_crash_verdict() -> None:
    assert crash_verdict([], TOPO) is None
    assert crash_verdict([ex(1, 0.0, role="dataloader")], TOPO) is None


def test_crash_verdict_leads_and_keeps_the_stack_clusters(tmp_path: Path) -> None:
    exits = [ex(6, 0.0, message="injected"), ex(0, 0.7, message=GLOO_PEER)]
    v = diagnose((), TOPO, job="j", exits=exits)
    assert v.verdict == "crash" and v.culprit_nodes == ("node-3",) and v.sources == ("events",)


def test_exits_from_agent_events_structured_and_text_only() -> None:
    ts = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
    events = pl.DataFrame(
        {
            "job": ["j"] * 4,
            "ts": [ts] * 4,
            "node": ["node-3", "node-0", "node-1", "node-1"],
            "kind": ["process_exit", "process_exit", "process_exit", "stall"],
            "severity": ["critical", "critical", "info", "warning"],
            "gpu": [None] * 4,
            "rank": [6, 0, 2, None],
            "message": [
                "rank 6 (pid 9) exited: RuntimeError: injected crash",
                "rank 0 (pid 3) exited: RuntimeError: " + GLOO_PEER,
                "rank 2 (pid 4) exited: exit: normal",
                "no progress",
            ],
            "labels": [
                json.dumps(
                    {
                        "exception": "RuntimeError",
                        "message": "injected crash",
                        "where": "f (a.py:1)",
                        "time_source": "hook",
                    }
                ),
                json.dumps({"exception": "RuntimeError"}),
                None,
                None,
            ],
            "pid": [9, 3, 4, None],
            "action": ["stop-time-check"] * 3 + ["capture"],
        },
        schema_overrides={"gpu": pl.Int32, "rank": pl.Int32, "pid": pl.Int64},
    )
    exits = exits_from_events(events)
    assert [(e.rank, e.kind, e.node) for e in exits] == [(6, "RuntimeError", "node-3"), (0, "RuntimeError", "node-0")]
    assert exits[0].where == "f (a.py:1)" and exits[1].message == GLOO_PEER and is_cascade(exits[1])


def test_exit_records_in_a_dump_directory_give_a_crash_verdict(tmp_path: Path) -> None:
    def record(pid: int, rank: int, t: float, tp: str, msg: str) -> None:
        (tmp_path / f"pid{pid}.exit.json").write_text(
            json.dumps(
                {
                    "pid": pid,
                    "rank": rank,
                    "role": "trainer",
                    "time": t,
                    "type": tp,
                    "message": msg,
                    "frames": [{"function": "step", "file": "/x/train.py", "line": 7}],
                }
            )
        )

    record(100, 5, 10.0, "RuntimeError", "CUDA error: an illegal memory access was encountered")
    record(101, 4, 10.8, "RuntimeError", GLOO_PEER)
    record(102, 1, 12.0, "exit", "normal interpreter exit")
    (tmp_path / "pid103.exit.json").write_text("{not json")
    inp = load_inputs(tmp_path, layout="tp=2,pp=2,dp=2", gpus_per_node=2)
    assert sorted(e.rank for e in inp.exits) == [4, 5]
    assert any("exit record(s) skipped" in n and "pid103.exit.json" in n for n in inp.notes)
    v = diagnose(inp.procs, inp.topology, job=inp.job, exits=inp.exits)
    assert v.verdict == "crash" and v.culprit_ranks == (5,) and v.culprit_nodes == ("node-2",)
    assert "step (train.py:7)" in v.reasons[0]
    assert read_exit_record(tmp_path / "pid102.exit.json") is None


def test_death_signal_reads_faulthandler_output_written_at_death(tmp_path: Path) -> None:
    f = tmp_path / "pid7.stack.txt"
    assert death_signal(7, tmp_path) is None
    f.write_text('Thread 0x01 (most recent call first):\n  File "a.py", line 1 in f\n')
    assert death_signal(7, tmp_path)[0] == "SIGTERM"  # type: ignore[index]
    assert death_signal(7, tmp_path, offset=f.stat().st_size) is None  # already consumed by a capture
    with f.open("a") as fh:
        fh.write(
            "Fatal Python error: Segmentation fault\n\nCurrent thread 0x01 (most recent call first):\n"
            '  File "a.py", line 2 in g\n'
        )
    kind, message, _ = death_signal(7, tmp_path)  # type: ignore[misc]
    assert (kind, message) == ("fatal signal", "Segmentation fault")

    g = tmp_path / "pid8.stack.txt"  # only a dump the agent asked for, then SIGKILL: nothing written at death
    g.write_text(
        '# rankscope: stack requested at 1000.5\nThread 0x01 (most recent call first):\n  File "a.py", line 1 in f\n'
    )
    assert death_signal(8, tmp_path) is None


def test_exits_that_only_report_lost_peers_do_not_outrank_the_stacks(tmp_path: Path) -> None:
    # a hung job torn down with SIGTERM while the agent runs: every exit is a consequence
    from rankscope.datasets.domain.stacks import from_dumps
    from rankscope.harness.synthetic import generate_job

    job = generate_job("tp=2,pp=2,dp=2", fault="compute-hang", gpus_per_node=2, seed=0)
    procs = from_dumps((d.dump, d.snapshot, d.rank, d.node, d.role) for d in job.dumps)
    sigterms = [ex(r, 0.01 * r, "SIGTERM", "terminated by a signal") for r in range(8)]
    v = diagnose(procs, job.topology, job="j", exits=sigterms)
    assert v.verdict == "hang" and any(r.startswith("[events]") for r in v.reasons)
    assert crash_verdict(sigterms, TOPO).verdict == "crash"  # alone, the exits still say what they can


def test_ctrl_c_everywhere_is_a_deliberate_stop_not_a_code_fault() -> None:
    v = crash_verdict([ex(r, 0.01 * r, "KeyboardInterrupt", "") for r in range(8)], TOPO)
    assert v is not None and v.details["crash"]["n_primary"] == 0 and v.confidence == 0.5


def test_exits_far_from_the_diagnosed_capture_are_ignored() -> None:
    old = [ex(2, -7200.0, message="last week's crash")]
    assert crash_verdict(old, TOPO, anchor=1_000_000.0) is None
    assert crash_verdict(old, TOPO).culprit_ranks == (2,)


def test_death_signal_ignores_dumps_written_before_the_process_was_last_seen_alive(tmp_path: Path) -> None:
    f = tmp_path / "pid8.stack.txt"
    f.write_text('Thread 0x01 (most recent call first):\n  File "a.py", line 1 in f\n')
    mtime = f.stat().st_mtime
    assert death_signal(8, tmp_path, since=mtime + 5) is None  # a stack request answered earlier, then SIGKILL
    assert death_signal(8, tmp_path, since=mtime - 5)[0] == "SIGTERM"  # type: ignore[index]


@pytest.mark.parametrize(
    ("offsets", "words"),
    [
        ((633.0, 633.0), "failed 633.0 s later with"),  # it read "633.0-633.0 s later"
        (
            (-87.0, -87.0),
            "failed 87.0 s before it (by another clock) with",
        ),  # "between 87.0 s before and -87.0 s after"
        ((-2.0, 3.0), "failed between 2.0 s before and 3.0 s after it with"),
        ((1.0, 4.0), "failed 1.0-4.0 s later with"),
    ],
)
def test_the_cascade_s_time_reads_right_whatever_the_clocks(offsets: tuple[float, float], words: str) -> None:
    exits = [ex(6, 100.0, message="CUDA error: uncorrectable ECC error encountered")]
    exits += [ex(r, 100.0 + t, "DistBackendError", NCCL_TIMEOUT) for r, t in zip((0, 1), offsets)]
    v = crash_verdict(exits, TOPO)
    assert v is not None and v.culprit_ranks == (6,) and words in v.reasons[1], v.reasons
