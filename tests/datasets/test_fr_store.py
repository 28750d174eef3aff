"""Raw Flight Recorder dumps kept in the store by the agent, and read back for ``diagnose STORE``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rankscope.analytics import diagnose
from rankscope.datasets.domain.flight_recorder import DUMP_TIME_KEY
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.datasets.readers.fr_store import read_fr_captures
from rankscope.datasets.store.fr_dumps import ARTIFACTS, keep_dump
from rankscope.datasets.store.store import Store

T0, T1 = 1_796_150_000.0, 1_796_150_030.0  # the agent's capture times (after the hook's dumps)


def _keep(root: Path, src: Path, when: float, job: str = "j") -> list[dict]:
    rows = []
    for path in sorted(src.glob("*rank*.json")):
        rank = int(path.stem.rsplit("rank", 1)[1].lstrip("_"))
        rows.append(keep_dump(root, path, job=job, capture_time=when, rank=rank, node=f"host-{rank}", pid=100 + rank))
    Store(root, create=True).write("fr_dumps", rows)
    return rows


def test_kept_dumps_are_the_hooks_bytes_and_diagnose_reads_the_latest_capture(tmp_path: Path, fr_gloo: Path) -> None:
    root = tmp_path / "store"
    _keep(root, fr_gloo / "healthy", T0)
    rows = _keep(root, fr_gloo / "hang", T1)
    src = fr_gloo / "hang" / "fr_rank3.json"
    row = next(r for r in rows if r["rank"] == 3)
    kept = root / row["path"]
    assert row["path"].startswith(f"{ARTIFACTS}/job=j/capture=") and row["format"] == "fr-json"
    assert kept.read_bytes() == src.read_bytes() and row["size_bytes"] == src.stat().st_size
    assert row["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    dumps, notes, nodes = read_fr_captures(Store(root), "j")
    assert notes == [] and nodes == {r: f"host-{r}" for r in range(4)}
    assert sorted({d.capture for d in dumps}) == [0, 1] and len(dumps) == 8
    latest = [d for d in dumps if d.capture == 1]
    own = {r: json.loads((fr_gloo / "hang" / f"fr_rank{r}.json").read_text())[DUMP_TIME_KEY] for r in range(4)}
    assert {d.rank: d.dump_time_ns for d in latest} == own  # the hook's own dump time wins over the capture's
    inputs = load_inputs(root)
    assert inputs.job == "j" and len(inputs.fr_dumps) == 8
    v = diagnose(inputs, sources=("flight_recorder",))
    assert v.verdict == "hang" and v.culprit_ranks == (3,) and v.culprit_nodes == ("host-3",)


def test_the_capture_time_stands_in_for_a_dump_without_one(tmp_path: Path, probe_dir: Path) -> None:
    """The probe's dumps carry no time: the agent's capture time is their clock (here 30 s after the hang)."""
    root = tmp_path / "store"
    stuck = 1_795_960_016.5  # the probe's stuck all_reduce was issued at ...016.497
    _keep(root, probe_dir / "fr", stuck + 30)
    dumps, _, _ = read_fr_captures(Store(root), "j")
    assert {d.dump_time_ns for d in dumps} == {int((stuck + 30) * 1e9)}
    v = diagnose(load_inputs(root), sources=("flight_recorder",))
    assert v.verdict == "hang" and v.culprit_ranks == (3,)


def test_an_unreadable_kept_dump_is_a_note_and_older_incidents_are_dropped(tmp_path: Path, fr_gloo: Path) -> None:
    root = tmp_path / "store"
    _keep(root, fr_gloo / "healthy", T0)
    rows = _keep(root, fr_gloo / "hang", T1)
    (root / rows[0]["path"]).write_bytes(b"{not json")
    dumps, notes, _ = read_fr_captures(Store(root), "j", not_before=T1 - 1)
    assert {d.capture for d in dumps} == {0} and sorted(d.rank for d in dumps) == [1, 2, 3]
    assert any("before the latest incident" in n for n in notes) and any("unreadable" in n for n in notes)
