"""Frame normalization, stack signatures and what a stack is doing (its *state*).

Normalization makes stacks from different nodes comparable: install prefixes
(``/opt/conda/lib/python3.11/site-packages/``, ``/workspace/Megatron-LM/``) are stripped so a frame
is its function plus a package-relative file. A signature is the tuple of normalized frames,
outermost first, by default without line numbers (STAT's function-level equivalence classes).

The state of a stack says whether a rank is *waiting on someone else* (a collective, a p2p
transfer, its dataloader, its checkpoint writer) or *doing something itself* (compute, I/O).
During a hang the ranks that are not waiting are the likeliest culprits.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rankscope.datasets.domain.stacks import FrameLike, is_hook_idle_frame, is_launcher_frame

_SITE = re.compile(r"^.*?/(?:site|dist)-packages/")
_STDLIB = re.compile(r"^.*?/lib(?:64)?/python\d+(?:\.\d+)?/")
_REPO_ROOTS = (
    "megatron/",
    "torch/",
    "torchtitan/",
    "deepspeed/",
    "transformers/",
    "apex/",
    "nemo/",
    "vllm/",
    "fairscale/",
    "accelerate/",
)


def normalize_file(path: str) -> str:
    """Package-relative file: strip site-packages / stdlib / checkout prefixes, keep the rest."""
    p = path.replace("\\", "/")
    m = _SITE.match(p)
    if m:
        return p[m.end() :]
    m = _STDLIB.match(p)
    if m:
        return p[m.end() :]
    if p.startswith("/"):
        for root in _REPO_ROOTS:
            i = p.rfind("/" + root)
            if i >= 0:
                return p[i + 1 :]
        return p.rsplit("/", 1)[-1]
    return p


def frame_key(f: FrameLike, *, lines: bool = False) -> str:
    """The comparison key of one frame: ``function@basename`` (+``:line``), stable across nodes.

    Only the last part of a qualified name is kept: py-spy prints ``Thread.run`` under Python 3.11+
    and ``run`` under 3.10, and nodes of one job can differ.
    """
    base = f.file.rsplit("/", 1)[-1]
    fn = f.function.rsplit(".", 1)[-1]
    if lines and f.line is not None:
        return f"{fn}@{base}:{f.line}"
    return f"{fn}@{base}"


def is_native_frame(f: FrameLike) -> bool:
    """A frame of compiled code, as ``py-spy dump --native`` interleaves them with the Python frames: a shared
    object or binary (``pthread_cond_wait (libc.so.6)``, ``c10d::Reducer::finalize_backward (libtorch_cpu.so)``)
    and no line number. Python frames always carry a line (``<frozen ...>`` modules too)."""
    return f.line is None and not f.file.endswith((".py", ".pyx", ".pyw")) and not f.file.startswith("<")


_VIEW_CACHE: dict[int, tuple[object, tuple[Any, ...] | None, tuple[int, ...]]] = {}


def python_view(frames: Sequence[FrameLike]) -> tuple[Sequence[FrameLike], tuple[int, ...] | None]:
    """The Python frames of a stack and, when native frames were left out, each one's index in ``frames``
    (None: ``frames`` itself, nothing left out). The analysis compares and classifies Python frames: native
    ones differ with the build of each node's libraries (``libstdc++.so.6.0.30`` on one, ``.32`` on another)
    and sit below the Python frame that tells what the rank is doing. A stack with no Python frame is kept
    whole. Memoized per frames tuple (the readers share one per distinct stack)."""
    hit = _VIEW_CACHE.get(id(frames))
    if hit is not None and hit[0] is frames:
        return (hit[1], hit[2]) if hit[1] is not None else (frames, None)
    keep = tuple(i for i, f in enumerate(frames) if not is_native_frame(f))
    view = None if len(keep) in (0, len(frames)) else tuple(frames[i] for i in keep)
    if isinstance(frames, tuple):
        if len(_VIEW_CACHE) >= 100_000:
            _VIEW_CACHE.clear()
        _VIEW_CACHE[id(frames)] = (frames, view, keep)
    return (view, keep) if view is not None else (frames, None)


_SIG_CACHE: dict[tuple[int, bool], tuple[object, tuple[str, ...]]] = {}


def signature(frames: Sequence[FrameLike], *, lines: bool = False) -> tuple[str, ...]:
    """Outermost-first tuple of frame keys of an innermost-first frame list (runpy and native frames left out:
    see :func:`python_view`).

    Memoized per frames object: readers share one tuple among identical stacks, so 100,000
    ranks in the same state cost one computation. The cache keeps the tuple alive (its id stays
    valid) and is cleared when it grows past 100,000 entries.
    """
    key = (id(frames), lines)
    hit = _SIG_CACHE.get(key)
    if hit is not None and hit[0] is frames:
        return hit[1]
    view, _ = python_view(frames)
    sig = tuple(frame_key(f, lines=lines) for f in reversed(view) if not is_launcher_frame(f))
    if isinstance(frames, tuple):
        if len(_SIG_CACHE) >= 100_000:
            _SIG_CACHE.clear()
        _SIG_CACHE[key] = (frames, sig)
    return sig


def display(f: FrameLike) -> str:
    """``function (package/file.py:line)`` as py-spy prints it."""
    loc = normalize_file(f.file)
    return f"{f.function} ({loc}:{f.line})" if f.line is not None else f"{f.function} ({loc})"


COLLECTIVE_OPS = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "_all_gather_base",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "broadcast",
        "barrier",
        "monitored_barrier",
        "all_to_all",
        "all_to_all_single",
        "reduce",
        "gather",
        "scatter",
        "all_gather_object",
        "broadcast_object_list",
        "all_reduce_coalesced",
        "all_gather_coalesced",
        "gather_object",
        "scatter_object_list",
        "_coalescing_manager",
        "allreduce",
        "allgather",
        "reducescatter",
    }
)
P2P_OPS = frozenset(
    {
        "send",
        "recv",
        "isend",
        "irecv",
        "batch_isend_irecv",
        "_batched_p2p_ops",
        "_p2p_ops",
        "_communicate",
        "send_forward",
        "recv_forward",
        "send_backward",
        "recv_backward",
        "send_forward_recv_backward",
        "send_backward_recv_forward",
        "send_forward_recv_forward",
        "send_backward_recv_backward",
        "send_object_list",
        "recv_object_list",
        # torch.distributed.pipelining (schedules.py) waits on a stage's transfers with ``for w in work:
        # w.wait()`` (C++ below: py-spy's innermost frame is this function; issuing them is batch_isend_irecv)
        "_wait_batch_p2p",
    }
)
DATALOADER_WAIT = frozenset({"_next_data", "_get_data", "_try_get_data", "__next__"})
CHECKPOINT_WAIT = frozenset(
    {"maybe_finalize_async_save", "finalize_async_save", "finalize_async_calls", "wait_until_finished"}
)
IO_LEAVES = frozenset(
    {
        "read",
        "readinto",
        "readline",
        "readlines",
        "write",
        "writelines",
        "fsync",
        "fdatasync",
        "flush",
        "pread",
        "pwrite",
        "open",
        "_save",
        "save",
        "load",
        "_write_item",
        "write_data",
        "_write_files_from_queue",
        "copyfileobj",
        "copy",
        "copy2",
        "stat",
        "listdir",
        "scandir",
        "makedirs",
        "mmap",
        "_load",
        "_read",
        "write_bytes",
        "read_bytes",
        "_legacy_save",
        "_save_to_file",
    }
)
IDLE_LEAVES = frozenset(
    {
        "wait",
        "select",
        "poll",
        "_poll",
        "get",
        "sleep",
        "acquire",
        "_wait_for_tstate_lock",
        "join",
        "accept",
        "recv_into",
        "_recv",
        "_recv_bytes",
        "epoll",
        "wait_for",
    }
)


STARTUP_FUNCTIONS = frozenset(
    {
        "init_process_group",
        "_new_process_group_helper",
        "_store_based_barrier",
        "_create_c10d_store",
        "_env_rendezvous_handler",
        "_tcp_rendezvous_handler",
        "_rendezvous_helper",
        "rendezvous",
        "next_rendezvous",
        "initialize_model_parallel",
        "init_device_mesh",
    }
)
"""Frames of a process that is still starting: joining the process group or building its groups."""
_IMPORT_FILES = ("importlib._bootstrap", "importlib/_bootstrap")

STATES = (
    "compute",
    "io",
    "idle",
    "collective",
    "p2p",
    "dataloader-wait",
    "checkpoint-wait",
    "device-wait",
    "backward",
    "startup",
    "empty",
)
"""Every state :func:`classify` returns."""
PEER_WAIT_STATES = frozenset({"collective", "p2p"})
"""Waiting on other ranks: a collective or a pipeline transfer."""
WAIT_STATES = PEER_WAIT_STATES | {"dataloader-wait", "checkpoint-wait", "device-wait", "backward"}
"""Blocked waiting on someone else (peers, its own DataLoader / checkpoint process, its GPU), or possibly so
(``backward``: DDP's gradient all-reduce runs inside the autograd engine, so a DDP job stuck on one rank
shows every other rank in ``backward``): what the majority of a stuck job is doing (with NCCL, ranks block in
the next device sync after a hung collective)."""
OWN_WORK_STATES = frozenset({"compute", "io", "idle", "dataloader-wait", "checkpoint-wait", "device-wait", "backward"})
"""Not waiting on a peer: running its own code, its own I/O, a local sleep, a wait on its own child or its
own GPU. While its parallel group waits in a collective, the others wait for such a rank."""
DEVICE_WAIT = frozenset({"synchronize", "wait_event", "wait_stream"})
AUTOGRAD_ENGINE = frozenset({"_engine_run_backward", "run_backward"})


def _is_dist(file: str) -> bool:
    return "distributed" in file or "megatron/core" in file or "c10d" in file or "parallel" in file


def _is_dcp_step(file: str) -> bool:
    """torch.distributed.checkpoint's ``_DistWrapper`` (``checkpoint/utils.py``): its ``all_reduce``,
    ``reduce_scatter``, ``all_gather`` and ``broadcast`` run a local step (planning, writing the rank's shard)
    and then a c10d collective of their own; named like collectives, they are not one (the c10d call inside is)."""
    return file.replace("\\", "/").endswith("distributed/checkpoint/utils.py")


def _is_c10d_wait(fn: str, file: str) -> bool:
    """``Work.wait`` of an async collective (``dist.all_reduce(..., async_op=True).wait()``, DDP/FSDP and
    Megatron's gradient sync): py-spy shows it as ``wait`` in ``distributed_c10d.py`` or ``c10d``; a functional
    collective's (tensor parallel's DTensor redistribution) as ``wait_tensor`` in ``_functional_collectives.py``."""
    return fn in ("wait", "_wait", "wait_all", "block_current_stream", "wait_tensor") and (
        "distributed_c10d" in file or "/c10d" in file or "_functional_collectives" in file
    )


_COLLECTIVE_NAME = re.compile(
    r"^_?(?:all_?gather|reduce_?scatter|all_?reduce|all_to_all|broadcast|(?:monitored_)?barrier|gather|scatter|reduce)"
    r"(?:_|$)"
)
"""The collectives of ``distributed_c10d.py`` and ``_functional_collectives.py`` by their name's stem, whatever
the release calls the variant (``all_gather_single`` and ``reduce_scatter_single``, FSDP2's in torch 2.13;
``all_gather_into_tensor_coalesced``; ``reduce_scatter_tensor``)."""


def _is_c10d_collective(fn: str, file: str) -> bool:
    """A collective call of torch.distributed's own modules, named by its stem (:data:`_COLLECTIVE_NAME`)."""
    f = file.replace("\\", "/")
    return (
        f.endswith(("distributed_c10d.py", "_functional_collectives.py"))
        and bool(_COLLECTIVE_NAME.match(fn))
        and not fn.endswith(("_meta", "_setup_context"))  # fake-tensor shapes and autograd set-up: no wait
    )


def is_startup(frames: Sequence[FrameLike]) -> tuple[bool, int]:
    """Whether the process is still starting, and the frame that says so (-1 if not): joining the process
    group or building its parallel groups (definite), or importing modules (``importing``: the caller checks
    that no training wait sits below the import)."""
    importing = -1
    for i in range(len(frames) - 1, -1, -1):  # outermost first: start-up frames sit outside any step
        f = frames[i]
        if f.function.rsplit(".", 1)[-1] in STARTUP_FUNCTIONS:
            return True, i
        if (
            importing < 0
            and f.function in ("_find_and_load", "_gcd_import")
            and any(x in f.file for x in _IMPORT_FILES)
        ):
            importing = i
    return False, importing


def classify(frames: Sequence[FrameLike], *, role: str = "trainer") -> tuple[str, int]:
    """The state of an innermost-first stack and the index of the frame that decided it.

    States (:data:`STATES`): ``collective``, ``p2p``, ``dataloader-wait``, ``checkpoint-wait``,
    ``device-wait`` (``torch.cuda.synchronize`` and kin: waiting on its own GPU), ``backward`` (inside
    the autograd engine: computing, or waiting in DDP's gradient all-reduce), ``io``, ``idle``,
    ``startup`` (importing modules or joining the process group, before training), ``compute``
    (anything else: the process is running its own code), ``empty``. Decided on the Python frames
    (:func:`python_view`); the index is into ``frames``.
    """
    view, index = python_view(frames)
    if index is not None:
        state, i = _classify(view, role)
        return state, index[i] if i >= 0 else i
    return _classify(frames, role)


def _classify(frames: Sequence[FrameLike], role: str) -> tuple[str, int]:
    if not frames:
        return "empty", -1
    importing = -1
    if role == "trainer":
        definite, importing = is_startup(frames)
        if definite:
            return "startup", importing
    for i, f in enumerate(frames):
        fn = f.function.rsplit(".", 1)[-1]
        if i == 0 and fn == "wrapper" and f.file.replace("\\", "/").endswith("distributed/c10d_logger.py"):
            return "collective", 0  # caught in the logging wrapper every c10d call passes through, inside the call
        if fn in P2P_OPS and (_is_dist(f.file) or fn.startswith(("send_", "recv_"))):
            return "p2p", i
        if fn in COLLECTIVE_OPS and _is_dist(f.file) and not _is_dcp_step(f.file):
            return "collective", i
        if _is_c10d_wait(fn, f.file) or _is_c10d_collective(fn, f.file):
            return "collective", i
        if fn in DATALOADER_WAIT and "utils/data" in f.file.replace("\\", "/"):
            return "dataloader-wait", i
        if fn in CHECKPOINT_WAIT:
            return "checkpoint-wait", i
    if importing >= 0:  # module-level code being imported, no training wait below it: still starting
        return "startup", importing
    for i, f in enumerate(frames[:4]):  # in the autograd engine (C++: backward kernels, DDP's all-reduce hooks)
        if f.function.rsplit(".", 1)[-1] in AUTOGRAD_ENGINE and "autograd" in f.file:
            return "backward", i
    leaf = frames[0].function.rsplit(".", 1)[-1]
    if leaf in DEVICE_WAIT and "torch/cuda" in frames[0].file.replace("\\", "/"):
        return "device-wait", 0
    if leaf in IO_LEAVES:
        return "io", 0
    # a few frames of I/O under a user frame (e.g. numpy read -> fromfile) still count as I/O
    for i, f in enumerate(frames[:4]):
        if f.function.rsplit(".", 1)[-1] in IO_LEAVES and "data" in f.file + (
            frames[i + 1].file if i + 1 < len(frames) else ""
        ):
            return "io", i
    if leaf in IDLE_LEAVES or is_hook_idle_frame(frames[0]):
        return "idle", 0
    return "compute", 0
