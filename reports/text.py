"""A verdict for people: the decision, what to isolate, why, and the clusters behind it."""

from __future__ import annotations

from rankscope.analytics.verdict import Verdict, rank_ranges


def render_text(v: Verdict, *, max_clusters: int = 8, max_frames: int = 8) -> str:
    """Plain text (no colour codes) so it can be pasted into an incident ticket."""
    out = [
        f"verdict: {v.verdict}   confidence: {v.confidence:.2f}   job: {v.job or '-'}   "
        f"ranks: {v.world_size}   snapshots: {v.n_snapshots}   evidence: {', '.join(v.sources) or '-'}"
    ]
    if v.suspect_nodes:
        g = v.suspect_group
        where = f" ({g.kind.upper()} group(s) {', '.join(map(str, g.indices[:10]))})" if g and g.kind != "node" else ""
        out.append(
            f"isolate: {len(v.suspect_nodes)} node(s){where}: {', '.join(v.suspect_nodes[:32])}"
            + (" ..." if len(v.suspect_nodes) > 32 else "")
        )
        out.append(
            f"culprit: {', '.join(v.culprit_nodes) or '(none singled out: isolate the whole group)'}"
            + (f"   rank(s) {rank_ranges(v.culprit_ranks)}" if v.culprit_ranks else "")
        )
        out.append(f"suspect ranks: {rank_ranges(v.suspect_ranks)[:400]}")
    else:
        out.append("isolate: nothing")
    out.append("")
    out.append("why:")
    out.extend(f"  - {r}" for r in v.reasons)
    if v.clusters:
        out.append("")
        out.append("clusters (largest first):")
        for c in v.clusters[:max_clusters]:
            tag = "healthy" if c.healthy else "OUTLIER"
            out.append(
                f"  #{c.id} {tag:8} {c.role:10} {c.size:>7} proc(s) on {c.n_nodes} node(s)  state={c.state}  "
                f"ranks {rank_ranges(c.ranks)[:120]}"
            )
            frames = list(c.representative)[-max_frames:][::-1]  # innermost first, as py-spy prints
            for f in frames:
                out.append(f"        {f}")
            if len(c.representative) > max_frames:
                out.append(f"        ... {len(c.representative) - max_frames} outer frame(s)")
        if len(v.clusters) > max_clusters:
            out.append(f"  ... {len(v.clusters) - max_clusters} more cluster(s) (see --format json)")
    notes = v.details.get("notes") if isinstance(v.details, dict) else None
    if notes:
        out.append("")
        out.append("notes:")
        out.extend(f"  - {n}" for n in notes)
    return "\n".join(out)
