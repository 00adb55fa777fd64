"""The dashboard's Attribution graph page, driven headless with streamlit.testing.v1.AppTest on the shipped gpt-4
(its transcoders make a graph in seconds): the default view (the story's second "Zorbin Plax", the graph's scores
beside the command that reproduces them), the thresholds, pins and supernodes kept in the link and restored from
it, link values it cannot show (a warning naming the valid range), a feature's card, and gpt-1, which has no
transcoders."""
from __future__ import annotations

import json
import re
from pathlib import Path

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
    pytest.mark.acceptance,  # the first view computes a graph: seconds
    pytest.mark.skipif(not (Path(loading.SHIPPED_DIR) / "gpt-4" / "transcoders").is_dir(),
                       reason="the shipped gpt-4 transcoders are not installed"),
]


def run(params: dict | None = None, model: str = "gpt-4") -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=600)
    at.query_params.update({"model": model, "text": "story", **(params or {})})
    return at.switch_page(PAGE).run()


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def said(at: AppTest) -> str:
    """The page's messages as a person reads them (the dashboard backslash-escapes punctuation it quotes)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", " ".join(str(e.value) for e in [*at.warning, *at.info, *at.error]))


def graph_spec(at: AppTest) -> dict:
    specs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    return next(s for s in specs if s["layout"]["yaxis"].get("ticktext", [""])[0] == "embeddings")


def many(at: AppTest, param: str) -> list[str]:
    """A repeated link parameter's values (AppTest keeps one value as a string, several as a list)."""
    v = at.query_params.get(param)
    return [] if v is None else list(v) if isinstance(v, list) else [v]


def drawn_keys(spec: dict) -> set[str]:
    return {line.rsplit("key ", 1)[1] for t in spec["data"] if t.get("mode") == "markers"
            for line in t["hovertext"] if "key " in line}


@pytest.fixture(scope="module")
def first() -> AppTest:
    return ok(run())


def test_the_default_view_is_the_second_plax_with_its_scores_and_command(first):
    at = first
    strs = si.load("gpt-4").to_str_tokens(TEXTS["story"])
    end = int(at.query_params["end"])
    assert strs[end] == " Pl" and "".join(strs[:end]).endswith("Zorbin")  # stops before the second " Plax"
    assert "".join(strs[:end]).count("Zorbin") == 2
    metrics = {m.label: m.value for m in at.metric}
    g = si.attribution_graph(si.load("gpt-4"), si.load("gpt-4").to_tokens(TEXTS["story"])[0, :end],
                             max_feature_nodes=2048)
    rep, comp = si.graph_scores(g)
    assert metrics["replacement score"] == f"{rep:.3f}" and metrics["completeness score"] == f"{comp:.3f}"
    assert metrics["nodes"] == f"{len(g.nodes):,}"
    code = " ".join(c.value for c in at.code)
    assert f"[0, :{end}], max_feature_nodes=2048" in code and "TEXTS['story']" in code and "graph_scores" in code
    spec = graph_spec(at)
    assert spec["layout"]["yaxis"]["ticktext"] == ["embeddings", "block 1", "block 2", "block 3", "block 4", "logits"]
    ticks = [a["text"] for a in spec["layout"]["annotations"] if a.get("name") == "token"]
    first_pl = strs.index(" Pl") + 1  # <|endoftext|> goes first
    assert len(ticks) == end + 1 and ticks[0].startswith("0: &lt;|endof") and ticks[first_pl] == f"{first_pl}: ␣Pl"
    assert spec["layout"]["meta"]["fits"] and "width" not in spec["layout"]  # the page's width, no sideways scroll
    drawn = [a["text"] for a in spec["layout"]["annotations"] if a.get("name") == "node label"]
    top = metrics["top logit"][1:-1]  # the top logit named first, as its token and probability
    assert len(drawn) >= 12 and drawn[0].startswith("␣" * (len(top) - len(top.lstrip(" "))) + top.lstrip(" ") + " (p ")
    assert at.query_params["node_threshold"] == "0.8" and at.query_params["edge_threshold"] == "0.98"


def test_thresholds_pins_and_supernodes_live_in_the_link(first):
    at = first
    at.slider(key="ag_node_thr").set_value(0.5)
    ok(at.run())
    few = drawn_keys(graph_spec(at))
    assert at.query_params["node_threshold"] == "0.5"
    at.slider(key="ag_node_thr").set_value(0.9)
    ok(at.run())
    more = drawn_keys(graph_spec(at))
    assert few < more  # a higher threshold keeps more nodes
    feats = sorted(k for k in more - few if k.startswith("f"))[:3]
    at.slider(key="ag_node_thr").set_value(0.5)
    at.multiselect(key="ag_pins").set_value(feats)
    ok(at.run())
    assert set(feats) <= drawn_keys(graph_spec(at))  # pinned: drawn below their threshold
    assert many(at, "pin") == feats
    at.text_input(key="ag_super_name").set_value("late readers")
    at.multiselect(key="ag_super_members").set_value(feats[:2])
    at.button(key="FormSubmitter:ag_group-group into a supernode").click()
    ok(at.run())
    link = dict(at.query_params) | {"super": many(at, "super"), "pin": many(at, "pin")}
    assert link["super"] == [f"late readers:{feats[0]},{feats[1]}"]
    spec = graph_spec(at)
    keys = drawn_keys(spec)
    assert not set(feats[:2]) & keys and feats[2] in keys  # two drawn as one supernode
    assert any(t.get("name") == "late readers" for t in spec["data"])
    again = ok(run({k: v for k, v in link.items() if k not in ("model", "text")}))  # the link, reopened
    assert again.session_state["ag_node_thr"] == 0.5 and again.session_state["ag_pins"] == feats
    assert again.session_state["ag_super"] == link["super"]
    assert drawn_keys(graph_spec(again)) == keys


def test_a_long_prompt_is_graphed_when_asked_and_a_link_keeps_it():
    """A prompt of more than AUTO_TOKENS tokens opens on its controls and a button, with no graph computed; the
    button computes it and the link then says graph=1, which reopens it computed. The default prompt (57 tokens) is
    graphed at once, with no graph=1 in its link."""
    default = ok(run())
    assert graph_spec(default) and "graph" not in default.query_params and "graphed when you ask" not in said(default)
    at = ok(run({"end": "120"}))
    assert "A prompt of 120 tokens is graphed when you ask" in said(at)
    assert not at.get("plotly_chart") and not at.metric and "graph" not in at.query_params  # nothing computed
    at.button(key="ag_go_btn").click()
    at = ok(at.run())
    assert graph_spec(at) and at.query_params["graph"] == "1" and at.query_params["end"] == "120"
    assert {m.label for m in at.metric} >= {"nodes", "replacement score"}
    again = ok(run({"end": "120", "graph": "1"}))
    assert graph_spec(again) and "graphed when you ask" not in said(again)


def test_link_values_it_cannot_show_are_named_with_their_range():
    at = ok(run({"node_threshold": "2", "edge_threshold": "x", "end": "9999", "pin": "f9.9.9", "super": "a:zz",
                 "max_features": "7", "card": "e0.3"}))
    text = said(at)
    assert "node_threshold=2" in text and "a number from 0.1 to 1.0" in text
    assert "edge_threshold=x" in text and "a number from 0.5 to 1.0" in text
    assert "end=9999" in text and "a whole number from 1 to" in text
    assert "pin=f9.9.9" in text and "layer 0 to 3" in text
    assert "super=a:zz" in text and "max_features=7" in text and "card=e0.3" in text
    assert at.session_state["ag_node_thr"] == 0.8 and at.query_params["node_threshold"] == "0.8"
    assert not many(at, "pin")


def test_a_feature_in_the_link_opens_its_card_from_held_out_text(first):
    spec = graph_spec(first)
    feat = sorted(k for k in drawn_keys(spec) if k.startswith("f"))[0]
    at = ok(run({"card": feat}))
    layer, pos, feature = (int(x) for x in feat[1:].split("."))
    assert any(f"Feature {feature}, block {layer + 1} (layer {layer})" in h.value for h in at.subheader)
    labels = {m.label for m in at.metric}
    assert {"fires on", "max activation", "mean when on"} <= labels
    titles = [json.loads(el.proto.spec)["layout"].get("title", {}).get("text", "").replace("<br>", " ")
              for el in at.get("plotly_chart")]
    assert any(f"tokens feature {feature} promotes" in t for t in titles)


def test_gpt1_says_it_has_no_transcoders():
    at = ok(run(model="gpt-1"))
    assert "gpt-1 has no transcoders" in said(at) and "sprout" in said(at)
    assert not at.get("plotly_chart")


def test_a_typed_label_replaces_the_measured_one_and_lives_in_the_link():
    """A label typed for a node (the link's label=key:text) is drawn on the graph in place of the one made from its
    promoted tokens, shown in the nodes' table and kept in the link; a link's label for a node the graph lacks is
    named with the valid form."""
    spec = graph_spec(ok(run()))  # the default view (the module's first view has been changed by other tests)
    feat = next(line.rsplit("key ", 1)[1] for t in spec["data"] if t.get("name") == "feature"
                for line in t["hovertext"] if line.split("<br>")[0].startswith("<i>"))
    at = ok(run({"label": f"{feat}:the Plax reader"}))
    spec = graph_spec(at)
    drawn = [a["text"] for a in spec["layout"]["annotations"] if a.get("name") == "node label"]
    hover = next(line for t in spec["data"] if t.get("name") == "feature" for line in t["hovertext"]
                 if line.endswith(f"key {feat}"))
    assert hover.startswith("<i>the Plax reader</i>")
    assert at.query_params["label"] == f"{feat}:the Plax reader"
    table = next(df.value for df in at.dataframe if "label" in df.value.columns)
    assert table.set_index("key").loc[feat, "label"] == "the Plax reader"
    assert drawn  # the strongest nodes keep their labels
    bad = ok(run({"label": "f9.9.9:nothing"}))
    assert "label=f9.9.9:nothing" in said(bad) and "key:text" in said(bad)
