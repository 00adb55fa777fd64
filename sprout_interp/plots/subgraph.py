"""The subgraph of an attribution graph's pinned nodes and supernodes, drawn on its own (data from
:func:`sprout_interp.circuits.subgraph.subgraph`): columns by position (only the positions it uses, in order), rows
by block (the embeddings at the bottom, the logits at the top), an arrow per edge with its value written on it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

import pandas as pd
import plotly.graph_objects as go

from sprout_interp.core.arguments import describe
from sprout_interp.core.errors import AttributionGraphError
from sprout_interp.plots.common import FULL_COLUMN, escape_label, show_token, title_below_toolbar, top_margin
from sprout_interp.plots.graph import figure_row

__all__ = ["VALUES", "subgraph_label", "subgraph_figure"]

#: what an edge of the figure can show: a column of subgraph()'s edges, and what it means
VALUES = {
    "total": "summed over every path through unpinned nodes (target units)",
    "weight": "the direct edges summed (target units)",
    "share": "circuit-tracer's subgraph view: direct edges as a share of the target's |input|",
}
_COLOURS = {"feature": "#4c78a8", "error": "#9d9d9d", "embedding": "#59a14f", "logit": "#f28e2b",
            "supernode": "#b279a2"}
_SYMBOLS = {"feature": "circle", "error": "square", "embedding": "triangle-up", "logit": "star",
            "supernode": "diamond"}
_POSITIVE, _NEGATIVE = "#2166ac", "#b2182b"
_MARGIN_PX = 140  # the figure's width beyond its places' (column_px each): the margins (90 + 20 px) and 30 px


def subgraph_label(row, most: int = 14) -> str:
    """A subgraph node's short name: a supernode's own, ``F<feature> b<block>`` a feature, ``err b<block>`` an
    error node, ``emb <token>`` an embedding, ``logit <token>`` a logit."""
    kind = row["kind"]
    if kind == "supernode":
        return str(row["name"])
    tok = show_token(str(row["token"]), most)
    if kind == "feature":
        return f"F{int(row['feature'])} b{int(row['block'])}"
    if kind == "error":
        return f"err b{int(row['block'])}"
    if kind == "embedding":
        return f"emb {tok}"
    return f"logit {tok}"


def _fmt(v: float, value: str) -> str:
    return f"{v:+.1%}" if value == "share" else f"{v:+.3g}"


_NAME_PX, _VALUE_PX = 7.2, 6.6  # an average character of a node's name (12 px) and of an edge's value (11 px)
_MARKER_PX = 9  # half a marker, and its outline


def _boxes_overlap(a: tuple, b: tuple) -> float:
    """The area (px²) two boxes (x0, y0, x1, y1) share."""
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def _node_boxes(x: float, y: float, name: str, below: bool, column_px: float, row_px: float) -> list[tuple]:
    """A node's marker and its name (above it, an embedding's below) as boxes in pixels (y down)."""
    cx, cy = x * column_px, -y * row_px
    w = len(name) * _NAME_PX / 2 + 2
    name_y = (cy + _MARKER_PX, cy + _MARKER_PX + 17) if below else (cy - _MARKER_PX - 17, cy - _MARKER_PX)
    return [(cx - _MARKER_PX, cy - _MARKER_PX, cx + _MARKER_PX, cy + _MARKER_PX), (cx - w, name_y[0], cx + w, name_y[1])]


def _label_place(sx: float, sy: float, tx: float, ty: float, text: str, obstacles: list, placed: list,
                 column_px: float, row_px: float) -> tuple[float, float]:
    """Where on the edge (sx, sy) -> (tx, ty) its value ``text`` goes: the first of a few points along it (the
    middle first) whose box covers no node's marker or name (``obstacles``, boxes in pixels) and no value placed
    before (``placed``, boxes; the chosen one is added), at the figure's design scale (``column_px`` a place,
    ``row_px`` a row; a page that draws it wider only moves them apart); the one that covers least when none is
    clear."""
    best, best_cover = None, float("inf")
    w, h = len(text) * _VALUE_PX / 2 + 4, 8.0
    for at in (0.5, 0.38, 0.62, 0.28, 0.72, 0.2, 0.8, 0.14, 0.86):
        x, y = sx + at * (tx - sx), sy + at * (ty - sy)
        box = (x * column_px - w, -y * row_px - h, x * column_px + w, -y * row_px + h)
        cover = sum(_boxes_overlap(box, o) for o in obstacles) + sum(_boxes_overlap(box, o) for o in placed)
        if cover < best_cover:
            best, best_cover = (x, y, box), cover
        if cover == 0:
            break
    placed.append(best[2])
    return best[0], best[1]


def subgraph_figure(nodes: pd.DataFrame, edges: pd.DataFrame, tokens: Sequence[str], n_layers: int,
                    value: str = "total", labels: Optional[Mapping[int, str]] = None, max_edges: int = 40,
                    title: Optional[str] = None, column_px: int = 110, row_px: int = 70,
                    fit_px: float | int = FULL_COLUMN, min_column_px: int = 64) -> go.Figure:
    """The subgraph ``(nodes, edges)`` of :func:`~sprout_interp.circuits.subgraph.subgraph`: one column per position
    a node sits at (``column_px`` pixels a node: each node of a position has a place of its own, ordered by block, so
    no edge runs over another node along a column; the prompt's token under it), one row per block from the lowest
    to the highest node (``row_px`` pixels; embeddings, block 1 … block ``n_layers``, logits).

    Width, as the attribution graph's (:func:`~sprout_interp.plots.graph.attribution_graph_figure`): laid out to fit
    ``fit_px`` pixels (the page's column at a 1280-px window, :data:`~sprout_interp.plots.common.FULL_COLUMN`),
    each node's place narrowed from ``column_px`` down to ``min_column_px`` where needed; the figure then has no
    fixed width (a page stretches it to its column). A subgraph too wide even at ``min_column_px`` keeps
    ``column_px`` a place and gets the width that needs (``layout.width``, for a box that scrolls sideways: its
    labels as far apart as ever). ``layout.meta["fits"]`` says which. Each edge an arrow
    from source to target, blue positive, red negative, as wide as ``|value|`` relative to the largest, its
    ``value`` (a column of ``edges``: :data:`VALUES`) written on it; the ``max_edges`` strongest drawn. A node's
    name (:func:`subgraph_label`, or ``labels[id]``) is written above it (an embedding's below, away from its
    arrows); its hover lists a supernode's members. Each node's ``customdata`` is ``[id, node index]`` (-1 for a
    supernode); ``layout.meta`` holds ``{"value": value, "edges": [[source id, target id, value], ...], "fits": ...,
    "design_px": the width laid out}`` as drawn.
    AttributionGraphError for another ``value``."""
    if value not in VALUES:
        raise AttributionGraphError(f"value must be one of {sorted(VALUES)} (a column of subgraph()'s edges), got "
                                    f"{describe(value)}")
    labels = dict(labels or {})
    nodes = nodes.copy()
    nodes["row"] = [figure_row(k, ly, n_layers) for k, ly in zip(nodes["kind"], nodes["layer"])]
    cols = sorted(set(int(p) for p in nodes["pos"]))
    # each node its own slot inside its position's column (ordered by row), so that no edge runs along a column
    # over other nodes and no two nodes share a place; a gap of one slot between columns
    nodes = nodes.sort_values(["pos", "row", "id"])
    nodes["_k"] = nodes.groupby("pos").cumcount()
    count = nodes.groupby("pos")["id"].size()
    start, x0 = {}, 0.0
    for p in cols:
        start[p] = x0
        x0 += int(count[p]) + 0.7
    nodes["x"] = [start[int(p)] + k for p, k in zip(nodes["pos"], nodes["_k"])]
    # the width: the places (x0 - 0.1 of them, with the margins' 140 px) at column_px, narrowed to fit fit_px
    span = x0 - 0.1
    fits = _MARGIN_PX + min_column_px * span <= fit_px
    column_px = min(column_px, (fit_px - _MARGIN_PX) / span) if fits else column_px  # scrolled: full width
    design_px = int(_MARGIN_PX + column_px * span)
    nodes["y"] = nodes["row"].astype(float)
    xy = dict(zip(nodes["id"], zip(nodes["x"], nodes["y"])))
    lo, hi = int(nodes["row"].min()), int(nodes["row"].max())
    fig = go.Figure()
    e = edges[edges["source"].isin(xy) & edges["target"].isin(xy) & (edges[value] != 0)]
    e = e.reindex(e[value].abs().sort_values(ascending=False, kind="stable").index).head(max_edges)
    big = max(float(e[value].abs().max()) if len(e) else 1.0, 1e-12)
    name_of = {int(r["id"]): labels.get(int(r["id"]), subgraph_label(r)) for _, r in nodes.iterrows()}
    obstacles = [b for i, k, x, y in zip(nodes["id"], nodes["kind"], nodes["x"], nodes["y"]) for b in
                 _node_boxes(float(x), float(y), name_of[int(i)], k == "embedding", float(column_px), float(row_px))]
    placed: list[tuple] = []
    for r in e.itertuples():
        v = float(getattr(r, value))
        (sx, sy), (tx, ty) = xy[r.source], xy[r.target]
        colour = _POSITIVE if v > 0 else _NEGATIVE
        fig.add_annotation(x=tx, y=ty, ax=sx, ay=sy, xref="x", yref="y", axref="x", ayref="y", showarrow=True,
                           arrowhead=2, arrowsize=1.0, arrowwidth=1 + 5 * abs(v) / big, arrowcolor=colour,
                           opacity=0.35 + 0.5 * abs(v) / big, standoff=9, startstandoff=9, text="")
        lx, ly = _label_place(float(sx), float(sy), float(tx), float(ty), _fmt(v, value), obstacles, placed,
                              float(column_px), float(row_px))
        fig.add_annotation(x=lx, y=ly, xref="x", yref="y", showarrow=False,
                           text=_fmt(v, value), font=dict(size=11, color=colour), bgcolor="rgba(255,255,255,0.85)",
                           name="edge value")
    for kind in ("embedding", "error", "feature", "logit", "supernode"):
        part = nodes[nodes["kind"] == kind]
        if not len(part):
            continue
        names = [name_of[int(i)] for i in part["id"]]
        hover = []
        for name, (_, r) in zip(names, part.iterrows()):
            p = int(r["pos"])
            tok = show_token(str(tokens[p])) if 0 <= p < len(tokens) else ""
            members = [int(m) for m in r["members"]]
            more = (f"{len(members)} nodes: " + ", ".join(map(str, members[:12])) + (" …" if len(members) > 12 else "")
                    if kind == "supernode" else f"node {int(r['node'])}")
            hover.append(f"<b>{escape_label(name)}</b> ({kind})<br>block {int(r['block'])}, pos {p} "
                         f"{escape_label(tok)}<br>{more}")
        fig.add_trace(go.Scatter(
            x=part["x"], y=part["y"], mode="markers+text", name=kind, text=[escape_label(s) for s in names],
            textposition="bottom center" if kind == "embedding" else "top center", textfont=dict(size=12),
            marker=dict(size=16 if kind == "supernode" else 13, color=_COLOURS[kind], symbol=_SYMBOLS[kind],
                        line=dict(width=1, color="black")),
            customdata=[[int(i), int(nd)] for i, nd in zip(part["id"], part["node"])],
            hovertext=hover, hovertemplate="%{hovertext}<extra></extra>"))
    rows = [(0, "embeddings")] + [(b, f"block {b}") for b in range(1, n_layers + 1)] + [(n_layers + 1, "logits")]
    rows = [(y, s) for y, s in rows if lo <= y <= hi]
    ticks = [f"{p}: {show_token(str(tokens[p]), 12)}" if 0 <= p < len(tokens) else str(p) for p in cols]
    centres = [start[p] + (int(count[p]) - 1) / 2 for p in cols]
    title_d = title_below_toolbar(title) if title else None
    height = max(260, row_px * (hi - lo + 1) + 130 + (top_margin(title_d) if title_d else 30))
    fig.update_layout(
        width=None if fits else design_px, height=height, showlegend=False, plot_bgcolor="white",
        margin=dict(l=90, r=20, t=top_margin(title_d) if title_d else 30, b=80),
        xaxis=dict(tickvals=centres, ticktext=ticks, range=[-0.7, x0 - 0.7 - 0.3], showgrid=False,
                   zeroline=False, title="position (0-based) and token"),
        yaxis=dict(tickvals=[y for y, _ in rows], ticktext=[s for _, s in rows], range=[lo - 0.5, hi + 0.6],
                   showgrid=True, gridcolor="#eeeeee", zeroline=False, title="block (from 1)"),
        meta={"value": value, "edges": [[int(r.source), int(r.target), float(getattr(r, value))]
                                       for r in e.itertuples()], "fits": bool(fits), "design_px": design_px},
    )
    if title_d:
        fig.update_layout(title=title_d)
    return fig
