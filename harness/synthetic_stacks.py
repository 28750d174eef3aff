"""The catalogue of Megatron-style stacks the synthetic jobs are built from (trainers and their children)."""

from __future__ import annotations

from rankscope.harness.synthetic_frames import (
    APPLY,
    ASYNC,
    ATT,
    C10D,
    CKPT,
    CLIP,
    CONN,
    DDP,
    DL,
    DOPT,
    DPA,
    FMG,
    FORK_PREFIX,
    FSA,
    GDS,
    GPT,
    IDX,
    LAY,
    MAIN_PREFIX,
    MAP,
    MLP,
    MOD16,
    MODCALL,
    MPQ,
    OPT,
    P2P,
    P2P_OPS,
    PGB,
    PRE,
    SCH,
    SOFT,
    SPAWN_PREFIX,
    TB,
    THREAD_BOOT,
    THREAD_RUN,
    TIMERS,
    TL,
    TPD,
    TRN,
    Site,
    StackDef,
    c10d_call,
    meg,
    mp_poll_wait,
    std_site,
    thread_wait,
    torch_site,
)


def _forward_into_layer(sched: tuple[Site, ...], fwd_line: int) -> tuple[Site, ...]:
    return sched + (
        meg("forward_step", SCH, fwd_line),
        meg("forward_step", PRE, 228),
        *MODCALL,
        meg("DistributedDataParallel.forward", DDP, 305),
        *MODCALL,
        meg("Float16Module.forward", MOD16, 185),
        *MODCALL,
        meg("GPTModel.forward", GPT, 264),
        *MODCALL,
        meg("TransformerBlock.forward", TB, 549),
        *MODCALL,
    )


def _linear_compute(qual: str, line: int) -> tuple[Site, ...]:
    return (
        meg(qual, LAY, line),
        meg("linear_with_grad_accumulation_and_async_allreduce", LAY, 655),
        APPLY,
        meg("LinearWithGradAccumulationAndAsyncCommunication.forward", LAY, 440),
    )


def _tp_allreduce(row_line: int = 1147) -> tuple[Site, ...]:
    return (
        meg("RowParallelLinear.forward", LAY, row_line),
        meg("reduce_from_tensor_model_parallel_region", MAP, 493),
        APPLY,
        meg("_ReduceFromModelParallelRegion.forward", MAP, 238),
        meg("_reduce", MAP, 29),
        *c10d_call("all_reduce"),
    )


def _p2p(sched: tuple[Site, ...], op: str, lines: tuple[int, int, int], leaf: str) -> tuple[Site, ...]:
    """A pipeline send/recv: in ``batch_isend_irecv`` (``leaf="batch"``) or waiting on its requests."""
    caller, helper, inner = lines
    tail = (meg("_batched_p2p_ops", P2P, 170), torch_site("batch_isend_irecv", C10D, 2584)) if leaf == "batch" else ()
    return sched[:-1] + (
        meg(sched[-1].qualname, SCH, caller),
        meg(op, SCH, helper),
        meg(op, P2P, inner),
        meg("_communicate", P2P, 322 if leaf == "batch" else 331),
        *tail,
    )


def trainer_stacks(*, pipelined: bool) -> list[StackDef]:
    """Every main-thread stack of a trainer (the schedule depends on whether pp > 1)."""
    sched = MAIN_PREFIX + (
        (meg("forward_backward_pipelining_without_interleaving", SCH, 1460),)
        if pipelined
        else (meg("forward_backward_no_pipelining", SCH, 478),)
    )
    sched_fwd = sched[:-1] + (meg(sched[-1].qualname, SCH, 1417 if pipelined else 452),)
    sched_bwd = sched[:-1] + (meg(sched[-1].qualname, SCH, 1452 if pipelined else 456),)
    sched_fin = sched[:-1] + (meg(sched[-1].qualname, SCH, 1493 if pipelined else 487),)
    layer = _forward_into_layer(sched_fwd, 275)
    attn = layer + (meg("TransformerLayer.forward", TL, 390), *MODCALL)
    mlp = layer + (meg("TransformerLayer.forward", TL, 426), *MODCALL)
    out = [
        # compute in the forward pass (never a distributed frame at the leaf)
        StackDef(
            "fwd-qkv",
            "compute",
            attn
            + (
                meg("Attention.forward", ATT, 459),
                meg("SelfAttention.get_query_key_value_tensors", ATT, 611),
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
                meg("Attention.forward", ATT, 521),
                *MODCALL,
                meg("DotProductAttention.forward", DPA, 170),
                *MODCALL,
                meg("FusedScaleMaskSoftmax.forward", SOFT, 148),
                meg("FusedScaleMaskSoftmax.forward_torch_softmax", SOFT, 198),
            ),
            True,
            True,
        ),
        StackDef(
            "fwd-attn-proj",
            "compute",
            attn + (meg("Attention.forward", ATT, 549), *MODCALL, *_linear_compute("RowParallelLinear.forward", 1137)),
            True,
            True,
        ),
        StackDef(
            "fwd-mlp-fc1",
            "compute",
            mlp + (meg("MLP.forward", MLP, 118), *MODCALL, *_linear_compute("ColumnParallelLinear.forward", 938)),
            True,
            True,
        ),
        StackDef(
            "fwd-mlp-act",
            "compute",
            mlp + (meg("MLP.forward", MLP, 135), meg("MLP.forward.<locals>.glu", MLP, 125)),
            True,
            True,
        ),
        StackDef(
            "fwd-mlp-fc2",
            "compute",
            mlp + (meg("MLP.forward", MLP, 150), *MODCALL, *_linear_compute("RowParallelLinear.forward", 1137)),
            True,
            True,
        ),
        StackDef(
            "bwd-engine",
            "compute",
            sched_bwd
            + (
                meg("backward_step", SCH, 366),
                torch_site("backward", "torch/autograd/__init__.py", 353),
                torch_site("_engine_run_backward", "torch/autograd/graph.py", 823),
            ),
            True,
        ),
        StackDef(
            "bwd-custom",
            "compute",
            sched_bwd + (meg("backward_step", SCH, 362), meg("custom_backward", SCH, 155)),
            True,
        ),
        StackDef(
            "timer-sync",
            "compute",
            MAIN_PREFIX[:-1]
            + (
                meg("train_step", TRN, 748),
                meg("_Timer.stop", TIMERS, 176),
                torch_site("synchronize", "torch/cuda/__init__.py", 985),
            ),
            True,
        ),
        # tensor-parallel collectives in the forward pass
        StackDef("tp-ar-attn", "tp-comm", attn + (meg("Attention.forward", ATT, 549), *MODCALL, *_tp_allreduce())),
        StackDef("tp-ar-mlp", "tp-comm", mlp + (meg("MLP.forward", MLP, 150), *MODCALL, *_tp_allreduce())),
        StackDef(
            "tp-bcast-batch",
            "tp-data",
            sched_fwd
            + (
                meg("forward_step", SCH, 275),
                meg("forward_step", PRE, 212),
                meg("get_batch", PRE, 69),
                meg("broadcast_data", TPD, 80),
                meg("_build_key_size_numel_dictionaries", TPD, 40),
                *c10d_call("broadcast"),
            ),
        ),
        # waiting for a batch from the DataLoader workers
        StackDef(
            "dataloader-wait",
            "data-wait",
            sched_fwd
            + (
                meg("forward_step", SCH, 275),
                meg("forward_step", PRE, 212),
                meg("get_batch", PRE, 65),
                torch_site("_BaseDataLoaderIter.__next__", DL, 708),
                torch_site("_MultiProcessingDataLoaderIter._next_data", DL, 1458),
                torch_site("_MultiProcessingDataLoaderIter._get_data", DL, 1420),
                torch_site("_MultiProcessingDataLoaderIter._try_get_data", DL, 1251),
                *mp_poll_wait(),
            ),
        ),
        # data-parallel gradient sync at the end of the step
        StackDef(
            "dp-rs",
            "dp-sync",
            sched_fin
            + (
                meg("finalize_model_grads", FMG, 245),
                meg("DistributedDataParallel.finish_grad_sync", DDP, 421),
                meg("_ParamAndGradBucketGroup.finish_grad_sync", PGB, 297),
                meg("_ParamAndGradBucketGroup.start_grad_sync", PGB, 262),
                *c10d_call("reduce_scatter_tensor"),
            ),
        ),
        StackDef(
            "dp-ar",
            "dp-sync",
            sched_fin
            + (
                meg("finalize_model_grads", FMG, 245),
                meg("DistributedDataParallel.finish_grad_sync", DDP, 421),
                meg("_ParamAndGradBucketGroup.finish_grad_sync", PGB, 297),
                meg("_ParamAndGradBucketGroup.start_grad_sync", PGB, 270),
                *c10d_call("all_reduce"),
            ),
        ),
        StackDef(
            "dp-ar-ln",
            "dp-sync",
            sched_fin
            + (
                meg("finalize_model_grads", FMG, 258),
                meg("_allreduce_layernorm_grads", FMG, 212),
                meg("_flatten_dense_tensors_allreduce", FMG, 35),
                *c10d_call("all_reduce"),
            ),
        ),
        # optimizer step
        StackDef(
            "opt-gradnorm",
            "optimizer",
            MAIN_PREFIX[:-1]
            + (
                meg("train_step", TRN, 735),
                meg("MixedPrecisionOptimizer.step", OPT, 479),
                meg("MegatronOptimizer.clip_grad_norm", OPT, 212),
                meg("get_grad_norm_fp32", CLIP, 136),
                *c10d_call("all_reduce"),
            ),
        ),
        StackDef(
            "opt-param-ag",
            "optimizer",
            MAIN_PREFIX[:-1]
            + (
                meg("train_step", TRN, 735),
                meg("MixedPrecisionOptimizer.step", OPT, 492),
                meg("DistributedOptimizer.step_with_ready_grads", DOPT, 1853),
                meg("DistributedDataParallel.start_param_sync", DDP, 372),
                meg("_ParamAndGradBucketGroup.start_param_sync", PGB, 215),
                *c10d_call("all_gather_into_tensor"),
            ),
        ),
        # checkpointing
        StackDef(
            "ckpt-finalize",
            "ckpt-wait",
            MAIN_PREFIX[:-1]
            + (
                meg("train", TRN, 1420),
                meg("save_checkpoint_and_time", TRN, 1090),
                meg("save_checkpoint", CKPT, 330),
                meg("maybe_finalize_async_save", CKPT, 1458),
                meg("AsyncCallsQueue.maybe_finalize_async_calls", ASYNC, 489),
                meg("PersistentAsyncCaller.is_current_async_call_done", ASYNC, 371),
                std_site("Queue.get", MPQ, 103),
                std_site("_ConnectionBase.recv_bytes", CONN, 216),
                std_site("Connection._recv_bytes", CONN, 430),
                std_site("Connection._recv", CONN, 395),
            ),
        ),
        StackDef(
            "ckpt-barrier",
            "ckpt-comm",
            MAIN_PREFIX[:-1]
            + (
                meg("train", TRN, 1420),
                meg("save_checkpoint_and_time", TRN, 1090),
                meg("save_checkpoint", CKPT, 436),
                *c10d_call("barrier"),
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
    worker = FORK_PREFIX + (torch_site("_worker_loop", "torch/utils/data/_utils/worker.py", 309),)
    worker_busy = FORK_PREFIX + (torch_site("_worker_loop", "torch/utils/data/_utils/worker.py", 349),)
    fetch = (
        torch_site("_MapDatasetFetcher.fetch", "torch/utils/data/_utils/fetch.py", 52),
        torch_site("_MapDatasetFetcher.fetch.<locals>.<listcomp>", "torch/utils/data/_utils/fetch.py", 52),
        meg("GPTDataset.__getitem__", GDS, 188),
        meg("GPTDataset._query_document_sample_shuffle_index", GDS, 303),
        meg("IndexedDataset.get", IDX, 697),
        meg("_FileBinReader.read", IDX, 434),
    )
    ckpt = SPAWN_PREFIX + (meg("PersistentAsyncCaller.async_loop", ASYNC, 405),)
    ckpt_busy = SPAWN_PREFIX + (
        meg("PersistentAsyncCaller.async_loop", ASYNC, 419),
        meg("FileSystemWriterAsync.write_preloaded_data", FSA, 296),
    )
    return [
        StackDef(
            "pin-memory",
            "thread",
            THREAD_RUN
            + (
                torch_site("_pin_memory_loop", "torch/utils/data/_utils/pin_memory.py", 55),
                torch_site("_pin_memory_loop.<locals>.do_one_step", "torch/utils/data/_utils/pin_memory.py", 31),
                *thread_wait(180),
            ),
        ),
        StackDef(
            "tb-writer",
            "thread",
            THREAD_BOOT
            + (
                torch_site("_AsyncWriterThread.run", "tensorboard/summary/writer/event_file_writer.py", 244),
                *thread_wait(171),
            ),
        ),
        StackDef("worker-idle", "worker", worker + mp_poll_wait()),
        StackDef("worker-io-stall", "worker", worker_busy + fetch),
        StackDef("ckpt-idle", "ckpt", ckpt + mp_poll_wait(122)),
        StackDef(
            "ckpt-write-stall",
            "ckpt",
            ckpt_busy
            + (
                torch_site("_write_item", "torch/distributed/checkpoint/filesystem.py", 162),
                torch_site("save", "torch/serialization.py", 944),
                torch_site("_save", "torch/serialization.py", 1216),
            ),
        ),
        StackDef(
            "ckpt-bytes-stall",
            "ckpt",
            ckpt_busy + (torch_site("_write_item", "torch/distributed/checkpoint/filesystem.py", 157),),
        ),
    ]
