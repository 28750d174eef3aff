"""The merged call-prefix tree of all processes (LLNL STAT's 2D trace/space view).

Each node is a frame reached by the same call path; it carries the ranks whose stacks pass
through it. Where a node has several children the clusters diverge: that is where to look.
Built over cluster signatures (not individual processes), so it is cheap at any scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rankscope.analytics.stacks.clustering import Cluster
from rankscope.analytics.verdict import rank_ranges


@dataclass
class _Node:
    label: str
    ranks: set[int] = field(default_factory=set)
    clusters: list[int] = field(default_factory=list)
    children: dict[str, _Node] = field(default_factory=dict)


@dataclass(frozen=True)
class TreeLine:
    depth: int
    label: str
    n_ranks: int
    ranks: str
    clusters: tuple[int, ...]
    diverges: bool


@dataclass(frozen=True)
class PrefixTree:
    """Flattened tree, pre-order; chains without branching are collapsed for display."""

    lines: tuple[TreeLine, ...]

    def to_dict(self) -> list[dict[str, Any]]:
        return [
            {
                "depth": ln.depth,
                "frame": ln.label,
                "n_ranks": ln.n_ranks,
                "ranks": ln.ranks,
                "clusters": list(ln.clusters),
                "diverges": ln.diverges,
            }
            for ln in self.lines
        ]


def build(clusters: Sequence[Cluster], *, collapse: bool = True) -> PrefixTree:
    """Merge the clusters' representative stacks (outermost first) into one prefix tree."""
    root = _Node("<root>")
    for c in clusters:
        node = root
        node.ranks.update(c.ranks)
        for label in c.representative:
            node = node.children.setdefault(label, _Node(label))
            node.ranks.update(c.ranks)
        node.clusters.append(c.id)
    lines: list[TreeLine] = []

    def walk(node: _Node, depth: int) -> None:
        labels = [node.label]
        while collapse and len(node.children) == 1 and not node.clusters:
            (child,) = node.children.values()
            if child.ranks != node.ranks:
                break
            node = child
            labels.append(node.label)
        label = (
            labels[0]
            if len(labels) == 1
            else (
                f"{labels[0]} > {labels[-1]}"
                if len(labels) == 2
                else f"{labels[0]} > ... {len(labels) - 2} frames ... > {labels[-1]}"
            )
        )
        lines.append(
            TreeLine(
                depth, label, len(node.ranks), rank_ranges(node.ranks), tuple(node.clusters), len(node.children) > 1
            )
        )
        for child in sorted(node.children.values(), key=lambda n: -len(n.ranks)):
            walk(child, depth + 1)

    for child in sorted(root.children.values(), key=lambda n: -len(n.ranks)):
        walk(child, 0)
    return PrefixTree(tuple(lines))
