"""Synthetic per-rank stack dumps of a Megatron-LM job, with an injected fault and its ground truth.

:func:`generate_job` lays out a 3D-parallel job (any tp/cp/ep/pp/dp), puts every trainer's main
thread, its extra threads, its DataLoader workers and (optionally) its async-checkpoint process in a
plausible state, injects one fault from :data:`FAULTS` and records which ranks are to blame. The
result feeds tests, the demo and the benchmark, in memory (:meth:`SyntheticJob.to_rows`) or as a
directory of py-spy / faulthandler files (:meth:`SyntheticJob.write_dir`). Generation reuses one
frame tuple per (state, install layout), so 100k ranks take a few seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from rankscope.datasets.domain.stacks import Frame, ProcessDump, ThreadDump
from rankscope.datasets.domain.topology import Layout, Topology
from rankscope.datasets.readers.base import to_rows
from rankscope.harness.synthetic_faults import Scenario, build_scenario
from rankscope.harness.synthetic_frames import ENVS, InstallEnv, StackDef
from rankscope.harness.synthetic_render import FORMATS, write_job_dir
from rankscope.harness.synthetic_stacks import child_stacks, trainer_stacks
from rankscope.spine import InputError, paused_gc

FAULTS = (
    "none",
    "compute-hang",
    "collective-hang",
    "p2p-hang",
    "dataloader-stall",
    "checkpoint-stall",
    "crash",
    "slow-rank",
)
SOURCE_FORMAT = "synthetic"
SNAPSHOT_INTERVAL_SECONDS = 30
START_TIME = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class GroundTruth:
    """What was injected: the fault, the ranks and nodes to blame, and the verdict a diagnosis should reach."""

    fault: str
    culprit_ranks: tuple[int, ...]
    culprit_nodes: tuple[str, ...]
    expected_verdict: str  # "hang" | "fail-slow" | "healthy"
    affected_ranks: tuple[int, ...]  # ranks whose trainer stack differs from the healthy majority
    fault_rank: int | None = None
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "fault": self.fault,
            "culprit_ranks": list(self.culprit_ranks),
            "culprit_nodes": list(self.culprit_nodes),
            "expected_verdict": self.expected_verdict,
            "affected_ranks": list(self.affected_ranks),
            "fault_rank": self.fault_rank,
            "description": self.description,
        }

    def explain(self) -> str:
        who = (
            f"culprit rank(s) {list(self.culprit_ranks)} on {', '.join(self.culprit_nodes)}"
            if self.culprit_ranks
            else "no culprit"
        )
        return f"{self.fault}: {self.description} ({who}; expected verdict {self.expected_verdict})"


@dataclass(frozen=True, slots=True)
class SyntheticDump:
    """One process's stack in one snapshot: a trainer, a DataLoader worker or a checkpoint process."""

    snapshot: int
    rank: int
    node: str
    role: str  # trainer | dataloader | checkpoint
    dump: ProcessDump


@dataclass(frozen=True, eq=False)
class SyntheticJob:
    """A generated job: its topology, ground truth and every process dump of every snapshot.

    ``dumps`` are ordered by snapshot, rank, then trainer / dataloader workers / checkpoint. Frames are
    what ``py-spy dump`` (text) would print on the rank's node; ``envs[node_env[i]]`` says where node
    ``i`` has Python, site-packages and Megatron installed.
    """

    topology: Topology
    layout: Layout
    gpus_per_node: int
    truth: GroundTruth
    dumps: tuple[SyntheticDump, ...]
    n_snapshots: int
    envs: tuple[InstallEnv, ...] = (ENVS[0],)
    node_env: tuple[int, ...] = ()
    seed: int = 0

    @cached_property
    def _env_by_node(self) -> dict[str, InstallEnv]:
        return {n: self.envs[self.node_env[i] if self.node_env else 0] for i, n in enumerate(self.topology.node_names)}

    def env_of(self, node: str) -> InstallEnv:
        """The install layout of ``node`` (Python version, site-packages and Megatron paths)."""
        try:
            return self._env_by_node[node]
        except KeyError:
            raise InputError(f"node {node!r} is not a node of this job") from None

    def snapshot(self, i: int) -> tuple[SyntheticDump, ...]:
        """The dumps of snapshot ``i``."""
        return tuple(d for d in self.dumps if d.snapshot == i)

    def write_dir(self, path: str | os.PathLike[str], *, fmt: str = "pyspy-text", manifest: bool = True) -> Path:
        """Write one file per process under ``path`` (see :func:`synthetic_render.write_job_dir`)."""
        return write_job_dir(self, path, fmt=fmt, manifest=manifest)

    def to_rows(self, job: str) -> list[dict[str, Any]]:
        """Rows of the ``stacks`` table, one per thread of every dump (as :func:`readers.base.to_rows` makes them).

        Threads that share a frame tuple share one (read-only) ``frames`` list, which keeps 100k ranks cheap.
        """
        rows: list[dict[str, Any]] = []
        times = [START_TIME + timedelta(seconds=SNAPSHOT_INTERVAL_SECONDS * i) for i in range(self.n_snapshots)]
        frame_lists: dict[int, list[dict[str, Any]]] = {}
        for d in self.dumps:
            p = d.dump
            if not p.threads:
                rows.extend(
                    to_rows(
                        p, job=job, snapshot=d.snapshot, rank=d.rank, node=d.node, role=d.role, time=times[d.snapshot]
                    )
                )
                continue
            base = {
                "job": job,
                "snapshot": d.snapshot,
                "time": times[d.snapshot],
                "node": d.node,
                "rank": d.rank,
                "pid": p.pid,
                "role": d.role,
                "source_format": p.source_format,
                "source_file": p.source_file,
                "status": p.status,
                "error": p.error,
            }
            for t in p.threads:
                fl = frame_lists.get(id(t.frames))
                if fl is None:
                    fl = [{"function": f.function, "file": f.file, "line": f.line} for f in t.frames]
                    frame_lists[id(t.frames)] = fl
                rows.append(
                    {
                        **base,
                        "thread_id": t.thread_id,
                        "thread_name": t.thread_name,
                        "is_main_thread": t.is_main,
                        "active": t.active,
                        "frames": fl,
                    }
                )
        return rows


# -- generation --------------------------------------------------------------------------------
@dataclass
class _Catalog:
    """The job's stack catalog with frames cached per (stack, install layout)."""

    defs: list[StackDef]
    envs: tuple[InstallEnv, ...]
    ids: dict[str, int] = field(default_factory=dict)
    frames: dict[tuple[int, int], tuple[Frame, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ids = {d.name: i for i, d in enumerate(self.defs)}

    def thread_frames(self, sid: int, env: int) -> tuple[Frame, ...]:
        key = (sid, env)
        got = self.frames.get(key)
        if got is None:
            e = self.envs[env]
            got = tuple(e.frame(s) for s in reversed(self.defs[sid].sites))  # innermost first
            self.frames[key] = got
        return got


def _cmdline(env: InstallEnv, layout: Layout, *, async_save: bool) -> str:
    mp = [f"--tensor-model-parallel-size {layout.tp}", f"--pipeline-model-parallel-size {layout.pp}"]
    if layout.cp > 1:
        mp.append(f"--context-parallel-size {layout.cp}")
    if layout.ep > 1:
        mp.append(f"--expert-model-parallel-size {layout.ep} --num-experts {8 * layout.ep}")
    args = [
        env.python_exe,
        "-u",
        env.script,
        *mp,
        "--sequence-parallel --use-distributed-optimizer",
        "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096",
        f"--micro-batch-size 1 --global-batch-size {max(1, layout.dp) * 16} --train-iters 500000",
        "--data-path /data/gpt/corpus_text_document --split 949,50,1 --bf16",
        "--save /checkpoints/gpt --load /checkpoints/gpt --save-interval 1000 --tensorboard-dir /logs/tb",
    ]
    if async_save:
        args.append("--async-save --ckpt-format torch_dist")
    return " ".join(args)


def _spawn_cmdline(env: InstallEnv) -> str:
    return (
        f"{env.python_exe} -c from multiprocessing.spawn import spawn_main; "
        "spawn_main(tracker_fd=9, pipe_handle=31) --multiprocessing-fork"
    )


def _check(
    layout: Layout,
    *,
    fault: str,
    fault_rank: int | None,
    n_snapshots: int | None,
    dataloader_workers: int,
    node_format: str,
) -> None:
    if fault not in FAULTS:
        raise InputError(f"fault={fault!r} is not one of {', '.join(FAULTS)}")
    world = layout.world_size
    if fault_rank is not None and not 0 <= fault_rank < world:
        raise InputError(f"fault_rank={fault_rank} is outside 0..{world - 1} for layout {layout}")
    if n_snapshots is not None and n_snapshots < 1:
        raise InputError(f"n_snapshots={n_snapshots} must be at least 1")
    if dataloader_workers < 0:
        raise InputError(f"dataloader_workers={dataloader_workers} must be 0 or more")
    if fault == "p2p-hang" and layout.pp < 2:
        raise InputError(f"fault='p2p-hang' needs pipeline parallelism (pp >= 2); layout is {layout}")
    if fault == "collective-hang" and layout.tp * layout.cp * layout.ep < 2:
        raise InputError(
            f"fault='collective-hang' needs a tensor-parallel group (tp, cp or ep >= 2); layout is {layout}"
        )
    if fault == "dataloader-stall" and dataloader_workers < 1:
        raise InputError("fault='dataloader-stall' needs dataloader_workers >= 1")
    try:
        node_format.format(0)
    except (KeyError, IndexError, ValueError) as exc:
        raise InputError(f"node_format={node_format!r} is not a format string with one {{}} field ({exc})") from None


def generate_job(
    layout: Layout | str,
    *,
    gpus_per_node: int = 8,
    fault: str = "compute-hang",
    fault_rank: int | None = None,
    n_snapshots: int | None = None,
    dataloader_workers: int = 2,
    checkpoint_process: bool = False,
    seed: int = 0,
    node_format: str = "node-{}",
    install_prefixes: bool = True,
) -> SyntheticJob:
    """A synthetic job of ``layout`` with ``fault`` injected at ``fault_rank`` (picked with ``seed`` if None).

    ``n_snapshots`` defaults to 1 for hangs and crashes, 5 for ``slow-rank`` and ``none``. A crashed
    rank has no dump at all (nor its workers). ``checkpoint-stall`` always gets checkpoint processes.
    With ``install_prefixes`` nodes differ in install paths and Python version, as real clusters do.
    """
    lay = Layout.parse(layout) if isinstance(layout, str) else layout
    _check(
        lay,
        fault=fault,
        fault_rank=fault_rank,
        n_snapshots=n_snapshots,
        dataloader_workers=dataloader_workers,
        node_format=node_format,
    )
    topo = Topology.from_layout(lay, gpus_per_node=gpus_per_node, node_format=node_format)
    rng = np.random.default_rng(seed)
    if n_snapshots is None:
        n_snapshots = 5 if fault in ("none", "slow-rank") else 1
    with_ckpt = checkpoint_process or fault == "checkpoint-stall"
    n_nodes = len(topo.node_names)
    envs = ENVS if install_prefixes else ENVS[:1]
    node_env = ((np.arange(n_nodes) + int(rng.integers(len(envs)))) % len(envs)).astype(np.int64)
    cat = _Catalog(trainer_stacks(pipelined=lay.pp > 1) + child_stacks(), envs)
    sc = build_scenario(
        topo,
        cat.defs,
        cat.ids,
        rng,
        fault=fault,
        fault_rank=fault_rank,
        n_snapshots=n_snapshots,
        dataloader_workers=dataloader_workers,
        checkpoint_process=with_ckpt,
    )
    with paused_gc():  # millions of small acyclic objects: the cyclic collector would rescan them again and again
        dumps = _build_dumps(
            topo,
            lay,
            cat,
            sc,
            node_env,
            n_snapshots=n_snapshots,
            workers=dataloader_workers,
            with_ckpt=with_ckpt,
            rng=rng,
        )
    culprits = sc.culprit_ranks
    truth = GroundTruth(
        fault=fault,
        culprit_ranks=culprits,
        culprit_nodes=topo.nodes_of(list(culprits)) if culprits else (),
        expected_verdict=sc.expected_verdict,
        affected_ranks=sc.affected_ranks,
        fault_rank=sc.fault_rank,
        description=sc.description,
    )
    return SyntheticJob(
        topo, lay, gpus_per_node, truth, dumps, n_snapshots, envs, tuple(int(x) for x in node_env), seed
    )


def _build_dumps(
    topo: Topology,
    lay: Layout,
    cat: _Catalog,
    sc: Scenario,
    node_env: np.ndarray,
    *,
    n_snapshots: int,
    workers: int,
    with_ckpt: bool,
    rng: np.random.Generator,
) -> tuple[SyntheticDump, ...]:
    """Every process dump of every snapshot, reusing frames, threads and unchanged processes."""
    world = topo.world_size
    g = int(np.bincount(topo.node_index).max())
    local = topo.local_rank
    base = 1000 + rng.integers(1000, 60000, size=len(topo.node_names))[topo.node_index]
    trainer_pid = base + 3 * local
    worker_base = base + 3 * g + 10 + local * (workers + 1)
    ckpt_pid = base + 3 * g + 20 + g * (workers + 1) + local
    pin_tid = ckpt_pid + g + 10
    env_of_rank = node_env[topo.node_index]
    cmd = [_cmdline(e, lay, async_save=with_ckpt) for e in cat.envs]
    spawn_cmd = [_spawn_cmdline(e) for e in cat.envs]
    node_names = [topo.node_names[i] for i in topo.node_index.tolist()]
    defs = cat.defs
    pin_id, tb_id = cat.ids["pin-memory"], cat.ids["tb-writer"]
    last = world - 1
    missing = set(sc.missing_ranks)

    out: list[SyntheticDump] = []
    prev_trainer: dict[int, tuple[int, ProcessDump]] = {}
    prev_child: dict[tuple[int, int], tuple[int, ProcessDump]] = {}
    extra_threads: dict[int, tuple[ThreadDump, ...]] = {}
    tpids = trainer_pid.tolist()
    wbase = worker_base.tolist()
    cpids = ckpt_pid.tolist()
    pins = pin_tid.tolist()
    envs_l = env_of_rank.tolist()
    for t in range(n_snapshots):
        main_states = sc.trainer[t].tolist()
        worker_states = sc.workers[t].tolist() if workers else None
        ckpt_states = sc.ckpt[t].tolist() if with_ckpt else None
        for rank in range(world):
            if rank in missing:
                continue
            e = envs_l[rank]
            node = node_names[rank]
            sid = main_states[rank]
            cached = prev_trainer.get(rank)
            if cached is not None and cached[0] == sid:
                pd = cached[1]
            else:
                extra = extra_threads.get(rank)
                if extra is None:
                    ex = []
                    if rank == last:
                        ex.append(ThreadDump(cat.thread_frames(tb_id, e), tpids[rank] + 1, "Thread-1", False))
                    if workers:
                        ex.append(
                            ThreadDump(cat.thread_frames(pin_id, e), pins[rank], "Thread-2 (_pin_memory_loop)", False)
                        )
                    extra = extra_threads[rank] = tuple(ex)
                d = defs[sid]
                main = ThreadDump(cat.thread_frames(sid, e), tpids[rank], "MainThread", d.active, True)
                pd = ProcessDump((main, *extra), tpids[rank], cmd[e], "ok", None, SOURCE_FORMAT, "")
                prev_trainer[rank] = (sid, pd)
            out.append(SyntheticDump(t, rank, node, "trainer", pd))
            children: list[tuple[int, int, str, str]] = []
            if worker_states is not None:
                ws = worker_states[rank]
                children.extend((k, ws[k], "dataloader", cmd[e]) for k in range(workers))
            if ckpt_states is not None:
                children.append((workers, ckpt_states[rank], "checkpoint", spawn_cmd[e]))
            for k, csid, role, cline in children:
                key = (rank, k)
                cached = prev_child.get(key)
                if cached is not None and cached[0] == csid:
                    cpd = cached[1]
                else:
                    pid = wbase[rank] + k if role == "dataloader" else cpids[rank]
                    th = ThreadDump(cat.thread_frames(csid, e), pid, "MainThread", defs[csid].active, True)
                    cpd = ProcessDump((th,), pid, cline, "ok", None, SOURCE_FORMAT, "")
                    prev_child[key] = (csid, cpd)
                out.append(SyntheticDump(t, rank, node, role, cpd))
    return tuple(out)


def leaf_counts(job: SyntheticJob, snapshot: int = 0) -> dict[str, int]:
    """How many trainers of one snapshot sit in each leaf function, for a quick look at a job."""
    counts: dict[str, int] = {}
    for d in job.dumps:
        if d.role == "trainer" and d.snapshot == snapshot:
            main = d.dump.main_thread
            leaf = main.frames[0].function if main and main.frames else "?"
            counts[leaf] = counts.get(leaf, 0) + 1
    return counts


__all__ = ["FAULTS", "FORMATS", "GroundTruth", "SyntheticDump", "SyntheticJob", "generate_job", "leaf_counts"]
