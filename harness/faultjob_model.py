"""The fault job's model and data: a two-stage transformer split over TP, PP and DP, and a seeded token stream.

Stage 0 = embedding + block, stage 1 = block + head. Each block's attention heads and MLP are split over
the TP group (column-parallel then row-parallel linears with an all-reduce). The data is a seeded copy
task (predict the previous token); sample ``i`` is the same on every run, so a job resumed from a
checkpoint at step N reads exactly the batches it would have read.
"""

from __future__ import annotations

import math
from typing import Any

TP, PP = 2, 2
VOCAB, D_MODEL, HEADS, FFN = 64, 32, 2, 64


def build(torch: Any, pp_r: int, tp_r: int, tp_group: Any) -> Any:
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


def loader(torch: Any, args: Any, dp_r: int, stall: Any, first_step: int = 0) -> Any:
    """This DP replica's batches from ``first_step`` on; ``stall(step)`` runs in the worker for each sample
    (where a DataLoader-stall fault hangs)."""
    from torch.utils.data import DataLoader, Dataset

    offset = first_step * args.batch_size

    class Tokens(Dataset):
        """Seeded synthetic copy task: predict the previous token."""

        def __len__(self) -> int:
            return 10**9

        def __getitem__(self, i: int) -> Any:
            i += offset
            stall(i // args.batch_size)
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
