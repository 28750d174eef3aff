"""The words of a Flight Recorder finding: groups, waits and why a rank is a culprit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rankscope.analytics.collectives.waits import P2PWait, Wait
from rankscope.analytics.verdict import rank_ranges

if TYPE_CHECKING:
    from rankscope.analytics.collectives.facts import CollectiveFacts


def pg_words(name: str, desc: str, kind: str) -> str:
    d = f" {desc}" if desc and desc != "undefined" else ""
    return f"pg {name}{d} [{kind}]"


def wait_words(f: CollectiveFacts, w: Wait) -> str:
    info = f.groups[w.group]
    e = w.entry
    peers = f"rank(s) {rank_ranges(w.waited_for)}" if w.waited_for else "its peer (none waited for)"
    what = f"{e.op} to/from {peers}" if e.is_p2p else f"#{e.collective_seq_id} ({e.op})"
    ref = f.clock.ref(w.group)
    usual = f"; normal in this group: {ref:.3g} s (p99 op latency or gap between ops)" if ref is not None else ""
    return f"rank {w.rank} has waited in {pg_words(info.name, info.desc, info.kind)} {what} {w.timing.words()}{usual}"


def culprit_words(f: CollectiveFacts, r: int, p2p: Sequence[P2PWait]) -> tuple[str, str]:
    """Why rank ``r`` is a culprit: (evidence kind, words)."""
    if r in f.no_dump:
        waiters = sorted({w.rank for w in f.graph.all_waits() if r in w.waited_for})
        return (
            "missing-dump",
            f"rank {r} left no Flight Recorder dump; rank(s) {rank_ranges(waiters)[:100]} wait for it",
        )
    for s in f.stalls:
        if r in s.missing_ranks:
            verb = "has not started" if s.starts else "never enqueued"
            return (
                "missing-from-collective",
                f"rank {r} {verb} collective #{s.seq} ({s.op}) of "
                f"{pg_words(s.pg, s.desc, s.kind)}, which {len(s.waiting_ranks)} member(s) wait in",
            )
    for g, waiter, peer, op in p2p:
        if peer == r:
            other = "send" if op == "recv" else "recv"
            info = f.groups[g]
            return (
                "p2p-peer-behind",
                f"rank {r} has not started the {other} that rank {waiter} waits for in {op} "
                f"({pg_words(info.name, info.desc, info.kind)})",
            )
    return ("waited-for", f"ranks wait for rank {r}, which waits for nobody")


UNSTARTED_WORDS = (
    "No op start is recorded (NCCL timing off, TORCH_NCCL_ENABLE_TIMING unset): the op each rank is blocked in is "
    "inferred from the order it issued them, so a rank queued behind a transfer can look like where the waits end. "
    "Confirm with stacks before evicting."
)
