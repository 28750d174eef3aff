"""The classification table: fault categories, their domains, and the built-in rules.

A job's last words say a lot about where the fault lives: ``NVRM: Xid (PCI:0000:3b:00): 79`` is the
machine, ``TypeError`` is the code, ``CUDA out of memory`` is the configuration, ``Connection closed by
peer`` only says that *someone else* died first. The table here is data: each :class:`Rule` is a regex
and/or a set of exit codes, a category and a confidence, and a user adds or overrides rules from a TOML
or JSON file (:func:`rankscope.recovery.classify.load_rules`) without touching code. Each category has a
**domain** that tells the decision ladder what kind of fault it is:

============  ======================================================================================
machine       the fault follows the machine (fatal Xid, uncorrectable ECC, GPU lost, local disk): evict
network       NIC / InfiniBand / switch: may recover by itself, tolerate once, evict on a repeat
ambiguous     a kernel bug or a bad GPU (illegal memory access, segfault): needs the stack analysis
symptom       a collective timeout, a lost peer, a teardown signal: a consequence, never a verdict;
              it routes to the aggregation analysis that finds the rank that stopped first
code          user code or configuration (TypeError, shape mismatch, bad arguments): no eviction
data          a bad sample or shard: no eviction
resources     out of memory (CUDA or host): the job asked for too much, no eviction
storage       shared storage (NFS stale handle, remote filesystem): not one machine's fault
numerics      NaN / Inf in the loss or gradients: roll back
none          not a fault: a user's Ctrl-C, a scheduler time limit or preemption
============  ======================================================================================

Sources of the wording: PyTorch's ProcessGroupNCCL watchdog ("Watchdog caught collective operation
timeout: WorkNCCL(...) ran for N milliseconds before timing out", "Some NCCL operations have failed or
timed out"), gloo's TCP transport ("Connection closed by peer [addr]:port", "Timed out waiting Nms for
recv operation to complete"), the CUDA runtime's error strings ("CUDA error: an illegal memory access
was encountered", "uncorrectable ECC error encountered"), PyTorch's allocator ("CUDA out of memory. Tried
to allocate ..."), the NVIDIA driver's kernel log (``NVRM: Xid (PCI:...): N, ...``) with NVIDIA's Xid
catalog for which Xids need a GPU reset or a node reboot, NCCL's IB transport ("NET/IB : Got completion
from peer ... with error 12"), the kernel's OOM killer and ext4 messages, Slurm's ``slurmstepd`` lines,
NVRx's log-signature registry (hardware fault vs CUDA OOM vs NaN vs framework crash vs config mismatch,
and the "NCCL cascade" that means: look for the earlier failure) and Kubeflow's exit-code policy
(1, 2, 126, 127, 128, 139 permanent; 130, 137, 143 and 138 retryable).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from rankscope.datasets.domain.xid import XID_LINE, XIDS, evict_xids
from rankscope.spine import InputError

DOMAINS = (
    "machine",
    "network",
    "ambiguous",
    "symptom",
    "code",
    "data",
    "resources",
    "storage",
    "numerics",
    "none",
    "unknown",
)

CATEGORIES: dict[str, tuple[str, str]] = {
    "gpu_hardware": ("machine", "GPU hardware: a fatal Xid, uncorrectable ECC, a GPU lost or off the bus"),
    "filesystem": ("machine", "the machine's disk or filesystem: full, read-only, I/O errors"),
    "node_failure": ("machine", "the node itself: kernel panic, soft lockup, the scheduler's NODE FAILURE"),
    "network": ("network", "NIC, InfiniBand or switch: link down, transport retries exhausted"),
    "cuda": ("ambiguous", "a CUDA runtime error: a kernel bug or a bad GPU"),
    "crash_signal": ("ambiguous", "a native crash: segfault, bus error, abort, illegal instruction"),
    "collective_timeout": ("symptom", "an NCCL/gloo collective timed out: someone stopped first"),
    "peer_lost": ("symptom", "a peer went away (connection closed/reset): a cascade of an earlier failure"),
    "termination": ("symptom", "terminated by the launcher or the scheduler (teardown, SIGTERM, SIGKILL)"),
    "user_code": ("code", "a Python exception in user code"),
    "config": ("code", "configuration or environment: bad arguments, shapes, checkpoint mismatch"),
    "data": ("data", "a bad sample, record or shard"),
    "oom_cuda": ("resources", "CUDA out of memory"),
    "oom_cpu": ("resources", "host out of memory (OOM killer, MemoryError, shared memory)"),
    "storage": ("storage", "shared storage: stale NFS handle, remote filesystem"),
    "nan_inf": ("numerics", "NaN or Inf in the loss or gradients"),
    "stop_requested": ("none", "stopped on purpose: Ctrl-C, scancel, time limit, preemption"),
}
"""category -> (domain, what it means). A user rule may name a new category if it gives its domain."""

# NVIDIA's Xid catalog, as rankscope.datasets.domain.xid reads it (the node agent's events read the same
# table): the Xids whose machine must be reset or rebooted before it trains again (154 says so in its own
# words, matched below), and those that ask for a reset at the next restart only (below the eviction floor).
FATAL_XIDS: dict[int, tuple[float, str]] = {x: (i.confidence, i.meaning) for x, i in evict_xids().items() if x != 154}
DRAIN_XIDS: dict[int, tuple[float, str]] = {
    x: (i.confidence, i.meaning) for x, i in XIDS.items() if i.action == "drain"
}
APP_XIDS: dict[int, tuple[str, float, str]] = {
    x: ("termination" if i.resolution == "IGNORE" else "cuda", 0.6 if i.resolution == "IGNORE" else 0.5, i.meaning)
    for x, i in XIDS.items()
    if i.action in ("stop-time-check", "none") and x != 154
}


@dataclass(frozen=True)
class Rule:
    """One row of the table: a regex (searched, case-insensitive) and/or exit codes -> a category.

    With both a pattern and exit codes, both must match. ``domain`` is only needed for a category the
    built-in table does not know.
    """

    id: str
    category: str
    pattern: str = ""
    exit_codes: tuple[int, ...] = ()
    confidence: float = 0.8
    note: str = ""
    domain: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            raise InputError("classification rule: 'id' is empty")
        if not self.pattern and not self.exit_codes:
            raise InputError(f"classification rule {self.id!r}: needs a 'pattern' or 'exit_codes'")
        if not 0.0 < self.confidence <= 1.0:
            raise InputError(f"classification rule {self.id!r}: confidence {self.confidence} is outside (0, 1]")
        dom = self.domain or CATEGORIES.get(self.category, ("",))[0]
        if dom not in DOMAINS:
            raise InputError(
                f"classification rule {self.id!r}: category {self.category!r} is not one of "
                f"{sorted(CATEGORIES)}; a new category needs a 'domain' among {DOMAINS}"
            )
        if self.pattern:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise InputError(f"classification rule {self.id!r}: bad regex {self.pattern!r} ({exc})") from None

    @cached_property
    def regex(self) -> re.Pattern[str] | None:
        return re.compile(self.pattern, re.I) if self.pattern else None

    @property
    def effective_domain(self) -> str:
        return self.domain or CATEGORIES[self.category][0]

    def matches(self, text: str, exit_code: int | None) -> re.Match[str] | bool | None:
        if self.exit_codes and (exit_code is None or exit_code not in self.exit_codes):
            return None
        if self.regex is None:
            return True
        return self.regex.search(text)


def _signal_codes(sig: signal.Signals) -> tuple[int, int]:
    """The two ways an exit by signal shows up: 128+N from a shell or Slurm, -N from Python/torchrun."""
    return (128 + int(sig), -int(sig))


def _xid_pattern(xids: Iterable[int]) -> str:
    return XID_LINE.pattern.replace(r"(?P<xid>\d+)", "(?:" + "|".join(str(x) for x in sorted(xids)) + ")")


def _builtin_rules() -> tuple[Rule, ...]:
    r = []
    # --- the machine: GPU hardware -------------------------------------------------------------
    for xid, (conf, meaning) in sorted({**FATAL_XIDS, **DRAIN_XIDS}.items()):
        r.append(Rule(f"xid-{xid}", "gpu_hardware", _xid_pattern([xid]), confidence=conf, note=meaning))
    r += [
        Rule(
            "xid-154-reset",
            "gpu_hardware",
            r"NVRM: Xid \([^)]*\): 154\b.*(?:Node Reboot Required|GPU Reset Required|Drain and Reset)",
            confidence=0.95,
            note="the driver asks for a GPU reset or a node reboot",
        ),
        Rule("gpu-off-bus", "gpu_hardware", r"fallen off the bus", confidence=0.97),
        Rule(
            "gpu-lost",
            "gpu_hardware",
            r"\bGPU is lost\b|Unable to determine the device handle for GPU",
            confidence=0.95,
        ),
        Rule("ecc-uncorrectable", "gpu_hardware", r"uncorrectable ECC error", confidence=0.9),
        Rule("row-remap-failure", "gpu_hardware", r"row remap(?:ping|per)? (?:failure|failed)", confidence=0.9),
    ]
    for xid, (cat, conf, meaning) in sorted(APP_XIDS.items()):
        r.append(Rule(f"xid-{xid}", cat, _xid_pattern([xid]), confidence=conf, note=meaning))
    r.append(Rule("xid-other", "cuda", XID_LINE.pattern, confidence=0.4, note="an Xid not in the fatal list"))
    # --- the machine: disk, node -------------------------------------------------------------------
    r += [
        # a process's ENOSPC / EROFS may be a shared or read-only mount (a configuration matter): below the
        # eviction floor; the agent's disk_full / fs_readonly events and the kernel's remount line are the
        # machine's own word
        Rule("enospc", "filesystem", r"No space left on device|\[Errno 28\]", confidence=0.7),
        Rule("erofs", "filesystem", r"Read-only file system|\[Errno 30\]", confidence=0.6),
        Rule("fs-remount-ro", "filesystem", r"Remounting filesystem read-only", confidence=0.95),
        Rule("ext4-error", "filesystem", r"EXT4-fs error|XFS \([^)]*\): .*(?:corruption|I/O error)", confidence=0.85),
        Rule(
            "block-io-error",
            "filesystem",
            r"(?:blk_update_request|Buffer I/O error|critical medium error).*\bdev\b",
            confidence=0.85,
        ),
        Rule("eio", "filesystem", r"Input/output error|\[Errno 5\]", confidence=0.6),
        Rule("kernel-panic", "node_failure", r"Kernel panic", confidence=0.9),
        Rule(
            "soft-lockup", "node_failure", r"watchdog: BUG: soft lockup|rcu_sched self-detected stall", confidence=0.7
        ),
        Rule(
            "slurm-node-fail",
            "node_failure",
            r"\*\*\* JOB \d+ ON \S+ CANCELLED AT .* DUE TO NODE FAILURE",
            confidence=0.95,
        ),
        Rule(
            "cuda-driver-too-old",
            "node_failure",
            r"CUDA driver version is insufficient for CUDA runtime version",
            confidence=0.6,
            note="this machine's driver differs from its peers'",
        ),
        # --- network --------------------------------------------------------------------------------
        Rule(
            "nccl-ib-completion-error",
            "network",
            r"NET/IB ?: .*Got completion from peer .* with (?:error|status)",
            confidence=0.8,
            note="IB work completion error, e.g. 12 = transport retry counter exceeded",
        ),
        Rule("nccl-ib-port-error", "network", r"NET/IB ?: .*async event: port error", confidence=0.75),
        Rule("ib-retry-exceeded", "network", r"IBV_WC_RETRY_EXC_ERR|transport retry counter exceeded", confidence=0.75),
        Rule("nic-link-down", "network", r"\bLink (?:is )?[Dd]own\b|carrier lost", confidence=0.75),
        Rule(
            "nccl-socket-unreachable",
            "network",
            r"NET/Socket ?: .*(?:Network is unreachable|No route to host)",
            confidence=0.6,
        ),
        # --- symptoms: collective timeouts and lost peers route to the aggregation analysis --------
        Rule(
            "nccl-watchdog-timeout",
            "collective_timeout",
            r"Watchdog caught collective operation timeout",
            confidence=0.95,
        ),
        Rule(
            "nccl-ops-failed", "collective_timeout", r"Some NCCL operations have failed or timed out", confidence=0.85
        ),
        Rule(
            "collective-ran-too-long",
            "collective_timeout",
            r"ran for \d+ milliseconds before timing out",
            confidence=0.9,
        ),
        Rule(
            "gloo-timeout",
            "collective_timeout",
            r"Timed out waiting \d+ ?ms for (?:recv|send) operation",
            confidence=0.9,
        ),
        Rule("monitored-barrier", "collective_timeout", r"failed to pass monitoredBarrier", confidence=0.85),
        Rule(
            "nccl-heartbeat",
            "collective_timeout",
            r"Heartbeat monitor timed out|ProcessGroupNCCL.*\btime(?:d )?out",
            confidence=0.7,
        ),
        Rule("socket-timeout", "collective_timeout", r"\bSocket Timeout\b", confidence=0.6),
        Rule("gloo-peer-closed", "peer_lost", r"Connection closed by peer", confidence=0.9),
        Rule("peer-reset", "peer_lost", r"Connection reset by peer", confidence=0.85),
        Rule("nccl-remote-error", "peer_lost", r"remote process exited or there was a network error", confidence=0.8),
        Rule(
            "nccl-comm-aborted", "peer_lost", r"communicator (?:was )?abort|NCCL communicator .*abort", confidence=0.8
        ),
        Rule("broken-pipe", "peer_lost", r"Broken pipe|\[Errno 32\]", confidence=0.6),
        Rule(
            "dist-network-error",
            "peer_lost",
            r"DistNetworkError|client socket has timed out while trying to connect",
            confidence=0.6,
        ),
        Rule(
            "elastic-sigterm",
            "termination",
            r"Sending process \d+ closing signal SIGTERM|"
            r"Received (?:Signals\.)?(?:SIGTERM|15) death signal",
            confidence=0.85,
        ),
        Rule(
            "child-failed",
            "termination",
            r"ChildFailedError",
            confidence=0.5,
            note="torchrun's summary; the cause is in the ranks' own errors",
        ),
        # --- code, configuration, data, resources ---------------------------------------------------
        Rule("cuda-oom", "oom_cuda", r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory", confidence=0.95),
        Rule(
            "oom-killer",
            "oom_cpu",
            r"Out of memory: Killed process|invoked oom-killer|oom-kill(?:er)?\b|"
            r"Memory cgroup out of memory|Detected \d+ oom.kill event",
            confidence=0.9,
        ),
        Rule("python-memoryerror", "oom_cpu", r"(?:^|\s|\.)MemoryError\b", confidence=0.8),
        Rule("shm-exhausted", "oom_cpu", r"insufficient shared memory \(shm\)", confidence=0.75),
        Rule(
            "cuda-device-assert",
            "user_code",
            r"device-side assert triggered",
            confidence=0.8,
            note="an index or value check in a kernel: the code or the data",
        ),
        Rule(
            "shape-mismatch",
            "user_code",
            r"shapes cannot be multiplied|size of tensor a \(\d+\) must match",
            confidence=0.85,
        ),
        Rule(
            "python-exception",
            "user_code",
            r"(?:^|[\s:\]])(?:\w+\.)*(?:TypeError|ValueError|IndexError|KeyError|AttributeError|NameError|"
            r"ZeroDivisionError|AssertionError|NotImplementedError|UnboundLocalError|RecursionError|"
            r"ImportError|ModuleNotFoundError|SyntaxError)\b(?::|$)",
            confidence=0.8,
        ),
        Rule("state-dict-mismatch", "config", r"Error\(s\) in loading state_dict|size mismatch for", confidence=0.85),
        Rule("bad-arguments", "config", r"unrecognized arguments:|error: argument |invalid choice:", confidence=0.85),
        Rule("nccl-invalid-usage", "config", r"invalid usage \(run with NCCL_DEBUG", confidence=0.8),
        Rule(
            "port-in-use",
            "config",
            r"Address already in use|EADDRINUSE|\[Errno 98\]",
            confidence=0.7,
            note="a port clash: restart with another port",
        ),
        Rule("file-not-found", "config", r"No such file or directory|FileNotFoundError", confidence=0.5),
        Rule("permission-denied", "config", r"Permission denied|PermissionError|\[Errno 13\]", confidence=0.5),
        Rule("unicode-decode", "data", r"UnicodeDecodeError", confidence=0.6),
        Rule(
            "corrupt-data",
            "data",
            r"(?:corrupt(?:ed)?|truncated|invalid) (?:record|sample|shard|jpeg|image|"
            r"data file|tfrecord)|UnidentifiedImageError|ArrowInvalid|Error -3 while decompressing",
            confidence=0.65,
        ),
        Rule("pickle-eof", "data", r"EOFError: Ran out of input", confidence=0.5),
        Rule(
            "stale-nfs", "storage", r"Stale file handle|\[Errno 116\]|nfs: server \S+ not responding", confidence=0.85
        ),
        Rule(
            "nan-loss",
            "nan_inf",
            r"\b(?:loss|grad(?:ient)?[ _-]?norm)\b[^\n]{0,40}?\b(?:nan|inf)\b|found NaN in|"
            r"Detected (?:NaN|Inf)",
            confidence=0.7,
        ),
        # --- deliberate stops -----------------------------------------------------------------------
        Rule("slurm-cancelled", "stop_requested", r"\*\*\* (?:JOB|STEP) [\d.]+ ON \S+ CANCELLED AT", confidence=0.8),
        Rule(
            "slurm-time-limit", "stop_requested", r"CANCELLED AT .* DUE TO (?:TIME LIMIT|PREEMPTION)", confidence=0.95
        ),
        Rule("keyboard-interrupt", "stop_requested", r"KeyboardInterrupt", confidence=0.8),
        # --- native crashes --------------------------------------------------------------------------
        Rule("cuda-illegal-address", "cuda", r"an illegal memory access was encountered", confidence=0.6),
        Rule(
            "cuda-launch-failure",
            "cuda",
            r"unspecified launch failure|an illegal instruction was encountered|"
            r"misaligned address|CUDA error: ",
            confidence=0.5,
        ),
        Rule("nccl-unhandled-cuda", "cuda", r"unhandled cuda error", confidence=0.55),
        Rule(
            "nccl-system-error",
            "network",
            r"unhandled system error",
            confidence=0.45,
            note="ncclSystemError: often a NIC or socket failure; NCCL_DEBUG=INFO says which",
        ),
        Rule("segfault", "crash_signal", r"Segmentation fault|SIGSEGV", confidence=0.6),
        Rule("bus-error", "crash_signal", r"\bBus error\b|SIGBUS", confidence=0.55),
        Rule("illegal-instruction", "crash_signal", r"Illegal instruction|SIGILL", confidence=0.55),
        Rule(
            "cpp-terminate",
            "crash_signal",
            r"terminate called after throwing an instance of|core dumped",
            confidence=0.4,
        ),
    ]
    # --- exit codes (Kubeflow's policy; 128+N and -N are signals) -----------------------------------
    r += [
        Rule(
            "exit-sigkill",
            "termination",
            exit_codes=_signal_codes(signal.SIGKILL),
            confidence=0.4,
            note="SIGKILL: the OOM killer or the scheduler; look for an oom-kill line",
        ),
        Rule("exit-sigterm", "termination", exit_codes=_signal_codes(signal.SIGTERM), confidence=0.7),
        Rule("exit-sigint", "stop_requested", exit_codes=_signal_codes(signal.SIGINT), confidence=0.6),
        Rule(
            "exit-sigusr1",
            "termination",
            exit_codes=_signal_codes(signal.SIGUSR1),
            confidence=0.5,
            note="Kubeflow reserves SIGUSR1 (138) for user-signalled retryable failures",
        ),
        Rule("exit-sigsegv", "crash_signal", exit_codes=_signal_codes(signal.SIGSEGV), confidence=0.6),
        Rule("exit-sigbus", "crash_signal", exit_codes=_signal_codes(signal.SIGBUS), confidence=0.5),
        Rule(
            "exit-sigabrt",
            "crash_signal",
            exit_codes=_signal_codes(signal.SIGABRT),
            confidence=0.4,
            note="SIGABRT: also how the NCCL watchdog takes a process down after a timeout",
        ),
        Rule("exit-sigill", "crash_signal", exit_codes=_signal_codes(signal.SIGILL), confidence=0.5),
        Rule(
            "exit-not-found", "config", exit_codes=(126, 127), confidence=0.8, note="command not executable / not found"
        ),
        Rule("exit-usage", "config", exit_codes=(2,), confidence=0.4, note="a usage error (argparse exits 2)"),
        Rule(
            "exit-nvrx-no-requeue",
            "stop_requested",
            exit_codes=(93,),
            confidence=0.6,
            note="NVRx's 'do not requeue' exit code",
        ),
        Rule(
            "exit-generic",
            "user_code",
            exit_codes=(1,),
            confidence=0.25,
            note="a generic failure: the log lines say more",
        ),
    ]
    return tuple(r)


BUILTIN_RULES: tuple[Rule, ...] = _builtin_rules()

RETRYABLE_EXIT_CODES = frozenset({130, 137, 143, 138})
"""Kubeflow's retryable exit codes; 1, 2, 126, 127, 128 and 139 are permanent there."""
