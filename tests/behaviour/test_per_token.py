"""Per-token tables of the actual next token (what the dashboard's ablation page reads), and their figures."""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
import pytest
import torch
import torch.nn.functional as F

from sprout_interp import HookedSprout
from sprout_interp.behaviour.per_token import ablation_effect, next_token_table
from sprout_interp.circuits.ablation import ablate
from sprout_interp.core.errors import AblationError, ContextLengthError
from sprout_interp.lens.residual import residual_rms
from sprout_interp.plots import rms_position_chart, token_change_chart

pytestmark = pytest.mark.unit


@pytest.fixture
def hooked(tiny_model):
    with torch.no_grad():
        for b in tiny_model.blocks:  # make the heads matter
            b.attn.proj.weight.mul_(20.0)
    return HookedSprout(tiny_model)


TOKS = torch.tensor([[5, 9, 2, 33, 7, 1, 4, 8, 5, 9]])


def test_next_token_table_matches_the_plain_loss(hooked):
    df = next_token_table(hooked, TOKS)
    with torch.no_grad():
        logits = hooked.model(TOKS)[0]
    loss = F.cross_entropy(logits[0, :-1], TOKS[0, 1:], reduction="none")
    assert list(df["pos"]) == list(range(1, 10))
    torch.testing.assert_close(torch.tensor(df["loss"].to_numpy()), loss, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(df["prob"].to_numpy()), torch.softmax(logits[0, :-1], -1)
                               .gather(-1, TOKS[0, 1:, None])[:, 0], atol=1e-6, rtol=0)
    assert math.isclose(df.attrs["mean_loss"], float(loss.mean()), abs_tol=1e-5)
    assert list(df["context"]) == [f"#{i}" for i in TOKS[0, :-1].tolist()]  # no tokenizer: ids


def test_ablation_effect_equals_ablate(hooked):
    heads = [(0, 1), (1, 0)]
    df = ablation_effect(hooked, TOKS, heads, kind="zero")
    res = ablate(hooked, TOKS, heads, kind="zero")
    torch.testing.assert_close(torch.tensor(df["ablated_loss"].to_numpy()), res.loss[0], atol=1e-5, rtol=0)
    assert (df["prob_change"] - (df["ablated_prob"] - df["clean_prob"])).abs().max() < 1e-7
    assert (df["loss_change"] - (df["ablated_loss"] - df["clean_loss"])).abs().max() < 1e-6
    assert df["prob_change"].abs().max() > 1e-3  # the heads matter in this model
    assert math.isclose(df.attrs["ablated_loss"], res.mean_loss, abs_tol=1e-5)
    assert df.attrs["heads"] == heads and df.attrs["kind"] == "zero"
    assert not any(hp._forward_hooks for hp in hooked.hook_dict.values())  # nothing left behind


def test_ablation_effect_errors(hooked):
    with pytest.raises(AblationError):
        ablation_effect(hooked, TOKS, [(5, 0)])
    with pytest.raises(AblationError):
        ablation_effect(hooked, TOKS, [])
    with pytest.raises(ContextLengthError):
        next_token_table(hooked, TOKS[:, :1])


def test_token_change_chart(hooked):
    df = ablation_effect(hooked, TOKS, [(0, 0)])
    fig = token_change_chart(df, positions=[2, 3, 4])
    assert isinstance(fig, go.Figure) and len(fig.data[0].x) == 3
    assert list(fig.data[0].y) == list(df[df["pos"].isin([2, 3, 4])]["prob_change"])
    colors = fig.data[0].marker.color
    assert all((c == "#d62728") == (v < 0) for c, v in zip(colors, fig.data[0].y))


def test_rms_position_chart(hooked):
    pp = residual_rms(hooked, TOKS, per_position=True)
    fig = rms_position_chart(pp, blocks=[0, 2], tokens=[f"t{i}" for i in range(10)])
    assert [t.name for t in fig.data] == ["embedding", "block 2"]
    want = pp[pp["block"] == 2].sort_values("pos")["rms"].to_numpy()
    assert list(fig.data[1].y) == list(want) and fig.layout.yaxis.type == "log"
    assert isinstance(pp, pd.DataFrame)
