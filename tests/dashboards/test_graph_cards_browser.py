"""The Attribution graph page's node cards and subgraph pane in a real browser (`streamlit run` on a free localhost
port, headless Chromium; the server and the browser stopped after, even on failure): a click on an error node and on
a logit node opens its card with its ranked lists, a click on a list's first row moves the card to the node the
library ranks first, and two pinned nodes are drawn on their own with the edge value the library computes.

The expected values come from the library on the same graph (the page's own command: gpt-4, the story's first 57
tokens, 2048 feature nodes). Skipped, with the reason, only where Chromium, its driver, selenium or the shipped gpt-4
are missing.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from sprout_interp.core import loading

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import browser  # noqa: E402  (scripts/browser.py)

sys.path.remove(str(ROOT / "scripts"))

pytestmark = pytest.mark.acceptance

#: every node marker of the attribution graph: [left, top, right, bottom, customdata, trace name]
NODES_JS = """
const gd = Array.from(document.querySelectorAll('.js-plotly-plot'))
  .find(g => (g._fullData || []).some(t => t.name === 'error' && t.customdata));
if (!gd) return null;
gd.scrollIntoView({block: 'center'});
const traces = gd.querySelectorAll('.scatterlayer .trace');
const out = [];
gd._fullData.forEach((t, i) => {
  if (!t.customdata || !traces[i]) return;
  Array.from(traces[i].querySelectorAll('path.point')).forEach((p, k) => {
    const r = p.getBoundingClientRect();
    out.push([r.left, r.top, r.right, r.bottom, t.customdata[k], t.name]);
  });
});
return out;
"""

#: the first row of a card's list (found by its key's start): where to click it, in the viewport
ROW_JS = """
const el = document.querySelector('[class*="st-key-' + arguments[0] + '"] [data-testid="stDataFrame"]')
  || document.querySelector('[class*="st-key-' + arguments[0] + '"]');
if (!el) return null;
el.scrollIntoView({block: 'center'});
const r = el.getBoundingClientRect();
return [r.left, r.top, r.width, r.height];
"""

#: the subgraph figure's edges as drawn: layout.meta
META_JS = """
const gd = Array.from(document.querySelectorAll('.js-plotly-plot'))
  .find(g => ((g.querySelector('.gtitle') || {}).textContent || '').startsWith('subgraph'));
return gd ? gd.layout.meta : null;
"""


def _query(d) -> dict:
    return parse_qs(urlparse(d.current_url).query)


def _click(d, x: float, y: float) -> None:
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    actions = ActionBuilder(d)
    actions.pointer_action.move_to_location(int(x), int(y)).pause(0.3).click()
    actions.perform()


def _card(d, key: str, timeout: float = 180) -> str:
    """Wait for the card of node ``key`` (its heading); returns the heading."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        heads = [h for h in browser.texts(d, "h3") if h.startswith(f"Node {key}:")]
        if heads and _query(d).get("node") == [key]:
            browser.wait_for_page(d, n_plots=1)
            return heads[0]
        time.sleep(0.5)
    raise AssertionError(f"no card for {key}: headings {browser.texts(d, 'h3')}, link {_query(d)}")


def _click_node(d, kind: str, index: int) -> None:
    width = d.execute_script("return window.innerWidth;")
    time.sleep(0.5)
    boxes = [b for b in d.execute_script(NODES_JS) if b[5] == kind and b[4][1] == index]
    assert boxes, (kind, index)
    b = boxes[0]
    assert 0 < (b[0] + b[2]) / 2 < width, b
    _click(d, (b[0] + b[2]) / 2, (b[1] + b[3]) / 2)


def _click_first_row(d, table_key: str) -> None:
    """A click on the first data row of the list (the row's first cell: Streamlit selects the row)."""
    box = browser.script_result(d, ROW_JS, table_key)
    assert box, table_key
    time.sleep(0.5)
    box = d.execute_script(ROW_JS, table_key)
    _click(d, box[0] + 14, box[1] + 35 + 17)  # the row marker column, below the 35-px header


@pytest.fixture(scope="module")
def graph():
    """The page's default graph, made here by the library with the command the page prints."""
    if not (Path(loading.SHIPPED_DIR) / "gpt-4" / "model.safetensors").is_file():
        pytest.skip("the shipped gpt-4 checkpoint is not installed")
    import sprout_interp as si
    from sprout_interp.core.texts import TEXTS

    m = si.load("gpt-4")
    return si.attribution_graph(m, m.to_tokens(TEXTS["story"])[0, :57], max_feature_nodes=2048)


@pytest.fixture(scope="module")
def site(tmp_path_factory, graph):
    _, _, why = browser.find_chromium()
    if why:
        pytest.skip(f"no browser to test with: {why}")
    log = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    with browser.serve("gpt-4", log=log, timeout=300) as url, browser.chrome(1600, 1000) as d:
        yield url, d


def _key(graph, i: int) -> str:
    import sprout_interp as si

    return si.node_keys(graph)[i]


def test_any_node_opens_its_card_and_a_row_moves_it(site, graph, tmp_path):
    import sprout_interp as si

    url, d = site
    d.get(url + "/attribution_graph?model=gpt-4")
    browser.wait_for_page(d, n_plots=1, timeout=600)
    assert browser.problems(d) == []
    time.sleep(0.5)
    width = d.execute_script("return window.innerWidth;")
    # an error node in view that writes into something (the last position's, into the logits)
    errors = sorted(b[4][1] for b in d.execute_script(NODES_JS) if b[5] == "error" and 0 < (b[0] + b[2]) / 2 < width)
    err = next(i for i in errors if len(si.node_edges(graph, i)[1]) >= 2)
    _click_node(d, "error", err)
    head = _card(d, _key(graph, err))
    assert "error" in head
    ins, outs = si.node_edges(graph, err, n=10)
    assert ins.empty and len(outs) >= 2
    assert abs(outs["weight"].iloc[0]) > abs(outs["weight"].iloc[1]) * 1.001  # no tie decides the first row
    page = " ".join(browser.texts(d, "[data-testid='stMarkdownContainer']"))
    assert f"Strongest outputs (top {len(outs)} of {outs.attrs['count']:,})" in page
    assert "Strongest inputs (top 0 of 0)" in page
    browser.full_page_screenshot(d, tmp_path / "card_error_1600.png")
    # its first output row opens the node the library ranks first
    _click_first_row(d, f"ag_nc_outputs_{_key(graph, err)}".replace(".", "_"))
    first = int(outs["node"].iloc[0])
    _card(d, _key(graph, first))

    # a logit node: its inputs ranked, the first row moves the card to the strongest source
    d.get(url + "/attribution_graph?model=gpt-4")
    browser.wait_for_page(d, n_plots=1, timeout=600)
    logit = len(graph.nodes) - graph.n_logits
    _click_node(d, "logit", logit)
    lkey = _key(graph, logit)
    assert "logit" in _card(d, lkey)
    ins, outs = si.node_edges(graph, logit, n=10)
    assert outs.empty and len(ins) == 10
    assert abs(ins["weight"].iloc[0]) > abs(ins["weight"].iloc[1]) * 1.001
    page = " ".join(browser.texts(d, "[data-testid='stMarkdownContainer']"))
    assert f"Strongest inputs (top 10 of {ins.attrs['count']:,})" in page
    _click_first_row(d, f"ag_nc_inputs_{lkey}".replace(".", "_"))
    _card(d, _key(graph, int(ins["node"].iloc[0])))
    assert browser.problems(d) == []


def test_two_pinned_nodes_are_drawn_on_their_own_with_the_librarys_sum(site, graph, tmp_path):
    import sprout_interp as si

    url, d = site
    logit = len(graph.nodes) - graph.n_logits
    ins, _ = si.node_edges(graph, logit, n=40)
    # a feature among the logit's strongest sources whose total through the rest differs from its direct edge
    feats = [int(i) for i in ins[ins["kind"] == "feature"]["node"]]
    pick, want = None, None
    for f in feats:
        _, e = si.subgraph(graph, [f, logit])
        row = e[(e["source"] == 0) & (e["target"] == 1)]
        if len(row) and abs(row["total"].iloc[0] - row["weight"].iloc[0]) > 0.05 * abs(row["weight"].iloc[0]):
            pick, want = f, row.iloc[0]
            break
    assert pick is not None
    keys = [_key(graph, pick), _key(graph, logit)]
    for width in (1280, 1920):
        d.set_window_size(width, 1000)
        d.get(url + f"/attribution_graph?model=gpt-4&pin={keys[0]}&pin={keys[1]}&node={keys[0]}")
        browser.wait_for_page(d, n_plots=2, timeout=600)
        assert browser.problems(d) == []
        meta = browser.script_result(d, META_JS)
        assert meta and meta["value"] == "total", meta
        drawn = {(s, t): v for s, t, v in meta["edges"]}
        assert drawn[(0, 1)] == pytest.approx(float(want["total"]), rel=1e-9)
        assert abs(drawn[(0, 1)] - float(want["weight"])) > 1e-3  # the sum, not the direct edge
        d.execute_script("""const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(g =>
            ((g.querySelector('.gtitle') || {}).textContent || '').startsWith('subgraph'));
            gd.scrollIntoView({block: 'start'});""")
        time.sleep(1.0)
        d.save_screenshot(str(tmp_path / f"subgraph_{width}.png"))
        browser.full_page_screenshot(d, tmp_path / f"cards_{width}.png")
        d.set_window_size(width, 1000)


#: the drawn boxes (left, right in the viewport) of the attribution graph and of the subgraph figure (and of the box
#: that scrolls it, where there is one), and the subgraph's layout.meta
WIDTHS_JS = """
const gds = Array.from(document.querySelectorAll('.js-plotly-plot'));
const main = gds.find(g => (g._fullLayout.yaxis.ticktext || [])[0] === 'embeddings');
const sub = gds.find(g => ((g.querySelector('.gtitle') || {}).textContent || '').startsWith('subgraph'));
if (!main || !sub) return null;
const lr = e => { const r = e.getBoundingClientRect(); return [r.left, r.right]; };
const box = document.querySelector('.st-key-ag_subgraph_box');
return {main: lr(main.querySelector('.main-svg')), sub: lr(sub.querySelector('.main-svg')), meta: sub.layout.meta,
        box: box ? lr(box) : null};
"""


def test_the_subgraph_fits_the_page_column_at_1280_and_1920(site, graph, tmp_path):
    """The subgraph figure fits the page's column as the attribution graph above it does, at a 1280- and a 1920-px
    window: two pinned nodes, and six (whose places would need more than a 1280-px window's column at their full
    width), drawn as wide as that graph (the column's width) and inside it; twelve, too many to fit, at their own
    width in a box that scrolls sideways, the box inside the column. Nothing on the figure overlapping or cut
    (scripts/browser.py's LAYOUT_JS). Screenshots of the pane land in tmp_path."""
    import sprout_interp as si

    url, d = site
    logit = len(graph.nodes) - graph.n_logits
    ins, _ = si.node_edges(graph, logit, n=60)
    feats = [_key(graph, int(i)) for i in ins[ins["kind"] == "feature"]["node"]]
    assert len(set(feats[:11])) == 11
    cases = (("two", feats[:1], True), ("six", feats[:5], True), ("twelve", feats[:11], False))
    for name, keys, fits in cases:
        pins = "&".join(f"pin={k}" for k in keys + [_key(graph, logit)])
        for width in (1280, 1920):
            d.set_window_size(width, 1000)
            d.get(url + f"/attribution_graph?model=gpt-4&{pins}")
            browser.wait_for_page(d, n_plots=2, timeout=600)
            assert browser.problems(d) == []
            got = browser.script_result(d, WIDTHS_JS)
            assert got, (name, width)
            browser.settle(d)
            got = d.execute_script(WIDTHS_JS)
            (ml, mr), (sl, sr) = got["main"], got["sub"]
            assert got["meta"]["edges"], (name, width)  # the pinned nodes' edges drawn
            if fits:
                assert sr <= mr + 1 and sl >= ml - 1, (name, width, got)  # inside the column
                assert abs((sr - sl) - (mr - ml)) <= 2, (name, width, got)  # as wide as it, like the graph
            else:
                assert not got["meta"]["fits"] and got["box"], (name, width, got)
                bl, br = got["box"]
                assert br <= mr + 1 and bl >= ml - 1 and sr - sl > br - bl, (name, width, got)  # the box scrolls
            _, problems = browser.layout_problems(d)
            problems = [p for p in problems if '"subgraph' in p]
            assert problems == [], (name, width, problems)
            d.execute_script("""const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(g =>
                ((g.querySelector('.gtitle') || {}).textContent || '').startsWith('subgraph'));
                gd.scrollIntoView({block: 'start'});""")
            time.sleep(1.0)
            d.save_screenshot(str(tmp_path / f"subgraph_{name}_{width}.png"))
