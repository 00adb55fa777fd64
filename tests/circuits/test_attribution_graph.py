"""Attribution graphs: exact against an independent run of the frozen replacement model (the model's own hooked
forward with patterns and norm scales held), checked by intervention in the frozen and the real model, circuit-tracer's
node order, logit choice, pruning and scores, the graph file and what it refuses. Tiny random models with random
transcoders; the shipped gpt-4 with seeded random transcoders on the chapter's name-copying prompt."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import pinned_threads, tiny_config
from safetensors.torch import save_file

import sprout_interp as si
from sprout_interp.circuits.attribution_graph import attribution_graph, graph_macs
from sprout_interp.circuits.graph_interventions import (
    ablation_prediction,
    copy_positions,
    cut_attention,
    frozen_run,
    intervention_check,
    intervention_summary,
    real_run,
)
from sprout_interp.circuits.graphs import (
    AttributionGraph,
    graph_scores,
    load_graph,
    node_influence,
    normalized_adjacency,
    prune_graph,
)
from sprout_interp.circuits.local_replacement import local_replacement, random_transcoders, salient_logits
from sprout_interp.core.errors import (
    AttributionGraphError,
    NotAPathError,
    TranscoderMismatchError,
    TranscoderNotFoundError,
    UnequalLengthsError,
)
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.core.texts import TEXTS
from sprout_interp.features.transcoder import TranscoderSet
from sprout_model import GPT

pytestmark = pytest.mark.unit

TOL = 1e-4


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """These tensors are small: one thread spends no time handing work between threads on a shared machine
    (SPROUT_TEST_THREADS, where set, instead)."""
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


@pytest.fixture(scope="module", params=[True, False], ids=["bos", "nobos"])
def case(request, model, ts, tokens):
    g = attribution_graph(model, tokens, ts, bos=request.param, batch_size=7)
    return g, local_replacement(model, g.tokens, ts, bos=request.param), ts


def _targets(g: AttributionGraph) -> torch.Tensor:
    return torch.tensor(g.nodes["kind"].isin(["feature", "logit"]).values)


def _node_inputs(g: AttributionGraph, run) -> torch.Tensor:
    """What the frozen run gives each feature and logit node as its input (the graph's units)."""
    ids = torch.tensor(g.nodes["token_id"].values[-g.n_logits:])
    return torch.cat([run.feature_inputs, run.logits[ids] - run.logits.mean()]).double()


# -- exactness ---------------------------------------------------------------------------------------------------


def test_each_input_is_its_incoming_edges_plus_the_constant_run_by_hand(model, case):
    g, rep, _ = case
    # the constant: the frozen model with every node's write removed (embeddings, features, errors), run forward
    const = frozen_run(model, rep, activations=torch.zeros_like(rep.feat_act), embed=False, errors=False)
    inputs = torch.cat([rep.feat_input.double(), (rep.logits[g.nodes["token_id"].values[-g.n_logits:].copy()]
                                                  - rep.logits.mean()).double()])
    rows = _targets(g)
    got = g.adjacency[rows].double().sum(1) + _node_inputs(g, const)
    assert (inputs - got).abs().max() < TOL
    assert g.max_error() < TOL
    torch.testing.assert_close(torch.tensor(g.nodes["constant"].values)[rows], _node_inputs(g, const), rtol=0,
                               atol=TOL)
    assert inputs.abs().max() > 0.5  # the inputs are not all tiny, so the tolerance means something


def test_edges_are_what_one_source_alone_does_in_the_frozen_model(model, case):
    g, rep, _ = case
    L, T, nF = g.n_layers, g.n_pos, g.n_features
    zero = torch.zeros_like(rep.feat_act)
    lo1, hi1 = rep.layer_span(1)
    sources = {"first feature": 0, "a layer-1 feature": lo1 + (hi1 - lo1) // 2, "last feature": nF - 1,
               "error 0, last pos": nF + T - 1, "error 1, pos 5": nF + T + 5, "token 3": nF + L * T + 3,
               "token 0": nF + L * T}
    rows = _targets(g)
    for what, s in sources.items():
        acts, emb, err = zero.clone(), torch.zeros(T), torch.zeros(L, T)
        if s < nF:
            acts[s] = rep.feat_act[s]
        elif s < nF + L * T:
            err.view(-1)[s - nF] = 1.0
        else:
            emb[s - nF - L * T] = 1.0
        run = frozen_run(model, rep, activations=acts, embed=emb, errors=err, consts=False)
        torch.testing.assert_close(g.adjacency[rows, s].double(), _node_inputs(g, run), rtol=0, atol=TOL, msg=what)


def test_the_frozen_replacement_model_is_the_real_model_on_the_prompt(model, case):
    g, rep, ts = case
    run = frozen_run(model, rep)
    real = model(g.tokens[None])[0, -1]
    torch.testing.assert_close(run.logits, real, rtol=0, atol=TOL)
    torch.testing.assert_close(run.feature_inputs, rep.feat_input, rtol=0, atol=TOL)
    torch.testing.assert_close(run.activations, rep.feat_act, rtol=0, atol=0)
    # and the features are the transcoders' own on the real feed-forward inputs
    layer = 1
    lo, hi = rep.layer_span(layer)
    x = rep.mlp_in[layer]
    enc = ts[layer].encode(x)
    if g.info["bos"]:
        enc[0] = 0
    assert torch.equal(enc.nonzero(), torch.stack([rep.feat_pos[lo:hi], rep.feat_index[lo:hi]], 1))


def test_batch_size_does_not_change_the_graph(model, ts, tokens):
    a = attribution_graph(model, tokens, ts, batch_size=1)
    b = attribution_graph(model, tokens, ts, batch_size=1000)
    torch.testing.assert_close(a.adjacency, b.adjacency, rtol=0, atol=1e-6)


# -- max_feature_nodes -------------------------------------------------------------------------------------------


def _circuit_tracers_selection(full: AttributionGraph, max_feature_nodes: int, every: int) -> torch.Tensor:
    """circuit-tracer 0.5's ``attribute`` phase 4 written out on a full graph's rows (a feature's row does not depend
    on which others are kept): logit rows first, then, until the budget is spent, ``compute_partial_influences`` over
    the rows computed so far, the ``every`` unvisited features of most influence computed next. Returns the kept
    feature nodes, ascending."""
    nF, nL, n = full.n_features, full.n_logits, full.adjacency.shape[0]
    row_nodes = list(range(n - nL, n))
    visited = torch.zeros(nF, dtype=torch.bool)
    while int(visited.sum()) < max_feature_nodes:
        rows = full.adjacency[row_nodes].double().abs()
        rows /= rows.sum(1, keepdim=True).clamp(min=1e-8)
        prod = torch.zeros(n, dtype=torch.float64)
        prod[-nL:] = full.logit_probs.double()
        infl = torch.zeros(n, dtype=torch.float64)
        for _ in range(128):
            prod = prod[row_nodes] @ rows
            if not prod.any():
                break
            infl += prod
        rank = torch.sort(infl[:nF], descending=True, stable=True).indices
        pending = rank[~visited[rank]][:min(every, max_feature_nodes - int(visited.sum()))]
        visited[pending] = True
        row_nodes += pending.tolist()
    return visited.nonzero()[:, 0]


@pytest.mark.parametrize("keep, every", [(5, 2048), (17, 4), (1, 1)])
def test_max_feature_nodes_keeps_circuit_tracers_features_and_stays_exact(model, case, keep, every):
    full, rep, ts = case
    bos = full.info["bos"]
    g = attribution_graph(model, full.tokens, ts, bos=bos, batch_size=3, max_feature_nodes=keep, rerank_every=every)
    want = _circuit_tracers_selection(full, keep, every)
    nF, nL = full.n_features, full.n_logits
    assert g.n_features == keep and g.info["n_active_features"] == nF and g.info["max_feature_nodes"] == keep
    kept = g.nodes.iloc[:keep][["layer", "pos", "feature"]].to_numpy()
    assert (kept == full.nodes.iloc[want.tolist()][["layer", "pos", "feature"]].to_numpy()).all()
    # the edges among what is kept are the full graph's; the left-out features' columns are summed into dropped
    rows = torch.cat([want, torch.arange(full.adjacency.shape[0] - nL, full.adjacency.shape[0])])
    cols = torch.cat([want, torch.arange(nF, full.adjacency.shape[0])])
    row_mask = torch.cat([torch.ones(keep, dtype=torch.bool), torch.zeros(g.n_errors + g.n_pos, dtype=torch.bool),
                          torch.ones(nL, dtype=torch.bool)])
    torch.testing.assert_close(g.adjacency[row_mask], full.adjacency[rows][:, cols], rtol=0, atol=1e-6)
    assert not g.adjacency[~row_mask].any()
    out = torch.ones(nF, dtype=torch.bool)
    out[want] = False
    dropped = torch.tensor(g.nodes["dropped"].values)[row_mask]
    torch.testing.assert_close(dropped, full.adjacency[rows][:, :nF][:, out].double().sum(1), rtol=0, atol=1e-5)
    assert dropped.abs().max() > 1e-3  # something was left out, and exactness needs its column
    assert g.max_error() < TOL
    for c in ("input", "constant"):
        torch.testing.assert_close(torch.tensor(g.nodes[c].values)[row_mask],
                                   torch.tensor(full.nodes[c].values)[rows], rtol=0, atol=1e-6)
    assert full.max_error() < TOL and (full.nodes["dropped"].fillna(0) == 0).all()


def test_the_top_features_by_influence_are_kept_when_ranked_once(model, case):
    """With a ranking interval past the budget, the kept features are the top ones by influence through the logit
    rows alone: the direct-effect share each has on the probability-weighted logits."""
    full, _, ts = case
    g = attribution_graph(model, full.tokens, ts, bos=full.info["bos"], max_feature_nodes=6)
    nF, nL = full.n_features, full.n_logits
    N = full.adjacency[-nL:].double().abs()
    direct = full.logit_probs.double() @ (N / N.sum(1, keepdim=True))[:, :nF]
    top = direct.argsort(descending=True)[:6].sort().values
    assert g.nodes.iloc[:6]["feature"].tolist() == full.nodes.iloc[top.tolist()]["feature"].tolist()


def test_interventions_on_a_graph_with_features_left_out_are_exact(model, case):
    full, rep, ts = case
    g = attribution_graph(model, full.tokens, ts, bos=full.info["bos"], max_feature_nodes=9, rerank_every=3)
    df = intervention_check(model, g, ts, n=3, factor=0.0)
    assert df["node"].max() < 9 and df["target"].max() < len(g.nodes)
    assert (df["direct_frozen"] - df["direct_predicted"]).abs().max() < TOL
    assert (df["total_frozen"] - df["total_predicted"]).abs().max() < TOL
    assert df["direct_frozen"].abs().max() > 1e-3


def test_a_graph_with_features_left_out_reopens_with_its_dropped_column(model, case, tmp_path):
    full, _, ts = case
    g = attribution_graph(model, full.tokens, ts, bos=full.info["bos"], max_feature_nodes=4)
    back = load_graph(g.save(tmp_path / "g.safetensors"))
    torch.testing.assert_close(torch.tensor(back.nodes["dropped"].values), torch.tensor(g.nodes["dropped"].values),
                               rtol=1e-6, atol=1e-7, equal_nan=True)
    assert back.max_error() < TOL and back.info["n_active_features"] == full.n_features


@pytest.mark.unchecked_types
@pytest.mark.parametrize("kw, match", [
    (dict(max_feature_nodes=0), r"max_feature_nodes=0 is out of range: max_feature_nodes is 1\.\."),
    (dict(max_feature_nodes=-3), "max_feature_nodes=-3 is out of range"),
    (dict(max_feature_nodes=True), "max_feature_nodes"), (dict(max_feature_nodes=2.5), "max_feature_nodes"),
    (dict(max_feature_nodes="10"), "max_feature_nodes"), (dict(rerank_every=0), "rerank_every"),
    (dict(rerank_every=1.0), "rerank_every"),
])
def test_bad_feature_budgets_are_refused(model, ts, tokens, kw, match):
    with pytest.raises(AttributionGraphError, match=match):
        attribution_graph(model, tokens, ts, **kw)


def test_attribution_targets_are_the_logit_nodes_given(model, case):
    full, rep, ts = case
    probs = torch.softmax(rep.logits, -1)
    low = [int(i) for i in probs.argsort()[:2]]  # the two least probable tokens: never picked by probability
    g = attribution_graph(model, full.tokens, ts, bos=full.info["bos"], attribution_targets=low)
    assert g.nodes["token_id"].values[-2:].tolist() == low and g.n_logits == 2
    torch.testing.assert_close(g.logit_probs, probs[low], rtol=1e-5, atol=0)
    assert g.max_error() < TOL
    torch.testing.assert_close(torch.tensor(g.nodes["input"].values[-2:]), (rep.logits[low] - rep.logits.mean()).double(),
                               rtol=0, atol=TOL)
    torch.testing.assert_close(g.adjacency[:-2, :-2], full.adjacency[:-full.n_logits, :-full.n_logits], rtol=0,
                               atol=1e-6)
    for bad in ([], [model.cfg.d_vocab], [1, 1], ["or"], [True]):
        with pytest.raises(AttributionGraphError, match="attribution_targets"):
            attribution_graph(model, full.tokens, ts, attribution_targets=bad)


def test_a_budget_past_the_active_features_keeps_them_all(model, ts, tokens):
    a = attribution_graph(model, tokens, ts)
    b = attribution_graph(model, tokens, ts, max_feature_nodes=a.n_features + 100)
    assert torch.equal(a.adjacency, b.adjacency)


# -- interventions -----------------------------------------------------------------------------------------------


def test_interventions_in_the_frozen_model_are_what_the_edges_predict(model, case):
    g, rep, ts = case
    for factor in (0.0, 2.5):
        df = intervention_check(model, g, ts, n=4, factor=factor)
        assert set(df["node"]) <= set(range(g.n_features)) and df["node"].nunique() == 4
        assert (df["direct_frozen"] - df["direct_predicted"]).abs().max() < TOL
        assert (df["total_frozen"] - df["total_predicted"]).abs().max() < TOL
        assert df["direct_frozen"].abs().max() > 1e-3  # the interventions moved something
        for node, sub in df.groupby("node"):  # every later feature and every logit node is a target
            layer = int(rep.feat_layer[node])
            assert set(sub["target"]) == set((rep.feat_layer > layer).nonzero()[:, 0].tolist()) | set(
                range(len(g.nodes) - g.n_logits, len(g.nodes)))


def test_total_effects_are_the_direct_edge_plus_the_paths_through_features(model, case):
    """In a 3-layer graph a layer-0 feature reaches a layer-2 feature directly and through each layer-1 feature:
    total = (factor - 1) · (A[t, s] + sum over m of A[t, m] · A[m, s] / act_m), written out here by hand."""
    g, rep, ts = case
    s = int(rep.layer_span(0)[0]) + 1
    df = intervention_check(model, g, ts, nodes=[s], factor=0.0)
    lo1, hi1 = rep.layer_span(1)
    A = g.adjacency.double()
    act1 = rep.feat_act[lo1:hi1].double()
    top = df[(df["target_kind"] == "feature") & (df["target_layer"] == 2)]
    t = torch.tensor(top["target"].values)
    by_hand = -(A[t, s] + A[t, lo1:hi1] @ (A[lo1:hi1, s] / act1))
    torch.testing.assert_close(torch.tensor(top["total_predicted"].values), by_hand, rtol=0, atol=1e-9)
    assert (by_hand + A[t, s]).abs().max() > 1e-7  # the paths through layer 1 add something
    assert (torch.tensor(top["total_frozen"].values) - by_hand).abs().max() < TOL


def test_removing_a_set_of_sources_is_what_the_edges_predict(model, case):
    """Features of two layers, an error node and a token removed at once: the frozen model with every node held
    moves by the negated sum of their edges; with the features following their inputs (linear, the removed held at
    0), by the paths through the features, both as ablation_prediction says."""
    g, rep, _ = case
    L, T, nF = g.n_layers, g.n_pos, g.n_features
    lo1, hi1 = rep.layer_span(1)
    feats = [0, 2, lo1, hi1 - 1]
    err, tok = nF + T + 5, nF + L * T + 3  # error node (layer 1, pos 5), the embedding of position 3
    pred = ablation_prediction(g, feats + [err, tok])
    acts = rep.feat_act.clone()
    acts[feats] = 0
    held = torch.zeros(nF, dtype=torch.bool)
    held[feats] = True
    emb, errs = torch.ones(T), torch.ones(L, T)
    emb[3], errs[1, 5] = 0, 0
    for linear, kind in ((False, "direct"), (True, "total")):
        before = frozen_run(model, rep, linear=linear)
        after = frozen_run(model, rep, activations=acts, linear=linear, held=held, embed=emb, errors=errs)
        got = _node_inputs(g, after) - _node_inputs(g, before)
        torch.testing.assert_close(torch.cat([pred[f"{kind}_features"], pred[f"{kind}_logits"]]), got, rtol=0,
                                   atol=TOL, msg=kind)
    assert (pred["total_features"] - pred["direct_features"]).abs().max() > 1e-2  # the paths through features count
    with pytest.raises(AttributionGraphError, match="nodes"):
        ablation_prediction(g, [len(g.nodes) - 1])  # a logit node writes nothing


@pytest.mark.unchecked_types
def test_real_run_removes_what_it_is_asked_to(model, case):
    """real_run's feature removal is intervention_check's real column at factor 0; its attention cut and embedding
    removal are hooks written here; bad indices are refused."""
    g, rep, ts = case
    s = int(rep.layer_span(1)[0])
    ids = torch.tensor(g.nodes["token_id"].values[-g.n_logits:])
    base, _ = real_run(model, rep)
    after, logp = real_run(model, rep, features=[s])
    df = intervention_check(model, g, ts, nodes=[s], factor=0.0)
    got = (after[ids] - after.mean()) - (base[ids] - base.mean())
    torch.testing.assert_close(got.double(), torch.tensor(df[df.target_kind == "logit"]["real"].values), rtol=0,
                               atol=1e-5)
    torch.testing.assert_close(logp, torch.log_softmax(after, -1))
    key = int(rep.tokens.numel()) - 3

    def cut(act, hook):
        act = act.clone()
        act[0, 1, -1, key] = 0
        return act

    def no_embed(act, hook):
        act = act.clone()
        act[0, [2, 4]] = 0
        return act

    with torch.no_grad():
        want_cut = model.run_with_hooks(rep.tokens[None], fwd_hooks=[("blocks.1.attn.hook_pattern", cut)])[0, -1]
        want_emb = model.run_with_hooks(rep.tokens[None], fwd_hooks=[("hook_embed", no_embed)])[0, -1]
    torch.testing.assert_close(real_run(model, rep, head=(1, 1), key=key)[0], want_cut.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(real_run(model, rep, embeds=[2, 4])[0], want_emb.float(), rtol=0, atol=1e-6)
    assert not torch.equal(want_cut, model(rep.tokens[None])[0, -1])
    assert float(cut_attention(rep, 1, 1, key).patterns[1, 1, -1, key]) == 0
    for kw, match in ((dict(features=[rep.n_features]), "features"), (dict(embeds=[99]), "embeds"),
                      (dict(head=(3, 0)), "layer"), (dict(head=(0, 2)), "head"), (dict(head=1), "head"),
                      (dict(head=(0, 0), key=99), "key")):
        with pytest.raises(AttributionGraphError, match=match):
            real_run(model, rep, **kw)
    with pytest.raises(AttributionGraphError, match="no earlier occurrence"):
        copy_positions(torch.tensor([5, 6, 7, 8]), 6)
    assert copy_positions(torch.tensor([0, 5, 6, 7, 5]), 6) == (2, 4)


def test_the_real_model_follows_the_prediction_measured_not_exact(model, ts, tokens):
    g = attribution_graph(model, tokens, ts)
    summary = intervention_summary(intervention_check(model, g, ts, n=3, factor=0.0))
    assert set(summary.columns) >= {"direct_max_error", "total_max_error", "r_real", "rel_error_real"}
    assert (summary["total_max_error"] < TOL).all()
    assert summary["r_real"].between(-1, 1).all()
    assert (summary["r_real"] > 0.5).all(), summary  # a random tiny model: measured, not exact
    pooled = summary[summary["node"] == -1].set_index("target_kind")
    assert pooled.loc["feature", "targets"] == summary[(summary["node"] >= 0)
                                                        & (summary["target_kind"] == "feature")]["targets"].sum()
    assert pooled.loc["logit", "targets"] == 3 * g.n_logits


# -- nodes, logits, arguments ------------------------------------------------------------------------------------


def test_node_order_and_table_are_circuit_tracers(model, ts, tokens):
    g = attribution_graph(model, tokens, ts)
    L, T, nF, nL = 3, 13, g.n_features, g.n_logits
    assert int(g.tokens[0]) == 0 and torch.equal(g.tokens[1:], tokens)  # <|endoftext|> put first
    assert g.adjacency.shape == (len(g.nodes),) * 2 == (nF + L * T + T + nL,) * 2
    assert g.adjacency.dtype == torch.float32
    assert list(g.nodes["kind"]) == ["feature"] * nF + ["error"] * (L * T) + ["embedding"] * T + ["logit"] * nL
    f = g.nodes.iloc[:nF]
    assert list(zip(f.layer, f.pos, f.feature)) == sorted(zip(f.layer, f.pos, f.feature))
    assert (f["pos"] > 0).all() and nF == L * (T - 1) * 4  # no features at position 0; TopK's k at every other
    e = g.nodes.iloc[nF:nF + L * T]
    assert list(zip(e.layer, e.pos)) == [(i, p) for i in range(L) for p in range(T)]
    assert (g.nodes["block"] == g.nodes["layer"] + 1).all()
    assert list(g.nodes["layer"].iloc[-nL - T:-nL]) == [-1] * T and (g.nodes["layer"].iloc[-nL:] == L).all()
    assert not g.adjacency[nF:nF + L * T + T].any()  # error and embedding rows are empty
    assert not g.adjacency[:, nF:nF + L * T].view(-1, L, T)[:, :, 0].any()  # errors at position 0 are zero
    assert g.nodes["activation"].iloc[:nF].ne(0).all() and g.nodes["activation"].iloc[nF:].isna().all()
    nobos = attribution_graph(model, tokens, ts, bos=False)
    assert torch.equal(nobos.tokens, tokens) and (nobos.nodes.iloc[:nobos.n_features]["pos"] == 0).any()


def test_logit_nodes_cover_the_probability_mass_as_circuit_tracer_picks_them():
    logits = torch.log(torch.tensor([0.5, 0.02, 0.3, 0.1, 0.05, 0.03]))
    ids, p = salient_logits(logits, max_n_logits=10, desired_logit_prob=0.85)
    assert ids.tolist() == [0, 2, 3] and torch.allclose(p, torch.tensor([0.5, 0.3, 0.1]))
    ids, _ = salient_logits(logits, max_n_logits=2, desired_logit_prob=0.99)
    assert ids.tolist() == [0, 2]
    ids, _ = salient_logits(logits, max_n_logits=10, desired_logit_prob=0.8)  # reached exactly: that one included
    assert ids.tolist() == [0, 2]


def test_logit_node_inputs_are_demeaned_logits(model, case):
    g, rep, _ = case
    lg = g.nodes.iloc[-g.n_logits:]
    torch.testing.assert_close(torch.tensor(lg["input"].values, dtype=torch.float32),
                               rep.logits[lg["token_id"].values.copy()] - rep.logits.mean(), rtol=0, atol=1e-6)
    probs = torch.softmax(rep.logits, -1)
    assert torch.allclose(torch.tensor(lg["logit_prob"].values, dtype=torch.float32), probs[lg["token_id"].values.copy()])


@pytest.fixture(scope="module")
def with_tokenizer(tiny_checkpoint):
    m = si.load(tiny_checkpoint)
    return m, random_transcoders(m, k=4, d_transcoder=32, seed=0)


def test_one_text_at_a_time(with_tokenizer):
    m, ts = with_tokenizer
    g = si.attribution_graph(m, "Zorbin Plax came home.", ts)
    assert g.nodes["token"].iloc[g.n_features + g.n_errors] == "<|endoftext|>"
    with pytest.raises(UnequalLengthsError, match="one text at a time"):
        si.attribution_graph(m, ["Zorbin Plax came home.", "Hi"], ts)
    with pytest.raises(AttributionGraphError, match="one text at a time"):
        si.attribution_graph(m, ["Zorbin Plax", "Zorbin Plax"], ts)
    with pytest.raises(AttributionGraphError, match="one text at a time"):
        si.attribution_graph(m, torch.zeros(2, 5, dtype=torch.long), ts)


@pytest.mark.unchecked_types
@pytest.mark.parametrize("kw, match", [
    (dict(max_n_logits=0), "max_n_logits"), (dict(max_n_logits=True), "max_n_logits"),
    (dict(max_n_logits=2.0), "max_n_logits"), (dict(desired_logit_prob=1.5), "desired_logit_prob"),
    (dict(desired_logit_prob="0.9"), "desired_logit_prob"), (dict(batch_size=0), "batch_size"),
    (dict(bos="yes"), "bos"), (dict(transcoders=3), "transcoders"),
])
def test_bad_arguments_are_refused(model, ts, tokens, kw, match):
    kw = {"transcoders": ts, **kw}
    with pytest.raises(AttributionGraphError, match=match):
        attribution_graph(model, tokens, **kw)


def test_transcoders_must_cover_and_fit_the_model(model, ts, tokens):
    two = TranscoderSet({i: ts[i] for i in (0, 1)})
    with pytest.raises(TranscoderNotFoundError, match=r"layer\(s\) \[2\]"):
        attribution_graph(model, tokens, two)
    other = HookedSprout(GPT(tiny_config(n_layer=3, d_model=24)).eval())
    with pytest.raises(TranscoderMismatchError, match="d_model"):
        attribution_graph(other, tokens, ts)
    torch.manual_seed(5)
    retrained = HookedSprout(GPT(tiny_config(n_layer=3)).eval())  # same shapes, other weights
    with pytest.raises(TranscoderMismatchError, match="another checkpoint"):
        attribution_graph(retrained, tokens, ts)


# -- pruning and scores ------------------------------------------------------------------------------------------


def _influence_by_inverse(g: AttributionGraph) -> torch.Tensor:
    N = normalized_adjacency(g.adjacency).double()
    w = torch.zeros(N.shape[0], dtype=torch.float64)
    w[-g.n_logits:] = g.logit_probs.double()
    eye = torch.eye(N.shape[0], dtype=torch.float64)
    return w @ (torch.linalg.inv(eye - N) - eye)


def test_influence_and_scores_are_circuit_tracers_definitions(case):
    g = case[0]
    infl = _influence_by_inverse(g)
    torch.testing.assert_close(node_influence(g).double(), infl, rtol=1e-4, atol=1e-6)
    N = normalized_adjacency(g.adjacency).double()
    nF, nE, nT = g.n_features, g.n_errors, g.n_pos
    tok, err = infl[nF + nE:nF + nE + nT].sum(), infl[nF:nF + nE].sum()
    w = torch.zeros_like(infl)
    w[-g.n_logits:] = g.logit_probs.double()
    complete = ((1 - N[:, nF:nF + nE].sum(1)) * (infl + w)).sum() / (infl + w).sum()
    rep_score, comp_score = graph_scores(g)
    assert rep_score == pytest.approx(float(tok / (tok + err)), abs=1e-5)
    assert comp_score == pytest.approx(float(complete), abs=1e-5)
    assert 0 < rep_score < 1 and 0 < comp_score < 1


def _thresh(scores: torch.Tensor, frac: float) -> torch.Tensor:
    """circuit-tracer's threshold: the score at which the scores sorted from the largest carry ``frac`` of the total."""
    s = scores.sort(descending=True).values
    cum = s.cumsum(0) / s.sum()
    return s[min(int(torch.searchsorted(cum, torch.tensor([frac], dtype=cum.dtype))[0]), len(s) - 1)]


def _edge_scores(g: AttributionGraph, nm: torch.Tensor) -> torch.Tensor:
    """circuit-tracer's edge scores among the nodes ``nm`` keeps, in float64 on the full matrix."""
    pm = g.adjacency.double().clone()
    pm[~nm] = 0
    pm[:, ~nm] = 0
    Np = normalized_adjacency(pm)
    w = torch.zeros(pm.shape[0], dtype=torch.float64)
    w[-g.n_logits:] = g.logit_probs.double()
    cur = w @ Np
    ei = cur.clone()
    while cur.any():
        cur = cur @ Np
        ei += cur
    return Np * (ei + w)[:, None]


def _node_cut(g: AttributionGraph, node_t: float) -> torch.Tensor:
    infl = _influence_by_inverse(g)
    nm = infl >= _thresh(infl, node_t)
    nm[-g.n_logits - g.n_pos:] = True
    return nm


def _prune_full_matrix(g: AttributionGraph, node_t: float, edge_t: float):
    """circuit-tracer's prune_graph written out on the full matrix in float64 (the module works on the kept nodes
    only, in float32)."""
    nL, nT, nF = g.n_logits, g.n_pos, g.n_features
    nm = _node_cut(g, node_t)
    scores = _edge_scores(g, nm)
    em = scores >= _thresh(scores.flatten(), edge_t)
    old = nm.clone()
    nm[:-nL - nT] &= em[:, :-nL - nT].any(0)
    nm[:nF] &= em[:nF].any(1)
    while not torch.equal(nm, old):
        old[:] = nm
        em[~nm] = False
        em[:, ~nm] = False
        nm[:-nL - nT] &= em[:, :-nL - nT].any(0)
        nm[:nF] &= em[:nF].any(1)
    return nm, em


CUT_GAP = 1e-3  # the score kept last exceeds the next one by this share of itself
CUT_MARGIN = 1e-5  # the fraction lies this far inside its step of the cumulative share


def _clear_cut(scores: torch.Tensor, nominal: float) -> float:
    """The threshold fraction nearest ``nominal`` whose cut no rounding can move (asserted within 0.05 of it): it lies
    ``CUT_MARGIN`` inside its step of the cumulative share (float64), and the score it keeps last is ``CUT_GAP``
    larger than the next one. A float32 computation summing in another order (another CPU's kernels, the module's
    submatrix) differs from this float64 one by about 1e-6 of a score, far inside both margins, so it keeps exactly
    the same scores; a fraction at a near-tie would let the last bit decide."""
    s = scores.double().flatten().sort(descending=True).values
    s = s[s > 0]
    cum = s.cumsum(0) / s.sum()
    lo = torch.cat([cum.new_zeros(1), cum[:-1]])  # the step of score i: (lo[i], cum[i]] cuts at i
    nxt = torch.cat([s[1:], s.new_zeros(1)])
    ok = (s > nxt * (1 + CUT_GAP)) & (cum - lo > 2 * CUT_MARGIN)
    a, b = lo[ok] + CUT_MARGIN, cum[ok] - CUT_MARGIN
    nearest = torch.minimum(torch.maximum(torch.tensor(nominal, dtype=torch.float64), a), b)
    best = float(nearest[(nearest - nominal).abs().argmin()])
    assert abs(best - nominal) < 0.05, f"no clear cut near {nominal}: the nearest is {best}"
    return best


@pytest.mark.parametrize("node_t, edge_t", [(0.8, 0.98), (0.5, 0.9), (0.95, 0.5), (0.999, 0.999)])
def test_pruning_is_circuit_tracers(case, node_t, edge_t):
    g = case[0]
    # the thresholds moved (by under 0.05) to where a wide gap separates what is kept from what is not
    node_t = _clear_cut(_influence_by_inverse(g), node_t)
    edge_t = _clear_cut(_edge_scores(g, _node_cut(g, node_t)), edge_t)
    got = prune_graph(g, node_t, edge_t)
    nm, em = _prune_full_matrix(g, node_t, edge_t)
    assert torch.equal(got.node_mask, nm)
    assert torch.equal(got.edge_mask, em & nm[:, None] & nm[None, :])
    assert got.node_mask[-g.n_logits - g.n_pos:].all()  # tokens and logits always kept
    kept_feats = got.node_mask[:g.n_features]
    assert got.edge_mask[:g.n_features][kept_feats].any(1).all()  # every kept feature reads a kept edge
    if node_t > 0.99:  # in a random tiny model the tokens carry most of the influence; at 0.999 features come in
        assert 0 < int(kept_feats.sum()) < g.n_features
    order = node_influence(g).argsort(descending=True)
    assert torch.all(got.cumulative_scores[order].diff() >= -1e-6) and got.cumulative_scores.max() == pytest.approx(1)


@pytest.mark.unchecked_types
@pytest.mark.parametrize("kw", [dict(node_threshold=1.5), dict(edge_threshold=-0.1), dict(node_threshold="0.8"),
                                dict(edge_threshold=float("nan"))])
def test_pruning_thresholds_are_fractions(case, kw):
    with pytest.raises(AttributionGraphError, match="threshold"):
        prune_graph(case[0], **kw)


# -- the file ----------------------------------------------------------------------------------------------------


def test_a_saved_graph_reopens_the_same(case, tmp_path):
    g = case[0]
    p = g.save(tmp_path / "g.safetensors")
    back = si.load_graph(p)
    assert torch.equal(back.adjacency, g.adjacency) and torch.equal(back.tokens, g.tokens)
    assert back.n_layers == g.n_layers and back.info == json.loads(json.dumps(g.info))
    cols = ["node", "kind", "layer", "block", "pos", "feature", "token_id", "token"]
    assert back.nodes[cols].equals(g.nodes[cols])
    for c in ("activation", "logit_prob", "input", "constant", "norm"):
        torch.testing.assert_close(torch.tensor(back.nodes[c].values), torch.tensor(g.nodes[c].values), rtol=1e-6,
                                   atol=1e-7, equal_nan=True)
    assert back.max_error() < TOL and graph_scores(back) == pytest.approx(graph_scores(g), abs=1e-6)


def _tensors(g: AttributionGraph) -> dict:
    t = {"adjacency": g.adjacency.clone(), "tokens": g.tokens.float()}
    for c in ("layer", "pos", "feature", "token_id", "activation", "logit_prob", "input", "constant", "norm"):
        t[c] = torch.tensor(g.nodes[c].values, dtype=torch.float32)
    return t


def _meta(path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.metadata()


@pytest.mark.unchecked_types
def test_hostile_graph_files_are_refused(case, tmp_path):
    g = case[0]
    good = g.save(tmp_path / "good.safetensors")
    meta = _meta(good)

    def write(name, tensors, metadata=meta):
        p = tmp_path / name
        save_file(tensors, str(p), metadata=metadata)
        return p

    t = _tensors(g)
    cases = {
        "extra tensor": write("a.safetensors", {**t, "x": torch.zeros(1)}),
        "square": write("b.safetensors", {**t, "adjacency": t["adjacency"][:, :-1].contiguous()}),
        "no metadata": write("c.safetensors", t, None),
        "nan": write("d.safetensors", {**t, "adjacency": t["adjacency"].clone().fill_(float("nan"))}),
        "half layer": write("e.safetensors", {**t, "layer": t["layer"] + 0.5}),
        "position": write("f.safetensors", {**t, "pos": t["pos"] + 1000}),
        "counts": write("g.safetensors", t, {"sprout_interp": json.dumps({**json.loads(meta["sprout_interp"]),
                                                                          "counts": [1, 2, 3, 4]})}),
        "metadata json": write("h.safetensors", t, {"sprout_interp": "{not json"}),
        "int tensor": write("i.safetensors", {**t, "tokens": g.tokens}),
    }
    trunc = tmp_path / "trunc.safetensors"
    trunc.write_bytes(good.read_bytes()[:200])
    cases["truncated"] = trunc
    cases["not safetensors"] = tmp_path / "x.safetensors"
    cases["not safetensors"].write_text("hello")
    for what, p in cases.items():
        with pytest.raises(AttributionGraphError, match="not an attribution graph"):
            load_graph(p)
        assert what
    with pytest.raises(AttributionGraphError):
        load_graph(tmp_path)  # a folder
    with pytest.raises(NotAPathError):
        load_graph(3)
    with pytest.raises(AttributionGraphError, match=".safetensors"):
        g.save(tmp_path / "g.pt")


def test_multiply_adds_count_what_the_backward_passes_do(model, ts, tokens):
    g = attribution_graph(model, tokens, ts, batch_size=4)  # one position's k features per batch: no waste
    est = graph_macs(3, 16, 2, 13, 4, skip=ts[0].has_skip)
    assert g.info["macs"] == est["ours"]
    assert 0 < est["ratio"] < 1


# -- the shipped gpt-4 -------------------------------------------------------------------------------------------


def _second_zorbin() -> str:
    s = TEXTS["story"]
    second = s.index("Zorbin", s.index("Zorbin") + 1)
    return s[:second + len("Zorbin")]


@pytest.mark.integration
def test_exact_on_the_shipped_gpt4_at_the_second_zorbin(gpt4):
    ts = random_transcoders(gpt4, k=16, d_transcoder=768, seed=0)
    g = si.attribution_graph(gpt4, _second_zorbin(), ts)
    rep = local_replacement(gpt4, g.tokens, ts)
    assert g.n_pos == 58 and int(g.tokens[0]) == 0  # <|endoftext|> and the 57 tokens up to the second "Zorbin"
    const = frozen_run(gpt4, rep, activations=torch.zeros_like(rep.feat_act), embed=False, errors=False)
    inputs = torch.tensor(g.nodes["input"].values)
    rows = _targets(g)
    err = (inputs[rows] - (g.adjacency[rows].double().sum(1) + _node_inputs(g, const))).abs().max()
    assert err < TOL and g.max_error() < TOL
    torch.testing.assert_close(frozen_run(gpt4, rep).logits, gpt4(g.tokens[None])[0, -1], rtol=0, atol=TOL)
    df = intervention_check(gpt4, g, ts, n=3)
    assert (df["direct_frozen"] - df["direct_predicted"]).abs().max() < TOL
    assert (df["total_frozen"] - df["total_predicted"]).abs().max() < TOL
