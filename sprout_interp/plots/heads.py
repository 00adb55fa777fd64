"""Plotly figures for attention heads, ablations and model comparison.

Each function takes what the analysis functions return (a pattern tensor, a ``head_scores`` or
``ablation_sweep`` DataFrame, a ``compare_models`` table) and returns a ``plotly.graph_objects.Figure``;
none does tensor maths beyond reshaping into a grid. Heat-maps of heads put blocks on the y axis,
labelled as people read them: "block 1 (layer 0)" … (the chapter counts blocks from 1; ``blocks.{l}``
in code is 0-indexed).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = [
    "block_label", "head_grid", "pattern_figure", "head_scores_heatmap", "head_scores_figure",
    "sweep_heatmap", "compare_models_figure", "name_copying_figure",
]

_SCORE_TITLES = {
    "prev_token_random": "previous-token (repeated random tokens)",
    "duplicate_random": "duplicate-token (repeated random tokens)",
    "induction_random": "induction (repeated random tokens)",
    "prev_token_text": "previous-token (natural text)",
    "duplicate_text": "duplicate-token (natural text)",
    "induction_text": "induction (natural text)",
    "copying_ratio_change": "copying ratio change when ablated",
}


def _vis(s: str) -> str:
    s = str(s).replace("\n", "↵").replace("\t", "⇥")
    return "␣" if s == " " else s


def block_label(layer: int) -> str:
    """'block 3 (layer 2)': the chapter's count, then the code's index."""
    return f"block {layer + 1} (layer {layer})"


def head_grid(df: pd.DataFrame, value: str) -> tuple[np.ndarray, list[int], list[int]]:
    """``(grid (n_layers, n_heads), layers, heads)`` of column ``value``; NaN where a head is missing."""
    if value not in df:
        raise KeyError(f"no column {value!r}; the table has {list(df.columns)}")
    layers = sorted(int(l) for l in df["layer"].unique())
    heads = list(range(int(df["head"].max()) + 1))
    grid = np.full((len(layers), len(heads)), np.nan)
    row = {l: i for i, l in enumerate(layers)}
    for l, h, v in zip(df["layer"], df["head"], df[value]):
        grid[row[int(l)], int(h)] = float(v)
    return grid, layers, heads


def pattern_figure(
    pattern, str_tokens: Sequence[str], layer: Optional[int] = None, head: Optional[int] = None, title: Optional[str] = None
) -> go.Figure:
    """Heat-map of one head's pattern (query rows × key columns).

    ``pattern``: ``(query, key)``, or ``(layer, head, query, key)`` from ``attention_patterns`` with
    ``layer``/``head`` picking the head (0-indexed).
    """
    p = pattern.detach().cpu().float().numpy() if hasattr(pattern, "detach") else np.asarray(pattern, dtype=float)
    if p.ndim == 4:
        if layer is None or head is None:
            raise ValueError("a (layer, head, query, key) pattern needs layer= and head=")
        p = p[layer, head]
    if p.ndim != 2:
        raise ValueError(f"expected a (query, key) or (layer, head, query, key) pattern, got shape {p.shape}")
    n = p.shape[0]
    toks = [f"{i}:{_vis(t)}" for i, t in enumerate(list(str_tokens)[:n])]
    fig = go.Figure(go.Heatmap(
        z=p, x=toks, y=toks, colorscale="Blues", zmin=0, zmax=1,
        hovertemplate="query %{y}<br>key %{x}<br>attention %{z:.3f}<extra></extra>",
    ))
    if title is None:
        title = "attention pattern" if layer is None else f"attention pattern, {block_label(layer)}, head {head}"
    fig.update_layout(title=title, width=700, height=700)
    fig.update_xaxes(title="key (attended to)", tickangle=-60)
    fig.update_yaxes(title="query (attending)", autorange="reversed")
    return fig


def head_scores_heatmap(
    df: pd.DataFrame, value: str = "induction_random", title: Optional[str] = None, zmin: Optional[float] = 0.0,
    zmax: Optional[float] = 1.0, colorscale: str = "Blues",
) -> go.Figure:
    """Blocks × heads heat-map of one column of ``head_scores`` (or any per-head table), values printed in the cells."""
    grid, layers, heads = head_grid(df, value)
    fig = go.Figure(go.Heatmap(
        z=grid, x=[f"head {h}" for h in heads], y=[block_label(l) for l in layers], colorscale=colorscale,
        zmin=zmin, zmax=zmax, text=np.round(grid, 2), texttemplate="%{text}",
        hovertemplate="%{y}, %{x}<br>" + value + " %{z:.3f}<extra></extra>",
    ))
    fig.update_layout(title=title or _SCORE_TITLES.get(value, value), width=120 + 90 * len(heads), height=160 + 45 * len(layers))
    fig.update_yaxes(autorange="reversed")
    return fig


def head_scores_figure(df: pd.DataFrame, columns: Optional[Sequence[str]] = None, title: Optional[str] = None) -> go.Figure:
    """Side-by-side heat-maps of several head-score columns (default: the three scores on random tokens, and on text if present)."""
    if columns is None:
        columns = [c for c in ("prev_token_random", "duplicate_random", "induction_random",
                               "prev_token_text", "duplicate_text", "induction_text") if c in df]
    columns = list(columns)
    ncols = min(3, len(columns))
    nrows = (len(columns) + ncols - 1) // ncols
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=[_SCORE_TITLES.get(c, c) for c in columns],
                        horizontal_spacing=0.08, vertical_spacing=0.12)
    for i, c in enumerate(columns):
        grid, layers, heads = head_grid(df, c)
        fig.add_trace(go.Heatmap(
            z=grid, x=[f"h{h}" for h in heads], y=[block_label(l) for l in layers], zmin=0, zmax=1,
            colorscale="Blues", showscale=(i == 0), text=np.round(grid, 2), texttemplate="%{text}", name=c,
            hovertemplate="%{y}, %{x}<br>" + c + " %{z:.3f}<extra></extra>",
        ), row=i // ncols + 1, col=i % ncols + 1)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=title or "head scores (blocks counted from 1; layer = index in code)",
                      width=380 * ncols, height=140 + 320 * nrows)
    return fig


def sweep_heatmap(df: pd.DataFrame, value: str = "change", title: Optional[str] = None) -> go.Figure:
    """Blocks × heads heat-map of an ``ablation_sweep`` (default: the change vs clean), diverging around 0."""
    grid, layers, heads = head_grid(df, value)
    lim = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
    lim = lim or 1.0
    metric, kind = df.attrs.get("metric", ""), df.attrs.get("kind", "")
    fig = go.Figure(go.Heatmap(
        z=grid, x=[f"head {h}" for h in heads], y=[block_label(l) for l in layers], colorscale="RdBu_r",
        zmid=0 if value in ("change", "estimate") else None, zmin=-lim if value in ("change", "estimate") else None,
        zmax=lim if value in ("change", "estimate") else None,
        text=np.round(grid, 3), texttemplate="%{text}", hovertemplate="%{y}, %{x}<br>" + value + " %{z:.4f}<extra></extra>",
    ))
    default = f"{kind}-ablating one head: {value} of {metric}"
    if "clean" in df and len(df):
        default += f" (clean {float(df['clean'].iloc[0]):.3f})"
    fig.update_layout(title=title or default, width=120 + 90 * len(heads), height=160 + 45 * len(layers))
    fig.update_yaxes(autorange="reversed")
    return fig


def compare_models_figure(df: pd.DataFrame, models: Optional[Sequence[str]] = None, title: Optional[str] = None,
                          positions: Optional[Sequence[int]] = None) -> go.Figure:
    """Grouped bars: P(actual next token) under each model, one group per token of a ``compare_models`` table."""
    models = list(models or df.attrs.get("models") or [c for c in df.columns if c not in ("position", "context", "token")])
    d = df if positions is None else df[df["position"].isin(list(positions))]
    x = [f"{p}:{_vis(t)}" for p, t in zip(d["position"], d["token"])]
    fig = go.Figure([go.Bar(name=m, x=x, y=d[m], hovertemplate="%{x}<br>P = %{y:.3f}<extra>" + m + "</extra>") for m in models])
    fig.update_layout(barmode="group", title=title or "probability of the actual next token", yaxis_range=[0, 1],
                      width=max(700, 28 * len(x) * max(1, len(models)) // 2), height=450)
    fig.update_yaxes(title="P(token | text before it)")
    fig.update_xaxes(title="position:token", tickangle=-60)
    return fig


def name_copying_figure(df: pd.DataFrame, title: Optional[str] = None) -> go.Figure:
    """Grouped bars from a ``name_copying_table``: P of each later token of each name at its second occurrence, per model."""
    d = df[df["occurrence"] == 2]

    def labels(x: pd.DataFrame) -> list[str]:
        return [f"{n} {i}:{_vis(t)}" for n, i, t in zip(x["name"], x["index"], x["token"])]

    x_order = list(dict.fromkeys(labels(d)))
    fig = go.Figure()
    for m in dict.fromkeys(d["model"]):
        dm = d[d["model"] == m]
        fig.add_trace(go.Bar(name=m, x=labels(dm), y=dm["prob"], hovertemplate="%{x}<br>P = %{y:.3f}<extra>" + m + "</extra>"))
    fig.update_layout(barmode="group", title=title or "invented names, second occurrence: P(each later token)",
                      yaxis_range=[0, 1], width=max(700, 40 * len(x_order)), height=450)
    fig.update_xaxes(categoryorder="array", categoryarray=x_order, tickangle=-60)
    return fig
