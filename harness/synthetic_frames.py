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
def meg(q: str, p: str, n: int) -> Site:
    return Site(q, "meg", p, n)


def torch_site(q: str, p: str, n: int) -> Site:
    return Site(q, "site", p, n)


def std_site(q: str, p: str, n: int) -> Site:
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

WRAPPER = torch_site("_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py", 81)
APPLY = torch_site("Function.apply", "torch/autograd/function.py", 575)
MODCALL = (torch_site("Module._wrapped_call_impl", MODULE, 1739), torch_site("Module._call_impl", MODULE, 1750))


def c10d_call(op: str) -> tuple[Site, ...]:
    lines = {
        "all_reduce": 2810,
        "reduce_scatter_tensor": 4403,
        "all_gather_into_tensor": 3709,
        "broadcast": 2417,
        "barrier": 4551,
        "batch_isend_irecv": 2584,
    }
    return (WRAPPER, torch_site(op, C10D, lines[op]))


def mp_poll_wait(get_line: int = 113) -> tuple[Site, ...]:
    """multiprocessing Queue.get with a timeout, blocked in select (outermost first)."""
    return (
        std_site("Queue.get", MPQ, get_line),
        std_site("_ConnectionBase.poll", CONN, 257),
        std_site("Connection._poll", CONN, 440),
        std_site("wait", CONN, 947),
        std_site("_PollLikeSelector.select", "selectors.py", 415),
    )


def thread_wait(get_line: int) -> tuple[Site, ...]:
    return (std_site("Queue.get", "queue.py", get_line), std_site("Condition.wait", "threading.py", 331))


THREAD_BOOT = (
    std_site("Thread._bootstrap", "threading.py", 1002),
    std_site("Thread._bootstrap_inner", "threading.py", 1045),
)
THREAD_RUN = THREAD_BOOT + (std_site("Thread.run", "threading.py", 982),)

MAIN_PREFIX = (
    meg("<module>", PRE, 270),
    meg("pretrain", TRN, 349),
    meg("train", TRN, 1332),
    meg("train_step", TRN, 714),
)

# Forked children (dataloader workers) keep the parent's stack at fork time below _bootstrap.
FORK_PREFIX = (
    meg("<module>", PRE, 270),
    meg("pretrain", TRN, 312),
    meg("build_train_valid_test_data_iterators", TRN, 1811),
    torch_site("DataLoader.__iter__", DL, 493),
    torch_site("DataLoader._get_iterator", DL, 426),
    torch_site("_MultiProcessingDataLoaderIter.__init__", DL, 1040),
    std_site("BaseProcess.start", PROC, 121),
    std_site("Process._Popen", "multiprocessing/context.py", 224),
    std_site("ForkProcess._Popen", "multiprocessing/context.py", 282),
    std_site("Popen.__init__", "multiprocessing/popen_fork.py", 19),
    std_site("Popen._launch", "multiprocessing/popen_fork.py", 71),
    std_site("BaseProcess._bootstrap", PROC, 314),
    std_site("BaseProcess.run", PROC, 108),
)
SPAWN_PREFIX = (
    Site("<module>", "raw", "<string>", 1),
    std_site("spawn_main", "multiprocessing/spawn.py", 122),
    std_site("_main", "multiprocessing/spawn.py", 135),
    std_site("BaseProcess._bootstrap", PROC, 314),
    std_site("BaseProcess.run", PROC, 108),
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


P2P_OPS = {  # op -> (line in the schedule, schedules.py helper line, p2p_communication.py line)
    "recv_forward": (1391, 1188, 382),
    "recv_backward": (1475, 1200, 407),
    "send_forward": (1399, 1223, 433),
    "send_backward": (1480, 1244, 457),
    "send_forward_recv_backward": (1431, 1258, 482),
    "send_backward_recv_forward": (1447, 1272, 507),
}
