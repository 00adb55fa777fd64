"""The model is coerced once, at the public edge: a public function given a plain ``sprout_model.GPT`` wraps it in
one HookedSprout and hands that wrapper to everything it calls (a second wrapper would register its hook points
again, and a user's hooks on the first would not be seen by the second)."""
from __future__ import annotations

import pytest
import torch

import sprout_interp as si
from sprout_interp.behaviour.per_token import next_token_table
from sprout_interp.circuits.attention import attention_row
from sprout_interp.circuits.metrics import LogitDiff
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.lens.residual import stream_rms

pytestmark = pytest.mark.unit

TOKS = torch.tensor([[5, 9, 3, 7, 5, 9, 3, 7, 2, 4, 6, 8]])
CLEAN, CORRUPT = TOKS[0], torch.tensor([5, 9, 3, 7, 11, 9, 3, 7, 2, 4, 6, 8])

CALLS = {
    "ablation_sweep": lambda g: si.ablation_sweep(g, TOKS),
    "attribution_sweep": lambda g: si.attribution_sweep(g, TOKS),
    "ablate": lambda g: si.ablate(g, TOKS, [(0, 1)]),
    "attention_patterns": lambda g: si.attention_patterns(g, TOKS),
    "attention_row": lambda g: attention_row(g, TOKS[0], 1, 0),
    "head_scores": lambda g: si.head_scores(g, seq_len=8, batch=2, natural=False, copying=False),
    "direct_logit_attribution": lambda g: si.direct_logit_attribution(g, TOKS[0], 5, 9),
    "head_token_effects": lambda g: si.head_token_effects(g, TOKS[0], 1, 0),
    "composition_table": lambda g: si.composition_table(g, samples=2),
    "ov_copying_scores": lambda g: si.ov_copying_scores(g),
    "logit_lens": lambda g: si.logit_lens(g, TOKS),
    "residual_rms": lambda g: si.residual_rms(g, TOKS),
    "stream_rms": lambda g: stream_rms(g, TOKS),
    "steering_vector": lambda g: si.steering_vector(g, TOKS, CORRUPT[None], 1),
    "steering_effect": lambda g: si.steering_effect(g, TOKS, torch.ones(16), 1, coeffs=(0.0, 1.0)),
    "block_knockout": lambda g: si.block_knockout(g, TOKS),
    "next_token_table": lambda g: next_token_table(g, TOKS),
    "activation_patch": lambda g: si.patching.activation_patch(g, CLEAN, CORRUPT, LogitDiff(5, 9)),
    "attribution_patch": lambda g: si.patching.attribution_patch(g, CLEAN, CORRUPT, LogitDiff(5, 9)),
    "path_patch": lambda g: si.patching.path_patch(g, CLEAN, CORRUPT, LogitDiff(5, 9), [(1, 0, "k")]),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_a_plain_gpt_is_wrapped_once(name, tiny_model, monkeypatch):
    made = []
    init = HookedSprout.__init__

    def counting(self, *a, **k):
        made.append(1)
        init(self, *a, **k)

    monkeypatch.setattr(HookedSprout, "__init__", counting)
    CALLS[name](tiny_model)
    assert len(made) == 1, f"{name} wrapped the GPT {len(made)} times"
