"""Shared fixtures: paths to the real shared data and small helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RANKSCOPE_SHARED_DIR") or REPO.parent / "shared")  # ../shared beside the checkout
PROBE = SHARED / "data" / "torch_gloo_hang_probe"


@pytest.fixture(scope="session")
def probe_dir() -> Path:
    if not PROBE.is_dir():
        pytest.skip(f"shared data not present at {PROBE}")
    return PROBE


FR_GLOO = REPO / "tests" / "data" / "fr_gloo"  # real gloo FR captures, small (see its README.md)


@pytest.fixture(scope="session")
def fr_gloo() -> Path:
    return FR_GLOO


@pytest.fixture()
def fr_hang_past_timeout(tmp_path: Path) -> Path:
    """``fr_gloo/hang`` (rank 3 missing from an all_reduce, dumped 8 s in) as a capture taken 70 s into the hang,
    past the job's 60 s collective timeout: the clocked hang the recovery executor acts on. Taken 8 s in, younger
    than that timeout, the same dumps are a hang on a premise (a long pause on rank 3 looks alike)."""
    import json

    out = tmp_path / "fr-hang-70s"
    out.mkdir()
    for f in sorted((FR_GLOO / "hang").iterdir()):
        raw = json.loads(f.read_text())
        raw["rankscope_dump_time_ns"] += 62_000_000_000
        (out / f.name).write_text(json.dumps(raw))
    return out
