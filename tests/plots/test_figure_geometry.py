"""The figures' geometry as built (the browser test, tests/dashboards/test_layout_browser.py, measures it as drawn): square
patterns, every block of the contribution graph on its own rows with nodes that cannot overlap, cell text that
fits its cell, titles wrapped to the narrowest page, an empty steering bar that says why, and the repeated name a
typed text opens on."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from sprout_interp.features.search import repeated_names
from sprout_interp.plots.common import CHAR_EM, FULL_COLUMN, title_below_toolbar, top_margin, wrap_text
from sprout_interp.plots.heads import all_heads_figure, pattern_figure
from sprout_interp.plots.patching import NODE_KINDS, contribution_graph_figure
from sprout_interp.plots.steering import steering_layers_figure, zero_vector_blocks
from sprout_interp.plots.trajectories import trajectory_heatmaps

pytestmark = pytest.mark.unit


def test_wrap_text_keeps_every_line_inside_the_width():
    text = "what pushes ␣Pl at position 39: every head and feed-forward (blocks from 1), lines from the positions"
    out = wrap_text(text, 200, 10)
    lines = out.split("<br>")
    assert len(lines) > 1 and " ".join(lines) == text
    assert all(len(line) * CHAR_EM * 10 <= 200 for line in lines)
    head = title_below_toolbar(text, width=200, font=10)
    assert head["text"] == out and top_margin(head) >= 34 + len(lines) * 13


def test_every_head_grid_has_square_cells_that_fit_a_1280_pixel_window():
    for L, H in ((8, 6), (4, 3), (1, 3)):
        fig = all_heads_figure(torch.rand(L, H, 20, 20), [f" t{i}" for i in range(20)], selected=(0, H - 1))
        assert fig.layout.width <= FULL_COLUMN
        m = fig.layout.margin
        w = (fig.layout.width - m.l - m.r) * np.diff(fig.layout.xaxis.domain)[0]
        h = (fig.layout.height - m.t - m.b) * np.diff(fig.layout.yaxis.domain)[0]
        assert w == pytest.approx(h, abs=1.0) and w >= 60


def test_the_chosen_pattern_is_locked_square_with_thinned_labels():
    fig = pattern_figure(torch.rand(48, 48), [" a"] * 48, title="a long title " * 6)
    ya, xa = fig.layout.yaxis, fig.layout.xaxis
    assert ya.scaleanchor == "x" and ya.scaleratio == 1 and xa.constrain == "domain"
    assert tuple(xa.range) == (-0.5, 47.5) and tuple(ya.range) == (47.5, -0.5)
    assert xa.nticks <= 16 and ya.nticks <= 16
    assert "<br>" in fig.layout.title.text and fig.layout.margin.t == top_margin(fig.layout.title.to_plotly_json())


def _graph(n_layers=3, n_heads=4, pos=9):
    nodes = pd.DataFrame([
        dict(component="embedding", kind="embed", layer=-1, block=0, head=-1, attribution=0.4),
        dict(component="block 2 head 0", kind="head", layer=1, block=2, head=0, attribution=2.0),
        dict(component="block 2 head 1", kind="head", layer=1, block=2, head=1, attribution=-0.5),
        dict(component="block 3 feed-forward", kind="mlp", layer=2, block=3, head=-1, attribution=1.0),
    ])
    edges = pd.DataFrame([dict(layer=1, block=2, head=0, src_pos=3, src_token=" Pl", attribution=1.5),
                          dict(layer=1, block=2, head=1, src_pos=3, src_token=" Pl", attribution=-0.3)])
    for df in (nodes, edges):
        df.attrs.update(pos=pos, token=" ax", logit=7.0)
    return contribution_graph_figure(nodes, edges, [f" t{i}" for i in range(12)], n_layers, n_heads)


def test_the_contribution_graph_gives_every_part_its_own_row():
    fig = _graph()
    rows = list(fig.layout.yaxis.ticktext)
    assert rows[0] == "embedding" and rows[-1] == "output"
    assert {f"block {b} head {h}" for b in (1, 2, 3) for h in range(4)} | {f"block {b} feed-forward" for b in (1, 2, 3)} \
        <= set(rows)  # every block drawn, blocks 1 and 3 with nothing kept included
    assert len(set(fig.layout.yaxis.tickvals)) == len(rows) == 1 + 3 * 5 + 1
    parts = next(t for t in fig.data if t.name == "parts")
    ys = list(parts.y)
    assert len(set(ys)) == len(ys) and set(parts.x) == {9}  # at the prediction's position, one row each
    row_px = (fig.layout.height - fig.layout.margin.t - fig.layout.margin.b) / (np.diff(fig.layout.yaxis.range)[0])
    assert max(parts.marker.size) <= row_px - 1  # a node is smaller than its row: neighbours never touch
    assert [list(c) for c in parts.customdata] == [[NODE_KINDS["embed"], -1, -1], [NODE_KINDS["head"], 1, 0],
                                                   [NODE_KINDS["head"], 1, 1], [NODE_KINDS["mlp"], 2, -1]]
    assert all("click" in t for t in parts.hovertext)
    # the edges start on the stream entering the head's block, at the position read, and end on the head
    lines = [t for t in fig.data if t.mode == "lines"]
    assert [(list(t.x), list(t.y)) for t in lines] == [([3, 9], [5.5, 6.0]), ([3, 9], [5.5, 7.0])]
    lo, hi = fig.layout.yaxis.range
    assert all(lo < y < hi for t in fig.data for y in t.y)  # nothing drawn outside the axes


def test_trajectory_cells_are_wide_enough_for_their_text():
    rows = [dict(lens=k, lens_asked=k, row="embedding" if b == 0 else f"block {b}", block=b, layer=b - 1, pos=p,
                 token=" Jonathan", top1=" Jonathanson", kl_to_final=0.1 * b)
            for k in ("logit", "tuned") for b in range(3) for p in range(10)]
    fig = trajectory_heatmaps(pd.DataFrame(rows))
    assert len(fig.data) == 2 and fig.data[0].xaxis == "x" and fig.data[1].yaxis == "y2"  # one above the other
    cell_px = (fig.layout.width - fig.layout.margin.l - fig.layout.margin.r) / 10
    longest = max(len(t) for row in fig.data[0].text for t in row)
    assert longest <= 7 and fig.data[0].text[0][0] == "␣Jonat…" and fig.data[0].customdata[0][0] == "␣Jonathanson"
    assert longest * CHAR_EM * fig.data[0].textfont.size < cell_px - 8  # the text fits its cell with room


def test_a_block_without_a_steering_vector_says_so():
    df = pd.DataFrame(dict(layer=[0, 1], block=[1, 2], coeff=2.0, metric="logit difference", value=[1.0, 3.0],
                           clean=1.0, change=[0.0, 2.0], vector_norm=[0.0, 5.0], added_norm=[0.0, 10.0],
                           stream_norm=[4.0, 20.0]))
    assert zero_vector_blocks(df) == [1]
    fig = steering_layers_figure(df)
    assert list(fig.data[0].text) == ["vector = 0", ""] and "embedding" in fig.data[0].customdata[0][4]
    assert isinstance(fig, go.Figure)


def test_repeated_names_finds_the_second_occurrence_from_tokens_alone():
    toks = ["Z", "or", "bin", " Pl", "ax", " came", ".", " The", " boat", ".", " The", " Z", "or", "bin", " left"]
    df = repeated_names(toks)
    second = df[(df["occurrence"] == 2) & (df["piece"] == 0)]
    assert second["pos"].tolist() == [11] and second["name"].tolist() == ["Zorbin"]  # " The" is one token: no name
    assert df[df["name"] == "Zorbin"]["pos"].tolist() == [0, 1, 2, 11, 12, 13]
    assert repeated_names([" a", " b"]).empty and list(repeated_names([]).columns) == ["name", "occurrence", "piece",
                                                                                      "pos", "token"]
