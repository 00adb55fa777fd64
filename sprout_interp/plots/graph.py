"""The attribution graph as circuit-tracer's and Neuronpedia's graph viewers draw it (plotly; data from
:mod:`sprout_interp.circuits.attribution_graph` and :mod:`sprout_interp.circuits.graphs`).

:func:`graph_tables` picks the nodes and edges that :func:`~sprout_interp.circuits.graphs.prune_graph` keeps out of a
graph (plus nodes a person pinned) as two DataFrames; :func:`group_nodes` draws chosen nodes as one *supernode*
(its edges the sums of its members'); :func:`shown_labels` gives each node the short label a person reads (typed,
measured or made from the tokens it promotes); :func:`attribution_graph_figure` draws them: x = position (the
prompt's tokens under their columns, each column as wide as its nodes need), y = layer (the embeddings at the bottom,
each block's transcoder features and error nodes, the logits at the top), every node in a place of its own, sized by
influence, the strongest nodes labelled where no label covers another or a node, edges coloured by sign and as wide
as their weight; the whole graph fits :data:`FIT_PX` (a page's width at a 1280-px window) wherever it can.
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

__all__ = ["KIND_CODES", "FIT_PX", "node_key", "graph_tables", "shown_labels", "group_nodes", "figure_row",
           "attribution_graph_figure"]

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
    edges to and from a drawn node at least as strong as the weakest edge kept
    (:func:`~sprout_interp.circuits.graphs.keep_nodes`, the rule circuit-tracer's JSON export shares).
    """
    from sprout_interp.circuits.graphs import keep_nodes, node_influence

    pruned = prune_graph(graph, node_threshold, edge_threshold)
    infl = np.asarray(node_influence(graph) if influence is None else influence, dtype=float)
    kept = pruned.node_mask.numpy()
    shown = keep_nodes(graph, pruned, keep)  # the pinned nodes and their strong edges (one home for the rule)
    mask = shown.node_mask.numpy()
    nodes = graph.nodes[mask].copy()
    nodes["key"] = [node_key(r.kind, r.layer, r.pos, r.feature, r.token_id) for r in nodes.itertuples()]
    nodes["influence"] = infl[mask]
    nodes["kept"] = kept[mask]
    t, s = shown.edge_mask.nonzero(as_tuple=True)
    w = graph.adjacency[t, s]
    edges = pd.DataFrame({"source": s.numpy(), "target": t.numpy(), "weight": w.numpy().astype(float)})
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


def _plain_token(t: str) -> str:
    """A token as a label shows it (unescaped: the figure escapes its labels): leading spaces as ␣, newlines as ↵."""
    t = str(t).replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    rest = t.lstrip(" ")
    return "␣" * (len(t) - len(rest)) + rest


def shown_labels(nodes: pd.DataFrame, promoted: Mapping[tuple[int, int], Sequence[str]] = (),
                 typed: Mapping[str, str] = (), measured: Mapping[str, str] = ()) -> dict[str, str]:
    """{node key: the short label a person reads} for the rows of ``nodes`` (:func:`graph_tables`): a label a
    person typed (``typed``, by key) first, then one made from what was measured (``measured``, by key: a feature's
    description), else a feature's plain label from the tokens it promotes most (``promoted``: {(layer, feature):
    tokens}, e.g. ``"→ ␣Pl, ax"``), a logit's token and probability (``"␣Pl (p 0.98)"``); error nodes and
    embeddings get only a typed label (the tokens are named under their columns). Plain text (the figure escapes
    it), cut to 40 characters."""
    promoted, typed, measured = dict(promoted or {}), dict(typed or {}), dict(measured or {})
    out: dict[str, str] = {}
    for r in nodes.itertuples():
        text = typed.get(r.key) or measured.get(r.key)
        if not text and r.kind == "feature":
            toks = list(promoted.get((int(r.layer), int(r.feature)), []))[:2]
            text = "→ " + ", ".join(_plain_token(t) for t in toks) if toks else f"feature {int(r.feature)}"
        elif not text and r.kind == "logit":
            text = f"{_plain_token(str(r.token))} (p {float(r.logit_prob):.2f})"
        if text:
            out[r.key] = str(text)[:40]
    return out


def figure_row(kind: str, layer: int, n_layers: int) -> int:
    """The figure's row: 0 the embeddings, layer + 1 a block's features and errors, n_layers + 1 the logits."""
    if kind == "embedding":
        return 0
    if kind == "logit":
        return n_layers + 1
    return min(max(int(layer) + 1, 0), n_layers + 1)


def _hover(r, names: Mapping[str, str], labels: Mapping[str, str]) -> str:
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
    label, more = labels.get(r.key), names.get(r.key)
    return ((f"<i>{escape_label(label)}</i><br>" if label else "") + head + f"<br>influence {r.influence:.3f}"
            + (f"<br>{escape_label(more)}" if more else "") + f"<br>key {r.key}")


#: the width (pixels) the graph is laid out to fit: the plot area of the main column at the narrowest window the
#: dashboard is laid out for (:data:`~sprout_interp.plots.common.FULL_COLUMN` less the row labels' margin); a page
#: draws it stretched to its own column, wider, where the window is wider
FIT_PX = FULL_COLUMN - 110
_FONT = 10  # the labels' font size (px)
_CHAR_PX = 0.62 * _FONT  # an average character of that font, a little generous (Chromium draws DejaVu Sans here)
_LINE_PX = 14.0  # a label's line height
_LEFT, _RIGHT = 78, 14  # margins: the rows' names at the left


def _shown_len(s: str) -> int:
    """How many characters a label with plotly's escapes draws."""
    return len(s.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


def _columns(nodes: pd.DataFrame, n_pos: int, fit_px: float | int, slot_px: int, min_px: int, max_stack: int
             ) -> tuple[list[float], list[float], int]:
    """(each position's left edge, its width, the lines a crowded cell stacks in) in pixels of the design width: a
    position is as wide as its most crowded cell needs (``slot_px`` a node in a line; a cell of one node across its
    marker's ``size`` and a pixel and a half), at least ``min_px``; a cell
    stacks its nodes in up to ``stack`` lines, the fewest that fit ``fit_px`` (``max_stack`` when none does)."""
    count = nodes.groupby(["row", "pos"]).size()
    widest = nodes.groupby(["row", "pos"])["size"].max()
    for stack in range(1, max_stack + 1):
        width = [float(min_px)] * n_pos
        for (r, p), c in count.items():
            if 0 <= p < n_pos:
                cols = -(-int(c) // min(stack, int(c)))
                need = cols * slot_px + 2.0 if cols > 1 else float(widest[(r, p)]) + 1.5
                width[int(p)] = max(width[int(p)], need)
        if sum(width) <= fit_px:
            break
    start = list(np.concatenate([[0.0], np.cumsum(width)[:-1]]))
    return start, width, stack


def _box_overlap(a: tuple, b: tuple, pad: float = 1.0) -> bool:
    return a[0] < b[2] + pad and b[0] < a[2] + pad and a[1] < b[3] + pad and b[1] < a[3] + pad


def _place_labels(points: list[tuple[str, float, float, float, str]], obstacles: list[tuple], width: float,
                  height: float, most: int) -> list[tuple[str, float, float, str]]:
    """Where each of the first ``most`` labels that find room goes: ``points`` are (key, x px, y px from the top,
    marker radius, text) in order of priority; ``obstacles`` boxes (x0, y0, x1, y1) no label may cover (the
    markers); a label is tried beside its node, then further off along a leader line, left of it first in the
    right half of the plot; never over another label, a marker or the plot's edge. Returns (key, tail dx, tail dy,
    side "left"/"right") offsets in pixels from the node to the label's near edge."""
    placed: list[tuple] = []
    out = []
    dys = [0.0, -_LINE_PX, _LINE_PX, -2.0 * _LINE_PX, 2.0 * _LINE_PX, -3.0 * _LINE_PX, 3.0 * _LINE_PX]
    for key, x, y, r, text in points:
        if len(out) >= most:
            break
        w, h = _shown_len(text) * _CHAR_PX + 6, _LINE_PX
        sides = ("left", "right") if x > width / 2 else ("right", "left")
        done = False
        for far in (6, 24, 60, 110, 170, 240, 320):
            for dy in dys:
                for side in sides:
                    dx = -(r + far) if side == "left" else r + far
                    x0 = x + dx - w if side == "left" else x + dx
                    box = (x0, y + dy - h / 2, x0 + w, y + dy + h / 2)
                    if box[0] < 2 or box[2] > width - 2 or box[1] < 2 or box[3] > height - 2:
                        continue
                    if any(_box_overlap(box, b) for b in placed) or any(_box_overlap(box, b, 0.0) for b in obstacles):
                        continue
                    placed.append(box)
                    out.append((key, dx, dy, side))
                    done = True
                    break
                if done:
                    break
            if done:
                break
    return out


def attribution_graph_figure(nodes: pd.DataFrame, edges: pd.DataFrame, tokens: Sequence[str], n_layers: int,
                             pinned: Iterable[str] = (), notes: Optional[Mapping[str, str]] = None,
                             max_edges: int = 600, title: Optional[str] = None,
                             labels: Optional[Mapping[str, str]] = None, n_labels: int = 16,
                             fit_px: float | int = FIT_PX, slot_px: int = 13, min_px: int = 6, max_stack: int = 6
                             ) -> go.Figure:
    """The graph of :func:`graph_tables` (or :func:`group_nodes`) laid out as circuit-tracer's viewer does: x = the
    prompt's positions, each as wide as its most crowded cell needs (a position with one node per row ``min_px``
    pixels, narrow), y = layer (embeddings at the bottom, block 1 … block ``n_layers``, logits at the top). The nodes
    of one block and position sit in its row's band, the most influential first, stacked in as few lines (at most
    ``max_stack``) as let the whole graph fit ``fit_px`` pixels (:data:`FIT_PX`: the page's width at a 1280-px
    window), ``slot_px`` pixels a node, so no two nodes ever share a place. The figure then has no fixed width (a
    page stretches it to its column); a prompt too long to fit even so gets the width it needs (``layout.width``,
    for a box that scrolls sideways). Every token is named under its column (rotated, in up to three staggered tiers
    where columns are narrow, a thin line up to its column: labels never overlap).

    Nodes: features circles, error nodes grey squares, embeddings triangles, logits stars, supernodes diamonds (a
    colour each, named in the legend and beside them); sized by influence (area); ``pinned`` keys ringed in black.
    ``labels`` ({key: text}): the text drawn beside the ``n_labels`` most influential labelled nodes (supernodes and
    the top logit first), each placed where it covers no marker, no other label and stays inside the plot (a
    leader line joins it to its node; a node with no room is left unlabelled) and shown in every labelled node's
    hover. Edges: blue positive, red negative, wider and darker as ``|weight|`` grows relative to the largest; the
    ``max_edges`` strongest drawn, and listed in ``layout.meta["edges"]`` as ``[source, target, weight]`` (node
    indices) for a page's hover to highlight a node's edges. ``notes``: more hover text per key; ``title``: none by
    default (the page names the figure above it). Each node's ``customdata`` is ``[kind code (KIND_CODES), node
    index]``."""
    notes, labels = dict(notes or {}), dict(labels or {})
    pinned = set(pinned)
    T = len(tokens)
    nodes = nodes.copy()
    if "members" not in nodes:
        nodes["members"] = [[] for _ in range(len(nodes))]
    nodes["row"] = [figure_row(k, ly, n_layers) for k, ly in zip(nodes["kind"], nodes["layer"])]
    order = {"supernode": 0, "logit": 0, "feature": 1, "embedding": 1, "error": 2}
    nodes["_o"] = nodes["kind"].map(order)
    nodes["_p"] = nodes["logit_prob"].fillna(0) if "logit_prob" in nodes else 0.0
    nodes = nodes.sort_values(["row", "pos", "_o", "influence", "_p"], ascending=[True, True, True, False, False])
    big = max(float(nodes["influence"].max()) if len(nodes) else 1.0, 1e-9)
    sizes = 5 + (slot_px - 9) * np.sqrt(np.clip(nodes["influence"].to_numpy(dtype=float), 0, None) / big)
    nodes["size"] = np.where(nodes["kind"] == "logit", slot_px - 5, np.minimum(sizes, slot_px - 4))  # a logit's
    # influence is 0 by definition: its probability is named in its hover
    nodes.loc[nodes["kind"] == "supernode", "size"] = slot_px - 3
    start, width, stack = _columns(nodes, T, fit_px, slot_px, min_px, max_stack)
    total = sum(width)
    fits = total <= fit_px
    plot_w = fit_px if fits else total  # the design width the labels are placed at (the page draws it as wide or wider)
    line_px = slot_px - 1
    row_px = max(40, stack * line_px + 16)
    nodes["slot"] = nodes.groupby(["row", "pos"]).cumcount()
    count = nodes.groupby(["row", "pos"]).size()
    xs, ys = [], []
    for p, r, s in zip(nodes["pos"], nodes["row"], nodes["slot"]):
        c = int(count[(r, p)])
        n_lines = min(stack, c)
        cols = -(-c // n_lines)
        left = start[int(p)] + (width[int(p)] - cols * slot_px) / 2
        xs.append(left + (s // n_lines + 0.5) * slot_px)
        ys.append(r - (s % n_lines - (n_lines - 1) / 2) * line_px / row_px)
    nodes["x"], nodes["y"] = xs, ys
    xy = dict(zip(nodes["node"], zip(nodes["x"], nodes["y"])))
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
            lx, ly = [], []
            for s, t in zip(sel["source"], sel["target"]):
                (sx, sy), (tx, ty) = xy[s], xy[t]
                lx += [sx, tx, None]
                ly += [sy, ty, None]
            fig.add_trace(go.Scatter(x=lx, y=ly, mode="lines", hoverinfo="skip", showlegend=False,
                                     line=dict(width=0.6 + 1.2 * b, color=colour), opacity=0.18 + 0.2 * b,
                                     name=f"edges {'+' if sign > 0 else '-'}{b}"))
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
                marker=dict(size=g["size"], color=colour,
                            symbol="diamond" if kind == "supernode" else _SYMBOLS[kind],
                            line=dict(width=ring, color=["black" if w > 1 else "white" for w in ring])),
                customdata=[[KIND_CODES[kind], int(n)] for n in g["node"]],
                hovertext=[_hover(r, notes, labels) for r in g.itertuples()], hovertemplate="%{hovertext}<extra></extra>",
            ))
    # the pixel geometry at the design width: the y axis spans n_layers + 2.2 rows of row_px
    y_lo, y_hi = -0.6, n_layers + 1.6
    height_plot = row_px * (y_hi - y_lo)
    x_lo, x_hi = -2.0, plot_w + 2.0
    kx = plot_w / (x_hi - x_lo)

    def px(x: float, y: float) -> tuple[float, float]:
        return (x - x_lo) * kx, (y_hi - y) * row_px

    # the prompt's tokens under their columns: rotated, staggered in tiers where the columns are too close
    notes_ = []
    centres = [start[p] + width[p] / 2 for p in range(T)]
    texts = [f"{p}: {show_token(str(t), 10)}" for p, t in enumerate(tokens)]
    long_px = max([_shown_len(t) * _CHAR_PX for t in texts] or [0]) + 4
    last, tier_of = [-1e9, -1e9, -1e9], []
    for c in centres:
        t = next((k for k in range(3) if (c - last[k]) * kx >= _LINE_PX), int(np.argmin(last)))
        last[t] = c
        tier_of.append(t)
    n_tiers = max(tier_of, default=0) + 1
    for c, text, t in zip(centres, texts, tier_of):
        notes_.append(dict(x=c, y=0, xref="x", yref="paper", text=text, textangle=-90, showarrow=True, arrowhead=0,
                           arrowwidth=0.6, arrowcolor="#bbbbbb", ax=0, ay=4 + t * (long_px + 4), standoff=0,
                           xanchor="center", yanchor="top", font=dict(size=_FONT, color="#333"), name="token"))
    # labels beside the strongest labelled nodes (supernodes, the top logit, then features by influence)
    marks = [(*px(x, y), s / 2 + 1) for x, y, s in zip(nodes["x"], nodes["y"], nodes["size"])]
    obstacles = [(x - r, y - r, x + r, y + r) for x, y, r in marks]
    rank = nodes.assign(_k=nodes["kind"].map({"supernode": 0, "logit": 1}).fillna(2),
                        _m=[(x, y, r) for x, y, r in marks])
    top_logit = rank[rank["kind"] == "logit"].sort_values("_p", ascending=False)["key"].head(1).tolist()
    rank = rank[(rank["kind"] != "logit") | rank["key"].isin(top_logit)]
    rank = rank[rank["key"].isin(labels)].sort_values(["_k", "influence"], ascending=[True, False])
    points = [(k, m[0], m[1], m[2], escape_label(str(labels[k])[:40])) for k, m in zip(rank["key"], rank["_m"])]
    placed = _place_labels(points, obstacles, plot_w * 1.0, height_plot, n_labels)
    where = dict(zip(nodes["key"], zip(nodes["x"], nodes["y"], nodes["size"])))
    text_of = {k: t for k, *_, t in points}
    # the label's near edge sits at an x value (not a pixel offset): a page that draws the figure wider moves it with
    # the columns, so nothing that cleared it at the design width comes under it
    for key, dx, dy, side in placed:
        x, y, s = where[key]
        notes_.append(dict(x=x, y=y, xref="x", yref="y", text=text_of[key], showarrow=True, arrowhead=0,
                           arrowwidth=0.7, arrowcolor="#888888", ax=x + dx / kx, axref="x", ay=dy, standoff=s / 2,
                           xanchor="right" if side == "left" else "left", yanchor="middle",
                           bgcolor="rgba(255,255,255,0.85)", font=dict(size=_FONT, color="#222"), name="node label"))
    rows = [(0, "embeddings")] + [(b, f"block {b}") for b in range(1, n_layers + 1)] + [(n_layers + 1, "logits")]
    heading = title_below_toolbar(title, width=FULL_COLUMN - 200) if title else None
    top = top_margin(heading) if heading else TOOLBAR_PX + 10
    bottom = 10 + n_tiers * (long_px + 4) + (40 if supers else 0)
    height = int(top + bottom + height_plot)
    y_ticks = dict(tickmode="array", tickvals=[v for v, _ in rows], ticktext=[t for _, t in rows],
                   tickfont=dict(size=11), range=[y_lo, y_hi], fixedrange=True, zeroline=False)
    layout = dict(
        title=heading, height=height, plot_bgcolor="white", hovermode="closest",
        margin=dict(l=_LEFT, r=_RIGHT, t=top, b=int(bottom)), showlegend=bool(supers),
        legend=dict(orientation="h", x=1, xanchor="right", y=0, yref="container", yanchor="bottom",
                    title=dict(text="supernodes:")),
        annotations=notes_,
        xaxis=dict(tickmode="array", tickvals=centres, ticktext=[""] * T, ticks="outside", ticklen=3,
                   tickcolor="#bbbbbb", range=[x_lo, x_hi], fixedrange=True, showgrid=False, zeroline=False),
        yaxis=dict(**y_ticks, showgrid=True, gridcolor="rgba(0,0,0,0.06)"),
        meta=dict(edges=[[int(s), int(t), round(float(w), 5)] for s, t, w in zip(e["source"], e["target"], e["weight"])],
                  design_px=plot_w, fits=bool(fits)),
    )
    if not fits:  # a long prompt: drawn at its own width in a box that scrolls; its rows named on both sides
        layout["width"] = int(_LEFT + _RIGHT + 86 + plot_w)
        layout["margin"]["r"] = _RIGHT + 86
        layout["yaxis2"] = dict(**y_ticks, overlaying="y", side="right", showgrid=False)
        fig.add_trace(go.Scatter(x=[centres[0]] if centres else [0], y=[0], yaxis="y2", mode="lines",
                                 hoverinfo="skip", showlegend=False, name="row labels"))
    fig.update_layout(**layout)
    return fig
