"""Fault scenarios of the synthetic generator: which catalog stack every process is in, per snapshot.

Each scenario assigns integer stack ids (indexes into the catalog of
:mod:`rankscope.harness.synthetic_frames`) with numpy over all ranks at once, and says which
ranks are to blame. Model-parallel *peers* of a rank are the ranks that share its dp and pp
coordinates (its TP group, widened by cp/ep when those are > 1).

For a fault at rank r of replica d (its dp coordinate) and stage s, hangs put the other replicas in
the DP gradient reduce-scatter, the later stages of d in ``recv_forward`` and the earlier ones in
``recv_backward``; then r and its peers are in the fault's own state (compute + TP all_reduce, one TP
all_reduce, send vs recv, DataLoader wait + batch broadcast, checkpoint wait vs barrier, or no dump).
``none`` and ``slow-rank`` are progressing jobs whose stacks change between snapshots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rankscope.datasets.domain.topology import DIMS, Topology
from rankscope.harness.synthetic_frames import StackDef

ATTN_COMPUTE = ("fwd-qkv", "fwd-core-attn", "fwd-attn-proj")
MLP_COMPUTE = ("fwd-mlp-fc1", "fwd-mlp-act", "fwd-mlp-fc2")
HEALTHY_WEIGHTS = {
    "compute": 0.40,
    "tp-comm": 0.15,
    "p2p": 0.15,
    "dp-sync": 0.15,
    "optimizer": 0.08,
    "data-wait": 0.04,
    "tp-data": 0.03,
}
"""How often a rank of a healthy progressing job is caught in each family of states."""
P2P_BY_STAGE = {  # which p2p ops a first / middle / last pipeline stage performs
    "first": ("send_forward", "recv_backward", "send_forward_recv_backward"),
    "last": ("recv_forward", "send_backward", "send_backward_recv_forward"),
    "middle": (
        "recv_forward",
        "recv_backward",
        "send_forward",
        "send_backward",
        "send_forward_recv_backward",
        "send_backward_recv_forward",
    ),
}
NOISE_FRACTION = 0.02
"""Share of ranks of a slow-rank job caught in some other plausible state in a snapshot."""


@dataclass
class Scenario:
    """Stack ids per snapshot for trainers (world,), DataLoader workers (world, W) and checkpoint processes."""

    trainer: list[np.ndarray]
    workers: list[np.ndarray]
    ckpt: list[np.ndarray]
    culprit_ranks: tuple[int, ...]
    affected_ranks: tuple[int, ...]
    missing_ranks: tuple[int, ...]
    expected_verdict: str
    fault_rank: int | None
    description: str


class _Ctx:
    """Per-job lookups shared by the scenarios."""

    def __init__(
        self, topo: Topology, defs: Sequence[StackDef], ids: Mapping[str, int], rng: np.random.Generator
    ) -> None:
        self.topo, self.defs, self.ids, self.rng = topo, defs, ids, rng
        self.world = topo.world_size
        self.pp = topo.sizes["pp"]
        self.stage = np.asarray(topo.coords["pp"])
        self.dp = np.asarray(topo.coords["dp"])
        self.mp_size = int(np.prod([topo.sizes[d] for d in DIMS if d not in ("dp", "pp")]))
        self.stage_class = np.where(self.stage == 0, 0, np.where(self.stage == self.pp - 1, 2, 1))
        self.families: dict[str, list[int]] = {}
        for i, d in enumerate(defs):
            self.families.setdefault(d.family, []).append(i)

    def id(self, name: str) -> int:
        return self.ids[name]

    def p2p(self, op: str, leaf: str = "batch") -> int:
        return self.ids[f"p2p-{op}" + ("" if leaf == "batch" else "-wait")]

    def peers_mask(self, r: int) -> np.ndarray:
        """Ranks sharing r's dp and pp coordinates (its model-parallel peers at the same stage, r included)."""
        return (self.dp == self.dp[r]) & (self.stage == self.stage[r])

    def p2p_members(self, stage_class: int) -> list[int]:
        ops = P2P_BY_STAGE[("first", "middle", "last")[stage_class]] if self.pp > 1 else ()
        return [self.p2p(op, leaf) for op in ops for leaf in ("batch", "wait")]

    def sample_healthy(self, idx: np.ndarray) -> np.ndarray:
        """A random plausible state of a progressing step for each rank in ``idx``."""
        fams = [f for f in HEALTHY_WEIGHTS if self._family_ok(f)]
        w = np.array([HEALTHY_WEIGHTS[f] for f in fams])
        pick = self.rng.choice(len(fams), size=idx.size, p=w / w.sum())
        out = np.empty(idx.size, dtype=np.int64)
        for j, f in enumerate(fams):
            sel = np.flatnonzero(pick == j)
            if not sel.size:
                continue
            if f == "p2p":
                for c in range(3):
                    sub = sel[self.stage_class[idx[sel]] == c]
                    if sub.size:
                        members = self.p2p_members(c)
                        out[sub] = np.asarray(members)[self.rng.integers(len(members), size=sub.size)]
            else:
                members = self.families[f]
                out[sel] = np.asarray(members)[self.rng.integers(len(members), size=sel.size)]
        return out

    def _family_ok(self, fam: str) -> bool:
        if fam in ("tp-comm", "tp-data"):
            return self.mp_size > 1
        if fam == "p2p":
            return self.pp > 1
        if fam == "dp-sync":
            return self.topo.sizes["dp"] > 1
        return True

    def pick_rank(self, fault: str) -> int:
        if fault == "dataloader-stall":  # only the first rank of a TP group reads data in Megatron
            cand = np.flatnonzero(np.all([self.topo.coords[d] == 0 for d in DIMS if d not in ("dp", "pp")], axis=0))
            return int(self.rng.choice(cand))
        return int(self.rng.integers(self.world))


def _stalled_pipeline(c: _Ctx, st: np.ndarray, r: int, lo: int, hi: int) -> None:
    """Replica of r waits on the stalled stages lo..hi: later stages in recv_forward, earlier in recv_backward."""
    rep = c.dp == c.dp[r]
    if c.pp > 1:
        st[rep & (c.stage > hi)] = c.p2p("recv_forward")
        st[rep & (c.stage < lo)] = c.p2p("recv_backward")


def build_scenario(
    topo: Topology,
    defs: Sequence[StackDef],
    ids: Mapping[str, int],
    rng: np.random.Generator,
    *,
    fault: str,
    fault_rank: int | None,
    n_snapshots: int,
    dataloader_workers: int,
    checkpoint_process: bool,
) -> Scenario:
    """Stack ids of every process for ``fault`` (see the module docs of ``synthetic`` for the semantics)."""
    c = _Ctx(topo, defs, ids, rng)
    world = c.world
    r = fault_rank if fault_rank is not None else c.pick_rank(fault)
    workers = [np.full((world, dataloader_workers), c.id("worker-idle"), dtype=np.int64)]
    ckpt = [np.full(world, c.id("ckpt-idle"), dtype=np.int64)] if checkpoint_process else []
    replica = np.flatnonzero(c.dp == c.dp[r])
    if fault in ("none", "slow-rank"):
        return _progressing(c, fault, r, n_snapshots, dataloader_workers, checkpoint_process, replica)

    st = np.full(world, c.id("dp-rs"), dtype=np.int64)  # other replicas finished and wait in the DP sync
    peers = c.peers_mask(r)
    s = int(c.stage[r])
    culprits: tuple[int, ...] = (r,)
    missing: tuple[int, ...] = ()
    affected = replica
    verdict = "hang"
    module = "attn" if rng.random() < 0.5 else "mlp"
    compute = str(rng.choice(ATTN_COMPUTE if module == "attn" else MLP_COMPUTE))
    tp_ar = c.id(f"tp-ar-{module}")
    if fault in ("compute-hang", "crash"):
        _stalled_pipeline(c, st, r, s, s)
        st[peers] = tp_ar
        st[r] = c.id(compute)
        if fault == "crash":
            missing = (r,)
            desc = f"rank {r} crashed (no dump); its TP peers wait in the TP all_reduce, the pipeline and DP wait"
        else:
            desc = f"rank {r} is stuck in compute ({compute}); its TP peers wait in the TP all_reduce"
    elif fault == "collective-hang":
        _stalled_pipeline(c, st, r, s, s)
        st[peers] = tp_ar
        desc = f"the TP all_reduce of rank {r}'s group hangs (all its members blocked in it)"
    elif fault == "p2p-hang":
        forward = s < c.pp - 1
        t = s + 1 if forward else s - 1
        same = np.all([topo.coords[d] == topo.coords[d][r] for d in DIMS if d != "pp"], axis=0)
        peer = int(np.flatnonzero(same & (c.stage == t))[0])
        _stalled_pipeline(c, st, r, min(s, t), max(s, t))
        st[peers] = c.p2p("send_forward" if forward else "send_backward")
        st[c.peers_mask(peer)] = c.p2p("recv_forward" if forward else "recv_backward")
        culprits = (r, peer)
        desc = (
            f"rank {r} (stage {s}) is blocked sending {'forward' if forward else 'backward'} to rank {peer} "
            f"(stage {t}), which waits to receive"
        )
    elif fault == "dataloader-stall":
        _stalled_pipeline(c, st, r, s, s)
        st[peers] = c.id("tp-bcast-batch")
        st[r] = c.id("dataloader-wait")
        k = int(rng.integers(dataloader_workers))
        workers[0][r, k] = c.id("worker-io-stall")
        desc = f"DataLoader worker {k} of rank {r} is stuck reading its dataset; TP peers wait in the batch broadcast"
    elif fault == "checkpoint-stall":
        st[:] = c.id("ckpt-barrier")
        st[r] = c.id("ckpt-finalize")
        tensor_item = bool(rng.random() < 0.5)
        ckpt[0][r] = c.id("ckpt-write-stall" if tensor_item else "ckpt-bytes-stall")
        affected = np.array([r])
        desc = (
            f"the async checkpoint process of rank {r} is stuck writing a "
            f"{'tensor (torch.save)' if tensor_item else 'bytes item'} to storage; rank {r} waits for it"
        )
    else:  # pragma: no cover - guarded by the caller
        raise AssertionError(fault)
    return Scenario(
        [st] * n_snapshots,
        workers * n_snapshots,
        ckpt * n_snapshots,
        culprits,
        _sorted(affected, culprits),
        missing,
        verdict,
        r,
        desc,
    )


def _progressing(c: _Ctx, fault: str, r: int, n: int, w: int, with_ckpt: bool, replica: np.ndarray) -> Scenario:
    """``none`` and ``slow-rank``: every trainer stack changes from one snapshot to the next."""
    rng, world = c.rng, c.world
    trainer: list[np.ndarray] = []
    workers: list[np.ndarray] = []
    ckpt: list[np.ndarray] = []
    all_idx = np.arange(world)
    fixed = np.zeros(world, dtype=bool)
    s = int(c.stage[r])
    if fault == "slow-rank":
        peers = c.peers_mask(r)
        fixed = peers.copy()
        attn_order = rng.permutation(ATTN_COMPUTE)
        mlp_order = rng.permutation(MLP_COMPUTE)
        start_attn = bool(rng.random() < 0.5)
        rep = c.dp == c.dp[r]
        later = np.flatnonzero(rep & (c.stage > s))
        earlier = np.flatnonzero(rep & (c.stage < s))
        others = np.flatnonzero(~rep)
        ops_later = ("recv_forward", "send_backward_recv_forward") if c.pp > 1 else ()
        ops_earlier = ("recv_backward", "send_forward_recv_backward") if c.pp > 1 else ()
        waits_later = np.array([c.p2p(op, lf) for op in ops_later for lf in ("batch", "wait")], dtype=np.int64)
        waits_earlier = np.array([c.p2p(op, lf) for op in ops_earlier for lf in ("batch", "wait")], dtype=np.int64)
        dps = np.asarray(c.families["dp-sync"])
        offset = rng.integers(12, size=world)  # each waiting rank cycles through its wait states
    for t in range(n):
        if fault == "none":
            st = c.sample_healthy(all_idx)
        else:
            st = np.empty(world, dtype=np.int64)
            if others.size:
                st[others] = c.sample_healthy(others)
                waiting = others[rng.random(others.size) < 0.85]
                st[waiting] = dps[(offset[waiting] + t) % dps.size]
            if later.size:
                st[later] = waits_later[(offset[later] + t) % waits_later.size]
            if earlier.size:
                st[earlier] = waits_earlier[(offset[earlier] + t) % waits_earlier.size]
            attn = (t % 2 == 0) == start_attn
            st[peers] = c.id("tp-ar-attn" if attn else "tp-ar-mlp")
            order = attn_order if attn else mlp_order
            st[r] = c.id(str(order[(t // 2) % len(order)]))
            noise = np.flatnonzero((rng.random(world) < NOISE_FRACTION) & ~fixed)
            if noise.size:
                st[noise] = c.sample_healthy(noise)
        if trainer:  # a progressing rank is never caught twice in the very same place
            prev = trainer[-1]
            for _ in range(50):
                same = np.flatnonzero((st == prev) & ~fixed)
                if not same.size:
                    break
                st[same] = c.sample_healthy(same)
        trainer.append(st)
        # workers stay idle: a healthy prefetching DataLoader is almost never caught mid-read
        workers.append(np.full((world, w), c.id("worker-idle"), dtype=np.int64))
        if with_ckpt:
            ckpt.append(np.full(world, c.id("ckpt-idle"), dtype=np.int64))
    if fault == "none":
        return Scenario(
            trainer,
            workers,
            ckpt,
            (),
            (),
            (),
            "healthy",
            None,
            "a healthy job making progress: every rank's stack changes between snapshots",
        )
    desc = (
        f"rank {r} is slow: in every snapshot it computes while its TP peers wait in the TP all_reduce "
        "and the other ranks wait in p2p or the DP gradient sync"
    )
    return Scenario(trainer, workers, ckpt, (r,), _sorted(replica, (r,)), (), "fail-slow", r, desc)


def _sorted(ranks: np.ndarray, culprits: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted({int(x) for x in np.asarray(ranks).tolist()} | set(culprits)))
