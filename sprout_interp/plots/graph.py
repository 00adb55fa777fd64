"""The attribution graph as Neuronpedia's graph viewer draws it (plotly; data from
:mod:`sprout_interp.circuits.attribution_graph` and :mod:`sprout_interp.circuits.graphs`).

:func:`graph_tables` picks the nodes and edges that :func:`~sprout_interp.circuits.graphs.prune_graph` keeps out of a
graph (plus nodes a person pinned) as two DataFrames; :func:`group_nodes` draws chosen nodes as one *supernode*
(its edges the sums of its members'); :func:`attribution_graph_figure` draws them: x = position (the prompt's
tokens), y = layer (the embeddings at the bottom, each block's transcoder features and error nodes, the logits at
the top), every node in a slot of its own (a column is as wide as its most crowded layer), sized by influence,
edges coloured by sign and as wide as their weight.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Optional

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sprout_interp.circuits.graphs import AttributionGraph, node_key, prune_graph
from sprout_interp.plots.common import (
    FULL_COLUMN,
    TOOLBAR_PX,
    escape_label,
    show_token,
    title_below_toolbar,
    top_margin,
)

__all__ = ["KIND_CODES", "node_key", "graph_tables", "group_nodes", "attribution_graph_figure"]

#: a node's kind in its customdata's first number (a click reports it); a supernode is 4
KIND_CODES = {"feature": 0, "error": 1, "embedding": 2, "logit": 3, "supernode": 4}
_COLOURS = {"feature": "#4c78a8", "error": "#9d9d9d", "embedding": "#59a14f", "logit": "#f28e2b"}
_SYMBOLS = {"feature": "circle", "error": "square", "embedding": "triangle-up", "logit": "star"}
_SUPER_COLOURS = ["#b279a2", "#e15759", "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac", "#17becf"]
_POSITIVE, _NEGATIVE = "#2166ac", "#b2182b"


def graph_tables(graph: AttributionGraph, node_threshold: float = 0.8, edge_threshold: float = 0.98,
                 influence: Optional[Sequence[float]] = None, keep: Iterable[int] = ()
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The pruned graph as tables: ``(nodes, edges)``.

    ``nodes``: the node table's rows that :func:`~sprout_interp.circuits.graphs.prune_graph` keeps at these
    thresholds, and the nodes ``keep`` names (node indices, kept whatever their influence), with ``key``
    (:func:`node_key`), ``influence`` (``influence``: each node's influence on the logits in node order, as
    :func:`~sprout_interp.circuits.graphs.node_influence` gives it; computed when None) and ``kept`` (False for a
    node only ``keep`` brought in). ``edges``: ``source, target, weight`` (node indices; the direct effect of the
    source on the target's input, in the target's units), the edges pruning keeps, and each of a ``keep`` node's
    edges to and from a drawn node at least as strong as the weakest edge kept.
    """
    from sprout_interp.circuits.graphs import node_influence

    pruned = prune_graph(graph, node_threshold, edge_threshold)
    infl = np.asarray(node_influence(graph) if influence is None else influence, dtype=float)
    mask = pruned.node_mask.numpy().copy()
    extra = [int(i) for i in keep if 0 <= int(i) < len(mask) and not mask[int(i)]]
    kept = mask.copy()
    mask[extra] = True
    nodes = graph.nodes[mask].copy()
    nodes["key"] = [node_key(r.kind, r.layer, r.pos, r.feature, r.token_id) for r in nodes.itertuples()]
    nodes["influence"] = infl[mask]
    nodes["kept"] = kept[mask]
    t, s = pruned.edge_mask.nonzero(as_tuple=True)
    w = graph.adjacency[t, s]
    edges = pd.DataFrame({"source": s.numpy(), "target": t.numpy(), "weight": w.numpy().astype(float)})
    if extra and len(edges):
        weakest = float(edges["weight"].abs().min())
        shown = np.flatnonzero(mask)
        add = []
        for i in extra:
            row, col = graph.adjacency[i, shown].numpy(), graph.adjacency[shown, i].numpy()
            add += [(int(j), i, float(v)) for j, v in zip(shown, row) if abs(v) >= weakest and j != i]
            add += [(i, int(j), float(v)) for j, v in zip(shown, col) if abs(v) >= weakest and j != i]
        if add:
            edges = pd.concat([edges, pd.DataFrame(add, columns=["source", "target", "weight"])], ignore_index=True)
            edges = edges.drop_duplicates(["source", "target"]).reset_index(drop=True)
    return nodes.reset_index(drop=True), edges


def group_nodes(nodes: pd.DataFrame, edges: pd.DataFrame, groups: Mapping[str, Sequence[str]]
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each group (``{name: [node keys]}``) drawn as one supernode: its members' rows replaced by one row (``kind``
    "supernode", ``key`` ``S:{name}``, ``layer`` and ``pos`` the members' mean rounded, ``influence`` their sum,
    ``members`` the keys), and edges between drawn nodes summed (a group's edges to a node: the sum of its
    members'; edges inside a group dropped). A key in two groups counts in the first. Returns new tables; keys not
    drawn are left out."""
    where: dict[str, str] = {}
    for name, keys in groups.items():
        for k in keys:
            where.setdefault(str(k), f"S:{name}")
    nodes = nodes.copy()
    nodes["members"] = [[] for _ in range(len(nodes))]
    if not where:
        return nodes, edges.copy()
    group_of = nodes["key"].map(where)
    rows = []
    for gkey, part in nodes[group_of.notna()].groupby(group_of[group_of.notna()], sort=False):
        rows.append(dict(node=-1 - len(rows), kind="supernode", layer=int(round(part["layer"].mean())),
                         pos=int(round(part["pos"].mean())), feature=-1, token_id=-1, token="",
                         key=gkey, influence=float(part["influence"].sum()), kept=True, members=list(part["key"])))
    plain = nodes[group_of.isna()]
    out = pd.concat([plain, pd.DataFrame(rows)], ignore_index=True) if rows else plain.reset_index(drop=True)
    out["block"] = out["layer"] + 1
    ids = dict(zip(nodes["node"], nodes["key"].map(lambda k: where.get(k, k))))
    ids_new = dict(zip(out["key"], out["node"]))
    e = edges.copy()
    e["source"] = e["source"].map(ids).map(ids_new)
    e["target"] = e["target"].map(ids).map(ids_new)
    e = e.dropna(subset=["source", "target"])
    e = e[e["source"] != e["target"]]
    e = e.groupby(["source", "target"], as_index=False, sort=False)["weight"].sum()
    e[["source", "target"]] = e[["source", "target"]].astype(int)
    return out, e


def _row(kind: str, layer: int, n_layers: int) -> int:
    """The figure's row: 0 the embeddings, layer + 1 a block's features and errors, n_layers + 1 the logits."""
    if kind == "embedding":
        return 0
    if kind == "logit":
        return n_layers + 1
    return min(max(int(layer) + 1, 0), n_layers + 1)


def _hover(r, names: Mapping[str, str]) -> str:
    kind = r.kind
    if kind == "supernode":
        return (f"<b>supernode {escape_label(r.key[2:])}</b>: {len(r.members)} nodes<br>"
                + "<br>".join(escape_label(k) for k in r.members[:12]) + ("<br>…" if len(r.members) > 12 else "")
                + f"<br>influence (summed) {r.influence:.3f}")
    tok = show_token(str(r.token))
    if kind == "feature":
        head = (f"<b>feature {int(r.feature)}</b>, block {int(r.layer) + 1} (layer {int(r.layer)}), pos {int(r.pos)} "
                f"({tok})<br>activation {r.activation:.3f}")
    elif kind == "error":
        head = (f"<b>error node</b>, block {int(r.layer) + 1} (layer {int(r.layer)}), pos {int(r.pos)} ({tok}): what "
                "the transcoder misses")
    elif kind == "embedding":
        head = f"<b>embedding</b> of {tok}, pos {int(r.pos)}"
    else:
        head = f"<b>logit</b> {tok}: probability {r.logit_prob:.3f}"
    more = names.get(r.key)
    return (head + f"<br>influence {r.influence:.3f}" + (f"<br>{escape_label(more)}" if more else "")
            + f"<br>key {r.key}")


def attribution_graph_figure(nodes: pd.DataFrame, edges: pd.DataFrame, tokens: Sequence[str], n_layers: int,
                             pinned: Iterable[str] = (), notes: Optional[Mapping[str, str]] = None,
                             max_edges: int = 600, title: Optional[str] = None, slot_px: int = 16,
                             row_px: int = 52, stack: int = 3) -> go.Figure:
    """The graph of :func:`graph_tables` (or :func:`group_nodes`): x = position (``tokens``, one column each), y =
    layer (``row_px`` pixels a row: embeddings, block 1 … block ``n_layers``, logits). The nodes of one layer and
    position stack in up to ``stack`` lines inside the layer's band and spread sideways (a column is as wide as its
    most crowded cell needs, ``slot_px`` pixels a node), so no two nodes ever share a place. Node markers are at
    most ``slot_px - 4`` across (ring included: ``slot_px - 2``), their area growing with influence; features are circles, error nodes grey
    squares, embeddings triangles, logits stars, supernodes diamonds (a colour each, named in the legend);
    ``pinned`` keys get a black ring. Edges: blue positive, red negative, wider and darker as ``|weight|`` grows
    relative to the largest; the ``max_edges`` strongest are drawn. ``notes``: more hover text per key (a
    feature's top tokens); ``title``: none by default (the page names the figure above it). Each node's
    ``customdata`` is ``[kind code (KIND_CODES), node index]``; the rows are named on both sides; the figure is at
    least :data:`~sprout_interp.plots.common.FULL_COLUMN` wide (a page scrolls it sideways when wider)."""
    notes = dict(notes or {})
    pinned = set(pinned)
    T = len(tokens)
    nodes = nodes.copy()
    if "members" not in nodes:
        nodes["members"] = [[] for _ in range(len(nodes))]
    nodes["row"] = [_row(k, ly, n_layers) for k, ly in zip(nodes["kind"], nodes["layer"])]
    order = {"supernode": 0, "feature": 1, "embedding": 1, "logit": 1, "error": 2}
    nodes["_o"] = nodes["kind"].map(order)
    nodes = nodes.sort_values(["row", "pos", "_o", "influence"], ascending=[True, True, True, False])
    nodes["slot"] = nodes.groupby(["row", "pos"]).cumcount()
    count = nodes.groupby(["row", "pos"]).size()
    # a crowded cell stacks its nodes in up to ``stack`` lines inside its layer's band, then spreads them sideways
    lines = {cell: min(stack, int(c)) for cell, c in count.items()}
    width = {p: 1 for p in range(T)}
    for (r, p), c in count.items():
        if 0 <= p < T:
            width[p] = max(width[p], -(-int(c) // lines[(r, p)]))
    start, x0 = {}, 0.0
    for p in range(T):
        start[p] = x0
        x0 += width[p] + 0.6  # a gap between columns
    n_slots = x0 - 0.6
    step = (slot_px - 1) / row_px  # one line of a band, in rows
    xs, ys = [], []
    for p, r, s in zip(nodes["pos"], nodes["row"], nodes["slot"]):
        n_lines, c = lines[(r, p)], count[(r, p)]
        cols = -(-int(c) // n_lines)
        xs.append(start[int(p)] + (width[int(p)] - cols) / 2 + s // n_lines)
        ys.append(r + (s % n_lines - (n_lines - 1) / 2) * step)
    nodes["x"], nodes["y"] = xs, ys
    xy = dict(zip(nodes["node"], zip(nodes["x"], nodes["y"])))
    big = max(float(nodes["influence"].max()) if len(nodes) else 1.0, 1e-9)
    fig = go.Figure()
    # edges: the strongest ``max_edges``, in four widths of each sign (one trace each: thousands of lines stay fast)
    e = edges[edges["source"].isin(xy) & edges["target"].isin(xy)]
    e = e.reindex(e["weight"].abs().sort_values(ascending=False).index).head(max_edges)
    wmax = max(float(e["weight"].abs().max()) if len(e) else 1.0, 1e-12)
    for sign, colour in ((1, _POSITIVE), (-1, _NEGATIVE)):
        part = e[np.sign(e["weight"]) == sign]
        band = np.minimum((part["weight"].abs() / wmax * 4).astype(int), 3) if len(part) else []
        for b in range(4):
            sel = part[np.asarray(band) == b] if len(part) else part
            if not len(sel):
                continue
            xs, ys = [], []
            for s, t in zip(sel["source"], sel["target"]):
                (sx, sy), (tx, ty) = xy[s], xy[t]
                xs += [sx, tx, None]
                ys += [sy, ty, None]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                     line=dict(width=0.6 + 1.2 * b, color=colour), opacity=0.18 + 0.2 * b,
                                     name=f"edges {'+' if sign > 0 else '-'}{b}"))
    sizes = 5 + (slot_px - 9) * np.sqrt(np.clip(nodes["influence"].to_numpy(dtype=float), 0, None) / big)
    nodes["size"] = np.where(nodes["kind"] == "logit", slot_px - 6, np.minimum(sizes, slot_px - 4))  # a logit's
    # influence is 0 by definition: its probability is named in its hover
    supers = [k for k in nodes["key"] if k.startswith("S:")]
    for kind in ("embedding", "feature", "error", "logit", "supernode"):
        part = nodes[nodes["kind"] == kind]
        groups = [(k, part[part["key"] == k]) for k in supers] if kind == "supernode" else [(kind, part)]
        for name, g in groups:
            if not len(g):
                continue
            colour = (_SUPER_COLOURS[supers.index(name) % len(_SUPER_COLOURS)] if kind == "supernode"
                      else _COLOURS[kind])
            ring = [2 if k in pinned or kind == "supernode" else 0.5 for k in g["key"]]
            fig.add_trace(go.Scatter(
                x=g["x"], y=g["y"], mode="markers", name=(escape_label(name[2:]) if kind == "supernode" else kind),
                showlegend=kind == "supernode",
                marker=dict(size=g["size"] if kind != "supernode" else slot_px - 4, color=colour,
                            symbol="diamond" if kind == "supernode" else _SYMBOLS[kind],
                            line=dict(width=ring, color=["black" if w > 1 else "white" for w in ring])),
                customdata=[[KIND_CODES[kind], int(n)] for n in g["node"]],
                hovertext=[_hover(r, notes) for r in g.itertuples()], hovertemplate="%{hovertext}<extra></extra>",
            ))
    rows = [(0, "embeddings")] + [(b, f"block {b}") for b in range(1, n_layers + 1)] + [(n_layers + 1, "logits")]
    ticks = [start[p] + (width[p] - 1) / 2 for p in range(T)]
    labels = [f"{p}: {show_token(str(t), 8)}" for p, t in enumerate(tokens)]
    w = int(max(FULL_COLUMN - 20, 200 + slot_px * (n_slots + 1.4)))
    # a title, when given, hangs below the tool bar; without one (a page that scrolls the figure says what it is
    # above it) the plot starts just below the tool bar's band
    heading = title_below_toolbar(title, width=FULL_COLUMN - 200) if title else None
    top = top_margin(heading) if heading else TOOLBAR_PX + 10
    bottom = 120 + (40 if supers else 0)  # the tick labels, the axis's name and (with supernodes) the legend
    height = top + bottom + row_px * (n_layers + 2)
    y_ticks = dict(tickmode="array", tickvals=[v for v, _ in rows], ticktext=[t for _, t in rows],
                   tickfont=dict(size=11), range=[-0.6, n_layers + 1.6], fixedrange=True, zeroline=False)
    # the rows are named on both sides: a figure scrolled to its last positions still shows them
    fig.add_trace(go.Scatter(x=[ticks[0]] if ticks else [0], y=[0], yaxis="y2", mode="lines", hoverinfo="skip",
                             showlegend=False, name="row labels"))
    fig.update_layout(
        title=heading, width=w, height=height, plot_bgcolor="white", hovermode="closest",
        margin=dict(l=100, r=100, t=top, b=bottom), showlegend=bool(supers),
        # the legend and the x axis's name sit at the right end, where the page opens the figure
        legend=dict(orientation="h", x=1, xanchor="right", y=0, yref="container", yanchor="bottom",
                    title=dict(text="supernodes:")),
        annotations=[dict(text="position: token (0-based)", x=1, xref="paper", xanchor="right", y=0, yref="paper",
                          yanchor="top", yshift=-92, showarrow=False, font=dict(size=12, color="#444"))],
        xaxis=dict(tickmode="array", tickvals=ticks, ticktext=labels, tickangle=-90, tickfont=dict(size=10),
                   range=[-0.8, n_slots - 0.2], fixedrange=True, showgrid=False,
                   zeroline=False),
        yaxis=dict(**y_ticks, showgrid=True, gridcolor="rgba(0,0,0,0.06)"),
        yaxis2=dict(**y_ticks, overlaying="y", side="right", showgrid=False),
    )
    return fig
