"""The head / ablation / comparison figures carry the right data (not pixels)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from sprout_interp.plots.heads import (
    block_label,
    compare_models_figure,
    head_grid,
    head_scores_figure,
    head_scores_heatmap,
    name_copying_figure,
    pattern_figure,
    sweep_heatmap,
)


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
    assert list(fig.data[0].x) == ["0:a", "1: b", "2:↵", "3:␣"]
    assert "block 2 (layer 1), head 2" in fig.layout.title.text
    fig2 = pattern_figure(p[0, 0], ["a", "b", "c", "d"])
    np.testing.assert_allclose(np.array(fig2.data[0].z), p[0, 0].numpy(), rtol=1e-6)
    with pytest.raises(ValueError):
        pattern_figure(p, ["a"] * 4)


def test_compare_and_name_figures_data():
    df = pd.DataFrame(dict(position=[1, 2], context=["a", "b"], token=["b", "c"], m1=[0.1, 0.2], m2=[0.3, 0.9]))
    df.attrs["models"] = ["m1", "m2"]
    fig = compare_models_figure(df)
    assert [t.name for t in fig.data] == ["m1", "m2"]
    assert list(fig.data[1].y) == [0.3, 0.9] and list(fig.data[0].x) == ["1:b", "2:c"]
    t = pd.DataFrame(dict(model=["a", "a", "b", "b"], name=["N", "N", "N", "N"], occurrence=[1, 2, 1, 2],
                          index=[1, 1, 1, 1], token=["x", "x", "x", "x"], prob=[0.1, 0.2, 0.3, 0.4]))
    fig = name_copying_figure(t)
    assert [list(tr.y) for tr in fig.data] == [[0.2], [0.4]]
