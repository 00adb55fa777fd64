"""Attribution graphs over a cross-layer transcoder (CLT): each feature of layer i writes to every feed-forward output
j >= i, so its edge into a later node is the sum of what that node reads of each of those writes. Checked against a
float64 forward of the frozen replacement model written out here by hand from the chapter's parameter names (not the
graph's backward passes, not the hooked forward), against the hooked frozen run and by intervention; the kind a
graph uses (the best shipped by default, or the one asked for), its file, and what is refused. Tiny random models with
seeded random CLTs."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import pinned_threads, tiny_config

import sprout_interp as si
from sprout_interp.circuits.attribution_graph import attribution_graph, graph_memory
from sprout_interp.circuits.graph_interventions import frozen_run, intervention_check, intervention_summary, real_run
from sprout_interp.circuits.graphs import load_graph, save_graph
from sprout_interp.circuits.local_replacement import (
    best_kind,
    check_transcoders,
    local_replacement,
    random_clt,
    random_transcoders,
    resolve_transcoders,
    shipped_kinds,
)
from sprout_interp.core.errors import AttributionGraphError, TranscoderMismatchError, TranscoderNotFoundError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.features.clt import save_clt
from sprout_interp.features.transcoder import save_transcoders
from sprout_model import GPT

pytestmark = pytest.mark.unit

TOL = 1e-4


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(pinned_threads())
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedSprout(GPT(tiny_config(n_layer=3)).eval(), name="tiny")


@pytest.fixture(scope="module")
def clt(model):
    return random_clt(model, d_transcoder=48, density=0.1, seed=1)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(1, 64, (12,), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module", params=[True, False], ids=["bos", "nobos"])
def case(request, model, clt, tokens):
    g = attribution_graph(model, tokens, clt, bos=request.param, batch_size=7)
    return g, local_replacement(model, g.tokens, clt, bos=request.param, cross_layer=True)


# -- a float64 frozen replacement model, by hand ----------------------------------------------------------------


@torch.no_grad()
def _hand_inputs(model, rep, acts: torch.Tensor) -> torch.Tensor:
    """Every feature node's input (``W_enc[f] · x``) and the last position's demeaned logits (d_vocab,), float64, in
    the frozen replacement model with the features at ``acts`` (errors, constants and embeddings as on the prompt):
    the chapter's block (RMSNorm, attention, SwiGLU replaced) written out from GPT's own parameters, with the
    prompt's attention patterns and RMSNorm scales held."""
    g = model.model
    d = g.embed.weight.shape[1]
    H = rep.patterns.shape[1]
    dh = d // H
    clt = rep.clt
    A = rep.patterns.double()
    x = g.embed.weight.double()[rep.tokens]
    feat_in = torch.zeros(rep.n_features, dtype=torch.float64)
    acts = acts.double()
    for j, blk in enumerate(g.blocks):
        xn = x / rep.scale1[j].double()[:, None] * blk.norm1.weight.double()
        v = xn @ blk.attn.qkv.weight.double()[2 * d:].T  # (T, d): the heads' values side by side
        z = torch.cat([A[j, h] @ v[:, h * dh:(h + 1) * dh] for h in range(H)], dim=-1)
        x = x + z @ blk.attn.proj.weight.double().T
        xin = x / rep.scale2[j].double()[:, None] * blk.norm2.weight.double()  # what feed-forward j reads
        lo, hi = rep.layer_span(j)
        W_enc = clt.W_enc[j].double()[rep.feat_index[lo:hi]]
        feat_in[lo:hi] = (xin[rep.feat_pos[lo:hi]] * W_enc).sum(-1)
        out = rep.errors[j].double() + rep.consts[j].double()
        for i in range(j + 1):  # every feature of layers 0..j writes here, with its decoder row into layer j
            s0, s1 = rep.layer_span(i)
            dec = clt.W_dec[i].double()[rep.feat_index[s0:s1], j - i]
            out = out.index_add(0, rep.feat_pos[s0:s1], acts[s0:s1, None] * dec)
        x = x + out
    final = x[-1] / rep.scale_final[-1].double() * g.norm.weight.double()
    logits = final @ g.head.weight.double().T
    return feat_in, logits - logits.mean()


def test_the_hand_built_model_replays_the_prompt(model, case):
    _, rep = case
    feat_in, logits = _hand_inputs(model, rep, rep.feat_act)
    torch.testing.assert_close(feat_in, rep.feat_input.double(), rtol=0, atol=1e-5)
    torch.testing.assert_close(logits, (rep.logits - rep.logits.mean()).double(), rtol=0, atol=1e-5)


def test_a_features_edges_are_its_direct_effect_through_every_layer_it_writes_to(model, case):
    """The column of the graph of each of a few layer-0 features (they write to all three layers): the change of
    every later feature's and logit node's input when that feature's activation goes from 0 to its value, all
    else held, in float64 by hand (the frozen model is linear, so the finite difference is exact)."""
    g, rep = case
    nF, nL = g.n_features, g.n_logits
    ids = torch.tensor(g.nodes["token_id"].values[-nL:])
    lo, hi = rep.layer_span(0)
    strong = (g.adjacency[:, lo:hi].abs().sum(0)).argsort(descending=True)[:4] + lo
    for s in strong.tolist():
        off = rep.feat_act.clone()
        off[s] = 0
        f1, l1 = _hand_inputs(model, rep, rep.feat_act)
        f0, l0 = _hand_inputs(model, rep, off)
        want = torch.cat([f1 - f0, (l1 - l0)[ids]])
        got = torch.cat([g.adjacency[:nF, s], g.adjacency[-nL:, s]]).double()
        later = torch.cat([torch.tensor(g.nodes["layer"].values[:nF]) > 0, torch.ones(nL, dtype=torch.bool)])
        assert want.abs().max() > 1e-2  # a real effect
        assert (got - want).abs().max() <= TOL * max(1.0, float(want.abs().max()))
        assert not bool(got[~later].any())  # nothing into its own layer or before
        # the writes to later layers matter: with only its own layer's write the effect is another one
        own = rep.clt.W_dec[0].detach().clone()
        with torch.no_grad():
            rep.clt.W_dec[0][:, 1:] = 0
            try:
                f0b, l0b = _hand_inputs(model, rep, off)
                f1b, l1b = _hand_inputs(model, rep, rep.feat_act)
            finally:
                rep.clt.W_dec[0].copy_(own)
        only_own = torch.cat([f1b - f0b, (l1b - l0b)[ids]])
        assert (only_own - want).abs().max() > 20 * TOL


def test_each_input_is_its_edges_plus_its_constant(model, case):
    g, rep = case
    assert g.max_error() < TOL
    assert g.transcoder_kind == "clt" and g.info["k"] is None and g.info["d_transcoder"] == 48
    const = frozen_run(model, rep, activations=torch.zeros_like(rep.feat_act), embed=False, errors=False)
    ids = torch.tensor(g.nodes["token_id"].values[-g.n_logits:])
    rows = torch.tensor(g.nodes["kind"].isin(["feature", "logit"]).values)
    hooked = torch.cat([const.feature_inputs, const.logits[ids] - const.logits.mean()]).double()
    torch.testing.assert_close(torch.tensor(g.nodes["constant"].values)[rows], hooked, rtol=0, atol=TOL)
    assert g.n_features > 50 and rep.feat_input.abs().max() > 0.5


def test_the_hooked_frozen_run_replays_the_prompt(model, case):
    _, rep = case
    run = frozen_run(model, rep)
    torch.testing.assert_close(run.feature_inputs, rep.feat_input.cpu(), rtol=0, atol=1e-5)
    torch.testing.assert_close(run.logits, rep.logits.cpu(), rtol=0, atol=1e-5)


def test_errors_are_the_feed_forward_output_minus_the_whole_reconstruction(model, clt, case):
    _, rep = case
    dense = []
    for i in range(3):
        a = clt.encode_layer(i, rep.mlp_in[i]).float()
        dense.append(a)
    start = 1 if rep.bos else 0
    for j in range(3):
        want = rep.mlp_out[j] - clt.decode_layer(j, dense).float()
        torch.testing.assert_close(rep.errors[j, start:], want[start:], rtol=0, atol=1e-6)
    assert not bool(rep.errors[:, 0].any()) if rep.bos else True


def test_keeping_fewer_features_stays_exact(model, clt, tokens):
    g = attribution_graph(model, tokens, clt, batch_size=5, max_feature_nodes=25, rerank_every=10)
    assert g.n_features == 25 and g.max_error() < TOL
    assert float(g.nodes["dropped"].abs().max()) > 1e-3  # the dropped features' effect is kept


def test_interventions_on_a_clt_graph(model, clt, case):
    g, _ = case
    df = intervention_check(model, g, clt, n=3)
    s = intervention_summary(df)
    assert float(s["direct_max_error"].max()) < TOL and float(s["total_max_error"].max()) < TOL
    assert (df["direct_predicted"].abs() > 1e-2).any()
    # the real model with a layer-0 feature removed: its decoder writes leave every feed-forward output
    _, rep = case
    node = int(rep.layer_span(0)[0])
    logits, _ = real_run(model, rep, features=[node])
    hooks = []
    for j in range(3):
        vec = rep.feat_act[node] * clt.W_dec[0][rep.feat_index[node], j].detach()

        def cut(act, hook, vec=vec, p=int(rep.feat_pos[node])):
            out = act.clone()
            out[0, p] -= vec
            return out
        hooks.append((f"blocks.{j}.hook_mlp_out", cut))
    with torch.no_grad():
        want = model.run_with_hooks(rep.tokens[None], fwd_hooks=hooks)[0, -1].float()
    torch.testing.assert_close(logits, want, rtol=0, atol=1e-6)


def test_memory_counts_the_decoders_of_every_earlier_layer():
    shape = dict(n_layers=8, d_model=384, n_heads=6, n_pos=40, n_features=8 * 39 * 32, k=32)
    per, cross = graph_memory(**shape), graph_memory(**shape, cross_layer=True)
    L, T, d, k = 8, 40, 384, 32
    assert cross["sources"] - per["sources"] == 4 * T * d * sum(j * k for j in range(L)) + \
        8 * T * sum(j * k for j in range(L)) + 4 * k * T * d
    assert {kk: v for kk, v in cross.items() if kk not in ("sources", "total")} == \
        {kk: v for kk, v in per.items() if kk not in ("sources", "total")}


# -- which kind -------------------------------------------------------------------------------------------------


@pytest.fixture
def checkpoint(tiny_checkpoint, tmp_path):
    """A writable copy of the tiny checkpoint folder, its model loaded from it."""
    folder = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    return folder, si.load(str(folder))


def _ship_per_layer(m, folder, fve: float):
    ts = random_transcoders(m, k=4, d_transcoder=32, skip=False, seed=2)
    for tc in ts:
        tc.info["quality"] = {"layer": tc.layer, "fve": fve}
    save_transcoders(ts, folder / "transcoders", dtype=torch.float32)
    return ts


def _ship_clt(m, folder, fve: float):
    c = random_clt(m, d_transcoder=32, density=0.1, seed=3)
    c.info["quality"] = [{"layer": i, "fve": fve} for i in range(m.cfg.n_layers)]
    save_clt(c, folder / "clt")
    return c


def test_the_best_shipped_kind_is_the_default_and_the_other_is_asked_for(checkpoint):
    folder, m = checkpoint
    text = "Zorbin Plax came home. Zorbin"
    with pytest.raises(TranscoderNotFoundError, match="ships no transcoders"):
        attribution_graph(m, text)
    _ship_per_layer(m, folder, 0.6)
    assert shipped_kinds(m) == {"per_layer": pytest.approx(0.6)} and best_kind(m) == "per_layer"
    assert attribution_graph(m, text).transcoder_kind == "per_layer"
    with pytest.raises(TranscoderNotFoundError, match=r"ships no cross-layer transcoder.*'per_layer'"):
        attribution_graph(m, text, kind="clt")
    _ship_clt(m, folder, 0.7)
    assert shipped_kinds(m) == {"per_layer": pytest.approx(0.6), "clt": pytest.approx(0.7)}
    g = attribution_graph(m, text)
    assert best_kind(m) == "clt" and g.transcoder_kind == "clt" and g.max_error() < TOL
    per = attribution_graph(m, text, kind="per_layer")
    assert per.transcoder_kind == "per_layer" and per.info["k"] == 4 and per.max_error() < TOL
    # a folder names its kind itself
    assert attribution_graph(m, text, str(folder / "clt")).transcoder_kind == "clt"
    assert attribution_graph(m, text, folder / "transcoders").transcoder_kind == "per_layer"
    # the recorded quality decides: the per-layer set now better
    cfg = json.loads((folder / "transcoders" / "config.yaml").read_text())
    for v in cfg["sprout"]["layers"].values():
        v["quality"]["fve"] = 0.9
    (folder / "transcoders" / "config.yaml").write_text(json.dumps(cfg))
    assert best_kind(m) == "per_layer"
    # a kind without a recorded number loses to one with
    cfg["sprout"]["layers"]["0"].pop("quality")
    (folder / "transcoders" / "config.yaml").write_text(json.dumps(cfg))
    kinds = shipped_kinds(m)
    assert kinds["per_layer"] != kinds["per_layer"] and best_kind(m) == "clt"  # NaN
    # interventions on a CLT graph load the shipped CLT when given nothing
    df = intervention_check(m, g, n=1)
    assert float(intervention_summary(df)["direct_max_error"].max()) < TOL


def test_a_tie_keeps_the_per_layer_set(checkpoint):
    folder, m = checkpoint
    _ship_per_layer(m, folder, 0.5)
    _ship_clt(m, folder, 0.5)
    assert best_kind(m) == "per_layer"


def test_graph_predictions_take_the_best_shipped_kind_by_default(checkpoint):
    from sprout_interp.circuits.graph_predictions import logit_predictions

    folder, m = checkpoint
    texts = ["Zorbin Plax came home. Zorbin"]
    kw = dict(k=1, selections=["logit_edge"])
    ts = _ship_per_layer(m, folder, 0.6)
    assert set(logit_predictions(m, texts, **kw)["transcoder_kind"]) == {"per_layer"}
    c = _ship_clt(m, folder, 0.7)
    df = logit_predictions(m, texts, **kw)
    assert set(df["transcoder_kind"]) == {"clt"} and df.equals(logit_predictions(m, texts, c, **kw))
    per = logit_predictions(m, texts, kind="per_layer", **kw)
    assert set(per["transcoder_kind"]) == {"per_layer"} and per.equals(logit_predictions(m, texts, ts, **kw))
    assert not per[["layer", "pos", "feature", "real"]].equals(df[["layer", "pos", "feature", "real"]])


@pytest.mark.unchecked_types
@pytest.mark.parametrize("kind", ["bogus", True, 1, "CLT"])
def test_a_kind_that_is_not_one_is_refused(model, clt, tokens, kind):
    with pytest.raises(AttributionGraphError, match="kind must be one of"):
        attribution_graph(model, tokens, clt, kind=kind)


def test_a_kind_that_does_not_match_the_transcoders_is_refused(model, clt, tokens):
    ts = random_transcoders(model, k=4, d_transcoder=48, seed=1)
    with pytest.raises(AttributionGraphError, match="kind='per_layer' but transcoders is a cross-layer"):
        attribution_graph(model, tokens, clt, kind="per_layer")
    with pytest.raises(AttributionGraphError, match="kind='clt' but transcoders is per-layer"):
        resolve_transcoders(model, ts, "clt")


def test_a_clt_of_another_model_is_refused(clt, tokens):
    torch.manual_seed(1)
    other = HookedSprout(GPT(tiny_config(n_layer=2)).eval(), name="other")
    with pytest.raises(TranscoderMismatchError, match="spans 3 layers"):
        attribution_graph(other, tokens, clt)
    same_shape = HookedSprout(GPT(tiny_config(n_layer=3)).eval(), name="same-shape")  # other weights
    with pytest.raises(TranscoderMismatchError, match="another checkpoint"):
        attribution_graph(same_shape, tokens, clt)


@pytest.mark.unchecked_types
def test_analyses_that_read_per_layer_transcoders_refuse_a_clt(model, clt, tokens):
    with pytest.raises(TranscoderMismatchError, match="per-layer transcoders"):
        check_transcoders(model, clt)
    with pytest.raises(TranscoderMismatchError, match="per-layer transcoders"):
        local_replacement(model, tokens, clt)
    with pytest.raises(AttributionGraphError, match="cross_layer must be True or False"):
        local_replacement(model, tokens, clt, cross_layer=1)
    # QK attributions and head loadings take a CLT (tests/circuits/test_qk_attribution.py), and so do graph
    # predictions (below)


# -- the file ---------------------------------------------------------------------------------------------------


def test_the_kind_travels_in_the_file(case, tmp_path):
    g, _ = case
    back = load_graph(save_graph(g, tmp_path / "g.safetensors"))
    assert back.transcoder_kind == "clt" and back.info["k"] is None
    assert torch.equal(back.adjacency, g.adjacency)
    assert back.max_error() < TOL


def test_a_file_without_a_kind_loads_as_per_layer_and_a_bad_kind_is_refused(case, tmp_path):
    g, _ = case
    from dataclasses import replace

    old = replace(g, info={k: v for k, v in g.info.items() if k != "transcoder_kind"})
    assert load_graph(save_graph(old, tmp_path / "old.safetensors")).transcoder_kind == "per_layer"
    bad = replace(g, info={**g.info, "transcoder_kind": "both"})
    with pytest.raises(AttributionGraphError, match="'transcoder_kind' must be one of"):
        load_graph(save_graph(bad, tmp_path / "bad.safetensors"))


def test_a_folder_without_transcoders_is_refused(model, tokens, tmp_path):
    with pytest.raises(TranscoderNotFoundError, match="holds no config.yaml"):
        attribution_graph(model, tokens, str(tmp_path))


def test_the_memory_estimate_counts_this_prompts_sources(model, case):
    """The sources part of a CLT graph's estimate (what its budget decides with) is what the backward allocates:
    each layer's sources hold every earlier layer's features at a position."""
    from sprout_interp.circuits.attribution_graph import FrozenBackward

    _, rep = case
    bw = FrozenBackward(model, rep, 0, 1, token_images=False)
    L, T, d = 3, rep.tokens.numel(), 16
    counts = torch.zeros(L, T, dtype=torch.long)
    counts.index_put_((rep.feat_layer, rep.feat_pos), torch.ones_like(rep.feat_pos), accumulate=True)
    slots = int((counts.cumsum(0).max(dim=1).values + 2).sum())
    k = int(counts.max())
    est = graph_memory(L, d, 2, T, rep.n_features, k, cross_layer=True, source_slots=slots)
    assert sum(t.numel() for t in bw.srcT) * 4 == 4 * T * d * slots
    assert est["sources"] == 4 * T * d * slots + 8 * T * slots + 4 * L * T * d * 4 + 4 * k * T * d
    assert slots < sum((j + 1) * k + 2 for j in range(L))  # tighter than the bound from k alone


# -- how well a CLT graph predicts the real model (circuits/graph_predictions.py) ------------------------------


@torch.no_grad()
def _real_removal_by_hand(model, clt, tokens: torch.Tensor, layer: int, pos: int, feature: int,
                          writes=None) -> tuple[float, int]:
    """The real model with one CLT feature's writes taken out of the feed-forward outputs ``writes`` (default: its
    own and every later one) at ``pos``, its activation read off the CLT's encoder and JumpReLU on the true
    feed-forward input: the change of the top token's logit minus the mean logit, and that token."""
    base = model(tokens[None])[0, -1]
    target = int(base.argmax())
    name = act_name("normalized", layer, "ln2")
    _, cache = model.run_with_cache(tokens[None], names_filter=[name])
    x = cache[name][0, pos] * model.blocks[layer].ln2.w
    act = float(clt.encode_layer(layer, x)[feature])
    assert act != 0
    hooks = []
    for j in (range(layer, clt.n_layers) if writes is None else writes):
        write = act * clt.W_dec[layer][feature, j - layer].detach()

        def cut(out, hook, write=write):
            out = out.clone()
            out[0, pos] -= write
            return out

        hooks.append((act_name("mlp_out", j), cut))
    after = model.run_with_hooks(tokens[None], fwd_hooks=hooks)[0, -1]
    return float((after[target] - after.mean()) - (base[target] - base.mean())), target


def _hand_linear_logits(model, rep, node: int, value: float) -> torch.Tensor:
    """The last position's demeaned logits (float64) of the frozen linear replacement model, by hand: feature ``node``
    held at ``value``, every other feature following its pre-activation (``W_enc[f] · x + b_enc[f]``, the active set
    fixed), errors, constants and embeddings as on the prompt. A layer's features read only earlier layers' writes,
    so one pass of the hand-built model per layer reaches the fixed point."""
    clt = rep.clt
    b_enc = torch.cat([clt.b_enc[i].detach().double()[rep.feat_index[slice(*rep.layer_span(i))]]
                       for i in range(clt.n_layers)])
    acts = rep.feat_act.double().clone()
    for _ in range(clt.n_layers):
        acts[node] = value
        feat_in, _ = _hand_inputs(model, rep, acts)
        acts = feat_in + b_enc
    acts[node] = value
    return _hand_inputs(model, rep, acts)[1]


def _top(score: torch.Tensor, k: int) -> list[int]:
    """The ``k`` nodes of largest ``score`` (float64), strongest first, asserting a clear margin between each and the
    next, so that no near-tie decides which are picked nor their ranks."""
    order = score.argsort(descending=True)
    for j in range(k):
        gap = float(score[order[j]] - score[order[j + 1]])
        assert gap > 1e-3 * float(score.abs().max()), "a near-tie among the picks: pick another seed"
    return order[:k].tolist()


@pytest.fixture(scope="module")
def loud():
    """The test model with its final norm's gain 100 times larger (its logits and their changes too: about 0.01 to
    0.1 for one feature's removal, not 1e-4), and a random CLT of it."""
    torch.manual_seed(0)
    gpt = GPT(tiny_config(n_layer=3)).eval()
    with torch.no_grad():
        gpt.norm.weight.mul_(100.0)
    m = HookedSprout(gpt, name="tiny-loud")
    return m, random_clt(m, d_transcoder=48, density=0.1, seed=1)


def test_predictions_over_a_clt_are_real_removals_of_every_write_each_prompt_alone(loud):
    """logit_predictions over a CLT against, on two prompts of unequal length: each removal in the real model written
    out with hooks (every write of the feature), each prompt alone, the picks and predictions of graphs made anew,
    and the frozen graph's total against the frozen linear replacement model by hand in float64."""
    from sprout_interp.circuits.graph_predictions import logit_predictions, logit_totals, prediction_summary
    from sprout_interp.circuits.graphs import node_influence

    model, clt = loud
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randint(1, 64, (9,), generator=gen), torch.randint(1, 64, (14,), generator=gen)
    df = logit_predictions(model, [a, b], clt, k=2)
    assert set(df["transcoder_kind"]) == {"clt"}
    assert set(df["final_norm"]) == {"frozen", "jacobian"} and set(df["select"]) == {"influence", "logit_edge",
                                                                                      "last_layer"}
    assert sorted(df.groupby("text")["n_pos"].first().tolist()) == [10, 15]  # <|endoftext|> first
    assert (df[df["select"] == "last_layer"]["layer"] == 2).all()
    assert len(df) == 2 * 3 * 2 * 2
    # each removal in the real model, by hand: every write of the feature, its own layer's and each later one's
    own_only_differs = 0
    for _, r in df.drop_duplicates(["text", "layer", "pos", "feature"]).iterrows():
        toks = torch.cat([torch.tensor([0]), (a, b)[r["text"]]])
        args = (model, clt, toks, int(r["layer"]), int(r["pos"]), int(r["feature"]))
        want, target = _real_removal_by_hand(*args)
        assert target == r["target"]
        assert abs(r["real"] - want) < 1e-6
        if r["layer"] < 2:  # its writes to later layers matter: its own layer's alone is another removal
            own, _ = _real_removal_by_hand(*args, writes=[int(r["layer"])])
            own_only_differs += abs(own - want) > 1e-4
    assert own_only_differs >= 3
    # each prompt alone gives the same rows
    alone = logit_predictions(model, [b], clt, k=2)
    two = df[df["text"] == 1].drop(columns="text").reset_index(drop=True)
    cols = [c for c in two.columns if c != "text"]
    assert alone[cols].reset_index(drop=True).equals(two[cols])
    for i, text in enumerate((a, b)):
        toks = torch.cat([torch.tensor([0]), text])
        rows = df[df["text"] == i]
        target = int(rows["target"].iloc[0])
        graphs = {mode: attribution_graph(model, toks, clt, attribution_targets=[target], final_norm=mode)
                  for mode in ("frozen", "jacobian")}
        # the picks: the k strongest in the frozen graph by each rule, in float64 and clear of the next
        g = graphs["frozen"]
        nF = g.n_features
        edge = g.adjacency[-1, :nF].double().abs()
        last = torch.tensor(g.nodes["layer"].values[:nF]) == 2
        scores = {"influence": node_influence(g)[:nF].double(), "logit_edge": edge,
                  "last_layer": torch.where(last, edge, torch.full_like(edge, -1.0))}
        for sel, score in scores.items():
            picked = rows[(rows["select"] == sel) & (rows["final_norm"] == "frozen")].sort_values("rank")["node"]
            assert picked.tolist() == _top(score, 2), (i, sel)
        # predictions are the graphs' own
        for mode, gr in graphs.items():
            keys = {(int(x), int(y), int(z)): j for j, (x, y, z) in
                    enumerate(zip(gr.nodes["layer"][:gr.n_features], gr.nodes["pos"], gr.nodes["feature"]))}
            for _, r in rows[rows["final_norm"] == mode].iterrows():
                s = keys[(r["layer"], r["pos"], r["feature"])]
                assert abs(r["predicted_direct"] + float(gr.adjacency[-1, s])) < 1e-6
                assert abs(r["predicted_total"] + float(logit_totals(gr)[s])) < 1e-9
        # the frozen graph's total is the frozen linear replacement model's change, by hand in float64
        rep = local_replacement(model, toks, clt, cross_layer=True)
        rep_keys = {(int(x), int(y), int(z)): j for j, (x, y, z) in
                    enumerate(zip(rep.feat_layer.tolist(), rep.feat_pos.tolist(), rep.feat_index.tolist()))}
        through_later = 0
        for _, r in rows[rows["final_norm"] == "frozen"].drop_duplicates(["layer", "pos", "feature"]).iterrows():
            node = rep_keys[(r["layer"], r["pos"], r["feature"])]
            keep = _hand_linear_logits(model, rep, node, float(rep.feat_act[node]))
            off = _hand_linear_logits(model, rep, node, 0.0)
            want = float(off[target] - keep[target])
            assert abs(want) > 1e-2  # a real effect
            assert abs(r["predicted_total"] - want) < 1e-6, (i, r["layer"], r["feature"])
            through_later += abs(r["predicted_total"] - r["predicted_direct"]) > 5e-5
        assert through_later >= 1  # paths through later features count
    summary = prediction_summary(df)
    assert list(summary.columns) == ["transcoder_kind", "select", "final_norm", "removals", "prompts", "r",
                                     "sign_agreement", "median_rel_error"]
    assert (summary["transcoder_kind"] == "clt").all() and (summary["removals"] == 4).all()


def test_predictions_take_the_kind_as_graphs_do(model, clt, tokens):
    from sprout_interp.circuits.graph_predictions import logit_predictions

    with pytest.raises(AttributionGraphError, match="kind='per_layer' but transcoders is a cross-layer"):
        logit_predictions(model, [tokens], clt, kind="per_layer")
    with pytest.raises(AttributionGraphError, match="kind must be one of"):
        logit_predictions(model, [tokens], clt, kind="CLT")
