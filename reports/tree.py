"""The merged call-prefix tree (STAT's 2D trace/space view), classified, pruned and laid out.

From the verdict's ``details.prefix_tree`` when present, else built from its trainer clusters the
way ``analytics.prefix_tree`` builds it. Each node is marked healthy / outlier / mixed from the
clusters below it and whether it holds a culprit rank; the smallest healthy branches (then outlier
branches without a culprit) are folded until ``MAX_TREE_LEAVES`` leaves remain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankscope.analytics.verdict import rank_ranges
from rankscope.reports.clusters import clusters_of
from rankscope.reports.errors import ReportInputError
from rankscope.reports.ranges import parse_ranks

MAX_TREE_LEAVES = 18


@dataclass
class TreeNode:
    label: str
    n_ranks: int
    ranks: str
    clusters: tuple[int, ...] = ()
    children: list[TreeNode] = field(default_factory=list)
    status: str = "mixed"  # healthy | outlier | mixed | summary | root
    culprit: bool = False
    folded: int = 0  # leaves folded away below this node (drawn as a note in its box)
    x: float = 0.0
    y: float = 0.0

    def walk(self) -> list[TreeNode]:
        out = [self]
        for c in self.children:
            out.extend(c.walk())
        return out


def _tree_lines(verdict: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``details.prefix_tree`` when the verdict has it, else the same tree built from the clusters."""
    details = verdict.get("details") or {}
    lines = details.get("prefix_tree") if isinstance(details, Mapping) else None
    if lines:
        return [dict(ln) for ln in lines]
    clusters = clusters_of(verdict)
    trainers = [c for c in clusters if c.role == "trainer"]
    clusters = trainers or clusters  # one process per rank, as STAT shows it (workers share their rank's number)
    if not clusters:
        return []
    last = max(c.snapshot for c in clusters)
    root: dict[str, Any] = {"children": {}, "ranks": set(), "clusters": []}
    for c in (c for c in clusters if c.snapshot == last):
        node = root
        node["ranks"].update(c.ranks.tolist())
        for label in c.representative:
            node = node["children"].setdefault(label, {"label": label, "children": {}, "ranks": set(), "clusters": []})
            node["ranks"].update(c.ranks.tolist())
        node["clusters"].append(c.id)
    out: list[dict[str, Any]] = []

    def walk(node: dict[str, Any], depth: int) -> None:
        labels = [node["label"]]
        while len(node["children"]) == 1 and not node["clusters"]:
            (child,) = node["children"].values()
            if child["ranks"] != node["ranks"]:
                break
            node = child
            labels.append(node["label"])
        label = (
            labels[0]
            if len(labels) == 1
            else (
                f"{labels[0]} > {labels[-1]}"
                if len(labels) == 2
                else f"{labels[0]} > ... {len(labels) - 2} frames ... > {labels[-1]}"
            )
        )
        out.append(
            {
                "depth": depth,
                "frame": label,
                "n_ranks": len(node["ranks"]),
                "ranks": rank_ranges(node["ranks"]),
                "clusters": list(node["clusters"]),
                "diverges": len(node["children"]) > 1,
            }
        )
        for child in sorted(node["children"].values(), key=lambda n: -len(n["ranks"])):
            walk(child, depth + 1)

    for child in sorted(root["children"].values(), key=lambda n: -len(n["ranks"])):
        walk(child, 0)
    return out


def prefix_tree(verdict: Mapping[str, Any], *, max_leaves: int = MAX_TREE_LEAVES) -> TreeNode | None:
    """The merged call-prefix tree with every node's status (healthy / outlier / mixed branch), the
    branches holding a culprit rank flagged, pruned to ``max_leaves`` leaves (outlier branches kept,
    the smallest healthy branches summarised), and laid out (x = depth, y = leaf order)."""
    lines = _tree_lines(verdict)
    if not lines:
        return None
    world = int(verdict.get("world_size") or 0)
    root = TreeNode(
        f"{world or sum(int(ln.get('n_ranks', 0)) for ln in lines if ln.get('depth') == 0)} ranks", 0, "", status="root"
    )
    stack: list[tuple[int, TreeNode]] = [(-1, root)]
    for i, ln in enumerate(lines):
        try:
            depth = int(ln["depth"])
            node = TreeNode(
                str(ln["frame"]),
                int(ln["n_ranks"]),
                str(ln.get("ranks", "")),
                tuple(int(c) for c in ln.get("clusters") or ()),
            )
        except (KeyError, TypeError, ValueError):
            raise ReportInputError(f"verdict.details.prefix_tree[{i}]: expected depth, frame, n_ranks, ranks") from None
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if not stack:
            raise ReportInputError(f"verdict.details.prefix_tree[{i}]: depth {depth} has no parent")
        stack[-1][1].children.append(node)
        stack.append((depth, node))
    root.n_ranks = sum(c.n_ranks for c in root.children)
    root.ranks = ""
    health = {c.id: c.healthy for c in clusters_of(verdict)}
    culprits = set(parse_ranks(verdict.get("culprit_ranks"), field="verdict.culprit_ranks").tolist())

    def classify(node: TreeNode) -> set[bool]:
        kinds = {health[c] for c in node.clusters if c in health}
        for ch in node.children:
            kinds |= classify(ch)
        if node.status != "root":
            node.status = "healthy" if kinds == {True} else "outlier" if kinds == {False} else "mixed"
            if culprits and node.ranks and len(node.ranks) < 20000:
                node.culprit = bool(culprits & set(parse_ranks(node.ranks).tolist()))
        return kinds

    classify(root)
    _prune(root, max_leaves)
    leaf_y = [0]

    def place(node: TreeNode, depth: int) -> None:
        node.x = float(depth)
        if not node.children:
            node.y = float(leaf_y[0])
            leaf_y[0] += 1
            return
        for ch in node.children:
            place(ch, depth + 1)
        node.y = (node.children[0].y + node.children[-1].y) / 2

    place(root, 0)
    return root


def _leaves(node: TreeNode) -> int:
    return 1 if not node.children else sum(_leaves(c) for c in node.children)


def _prune(root: TreeNode, max_leaves: int) -> None:
    """Fold branches until at most ``max_leaves`` leaves remain: healthy ones first, then outlier
    branches without a culprit, smallest first. Every step removes at least one leaf."""
    for statuses in (("healthy",), ("healthy", "outlier", "mixed")):
        while _leaves(root) > max_leaves:
            step = _fold_once(root, statuses)
            if not step:
                break


def _summary(nodes: Sequence[TreeNode], what: str) -> TreeNode:
    ranks = ""
    if all(len(s.ranks) < 5000 for s in nodes):
        ranks = rank_ranges(np.concatenate([parse_ranks(s.ranks) for s in nodes]))
    return TreeNode(what, sum(s.n_ranks for s in nodes), ranks, status="summary")


def _fold_once(root: TreeNode, statuses: tuple[str, ...]) -> bool:
    """Merge the smallest foldable sibling leaves into one summary leaf, or else fold the smallest foldable
    subtree into its root (which then notes how many branches it hides)."""
    best: tuple[int, TreeNode, list[TreeNode]] | None = None
    for parent in root.walk():
        leaves = [c for c in parent.children if not c.children and c.status in statuses and not c.culprit]
        if len(leaves) >= 2:
            leaves.sort(key=lambda c: c.n_ranks)
            group = leaves[:-1] if len(leaves) > 2 else leaves
            size = sum(c.n_ranks for c in group)
            if best is None or size < best[0]:
                best = (size, parent, group)
    if best is not None:
        _, parent, group = best
        if len(group) == len(parent.children) and parent.status != "root":  # fold the parent instead
            parent.folded = len(group) + sum(c.folded for c in group)
            parent.children = []
            return True
        kind = "healthy" if all(c.status == "healthy" for c in group) else "outlier"
        keep = [c for c in parent.children if all(c is not g for g in group)]
        parent.children = keep + [_summary(group, f"+{len(group)} more {kind} branches")]
        return True
    subtrees = [
        c
        for n in root.walk()
        for c in n.children
        if c.children and c.status in statuses and not c.culprit and _leaves(c) > 1
    ]
    if not subtrees:
        return False
    c = min(subtrees, key=lambda c: (c.n_ranks, -_leaves(c)))
    c.folded = _leaves(c) + sum(n.folded for n in c.walk()[1:])
    c.children = []
    return True
