"""A node's ranked edges and the subgraph of pinned nodes and supernodes, each against an independent computation:
a loop over every node for the rankings, a transcription of circuit-tracer's subgraph view (its frontend's link
loop) for ``share``, a hand-written walk over every path through unpinned nodes (float64) on a small random graph for
``total``, and, on a real graph of a tiny random model, the frozen linear replacement model run with the source
removed and the pinned nodes held (``frozen_run``) and ``ablation_prediction``."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_config

from sprout_interp.circuits.attribution_graph import attribution_graph
from sprout_interp.circuits.graph_interventions import ablation_prediction, frozen_run
from sprout_interp.circuits.graphs import AttributionGraph, prune_graph
from sprout_interp.circuits.local_replacement import local_replacement, random_transcoders
from sprout_interp.circuits.subgraph import node_edges, subgraph
from sprout_interp.core.errors import AttributionGraphError
from sprout_interp.core.hooked import HookedSprout
from sprout_model import GPT

pytestmark = pytest.mark.unit


def random_graph(seed: int = 0, L: int = 3, T: int = 4, per_cell: int = 2, n_logits: int = 2,
                 density: float = 0.7) -> AttributionGraph:
    """A small graph with the format's node order and edges only where a real one has them (from a lower layer at an
    earlier or the same position into a feature or a logit), random weights and activations (some negative)."""
    g = torch.Generator().manual_seed(seed)
    feats = [(ly, p, f) for ly in range(L) for p in range(T) for f in range(per_cell)
             if torch.rand(1, generator=g).item() < 0.75]
    tokens = torch.randint(1, 50, (T,), generator=g)
    rows = [dict(kind="feature", layer=ly, pos=p, feature=f, token_id=int(tokens[p])) for ly, p, f in feats]
    rows += [dict(kind="error", layer=ly, pos=p, feature=-1, token_id=int(tokens[p])) for ly in range(L)
             for p in range(T)]
    rows += [dict(kind="embedding", layer=-1, pos=p, feature=-1, token_id=int(tokens[p])) for p in range(T)]
    rows += [dict(kind="logit", layer=L, pos=T - 1, feature=-1, token_id=60 + i) for i in range(n_logits)]
    df = pd.DataFrame(rows)
    df.insert(0, "node", range(len(df)))
    df.insert(3, "block", df["layer"] + 1)
    df["token"] = [f"t{t}" for t in df["token_id"]]
    n, nF = len(df), len(feats)
    act = (torch.rand(nF, generator=g, dtype=torch.float64) + 0.3) * torch.where(
        torch.rand(nF, generator=g) < 0.2, -1.0, 1.0).double()
    df["activation"] = act.tolist() + [float("nan")] * (n - nF)
    df["logit_prob"] = [float("nan")] * (n - n_logits) + [0.6, 0.3][:n_logits]
    layer, pos = torch.tensor(df["layer"].values), torch.tensor(df["pos"].values)
    reads = torch.tensor(df["kind"].isin(["feature", "logit"]).values)
    allowed = (layer[None, :] < layer[:, None]) & (pos[None, :] <= pos[:, None]) & reads[:, None]
    adj = torch.randn(n, n, generator=g) * (torch.rand(n, n, generator=g) < density) * allowed
    df["input"] = adj.double().sum(1).tolist()
    for c in ("constant", "dropped"):
        df[c] = 0.0
    df["norm"] = 1.0
    return AttributionGraph(adjacency=adj.float(), nodes=df, tokens=tokens, n_layers=L, info={"model_name": "random"})


@pytest.fixture(scope="module")
def graph() -> AttributionGraph:
    return random_graph()


# -- node_edges ---------------------------------------------------------------------------------------------------


def _by_hand(graph: AttributionGraph, node: int) -> tuple[list, list]:
    """Every nonzero (other end, weight) into and out of ``node``, from a loop over all nodes, strongest first."""
    A, n = graph.adjacency.double(), graph.adjacency.shape[0]
    ins = [(j, float(A[node, j])) for j in range(n) if A[node, j] != 0]
    outs = [(j, float(A[j, node])) for j in range(n) if A[j, node] != 0]
    return sorted(ins, key=lambda e: -abs(e[1])), sorted(outs, key=lambda e: -abs(e[1]))


def _margin(weights: list[float], n: int) -> float:
    """The smallest gap between the |weights| that decide the first ``n`` (the cut included)."""
    w = sorted((abs(x) for x in weights), reverse=True)[:n + 1]
    return min((a - b for a, b in zip(w, w[1:])), default=1.0)


@pytest.mark.parametrize("kind", ["feature", "error", "embedding", "logit"])
def test_node_edges_ranks_every_kind_of_node_as_a_loop_over_all_nodes_does(graph, kind):
    nodes = graph.nodes
    # the node of this kind with the most edges, so the lists are long and the cut at n matters
    cand = nodes.index[nodes["kind"] == kind]
    counts = [(graph.adjacency[i] != 0).sum() + (graph.adjacency[:, i] != 0).sum() for i in cand]
    node = int(cand[int(np.argmax(counts))])
    ins, outs = _by_hand(graph, node)
    n = 4
    got_in, got_out = node_edges(graph, node, n=n)
    for got, want, total in ((got_in, ins, sum(abs(w) for _, w in ins)), (got_out, outs, sum(abs(w) for _, w in outs))):
        assert _margin([w for _, w in want], n) > 1e-4  # no tie decides the order or the cut
        assert len(got) == min(n, len(want))
        assert got["node"].tolist() == [j for j, _ in want[:n]]
        assert got["rank"].tolist() == list(range(1, len(got) + 1))
        np.testing.assert_allclose(got["weight"].to_numpy(), [w for _, w in want[:n]], rtol=1e-12, atol=0)
        if len(got):
            np.testing.assert_allclose(got["share"].to_numpy(), [w / total for _, w in want[:n]], rtol=1e-9)
            assert set(got["kind"]) <= {"feature", "error", "embedding", "logit"}
            other = nodes.iloc[got["node"].to_numpy()]
            assert got["pos"].tolist() == other["pos"].tolist() and got["block"].tolist() == (other["layer"] + 1).tolist()
    if kind in ("error", "embedding"):
        assert got_in.empty and len(got_out) == n
    elif kind == "logit":
        assert got_out.empty and len(got_in) == n
    else:
        assert len(got_in) and len(got_out)
    # the targets' own shares: circuit-tracer's pctInput
    A = graph.adjacency.double()
    for r in got_out.itertuples():
        assert r.target_share == pytest.approx(float(A[r.node, node] / A[r.node].abs().sum()), rel=1e-9)


def test_node_edges_ranks_the_full_graph_and_marks_what_pruning_keeps(graph):
    pruned = prune_graph(graph, node_threshold=0.6, edge_threshold=0.7)
    logit = graph.adjacency.shape[0] - 1
    ins, _ = node_edges(graph, logit, n=50, edge_mask=pruned.edge_mask)
    assert ins["kept"].dtype == bool
    kept = ins[ins["kept"]]["node"].tolist()
    want = [j for j in range(graph.adjacency.shape[0]) if pruned.edge_mask[logit, j]]
    assert sorted(kept) == want and len(kept) < len(ins)  # some of the ranked edges are pruned away, still listed
    assert "every edge" in ins.attrs["edges"]


def test_nodes_are_named_by_their_keys_too(graph):
    from sprout_interp.circuits.subgraph import node_keys

    keys = node_keys(graph)
    nodes = graph.nodes
    f = int(nodes.index[nodes["kind"] == "feature"][-1])
    r = nodes.iloc[f]
    assert keys[f] == f"f{r['layer']}.{r['pos']}.{r['feature']}" and keys[-1] == f"l{nodes['token_id'].iloc[-1]}"
    assert keys[graph.n_features] == "e0.0" and keys[graph.n_features + graph.n_errors] == "t0"
    a_in, a_out = node_edges(graph, keys[f])
    b_in, b_out = node_edges(graph, f)
    pd.testing.assert_frame_equal(a_in, b_in)
    assert a_in["key"].tolist() == [keys[i] for i in a_in["node"]]
    s1, e1 = subgraph(graph, [keys[f], keys[-1]], {"two": [keys[0], 1]})
    s2, e2 = subgraph(graph, [f, len(keys) - 1], {"two": [0, 1]})
    pd.testing.assert_frame_equal(e1, e2)
    assert s1["key"].tolist() == ["S:two", keys[f], keys[-1]]
    with pytest.raises(AttributionGraphError, match=r"node='f9.9.9' is no node of this graph"):
        node_edges(graph, "f9.9.9")


def test_node_edges_refuses_what_it_cannot_rank(graph):
    n = graph.adjacency.shape[0]
    with pytest.raises(AttributionGraphError, match=rf"node={n} is out of range: node is 0..{n - 1}"):
        node_edges(graph, n)
    with pytest.raises(AttributionGraphError, match="not a whole number"):
        node_edges(graph, True)
    with pytest.raises(AttributionGraphError, match="n=0 is out of range"):
        node_edges(graph, 0, n=0)
    with pytest.raises(AttributionGraphError, match="edge_mask"):
        node_edges(graph, 0, edge_mask=torch.ones(2, 2, dtype=torch.bool))


# -- subgraph: total, by walking every path -----------------------------------------------------------------------


def _walk(graph: AttributionGraph, pinned: set[int], s: int, t: int) -> float:
    """The sum over every path s -> ... -> t whose inner nodes are unpinned features, each path the product of its
    edges with every inner feature's outgoing edge divided by its activation (float64, one path at a time)."""
    A = graph.adjacency.double().tolist()
    act = graph.nodes["activation"].tolist()
    kinds = graph.nodes["kind"].tolist()
    n = len(A)
    total = 0.0

    def go(cur: int, carry: float) -> None:
        nonlocal total
        for nx in range(n):
            if A[nx][cur] == 0:
                continue
            eff = carry * A[nx][cur]  # the change of nx's input
            if nx == t:
                total += eff
            elif nx not in pinned and kinds[nx] == "feature":
                go(nx, eff / act[nx])

    go(s, 1.0)
    return total


def test_total_is_every_path_through_unpinned_nodes_walked_by_hand(graph):
    nodes = graph.nodes
    nF, n = graph.n_features, len(nodes)
    emb = int(nodes.index[nodes["kind"] == "embedding"][0])
    err = int(nodes.index[(nodes["kind"] == "error") & (nodes["layer"] == 0)][1])
    first = int(nodes.index[(nodes["kind"] == "feature") & (nodes["layer"] == 0)][0])
    middle = int(nodes.index[(nodes["kind"] == "feature") & (nodes["layer"] == 1)][-1])
    logits = [n - 2, n - 1]
    pins = [emb, err, first, middle] + logits
    sg_nodes, sg_edges = subgraph(graph, pins)
    assert sg_nodes["node"].tolist() == pins and (sg_nodes["name"] == "").all()
    got = {(int(r.source), int(r.target)): r for r in sg_edges.itertuples()}
    checked = 0
    for s in range(len(pins)):
        for t in range(len(pins)):
            if s == t:
                continue
            want = _walk(graph, set(pins), pins[s], pins[t])
            direct = float(graph.adjacency[pins[t], pins[s]])
            row = got.get((s, t))
            if want == 0 and direct == 0:
                assert row is None
                continue
            assert row.total == pytest.approx(want, rel=1e-9, abs=1e-12)
            assert row.weight == pytest.approx(direct, rel=1e-12, abs=0)
            checked += want != direct  # a pair whose paths through the rest add something
    assert checked >= 5
    # the paths through pinned ``middle`` are not counted: unpinning it changes ``first``'s total into the logit
    _, e2 = subgraph(graph, [first] + logits)
    two = e2.set_index(["source", "target"])["total"]
    assert two[(0, 1)] == pytest.approx(_walk(graph, {first, *logits}, first, logits[0]), rel=1e-9)
    assert abs(two[(0, 1)] - got[(2, 4)].total) > 1e-3
    assert nF > 10


def test_supernode_sums_are_the_members_direct_and_path_sums(graph):
    nodes = graph.nodes
    n = len(nodes)
    l0 = nodes.index[(nodes["kind"] == "feature") & (nodes["layer"] == 0)].tolist()
    l1 = nodes.index[(nodes["kind"] == "feature") & (nodes["layer"] == 1)].tolist()
    groups = {"three early": l0[:3], "two middle": l1[1:3]}  # unequal sizes
    alone = [l1[0], n - 1]
    pins = set(l0[:3] + l1[1:3] + alone)
    sg_nodes, sg_edges = subgraph(graph, alone, groups)
    assert sg_nodes["name"].tolist() == ["three early", "two middle", "", ""]
    assert sg_nodes["kind"].tolist() == ["supernode", "supernode", "feature", "logit"]
    assert sg_nodes["members"].tolist() == [l0[:3], l1[1:3], [alone[0]], [alone[1]]]
    A = graph.adjacency.double()
    members = sg_nodes["members"].tolist()
    e = sg_edges.set_index(["source", "target"])
    for (s, t), r in e.iterrows():
        want_w = sum(float(A[tt, ss]) for tt in members[t] for ss in members[s])
        want_t = sum(_walk(graph, pins, ss, tt) for tt in members[t] for ss in members[s])
        assert r["weight"] == pytest.approx(want_w, rel=1e-12, abs=1e-15)
        assert r["total"] == pytest.approx(want_t, rel=1e-9, abs=1e-12)
    assert (0, 1) in e.index and (0, 3) in e.index and (1, 3) in e.index
    assert len(members[0]) != len(members[1])
    # no edge inside a supernode, and a pinned node given twice is drawn inside its supernode
    assert not ((sg_edges["source"] == sg_edges["target"]).any())
    again, _ = subgraph(graph, alone + [l0[0]], groups)
    assert len(again) == 4


# -- subgraph: share, as circuit-tracer's frontend computes it ------------------------------------------------------


def _frontend_share(graph: AttributionGraph, pins: list[int], supernodes: dict) -> dict:
    """circuit-tracer's init-cg-subgraph.js transcribed: links, each node's inputAbsSum, inputAbsSumExternalSn and
    sgSnInputWeighting, then the links among pinned nodes remapped onto supernodes and summed."""
    A = graph.adjacency.double()
    n = A.shape[0]
    links = [(s, t, float(A[t, s])) for t in range(n) for s in range(n) if A[t, s] != 0]
    source_links = {i: [] for i in range(n)}
    for s, t, w in links:
        source_links[t].append((s, w))
    input_abs_sum = {i: sum(abs(w) for _, w in source_links[i]) for i in range(n)}
    sn_id = {}
    members_all = {}
    for i, (label, ids) in enumerate(supernodes.items()):
        for x in ids:
            sn_id[x] = f"supernode-{i}"
        members_all[f"supernode-{i}"] = list(ids)
    pinned = set(pins) | set(sn_id)
    ext, weighting = {}, {}
    for d in pinned:
        ext[d] = sum(0.0 if (s in sn_id and sn_id.get(s) == sn_id.get(d)) else abs(w) for s, w in source_links[d])
        weighting[d] = ext[d] / input_abs_sum[d] if input_abs_sum[d] else float("nan")
    groups = [members_all[k] for k in members_all] + [[p] for p in pins if p not in sn_id]
    for ms in groups:
        total = sum(weighting[m] for m in ms if not np.isnan(weighting[m]))  # d3.sum skips NaN
        for m in ms:
            weighting[m] = weighting[m] / total if total else float("nan")
    out: dict = {}
    for s, t, w in links:
        if s in pinned and t in pinned:
            key = (sn_id.get(s, s), sn_id.get(t, t))
            if key[0] == key[1]:
                continue
            out[key] = out.get(key, 0.0) + w / ext[t] * weighting[t]
    return out


def test_share_is_circuit_tracers_subgraph_view(graph):
    nodes = graph.nodes
    n = len(nodes)
    l0 = nodes.index[(nodes["kind"] == "feature") & (nodes["layer"] == 0)].tolist()
    l1 = nodes.index[(nodes["kind"] == "feature") & (nodes["layer"] == 1)].tolist()
    l2 = nodes.index[(nodes["kind"] == "feature") & (nodes["layer"] == 2)].tolist()
    emb = nodes.index[nodes["kind"] == "embedding"].tolist()
    # a supernode with an edge inside it (layer 0 into layer 1), one of two layer-2 features, and single nodes
    groups = {"mixed": [l0[0], l1[0], l1[2]], "late": l2[:2]}
    A = graph.adjacency
    assert A[l1[0], l0[0]] != 0 or A[l1[2], l0[0]] != 0  # the inside edge that ext leaves out
    pins = [emb[0], l0[1], l1[1], n - 2, n - 1]
    sg_nodes, sg_edges = subgraph(graph, pins, groups)
    want = _frontend_share(graph, pins, groups)
    ids = {}
    for r in sg_nodes.itertuples():
        ids[r.id] = f"supernode-{list(groups).index(r.name)}" if r.name else r.node
    got = {(ids[r.source], ids[r.target]): r.share for r in sg_edges.itertuples() if r.weight != 0 or r.share != 0}
    assert set(want) <= set(got)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    for k in set(got) - set(want):  # pairs joined only through the rest have no direct share
        assert got[k] == 0
    assert len(want) >= 8
    # a single pinned target's share is the summed edges over its whole |input|
    lone = sg_nodes.index[sg_nodes["node"] == n - 1][0]
    into = sg_edges[sg_edges["target"] == lone]
    np.testing.assert_allclose(into["share"], into["weight"] / float(A[n - 1].double().abs().sum()), rtol=1e-9)


def test_an_edge_mask_counts_only_its_edges(graph):
    pruned = prune_graph(graph, node_threshold=0.7, edge_threshold=0.8)
    kept = graph.adjacency * pruned.edge_mask
    masked = AttributionGraph(kept, graph.nodes, graph.tokens, graph.n_layers, graph.info)
    feats = [i for i in range(graph.n_features) if pruned.node_mask[i]]
    pins = feats[:2] + feats[-2:] + [len(graph.nodes) - 1]
    _, a = subgraph(graph, pins, edge_mask=pruned.edge_mask)
    _, b = subgraph(masked, pins)
    pd.testing.assert_frame_equal(a, b)
    _, full = subgraph(graph, pins)
    assert not a[["weight", "total"]].equals(full[["weight", "total"]])
    assert a.attrs["edges"] == "the edges of edge_mask"


def test_subgraph_refuses_what_it_cannot_draw(graph):
    n = graph.adjacency.shape[0]
    with pytest.raises(AttributionGraphError, match=r"nodes\[1\]=-1 is out of range"):
        subgraph(graph, [0, -1])
    with pytest.raises(AttributionGraphError, match="name no node"):
        subgraph(graph, [])
    with pytest.raises(AttributionGraphError, match=r"supernodes\['a'\]\[0\]=" + str(n)):
        subgraph(graph, [0], {"a": [n]})
    with pytest.raises(AttributionGraphError, match=r"nodes\[1\]=1.5 \(a float\) is not a whole number"):
        subgraph(graph, [0, 1.5])
    with pytest.raises(AttributionGraphError, match="not a list of node indices"):
        subgraph(graph, "12")
    with pytest.raises(AttributionGraphError, match="non-empty string"):
        subgraph(graph, [0], {"": [1]})


# -- on a real graph: the frozen linear replacement model ------------------------------------------------------------


@pytest.fixture(scope="module")
def real():
    """A tiny random model's graph whose features pass a lot to each other (the random transcoders' encoders and
    decoders scaled up 6-fold, so paths through features are as large as direct edges)."""
    torch.manual_seed(0)
    model = HookedSprout(GPT(tiny_config(n_layer=3)).eval(), name="tiny")
    ts = random_transcoders(model, k=4, d_transcoder=48, skip=True, seed=1)
    with torch.no_grad():
        for t in ts:
            t.W_enc.mul_(6.0)
            t.W_dec.mul_(6.0)
    tokens = torch.randint(1, 64, (10,), generator=torch.Generator().manual_seed(3))
    g = attribution_graph(model, tokens, ts, bos=True)
    return model, g, local_replacement(model, g.tokens, ts, bos=True)


def _logit_inputs(g: AttributionGraph, run) -> torch.Tensor:
    ids = torch.tensor(g.nodes["token_id"].values[-g.n_logits:])
    return (run.logits[ids] - run.logits.mean()).double()


def test_total_is_the_frozen_linear_model_with_the_source_removed_and_the_pins_held(real):
    model, g, rep = real
    nF, n = g.n_features, len(g.nodes)
    acts = rep.feat_act
    layer = torch.tensor(g.nodes["layer"].to_numpy()[:nF])
    A = g.adjacency.double()
    # the layer-0 source and layer-2 target that paths through other features join most, and the layer-1 feature
    # on the strongest such path: pinned, so the paths through it are not counted
    best = []
    for s in (layer == 0).nonzero()[:, 0].tolist():
        indirect = (-ablation_prediction(g, [s])["total_features"] - A[:nF, s]).abs() * (layer == 2)
        best.append((float(indirect.max()), s, int(indirect.argmax())))
    _, s, t = max(best)
    ones = (layer == 1).nonzero()[:, 0]
    mid = int(ones[int((A[ones, s] * A[t, ones] / acts[ones].double()).abs().argmax())])
    _, edges = subgraph(g, [s, mid, t])
    total = edges.set_index(["source", "target"])["total"]
    held = {mid: float(acts[mid])}
    base = frozen_run(model, rep, linear=True, clamp=held)
    cut = frozen_run(model, rep, linear=True, clamp={**held, s: 0.0})
    want = float(base.feature_inputs[t] - cut.feature_inputs[t])
    assert total[(0, 2)] == pytest.approx(want, abs=1e-3)
    free = frozen_run(model, rep, linear=True, clamp={s: 0.0})
    assert abs(want - float(base.feature_inputs[t] - free.feature_inputs[t])) > 0.05  # holding mid matters
    assert abs(want - float(A[t, s])) > 0.05  # and so do the other paths: total is not the direct edge
    # with nothing else pinned, total is ablation_prediction's through every path (an embedding into a logit)
    logit = n - g.n_logits
    embs = range(nF + g.n_errors, nF + g.n_errors + g.n_pos)
    emb = max(embs, key=lambda e: abs(float(ablation_prediction(g, [e])["total_logits"][0]) + float(A[logit, e])))
    _, e2 = subgraph(g, [emb, logit])
    pred = ablation_prediction(g, [emb])
    assert e2.set_index(["source", "target"])["total"][(0, 1)] == pytest.approx(-float(pred["total_logits"][0]),
                                                                             rel=1e-6, abs=1e-6)
    assert abs(float(pred["total_logits"][0]) + float(A[logit, emb])) > 1e-3  # its paths through features count
