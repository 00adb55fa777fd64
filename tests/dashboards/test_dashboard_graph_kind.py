"""The Attribution graph page's choice of transcoders, driven headless with AppTest: a copy of the shipped gpt-4 that
also ships a (seeded random) cross-layer transcoder recorded as the better kind opens on the CLT's graph, the other
kind is a choice kept in the link, and the choice is hidden where a model ships one kind (a copy of gpt-4 without
its shipped CLT)."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

import sprout_interp as si  # noqa: E402
from sprout_interp.circuits.local_replacement import random_clt  # noqa: E402
from sprout_interp.core import loading  # noqa: E402
from sprout_interp.features.clt import save_clt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboards" / "app.py"
PAGE = "views/attribution_graph.py"

pytestmark = [
    pytest.mark.acceptance,  # each view computes a graph: seconds
    pytest.mark.skipif(not (Path(loading.SHIPPED_DIR) / "gpt-4" / "transcoders").is_dir(),
                       reason="the shipped gpt-4 transcoders are not installed"),
]


@pytest.fixture
def shipped_with_clt(shipped_gpt4_per_layer):
    """A copy of gpt-4 (its per-layer transcoders, mean held-out FVE 0.846) with a random CLT beside it recorded at
    FVE 0.99."""
    m = si.load("gpt-4")
    clt = random_clt(m, seed=0)
    clt.info["quality"] = [{"layer": i, "fve": 0.99} for i in range(m.cfg.n_layers)]
    save_clt(clt, shipped_gpt4_per_layer / "gpt-4" / "clt")
    return shipped_gpt4_per_layer


def run(params: dict | None = None) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=600)
    at.query_params.update({"model": "gpt-4", "text": "story", **(params or {})})
    return at.switch_page(PAGE).run()


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def scores(at: AppTest) -> tuple[str, str]:
    """The graph's replacement and completeness scores as the page shows them (a CLT's graph has its own)."""
    got = {mt.label: str(mt.value) for mt in at.metric}
    return got["replacement score"], got["completeness score"]


def test_the_better_kind_opens_and_the_other_is_a_choice_in_the_link(shipped_with_clt):
    at = ok(run())
    box = at.selectbox(key="ag_kind")
    assert box.options == ["cross-layer transcoder", "per-layer transcoders"] and box.value == "clt"
    clt_scores = scores(at)
    box.set_value("per_layer")
    at = ok(at.run())
    assert at.query_params.get("kind") == "per_layer"
    assert scores(at) != clt_scores
    again = ok(run({"kind": "per_layer"}))  # the link restores the choice
    assert again.selectbox(key="ag_kind").value == "per_layer" and scores(again) == scores(at)


def test_one_kind_shows_no_choice(shipped_gpt4_per_layer):
    at = ok(run())
    assert not [b for b in at.selectbox if b.key == "ag_kind"]
    assert at.metric  # the page drew its graph (over the one kind)
