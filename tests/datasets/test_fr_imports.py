"""The Flight Recorder path imports only the standard library and numpy (the topology): no pyarrow, no polars.

Run in a fresh interpreter: the test session itself has imported everything.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CODE = """
import sys
from rankscope.analytics import diagnose
from rankscope.datasets.loading.inputs import {loader}
v = diagnose({loader}(sys.argv[1], gpus_per_node=1), sources=("flight_recorder",))
heavy = sorted(m for m in ("pyarrow", "polars", "pandas", "duckdb", "typer", "rich") if m in sys.modules)
print(v.verdict, ",".join(heavy) or "-")
"""


def _run(loader: str, path: Path) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", CODE.format(loader=loader), str(path)], check=True, capture_output=True, text=True
    )
    return out.stdout.split()


def test_fr_directory_diagnosis_loads_no_pyarrow_or_polars(fr_gloo: Path) -> None:
    assert _run("load_fr_inputs", fr_gloo / "hang") == ["hang", "-"]


def test_dump_directory_fr_diagnosis_loads_no_pyarrow_or_polars(fr_gloo: Path) -> None:
    assert _run("load_inputs", fr_gloo / "hang") == ["hang", "-"]
