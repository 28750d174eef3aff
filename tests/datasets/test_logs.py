"""Logs as evidence: real torchrun 2.13 consoles, --log-dir trees and TorchElastic error files of a crash, a
hang and a healthy job (``tests/data/field``, captured on CPU/gloo; see its README), re-laid the way users
keep them, plus NCCL watchdog lines built from ProcessGroupNCCL's exact message templates (synthetic: NCCL
needs GPUs). Healthy variants must name nothing; cascade lines never evict.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rankscope.analytics import diagnose, logs
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.datasets.readers.base import failure_kind
from rankscope.datasets.readers.dumpdir import read_stack_file
from rankscope.datasets.readers.sniff import sniff

FIELD = Path(__file__).parents[1] / "data" / "field"
HOSTS = ("gpu-node-a", "gpu-node-b", "gpu-node-c", "gpu-node-d")  # torchrun agent k ran on HOSTS[k]


def _combined(capture: str, dst: Path) -> Path:
    """Each agent's console as ``<host>.log`` (``torchrun ... 2>&1 | tee $(hostname).log``)."""
    dst.mkdir()
    for k, host in enumerate(HOSTS):
        shutil.copy(FIELD / capture / f"torchrun_combined.node{k}.log", dst / f"{host}.log")
    return dst


def _log_dirs(capture: str, dst: Path, *, only_errors: bool = False) -> Path:
    """Each agent's ``--log-dir`` tree under ``<host>/`` (what collecting /var/log/torchelastic per node gives)."""
    for k, host in enumerate(HOSTS):
        src = FIELD / capture / "logs" / f"node{k}"
        shutil.copytree(
            src, dst / host, ignore=(lambda d, n: [x for x in n if x.endswith(".log")]) if only_errors else None
        )
    return dst


def test_torchrun_consoles_of_a_crash_name_the_first_failure(tmp_path):
    inputs = load_inputs(_combined("crash_mn4x2", tmp_path / "logs"), layout="tp=2,pp=2,dp=2", gpus_per_node=2)
    v = diagnose(inputs)
    assert v.verdict.value == "crash" and v.culprit_nodes == ("gpu-node-c",) and v.culprit_ranks == (5,), v.explain()
    assert v.suspect_nodes == ("gpu-node-c",)
    assert "OSError" in v.reasons[0] and "cascade" in v.reasons[1]
    assert "inferred_node_names" not in v.details  # the file names named the machines; "localhost" did not


def test_raw_consoles_without_machine_names_still_find_the_rank_and_say_names_are_invented(tmp_path):
    dst = tmp_path / "raw"
    shutil.copytree(FIELD / "crash_mn4x2", dst, ignore=lambda d, n: [x for x in n if x in ("logs", "cmd.json")])
    v = diagnose(load_inputs(dst, layout="tp=2,pp=2,dp=2", gpus_per_node=2))
    assert v.verdict.value == "crash" and v.culprit_ranks == (5,)
    assert v.details["inferred_node_names"]


@pytest.mark.parametrize("only_errors", [False, True])
def test_log_dir_trees_and_error_files_alone(tmp_path, only_errors):
    root = _log_dirs("crash_mn4x2", tmp_path / "logs", only_errors=only_errors)
    inputs = load_inputs(root, layout="tp=2,pp=2,dp=2", gpus_per_node=2)
    v = diagnose(inputs)
    assert v.verdict.value == "crash" and v.culprit_nodes == ("gpu-node-c",) and v.culprit_ranks == (5,), v.explain()
    first = min(inputs.exits, key=lambda e: e.time)
    assert (first.rank, first.kind, first.time_source) == (5, "OSError", "error-file")


def test_faulthandler_blocks_in_the_consoles_of_a_hang_are_a_stack_snapshot(tmp_path):
    inputs = load_inputs(_combined("hang_mn4x2", tmp_path / "logs"), layout="tp=2,pp=2,dp=2", gpus_per_node=2)
    assert sorted(p.rank for p in inputs.procs) == list(range(8))
    v = diagnose(inputs)
    assert v.verdict.value == "hang" and v.culprit_ranks == (6,) and v.culprit_nodes == ("gpu-node-d",), v.explain()
    f = logs.facts(inputs.logs, inputs.topology)
    assert f is not None and f.hang_evidence and f.gloo_timeouts == (0, 2) and not f.laggards  # gloo names no one


def test_a_healthy_job_stopped_by_the_user_names_nothing(tmp_path):
    dst = tmp_path / "logs"
    dst.mkdir()
    shutil.copy(FIELD / "healthy_ddp4" / "torchrun_combined.log", dst / "gpu-node-r.log")
    shutil.copytree(FIELD / "healthy_ddp4" / "logdir", dst / "logdir" / "gpu-node-r")
    inputs = load_inputs(dst, gpus_per_node=4)
    v = diagnose(inputs)
    assert v.verdict.value in ("healthy", "inconclusive") and not v.suspect_nodes, v.explain()
    assert any("faulthandler stacks of 1 of 4 ranks" in n for n in inputs.notes)  # rank 2's SIGUSR1 block alone


def test_the_probe_console_alone_evicts_no_one(tmp_path, probe_dir):
    shutil.copy(probe_dir / "torchrun_stdout.txt", tmp_path / "torchrun_stdout.txt")
    v = diagnose(load_inputs(tmp_path))
    assert not v.suspect_nodes and v.verdict.value in ("inconclusive", "healthy")


# -- NCCL watchdog: ProcessGroupNCCL's message templates (synthetic: no GPU here) -------------------------
def _c10d(rank: int, stamp: str, line: int, text: str, local: int | None = None) -> str:
    tee = f"[default{local}]:" if local is not None else ""
    return f"{tee}[rank{rank}]:[E1201 {stamp} ProcessGroupNCCL.cpp:{line}] {text}\n"


def _timeout(rank, pg_rank, seq, stamp):
    return _c10d(
        rank,
        stamp,
        632,
        f"[Rank {pg_rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
        f"NumelIn=70254592, NumelOut=70254592, Timeout(ms)=600000) ran for 600056 milliseconds before timing out.",
    )


def _failure(rank, pg, pg_rank, seq, enq, stamp):
    return _c10d(
        rank,
        stamp,
        2271,
        f"[PG ID {pg[0]} PG GUID {pg[1]} Rank {pg_rank}]  failure detected by watchdog at work sequence id: {seq} "
        f"PG status: last enqueued work: {enq}, last completed work: {seq - 1}",
    )


def _dump_signal(rank, enq, stamp):
    return _c10d(
        rank,
        stamp,
        1595,
        f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Received a dump signal due to a collective timeout from  rank 3 "
        f"and we will try our best to dump the debug info. Last enqueued NCCL work: {enq}, last completed NCCL work: "
        f"{enq}.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks.",
    )


def _write(root: Path, per_host: dict[str, str]) -> Path:
    root.mkdir()
    for host, text in per_host.items():
        (root / f"{host}.log").write_text(text)
    return root


def test_the_rank_that_never_enqueued_the_work_its_peers_time_out_in_is_the_laggard(tmp_path):
    text = {"h-0": "", "h-1": ""}
    for r in range(16):
        if r == 11:  # alive, its heartbeat monitor prints its counter: it never enqueued 80817
            text["h-1"] += _dump_signal(r, 80816, "04:51:29.1")
            continue
        text[f"h-{r // 8}"] += _timeout(r, r, 80817, "04:51:27.5") + _failure(
            r, ("0", "0(default_pg)"), r, 80817, 80817 + r % 3, "04:51:27.6"
        )
    inputs = load_inputs(_write(tmp_path / "logs", text), gpus_per_node=8)
    v = diagnose(inputs)
    assert v.verdict.value == "hang" and v.culprit_ranks == (11,) and v.suspect_nodes == ("h-1",), v.explain()
    assert "never enqueued work 80817" in v.reasons[0]


def test_a_silent_member_is_named_only_when_every_wait_leads_to_it(tmp_path):
    tp = ("2", "61(TENSOR_MODEL_PARALLEL_GROUP)")
    text = ""
    for r in range(8):  # one TP group; rank 5 prints no timeout but is alive after its peers' timeouts
        if r != 5:
            text += _timeout(r, r, 51211, "09:10:29.8") + _failure(r, tp, r, 51211, 51211, "09:10:29.9")
    silent = _write(tmp_path / "a", {"h-0": text})
    assert diagnose(load_inputs(silent, gpus_per_node=8)).suspect_nodes == ()  # silence alone: nothing named
    alive = _write(tmp_path / "b", {"h-0": text + _dump_signal(5, 412, "09:10:31.6")})
    v = diagnose(load_inputs(alive, gpus_per_node=8))
    assert v.verdict.value == "hang" and v.culprit_ranks == (5,) and v.confidence < 0.85, v.explain()


def test_timeouts_with_equal_counters_prove_a_hang_but_name_no_one(tmp_path):
    text = "".join(
        _timeout(r, r, 7, "01:00:00.0") + _failure(r, ("0", "0(default_pg)"), r, 7, 7, "01:00:00.1") for r in range(8)
    )
    v = diagnose(load_inputs(_write(tmp_path / "logs", {"h-0": text}), gpus_per_node=8))
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes


def test_periodic_work_updates_of_a_healthy_job_name_no_one(tmp_path):
    text = ""
    for i, r in enumerate(list(range(8)) * 3):  # each rank at its own moment: counters differ by tens
        stamp = f"12:{13 + i // 8}:{10 + i % 8:02d}.0"
        line = (
            f"[PG ID 0 PG GUID 0(default_pg) Rank {r}] NCCL Work update periodically: last enqueued NCCL work: "
            f"{2000 + 7 * i}, last completed NCCL work: {1998 + 7 * i}."
        )
        text += f"[default{r}]:[rank{r}]:[I1203 {stamp} ProcessGroupNCCL.cpp:2093] {line}\n"
    v = diagnose(load_inputs(_write(tmp_path / "logs", {"a100-r8-n10": text}), gpus_per_node=8))
    assert v.verdict.value == "healthy" and not v.suspect_nodes


# -- py-spy's own error output is a failed capture with its kind ----------------------------------------
@pytest.mark.parametrize(
    "name, kind",
    [
        ("permission_denied.txt", "permission"),
        ("permission_denied_json.txt", "permission"),
        ("nonexistent_pid.txt", "process-gone"),
        ("not_python.txt", "not-python"),
        ("rust_backtrace_1/nonexistent_pid.txt", "process-gone"),
        ("rust_backtrace_1/not_python_json.txt", "not-python"),
    ],
)
def test_pyspy_errors_are_failed_captures_with_their_kind(tmp_path, name, kind):
    lines = (FIELD / "pyspy_errors" / name).read_text().splitlines()
    body = "\n".join(x for x in lines if not x.startswith(("$ ", "[rc="))) + "\n"  # the capture's own annotations
    for suffix in (".txt", ".json"):  # what the collector named it does not matter
        f = tmp_path / f"rank1{suffix}"
        f.write_text(body)
        (d,) = read_stack_file(f)
        assert (d.status, d.failure_kind) == ("failed", kind), d.error


def test_two_pyspy_attaching_at_once_leave_a_header_and_an_eperm(tmp_path):
    src = FIELD / "pyspy_errors" / "concurrent_eperm"
    f = tmp_path / "rank1.txt"
    f.write_text((src / "rank1.stdout.txt").read_text() + (src / "rank1.stderr.txt").read_text())  # > f 2>&1
    (d,) = read_stack_file(f)
    assert (d.status, d.failure_kind, d.pid) == ("failed", "concurrent-attach", 17144)
    assert failure_kind("py-spy timed out after 5s") == "timeout"


def test_the_content_decides_the_format_not_the_name():
    assert sniff(b"[default0]:rank 5/8\n[default1]:step 0\n", "x.txt").kind == "log"
    assert sniff(b'[\n  {"pid": 1, "frames": []}\n]\n', "x.txt").kind == "pyspy-json"
    assert sniff(b"[2026-11-30 10:00:01,123] INFO x\nProcess 1: python\n", "x.json").kind == "pyspy-text"
    assert sniff(b"\x80\x04\x95", "rank_0").kind == "pickle"
    assert sniff(b"Traceback (most recent call last):\n", "stderr.log").kind == "log"
    assert sniff(b"Traceback (most recent call last):\n", "rank3.txt").kind == "traceback"
    assert sniff(b"job hung at 03:12 UTC\n", "notes.txt").kind == "unknown"


def test_a_job_stopped_by_its_scheduler_evicts_no_one(tmp_path):
    """Every worker SIGTERMed (the launcher's summary in torch 2.13's wording): no failure of its own."""
    entries = "".join(
        f"[{i}]:\n  time      : 2026-12-01_15:20:30\n  host      : gpu-node-x\n  rank      : {r} (local_rank: {r})\n"
        f"  exitcode  : -15 (pid: {100 + r})\n  error_file: <N/A>\n  traceback : Signal 15 (SIGTERM) received by PID "
        f"{100 + r}\n"
        for i, r in ((1, 1), (0, 0))
    )
    text = (
        "W1201 15:20:01.000000 123 torch/distributed/run.py:874] *****\n[default0]:step 10\n[default1]:step 10\n"
        "W1201 15:20:30.100000 123 torch/distributed/elastic/agent/server/api.py:704] Received 15 death signal, "
        "shutting down workers\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        + "=" * 60
        + "\ntrain.py FAILED\n"
        + "-" * 60
        + "\nFailures:\n"
        + entries.split("[0]:")[0]
        + "-" * 60
        + "\nRoot Cause (first observed failure):\n[0]:"
        + entries.split("[0]:")[1]
        + "=" * 60
        + "\n"
    )
    v = diagnose(load_inputs(_write(tmp_path / "logs", {"gpu-node-x": text}), gpus_per_node=2))
    assert not v.suspect_nodes and v.verdict.value == "inconclusive", v.explain()
    assert "deliberate stop" in v.reasons[0]


def test_line_prefixes_of_consoles_of_several_launchers():
    from rankscope.datasets.readers.logprefix import line_source, prefix_kind

    kube = b"".join(b"[pod/llm-train-worker-%d/pytorch] [default0]:step %d\n" % (i % 2, i) for i in range(6))
    srun = b"".join(b" %d: [default1]:step %d\n" % (i % 3, i) for i in range(6))
    pdsh = b"".join(b"worker-%d: [rank%d]: step\n" % (i, i) for i in range(6))
    assert (prefix_kind(kube), prefix_kind(srun), prefix_kind(pdsh)) == ("kubectl", "srun", "pdsh")
    assert prefix_kind(b"plain line\n" * 6) is None and prefix_kind(b"0: one\n") is None  # too few lines
    assert line_source("[pod/p-0/c] x", "kubectl") == ("p-0", "p-0", 12)
    assert line_source("  12: x", "srun") == ("task 12", None, 6)
    assert line_source("[pod/p-0/c] x", "srun") is None
