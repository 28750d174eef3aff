"""End to end on the real job: torchrun + gloo, 8 ranks on 4 simulated nodes, one injected fault.

The agent runs beside the job with a 3 s stall threshold; the job is then stopped with SIGTERM.
``rankscope diagnose`` on the agent's store and on the hook's run directory alone must both name
the node of the faulty rank (node-k holds ranks 2k and 2k+1), and for a lost p2p message both ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(240)]


def kill_tree(job: subprocess.Popen) -> None:
    """Stop torchrun and every worker below it (each in its own session) as a scheduler would:
    SIGTERM (the hook's faulthandler writes each rank's last stack), then SIGKILL what is left."""
    from rankscope.collectors.discovery import descendants

    tree = [*descendants(job.pid), job.pid]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in tree:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGTERM:
            time.sleep(1.0)
    job.wait()


def diagnose_json(path: Path, *flags: str) -> dict:
    diag = subprocess.run(
        [sys.executable, "-m", "rankscope", "diagnose", str(path), *flags, "--format", "json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert diag.returncode == 0, diag.stderr[-3000:]
    return json.loads(diag.stdout)


def run_fault(tmp_path: Path, fault: str, rank: int, agent_flags: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """The verdicts from the agent's store and from the hook's run directory alone."""
    pytest.importorskip("torch")
    from rankscope.harness.faultjob import command

    tmp_path.mkdir(parents=True, exist_ok=True)
    run_dir, store = tmp_path / "run", tmp_path / "store"
    argv, env = command(run_dir=run_dir, fault=fault, fault_rank=rank, fault_step=4)
    log = open(tmp_path / "job.log", "w")  # noqa: SIM115
    job = subprocess.Popen(argv, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        agent = subprocess.run(
            [
                sys.executable,
                "-m",
                "rankscope",
                "agent",
                str(store),
                "--job",
                "e2e",
                "--run-dir",
                str(run_dir),
                "--stall-seconds",
                "3",
                "--exit-after-captures",
                "1",
                "--launcher-pid",
                str(job.pid),
                "--max-runtime-seconds",
                "80",
                "--metric-interval-seconds",
                "0.5",
                *agent_flags,
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=100,
            env={**os.environ, "RANKSCOPE_AGENT_DISCOVERY_INTERVAL_SECONDS": "1", "RANKSCOPE_AGENT_KERNEL_LOG": ""},
        )
    finally:
        kill_tree(job)
        log.close()
    assert agent.returncode == 0, agent.stderr[-3000:]
    assert "captures: #" in agent.stdout, agent.stdout + agent.stderr[-2000:]
    # the run directory needs no flags: the hook recorded each rank's node and parallel coordinates
    return diagnose_json(store, "--layout", "tp=2,pp=2,dp=2", "--gpus-per-node", "2"), diagnose_json(run_dir)


@pytest.mark.parametrize(
    ("fault", "rank", "culprits", "kind"),
    [
        ("compute-hang", 5, ["node-2"], "hang"),
        ("dataloader-stall", 3, ["node-1"], "hang"),
        # the other ranks fail 0.5-3 s after the crash ("Connection closed by peer", SIGTERM from torchrun);
        # the stacks alone can then look inconclusive: the exits' order names the first failure
        ("crash", 6, ["node-3"], "crash"),
        # rank 1 (stage 0) skips its send to rank 5 (stage 1): each waits to receive from the other, and
        # rank 4 waits for rank 5 in a TP all_reduce. A lost message between two stages: both ends.
        ("p2p-stuck", 1, ["node-0", "node-2"], "hang"),
        # rank 2 sleeps 2 s more every step: the agent sees steps 4x slower than before and takes 3 rounds
        # 5 s apart; the run directory keeps them as requested dumps before the SIGTERM dump
        ("slow-rank", 2, ["node-1"], "fail-slow"),
    ],
)
def test_agent_and_diagnose_name_the_faulty_node(
    tmp_path: Path, fault: str, rank: int, culprits: list[str], kind: str
) -> None:
    flags = ("--slow-factor", "4", "--capture-rounds", "3", "--round-interval-seconds", "5")
    from_store, from_run_dir = run_fault(tmp_path, fault, rank, flags if fault == "slow-rank" else ())
    for verdict in (from_store, from_run_dir):
        if verdict is from_run_dir and fault == "p2p-stuck" and verdict["verdict"] == "inconclusive":
            # The run directory alone has no capture clock: the agent's request came 3 s into the hang (the
            # FR op is not overdue yet) and, under load, its stacks can catch the pipeline ends mid-way (a
            # 5/3 split of healthy-looking clusters). Then it must name nobody; the agent's store, which
            # has the capture time, must always be right (asserted above).
            assert not verdict["suspect_nodes"] and not verdict["culprit_nodes"], verdict
            continue
        assert verdict["verdict"] == kind, verdict
        if fault == "p2p-stuck":
            assert culprits[0] in verdict["suspect_nodes"], verdict
            # Both ends of the lost message, or (when the capture shows which end stopped first) the sender
            # that skipped it alone; never a node outside the pair.
            assert culprits[0] in verdict["culprit_nodes"] and set(verdict["culprit_nodes"]) <= set(culprits), verdict
        else:
            assert set(culprits) <= set(verdict["suspect_nodes"]), verdict
            assert verdict["culprit_nodes"] == culprits, verdict
        assert rank in verdict["culprit_ranks"], verdict
