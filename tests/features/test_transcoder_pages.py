"""Transcoder feature pages (sprout_interp.features.pages: index_transcoder_features, transcoder_feature_summary,
transcoder_promoted) on the shipped gpt-4 and its transcoders, against the transcoder run by hand on a full forward:
the index holds its k active features at every token, a page's top context is the feature's largest activation
there, and the promoted tokens are the top of W_dec[f] @ W_U; bad features and transcoders are refused by name."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import sprout_interp as si
from sprout_interp.core import loading
from sprout_interp.core.errors import SproutError
from sprout_interp.features.metrics import held_out_tokens
from sprout_interp.features.pages import index_transcoder_features, transcoder_feature_summary, transcoder_promoted
from sprout_interp.features.transcoder import input_hook, load_transcoders, mlp_input

pytestmark = [
    pytest.mark.acceptance,  # the held-out sample and two models load in about 13 s
    pytest.mark.skipif(not (Path(loading.SHIPPED_DIR) / "gpt-4" / "transcoders").is_dir(),
                       reason="the shipped gpt-4 transcoders are not installed"),
]


@pytest.fixture(scope="module")
def setup():
    m = si.load("gpt-4")
    ts = load_transcoders(m)
    return m, ts, index_transcoder_features(m, ts[2], n=6, length=48)


def test_the_index_holds_each_tokens_active_features(setup):
    m, ts, index = setup
    tc = ts[2]
    toks = held_out_tokens(m, n=6, length=48)
    _, cache = m.run_with_cache(toks, names_filter=input_hook(2))  # a full forward, not stopped at the layer
    dense = tc.encode(mlp_input(m, 2, cache[input_hook(2)])).float()
    assert torch.equal(index.tokens, toks.cpu()) and index.d_sae == tc.d_transcoder
    assert index.hook_name == "blocks.2.ln2.hook_normalized"
    got = torch.zeros_like(dense).scatter_(-1, index.idx, index.vals)
    assert torch.allclose(got, dense, atol=1e-5)
    assert int((dense != 0).sum(-1).max()) == tc.k


def test_a_page_shows_where_the_feature_fires_most_and_what_it_promotes(setup):
    m, ts, index = setup
    tc = ts[2]
    acts = torch.zeros(index.tokens.shape + (tc.d_transcoder,)).scatter_(-1, index.idx, index.vals)
    f = int(acts.amax((0, 1)).argmax())  # the feature with the largest activation in the sample
    page = transcoder_feature_summary(m, tc, f, index, n_contexts=3)
    assert page.layer == 2 and page.block == 3 and page.feature == f
    a = acts[..., f]
    assert page.max_activation == pytest.approx(float(a.max()))
    assert page.frequency == pytest.approx(float((a > 0).float().mean()))
    top = page.contexts.iloc[0]
    s, p = divmod(int(a.flatten().argmax()), a.shape[1])
    assert (top["seq"], top["pos"]) == (s, p) and top["activation"] == pytest.approx(float(a.max()))
    effect = tc.W_dec[f].float() @ m.W_U.float()
    want = list(m.to_str_tokens(effect.topk(5).indices.cpu()))
    assert list(page.promoted["token"].head(5)) == want
    assert list(page.promoted["logit"].head(1)) == pytest.approx([float(effect.max().detach())], rel=1e-4)
    promoted = transcoder_promoted(m, ts, [(2, f), (0, 5)], n=3)
    assert list(promoted["feature"]) == [f, 5] and promoted["promoted"].iloc[0] == want[:3]


@pytest.mark.parametrize("feature", [True, -1, 10 ** 6])  # (a float or a string: the type hint, checked in tests)
def test_a_feature_that_is_not_one_is_refused_with_the_range(setup, feature):
    m, ts, index = setup
    with pytest.raises(SproutError, match=r"pick one of 0\.\.\d+"):
        transcoder_feature_summary(m, ts[2], feature, index)


def test_features_of_layers_and_widths_that_do_not_exist_are_refused(setup):
    m, ts, _ = setup
    with pytest.raises(SproutError, match="not features of layer 1"):
        transcoder_promoted(m, ts, [(1, -2)])
    sprout = si.load("sprout")
    with pytest.raises(SproutError, match="does not fit"):
        index_transcoder_features(sprout, ts[0], n=1, length=8)
