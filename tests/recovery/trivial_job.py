"""A trivial gloo training loop for the local backend's tests: all_reduce steps, checkpoints, resume.

Launched by torchrun, one torchrun per simulated machine (``--nnodes``/``--node-rank``). Reads:
RANKSCOPE_MACHINE (the machine this rank runs on), RANKSCOPE_CKPT_ROOT (where step-N/ checkpoints go),
RANKSCOPE_RESUME_FROM (a checkpoint directory to resume from, or empty). A machine-bound fault:
TRIVIAL_FAULT_MACHINE=name and TRIVIAL_FAULT_STEP=N make every rank on that machine fail at step N, the
way a GPU that fell off the bus does, whichever ranks the machine holds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--ckpt-every", type=int, default=3)
    ap.add_argument("--step-seconds", type=float, default=0.05)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    machine = os.environ.get("RANKSCOPE_MACHINE", "?")
    root = Path(os.environ["RANKSCOPE_CKPT_ROOT"])
    resume = os.environ.get("RANKSCOPE_RESUME_FROM", "")
    start, total = 0, 0.0
    if resume:
        state = json.loads((Path(resume) / "state.json").read_text())
        start, total = int(state["step"]), float(state["total"])
    fault_machine = os.environ.get("TRIVIAL_FAULT_MACHINE", "")
    fault_step = int(os.environ.get("TRIVIAL_FAULT_STEP", "-1"))
    log = root.parent / "progress.log"
    for step in range(start + 1, args.steps + 1):
        if machine == fault_machine and step == fault_step:
            print(
                f"[rank{rank}]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)
        t = torch.ones(1)
        dist.all_reduce(t)
        total += float(t.item())
        time.sleep(args.step_seconds)
        if rank == 0:
            with open(log, "a") as f:
                f.write(f"{step} {world} {machine} {os.environ.get('RANKSCOPE_GENERATION', '0')}\n")
        if step % args.ckpt_every == 0 or step == args.steps:
            d = root / f"step-{step:08d}"
            if rank == 0:
                d.mkdir(parents=True, exist_ok=True)
                (d / "state.json").write_text(json.dumps({"step": step, "total": total}))
            dist.barrier()
            if rank == 0:
                (d / "COMPLETE").write_text("")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
