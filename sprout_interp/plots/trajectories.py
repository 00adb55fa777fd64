"""Figures of the tuned lens beside the logit lens: per-token trajectory heatmaps (stream row × token, as the
tuned-lens paper draws them) and per-block comparison lines. Inputs are the tables of
:func:`sprout_interp.lens.logit_lens.trajectories` and of ``analyses/lens_comparison.py``; no tensor maths here.
"""
from __future__ import annotations

from typing import Optional, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sprout_interp.plots.common import show_token

__all__ = ["TRAJECTORY_METRICS", "trajectory_heatmaps", "lens_comparison_chart"]

#: metric column -> (axis / colour-bar label, colour scale)
TRAJECTORY_METRICS: dict[str, tuple[str, str]] = {
    "entropy": ("entropy (nats)", "Viridis"),
    "cross_entropy": ("cross-entropy vs the actual next token (nats)", "Magma_r"),
    "kl_to_final": ("KL(final ‖ lens) (nats)", "Blues"),
    "top1_prob": ("top-1 probability", "Greens"),
}


def trajectory_heatmaps(
    traj: pd.DataFrame,
    metric: str = "kl_to_final",
    positions: Optional[Sequence[int]] = None,
    title: Optional[str] = None,
    show_top1: bool = True,
    cell_width: int = 58,
) -> go.Figure:
    """One heatmap per lens, one above the other on a shared token axis (so a token's two trajectories line up):
    rows = stream rows (embedding, block 1 … block L, blocks counted from 1), columns = token positions, colour =
    ``metric`` (a key of :data:`TRAJECTORY_METRICS`), text = the lens's top-1 token (at most 7 characters, leading
    space as ␣; the hover has it whole). ``traj``: :func:`~sprout_interp.lens.logit_lens.trajectories`'s table;
    both panels share one colour range so the lenses compare directly. The figure is ``cell_width`` pixels a
    token across (wider than a page for long texts: a page scrolls it sideways), so no cell's text runs into the
    next.
    """
    if metric not in TRAJECTORY_METRICS:
        raise ValueError(f"metric must be one of {sorted(TRAJECTORY_METRICS)}, got {metric!r}")
    label, scale = TRAJECTORY_METRICS[metric]
    df = traj if positions is None else traj[traj["pos"].isin(list(positions))]
    lenses = list(dict.fromkeys(df["lens_asked"] if "lens_asked" in df else df["lens"]))
    key = "lens_asked" if "lens_asked" in df else "lens"
    used = {k: str(df[df[key] == k]["lens"].iloc[0]) for k in lenses}
    names = [f"{k} lens" + ("" if used[k] == k else f" (no tuned lens: showing the {used[k]} lens)") for k in lenses]
    n_rows, n_pos = int(df["block"].nunique()), int(df["pos"].nunique())
    row_px, gap_px, top_px, bottom_px = 26, 56, 90, 110
    panels_px = len(lenses) * n_rows * row_px + (len(lenses) - 1) * gap_px
    fig = make_subplots(rows=len(lenses), cols=1, subplot_titles=names, shared_xaxes=True,
                        vertical_spacing=gap_px / panels_px if len(lenses) > 1 else 0.0)
    vals = df[metric].dropna()
    zmin, zmax = (float(vals.min()), float(vals.max())) if len(vals) else (0.0, 1.0)
    for i, k in enumerate(lenses, start=1):
        d = df[df[key] == k]
        rows = d.drop_duplicates("block").sort_values("block")
        pos = sorted(d["pos"].unique())
        z = d.pivot(index="block", columns="pos", values=metric).reindex(index=rows["block"], columns=pos)
        top1 = d.pivot(index="block", columns="pos", values="top1").reindex(index=rows["block"], columns=pos)
        tok = d.drop_duplicates("pos").set_index("pos")["token"].reindex(pos)
        x = [f"{p}:{show_token(str(t), 8)}" for p, t in zip(pos, tok)]
        cells = [[show_token(str(v), 7) for v in row] for row in top1.values]
        whole = [[show_token(str(v)) for v in row] for row in top1.values]
        fig.add_trace(go.Heatmap(
            z=z.values, x=x, y=list(rows["row"]), zmin=zmin, zmax=zmax, colorscale=scale,
            text=cells if show_top1 else None, texttemplate="%{text}" if show_top1 else None, customdata=whole,
            textfont={"size": 10}, showscale=i == 1, colorbar={"title": label, "len": min(1.0, 300 / panels_px), "y": 1,
                                                              "yanchor": "top"},
            hovertemplate="%{y}, token %{x}<br>top-1 %{customdata}<br>" + label + " %{z:.3f}<extra>" + k + " lens</extra>",
        ), row=i, col=1)
        fig.update_yaxes(title_text="stream row (blocks from 1)", row=i, col=1)
    fig.update_xaxes(tickangle=-60, tickfont={"size": 10})
    fig.update_xaxes(title_text="pos:token (pos = 0-based input index)", row=len(lenses), col=1)
    fig.update_layout(title=title or f"{label} by row and token: " + " vs ".join(names),
                      height=top_px + bottom_px + panels_px, width=200 + cell_width * n_pos,
                      margin=dict(t=top_px, b=bottom_px, l=130, r=110))
    return fig


def lens_comparison_chart(by_block: pd.DataFrame, metric: str = "kl_final", title: Optional[str] = None) -> go.Figure:
    """Lines of ``metric`` (``kl_final`` or ``cross_entropy``, nats) by block (0 = embedding, blocks from 1), one
    colour per model, solid = tuned lens, dotted = logit lens. ``by_block`` has columns model, lens, block, metric."""
    fig = go.Figure()
    for (model, lens), d in by_block.groupby(["model", "lens"], sort=False):
        d = d.sort_values("block")
        fig.add_trace(go.Scatter(x=d["block"], y=d[metric], mode="lines+markers", name=f"{model}, {lens} lens",
                                 line={"dash": "solid" if lens == "tuned" else "dot"}))
    unit = {"kl_final": "KL(final ‖ lens), nats", "cross_entropy": "cross-entropy, nats/token"}.get(metric, metric)
    fig.update_layout(title=title or f"{unit} by block: tuned (solid) vs logit (dotted) lens",
                      xaxis_title="block (0 = embedding, counted from 1)", yaxis_title=unit)
    return fig
