"""Attention patterns, head scores and the induction circuit, on tiny random models and hand-made patterns."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from sprout_model import GPT
from sprout_model.evaluation import repeated_tokens_batch
from sprout_interp import HookedSprout
from sprout_interp.attention import (
    SCORE_COLUMNS,
    attention_patterns,
    find_induction_circuit,
    head_scores,
    pattern_scores,
    score_masks,
)
from sprout_interp.errors import AblationError

from conftest import tiny_config

CHECKPOINTS = Path(__file__).resolve().parents[1] / "model" / "checkpoints"


@pytest.fixture(scope="module")
def hooked() -> HookedSprout:
    torch.manual_seed(0)
    return HookedSprout(GPT(tiny_config(n_layer=3, n_head=2)).eval())


def _forced(hooked, make):
    """Hooks replacing every block's pattern with ``make(T)`` (query, key)."""
    def hook(pattern, hook):
        T = pattern.shape[-1]
        return make(T).to(pattern.dtype).expand_as(pattern).clone()

    return [(f"blocks.{l}.attn.hook_pattern", hook) for l in range(hooked.cfg.n_layers)]


def _prev_token(T):
    p = torch.zeros(T, T)
    p[0, 0] = 1.0
    p[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    return p


def _induction(n):
    def make(T):
        p = torch.eye(T)  # first copy: attend to itself
        for q in range(n, T):
            p[q] = 0.0
            p[q, q - n + 1] = 1.0  # the token after the earlier copy of token q
        return p

    return make


UNIQUE_REPEATED = torch.arange(1, 9).repeat(2)[None].repeat(3, 1)  # (3, 16): 8 distinct tokens, twice


def test_score_masks_by_hand():
    toks = torch.tensor([[5, 6, 5, 6, 7]])
    m = score_masks(toks)
    assert m["prev_token"][0].nonzero().tolist() == [[1, 0], [2, 1], [3, 2], [4, 3]]
    assert m["duplicate"][0].nonzero().tolist() == [[2, 0], [3, 1]]
    assert m["induction"][0].nonzero().tolist() == [[2, 1], [3, 2]]  # after the earlier 5 is 6; after the earlier 6 is 5
    pad = score_masks(toks, torch.tensor([[True, True, True, False, False]]))
    assert pad["duplicate"][0].nonzero().tolist() == [[2, 0]]


def test_previous_token_pattern_scores_one(hooked):
    with hooked.hooks(fwd_hooks=_forced(hooked, _prev_token)):
        s = pattern_scores(hooked, UNIQUE_REPEATED)
    assert torch.allclose(s["prev_token"], torch.ones(3, 2))
    assert torch.allclose(s["induction"], torch.zeros(3, 2))
    assert torch.allclose(s["duplicate"], torch.zeros(3, 2))


def test_induction_pattern_scores_one(hooked):
    with hooked.hooks(fwd_hooks=_forced(hooked, _induction(8))):
        s = pattern_scores(hooked, UNIQUE_REPEATED)
    assert torch.allclose(s["induction"], torch.ones(3, 2))
    assert torch.allclose(s["duplicate"], torch.zeros(3, 2))
    assert torch.allclose(s["prev_token"], torch.zeros(3, 2))


def test_duplicate_pattern_scores_one(hooked):
    def dup(T):
        p = torch.eye(T)
        for q in range(8, T):
            p[q] = 0.0
            p[q, q - 8] = 1.0
        return p

    with hooked.hooks(fwd_hooks=_forced(hooked, dup)):
        s = pattern_scores(hooked, UNIQUE_REPEATED)
    assert torch.allclose(s["duplicate"], torch.ones(3, 2))
    assert torch.allclose(s["induction"], torch.zeros(3, 2))


def test_pattern_scores_batching_does_not_matter(hooked):
    toks = repeated_tokens_batch(64, 8, batch=5, seed=3)
    a = pattern_scores(hooked, toks, batch_size=2)
    b = pattern_scores(hooked, toks, batch_size=16)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0)


def test_attention_patterns_shapes_and_padding(hooked):
    toks = torch.randint(1, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    one = attention_patterns(hooked, toks[0])
    assert one.shape == (3, 2, 10, 10)
    torch.testing.assert_close(one.sum(-1), torch.ones(3, 2, 10), atol=1e-5, rtol=0)
    assert torch.all(one.triu(1) == 0)
    _, cache = hooked.run_with_cache(toks[:1])
    torch.testing.assert_close(one[1], cache["blocks.1.attn.hook_pattern"][0], atol=1e-6, rtol=0)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 6:] = False
    both = attention_patterns(hooked, toks, attention_mask=mask)
    assert [p.shape for p in both] == [(3, 2, 10, 10), (3, 2, 6, 6)]
    torch.testing.assert_close(both[1], attention_patterns(hooked, toks[1, :6]), atol=1e-6, rtol=0)
    sub = attention_patterns(hooked, toks[0], layers=[2, 0])
    torch.testing.assert_close(sub, one[[2, 0]])
    with pytest.raises(AblationError, match="layers 0..2 in code"):
        attention_patterns(hooked, toks[0], layers=[3])


def test_head_scores_table(hooked):
    natural = torch.randint(1, 64, (3, 20), generator=torch.Generator().manual_seed(1))
    df = head_scores(hooked, seq_len=8, batch=4, natural=natural)
    assert list(df.columns) == ["layer", "block", "head", *SCORE_COLUMNS, "copying_ratio_ablated", "copying_ratio_change"]
    assert len(df) == 6 and (df["block"] == df["layer"] + 1).all()
    assert ((df[list(SCORE_COLUMNS)] >= 0) & (df[list(SCORE_COLUMNS)] <= 1 + 1e-6)).all().all()
    assert "0-indexed" in df.attrs["convention"] and df.attrs["clean_copying_ratio"] > 0
    s = pattern_scores(hooked, natural)
    assert df["induction_text"].to_numpy() == pytest.approx(s["induction"].flatten().numpy(), abs=1e-6)
    lean = head_scores(hooked, seq_len=8, batch=4, natural=False, copying=False)
    assert list(lean.columns) == ["layer", "block", "head", "prev_token_random", "duplicate_random", "induction_random"]
    with pytest.raises(AblationError, match="context"):
        head_scores(hooked, seq_len=20)


def _table(prev, ind):
    rows = []
    for l in range(len(prev)):
        for h in range(len(prev[0])):
            rows.append(dict(layer=l, block=l + 1, head=h, prev_token_random=prev[l][h], induction_random=ind[l][h]))
    return pd.DataFrame(rows)


def test_find_induction_circuit_from_scores():
    df = _table(prev=[[0.1, 0.2], [0.9, 0.1], [0.2, 0.1], [0.1, 0.0]], ind=[[0, 0], [0.1, 0], [0.05, 0.8], [0.3, 0]])
    c = find_induction_circuit(scores=df)
    assert (c.prev_layer, c.prev_head, c.induction_layer, c.induction_head) == (1, 0, 2, 1)
    assert (c.prev_block, c.induction_block) == (2, 3)  # the chapter's "layer 2" and "layer 3"
    assert c.prev_earlier and c.found and c.heads() == [(1, 0), (2, 1)]
    assert "block 2 head 0" in c.summary() and "blocks.1" in c.summary()
    # the best previous-token head sits after the induction head: say so, and name the best earlier one
    df2 = _table(prev=[[0.5, 0.2], [0.1, 0.1], [0.95, 0.1]], ind=[[0, 0], [0.7, 0], [0.1, 0]])
    c2 = find_induction_circuit(scores=df2)
    assert not c2.prev_earlier and (c2.prev_before_layer, c2.prev_before_head) == (0, 0) and c2.found
    assert "NOT in an earlier block" in c2.summary()
    # a one-block model cannot have the circuit
    c3 = find_induction_circuit(scores=_table(prev=[[0.9, 0.1]], ind=[[0.5, 0.1]]))
    assert not c3.found and c3.prev_before_layer is None
    assert c3.as_dict()["induction_block"] == 1


def test_find_induction_circuit_runs_on_a_model(hooked):
    c = find_induction_circuit(hooked, seq_len=8, batch=4)
    assert 0 <= c.prev_layer < 3 and 0 <= c.induction_layer < 3 and c.scores_on == "random"
    with pytest.raises(AblationError):
        find_induction_circuit(hooked, on="bogus")


@pytest.mark.integration
@pytest.mark.parametrize("name", ["gpt-1", "gpt-4", "sprout"])
def test_shipped_head_scores(name):
    if not (CHECKPOINTS / name / "model.safetensors").is_file():
        pytest.skip(f"model/checkpoints/{name}/model.safetensors is not there yet")
    import sprout_interp as si
    from sprout_interp.texts import TEXTS

    m = si.load(name)
    df = head_scores(m, seq_len=32, batch=4, natural=list(TEXTS.values()), copying=False)
    assert len(df) == m.cfg.n_layers * m.cfg.n_heads
    assert ((df[list(SCORE_COLUMNS)] >= 0) & (df[list(SCORE_COLUMNS)] <= 1 + 1e-5)).all().all()
    pats = attention_patterns(m, TEXTS["story"])
    torch.testing.assert_close(pats.sum(-1), torch.ones(pats.shape[:-1]), atol=1e-4, rtol=0)
    c = find_induction_circuit(scores=df)
    assert c.model == name or c.model
