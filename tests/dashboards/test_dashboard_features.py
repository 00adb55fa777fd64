"""The dashboard's Features page, driven headless with streamlit.testing.v1.AppTest: a feature's page from the
shipped sprout SAEs, the search by token, the features of the sidebar's text (also one longer than the context),
a checkpoint without SAEs, and typed text shown literally."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from sprout_interp.core import loading  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboards" / "app.py"
PAGE = "views/features.py"
OWN_TEXT = "type your own…"
SAES = Path(loading.SHIPPED_DIR) / "sprout" / "saes"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (SAES / "blocks.3.hook_resid_post" / "cfg.json").is_file(),
                       reason="the shipped sprout SAEs are not installed"),
]


def app(model: str = "sprout", text: str | None = None) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.session_state["model_choice"] = model
    if text is not None:
        at.session_state["text_choice"] = OWN_TEXT
        at.session_state["own_text"] = text
    return at.switch_page(PAGE)


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def shown(markdown: str) -> str:
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown)


@pytest.mark.acceptance  # over 3 s
def test_feature_page_and_the_text_tab():
    at = ok(app().run())
    assert "Features" in at.header[0].value
    labels = {m.label for m in at.metric}
    assert {"loss recovered", "L0", "fires on", "max activation"} <= labels
    assert any("feature 0" in shown(m.value) for m in at.markdown)
    assert at.get("plotly_chart"), "no histogram / logit chart"
    assert any("fires" in shown(m.value) or "dead" in shown(m.value) for m in at.markdown)  # the description
    # another feature by number
    next(n for n in at.number_input if (n.key or "").startswith("feat_n_")).set_value(7)
    at = ok(at.run())
    assert any("feature 7" in shown(m.value) for m in at.markdown)
    # the text tab: a table of features with descriptions, built only once the tab is open
    assert not any("description" in d.value.columns for d in [*at.dataframe, *at.table])
    at.session_state["feat_tab"] = "On your text"  # what clicking the tab does
    at = ok(at.run())
    tables = [d.value for d in at.table]  # a table whose cells wrap: the descriptions are read whole
    assert any({"feature", "max_act", "pos_of_max", "description"} <= set(t.columns) for t in tables)
    assert not any("feature 7" in shown(m.value) for m in at.markdown)  # the feature page's tab is closed
    at.session_state["feat_tab"] = "Feature page"
    at = ok(at.run())
    assert any("feature 7" in shown(m.value) for m in at.markdown)  # still the feature chosen before
    assert at.query_params["tab"] == "Feature page"


def test_the_text_tab_waits_until_opened(monkeypatch):
    """The text tab's dozen feature pages (for their descriptions) are built only when it is opened (a ready-made
    text opens on the feature page; a typed one opens on its features)."""
    import sys

    at = app()
    ok(at.run())
    compute = sys.modules["compute"]
    calls = []
    real = compute.feature_descriptions
    monkeypatch.setattr(compute, "feature_descriptions", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    ok(at.run())
    assert calls == []
    at.session_state["feat_tab"] = "On your text"
    ok(at.run())
    assert calls == [1]


def test_search_by_token():
    at = app().run()
    at.radio(key="feat_how").set_value("by token")
    at = ok(at.run())
    found = at.dataframe[0].value
    assert {"feature", "mean_act", "share", "occurrences"} <= set(found.columns) and len(found)
    at.text_input(key="feat_token").set_value("zzqx not one token")
    at = at.run()
    assert not at.exception
    assert any("not one" in shown(str(e.value)) for e in at.error)  # a clear message, the page still up


def test_text_longer_than_the_context_is_cut_with_a_notice():
    at = app(text="Zorbin Plax came home late. " * 150)
    at.session_state["feat_tab"] = "On your text"
    at = ok(at.run())
    assert any("512" in shown(str(w.value)) for w in at.warning)


def test_checkpoint_without_saes_says_how_to_train_one():
    at = ok(app(model="gpt-1").run())
    assert any("sprout_interp.features.train" in shown(str(i.value)) for i in at.info)


def test_typed_text_is_shown_literally():
    at = app(text="**bold** <script>alert(1)</script> [link](http://x)")
    at.session_state["feat_tab"] = "On your text"
    at = ok(at.run())
    html = " ".join(str(h.proto.body) for h in at.get("html"))
    assert set(re.findall(r"<\s*(\w+)", html)) <= {"div", "span", "p"}, "typed text became markup"
    assert "&lt;" in html and "[link](http://x)" not in html.replace("</span>", "")


def test_the_link_keeps_the_layer_and_the_feature():
    at = ok(app().run())
    at.selectbox(key=next(s.key for s in at.selectbox if (s.key or "").startswith("feat_layer_"))).set_value(1)
    at = ok(at.run())
    next(n for n in at.number_input if (n.key or "").startswith("feat_n_")).set_value(11)
    at = ok(at.run())
    qp = at.query_params
    assert qp["layer"] == "1" and qp["feature"] == "11" and qp["how"] == "by number"
    again = AppTest.from_file(str(APP), default_timeout=300)  # a reload of that link: a new session
    again.query_params.update(qp)
    again = ok(again.switch_page(PAGE).run())
    assert any("feature 11" in shown(m.value) and "block 2" in shown(m.value) for m in again.markdown)
    bad = AppTest.from_file(str(APP), default_timeout=300)
    bad.query_params.update({**qp, "layer": "7", "feature": "999999"})  # no such SAE, no such feature: defaults
    bad = ok(bad.switch_page(PAGE).run())
    assert any("feature 0" in shown(m.value) for m in bad.markdown)
    said = " ".join(shown(str(w.value)) for w in bad.warning)  # not silently: each says what it must be
    assert "layer=7" in said and "feature=999999" in said and "from 0 to" in said
