"""The lens and residual figures, tested for their data (not their pixels)."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from sprout_interp.core.hooked import HookedSprout
from sprout_interp.lens.logit_lens import CHAPTER_SPROUT_CONFIDENCE, logit_lens
from sprout_interp.lens.residual import CHAPTER_GPT4_RMS, residual_rms
from sprout_interp.plots import layer_metrics_chart, logit_lens_grid, rms_growth_chart, save_figure, show_token

pytestmark = pytest.mark.unit


def to_str(ids):
    return [f"t{i}" for i in ids]


@pytest.fixture
def lens(tiny_model):
    toks = torch.tensor([[5, 9, 2, 33, 7, 1, 4, 8], [3, 3, 60, 12, 0, 0, 0, 0]])
    mask = torch.tensor([[True] * 8, [True] * 4 + [False] * 4])
    return logit_lens(HookedSprout(tiny_model), toks, attention_mask=mask)


def test_show_token():
    assert show_token("\n\n") == "↵↵" and show_token(" ") == "␣" and show_token(" the") == "␣the"
    assert show_token("  x ") == "␣␣x " and show_token(" Jonathan", 6) == "␣Jona…"
    assert show_token("<|endoftext|>") == "&lt;|endoftext|&gt;"


def test_grid_cells(lens):
    fig = logit_lens_grid(lens, to_str)
    assert isinstance(fig, go.Figure)
    hm = fig.data[0]
    assert isinstance(hm, go.Heatmap)
    z = torch.tensor(hm.z)
    torch.testing.assert_close(z, lens.topk_probs[:, 0, :, 0], atol=1e-7, rtol=0)  # rows × positions
    assert [list(r) for r in hm.text] == [[f"t{i}" for i in row] for row in lens.topk_ids[:, 0, :, 0].tolist()]
    assert list(fig.layout.yaxis.ticktext) == ["embedding", "block 1", "block 2"]
    assert list(fig.layout.xaxis.ticktext) == [f"t{i}" for i in lens.tokens[0].tolist()]
    assert (hm.zmin, hm.zmax) == (0.0, 1.0)


def test_grid_frames_mark_the_actual_next_token(lens):
    fig = logit_lens_grid(lens, to_str)
    correct = lens.top1_correct[:, 0]
    frames = {(round((s.x0 + s.x1) / 2), round((s.y0 + s.y1) / 2)) for s in fig.layout.shapes}
    want = {(p, r) for r, p in correct.nonzero().tolist()}
    assert frames == want and len(fig.layout.shapes) == int(correct.sum())


def test_grid_frames_on_a_forced_match(lens):
    lens.topk_ids[2, 0, 3, 0] = lens.tokens[0, 4]  # make block 2 at position 3 "right"
    fig = logit_lens_grid(lens, to_str)
    assert any(s.x0 == 2.5 and s.y0 == 1.5 for s in fig.layout.shapes)


def test_grid_hover_lists_the_top_k(lens):
    fig = logit_lens_grid(lens, to_str)
    cell = fig.data[0].customdata[1][2]  # block 1, position 2
    for j in range(5):
        tid = int(lens.topk_ids[1, 0, 2, j])
        assert f"{j + 1}. 't{tid}' {float(lens.topk_probs[1, 0, 2, j]):.1%}" in cell
    assert "actual next 't33'" in cell and "block 1" in cell


def test_grid_padding_and_positions(lens):
    fig = logit_lens_grid(lens, to_str, batch=1)
    assert len(fig.data[0].z[0]) == 4  # padding left out
    assert "no next token" in fig.data[0].customdata[0][3]
    fig = logit_lens_grid(lens, None, positions=[2, 3])
    assert list(fig.layout.xaxis.ticktext) == ["#2", "#33"]
    torch.testing.assert_close(torch.tensor(fig.data[0].z), lens.topk_probs[:, 0, 2:4, 0], atol=1e-7, rtol=0)


def _summaries(lens):
    parts = []
    for model, scale in (("a", 1.0), ("b", 0.5)):
        for text_set in ("texts", "held-out"):
            s = lens.summary()
            s["confidence"] *= scale
            s.insert(0, "text_set", text_set)
            s.insert(0, "model", model)
            parts.append(s)
    return pd.concat(parts, ignore_index=True)


def test_layer_metrics_chart(lens):
    summary = _summaries(lens)
    fig = layer_metrics_chart(summary, chapter=CHAPTER_SPROUT_CONFIDENCE)
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert len(lines) == 4 * 3  # (model, text set) × metrics
    first = [t for t in lines if t.name == "b · held-out"]
    assert [t.xaxis for t in first] == ["x", "x2", "x3"]
    sub = summary[(summary["model"] == "b") & (summary["text_set"] == "held-out")]
    assert list(first[0].y) == pytest.approx(sub["confidence"].tolist())
    assert list(first[2].y) == pytest.approx(sub["kl_final"].tolist())
    assert list(first[0].x) == [0, 1, 2]
    chapter = [t for t in fig.data if t.mode == "markers+text"]
    assert len(chapter) == 1 and list(chapter[0].x) == [7, 8] and list(chapter[0].y) == [0.77, 0.59]
    assert fig.layout.yaxis.range == (0, 1)
    # the same model keeps its colour in every panel; the text set sets the dash
    assert len({t.line.color for t in lines if t.name.startswith("a ")}) == 1
    assert {t.line.dash for t in lines} == {"solid", "dash"}


def test_rms_growth_chart(tiny_model):
    toks = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    rms = residual_rms(tiny_model, toks)
    rms.insert(0, "model", "tiny")
    fig = rms_growth_chart(rms, chapter=CHAPTER_GPT4_RMS)
    assert fig.layout.yaxis.type == "log"
    line = fig.data[0]
    assert list(line.x) == [0, 1, 2] and list(line.y) == pytest.approx(rms["rms"].tolist())
    assert fig.data[1].name.startswith("chapter") and list(fig.data[1].y) == [0.18, 10.0, 35.0]
    assert rms_growth_chart(rms, log_y=False).layout.yaxis.type == "linear"


def test_save_figure(tmp_path):
    fig = go.Figure(go.Scatter(x=[0, 1], y=[1, 2]))
    written, note = save_figure(fig, tmp_path / "sub" / "fig", png=False)
    assert written == [tmp_path / "sub" / "fig.html"] and note is None
    assert "plotly.min.js" in written[0].read_text() and (tmp_path / "sub" / "plotly.min.js").is_file()
    written, note = save_figure(fig, tmp_path / "fig2", png=True)
    assert (tmp_path / "fig2.png").is_file() if note is None else note.startswith("PNG skipped")


def test_grid_clickable_cells(lens):
    fig = logit_lens_grid(lens, to_str, positions=[1, 2, 3], clickable=True, selected=(2, 1))
    assert isinstance(fig.data[0], go.Heatmap)  # the grid stays the first trace
    cells = fig.data[1]
    assert len(cells.x) == 3 * lens.n_rows
    assert [list(c) for c in cells.customdata[:3]] == [[1, 0], [2, 0], [3, 0]]  # [position, row]
    (i,) = cells.selectedpoints
    assert list(cells.customdata[i]) == [2, 1] and (cells.x[i], cells.y[i]) == (1, 1)
    assert cells.marker.opacity == 0.0 and cells.selected.marker.opacity == 1.0
    assert cells.hovertext[i] == fig.data[0].customdata[1][1]  # same hover as the heat-map cell


def test_log_axis_labels_only_round_values():
    """Decades only when the data spans two or more (no "5, 2, 10, 5, 2, 1" minor labels); 1-2-5 when it spans
    less; the other multiples are unlabelled minor ticks."""
    from sprout_interp.plots.lens import log_axis

    wide = log_axis([0.18, 3.0, 35.0, 410.0])
    assert wide["type"] == "log" and wide["ticktext"] == ["0.1", "1", "10", "100", "1000"]
    assert 2 * 10.0 ** -1 in wide["minor"]["tickvals"] and "ticktext" not in wide["minor"]
    narrow = log_axis([2.5, 7.0])
    assert narrow["ticktext"] == ["1", "2", "5", "10", "20", "50"]
    fig = rms_growth_chart(pd.DataFrame({"model": "m", "row": ["embedding", "block 1"], "block": [0, 1],
                                         "layer": [-1, 0], "rms": [0.5, 40.0]}), dash=None)
    assert list(fig.layout.yaxis.ticktext) == ["0.1", "1", "10", "100"]


def test_figures_html_is_one_offline_page():
    from sprout_interp.plots.common import figures_html

    figs = [("first <one>", go.Figure(go.Scatter(x=[0, 1], y=[1, 2]))), ("second", go.Figure(go.Bar(x=[1], y=[2])))]
    page = figures_html(figs, title="a & b")
    assert page.count("Plotly.newPlot") == 2
    assert page.count("* plotly.js v") == 1  # plotly.js inline, once for all the figures
    assert "<script src=" not in page and "<script type=\"text/javascript\" src=" not in page  # nothing fetched
    assert "<h2>first &lt;one&gt;</h2>" in page and "<title>a &amp; b</title>" in page
    assert '"format": "svg"' in page or '"format":"svg"' in page


def test_logit_lens_grid_cells_are_readable(tiny_model):
    toks = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    ll = logit_lens(HookedSprout(tiny_model), toks, k=3)
    fig = logit_lens_grid(ll, lambda ids: [f"tokenlongname{i}" for i in ids])
    assert fig.data[0].textfont.size == 13 and fig.layout.xaxis.tickfont.size == 13
    assert all(len(t) <= 8 for row in fig.data[0].text for t in row)  # cut to fit a cell; the hover has it whole
    assert "tokenlongname" in fig.data[0].customdata[0][0]
    assert fig.layout.width == 64 * 12 + 200  # as wide as its cells need (the page scrolls it sideways)
