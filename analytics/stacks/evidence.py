"""The stack evidence of a verdict: each outlier's finding (culprits first, victims named as such), busy
threads of the outliers, dumps cut off and captures that failed, within a limit."""

from __future__ import annotations

from collections.abc import Sequence

from rankscope.analytics.stacks.snapshot import SnapshotAnalysis
from rankscope.analytics.verdict import Evidence
from rankscope.datasets.domain.topology import Topology


def stack_evidence(
    a: SnapshotAnalysis,
    topology: Topology,
    culprit_ranks: Sequence[int],
    victims: Sequence[int] = (),
    limit: int = 100,
) -> tuple[Evidence, ...]:
    first, vic = set(culprit_ranks), set(victims)
    ordered = sorted(a.findings, key=lambda f: (f.rank not in first, f.rank in vic, -f.score, f.rank))
    out = []
    for f in ordered[:limit]:
        if f.rank in vic:
            out.append(
                Evidence(
                    "stacks",
                    "victim",
                    f"waits for the culprit: {f.detail}",
                    (f.rank,),
                    (topology.node_of(f.rank),),
                    0.1,
                )
            )
        else:
            out.append(Evidence("stacks", f.kind, f.detail, (f.rank,), (topology.node_of(f.rank),), f.score))
    for r, words in a.thread_notes[:limit]:
        out.append(Evidence("stacks", "other-thread", words, (r,), (topology.node_of(r),), 0.3))
    if a.cut:
        out.append(
            Evidence(
                "stacks",
                "dump-cut-off",
                "stack dump cut off or never written as the process was "
                "stopped (no frame, or no main thread): no evidence either way",
                a.cut,
                (),
                0.0,
            )
        )
    failed = [p for p in a.problems if p.kind != "cut"]
    if failed:
        out.append(
            Evidence(
                "stacks",
                "capture-failed",
                "stack capture gave no evidence: " + "; ".join(p.line() for p in failed[:3])[:400],
                tuple(sorted({p.rank for p in failed if p.rank is not None})),
                (),
                0.0,
            )
        )
    if len(ordered) > limit:
        rest = ordered[limit:]
        out.append(
            Evidence("stacks", "more-outliers", f"{len(rest)} more outlier ranks", tuple(f.rank for f in rest), (), 0.0)
        )
    return tuple(out)
