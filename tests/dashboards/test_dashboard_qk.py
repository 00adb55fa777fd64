"""The QK-attribution panel (dashboards/qk_view.py) on the Attention page and the Attribution graph page, driven
headless with streamlit.testing.v1.AppTest on the shipped gpt-4: a click on a cell of the pattern drawn large opens
it at that cell, its lists are the library's call, the link keeps the cell and a link reopens it; on the graph page a
head and a cell chosen, and a head-carried edge into a clicked node, open the same panel on the graph's prompt, over
either kind of transcoders (the cross-layer transcoder, gpt-4's default, and the per-layer set)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

import sprout_interp as si  # noqa: E402
from sprout_interp.core import loading  # noqa: E402
from sprout_interp.core.texts import TEXTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboards" / "app.py"

pytestmark = [
    pytest.mark.acceptance,  # the Attention page runs the circuit finder and every head's scores: tens of seconds
    pytest.mark.skipif(not (Path(loading.SHIPPED_DIR) / "gpt-4" / "transcoders").is_dir(),
                       reason="the shipped gpt-4 and its transcoders are not installed"),
]


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def page(view: str, params: dict | None = None) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=600)
    at.query_params.update({"model": "gpt-4", "text": "story", **(params or {})})
    return at.switch_page(view)


def _selection(*customdata) -> dict:
    points = [{"customdata": list(c), "curve_number": 0, "point_number": 0} for c in customdata]
    return {"selection": {"points": points, "point_indices": [0] * len(points), "box": [], "lasso": []}}


def _tables(at: AppTest) -> dict[str, object]:
    """The panel's tables by their first columns: the two sides' ranked lists, the carriers and the pairs."""
    out = {"sides": [], "carriers": [], "pairs": None}
    for d in at.dataframe:
        cols = list(d.value.columns)
        if cols[:2] == ["#", "component"]:
            out["sides"].append(d.value)
        elif cols == ["carried by", "value"]:
            out["carriers"].append(d.value)
        elif cols == ["query", "key", "term"]:
            out["pairs"] = d.value
    return out


def _panel_is(at, a):
    """Assert the page's QK panel shows the QK attribution ``a``: its score, both sides, the key's carriers and the
    pairs (to their shown digits); the key side's table, for more checks."""
    said = " ".join(md.value for md in at.markdown)
    assert f"pre-softmax score **{a.score:.3f}**" in said
    t = _tables(at)
    query, key = t["sides"]
    _same_side(query, a.query_components)
    _same_side(key, a.key_components)
    assert t["carriers"][1]["value"].tolist() == a.key_by_head()["value"].round(3).tolist()
    assert t["pairs"]["term"].tolist() == a.terms["term"].round(3).tolist()
    return key


def _same_side(shown, library, n=12):
    lib = library.head(n)
    assert shown["value"].tolist() == lib["value"].round(3).tolist()
    assert shown["component"].str.extract(r" at (\d+) ")[0].astype(int).tolist() == lib["pos"].tolist()
    carriers = ["— (never moved)" if pd.isna(v) else f"block {int(v) + 1} head {int(h)}"
                for v, h in zip(lib["via_layer"], lib["via_head"])]
    assert shown["carried by"].tolist() == carriers


def test_attention_a_click_on_a_cell_opens_its_qk_attribution_and_the_link_keeps_it():
    at = ok(page("views/attention.py", {"layer": "1", "head": "0"}).run())
    assert at.query_params["qk"] == "0" and not _tables(at)["sides"]  # closed until asked: nothing computed
    big = next(json.loads(el.proto.spec) for el in at.get("plotly_chart")
               if "hook_pattern" in json.loads(el.proto.spec)["layout"]["title"]["text"])
    cells = [tuple(c) for d in big["data"] if d["type"] == "scatter" for c in d["customdata"]]
    assert cells and all(k <= q for q, k in cells) and (54, 2) in cells  # the text's positions, causal cells only
    at.session_state["attn_large"] = _selection((54, 2))  # a click on query 54 ('or'), key 2 ('b')
    ok(at.run())
    assert (at.query_params["qk"], at.query_params["qk_query"], at.query_params["qk_key"]) == ("1", "54", "2")
    m = si.load("gpt-4")
    a = si.qk_attribution(m, m.to_tokens(TEXTS["story"])[0], 1, 0, 54, 2)
    key = _panel_is(at, a)
    assert key["carried by"].iloc[0] == "block 1 head 0"  # the previous-token head carries the most

    again = ok(page("views/attention.py", dict(at.query_params)).run())  # the link, reopened: the same cell
    assert again.session_state["qk_open"] and (again.session_state["qk_query"], again.session_state["qk_key"]) == (54, 2)
    assert _tables(again)["sides"][1]["value"].tolist() == key["value"].tolist()


def test_attention_a_key_after_the_query_is_refused_and_a_bad_link_value_named():
    at = ok(page("views/attention.py", {"qk": "1", "qk_query": "10", "qk_key": "30"}).run())
    assert at.session_state["qk_key"] <= at.session_state["qk_query"] == 10  # a key after its query: moved back
    at = page("views/attention.py", {"qk": "1", "qk_query": "100000"}).run()
    assert any("qk_query=100000" in w.value.replace("\\", "") for w in at.warning)


def test_graph_page_a_head_and_a_cell_or_a_head_carried_edge_open_the_same_panel():
    at = ok(page("views/attribution_graph.py", {"qk": "1", "qk_layer": "1", "qk_head": "0", "qk_query": "55",
                                                 "qk_key": "3", "kind": "per_layer"}).run())
    m = si.load("gpt-4")
    from sprout_interp.circuits.local_replacement import prompt_tokens
    from sprout_interp.features.transcoder import load_transcoders
    from sprout_interp.plots.graph import KIND_CODES

    end = int(at.query_params["end"])
    ids = prompt_tokens(m, m.to_tokens(TEXTS["story"])[0, :end], bos=True)  # the graph's prompt: <|endoftext|> first
    a = si.qk_attribution(m, ids, 1, 0, 55, 3, load_transcoders(m))
    key = _tables(at)["sides"][1]
    _same_side(key, a.key_components)
    assert {"qk_layer", "qk_head", "qk_query", "qk_key"} <= set(at.query_params)

    # a click on a node, then one of the head-carried edges into it: the panel opens at that edge's head and cell
    spec = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    nodes = [tuple(c) for s in spec for d in s["data"] if d.get("customdata") for c in d["customdata"]
             if isinstance(c, list) and len(c) == 2]
    logit = next(c for c in nodes if c[0] == KIND_CODES["logit"])  # the top logit's node
    at.session_state["ag_graph"] = _selection(logit)
    ok(at.run())
    edges = next((d.value for d in at.dataframe if list(d.value.columns)[:2] == ["from", "carried by"]), None)
    assert edges is not None and len(edges)
    at.selectbox(key="ag_qk_edge").set_value(0)
    ok(at.run())
    carrier = edges["carried by"].iloc[0]
    assert carrier == f"block {at.session_state['ag_qk_layer'] + 1} head {at.session_state['ag_qk_head']} " \
                      f"(layer {at.session_state['ag_qk_layer']})"
    assert at.session_state["ag_qk_open"] and at.session_state["ag_qk_key"] <= at.session_state["ag_qk_query"]


def test_the_cross_layer_transcoders_graph_opens_its_qk_panel_and_head_carried_edges():
    """gpt-4's graph page opens on its CLT (the better kind): the QK panel is the library's attribution with the
    shipped CLT on the graph's prompt, and the head-carried edges into the top logit add up to their edges."""
    at = ok(page("views/attribution_graph.py", {"qk": "1", "qk_layer": "1", "qk_head": "0", "qk_query": "55",
                                                 "qk_key": "3"}).run())
    assert at.session_state["ag_kind"] == "clt"
    assert not any("per-layer" in i.value for i in at.info)  # no notice sends the reader to the other kind
    m = si.load("gpt-4")
    from sprout_interp.circuits.local_replacement import prompt_tokens
    from sprout_interp.features.clt import load_clt
    from sprout_interp.plots.graph import KIND_CODES

    end = int(at.query_params["end"])
    ids = prompt_tokens(m, m.to_tokens(TEXTS["story"])[0, :end], bos=True)
    a = si.qk_attribution(m, ids, 1, 0, 55, 3, load_clt(m))
    key = _panel_is(at, a)
    assert (key["component"].str.contains("feat.")).any()  # the CLT's features are components
    assert any("cross-layer transcoder" in c.value for c in at.caption)

    spec = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    nodes = [tuple(c) for s in spec for d in s["data"] if d.get("customdata") for c in d["customdata"]
             if isinstance(c, list) and len(c) == 2]
    logit = next(c for c in nodes if c[0] == KIND_CODES["logit"])
    at.session_state["ag_graph"] = _selection(logit)
    ok(at.run())
    edges = next((d.value for d in at.dataframe if list(d.value.columns)[:2] == ["from", "carried by"]), None)
    assert edges is not None and len(edges)
    # edges from other positions: every part carried by a head, so each edge's parts add up to it (4 decimals shown)
    parts = edges.groupby("from").agg(parts=("part of the edge", "sum"), edge=("edge", "first"), n=("edge", "size"))
    assert (parts["parts"] - parts["edge"]).abs().max() <= 1e-4 * (parts["n"].max() + 1)
    at.selectbox(key="ag_qk_edge").set_value(0)
    ok(at.run())
    assert edges["carried by"].iloc[0] == f"block {at.session_state['ag_qk_layer'] + 1} head " \
                                          f"{at.session_state['ag_qk_head']} (layer {at.session_state['ag_qk_layer']})"
    assert at.session_state["ag_qk_open"] and _tables(at)["sides"]
