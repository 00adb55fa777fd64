"""graph_interventions.copy_interventions on a graph that keeps only some of the prompt's active features
(``max_feature_nodes``), over per-layer transcoders and a cross-layer transcoder: each feature row zeroes the graph's
feature nodes at its positions (counted from the graph's own node table), the frozen model then moves exactly as
the graph's edges predict (the features the graph left out are held), and the real model's change is a hook written
here that removes those nodes' decoder writes (a CLT node's from every feed-forward output it writes to) from the
true feed-forward outputs. A tiny random model with a tokenizer; random transcoders whose decoders are scaled up so
the feature rows move the logit well above float rounding."""
from __future__ import annotations

import pytest
import torch
from conftest import pinned_threads

import sprout_interp as si
from sprout_interp.circuits.graph_interventions import copy_interventions
from sprout_interp.circuits.local_replacement import local_replacement, random_clt, random_transcoders
from sprout_interp.core.hook_points import act_name

pytestmark = pytest.mark.unit

TEXT = "Zorbin Plax came home. Then Zorbin"  # cut before the second " Plax": p1 is the first "P" after "in"
KEEP = 0.5  # of the active features the graph keeps


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(pinned_threads())
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return si.load(tiny_checkpoint)


def _transcoders(m, kind):
    if kind == "per_layer":
        ts = random_transcoders(m, k=4, d_transcoder=32, seed=0)
        with torch.no_grad():
            for t in ts:
                t.W_dec.mul_(30.0)
        return ts
    clt = random_clt(m, d_transcoder=32, density=0.15, seed=0)
    with torch.no_grad():
        for w in clt.W_dec:
            w.mul_(30.0)
    return clt


@pytest.fixture(scope="module", params=["per_layer", "clt"])
def measured(request, model):
    ts = _transcoders(model, request.param)
    n_active = local_replacement(model, TEXT, ts, cross_layer=True).n_features
    got = copy_interventions(model, TEXT, " Plax", (1, 0), n_random=2, transcoders=ts,
                             max_feature_nodes=int(KEEP * n_active))
    return request.param, ts, got


def _writes(m, kind, ts, g, nodes) -> dict[int, torch.Tensor]:
    """Each feed-forward output's share written by graph feature ``nodes`` (layer -> (pos, d_model)), from the
    graph's node table (layer, pos, feature, activation) and the transcoders' decoders."""
    T, L = g.n_pos, g.n_layers
    out = {j: torch.zeros(T, m.cfg.d_model) for j in range(L)}
    with torch.no_grad():
        for _, r in g.nodes.iloc[nodes].iterrows():
            i, p, f, a = int(r["layer"]), int(r["pos"]), int(r["feature"]), float(r["activation"])
            targets = [i] if kind == "per_layer" else range(i, L)
            for j in targets:
                row = ts[i].W_dec[f] if kind == "per_layer" else ts.W_dec[i][f, j - i]
                out[j][p] += a * row.float()
    return out


def _target_change(m, tokens, writes, target) -> float:
    with torch.no_grad():
        clean = m(tokens[None])[0, -1]
        cut = m.run_with_hooks(tokens[None], fwd_hooks=[
            (act_name("mlp_out", j), lambda a, hook, j=j: a - writes[j][None].to(a.dtype)) for j in writes])[0, -1]
    return float((cut[target] - cut.mean()) - (clean[target] - clean.mean()))


def test_the_graph_keeps_some_features_only(measured):
    _, _, got = measured
    g = got["graph"]
    assert 0 < g.n_features < got["n_active_features"]
    assert g.info["n_active_features"] == got["n_active_features"]


@pytest.mark.parametrize("which, positions", [("features at p1-1 and p1", "first"), ("features at p1 alone", "p1"),
                                              ("current token's features", "last")])
def test_each_feature_row_zeroes_the_graphs_nodes_there(model, measured, which, positions):
    kind, ts, got = measured
    g, p1, last = got["graph"], got["p1"], got["last"]
    where = {"first": [p1 - 1, p1], "p1": [p1], "last": [last]}[positions]
    nodes = [i for i in range(g.n_features) if int(g.nodes["pos"].iloc[i]) in where]
    row = next(r for r in got["rows"] if r["intervention"].startswith(which))
    assert row["n_nodes"] == len(nodes)
    # the frozen model with the graph's left-out features held is what the edges predict, through every path
    assert row["frozen"] == pytest.approx(row["graph_total"], abs=1e-6)
    assert row["real"] == pytest.approx(_target_change(model, g.tokens, _writes(model, kind, ts, g, nodes),
                                                       got["target"]), abs=1e-6)


def test_the_current_tokens_row_moves_the_logit(model, measured):
    """Sizes well above float rounding, so the exact comparisons above mean something; and the graph's feature nodes
    are not the first of the prompt's active features (node i is not rep's feature i), so the rows must find the
    graph's nodes among them."""
    _, ts, got = measured
    row = next(r for r in got["rows"] if r["intervention"].startswith("current token's features"))
    assert abs(row["frozen"]) > 1e-3 and abs(row["real"]) > 1e-3
    rep = local_replacement(model, TEXT, ts, cross_layer=True)
    g = got["graph"].nodes.iloc[:got["graph"].n_features]
    ours = list(zip(g["layer"], g["pos"], g["feature"]))
    firsts = list(zip(*(t[:len(ours)].tolist() for t in (rep.feat_layer, rep.feat_pos, rep.feat_index))))
    assert ours != firsts
