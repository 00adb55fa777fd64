"""Figures of SAE features: a latent's activation histogram, the tokens it promotes and suppresses, the quality
table, and HTML of token contexts coloured by activation (for a dashboard or a saved page).

Everything is drawn from :mod:`sprout_interp.features.pages` results; layer numbers are 0-indexed in code with
the block (= layer + 1) named beside them in every title.
"""
from __future__ import annotations

import html
from typing import Optional, Sequence

import pandas as pd
import plotly.graph_objects as go

from sprout_interp.plots.common import HALF_COLUMN, show_token, title_below_toolbar, top_margin

__all__ = ["activation_histogram", "logit_effect_chart", "context_html", "contexts_html", "quality_chart"]


def activation_histogram(summary, title: Optional[str] = None) -> go.Figure:
    """Bars of a :class:`~sprout_interp.features.pages.FeatureSummary`'s histogram of non-zero activations."""
    h = summary.histogram
    fig = go.Figure(go.Bar(x=[(a + b) / 2 for a, b in zip(h["left"], h["right"])], y=list(h["count"]),
                           width=[b - a for a, b in zip(h["left"], h["right"])], marker_color="#d95f02",
                           hovertemplate="activation %{x:.2f}<br>%{y} tokens<extra></extra>"))
    heading = title_below_toolbar(title or (f"feature {summary.feature}, layer {summary.layer} (block {summary.block}): "
                                            f"activations when on ({summary.frequency:.2%} of {summary.n_tokens:,} "
                                            "tokens)"), width=HALF_COLUMN - 80)
    fig.update_layout(
        title=heading, xaxis_title="activation (SAE units)", yaxis_title="tokens", bargap=0,
        height=270 + top_margin(heading), margin=dict(l=50, r=20, t=top_margin(heading), b=40))
    return fig


def logit_effect_chart(summary, title: Optional[str] = None) -> go.Figure:
    """Horizontal bars: the tokens the latent's decoder direction promotes (right) and suppresses (left)."""
    p, s = summary.promoted, summary.suppressed.iloc[::-1]
    toks = [show_token(t) for t in list(s["token"]) + list(p["token"])[::-1]]
    vals = list(s["logit"]) + list(p["logit"])[::-1]
    fig = go.Figure(go.Bar(x=vals, y=list(range(len(vals))), orientation="h",
                           marker_color=["#1b9e77" if v > 0 else "#7570b3" for v in vals],
                           customdata=toks, hovertemplate="%{customdata}: %{x:+.3f} logits<extra></extra>"))
    heading = title_below_toolbar(title or f"feature {summary.feature} (layer {summary.layer}, block {summary.block}): "
                                           "W_dec · W_U", width=HALF_COLUMN - 140)
    fig.update_layout(
        title=heading, xaxis_title="logit per unit of activation",
        height=max(320, 22 * len(vals) + 60 + top_margin(heading)),
        yaxis=dict(tickmode="array", tickvals=list(range(len(vals))), ticktext=toks),
        margin=dict(l=110, r=20, t=top_margin(heading), b=50))
    return fig


def _cell(token: str, act: float, top: float, bold: bool) -> str:
    a = 0.0 if top <= 0 else max(0.0, min(1.0, act / top))
    text = html.escape(token.replace("\n", "↵").replace("\t", "⇥"), quote=True)
    style = f"background: rgba(217,95,2,{a:.2f}); border-radius: 2px; white-space: pre-wrap"
    if bold:
        style += "; font-weight: bold; outline: 1px solid #d95f02"
    return f'<span style="{style}" title="{act:.2f}">{text}</span>'


def context_html(tokens: Sequence[str], acts: Sequence[float], top: Optional[float] = None,
                 center: Optional[int] = None) -> str:
    """One line of HTML: every token on a background as strong as its activation (relative to ``top``, default
    the line's maximum); the firing token (``center``) outlined. Token text is HTML-escaped."""
    top = max(acts, default=0.0) if top is None else top
    return "".join(_cell(t, float(a), top, i == center) for i, (t, a) in enumerate(zip(tokens, acts)))


def contexts_html(contexts: pd.DataFrame, top: Optional[float] = None) -> str:
    """The top-activating contexts of a feature page as HTML lines, all on one colour scale (the top activation)."""
    if contexts.empty:
        return "<p>(no context: the feature never fires on the sample)</p>"
    top = float(contexts["activation"].max()) if top is None else top
    lines = [f'<div style="font-family: monospace; margin: 2px 0"><span style="color:#888">'
             f'{r.activation:6.2f} </span>{context_html(r.tokens, r.acts, top, r.center)}</div>'
             for r in contexts.itertuples()]
    return "\n".join(lines)


def quality_chart(quality: pd.DataFrame, title: Optional[str] = None) -> go.Figure:
    """Loss recovered and fraction of variance explained per SAE (one bar pair per layer)."""
    labels = [f"layer {r.layer} (block {r.block})" for r in quality.itertuples()]
    fig = go.Figure([
        go.Bar(name="loss recovered", x=labels, y=list(quality["loss_recovered"])),
        go.Bar(name="variance explained", x=labels, y=list(quality["fve"])),
    ])
    fig.update_layout(title=title or "SAE quality on held-out text", yaxis=dict(range=[0, 1], tickformat=".0%"),
                      barmode="group", height=340)
    return fig
