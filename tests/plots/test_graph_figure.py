"""The attribution-graph figure and its tables (sprout_interp.plots.graph) on a tiny random model's graph: the pruned
tables are prune_graph's masks, pinned nodes join with their edges, supernodes carry their members' summed edges,
and the figure puts every node in a place of its own (markers never overlap), with its kind and index to click."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import tiny_config

from sprout_interp.circuits.attribution_graph import attribution_graph
from sprout_interp.circuits.graphs import node_influence, prune_graph
from sprout_interp.circuits.local_replacement import random_transcoders
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.plots.graph import KIND_CODES, attribution_graph_figure, graph_tables, group_nodes, node_key
from sprout_model import GPT

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def graph():
    torch.manual_seed(0)
    m = HookedSprout(GPT(tiny_config(n_layer=3)).eval(), name="tiny")
    ts = random_transcoders(m, k=4, d_transcoder=48, skip=True, seed=1)
    toks = torch.randint(1, 64, (12,), generator=torch.Generator().manual_seed(3))
    return attribution_graph(m, toks, ts)


def test_node_keys_name_each_kind():
    assert node_key("feature", 2, 7, 31, 5) == "f2.7.31"
    assert node_key("error", 1, 3, -1, 5) == "e1.3"
    assert node_key("embedding", -1, 4, -1, 9) == "t4"
    assert node_key("logit", 3, 11, -1, 42) == "l42"


def test_tables_hold_what_prune_graph_keeps(graph):
    pruned = prune_graph(graph, 0.5, 0.9)
    nodes, edges = graph_tables(graph, 0.5, 0.9)
    assert list(nodes["node"]) == pruned.node_mask.nonzero()[:, 0].tolist()
    assert nodes["kept"].all()
    assert np.allclose(nodes["influence"], node_influence(graph)[pruned.node_mask].numpy())
    assert len(edges) == int(pruned.edge_mask.sum())
    for r in edges.head(20).itertuples():  # each edge is the adjacency's entry, rows = targets
        assert pruned.edge_mask[r.target, r.source]
        assert r.weight == pytest.approx(float(graph.adjacency[r.target, r.source]))
    assert len(set(nodes["key"])) == len(nodes)


def test_a_pinned_node_is_drawn_whatever_the_thresholds_with_its_strong_edges(graph):
    nodes, edges = graph_tables(graph, 0.3, 0.9)
    dropped = next(i for i in range(graph.n_features) if i not in set(nodes["node"])
                   and bool(graph.adjacency[:, i].abs().gt(0).any()))
    n2, e2 = graph_tables(graph, 0.3, 0.9, keep=[dropped])
    assert dropped in set(n2["node"]) and not bool(n2.loc[n2["node"] == dropped, "kept"].iloc[0])
    weakest = float(edges["weight"].abs().min())
    shown = set(n2["node"])
    want = {(j, dropped) for j in shown if j != dropped and abs(float(graph.adjacency[dropped, j])) >= weakest}
    want |= {(dropped, j) for j in shown if j != dropped and abs(float(graph.adjacency[j, dropped])) >= weakest}
    got = {(int(s), int(t)) for s, t in zip(e2["source"], e2["target"]) if dropped in (s, t)}
    assert got == want and want


def test_a_supernode_carries_its_members_summed_edges(graph):
    nodes, edges = graph_tables(graph, 0.99, 0.99)
    feats = nodes[nodes["kind"] == "feature"]
    assert len(feats) >= 3
    members = list(feats["key"].iloc[:2])
    ids = set(feats["node"].iloc[:2])
    drawn, e = group_nodes(nodes, edges, {"pair": members})
    sup = drawn[drawn["key"] == "S:pair"].iloc[0]
    assert sup["kind"] == "supernode" and sup["members"] == members
    assert sup["influence"] == pytest.approx(float(feats["influence"].iloc[:2].sum()))
    assert not set(drawn["key"]) & set(members) and len(drawn) == len(nodes) - 1
    sid = int(sup["node"])
    for other in set(edges["target"]) - ids:  # the supernode's edge into each node: the sum of its members'
        want = edges[edges["source"].isin(ids) & (edges["target"] == other)]["weight"].sum()
        got = e[(e["source"] == sid) & (e["target"] == other)]["weight"].sum()
        assert got == pytest.approx(want)
    for other in set(edges["source"]) - ids:  # and each node's edge into it
        want = edges[(edges["source"] == other) & edges["target"].isin(ids)]["weight"].sum()
        got = e[(e["source"] == other) & (e["target"] == sid)]["weight"].sum()
        assert got == pytest.approx(want)
    assert not ((e["source"] == sid) & (e["target"] == sid)).any()  # edges inside the group are dropped


def test_every_node_has_a_place_of_its_own_and_a_click_reports_it(graph):
    nodes, edges = graph_tables(graph, 1.0, 1.0)  # every node: crowded cells
    drawn, e = group_nodes(nodes, edges, {"a": list(nodes[nodes["kind"] == "feature"]["key"].iloc[:3])})
    toks = [f" t{i}" for i in range(graph.n_pos)]
    fig = attribution_graph_figure(drawn, e, toks, graph.n_layers, pinned=[drawn["key"].iloc[0]])
    lay = fig.layout
    px_x = (lay.width - lay.margin.l - lay.margin.r) / (lay.xaxis.range[1] - lay.xaxis.range[0])
    px_y = (lay.height - lay.margin.t - lay.margin.b) / (lay.yaxis.range[1] - lay.yaxis.range[0])
    marks = []
    for tr in fig.data:
        if tr.mode != "markers":
            continue
        sizes = tr.marker.size if isinstance(tr.marker.size, (tuple, list, np.ndarray)) else [tr.marker.size] * len(tr.x)
        marks += [(x * px_x, y * px_y, s, tuple(c)) for x, y, s, c in zip(tr.x, tr.y, sizes, tr.customdata)]
    assert len(marks) == len(drawn)
    for (x1, y1, s1, _), (x2, y2, s2, _) in itertools.combinations(marks, 2):
        assert max(abs(x1 - x2), abs(y1 - y2)) >= (s1 + s2) / 2, ((x1, y1, s1), (x2, y2, s2))
    kinds = {c[0] for *_, c in marks}
    assert {KIND_CODES["feature"], KIND_CODES["error"], KIND_CODES["embedding"], KIND_CODES["logit"],
            KIND_CODES["supernode"]} == kinds
    assert list(lay.xaxis.ticktext)[:2] == ["0: &lt;|endoftext|&gt;", "1: ␣t1"] or "␣t1" in lay.xaxis.ticktext[1]
    assert [t for t in lay.yaxis.ticktext] == ["embeddings"] + [f"block {b}" for b in range(1, graph.n_layers + 1)] + ["logits"]
