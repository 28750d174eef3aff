"""The report tests' browser: Debian's chromium driven by Playwright (never a downloaded browser build).

The session fixture skips with a reason naming the missing piece only when Playwright is not installed, no
chromium binary exists, or it does not start. Screenshots go to $REPORT_ARTIFACTS_DIR (``.ci/run`` sets it
so CI keeps them), else to a directory under pytest's tmp dir.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    """Debian's chromium: $RANKSCOPE_CHROMIUM, /usr/bin/chromium, or chromium on PATH."""
    for cand in (os.environ.get("RANKSCOPE_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if cand and Path(cand).exists():
            return cand
    return None


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """A headless chromium, or a skip that says exactly what is missing."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        pytest.skip("browser tests need Playwright for Python: pip install -e '.[test]' (it downloads no browser)")
    exe = chromium_path()
    if exe is None:
        pytest.skip("browser tests need Debian's chromium: apt-get install -y chromium (or set RANKSCOPE_CHROMIUM)")
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        except Error as exc:
            pytest.skip(f"chromium at {exe} does not start: {str(exc).splitlines()[0]}")
        yield b
        b.close()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: $REPORT_ARTIFACTS_DIR, else a directory under pytest's tmp dir."""
    env = os.environ.get("REPORT_ARTIFACTS_DIR")
    path = Path(env) if env else tmp_path_factory.mktemp("report-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path
