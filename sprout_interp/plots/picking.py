"""Clicks on heat-map panels. Plotly cannot select a heat-map's cells, so Streamlit's ``on_select`` never reports a
click on one; an invisible marker as large as the panel, drawn over it, is selected instead, and its ``customdata``
says what the click picked. :func:`picked` reads that back from the chart's selection state.

Used by the dashboard's every-head figure (a click on a head's small pattern chooses that head) and by the drawn-large
pattern (:func:`clickable_cells`: a click on a cell opens that cell's QK attribution).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import plotly.graph_objects as go

__all__ = ["clickable_cells", "clickable_panels", "picked"]

# plotly hovers a marker when the pointer is within its radius plus this many pixels (layout.hoverdistance)
_HOVER_PX = 20


def _axis_px(fig: go.Figure, name: str, span: float) -> float:
    """The length in pixels of the axis ``name`` ("xaxis3") on a figure ``span`` pixels wide (or tall) inside
    its margins."""
    domain = fig.layout[name].domain or (0.0, 1.0)
    return span * (float(domain[1]) - float(domain[0]))


def clickable_panels(fig: go.Figure, picks: Mapping[int, Sequence[Any]], hover: Mapping[int, str],
                     name: str = "pick") -> go.Figure:
    """Put one invisible marker over each heat-map panel named in ``picks`` (trace index -> the customdata a click
    on that panel reports, e.g. ``(layer, head)``), as large as the panel, with ``hover[i]`` as its hover text.
    A click anywhere on the panel selects the marker; the heat-map's own hover gives way to the marker's there,
    and the panel's axes are fixed (no zoom strips at its edges to catch the click). The figure needs
    ``layout.width`` and ``layout.height`` (the markers' size is in pixels). Returns ``fig``."""
    width, height = fig.layout.width, fig.layout.height
    if width is None or height is None:
        raise ValueError("clickable_panels needs the figure's layout.width and layout.height (marker sizes are pixels)")
    margin = fig.layout.margin
    inner_w = float(width - (margin.l if margin.l is not None else 80) - (margin.r if margin.r is not None else 80))
    inner_h = float(height - (margin.t if margin.t is not None else 100) - (margin.b if margin.b is not None else 80))
    markers, axes = [], []
    for i, data in picks.items():
        tr = fig.data[i]
        if tr.type != "heatmap":
            raise ValueError(f"trace {i} is a {tr.type}, not a heat-map panel")
        xa = "xaxis" + (tr.xaxis or "x")[1:]
        ya = "yaxis" + (tr.yaxis or "y")[1:]
        axes += [xa, ya]
        w, h = _axis_px(fig, xa, inner_w), _axis_px(fig, ya, inner_h)
        xs = list(tr.x) if tr.x is not None else list(range(len(tr.z[0])))
        ys = list(tr.y) if tr.y is not None else list(range(len(tr.z)))
        # the marker sits on the middle cell (half a cell off the panel's centre for an even count); plotly hovers
        # it within its radius plus the hover distance, so that must reach the panel's farthest corner
        reach = math.hypot(w / 2 + w / (2 * len(xs)), h / 2 + h / (2 * len(ys)))
        size = 2 * max(reach - _HOVER_PX + 4, 4.0)
        markers.append(go.Scatter(
            x=[xs[len(xs) // 2]], y=[ys[len(ys) // 2]], xaxis=tr.xaxis, yaxis=tr.yaxis, customdata=[list(data)],
            mode="markers", marker=dict(symbol="square", size=size, opacity=0.0, color="black"),
            selected=dict(marker=dict(opacity=0.0)), unselected=dict(marker=dict(opacity=0.0)),
            hovertext=[hover.get(i, "")], hovertemplate="%{hovertext}<extra></extra>", showlegend=False, name=name,
        ))
    fig.add_traces(markers)
    # fixed axes: no zoom or pan strips at the panels' edges, where a neighbouring panel's axis strip (a few
    # pixels wide, wider than the gap between small panels) would take the click instead
    for name in axes:
        fig.layout[name].fixedrange = True
    return fig


def clickable_cells(fig: go.Figure, trace: int = 0, causal: bool = True, max_cells: int = 8400, offset: int = 0,
                    name: str = "cell") -> go.Figure:
    """Put one invisible marker on each cell of the heat-map ``fig.data[trace]`` (a pattern: rows are queries, columns
    keys), its ``customdata`` ``[offset + row, offset + column]`` (``offset``: the position of the heat-map's first
    row and column, for a window of a longer text), so that a click on a cell selects it (plotly picks the
    marker nearest the pointer, the one on the cell under it). ``causal``: only the cells at or below the diagonal
    (a key after its query is never attended to). Nothing is added when there would be more than ``max_cells``
    markers (a page then offers the cell's numbers instead). Returns ``fig``."""
    tr = fig.data[trace]
    if tr.type != "heatmap":
        raise ValueError(f"trace {trace} is a {tr.type}, not a heat-map")
    n_rows, n_cols = len(tr.z), len(tr.z[0]) if len(tr.z) else 0
    xs = list(tr.x) if tr.x is not None else list(range(n_cols))
    ys = list(tr.y) if tr.y is not None else list(range(n_rows))
    cells = [(r, c) for r in range(n_rows) for c in range(n_cols) if not causal or c <= r]
    if not cells or len(cells) > max_cells:
        return fig
    fig.add_trace(go.Scatter(
        x=[xs[c] for _, c in cells], y=[ys[r] for r, _ in cells], customdata=[[offset + r, offset + c] for r, c in cells],
        xaxis=tr.xaxis, yaxis=tr.yaxis, mode="markers",
        marker=dict(symbol="square", size=max(4, min(24, 560 // max(n_rows, 1))), opacity=0.0, color="black"),
        selected=dict(marker=dict(opacity=0.0)), unselected=dict(marker=dict(opacity=0.0)),
        hovertext=[f"query {ys[r]}<br>key {xs[c]}<br>attention {float(tr.z[r][c]):.3f}<br>click: why it looks there"
                   for r, c in cells],
        hovertemplate="%{hovertext}<extra></extra>", showlegend=False, name=name,
    ))
    return fig


def picked(selection: Optional[Mapping[str, Any]], n: int = 2) -> Optional[tuple[int, ...]]:
    """The first ``n`` values of the first selected point's ``customdata``, as ints, from a plotly chart's selection
    state (what ``st.plotly_chart(..., on_select="rerun", key=k)`` keeps in ``st.session_state[k]``); None when
    nothing with such customdata is selected."""
    try:
        points = selection["selection"]["points"]
    except (KeyError, TypeError):
        return None
    for p in points or []:
        data = p.get("customdata") if isinstance(p, Mapping) else None
        if isinstance(data, (list, tuple)) and len(data) >= n:
            try:
                return tuple(int(v) for v in data[:n])
            except (TypeError, ValueError):
                continue
    return None
