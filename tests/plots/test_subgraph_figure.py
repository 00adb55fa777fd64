"""The subgraph figure: every subgraph node drawn once at a place of its own (its position's column, its block's
row), each drawn edge's value the subgraph table's, the strongest first, and what it refuses."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sprout_interp.circuits.subgraph import subgraph
from sprout_interp.core.errors import AttributionGraphError
from sprout_interp.plots.subgraph import subgraph_figure, subgraph_label

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "circuits"))
from test_subgraph import random_graph  # noqa: E402

sys.path.pop(0)

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def sub():
    g = random_graph(seed=2)
    nodes = g.nodes
    feats = nodes.index[nodes["kind"] == "feature"].tolist()
    pins = feats[:2] + feats[-3:] + [len(nodes) - 1, len(nodes) - 2, g.n_features + g.n_errors]
    return g, *subgraph(g, pins, {"group": feats[3:6]})


@pytest.mark.parametrize("value", ["total", "weight", "share"])
def test_every_node_has_a_place_and_every_edge_its_value(sub, value):
    g, nodes, edges = sub
    tokens = list(g.nodes["token"].iloc[g.n_features + g.n_errors:g.n_features + g.n_errors + g.n_pos])
    fig = subgraph_figure(nodes, edges, tokens, g.n_layers, value=value, max_edges=6)
    pts = [(x, y, tuple(c)) for t in fig.data for x, y, c in zip(t.x, t.y, t.customdata)]
    assert sorted(c[0] for _, _, c in pts) == sorted(nodes["id"])  # each node once
    assert len({(x, y) for x, y, _ in pts}) == len(pts)  # no two share a place
    rows = {int(r.id): r for r in nodes.itertuples()}
    for x, y, (i, node) in pts:
        r = rows[i]
        assert node == r.node
        assert y == (0 if r.kind == "embedding" else g.n_layers + 1 if r.kind == "logit" else r.layer + 1)
    # columns in the order of positions
    by_pos = sorted((rows[c[0]].pos, x) for x, _, c in pts)
    assert [x for _, x in by_pos] == sorted(x for _, x in by_pos)
    want = edges[edges[value] != 0].reindex(edges[value].abs().sort_values(ascending=False, kind="stable").index)
    want = want.dropna().head(6)
    got = fig.layout.meta["edges"]
    assert [(s, t) for s, t, _ in got] == list(zip(want["source"], want["target"]))
    assert [v for _, _, v in got] == pytest.approx(want[value].tolist(), rel=1e-12)
    assert len(got) == 6 and len(edges) > 6
    names = [str(a.text) for a in fig.layout.annotations if a.text]
    assert len(names) == 6
    assert "group" in [subgraph_label(r) for _, r in nodes.iterrows()]


def test_a_value_that_is_no_column_is_refused(sub):
    g, nodes, edges = sub
    with pytest.raises(AttributionGraphError, match="value must be one of"):
        subgraph_figure(nodes, edges, ["a"] * g.n_pos, g.n_layers, value="influence")


def test_the_figure_fits_the_page_column_as_the_attribution_graph_does(sub):
    """Laid out to fit fit_px with no fixed width (a page stretches it to its column), each place narrowed from
    column_px where needed; wider than fits at min_column_px: its full width, for a box that scrolls."""
    g = sub[0]
    feats = g.nodes.index[g.nodes["kind"] == "feature"].tolist()
    nodes, edges = subgraph(g, feats[:2] + feats[-2:] + [len(g.nodes) - 1])
    tokens = ["t"] * g.n_pos
    n_places = sum(int(c) + 0.7 for c in nodes.groupby("pos").size()) - 0.1  # each node's place, gaps between
    assert 140 + 110 * n_places > 820 >= 140 + 64 * n_places  # too wide at its full width for a 1280-px window's
    # column, narrow enough at 64 px a place
    fig = subgraph_figure(nodes, edges, tokens, g.n_layers)
    assert fig.layout.width is None and fig.layout.meta["fits"]
    assert fig.layout.meta["design_px"] == pytest.approx(820, abs=1)  # narrowed to the column
    roomy = subgraph_figure(nodes, edges, tokens, g.n_layers, fit_px=140 + 110 * n_places + 5)
    assert roomy.layout.width is None and roomy.layout.meta["design_px"] == pytest.approx(140 + 110 * n_places, abs=1)
    tight = subgraph_figure(nodes, edges, tokens, g.n_layers, fit_px=140 + 64 * n_places - 5)
    assert not tight.layout.meta["fits"] and tight.layout.width == pytest.approx(140 + 110 * n_places, abs=1)
    xs = sorted(x for t in fig.data for x in t.x)
    assert [x for t in tight.data for x in t.x] == [x for t in fig.data for x in t.x] and len(set(xs)) == len(xs)
