"""``py-spy dump --native`` interleaves compiled frames (a shared object, no line) with the Python frames: the
state and the signature are decided on the Python frames, and the index of the deciding frame still points
into the whole stack (for display)."""

from __future__ import annotations

from rankscope.analytics.stacks.frames import classify, is_native_frame, python_view, signature
from rankscope.datasets.domain.stacks import Frame

PY = (
    Frame("_engine_run_backward", "torch/autograd/graph.py", 979),
    Frame("backward", "torch/autograd/__init__.py", 395),
    Frame("train_step", "train.py", 73),
)


def _native(lib: str) -> tuple[Frame, ...]:
    return (
        Frame("0x?", "libc.so.6"),
        Frame("pthread_cond_wait", "libc.so.6"),
        Frame("std::condition_variable::wait", lib),
        Frame("c10d::Reducer::finalize_backward", "libtorch_cpu.so"),
        Frame("THPEngine_run_backward", "libtorch_python.so"),
    )


def test_native_frames_are_told_from_python_ones() -> None:
    assert is_native_frame(Frame("pthread_cond_wait", "libc.so.6"))
    assert not is_native_frame(Frame("backward", "torch/autograd/__init__.py", 395))
    assert not is_native_frame(Frame("<module>", "train.py"))  # a Python file without a line
    assert not is_native_frame(Frame("_find_and_load", "<frozen importlib._bootstrap>"))


def test_a_native_stack_is_classified_and_compared_on_its_python_frames() -> None:
    mixed = (*_native("libstdc++.so.6.0.30"), *PY)
    state, i = classify(mixed)
    assert (state, mixed[i].function) == ("backward", "_engine_run_backward")
    assert classify(PY)[0] == "backward"
    other_build = (*_native("libstdc++.so.6.0.32"), *PY)  # another node's library version
    assert signature(mixed) == signature(other_build) == signature(PY)
    view, index = python_view(mixed)
    assert tuple(view) == PY and index == (5, 6, 7)


def test_a_stack_of_native_frames_only_is_kept_whole() -> None:
    only = _native("libstdc++.so.6.0.30")
    assert python_view(only) == (only, None)
    assert classify(only)[0] == "compute" and len(signature(only)) == len(only)
