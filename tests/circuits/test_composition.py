"""Composition scores: the definition by hand on a tiny model, and TransformerLens's own on the bridge."""
from __future__ import annotations

import pytest
import torch
from conftest import unchecked_types

import sprout_interp as si
from sprout_interp import HookedSprout
from sprout_interp.circuits import composition as C
from sprout_model import GPT

pytestmark = pytest.mark.unit


@pytest.fixture
def model(tiny_cfg) -> HookedSprout:
    torch.manual_seed(4)
    gpt = GPT(tiny_cfg).eval()
    with torch.no_grad():
        gpt.blocks[0].norm1.weight.uniform_(0.5, 2.0)
        gpt.blocks[1].norm1.weight.uniform_(0.5, 2.0)
    return HookedSprout(gpt)


def test_scores_follow_the_definition(model):
    W_Q, W_K, W_V, W_O = (w.detach() for w in (model.W_Q, model.W_K, model.W_V, model.W_O))
    for mode in "QKV":
        s = C.composition_scores(model, mode)
        assert s.shape == (2, 2, 2, 2)
        assert (s[1] == 0).all() and (s[0, :, 0] == 0).all()  # only earlier -> later pairs
        for h1 in range(2):
            for h2 in range(2):
                ov = W_V[0, h1] @ W_O[0, h1]
                right = {"Q": W_Q[1, h2] @ W_K[1, h2].T, "K": (W_Q[1, h2] @ W_K[1, h2].T).T,
                         "V": W_V[1, h2] @ W_O[1, h2]}[mode]
                want = (ov @ right).norm() / (ov.norm() * right.norm())
                assert float(s[0, h1, 1, h2]) == pytest.approx(float(want), rel=1e-4)


def test_table_and_baseline(model):
    t = C.composition_table(model, samples=16)
    assert len(t) == 3 * 4 and set(t["mode"]) == {"Q", "K", "V"}
    assert (t["receiver_layer"] > t["sender_layer"]).all() and (t["sender_block"] == t["sender_layer"] + 1).all()
    base = C.random_baseline(model, "K", samples=16)
    assert 0 < base < 1 and t["baseline"].iloc[0] > 0
    with unchecked_types(), pytest.raises(si.SproutError, match="mode"):
        C.composition_scores(model, "O")


@pytest.mark.acceptance  # over 10 s
def test_equal_to_transformer_lens_on_the_bridge():
    m = si.load("gpt-4")
    bridge = m.to_transformer_lens()
    for mode in "QKV":
        torch.testing.assert_close(C.composition_scores(m, mode), bridge.all_composition_scores(mode).scores,
                                   atol=1e-6, rtol=0)
