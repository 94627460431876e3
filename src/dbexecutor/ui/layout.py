"""Drawing a graph of jobs: a layered layout (left to right) and its SVG, with no JavaScript and no library.

::

    layers   each job one column right of its rightmost upstream (longest path from the sources)
    order    within a column, by the mean position of the neighbours in the column before,
             then in the column after (a few barycentre sweeps: fewer crossings)
    draw     nodes as boxes coloured by state, linked to their job pages; edges as curves

Pure functions of the nodes and edges, tested without a browser.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from ..readmodels import GraphNode

__all__ = ["Placed", "layout", "svg"]

NODE_W, NODE_H = 150, 34
GAP_X, GAP_Y = 60, 14
MARGIN = 10
_SWEEPS = 4


@dataclass(frozen=True)
class Placed:
    """A node's column, row, and the top-left corner of its box."""

    node: GraphNode
    layer: int
    row: int
    x: float
    y: float


def _layers(ids: list[int], edges: Sequence[tuple[int, int]]) -> dict[int, int]:
    ups: dict[int, list[int]] = defaultdict(list)
    downs: dict[int, list[int]] = defaultdict(list)
    for up, dep in edges:
        ups[dep].append(up)
        downs[up].append(dep)
    pending = {i: len(ups[i]) for i in ids}
    layer = {i: 0 for i in ids}
    ready = sorted(i for i, n in pending.items() if n == 0)
    while ready:
        nxt: list[int] = []
        for i in ready:
            for dep in downs[i]:
                layer[dep] = max(layer[dep], layer[i] + 1)
                pending[dep] -= 1
                if pending[dep] == 0:
                    nxt.append(dep)
        ready = sorted(nxt)
    # A cycle cannot be stored (an edge points at an older job), but a drawing must not loop if one were.
    return layer


def layout(nodes: Sequence[GraphNode], edges: Sequence[tuple[int, int]]) -> tuple[list[Placed], float, float]:
    """Where each node goes, and the drawing's width and height."""
    by_id = {n.id: n for n in nodes}
    edges = [(u, d) for u, d in edges if u in by_id and d in by_id]
    layer = _layers(sorted(by_id), edges)
    columns: dict[int, list[int]] = defaultdict(list)
    for i in sorted(by_id):
        columns[layer[i]].append(i)
    ups: dict[int, list[int]] = defaultdict(list)
    downs: dict[int, list[int]] = defaultdict(list)
    for up, dep in edges:
        ups[dep].append(up)
        downs[up].append(dep)
    count = max(columns) + 1 if columns else 0
    for sweep in range(_SWEEPS):
        forward = sweep % 2 == 0
        order = range(1, count) if forward else range(count - 2, -1, -1)
        for c in order:
            ref = columns[c - 1] if forward else columns[c + 1]
            pos = {i: k for k, i in enumerate(ref)}
            near = ups if forward else downs

            def centre(i: int) -> float:
                linked = [pos[j] for j in near[i] if j in pos]
                return sum(linked) / len(linked) if linked else float(columns[c].index(i))

            columns[c] = sorted(columns[c], key=lambda i: (centre(i), i))
    placed: list[Placed] = []
    for c in range(count):
        for r, i in enumerate(columns[c]):
            placed.append(Placed(by_id[i], c, r, MARGIN + c * (NODE_W + GAP_X), MARGIN + r * (NODE_H + GAP_Y)))
    width = MARGIN * 2 + max(count, 1) * (NODE_W + GAP_X) - GAP_X
    height = MARGIN * 2 + max((len(v) for v in columns.values()), default=1) * (NODE_H + GAP_Y) - GAP_Y
    return placed, width, height


def _label(node: GraphNode) -> str:
    name = node.function.rsplit(".", 1)[-1]
    text = f"#{node.id} {'batch' if node.batch else name}"
    return text if len(text) <= 20 else text[:19] + "…"


def svg(nodes: Sequence[GraphNode], edges: Sequence[tuple[int, int]], link: str = "/jobs/{id}") -> str:
    """The graph as an SVG element: boxes coloured by state (CSS classes ``st-<state>``), linked to ``link``."""
    placed, width, height = layout(nodes, edges)
    at = {p.node.id: p for p in placed}
    parts = [
        f'<svg class="dag" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="dependency graph of {len(placed)} jobs">'
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" orient="auto">'
        '<path d="M0,0 L8,4 L0,8 z"/></marker></defs>'
    ]
    for up, dep in edges:
        a, b = at.get(up), at.get(dep)
        if a is None or b is None:
            continue
        x1, y1 = a.x + NODE_W, a.y + NODE_H / 2
        x2, y2 = b.x, b.y + NODE_H / 2
        bend = max(20.0, (x2 - x1) / 2)
        parts.append(
            f'<path class="edge" d="M{x1:.0f},{y1:.0f} C{x1 + bend:.0f},{y1:.0f} {x2 - bend:.0f},{y2:.0f} {x2:.0f},{y2:.0f}"/>'
        )
    for p in placed:
        n = p.node
        title = f"job {n.id}: {n.function} ({n.state})" + (f", key {n.key}" if n.key else "") + f", group {n.group}"
        href = escape(link.format(id=n.id))
        parts.append(
            f'<a href="{href}" class="node st-{escape(n.state)}" data-job="{n.id}" data-state="{escape(n.state)}">'
            f"<title>{escape(title)}</title>"
            f'<rect x="{p.x:.0f}" y="{p.y:.0f}" width="{NODE_W}" height="{NODE_H}" rx="5"/>'
            f'<text x="{p.x + 8:.0f}" y="{p.y + 21:.0f}">{escape(_label(n))}</text>'
        )
        if n.progress is not None and n.state in ("leased", "running"):
            parts.append(
                f'<rect class="bar" x="{p.x:.0f}" y="{p.y + NODE_H - 4:.0f}" width="{NODE_W * n.progress:.0f}" height="4"/>'
            )
        parts.append("</a>")
    parts.append("</svg>")
    return "".join(parts)
