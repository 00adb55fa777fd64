"""Figures for activation steering (plotly; data from sprout_interp.behaviour.steering).

Every figure says its convention: blocks counted from 1 (the chapter's "layer N"), layers from 0 in the hover.
"""
from __future__ import annotations

from typing import Optional

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sprout_interp.plots.common import title_below_toolbar, top_margin

__all__ = ["steering_layers_figure", "steering_effect_figure", "zero_vector_blocks"]


def steering_layers_figure(df: pd.DataFrame, title: Optional[str] = None) -> go.Figure:
    """The metric's change when each layer's own vector is added there: ``df`` from ``steering_layers``."""
    site = df.attrs.get("site", "resid_pre")
    metric = str(df["metric"].iloc[0]) if len(df) else "metric"
    coeff = float(df["coeff"].iloc[0]) if len(df) else 0.0
    zero = zero_vector_blocks(df)
    fig = go.Figure(go.Bar(
        x=[f"block {b}" for b in df["block"]], y=df["change"],
        marker_color=["#2166ac" if c >= 0 else "#b2182b" for c in df["change"]],
        # a bar with no height says why: its vector is 0, so adding it changes nothing
        text=["vector = 0" if b in zero else "" for b in df["block"]], textposition="outside", cliponaxis=False,
        customdata=[[r.layer, r.vector_norm, r.added_norm, r.stream_norm,
                     "<br>" + _zero_why(int(r.block)) if r.block in zero else ""] for r in df.itertuples()],
        hovertemplate="%{x} (layer %{customdata[0]})<br>change %{y:.3f}<br>vector norm %{customdata[1]:.2f}, "
                      "added %{customdata[2]:.2f}, stream %{customdata[3]:.2f}%{customdata[4]}<extra></extra>",
    ))
    heading = title_below_toolbar(title or f"change in {metric} with coeff {coeff:g} × each block's own vector added "
                                           f"at its {site}", width=600)
    fig.update_layout(
        title=heading, width=700,
        xaxis=dict(title=f"{site} of block (counted from 1)"),
        yaxis=dict(title=f"change in {metric}", zeroline=True),
        height=300 + top_margin(heading), margin=dict(l=70, r=20, t=top_margin(heading), b=60),
    )
    return fig


def _zero_why(block: int) -> str:
    """Why a block's steering vector is 0 (its bar's hover)."""
    why = "the vector is 0 here: both sets of texts give the same stream at their last token"
    if block == 1:
        why += "<br>(entering block 1 the stream is the last token's embedding, and both sets end on the same tokens)"
    return why


def zero_vector_blocks(df: pd.DataFrame) -> list[int]:
    """The blocks (counted from 1) of a ``steering_layers`` table whose vector is 0 (at most a millionth of the
    largest one's norm): the two sets of texts give the same stream there, so steering with it changes nothing.
    Entering block 1 the stream is the last token's embedding alone, so texts that end on the same token (the
    default contrast, "She said that" / "He said that") have no vector there."""
    if not len(df):
        return []
    top = float(df["vector_norm"].max())
    return [int(b) for b, v in zip(df["block"], df["vector_norm"]) if float(v) <= 1e-6 * max(top, 1e-30)]


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
    heading = title_below_toolbar(title or f"steered at block {block}'s {site} (block counted from 1): {metric} by "
                                           "coefficient", width=540)
    fig.update_layout(
        title=heading, width=700, xaxis=dict(title="coefficient (× the vector)"), height=320 + top_margin(heading),
        margin=dict(l=70, r=70, t=top_margin(heading), b=60),
        legend=dict(orientation="h", y=-0.25),
    )
    return fig
