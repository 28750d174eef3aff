"""NVIDIA Xid errors: what each one means and what to do about the machine, in one table.

The node agent (:mod:`rankscope.collectors.events`) turns an Xid into a health event with a severity and
an action; the recovery ladder (:mod:`rankscope.recovery`) decides on those events and on Xid lines in
the job's logs. Both read this table, so they never disagree.

Source: NVIDIA's Xid catalog for Ampere and newer GPUs (docs.nvidia.com/deploy/xid-errors), whose
"resolution bucket" says what the GPU needs: ``RESTART_APP`` (the application faulted or was killed;
the GPU is fine), ``RESET_GPU`` (the GPU must be reset before it runs work again), ``RESTART_BM``
(reboot the machine), ``IGNORE``. rankscope's action follows from it, for a training job that cannot
lose a member:

``evict``   the GPU needs a reset or the machine a reboot before it can train again: take the machine
            out now and restart on a standby (double-bit / uncontained / unrecovered ECC, row-remap
            failure, a GPU off the bus, NVLink, GSP and micro-controller faults, a contained ECC error
            that killed a rank: uncorrectable errors, the paper's "evict at once" events);
``drain``   the GPU works but needs a reset at its next opportunity (a row remap pending, a high
            rate of *corrected* errors): keep training, take the machine out when the job next
            restarts; never a reason to stop a healthy job;
``stop-time-check``  usually the application (an illegal address, an engine exception): look at the
            code first; the machine only if it repeats on the same GPU;
``none``    informational.

``confidence`` is how sure the ladder may be that the machine, not the job, is at fault; the ladder
evicts at 0.85 and above.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ACTIONS = ("evict", "drain", "stop-time-check", "none")


@dataclass(frozen=True)
class XidInfo:
    """One Xid: its meaning, NVIDIA's resolution bucket, and what rankscope does about the machine."""

    xid: int
    meaning: str
    resolution: str  # NVIDIA's immediate action: RESET_GPU, RESTART_BM, RESTART_APP, IGNORE
    action: str  # one of ACTIONS
    confidence: float  # that the machine (not the job) is at fault

    @property
    def severity(self) -> str:
        """The health event's severity: critical (evict), warning (drain, check), info (none)."""
        return {"evict": "critical", "none": "info"}.get(self.action, "warning")


_ROWS: tuple[tuple[int, str, str, float, str], ...] = (
    # Xid, NVIDIA's resolution bucket, rankscope's action, confidence (the machine is at fault), meaning
    (13, "RESTART_APP", "stop-time-check", 0.3, "graphics engine exception (usually the application)"),
    (31, "RESTART_APP", "stop-time-check", 0.3, "GPU memory page fault (usually the application: a bad address)"),
    (43, "RESTART_APP", "none", 0.2, "GPU stopped processing (the application was killed or faulted)"),
    (45, "IGNORE", "none", 0.1, "preemptive cleanup after the process was killed"),
    (48, "RESET_GPU", "evict", 0.95, "double-bit ECC error"),
    (61, "RESET_GPU", "evict", 0.85, "internal micro-controller breakpoint/warning"),
    (62, "RESET_GPU", "evict", 0.9, "internal micro-controller halt"),
    (63, "RESET_GPU", "drain", 0.6, "ECC page retirement / row remap recorded: a GPU reset activates it"),
    (64, "RESET_GPU", "evict", 0.95, "ECC page retirement / row remapping failure"),
    (74, "RESET_GPU", "evict", 0.9, "NVLink error"),
    (79, "RESTART_BM", "evict", 0.98, "GPU has fallen off the bus"),
    (92, "RESET_GPU", "drain", 0.6, "high single-bit ECC error rate (corrected errors: the memory degrades)"),
    (94, "RESET_GPU", "evict", 0.9, "contained ECC error: an uncorrectable error killed the process using it"),
    (95, "RESET_GPU", "evict", 0.95, "uncontained ECC error"),
    (119, "RESET_GPU", "evict", 0.9, "GSP RPC timeout"),
    (120, "RESET_GPU", "evict", 0.9, "GSP error"),
    (140, "RESET_GPU", "evict", 0.95, "unrecovered ECC error"),
    (154, "RESET_GPU", "evict", 0.95, "GPU recovery action changed (the message says: reset, reboot, drain)"),
)

XIDS: dict[int, XidInfo] = {x: XidInfo(x, meaning, res, act, conf) for x, res, act, conf, meaning in _ROWS}
"""Every Xid rankscope has a policy for; any other Xid is :data:`UNLISTED`."""

UNLISTED = XidInfo(0, "an Xid not in rankscope's table", "CONTACT_SUPPORT", "stop-time-check", 0.4)

XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)\b")
"""The driver's kernel-log line: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus``."""

_RECOVERY_154 = re.compile(r"Node Reboot Required|GPU Reset Required|Drain and Reset|Drain P2P", re.I)


def xid_info(xid: int, message: str = "") -> XidInfo:
    """The policy for one Xid. Xid 154 says its own recovery action: without "Reboot", "Reset" or
    "Drain" in its message it asks for nothing and is informational."""
    info = XIDS.get(xid)
    if info is None:
        return XidInfo(xid, UNLISTED.meaning, UNLISTED.resolution, UNLISTED.action, UNLISTED.confidence)
    if xid == 154 and message and not _RECOVERY_154.search(message):
        return XidInfo(154, "GPU recovery action changed to none", "IGNORE", "none", 0.1)
    return info


def evict_xids() -> dict[int, XidInfo]:
    """The Xids whose action is ``evict``: the machine is taken out without further analysis."""
    return {x: i for x, i in XIDS.items() if i.action == "evict"}
