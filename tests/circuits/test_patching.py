"""Activation patching: the fast path equals one full forward per patch and TransformerLens's own patching loop."""
from __future__ import annotations

import pytest
import torch
from transformer_lens import patching as tlp

from sprout_interp import HookedSprout
from sprout_interp import patching as P
from sprout_model import GPT

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model(request) -> HookedSprout:
    from conftest import tiny_config

    torch.manual_seed(2)
    gpt = GPT(tiny_config(n_layer=3, context=40)).eval()
    with torch.no_grad():  # sharper than a fresh init, so patches move the metric
        for p in gpt.parameters():
            p.mul_(3.0)
    return HookedSprout(gpt)


@pytest.fixture(scope="module")
def pair() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    clean = torch.randint(0, 64, (2, 20), generator=g)
    corrupted = clean.clone()
    corrupted[:, 3] = (clean[:, 3] + 7) % 64
    corrupted[:, 11] = (clean[:, 11] + 5) % 64
    return clean, corrupted


CASES = [("resid_pre", "layer_pos"), ("resid_mid", "layer_pos"), ("resid_post", "layer_pos"),
         ("attn_out", "layer_pos"), ("mlp_out", "layer_pos"), ("resid_pre", "layer"), ("mlp_out", "layer"),
         ("z", "head"), ("z", "head_pos"), ("q", "head"), ("k", "head"), ("v", "head"), ("pattern", "head")]
METRICS = {
    "logit_diff": P.LogitDiff(answer=[3, 9], wrong=[8, 1], pos=-1),
    "log_prob": P.LogProb(target=5, pos=12),
    "loss": P.Loss(),
    "callable": lambda logits: logits[:, -1].log_softmax(-1)[:, 2].mean(),
}


@pytest.mark.parametrize("site,by,direction", [(s, b, "denoise") for s, b in CASES]
                         + [(s, b, "noise") for s, b in CASES if b in ("layer", "head")])
def test_fast_equals_one_forward_per_patch(model, pair, site, by, direction):
    metric = METRICS["logit_diff"]
    fast = P.activation_patch(model, *pair, metric, site, by, direction)
    naive = P.naive_patch(model, *pair, metric, site, by, direction)
    assert len(fast) == len(naive) and list(fast.columns) == list(naive.columns)
    torch.testing.assert_close(torch.tensor(fast["value"].values), torch.tensor(naive["value"].values), atol=1e-5, rtol=0)
    assert (fast["block"] == fast["layer"] + 1).all()


@pytest.mark.parametrize("name", ["log_prob", "loss", "callable"])
def test_every_metric_kind(model, pair, name):
    for site, by in (("resid_pre", "layer_pos"), ("z", "head_pos"), ("k", "head")):
        fast = P.activation_patch(model, *pair, METRICS[name], site, by)
        naive = P.naive_patch(model, *pair, METRICS[name], site, by)
        torch.testing.assert_close(torch.tensor(fast["value"].values), torch.tensor(naive["value"].values),
                                   atol=1e-5, rtol=0)


TL_FUNCTIONS = {
    ("resid_pre", "layer_pos"): tlp.get_act_patch_resid_pre,
    ("resid_mid", "layer_pos"): tlp.get_act_patch_resid_mid,
    ("attn_out", "layer_pos"): tlp.get_act_patch_attn_out,
    ("mlp_out", "layer_pos"): tlp.get_act_patch_mlp_out,
    ("z", "head_pos"): tlp.get_act_patch_attn_head_out_by_pos,
    ("z", "head"): tlp.get_act_patch_attn_head_out_all_pos,
    ("q", "head"): tlp.get_act_patch_attn_head_q_all_pos,
    ("k", "head"): tlp.get_act_patch_attn_head_k_all_pos,
    ("v", "head"): tlp.get_act_patch_attn_head_v_all_pos,
    ("pattern", "head"): tlp.get_act_patch_attn_head_pattern_all_pos,
}


@pytest.mark.parametrize("site,by", list(TL_FUNCTIONS))
def test_equals_transformer_lens_patching_on_hooked_sprout(model, pair, site, by):
    clean, corrupted = pair
    metric = METRICS["callable"]
    _, clean_cache = model.run_with_cache(clean)
    theirs = TL_FUNCTIONS[(site, by)](model, corrupted, clean_cache, metric)  # (layer, pos[, head]) or (layer, head)
    ours = P.activation_patch(model, clean, corrupted, metric, site, by)
    if by == "head_pos":
        ours = ours.sort_values(["layer", "pos", "head"])
    torch.testing.assert_close(torch.tensor(ours["value"].values, dtype=theirs.dtype), theirs.flatten(), atol=1e-5,
                               rtol=0)


def test_scores_run_from_corrupted_to_clean(model, pair):
    df = P.activation_patch(model, *pair, METRICS["logit_diff"], "resid_pre", "layer_pos")
    # patching the whole stream entering block 1 at every position where the texts differ restores the clean run;
    # at the first layer, patching a position where the texts agree changes nothing
    same = df[(df.layer == 0) & ~df.pos.isin([3, 11])]
    assert (same["score"].abs() < 1e-5).all()
    full = P.activation_patch(model, *pair, METRICS["logit_diff"], "resid_pre", "layer")
    assert full["score"].iloc[0] == pytest.approx(1.0, abs=1e-5)
    noised = P.activation_patch(model, *pair, METRICS["logit_diff"], "resid_pre", "layer", direction="noise")
    assert noised["score"].iloc[0] == pytest.approx(0.0, abs=1e-5)
    assert df.attrs["clean"] != df.attrs["corrupted"] and df.attrs["direction"] == "denoise"


def test_user_hooks_are_honoured(model, pair):
    metric = METRICS["logit_diff"]
    plain = P.activation_patch(model, *pair, metric, "resid_pre", "layer")
    with model.hooks(fwd_hooks=[("blocks.2.attn.hook_z", lambda z, hook: z * 0)]):
        hooked = P.activation_patch(model, *pair, metric, "resid_pre", "layer")
        naive = P.naive_patch(model, *pair, metric, "resid_pre", "layer")
    assert hooked["value"].tolist() == naive["value"].tolist()
    assert hooked["value"].tolist() != plain["value"].tolist()


@pytest.mark.unchecked_types
def test_bad_inputs_get_clear_messages(model, pair):
    clean, corrupted = pair
    with pytest.raises(P.PatchingError, match="same length"):
        P.activation_patch(model, clean, corrupted[:, :-1], METRICS["loss"])
    with pytest.raises(P.PatchingError, match="the texts are the same"):
        P.activation_patch(model, clean, clean, METRICS["loss"])
    with pytest.raises(P.PatchingError, match="site must be one of"):
        P.activation_patch(model, clean, corrupted, METRICS["loss"], site="resid")
    with pytest.raises(P.PatchingError, match="patched by 'head'"):
        P.activation_patch(model, clean, corrupted, METRICS["loss"], site="q", by="layer_pos")
    with pytest.raises(P.PatchingError, match="direction"):
        P.activation_patch(model, clean, corrupted, METRICS["loss"], direction="up")
    with pytest.raises(P.PatchingError, match="unknown metric 'lost'"):
        P.activation_patch(model, clean, corrupted, "lost")
    with pytest.raises(P.PatchingError, match="LogitDiff"):
        P.activation_patch(model, clean, corrupted, 3)
    with pytest.raises(P.PatchingError, match="one per row of the batch"):
        P.activation_patch(model, clean, corrupted, P.LogitDiff(answer=[1, 2, 3], wrong=4))
    with pytest.raises(P.PatchingError, match=r"pos=99\) is outside row 0, which has 20 real tokens"):
        P.activation_patch(model, clean, corrupted, P.LogProb(target=1, pos=99))


@pytest.mark.parametrize("receivers", [[(2, 0, "k")], [(1, 1, "q"), (2, 0, "v")], [(2, 0, "k"), (2, 1, "k")]])
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_path_patching_batched_equals_one_forward_per_sender(model, pair, receivers, direction):
    metric = METRICS["logit_diff"]
    fast = P.path_patch(model, *pair, metric, receivers, direction=direction)
    naive = P.path_patch(model, *pair, metric, receivers, direction=direction, method="naive")
    first = min(r[0] for r in receivers)
    assert len(fast) == first * model.cfg.n_heads and (fast["layer"] < first).all()
    torch.testing.assert_close(torch.tensor(fast["value"].values), torch.tensor(naive["value"].values), atol=1e-5, rtol=0)


def test_path_patching_by_hand(model, pair):
    """One path computed from the GPT's own modules: the sender's change added to the receiver's key input only."""
    clean, corrupted = pair
    metric = METRICS["logit_diff"]
    (l1, h1), (l2, h2) = (0, 1), (2, 0)
    got = P.path_patch(model, clean, corrupted, metric, [(l2, h2, "k")], senders=[(l1, h1)])["value"].iloc[0]
    _, cc = model.run_with_cache(clean)
    _, xc = model.run_with_cache(corrupted)
    gpt = model.model
    delta = torch.einsum("bpd,dm->bpm", cc[f"blocks.{l1}.attn.hook_z"][:, :, h1] - xc[f"blocks.{l1}.attn.hook_z"][:, :, h1],
                         gpt.blocks[l1].attn.proj.weight[:, h1 * 8:(h1 + 1) * 8].T)
    blk = gpt.blocks[l2]
    _, k_new, _ = blk.attn.heads(blk.norm1(xc[f"blocks.{l2}.hook_resid_pre"] + delta))  # (B, head, T, d_head)

    def swap_key(k, hook):
        k = k.clone()
        k[:, :, h2] = k_new[:, h2]
        return k

    logits = model.run_with_hooks(corrupted, fwd_hooks=[(f"blocks.{l2}.attn.hook_k", swap_key)])
    want = (logits[:, -1, [3, 9]].diagonal() - logits[:, -1, [8, 1]].diagonal()).mean().item()
    assert got == pytest.approx(want, abs=1e-5)


def test_path_patching_refuses_backward_paths(model, pair):
    with pytest.raises(P.PatchingError, match="not before every receiver"):
        P.path_patch(model, *pair, METRICS["loss"], [(1, 0, "k")], senders=[(1, 1)])
    with pytest.raises(P.PatchingError, match="receiver is"):
        P.path_patch(model, *pair, METRICS["loss"], [(1, 0, "z")])


def test_one_metric_protocol_for_patching_and_ablation(model, pair):
    """The same metric object (or name) runs in activation patching and in the ablation sweep, and means the same
    there: each engine's clean value equals the metric computed by hand from one plain forward."""
    from sprout_interp.circuits.ablation import ablation_sweep

    clean, corrupted = pair
    with torch.no_grad():
        logits = model(clean)
    lp = logits.log_softmax(-1)
    by_hand = {
        "loss": -lp[:, :-1].gather(-1, clean[:, 1:, None]).mean(),
        "logit_diff": (logits[[0, 1], -1, [3, 9]] - logits[[0, 1], -1, [8, 1]]).mean(),
        "log_prob": lp[:, 12, 5].mean(),
        "target": lp[[0, 0], [4, 15], [7, 2]].mean(),
    }
    metrics = {"loss": "loss", "logit_diff": METRICS["logit_diff"], "log_prob": METRICS["log_prob"],
               "target": P.TargetLogProb([4, 15], [7, 2], rows=[0, 0])}
    for name, metric in metrics.items():
        patched = P.activation_patch(model, clean, corrupted, metric, "resid_pre", "layer")
        swept = ablation_sweep(model, clean, metric, heads=[(0, 0)])
        assert patched.attrs["clean"] == pytest.approx(float(by_hand[name]), abs=1e-5), name
        assert swept["clean"].iloc[0] == pytest.approx(float(by_hand[name]), abs=1e-5), name
        naive = P.naive_patch(model, clean, corrupted, metric, "resid_pre", "layer_pos")
        fast = P.activation_patch(model, clean, corrupted, metric, "resid_pre", "layer_pos")
        torch.testing.assert_close(torch.tensor(fast["value"].values), torch.tensor(naive["value"].values), atol=1e-5, rtol=0)


def test_patches_that_change_nothing_give_the_run_exactly(model, pair):
    """Before the first position where the texts differ every stream is the same in both runs (attention is causal),
    and at the first block only the differing positions differ: copying such an activation changes nothing, so its
    value is the patched run's own, exactly (score 0 denoising), as one hooked forward per patch finds to 1e-5."""
    clean, corrupted = pair  # they differ at positions 3 and 11
    metric = METRICS["logit_diff"]
    fast = P.activation_patch(model, clean, corrupted, metric, "resid_pre", "layer_pos")
    naive = P.naive_patch(model, clean, corrupted, metric, "resid_pre", "layer_pos")
    same = (fast["pos"] < 3) | ((fast["layer"] == 0) & ~fast["pos"].isin([3, 11]))
    assert same.sum() == 3 * 3 + 18 - 3
    assert (fast.loc[same, "value"] == fast.attrs["corrupted"]).all() and (fast.loc[same, "score"] == 0).all()
    torch.testing.assert_close(torch.tensor(fast["value"].values), torch.tensor(naive["value"].values), atol=1e-5, rtol=0)
    heads = P.activation_patch(model, clean, corrupted, metric, "z", "head_pos")
    early = heads["pos"] < 3
    assert early.any() and (heads.loc[early, "value"] == heads.attrs["corrupted"]).all()


# -- attribution patching: the first-order term of exact patching ---------------------------------------------


def _slice(site: str, h, p):
    """The index of one patch's slice of an activation (the layouts of the module docstring)."""
    if site == "pattern":
        return (slice(None), h)
    if h is None:
        return (slice(None),) if p is None else (slice(None), p)
    return (slice(None), slice(None), h) if p is None else (slice(None), p, h)


@pytest.fixture(scope="module")
def model64(model) -> HookedSprout:
    import copy

    return HookedSprout(copy.deepcopy(model.model).double())


@pytest.mark.parametrize("site,by", CASES)
def test_attribution_patching_is_the_derivative_of_exact_patching(model64, pair, site, by):
    """Each estimate is the run's value plus the derivative of the exactly patched metric along the straight
    line from the run's activation to the source's, on that patch's slice: checked by a central difference of
    full forwards (float64, so the difference is exact to ~1e-8)."""
    def metric(logits):  # the log-probability of token 2 at the last position, kept in float64 (the metric
        return logits[:, -1].log_softmax(-1)[:, 2].mean()  # objects read logits in float32)

    m, eps = model64, 1e-4
    clean, corrupted = pair
    ap = P.attribution_patch(m, clean, corrupted, metric, site, by)
    _, src = m.run_with_cache(clean, names_filter=lambda n: n.endswith("hook_" + site), return_cache_object=False)
    with torch.no_grad():
        run = float(metric(m(corrupted)))
    assert ap.attrs["run_value"] == pytest.approx(run, abs=1e-9)
    assert ap.attrs["corrupted"] == pytest.approx(run, abs=1e-6)  # read in float32 by the shared metric path
    rows = list(ap.itertuples())
    for r in rows[:: max(1, len(rows) // 12)]:  # a spread of a dozen patches per case
        name = f"blocks.{r.layer}.hook_{site}" if site in ("resid_pre", "resid_mid", "resid_post", "attn_out",
                                                          "mlp_out") else f"blocks.{r.layer}.attn.hook_{site}"
        idx = _slice(site, getattr(r, "head", None), getattr(r, "pos", None))

        def along(t):
            def hook(act, hook):
                act = act.clone()
                act[idx] = act[idx] + t * (src[name][idx] - act[idx])
                return act
            with torch.no_grad():
                return float(metric(m.run_with_hooks(corrupted, fwd_hooks=[(name, hook)])))

        slope = (along(eps) - along(-eps)) / (2 * eps)
        assert r.value - run == pytest.approx(slope, abs=1e-6, rel=1e-5), (site, by, r)


def test_attribution_patching_equals_transformer_lens_backward_hooks(model, pair):
    """The estimate from TransformerLens's own recipe (forward and backward hooks caching each activation and its
    gradient on the corrupted run, then (clean - corrupted) * grad summed over the slice), to float rounding."""
    clean, corrupted = pair
    metric = METRICS["logit_diff"]
    names = [f"blocks.{l}.attn.hook_z" for l in range(model.cfg.n_layers)]
    fwd, grad = {}, {}
    model.zero_grad(set_to_none=True)

    def keep(store):
        def hook(t, hook):  # returns None: the activation (or gradient) is left as it is
            store[hook.name] = t.detach()
        return hook

    with model.hooks(fwd_hooks=[(n, keep(fwd)) for n in names], bwd_hooks=[(n, keep(grad)) for n in names]):
        metric.bind(corrupted, None).from_logits(model(corrupted)).backward()
    model.zero_grad(set_to_none=True)
    _, src = model.run_with_cache(clean, names_filter=names, return_cache_object=False)
    ap = P.attribution_patch(model, clean, corrupted, metric, "z", "head_pos")
    want = torch.stack([((src[n] - fwd[n]) * grad[n]).sum((0, 3)) for n in names])  # (layer, pos, head)
    got = torch.tensor(ap["value"].values).reshape(want.shape) - ap.attrs["run_value"]
    torch.testing.assert_close(got.float(), want, atol=1e-5, rtol=1e-4)
    assert list(ap.columns) == list(P.activation_patch(model, clean, corrupted, metric, "z", "head_pos").columns)


@pytest.mark.acceptance  # over 3 s
def test_attribution_patching_agrees_with_exact_patching_on_the_shipped_sprout():
    """On the dashboard's name pair, the estimates follow exact patching: the stream entering each block by
    position and each head's output rank the patches alike (Pearson r >= 0.85), though a single estimate can be
    off by much (the linear term misses saturation), which is why both are shown."""
    import numpy as np

    import sprout_interp as si
    from sprout_interp.core.tokens import token_id

    m = si.load("sprout")
    clean = ("When the boat came in, old Zorbin Plax was waiting on the pier. The sailors tied the ropes, and the "
             "last man off the boat shook hands with Zorbin")
    corrupted = clean.replace("Zorbin", "Velmat", 1)
    metric = P.LogitDiff(token_id(m, " Pl"), token_id(m, " the"))
    for site, by in (("resid_pre", "layer_pos"), ("z", "head")):
        ex = P.activation_patch(m, clean, corrupted, metric, site, by)
        ap = P.attribution_patch(m, clean, corrupted, metric, site, by)
        assert ap.attrs["clean"] == ex.attrs["clean"] and ap.attrs["corrupted"] == ex.attrs["corrupted"]
        assert np.corrcoef(ex["score"], ap["score"])[0, 1] >= 0.85, site


def test_attribution_patching_refuses_what_it_cannot_differentiate(model, pair):
    clean, corrupted = pair
    with pytest.raises(P.PatchingError, match="not a differentiable scalar"):
        P.attribution_patch(model, clean, corrupted, lambda logits: logits[:, -1, 2].mean().detach())
    with pytest.raises(P.PatchingError, match="patched by 'head'"):
        P.attribution_patch(model, clean, corrupted, METRICS["loss"], site="q", by="layer_pos")
    with pytest.raises(P.PatchingError, match="the texts are the same"):
        P.attribution_patch(model, clean, clean, METRICS["loss"])


def test_patching_agreement_joins_the_two_tables_and_refuses_mismatched_ones(model, pair):
    import numpy as np

    from sprout_interp.plots.patching import patching_agreement_figure

    metric = METRICS["logit_diff"]
    ex = P.activation_patch(model, *pair, metric, "resid_pre", "layer_pos")
    ap = P.attribution_patch(model, *pair, metric, "resid_pre", "layer_pos")
    df = P.patching_agreement(ex, ap)
    assert df[["layer", "pos"]].equals(ex[["layer", "pos"]])
    assert np.allclose(df["error"], ap["score"] - ex["score"])
    assert df.attrs["r"] == pytest.approx(np.corrcoef(ex["score"], ap["score"])[0, 1], abs=1e-12)
    assert df.attrs["max_abs_error"] == pytest.approx((ap["score"] - ex["score"]).abs().max())
    fig = patching_agreement_figure(df)
    assert fig.data[1].mode == "markers" and len(fig.data[1].x) == len(df) and "block" in fig.data[1].text[0]
    heads = P.attribution_patch(model, *pair, metric, "z", "head")
    with pytest.raises(P.PatchingError, match="same texts, site"):
        P.patching_agreement(ex, heads)


@pytest.mark.parametrize("receivers", [[(2, 0, "k")], [(1, 1, "q"), (2, 0, "v")], [(2, 0, "k"), (2, 1, "q")]])
def test_attribution_path_patching_is_the_derivative_of_path_patching(model64, pair, receivers):
    """Each estimate is the run's value plus d/dt at t = 0 of the path-patched metric with the senders' change
    scaled by t, the receivers' inputs recomputed by hand (ln1 then the projection, as path patching does):
    at t = 1 the hand computation is path_patch's exact value, and its central difference is the estimate."""
    def metric(logits):
        return logits[:, -1].log_softmax(-1)[:, 2].mean()

    m, (clean, corrupted) = model64, pair
    senders = [(0, 0), (0, 1), [(0, 0), (1, 1)]] if min(r[0] for r in receivers) == 2 else [(0, 0), (0, 1)]
    ap = P.attribution_path_patch(m, clean, corrupted, metric, receivers, senders)
    ex = P.path_patch(m, clean, corrupted, metric, receivers, senders)
    names = [f"blocks.{l}.attn.hook_z" for l in range(3)] + [f"blocks.{l}.hook_resid_pre" for l in range(3)]
    _, base = m.run_with_cache(corrupted, names_filter=names, return_cache_object=False)
    _, src = m.run_with_cache(clean, names_filter=names, return_cache_object=False)

    def along(st, t):
        hooks = []
        for l2, kind in {(r[0], r[2]) for r in receivers}:
            heads = [r[1] for r in receivers if r[0] == l2 and r[2] == kind]
            delta = sum(((src[f"blocks.{l}.attn.hook_z"][:, :, h] - base[f"blocks.{l}.attn.hook_z"][:, :, h])
                         @ m.W_O[l, h] for l, h in st if l < l2), torch.zeros_like(base[f"blocks.{l2}.hook_resid_pre"]))
            x = base[f"blocks.{l2}.hook_resid_pre"] + t * delta
            normed = x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
            W = {"q": m.W_Q, "k": m.W_K, "v": m.W_V}[kind][l2]  # (head, d_model, d_head), ln1's gain folded in

            def fn(act, hook, heads=heads, new=torch.einsum("bpd,hde->bphe", normed, W)):
                act = act.clone()
                act[:, :, heads] = new[:, :, heads]
                return act
            hooks.append((f"blocks.{l2}.attn.hook_{kind}", fn))
        with torch.no_grad():
            return float(metric(m.run_with_hooks(corrupted, fwd_hooks=hooks)))

    run = along([], 0.0)
    assert ap.attrs["run_value"] == pytest.approx(run, abs=1e-9)
    sets = [[s] if isinstance(s, tuple) else s for s in senders]
    for st, a, e in zip(sets, ap["value"], ex["value"]):
        assert along(st, 1.0) == pytest.approx(e, abs=1e-6)  # the hand computation is path patching
        slope = (along(st, 1e-4) - along(st, -1e-4)) / 2e-4
        assert a - run == pytest.approx(slope, abs=1e-7, rel=1e-5), st
    assert list(ap.columns) == list(ex.columns) and ap.attrs["method"] == "attribution"


def test_attribution_path_patching_ranks_the_shipped_gpt4_previous_token_heads_first():
    """On gpt-4's name pair the estimate of each block-1 head's path to block 2 head 0's keys ranks the heads
    as exact path patching does (block 1 head 2 first, the largest by far)."""
    import sprout_interp as si

    m = si.load("gpt-4")
    clean = "When the boat came in, old Zorbin Plax was waiting. The last man off the boat shook hands with Zorbin"
    corrupted = clean.replace("Zorbin", "Velmat", 1)
    metric = P.LogitDiff(m.to_single_token(" Pl"), m.to_single_token(" the"))
    ex = P.path_patch(m, clean, corrupted, metric, receivers=[(1, 0, "k")])
    ap = P.attribution_path_patch(m, clean, corrupted, metric, receivers=[(1, 0, "k")])
    assert list(ap.sort_values("score")["head"]) == list(ex.sort_values("score")["head"])
    assert ap["score"].idxmax() == ex["score"].idxmax() == 2 and ap["score"].max() > 0
