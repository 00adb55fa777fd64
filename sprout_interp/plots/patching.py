"""Figures for activation patching and contribution graphs (plotly; data from sprout_interp.circuits.patching / attribution).

Every figure says its convention: blocks counted from 1 (the chapter's "layer N"), positions from 0.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sprout_interp.circuits.heads import head_label
from sprout_interp.plots.common import (
    FULL_COLUMN,
    HALF_COLUMN,
    show_token,
    thinned_ticks,
    title_below_toolbar,
    top_margin,
    wrap_text,
)

__all__ = ["patching_heatmap", "head_patching_heatmap", "contribution_graph_figure", "patching_agreement_figure", "NODE_KINDS"]

_SCALE = [[0.0, "#b2182b"], [0.5, "#f7f7f7"], [1.0, "#2166ac"]]  # red: towards corrupted, blue: towards clean


def patching_heatmap(df: pd.DataFrame, tokens: Sequence[str], title: Optional[str] = None) -> go.Figure:
    """Score of each (block, position) patch: ``df`` from ``activation_patch(..., by="layer_pos")``."""
    L, T = int(df["layer"].max()) + 1, len(tokens)
    z = np.full((L, T), np.nan)
    z[df["layer"].to_numpy(), df["pos"].to_numpy()] = df["score"].to_numpy()
    x = [f"{p}: {show_token(t)}" for p, t in enumerate(tokens)]
    site = df.attrs.get("site", "resid_pre")
    fig = go.Figure(go.Heatmap(
        z=z, x=x, y=[f"block {l + 1}" for l in range(L)], colorscale=_SCALE, zmid=0.0,
        colorbar=dict(title="score"),
        hovertemplate="%{y}, position %{x}<br>score %{z:.3f}<extra></extra>",
    ))
    # labels upright and at most one per 14 pixels of the narrowest page (the rest are in the hover)
    fig.update_layout(
        title=wrap_text(title or f"patching {site} by block x position (score: 0 = corrupted run, 1 = clean run)",
                        FULL_COLUMN - 100),
        xaxis=dict(title="position: token (0-based)", tickangle=-90, tickfont=dict(size=10),
                   **thinned_ticks(x, (FULL_COLUMN - 200) // 14)),
        yaxis=dict(title="block (from 1)", autorange="reversed"),
        height=max(300, 40 * L + 180), margin=dict(l=80, r=20, t=60, b=140),
    )
    return fig


def head_patching_heatmap(df: pd.DataFrame, title: Optional[str] = None) -> go.Figure:
    """Score of each head's patch: ``df`` from ``activation_patch(..., site="z", by="head")``."""
    L, H = int(df["layer"].max()) + 1, int(df["head"].max()) + 1
    z = np.full((L, H), np.nan)
    z[df["layer"].to_numpy(), df["head"].to_numpy()] = df["score"].to_numpy()
    fig = go.Figure(go.Heatmap(
        z=z, x=[f"head {h}" for h in range(H)], y=[f"block {l + 1}" for l in range(L)], colorscale=_SCALE, zmid=0.0,
        text=np.round(z, 2), texttemplate="%{text}", colorbar=dict(title="score"),
        hovertemplate="%{y} %{x}<br>score %{z:.3f}<extra></extra>",
    ))
    fig.update_layout(title=wrap_text(title or "each head's output patched, all positions (score: 0 = corrupted, 1 = clean)",
                                      FULL_COLUMN - 100),
                      yaxis=dict(title="block (from 1)", autorange="reversed"), xaxis=dict(title="head (from 0)"),
                      height=max(260, 40 * L + 140), margin=dict(l=80, r=20, t=60, b=40))
    return fig


#: what a node of the contribution graph is, in its customdata's first number (a click reports it)
NODE_KINDS = {"embed": 0, "head": 1, "mlp": 2}


def contribution_graph_figure(nodes: pd.DataFrame, edges: pd.DataFrame, tokens: Sequence[str],
                              n_layers: Optional[int] = None, n_heads: Optional[int] = None,
                              title: Optional[str] = None, row_px: int = 16, column_px: int = 15) -> go.Figure:
    """The contribution graph, as the LLM Transparency Tool draws it: x = position (every token of the text), y =
    layer, from the embedding at the bottom to the output at the top. Every block has a row for each of its heads
    and one for its feed-forward (blocks counted from 1, all ``n_layers`` drawn, kept parts or not), so no two nodes
    ever share a place: ``row_px`` pixels a row, node markers at most ``row_px - 2`` across.

    Nodes sit at the prediction's position (``nodes.attrs["pos"]``): the embedding, each head and each feed-forward
    that :func:`~sprout_interp.circuits.attribution.contribution_graph` kept, sized by how much it pushes the token
    (blue for, red against). Lines run from each earlier position a head reads (a grey dot on the stream entering
    that head's block) to the head, as wide as the part of the head's push that comes from there. Labels are in
    the hover. Each node's ``customdata`` is ``[kind, layer, head]`` (``kind`` from :data:`NODE_KINDS`; head -1
    for the others), so a click can open that part's own page. The figure is ``column_px`` pixels a token across
    (at least 800): a page scrolls it sideways when the text is long.
    """
    pos = int(nodes.attrs.get("pos", len(tokens) - 1))
    T = len(tokens)
    L = int(n_layers if n_layers is not None else max(nodes["layer"].max() if len(nodes) else 0,
                                                       edges["layer"].max() if len(edges) else 0) + 1)
    heads_in = [int(h) for h in nodes.loc[nodes["kind"] == "head", "head"]] + [int(h) for h in edges["head"]]
    H = int(n_heads if n_heads is not None else (max(heads_in) + 1 if heads_in else 1))
    big = max(float(nodes["attribution"].abs().max()) if len(nodes) else 1.0, 1e-9)
    token = show_token(str(nodes.attrs.get("token", "")))

    def y(kind: str, layer: int = 0, head: int = 0) -> float:
        """The row: 0 the embedding, then each block's heads and its feed-forward, the output on top."""
        if kind == "embed":
            return 0.0
        if kind == "out":
            return float(1 + L * (H + 1))
        return float(1 + layer * (H + 1) + (H if kind == "mlp" else head))

    rows = [(0.0, "embedding")] + [(y("head", l, h), head_label(l, h, with_layer=False)) for l in range(L) for h in range(H)] \
        + [(y("mlp", l), f"block {l + 1} feed-forward") for l in range(L)] + [(y("out"), "output")]
    rows.sort()
    labels = [f"{p}: {show_token(t, 8)}" for p, t in enumerate(tokens)]
    fig = go.Figure()
    # every other block on a grey band, so a block's rows read as one
    shapes = [dict(type="rect", xref="paper", x0=0, x1=1, yref="y", y0=y("head", l) - 0.5, y1=y("mlp", l) + 0.5,
                   fillcolor="rgba(0,0,0,0.045)", line=dict(width=0), layer="below") for l in range(0, L, 2)]
    shapes.append(dict(type="line", xref="x", x0=pos, x1=pos, yref="y", y0=0, y1=y("out"),
                       line=dict(color="rgba(0,0,0,0.25)", width=1, dash="dot"), layer="below"))
    for r in edges.itertuples():  # from the stream entering the head's block at the position read, to the head
        fig.add_trace(go.Scatter(
            x=[r.src_pos, pos], y=[y("head", r.layer) - 0.5, y("head", r.layer, r.head)],
            mode="lines", line=dict(width=1 + 6 * abs(r.attribution) / big, color="#2166ac" if r.attribution > 0 else "#b2182b"),
            opacity=0.3 + 0.5 * abs(r.attribution) / big, hoverinfo="skip", showlegend=False,
        ))
    # the positions read: one dot per (block, position), its hover listing the heads that read there
    reads: dict[tuple[int, int], list] = {}
    for r in edges.itertuples():
        reads.setdefault((int(r.layer), int(r.src_pos)), []).append(r)
    fig.add_trace(go.Scatter(
        x=[p for _, p in reads], y=[y("head", l) - 0.5 for l, _ in reads], mode="markers", name="positions read",
        marker=dict(size=7, color="#666", line=dict(width=0)), showlegend=False,
        hovertext=[f"the stream entering block {l + 1} at position {p} ({show_token(str(rs[0].src_token))}), read by<br>"
                   + "<br>".join(f"  block {r.block} head {r.head}: {r.attribution:+.3f} logits" for r in rs)
                   for (l, p), rs in reads.items()],
        hovertemplate="%{hovertext}<extra></extra>",
    ))
    what = {"embed": "open the Residual stream page", "head": "open its page (Attention heads)",
            "mlp": "split it into neurons (Neurons page)"}
    fig.add_trace(go.Scatter(
        x=[pos] * len(nodes), y=[y(r.kind, int(r.layer), int(r.head)) for r in nodes.itertuples()], mode="markers",
        name="parts", showlegend=False,
        marker=dict(size=[5 + (row_px - 7) * abs(a) / big for a in nodes["attribution"]],
                    color=["#2166ac" if a > 0 else "#b2182b" for a in nodes["attribution"]], line=dict(width=1, color="white")),
        customdata=[[NODE_KINDS.get(r.kind, -1), int(r.layer), int(r.head)] for r in nodes.itertuples()],
        hovertext=[f"<b>{c}</b>{f' (layer {int(l)})' if k != 'embed' else ''}: {a:+.3f} logits toward {token}"
                   f"<br>click: {what.get(k, '')}"
                   for c, k, l, a in zip(nodes["component"], nodes["kind"], nodes["layer"], nodes["attribution"])],
        hovertemplate="%{hovertext}<extra></extra>",
    ))
    fig.add_trace(go.Scatter(
        x=[pos], y=[y("out")], mode="markers", marker=dict(symbol="star", size=row_px - 2, color="#333"), showlegend=False,
        hovertext=[f"the prediction at position {pos}: {token} (logit {float(nodes.attrs.get('logit', float('nan'))):.2f})"],
        hovertemplate="%{hovertext}<extra></extra>",
    ))
    n_rows = len(rows)
    w = max(FULL_COLUMN - 20, 200 + column_px * T)
    heading = title_below_toolbar(title or f"what pushes {token} at position {pos}: every head and feed-forward (blocks "
                                           "from 1), lines from the positions each head reads", width=FULL_COLUMN - 200)
    fig.update_layout(
        title=heading, shapes=shapes, width=w, height=top_margin(heading) + 130 + row_px * n_rows,
        margin=dict(l=150, r=20, t=top_margin(heading), b=130), plot_bgcolor="white", hovermode="closest",
        xaxis=dict(tickmode="array", tickvals=list(range(T)), ticktext=labels, tickangle=-90, tickfont=dict(size=10),
                   title="position: token (0-based)", range=[-0.7, T - 0.3], fixedrange=True, showgrid=False,
                   zeroline=False),
        yaxis=dict(tickmode="array", tickvals=[v for v, _ in rows], ticktext=[t for _, t in rows], tickfont=dict(size=10),
                   range=[-0.7, y("out") + 0.7], fixedrange=True, showgrid=True, gridcolor="rgba(0,0,0,0.06)",
                   zeroline=False),
    )
    return fig


def patching_agreement_figure(df: pd.DataFrame, title: Optional[str] = None) -> go.Figure:
    """Attribution estimate against exact patching, one marker per patch: ``df`` from
    ``circuits.patching.patching_agreement``; markers on the diagonal are estimated exactly."""
    label = [f"block {int(r.block)}" + (f" head {int(r.head)}" if "head" in df.columns else "")
             + (f", position {int(r.pos)}: {show_token(r.token)}" if "pos" in df.columns else "") for r in df.itertuples()]
    lo = float(min(df["exact"].min(), df["estimate"].min(), 0.0))
    hi = float(max(df["exact"].max(), df["estimate"].max(), 1.0))
    fig = go.Figure([
        go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="#999", dash="dot"), name="estimate = exact",
                   hoverinfo="skip"),
        go.Scatter(x=df["exact"], y=df["estimate"], mode="markers", text=label, name="patch",
                   marker=dict(size=7, color=df["block"], colorscale="Viridis", colorbar=dict(title="block"),
                               showscale=True, opacity=0.8),
                   hovertemplate="%{text}<br>exact %{x:.3f}<br>estimate %{y:.3f}<extra></extra>"),
    ])
    site = df.attrs.get("site", "")
    # drawn in half the page: the title wraps to the narrowest half, the axis titles are short
    heading = title_below_toolbar(title or (f"{site}: attribution estimate vs exact patching (r = "
                                            f"{df.attrs.get('r', float('nan')):.2f}; score 0 = corrupted, 1 = clean; "
                                            "blocks from 1)"), width=HALF_COLUMN - 100, font=14)
    fig.update_layout(
        title=heading, xaxis=dict(title="exact score (one run per patch)"),
        yaxis=dict(title="estimate (one backward pass)"), height=340 + top_margin(heading),
        margin=dict(l=80, r=20, t=top_margin(heading), b=60), showlegend=False,
    )
    return fig
