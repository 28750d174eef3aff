"""Logs laid out and worded as the field writes them, from an outside tester's cases (``fieldcases8``,
formats taken from real output quoted in public issues): each test is a case that once named the wrong
machine, or named one in a healthy job.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rankscope.analytics import diagnose
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.datasets.readers.logs import _split


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def _watchdog_crash(rank: int, local: int, host: str, started: str, failed: str, error: str) -> str:
    """A torch >= 2.4 console: c10 writes the month unpadded (``[E321 ...]`` is March 21)."""
    head = f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Process group watchdog thread terminated with exception"
    return (
        f"[default{local}]:[2025-03-21 {started}] rank {rank}/4 (local {local}) on {host} initialized\n"
        f"[default{local + 1}]:[2025-03-21 {started}] rank {rank + 1}/4 (local {local + 1}) on {host} initialized\n"
        f"[default{local}]:[rank{rank}]:[E321 {failed}.123456789 ProcessGroupNCCL.cpp:1595] {head}: {error}\n"
        f"[default{local}]:[rank{rank}]:terminate called after throwing an instance of 'c10::DistBackendError'\n"
        f"[default{local}]:[rank{rank}]:  what():  {head}: {error}\n"
    )


@pytest.mark.parametrize(
    ("prefix", "want"),
    [
        ("[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] ", (3, 21)),
        ("[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] ", (12, 6)),
        ("[E0321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] ", (3, 21)),
        ("W321 10:59:50.786825 90011 torch/distributed/elastic/agent/server/api.py:879] ", (3, 21)),
    ],
)
def test_c10_stamps_with_an_unpadded_month_are_read(prefix, want):
    text, _, _, stamp = _split(prefix + "[PG ID 0 PG GUID 0(default_pg) Rank 2] watchdog")
    assert text.startswith("[PG ID 0") and stamp is not None and stamp[:2] == want


def test_the_first_failure_is_ordered_by_c10_stamps_with_an_unpadded_month(tmp_path):
    """Each rank's start-up line is an hour before its failure and in the other order: read without its
    c10 stamp, each failure took its start-up time and the later failure (gpu-a) came first."""
    root = _write(
        tmp_path / "job",
        {
            "logs/gpu-a.log": _watchdog_crash(0, 0, "gpu-a", "01:40:00", "02:40:00", "an illegal memory access"),
            "logs/gpu-b.log": _watchdog_crash(2, 0, "gpu-b", "02:20:00", "02:30:00", "unspecified launch failure"),
        },
    )
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert v.verdict.value == "crash" and v.culprit_nodes == ("gpu-b",), v.explain()
    assert "before" not in v.explain()


_DEL_BLOCK = """Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f3c2d1e5cf0>
Traceback (most recent call last):
  File "/usr/local/lib/python3.10/dist-packages/torch/utils/data/dataloader.py", line 1604, in __del__
    self._shutdown_workers()
  File "/usr/lib/python3.10/multiprocessing/process.py", line 160, in is_alive
    assert self._parent_pid == os.getpid(), 'can only test a child process'
AssertionError: can only test a child process
"""
_CAUGHT = """WARNING data: Handling webdataset error (PIL.UnidentifiedImageError). Ignoring.
Traceback (most recent call last):
  File "/opt/openclip/src/training/data.py", line 122, in __getitem__
    image = Image.open(io.BytesIO(sample["jpg"]))
PIL.UnidentifiedImageError: cannot identify image file <_io.BytesIO object at 0x7f2d40a1c6d0>
"""
_OK = (
    "I0321 01:55:30.000000 90011 torch/distributed/elastic/agent/server/api.py:879] [default] worker group "
    "successfully finished. Waiting 300 seconds for other agents to finish.\n"
)


def _console(host_index: int, block: str | None, *, finished: bool, steps_after: bool = False) -> str:
    """Two workers of one torchrun agent (``--tee 3``); local rank 1 prints ``block``."""
    g = 2 * host_index
    out = [
        f"[default{lr}]:[rank{g + lr}]: iteration 10/100 | elapsed time per iteration (ms): 812.0\n" for lr in (0, 1)
    ]
    if block is not None:
        out += [f"[default1]:[rank{g + 1}]:{ln}\n" for ln in block.splitlines()]
    if steps_after:
        out += [f"[default1]:[rank{g + 1}]: iteration 11/100 | elapsed time per iteration (ms): 809.0\n"]
    if finished:
        out.append(_OK)
    return "".join(out)


@pytest.mark.parametrize(
    ("block", "finished", "steps_after"),
    [
        pytest.param(_DEL_BLOCK, False, False, id="exception-ignored-in-a-finalizer"),
        pytest.param(_CAUGHT, True, False, id="caught-then-the-launcher-finished"),
        pytest.param(_CAUGHT, False, True, id="caught-then-more-steps"),
    ],
)
def test_a_traceback_the_process_lived_through_is_no_crash(tmp_path, block, finished, steps_after):
    root = _write(
        tmp_path / "job",
        {
            "logs/node03.log": _console(0, None, finished=finished),
            "logs/node04.log": _console(1, block, finished=finished, steps_after=steps_after),
        },
    )
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert v.verdict.value != "crash" and not v.suspect_nodes, v.explain()


def test_a_crash_before_a_restart_is_the_replaced_attempt_s(tmp_path):
    """``torchrun --max-restarts``: the launcher restarted the group after the crash and the new attempt
    finished. The crash belongs to processes the restart replaced: the verdict is about the latest attempt
    (a restarted, healthy job's machine was evicted at 0.95), and the notes say so."""
    failed = (
        "W0321 01:50:00.000000 90011 torch/distributed/elastic/agent/server/api.py:700] [default] Worker group "
        "FAILED. 3/3 attempts left; will restart worker group\n"
    )
    text = _console(1, _CAUGHT.split("\n", 1)[1], finished=False) + failed + _OK
    root = _write(tmp_path / "job", {"logs/node03.log": _console(0, None, finished=False), "logs/node04.log": text})
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert v.verdict.value != "crash" and not v.suspect_nodes, v.explain()
    assert any("restart" in n for n in v.details.get("notes", [])), v.details


def test_a_failed_worker_speaking_again_marks_a_restart(tmp_path):
    """torch 2.13's agent logs no "will restart" line at its default level: the failed worker's stream
    printing again after the launcher's "failed (exitcode" line is the restart."""
    failed = (
        "E0321 01:50:00.000000 90011 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) "
        "local_rank: 1 (pid: 12044) of binary: /usr/bin/python\n"
    )
    again = "[default1]:rank 3/4 pid 12261 ready attempt 1\n[default0]:step 0 loss 7.07\n"
    text = _console(1, _CAUGHT.split("\n", 1)[1], finished=False) + failed + again
    root = _write(tmp_path / "job", {"logs/node03.log": _console(0, None, finished=False), "logs/node04.log": text})
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert v.verdict.value != "crash" and not v.suspect_nodes, v.explain()
    # without the worker speaking again the crash stands
    root = _write(
        tmp_path / "job2",
        {
            "logs/node03.log": _console(0, None, finished=False),
            "logs/node04.log": _console(1, _CAUGHT.split("\n", 1)[1], finished=False) + failed,
        },
    )
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert v.verdict.value == "crash" and v.culprit_nodes == ("node04",), v.explain()


def _timeout_console(host: str, first: int, hung: int, *, nccl: bool = True) -> str:
    """One torchrun agent's ``--tee 3`` console of an NCCL hang (torch 2.5 wording): every local rank but the
    one holding global rank ``hung`` times out on SeqNum 121; that one never enqueued it."""
    out = []
    for lr in range(2):
        r = first + lr
        if nccl:
            out.append(
                f"[default{lr}]:{host}:1000{lr}:1000{lr} [{lr}] NCCL INFO Bootstrap : Using eth0:10.1.0.{lr}<0>\n"
            )
        pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
        if r == hung:
            out.append(
                f"[default{lr}]:[rank{r}]:[E321 02:10:00.000000000 ProcessGroupNCCL.cpp:1710] {pg} Received a dump "
                "signal due to a collective timeout from  rank 0 and we will try our best to dump the debug info. "
                "Last enqueued NCCL work: 120, last completed NCCL work: 120.\n"
            )
            continue
        out.append(
            f"[default{lr}]:[rank{r}]:[E321 02:10:00.000000000 ProcessGroupNCCL.cpp:616] {pg} Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=121, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n"
        )
    return "".join(out)


def test_a_folder_of_per_host_consoles_is_no_machine(tmp_path):
    """``kubectl logs`` per pod collected in ``pods/``: the folder was taken as the one machine ("isolate:
    pods"); each console names its own."""
    hosts = ("sft-worker-0", "sft-worker-1", "sft-worker-2")
    root = _write(tmp_path / "job", {f"pods/{h}.log": _timeout_console(h, 2 * i, 3) for i, h in enumerate(hosts)})
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert v.verdict.value == "hang" and v.culprit_nodes == ("sft-worker-1",), v.explain()
    assert "pods" not in v.suspect_nodes


def test_a_user_named_host_folder_stays_the_machine(tmp_path):
    """The rule above never overrides a folder named after a machine holding that machine's own files."""
    files = {f"gpu-node-{c}/console.log": _timeout_console(f"10-1-0-{i}", 2 * i, 3) for i, c in enumerate("abc")}
    v = diagnose(load_inputs(_write(tmp_path / "job", files), gpus_per_node=2))
    assert v.verdict.value == "hang" and v.culprit_nodes == ("gpu-node-b",), v.explain()


def test_slurm_task_files_are_named_by_nccl_hosts_and_a_batch_log_holds_no_rank(tmp_path):
    """``srun --output=%x-%j-%t.out`` (one file per task) beside the batch log: the task files named the
    machines (``pretrain-4471190-3``) and the batch log took a machine's slot (phantom ranks)."""
    files = {}
    for r, host in ((0, "gpu-b-014"), (1, "gpu-b-014"), (2, "gpu-b-015"), (3, "gpu-b-015")):
        text = _timeout_console(host, 0, 3 if r == 3 else -1).splitlines()[0].split(":", 1)[1] + "\n"
        text = text.replace("[0] NCCL", f"[{r % 2}] NCCL")
        pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
        if r == 3:
            text += f"[rank{r}]:[E321 02:10:00.0 ProcessGroupNCCL.cpp:1710] {pg} Received a dump signal. "
            text += "Last enqueued NCCL work: 120, last completed NCCL work: 120.\n"
        else:
            text += f"[rank{r}]:[E321 02:10:00.0 ProcessGroupNCCL.cpp:616] {pg} Watchdog caught collective operation "
            text += "timeout: WorkNCCL(SeqNum=121, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600012 milliseconds\n"
        files[f"pretrain-4471190-{r}.out"] = text
    files["slurm-4471190.out"] = "srun: error: gpu-b-015: task 3: Exited with exit code 1\nsrun: Job step aborted\n"
    v = diagnose(load_inputs(_write(tmp_path / "job", files), gpus_per_node=2))
    assert v.verdict.value == "hang" and v.culprit_nodes == ("gpu-b-015",), v.explain()
    assert v.world_size == 4 and not v.details.get("inferred_node_names"), v.explain()


def test_a_silent_member_its_heartbeat_monitor_aborted_is_the_laggard(tmp_path):
    """torch 2.3 wording: the hung GPU's rank prints no timeout, its heartbeat monitor (8 min) aborts it two
    minutes before its peers' 10-minute timeouts. Read with its time, its silence was no longer "alive after
    the timeouts" and the hang named nobody."""
    files = {}
    for host, first in (("node201", 0), ("node202", 2)):
        for lr in range(2):
            r = first + lr
            if r == 1:
                line = (
                    f"[rank{r}]:[E321 01:59:37.959239289 ProcessGroupNCCL.cpp:1259] [PG 0 Rank {r}] Heartbeat monitor "
                    "timed out! Process will be terminated after dumping debug info. workMetaList_.size()=1\n"
                )
            else:
                line = (
                    f"[rank{r}]:[E321 02:01:38.354239924 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
                    "collective operation timeout: WorkNCCL(SeqNum=120544, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, "
                    "Timeout(ms)=600000) ran for 600074 milliseconds before timing out.\n"
                    f"[rank{r}]:[E321 02:01:41.354239206 ProcessGroupNCCL.cpp:1595] [PG 0 Rank {r}] Process group "
                    f"watchdog thread terminated with exception: [Rank {r}] Watchdog caught collective operation "
                    "timeout: WorkNCCL(SeqNum=120544, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=600000) "
                    "ran for 600074 milliseconds before timing out.\n"
                )
            files[f"{host}/pretrain_7k2m/attempt_0/{lr}/stderr.log"] = line
    v = diagnose(load_inputs(_write(tmp_path / "job", files), gpus_per_node=2))
    assert v.verdict.value == "hang" and v.culprit_ranks == (1,) and v.culprit_nodes == ("node201",), v.explain()


def test_a_deepspeed_pdsh_console_names_each_host_by_its_prefix(tmp_path):
    """``deepspeed --hostfile`` runs pdsh: every remote line is ``<host>: ...`` in one console. It read as
    "no evidence"."""
    lines = [
        "[2025-03-23 11:00:00,112] [INFO] [multinode_runner.py:80:get_cmd] Running on the following workers: "
        "worker-0,worker-1",
        "worker-0: [2025-03-23 11:00:00,501] [INFO] [launch.py:152:main] nnodes=2, num_local_procs=2, node_rank=0",
        "worker-1: [2025-03-23 11:00:00,511] [INFO] [launch.py:152:main] nnodes=2, num_local_procs=2, node_rank=1",
        "worker-0: [rank0]: iteration 10/100 | elapsed time per iteration (ms): 812.0",
        "worker-1: [rank3]: Traceback (most recent call last):",
        'worker-1: [rank3]:   File "/workspace/sft/train.py", line 88, in <module>',
        "worker-1: [rank3]:     loss.backward()",
        "worker-1: [rank3]: RuntimeError: CUDA error: an illegal memory access was encountered",
        "worker-1: [2025-03-23 11:20:01,000] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python', '-u', "
        "'train.py', '--local_rank=1'] exits with return code = 1",
        "pdsh@launcher: worker-1: ssh exited with exit code 1",
    ]
    root = _write(tmp_path / "job", {"ds-train-20250323.log": "\n".join(lines) + "\n"})
    v = diagnose(load_inputs(root, gpus_per_node=2))
    assert v.verdict.value == "crash" and v.culprit_ranks == (3,) and v.culprit_nodes == ("worker-1",), v.explain()


def test_ctrl_c_on_every_rank_is_a_deliberate_stop_not_a_lost_peer(tmp_path):
    ki = 'Traceback (most recent call last):\n  File "/w/train.py", line 88, in <module>\nKeyboardInterrupt\n'
    files = {f"logs/node0{h}.log": _console(h, ki, finished=False) for h in range(2)}
    v = diagnose(load_inputs(_write(tmp_path / "job", files), gpus_per_node=2))
    assert not v.suspect_nodes and v.verdict.value in ("inconclusive", "healthy"), v.explain()
    text = v.explain()
    assert "deliberate stop" in text and "lost peer; the earliest" not in text, text
