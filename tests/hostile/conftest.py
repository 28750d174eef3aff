"""Small seed inputs for the hostile-input tests, made at test time from the project's own generators and
small real captures (nothing hostile is committed: FIFOs, links, bombs and huge values are made in tmp_path)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOOK_RUN = REPO / "tests" / "data" / "stacks" / "hook_slow"  # a real hook run directory (8 ranks)


@pytest.fixture
def stack_dir(tmp_path: Path) -> Path:
    """A 16-rank synthetic compute hang as py-spy text dumps with a manifest."""
    from rankscope.harness.synthetic import generate_job

    return generate_job("tp=2,dp=8", fault="compute-hang", seed=3, dataloader_workers=0).write_dir(tmp_path / "job")


@pytest.fixture
def fr_dir(tmp_path: Path) -> Path:
    """Flight Recorder pickles of a 4-rank job where rank 2 never joined the last collective."""
    from rankscope.harness.synthetic_fr import generate_fr

    d = tmp_path / "fr"
    generate_fr("tp=2,dp=2", fault="missing", steps=1, seed=1).write(d, prefix="rank_")
    return d


@pytest.fixture
def hook_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(HOOK_RUN, d)
    return d


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside every input, with a secret nothing may show."""
    p = tmp_path / "outside" / "secret.txt"
    p.parent.mkdir()
    p.write_text("SECRET-CANARY-4b1d\n" * 3)
    return p
