"""Figures for activation patching and contribution graphs (plotly; data from sprout_interp.circuits.patching / attribution).

Every figure says its convention: blocks counted from 1 (the chapter's "layer N"), positions from 0.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sprout_interp.plots.common import show_token

__all__ = ["patching_heatmap", "head_patching_heatmap", "contribution_graph_figure", "patching_agreement_figure"]

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
    fig.update_layout(
        title=title or f"patching {site} by block x position (score: 0 = corrupted run, 1 = clean run)",
        xaxis=dict(title="position: token (0-based)", tickangle=-60, tickfont=dict(size=10)),
        yaxis=dict(title=f"{site} of block (counted from 1)", autorange="reversed"),
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
    fig.update_layout(title=title or "each head's output patched, all positions (score: 0 = corrupted, 1 = clean)",
                      yaxis=dict(title="block (counted from 1)", autorange="reversed"), xaxis=dict(title="head (from 0)"),
                      height=max(260, 40 * L + 140), margin=dict(l=80, r=20, t=60, b=40))
    return fig


def contribution_graph_figure(nodes: pd.DataFrame, edges: pd.DataFrame, tokens: Sequence[str],
                              title: Optional[str] = None) -> go.Figure:
    """The contribution graph: positions across, blocks down; a node per head / feed-forward at the
    prediction's position (size = |direct push on the token|, blue = for, red = against), and a line from
    each position a head reads (width = |the part of the head's push that comes from there|)."""
    pos = int(nodes.attrs.get("pos", len(tokens) - 1))
    fig = go.Figure()
    big = max(float(nodes["attribution"].abs().max()) if len(nodes) else 1.0, 1e-9)

    def ypos(layer: int, kind: str, head: int) -> float:
        if kind == "embed":
            return 0.0
        return layer + 1 + (0.7 if kind == "mlp" else 0.15 + 0.5 * head / 8)

    for r in edges.itertuples():
        w = abs(r.attribution) / big
        fig.add_trace(go.Scatter(
            x=[r.src_pos, pos], y=[r.layer + 0.5, ypos(r.layer, "head", r.head)], mode="lines",
            line=dict(width=1 + 8 * w, color="#2166ac" if r.attribution > 0 else "#b2182b"), opacity=0.35 + 0.5 * w,
            hovertext=f"block {r.block} head {r.head} reads position {r.src_pos} ({show_token(r.src_token)}): "
                      f"{r.attribution:+.3f} logits", hoverinfo="text", showlegend=False,
        ))
    ys = [ypos(r.layer, r.kind, r.head) for r in nodes.itertuples()]
    fig.add_trace(go.Scatter(
        x=[pos] * len(nodes), y=ys, mode="markers+text",
        marker=dict(size=[10 + 30 * abs(a) / big for a in nodes["attribution"]],
                    color=["#2166ac" if a > 0 else "#b2182b" for a in nodes["attribution"]], line=dict(width=1)),
        text=[c.replace("feed-forward", "FF") for c in nodes["component"]], textposition="middle left",
        hovertext=[f"{c}: {a:+.3f} logits" for c, a in zip(nodes["component"], nodes["attribution"])],
        hoverinfo="text", showlegend=False,
    ))
    L = int(max(nodes["layer"].max() if len(nodes) else 0, edges["layer"].max() if len(edges) else 0)) + 1
    token = show_token(str(nodes.attrs.get("token", "")))
    fig.update_layout(
        title=title or f"what pushes {token} at position {pos}: heads and feed-forwards (blocks from 1), "
                       "lines from the positions each head reads",
        xaxis=dict(tickmode="array", tickvals=list(range(len(tokens))),
                   ticktext=[f"{p}: {show_token(t)}" for p, t in enumerate(tokens)], tickangle=-60, tickfont=dict(size=10),
                   title="position: token (0-based)"),
        yaxis=dict(tickmode="array", tickvals=[0] + [l + 1 for l in range(L)],
                   ticktext=["embedding"] + [f"block {l + 1}" for l in range(L)], autorange="reversed"),
        height=max(360, 55 * L + 220), margin=dict(l=90, r=20, t=60, b=140),
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
    fig.update_layout(
        title=title or (f"{site}: attribution estimate vs exact patching (r = {df.attrs.get('r', float('nan')):.2f}; "
                        "score 0 = corrupted, 1 = clean; blocks from 1)"),
        xaxis=dict(title="exact score (one run per patch)"), yaxis=dict(title="attribution estimate (one backward pass)"),
        height=420, margin=dict(l=80, r=20, t=70, b=60), showlegend=False,
    )
    return fig
