"""Feature pages of a cross-layer transcoder's features (sprout_interp.features.pages over
``CrossLayerTranscoder.layer_features``) on a seeded random CLT of a tiny saved model with a tokenizer: where a
feature of layer i fires is its layer's encoder and JumpReLU run by hand in float64 on each held-out window alone
(a full forward each), and what it promotes is the float64 ranking of its decoder rows to every layer it writes to,
summed, times W_U."""
from __future__ import annotations

import pytest
import torch
from conftest import pinned_threads

import sprout_interp as si
from sprout_interp.circuits.local_replacement import random_clt
from sprout_interp.core.errors import SproutError
from sprout_interp.features.clt import CLTLayer
from sprout_interp.features.labels import decoder_directions
from sprout_interp.features.metrics import held_out_tokens
from sprout_interp.features.pages import (
    index_transcoder_features,
    transcoder_feature_summary,
    transcoder_promoted,
    vocabulary_strings,
)

pytestmark = pytest.mark.unit

LAYER, N, LENGTH = 1, 5, 24  # unequal windows are not possible here: held-out windows all have LENGTH tokens


@pytest.fixture(scope="module")
def setup(tiny_checkpoint):
    before = torch.get_num_threads()
    torch.set_num_threads(pinned_threads())
    m = si.load(str(tiny_checkpoint))
    clt = random_clt(m, d_transcoder=40, density=0.15, seed=3)
    index = index_transcoder_features(m, clt.layer_features(LAYER), n=N, length=LENGTH, batch=2)
    yield m, clt, index
    torch.set_num_threads(before)


@torch.no_grad()
def by_hand(m, clt, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 JumpReLU activations (N, LENGTH, d_transcoder), float64 pre-activations minus thresholds), each
    held-out window run alone through the whole model."""
    toks = held_out_tokens(m, n=N, length=LENGTH)
    acts, gaps = [], []
    for w in range(toks.shape[0]):
        _, cache = m.run_with_cache(toks[w:w + 1], names_filter=f"blocks.{layer}.ln2.hook_normalized")
        x = cache[f"blocks.{layer}.ln2.hook_normalized"][0].double() * m.blocks[layer].ln2.w.double()
        pre = x @ clt.W_enc[layer].double().T + clt.b_enc[layer].double()
        thr = clt.threshold[layer].double()
        acts.append(torch.where(pre > thr, pre, torch.zeros_like(pre)))
        gaps.append(pre - thr)
    return torch.stack(acts), torch.stack(gaps)


def test_the_index_is_the_jumprelu_of_each_window_alone(setup):
    m, clt, index = setup
    want, gaps = by_hand(m, clt, LAYER)
    clear = gaps.abs() > 1e-3  # a cell this far from its threshold is cut alike in float32 and float64
    assert float(clear.double().mean()) > 0.99
    assert index.d_sae == clt.d_transcoder and index.hook_name == f"blocks.{LAYER}.ln2.hook_normalized"
    assert torch.equal(index.tokens, held_out_tokens(m, n=N, length=LENGTH))
    got = torch.zeros(*index.tokens.shape, clt.d_transcoder).scatter_add_(-1, index.idx, index.vals)
    assert torch.equal((got != 0)[clear], (want != 0)[clear])
    assert torch.allclose(got.double()[clear], want[clear], atol=1e-5)
    # padded to the most active features at any token; the padding is value 0 (not firing)
    n_active = (want != 0).sum(-1)
    assert index.vals.shape[-1] == int(n_active.max()) and int(n_active.min()) < int(n_active.max())
    assert int((index.vals != 0).sum()) == int((got != 0).sum())
    sure = clear.all(0).all(0)  # the features with no cell near their threshold
    assert int(sure.sum()) >= clt.d_transcoder // 2
    assert torch.allclose(index.density()[sure].double(), (want > 0).double().mean((0, 1))[sure])


def test_a_page_fires_where_the_hand_loop_does_and_promotes_the_summed_decoder(setup):
    m, clt, index = setup
    want, gaps = by_hand(m, clt, LAYER)
    sure = (gaps.abs() > 1e-3).all(0).all(0)  # no cell of the feature near its threshold
    f = int(((want > 0).sum((0, 1)) * sure).argmax())  # of those, the one that fires most often
    page = transcoder_feature_summary(m, clt.layer_features(LAYER), f, index, n_contexts=3, n_tokens=5)
    a = want[..., f]
    assert page.layer == LAYER and page.feature == f
    assert page.frequency == pytest.approx(float((a > 0).double().mean()))
    assert page.max_activation == pytest.approx(float(a.max()), abs=1e-5)
    assert page.mean_activation == pytest.approx(float(a[a > 0].mean()), abs=1e-5)
    s, p = divmod(int(a.flatten().argmax()), a.shape[1])
    top = page.contexts.iloc[0]
    assert (top["seq"], top["pos"]) == (s, p)
    # promoted: sum_j W_dec[i][f, j] @ W_U in float64, written out over j; the top 5 separated by a margin
    direction = sum(clt.W_dec[LAYER][f, j].double() for j in range(m.cfg.n_layers - LAYER)).detach()
    effect = direction @ m.W_U.double().detach()
    vals, ids = effect.topk(6)
    assert float((vals[:-1] - vals[1:]).min()) > 1e-3 * float(vals[0])  # no near-tie decides the first five's order
    assert list(page.promoted["token"].head(5)) == [vocabulary_strings(m)[i] for i in ids[:5].tolist()]
    assert list(page.promoted["logit"].head(5)) == pytest.approx(vals[:5].tolist(), rel=1e-4, abs=0)


def test_promoted_tokens_of_several_layers_and_the_labels_direction(setup):
    m, clt, _ = setup
    pairs = [(0, 7), (LAYER, 3), (m.cfg.n_layers - 1, 11)]
    got = transcoder_promoted(m, clt, pairs, n=3)
    assert [(int(r.layer), int(r.feature)) for r in got.itertuples()] == pairs
    for (layer, f), promoted in zip(pairs, got["promoted"]):
        direction = sum(clt.W_dec[layer][f, j].double() for j in range(m.cfg.n_layers - layer)).detach()
        vals, ids = (direction @ m.W_U.double().detach()).topk(4)
        assert float((vals[:-1] - vals[1:]).min()) > 1e-3 * float(vals[0])
        assert promoted == [vocabulary_strings(m)[i] for i in ids[:3].tolist()]
        # the feature labels read the same direction (one home: CrossLayerTranscoder.summed_decoder)
        assert torch.allclose(decoder_directions(clt, layer, [f])[0].double(), direction, rtol=1e-5, atol=0)


def test_a_layer_view_and_bad_arguments(setup):
    m, clt, _ = setup
    view = clt.layer_features(LAYER)
    assert isinstance(view, CLTLayer) and (view.layer, view.d_transcoder, view.d_model) == (LAYER, 40, m.cfg.d_model)
    assert torch.equal(view.W_dec, clt.W_dec[LAYER].sum(1))
    with pytest.raises(SproutError, match="layer"):
        clt.layer_features(m.cfg.n_layers)
    with pytest.raises(SproutError, match="layer"):
        clt.layer_features(True)
    with pytest.raises(SproutError, match=r"0\.\.39"):
        transcoder_feature_summary(m, view, 40)
    with pytest.raises(SproutError, match=r"0\.\.39"):
        transcoder_promoted(m, clt, [(0, 40)])
