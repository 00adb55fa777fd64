"""HookedSprout: hook points, exactness, TransformerLens behaviour, tokens, errors.

Unit tests run on tiny random models (tests/conftest.py); tests marked ``integration`` run the same
identities on the shipped checkpoints and are skipped until their weights exist.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config, unchecked_types

from sprout_interp.core.errors import (
    ContextLengthError,
    HookNameError,
    SproutError,
    TokenizationError,
    VocabularyMismatchError,
)
from sprout_interp.core.hooked import HookedSprout, SproutCache, load_hooked
from sprout_model import GPT, apply_rope
from sprout_model.tokenizer import train_tokenizer

pytestmark = pytest.mark.unit

BLOCK_HOOKS = [
    "hook_resid_pre",
    "ln1.hook_scale",
    "ln1.hook_normalized",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.q_norm.hook_normalized",
    "attn.k_norm.hook_normalized",
    "attn.hook_rot_q",
    "attn.hook_rot_k",
    "attn.hook_attn_scores",
    "attn.hook_pattern",
    "attn.hook_z",
    "hook_attn_out",
    "hook_resid_mid",
    "ln2.hook_scale",
    "ln2.hook_normalized",
    "mlp.hook_pre",
    "mlp.hook_pre_linear",
    "mlp.hook_post",
    "hook_mlp_out",
    "hook_resid_post",
]
CHECKPOINTS = Path(__file__).resolve().parents[2] / "model" / "checkpoints"


def expected_hook_names(n_layers: int) -> list[str]:
    names = ["hook_embed"]
    for l in range(n_layers):
        names += [f"blocks.{l}.{h}" for h in BLOCK_HOOKS]
    return names + ["ln_final.hook_scale", "ln_final.hook_normalized"]


@pytest.fixture
def toks() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (3, 12), generator=g)


@pytest.fixture(scope="module")
def tokenizer300():
    texts = [
        "The quick brown fox jumps over the lazy dog. Zorbin Plax came home and the cat sat on the mat.",
        "Once upon a time there was a little sprout that wanted to grow into a tall tree.",
        "Tokens, embeddings, attention and feed-forward layers: the transformer, one block at a time.",
    ] * 20
    return train_tokenizer(texts, vocab_size=300)


@pytest.fixture
def worded(tokenizer300) -> HookedSprout:
    """A tiny random model whose vocabulary matches a real (tiny) byte-level BPE."""
    torch.manual_seed(0)
    return HookedSprout(GPT(tiny_config(vocab_size=300)).eval(), tokenizer=tokenizer300, name="tiny-300")


def no_hooks_left(m: HookedSprout) -> bool:
    return all(
        not (hp._forward_hooks or hp._backward_hooks or hp._forward_pre_hooks or hp.fwd_hooks or hp.bwd_hooks)
        for hp in m.hook_dict.values()
    )


# ---------------------------------------------------------------- names and shapes


def test_hook_names_are_exactly_the_documented_ones(hooked):
    assert list(hooked.hook_dict) == expected_hook_names(2)
    assert hooked.hook_names == expected_hook_names(2)


def test_hook_shapes(hooked, toks):
    B, T = toks.shape
    c = hooked.cfg
    _, cache = hooked.run_with_cache(toks)
    assert isinstance(cache, SproutCache)
    assert set(cache.keys()) == set(expected_hook_names(2))
    resid = (B, T, c.d_model)
    heads = (B, T, c.n_heads, c.d_head)
    attn = (B, c.n_heads, T, T)
    mlp = (B, T, c.d_mlp)
    shape = {
        "hook_resid_pre": resid, "ln1.hook_normalized": resid, "attn.hook_q": heads, "attn.hook_k": heads,
        "attn.hook_v": heads, "attn.q_norm.hook_normalized": heads, "attn.k_norm.hook_normalized": heads,
        "attn.hook_rot_q": heads, "attn.hook_rot_k": heads, "attn.hook_attn_scores": attn,
        "attn.hook_pattern": attn, "attn.hook_z": heads, "hook_attn_out": resid, "hook_resid_mid": resid,
        "ln2.hook_normalized": resid, "mlp.hook_pre": mlp, "mlp.hook_pre_linear": mlp, "mlp.hook_post": mlp,
        "hook_mlp_out": resid, "hook_resid_post": resid, "ln1.hook_scale": (B, T, 1), "ln2.hook_scale": (B, T, 1),
    }
    for l in range(c.n_layers):
        for h, s in shape.items():
            assert tuple(cache[f"blocks.{l}.{h}"].shape) == s, h
    assert tuple(cache["hook_embed"].shape) == resid
    assert tuple(cache["ln_final.hook_normalized"].shape) == resid
    # TransformerLens shorthand
    assert torch.equal(cache["resid_post", 1], cache["blocks.1.hook_resid_post"])
    assert torch.equal(cache["pattern", -1], cache["blocks.1.attn.hook_pattern"])


def test_cfg_and_weight_shapes(hooked, tiny_model):
    c = hooked.cfg
    assert (c.n_layers, c.n_heads, c.d_model, c.d_head, c.d_mlp, c.d_vocab, c.n_ctx) == (2, 2, 16, 8, 24, 64, 32)
    assert c.context == 32 and c.sprout is tiny_model.cfg
    assert hooked.model is tiny_model
    assert hooked.W_E.shape == (64, 16) and hooked.W_U.shape == (16, 64)
    # TransformerLens's fold_ln: the final norm's gain is folded into the (tied) unembedding
    torch.testing.assert_close(hooked.W_U, hooked.W_E.T * tiny_model.norm.weight[:, None], atol=0, rtol=0)
    assert torch.equal(hooked.W_U, hooked.unembed.W_U) and not hooked.b_U.any()
    for W in (hooked.W_Q, hooked.W_K, hooked.W_V):
        assert W.shape == (2, 2, 16, 8)
    assert hooked.W_O.shape == (2, 2, 8, 16)
    assert hooked.W_gate.shape == hooked.W_in.shape == (2, 16, 24)
    assert hooked.W_out.shape == (2, 24, 16)
    assert hooked.OV.shape == (2, 2, 16, 16)
    # the wrapper owns no weights of its own: the GPT's, under "model."
    assert set(hooked.state_dict()) == {f"model.{k}" for k in tiny_model.state_dict()}
    assert {id(p) for p in hooked.parameters()} == {id(p) for p in tiny_model.parameters()}


def test_weights_reproduce_activations(hooked, toks):
    _, cache = hooked.run_with_cache(toks)
    for l in range(2):
        x = cache[f"blocks.{l}.ln1.hook_normalized"]
        for name, W in (("q", hooked.W_Q), ("k", hooked.W_K), ("v", hooked.W_V)):
            got = torch.einsum("bpd,hde->bphe", x, W[l])
            torch.testing.assert_close(got, cache[f"blocks.{l}.attn.hook_{name}"], atol=1e-5, rtol=0)
        x2 = cache[f"blocks.{l}.ln2.hook_normalized"]
        torch.testing.assert_close(x2 @ hooked.W_gate[l], cache[f"blocks.{l}.mlp.hook_pre"], atol=1e-5, rtol=0)
        torch.testing.assert_close(x2 @ hooked.W_in[l], cache[f"blocks.{l}.mlp.hook_pre_linear"], atol=1e-5, rtol=0)
        post = cache[f"blocks.{l}.mlp.hook_post"]
        torch.testing.assert_close(
            F.silu(cache[f"blocks.{l}.mlp.hook_pre"]) * cache[f"blocks.{l}.mlp.hook_pre_linear"], post, atol=1e-6, rtol=0
        )
        torch.testing.assert_close(post @ hooked.W_out[l], cache[f"blocks.{l}.hook_mlp_out"], atol=1e-5, rtol=0)
    torch.testing.assert_close(cache["hook_embed"], hooked.W_E[toks])


def test_attention_internals_are_consistent(hooked, toks):
    _, cache = hooked.run_with_cache(toks)
    T = toks.shape[1]
    blk = hooked.model.blocks[0].attn
    q = cache["blocks.0.attn.hook_q"]
    qn = cache["blocks.0.attn.q_norm.hook_normalized"]
    torch.testing.assert_close(blk.q_norm(q), qn, atol=1e-6, rtol=0)  # QK-norm before RoPE
    cos, sin = hooked.model.cos[:T, None, :], hooked.model.sin[:T, None, :]
    torch.testing.assert_close(apply_rope(qn, cos, sin), cache["blocks.0.attn.hook_rot_q"], atol=1e-6, rtol=0)
    rq, rk = cache["blocks.0.attn.hook_rot_q"], cache["blocks.0.attn.hook_rot_k"]
    scores = torch.einsum("bqhd,bkhd->bhqk", rq, rk) / math.sqrt(hooked.cfg.d_head)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    got = cache["blocks.0.attn.hook_attn_scores"]
    assert torch.isinf(got[..., future]).all() and (got[..., future] < 0).all()
    torch.testing.assert_close(got[..., ~future], scores[..., ~future], atol=1e-5, rtol=0)
    pattern = cache["blocks.0.attn.hook_pattern"]
    torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)))
    z = torch.einsum("bhqk,bkhd->bqhd", pattern, cache["blocks.0.attn.hook_v"])
    torch.testing.assert_close(z, cache["blocks.0.attn.hook_z"], atol=1e-5, rtol=0)


# ---------------------------------------------------------------- exactness


def test_logits_equal_plain_gpt(hooked, tiny_model, toks):
    plain, _ = tiny_model(toks)
    torch.testing.assert_close(hooked(toks), plain, atol=1e-5, rtol=0)
    logits, _ = hooked.run_with_cache(toks)
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=0)


def test_last_resid_post_through_final_norm_and_head_gives_logits(hooked, tiny_model, toks):
    logits, cache = hooked.run_with_cache(toks)
    last = cache["blocks.1.hook_resid_post"]
    torch.testing.assert_close(tiny_model.head(tiny_model.norm(last)), logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(cache["ln_final.hook_normalized"] @ hooked.W_U, logits, atol=1e-5, rtol=0)


def test_resid_pre_is_the_previous_resid_post(hooked, toks):
    seen = {}

    def grab(x, hook):
        seen[hook.name] = x

    hooked.run_with_hooks(
        toks, fwd_hooks=[("blocks.0.hook_resid_post", grab), ("blocks.1.hook_resid_pre", grab), ("hook_embed", grab),
                         ("blocks.0.hook_resid_pre", grab)]
    )
    assert seen["blocks.0.hook_resid_post"] is seen["blocks.1.hook_resid_pre"]
    assert seen["hook_embed"] is seen["blocks.0.hook_resid_pre"]


def test_resid_stream_decomposes(hooked, toks):
    _, cache = hooked.run_with_cache(toks)
    acc = cache["hook_embed"].clone()
    for l in range(hooked.cfg.n_layers):
        acc = acc + cache[f"blocks.{l}.hook_attn_out"]
        torch.testing.assert_close(cache[f"blocks.{l}.hook_resid_mid"], acc, atol=1e-4, rtol=0)
        acc = acc + cache[f"blocks.{l}.hook_mlp_out"]
        torch.testing.assert_close(cache[f"blocks.{l}.hook_resid_post"], acc, atol=1e-4, rtol=0)


def test_z_through_W_O_per_head_sums_to_attn_out(hooked, toks):
    _, cache = hooked.run_with_cache(toks)
    W_O = hooked.W_O
    for l in range(hooked.cfg.n_layers):
        z = cache[f"blocks.{l}.attn.hook_z"]
        per_head = torch.einsum("bphd,hdm->bphm", z, W_O[l])
        torch.testing.assert_close(per_head.sum(2), cache[f"blocks.{l}.hook_attn_out"], atol=1e-5, rtol=0)


def test_identity_hooks_change_nothing(hooked, toks):
    plain = hooked(toks)
    ident = lambda x, hook: x  # noqa: E731
    fused = [(n, ident) for n in hooked.hook_dict if not n.endswith(("hook_pattern", "hook_attn_scores"))]
    assert torch.equal(hooked.run_with_hooks(toks, fwd_hooks=fused), plain)
    every = [(n, ident) for n in hooked.hook_dict]
    torch.testing.assert_close(hooked.run_with_hooks(toks, fwd_hooks=every), plain, atol=1e-5, rtol=0)
    copies = [(n, lambda x, hook: x.clone()) for n in hooked.hook_dict]
    torch.testing.assert_close(hooked.run_with_hooks(toks, fwd_hooks=copies), plain, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layer,head", [(0, 0), (0, 1), (1, 1)])
def test_zeroing_one_head_changes_exactly_what_it_should(hooked, tiny_model, toks, layer, head):
    _, clean = hooked.run_with_cache(toks)

    def zero(z, hook):
        z[:, :, head] = 0.0
        return z

    logits, cache = None, None
    with hooked.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero)]):
        logits, cache = hooked.run_with_cache(toks)
    # recompute by hand from the clean activations, with the GPT's own modules
    z = clean[f"blocks.{layer}.attn.hook_z"].clone()
    z[:, :, head] = 0.0
    attn_out = torch.einsum("bphd,hdm->bpm", z, hooked.W_O[layer])
    x = clean[f"blocks.{layer}.hook_resid_pre"] + attn_out
    blk = tiny_model.blocks[layer]
    x = x + blk.ffn(blk.norm2(x))
    T = toks.shape[1]
    for b in tiny_model.blocks[layer + 1 :]:
        x = b(x, tiny_model.cos[:T], tiny_model.sin[:T])
    expected = tiny_model.head(tiny_model.norm(x))
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    # everything upstream of the ablation is untouched; the other heads' z too
    assert torch.equal(cache[f"blocks.{layer}.hook_resid_pre"], clean[f"blocks.{layer}.hook_resid_pre"])
    assert torch.equal(cache[f"blocks.{layer}.attn.hook_pattern"], clean[f"blocks.{layer}.attn.hook_pattern"])
    assert (cache[f"blocks.{layer}.attn.hook_z"][:, :, head] == 0).all()
    other = [h for h in range(hooked.cfg.n_heads) if h != head]
    assert torch.equal(cache[f"blocks.{layer}.attn.hook_z"][:, :, other], clean[f"blocks.{layer}.attn.hook_z"][:, :, other])
    assert not torch.allclose(logits, clean["ln_final.hook_normalized"] @ hooked.W_U)
    assert no_hooks_left(hooked)


# ---------------------------------------------------------------- fused attention vs explicit softmax


def test_fused_attention_unless_patterns_are_needed(hooked, toks, monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    plain = hooked(toks)
    assert len(calls) == 2
    calls.clear()
    hooked.run_with_cache(toks, names_filter=lambda n: n.endswith("resid_post"))
    assert len(calls) == 2
    calls.clear()
    hooked.run_with_hooks(toks, fwd_hooks=[("blocks.1.attn.hook_z", lambda z, hook: z)])
    assert len(calls) == 2
    calls.clear()
    logits, cache = hooked.run_with_cache(toks, names_filter="blocks.0.attn.hook_pattern")
    assert len(calls) == 1  # block 0 explicit, block 1 fused
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=0)
    calls.clear()
    logits = hooked.run_with_hooks(toks, fwd_hooks=[(lambda n: n.endswith("attn_scores"), lambda s, hook: s)])
    assert len(calls) == 0
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=0)
    calls.clear()
    hooked(toks)
    assert len(calls) == 2  # nothing left behind forces the slow path


def test_fused_and_explicit_paths_agree_everywhere(hooked, toks):
    _, fused = hooked.run_with_cache(toks, names_filter=lambda n: "pattern" not in n and "scores" not in n)
    logits, explicit = hooked.run_with_cache(toks)
    for name in fused.keys():
        torch.testing.assert_close(fused[name], explicit[name], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, hooked(toks), atol=1e-5, rtol=0)


def test_pattern_hook_can_intervene(hooked, toks):
    T = toks.shape[1]

    def attend_to_first(p, hook):
        p = torch.zeros_like(p)
        p[..., 0] = 1.0
        return p

    _, cache = hooked.run_with_cache(toks, names_filter=["blocks.0.attn.hook_v", "blocks.0.attn.hook_z"])
    with hooked.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", attend_to_first)]):
        _, c2 = hooked.run_with_cache(toks, names_filter="blocks.0.attn.hook_z")
    v0 = cache["blocks.0.attn.hook_v"][:, :1].expand(-1, T, -1, -1)
    torch.testing.assert_close(c2["blocks.0.attn.hook_z"], v0)


# ---------------------------------------------------------------- caching, names, hook lifetime


def test_names_filter_caches_only_the_selection(hooked, toks):
    _, c = hooked.run_with_cache(toks, names_filter="blocks.1.hook_resid_post")
    assert list(c.keys()) == ["blocks.1.hook_resid_post"]
    _, c = hooked.run_with_cache(toks, names_filter=["hook_embed", "blocks.0.attn.hook_z"])
    assert set(c.keys()) == {"hook_embed", "blocks.0.attn.hook_z"}
    _, c = hooked.run_with_cache(toks, names_filter=lambda n: n.endswith("hook_resid_post"))
    assert list(c.keys()) == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    logits, c = hooked.run_with_cache(toks, names_filter=lambda n: False, return_cache_object=False)
    assert c == {} and isinstance(c, dict)
    assert no_hooks_left(hooked)


def test_unknown_names_raise_with_close_matches(hooked, toks):
    with pytest.raises(HookNameError) as e:
        hooked.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_pots", lambda x, hook: x)])
    assert "blocks.0.hook_resid_post" in str(e.value)
    assert isinstance(e.value, KeyError) and isinstance(e.value, SproutError)
    with pytest.raises(HookNameError, match="blocks.0.attn.hook_pattern"):
        hooked.run_with_cache(toks, names_filter=["hook_embed", "blocks.0.attn.hook_patern"])
    with pytest.raises(HookNameError, match="blocks.1.hook_resid_post"):
        hooked.run_with_cache(toks, names_filter="blocks.7.hook_resid_post")
    with pytest.raises(HookNameError, match="0 to 1"):
        hooked.get_hook_point("blocks.2.hook_resid_post")
    with pytest.raises(HookNameError, match="ln_final.hook_normalized"):
        hooked.get_hook_point("ln_final.hook_normalised")
    with pytest.raises(HookNameError):
        with hooked.hooks(fwd_hooks=[("hook_embed", lambda x, hook: x), ("nonsense", lambda x, hook: x)]):
            pass
    with pytest.raises(HookNameError):
        hooked.add_hook("blocks.0.mlp.hook_prelinear", lambda x, hook: x)
    _, cache = hooked.run_with_cache(toks, names_filter="blocks.0.hook_resid_post")
    with pytest.raises(HookNameError, match="blocks.0.hook_resid_post"):
        cache["blocks.0.hook_resid_pst"]
    with pytest.raises(HookNameError, match="valid hook point"):
        cache["blocks.1.hook_resid_post"]
    assert hooked.get_hook_point("hook_embed") is hooked.hook_embed
    assert no_hooks_left(hooked)


def test_hooks_are_removed_when_a_hook_raises(hooked, toks):
    plain = hooked(toks)

    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        hooked.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_attn_out", lambda x, hook: x * 0), ("blocks.1.hook_mlp_out", boom)])
    assert no_hooks_left(hooked)
    with pytest.raises(RuntimeError, match="boom"):
        with hooked.hooks(fwd_hooks=[("blocks.1.attn.hook_pattern", boom)]):
            hooked.run_with_cache(toks)
    assert no_hooks_left(hooked)
    with pytest.raises(ValueError):
        with hooked.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: x + 1)]):
            raise ValueError("user code")
    assert no_hooks_left(hooked)
    assert torch.equal(hooked(toks), plain)
    assert hooked.context_level == 0


def test_hooks_context_manager_and_nesting(hooked, toks):
    plain = hooked(toks)
    double = lambda x, hook: 2 * x  # noqa: E731
    with hooked.hooks(fwd_hooks=[("blocks.1.hook_mlp_out", double)]):
        a = hooked(toks)
        with hooked.hooks(fwd_hooks=[("blocks.0.hook_attn_out", double)]):
            b = hooked(toks)
            logits, cache = hooked.run_with_cache(toks, names_filter="blocks.1.hook_mlp_out")
        c = hooked(toks)
    assert not torch.allclose(a, plain) and not torch.allclose(a, b)
    assert torch.equal(a, c) and torch.equal(logits, b)
    assert torch.equal(hooked(toks), plain)
    assert no_hooks_left(hooked)


def test_run_with_hooks_replaces_activation_and_ctx(hooked, toks):
    def stash(x, hook):
        hook.ctx["mean"] = x.mean()

    hooked.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_post", stash)], clear_contexts=False)
    assert "mean" in hooked.get_hook_point("blocks.0.hook_resid_post").ctx
    hooked.reset_hooks()  # clears contexts too
    assert hooked.get_hook_point("blocks.0.hook_resid_post").ctx == {}


def test_permanent_hooks_and_reset(hooked, toks):
    plain = hooked(toks)
    hooked.add_hook("blocks.0.hook_mlp_out", lambda x, hook: x * 0, is_permanent=True)
    hooked.add_hook(lambda n: n == "blocks.1.hook_mlp_out", lambda x, hook: x * 0)
    hooked.reset_hooks()
    assert hooked.get_hook_point("blocks.0.hook_mlp_out").has_hooks()
    assert not hooked.get_hook_point("blocks.1.hook_mlp_out").has_hooks()
    assert not torch.allclose(hooked(toks), plain)
    hooked.reset_hooks(including_permanent=True)
    assert no_hooks_left(hooked)
    assert torch.equal(hooked(toks), plain)


def test_pos_slice(hooked, toks):
    _, full = hooked.run_with_cache(toks)
    _, last = hooked.run_with_cache(toks, pos_slice=-1)
    _, mid = hooked.run_with_cache(toks, pos_slice=(2, 5))
    for name in full.keys():
        if "pattern" in name or "scores" in name:  # (batch, head, query, key): the query axis
            assert torch.equal(last[name], full[name][:, :, -1:])
            assert torch.equal(mid[name], full[name][:, :, 2:5])
        else:  # (batch, pos, ...), per-head ones included
            assert torch.equal(last[name], full[name][:, -1:])
            assert torch.equal(mid[name], full[name][:, 2:5])


def test_remove_batch_dim(hooked, toks):
    _, c = hooked.run_with_cache(toks[:1], remove_batch_dim=True, names_filter=["blocks.0.attn.hook_z", "hook_embed"])
    assert c["blocks.0.attn.hook_z"].shape == (12, 2, 8) and c["hook_embed"].shape == (12, 16)
    with pytest.raises(AssertionError):
        hooked.run_with_cache(toks, remove_batch_dim=True)
    assert no_hooks_left(hooked)


def test_backward_hooks_and_incl_bwd(hooked, toks):
    loss, cache = hooked.run_with_cache(toks, return_type="loss", incl_bwd=True, names_filter=lambda n: "resid_post" in n)
    assert set(cache.keys()) == {
        "blocks.0.hook_resid_post", "blocks.0.hook_resid_post_grad", "blocks.1.hook_resid_post", "blocks.1.hook_resid_post_grad"
    }
    hooked.zero_grad(set_to_none=True)
    # the same gradient by plain autograd
    seen = {}

    def keep(x, hook):
        x.retain_grad()
        seen["x"] = x

    loss2 = hooked.run_with_hooks(toks, return_type="loss", fwd_hooks=[("blocks.1.hook_resid_post", keep)])
    loss2.backward()
    torch.testing.assert_close(cache["blocks.1.hook_resid_post_grad"], seen["x"].grad, atol=1e-7, rtol=1e-5)
    # backward hooks kept past the call (reset_hooks_end=False), as TransformerLens documents
    grads = {}
    loss3 = hooked.run_with_hooks(
        toks, return_type="loss", bwd_hooks=[("hook_embed", lambda g, hook: grads.setdefault("g", g))], reset_hooks_end=False
    )
    loss3.backward()
    hooked.reset_hooks()
    assert grads["g"].shape == (3, 12, 16)
    assert no_hooks_left(hooked)
    hooked.zero_grad(set_to_none=True)


# ---------------------------------------------------------------- forward options


def test_return_types_and_loss(hooked, tiny_model, toks):
    logits = hooked(toks)
    _, ref = tiny_model(toks[:, :-1], targets=toks[:, 1:])
    loss = hooked(toks, return_type="loss")
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=0)
    per_tok = hooked(toks, return_type="loss", loss_per_token=True)
    assert per_tok.shape == (3, 11)
    torch.testing.assert_close(per_tok.mean(), loss)
    both = hooked(toks, return_type="both")
    assert torch.equal(both[0], logits) and torch.equal(both[1], loss)
    assert hooked(toks, return_type=None) is None
    assert torch.equal(hooked(toks[0]), logits[:1])  # (pos,) is a batch of one
    with unchecked_types(), pytest.raises(SproutError):
        hooked(toks, return_type="probs")


def test_stop_and_start_at_layer(hooked, toks):
    fused = lambda n: "pattern" not in n and "scores" not in n  # noqa: E731  (same attention path as a plain forward)
    logits, cache = hooked.run_with_cache(toks, names_filter=fused)
    assert torch.equal(hooked(toks, stop_at_layer=0), cache["hook_embed"])
    assert torch.equal(hooked(toks, stop_at_layer=1), cache["blocks.1.hook_resid_pre"])
    assert torch.equal(hooked(toks, stop_at_layer=-1), cache["blocks.1.hook_resid_pre"])
    assert torch.equal(hooked(toks, stop_at_layer=2), cache["blocks.1.hook_resid_post"])
    resid1 = cache["blocks.1.hook_resid_pre"]
    assert torch.equal(hooked(resid1, start_at_layer=1), logits)
    assert torch.equal(hooked(resid1, start_at_layer=-1), logits)
    assert torch.equal(hooked(cache["hook_embed"], start_at_layer=0), logits)
    torch.testing.assert_close(
        hooked(resid1, start_at_layer=1, return_type="loss", tokens=toks), hooked(toks, return_type="loss")
    )
    with pytest.raises(SproutError, match="tokens"):
        hooked(resid1, start_at_layer=1, return_type="loss")
    with pytest.raises(SproutError):
        hooked(toks, start_at_layer=1)
    with pytest.raises(SproutError):
        hooked(toks, stop_at_layer=3)
    # blocks that do not run leave nothing in the cache, and no hook fires there
    _, c = hooked.run_with_cache(toks, stop_at_layer=1, names_filter=fused)
    assert not any(k.startswith("blocks.1") for k in c.keys()) and "blocks.0.hook_resid_post" in c
    _, c = hooked.run_with_cache(resid1, start_at_layer=1)
    assert "hook_embed" not in c and not any(k.startswith("blocks.0") for k in c.keys())
    torch.testing.assert_close(c["blocks.1.hook_resid_post"], cache["blocks.1.hook_resid_post"])
    # a patched resid through start_at_layer equals patching with a hook
    patched = resid1.clone()
    patched[:, 3] = 0
    hooked_logits = hooked.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_resid_pre", lambda x, hook: patched)])
    assert torch.equal(hooked(patched, start_at_layer=1), hooked_logits)


@pytest.mark.unchecked_types
def test_token_input_errors(hooked):
    with pytest.raises(ContextLengthError, match="33 tokens.*32"):
        hooked(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(VocabularyMismatchError, match="64"):
        hooked(torch.tensor([[1, 2, 64]]))
    with pytest.raises(VocabularyMismatchError):
        hooked(torch.tensor([[1, -1]]))
    with pytest.raises(SproutError):
        hooked(torch.zeros(1, 4))
    with pytest.raises(ContextLengthError):
        hooked(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(SproutError, match="empty list"):
        hooked([])
    with pytest.raises(SproutError, match="no tokenizer"):
        hooked("some text")
    with pytest.raises(SproutError, match="no tokenizer"):
        hooked.to_tokens("some text")


# ---------------------------------------------------------------- text


def test_to_tokens_and_back(worded):
    text = "Zorbin Plax came home."
    t = worded.to_tokens(text)
    assert t.dtype == torch.long and t.dim() == 2 and t.shape[0] == 1
    assert worded.to_string(t[0]) == text
    assert worded.to_string(t) == [text]
    strs = worded.to_str_tokens(text)
    assert "".join(strs) == text and len(strs) == t.shape[1]
    assert worded.to_str_tokens(t) == strs
    assert worded.to_str_tokens(t[0]) == strs
    assert worded.to_str_tokens(t[0].tolist()) == strs
    b = worded.to_tokens(text, prepend_bos=True)
    assert b[0, 0].item() == 0 and torch.equal(b[:, 1:], t)
    assert worded.to_str_tokens(text, prepend_bos=True)[0] == "<|endoftext|>"


def test_batch_is_right_padded_with_a_mask(worded):
    texts = ["The cat sat.", "Once upon a time there was a little sprout."]
    toks, mask = worded.to_tokens(texts, return_mask=True)
    t2, m2 = worded.to_tokens_with_mask(texts)
    assert torch.equal(toks, t2) and torch.equal(mask, m2)
    n0 = worded.to_tokens(texts[0]).shape[1]
    n1 = worded.to_tokens(texts[1]).shape[1]
    assert toks.shape == (2, max(n0, n1)) and mask.dtype == torch.bool
    assert mask[0].sum() == n0 and mask[1].all() and not mask[0, n0:].any()
    assert (toks[0, n0:] == 0).all()  # padded with <|endoftext|>
    assert worded.to_tokens(texts) .shape == toks.shape
    # padding never changes a real position's logits (causal attention, right padding)
    logits = worded(toks)
    torch.testing.assert_close(logits[0, :n0], worded(texts[0])[0], atol=1e-5, rtol=0)
    # the batch loss ignores padding: it is the token-weighted mean of the two texts' losses
    l0 = worded(texts[0], return_type="loss", loss_per_token=True)
    l1 = worded(texts[1], return_type="loss", loss_per_token=True)
    expected = torch.cat([l0.flatten(), l1.flatten()]).mean()
    torch.testing.assert_close(worded(texts, return_type="loss"), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(worded(toks, return_type="loss", attention_mask=mask), expected, atol=1e-5, rtol=0)
    with pytest.raises(SproutError, match="right padding"):
        worded(toks, return_type="loss", attention_mask=mask.flip(-1))
    strs = worded.to_str_tokens(texts)
    assert len(strs) == 2 and "".join(strs[1]) == texts[1]


def test_text_length_errors(worded):
    long_text = "the cat sat on the mat " * 20
    n = len(worded.tokenizer.encode(long_text).ids)
    assert n > 32
    with pytest.raises(ContextLengthError) as e:
        worded.to_tokens(long_text)
    assert str(n) in str(e.value) and "32" in str(e.value)
    with pytest.raises(ContextLengthError):
        worded(long_text)
    with pytest.raises(ContextLengthError, match="text 1 of 2"):
        worded.to_tokens(["short", long_text])
    t = worded.to_tokens(long_text, truncate=True)
    assert t.shape == (1, 32)
    assert torch.equal(t[0], torch.tensor(worded.tokenizer.encode(long_text).ids[:32]))
    assert worded(long_text, truncate=True).shape == (1, 32, 300)
    with pytest.raises(ContextLengthError, match="empty"):
        worded.to_tokens("")
    with pytest.raises(ContextLengthError, match="empty"):
        worded("")
    assert worded.to_tokens("", prepend_bos=True).tolist() == [[0]]
    with pytest.raises(TokenizationError, match="surrogate"):
        worded.to_tokens("bad \ud800 text")
    with pytest.raises(SproutError):
        worded.to_tokens([])


def test_string_input_runs_everywhere(worded):
    text = "The quick brown fox."
    t = worded.to_tokens(text)
    assert torch.equal(worded(text), worded(t))
    logits, cache = worded.run_with_cache(text, names_filter="blocks.0.hook_resid_post")
    assert torch.equal(logits, worded(t))
    out = worded.run_with_hooks(text, fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: x)])
    assert torch.equal(out, logits)
    assert worded.to_single_token(worded.to_str_tokens(text)[0]) == t[0, 0].item()
    with pytest.raises(SproutError):
        worded.to_single_token("The quick brown fox.")
    assert worded.tokens_to_residual_directions(int(t[0, 0])).shape == (16,)
    assert worded.tokens_to_residual_directions(t[0]).shape == (t.shape[1], 16)


def test_generate(worded):
    prompt = "Once upon a time"
    state = torch.get_rng_state()
    a = worded.generate(prompt, max_new_tokens=8, seed=3, stop_at_eot=False)
    b = worded.generate(prompt, max_new_tokens=8, seed=3, stop_at_eot=False)
    assert torch.equal(torch.get_rng_state(), state)  # a seed leaves the global RNG alone
    assert isinstance(a, str) and a == b and a.startswith(prompt)
    ids = worded.to_tokens(prompt)
    out = worded.generate(ids, max_new_tokens=5, seed=3, stop_at_eot=False)
    assert out.shape == (1, ids.shape[1] + 5) and torch.equal(out[:, : ids.shape[1]], ids)
    # the plain GPT's sampler, same seed, same tokens
    torch.manual_seed(5)
    ref = worded.model.generate(ids, 6, temperature=1.0, top_k=5, top_p=None)
    torch.manual_seed(5)
    got = worded.generate(ids, max_new_tokens=6, temperature=1.0, top_k=5, top_p=None, stop_at_eot=False)
    assert torch.equal(got, ref)
    # hooks in force apply to every generated step: steer the final stream onto one token's direction
    target = int(worded.W_E.norm(dim=-1).argmax())
    steer = lambda x, hook: 100 * worded.W_E[target].expand_as(x)  # noqa: E731
    with worded.hooks(fwd_hooks=[("ln_final.hook_normalized", steer)]):
        steered = worded.generate(ids, max_new_tokens=3, top_k=1, stop_at_eot=False, seed=0)
    assert steered[0, ids.shape[1]:].tolist() == [target] * 3
    assert no_hooks_left(worded)


def test_transformer_lens_cache_helpers(hooked, toks):
    """The ActivationCache helpers that only need cfg, W_O, W_U and ln_final work on a SproutCache."""
    assert hooked.training is False  # follows the GPT's eval mode
    logits, cache = hooked.run_with_cache(toks)
    acc = cache.accumulated_resid(apply_ln=True)
    assert acc.shape == (3, 3, 12, 16)
    torch.testing.assert_close(acc[-1] @ hooked.W_U, logits, atol=1e-5, rtol=0)
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    torch.testing.assert_close(parts.sum(0), cache["resid_post", 1], atol=1e-5, rtol=0)
    heads, labels = cache.stack_head_results(return_labels=True)
    assert heads.shape == (4, 3, 12, 16) and labels == ["L0H0", "L0H1", "L1H0", "L1H1"]
    torch.testing.assert_close(heads[:2].sum(0), cache["attn_out", 0], atol=1e-5, rtol=0)
    assert cache.stack_activation("pattern").shape == (2, 3, 2, 12, 12)
    assert "hook_embed" in cache and cache.get("nope") is None


def test_construction_and_copies(tiny_model, tokenizer300, toks):
    with pytest.raises(VocabularyMismatchError, match="300.*64"):
        HookedSprout(tiny_model, tokenizer=tokenizer300)
    with unchecked_types(), pytest.raises(SproutError):
        HookedSprout(torch.nn.Linear(2, 2))
    loaded = SimpleNamespace(model=tiny_model, tokenizer=None, info={"steps": 3}, name="tiny", source="/x")
    m = HookedSprout.from_loaded(loaded)
    assert m.name == "tiny" and m.info == {"steps": 3} and m.source == "/x" and m.model is tiny_model
    m2 = copy.deepcopy(m)
    assert m2.model is not tiny_model
    assert torch.equal(m2(toks), m(toks))
    with m2.hooks(fwd_hooks=[("hook_embed", lambda x, hook: x)]):
        pass
    assert "tiny" in repr(m)


def test_load_hooked_from_a_checkpoint_folder(tmp_path, worded, tokenizer300):
    pytest.importorskip("sprout_interp.core.loading")
    from sprout_model.checkpoint import save_checkpoint

    tok_file = tmp_path / "tok.json"
    tokenizer300.save(str(tok_file))
    folder = save_checkpoint(worded.model, tmp_path / "ckpt", tok_file, {"steps": 1})
    m = load_hooked(folder)
    assert isinstance(m, HookedSprout) and m.tokenizer is not None
    t = worded.to_tokens("The cat sat.")
    torch.testing.assert_close(m(t), worded(t), atol=1e-5, rtol=0)
    m2 = load_hooked(folder, tokenizer=tok_file)
    assert m2.tokenizer.get_vocab_size() == 300


# ---------------------------------------------------------------- shipped checkpoints

TEXT = (
    "Once upon a time, a little girl named Lily found a shiny stone in the garden. She showed it to her "
    "mother, who smiled and said it was the most beautiful stone she had ever seen."
)


@pytest.mark.acceptance  # 3-8 s each
@pytest.mark.parametrize("name", ["gpt-1", "gpt-4", "sprout"])
def test_shipped_checkpoint_identities(name):
    if not (CHECKPOINTS / name / "model.safetensors").is_file():
        pytest.skip(f"model/checkpoints/{name}/model.safetensors is not there yet")
    m = load_hooked(name)
    assert isinstance(m, HookedSprout) and m.tokenizer is not None
    assert m.cfg.d_vocab == 8192 and m.cfg.n_ctx == 512
    assert list(m.hook_dict) == expected_hook_names(m.cfg.n_layers)
    toks = m.to_tokens([TEXT, "Zorbin Plax came home."])
    with torch.no_grad():
        plain, _ = m.model(toks)
        torch.testing.assert_close(m(toks), plain, atol=1e-5, rtol=0)
        logits, cache = m.run_with_cache(toks)
    # a full cache takes the explicit-softmax path; trained logits reach ~15, where float32's own
    # rounding is ~1e-6 relative, so allow that on top of 1e-5
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=1e-6)
    L = m.cfg.n_layers
    torch.testing.assert_close(m.model.head(m.model.norm(cache[f"blocks.{L - 1}.hook_resid_post"])), plain, atol=1e-5, rtol=1e-6)
    acc = cache["hook_embed"].clone()
    for l in range(L):
        acc = acc + cache[f"blocks.{l}.hook_attn_out"] + cache[f"blocks.{l}.hook_mlp_out"]
        torch.testing.assert_close(cache[f"blocks.{l}.hook_resid_post"], acc, atol=1e-4, rtol=0)
        per_head = torch.einsum("bphd,hdm->bpm", cache[f"blocks.{l}.attn.hook_z"], m.W_O[l])
        torch.testing.assert_close(per_head, cache[f"blocks.{l}.hook_attn_out"], atol=1e-4, rtol=0)
    # zero head 0 of the last block: only what follows changes, as recomputed by hand
    def zero(z, hook):
        z[:, :, 0] = 0.0
        return z

    with torch.no_grad():
        ablated = m.run_with_hooks(toks, fwd_hooks=[(f"blocks.{L - 1}.attn.hook_z", zero)])
        z = cache[f"blocks.{L - 1}.attn.hook_z"].clone()
        z[:, :, 0] = 0
        x = cache[f"blocks.{L - 1}.hook_resid_pre"] + torch.einsum("bphd,hdm->bpm", z, m.W_O[L - 1])
        blk = m.model.blocks[L - 1]
        x = x + blk.ffn(blk.norm2(x))
        torch.testing.assert_close(ablated, m.model.head(m.model.norm(x)), atol=1e-4, rtol=0)
    n = len(m.to_str_tokens(TEXT * 12, truncate=True))
    assert n == 512
    with pytest.raises(ContextLengthError, match="512"):
        m.to_tokens(TEXT * 12)
    assert m.generate("Once upon a time", max_new_tokens=5, seed=0).startswith("Once upon a time")


@pytest.mark.acceptance  # 3-8 s each
@pytest.mark.parametrize("name", ["gpt-4", "sprout"])
def test_shipped_checkpoint_fused_equals_explicit(name):
    if not (CHECKPOINTS / name / "model.safetensors").is_file():
        pytest.skip(f"model/checkpoints/{name}/model.safetensors is not there yet")
    m = load_hooked(name)
    toks = m.to_tokens(TEXT)
    with torch.no_grad():
        _, fused = m.run_with_cache(toks, names_filter=lambda n: "pattern" not in n and "scores" not in n)
        logits, explicit = m.run_with_cache(toks)
        torch.testing.assert_close(logits, m(toks), atol=1e-5, rtol=1e-6)  # float32 rounding at |logit| ~ 15
    for k in fused.keys():
        # float32 rounding grows with the stream's size (|resid| reaches ~60: 4 ulps there are 1.5e-5)
        scale = explicit[k].abs().max().item()
        torch.testing.assert_close(fused[k], explicit[k], atol=1e-5 + 1e-6 * scale, rtol=1e-5)


@pytest.mark.acceptance  # over 10 s of generating
def test_cached_generation_equals_the_uncached_forward(hooked, toks):
    """Keys and values kept between steps: the same greedy tokens, also once the window slides past the context."""
    prompt = toks[:1, :10]
    n = hooked.cfg.n_ctx + 8  # crosses the 32-token context
    cached = hooked.generate(prompt, max_new_tokens=n, top_k=1, stop_at_eot=False)
    plain = hooked.generate(prompt, max_new_tokens=n, top_k=1, stop_at_eot=False, use_cache=False)
    assert cached.shape == (1, 10 + n) and torch.equal(cached, plain)
    batch = hooked.generate(toks[:, :5], max_new_tokens=6, top_k=1, stop_at_eot=False)
    assert torch.equal(batch, hooked.generate(toks[:, :5], max_new_tokens=6, top_k=1, stop_at_eot=False, use_cache=False))
    # with a hook active every step runs the full forward, so the hook sees the whole sequence
    seen = []
    with hooked.hooks(fwd_hooks=[("hook_embed", lambda x, hook: seen.append(x.shape[1]))]):
        hooked.generate(prompt, max_new_tokens=3, top_k=1, stop_at_eot=False)
    assert seen == [10, 11, 12]
