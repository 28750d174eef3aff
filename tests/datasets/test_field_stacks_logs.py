"""Real stack and log captures from an outside tester (tests/data/field/stacks_logs, see its README): folders
and log names read as machines, a phantom rank from a --log-dir tree, a healthy job voted fail-slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankscope.analytics import diagnose as run_diagnose
from rankscope.datasets.loading.inputs import load_inputs

DATA = Path(__file__).resolve().parents[1] / "data" / "field" / "stacks_logs"


def test_a_dated_dump_folder_is_not_a_machine() -> None:
    inp = load_inputs(DATA / "c06_dl_hang_json_workers_datefolder", gpus_per_node=1)
    assert not any("2026" in n for n in inp.topology.node_names), inp.topology.node_names
    v = run_diagnose(inp)
    assert v.verdict == "hang" and v.culprit_ranks == (1,), v.explain()
    assert any("not taken for machine names" in n for n in inp.notes), inp.notes


@pytest.mark.parametrize(
    "case, culprit",
    [
        ("c2x_exit3_r3_console_logdir", 3),  # a single-node log-dir tree adds no rank; a console name is no machine
        ("c2x_valueerror_r2_record_console_logdir", 2),  # a console and a log-dir tree of one torchrun: one launcher
    ],
)
def test_a_console_and_a_single_node_log_dir_tree_are_one_launcher_of_the_job_s_ranks(case: str, culprit: int) -> None:
    inp = load_inputs(DATA / case, gpus_per_node=4)
    assert inp.topology.world_size == 4, inp.notes
    v = run_diagnose(inp)
    assert v.verdict == "crash" and v.culprit_ranks == (culprit,), v.explain()
    assert "trainer-console" not in v.suspect_nodes and not any(n.startswith("logdir:") for n in v.suspect_nodes)


def test_a_healthy_job_dumped_rank_by_rank_three_times_is_not_fail_slow() -> None:
    v = run_diagnose(load_inputs(DATA / "c38_healthy8_3rounds_json_hosts", gpus_per_node=2))
    assert v.verdict == "healthy" and v.suspect_nodes == () and v.culprit_ranks == (), v.explain()
    assert any("fewer than the 5" in r for r in v.reasons), v.reasons


def test_a_gloo_hang_in_logs_alone_points_at_the_silent_rank_in_words() -> None:
    inp = load_inputs(DATA / "c34_logs_alone_hang_timeout", gpus_per_node=4)
    assert inp.topology.world_size == 4 and "torchrun-logs" not in inp.topology.node_names
    v = run_diagnose(inp)
    assert v.verdict == "inconclusive" and v.suspect_nodes == () and v.culprit_ranks == (), v.explain()
    assert any("rank(s) 2 printed no gloo timeout" in r for r in v.reasons), v.reasons


def test_untimed_failures_still_tell_the_one_that_is_not_a_cascade() -> None:
    v = run_diagnose(load_inputs(DATA / "c2x_valueerror_r2_norecord_logdir_only", gpus_per_node=4))
    assert v.verdict == "crash" and v.culprit_ranks == (2,), v.explain()
    assert v.confidence <= 0.7 and any("order is unknown" in r for r in v.reasons), v.reasons
