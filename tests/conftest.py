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
