"""TransformerLens habits on HookedSprout: folded weights, ActivationCache methods, direct logit attribution.

Checked three ways: against the model's own activations (the decompositions sum to the stream and
the attributions to the model's logit difference), against TransformerLens's own ActivationCache
methods run on the compatibility-mode bridge of the exported model (same numbers), and against
``sprout_interp.direct_logit_attribution``.
"""
from __future__ import annotations

import pytest
import torch

import sprout_interp as si
from sprout_interp import HookedSprout, HookOutputError
from sprout_model import GPT

pytestmark = pytest.mark.unit


@pytest.fixture
def gained(tiny_cfg) -> HookedSprout:
    """A tiny model whose norm gains are far from 1, so folding them is visible."""
    torch.manual_seed(1)
    gpt = GPT(tiny_cfg).eval()
    with torch.no_grad():
        for n, p in gpt.named_parameters():
            if n.endswith(("norm1.weight", "norm2.weight")) or n == "norm.weight":
                p.copy_(torch.rand_like(p) * 2 + 0.2)
    return HookedSprout(gpt)


@pytest.fixture
def ids(tiny_cfg) -> torch.Tensor:
    return torch.randint(0, tiny_cfg.vocab_size, (2, 10), generator=torch.Generator().manual_seed(3))


def test_norm_hooks_have_transformer_lens_meaning(gained, ids):
    _, cache = gained.run_with_cache(ids)
    for l in range(gained.cfg.n_layers):
        x = cache[f"blocks.{l}.hook_resid_pre"]
        scale = cache[f"blocks.{l}.ln1.hook_scale"]
        torch.testing.assert_close(scale, (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt())
        torch.testing.assert_close(cache[f"blocks.{l}.ln1.hook_normalized"], x / scale)  # before the gain
    torch.testing.assert_close(cache["ln_final.hook_normalized"] @ gained.W_U, gained(ids), atol=1e-5, rtol=0)


def test_folded_weights_reproduce_the_model(gained, ids):
    gpt = gained.model
    torch.testing.assert_close(gained.W_U, gpt.head.weight.T * gpt.norm.weight[:, None], atol=0, rtol=0)
    _, cache = gained.run_with_cache(ids)
    for l in range(gained.cfg.n_layers):
        x = cache[f"blocks.{l}.ln1.hook_normalized"]
        for name, W in (("q", gained.W_Q), ("k", gained.W_K), ("v", gained.W_V)):
            got = torch.einsum("bpd,hde->bphe", x, W[l])
            torch.testing.assert_close(got, cache[f"blocks.{l}.attn.hook_{name}"], atol=1e-5, rtol=0)
        x2 = cache[f"blocks.{l}.ln2.hook_normalized"]
        torch.testing.assert_close(x2 @ gained.W_gate[l], cache[f"blocks.{l}.mlp.hook_pre"], atol=1e-5, rtol=0)
        torch.testing.assert_close(x2 @ gained.W_in[l], cache[f"blocks.{l}.mlp.hook_pre_linear"], atol=1e-5, rtol=0)
    assert gained.QK.shape == gained.OV.shape == (2, 2, 16, 16)
    torch.testing.assert_close(gained.QK.AB, gained.W_Q @ gained.W_K.transpose(-2, -1))
    for b in (gained.b_U, gained.b_Q, gained.b_O, gained.b_in, gained.b_out, gained.accumulated_bias(1)):
        assert not b.any()


def test_decomposition_and_logit_attrs_are_exact(gained, ids):
    logits, cache = gained.run_with_cache(ids)
    a, w = torch.tensor([3, 5]), torch.tensor([7, 7])
    true = logits[torch.arange(2), -1, a] - logits[torch.arange(2), -1, w]
    stack = cache.decompose_resid(pos_slice=-1)
    torch.testing.assert_close(stack.sum(0), cache["resid_post", -1][:, -1], atol=1e-5, rtol=0)
    torch.testing.assert_close(cache.logit_attrs(stack, a, w, pos_slice=-1).sum(0), true, atol=1e-4, rtol=0)
    full = cache.get_full_resid_decomposition(pos_slice=-1, expand_neurons=True)
    torch.testing.assert_close(cache.logit_attrs(full, a, w, pos_slice=-1).sum(0), true, atol=1e-4, rtol=0)
    acc = cache.accumulated_resid(apply_ln=True)
    torch.testing.assert_close(acc[-1] @ gained.W_U, logits, atol=1e-5, rtol=0)
    assert cache.logit_lens().readout.values.shape[0] == gained.cfg.n_layers + 1


def test_direct_logit_attribution_sums_to_the_logit_difference(gained, ids):
    logits = gained(ids[:1])
    true = (logits[0, 6, 3] - logits[0, 6, 7]).item()
    for by in ("component", "head", "source"):
        df = si.direct_logit_attribution(gained, ids[0], 3, 7, pos=6, by=by)
        assert df.attrs["logit_diff"] == pytest.approx(true, abs=1e-5)
        assert df["attribution"].sum() == pytest.approx(true, abs=1e-4), by
        assert {"layer", "block", "head", "pos"} <= set(df.columns) and (df["block"] == df["layer"] + 1).all()
    heads = si.direct_logit_attribution(gained, ids[0], 3, 7, pos=6, by="head")
    src = si.direct_logit_attribution(gained, ids[0], 3, 7, pos=6, by="source")
    per_head = src[src.kind == "head"].groupby(["layer", "head"])["attribution"].sum()
    for _, r in heads[heads.kind == "head"].iterrows():
        assert per_head[(r["layer"], r["head"])] == pytest.approx(r["attribution"], abs=1e-5)
    # the same numbers as TransformerLens's own per-head logit_attrs
    _, cache = gained.run_with_cache(ids[:1])
    tl = cache.logit_attrs(cache.stack_head_results(pos_slice=6), 3, 7, pos_slice=6)[:, 0]
    torch.testing.assert_close(torch.tensor(heads[heads.kind == "head"]["attribution"].values, dtype=tl.dtype), tl,
                               atol=1e-5, rtol=0)
    eff = si.head_token_effects(gained, ids[0], 1, 0, pos=6, k=3)
    assert list(eff.effect) == ["promoted"] * 3 + ["suppressed"] * 3
    assert eff.logit.iloc[0] >= eff.logit.iloc[2] and eff.logit.iloc[3] <= eff.logit.iloc[5]


@pytest.mark.unchecked_types
def test_dla_refuses_bad_input(gained, ids):
    with pytest.raises(si.SproutError, match="pos=40"):
        si.direct_logit_attribution(gained, ids[0], 3, pos=40)
    with pytest.raises(si.SproutError, match="one text at a time"):
        si.direct_logit_attribution(gained, ids, 3)
    with pytest.raises(si.SproutError, match="outside the vocabulary"):
        si.direct_logit_attribution(gained, ids[0], 10_000)
    with pytest.raises(si.SproutError, match="no head"):
        si.head_token_effects(gained, ids[0], 5, 0)


def test_hooks_must_return_the_activation_shape(gained, ids):
    one_head = lambda x, hook: x[:, :1]  # noqa: E731  (would broadcast over the heads)
    with pytest.raises(HookOutputError, match=r"blocks\.0\.attn\.hook_pattern.*\(2, 1, 10, 10\).*\(2, 2, 10, 10\)"):
        gained.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_pattern", one_head)])
    with pytest.raises(HookOutputError, match="hook_embed"):
        gained.run_with_hooks(ids, fwd_hooks=[("hook_embed", lambda x, hook: x[:, :3])])
    with pytest.raises(HookOutputError, match="float16"):
        gained.run_with_hooks(ids, fwd_hooks=[("hook_embed", lambda x, hook: x.half())])
    with pytest.raises(HookOutputError, match="returned a list"):
        gained.run_with_hooks(ids, fwd_hooks=[("hook_embed", lambda x, hook: [x])])
    with gained.hooks(fwd_hooks=[("hook_embed", lambda x, hook: x * 2)]):  # right shape: fine
        gained(ids)
    assert not any(hp.fwd_hooks for hp in gained.hook_dict.values())


@pytest.mark.integration
def test_activation_cache_methods_equal_the_bridge():
    """Every ActivationCache method TransformerLens documents: HookedSprout and the bridge agree (1e-4)."""
    m = si.load("gpt-4")
    toks = m.to_tokens(["Zorbin Plax came home. Later that day, Zorbin Plax", "The cat sat on the mat and the"])
    logits, cache = m.run_with_cache(toks)
    bridge = m.to_transformer_lens()  # compatibility mode by default
    blogits, bcache = bridge.run_with_cache(toks)
    torch.testing.assert_close(blogits, logits, atol=1e-4, rtol=0)
    a = torch.tensor([m.to_single_token(" Pl"), m.to_single_token(" the")])
    w = torch.tensor([m.to_single_token(" the"), m.to_single_token(" a")])
    methods = {
        "accumulated_resid": lambda c: c.accumulated_resid(),
        "accumulated_resid(apply_ln)": lambda c: c.accumulated_resid(apply_ln=True),
        "accumulated_resid(2, mid, apply_ln)": lambda c: c.accumulated_resid(2, incl_mid=True, apply_ln=True),
        "decompose_resid(apply_ln)": lambda c: c.decompose_resid(apply_ln=True),
        "decompose_resid(2, mlp_input)": lambda c: c.decompose_resid(2, mlp_input=True, apply_ln=True),
        "stack_head_results(apply_ln)": lambda c: c.stack_head_results(apply_ln=True),
        "stack_activation(pattern)": lambda c: c.stack_activation("pattern"),
        "get_full_resid_decomposition": lambda c: c.get_full_resid_decomposition(apply_ln=True, expand_neurons=True,
                                                                                   pos_slice=-1),
        "logit_attrs": lambda c: c.logit_attrs(c.decompose_resid(pos_slice=-1), a, w, pos_slice=-1),
        "apply_ln_to_stack": lambda c: c.apply_ln_to_stack(c.decompose_resid(2), 2),
        "get_neuron_results": lambda c: c.get_neuron_results(1, neuron_slice=[0, 5, 9]),
        "stack_neuron_results(apply_ln)": lambda c: c.stack_neuron_results(2, apply_ln=True),
        "logit_lens": lambda c: c.logit_lens().readout.values,
    }
    for name, f in methods.items():
        ours, theirs = f(cache), f(bcache)
        assert ours.shape == theirs.shape, name
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0, msg=name)
    cache.compute_head_results()
    bcache.compute_head_results()
    torch.testing.assert_close(cache["blocks.1.attn.hook_result"], bcache["blocks.1.attn.hook_result"], atol=1e-5, rtol=0)
    true = logits[torch.arange(2), -1, a] - logits[torch.arange(2), -1, w]
    torch.testing.assert_close(methods["logit_attrs"](bcache).sum(0), true, atol=1e-4, rtol=0)
    for name in ("W_E", "W_U", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out"):
        torch.testing.assert_close(getattr(m, name), getattr(bridge, name), atol=1e-6, rtol=0, msg=name)
    torch.testing.assert_close(cache["blocks.2.ln1.hook_normalized"], bcache["blocks.2.ln1.hook_normalized"],
                               atol=1e-5, rtol=0)


def test_contribution_graph_weights_sum_to_the_logit(gained, ids):
    from sprout_interp.circuits.attribution import contribution_graph

    nodes, edges = contribution_graph(gained, ids[0], pos=7, token=4, threshold=0.0)
    logit = gained(ids[:1])[0, 7, 4].item()
    assert nodes["attribution"].sum() == pytest.approx(logit, abs=1e-4) and nodes.attrs["token_id"] == 4
    per_head = edges.groupby(["layer", "head"])["attribution"].sum()
    for r in nodes[nodes.kind == "head"].itertuples():
        assert per_head[(r.layer, r.head)] == pytest.approx(r.attribution, abs=1e-5)
    assert (edges["src_pos"] <= 7).all()
    pruned, few = contribution_graph(gained, ids[0], pos=7, token=4, threshold=0.5)
    assert len(pruned) < len(nodes) and len(few) < len(edges)
    assert (pruned["attribution"].abs() >= 0.5 * nodes["attribution"].abs().max() - 1e-9).all()
    top, _ = contribution_graph(gained, ids[0], pos=7)  # default: the model's own top prediction
    assert top.attrs["token_id"] == int(gained(ids[:1])[0, 7].argmax())
