"""The two stack figures: the rank grid (ranks by parallel group, coloured by cluster) and the merged
call-prefix tree. Numbers from :mod:`.grid` and :mod:`.tree`; drawn with :mod:`.drawing`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import polars as pl

from rankscope.reports import grid as gd
from rankscope.reports import tree as tr
from rankscope.reports.clusters import short_frame
from rankscope.reports.drawing import (
    CULPRIT_COLOUR,
    DPI,
    SUSPECT_COLOUR,
    Figure,
    class_colours,
    clip,
    mpl_context,
    new_figure,
    render_png,
)


# -- 1. rank grid ------------------------------------------------------------------------------------
def rank_grid(verdict: Mapping[str, Any], topology: pl.DataFrame | None) -> Figure | None:
    """Ranks laid out by TP x PP x DP, coloured by stack cluster, suspects and culprits outlined."""
    if topology is None or not (verdict.get("clusters") or verdict.get("suspect_ranks")):
        return None
    g = gd.rank_grid(verdict, topology)
    rows, cols = g.codes.shape
    with mpl_context():
        from matplotlib.collections import LineCollection
        from matplotlib.colors import ListedColormap
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        colours = class_colours(g.classes)
        cmap = ListedColormap([*colours, "#ffffff"])
        img = np.where(g.codes < 0, len(colours), g.codes)
        used = set(np.unique(g.codes).tolist())
        handles: list[Any] = [
            Patch(facecolor=c, edgecolor="#888", label=clip(k.label, 84))
            for i, (c, k) in enumerate(zip(colours, g.classes))
            if i in used
        ]
        boundaries = g.cell_unit != "node" and g.ranks_per_cell < 8 and g.n_nodes < g.world
        if boundaries:
            handles.append(Line2D([], [], color="#6e6e6e", lw=0.8, label="machine boundary"))
        if g.suspect.any():
            handles.append(Line2D([], [], color=SUSPECT_COLOUR, lw=2.2, label="suspect (isolate)"))
        if g.culprit.any():
            handles.append(Line2D([], [], color=CULPRIT_COLOUR, lw=2.6, label="likeliest culprit"))
        w = 11.0
        h = float(np.clip(w * rows / max(cols, 1) * 0.6, max(0.9, min(2.2, 0.5 * rows)), 6.0))
        leg_h = 0.19 * math.ceil(len(handles) / 2) + 0.05
        total = h + 0.75 + leg_h
        fig = new_figure(w, total)
        ax = fig.add_axes((0.1, (leg_h + 0.55) / total, 0.87, h / total))
        leg_ax = fig.add_axes((0.1, 0.0, 0.87, leg_h / total))
        leg_ax.axis("off")
        ax.imshow(
            img,
            cmap=cmap,
            vmin=-0.5,
            vmax=len(colours) + 0.5,
            interpolation="nearest",
            aspect="auto",
            extent=(0, cols, rows, 0),
        )
        if boundaries:
            segs = gd.boundary_segments(g.node)
            ax.add_collection(
                LineCollection(cast(Any, segs), colors="#6e6e6e", linewidths=0.6 if rows * cols < 2000 else 0.35)
            )
        for e in g.band_edges:
            ax.axhline(e, color="#222222", lw=1.0 if g.wrap_edges else 1.3)
        for e in g.wrap_edges:
            ax.axhline(e, color="#000000", lw=3.0)
        if g.suspect.any():
            ax.add_collection(
                LineCollection(cast(Any, gd.mask_outline(g.suspect)), colors=SUSPECT_COLOUR, linewidths=2.2)
            )
        if g.culprit.any():
            ax.add_collection(
                LineCollection(cast(Any, gd.mask_outline(g.culprit)), colors=CULPRIT_COLOUR, linewidths=2.6)
            )
            cell_px = min(w * 0.87 / cols, h / rows) * DPI
            if cell_px < 14:  # cells too small to see an outline: ring the culprits
                ci, cj = np.nonzero(g.culprit)
                ax.scatter(
                    cj + 0.5,
                    ci + 0.5,
                    s=260,
                    facecolors="none",
                    edgecolors=CULPRIT_COLOUR,
                    linewidths=2.0,
                    zorder=5,
                    clip_on=False,
                )
        if g.cell_unit == "rank" and rows * cols <= 400:
            fs = 6 if rows * cols > 120 else 7
            for (i, j), r in np.ndenumerate(g.first_rank):
                if r >= 0:
                    dark = g.codes[i, j] >= 0 and g.classes[g.codes[i, j]].kind in ("missing", "outlier")
                    ax.text(
                        j + 0.5,
                        i + 0.5,
                        str(r),
                        ha="center",
                        va="center",
                        fontsize=fs,
                        color="white" if dark else "#333333",
                    )
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)
        ax.set_xlabel(g.xlabel)
        ax.set_ylabel(g.ylabel)
        if g.yticks:
            ax.set_yticks([p for p, _ in g.yticks], [lb for _, lb in g.yticks])
        else:
            ax.set_yticks([])
        if cols <= 40:
            ax.set_xticks(np.arange(cols) + 0.5, [str(i) for i in range(cols)])
        else:
            step = max(1, cols // 16)
            ax.set_xticks(np.arange(0, cols, step) + 0.5, [str(i) for i in range(0, cols, step)])
        ax.tick_params(length=2)
        for s in ax.spines.values():
            s.set_visible(False)
        what = f"{g.world} ranks on {g.n_nodes} machines; one cell = one {g.cell_unit}"
        if g.ranks_per_cell > 1 and g.cell_unit != "rank":
            what += f" (up to {g.ranks_per_cell} ranks, coloured by the most unusual stack among them)"
        ax.set_title(what, loc="left")
        leg_ax.legend(
            handles=handles,
            loc="upper left",
            ncol=2,
            frameon=False,
            handlelength=1.4,
            columnspacing=1.2,
            borderaxespad=0,
        )
    how = (
        "rows are pipeline stages (thick lines) split by TP rank"
        if g.band_edges or "TP" in g.ylabel
        else g.ylabel.lower()
    )
    cap = (
        f"Each cell is one {g.cell_unit} placed by its parallel coordinates (columns: DP replica; {how}); "
        "colour is its stack cluster, grey lines separate machines. Black outlines mark the ranks to "
        "isolate, red the likeliest culprit: look for the colour that breaks the pattern."
    )
    if g.cell_unit == "node" or g.cell_unit.endswith("nodes"):
        cap = (
            f"Each cell is one {g.cell_unit} in rank order (too many ranks to draw one by one), coloured by "
            "the most unusual stack cluster on it; black outlines mark the machines to isolate, red the "
            "likeliest culprit."
        )
    return render_png(fig, "rank-grid", "Ranks by parallel group", cap)


# -- 2. prefix tree ----------------------------------------------------------------------------------
ROOT_W = 1.0
LABEL_CHARS = 46
STATUS_STYLE = {  # face, edge
    "healthy": ("#e3edf7", "#6b8fb5"),
    "outlier": ("#fde3cc", "#d9480f"),
    "mixed": ("#f1f1f1", "#8c8c8c"),
    "summary": ("#ffffff", "#b0b0b0"),
    "root": ("#f7f7f7", "#555555"),
}


def _tree_label(node: tr.TreeNode) -> list[str]:
    if node.status == "root":
        return [node.label]
    parts = node.label.split(" > ")
    if len(parts) == 1:
        lines = [short_frame(parts[0], LABEL_CHARS)]
    elif len(parts) == 3 and parts[1].startswith("... "):
        lines = [
            short_frame(parts[0], LABEL_CHARS),
            "⋮ " + parts[1].strip(". ").strip(),
            short_frame(parts[2], LABEL_CHARS),
        ]
    else:
        lines = [short_frame(parts[0], LABEL_CHARS), short_frame(parts[-1], LABEL_CHARS)]
    if node.folded:
        lines.append(f"⋮ +{node.folded} branch(es) below, folded")
    return lines


def prefix_tree(verdict: Mapping[str, Any]) -> Figure | None:
    """The merged call-prefix tree (STAT's 2D trace/space view), outlier branches highlighted."""
    root = tr.prefix_tree(verdict)
    if root is None:
        return None
    nodes = root.walk()
    depth = int(max(n.x for n in nodes))
    n_leaves = int(max(n.y for n in nodes)) + 1
    box_w, gap, row_h = 2.7, 1.2, 0.66
    col_w = box_w + gap
    W = 0.2 + (depth + 1) * col_w - gap + 0.2
    H = 0.35 + n_leaves * row_h
    with mpl_context():
        from matplotlib.lines import Line2D
        from matplotlib.patches import FancyBboxPatch, Patch

        fig = new_figure(W, H + 0.45)
        ax = fig.add_axes((0, 0.45 / (H + 0.45), 1, H / (H + 0.45)))
        ax.set_xlim(0, W)
        ax.set_ylim(H, 0)
        ax.axis("off")

        def pos(n: tr.TreeNode) -> tuple[float, float]:
            return 0.2 + n.x * col_w, 0.25 + n.y * row_h + row_h / 2

        for n in nodes:
            x, y = pos(n)
            bw = box_w if n.status != "root" else ROOT_W
            for ch in n.children:
                cx, cy = pos(ch)
                face, edge = STATUS_STYLE[ch.status]
                lw = 0.8 + 2.2 * math.log1p(ch.n_ranks) / math.log1p(max(root.n_ranks, 2))
                colour = edge if ch.status != "summary" else "#b0b0b0"
                if ch.culprit:
                    colour = CULPRIT_COLOUR
                xm = x + box_w + 0.18
                ax.plot([x + bw, xm, xm, cx], [y, y, cy, cy], color=colour, lw=lw, solid_joinstyle="miter", zorder=1)
                label = f"{ch.n_ranks}:[{ch.ranks}]" if ch.ranks else f"{ch.n_ranks}"
                ax.text(
                    cx - 0.05, cy - 0.05, clip(label, 27), ha="right", va="bottom", fontsize=6.5, color=colour, zorder=3
                )
        for n in nodes:
            x, y = pos(n)
            lines = _tree_label(n)
            face, edge = STATUS_STYLE[n.status]
            h = 0.13 * len(lines) + 0.1
            bw = box_w if n.status != "root" else ROOT_W
            ax.add_patch(
                FancyBboxPatch(
                    (x, y - h / 2),
                    bw,
                    h,
                    boxstyle="round,pad=0,rounding_size=0.05",
                    facecolor=face,
                    edgecolor=CULPRIT_COLOUR if n.culprit else edge,
                    lw=2.2 if n.culprit else 0.9,
                    ls="--" if n.status == "summary" else "-",
                    zorder=2,
                )
            )
            for k, text in enumerate(lines):
                ax.text(
                    x + 0.06,
                    y - h / 2 + 0.05 + 0.13 * k + 0.065,
                    text,
                    ha="left",
                    va="center",
                    fontsize=6.8,
                    zorder=4,
                    color="#222222" if not text.startswith("⋮") else "#777777",
                    fontweight="bold" if k == 0 and n.status == "outlier" else "normal",
                )
        handles: list[Any] = [
            Patch(facecolor=STATUS_STYLE[s][0], edgecolor=STATUS_STYLE[s][1], label=lb)
            for s, lb in (
                ("outlier", "outlier branch (only outlier ranks)"),
                ("healthy", "healthy branch"),
                ("mixed", "shared prefix"),
            )
        ]
        handles.append(Line2D([], [], color=CULPRIT_COLOUR, lw=2.2, label="holds a culprit rank"))
        fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.01, 0.0), ncol=4, frameon=False)
    cap = (
        "The stacks of all ranks merged by common call prefix, outermost frame on the left (STAT's view); "
        "each edge says how many ranks take that branch and which. Orange branches hold only outlier ranks "
        "and a red outline holds a culprit: read where the odd branch leaves the crowd."
    )
    return render_png(fig, "prefix-tree", "Merged call-prefix tree", cap, tight=False)
