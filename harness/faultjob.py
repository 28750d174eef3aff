"""A real, tiny 3D-parallel training job on CPU (gloo) with injectable faults.

Run it with torchrun (8 ranks = TP=2 x DP=2 x PP=2, Megatron order tp-cp-ep-dp-pp, so
``--layout tp=2,pp=2,dp=2 --gpus-per-node 2`` describes it; ranks 2k and 2k+1 form node-k)::

    RANKSCOPE_FAULT=compute-hang RANKSCOPE_FAULT_RANK=5 \\
    torchrun --standalone --nproc-per-node 8 -m rankscope.harness.faultjob --run-dir /tmp/run

The model (:mod:`.faultjob_model`) is a two-stage transformer: activations and their gradients travel
stage to stage with send/recv, TP all-reduces inside each block, gradients are all-reduced over the
DP group. Every rank has a DataLoader with worker processes. The in-process hook
(:mod:`rankscope.collectors.hook`) is installed, so the agent sees steps, stacks and FR dumps; rank 0
appends one line per step to ``RUN_DIR/progress.jsonl`` (step, start, end, generation, machine), and
each injected fault one line to ``RUN_DIR/faults.jsonl`` when it begins.

Checkpoints follow the local recovery backend's contract: every ``--ckpt-every`` steps (and at the
last step) each rank writes ``CKPT_ROOT/step-<N>/rank<r>.pt``, then after a barrier rank 0 writes the
``COMPLETE`` marker and keeps the newest two complete checkpoints; ``CKPT_ROOT`` is
``$RANKSCOPE_CKPT_ROOT`` (else ``RUN_DIR/ckpt``). With ``$RANKSCOPE_RESUME_FROM`` set to a complete
checkpoint, every rank loads its shard and training goes on from the next step with the same data.

Faults (environment): ``RANKSCOPE_FAULT`` = one of :data:`FAULTS`, ``RANKSCOPE_FAULT_STEP`` (first
faulty step, default 4), ``RANKSCOPE_FAULT_DELAY_S`` (slow-rank), bound either to a rank
(``RANKSCOPE_FAULT_RANK``) or to a machine: ``RANKSCOPE_FAULT_MACHINE=<name>`` hits the ranks running
on that machine (``$RANKSCOPE_MACHINE``, set by the local backend), local rank
``RANKSCOPE_FAULT_LOCAL_RANK`` (default 0: one bad GPU; ``all``: the whole machine), whichever global
ranks the machine holds in this launch, so the fault follows the machine, not the rank, across a
restart. ``RANKSCOPE_FAULT_SCHEDULE`` = a JSON list of such faults (``{"fault", "machine" or "rank",
"step", "local_rank", "delay_s"}``) injects several. Fault names are spelled as everywhere in
rankscope (``compute-hang``; the old ``compute_hang`` is accepted).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from rankscope.harness.faultjob_model import D_MODEL, PP, TP, VOCAB, build, loader
from rankscope.spine import atomic_write, atomic_write_with

FAULTS = ("none", "compute-hang", "dataloader-stall", "p2p-stuck", "slow-rank", "crash", "nan")
"""Injectable faults: hang in compute, stuck DataLoader worker, lost activation send, extra delay per
step, an uncaught exception, NaN gradients (hyphenated, like ``rankscope demo --fault``)."""


def fault_name(text: str) -> str:
    """``text`` in the one spelling (``slow_rank`` -> ``slow-rank``)."""
    return text.strip().replace("_", "-")


def command(
    *,
    nproc: int = 8,
    run_dir: str | os.PathLike[str],
    steps: int = 1_000_000,
    fault: str = "none",
    fault_rank: int = 0,
    fault_step: int = 4,
    delay_s: float = 2.0,
    step_sleep_s: float = 0.05,
    num_workers: int = 1,
    ranks_per_node: int = 2,
    monitor_interval_s: float = 0.5,
    master_port: int | None = None,
    extra_env: dict[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The torchrun argv and environment that start this job with one fault injected."""
    fault = fault_name(fault)
    if fault not in FAULTS:
        raise ValueError(f"fault={fault!r} is not one of {FAULTS}")
    rdzv = (
        ["--standalone"] if master_port is None else ["--master-addr", "127.0.0.1", "--master-port", str(master_port)]
    )
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *rdzv,
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--monitor-interval",
        str(monitor_interval_s),
        "-m",
        "rankscope.harness.faultjob",
        "--run-dir",
        str(run_dir),
        "--steps",
        str(steps),
        "--step-sleep-s",
        str(step_sleep_s),
        "--num-workers",
        str(num_workers),
        "--ranks-per-node",
        str(ranks_per_node),
    ]
    env = dict(os.environ)
    env.update(
        {
            "RANKSCOPE_FAULT": fault,
            "RANKSCOPE_FAULT_RANK": str(fault_rank),
            "RANKSCOPE_FAULT_STEP": str(fault_step),
            "RANKSCOPE_FAULT_DELAY_S": str(delay_s),
            "RANKSCOPE_RUN_DIR": str(run_dir),
            "TORCH_FR_BUFFER_SIZE": "2000",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra_env or {})
    return argv, env


def manifest(world_size: int, ranks_per_node: int, machines: Sequence[str] = ()) -> dict[str, Any]:
    """Which node each rank runs on (``machines`` in node-rank order when the launcher names them, else
    ``node-k``), and its TP/DP/PP coordinates."""
    dp = world_size // (TP * PP)
    names = list(machines) or [f"node-{k}" for k in range(-(-world_size // ranks_per_node))]
    return {
        "layout": f"tp={TP},pp={PP},dp={dp}",
        "gpus_per_node": ranks_per_node,
        "nodes": {str(r): names[r // ranks_per_node] for r in range(world_size)},
        "coords": {str(r): {"tp": r % TP, "dp": (r // TP) % dp, "pp": r // (TP * dp)} for r in range(world_size)},
    }


class Fault:
    """The faults this rank must inject, read from the environment (see the module docstring)."""

    def __init__(self, rank: int, local_rank: int = 0, machine: str = "", log: Path | None = None) -> None:
        self.rank, self.local_rank, self.machine, self.log = rank, local_rank, machine, log
        self._fired: set[int] = set()
        path = os.environ.get("RANKSCOPE_FAULT_SCHEDULE", "")
        if path:
            try:
                specs = json.loads(Path(path).read_text())
            except (OSError, ValueError) as exc:
                raise SystemExit(f"faultjob: RANKSCOPE_FAULT_SCHEDULE={path}: {exc}") from None
        else:
            specs = [
                {
                    "fault": os.environ.get("RANKSCOPE_FAULT", "none") or "none",
                    "rank": int(os.environ.get("RANKSCOPE_FAULT_RANK", "0")),
                    "machine": os.environ.get("RANKSCOPE_FAULT_MACHINE", ""),
                    "local_rank": os.environ.get("RANKSCOPE_FAULT_LOCAL_RANK", "0"),
                    "step": int(os.environ.get("RANKSCOPE_FAULT_STEP", "4")),
                    "delay_s": float(os.environ.get("RANKSCOPE_FAULT_DELAY_S", "2.0")),
                }
            ]
        for s in specs:
            s["fault"] = fault_name(str(s.get("fault", "none") or "none"))
            if s["fault"] not in FAULTS:
                raise SystemExit(f"faultjob: fault {s.get('fault')!r} is not one of {FAULTS}")
        self.specs = [s for s in specs if s.get("fault", "none") != "none" and self._mine(s)]
        self.kind = self.specs[0]["fault"] if self.specs else "none"
        self.delay_s = float(self.specs[0].get("delay_s", 2.0)) if self.specs else 0.0

    def _mine(self, spec: dict[str, Any]) -> bool:
        if spec.get("machine"):
            lr = str(spec.get("local_rank", "0"))
            return spec["machine"] == self.machine and (lr == "all" or int(lr) == self.local_rank)
        return int(spec.get("rank", 0)) == self.rank

    def active(self, kind: str, step: int) -> bool:
        for i, s in enumerate(self.specs):
            if s["fault"] == kind and step >= int(s.get("step", 4)):
                self.delay_s = float(s.get("delay_s", 2.0))
                if i not in self._fired:
                    self._fired.add(i)
                    self._record(kind, step)
                return True
        return False

    def _record(self, kind: str, step: int) -> None:
        """One line per injection in RUN_DIR/faults.jsonl: when the fault began (benchmarks time from it)."""
        if self.log is None:
            return
        line = {"fault": kind, "rank": self.rank, "machine": self.machine, "step": step, "time": time.time(),
                "gen": os.environ.get("RANKSCOPE_GENERATION", "1")}  # fmt: skip
        with open(self.log, "a") as fh:
            fh.write(json.dumps(line) + "\n")


# -- injected faults: named functions so their frames are recognizable in stacks --------------
def injected_compute_hang() -> None:
    """Spin in 'compute' forever (small matmuls with short sleeps, so other ranks still get CPU)."""
    import torch

    x = torch.randn(64, 64)
    while True:
        x = torch.tanh(x @ x)
        time.sleep(0.02)


def injected_dataloader_stall() -> None:
    """A DataLoader worker stuck reading a sample (a hung filesystem read)."""
    while True:
        time.sleep(0.5)


def injected_slow_step(delay_s: float) -> None:
    time.sleep(delay_s)


def injected_crash(rank: int, step: int, machine: str = "") -> None:
    where = f" (machine {machine})" if machine else ""
    raise RuntimeError(f"injected crash on rank {rank}{where} at step {step}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rankscope.harness.faultjob",
        description=__doc__.split("\n")[0],
        epilog="Faults: RANKSCOPE_FAULT=" + "|".join(FAULTS) + " with RANKSCOPE_FAULT_RANK and RANKSCOPE_FAULT_STEP.",
    )
    p.add_argument("--run-dir", default=os.environ.get("RANKSCOPE_RUN_DIR", "/tmp/rankscope-faultjob"))
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-sleep-s", type=float, default=0.0, help="idle time per step (keeps CPU use low)")
    p.add_argument("--pg-timeout-s", type=float, default=600.0)
    p.add_argument("--ranks-per-node", type=int, default=2)
    args = p.parse_args(argv)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    machine = os.environ.get("RANKSCOPE_MACHINE", "")
    machines = [m for m in os.environ.get("RANKSCOPE_MACHINES", "").split(",") if m]
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", args.ranks_per_node)) if machines else args.ranks_per_node
    os.environ.setdefault("RANKSCOPE_RANKS_PER_NODE", str(per_node))
    os.environ.setdefault("RANKSCOPE_RUN_DIR", args.run_dir)
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_root = Path(os.environ.get("RANKSCOPE_CKPT_ROOT") or run_dir / "ckpt")
    generation = os.environ.get("RANKSCOPE_GENERATION", "1")
    if rank == 0:
        atomic_write(
            run_dir / "manifest.json", json.dumps(manifest(world, per_node, machines), indent=1), durable=False
        )

    from rankscope.collectors import hook

    hook.install(run_dir=run_dir)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if world % (TP * PP):
        raise SystemExit(f"faultjob: world size {world} is not a multiple of tp*pp={TP * PP}")
    dp = world // (TP * PP)
    tp_r, dp_r, pp_r = rank % TP, (rank // TP) % dp, rank // (TP * dp)
    fault = Fault(rank, local_rank, machine, run_dir / "faults.jsonl")

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout_s))
    groups: dict[str, Any] = {}
    members: dict[str, list[int]] = {}
    # every rank creates every group in the same order (a torch.distributed requirement)
    for kind in ("tp", "dp", "pp"):
        for ranks in _groups_of(kind, world, dp):
            g = dist.new_group(ranks, group_desc=kind, timeout=timedelta(seconds=args.pg_timeout_s))
            if rank in ranks:
                groups[kind], members[kind] = g, ranks
    hook.record_groups(members)

    model = build(torch, pp_r, tp_r, groups["tp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    first = _resume(torch, rank, model, opt)

    def stall(step: int) -> None:
        if fault.active("dataloader-stall", step):
            injected_dataloader_stall()

    batches = loader(torch, args, dp_r, stall, first)
    peer = members["pp"][1 - pp_r]
    act_shape = (args.batch_size, args.seq_len, D_MODEL)
    progress = open(run_dir / "progress.jsonl", "a", buffering=1) if rank == 0 else None  # noqa: SIM115

    it = iter(batches)
    for step in range(first, args.steps):
        t0 = time.time()
        tokens, targets = next(it)
        if fault.active("compute-hang", step):
            injected_compute_hang()
        if fault.active("slow-rank", step):
            injected_slow_step(fault.delay_s)
        if fault.active("crash", step):
            injected_crash(rank, step, machine)
        skip_send = fault.active("p2p-stuck", step)
        loss_val = None
        if pp_r == 0:
            out = model(tokens)
            if not skip_send:
                dist.send(out.detach().contiguous(), dst=peer, group=groups["pp"])
            grad = torch.empty(act_shape)
            dist.recv(grad, src=peer, group=groups["pp"])
            out.backward(grad)
        else:
            act = torch.empty(act_shape)
            dist.recv(act, src=peer, group=groups["pp"])
            act.requires_grad_(True)
            logits = model(act)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
            loss.backward()
            if not skip_send:
                assert act.grad is not None  # backward() filled it
                dist.send(act.grad.contiguous(), dst=peer, group=groups["pp"])
            loss_val = float(loss.detach())
        if fault.active("nan", step):
            for prm in model.parameters():
                prm.grad.fill_(float("nan"))
        grads = [prm.grad for prm in model.parameters()]
        local_norm = float(torch.sqrt(sum((g.float() ** 2).sum() for g in grads)))
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=groups["dp"])
        flat /= dp
        off = 0
        for g in grads:
            g.copy_(flat[off : off + g.numel()].view_as(g))
            off += g.numel()
        opt.step()
        opt.zero_grad(set_to_none=False)
        if args.ckpt_every and step and (step % args.ckpt_every == 0 or step == args.steps - 1):
            _checkpoint(torch, dist, ckpt_root, rank, world, step, model, opt)
        if args.step_sleep_s:
            time.sleep(args.step_sleep_s)
        hook.log_step(step, loss=loss_val, grad_norm=local_norm, step_time_seconds=time.time() - t0)
        if progress is not None:
            line = {"step": step, "start": t0, "end": time.time(), "gen": generation, "machine": machine}
            progress.write(json.dumps(line) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    if progress is not None:
        progress.write(json.dumps({"done": args.steps, "end": time.time(), "gen": generation}) + "\n")
        progress.close()
    return 0


def _groups_of(kind: str, world: int, dp: int) -> list[list[int]]:
    ranks = range(world)
    coord = {"tp": lambda r: r % TP, "dp": lambda r: (r // TP) % dp, "pp": lambda r: r // (TP * dp)}
    others = [k for k in ("tp", "dp", "pp") if k != kind]
    out: dict[tuple[int, ...], list[int]] = {}
    for r in ranks:
        out.setdefault(tuple(coord[k](r) for k in others), []).append(r)
    return list(out.values())


def _checkpoint(torch: Any, dist: Any, root: Path, rank: int, world: int, step: int, model: Any, opt: Any) -> None:
    """Every rank writes its shard of ``step-<N>/``; after a barrier rank 0 marks it COMPLETE and keeps the
    newest two complete checkpoints (older ones, and partial ones older than the newest, are removed)."""
    d = root / f"step-{step:08d}"
    d.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "world_size": world, "model": model.state_dict(), "opt": opt.state_dict()}
    atomic_write_with(d / f"rank{rank}.pt", lambda fh: torch.save(state, fh), durable=False)
    dist.barrier()
    if rank != 0:
        return
    atomic_write(d / "COMPLETE", json.dumps({"step": step, "world_size": world, "time": time.time()}), durable=False)
    steps = sorted((int(p.name[5:]), p) for p in root.glob("step-*") if p.name[5:].isdigit())
    complete = [s for s, p in steps if (p / "COMPLETE").is_file()]
    keep = set(complete[-2:])
    for s, path in steps:
        if s not in keep and s < max(keep):
            shutil.rmtree(path, ignore_errors=True)


def _resume(torch: Any, rank: int, model: Any, opt: Any) -> int:
    """Load this rank's shard of ``$RANKSCOPE_RESUME_FROM`` (if set); the first step to run."""
    resume = os.environ.get("RANKSCOPE_RESUME_FROM", "")
    if not resume:
        return 0
    path = Path(resume) / f"rank{rank}.pt"
    if not (Path(resume) / "COMPLETE").is_file():
        raise SystemExit(f"faultjob: {resume} is not a complete checkpoint (no COMPLETE marker)")
    try:
        state = torch.load(path, weights_only=True)
    except (OSError, RuntimeError) as exc:
        raise SystemExit(f"faultjob: cannot resume rank {rank} from {path} ({exc})") from None
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return int(state["step"]) + 1


if __name__ == "__main__":
    sys.exit(main())
