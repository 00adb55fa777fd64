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
from sprout_interp.plots.common import escape_label, show_token, title_below_toolbar, top_margin
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


def _label_place(sx: float, sy: float, tx: float, ty: float, nodes: list, placed: list, column_px: float,
                 row_px: float) -> tuple[float, float]:
    """Where on the edge (sx, sy) -> (tx, ty) its value goes: the first of a few points along it (the middle first)
    at least a marker and its name away from every node and a label away from every label placed, in pixels; the
    one farthest from them all when none is."""
    best, best_d = None, -1.0
    for at in (0.5, 0.38, 0.62, 0.28, 0.72, 0.2, 0.8):
        x, y = sx + at * (tx - sx), sy + at * (ty - sy)
        d_node = min((max(abs(x - nx) * column_px / 30, abs(y - ny) * row_px / 26) for nx, ny in nodes), default=9)
        d_lab = min((max(abs(x - lx) * column_px / 46, abs(y - ly) * row_px / 16) for lx, ly in placed), default=9)
        d = min(d_node, d_lab)
        if d >= 1:
            return x, y
        if d > best_d:
            best, best_d = (x, y), d
    return best


def subgraph_figure(nodes: pd.DataFrame, edges: pd.DataFrame, tokens: Sequence[str], n_layers: int,
                    value: str = "total", labels: Optional[Mapping[int, str]] = None, max_edges: int = 40,
                    title: Optional[str] = None, column_px: int = 110, row_px: int = 70) -> go.Figure:
    """The subgraph ``(nodes, edges)`` of :func:`~sprout_interp.circuits.subgraph.subgraph`: one column per position
    a node sits at (``column_px`` pixels a node: each node of a position has a place of its own, ordered by block, so
    no edge runs over another node along a column; the prompt's token under it), one row per block from the lowest
    to the highest node (``row_px`` pixels; embeddings, block 1 … block ``n_layers``, logits). Each edge an arrow
    from source to target, blue positive, red negative, as wide as ``|value|`` relative to the largest, its
    ``value`` (a column of ``edges``: :data:`VALUES`) written on it; the ``max_edges`` strongest drawn. A node's
    name (:func:`subgraph_label`, or ``labels[id]``) is written above it (an embedding's below, away from its
    arrows); its hover lists a supernode's members. Each node's ``customdata`` is ``[id, node index]`` (-1 for a
    supernode); ``layout.meta`` holds ``{"value": value, "edges": [[source id, target id, value], ...]}`` as drawn.
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
    nodes["y"] = nodes["row"].astype(float)
    xy = dict(zip(nodes["id"], zip(nodes["x"], nodes["y"])))
    lo, hi = int(nodes["row"].min()), int(nodes["row"].max())
    fig = go.Figure()
    e = edges[edges["source"].isin(xy) & edges["target"].isin(xy) & (edges[value] != 0)]
    e = e.reindex(e[value].abs().sort_values(ascending=False, kind="stable").index).head(max_edges)
    big = max(float(e[value].abs().max()) if len(e) else 1.0, 1e-12)
    placed: list[tuple[float, float]] = []
    for r in e.itertuples():
        v = float(getattr(r, value))
        (sx, sy), (tx, ty) = xy[r.source], xy[r.target]
        colour = _POSITIVE if v > 0 else _NEGATIVE
        fig.add_annotation(x=tx, y=ty, ax=sx, ay=sy, xref="x", yref="y", axref="x", ayref="y", showarrow=True,
                           arrowhead=2, arrowsize=1.0, arrowwidth=1 + 5 * abs(v) / big, arrowcolor=colour,
                           opacity=0.35 + 0.5 * abs(v) / big, standoff=9, startstandoff=9, text="")
        lx, ly = _label_place(float(sx), float(sy), float(tx), float(ty), list(xy.values()), placed,
                              float(column_px), float(row_px))
        placed.append((lx, ly))
        fig.add_annotation(x=lx, y=ly, xref="x", yref="y", showarrow=False,
                           text=_fmt(v, value), font=dict(size=11, color=colour), bgcolor="rgba(255,255,255,0.85)",
                           name="edge value")
    for kind in ("embedding", "error", "feature", "logit", "supernode"):
        part = nodes[nodes["kind"] == kind]
        if not len(part):
            continue
        names = [labels.get(int(i), subgraph_label(r)) for i, (_, r) in zip(part["id"], part.iterrows())]
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
        width=max(560, 140 + int(column_px * (x0 - 0.7 + 0.6))), height=height, showlegend=False, plot_bgcolor="white",
        margin=dict(l=90, r=20, t=top_margin(title_d) if title_d else 30, b=80),
        xaxis=dict(tickvals=centres, ticktext=ticks, range=[-0.7, x0 - 0.7 - 0.3], showgrid=False,
                   zeroline=False, title="position (0-based) and token"),
        yaxis=dict(tickvals=[y for y, _ in rows], ticktext=[s for _, s in rows], range=[lo - 0.5, hi + 0.6],
                   showgrid=True, gridcolor="#eeeeee", zeroline=False, title="block (from 1)"),
        meta={"value": value, "edges": [[int(r.source), int(r.target), float(getattr(r, value))]
                                       for r in e.itertuples()]},
    )
    if title_d:
        fig.update_layout(title=title_d)
    return fig
