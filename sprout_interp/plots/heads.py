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

from sprout_interp.circuits.heads import block_label, head_label
from sprout_interp.plots.common import (
    FULL_COLUMN,
    model_style,
    show_token,
    thinned_ticks,
    title_below_toolbar,
    top_margin,
    wrap_text,
)

__all__ = [
    "head_grid", "pattern_figure", "head_scores_heatmap", "head_scores_figure",
    "sweep_heatmap", "compare_models_figure", "name_copying_figure", "all_heads_figure", "attention_hover_html",
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
    """A token for the HTML text view, where its own spaces show: newlines and tabs made visible."""
    s = str(s).replace("\n", "↵").replace("\t", "⇥")
    return "␣" if s == " " else s


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
    pattern, str_tokens: Sequence[str], layer: Optional[int] = None, head: Optional[int] = None, title: Optional[str] = None,
    size: int = 560, narrowest: Optional[int] = None, first: int = 0,
) -> go.Figure:
    """Heat-map of one head's pattern (query rows × key columns), drawn square, its colour bar as tall as the pattern.

    ``pattern``: ``(query, key)``, or ``(layer, head, query, key)`` from ``attention_patterns`` with
    ``layer``/``head`` picking the head (0-indexed). ``str_tokens``: one per row, the first at input position
    ``first`` (a window of a longer text: the labels say ``pos:token`` with the text's own positions). ``size``: the
    figure's width in pixels, drawn at that width (``show.chart``'s default): fixed margins for the labels (a token
    label is cut to 10 characters; every token is whole in the hover) and the colour bar, and a height that makes
    the plot area square, so the pattern fills it at that size; the title is wrapped to the figure's width (or to
    ``narrowest`` pixels, where a page may draw it narrower). At most 16 keys and queries are labelled.
    """
    p = pattern.detach().cpu().float().numpy() if hasattr(pattern, "detach") else np.asarray(pattern, dtype=float)
    if p.ndim == 4:
        if layer is None or head is None:
            raise ValueError("a (layer, head, query, key) pattern needs layer= and head=")
        p = p[layer, head]
    if p.ndim != 2:
        raise ValueError(f"expected a (query, key) or (layer, head, query, key) pattern, got shape {p.shape}")
    n = p.shape[0]
    toks = [f"{first + i}:{show_token(str(t), most=10)}" for i, t in enumerate(list(str_tokens)[:n])]
    fig = go.Figure(go.Heatmap(
        z=p, x=toks, y=toks, colorscale="Blues", zmin=0, zmax=1, colorbar=dict(thickness=14, len=1.0),
        hovertemplate="query %{y}<br>key %{x}<br>attention %{z:.3f}<extra></extra>",
    ))
    if title is None:
        title = "attention pattern" if layer is None else f"attention pattern, {block_label(layer)}, head {head}"
    heading = title_below_toolbar(title, width=(narrowest or size) - 20, font=14, ref="container")
    left, right, bottom = 118, 64, 96  # the query labels and axis title; the colour bar; the key labels and title
    side = size - left - right
    fig.update_layout(title=heading, width=size, height=top_margin(heading) + bottom + side,
                      margin=dict(l=left, r=right, t=top_margin(heading), b=bottom), plot_bgcolor="white")
    fig.update_xaxes(title="key (attended to)", tickangle=-90, nticks=16, tickfont=dict(size=10), range=[-0.5, n - 0.5],
                     constrain="domain", showgrid=False, automargin=False)
    fig.update_yaxes(title="query (attending)", nticks=16, tickfont=dict(size=10), range=[n - 0.5, -0.5],
                     scaleanchor="x", scaleratio=1, constrain="domain", constraintoward="top", showgrid=False,
                     automargin=False)
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
    _grid_layout(fig, title or _SCORE_TITLES.get(value, value), len(heads), len(layers))
    return fig


def _grid_layout(fig: go.Figure, title: str, n_heads: int, n_layers: int) -> None:
    """A blocks × heads heat-map's size and title: 90 × 45 pixel cells (at least 480 pixels across, so the title
    has room), the title wrapped to the figure's width, block 1 at the top."""
    width = max(480, 170 + 90 * n_heads)
    heading = title_below_toolbar(title, width=width - 40, font=15, ref="container")
    fig.update_layout(title=heading, width=width, height=top_margin(heading) + 60 + 45 * n_layers,
                      margin=dict(t=top_margin(heading), b=50))
    fig.update_yaxes(autorange="reversed")


def head_scores_figure(df: pd.DataFrame, columns: Optional[Sequence[str]] = None, title: Optional[str] = None) -> go.Figure:
    """Side-by-side heat-maps of several head-score columns (default: the three scores on random tokens, and on
    text if present); the panels of a row share one y axis, labelled once."""
    if columns is None:
        columns = [c for c in ("prev_token_random", "duplicate_random", "induction_random",
                               "prev_token_text", "duplicate_text", "induction_text") if c in df]
    columns = list(columns)
    ncols = min(3, len(columns))
    nrows = (len(columns) + ncols - 1) // ncols
    # the panels of a row share their y axis, so only the first carries the block labels: labels drawn on
    # every panel would overlap the last column of the panel to their left
    # panels about 190 pixels across, so the figure fits the main column of a 1280-pixel window; their titles wrap
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=[wrap_text(_SCORE_TITLES.get(c, c), 180, 12) for c in columns],
                        shared_yaxes=True, horizontal_spacing=0.03, vertical_spacing=0.16)
    for i, c in enumerate(columns):
        grid, layers, heads = head_grid(df, c)
        fig.add_trace(go.Heatmap(
            z=grid, x=[f"h{h}" for h in heads], y=[block_label(l) for l in layers], zmin=0, zmax=1,
            colorscale="Blues", showscale=(i == 0), text=np.round(grid, 2), texttemplate="%{text}", name=c,
            hovertemplate="%{y}, %{x}<br>" + c + " %{z:.3f}<extra></extra>", colorbar=dict(x=1.02),
        ), row=i // ncols + 1, col=i % ncols + 1)
    fig.update_yaxes(autorange="reversed")
    for r in range(1, nrows + 1):
        for c in range(2, ncols + 1):
            fig.update_yaxes(showticklabels=False, row=r, col=c)
    fig.update_annotations(font_size=12)
    fig.update_layout(title=title or "head scores (blocks counted from 1; layer = index in code)",
                      width=min(800, 160 + 320 * ncols), height=140 + 320 * nrows, margin=dict(l=140))
    return fig


def all_heads_figure(
    patterns, str_tokens: Sequence[str], selected: Optional[tuple[int, int]] = None, n: Optional[int] = None,
    title: Optional[str] = None, panel: int = 170, max_width: int = FULL_COLUMN - 20, first: int = 0,
) -> go.Figure:
    """Every head of every block at a glance: one small attention pattern per head (rows = blocks, counted
    from 1; columns = heads), one shared colour scale, the ``selected`` (layer, head) framed in red.

    ``patterns``: ``(layer, head, query, key)`` from ``attention_patterns`` (or a list of per-layer
    ``(head, query, key)``); ``n``: only the first ``n`` tokens (queries and keys); ``first``: the input position of
    the first of them (a window of a longer text: labels and title use the text's own positions). Each panel is a square of
    ``panel`` pixels, smaller where the figure would be wider than ``max_width`` pixels (800: the main column of
    a 1280-pixel window); each pattern's axes are locked to one scale across and down, so a pattern stays square
    and fills its axes at whatever width the page draws it, and the frame is drawn on the pattern's own axes.
    """
    if isinstance(patterns, (list, tuple)):
        patterns = [p.detach().cpu().float().numpy() if hasattr(p, "detach") else np.asarray(p) for p in patterns]
        p = np.stack(patterns)
    else:
        p = patterns.detach().cpu().float().numpy() if hasattr(patterns, "detach") else np.asarray(patterns, dtype=float)
    if p.ndim != 4:
        raise ValueError(f"expected (layer, head, query, key) patterns, got shape {p.shape}")
    L, H = p.shape[:2]
    n = p.shape[-1] if n is None else max(1, min(int(n), p.shape[-1]))
    p = p[:, :, :n, :n].astype(np.float32)
    labels = [f"{first + i}:{show_token(str(t))}" for i, t in enumerate(list(str_tokens)[:n])]
    # pixels: margins, gaps (a row's gap holds the next row's panel titles), and the square panels
    left, right, top, bottom, hgap, vgap = 20, 110, 80, 20, 10, 26
    side = int(max(60, min(panel, (max_width - left - right - (H - 1) * hgap) // H)))
    plot_w, plot_h = H * side + (H - 1) * hgap, L * side + (L - 1) * vgap
    fig = make_subplots(rows=L, cols=H, horizontal_spacing=hgap / plot_w if H > 1 else 0.0,
                        vertical_spacing=vgap / plot_h if L > 1 else 0.0,
                        subplot_titles=[head_label(l, h, with_layer=False) for l in range(L) for h in range(H)])
    for l in range(L):
        for h in range(H):
            fig.add_trace(go.Heatmap(
                z=p[l, h], x=labels, y=labels, coloraxis="coloraxis", name=head_label(l, h, with_layer=False),
                hovertemplate=f"block {l + 1} head {h} (layer {l})<br>query %{{y}}<br>key %{{x}}<br>"
                              "attention %{z:.3f}<extra></extra>",
            ), row=l + 1, col=h + 1)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False, range=[-0.5, n - 0.5], constrain="domain")
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, range=[n - 0.5, -0.5], constrain="domain")
    for i in range(L * H):  # one pixel across is one pixel down: the pattern stays square when the page narrows it
        suffix = str(i + 1) if i else ""
        fig.layout["yaxis" + suffix].update(scaleanchor="x" + suffix, scaleratio=1)
    fig.update_annotations(font_size=11)
    if selected is not None:
        sl, sh = int(selected[0]), int(selected[1])
        if 0 <= sl < L and 0 <= sh < H:
            i = sl * H + sh
            suffix = str(i + 1) if i else ""
            # on the pattern's own axes (their domain as drawn, after the square lock), just outside the pattern
            fig.add_shape(type="rect", xref=f"x{suffix} domain", yref=f"y{suffix} domain", x0=-0.02, x1=1.02,
                          y0=-0.02, y1=1.02, line=dict(color="#d62728", width=3))
            fig.layout.annotations[i].font = dict(color="#d62728", size=12)
            fig.layout.annotations[i].text = f"<b>block {sl + 1} head {sh}</b>"
    fig.update_layout(
        title=title or (f"every head, first {n} tokens" if not first else f"every head, tokens {first}–{first + n - 1}")
        + " (queries down, keys across)",
        coloraxis=dict(colorscale="Blues", cmin=0, cmax=1, colorbar=dict(title="attention", len=min(1.0, 400 / plot_h))),
        width=left + right + plot_w, height=top + bottom + plot_h, margin=dict(l=left, r=right, t=top, b=bottom),
        plot_bgcolor="white",
    )
    return fig


def attention_hover_html(pattern, str_tokens: Sequence[str], title: str = "", element_id: str = "attn-hover",
                         shown: Optional[int] = None) -> str:
    """One head's pattern as the text itself, CircuitsVis-style, offline (plain HTML and JavaScript, no CDN).

    Hover over (or click, to keep) a token: the tokens it attends to are shaded blue by their weight, the
    later tokens that attend to it are underlined orange by theirs, and the strongest of each are listed.
    ``pattern``: ``(query, key)``; ``shown``: the position shown (outlined) at first, the last when None. Token
    strings reach the page only as JSON data written with ``textContent``,
    never as markup, so any text is shown literally.
    """
    import json

    p = pattern.detach().cpu().float().numpy() if hasattr(pattern, "detach") else np.asarray(pattern, dtype=float)
    if p.ndim != 2 or p.shape[0] != p.shape[1]:
        raise ValueError(f"expected a square (query, key) pattern, got shape {p.shape}")
    n = p.shape[0]
    toks = [_vis(t) for t in list(str_tokens)[:n]]
    if len(toks) < n:
        raise ValueError(f"{n} positions but only {len(toks)} token strings")
    weights = np.round(p.astype(np.float64), 4).tolist()
    start = n - 1 if shown is None else max(0, min(int(shown), n - 1))
    data = json.dumps({"tokens": toks, "pattern": weights, "title": str(title), "shown": start}, ensure_ascii=True)
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    uid = "".join(ch for ch in str(element_id) if ch.isalnum() or ch in "-_") or "attn-hover"
    return _HOVER_TEMPLATE.replace("__UID__", uid).replace("__DATA__", data)


_HOVER_TEMPLATE = """<div id="__UID__" class="sprout-attn" style="font-family: sans-serif; font-size: 15px; line-height: 2.1;">
<div class="sa-title" style="font-weight: 600; margin-bottom: 4px;"></div>
<div class="sa-help" style="font-size: 13px; color: #555;">Hover over a token (click to keep it):
<span style="background: rgba(31,119,180,0.55); padding: 0 4px;">blue</span> = what it attends to,
<span style="border-bottom: 3px solid rgb(255,127,14); padding: 0 4px;">orange</span> = what attends to it.</div>
<div class="sa-tokens" style="margin: 6px 0; max-height: 420px; overflow-y: auto; overflow-x: hidden; position: relative;"></div>
<div class="sa-info" style="font-size: 13px; color: #333; min-height: 3.2em; line-height: 1.5;"></div>
</div>
<script>
(function () {
  const root = document.getElementById("__UID__");
  if (!root) return;
  const D = __DATA__;
  const n = D.tokens.length, P = D.pattern;
  root.querySelector(".sa-title").textContent = D.title;
  const box = root.querySelector(".sa-tokens"), info = root.querySelector(".sa-info");
  const spans = [];
  let kept = -1;
  for (let i = 0; i < n; i++) {
    const s = document.createElement("span");
    s.textContent = D.tokens[i];
    s.dataset.pos = String(i);
    // inline blocks: the text wraps between tokens (plain inline spans with no space between them would not),
    // and each token keeps its own spaces
    s.style.cssText = "display: inline-block; max-width: 100%; padding: 0 1px; margin: 1px; border-radius: 3px; " +
      "cursor: pointer; white-space: pre-wrap; overflow-wrap: anywhere; line-height: 1.6; border-bottom: 3px solid transparent;";
    s.addEventListener("mouseenter", () => { if (kept < 0) show(i); });
    s.addEventListener("click", () => { kept = (kept === i) ? -1 : i; show(i); });
    box.appendChild(s);
    spans.push(s);
  }
  function top(pairs) {
    return pairs.filter(p => p[1] > 0.005).sort((a, b) => b[1] - a[1]).slice(0, 4)
      .map(p => p[0] + ":" + JSON.stringify(D.tokens[p[0]]) + " " + (100 * p[1]).toFixed(0) + "%").join(", ") || "none";
  }
  function show(i) {
    for (let j = 0; j < n; j++) {
      const a = j <= i ? P[i][j] : 0, b = j >= i ? P[j][i] : 0, s = spans[j];
      s.style.background = a > 0 ? "rgba(31,119,180," + (0.9 * a).toFixed(3) + ")" : "transparent";
      s.style.borderBottomColor = (j > i && b > 0) ? "rgba(255,127,14," + Math.min(1, 0.15 + b).toFixed(3) + ")" : "transparent";
      s.style.outline = j === i ? "2px solid #222" : "none";
      s.style.color = a > 0.6 ? "white" : "black";
    }
    const t = spans[i];  // keep the token in view inside the box (it scrolls down when the text is long)
    if (t.offsetTop < box.scrollTop || t.offsetTop + t.offsetHeight > box.scrollTop + box.clientHeight)
      box.scrollTop = Math.max(0, t.offsetTop - box.clientHeight / 2);
    const to = [], from = [];
    for (let j = 0; j <= i; j++) to.push([j, P[i][j]]);
    for (let q = i + 1; q < n; q++) from.push([q, P[q][i]]);
    info.textContent = "";
    const l1 = document.createElement("div"), l2 = document.createElement("div");
    l1.textContent = "position " + i + " " + JSON.stringify(D.tokens[i]) +
      (kept === i ? " (kept; click again to let go)" : "") + " attends to: " + top(to);
    l2.textContent = "attended to by: " + top(from);
    info.appendChild(l1); info.appendChild(l2);
  }
  root.dataset.ready = "1";
  if (n) show(D.shown);
})();
</script>
"""


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
    _grid_layout(fig, title or default, len(heads), len(layers))
    return fig


def compare_models_figure(df: pd.DataFrame, models: Optional[Sequence[str]] = None, title: Optional[str] = None,
                          positions: Optional[Sequence[int]] = None) -> go.Figure:
    """Grouped bars: P(actual next token) under each model, one group per token of a ``compare_models`` table."""
    models = list(models or df.attrs.get("models") or [c for c in df.columns if c not in ("pos", "context", "token")])
    d = df if positions is None else df[df["pos"].isin(list(positions))]
    x = [f"{p}:{show_token(str(t))}" for p, t in zip(d["pos"], d["token"])]
    fig = go.Figure([go.Bar(name=m, x=x, y=d[m], marker=model_style(i),
                            hovertemplate="%{x}<br>P = %{y:.3f}<extra>" + m + "</extra>") for i, m in enumerate(models)])
    fig.update_layout(barmode="group", title=title or "probability of the actual next token", yaxis_range=[0, 1],
                      width=max(700, 28 * len(x) * max(1, len(models)) // 2), height=450)
    fig.update_yaxes(title="P(token | text before it)")
    fig.update_xaxes(title="pos:token predicted (pos = 0-based input index)", tickangle=-60, **thinned_ticks(x))
    return fig


def name_copying_figure(df: pd.DataFrame, title: Optional[str] = None) -> go.Figure:
    """Grouped bars from a ``name_copying_table``: P of each later token of each name at its second occurrence, per model."""
    d = df[df["occurrence"] == 2]

    def labels(x: pd.DataFrame) -> list[str]:
        return [f"{n} {i}:{show_token(str(t))}" for n, i, t in zip(x["name"], x["index"], x["token"])]

    x_order = list(dict.fromkeys(labels(d)))
    fig = go.Figure()
    for i, m in enumerate(dict.fromkeys(d["model"])):
        dm = d[d["model"] == m]
        fig.add_trace(go.Bar(name=m, x=labels(dm), y=dm["prob"], marker=model_style(i),
                             hovertemplate="%{x}<br>P = %{y:.3f}<extra>" + m + "</extra>"))
    fig.update_layout(barmode="group", title=title or "invented names, second occurrence: P(each later token)",
                      yaxis_range=[0, 1], width=max(700, 40 * len(x_order)), height=450)
    fig.update_xaxes(categoryorder="array", categoryarray=x_order, tickangle=-60, **thinned_ticks(x_order, 40))
    return fig
