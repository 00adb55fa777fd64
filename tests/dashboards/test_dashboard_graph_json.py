"""The Attribution graph page and circuit-tracer's JSON, driven headless with streamlit.testing.v1.AppTest: a
circuit-tracer .json uploaded is drawn read-only (every node of the file in the figure, its labels and cumulative
influence in the hover, the tables), a hostile one is refused on the page naming the field, and the computed
graph's view offers both downloads (the JSON and the folder for circuit-tracer's server)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("streamlit")
from conftest import tiny_config  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import sprout_interp as si  # noqa: E402
from sprout_interp.circuits.local_replacement import random_transcoders  # noqa: E402
from sprout_interp.core import loading  # noqa: E402
from sprout_interp.core.hooked import HookedSprout  # noqa: E402
from sprout_model import GPT  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboards" / "app.py"
PAGE = "views/attribution_graph.py"

pytestmark = [
    pytest.mark.acceptance,  # the app loads the shipped gpt-4; the download view computes its graph
    pytest.mark.skipif(not (Path(loading.SHIPPED_DIR) / "gpt-4" / "transcoders").is_dir(),
                       reason="the shipped gpt-4 transcoders are not installed"),
]


def run(params: dict | None = None) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=600)
    at.query_params.update({"model": "gpt-4", "text": "story", **(params or {})})
    return at.switch_page(PAGE)


def said(at: AppTest) -> str:
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", " ".join(str(e.value) for e in [*at.warning, *at.info, *at.error]))


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory) -> Path:
    """A small graph in circuit-tracer's JSON with a typed label (a tiny random model: the page draws the file alone,
    whatever model made it)."""
    torch.manual_seed(0)
    m = HookedSprout(GPT(tiny_config(n_layer=3)).eval(), name="tiny")
    g = si.attribution_graph(m, torch.randint(1, 64, (12,), generator=torch.Generator().manual_seed(3)),
                             random_transcoders(m, k=4, d_transcoder=48, seed=1))
    return si.save_graph_json(g, tmp_path_factory.mktemp("json"), "tiny", node_threshold=0.99,
                              labels={"t1": "<b>the second token</b>"}, pinned=["t1"])


def test_an_uploaded_circuit_tracer_json_is_drawn_read_only(graph_file):
    at = run().run()
    at.file_uploader(key="ag_upload").upload("tiny.json", graph_file.read_bytes())
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert "Showing the uploaded graph in circuit-tracer's JSON" in said(at)
    back = si.load_graph_json(graph_file)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["nodes"] == f"{len(back.nodes):,}" and metrics["links"] == f"{len(back.links):,}"
    assert metrics["blocks"] == "3" and metrics["positions"] == "13"
    spec = next(json.loads(el.proto.spec) for el in at.get("plotly_chart"))
    hovers = [h for t in spec["data"] if t.get("mode") == "markers" for h in t.get("hovertext") or []]
    assert len(hovers) == len(back.nodes)  # every node of the file drawn once
    ids = {h.rsplit("id ", 1)[1] for h in hovers}
    assert ids == set(back.nodes["node_id"])
    t1 = back.nodes[back.nodes["key"] == "t1"].iloc[0]
    second = next(h for h in hovers if h.endswith(f"id {t1['node_id']}"))
    assert "<i>&lt;b&gt;the second token&lt;/b&gt;</i>" in second and "cumulative influence" in second
    ring = {h.rsplit("id ", 1)[1]: w for t in spec["data"] if t.get("mode") == "markers"
            for h, w in zip(t["hovertext"], t["marker"]["line"]["width"])}
    assert ring[t1["node_id"]] == 2 and sorted(ring.values())[-2] < 2  # the file's one pin ringed
    assert sum("cumulative influence" in h for h in hovers) == int((back.nodes["kind"] != "logit").sum())
    assert len(at.dataframe) >= 2  # the nodes and the links
    assert "replacement score" not in metrics  # nothing computed: the file alone


def test_a_hostile_json_is_refused_on_the_page(graph_file):
    obj = json.loads(graph_file.read_text())
    obj["links"][0]["target"] = "nowhere"
    at = run().run()
    at.file_uploader(key="ag_upload").upload("bad.json", json.dumps(obj).encode())
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    text = said(at)
    assert "links[0].target 'nowhere' is not a node" in text
    assert not at.get("plotly_chart")


def test_the_computed_graph_offers_circuit_tracers_json():
    at = run({"pin": "t5", "super": "ends:t1,t2"}).run()  # pins and a supernode go into the file's qParams
    assert not at.exception, [e.value for e in at.exception]
    labels = [b.proto.label for b in at.get("download_button")]
    assert any("circuit-tracer's JSON (.json)" in x for x in labels)
    assert any("circuit-tracer's server folder (.zip)" in x for x in labels)
    # the page's pins and supernode go into the file (kept whatever the thresholds): its command says so
    said_ = " ".join(str(c.value) for c in at.caption)
    assert "pinned=['t5'], supernodes={'ends': ['t1', 't2']})" in said_, said_[-2000:]
    sys.path.insert(0, str(APP.parent))
    try:
        import graph_export
    finally:
        sys.path.remove(str(APP.parent))
    assert graph_export.slug_for("gpt-4", "graph", 58, "tokens") == "gpt-4-graph-58-tokens"
    assert graph_export.slug_for("../a b/<c>") == "a-b-c" and graph_export.slug_for("///") == "graph"
