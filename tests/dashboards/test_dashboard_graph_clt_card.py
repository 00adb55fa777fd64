"""The Attribution graph page's feature card on a cross-layer transcoder's graph, driven headless with AppTest: a copy
of the shipped gpt-4 that also ships a seeded random CLT recorded as the better kind opens on the CLT's graph; a
feature of it chosen in the link opens its card (no refusal) with the page the library builds from the CLT's layer
(sprout_interp.features.pages over CrossLayerTranscoder.layer_features) and the command that reproduces it; the
features' promoted tokens (read for every drawn node) raise no error."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

import sprout_interp as si  # noqa: E402
from sprout_interp.circuits.local_replacement import random_clt  # noqa: E402
from sprout_interp.core import loading  # noqa: E402
from sprout_interp.features.clt import load_clt, save_clt  # noqa: E402
from sprout_interp.features.pages import transcoder_feature_summary  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboards" / "app.py"
PAGE = "views/attribution_graph.py"

pytestmark = [
    pytest.mark.acceptance,  # each view computes a graph and a card reads held-out text: seconds
    pytest.mark.skipif(not (Path(loading.SHIPPED_DIR) / "gpt-4" / "transcoders").is_dir(),
                       reason="the shipped gpt-4 transcoders are not installed"),
]


@pytest.fixture
def shipped_with_clt(shipped_gpt4_per_layer):
    """A copy of gpt-4 with a seeded random CLT beside it recorded at FVE 0.99 (so the page opens on it). Returns
    (the model, the CLT as saved)."""
    m = si.load("gpt-4")
    clt = random_clt(m, seed=0)
    clt.info["quality"] = [{"layer": i, "fve": 0.99} for i in range(m.cfg.n_layers)]
    save_clt(clt, shipped_gpt4_per_layer / "gpt-4" / "clt")
    return m, clt


def run(params: dict | None = None) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=600)
    at.query_params.update({"model": "gpt-4", "text": "story", **(params or {})})
    return at.switch_page(PAGE).run()


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def feature_hovers(at: AppTest) -> dict[str, str]:
    """{drawn feature node's key: its hover text} on the graph's figure."""
    specs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    spec = next(s for s in specs if s["layout"]["yaxis"].get("ticktext", [""])[0] == "embeddings")
    return {line.rsplit("key ", 1)[1]: line for t in spec["data"] if t.get("name") == "feature"
            for line in t["hovertext"] if "key " in line}


def test_a_clt_features_card_opens_with_the_librarys_page(shipped_with_clt):
    m, _ = shipped_with_clt
    at = ok(run())
    assert at.selectbox(key="ag_kind").value == "clt"
    hovers = feature_hovers(at)
    assert hovers
    feat = sorted(hovers)[0]
    layer, pos, feature = (int(x) for x in feat[1:].split("."))
    at = ok(run({"card": feat}))
    assert at.selectbox(key="ag_kind").value == "clt"
    assert any(f"Feature {feature}, block {layer + 1} (layer {layer})" in h.value for h in at.subheader)
    text = " ".join(str(x.value) for x in [*at.markdown, *at.info, *at.warning, *at.caption])
    assert "built for per-layer transcoders" not in text
    # the card is the library's page of the CLT's feature, from the CLT the page loaded (as saved: float32)
    clt = load_clt(m)
    page = transcoder_feature_summary(m, clt.layer_features(layer), feature)
    assert any(page.description.replace("'", "") in str(x.value).replace("\\", "").replace("'", "")
               for x in at.markdown)
    metrics = {mt.label: str(mt.value) for mt in at.metric}
    assert metrics["fires on"] == f"{page.frequency:.2%}" and metrics["max activation"] == f"{page.max_activation:.2f}"
    titles = [json.loads(el.proto.spec)["layout"].get("title", {}).get("text", "").replace("<br>", " ")
              for el in at.get("plotly_chart")]
    assert any(f"tokens feature {feature} promotes" in t for t in titles)
    assert "load_clt" in text and f"layer_features({layer})" in text  # the command that reproduces it
