"""Plotly figures for the logit lens and the residual stream (head and ablation plots live in ``plots.heads``).

Every function takes results of the analysis functions (a :class:`~sprout_interp.lens.logit_lens.LogitLens`,
or the tidy DataFrames of ``LogitLens.summary`` / ``residual_rms``) and returns a
``plotly.graph_objects.Figure``; none does tensor maths beyond picking cells out. Rows of the stream
are labelled as people read them: "embedding", then "block 1" … (blocks counted from 1, as the
chapter does; ``blocks.{n-1}`` in code).
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sprout_interp.lens.logit_lens import LogitLens
from sprout_interp.plots.common import FULL_COLUMN, show_token, wrap_text
from sprout_interp.plots.common import escape_label as _esc

__all__ = [
    "logit_lens_grid", "layer_metrics_chart", "rms_growth_chart", "rms_position_chart",
    "token_change_chart", "block_knockout_chart", "log_axis",
]

BLOCK_AXIS = "after block (counted from 1; 0 = after the embedding)"
_METRIC_TITLES = {
    "confidence": "confidence (mean top-1 probability)",
    "accuracy": "top-1 accuracy (vs the actual next token)",
    "cross_entropy": "cross-entropy (nats/token)",
    "entropy": "entropy (nats)",
    "kl_final": "KL(final ‖ row) (nats)",
}
_PERCENT = {"confidence", "accuracy"}
#: the most characters of a token a grid cell shows (the hover has it whole)
CELL_CHARS = 8


def _str_tokens(to_str: Optional[Callable[[Sequence[int]], Sequence[str]]], ids: Iterable[int]) -> dict[int, str]:
    ids = sorted({int(i) for i in ids})
    if to_str is None:
        return {i: f"#{i}" for i in ids}
    return dict(zip(ids, (str(s) for s in to_str(ids))))


def logit_lens_grid(
    lens: LogitLens,
    to_str: Optional[Callable[[Sequence[int]], Sequence[str]]] = None,
    batch: int = 0,
    positions: Optional[Sequence[int]] = None,
    title: Optional[str] = None,
    colorscale: str = "Blues",
    clickable: bool = False,
    selected: Optional[tuple[int, int]] = None,
    cell_font: int = 13,
    cell_width: int = 64,
) -> go.Figure:
    """The logit-lens grid as the chapter draws it: rows of the stream × input tokens.

    Cell colour = the row's top-1 probability, cell text = its top-1 token, a frame (a rectangle
    shape) where the top-1 is the actual next token, hover = the top-k with probabilities and the
    actual next token's probability and rank. The embedding row is at the bottom, the model's real
    output (the last block) at the top.

    Args:
        lens: from :func:`~sprout_interp.lens.logit_lens.logit_lens`.
        to_str: maps a list of token ids to their strings (``model.to_str_tokens``); ids as "#123" if None.
        batch: which sequence of the batch to draw.
        positions: which positions to draw (default every real token of that sequence).
        clickable: add a second, invisible trace with one marker per cell (``customdata`` = [position,
            row]) so a click can select a cell where heat-maps cannot be selected (Streamlit's
            ``on_select``); the selected cell gets a black outline.
        selected: (position, row) of a cell to outline (with ``clickable``).
        cell_font, cell_width: the cells' text size (px; tokens longer than 8 characters are cut, the hover
            has them whole) and width (px): the figure is as wide as its cells need.
    """
    mask = lens.mask[batch].cpu()
    if positions is None:
        positions = mask.nonzero().flatten().tolist()
    positions = [int(p) for p in positions]
    R = lens.n_rows
    ids = lens.topk_ids[:, batch].cpu()  # (R, T, k)
    probs = lens.topk_probs[:, batch].cpu()
    tokens = lens.tokens[batch].cpu()
    nxt = lens.next_ids[batch].cpu()
    correct = lens.top1_correct[:, batch].cpu()
    next_prob = lens.next_prob[:, batch].cpu()
    next_rank = lens.next_rank[:, batch].cpu()
    vocab = set(ids[:, positions].flatten().tolist()) | set(tokens[positions].tolist()) | {
        int(nxt[p]) for p in positions if nxt[p] >= 0}
    s = _str_tokens(to_str, vocab)

    z, text, hover = [], [], []
    for r in range(R):
        zr, tr, hr = [], [], []
        for p in positions:
            zr.append(float(probs[r, p, 0]))
            tr.append(show_token(s[int(ids[r, p, 0])], CELL_CHARS))
            lines = [f"<b>{lens.rows[r]}</b>, position {p}: input {_esc(repr(s[int(tokens[p])]))}"]
            if nxt[p] >= 0:
                lines.append(f"actual next {_esc(repr(s[int(nxt[p])]))}: p = {float(next_prob[r, p]):.1%}, "
                             f"rank {int(next_rank[r, p]) + 1}")
            else:
                lines.append("no next token")
            for j in range(ids.shape[-1]):
                lines.append(f"{j + 1}. {_esc(repr(s[int(ids[r, p, j])]))} {float(probs[r, p, j]):.1%}")
            hr.append("<br>".join(lines))
        z.append(zr)
        text.append(tr)
        hover.append(hr)

    xs = list(range(len(positions)))
    fig = go.Figure(go.Heatmap(
        z=z, x=xs, y=list(range(R)), text=text, texttemplate="%{text}", textfont=dict(size=cell_font), customdata=hover,
        hovertemplate="%{customdata}<extra></extra>", zmin=0.0, zmax=1.0, colorscale=colorscale,
        colorbar=dict(title="top-1 p", tickformat=".0%"), name="top-1 probability",
    ))
    # one layout update with every frame: add_shape per cell re-validates all shapes each time (quadratic)
    frame = dict(type="rect", line=dict(color="#d62728", width=2), fillcolor="rgba(0,0,0,0)", name="matches next")
    fig.update_layout(shapes=[
        dict(frame, x0=x - 0.5, x1=x + 0.5, y0=r - 0.5, y1=r + 0.5)
        for r in range(R) for x, p in zip(xs, positions) if bool(correct[r, p])
    ])
    if clickable:
        cells = [(x, r, p) for r in range(R) for x, p in zip(xs, positions)]
        tips = [hover[r][x] for r in range(R) for x in xs]
        chosen = [i for i, (_, r, p) in enumerate(cells) if selected is not None and (p, r) == tuple(selected)]
        fig.add_trace(go.Scatter(
            x=[c[0] for c in cells], y=[c[1] for c in cells], customdata=[[c[2], c[1]] for c in cells],
            mode="markers", marker=dict(symbol="square-open", size=28, color="black", opacity=0.0, line=dict(width=3)),
            selectedpoints=chosen, selected=dict(marker=dict(opacity=1.0)), unselected=dict(marker=dict(opacity=0.0)),
            hovertext=tips, hovertemplate="%{hovertext}<extra></extra>", showlegend=False, name="cells",
        ))
    # fixed ranges: the cells fill the axes (the clickable markers would otherwise pad them by their size)
    fig.update_xaxes(tickmode="array", tickvals=xs, ticktext=[show_token(s[int(tokens[p])], CELL_CHARS) for p in positions],
                     title="input token", tickangle=-60, tickfont=dict(size=cell_font), range=[-0.5, len(xs) - 0.5])
    fig.update_yaxes(tickmode="array", tickvals=list(range(R)), ticktext=lens.rows,
                     title="read after (blocks counted from 1)", range=[-0.5, R - 0.5])
    fig.update_layout(
        title=title or "Logit lens: top-1 guess after each block (frame = the actual next token)",
        width=max(500, cell_width * len(positions) + 200), height=max(300, 40 * R + 200),
        plot_bgcolor="white",
    )
    return fig


def _series(df: pd.DataFrame, color: Optional[str], dash: Optional[str]):
    keys = [c for c in (color, dash) if c is not None and c in df.columns]
    if not keys:
        yield {}, df
        return
    for vals, part in df.groupby(keys, sort=False):
        vals = vals if isinstance(vals, tuple) else (vals,)
        yield dict(zip(keys, vals)), part


_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
_DASHES = ["solid", "dash", "dot", "dashdot", "longdash"]


def _styles(df: pd.DataFrame, col: Optional[str], values: Sequence[str]) -> dict:
    if col is None or col not in df.columns:
        return {}
    return {v: values[i % len(values)] for i, v in enumerate(pd.unique(df[col]))}


def layer_metrics_chart(
    summary: pd.DataFrame,
    metrics: Sequence[str] = ("confidence", "accuracy", "kl_final"),
    color: Optional[str] = "model",
    dash: Optional[str] = "text_set",
    chapter: Optional[dict[int, float]] = None,
    chapter_label: str = "chapter (Sprout, three texts)",
    title: Optional[str] = None,
) -> go.Figure:
    """Per-layer logit-lens metrics, one panel per metric, one line per (``color``, ``dash``) group.

    ``summary`` is one or more :meth:`LogitLens.summary` tables concatenated, with optional columns
    named by ``color`` (e.g. ``model``) and ``dash`` (e.g. ``text_set``). The x axis is the block
    (counted from 1; 0 = after the embedding). ``chapter`` (block → value) adds the chapter's
    confidence figures as markers in the "confidence" panel.
    """
    metrics = [m for m in metrics if m in summary.columns]
    # fits the main column of a 1280-pixel window: panels about 220 pixels across, their titles wrapped to fit
    width = min(FULL_COLUMN - 20, max(700, 420 * len(metrics)))
    panel = (width - 160) / max(len(metrics), 1) - 40
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[wrap_text(_METRIC_TITLES.get(m, m), panel, 13)
                                                                   for m in metrics],
                        horizontal_spacing=0.08)
    colors, dashes = _styles(summary, color, _PALETTE), _styles(summary, dash, _DASHES)
    for keys, part in _series(summary, color, dash):
        part = part.sort_values("block")
        name = " · ".join(str(v) for v in keys.values()) or "lens"
        for i, m in enumerate(metrics):
            fig.add_trace(go.Scatter(
                x=part["block"], y=part[m], mode="lines+markers", name=name, legendgroup=name, showlegend=i == 0,
                line=dict(color=colors.get(keys.get(color)), dash=dashes.get(keys.get(dash), "solid")),
                customdata=part["row"], hovertemplate=f"{name}<br>%{{customdata}}: %{{y:.3g}}<extra>{m}</extra>",
            ), row=1, col=i + 1)
    if chapter and "confidence" in metrics:
        col = metrics.index("confidence") + 1
        fig.add_trace(go.Scatter(
            x=list(chapter), y=list(chapter.values()), mode="markers+text", name=chapter_label,
            marker=dict(symbol="x", size=12, color="black"), text=[f"{v:.0%}" for v in chapter.values()],
            textposition="top center", hovertemplate="chapter: block %{x}: %{y:.0%}<extra></extra>",
        ), row=1, col=col)
    for i, m in enumerate(metrics):
        fig.update_xaxes(title_text=wrap_text(BLOCK_AXIS, panel, 14) if i == 0 else "block", dtick=1, row=1, col=i + 1)
        if m in _PERCENT:
            fig.update_yaxes(range=[0, 1], tickformat=".0%", row=1, col=i + 1)
    fig.update_annotations(font_size=13)
    fig.update_layout(title=title or "Logit lens by layer", width=width, height=480, margin=dict(t=110))
    return fig


def _ys(fig: go.Figure) -> list[float]:
    return [float(v) for tr in fig.data if tr.y is not None for v in tr.y if v is not None]


def log_axis(values: Sequence[float]) -> dict:
    """Log-axis settings that label only round values: the powers of ten (1, 10, 100 …) when the data spans at
    least one, else 1, 2 and 5 times them; unlabelled minor ticks at the other multiples. (Plotly's default
    labels minor ticks too: "5, 2, 10, 5, 2, 1 …".)"""
    import math

    pos = [v for v in values if v > 0 and math.isfinite(v)]
    if not pos:
        return {"type": "log"}
    lo, hi = min(pos), max(pos)
    e0, e1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    mults = (1,) if sum(lo <= 10.0 ** e <= hi for e in range(e0, e1 + 1)) >= 2 else (1, 2, 5)
    major = [m * 10.0 ** e for e in range(e0, e1 + 1) for m in mults]
    minor = [m * 10.0 ** e for e in range(e0, e1 + 1) for m in range(1, 10) if m not in mults]
    return {"type": "log", "tickmode": "array", "tickvals": major, "ticktext": [f"{v:g}" for v in major],
            "minor": {"tickmode": "array", "tickvals": minor, "ticks": "outside", "ticklen": 4, "showgrid": False}}


def rms_growth_chart(
    rms: pd.DataFrame,
    color: Optional[str] = "model",
    dash: Optional[str] = "text_set",
    log_y: bool = True,
    chapter: Optional[dict[int, float]] = None,
    chapter_label: str = "chapter (gpt-4)",
    title: Optional[str] = None,
) -> go.Figure:
    """RMS of the residual stream after the embedding (block 0) and after each block, log scale by default.

    ``rms`` is one or more ``residual_rms`` tables concatenated, with optional ``color`` / ``dash``
    columns (e.g. ``model``, ``text_set``). ``chapter`` (block → RMS) adds the chapter's figures as markers.
    """
    fig = go.Figure()
    colors, dashes = _styles(rms, color, _PALETTE), _styles(rms, dash, _DASHES)
    for keys, part in _series(rms, color, dash):
        part = part.sort_values("block")
        name = " · ".join(str(v) for v in keys.values()) or "RMS"
        growth = part["growth"] if "growth" in part.columns else part["rms"] / part["rms"].iloc[0]
        fig.add_trace(go.Scatter(
            x=part["block"], y=part["rms"], mode="lines+markers", name=name,
            line=dict(color=colors.get(keys.get(color)), dash=dashes.get(keys.get(dash), "solid")),
            customdata=list(zip(part["row"], growth)),
            hovertemplate=f"{name}<br>%{{customdata[0]}}: RMS %{{y:.3g}} (×%{{customdata[1]:.1f}} the embedding)<extra></extra>",
        ))
    if chapter:
        fig.add_trace(go.Scatter(
            x=list(chapter), y=list(chapter.values()), mode="markers+text", name=chapter_label,
            marker=dict(symbol="x", size=12, color="black"), text=[f"{v:g}" for v in chapter.values()],
            textposition="top center", hovertemplate="chapter: block %{x}: RMS %{y}<extra></extra>",
        ))
    fig.update_xaxes(title=BLOCK_AXIS, dtick=1)
    fig.update_yaxes(title="RMS of the stream (mean over positions)", **(log_axis(_ys(fig)) if log_y else {"type": "linear"}))
    fig.update_layout(title=title or "Residual stream size after each block", width=800, height=480)
    return fig


def rms_position_chart(
    rms: pd.DataFrame,
    blocks: Optional[Sequence[int]] = None,
    log_y: bool = True,
    tokens: Optional[Sequence[str]] = None,
    title: Optional[str] = None,
) -> go.Figure:
    """RMS of the stream at every position, one line per stream row (``residual_rms(..., per_position=True)``).

    ``blocks`` picks rows by block (0 = after the embedding, blocks counted from 1; default all).
    ``tokens`` (the text's token strings) label the hover.
    """
    fig = go.Figure()
    keep = sorted(pd.unique(rms["block"])) if blocks is None else [int(b) for b in blocks]
    for i, b in enumerate(keep):
        part = rms[rms["block"] == b].sort_values("pos")
        if part.empty:
            continue
        label = part["row"].iloc[0]
        hover = [show_token(tokens[p]) if tokens is not None and p < len(tokens) else "" for p in part["pos"]]
        fig.add_trace(go.Scatter(
            x=part["pos"], y=part["rms"], mode="lines", name=label, customdata=hover,
            line=dict(color=_PALETTE[i % len(_PALETTE)]),
            hovertemplate=f"{label}<br>position %{{x}} %{{customdata}}: RMS %{{y:.3g}}<extra></extra>",
        ))
    fig.update_xaxes(title="token position (from 0)")
    fig.update_yaxes(title="RMS of the stream", **(log_axis(_ys(fig)) if log_y else {"type": "linear"}))
    fig.update_layout(title=title or "Residual stream size at each position (rows: blocks counted from 1)",
                      width=900, height=480)
    return fig


def token_change_chart(
    df: pd.DataFrame,
    value: str = "prob_change",
    positions: Optional[Sequence[int]] = None,
    title: Optional[str] = None,
) -> go.Figure:
    """Bars of a per-token change (default: the actual next token's probability, ablated − clean), one per
    predicted token of a ``per_token.ablation_effect`` table; ``positions`` picks which (default all)."""
    d = df if positions is None else df[df["pos"].isin([int(p) for p in positions])]
    x = [f"{p}:{show_token(str(t))}" for p, t in zip(d["pos"], d["token"])]
    colors = ["#d62728" if v < 0 else "#1f77b4" for v in d[value]]
    hover = [f"{show_token(str(c))} → {show_token(str(t))}" for c, t in zip(d["context"], d["token"])]
    extra = [c for c in ("clean_prob", "ablated_prob") if c in d.columns]
    if len(extra) == 2:
        hover = [f"{h}<br>clean {a:.1%}, ablated {b:.1%}" for h, a, b in zip(hover, d[extra[0]], d[extra[1]])]
    fig = go.Figure(go.Bar(x=x, y=d[value], marker_color=colors, customdata=hover,
                           hovertemplate="%{customdata}<br>change %{y:+.3f}<extra></extra>"))
    fig.update_layout(title=title or "change in the probability of the actual next token (ablated − clean)",
                      width=max(700, 22 * len(x) + 200), height=420)
    fig.update_xaxes(title="pos:token predicted (pos = 0-based input index)", tickangle=-60)
    fig.update_yaxes(title=value)
    return fig


def block_knockout_chart(df: pd.DataFrame, title: Optional[str] = None) -> go.Figure:
    """Bars of what each group of blocks is worth: the loss rise (nats) when it stops writing to the
    stream, one bar per row of a ``block_knockout`` table (blocks counted from 1)."""
    x = [f"{'block' if len(l) == 1 else 'blocks'} {b}" for l, b in zip(df["layers"], df["blocks"])]
    hover = [f"loss {l:.3f} (clean {c:.3f})" for l, c in zip(df["loss"], df["clean"])]
    fig = go.Figure(go.Bar(x=x, y=df["change"], customdata=hover,
                           hovertemplate="%{x}: %{y:+.3f} nats<br>%{customdata}<extra></extra>"))
    fig.update_layout(title=title or "loss rise when a block stops writing to the stream (nats)",
                      width=max(520, 70 * len(x) + 200), height=380)
    fig.update_yaxes(title="loss rise (nats)")
    return fig
