"""The classification table: real wording from PyTorch, gloo, NCCL, the CUDA runtime, the NVIDIA driver,
the kernel and Slurm lands in the right category; exit codes follow Kubeflow's policy; users extend it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankscope.recovery.classify import BUILTIN_RULES, CATEGORIES, DEFAULT_TABLE, LogLine, Rule, load_rules, table_with
from rankscope.spine import InputError

LINES = [
    # (line, category, domain)
    (
        "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran "
        "for 600081 milliseconds before timing out.",
        "collective_timeout",
        "symptom",
    ),
    (
        "[E ProcessGroupNCCL.cpp:414] Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
        "CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        "collective_timeout",
        "symptom",
    ),
    (
        "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[127.0.0.1]:58054",
        "peer_lost",
        "symptom",
    ),
    ("RuntimeError: Timed out waiting 12000ms for recv operation to complete", "collective_timeout", "symptom"),
    ("RuntimeError: Rank 1 failed to pass monitoredBarrier in 2000 ms", "collective_timeout", "symptom"),
    (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, remote "
        "process exited or there was a network error, NCCL version 2.19.3",
        "peer_lost",
        "symptom",
    ),
    (
        "[2024-05-01 10:00:00,000] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending "
        "process 4242 closing "
        "signal SIGTERM",
        "termination",
        "symptom",
    ),
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "gpu_hardware", "machine"),
    (
        "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
        "gpu_hardware",
        "machine",
    ),
    (
        "NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, An uncorrectable double bit error (DBE) has been detected on GPU",
        "gpu_hardware",
        "machine",
    ),
    (
        "NVRM: Xid (PCI:0000:9a:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
        "gpu_hardware",
        "machine",
    ),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "gpu_hardware", "machine"),
    (
        "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system to "
        "recover this GPU",
        "gpu_hardware",
        "machine",
    ),
    ("NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, Graphics Exception: ESR 0x404600=0x80000002", "cuda", "ambiguous"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda", "ambiguous"),
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 146.00 MiB. GPU 0 has a total "
        "capacity of 8.00 GiB "
        "of which 0 bytes is free.",
        "oom_cuda",
        "resources",
    ),
    (
        "[ 8712.443] Out of memory: Killed process 4242 (python) total-vm:91234567kB, anon-rss:81234567kB",
        "oom_cpu",
        "resources",
    ),
    (
        "slurmstepd: error: Detected 1 oom_kill event in StepId=1234.0. Some of your processes may have been killed by "
        "the cgroup out-of-memory handler.",
        "oom_cpu",
        "resources",
    ),
    (
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
        "oom_cpu",
        "resources",
    ),
    ("RuntimeError: CUDA error: device-side assert triggered", "user_code", "code"),
    ("TypeError: unsupported operand type(s) for +: 'int' and 'str'", "user_code", "code"),
    ("  File \"train.py\", line 12\nKeyError: 'input_ids'", "user_code", "code"),
    ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x512 and 256x1024)", "user_code", "code"),
    ("RuntimeError: Error(s) in loading state_dict for GPT: size mismatch for wte.weight", "config", "code"),
    ("train.py: error: unrecognized arguments: --lr0.1", "config", "code"),
    ("EXT4-fs (nvme0n1p1): Remounting filesystem read-only", "filesystem", "machine"),
    ("OSError: [Errno 28] No space left on device", "filesystem", "machine"),
    ("OSError: [Errno 116] Stale file handle", "storage", "storage"),
    ("UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0", "data", "data"),
    (
        "NCCL WARN NET/IB : Got completion from peer 10.0.0.1<58224> with error 12, opcode 0, len 0, vendor err 129 "
        "(Recv)",
        "network",
        "network",
    ),
    ("mlx5_core 0000:5e:00.0 ib0: Link down", "network", "network"),
    ("iteration 5120 | lm loss: nan | grad norm: 12.3", "nan_inf", "numerics"),
    (
        "slurmstepd: error: *** JOB 1234 ON gpu07 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***",
        "stop_requested",
        "none",
    ),
    (
        "slurmstepd: error: *** JOB 1234 ON gpu07 CANCELLED AT 2024-01-01T00:00:00 DUE TO NODE FAILURE ***",
        "node_failure",
        "machine",
    ),
    ("Fatal Python error: Segmentation fault", "crash_signal", "ambiguous"),
]


@pytest.mark.parametrize("line,category,domain", LINES)
def test_real_lines_are_classified(line: str, category: str, domain: str) -> None:
    c = DEFAULT_TABLE.classify(line)
    assert c is not None, line
    assert (c.category, c.domain) == (category, domain), (line, c.rule)


def test_unrelated_lines_are_not_classified() -> None:
    for line in [
        "step 100 loss 2.31 lr 3e-4",
        "Saving checkpoint to /ckpt/step-100",
        "INFO: infinity and beyond",
        "Traceback (most recent call last):",
        "NCCL INFO Channel 00/02 : 0 1",
    ]:
        assert DEFAULT_TABLE.classify(line) is None, line


def test_xid_number_rank_and_node_are_kept() -> None:
    c = DEFAULT_TABLE.classify_lines(
        [LogLine("NVRM: Xid (PCI:0000:3b:00): 94, pid=9, Contained: SM (0x1)", node="gpu-3", time=5.0)]
    )[0]
    assert (c.xid, c.node, c.time) == (94, "gpu-3", 5.0)
    c = DEFAULT_TABLE.classify("[rank7]: RuntimeError: Connection closed by peer [10.0.0.2]:1")
    assert c is not None and c.rank == 7 and c.is_symptom


@pytest.mark.parametrize(
    "code,category,retryable",
    [
        (-9, "termination", None),
        (137, "termination", True),
        (143, "termination", True),
        (-15, "termination", None),
        (130, "stop_requested", True),
        (139, "crash_signal", False),
        (-11, "crash_signal", None),
        (127, "config", False),
        (126, "config", False),
        (2, "config", False),
        (1, "user_code", False),
        (138, "termination", True),
        (134, "crash_signal", False),
        (93, "stop_requested", False),
    ],
)
def test_exit_codes_follow_signals_and_kubeflow_policy(code: int, category: str, retryable: bool | None) -> None:
    c = DEFAULT_TABLE.classify_exit(exit_code=code)
    assert c is not None and c.category == category
    if code > 0:
        assert c.retryable is retryable


def test_exit_with_a_message_prefers_the_more_specific_text() -> None:
    c = DEFAULT_TABLE.classify_exit(exit_code=1, kind="OutOfMemoryError", message="CUDA out of memory. Tried to ...")
    assert c is not None and c.category == "oom_cuda" and c.exit_code == 1
    v = DEFAULT_TABLE.classify_exit(kind="vanished")
    assert v is not None and v.is_symptom


def test_every_builtin_rule_is_well_formed() -> None:
    assert len({r.id for r in BUILTIN_RULES}) == len(BUILTIN_RULES)
    for r in BUILTIN_RULES:
        assert r.category in CATEGORIES and 0 < r.confidence <= 1


def test_user_rules_from_toml_and_json_extend_and_override(tmp_path: Path) -> None:
    toml = tmp_path / "rules.toml"
    toml.write_text(
        '[[rules]]\nid = "lustre-evict"\ncategory = "storage"\npattern = "LustreError: .* evicted"\n'
        'confidence = 0.9\n\n[[rules]]\nid = "exit-generic"\ncategory = "config"\nexit_codes = [1]\n'
        'confidence = 0.3\n\n[[rules]]\nid = "our-hw"\ncategory = "bmc_alarm"\ndomain = "machine"\n'
        'pattern = "BMC: PSU failure"\nconfidence = 0.95\n'
    )
    t = table_with(toml)
    c = t.classify("LustreError: 11-0: lustre-OST0002: evicted by server")
    assert c is not None and c.category == "storage" and c.rule == "lustre-evict"
    ec = t.classify_exit(exit_code=1)
    assert ec is not None and ec.category == "config"  # the user's rule replaced the built-in one
    hw = t.classify("BMC: PSU failure on slot 2")
    assert hw is not None and hw.domain == "machine"
    js = tmp_path / "rules.json"
    js.write_text(json.dumps({"rules": [{"id": "x", "category": "data", "pattern": "bad shard \\d+"}]}))
    assert table_with(js).classify("bad shard 17") is not None


@pytest.mark.parametrize(
    "body,match",
    [
        ('[[rules]]\nid = "a"\ncategory = "nope"\npattern = "x"\n', "category 'nope'"),
        ('[[rules]]\nid = "a"\ncategory = "data"\npattern = "("\n', "bad regex"),
        ('[[rules]]\nid = "a"\ncategory = "data"\n', "needs a 'pattern' or 'exit_codes'"),
        ('[[rules]]\nid = "a"\ncategory = "data"\npattern = "x"\ncolour = 1\n', "unknown key"),
        ("rules = 3\n", "expected a list of rules"),
        ("[[rules]\n", "not valid TOML"),
    ],
)
def test_bad_rules_files_give_one_clear_error(tmp_path: Path, body: str, match: str) -> None:
    p = tmp_path / "r.toml"
    p.write_text(body)
    with pytest.raises(InputError, match=match) as e:
        load_rules(p)
    assert str(p) in str(e.value)


def test_rule_needs_a_domain_for_a_new_category() -> None:
    with pytest.raises(InputError, match="needs a 'domain'"):
        Rule("r", "brand-new", "x")


def test_the_agent_and_the_ladder_read_one_xid_table() -> None:
    """collectors/events.py (the agent's event actions) and the ladder agree on every Xid, by construction."""
    from rankscope.collectors.events import XID, xid_event
    from rankscope.datasets.domain.xid import XIDS
    from rankscope.recovery.planner import make_plan, situation_from_obj

    assert set(XID) == set(XIDS)
    for xid, info in XIDS.items():
        text = f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1, GPU Reset Required"
        event = xid_event(xid, text)
        assert (event.action, event.severity) == (info.action, info.severity)
        row = {"kind": "xid", "xid": xid, "node": "m1", "time": 100.0, "message": text}
        plan = make_plan(situation_from_obj({"events": [row], "machines": ["m0", "m1"], "now": 100.0}))
        assert (plan.evicted == ("m1",)) == (info.action == "evict"), (xid, plan.rule)
        c = DEFAULT_TABLE.classify(text)
        assert c is not None and c.xid == xid
        assert (c.domain == "machine" and c.confidence >= 0.85) == (info.action == "evict"), (xid, c)
