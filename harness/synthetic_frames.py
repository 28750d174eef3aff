"""The code sites and stacks of a synthetic Megatron-LM / PyTorch training job.

A *site* is one Python frame independent of where the code is installed (function qualname, which
tree the file lives in, path inside that tree, line). A *stack* is a named tuple of sites; the
catalog below holds every stack the generator can put a process in, grouped into *families*
(compute, TP collective, p2p, DP sync, ...) so a progressing job can move between members of one
family from one snapshot to the next. An :class:`InstallEnv` turns sites into the frames py-spy
would print on a given node (short file names, qualnames only on Python >= 3.11).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from rankscope.datasets.domain.stacks import Frame


class Site(NamedTuple):
    """One frame: ``tree`` is ``std`` (stdlib), ``site`` (site-packages), ``meg`` (Megatron checkout) or ``raw``."""

    qualname: str
    tree: str
    path: str
    line: int


@dataclass(frozen=True, kw_only=True)
class InstallEnv:
    """Where Python, site-packages and Megatron live on a node, as real clusters differ."""

    name: str
    python_version: str
    python_exe: str  # as run by torchrun (cmdline)
    python_real: str  # what py-spy prints in "Python vX (...)"
    stdlib_dir: str
    site_dir: str
    megatron_dir: str
    cwd: str  # where torchrun was started: decides whether the cmdline names the script by absolute path

    @property
    def qualnames(self) -> bool:
        """py-spy prints ``Class.method`` (co_qualname) only for Python >= 3.11."""
        major, minor = (int(x) for x in self.python_version.split(".")[:2])
        return (major, minor) >= (3, 11)

    @property
    def script(self) -> str:
        """The training script as it appears on the command line."""
        return "pretrain_gpt.py" if self.cwd == self.megatron_dir else f"{self.megatron_dir}/pretrain_gpt.py"

    def short_file(self, site: Site) -> str:
        """The file as py-spy text prints it: relative to the ``sys.path`` entry it was found under.

        Checked with py-spy 0.4.3: a script run as ``python /opt/megatron/pretrain_gpt.py`` from another
        cwd still prints ``pretrain_gpt.py`` and ``megatron/core/...`` (the script's directory is on sys.path).
        """
        return site.path

    def abs_from_short(self, short: str) -> str:
        """Inverse of :meth:`short_file`: the absolute file of a frame printed by py-spy text."""
        if short.startswith(("/", "<")):
            return short
        if short.startswith("megatron/") or short == "pretrain_gpt.py":
            return f"{self.megatron_dir}/{short}"
        if short.split("/", 1)[0] in SITE_PACKAGES:
            return f"{self.site_dir}/{short}"
        return f"{self.stdlib_dir}/{short}"

    def function(self, site: Site) -> str:
        return site.qualname if self.qualnames else co_name(site.qualname)

    def frame(self, site: Site) -> Frame:
        return Frame(self.function(site), self.short_file(site), site.line)


SITE_PACKAGES = frozenset({"torch", "tensorboard", "numpy", "transformer_engine", "apex", "wandb"})
"""Top-level packages the catalog installs in site-packages (everything else relative is stdlib)."""


def co_name(qualname: str) -> str:
    """``_exception_logger.<locals>.wrapper`` -> ``wrapper`` (what faulthandler and Python < 3.11 show)."""
    return qualname.rsplit(".", 1)[-1]


ENVS: tuple[InstallEnv, ...] = (
    InstallEnv(
        name="conda",
        python_version="3.11.9",
        python_exe="/opt/conda/bin/python",
        python_real="/opt/conda/bin/python3.11",
        stdlib_dir="/opt/conda/lib/python3.11",
        site_dir="/opt/conda/lib/python3.11/site-packages",
        megatron_dir="/workspace/Megatron-LM",
        cwd="/workspace/Megatron-LM",
    ),
    InstallEnv(
        name="ngc",
        python_version="3.10.12",
        python_exe="/usr/bin/python",
        python_real="/usr/bin/python3.10",
        stdlib_dir="/usr/lib/python3.10",
        site_dir="/usr/local/lib/python3.10/dist-packages",
        megatron_dir="/opt/megatron",
        cwd="/opt/megatron",
    ),
    InstallEnv(
        name="venv",
        python_version="3.11.7",
        python_exe="/home/user/.venv/bin/python3",
        python_real="/usr/local/bin/python3.11",
        stdlib_dir="/usr/local/lib/python3.11",
        site_dir="/home/user/.venv/lib/python3.11/site-packages",
        megatron_dir="/opt/megatron",
        cwd="/home/user/run",
    ),
)
"""Install layouts nodes are spread over when ``install_prefixes=True`` (else every node uses the first)."""

# Functions whose callee is entered through C (``f(*args)``, autograd, thread/process start): the
# callee's frame is an interpreter entry frame on Python 3.11 (py-spy JSON ``is_entry``).
ENTRY_CALLERS = frozenset({"_call_impl", "wrapper", "apply", "run", "_bootstrap_inner", "_bootstrap"})


# -- sites ------------------------------------------------------------------------------------
def _m(q: str, p: str, n: int) -> Site:
    return Site(q, "meg", p, n)


def _t(q: str, p: str, n: int) -> Site:
    return Site(q, "site", p, n)


def _s(q: str, p: str, n: int) -> Site:
    return Site(q, "std", p, n)


PRE = "pretrain_gpt.py"
TRN = "megatron/training/training.py"
CKPT = "megatron/training/checkpointing.py"
SCH = "megatron/core/pipeline_parallel/schedules.py"
P2P = "megatron/core/pipeline_parallel/p2p_communication.py"
DDP = "megatron/core/distributed/distributed_data_parallel.py"
PGB = "megatron/core/distributed/param_and_grad_buffer.py"
FMG = "megatron/core/distributed/finalize_model_grads.py"
LAY = "megatron/core/tensor_parallel/layers.py"
MAP = "megatron/core/tensor_parallel/mappings.py"
TPD = "megatron/core/tensor_parallel/data.py"
TL = "megatron/core/transformer/transformer_layer.py"
TB = "megatron/core/transformer/transformer_block.py"
ATT = "megatron/core/transformer/attention.py"
DPA = "megatron/core/transformer/dot_product_attention.py"
MLP = "megatron/core/transformer/mlp.py"
MOD16 = "megatron/core/transformer/module.py"
SOFT = "megatron/core/fusions/fused_softmax.py"
GPT = "megatron/core/models/gpt/gpt_model.py"
OPT = "megatron/core/optimizer/optimizer.py"
DOPT = "megatron/core/optimizer/distrib_optimizer.py"
CLIP = "megatron/core/optimizer/clip_grads.py"
ASYNC = "megatron/core/dist_checkpointing/strategies/async_utils.py"
FSA = "megatron/core/dist_checkpointing/strategies/filesystem_async.py"
GDS = "megatron/core/datasets/gpt_dataset.py"
IDX = "megatron/core/datasets/indexed_dataset.py"
TIMERS = "megatron/core/timers.py"
C10D = "torch/distributed/distributed_c10d.py"
MODULE = "torch/nn/modules/module.py"
DL = "torch/utils/data/dataloader.py"
MPQ = "multiprocessing/queues.py"
CONN = "multiprocessing/connection.py"
PROC = "multiprocessing/process.py"

WRAPPER = _t("_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py", 81)
APPLY = _t("Function.apply", "torch/autograd/function.py", 575)
MODCALL = (_t("Module._wrapped_call_impl", MODULE, 1739), _t("Module._call_impl", MODULE, 1750))


def _c10d(op: str) -> tuple[Site, ...]:
    lines = {
        "all_reduce": 2810,
        "reduce_scatter_tensor": 4403,
        "all_gather_into_tensor": 3709,
        "broadcast": 2417,
        "barrier": 4551,
        "batch_isend_irecv": 2584,
    }
    return (WRAPPER, _t(op, C10D, lines[op]))


def _mp_poll_wait(get_line: int = 113) -> tuple[Site, ...]:
    """multiprocessing Queue.get with a timeout, blocked in select (outermost first)."""
    return (
        _s("Queue.get", MPQ, get_line),
        _s("_ConnectionBase.poll", CONN, 257),
        _s("Connection._poll", CONN, 440),
        _s("wait", CONN, 947),
        _s("_PollLikeSelector.select", "selectors.py", 415),
    )


def _thread_wait(get_line: int) -> tuple[Site, ...]:
    return (_s("Queue.get", "queue.py", get_line), _s("Condition.wait", "threading.py", 331))


THREAD_BOOT = (_s("Thread._bootstrap", "threading.py", 1002), _s("Thread._bootstrap_inner", "threading.py", 1045))
THREAD_RUN = THREAD_BOOT + (_s("Thread.run", "threading.py", 982),)

MAIN_PREFIX = (_m("<module>", PRE, 270), _m("pretrain", TRN, 349), _m("train", TRN, 1332), _m("train_step", TRN, 714))

# Forked children (dataloader workers) keep the parent's stack at fork time below _bootstrap.
FORK_PREFIX = (
    _m("<module>", PRE, 270),
    _m("pretrain", TRN, 312),
    _m("build_train_valid_test_data_iterators", TRN, 1811),
    _t("DataLoader.__iter__", DL, 493),
    _t("DataLoader._get_iterator", DL, 426),
    _t("_MultiProcessingDataLoaderIter.__init__", DL, 1040),
    _s("BaseProcess.start", PROC, 121),
    _s("Process._Popen", "multiprocessing/context.py", 224),
    _s("ForkProcess._Popen", "multiprocessing/context.py", 282),
    _s("Popen.__init__", "multiprocessing/popen_fork.py", 19),
    _s("Popen._launch", "multiprocessing/popen_fork.py", 71),
    _s("BaseProcess._bootstrap", PROC, 314),
    _s("BaseProcess.run", PROC, 108),
)
SPAWN_PREFIX = (
    Site("<module>", "raw", "<string>", 1),
    _s("spawn_main", "multiprocessing/spawn.py", 122),
    _s("_main", "multiprocessing/spawn.py", 135),
    _s("BaseProcess._bootstrap", PROC, 314),
    _s("BaseProcess.run", PROC, 108),
)


# -- the catalog ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StackDef:
    """One catalog stack: sites outermost first, its family and py-spy's idle/active/gil markers."""

    name: str
    family: str
    sites: tuple[Site, ...]
    active: bool = False
    owns_gil: bool = False


def _forward_into_layer(sched: tuple[Site, ...], fwd_line: int) -> tuple[Site, ...]:
    return sched + (
        _m("forward_step", SCH, fwd_line),
        _m("forward_step", PRE, 228),
        *MODCALL,
        _m("DistributedDataParallel.forward", DDP, 305),
        *MODCALL,
        _m("Float16Module.forward", MOD16, 185),
        *MODCALL,
        _m("GPTModel.forward", GPT, 264),
        *MODCALL,
        _m("TransformerBlock.forward", TB, 549),
        *MODCALL,
    )


def _linear_compute(qual: str, line: int) -> tuple[Site, ...]:
    return (
        _m(qual, LAY, line),
        _m("linear_with_grad_accumulation_and_async_allreduce", LAY, 655),
        APPLY,
        _m("LinearWithGradAccumulationAndAsyncCommunication.forward", LAY, 440),
    )


def _tp_allreduce(row_line: int = 1147) -> tuple[Site, ...]:
    return (
        _m("RowParallelLinear.forward", LAY, row_line),
        _m("reduce_from_tensor_model_parallel_region", MAP, 493),
        APPLY,
        _m("_ReduceFromModelParallelRegion.forward", MAP, 238),
        _m("_reduce", MAP, 29),
        *_c10d("all_reduce"),
    )


def _p2p(sched: tuple[Site, ...], op: str, lines: tuple[int, int, int], leaf: str) -> tuple[Site, ...]:
    """A pipeline send/recv: in ``batch_isend_irecv`` (``leaf="batch"``) or waiting on its requests."""
    caller, helper, inner = lines
    tail = (_m("_batched_p2p_ops", P2P, 170), _t("batch_isend_irecv", C10D, 2584)) if leaf == "batch" else ()
    return sched[:-1] + (
        _m(sched[-1].qualname, SCH, caller),
        _m(op, SCH, helper),
        _m(op, P2P, inner),
        _m("_communicate", P2P, 322 if leaf == "batch" else 331),
        *tail,
    )


P2P_OPS = {  # op -> (line in the schedule, schedules.py helper line, p2p_communication.py line)
    "recv_forward": (1391, 1188, 382),
    "recv_backward": (1475, 1200, 407),
    "send_forward": (1399, 1223, 433),
    "send_backward": (1480, 1244, 457),
    "send_forward_recv_backward": (1431, 1258, 482),
    "send_backward_recv_forward": (1447, 1272, 507),
}


def trainer_stacks(*, pipelined: bool) -> list[StackDef]:
    """Every main-thread stack of a trainer (the schedule depends on whether pp > 1)."""
    sched = MAIN_PREFIX + (
        (_m("forward_backward_pipelining_without_interleaving", SCH, 1460),)
        if pipelined
        else (_m("forward_backward_no_pipelining", SCH, 478),)
    )
    sched_fwd = sched[:-1] + (_m(sched[-1].qualname, SCH, 1417 if pipelined else 452),)
    sched_bwd = sched[:-1] + (_m(sched[-1].qualname, SCH, 1452 if pipelined else 456),)
    sched_fin = sched[:-1] + (_m(sched[-1].qualname, SCH, 1493 if pipelined else 487),)
    layer = _forward_into_layer(sched_fwd, 275)
    attn = layer + (_m("TransformerLayer.forward", TL, 390), *MODCALL)
    mlp = layer + (_m("TransformerLayer.forward", TL, 426), *MODCALL)
    out = [
        # compute in the forward pass (never a distributed frame at the leaf)
        StackDef(
            "fwd-qkv",
            "compute",
            attn
            + (
                _m("Attention.forward", ATT, 459),
                _m("SelfAttention.get_query_key_value_tensors", ATT, 611),
                *MODCALL,
                *_linear_compute("ColumnParallelLinear.forward", 938),
            ),
            True,
            True,
        ),
        StackDef(
            "fwd-core-attn",
            "compute",
            attn
            + (
                _m("Attention.forward", ATT, 521),
                *MODCALL,
                _m("DotProductAttention.forward", DPA, 170),
                *MODCALL,
                _m("FusedScaleMaskSoftmax.forward", SOFT, 148),
                _m("FusedScaleMaskSoftmax.forward_torch_softmax", SOFT, 198),
            ),
            True,
            True,
        ),
        StackDef(
            "fwd-attn-proj",
            "compute",
            attn + (_m("Attention.forward", ATT, 549), *MODCALL, *_linear_compute("RowParallelLinear.forward", 1137)),
            True,
            True,
        ),
        StackDef(
            "fwd-mlp-fc1",
            "compute",
            mlp + (_m("MLP.forward", MLP, 118), *MODCALL, *_linear_compute("ColumnParallelLinear.forward", 938)),
            True,
            True,
        ),
        StackDef(
            "fwd-mlp-act",
            "compute",
            mlp + (_m("MLP.forward", MLP, 135), _m("MLP.forward.<locals>.glu", MLP, 125)),
            True,
            True,
        ),
        StackDef(
            "fwd-mlp-fc2",
            "compute",
            mlp + (_m("MLP.forward", MLP, 150), *MODCALL, *_linear_compute("RowParallelLinear.forward", 1137)),
            True,
            True,
        ),
        StackDef(
            "bwd-engine",
            "compute",
            sched_bwd
            + (
                _m("backward_step", SCH, 366),
                _t("backward", "torch/autograd/__init__.py", 353),
                _t("_engine_run_backward", "torch/autograd/graph.py", 823),
            ),
            True,
        ),
        StackDef(
            "bwd-custom", "compute", sched_bwd + (_m("backward_step", SCH, 362), _m("custom_backward", SCH, 155)), True
        ),
        StackDef(
            "timer-sync",
            "compute",
            MAIN_PREFIX[:-1]
            + (
                _m("train_step", TRN, 748),
                _m("_Timer.stop", TIMERS, 176),
                _t("synchronize", "torch/cuda/__init__.py", 985),
            ),
            True,
        ),
        # tensor-parallel collectives in the forward pass
        StackDef("tp-ar-attn", "tp-comm", attn + (_m("Attention.forward", ATT, 549), *MODCALL, *_tp_allreduce())),
        StackDef("tp-ar-mlp", "tp-comm", mlp + (_m("MLP.forward", MLP, 150), *MODCALL, *_tp_allreduce())),
        StackDef(
            "tp-bcast-batch",
            "tp-data",
            sched_fwd
            + (
                _m("forward_step", SCH, 275),
                _m("forward_step", PRE, 212),
                _m("get_batch", PRE, 69),
                _m("broadcast_data", TPD, 80),
                _m("_build_key_size_numel_dictionaries", TPD, 40),
                *_c10d("broadcast"),
            ),
        ),
        # waiting for a batch from the DataLoader workers
        StackDef(
            "dataloader-wait",
            "data-wait",
            sched_fwd
            + (
                _m("forward_step", SCH, 275),
                _m("forward_step", PRE, 212),
                _m("get_batch", PRE, 65),
                _t("_BaseDataLoaderIter.__next__", DL, 708),
                _t("_MultiProcessingDataLoaderIter._next_data", DL, 1458),
                _t("_MultiProcessingDataLoaderIter._get_data", DL, 1420),
                _t("_MultiProcessingDataLoaderIter._try_get_data", DL, 1251),
                *_mp_poll_wait(),
            ),
        ),
        # data-parallel gradient sync at the end of the step
        StackDef(
            "dp-rs",
            "dp-sync",
            sched_fin
            + (
                _m("finalize_model_grads", FMG, 245),
                _m("DistributedDataParallel.finish_grad_sync", DDP, 421),
                _m("_ParamAndGradBucketGroup.finish_grad_sync", PGB, 297),
                _m("_ParamAndGradBucketGroup.start_grad_sync", PGB, 262),
                *_c10d("reduce_scatter_tensor"),
            ),
        ),
        StackDef(
            "dp-ar",
            "dp-sync",
            sched_fin
            + (
                _m("finalize_model_grads", FMG, 245),
                _m("DistributedDataParallel.finish_grad_sync", DDP, 421),
                _m("_ParamAndGradBucketGroup.finish_grad_sync", PGB, 297),
                _m("_ParamAndGradBucketGroup.start_grad_sync", PGB, 270),
                *_c10d("all_reduce"),
            ),
        ),
        StackDef(
            "dp-ar-ln",
            "dp-sync",
            sched_fin
            + (
                _m("finalize_model_grads", FMG, 258),
                _m("_allreduce_layernorm_grads", FMG, 212),
                _m("_flatten_dense_tensors_allreduce", FMG, 35),
                *_c10d("all_reduce"),
            ),
        ),
        # optimizer step
        StackDef(
            "opt-gradnorm",
            "optimizer",
            MAIN_PREFIX[:-1]
            + (
                _m("train_step", TRN, 735),
                _m("MixedPrecisionOptimizer.step", OPT, 479),
                _m("MegatronOptimizer.clip_grad_norm", OPT, 212),
                _m("get_grad_norm_fp32", CLIP, 136),
                *_c10d("all_reduce"),
            ),
        ),
        StackDef(
            "opt-param-ag",
            "optimizer",
            MAIN_PREFIX[:-1]
            + (
                _m("train_step", TRN, 735),
                _m("MixedPrecisionOptimizer.step", OPT, 492),
                _m("DistributedOptimizer.step_with_ready_grads", DOPT, 1853),
                _m("DistributedDataParallel.start_param_sync", DDP, 372),
                _m("_ParamAndGradBucketGroup.start_param_sync", PGB, 215),
                *_c10d("all_gather_into_tensor"),
            ),
        ),
        # checkpointing
        StackDef(
            "ckpt-finalize",
            "ckpt-wait",
            MAIN_PREFIX[:-1]
            + (
                _m("train", TRN, 1420),
                _m("save_checkpoint_and_time", TRN, 1090),
                _m("save_checkpoint", CKPT, 330),
                _m("maybe_finalize_async_save", CKPT, 1458),
                _m("AsyncCallsQueue.maybe_finalize_async_calls", ASYNC, 489),
                _m("PersistentAsyncCaller.is_current_async_call_done", ASYNC, 371),
                _s("Queue.get", MPQ, 103),
                _s("_ConnectionBase.recv_bytes", CONN, 216),
                _s("Connection._recv_bytes", CONN, 430),
                _s("Connection._recv", CONN, 395),
            ),
        ),
        StackDef(
            "ckpt-barrier",
            "ckpt-comm",
            MAIN_PREFIX[:-1]
            + (
                _m("train", TRN, 1420),
                _m("save_checkpoint_and_time", TRN, 1090),
                _m("save_checkpoint", CKPT, 436),
                *_c10d("barrier"),
            ),
        ),
    ]
    if pipelined:
        for op, lines in P2P_OPS.items():
            out.append(StackDef(f"p2p-{op}", "p2p", _p2p(sched, op, lines, "batch")))
            out.append(StackDef(f"p2p-{op}-wait", "p2p", _p2p(sched, op, lines, "wait")))
    return out


def child_stacks() -> list[StackDef]:
    """Stacks of the trainer's other threads, its DataLoader workers and its checkpoint process."""
    worker = FORK_PREFIX + (_t("_worker_loop", "torch/utils/data/_utils/worker.py", 309),)
    worker_busy = FORK_PREFIX + (_t("_worker_loop", "torch/utils/data/_utils/worker.py", 349),)
    fetch = (
        _t("_MapDatasetFetcher.fetch", "torch/utils/data/_utils/fetch.py", 52),
        _t("_MapDatasetFetcher.fetch.<locals>.<listcomp>", "torch/utils/data/_utils/fetch.py", 52),
        _m("GPTDataset.__getitem__", GDS, 188),
        _m("GPTDataset._query_document_sample_shuffle_index", GDS, 303),
        _m("IndexedDataset.get", IDX, 697),
        _m("_FileBinReader.read", IDX, 434),
    )
    ckpt = SPAWN_PREFIX + (_m("PersistentAsyncCaller.async_loop", ASYNC, 405),)
    ckpt_busy = SPAWN_PREFIX + (
        _m("PersistentAsyncCaller.async_loop", ASYNC, 419),
        _m("FileSystemWriterAsync.write_preloaded_data", FSA, 296),
    )
    return [
        StackDef(
            "pin-memory",
            "thread",
            THREAD_RUN
            + (
                _t("_pin_memory_loop", "torch/utils/data/_utils/pin_memory.py", 55),
                _t("_pin_memory_loop.<locals>.do_one_step", "torch/utils/data/_utils/pin_memory.py", 31),
                *_thread_wait(180),
            ),
        ),
        StackDef(
            "tb-writer",
            "thread",
            THREAD_BOOT
            + (
                _t("_AsyncWriterThread.run", "tensorboard/summary/writer/event_file_writer.py", 244),
                *_thread_wait(171),
            ),
        ),
        StackDef("worker-idle", "worker", worker + _mp_poll_wait()),
        StackDef("worker-io-stall", "worker", worker_busy + fetch),
        StackDef("ckpt-idle", "ckpt", ckpt + _mp_poll_wait(122)),
        StackDef(
            "ckpt-write-stall",
            "ckpt",
            ckpt_busy
            + (
                _t("_write_item", "torch/distributed/checkpoint/filesystem.py", 162),
                _t("save", "torch/serialization.py", 944),
                _t("_save", "torch/serialization.py", 1216),
            ),
        ),
        StackDef(
            "ckpt-bytes-stall",
            "ckpt",
            ckpt_busy + (_t("_write_item", "torch/distributed/checkpoint/filesystem.py", 157),),
        ),
    ]
