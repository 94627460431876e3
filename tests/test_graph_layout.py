"""The UI's graph drawing, without a database or a browser: columns by dependency, no overlaps, escaped labels."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("starlette")

from dbexecutor.readmodels import GraphNode  # noqa: E402
from dbexecutor.ui import layout  # noqa: E402


def _node(i: int, state: str = "done", fn: str = "app.step", **kw: object) -> GraphNode:
    return GraphNode(i, state, fn, kw.get("key"), "default", bool(kw.get("batch", False)))  # type: ignore[arg-type]


def test_each_job_sits_right_of_everything_it_depends_on_and_boxes_never_overlap():
    # A diamond with a long edge and a fan-in: 1 -> 2 -> 4, 1 -> 3 -> 4, 1 -> 4, and 5..9 -> 10.
    nodes = [_node(i) for i in range(1, 11)]
    edges = [(1, 2), (1, 3), (2, 4), (3, 4), (1, 4)] + [(i, 10) for i in range(5, 10)]
    placed, width, height = layout.layout(nodes, edges)
    at = {p.node.id: p for p in placed}
    for up, dep in edges:
        assert at[up].layer < at[dep].layer
    assert at[4].layer == 2 and at[10].layer == 1  # the longest path decides
    boxes = {(p.x, p.y) for p in placed}
    assert len(boxes) == len(placed)
    assert all(0 <= p.x and p.x + layout.NODE_W <= width and 0 <= p.y and p.y + layout.NODE_H <= height for p in placed)


def test_ordering_puts_a_job_near_what_it_depends_on():
    # Two independent chains drawn side by side: each dependent lands on its own upstream's row.
    nodes = [_node(i) for i in (1, 2, 3, 4)]
    placed, _, _ = layout.layout(nodes, [(1, 4), (2, 3)])
    row = {p.node.id: p.row for p in placed}
    assert row[3] == row[2] and row[4] == row[1]


def test_the_svg_links_colours_and_escapes():
    nodes = [_node(1, "failed", "m.<script>"), _node(2, "running", key="<k>"), _node(3, "done", batch=True)]
    svg = layout.svg(nodes, [(1, 2), (2, 3)])
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "&lt;k&gt;" in svg
    assert re.findall(r'<a href="/jobs/(\d+)" class="node st-(\w+)"', svg) == [("1", "failed"), ("2", "running"), ("3", "done")]
    assert svg.count('class="edge"') == 2 and "#3 batch" in svg
    assert layout.layout([], []) == ([], 2 * layout.MARGIN + layout.NODE_W, 2 * layout.MARGIN + layout.NODE_H)
