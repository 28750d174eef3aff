"""Shared matplotlib plumbing for the figures: the :class:`Figure` result, an Agg figure without pyplot,
PNG rendering, text clipping and the colour scheme. matplotlib is imported only inside these calls.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rankscope.reports import grid as gd

if TYPE_CHECKING:
    from matplotlib.figure import Figure as MplFigure

DPI = 100
FONT = 8
DAY_S = 86400.0


@dataclass(frozen=True)
class Figure:
    """One rendered figure: a file-name-safe ``name``, a title, a caption and the PNG."""

    name: str
    title: str
    caption: str
    png: bytes
    width_px: int
    height_px: int


# -- matplotlib plumbing -----------------------------------------------------------------------------
@contextmanager
def mpl_context() -> Iterator[Any]:
    import matplotlib

    with matplotlib.rc_context(
        {
            "text.parse_math": False,
            "font.size": FONT,
            "axes.titlesize": FONT + 1,
            "axes.labelsize": FONT,
            "legend.fontsize": FONT - 1,
            "svg.fonttype": "none",
            "font.family": "DejaVu Sans",
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    ):
        yield matplotlib


def new_figure(w_in: float, h_in: float) -> MplFigure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=(w_in, h_in), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def render_png(fig: MplFigure, name: str, title: str, caption: str, *, tight: bool = True) -> Figure:
    buf = io.BytesIO()
    fig.savefig(
        buf,
        format="png",
        dpi=DPI,
        bbox_inches="tight" if tight else None,
        pad_inches=0.08,
        metadata={"Software": None},
        facecolor="white",
    )
    png = buf.getvalue()
    w, h = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # IHDR
    return Figure(name, title, caption, png, w, h)


def clip(text: object, n: int) -> str:
    """``text`` cut to ``n`` characters with an ellipsis."""
    s = " ".join(str(text).split())
    return s if len(s) <= n else s[: max(1, n - 1)] + "…"


OUTLIER_COLOURS = (
    "#e66101",
    "#5e3c99",
    "#1b9e77",
    "#d95f9e",
    "#a6761d",
    "#1f78b4",
    "#b2df8a",
    "#e7298a",
    "#66a61e",
    "#fdb863",
)
HEALTHY_COLOURS = ("#c9d7e6", "#d6e6c6", "#e6dcc6", "#dde0e3")
MISSING_COLOUR = "#3a3a3a"
NOSTACK_COLOUR = "#efefef"
SUSPECT_COLOUR = "#111111"
CULPRIT_COLOUR = "#e31a1c"


def class_colours(classes: tuple[gd.GridClass, ...]) -> list[str]:
    out, o, h = [], 0, 0
    for c in classes:
        if c.kind == "outlier":
            out.append(OUTLIER_COLOURS[o % len(OUTLIER_COLOURS)])
            o += 1
        elif c.kind == "healthy":
            out.append(HEALTHY_COLOURS[h % len(HEALTHY_COLOURS)])
            h += 1
        else:
            out.append(MISSING_COLOUR if c.kind == "missing" else NOSTACK_COLOUR)
    return out
