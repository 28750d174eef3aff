"""Flight Recorder dumps without a capture time, written by the watchdog on a timeout (torch's
TORCH_NCCL_DUMP_ON_TIMEOUT): the timeout itself is the time evidence, when the user or the logs say so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.analytics import collectives
from rankscope.config import CollectivesConfig
from rankscope.harness.synthetic_fr import generate_fr

ON_TIMEOUT = CollectivesConfig(dumped_on_timeout=True)
WIDE = "tp=8,pp=2,dp=8"  # 128 ranks on 16 machines of 8 GPUs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_timeout_dump_names_the_rank_that_never_joined(seed: int) -> None:
    syn = generate_fr(WIDE, fault="missing", seed=seed)  # no capture time, as FR itself writes dumps
    assert collectives.facts(syn.dumps(), syn.topology).status == "inconclusive"  # no clock: nobody
    a = collectives.facts(syn.dumps(), syn.topology, config=ON_TIMEOUT)
    assert a.status == "hang" and a.culprit_ranks == syn.truth.culprit_ranks
    v = collectives.verdict(a, syn.topology)
    assert set(v.culprit_nodes) == set(syn.topology.nodes_of(syn.truth.culprit_ranks))
    assert any("watchdog wrote on a timeout" in r for r in v.reasons)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dumps_of_a_running_job_wrongly_called_timeout_dumps_name_nobody(seed: int) -> None:
    """The wavefront of a running job ends at ranks one op behind, on most machines: not a machine fault."""
    syn = generate_fr(WIDE, fault="clean", seed=seed)
    v = collectives.verdict(collectives.facts(syn.dumps(), syn.topology, config=ON_TIMEOUT), syn.topology)
    assert v.verdict in ("inconclusive", "healthy") and not v.suspect_nodes and not v.culprit_nodes


WATCHDOG = (
    "[rank{r}]:[E1201 10:30:00.000000000 4242 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600012 milliseconds before timing out.\n"
)


def _diagnose(path: Path, *flags: str) -> dict:
    res = subprocess.run(
        [sys.executable, "-m", "rankscope", "diagnose", str(path), "--layout", WIDE, "--format", "json", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_cli_flag_and_a_watchdog_log_line_give_the_same_time_evidence(tmp_path: Path) -> None:
    syn = generate_fr(WIDE, fault="missing", seed=3)
    dumps = tmp_path / "dumps"
    syn.write(dumps)
    culprits = set(syn.topology.nodes_of(syn.truth.culprit_ranks))
    assert _diagnose(dumps)["verdict"] == "inconclusive"
    flagged = _diagnose(dumps, "--dumped-on-timeout")
    assert flagged["verdict"] == "hang" and set(flagged["culprit_nodes"]) == culprits
    waiting = [r for r in range(128) if r not in syn.truth.culprit_ranks][:3]
    (dumps / "train.log").write_text("".join(WATCHDOG.format(r=r) for r in waiting))
    from_logs = _diagnose(dumps)
    assert from_logs["verdict"] == "hang" and set(from_logs["culprit_nodes"]) == culprits


def test_two_captures_of_a_running_job_refute_the_timeout_assumption(tmp_path: Path) -> None:
    """Real gloo dumps of a healthy job 3.7 s apart, their capture times removed (as FR writes them): every
    waiting rank moved on between them, so they were not written by a watchdog on a timeout, whatever the flag
    says."""
    import shutil

    from rankscope.analytics import diagnose
    from rankscope.config import Config
    from rankscope.datasets.loading.inputs import load_inputs

    data = tmp_path / "mp8_healthy"
    shutil.copytree(Path(__file__).parents[1] / "data" / "fr_gloo" / "mp8_healthy", data)
    for f in data.glob("snapshot-*/*.json"):
        raw = json.loads(f.read_text())
        raw.pop("rankscope_dump_time_ns", None)
        f.write_text(json.dumps(raw))
    inputs = load_inputs(data, layout="tp=2,pp=2,dp=2", gpus_per_node=2)
    v = diagnose(inputs, Config(collectives=ON_TIMEOUT))
    assert v.verdict == "healthy" and not v.suspect_nodes
    assert any("every waiting rank advanced" in r for r in v.reasons)
