"""Clickable cells of a pattern (plots.picking.clickable_cells): one invisible marker per causal cell, its customdata
the text's own (query, key) positions, and what a click on it leaves read back by picked."""
from __future__ import annotations

import numpy as np
import pytest

from sprout_interp.plots.heads import pattern_figure
from sprout_interp.plots.picking import clickable_cells, picked

pytestmark = pytest.mark.unit


def test_each_causal_cell_gets_a_marker_with_its_positions():
    p = np.tril(np.ones((5, 5))) / np.arange(1, 6)[:, None]
    fig = clickable_cells(pattern_figure(p, list("abcde")), offset=10)
    marks = fig.data[-1]
    assert marks.type == "scatter" and marks.marker.opacity == 0
    cells = [tuple(c) for c in marks.customdata]
    assert cells == [(10 + q, 10 + k) for q in range(5) for k in range(q + 1)]  # 15 cells, none above the diagonal
    heat = fig.data[0]
    assert list(marks.x) == [heat.x[k] for q in range(5) for k in range(q + 1)]  # on the heat-map's own cells
    assert list(marks.y) == [heat.y[q] for q in range(5) for k in range(q + 1)]
    assert "attention 0.500" in marks.hovertext[cells.index((11, 10))]
    click = {"selection": {"points": [{"customdata": [13, 11]}]}}
    assert picked(click) == (13, 11)


def test_too_many_cells_add_nothing_and_a_non_heatmap_is_refused():
    fig = pattern_figure(np.zeros((6, 6)), list("abcdef"))
    assert len(clickable_cells(fig, max_cells=20).data) == 1  # 21 causal cells: left to the page's number boxes
    assert len(clickable_cells(fig, causal=False, max_cells=36).data) == 2
    with pytest.raises(ValueError, match="not a heat-map"):
        clickable_cells(fig, trace=1)
