"""Real gloo Flight Recorder captures from an outside tester (tests/data/field/gloo_fr, see its README):
shapes that named the wrong machine, called a hang healthy or read folders as machines."""

from __future__ import annotations

import shutil
from pathlib import Path

from rankscope.analytics import diagnose as run_diagnose
from rankscope.config import CollectivesConfig, Config
from rankscope.datasets.loading.inputs import load_inputs

DATA = Path(__file__).resolve().parents[1] / "data" / "field" / "gloo_fr"


def _copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(DATA / name, dst)  # copytree keeps the files' modification times
    return dst


def test_a_rank_that_only_timed_out_first_is_not_evicted(tmp_path: Path) -> None:
    # torchrun names rank 0 the root cause (exitcode 1, no traceback); its own log says gloo timed out waiting
    # for a peer: a victim of the hang (rank 1 stalled), not a machine to evict
    v = run_diagnose(load_inputs(_copy(tmp_path, "c12_ringwrap_timeout_log")))
    assert v.verdict != "crash" and v.suspect_nodes == () and v.culprit_ranks == (), v.explain()
    assert any("timed out waiting" in r for r in v.reasons), v.reasons


def test_a_gloo_collective_mismatch_abort_is_a_code_fault(tmp_path: Path) -> None:
    # std::terminate's report of gloo::EnforceNotMet ("collective mismatch") on rank 2, then SIGABRT
    # gloo's size check fails on the rank whose buffer is the smaller: here the odd rank, in an outside tester's
    # capture (fieldcases15/16) rank 0, whose peer rank 1 had skipped an all_reduce. The rank that caught the
    # mismatch is said, never named a culprit: which rank went astray the error cannot tell.
    v = run_diagnose(load_inputs(_copy(tmp_path, "c08_size_mismatch_gloo_abort")))
    assert v.verdict == "mismatch" and v.suspect_nodes == () and v.culprit_ranks == (), v.explain()
    assert any("Rank(s) 2 failed first" in r and "disagreed on a collective" in r for r in v.reasons), v.reasons


def test_dumps_written_on_a_gloo_timeout_are_never_healthy(tmp_path: Path) -> None:
    # gloo retires the op that timed out as if it finished: dumps written on the timeout look idle
    inp = load_inputs(_copy(tmp_path, "c06_hang_timeout_dumps_flag"), layout="dp=4")
    v = run_diagnose(inp, Config(collectives=CollectivesConfig(dumped_on_timeout=True)))
    assert v.verdict == "inconclusive" and v.suspect_nodes == (), v.explain()
    assert any("rank(s) 3 left no dump" in r for r in v.reasons), v.reasons


def test_folders_repeating_the_same_ranks_are_captures_not_machines(tmp_path: Path) -> None:
    # step-10/ and step-20/ each hold rank_0..3: two captures of a moving job
    inp = load_inputs(_copy(tmp_path, "c16b_two_step_dumps_nonstandard_folders"))
    assert sorted({d.capture for d in inp.fr_dumps}) == [0, 1]
    assert all(d.capture == 1 for d in inp.fr_dumps if "step-20" in d.source_file)
    assert not any(n.startswith("step-") for n in inp.topology.node_names)
    v = run_diagnose(inp)
    assert v.verdict == "healthy" and v.suspect_nodes == (), v.explain()


def test_one_folder_holding_every_dump_is_not_a_machine_name(tmp_path: Path) -> None:
    src = _copy(tmp_path, "c16b_two_step_dumps_nonstandard_folders")
    shutil.rmtree(src / "step-10")
    inp = load_inputs(src)
    assert "step-20" not in inp.topology.node_names, inp.topology.node_names
