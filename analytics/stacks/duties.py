"""Rank 0's own duties: code the main process runs alone (``if rank == 0:``) while the job waits on it.

Evaluation, logging, metrics, checkpoints written by rank 0 alone and data preparation make every other
rank wait in its next collective by design. Stacks show that exactly as they show rank 0 stuck in that
code, so rank 0 alone in code no other rank ran is no evidence against its machine: neither a slow
machine (fail-slow) nor a faulty one (hang).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from rankscope.analytics.stacks.facts import StackFacts

MODEL_CODE = frozenset({"forward", "_call_impl", "_wrapped_call_impl", "backward", "_engine_run_backward"})
"""Frames of model compute (every rank runs them; the others may just never be caught there)."""

DUTY_STATES = frozenset({"compute", "io"})
"""States rank 0's own duties leave it in: working, reading or writing. A device sync (a stuck GPU), a data
loader wait (every rank iterates its own loader), a wait on its checkpoint writer or on a lock or queue (on
another thread or process of its own, which may have died or hung) are not duties: rank 0 in them is judged
like any rank, and so is rank 0 whose child process is stuck."""


def main_process_duty(facts: StackFacts, culprits: Sequence[int], flagged: Collection[int]) -> str:
    """A frame rank 0 ran in the ``flagged`` snapshots that no other rank ran in any snapshot, when rank 0
    alone is the culprit ("" otherwise). Where rank 0 is in model compute, only a caller of it counts, and only
    one in a function no other rank ran at all (rank 0's ``evaluate()``, not the training step)."""
    if tuple(culprits) != (0,):
        return ""
    own: set[str] = set()
    callers: set[str] = set()  # what calls model compute in rank 0's stacks
    others: set[str] = set()
    for a in facts.analyses:
        for c in a.clusters:
            if c.role != "trainer":
                continue
            if 0 in c.ranks and a.snapshot in flagged:
                model = next((i for i, k in enumerate(c.signature) if k.split("@")[0] in MODEL_CODE), None)
                if model is None:
                    own |= set(c.signature)
                else:  # model compute (forward, backward) every rank runs is never a duty by itself; what calls
                    callers |= set(c.signature[:model])  # it may be (evaluate() under `if rank == 0:`)
            if any(r != 0 for r in c.ranks):
                others |= set(c.signature)
    ran = {_function(k) for k in others}
    return min((own - others) | {k for k in callers if _function(k) not in ran}, default="")


def _function(key: str) -> str:
    """A frame key without its line: the function (``evaluate@train.py:40`` -> ``evaluate@train.py``). A rank
    that called the model from a function every rank runs, at another line (a training step caught in its
    forward while the others are in its backward), runs no code of its own."""
    head, _, line = key.rpartition(":")
    return head if head and line.isdigit() else key


def duty_words(how: str, duty: str) -> str:
    """Why rank 0's standing out in a moving job names nobody."""
    return (
        f"Rank 0 {how}, running code no other rank ran in any round ({duty}): the main process's own duties "
        "(logging, metrics, checkpoints, data preparation: `if rank == 0:`) that the job waits on by design, not a "
        "slower machine, and no step record shows the job slowing down. Nothing evicted; if the steps are slower "
        "than they should be, look there first."
    )


def stuck_duty_words(n: int, duty: str, state: str) -> str:
    """Why rank 0 alone in its own code in a job that does not move names nobody."""
    seen = "the snapshot" if n == 1 else f"all {n} snapshots"
    return (
        f"Rank 0 alone was in code no other rank ran in any snapshot ({duty}, {state}) while the others waited, in "
        f"{seen}: the main process's own duties (evaluation, logging, checkpoints, data preparation: `if rank == 0:`) "
        "that the job waits on by design. A long duty and a duty stuck for good look alike in stacks, and neither "
        "is a machine fault by itself (a stuck GPU shows a device wait): nothing evicted. If the job stays stuck "
        "longer than that duty should take, look at rank 0's duty first (its storage, network, logs), then take "
        "rounds again."
    )
