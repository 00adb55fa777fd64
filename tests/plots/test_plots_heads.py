"""The head / ablation / comparison figures carry the right data (not pixels)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from sprout_interp.circuits.heads import block_label
from sprout_interp.plots.common import thinned_ticks
from sprout_interp.plots.heads import (
    all_heads_figure,
    attention_hover_html,
    compare_models_figure,
    head_grid,
    head_scores_figure,
    head_scores_heatmap,
    name_copying_figure,
    pattern_figure,
    sweep_heatmap,
)

pytestmark = pytest.mark.unit


def _scores():
    rows = [dict(layer=l, block=l + 1, head=h, induction_random=l * 0.1 + h * 0.01, prev_token_random=0.5,
                 duplicate_random=0.0) for l in range(3) for h in range(2)]
    return pd.DataFrame(rows)


def test_head_grid_and_labels():
    grid, layers, heads = head_grid(_scores(), "induction_random")
    assert layers == [0, 1, 2] and heads == [0, 1]
    np.testing.assert_allclose(grid, [[0, 0.01], [0.1, 0.11], [0.2, 0.21]])
    assert block_label(2) == "block 3 (layer 2)"
    with pytest.raises(KeyError):
        head_grid(_scores(), "nope")


def test_head_scores_heatmap_data():
    fig = head_scores_heatmap(_scores(), "induction_random")
    hm = fig.data[0]
    np.testing.assert_allclose(np.array(hm.z), [[0, 0.01], [0.1, 0.11], [0.2, 0.21]])
    assert list(hm.y) == ["block 1 (layer 0)", "block 2 (layer 1)", "block 3 (layer 2)"]
    assert list(hm.x) == ["head 0", "head 1"]
    fig = head_scores_figure(_scores())
    assert len(fig.data) == 3 and fig.data[2].name == "induction_random"


def test_sweep_heatmap_data():
    df = pd.DataFrame(dict(layer=[0, 0, 1, 1], block=[1, 1, 2, 2], head=[0, 1, 0, 1], metric="loss",
                           ablated=[3.0, 3.5, 3.1, 3.2], clean=3.0))
    df["change"] = df["ablated"] - df["clean"]
    df.attrs.update(metric="loss", kind="zero")
    fig = sweep_heatmap(df)
    np.testing.assert_allclose(np.array(fig.data[0].z), [[0.0, 0.5], [0.1, 0.2]], atol=1e-12)
    assert fig.data[0].zmid == 0 and fig.data[0].zmax == pytest.approx(0.5)
    assert "zero" in fig.layout.title.text and "loss" in fig.layout.title.text


def test_pattern_figure_data():
    p = torch.rand(2, 3, 4, 4)
    fig = pattern_figure(p, ["a", " b", "\n", " "], layer=1, head=2)
    np.testing.assert_allclose(np.array(fig.data[0].z), p[1, 2].numpy(), rtol=1e-6)
    assert list(fig.data[0].x) == ["0:a", "1:␣b", "2:↵", "3:␣"]  # a leading space drawn, not dropped
    assert "block 2 (layer 1), head 2" in fig.layout.title.text.replace("<br>", " ")  # wrapped to half a page
    fig2 = pattern_figure(p[0, 0], ["a", "b", "c", "d"])
    np.testing.assert_allclose(np.array(fig2.data[0].z), p[0, 0].numpy(), rtol=1e-6)
    with pytest.raises(ValueError):
        pattern_figure(p, ["a"] * 4)


def test_compare_and_name_figures_data():
    df = pd.DataFrame(dict(pos=[1, 2], context=["a", "b"], token=["b", "c"], m1=[0.1, 0.2], m2=[0.3, 0.9]))
    df.attrs["models"] = ["m1", "m2"]
    fig = compare_models_figure(df)
    assert [t.name for t in fig.data] == ["m1", "m2"]
    assert list(fig.data[1].y) == [0.3, 0.9] and list(fig.data[0].x) == ["1:b", "2:c"]
    t = pd.DataFrame(dict(model=["a", "a", "b", "b"], name=["N", "N", "N", "N"], occurrence=[1, 2, 1, 2],
                          index=[1, 1, 1, 1], token=["x", "x", "x", "x"], prob=[0.1, 0.2, 0.3, 0.4]))
    fig = name_copying_figure(t)
    assert [list(tr.y) for tr in fig.data] == [[0.2], [0.4]]


def _six_scores(L: int = 4, H: int = 6) -> pd.DataFrame:
    cols = ("prev_token_random", "duplicate_random", "induction_random", "prev_token_text", "duplicate_text",
            "induction_text")
    rows = [dict(layer=l, block=l + 1, head=h, **{c: 0.1 * h for c in cols}) for l in range(L) for h in range(H)]
    return pd.DataFrame(rows)


def test_head_scores_figure_labels_rows_once_per_row_of_panels():
    """The six panels' block labels are drawn only on each row's first panel (the others share its y axis), so
    no label can overlap the panel to its left; the panels' domains do not overlap either."""
    fig = head_scores_figure(_six_scores())
    assert len(fig.data) == 6
    axes = {name: fig.layout[name] for name in fig.layout if name.startswith("yaxis")}
    shown = sorted(name for name, ax in axes.items() if ax.showticklabels is not False)
    assert shown == ["yaxis", "yaxis4"]  # column 1 of row 1 and of row 2
    xs = sorted(tuple(fig.layout[n].domain) for n in fig.layout if n.startswith("xaxis"))
    for (a0, a1), (b0, b1) in zip(xs, xs[1:]):
        assert a1 <= b0 or (a0, a1) == (b0, b1)  # side by side (two rows share the same three columns)
    assert fig.layout.margin.l >= 120  # room for "block 4 (layer 3)" left of the first column


def test_all_heads_figure_draws_every_head():
    p = torch.rand(3, 4, 10, 10)
    fig = all_heads_figure(p, [f"t{i}" for i in range(10)], selected=(1, 2), n=6)
    assert len(fig.data) == 12 and all(tr.type == "heatmap" for tr in fig.data)
    assert {tr.coloraxis for tr in fig.data} == {"coloraxis"}  # one colour scale for all
    np.testing.assert_allclose(np.array(fig.data[1 * 4 + 2].z), p[1, 2, :6, :6].numpy(), rtol=1e-6)
    assert [a.text for a in fig.layout.annotations][:2] == ["block 1 head 0", "block 1 head 1"]
    assert "block 2 head 2" in fig.layout.annotations[6].text  # the chosen head, emphasised …
    (frame,) = fig.layout.shapes  # … and framed just outside its own pattern, on that pattern's axes as drawn
    assert (frame.xref, frame.yref) == ("x7 domain", "y7 domain")
    assert frame.x0 < 0 < 1 < frame.x1 and frame.y0 < 0 < 1 < frame.y1 and frame.x1 - frame.x0 < 1.1
    for i in range(1, 13):  # every pattern: its own axes at one scale across and down, and no padding around it
        sx, xa, ya = str(i) if i > 1 else "", fig.layout[f"xaxis{i if i > 1 else ''}"], fig.layout[f"yaxis{i if i > 1 else ''}"]
        assert ya.scaleanchor == f"x{sx}" and ya.scaleratio == 1 and xa.constrain == ya.constrain == "domain"
        assert tuple(xa.range) == (-0.5, 5.5) and tuple(ya.range) == (5.5, -0.5)
    # square cells at the figure's own size: the panels' pixel width equals their pixel height
    m = fig.layout.margin
    w = (fig.layout.width - m.l - m.r) * (fig.layout.xaxis.domain[1] - fig.layout.xaxis.domain[0])
    h = (fig.layout.height - m.t - m.b) * (fig.layout.yaxis.domain[1] - fig.layout.yaxis.domain[0])
    assert w == pytest.approx(h, abs=1.0)
    with pytest.raises(ValueError):
        all_heads_figure(p[0], ["a"] * 10)


def test_attention_hover_html_keeps_tokens_literal():
    p = torch.tensor([[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.1, 0.2, 0.7]])
    hostile = ["</script><script>alert(1)</script>", " <b>x</b>", "&amp;"]
    page = attention_hover_html(p, hostile, title="<i>t</i>", element_id="x\"><img")
    script = page.split("<script>", 1)[1]
    assert "</script>" in script and script.count("</script>") == 1  # only the closing tag of our own script
    assert "<b>" not in page and "<img" not in page and "<i>" not in page
    assert '"pattern": [[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.1, 0.2, 0.7]]' in page
    assert 'id="ximg"' in page and "textContent" in page and "innerHTML" not in page
    assert "http" not in page  # nothing to fetch: it works offline
    with pytest.raises(ValueError):
        attention_hover_html(torch.rand(2, 3), ["a", "b"])


def test_models_get_distinct_colours_and_thinned_labels():
    df = pd.DataFrame({"pos": range(1, 61), "context": "c", "token": [f"w{i}" for i in range(60)],
                       "a": 0.1, "b": 0.2, "c": 0.3})
    fig = compare_models_figure(df, models=["a", "b", "c"])
    colours = [tr.marker.color for tr in fig.data]
    assert len(set(colours)) == 3 and len({tr.marker.pattern.shape for tr in fig.data}) == 3
    ticks = fig.layout.xaxis.tickvals
    assert ticks is not None and len(ticks) <= 24 and ticks[0] == "1:w0"
    assert thinned_ticks(["a", "b"]) == {}
