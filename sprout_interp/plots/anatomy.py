"""Figures for the anatomy and positions pages: the one-page diagram of the model, the RoPE score grid, a real
head's score by distance."""
from __future__ import annotations

import plotly.graph_objects as go
from torch import Tensor

__all__ = ["model_diagram", "rope_grid_figure", "distance_profile_figure"]

# (key, label, y centre) from top (input) to bottom (output); keys match sprout_interp.anatomy.params.PARTS; a label
# is at most about 24 characters a line
_BOXES = [
    ("embed", "token embedding  (V × d)", 9.0),
    ("rmsnorm", "RMSNorm", 7.6),
    ("attention", "attention: QK-norm, RoPE,<br>causal softmax", 6.8),
    ("rmsnorm", "RMSNorm", 5.4),
    ("ffn", "SwiGLU feed-forward", 4.6),
    ("rmsnorm", "final RMSNorm", 2.6),
    ("embed", "output head =<br>embedding matrix (tied)", 1.4),
]


def model_diagram(n_layer: int, selected: str | None = None) -> go.Figure:
    """The chapter's diagram: residual stream on the left, the repeating block (× n_layer) in a dashed
    frame, the tied embedding at input and output joined by a dashed line. ``selected`` highlights a part."""
    fig = go.Figure()
    for key, label, y in _BOXES:
        on = key == selected or (selected == "block" and 4.0 < y < 8.0) or (selected == "gpt")
        fig.add_shape(type="rect", x0=1.2, x1=5.8, y0=y - 0.35, y1=y + 0.35, line=dict(color="#444"),
                      fillcolor="#ffd54f" if on else "#e3f2fd")
        # two short lines at most: the label stays inside its box when the page draws the diagram narrow (a
        # half column of a 1280-pixel window)
        fig.add_annotation(x=3.5, y=y, text=label, showarrow=False, font=dict(size=12))
    # the residual stream: the thick vertical line, with the two additions of each block
    fig.add_shape(type="line", x0=0.6, x1=0.6, y0=0.6, y1=9.6, line=dict(width=8, color="#90a4ae"))
    for y in (6.8, 4.6):
        fig.add_annotation(x=0.6, y=y, text="<b>+</b>", showarrow=False, font=dict(size=22), bgcolor="white")
        fig.add_shape(type="line", x0=0.75, x1=1.2, y0=y, y1=y, line=dict(width=2, color="#90a4ae"))
    fig.add_shape(type="rect", x0=0.2, x1=6.2, y0=3.9, y1=8.1, line=dict(dash="dash", width=2, color="#6a1b9a"))
    fig.add_annotation(x=6.2, y=8.1, text=f"× {n_layer} blocks", showarrow=False, xanchor="right", yanchor="bottom",
                       font=dict(size=14, color="#6a1b9a"))
    # weight tying: one matrix at both ends
    fig.add_shape(type="path", path="M 5.8 9.0 C 7.3 9.0, 7.3 1.4, 5.8 1.4", line=dict(dash="dash", width=3, color="#f9a825"))
    fig.add_annotation(x=7.1, y=5.2, text="same matrix", textangle=-90, showarrow=False, font=dict(color="#f9a825"))
    fig.add_annotation(x=3.5, y=10.0, text="text in (token ids)", showarrow=False)
    fig.add_annotation(x=3.5, y=0.3, text="logits → next token", showarrow=False)
    fig.update_xaxes(visible=False, range=[0, 7.6])
    fig.update_yaxes(visible=False, range=[0, 10.4])
    fig.update_layout(height=560, margin=dict(l=10, r=10, t=10, b=10), plot_bgcolor="white", showlegend=False)
    return fig


def rope_grid_figure(grid: Tensor, title: str | None = None, colorbar: str = "q·k") -> go.Figure:
    """Heatmap of score[m, n] (query position m, key position n): constant along every diagonal for one q and
    k rotated by RoPE; NaN cells (future keys of a real head) are left blank."""
    fig = go.Figure(go.Heatmap(z=grid.tolist(), colorscale="RdBu", zmid=0, colorbar={"title": colorbar},
                               hovertemplate="query m=%{y}, key n=%{x}<br>score %{z:.3f}<extra></extra>"))
    fig.update_layout(xaxis_title="key position n", yaxis_title="query position m", height=480,
                      margin={"l": 10, "r": 10, "t": 40 if title else 30, "b": 10}, title=title)
    fig.update_yaxes(autorange="reversed")
    return fig


def distance_profile_figure(df, title: str | None = None) -> go.Figure:
    """A real head's mean score by distance m − n, with a band of ± one standard deviation (from
    ``sprout_interp.anatomy.rope.scores_by_distance``): a narrow band means the distance decides the score."""
    d = df.sort_values("distance")
    x, mu, sd = d["distance"].tolist(), d["mean"].to_numpy(), d["std"].fillna(0).to_numpy()
    fig = go.Figure([
        go.Scatter(x=x + x[::-1], y=list(mu + sd) + list((mu - sd)[::-1]), fill="toself", line={"width": 0},
                   fillcolor="rgba(55,126,184,0.2)", hoverinfo="skip", name="± 1 std"),
        go.Scatter(x=x, y=mu, mode="lines", line={"color": "#377eb8"}, name="mean score",
                   customdata=d[["std", "n"]].to_numpy(),
                   hovertemplate="distance %{x}: mean %{y:.3f}, std %{customdata[0]:.3f} over %{customdata[1]} pairs"
                                 "<extra></extra>"),
    ])
    r2 = df.attrs.get("r2")
    head = f"block {int(d['block'].iloc[0])} head {int(d['head'].iloc[0])}" if len(d) else "the head"
    fig.update_layout(title=title or f"{head}: score by distance" + (f" (distance explains {r2:.0%} of the variance)"
                                                                     if r2 is not None else ""),
                      xaxis_title="distance m − n (tokens)", yaxis_title="score q·k / √d_head", height=420)
    return fig
