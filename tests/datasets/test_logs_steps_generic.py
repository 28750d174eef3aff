"""Training steps as loops log them: Megatron's ``iteration N/M`` lines and the loop's own ``step N ... loss``
lines (torchtitan, DeepSpeed, plain Python logging), with their step time where the line gives one."""

from __future__ import annotations

import pytest

from rankscope.datasets.readers.logsteps import step_record


@pytest.mark.parametrize(
    "line,step,ms",
    [
        ("2026-12-03 03:29:02,170 INFO step 1 loss 2.3297 step_time 0.869s", 1, 869.0),
        ("step:  10  loss:  8.1234  memory: 12.34GiB(15.23%)  tps: 1,234", 10, None),  # torchtitan
        ("steps: 10 loss: 2.3011 iter time (s): 0.512 samples/sec: 31.2", 10, 512.0),  # DeepSpeed
        ("epoch 1 step 20/100 loss=0.5 time/step=120ms", 20, 120.0),
        ("global_step 77 loss 1.2", 77, None),
    ],
)
def test_a_loop_s_own_step_lines_are_steps(line: str, step: int, ms: float | None) -> None:
    rec = step_record(line)
    assert rec is not None and rec["step"] == step
    assert rec["elapsed_ms"] == pytest.approx(ms) if ms is not None else rec["elapsed_ms"] is None


def test_megatron_s_iteration_lines_keep_their_batch_size() -> None:
    line = (
        " [2026-12-03 02:28:21] iteration       83/    5000 | consumed samples:      10624 | elapsed time per "
        "iteration (ms): 339.7 | learning rate: 1.000E-03 | global batch size:   128 | lm loss: 2.320244E+00 |"
    )
    assert step_record(line) == {"type": "step", "step": 83, "elapsed_ms": 339.7, "batch": 128}


@pytest.mark.parametrize(
    "line",
    ["[Rank 0] step=10, skipped=0, lr=[0.1]", "Saving checkpoint at step 100", "data prep step 3 of 5", "lossy step 5"],
)
def test_lines_that_only_mention_a_step_are_not_steps(line: str) -> None:
    assert step_record(line) is None
