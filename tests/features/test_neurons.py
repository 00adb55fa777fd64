"""Neuron pages, neuron attribution and neuron ablation (sprout_interp.features.neurons) against independent
computations: the chapter's own model code (tests/fixtures/course_model.py) with the feed-forward's hidden units read
or zeroed by hand, TransformerLens's own ``ActivationCache.stack_neuron_results`` + ``logit_attrs``, and loops
written out here."""
from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

import sprout_interp as si
from sprout_interp.circuits.metrics import LogitDiff
from sprout_interp.core.errors import SproutError
from sprout_interp.features import neurons as N

pytestmark = pytest.mark.unit

TEXT = "Mr. Zorbin Plax walked in. Everyone looked at Mr. Zorbin"
TEXTS = ["The cat sat on the mat, and the dog sat on the rug.", "She said that", "Once upon a time there was a king"]


@pytest.fixture(scope="module")
def chapter_gpt4(course, gpt4):
    """The shipped gpt-4's weights in the chapter's own GPT class."""
    theirs = course.GPT(course.Config(**asdict(gpt4.cfg.sprout)))
    theirs.load_state_dict(gpt4.model.state_dict())
    return theirs.eval()


@pytest.fixture(scope="module")
def index2(gpt4):
    """Layer 2's neurons on a small held-out sample (8 windows of 64 tokens)."""
    return N.index_neurons(gpt4, 2, n=8, length=64)


def _chapter_hidden(gpt, idx, layer, zero=None, means=None):
    """The chapter's forward written out: block ``layer``'s SwiGLU hidden units silu(x W1) * (x W3), and the
    logits; ``zero`` (neuron indices) set to 0, or to ``means`` when given, before W2 reads them."""
    T = idx.shape[1]
    cos, sin = gpt.cos[:T], gpt.sin[:T]
    x = gpt.embed(idx)
    hidden = None
    for i, blk in enumerate(gpt.blocks):
        x = x + blk.attn(blk.norm1(x), cos, sin)
        h = blk.norm2(x)
        u = F.silu(blk.ffn.w1(h)) * blk.ffn.w3(h)
        if i == layer:
            hidden = u.clone()
            if zero is not None:
                u[..., zero] = 0.0 if means is None else means
        x = x + blk.ffn.w2(u)
    return hidden, gpt.head(gpt.norm(x)), x


@torch.no_grad()
def test_the_index_holds_the_chapter_models_hidden_units(gpt4, chapter_gpt4, index2):
    want, _, _ = _chapter_hidden(chapter_gpt4, index2.tokens, 2)
    torch.testing.assert_close(index2.acts, want, atol=2e-5, rtol=1e-4)
    assert index2.acts.shape == (8, 64, gpt4.cfg.d_mlp) and index2.block == 3 and index2.hook_name == "blocks.2.mlp.hook_post"
    # texts of different lengths: padding is masked out and reads 0
    idx = N.index_neurons(gpt4, 0, TEXTS)
    assert idx.mask is not None and idx.n_tokens == int(idx.mask.sum())
    assert (idx.acts[~idx.mask] == 0).all()
    for row, text in enumerate(TEXTS):
        ids = gpt4.to_tokens(text)
        h, _, _ = _chapter_hidden(chapter_gpt4, ids, 0)
        torch.testing.assert_close(idx.acts[row, : ids.shape[1]], h[0], atol=2e-5, rtol=1e-4)


@torch.no_grad()
def test_one_neuron_on_one_text_is_its_column_of_the_chapter_models_hidden_units(gpt4, chapter_gpt4):
    df = N.neuron_on_text(gpt4, TEXT, 3, 77)
    h, _, _ = _chapter_hidden(chapter_gpt4, gpt4.to_tokens(TEXT), 3)
    torch.testing.assert_close(torch.tensor(df["activation"].to_numpy(), dtype=torch.float32), h[0, :, 77], atol=2e-5, rtol=1e-4)
    assert df["pos"].tolist() == list(range(len(df))) and df["token"].tolist() == gpt4.to_str_tokens(TEXT)
    assert df.attrs["block"] == 4 and df.attrs["notice"] is None


@torch.no_grad()
def test_neuron_attribution_is_tl_stack_neuron_results_through_logit_attrs_and_sums_to_each_feed_forward(gpt4):
    a, w = gpt4.to_single_token(" Pl"), gpt4.to_single_token(" the")
    ours = N.neuron_attribution(gpt4, TEXT, " Pl", " the", top=None).sort_values(["layer", "neuron"])
    toks = gpt4.to_tokens(TEXT)
    _, cache = gpt4.run_with_cache(toks)
    stack, labels = cache.stack_neuron_results(layer=gpt4.cfg.n_layers, pos_slice=-1, return_labels=True)
    tl = cache.logit_attrs(stack, a, w, pos_slice=-1)[:, 0]
    assert labels[:2] == ["L0N0", "L0N1"] and len(labels) == len(ours)
    torch.testing.assert_close(torch.tensor(ours["attribution"].to_numpy(), dtype=torch.float32), tl, atol=1e-5, rtol=0)
    # every neuron's rows of a layer sum to that feed-forward's direct logit attribution; all parts to the logit diff
    by_head = si.direct_logit_attribution(gpt4, TEXT, " Pl", " the", by="head")
    mlp = by_head[by_head.kind == "mlp"].set_index("layer")["attribution"]
    sums = ours.groupby("layer")["attribution"].sum()
    torch.testing.assert_close(torch.tensor(sums.to_numpy()), torch.tensor(mlp.to_numpy()), atol=1e-4, rtol=0)
    assert ours.attrs["neurons_total"] == pytest.approx(float(mlp.sum()), abs=1e-4)
    assert ours.attrs["total"] == pytest.approx(ours.attrs["logit_diff"], abs=1e-3)
    full = si.direct_logit_attribution(gpt4, TEXT, " Pl", " the", by="neuron")
    assert set(full["kind"]) == {"embed", "head", "neuron"} and full["attribution"].sum() == pytest.approx(
        full.attrs["logit_diff"], abs=1e-3)
    assert (full.loc[full.kind != "neuron", "neuron"] == -1).all() and full.loc[full.kind != "neuron", "activation"].isna().all()


@torch.no_grad()
def test_one_neurons_attribution_is_its_write_removed_from_the_chapter_models_final_stream(gpt4, chapter_gpt4):
    """The direct effect written out: the final stream without the neuron's write, read through the same norm scale."""
    toks = gpt4.to_tokens(TEXT)
    a, w = gpt4.to_single_token(" Pl"), gpt4.to_single_token(" the")
    top = N.neuron_attribution(gpt4, TEXT, " Pl", " the", top=3)
    assert top["attribution"].abs().is_monotonic_decreasing
    gpt = chapter_gpt4
    for r in top.itertuples():
        hidden, logits, x = _chapter_hidden(gpt, toks, r.layer)
        final = x[0, -1]
        scale = torch.rsqrt(final.pow(2).mean() + gpt.norm.eps)
        write = hidden[0, -1, r.neuron] * gpt.blocks[r.layer].ffn.w2.weight[:, r.neuron]
        U = gpt.head.weight * gpt.norm.weight  # (vocab, d_model): the final gain folded in
        d = U[a] - U[w]
        assert float(hidden[0, -1, r.neuron]) == pytest.approx(r.activation, abs=1e-4)
        assert float(write * scale @ d) == pytest.approx(r.attribution, abs=1e-4)
        # and the promoted tokens are those W_out[n] @ W_U raises most, as the activation's sign applies it
        eff = gpt.blocks[r.layer].ffn.w2.weight[:, r.neuron] @ U.T * (1 if r.activation >= 0 else -1)
        names = [repr(gpt4.to_string([i])) for i in eff.topk(3).indices.tolist()]
        assert r.promotes == ", ".join(names)


@torch.no_grad()
def test_logit_effects_are_w_out_through_the_chapter_models_unembedding(gpt4, chapter_gpt4):
    U = chapter_gpt4.head.weight * chapter_gpt4.norm.weight
    for layer, n in [(0, 0), (3, 17), (2, 511)]:
        want = chapter_gpt4.blocks[layer].ffn.w2.weight[:, n] @ U.T
        torch.testing.assert_close(N.neuron_logit_effects(gpt4, layer, n), want, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_zero_and_mean_ablation_are_the_chapter_models_loss_with_the_unit_set_by_hand(gpt4, chapter_gpt4, index2):
    toks = gpt4.to_tokens(TEXT)

    def loss(logits):
        return float(F.cross_entropy(logits[0, :-1], toks[0, 1:]))

    _, clean, _ = _chapter_hidden(chapter_gpt4, toks, 2)
    _, zeroed, _ = _chapter_hidden(chapter_gpt4, toks, 2, zero=[5, 40])
    got = N.ablate_neurons(gpt4, TEXT, [(2, 5), (2, 40)])
    assert got.loc[0, "metric"] == "loss"
    assert got.loc[0, "clean"] == pytest.approx(loss(clean), abs=1e-4)
    assert got.loc[0, "ablated"] == pytest.approx(loss(zeroed), abs=1e-4)
    assert got.loc[0, "change"] == pytest.approx(loss(zeroed) - loss(clean), abs=1e-4)
    assert got.loc[0, "neurons"] == "block 3 neuron 5 (layer 2), block 3 neuron 40 (layer 2)"
    # mean ablation: the means over the reference's tokens, computed by hand on the chapter's model
    ref = index2.tokens
    hidden, _, _ = _chapter_hidden(chapter_gpt4, ref, 2)
    means = hidden.reshape(-1, hidden.shape[-1]).mean(0)
    _, meaned, _ = _chapter_hidden(chapter_gpt4, toks, 2, zero=[5, 40], means=means[[5, 40]])
    got = N.ablate_neurons(gpt4, TEXT, [(2, 5), (2, 40)], kind="mean", reference=ref)
    assert got.loc[0, "ablated"] == pytest.approx(loss(meaned), abs=1e-4)
    torch.testing.assert_close(N.neuron_means(gpt4, [2], ref)[2], means, atol=1e-5, rtol=1e-4)
    # the per-token changes add up to the mean change
    assert float(got.attrs["per_token"].sum()) / (toks.shape[1] - 1) == pytest.approx(got.loc[0, "change"], abs=1e-5)
    # one prediction's logit difference, as the chapter's model gives it with the units zeroed
    a, w = gpt4.to_single_token(" Pl"), gpt4.to_single_token(" the")
    got = N.ablate_neurons(gpt4, TEXT, [(2, 5), (2, 40)], metric=LogitDiff(a, w, pos=-1))
    assert got.loc[0, "metric"] == "logit difference"
    assert got.loc[0, "clean"] == pytest.approx(float(clean[0, -1, a] - clean[0, -1, w]), abs=1e-4)
    assert got.loc[0, "ablated"] == pytest.approx(float(zeroed[0, -1, a] - zeroed[0, -1, w]), abs=1e-4)


@torch.no_grad()
def test_several_metrics_come_from_one_pair_of_forwards_as_each_alone(gpt4):
    """A list of metrics gives one row per metric, each what that metric alone gives (the dashboard's neuron page
    reads the loss and one prediction's logit difference from one clean and one ablated forward)."""
    a, w = gpt4.to_single_token(" Pl"), gpt4.to_single_token(" the")
    pair = LogitDiff(a, w, pos=-1)
    for kind in ("zero", "mean"):
        both = N.ablate_neurons(gpt4, TEXT, [(2, 5), (1, 40)], kind=kind, metric=["loss", pair])
        alone = [N.ablate_neurons(gpt4, TEXT, [(2, 5), (1, 40)], kind=kind, metric=mt) for mt in ("loss", pair)]
        assert list(both["metric"]) == ["loss", "logit difference"]
        for i, one in enumerate(alone):
            for col in ("clean", "ablated", "change"):
                assert both.loc[i, col] == pytest.approx(one.loc[0, col], abs=1e-6)
        torch.testing.assert_close(both.attrs["per_token"], alone[0].attrs["per_token"])
    with pytest.raises(SproutError, match="empty list"):
        N.ablate_neurons(gpt4, TEXT, [(2, 5)], metric=[])


@torch.no_grad()
def test_ablating_on_a_padded_batch_reads_only_the_real_targets(gpt4):
    batch = N.ablate_neurons(gpt4, TEXTS, [(1, 3)])
    per_text = [N.ablate_neurons(gpt4, t, [(1, 3)]) for t in TEXTS]
    n = [len(gpt4.to_tokens(t)[0]) - 1 for t in TEXTS]
    want = sum(r.loc[0, "change"] * k for r, k in zip(per_text, n)) / sum(n)
    assert batch.loc[0, "change"] == pytest.approx(want, abs=1e-5)


@torch.no_grad()
def test_a_neuron_page_agrees_with_its_activations(gpt4, index2):
    tab = N.neuron_table(index2)
    n = int(tab.sort_values("selectivity", ascending=False)["neuron"].iloc[0])
    page = N.neuron_summary(gpt4, 2, n, index2, n_contexts=5)
    acts = index2.acts[..., n]
    assert page.max_activation == pytest.approx(float(acts.max())) and page.min_activation == pytest.approx(float(acts.min()))
    assert page.mean_activation == pytest.approx(float(acts.mean()), abs=1e-6)
    assert page.positive_share == pytest.approx(float((acts > 0).float().mean()))
    assert page.frequency == pytest.approx(float((acts > N.FIRE_AT * acts.max()).float().mean()))
    # contexts: the 5 largest activations in order, each the activation at its (seq, pos), the centre its token
    want = acts.flatten().topk(5).values.tolist()
    assert page.contexts["activation"].tolist() == pytest.approx(want)
    for r in page.contexts.itertuples():
        assert float(acts[r.seq, r.pos]) == pytest.approx(r.activation)
        assert r.acts[r.center] == pytest.approx(r.activation)
        assert r.tokens[r.center] == index2.token_strings[int(index2.tokens[r.seq, r.pos])] == r.token
    neg = page.negative_contexts["activation"].tolist()
    assert neg == pytest.approx(acts.flatten().topk(len(neg), largest=False).values.tolist()) and all(v < 0 for v in neg)
    assert int(page.histogram["count"].sum()) == acts.numel()
    eff = N.neuron_logit_effects(gpt4, 2, n)
    assert page.promoted["logit"].iloc[0] == pytest.approx(float(eff.max()))
    assert page.suppressed["logit"].iloc[0] == pytest.approx(float(eff.min()))
    # the table's row for this neuron says the same
    row = tab.set_index("neuron").loc[n]
    assert row["max_act"] == pytest.approx(page.max_activation) and row["frequency"] == pytest.approx(page.frequency)
    assert row["selectivity"] == pytest.approx((page.max_activation - page.mean_activation) / page.std_activation, rel=1e-4)


@torch.no_grad()
def test_padding_never_appears_on_a_page(gpt4):
    idx = N.index_neurons(gpt4, 1, TEXTS)
    for n in range(0, gpt4.cfg.d_mlp, 37):
        page = N.neuron_summary(gpt4, 1, n, idx, n_contexts=40, after=40)
        for df in (page.contexts, page.negative_contexts):
            for r in df.itertuples():
                assert bool(idx.mask[r.seq, r.pos])
                assert r.pos - r.center + len(r.tokens) <= int(idx.mask[r.seq].sum())
        assert int(page.histogram["count"].sum()) == idx.n_tokens


@torch.no_grad()
def test_neurons_for_a_token_rank_by_the_z_score_computed_by_hand(gpt4, index2):
    tok = int(torch.mode(index2.tokens.flatten()).values)  # the sample's most common token
    got = N.neurons_for_token(index2, tok, n=5)
    a = index2.acts.reshape(-1, index2.d_mlp)
    on = index2.acts[index2.tokens == tok].mean(0)
    z = (on - a.mean(0)) / a.std(0)
    assert got["neuron"].tolist() == z.topk(5).indices.tolist()
    assert got["z"].tolist() == pytest.approx(z.topk(5).values.tolist(), rel=1e-5)
    assert got["occurrences"].iloc[0] == int((index2.tokens == tok).sum())
    absent = next(i for i in range(gpt4.cfg.d_vocab) if not (index2.tokens == i).any())
    assert N.neurons_for_token(index2, absent, n=3).empty
    with pytest.raises(SproutError, match="pass model"):
        N.neurons_for_token(index2, " the")


@pytest.mark.unchecked_types
def test_refusals_say_what_to_pick(gpt4, index2):
    with pytest.raises(SproutError, match=r"0\.\.3"):
        N.index_neurons(gpt4, 4)
    with pytest.raises(SproutError, match=r"0\.\.511"):
        N.neuron_summary(gpt4, 2, 512, index2)
    with pytest.raises(SproutError, match="built for layer 2"):
        N.neuron_summary(gpt4, 1, 0, index2)
    with pytest.raises(SproutError, match=r"\(layer, neuron\)"):
        N.ablate_neurons(gpt4, TEXT, [3])
    with pytest.raises(SproutError, match="no neurons"):
        N.ablate_neurons(gpt4, TEXT, [])
    with pytest.raises(SproutError, match="kind"):
        N.ablate_neurons(gpt4, TEXT, [(0, 1)], kind="resample")
    with pytest.raises(SproutError, match="'neuron'"):
        si.direct_logit_attribution(gpt4, TEXT, " Pl", by="neurons")
