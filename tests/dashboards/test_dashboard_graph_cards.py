"""The Attribution graph page's node card and subgraph pane, driven headless with streamlit.testing.v1.AppTest on the
shipped gpt-4: a logit node's card from the link lists the inputs the library ranks (keys, weights, shares) and marks
the ones pruning keeps as drawn; two pinned nodes get the subgraph pane with the library's sums. The expected values
come from the library on the same graph (the page's own command: the story's first 57 tokens, 2048 feature nodes)
and from prune_graph at the page's default thresholds."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

import sprout_interp as si  # noqa: E402
from sprout_interp.core import loading  # noqa: E402
from sprout_interp.core.texts import TEXTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboards" / "app.py"
PAGE = "views/attribution_graph.py"

pytestmark = [
    pytest.mark.acceptance,  # the page computes a graph: seconds
    pytest.mark.skipif(not (Path(loading.SHIPPED_DIR) / "gpt-4" / "transcoders").is_dir(),
                       reason="the shipped gpt-4 transcoders are not installed"),
]


def run(params: dict) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=600)
    at.query_params.update({"model": "gpt-4", "text": "story", **params})
    at = at.switch_page(PAGE).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


@pytest.fixture(scope="module")
def graph():
    m = si.load("gpt-4")
    return si.attribution_graph(m, m.to_tokens(TEXTS["story"])[0, :57], max_feature_nodes=2048)


def test_a_logit_nodes_card_ranks_its_inputs_as_the_library_does(graph):
    keys = si.node_keys(graph)
    logit = len(keys) - graph.n_logits
    at = run({"node": keys[logit]})
    assert any(str(h.value).startswith(f"Node {keys[logit]}: logit") for h in at.subheader)
    tables = [d.value for d in at.dataframe if "rank" in d.value.columns]
    assert len(tables) == 1  # a logit has inputs only
    got = tables[0]
    ins, outs = si.node_edges(graph, logit, n=10)
    assert outs.empty and got["key"].tolist() == ins["key"].tolist()
    np.testing.assert_allclose(got["weight"].to_numpy(float), ins["weight"].to_numpy(), rtol=1e-9)
    np.testing.assert_allclose(got["share"].to_numpy(float), ins["share"].to_numpy(), rtol=1e-9)
    # 'drawn': the edges pruning keeps at the page's default thresholds (rows = targets)
    mask = si.prune_graph(graph, 0.8, 0.98).edge_mask
    want = [bool(mask[logit, int(s)]) for s in ins["node"]]
    assert got["drawn"].tolist() == want and any(want)


def test_two_pinned_nodes_get_the_subgraph_pane_with_the_librarys_sums(graph):
    keys = si.node_keys(graph)
    logit = len(keys) - graph.n_logits
    ins, _ = si.node_edges(graph, logit, n=10)
    feat = next(k for k, kind in zip(ins["key"], ins["kind"]) if kind == "feature")
    at = run({"pin": [feat, keys[logit]]})
    nodes, edges = si.subgraph(graph, [feat, keys[logit]])
    table = next(d.value for d in at.dataframe if "target_key" in d.value.columns)
    row = table[(table["source_key"] == feat) & (table["target_key"] == keys[logit])]
    want = edges[(edges["source"] == 0) & (edges["target"] == 1)]
    assert len(row) == 1 and len(want) == 1
    for c in ("total", "weight", "share"):
        assert float(row[c].iloc[0]) == pytest.approx(float(want[c].iloc[0]), rel=1e-9)
    spec = next(json.loads(el.proto.spec) for el in at.get("plotly_chart")
                if json.loads(el.proto.spec)["layout"].get("meta", {}).get("value") == "total")
    assert spec["layout"]["meta"]["edges"] == [[0, 1, pytest.approx(float(want["total"].iloc[0]), rel=1e-9)]]
