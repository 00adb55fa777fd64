"""Figures of feed-forward neurons: which neurons push one prediction, a neuron's activation histogram and the
tokens its output direction promotes, and HTML of token contexts coloured by a signed activation (orange for
positive, blue for negative).

Everything is drawn from :mod:`sprout_interp.features.neurons` results; every title names the block (= layer + 1)
beside the 0-indexed layer, and neurons are 0-based in their layer.
"""
from __future__ import annotations

import html
from typing import Optional, Sequence

import pandas as pd
import plotly.graph_objects as go

from sprout_interp.plots.common import HALF_COLUMN, title_below_toolbar, top_margin, wrap_text
from sprout_interp.plots.features import logit_effect_chart

__all__ = ["neuron_attribution_chart", "neuron_histogram", "neuron_logit_effect_chart", "signed_context_html",
           "signed_contexts_html"]

POSITIVE, NEGATIVE = "217,95,2", "49,130,189"  # rgb of orange and blue


def neuron_attribution_chart(top: pd.DataFrame, title: Optional[str] = None) -> go.Figure:
    """Horizontal bars: each neuron's direct effect on the prediction (:func:`neuron_attribution`'s rows, strongest
    at the top), green where it pushes towards the answer, purple where against; each bar's customdata is
    ``(layer, neuron)`` so a click can pick it."""
    rows = top.iloc[::-1]
    labels = [f"block {r.block} neuron {r.neuron}" for r in rows.itertuples()]
    fig = go.Figure(go.Bar(
        x=list(rows["attribution"]), y=labels, orientation="h",
        marker_color=["#1b9e77" if v > 0 else "#7570b3" for v in rows["attribution"]],
        customdata=[[int(r.layer), int(r.neuron), float(r.activation), r.promotes] for r in rows.itertuples()],
        hovertemplate="%{y} (layer %{customdata[0]})<br>activation %{customdata[2]:+.2f}<br>direct effect %{x:+.3f} "
                      "logits<br>promotes %{customdata[3]}<extra></extra>"))
    a = top.attrs
    # plotly's default 700 pixels across, less the labels' margin: the title wraps to fit
    heading = title_below_toolbar(title or f"the neurons that push the prediction at pos {a.get('pos')} most (direct "
                                           f"effect; all neurons together {a.get('neurons_total', 0):+.2f} of "
                                           f"{a.get('logit_diff', 0):+.2f} logits)", width=520)
    fig.update_layout(
        title=heading, width=700, xaxis_title="direct effect on the logit (difference), logits",
        height=max(320, 24 * len(rows) + 40 + top_margin(heading)), margin=dict(l=150, r=20, t=top_margin(heading), b=40))
    return fig


def neuron_histogram(summary, title: Optional[str] = None) -> go.Figure:
    """Bars of a :class:`~sprout_interp.features.neurons.NeuronSummary`'s histogram of every activation (log count
    axis: most tokens sit near 0)."""
    h = summary.histogram
    mids = [(a + b) / 2 for a, b in zip(h["left"], h["right"])]
    fig = go.Figure(go.Bar(x=mids, y=list(h["count"]), width=[b - a for a, b in zip(h["left"], h["right"])],
                           marker_color=[f"rgb({POSITIVE})" if x >= 0 else f"rgb({NEGATIVE})" for x in mids],
                           hovertemplate="activation %{x:.2f}<br>%{y} tokens<extra></extra>"))
    heading = title_below_toolbar(title or f"neuron {summary.neuron}, layer {summary.layer} (block {summary.block}): "
                                           f"activations on {summary.n_tokens:,} tokens", width=HALF_COLUMN - 80)
    fig.update_layout(
        title=heading, xaxis_title="activation (hook_post)", yaxis_title="tokens", yaxis_type="log", bargap=0,
        height=270 + top_margin(heading), margin=dict(l=50, r=20, t=top_margin(heading), b=40))
    return fig


def neuron_logit_effect_chart(summary, title: Optional[str] = None) -> go.Figure:
    """Horizontal bars: the tokens the neuron's output direction ``W_out[n] @ W_U`` promotes (right) and suppresses
    (left), per unit of positive activation (the feature pages' chart, titled for a neuron)."""
    fig = logit_effect_chart(summary, title=title or f"neuron {summary.neuron} (layer {summary.layer}, block "
                                                      f"{summary.block}): W_out · W_U")
    fig.update_layout(xaxis_title=wrap_text("logit per unit of activation (a negative activation turns it round)",
                                            HALF_COLUMN - 140, 14))
    return fig


def _cell(token: str, act: float, top: float, bold: bool) -> str:
    a = 0.0 if top <= 0 else max(0.0, min(1.0, abs(act) / top))
    rgb = POSITIVE if act >= 0 else NEGATIVE
    text = html.escape(token.replace("\n", "↵").replace("\t", "⇥"), quote=True)
    style = f"background: rgba({rgb},{a:.2f}); border-radius: 2px; white-space: pre-wrap"
    if bold:
        style += f"; font-weight: bold; outline: 1px solid rgb({rgb})"
    return f'<span style="{style}" title="{act:+.2f}">{text}</span>'


def signed_context_html(tokens: Sequence[str], acts: Sequence[float], top: Optional[float] = None,
                        center: Optional[int] = None) -> str:
    """One line of HTML: every token on a background as strong as its activation's size (relative to ``top``,
    default the line's largest size), orange where positive and blue where negative; ``center`` outlined. Token
    text is HTML-escaped."""
    top = max((abs(float(a)) for a in acts), default=0.0) if top is None else top
    return "".join(_cell(t, float(a), top, i == center) for i, (t, a) in enumerate(zip(tokens, acts)))


def signed_contexts_html(contexts: pd.DataFrame, top: Optional[float] = None) -> str:
    """A neuron page's contexts (positive or negative) as HTML lines on one colour scale (the largest size)."""
    if contexts.empty:
        return "<p>(none on the sample)</p>"
    top = float(contexts["activation"].abs().max()) if top is None else top
    lines = [f'<div style="font-family: monospace; margin: 2px 0"><span style="color:#888">'
             f'{r.activation:+7.2f} </span>{signed_context_html(r.tokens, r.acts, top, r.center)}</div>'
             for r in contexts.itertuples()]
    return "".join(lines)
