"""The Slurm backend against a real controller on this host (tests/recovery/slurm_cluster.sh).

munged, slurmctld and three slurmd (node1..node3, all localhost on their own ports) are started for this
module; a real batch job is submitted and the backend drains machines / requeues the job without them.
Skipped only when Debian's slurm-wlm and munge packages are not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rankscope.recovery.audit import JsonlAuditLog
from rankscope.recovery.backends.slurm import SlurmBackend
from rankscope.recovery.executor import execute
from rankscope.recovery.plan import Action, Plan

HERE = Path(__file__).resolve().parent
CLUSTER = HERE / "slurm_cluster.sh"
NEEDED = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "sinfo", "setpriv")
NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")

pytestmark = [
    pytest.mark.skipif(
        any(shutil.which(b) is None for b in NEEDED),
        reason="Debian's slurm-wlm and munge are not installed (apt-get install -y slurm-wlm munge)",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="the one-host Slurm cluster runs slurmd as root"),
]


@pytest.fixture(scope="module")
def slurm() -> Iterator[dict[str, str]]:
    d = tempfile.mkdtemp(prefix="rankscope-slurm-")
    os.chmod(d, 0o755)
    p = subprocess.run(
        ["bash", str(CLUSTER), "start", d, "3"], capture_output=True, text=True, timeout=120, check=False
    )
    env = {**os.environ, "SLURM_CONF": f"{d}/slurm.conf"}
    try:
        assert p.returncode == 0, f"slurm cluster did not start: {p.stderr}"
        out = Path(d, "out")
        out.mkdir(mode=0o777)
        out.chmod(0o777)
        script = out / "train.sh"
        script.write_text(
            '#!/bin/bash\necho "start $SLURM_JOB_NODELIST restarts=${SLURM_RESTART_COUNT:-0}"\nsleep 600\n'
        )
        script.chmod(0o755)
        yield {**env, "RANKSCOPE_TEST_DIR": d}
    finally:
        subprocess.run(["scancel", "--user=root"], env=env, capture_output=True, timeout=30, check=False)
        subprocess.run(["scancel", "--user=nobody"], env=env, capture_output=True, timeout=30, check=False)
        subprocess.run(["bash", str(CLUSTER), "stop", d], capture_output=True, timeout=60, check=False)
        shutil.rmtree(d, ignore_errors=True)


def _sh(env: dict[str, str], *argv: str) -> str:
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=30, check=True).stdout


def _wait(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _job(env: dict[str, str], job: str) -> dict[str, str]:
    text = _sh(env, "scontrol", "show", "job", "-o", job)
    return dict(re.findall(r"(\w+)=(\S*)", text))


def _nodes(env: dict[str, str], hostlist: str) -> set[str]:
    return set(_sh(env, "scontrol", "show", "hostnames", hostlist).split()) if hostlist not in ("", "(null)") else set()


def _node_state(env: dict[str, str], node: str) -> dict[str, str]:
    text = _sh(env, "scontrol", "show", "node", "-o", node)
    d = dict(re.findall(r"(\w+)=(\S*)", text))
    m = re.search(r"Reason=(.*?)(?: \[|$)", text)
    d["Reason"] = m.group(1) if m else ""
    return d


def _resume_all(env: dict[str, str]) -> None:
    for n in ("node1", "node2", "node3"):
        subprocess.run(
            ["scontrol", "update", f"NodeName={n}", "State=RESUME"],
            env=env,
            capture_output=True,
            timeout=30,
            check=False,
        )


def _submit(env: dict[str, str], backend: SlurmBackend, exclude: tuple[str, ...] = ()) -> str:
    d = env["RANKSCOPE_TEST_DIR"]
    step = backend.submit(
        f"{d}/out/train.sh", exclude=exclude, extra=["--requeue", "-N", "2", "-o", f"{d}/out/%j.log"], apply=True
    )
    assert step.outcome == "ok", step
    job = step.detail
    _wait(lambda: _job(env, job).get("JobState") == "RUNNING", f"job {job} to run")
    return job


def _plan(job: str, nodes: tuple[str, ...], incident: str) -> Plan:
    return Plan(
        job=f"slurm-{job}",
        incident=incident,
        category="machine",
        rule="machine-event",
        confidence=0.98,
        actions=(
            Action("evict", "Xid 79 (GPU has fallen off the bus)", nodes=nodes),
            Action("restart", "on the remaining machines", exclude=nodes),
        ),
        time=0.0,
    )


def _running_again(env: dict[str, str], job: str) -> None:
    """Wait for the requeued job to run. Slurm holds a requeued job back ~2 minutes (its BeginTime); the
    test moves that to now (again while the old allocation is still completing) instead of waiting."""

    def started() -> bool:
        info = _job(env, job)
        if info.get("JobState") == "PENDING":
            subprocess.run(
                ["scontrol", "update", f"JobId={job}", "StartTime=now"],
                env=env,
                capture_output=True,
                timeout=30,
                check=False,
            )
        return info.get("JobState") == "RUNNING"

    _wait(started, f"the requeued job {job} to run again", timeout=60)


def test_drain_then_requeue_on_a_real_controller(slurm: dict[str, str], tmp_path: Path) -> None:
    _resume_all(slurm)
    backend = SlurmBackend("0", env=slurm)
    job = _submit(slurm, backend)
    running = _nodes(slurm, _job(slurm, job)["NodeList"])
    victim = sorted(running)[-1]
    sb = SlurmBackend(job, mode="drain", env=slurm)
    plan = _plan(job, (victim,), "inc-drain")
    dry = execute(plan, sb, audit=JsonlAuditLog(tmp_path / "audit.jsonl"), lock_dir=tmp_path, apply=False)
    assert [s.outcome for s in dry.steps][:2] == ["dry-run", "dry-run"]
    assert dry.steps[0].command.startswith(f"scontrol update NodeName={victim} State=DRAIN 'Reason=rankscope inc-drain")
    assert _node_state(slurm, victim)["State"] in ("ALLOCATED", "MIXED")  # the dry run changed nothing

    rep = execute(plan, sb, audit=JsonlAuditLog(tmp_path / "audit.jsonl"), lock_dir=tmp_path, apply=True)
    assert rep.ok, rep.explain()
    st = _node_state(slurm, victim)
    assert "DRAIN" in st["State"] and "inc-drain" in st["Reason"], st
    _wait(lambda: _job(slurm, job).get("JobState") == "PENDING", "the job to be requeued")
    assert _job(slurm, job)["Restarts"] == "1"
    _running_again(slurm, job)
    now_on = _nodes(slurm, _job(slurm, job)["NodeList"])
    assert victim not in now_on and len(now_on) == 2

    again = execute(plan, sb, audit=JsonlAuditLog(tmp_path / "audit.jsonl"), lock_dir=tmp_path, apply=True)
    assert again.skipped and not again.steps  # idempotent: the same incident is not acted on twice
    assert _job(slurm, job)["Restarts"] == "1"
    subprocess.run(["scancel", job], env=slurm, timeout=30, check=False)


def test_user_without_drain_rights_falls_back_to_requeue_excluding(slurm: dict[str, str], tmp_path: Path) -> None:
    _resume_all(slurm)
    user = SlurmBackend("0", env=slurm, sbatch=(*NOBODY, "sbatch"))
    job = _submit(slurm, user)
    assert _job(slurm, job)["UserId"].startswith("nobody")
    victim = sorted(_nodes(slurm, _job(slurm, job)["NodeList"]))[0]
    sb = SlurmBackend(job, mode="auto", env=slurm, scontrol=(*NOBODY, "scontrol"))
    rep = execute(
        _plan(job, (victim,), "inc-user"), sb, audit=JsonlAuditLog(tmp_path / "a.jsonl"), lock_dir=tmp_path, apply=True
    )
    assert rep.ok, rep.explain()
    outcomes = [(s.outcome, s.command.split("scontrol ", 1)[-1].split(" ")[0]) for s in rep.steps]
    assert outcomes[0][0] == "noop" and "refused" in rep.steps[0].detail  # Slurm refused the drain
    assert [o[1] for o in outcomes[1:4]] == ["requeuehold", "update", "release"]
    assert "DRAIN" not in _node_state(slurm, victim)["State"]  # not drained: the user could not
    info = _job(slurm, job)
    assert _nodes(slurm, info["ExcNodeList"]) == {victim}
    _running_again(slurm, job)
    assert victim not in _nodes(slurm, _job(slurm, job)["NodeList"])

    # a second incident adds to the exclusion list instead of replacing it
    other = sorted(_nodes(slurm, _job(slurm, job)["NodeList"]))[0]
    rep2 = execute(
        _plan(job, (other,), "inc-user-2"),
        SlurmBackend(job, mode="requeue", env=slurm, scontrol=(*NOBODY, "scontrol")),
        audit=JsonlAuditLog(tmp_path / "a.jsonl"),
        lock_dir=tmp_path,
        apply=True,
    )
    assert rep2.ok, rep2.explain()
    assert _nodes(slurm, _job(slurm, job)["ExcNodeList"]) == {victim, other}
    subprocess.run(["scancel", job], env=slurm, timeout=30, check=False)


def test_fresh_submission_excludes_machines(slurm: dict[str, str]) -> None:
    _resume_all(slurm)
    backend = SlurmBackend("0", env=slurm)
    job = _submit(slurm, backend, exclude=("node1",))
    info = _job(slurm, job)
    assert _nodes(slurm, info["ExcNodeList"]) == {"node1"}
    assert _nodes(slurm, info["NodeList"]) == {"node2", "node3"}
    subprocess.run(["scancel", job], env=slurm, timeout=30, check=False)
