"""Activation steering (sprout_interp.behaviour.steering) against the chapter's own model code with the vector added
by hand, the fast path against the loop of hooked forwards, and the shipped Sprout steered by a she/he contrast."""
from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

import sprout_interp as si
from sprout_interp.behaviour import steering as st
from sprout_interp.circuits.metrics import LogitDiff, LogProb, MetricError

pytestmark = pytest.mark.unit

POS = ["She said that", "She was tired, and", "Then she told them that", "She looked at the door and"]
NEG = ["He said that", "He was tired, and", "Then he told them that", "He looked at the door and"]
PROMPT = "When the doctor came in, the nurse said that"


@pytest.fixture(scope="module")
def chapter_gpt4(course, gpt4):
    """The shipped gpt-4's weights in the chapter's own GPT class."""
    theirs = course.GPT(course.Config(**asdict(gpt4.cfg.sprout)))
    theirs.load_state_dict(gpt4.model.state_dict())
    return theirs.eval()


def _chapter_streams(gpt, idx):
    """The stream entering each block and leaving the last, from the chapter's forward written out."""
    T = idx.shape[1]
    x = gpt.embed(idx)
    out = []
    for blk in gpt.blocks:
        out.append(x)
        x = blk(x, gpt.cos[:T], gpt.sin[:T])
    return out + [x]


def _chapter_steered_logits(gpt, idx, vector, layer, coeff, site="resid_pre", positions=None):
    """The chapter's forward with ``coeff * vector`` added by hand entering (or leaving) block ``layer``."""
    T = idx.shape[1]
    add = torch.zeros(T, vector.shape[0])
    add[slice(None) if positions is None else positions] = coeff * vector
    x = gpt.embed(idx)
    for i, blk in enumerate(gpt.blocks):
        if i == layer and site == "resid_pre":
            x = x + add
        x = blk(x, gpt.cos[:T], gpt.sin[:T])
        if i == layer and site == "resid_post":
            x = x + add
    return gpt.head(gpt.norm(x))


def _last_real(texts, m):
    return [m.to_tokens(t)[0] for t in texts]


@torch.no_grad()
def test_the_vector_is_the_difference_of_the_chapter_models_streams_at_the_last_real_token(gpt4, chapter_gpt4):
    for layer in range(gpt4.cfg.n_layers):
        want = []
        for texts in (POS, NEG):
            rows = [_chapter_streams(chapter_gpt4, ids[None])[layer][0, -1] for ids in _last_real(texts, gpt4)]
            want.append(torch.stack(rows).mean(0))
        got = st.steering_vector(gpt4, POS, NEG, layer)  # the lists are right-padded: padding must not be read
        torch.testing.assert_close(got, want[0] - want[1], atol=1e-5, rtol=1e-5)
    # resid_post of the last block is the stream the final norm reads; "mean" averages over the real tokens
    L = gpt4.cfg.n_layers
    ids = gpt4.to_tokens(PROMPT)
    s = _chapter_streams(chapter_gpt4, ids)
    got = st.steering_vector(gpt4, PROMPT, ids[:, :3], L - 1, site="resid_post", read="mean")
    torch.testing.assert_close(got, s[L][0].mean(0) - s[L][0, :3].mean(0), atol=1e-5, rtol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("site", ["resid_pre", "resid_post"])
def test_effect_equals_the_chapter_model_with_the_vector_added_by_hand(gpt4, chapter_gpt4, site):
    she, he = gpt4.to_single_token(" she"), gpt4.to_single_token(" he")
    ids = gpt4.to_tokens(PROMPT)
    T = ids.shape[1]
    for layer in range(gpt4.cfg.n_layers):
        v = st.steering_vector(gpt4, POS, NEG, layer, site=site)
        coeffs = [-3.0, 0.5, 2.0]
        for metric, value in [
            (LogitDiff(she, he), lambda lg: float(lg[0, -1, she] - lg[0, -1, he])),
            ("loss", lambda lg: float(F.cross_entropy(lg[0, :-1], ids[0, 1:]))),
        ]:
            want = [value(_chapter_steered_logits(chapter_gpt4, ids, v, layer, c, site)) for c in coeffs]
            for method in ("fast", "naive"):
                df = st.steering_effect(gpt4, PROMPT, v, layer, coeffs, metric, site=site, method=method)
                assert df.attrs["method"] == method and df.attrs["block"] == layer + 1
                assert df["value"].tolist() == pytest.approx(want, abs=2e-4), (site, layer, method)
                assert df["clean"].iloc[0] == pytest.approx(value(chapter_gpt4(ids)[0]), abs=2e-4)
                assert df["change"].tolist() == pytest.approx((df["value"] - df["clean"]).tolist())
        # only at chosen positions: the chapter model with the vector added there alone
        pos = [2, T - 1]
        want = _chapter_steered_logits(chapter_gpt4, ids, v, layer, 4.0, site, pos)
        df = st.steering_effect(gpt4, ids, v, layer, [4.0], LogProb(she), site=site, positions=pos)
        assert df["value"].iloc[0] == pytest.approx(float(F.log_softmax(want[0, -1], -1)[she]), abs=2e-4)


@torch.no_grad()
def test_fast_equals_naive_on_a_padded_batch_with_every_metric_kind(gpt4):
    texts = [PROMPT, "The old man and the sea", "Once upon a time there was a"]
    v = st.steering_vector(gpt4, POS, NEG, 2)
    she = gpt4.to_single_token(" she")
    metrics = ["loss", LogProb(she), LogitDiff(she, gpt4.to_single_token(" he"))]
    for metric in metrics:
        a = st.steering_effect(gpt4, texts, v, 2, (-2.0, 0.0, 3.0), metric, method="fast")
        b = st.steering_effect(gpt4, texts, v, 2, (-2.0, 0.0, 3.0), metric, method="naive")
        assert a["value"].tolist() == pytest.approx(b["value"].tolist(), abs=1e-4)
        assert a.loc[a["coeff"] == 0, "change"].item() == pytest.approx(0.0, abs=1e-5)
        # a coefficient of 0 adds nothing: it is the unsteered value itself, in both methods (not a second run)
        assert a.loc[a["coeff"] == 0, "change"].item() == 0.0 and b.loc[b["coeff"] == 0, "change"].item() == 0.0
    # a function of the logits would see the padding (logits[:, -1] is padding in the shorter rows): refused
    for method in ("fast", "naive"):
        with pytest.raises(MetricError, match="padded logits"):
            st.steering_effect(gpt4, texts, v, 2, (1.0,), lambda logits: float(logits[:, -1].logsumexp(-1).mean()),
                               method=method)
    ids = gpt4.to_tokens(texts[0])  # one text: the function metric runs, fast equal to naive
    fn = lambda logits: float(logits[:, -1].logsumexp(-1).mean())  # noqa: E731
    a = st.steering_effect(gpt4, ids, v, 2, (-2.0, 3.0), fn, method="fast")
    b = st.steering_effect(gpt4, ids, v, 2, (-2.0, 3.0), fn, method="naive")
    assert a["value"].tolist() == pytest.approx(b["value"].tolist(), abs=1e-4)
    # more coefficients than one forward takes: split into groups, still the same numbers
    many = [float(c) for c in range(-10, 11)]
    a = st.steering_effect(gpt4, texts * 30, v, 2, many, "loss")
    b = st.steering_effect(gpt4, texts * 30, v, 2, many[::5], "loss", method="naive")
    assert a.set_index("coeff").loc[many[::5], "value"].tolist() == pytest.approx(b["value"].tolist(), abs=1e-4)


@torch.no_grad()
def test_steered_context_adds_the_vector_to_every_forward_and_is_removed_after(gpt4, chapter_gpt4):
    ids = gpt4.to_tokens(PROMPT)
    v = st.steering_vector(gpt4, POS, NEG, 1)
    clean = gpt4(ids)
    with st.steered(gpt4, v, 1, 3.0) as m:
        assert m is gpt4
        torch.testing.assert_close(gpt4(ids), _chapter_steered_logits(chapter_gpt4, ids, v, 1, 3.0), atol=1e-4, rtol=1e-4)
        # the toolkit's own functions see the steered model: the fast path falls back to the honoured loop
        df = st.steering_effect(gpt4, ids, v, 1, [0.0], "loss")
        assert df.attrs["method"] == "naive"
        steered_loss = float(F.cross_entropy(_chapter_steered_logits(chapter_gpt4, ids, v, 1, 3.0)[0, :-1], ids[0, 1:]))
        assert df["value"].iloc[0] == pytest.approx(steered_loss, abs=2e-4)
    torch.testing.assert_close(gpt4(ids), clean)
    with pytest.raises(RuntimeError):
        with st.steered(gpt4, v, 1, 3.0):
            raise RuntimeError("inside")
    torch.testing.assert_close(gpt4(ids), clean)  # removed on an error too


@torch.no_grad()
def test_generations_share_one_seed_and_follow_the_steered_argmax(gpt4, chapter_gpt4):
    v = st.steering_vector(gpt4, POS, NEG, 2)
    df = st.steered_generations(gpt4, PROMPT, v, 2, coeffs=(0.0, 6.0), max_new_tokens=8, seed=3)
    assert df["coeff"].tolist() == [0.0, 6.0] and df.attrs["block"] == 3
    plain = gpt4.generate(PROMPT, max_new_tokens=8, seed=3)
    assert PROMPT + df["continuation"].iloc[0] == plain  # coefficient 0 is the model's own sample
    # near-zero temperature: the first new token is the argmax of the chapter model steered by hand
    ids = gpt4.to_tokens(PROMPT)
    g = st.steered_generations(gpt4, PROMPT, v, 2, coeffs=(-6.0, 6.0), max_new_tokens=1, temperature=0.0)
    for c, text in zip(g["coeff"], g["continuation"]):
        first = int(_chapter_steered_logits(chapter_gpt4, ids, v, 2, c)[0, -1].argmax())
        assert text == gpt4.to_string([first])


@torch.no_grad()
def test_a_she_he_contrast_steers_the_shipped_sprout_towards_she_and_back():
    m = si.load("sprout")
    she, he = m.to_single_token(" she"), m.to_single_token(" he")
    layers = st.steering_layers(m, POS, NEG, PROMPT, coeff=2.0, metric=LogitDiff(she, he))
    assert layers["layer"].tolist() == list(range(8)) and layers["block"].tolist() == list(range(1, 9))
    for l in (0, 5):  # steering_layers is steering_effect of each layer's own vector
        v = st.steering_vector(m, POS, NEG, l)
        one = st.steering_effect(m, PROMPT, v, l, [2.0], LogitDiff(she, he))
        assert layers.loc[l, "value"] == pytest.approx(one["value"].item(), abs=1e-5)
        assert layers.loc[l, "vector_norm"] == pytest.approx(float(v.norm()), rel=1e-5)
    late = layers[layers["layer"] >= 4]
    assert (late["change"] > 0.5).all(), layers  # from block 5 on, the contrast moves " she" over " he"
    v = st.steering_vector(m, POS, NEG, 5)
    eff = st.steering_effect(m, PROMPT, v, 5, (-4.0, -2.0, 0.0, 2.0, 4.0), LogitDiff(she, he))
    assert eff["value"].is_monotonic_increasing, eff  # more of the vector, more " she"; minus it, more " he"
    assert eff["value"].iloc[0] < eff["clean"].iloc[0] - 0.5 < eff["clean"].iloc[0] + 0.5 < eff["value"].iloc[-1]


@pytest.mark.unchecked_types
def test_refusals_say_what_is_wrong(gpt4):
    v = st.steering_vector(gpt4, POS, NEG, 0)
    cases = [
        (lambda: st.steering_vector(gpt4, POS, NEG, 4), "layer=4"),
        (lambda: st.steering_vector(gpt4, POS, NEG, 0, site="attn_out"), "residual stream"),
        (lambda: st.steering_vector(gpt4, POS, NEG, 0, read="first"), "read="),
        (lambda: st.steering_effect(gpt4, PROMPT, v[:10], 0), r"shape \(192,\)"),
        (lambda: st.steering_effect(gpt4, PROMPT, v * float("nan"), 0), "NaN"),
        (lambda: st.steering_effect(gpt4, PROMPT, v, 0, []), "one or more"),
        (lambda: st.steering_effect(gpt4, PROMPT, v, 0, ["a"]), "numbers"),
        (lambda: st.steering_effect(gpt4, PROMPT, v, 0, positions=[99]), "outside the input"),
        (lambda: st.steering_effect(gpt4, PROMPT, v, 0, method="slow"), "method="),
        (lambda: st.steering_layers(gpt4, POS, NEG, PROMPT, layers=[]), "layers is empty"),
        (lambda: st.steered_generations(gpt4, "", v, 0), "prompt"),
        (lambda: st.steered(gpt4, v, 0, positions=[-1]).__enter__(), "count from 0"),
    ]
    for call, words in cases:
        with pytest.raises(si.SteeringError, match=words):
            call()


def test_figures_draw_the_tables_and_say_their_convention(hooked):
    from sprout_interp.plots.steering import steering_effect_figure, steering_layers_figure

    torch.manual_seed(0)
    pos, neg, text = torch.randint(0, 64, (3, 6)), torch.randint(0, 64, (3, 6)), torch.randint(0, 64, (1, 10))
    layers = st.steering_layers(hooked, pos, neg, text, coeff=3.0)
    fig = steering_layers_figure(layers)
    assert list(fig.data[0].y) == pytest.approx(layers["change"].tolist())
    assert list(fig.data[0].x) == ["block 1", "block 2"] and "counted from 1" in fig.layout.xaxis.title.text
    v = st.steering_vector(hooked, pos, neg, 1)
    eff = st.steering_effect(hooked, text, v, 1, (-1, 0, 1), LogProb(5))
    loss = st.steering_effect(hooked, text, v, 1, (-1, 0, 1), "loss")
    fig = steering_effect_figure(eff, loss)
    assert [list(t.y) for t in fig.data] == [pytest.approx(eff["value"].tolist()), pytest.approx(loss["value"].tolist())]
    assert fig.data[1].yaxis == "y2" and "block 2" in fig.layout.title.text
    assert len(steering_effect_figure(eff).data) == 1


@torch.no_grad()
def test_controls_are_seeded_random_pushes_of_the_vectors_size(hooked):
    torch.manual_seed(1)
    pos, neg, text = torch.randint(0, 64, (3, 6)), torch.randint(0, 64, (3, 6)), torch.randint(0, 64, (2, 9))
    v = st.steering_vector(hooked, pos, neg, 0)
    df = st.steering_controls(hooked, text, v, 0, coeff=2.0, n=5, seed=7)
    assert df["kind"].tolist() == ["steering"] + ["random"] * 5 and df["draw"].tolist() == [-1, 0, 1, 2, 3, 4]
    assert df["added_norm"].tolist() == pytest.approx([2.0 * float(v.norm())] * 6, rel=1e-5)
    assert df["value"].iloc[0] == pytest.approx(st.steering_effect(hooked, text, v, 0, [2.0])["value"].item())
    gen = torch.Generator().manual_seed(7)
    d = torch.randn(5, v.shape[0], generator=gen, dtype=torch.float64)[3]
    d = (d / d.norm() * float(v.norm())).float()
    assert df["value"].iloc[4] == pytest.approx(st.steering_effect(hooked, text, d, 0, [2.0])["value"].item(), abs=1e-6)
    again = st.steering_controls(hooked, text, v, 0, coeff=2.0, n=5, seed=7)
    assert again["value"].tolist() == df["value"].tolist()
    assert df.attrs["random_abs_change_max"] == pytest.approx(df["change"].iloc[1:].abs().max())
    with pytest.raises(si.SteeringError, match="at least one"):
        st.steering_controls(hooked, text, v, 0, n=0)


@torch.no_grad()
def test_the_she_he_vector_moves_sprout_far_more_than_random_pushes_of_its_size():
    m = si.load("sprout")
    metric = LogitDiff(m.to_single_token(" she"), m.to_single_token(" he"))
    v = st.steering_vector(m, POS, NEG, 5)
    prompts = [PROMPT, "The teacher looked up and said that", "After a long silence the stranger said that"]
    df = st.steering_controls(m, prompts, v, 5, coeff=2.0, metric=metric, n=8)
    # each prompt read at its own last token (the shorter prompts' padding was read before): 5.4 vs at most 1.9
    assert df["change"].iloc[0] > 2.5 * df.attrs["random_abs_change_max"], df


@torch.no_grad()
def test_a_float64_model_is_steered_in_float64(tiny_model):
    m = si.HookedSprout(tiny_model.double())
    torch.manual_seed(2)
    pos, neg, text = torch.randint(0, 64, (2, 5)), torch.randint(0, 64, (2, 5)), torch.randint(0, 64, (1, 12))
    v = st.steering_vector(m, pos, neg, 1, site="resid_post")
    assert v.dtype == torch.float64
    a = st.steering_effect(m, text, v, 1, (-3.0, 2.0), LogProb(7), site="resid_post")
    b = st.steering_effect(m, text, v, 1, (-3.0, 2.0), LogProb(7), site="resid_post", method="naive")
    assert a["value"].tolist() == pytest.approx(b["value"].tolist(), abs=1e-12)
