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
from sprout_interp.plots.graph import (
    FIT_PX,
    KIND_CODES,
    attribution_graph_figure,
    graph_tables,
    group_nodes,
    node_key,
    shown_labels,
)
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


def _geometry(fig):
    """(pixels per x unit, pixels per y unit) at the width the figure is laid out for."""
    lay = fig.layout
    plot_w = (lay.width - lay.margin.l - lay.margin.r) if lay.width else lay.meta["design_px"] + 4
    px_x = plot_w / (lay.xaxis.range[1] - lay.xaxis.range[0])
    px_y = (lay.height - lay.margin.t - lay.margin.b) / (lay.yaxis.range[1] - lay.yaxis.range[0])
    return px_x, px_y


def _marks(fig):
    """(x, y, size, customdata) of every node marker, in data units."""
    marks = []
    for tr in fig.data:
        if tr.mode != "markers":
            continue
        sizes = tr.marker.size if isinstance(tr.marker.size, (tuple, list, np.ndarray)) else [tr.marker.size] * len(tr.x)
        marks += [(x, y, s, tuple(c)) for x, y, s, c in zip(tr.x, tr.y, sizes, tr.customdata)]
    return marks


def test_every_node_has_a_place_of_its_own_and_a_click_reports_it(graph):
    nodes, edges = graph_tables(graph, 1.0, 1.0)  # every node: crowded cells
    drawn, e = group_nodes(nodes, edges, {"a": list(nodes[nodes["kind"] == "feature"]["key"].iloc[:3])})
    toks = [f" t{i}" for i in range(graph.n_pos)]
    fig = attribution_graph_figure(drawn, e, toks, graph.n_layers, pinned=[drawn["key"].iloc[0]])
    px_x, px_y = _geometry(fig)
    marks = [(x * px_x, y * px_y, s, c) for x, y, s, c in _marks(fig)]
    assert len(marks) == len(drawn)
    for (x1, y1, s1, _), (x2, y2, s2, _) in itertools.combinations(marks, 2):
        assert max(abs(x1 - x2), abs(y1 - y2)) >= (s1 + s2) / 2, ((x1, y1, s1), (x2, y2, s2))
    kinds = {c[0] for *_, c in marks}
    assert {KIND_CODES["feature"], KIND_CODES["error"], KIND_CODES["embedding"], KIND_CODES["logit"],
            KIND_CODES["supernode"]} == kinds
    tokens = [a.text for a in fig.layout.annotations if a.name == "token"]
    assert tokens == [f"{p}: ␣t{p}" for p in range(graph.n_pos)]
    assert [t for t in fig.layout.yaxis.ticktext] == ["embeddings"] + [f"block {b}" for b in range(1, graph.n_layers + 1)] + ["logits"]


def test_positions_are_as_wide_as_their_nodes_need_and_the_graph_fits_the_page(graph):
    """A position with one node per row is min_px wide; a crowded one wider; each position's nodes lie in its own
    column, left to right in prompt order, every node in its block's row; the whole graph within FIT_PX, so the
    figure has no fixed width (the page stretches it); a prompt that cannot fit gets its own width."""
    nodes, edges = graph_tables(graph, 0.8, 0.98)
    n_layers = graph.n_layers
    fig = attribution_graph_figure(nodes, edges, [f" t{i}" for i in range(graph.n_pos)], n_layers)
    assert fig.layout.width is None and fig.layout.meta["fits"] and fig.layout.meta["design_px"] == FIT_PX
    px_x, _ = _geometry(fig)
    x_of = dict(zip(nodes["node"], nodes["node"]))
    for x, y, s, (kind, node) in _marks(fig):
        x_of[node] = x
        r = nodes[nodes["node"] == node].iloc[0]
        row = 0 if r["kind"] == "embedding" else n_layers + 1 if r["kind"] == "logit" else int(r["layer"]) + 1
        assert round(y) == row, (r["key"], y, row)
    pos = nodes.set_index("node")["pos"]
    span = {p: (min(x_of[n] for n in pos.index[pos == p]), max(x_of[n] for n in pos.index[pos == p]))
            for p in sorted(set(pos))}
    ps = sorted(span)
    assert all(span[a][1] < span[b][0] for a, b in zip(ps, ps[1:]))  # columns in prompt order, apart
    crowd = nodes.groupby("pos").size()
    single = [p for p in ps if crowd[p] == 1]  # an embedding alone: the narrowest column
    busy = int(crowd.idxmax())
    assert single and crowd[busy] > 3
    centres = list(fig.layout.xaxis.tickvals)
    gaps = np.diff(centres) * px_x
    narrow = [g for p, g in zip(ps[1:], gaps) if p in single and p - 1 in single]
    assert narrow and max(narrow) <= 8  # empty positions narrow (min_px 6, a wider marker's width at most)
    assert (span[busy][1] - span[busy][0]) * px_x >= 13  # a crowded one as wide as its nodes need
    long = attribution_graph_figure(nodes, edges, [f" t{i}" for i in range(graph.n_pos)], n_layers, fit_px=40)
    assert long.layout.width is not None and not long.layout.meta["fits"]


def test_the_strongest_labelled_nodes_get_labels_apart_and_the_edges_are_listed(graph):
    """n_labels of the labelled nodes are drawn, the most influential first, their boxes (at the estimated text
    size) apart; the drawn edges are the strongest max_edges, listed in layout.meta for the page's hover."""
    nodes, edges = graph_tables(graph, 0.99, 0.99)
    feats = nodes[nodes["kind"] == "feature"].sort_values("influence", ascending=False)
    assert len(feats) >= 6 and feats["influence"].iloc[3] > feats["influence"].iloc[4]
    labels = {k: f"label {i}" for i, k in enumerate(feats["key"])}
    fig = attribution_graph_figure(nodes, edges, [f" t{i}" for i in range(graph.n_pos)], graph.n_layers,
                                   labels=labels, n_labels=4, max_edges=50)
    drawn = [a.text for a in fig.layout.annotations if a.name == "node label"]
    assert drawn == [f"label {i}" for i in range(4)]  # the four most influential, none without room here
    want = edges.reindex(edges["weight"].abs().sort_values(ascending=False).index).head(50)
    assert fig.layout.meta["edges"] == [[int(s), int(t), round(float(w), 5)]
                                         for s, t, w in zip(want["source"], want["target"], want["weight"])]


def test_labels_are_typed_then_measured_then_made_from_promoted_tokens(graph):
    nodes, _ = graph_tables(graph, 0.99, 0.99)
    f = nodes[nodes["kind"] == "feature"].iloc[:3]
    err = nodes[nodes["kind"] == "error"]["key"].iloc[0]
    logit = nodes[nodes["kind"] == "logit"].iloc[0]
    (k0, k1, k2) = f["key"]
    promoted = {(int(r.layer), int(r.feature)): [" Pl", "ax\n", "x"] for r in f.itertuples()}
    got = shown_labels(nodes, promoted, typed={k0: "mine", err: "errs"}, measured={k0: "m0", k1: "m1"})
    assert got[k0] == "mine" and got[k1] == "m1" and got[k2] == "→ ␣Pl, ax↵" and got[err] == "errs"
    assert got[logit["key"]] == f"{logit['token'].replace(' ', '␣')} (p {logit['logit_prob']:.2f})"
    assert not any(k.startswith(("e", "t")) for k in set(got) - {err})
    assert shown_labels(nodes, {}, typed={k0: "x" * 60})[k0] == "x" * 40
