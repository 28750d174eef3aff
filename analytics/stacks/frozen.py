"""The ranks a frozen job waits for when no stack stands apart from its peers.

A job the time evidence shows stuck (no waiter released across the rounds) whose stacks all recur somewhere
in the job has no outlier cluster, yet a rank running its own code there (compute, I/O, a sleep) while every
other rank waits on its peers is what they wait for: in a pipeline without data-parallel replicas each stage's
stack is its own, so a stuck stage is one cluster among the stages' (every stage is as "common" as the others).
"""

from __future__ import annotations

from rankscope.analytics.stacks.facts import Progress
from rankscope.analytics.stacks.frames import WAIT_STATES
from rankscope.analytics.stacks.snapshot import SnapshotAnalysis
from rankscope.analytics.verdict import rank_ranges

_NOT_RUNNING = WAIT_STATES | {"startup", "empty", "failed"}


def frozen_runners(a: SnapshotAnalysis, progress: Progress | None, max_fraction: float = 0.25) -> tuple[int, ...]:
    """The trainers running their own code while every other trainer waits, when they are a few (at most
    ``max_fraction`` of the trainers with a stack, one at least) and sat at one place through the last pair of
    snapshots (a rank that moved on, a rank 0 preparing data or a node's local rank 0 at its own chores, is no
    stuck rank); () otherwise."""
    trainer = [c for c in a.clusters if c.role == "trainer" and c.ranks]
    runners = sorted({r for c in trainer if c.state not in _NOT_RUNNING for r in c.ranks})
    waiting = sum(len(c.ranks) for c in trainer if c.state in WAIT_STATES)
    if not runners or len(runners) > max(1, max_fraction * a.n_trainers) or waiting + len(runners) < a.n_trainers:
        return ()
    still = progress.still[-1] if progress is not None and progress.still else frozenset()
    return tuple(runners) if set(runners) <= still else ()


def frozen_runner_words(runners: tuple[int, ...]) -> str:
    return (
        f"Rank(s) {rank_ranges(runners)[:100]} run their own code while every other rank waits on its peers, through "
        "rounds in which no waiter was released: what the job waits for, though their stacks recur in the job."
    )
