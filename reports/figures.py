"""The report's figures, one function per figure, drawn with matplotlib (Agg, no pyplot, imported lazily).

Each function takes the verdict dict and, where it needs more, one evidence table (see
:mod:`.evidence`), and returns a :class:`Figure` (PNG bytes + a caption saying how to read it) or
None when its evidence is absent. The numbers come from :mod:`.grid`, :mod:`.tree` and
:mod:`.figure_data`; the rank grid and prefix tree are drawn in :mod:`.figures_stacks`. All input text
is drawn with mathtext off, so a frame named ``$x$`` or ``<script>`` prints as is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import polars as pl

from rankscope.reports import figure_data as fd
from rankscope.reports.drawing import CULPRIT_COLOUR, DAY_S, FONT, Figure, clip, mpl_context, new_figure, render_png
from rankscope.reports.evidence import ReportEvidence
from rankscope.reports.figures_stacks import prefix_tree, rank_grid

if TYPE_CHECKING:  # matplotlib is imported only when a figure is drawn
    from matplotlib.axes import Axes

__all__ = [
    "FIGURES",
    "Figure",
    "all_figures",
    "crash_timeline",
    "failslow_rounds",
    "fr_wavefront",
    "metric_series",
    "prefix_tree",
    "rank_grid",
    "step_heatmap",
]


# -- 3. fail-slow rounds -----------------------------------------------------------------------------
def failslow_rounds(verdict: Mapping[str, Any]) -> Figure | None:
    """Which parallel group each snapshot round flagged (ByteRobust's fail-slow vote)."""
    r = fd.failslow_rounds(verdict)
    if r is None:
        return None
    n_rows = len(r.groups) + 1
    with mpl_context():
        from matplotlib.colors import Normalize

        fig = new_figure(min(11.0, 3.8 + 0.55 * r.n_rounds), 1.0 + 0.38 * n_rows)
        ax = fig.add_subplot()
        flagged_rounds = {f[0] for f in r.flags}
        logp = np.array([-math.log10(max(p, 1e-300)) if p == p else 1.0 for *_, p in r.flags])
        norm = Normalize(vmin=0, vmax=max(10.0, float(logp.max()) if logp.size else 10.0))
        sizes = np.array([f[2] for f in r.flags], dtype=float)
        s = 180 + 420 * sizes / max(sizes.max(), 1.0) if sizes.size else sizes
        sc = ax.scatter(
            [f[0] for f in r.flags],
            [f[1] for f in r.flags],
            s=s,
            c=logp,
            cmap="Reds",
            norm=norm,
            edgecolors="#333333",
            linewidths=0.7,
            zorder=3,
        )
        for (rnd, row, n, _p), lp in zip(r.flags, logp):
            ax.text(
                rnd,
                row,
                str(n),
                ha="center",
                va="center",
                fontsize=7,
                zorder=4,
                color="white" if norm(lp) > 0.55 else "#222222",
            )
        none_row = len(r.groups)
        for rnd in range(r.n_rounds):
            if rnd not in flagged_rounds:
                ax.text(rnd, none_row, "–", ha="center", va="center", fontsize=10, color="#888888")
        labels = [clip(g, 60) + ("  (isolate)" if g == r.voted else "") for g in r.groups] + ["no group stood out"]
        ax.set_yticks(range(n_rows), labels)
        for t, g in zip(ax.get_yticklabels(), [*r.groups, ""]):
            if g == r.voted:
                t.set_fontweight("bold")
        ax.set_xticks(range(r.n_rounds), [f"round {i}" for i in range(r.n_rounds)])
        ax.set_xlim(-0.6, r.n_rounds - 0.4)
        ax.set_ylim(n_rows - 0.5, -0.6)
        ax.grid(True, color="#eeeeee", zorder=0)
        for row in range(len(r.groups)):
            k = sum(1 for f in r.flags if f[1] == row)
            ax.text(
                r.n_rounds - 0.35, row, f"{k} of {r.n_rounds}", va="center", fontsize=7, color="#444444", clip_on=False
            )
        cb = fig.colorbar(sc, ax=ax, pad=0.12, fraction=0.04)
        cb.set_label("-log10 p (chance of so many outliers)", fontsize=7)
        ax.set_title("Group flagged in each snapshot round (number: outlier ranks in it)", loc="left")
    cap = (
        "Each column is one stack snapshot; a dot marks the parallel group that held significantly more "
        "outlier ranks than chance in that round (number inside: its outlier ranks; darker: less likely by "
        "chance). The group flagged in most rounds is the slow one to isolate."
    )
    return render_png(fig, "failslow-rounds", "Fail-slow rounds", cap)


# -- 4. Flight Recorder wavefront --------------------------------------------------------------------
WAVE_COLOURS = ("#a1d99b", "#fee391", "#fc8d59", "#e34a33", "#99000d", "#3a3a3a", "#ffffff")


def fr_wavefront(verdict: Mapping[str, Any], fr_progress: pl.DataFrame | None) -> Figure | None:
    """Per process group kind, how far each rank got (last enqueued/completed collective)."""
    if fr_progress is None:
        return None
    wf = fd.fr_wavefront(verdict, fr_progress)
    rows, cols = wf.codes.shape
    with mpl_context():
        from matplotlib.colors import ListedColormap
        from matplotlib.patches import Patch

        fig = new_figure(11.0, 1.5 + 0.34 * rows)
        ax = fig.add_subplot()
        ax.imshow(
            wf.codes,
            cmap=ListedColormap(WAVE_COLOURS),
            vmin=-0.5,
            vmax=len(WAVE_COLOURS) - 0.5,
            interpolation="nearest",
            aspect="auto",
            extent=(0, wf.world, rows, 0),
        )
        if cols <= 64:
            for e in wf.col_edges[1:-1]:
                ax.axvline(e, color="white", lw=0.5)
        ax.set_yticks(np.arange(rows) + 0.5, [f"{clip(lb, 40)}  {fr}" for lb, fr in zip(wf.row_labels, wf.fronts)])
        for c in wf.culprit_cols:
            x = (wf.col_edges[c] + wf.col_edges[c + 1]) / 2
            ax.plot([x], [-0.25], marker="v", color=CULPRIT_COLOUR, markersize=7, clip_on=False)
        ax.set_ylim(rows, -0.5)
        ax.set_xlim(0, wf.world)
        ax.set_xlabel(
            "rank" + (f" (blocks of {wf.ranks_per_col}, the furthest behind shown)" if wf.ranks_per_col > 1 else "")
        )
        if wf.world <= 40:
            ax.set_xticks(np.arange(wf.world) + 0.5, [str(i) for i in range(wf.world)])
        present = sorted(set(np.unique(wf.codes).tolist()))
        handles: list[Any] = [
            Patch(facecolor=WAVE_COLOURS[i], edgecolor="#999999", label=fd.WAVE_CLASSES[i]) for i in present
        ]
        if wf.culprit_cols.size:
            from matplotlib.lines import Line2D

            handles.append(Line2D([], [], marker="v", color=CULPRIT_COLOUR, lw=0, label="culprit rank"))
        ax.legend(
            handles=handles, loc="upper left", bbox_to_anchor=(0, -0.18 if rows > 2 else -0.35), ncol=4, frameon=False
        )
        ax.set_title("How far each rank got in each kind of process group", loc="left")
    cap = (
        "Each row is a kind of process group and each column a rank; the colour says how far the rank got "
        "against the furthest member of its own group (the front, its last enqueued collective): done, "
        "waiting at the front, or N collectives behind. The ranks behind are the ones the others wait for."
    )
    return render_png(fig, "fr-wavefront", "Flight Recorder wavefront", cap)


# -- 5. metrics against peers ------------------------------------------------------------------------
def _iso(ts: object) -> datetime | None:
    if not isinstance(ts, str):
        return None
    try:
        d = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    return d if d.tzinfo else d.replace(tzinfo=timezone.utc)


def _onsets(verdict: Mapping[str, Any]) -> tuple[dict[str, datetime], datetime | None]:
    details = verdict.get("details") or {}
    by: dict[str, datetime] = {}
    if isinstance(details, Mapping):
        for a in details.get("metric_alerts") or ():
            if isinstance(a, Mapping) and (t := _iso(a.get("onset"))):
                by.setdefault(str(a.get("unit")), t)
                by.setdefault(str(a.get("node")), t)
        for node, t in (details.get("onset_by_node") or {}).items():
            if d := _iso(t):
                by.setdefault(str(node), d)
        return by, _iso(details.get("onset"))
    return by, None


def metric_series(
    verdict: Mapping[str, Any], metric_bands: pl.DataFrame | None, *, max_panels: int = 6
) -> Figure | None:
    """The suspect machine's series against its peers' median and interquartile band, onset marked."""
    if metric_bands is None:
        return None
    pairs = metric_bands.select("unit", "metric").unique(maintain_order=True).head(max_panels).rows()
    onset_by, onset = _onsets(verdict)
    n = len(pairs)
    ncols = 1 if n == 1 else 2
    nrows = math.ceil(n / ncols)
    with mpl_context():
        import matplotlib.dates as mdates

        fig = new_figure(11.0, 0.6 + 2.3 * nrows)
        axes = fig.subplots(nrows, ncols, squeeze=False)
        for k, (unit, metric) in enumerate(pairs):
            ax: Axes = axes[k // ncols][k % ncols]
            d = metric_bands.filter((pl.col("unit") == unit) & (pl.col("metric") == metric)).sort("ts")
            t = d["ts"].to_numpy() / DAY_S  # matplotlib dates: days since 1970-01-01 (its default epoch)
            ax.fill_between(
                t,
                d["peer_q25"].to_numpy(),
                d["peer_q75"].to_numpy(),
                color="#9ecae1",
                alpha=0.55,
                lw=0,
                label="peers: middle 50% (IQR)",
            )
            ax.plot(t, d["peer_median"].to_numpy(), color="#2171b5", lw=1.0, label="peers: median")
            ax.plot(t, d["value"].to_numpy(), color=CULPRIT_COLOUR, lw=1.3, label=clip(unit, 40))
            node = d["node"][0] if "node" in d.columns and d.height else None
            when = onset_by.get(str(unit)) or (onset_by.get(str(node)) if node else None) or onset
            if when is not None and t.size and t[0] <= when.timestamp() / DAY_S <= t[-1]:
                ax.axvline(when.timestamp() / DAY_S, color="#111111", ls="--", lw=1.0, label="onset")
            peers = f", {int(cast(int, d['n_peers'].max()))} peers" if "n_peers" in d.columns and d.height else ""
            ax.set_title(f"{clip(metric, 46)} — {clip(unit, 34)}{peers}", loc="left", fontsize=FONT)
            ax.xaxis_date(tz=timezone.utc)
            ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=timezone.utc))  # type: ignore[no-untyped-call]
            ax.tick_params(labelsize=7)
            ax.grid(True, color="#eeeeee")
            if k == 0:
                ax.legend(loc="best", fontsize=6.5, frameon=True, framealpha=0.85)
        for k in range(n, nrows * ncols):
            axes[k // ncols][k % ncols].set_visible(False)
        fig.supxlabel("time (UTC)", fontsize=FONT)
        fig.tight_layout()
    cap = (
        "Each panel is one metric of the suspect machine (red) against every peer doing the same work: the "
        "blue line is the peers' median and the band their middle 50%. The dashed line is the onset the "
        "analysis found; the suspect leaving the band there is the evidence."
    )
    return render_png(fig, "metrics", "Suspect metrics against peers", cap)


# -- 6. timings heatmap ------------------------------------------------------------------------------
def step_heatmap(verdict: Mapping[str, Any], timings: pl.DataFrame | None) -> Figure | None:
    """Rank x step time, relative to each step's median across ranks."""
    if timings is None:
        return None
    m = fd.step_matrix(verdict, timings)
    rows, cols = m.ratio.shape
    with mpl_context():
        import matplotlib as mpl
        from matplotlib.colors import Normalize

        fig = new_figure(11.0, float(np.clip(1.8 + rows * 0.05, 3.2, 7.5)))
        gs = fig.add_gridspec(2, 2, height_ratios=(1, 5), width_ratios=(60, 1), hspace=0.08, wspace=0.02)
        top = fig.add_subplot(gs[0, 0])
        ax = fig.add_subplot(gs[1, 0], sharex=top)
        cax = fig.add_subplot(gs[1, 1])
        from matplotlib.ticker import MaxNLocator

        steps = m.steps.astype(float)
        x0 = float(steps[0]) - 0.5 if steps.size else -0.5
        x1 = float(steps[-1]) + m.steps_per_col - 0.5 if steps.size else 0.5
        top.plot(
            steps + (m.steps_per_col - 1) / 2,
            m.median_s,
            color="#444444",
            lw=1.0,
            marker="." if steps.size < 30 else None,
        )
        top.set_ylabel("median s", fontsize=7)
        top.tick_params(labelbottom=False, labelsize=7)
        top.grid(True, color="#eeeeee")
        cmap = mpl.colormaps["RdBu_r"].with_extremes(bad="#e8e8e8")
        with np.errstate(all="ignore"):
            val = np.log2(m.ratio)
        im = ax.imshow(
            val,
            cmap=cmap,
            norm=Normalize(-1, 1),
            aspect="auto",
            interpolation="nearest",
            extent=(x0, x1, float(m.row_edges[-1]) - 0.5, -0.5),
        )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        for r in m.suspect_rows:
            y = (m.row_edges[r] + m.row_edges[r + 1]) / 2 - 0.5
            ax.plot([x1], [y], marker="<", color=CULPRIT_COLOUR, markersize=6, clip_on=False)
        ax.set_xlabel("step" + (f" (mean of {m.steps_per_col} per column)" if m.steps_per_col > 1 else ""))
        ax.set_ylabel("rank" + (f" (blocks of {m.ranks_per_row}, slowest shown)" if m.ranks_per_row > 1 else ""))
        cb = fig.colorbar(im, cax=cax, ticks=[-1, -0.5, 0, 0.5, 1])
        cb.ax.set_yticklabels(["0.5x", "0.7x", "1x", "1.4x", "≥2x"], fontsize=7)
        cb.set_label("÷ median of the step", fontsize=7)
        top.set_title(f"Step time per rank ({m.op}); red: slower than the other ranks at the same step", loc="left")
    cap = (
        "Each row is a rank and each column a training step; red cells took longer than the median rank at "
        "that step, blue shorter (top: the median step time). A slow machine is a red row from its onset on; a "
        "red column is the whole job slowing. Arrows mark the culprit (or suspect) ranks."
    )
    return render_png(fig, "timings", "Step times", cap)


# -- 7. crash time line ------------------------------------------------------------------------------
def crash_timeline(verdict: Mapping[str, Any], exits: pl.DataFrame | None) -> Figure | None:
    """Process exits on a time line, the first failure marked."""
    ex = fd.crash_exits(verdict, exits)
    if ex is None:
        return None
    n = ex.height
    categorical = n <= 30
    with mpl_context():
        fig = new_figure(11.0, 1.6 + (0.24 * n if categorical else 3.2))
        ax = fig.add_subplot()
        y = np.arange(n) if categorical else ex["rank"].to_numpy()
        cause = ex["cause"].to_numpy()
        kind = ex["kind"].to_numpy() if "kind" in ex.columns else np.full(n, "")
        t = ex["after_s"].to_numpy()
        styles = (
            ("primary", cause == "primary", "X", CULPRIT_COLOUR, 90, "failure (a cause)"),
            ("cascade", cause == "cascade", "o", "#8c8c8c", 36, "cascade (reports a lost peer)"),
            ("other", (cause != "primary") & (cause != "cascade"), "s", "#3a3a3a", 36, "other"),
        )
        for _, sel, mk, col, sz, label in styles:
            if sel.any():
                ax.scatter(t[sel], y[sel], marker=mk, color=col, s=sz, label=label, zorder=3)
        first = int(np.argmin(t))
        t0 = float(t[first])
        ax.axvline(t0, color=CULPRIT_COLOUR, ls="--", lw=1.0, zorder=2)
        node = ex["node"][first] if "node" in ex.columns else None
        msg = ex["message"][first] if "message" in ex.columns else ""
        head = f"first failure: rank {ex['rank'][first]}" + (f" on {node}" if node else "")
        detail = clip(f"{kind[first]}: {msg}" if kind[first] else msg, 90)
        ax.annotate(
            f"{head}\n{detail}",
            xy=(t0, y[first]),
            xytext=(8, 0),
            textcoords="offset points",
            fontsize=7,
            va="center",
            color="#7f0000",
            annotation_clip=False,
        )
        if categorical:
            labels = [
                clip(f"rank {r}" + (f" · {nd}" if nd else ""), 34)
                for r, nd in zip(ex["rank"].to_list(), ex["node"].to_list() if "node" in ex.columns else [None] * n)
            ]
            ax.set_yticks(y, labels)
            ax.set_ylim(n - 0.5, -0.8)
        else:
            ax.set_ylabel("rank")
            ax.invert_yaxis()
        span = float(t.max() - t.min()) if n > 1 else 1.0
        ax.set_xlim(float(t.min()) - 0.05 * span - 0.05, float(t.max()) + 0.45 * span + 0.2)
        ax.set_xlabel("seconds after the first failure")
        ax.grid(True, axis="x", color="#eeeeee")
        ax.legend(loc="lower right", frameon=True, framealpha=0.9)
        ax.set_title(f"{n} process exit(s), in the order they happened", loc="left")
    cap = (
        "Each mark is one rank's process exit, by time after the first failure (red dashed line). Red crosses "
        "are failures that name their own cause; grey dots report a lost peer, the cascade that follows the "
        "first failure. Read the top row: that rank died first."
    )
    return render_png(fig, "crash-timeline", "Crash time line", cap)


# -- registry ----------------------------------------------------------------------------------------
FigureFn = Callable[[Mapping[str, Any], ReportEvidence], "Figure | None"]
FIGURES: dict[str, FigureFn] = {
    "rank-grid": lambda v, e: rank_grid(v, e.topology),
    "prefix-tree": lambda v, e: prefix_tree(v),
    "failslow-rounds": lambda v, e: failslow_rounds(v),
    "fr-wavefront": lambda v, e: fr_wavefront(v, e.fr_progress),
    "metrics": lambda v, e: metric_series(v, e.metric_bands),
    "timings": lambda v, e: step_heatmap(v, e.timings),
    "crash-timeline": lambda v, e: crash_timeline(v, e.exits),
}
"""Every figure, in report order; each returns None when its evidence is absent."""


def all_figures(verdict: Mapping[str, Any], evidence: ReportEvidence | None = None) -> list[Figure]:
    """Every figure the verdict and evidence support, in report order."""
    ev = evidence or ReportEvidence()
    return [f for fn in FIGURES.values() if (f := fn(verdict, ev)) is not None]
