"""A real, tiny 3D-parallel training job on CPU (gloo) with injectable faults.

Run it with torchrun (8 ranks = TP=2 x DP=2 x PP=2, Megatron order tp-cp-ep-dp-pp, so
``--layout tp=2,pp=2,dp=2 --gpus-per-node 2`` describes it; ranks 2k and 2k+1 form node-k)::

    RANKSCOPE_FAULT=compute-hang RANKSCOPE_FAULT_RANK=5 \\
    torchrun --standalone --nproc-per-node 8 -m rankscope.harness.faultjob --run-dir /tmp/run

The model is a two-stage transformer: stage 0 = embedding + block, stage 1 = block + head. Each
block's attention heads and MLP are split over the TP group (column-parallel then row-parallel
linears with an all-reduce), activations and their gradients travel stage to stage with
send/recv, and gradients are all-reduced over the DP group. Every rank has a DataLoader with
worker processes and writes a checkpoint every ``--ckpt-every`` steps. The in-process hook
(:mod:`rankscope.collectors.hook`) is installed, so the agent sees steps, stacks and FR dumps.

Faults (environment): ``RANKSCOPE_FAULT`` = one of :data:`FAULTS`, ``RANKSCOPE_FAULT_RANK`` (r),
``RANKSCOPE_FAULT_STEP`` (first faulty step, default 4), ``RANKSCOPE_FAULT_DELAY_S`` (slow-rank).
Fault names are spelled as everywhere in rankscope (``compute-hang``; the old ``compute_hang`` is accepted).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from rankscope.spine import atomic_write, atomic_write_with

FAULTS = ("none", "compute-hang", "dataloader-stall", "p2p-stuck", "slow-rank", "crash", "nan")
"""Injectable faults: hang in compute, stuck DataLoader worker, lost activation send, extra delay per
step, an uncaught exception, NaN gradients (hyphenated, like ``rankscope demo --fault``)."""


def fault_name(text: str) -> str:
    """``text`` in the one spelling (``slow_rank`` -> ``slow-rank``)."""
    return text.strip().replace("_", "-")


TP, PP = 2, 2
VOCAB, D_MODEL, HEADS, FFN = 64, 32, 2, 64


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


def manifest(world_size: int, ranks_per_node: int) -> dict[str, Any]:
    """Which simulated node each rank runs on, and its TP/DP/PP coordinates."""
    dp = world_size // (TP * PP)
    return {
        "layout": f"tp={TP},pp={PP},dp={dp}",
        "gpus_per_node": ranks_per_node,
        "nodes": {str(r): f"node-{r // ranks_per_node}" for r in range(world_size)},
        "coords": {str(r): {"tp": r % TP, "dp": (r // TP) % dp, "pp": r // (TP * dp)} for r in range(world_size)},
    }


class Fault:
    """The fault this rank must inject, read from the environment."""

    def __init__(self, rank: int) -> None:
        self.kind = fault_name(os.environ.get("RANKSCOPE_FAULT", "none") or "none")
        if self.kind not in FAULTS:
            raise SystemExit(f"faultjob: RANKSCOPE_FAULT={self.kind!r} is not one of {FAULTS}")
        self.rank = int(os.environ.get("RANKSCOPE_FAULT_RANK", "0"))
        self.step = int(os.environ.get("RANKSCOPE_FAULT_STEP", "4"))
        self.delay_s = float(os.environ.get("RANKSCOPE_FAULT_DELAY_S", "2.0"))
        self.mine = self.kind != "none" and rank == self.rank

    def active(self, kind: str, step: int) -> bool:
        return self.mine and self.kind == kind and step >= self.step


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


def injected_crash(rank: int, step: int) -> None:
    raise RuntimeError(f"injected crash on rank {rank} at step {step}")


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
    os.environ.setdefault("RANKSCOPE_RANKS_PER_NODE", str(args.ranks_per_node))
    os.environ.setdefault("RANKSCOPE_RUN_DIR", args.run_dir)
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        atomic_write(
            run_dir / "manifest.json", json.dumps(manifest(world, args.ranks_per_node), indent=1), durable=False
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
    fault = Fault(rank)

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout_s))
    groups: dict[str, Any] = {}
    members: dict[str, list[int]] = {}
    # every rank creates every group in the same order (a torch.distributed requirement)
    for kind in ("tp", "dp", "pp"):
        for ranks in _groups_of(kind, world, dp):
            g = dist.new_group(ranks, group_desc=kind)
            if rank in ranks:
                groups[kind], members[kind] = g, ranks
    hook.record_groups(members)

    model = _build(torch, pp_r, tp_r, groups["tp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = _loader(torch, args, dp_r, fault)
    peer = members["pp"][1 - pp_r]
    act_shape = (args.batch_size, args.seq_len, D_MODEL)

    it = iter(loader)
    for step in range(args.steps):
        t0 = time.time()
        tokens, targets = next(it)
        if fault.active("compute-hang", step):
            injected_compute_hang()
        if fault.active("slow-rank", step):
            injected_slow_step(fault.delay_s)
        if fault.active("crash", step):
            injected_crash(rank, step)
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
        if args.ckpt_every and step and step % args.ckpt_every == 0:
            _checkpoint(torch, run_dir, rank, step, model, opt)
        if args.step_sleep_s:
            time.sleep(args.step_sleep_s)
        hook.log_step(step, loss=loss_val, grad_norm=local_norm, step_time_seconds=time.time() - t0)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _groups_of(kind: str, world: int, dp: int) -> list[list[int]]:
    ranks = range(world)
    coord = {"tp": lambda r: r % TP, "dp": lambda r: (r // TP) % dp, "pp": lambda r: r // (TP * dp)}
    others = [k for k in ("tp", "dp", "pp") if k != kind]
    out: dict[tuple[int, ...], list[int]] = {}
    for r in ranks:
        out.setdefault(tuple(coord[k](r) for k in others), []).append(r)
    return list(out.values())


def _build(torch: Any, pp_r: int, tp_r: int, tp_group: Any) -> Any:
    """Stage ``pp_r`` of the model; full weights drawn from one seed per stage, then sliced per TP rank."""
    import torch.distributed as dist
    from torch import nn

    class CopyToTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            g = g.contiguous()
            dist.all_reduce(g, group=tp_group)
            return g

    class ReduceFromTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            x = x.contiguous()
            dist.all_reduce(x, group=tp_group)
            return x

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return g

    gen = torch.Generator().manual_seed(1234 + pp_r)

    def shard(out_f: int, in_f: int, dim: int) -> Any:
        w = torch.randn(out_f, in_f, generator=gen) / math.sqrt(in_f)
        return nn.Parameter(w.chunk(TP, dim=dim)[tp_r].clone())

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
            self.qkv = nn.ParameterList([shard(D_MODEL, D_MODEL, 0) for _ in range(3)])  # column-parallel
            self.proj = shard(D_MODEL, D_MODEL, 1)  # row-parallel
            self.fc1 = shard(FFN, D_MODEL, 0)
            self.fc2 = shard(D_MODEL, FFN, 1)

        def forward(self, x: Any) -> Any:
            h = CopyToTP.apply(self.ln1(x))
            q, k, v = (h @ w.t() for w in self.qkv)  # this rank's heads only
            att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)
            x = x + ReduceFromTP.apply((att @ v) @ self.proj.t())
            h = CopyToTP.apply(self.ln2(x))
            return x + ReduceFromTP.apply(torch.nn.functional.gelu(h @ self.fc1.t()) @ self.fc2.t())

    class Stage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = pp_r == 0
            if self.first:
                self.emb = nn.Parameter(torch.randn(VOCAB, D_MODEL, generator=gen) * 0.1)
            self.block = Block()
            if not self.first:
                self.ln = nn.LayerNorm(D_MODEL)
                self.head = nn.Parameter(torch.randn(VOCAB, D_MODEL, generator=gen) / math.sqrt(D_MODEL))

        def forward(self, x: Any) -> Any:
            if self.first:
                x = self.emb[x]
            x = self.block(x)
            return x if self.first else self.ln(x) @ self.head.t()

    return Stage()


def _loader(torch: Any, args: Any, dp_r: int, fault: Fault) -> Any:
    from torch.utils.data import DataLoader, Dataset

    class Tokens(Dataset):
        """Seeded synthetic copy task: predict the previous token."""

        def __len__(self) -> int:
            return 10**9

        def __getitem__(self, i: int) -> Any:
            if fault.active("dataloader-stall", i // args.batch_size):
                injected_dataloader_stall()
            g = torch.Generator().manual_seed(dp_r * 1_000_003 + i)
            x = torch.randint(0, VOCAB, (args.seq_len,), generator=g)
            return x, torch.roll(x, 1)

    return DataLoader(
        Tokens(),
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        prefetch_factor=2 if args.num_workers else None,
        persistent_workers=args.num_workers > 0,
    )


def _checkpoint(torch: Any, run_dir: Path, rank: int, step: int, model: Any, opt: Any) -> None:
    """Periodic checkpoint, written atomically (temp file + rename), newest two kept."""
    d = run_dir / "ckpt"
    d.mkdir(exist_ok=True)
    state = {"step": step, "model": model.state_dict(), "opt": opt.state_dict()}
    atomic_write_with(d / f"rank{rank}-step{step}.pt", lambda fh: torch.save(state, fh), durable=False)
    old = sorted(d.glob(f"rank{rank}-step*.pt"), key=lambda p: int(p.stem.rsplit("step", 1)[1]))
    for path in old[:-2]:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
