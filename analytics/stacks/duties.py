"""The job's own duties: code the main process runs alone (``if rank == 0:``), or the first data-parallel replica
runs alone, while the job waits on it.

Evaluation, logging, metrics, checkpoints written by rank 0 alone and data preparation make every other
rank wait in its next collective by design. So does a checkpoint that data-parallel replica 0 writes alone:
Megatron-LM's and DeepSpeed's writers are the model-parallel ranks whose data-parallel rank is 0 (``if
mpu.get_data_parallel_rank() == 0:``), each saving its shard. Stacks show that exactly as they show those
ranks stuck in that code, so rank 0, or replica 0 as a whole, alone in code no other rank ran is no evidence
against its machines: neither a slow machine (fail-slow) nor a faulty one (hang).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

import numpy as np

from rankscope.analytics.stacks.facts import StackFacts
from rankscope.analytics.verdict import rank_ranges
from rankscope.datasets.domain.topology import Topology

MODEL_CODE = frozenset({"forward", "_call_impl", "_wrapped_call_impl", "backward", "_engine_run_backward"})
"""Frames of model compute (every rank runs them; the others may just never be caught there)."""

DUTY_STATES = frozenset({"compute", "io"})
"""States rank 0's own duties leave it in: working, reading or writing. A device sync (a stuck GPU), a data
loader wait (every rank iterates its own loader), a wait on its checkpoint writer or on a lock or queue (on
another thread or process of its own, which may have died or hung) are not duties: rank 0 in them is judged
like any rank, and so is rank 0 whose child process is stuck."""


def duty_ranks(topology: Topology) -> frozenset[int]:
    """The ranks that run the job's duties by design: data-parallel replica 0 (its model-parallel ranks: those
    whose data- and context-parallel coordinates are 0). Rank 0 alone in pure data parallelism."""
    c = topology.coords
    mask = np.ones(topology.world_size, dtype=bool)
    for dim in ("dp", "cp"):
        if dim in c:
            mask &= np.asarray(c[dim]) == 0
    return frozenset(int(r) for r in np.asarray(topology.ranks)[mask])


def main_process_duty(
    facts: StackFacts,
    culprits: Sequence[int],
    flagged: Collection[int],
    duty: Collection[int] = (0,),
    *,
    any_rank: bool = False,
) -> str:
    """A frame the culprits ran in the ``flagged`` snapshots that no other rank ran in any snapshot, when the
    culprits are rank 0 alone or exactly the ``duty`` ranks (:func:`duty_ranks`; "" otherwise). Where they are in
    model compute, only a caller of it counts, and only one in a function no other rank ran at all (rank 0's
    ``evaluate()``, not the training step).

    ``any_rank``: any one rank alone qualifies too, when every stack it was flagged in runs a logging or metrics
    library (:data:`DUTY_LIBRARIES`) among its innermost frames. In a job that moves, frameworks give the duty of
    logging to other ranks than 0 (torchtitan: the first rank of the last pipeline stage, which holds the loss;
    Megatron-LM: the last rank); a slower machine is caught in the code every rank runs, or in code of its own
    that is not such a library's (a rank given extra work)."""
    mine = set(culprits)
    standard = mine == {0} or mine == set(duty)
    if not mine or not (standard or (any_rank and len(mine) == 1)):
        return ""
    own: set[str] = set()
    callers: set[str] = set()  # what calls model compute in the culprits' stacks
    others: set[str] = set()
    for a in facts.analyses:
        for c in a.clusters:
            if c.role != "trainer":
                continue
            if a.snapshot in flagged and not mine.isdisjoint(c.ranks):
                if not standard and not any(DUTY_LIBRARIES.search(f) for f in c.representative[-_INNER:]):
                    return ""
                model = next((i for i, k in enumerate(c.signature) if k.split("@")[0] in MODEL_CODE), None)
                if model is None:
                    own |= set(c.signature)
                else:  # model compute (forward, backward) every rank runs is never a duty by itself; what calls
                    callers |= set(c.signature[:model])  # it may be (evaluate() under `if rank == 0:`)
            if any(r not in mine for r in c.ranks):
                others |= set(c.signature)
    ran = {_function(k) for k in others}
    return min((own - others) | {k for k in callers if _function(k) not in ran}, default="")


DUTY_LIBRARIES = re.compile(
    r"\((?:[^()]*/(?:site|dist)-packages/)?"
    r"(?:wandb|tensorboard|tensorboardX|mlflow|neptune|comet_ml|clearml|swanlab|dllogger|torch/utils/tensorboard)/"
)
"""Files of the logging and metrics libraries a rank runs as its job's duty (wandb's ``Run.log``, a TensorBoard
writer's flush), as a frame shows them: ``Run._log (wandb/sdk/wandb_run.py:1850)``, the package at the start of
the path or right under ``site-packages``. A checkpoint writer is not among them: every rank runs DCP's save, and
one rank alone slow in it has a slow disk or link."""


_INNER = 12  # the innermost frames a flagged stack's library is looked for in (a user's outer code may import it)


def duty_who(ranks: Collection[int]) -> str:
    """Who ran the duty, for the words: "Rank 0", or "Data-parallel replica 0 (ranks 0-7)"."""
    if len(set(ranks)) == 1:
        return f"Rank {next(iter(ranks))}"
    return f"Data-parallel replica 0 (ranks {rank_ranges(sorted(ranks))[:100]})"


def _function(key: str) -> str:
    """A frame key without its line: the function (``evaluate@train.py:40`` -> ``evaluate@train.py``). A rank
    that called the model from a function every rank runs, at another line (a training step caught in its
    forward while the others are in its backward), runs no code of its own."""
    head, _, line = key.rpartition(":")
    return head if head and line.isdigit() else key


def duty_words(how: str, duty: str, who: str = "Rank 0") -> str:
    """Why rank 0 (or replica 0: ``who``) standing out in a moving job names nobody."""
    return (
        f"{who} {how}, running code no other rank ran in any round ({duty}): the job's own duties (logging, "
        "metrics, checkpoints, data preparation: `if rank == 0:`, the rank a framework logs from, or a checkpoint "
        "replica 0 writes) that the job "
        "waits on by design, not a slower machine, and no step record shows the job slowing down. Nothing evicted; "
        "if the steps are slower than they should be, look there first."
    )


def stuck_duty_words(n: int, duty: str, state: str, who: str = "Rank 0") -> str:
    """Why rank 0 (or replica 0: ``who``) alone in its own code in a job that does not move names nobody."""
    seen = "the snapshot" if n == 1 else f"all {n} snapshots"
    lead = f"{who.lower()}'s duty" if who.startswith("Rank ") else "their duty"
    return (
        f"{who} alone was in code no other rank ran in any snapshot ({duty}, {state}) while the others waited, in "
        f"{seen}: the job's own duties (evaluation, logging, checkpoints, data preparation: `if rank == 0:`, or a "
        "checkpoint replica 0 writes) that the job waits on by design. A long duty and a duty stuck for good look "
        "alike in stacks, and neither is a machine fault by itself (a stuck GPU shows a device wait): nothing "
        f"evicted. If the job stays stuck longer than that duty should take, look at {lead} first (its storage, "
        "network, logs), then take rounds again."
    )
