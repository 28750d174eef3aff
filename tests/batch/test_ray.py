"""The Ray runner (one task per job, a local instance on 2 CPUs with a capped object store) gives the same
verdicts as the local runner on the same store."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankscope.batch.run import run_batch
from rankscope.config import BatchConfig, Config

from .conftest import clone_job, copy_store, verdict_rows

ray = pytest.importorskip("ray", reason="the [ray] extra is not installed (make test installs it)")

SAME = (
    "job",
    "incident_id",
    "input_fingerprint",
    "verdict",
    "confidence",
    "culprit_nodes",
    "suspect_nodes",
    "suspect_ranks",
    "incident_time",
    "incident_source",
    "summary",
)


def _verdicts(root: Path) -> list[tuple]:
    return sorted(tuple(str(r[c]) for c in SAME) for r in verdict_rows(root))


@pytest.mark.slow
def test_ray_and_local_runners_give_the_same_verdicts(real_store: Path, tmp_path: Path) -> None:
    for i in range(5):
        clone_job(real_store, "llama-a", f"clone-{i}")
    local = copy_store(real_store, tmp_path / "local")
    on_ray = copy_store(real_store, tmp_path / "ray")
    a = run_batch(local, Config(batch=BatchConfig(runner="local")))
    b = run_batch(on_ray, Config(batch=BatchConfig(runner="ray", workers=2)))
    assert (a.exit_code, b.exit_code) == (0, 0), (a.lines(), b.lines())
    assert b.runner == "ray" and b.workers == 2 and b.jobs_done == a.jobs_done == 8
    assert _verdicts(local) == _verdicts(on_ray) and len(_verdicts(local)) == 8
    assert not ray.is_initialized()  # the run started its own instance and shut it down
    again = run_batch(on_ray, Config(batch=BatchConfig(runner="ray", workers=2)))
    assert again.jobs_new == 0 and again.verdicts_written == 0  # nothing new: Ray is not even started
