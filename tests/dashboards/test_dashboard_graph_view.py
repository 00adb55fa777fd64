"""The Attribution graph page's first view, shipped beside a checkpoint (``graph_view.json``, dashboards/precomputed.py;
written by ``scripts/precompute_dashboard.py``).

The file is read only for the checkpoint whose fingerprint it carries and over the transcoders it was computed over
(the sha256 of their files); it comes back as written (floats to precomputed.GRAPH_DIGITS digits). The shipped files
are current and equal a fresh computation on this machine, whatever its CPU: numbers to precomputed.FRESH_TOLERANCE,
and the pruned graph, a cut over thousands of nearly equal edge scores, lies between the fresh graph pruned at both
thresholds 1e-4 lower and 1e-4 higher (pruning keeps more at a higher threshold; float32 rounding moves a cumulative
share by about 1e-6, so no near-tie decides the comparison). The page draws the first view without computing the
graph, and computes the graph once a person asks for more.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from sprout_interp.core import loading

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "dashboards"))
import precomputed  # noqa: E402

pytestmark = pytest.mark.unit
WITH_TRANSCODERS = ["gpt-4", "sprout"]
SLACK = 1e-4  # how far the thresholds move for the sandwich (10 times any cross-machine change of a share)


def _installed(name: str) -> bool:
    return (Path(loading.SHIPPED_DIR) / name / "model.safetensors").is_file()


def _view(kind: str = "per_layer") -> precomputed.GraphView:
    """A hand-made first view: 3 features, 2 layers x 2 positions of error nodes, 2 embeddings, 1 logit."""
    nodes = pd.DataFrame({"node": range(10), "kind": ["feature"] * 3 + ["error"] * 4 + ["embedding"] * 2 + ["logit"],
                          "layer": [0, 1, 1, 0, 0, 1, 1, -1, -1, 2], "block": [1, 2, 2, 1, 1, 2, 2, 0, 0, 3],
                          "pos": [0, 1, 1, 0, 1, 0, 1, 0, 1, 1], "feature": [5, 2, 7] + [-1] * 7,
                          "token_id": [3, 9, 9, 3, 9, 3, 9, 3, 9, 4], "token": ["a", " b", " b", "a", " b", "a", " b",
                                                                                 "a", " b", " c"],
                          "activation": [1.25, 0.123456789, 3.0] + [np.nan] * 7,
                          "logit_prob": [np.nan] * 9 + [0.987654321]})
    view_nodes = nodes.iloc[[0, 1, 7, 8, 9]].reset_index(drop=True).assign(key=["f0.0.5", "f1.1.2", "t0", "t1", "l4"],
                                                                          influence=[0.5, 1 / 3, 0.1, 0.2, 0.0],
                                                                          kept=True)
    edges = pd.DataFrame({"source": [7, 0, 1, 8], "target": [0, 1, 9, 9], "weight": [1 / 7, -2.5, 0.3, 1e-9]})
    return precomputed.GraphView(
        settings=precomputed.graph_settings("some text", 2, 2048, kind), nodes=nodes, tokens=[3, 9], n_layers=2,
        info={"model_name": "tiny", "transcoder_kind": kind}, influence=[0.5, 1 / 3, 0.25, 0, 0, 0, 0, 0.1, 0.2, 0],
        replacement=0.75, completeness=0.875, view_nodes=view_nodes, view_edges=edges,
        labels={(0, 5): 'after "a"', (1, 2): '-> " c"'}, promoted={(0, 5): [" b", "x", "y"], (1, 2): [" c", "d", "e"]})


def _same(a: precomputed.GraphView, b: precomputed.GraphView, rtol: float, atol: float) -> None:
    assert (a.settings, a.tokens, a.n_layers, a.labels, a.promoted) == (b.settings, b.tokens, b.n_layers, b.labels,
                                                                         b.promoted)
    assert a.info == b.info
    np.testing.assert_allclose(a.influence, b.influence, rtol=rtol, atol=atol)
    np.testing.assert_allclose([a.replacement, a.completeness], [b.replacement, b.completeness], rtol=rtol, atol=atol)
    for x, y in ((a.nodes, b.nodes), (a.view_nodes, b.view_nodes), (a.view_edges, b.view_edges)):
        pd.testing.assert_frame_equal(x, y, check_exact=False, rtol=rtol, atol=atol)


def test_a_first_view_comes_back_as_written(tmp_path):
    v = _view()
    path = tmp_path / "view.json"
    path.write_text(json.dumps(precomputed.graph_view_to_json(v), allow_nan=False))
    back = precomputed.graph_view_from_json(json.loads(path.read_text()))
    _same(back, v, rtol=5e-7, atol=0)
    assert back.view_edges["weight"].tolist()[0] == float(f"{1 / 7:.7g}") != 1 / 7  # 7 digits, not 17
    assert (back.n_pos, back.n_features, back.n_errors, back.n_logits, back.transcoder_kind) == (2, 3, 4, 1, "per_layer")
    assert back.answers("some text", 2, 2048, "per_layer")
    for other in (("some text!", 2, 2048, "per_layer"), ("some text", 3, 2048, "per_layer"),
                  ("some text", 2, 1024, "per_layer"), ("some text", 2, 2048, "clt")):
        assert not back.answers(*other)


@pytest.fixture
def checkpoint_with_transcoders(tiny_checkpoint, tmp_path):
    """A copy of the tiny checkpoint with a (stand-in) per-layer transcoder folder beside it."""
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, folder)
    (folder / "transcoders").mkdir(exist_ok=True)
    (folder / "transcoders" / "layer_0.safetensors").write_bytes(b"weights")
    (folder / "transcoders" / "config.yaml").write_text("{}")
    return folder


def test_the_file_is_read_only_for_its_checkpoint_and_transcoders(checkpoint_with_transcoders):
    import sprout_interp as si

    m = si.load(str(checkpoint_with_transcoders))
    v = _view()
    path = precomputed.write_graph_view(m, v)
    assert path == checkpoint_with_transcoders / precomputed.GRAPH_FILE
    got, why = precomputed.read_graph_view(m)
    assert why == "" and got is not None
    _same(got, v, rtol=5e-7, atol=0)
    # retrained transcoders: another file's sha256
    (checkpoint_with_transcoders / "transcoders" / "layer_0.safetensors").write_bytes(b"other weights")
    got, why = precomputed.read_graph_view(m)
    assert got is None and "other transcoders" in why
    precomputed.write_graph_view(m, v)
    assert precomputed.read_graph_view(m)[0] is not None
    # a view over the CLT checks the CLT's folder, which this checkpoint lacks
    precomputed.write_graph_view(m, _view("clt"))
    (checkpoint_with_transcoders / "clt").mkdir()
    (checkpoint_with_transcoders / "clt" / "config.yaml").write_text("{}")
    got, why = precomputed.read_graph_view(m)
    assert got is None and "other transcoders" in why
    # another checkpoint
    precomputed.write_graph_view(m, v)
    data = json.loads(path.read_text())
    data["fingerprint"]["weights_sha256"] = "0" * 64
    path.write_text(json.dumps(data))
    got, why = precomputed.read_graph_view(m)
    assert got is None and "another checkpoint" in why
    # damaged, or not this format
    for text, said in (("{not json", "cannot be read"), (json.dumps({"format": "x"}), "is not a"),
                       (json.dumps({"format": precomputed.GRAPH_FORMAT, "fingerprint": {}}), "another checkpoint")):
        path.write_text(text)
        got, why = precomputed.read_graph_view(m)
        assert got is None and said in why, why
    precomputed.write_graph_view(m, v)
    data = json.loads(path.read_text())
    del data["view"]["influence"]
    path.write_text(json.dumps(data))
    got, why = precomputed.read_graph_view(m)
    assert got is None and "cannot be read" in why
    path.unlink()
    assert precomputed.read_graph_view(m) == (None, f"no {precomputed.GRAPH_FILE} beside the checkpoint")


def test_a_checkpoint_without_transcoders_gets_no_file(tiny_checkpoint, tmp_path):
    import sprout_interp as si

    folder = tmp_path / "bare"
    shutil.copytree(tiny_checkpoint, folder)
    shutil.rmtree(folder / "transcoders", ignore_errors=True)
    (folder / precomputed.GRAPH_FILE).write_text("{}")  # an old one goes
    m = si.load(str(folder))
    assert precomputed.write_graph_view(m) is None
    assert not (folder / precomputed.GRAPH_FILE).exists()


@pytest.mark.integration
@pytest.mark.parametrize("name", WITH_TRANSCODERS)
def test_the_shipped_first_view_is_current(name):
    """The shipped file matches the checkpoint and the transcoders shipped beside it now, and answers the page's
    question for the default text (a reshipped CLT without `scripts/precompute_dashboard.py --graph-only` fails
    here)."""
    import sprout_interp as si
    from sprout_interp.circuits.local_replacement import best_kind
    from sprout_interp.core.texts import TEXTS

    if not _installed(name):
        pytest.skip(f"the shipped {name} checkpoint is not installed")
    m = si.load(name)
    got, why = precomputed.read_graph_view(m)
    assert why == "" and got is not None
    text = TEXTS[precomputed.GRAPH_TEXT]
    assert got.answers(text, precomputed.default_end(m, text), precomputed.GRAPH["max_features"], best_kind(m))
    assert got.view_nodes["key"].is_unique and len(got.view_nodes) > got.n_pos + got.n_logits
    assert set(got.labels) == set(got.promoted) == {(int(r.layer), int(r.feature)) for r in
                                                    got.view_nodes[got.view_nodes["kind"] == "feature"].itertuples()}


def _pairs(edges: pd.DataFrame) -> set:
    return set(zip(edges["source"].tolist(), edges["target"].tolist()))


@pytest.mark.acceptance  # tens of seconds: the default prompt's graph of each model
@pytest.mark.parametrize("name", WITH_TRANSCODERS)
def test_the_shipped_first_view_equals_a_fresh_computation(name):
    import sprout_interp as si
    from sprout_interp.circuits.local_replacement import resolve_transcoders
    from sprout_interp.features.pages import vocabulary_strings
    from sprout_interp.plots.graph import graph_tables

    if not _installed(name):
        pytest.skip(f"the shipped {name} checkpoint is not installed")
    m = si.load(name)
    shipped, why = precomputed.read_graph_view(m)
    assert shipped is not None, why
    g, text, kind = precomputed.default_graph(m)
    fresh = precomputed.graph_first_view(m, graph=g)
    tol = precomputed.FRESH_TOLERANCE
    assert (shipped.settings, shipped.tokens, shipped.n_layers, shipped.info) == (fresh.settings, fresh.tokens,
                                                                                    fresh.n_layers, fresh.info)
    pd.testing.assert_frame_equal(shipped.nodes, fresh.nodes, check_exact=False, **tol)
    np.testing.assert_allclose(shipped.influence, fresh.influence, **tol)
    np.testing.assert_allclose([shipped.replacement, shipped.completeness], [fresh.replacement, fresh.completeness],
                               **tol)
    # the pruned graph: between the fresh graph pruned at both thresholds SLACK lower and SLACK higher
    nt, et = precomputed.GRAPH["node_threshold"], precomputed.GRAPH["edge_threshold"]
    lo_nodes, lo_edges = graph_tables(g, nt - SLACK, et - SLACK)
    hi_nodes, hi_edges = graph_tables(g, nt + SLACK, min(1.0, et + SLACK))
    keys = set(shipped.view_nodes["key"])
    assert set(lo_nodes["key"]) <= keys <= set(hi_nodes["key"])
    assert _pairs(lo_edges) <= _pairs(shipped.view_edges) <= _pairs(hi_edges)
    assert len(lo_edges) < len(hi_edges)  # the sandwich is not empty: the check can fail
    both = shipped.view_edges.merge(hi_edges, on=["source", "target"], suffixes=("", "_fresh"))
    assert len(both) == len(shipped.view_edges)
    np.testing.assert_allclose(both["weight"], both["weight_fresh"], **tol)
    drawn = shipped.view_nodes.merge(hi_nodes[["key", "influence", "activation"]], on="key", suffixes=("", "_fresh"))
    np.testing.assert_allclose(drawn["influence"], drawn["influence_fresh"], **tol)
    # labels read from the labels file shipped beside the transcoders; promoted tokens a top-3 over the vocabulary,
    # compared by their scores (a near-tie may order two tokens otherwise on another CPU)
    common = set(shipped.labels) & set(fresh.labels)
    assert common and {f: shipped.labels[f] for f in common} == {f: fresh.labels[f] for f in common}
    ts = resolve_transcoders(m, None, kind=kind)
    strings = vocabulary_strings(m)
    for layer, f in sorted(common):
        if shipped.promoted[(layer, f)] == fresh.promoted[(layer, f)]:
            continue
        tc = ts.layer_features(layer) if kind == "clt" else ts[layer]
        with torch.no_grad():
            scores = (tc.W_dec[f].float() @ m.W_U.float()).double()
        third = scores.topk(3).values[-1]
        got = scores[[strings.index(t) for t in shipped.promoted[(layer, f)]]]
        assert bool((got >= third - 1e-4 * scores.abs().max()).all()), (layer, f, shipped.promoted[(layer, f)])


def _page(params: dict | None = None):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "dashboards" / "app.py"), default_timeout=600)
    at.query_params.update({"model": "gpt-4", "text": "story", **(params or {})})
    at.switch_page("views/attribution_graph.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def _drawn(at) -> set:
    """The keys of the drawn nodes (the page's nodes table)."""
    return next(set(d.value["key"]) for d in at.dataframe if "key" in d.value.columns)


@pytest.mark.acceptance  # the page, then the graph computed when asked: seconds
@pytest.mark.skipif(not _installed("gpt-4"), reason="the shipped gpt-4 checkpoint is not installed")
def test_the_page_draws_the_first_view_from_the_file_and_computes_the_graph_when_asked(monkeypatch):
    import streamlit as st

    import sprout_interp as si
    from sprout_interp.circuits import attribution_graph as ag
    from sprout_interp.plots.graph import graph_tables

    st.cache_data.clear()
    st.cache_resource.clear()
    made = []
    real = ag.attribution_graph

    def counted(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    g, _, _ = precomputed.default_graph(si.load("gpt-4"))  # the page's graph, computed here by the library
    monkeypatch.setattr(ag, "attribution_graph", counted)
    view, why = precomputed.read_graph_view(si.load("gpt-4"))
    assert view is not None, why
    at = _page()
    metrics = {mt.label: str(mt.value) for mt in at.metric}
    assert metrics["computed in"] == "(from file)" and not made  # drawn without computing the graph
    assert metrics["replacement score"] == f"{view.replacement:.3f}"
    assert metrics["nodes"] == f"{len(view.nodes):,}"
    assert _drawn(at) == set(view.view_nodes["key"])
    # another threshold needs the graph itself: computed once, and drawn as graph_tables prunes it
    at.slider(key="ag_node_thr").set_value(0.7)
    at.run()
    assert not at.exception and len(made) == 1
    assert _drawn(at) == set(graph_tables(g, 0.7, precomputed.GRAPH["edge_threshold"])[0]["key"])
    at.slider(key="ag_node_thr").set_value(precomputed.GRAPH["node_threshold"])
    at.run()
    assert _drawn(at) == set(view.view_nodes["key"]) and len(made) == 1
    # a node's card from a link: its ranked edges need the graph (cached now: no second computation)
    key = view.view_nodes.loc[view.view_nodes["kind"] == "feature", "key"].iloc[0]
    card = _page({"node": key})
    assert any(f"Node {key}" in str(h.value) for h in card.subheader) and len(made) == 1
    # a stale file (another checkpoint's fingerprint) is not used: the page computes and says how long it took
    st.cache_resource.clear()
    monkeypatch.setattr(precomputed, "read_graph_view", lambda m, path=None: (None, "stale"))
    fresh = _page()
    assert {mt.label: str(mt.value) for mt in fresh.metric}["computed in"].endswith(" s") and len(made) == 2
    assert _drawn(fresh) == set(view.view_nodes["key"])  # gpt-4's default view: no near-tie at its thresholds
