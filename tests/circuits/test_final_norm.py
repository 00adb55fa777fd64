"""The final norm's first-order correction of an attribution graph's logit rows (``final_norm="jacobian"``) and the
measure of how well a graph predicts the real model (circuits/graph_predictions.py): the norm's Jacobian against
autograd's, each logit edge against the real model's directional derivative (float64 autograd, everything before the
final norm frozen as in the graph, written out here with the model's own hooks), the rows still adding up, and the
measuring function against a hand-written loop of real interventions on two prompts of unequal length."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from conftest import pinned_threads, tiny_config

from sprout_interp.circuits.attribution_graph import attribution_graph
from sprout_interp.circuits.graph_interventions import ablation_prediction, frozen_run, intervention_check
from sprout_interp.circuits.graph_predictions import (
    logit_predictions,
    logit_totals,
    prediction_summary,
)
from sprout_interp.circuits.graphs import load_graph
from sprout_interp.circuits.local_replacement import local_replacement, random_transcoders, rms_norm_jacobian
from sprout_interp.core.errors import AttributionGraphError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout
from sprout_model import GPT
from sprout_model.model import RMSNorm

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


@pytest.fixture(scope="module", params=[True, False], ids=["skip", "noskip"])
def ts(request, model):
    return random_transcoders(model, k=4, d_transcoder=48, skip=request.param, seed=1)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(1, 64, (12,), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def graphs(model, ts, tokens):
    return {mode: attribution_graph(model, tokens, ts, final_norm=mode) for mode in ("frozen", "jacobian")}


@pytest.mark.parametrize("eps", [1e-6, 0.3])  # a large eps: the formula must carry it, not drop it
def test_the_norms_jacobian_is_autograds(eps):
    g = torch.Generator().manual_seed(0)
    d = 16
    x = torch.randn(d, generator=g, dtype=torch.float64) * 0.4  # small, so eps is a real part of the scale
    norm = RMSNorm(d, eps=eps).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(d, generator=g, dtype=torch.float64))
    want = torch.autograd.functional.jacobian(lambda v: norm(v), x)
    got = rms_norm_jacobian(x, norm.weight, eps)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # the norm undoes a scaling of the whole stream but for eps: J x = (eps / s²) y
    s2 = x.pow(2).mean() + eps
    torch.testing.assert_close(got @ x, eps / s2 * norm(x), rtol=0, atol=1e-12)
    assert (got @ x).abs().max() > 1e-3 if eps > 0.1 else True


def _derivative(m64: HookedSprout, ts64, tokens: torch.Tensor, bos: bool, target: int, writes: dict) -> float:
    """float64 autograd: d/dε at ε = 0 of the last position's (logit[target] - mean logit) with ε times ``writes``
    added (``{("embed", None): (pos, d) tensor}`` or ``{("mlp_out", layer): (pos, d)}``), everything before the final
    norm frozen as in the graph (attention patterns and ln1 / ln2 scales at their clean values; each feed-forward's
    output its clean value plus its transcoder's skip connection's change, i.e. every feature, error and constant
    held), the final norm live."""
    L = m64.cfg.n_layers
    names = [act_name(n, i) for i in range(L) for n in ("pattern", "mlp_out")]
    names += [act_name("scale", i, ln) for i in range(L) for ln in ("ln1", "ln2")]
    names += [act_name("normalized", i, "ln2") for i in range(L)]
    with torch.no_grad():
        _, cache = m64.run_with_cache(tokens[None], names_filter=names)
    eps = torch.zeros((), dtype=torch.float64, requires_grad=True)
    x_ln2 = {}

    def const(name):
        return lambda act, hook: cache[name].detach().clone()

    def grab(act, hook, i):
        x_ln2[i] = act[0] * m64.blocks[i].ln2.w
        return act

    def mlp(act, hook, i):
        tc = ts64[i]
        x_clean = cache[act_name("normalized", i, "ln2")][0] * m64.blocks[i].ln2.w
        out = cache[act_name("mlp_out", i)][0] + tc.skip(x_ln2.pop(i)) - tc.skip(x_clean)
        if ("mlp_out", i) in writes:
            out = out + eps * writes[("mlp_out", i)]
        return out[None]

    hooks = []
    if ("embed", None) in writes:
        hooks.append((act_name("embed"), lambda act, hook: act + eps * writes[("embed", None)][None]))
    for i in range(L):
        hooks += [(act_name("pattern", i), const(act_name("pattern", i))),
                  (act_name("scale", i, "ln1"), const(act_name("scale", i, "ln1"))),
                  (act_name("scale", i, "ln2"), const(act_name("scale", i, "ln2"))),
                  (act_name("normalized", i, "ln2"), lambda act, hook, i=i: grab(act, hook, i)),
                  (act_name("mlp_out", i), lambda act, hook, i=i: mlp(act, hook, i))]
    with torch.enable_grad():
        logits = m64.run_with_hooks(tokens[None], fwd_hooks=hooks)[0, -1]
        (d,) = torch.autograd.grad(logits[target] - logits.mean(), eps)
    return float(d)


@pytest.mark.parametrize("bos", [True, False], ids=["bos", "nobos"])
def test_a_jacobian_logit_edge_is_the_real_directional_derivative(model, ts, tokens, bos):
    g = attribution_graph(model, tokens, ts, bos=bos, final_norm="jacobian")
    frozen = attribution_graph(model, tokens, ts, bos=bos)
    rep = local_replacement(model, g.tokens, ts, bos=bos)
    m64 = HookedSprout(copy.deepcopy(model.model).double(), name="tiny64")
    ts64 = {i: copy.deepcopy(ts[i]).double() for i in range(model.cfg.n_layers)}
    L, T, nF, d = g.n_layers, g.n_pos, g.n_features, model.cfg.d_model
    last_layer = [i for i in range(nF) if int(rep.feat_layer[i]) == L - 1 and int(rep.feat_pos[i]) == T - 1]
    sources = {"a last-layer feature at the last position": last_layer[0],
               "a layer-0 feature": 0 if bos is False else int((rep.feat_pos == 1).nonzero()[0, 0]),
               "error of layer 1 at position 5": nF + T + 5, "token 3": nF + L * T + 3}
    n_logits = g.n_logits
    far = 0.0
    for what, s in sources.items():
        write = torch.zeros(T, d, dtype=torch.float64)
        if s < nF:
            layer, pos = int(rep.feat_layer[s]), int(rep.feat_pos[s])
            write[pos] = float(rep.feat_act[s]) * ts64[layer].W_dec.detach()[int(rep.feat_index[s])]
            key = ("mlp_out", layer)
        elif s < nF + L * T:
            layer, pos = divmod(s - nF, T)
            x = rep.mlp_in[layer, pos].double()  # the error: the true output minus the transcoder's, at that point
            write[pos] = rep.mlp_out[layer, pos].double() - ts64[layer](x)
            key = ("mlp_out", layer)
        else:
            pos = s - nF - L * T
            write[pos] = m64.model.embed.weight.detach()[int(g.tokens[pos])]
            key = ("embed", None)
        for j in range(n_logits):
            target = int(g.nodes["token_id"].iloc[-n_logits + j])
            want = _derivative(m64, ts64, g.tokens, bos, target, {key: write})
            got = float(g.adjacency[len(g.nodes) - n_logits + j, s])
            assert abs(got - want) < TOL + 1e-3 * abs(want), (what, j, got, want)
            far = max(far, abs(float(frozen.adjacency[len(g.nodes) - n_logits + j, s]) - want))
    assert far > 5 * TOL  # the frozen scale's edges are not these: the test can tell them apart


def test_feature_rows_are_the_same_and_logit_rows_still_add_up(model, ts, tokens, graphs):
    fro, jac = graphs["frozen"], graphs["jacobian"]
    nL = fro.n_logits
    assert torch.equal(fro.adjacency[:-nL], jac.adjacency[:-nL])
    assert not torch.allclose(fro.adjacency[-nL:], jac.adjacency[-nL:], atol=1e-3)
    assert jac.max_error() < TOL and fro.max_error() < TOL
    assert fro.info["final_norm"] == "frozen" and jac.info["final_norm"] == "jacobian"
    # the constant: the Jacobian applied to the constant writes, plus (1 - eps/s²) of the input; the first part is the
    # derivative along every constant write, run by hand in float64
    rep = local_replacement(model, jac.tokens, ts)
    m64 = HookedSprout(copy.deepcopy(model.model).double(), name="tiny64")
    ts64 = {i: copy.deepcopy(ts[i]).double() for i in range(model.cfg.n_layers)}
    writes = {}
    for i in range(model.cfg.n_layers):
        w = ts64[i].b_dec.detach().expand(jac.n_pos, -1).clone()
        x0 = rep.mlp_in[i, 0].double()
        w[0] = rep.mlp_out[i, 0].double() - ts64[i].skip(x0)  # bos: position 0's whole output beyond the skip
        writes[("mlp_out", i)] = w
    s2 = float(rep.scale_final[-1]) ** 2
    eps = model.ln_final.eps
    for j in range(nL):
        node = jac.nodes.iloc[-nL + j]
        want = _derivative(m64, ts64, jac.tokens, True, int(node["token_id"]), writes)
        got = node["constant"] - (1 - eps / s2) * node["input"]
        assert abs(got - want) < TOL, (j, got, want)


@pytest.mark.unchecked_types
def test_the_choice_travels_in_the_graph_file_and_is_checked(model, ts, tokens, graphs, tmp_path):
    back = load_graph(graphs["jacobian"].save(tmp_path / "g.safetensors"))
    assert back.info["final_norm"] == back.final_norm == "jacobian" and "final norm: jacobian" in repr(back)
    assert graphs["frozen"].final_norm == "frozen" and "final norm" not in repr(graphs["frozen"])
    torch.testing.assert_close(back.adjacency, graphs["jacobian"].adjacency, rtol=0, atol=0)
    older = dataclasses.replace(graphs["frozen"], info={k: v for k, v in graphs["frozen"].info.items()
                                                         if k != "final_norm"})
    assert load_graph(older.save(tmp_path / "older.safetensors")).final_norm == "frozen"  # a file from before
    bogus = dataclasses.replace(graphs["frozen"], info={**graphs["frozen"].info, "final_norm": "live"})
    with pytest.raises(AttributionGraphError, match="final_norm"):
        load_graph(bogus.save(tmp_path / "bogus.safetensors"))
    for bad in ("Jacobian", "real", None, True):
        with pytest.raises(AttributionGraphError, match="final_norm"):
            attribution_graph(model, tokens, ts, final_norm=bad)


def test_the_frozen_models_check_refuses_a_jacobian_graph(model, ts, graphs):
    with pytest.raises(AttributionGraphError, match="final_norm='frozen'"):
        intervention_check(model, graphs["jacobian"], ts, n=1)


def test_totals_are_ablation_predictions_and_the_frozen_model(model, ts, tokens, graphs):
    for mode, g in graphs.items():
        totals = logit_totals(g)
        for s in (0, g.n_features // 2, g.n_features - 1, g.n_features + 3, len(g.nodes) - g.n_logits - 1):
            want = ablation_prediction(g, [s])["total_logits"][0]
            assert abs(float(totals[s]) + float(want)) < TOL, (mode, s)
    # the frozen graph's total is the frozen linear replacement model's change with that feature held at 0
    g, rep = graphs["frozen"], local_replacement(model, graphs["frozen"].tokens, ts)
    target = int(g.nodes["token_id"].iloc[-g.n_logits])
    base = frozen_run(model, rep, linear=True).logits
    s = g.n_features - 1
    acts = rep.feat_act.clone()
    acts[s] = 0
    held = torch.zeros_like(acts, dtype=torch.bool)
    held[s] = True
    after = frozen_run(model, rep, activations=acts, linear=True, held=held).logits
    change = float((after[target] - after.mean()) - (base[target] - base.mean()))
    assert abs(change + float(logit_totals(g)[s])) < TOL


@torch.no_grad()
def _real_by_hand(model, ts, tokens: torch.Tensor, layer: int, pos: int, feature: int) -> tuple[float, int]:
    """The real model with one transcoder feature's write taken out of block ``layer``'s feed-forward output at
    ``pos`` (its activation read off the transcoder on the true feed-forward input), its top token's logit minus
    the mean logit: the change, and that token."""
    base = model(tokens[None])[0, -1]
    target = int(base.argmax())
    _, cache = model.run_with_cache(tokens[None], names_filter=[act_name("normalized", layer, "ln2")])
    x = cache[act_name("normalized", layer, "ln2")][0, pos] * model.blocks[layer].ln2.w
    act = float(ts[layer].encode(x)[feature])
    assert act != 0
    write = act * ts[layer].W_dec.detach()[feature]

    def hook(out, hook):
        out = out.clone()
        out[0, pos] -= write
        return out

    after = model.run_with_hooks(tokens[None], fwd_hooks=[(act_name("mlp_out", layer), hook)])[0, -1]
    return float((after[target] - after.mean()) - (base[target] - base.mean())), target


@pytest.fixture(scope="module", params=[True, False], ids=["skip", "noskip"])
def loud(request):
    """The test model with its final norm's gain 100 times larger, so one feature's removal moves the target's logit
    by up to about 1e-2 rather than 1e-4 (the comparison, to 1e-6 plus 1e-4 of the change, can then fail), and its transcoders."""
    torch.manual_seed(0)
    gpt = GPT(tiny_config(n_layer=3)).eval()
    with torch.no_grad():
        gpt.norm.weight.mul_(100.0)
    m = HookedSprout(gpt, name="tiny-loud")
    return m, random_transcoders(m, k=4, d_transcoder=48, skip=request.param, seed=1)


def test_the_measure_is_a_loop_of_real_removals_each_prompt_alone(loud):
    model, ts = loud
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randint(1, 64, (9,), generator=gen), torch.randint(1, 64, (14,), generator=gen)
    df = logit_predictions(model, [a, b], ts, k=2)
    assert set(df["transcoder_kind"]) == {"per_layer"}  # over a CLT: tests/circuits/test_clt_graph.py
    assert set(df["final_norm"]) == {"frozen", "jacobian"} and set(df["select"]) == {"influence", "logit_edge",
                                                                                      "last_layer"}
    assert sorted(df.groupby("text")["n_pos"].first().tolist()) == [10, 15]  # <|endoftext|> first
    assert (df[df["select"] == "last_layer"]["layer"] == model.cfg.n_layers - 1).all()
    assert len(df) == 2 * 3 * 2 * 2
    biggest = 0.0
    for _, r in df.drop_duplicates(["text", "layer", "pos", "feature"]).iterrows():
        toks = torch.cat([torch.tensor([0]), (a, b)[r["text"]]])
        want, target = _real_by_hand(model, ts, toks, int(r["layer"]), int(r["pos"]), int(r["feature"]))
        assert target == r["target"]
        assert abs(r["real"] - want) < 1e-6 + 1e-4 * abs(want)
        biggest = max(biggest, abs(want))
    assert biggest > 5e-3  # the removals move the logit far more than the tolerance: a wrong removal fails
    # each prompt alone gives the same rows
    alone = logit_predictions(model, [b], ts, k=2)
    two = df[df["text"] == 1].drop(columns="text").reset_index(drop=True)
    cols = [c for c in two.columns if c != "text"]
    assert alone[cols].reset_index(drop=True).equals(two[cols])
    # predictions are the graphs' own
    for mode in ("frozen", "jacobian"):
        g = attribution_graph(model, torch.cat([torch.tensor([0]), a]), ts, attribution_targets=[int(
            df[df["text"] == 0]["target"].iloc[0])], final_norm=mode)
        rows = df[(df["text"] == 0) & (df["final_norm"] == mode)]
        for _, r in rows.iterrows():
            assert abs(r["predicted_direct"] + float(g.adjacency[-1, int(r["node"])])) < 1e-6
            assert abs(r["predicted_total"] + float(logit_totals(g)[int(r["node"])])) < 1e-9
    summary = prediction_summary(df)
    assert list(summary.columns) == ["transcoder_kind", "select", "final_norm", "removals", "prompts", "r",
                                     "sign_agreement", "median_rel_error"]
    one = summary[(summary["select"] == "influence") & (summary["final_norm"] == "jacobian")].iloc[0]
    sub = df[(df["select"] == "influence") & (df["final_norm"] == "jacobian")]
    p, r = torch.tensor(sub["predicted_total"].values), torch.tensor(sub["real"].values)
    assert one["removals"] == 4 and one["prompts"] == 2
    assert abs(one["r"] - float(torch.corrcoef(torch.stack([p, r]))[0, 1])) < 1e-9
    assert one["sign_agreement"] == float(((p > 0) == (r > 0)).double().mean())
    assert abs(one["median_rel_error"] - float(((p - r).abs() / r.abs()).median())) < 1e-12
    by_block = prediction_summary(df, by=["block"])
    assert by_block.groupby(["select", "final_norm"])["removals"].sum().eq(4).all()
    with pytest.raises(AttributionGraphError, match="by"):
        prediction_summary(df, by=["no such column"])


@pytest.mark.unchecked_types
@pytest.mark.parametrize("kw, match", [(dict(texts="one text"), "list"), (dict(texts=[]), "list"),
                                       (dict(k=0), "k"), (dict(selections=["largest"]), "selections"),
                                       (dict(selections="influence"), "selections"), (dict(bos=1), "bos")])
def test_bad_arguments_to_the_measure_are_refused(model, ts, kw, match):
    args = dict(texts=[torch.tensor([1, 2, 3])])
    args.update(kw)
    with pytest.raises(AttributionGraphError, match=match):
        logit_predictions(model, args.pop("texts"), ts, **args)
