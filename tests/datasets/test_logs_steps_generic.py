"""Training steps as loops log them: Megatron's ``iteration N/M`` lines and the loop's own ``step N ... loss``
lines (torchtitan, DeepSpeed, plain Python logging), with their step time where the line gives one."""

from __future__ import annotations

import pytest

from rankscope.datasets.readers.logs import _STEP_LINE, _STEP_TIME


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
    m = _STEP_LINE.search(line)
    assert m is not None and int(m.group("it")) == step
    t = _STEP_TIME.search(line)
    got = None if t is None else float(t.group("t")) * (1.0 if (t.group("unit") or "s") == "ms" else 1e3)
    assert got == pytest.approx(ms) if ms is not None else got is None


@pytest.mark.parametrize(
    "line",
    ["[Rank 0] step=10, skipped=0, lr=[0.1]", "Saving checkpoint at step 100", "data prep step 3 of 5", "lossy step 5"],
)
def test_lines_that_only_mention_a_step_are_not_steps(line: str) -> None:
    assert not ("loss" in line.lower() and _STEP_LINE.search(line))
