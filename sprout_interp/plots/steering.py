"""Figures for activation steering (plotly; data from sprout_interp.circuits.steering).

Every figure says its convention: blocks counted from 1 (the chapter's "layer N"), layers from 0 in the hover.
"""
from __future__ import annotations

from typing import Optional

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sprout_interp.plots.common import title_below_toolbar

__all__ = ["steering_layers_figure", "steering_effect_figure"]


def steering_layers_figure(df: pd.DataFrame, title: Optional[str] = None) -> go.Figure:
    """The metric's change when each layer's own vector is added there: ``df`` from ``steering_layers``."""
    site = df.attrs.get("site", "resid_pre")
    metric = str(df["metric"].iloc[0]) if len(df) else "metric"
    coeff = float(df["coeff"].iloc[0]) if len(df) else 0.0
    fig = go.Figure(go.Bar(
        x=[f"block {b}" for b in df["block"]], y=df["change"],
        marker_color=["#2166ac" if c >= 0 else "#b2182b" for c in df["change"]],
        customdata=df[["layer", "vector_norm", "added_norm", "stream_norm"]].to_numpy(),
        hovertemplate="%{x} (layer %{customdata[0]})<br>change %{y:.3f}<br>vector norm %{customdata[1]:.2f}, "
                      "added %{customdata[2]:.2f}, stream %{customdata[3]:.2f}<extra></extra>",
    ))
    fig.update_layout(
        title=title_below_toolbar(title or f"change in {metric} with coeff {coeff:g} × each block's own vector added at its {site}"),
        xaxis=dict(title=f"{site} of block (counted from 1)"),
        yaxis=dict(title=f"change in {metric}", zeroline=True),
        height=380, margin=dict(l=70, r=20, t=80, b=60),
    )
    return fig


def steering_effect_figure(effect: pd.DataFrame, loss: Optional[pd.DataFrame] = None,
                           title: Optional[str] = None) -> go.Figure:
    """The metric against the coefficient at one layer (``effect`` from ``steering_effect``) and, on a second axis,
    the loss on another text under the same coefficients (``loss``: ``steering_effect(metric="loss")``), the
    damage check."""
    block = effect.attrs.get("block")
    site = effect.attrs.get("site", "resid_pre")
    metric = str(effect["metric"].iloc[0]) if len(effect) else "metric"
    fig = make_subplots(specs=[[{"secondary_y": loss is not None}]])
    fig.add_trace(go.Scatter(x=effect["coeff"], y=effect["value"], mode="lines+markers", name=metric,
                             line=dict(color="#2166ac"),
                             hovertemplate="coeff %{x:g}<br>" + metric + " %{y:.3f}<extra></extra>"))
    if loss is not None:
        fig.add_trace(go.Scatter(x=loss["coeff"], y=loss["value"], mode="lines+markers", name="loss (nats/token)",
                                 line=dict(color="#b2182b", dash="dot"),
                                 hovertemplate="coeff %{x:g}<br>loss %{y:.3f} nats/token<extra></extra>"),
                      secondary_y=True)
        fig.update_yaxes(title_text="loss on the text (nats/token)", secondary_y=True)
    fig.update_yaxes(title_text=metric, secondary_y=False)
    fig.update_layout(
        title=title_below_toolbar(title or f"steered at block {block}'s {site} (block counted from 1): {metric} by coefficient"),
        xaxis=dict(title="coefficient (× the vector)"), height=400, margin=dict(l=70, r=70, t=80, b=60),
        legend=dict(orientation="h", y=-0.25),
    )
    return fig
