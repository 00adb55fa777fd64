"""The dashboard's geometry in a real browser, at the window widths people use: every page at 1280, 1600, 1920 and
2560 pixels, measured from the DOM as Chromium drew it (``scripts/browser.py``'s ``LAYOUT_JS``): square patterns
drawn square and filling their axes, frames around the pattern they frame, no two text labels overlapping, none
cut by a figure's or the page's edge, the attention text view wrapping. Then what a person came to see: the logit
lens on the chosen position (and on a typed text, the name's second occurrence), and a contribution graph whose
nodes never overlap and open their own page when clicked.

One Streamlit server and one Chromium serve every test here (a module fixture stops both, even on failure); pages
run on the shipped gpt-4, and on Sprout where its size matters (the every-head grid) or where only it ships the
files (its SAEs). Skipped, with the reason, only where Chromium, its driver, selenium or those checkpoints are
missing.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, quote, urlparse

import pytest

from sprout_interp.core import loading

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import browser  # noqa: E402  (scripts/browser.py)

sys.path.remove(str(ROOT / "scripts"))

pytestmark = pytest.mark.acceptance

WIDTHS = (1280, 1600, 1920, 2560)

#: page -> (URL, figures drawn at first, a button to press or None, figures drawn after it)
PAGES = {
    "anatomy": ("/?model=gpt-4", 1, None, 1),
    "logit_lens": ("/logit_lens?model=gpt-4&trajectories=1", 3, None, 3),
    # a late position of Sprout's story: the grid and the trajectories scroll, their labels and titles stay in view
    "logit_lens (Sprout, a late position)": ("/logit_lens?model=sprout&pos=123&trajectories=1", 3, None, 3),
    "residual": ("/residual?model=gpt-4", 2, None, 2),
    "ablations (Sprout, the circuit not yet confirmed)": ("/ablations?model=sprout", 1, None, 1),
    "attention (gpt-4)": ("/attention?model=gpt-4", 4, None, 4),
    "attention (Sprout)": ("/attention?model=sprout&repeated=1", 5, None, 5),
    "ablations": ("/ablations?model=gpt-4", 1, "run the full sweep", 2),
    "patching": ("/patching?model=gpt-4", 3, None, 3),
    "steering": ("/steering?model=gpt-4", 2, None, 2),
    "features (Sprout)": ("/features?model=sprout&layer=1&feature=2899", 2, None, 2),
    "neurons": ("/neurons?model=gpt-4&held_out=1", 3, None, 3),  # the held-out page opened
    "attribution graph": ("/attribution_graph?model=gpt-4", 1, None, 1),
    "attribution graph (a long prompt)": ("/attribution_graph?model=gpt-4&end=120", 0, "compute the attribution graph", 1),
    "compare": ("/compare?model=gpt-4", 2, None, 2),
    "positions": ("/positions?model=gpt-4&qk=model", 3, None, 3),
}
#: a typed text whose invented name comes back after the first 30 tokens (the grid's first view)
NAME_TEXT = ("Zorbin Plax came home late from the harbour, and his wife was waiting at the door with a lamp. The "
             "sailors tied the ropes, and at last Zorbin Plax said hello to the children.")

#: the frame of the every-head grid (a path drawn in the induction head's red) and the pattern inside it
FRAME_JS = """
const gd = Array.from(document.querySelectorAll('.js-plotly-plot'))
  .find(g => ((g.querySelector('.gtitle') || {}).textContent || '').startsWith('every head'));
if (!gd) return null;
const frame = Array.from(gd.querySelectorAll('.shapelayer path'))
  .find(p => (p.style.stroke || '').replace(/ /g, '') === 'rgb(214,39,40)');
if (!frame) return [];
const f = frame.getBoundingClientRect();
const imgs = Array.from(gd.querySelectorAll('.hm image')).map(i => i.getBoundingClientRect());
const inside = imgs.filter(r => r.left >= f.left - 1 && r.right <= f.right + 1 && r.top >= f.top - 1 && r.bottom <= f.bottom + 1);
return [[f.left, f.top, f.width, f.height], inside.map(r => [r.left, r.top, r.width, r.height])];
"""

#: the attention text view: its box, and the token it shows at first (outlined)
TEXT_VIEW_JS = """
const v = document.querySelector('.sprout-attn .sa-tokens');
if (!v) return null;
const b = v.getBoundingClientRect();
const shown = Array.from(v.querySelectorAll('span')).find(s => s.style.outlineStyle === 'solid');
const r = shown ? shown.getBoundingClientRect() : null;
return [[b.left, b.top, b.right, b.bottom], r && [r.left, r.top, r.right, r.bottom]];
"""

#: a figure found by its title's start: its x axis's range and the box that scrolls it, the chosen column's centre
COLUMN_JS = """
const gd = Array.from(document.querySelectorAll('.js-plotly-plot'))
  .find(g => ((g.querySelector('.gtitle') || {}).textContent || '').includes(arguments[0]));
if (!gd) return null;
const xa = gd._fullLayout.xaxis, r = gd.getBoundingClientRect();
const box = gd.closest('[class*="st-key-"]') || document.documentElement;
const b = box.getBoundingClientRect();
return {range: xa.range, ticks: Array.from(gd.querySelectorAll('.xtick text')).map(t => t.textContent),
        x: r.left + xa._offset + xa.l2p(arguments[1]), box: [Math.max(b.left, 0), Math.min(b.right, window.innerWidth)]};
"""

#: the contribution graph: its row labels, and each node's drawn box with its customdata
GRAPH_JS = """
const gd = Array.from(document.querySelectorAll('.js-plotly-plot'))
  .find(g => ((g.querySelector('.gtitle') || {}).textContent || '').startsWith('what pushes'));
if (!gd) return null;
const i = gd._fullData.findIndex(t => t.name === 'parts');
const trace = gd.querySelectorAll('.scatterlayer .trace')[i];
const pts = Array.from(trace.querySelectorAll('path.point')).map(p => p.getBoundingClientRect());
return {rows: Array.from(gd.querySelectorAll('.ytick text')).map(t => t.textContent),
        nodes: pts.map((r, k) => [r.left, r.top, r.right, r.bottom, gd._fullData[i].customdata[k]])};
"""

#: the attribution graph: its row labels, and every node's drawn box with its customdata (trace name, box, data)
ATTRIBUTION_JS = """
const gd = Array.from(document.querySelectorAll('.js-plotly-plot'))
  .find(g => (g._fullLayout.yaxis.ticktext || [])[0] === 'embeddings');
if (!gd) return null;
const traces = gd.querySelectorAll('.scatterlayer .trace');
const nodes = [];
gd._fullData.forEach((t, i) => {
  if (!t.customdata || t.mode !== 'markers') return;
  Array.from(traces[i].querySelectorAll('path.point')).forEach((p, k) => {
    const r = p.getBoundingClientRect();
    nodes.push([r.left, r.top, r.right, r.bottom, t.customdata[k], t.name]);
  });
});
return {rows: Array.from(gd.querySelectorAll('.ytick text')).map(t => t.textContent), nodes: nodes};
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(base URL, Chromium driver): one server and one browser for every test of this file, both stopped after."""
    _, _, why = browser.find_chromium()
    if why:
        pytest.skip(f"no browser to test with: {why}")
    for name in ("gpt-4", "sprout"):
        if not (Path(loading.SHIPPED_DIR) / name / "model.safetensors").is_file():
            pytest.skip(f"the shipped {name} checkpoint is not installed")
    log = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    with browser.serve("gpt-4", log=log, timeout=300) as url, browser.chrome(WIDTHS[0], 1000) as d:
        yield url, d


def _open(d, url: str, path: str, n: int, button: str | None = None, n_after: int = 0, width: int = WIDTHS[0]) -> None:
    """Load a page at ``width`` and wait until it has drawn ``n`` figures (and, after pressing ``button``,
    ``n_after``)."""
    d.set_window_size(width, 1000)
    d.get(url + path)
    deadline = time.monotonic() + 600
    while not [h for h in browser.texts(d, "h2") if h.strip()] and time.monotonic() < deadline:
        time.sleep(0.3)
    browser.wait_for_page(d, n_plots=n, timeout=600)
    if button:
        from selenium.webdriver.common.by import By

        b = next(b for b in d.find_elements(By.CSS_SELECTOR, '[data-testid="stMain"] button') if button in b.text)
        d.execute_script("arguments[0].scrollIntoView({block: 'center'});", b)
        b.click()
        time.sleep(1.0)
        browser.wait_for_page(d, n_plots=n_after, timeout=600)
    assert browser.problems(d) == [], path


def _query(d) -> dict[str, list[str]]:
    return parse_qs(urlparse(d.current_url).query)


@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_holds_its_shape_at_every_width(site, page):
    """At each width: no squashed or unfilled heat-map, no overlapping or cut label, no line outside its axes; on
    the attention page the red frame hugs the induction head's pattern and the text view wraps with its first
    token in view; on the steering page an empty bar says why."""
    url, d = site
    path, n, button, n_after = PAGES[page]
    _open(d, url, path, n, button, n_after)
    found = []
    for w in WIDTHS:
        d.set_window_size(w, 1000)
        browser.settle(d)
        figures, problems = browser.layout_problems(d)
        assert len(figures) >= max(n, n_after), (page, w, len(figures))
        found += [f"{w} px: {p}" for p in problems]
        if page.startswith("attention"):
            frame = d.execute_script(FRAME_JS)  # both models have an induction head, framed in red
            assert frame, (w, frame)
            (fx, fy, fw, fh), inside = frame  # around exactly one pattern, a few pixels from its edges
            assert len(inside) == 1, (w, frame)
            ix, iy, iw, ih = inside[0]
            assert max(abs(fx - ix), abs(fy - iy), abs(fx + fw - ix - iw), abs(fy + fh - iy - ih)) <= 8, (w, frame)
            assert abs(iw - ih) <= 2, (w, frame)  # the framed pattern is square
            view, shown = d.execute_script(TEXT_VIEW_JS)
            assert shown is not None and view[0] - 1 <= shown[0] and shown[2] <= view[2] + 1, (w, view, shown)
            assert view[1] - 1 <= shown[1] and shown[3] <= view[3] + 1, (w, view, shown)  # the first query in view
        if page == "steering":  # the contrast ends on the same token: block 1 has no vector, and its bar says so
            assert "vector = 0" in browser.texts(d, ".js-plotly-plot .bartext", "textContent"), w
    assert not found, f"{page}: {len(found)} layout problem(s):\n  " + "\n  ".join(found)


#: the pattern drawn large: its labels (one per token), its image, its colour bar and its title's lines
LARGE_JS = """
const gd = Array.from(document.querySelectorAll('.js-plotly-plot'))
  .find(g => ((g.querySelector('.gtitle') || {}).textContent || '').includes('hook_pattern'));
if (!gd) return null;
const img = gd.querySelector('.hm image').getBoundingClientRect();
const bar = gd.querySelector('.colorbar .cbfills') || gd.querySelector('.colorbar');
const b = bar.getBoundingClientRect();
return {labels: Array.from(gd._fullData[0].x), image: [img.width, img.height], bar: [b.width, b.height],
        lines: gd.querySelectorAll('.gtitle tspan.line').length || 1};
"""


def _large_pattern(d, widths=WIDTHS) -> dict:
    """The pattern drawn large at each width: square, at least 300 px, a colour bar as tall and a title of at most
    two lines (at 1280 px it was 230 px wide beside a 500 px bar under three lines). Returns the last one seen."""
    for w in widths:
        d.set_window_size(w, 1000)
        browser.settle(d)
        big = d.execute_script(LARGE_JS)
        assert big is not None, w
        (iw, ih), (_, bh) = big["image"], big["bar"]
        assert iw >= 300 and abs(iw - ih) <= 2, (w, big["image"])
        assert abs(bh - ih) <= 0.1 * ih, (w, "colour bar", bh, "pattern", ih)
        assert big["lines"] <= 2, (w, big["lines"])
    return big


def test_the_attention_page_opens_centred_on_the_repeated_name(site):
    """Sprout's story repeats "Zorbin Plax" at positions 53-58 and a typed 49-token story at 36-41: the default
    window holds the whole second occurrence (and reaches back to the first), centred on where the name is copied
    (the token before the second word), which the text view outlines in view; the pattern drawn large reads at
    every width."""
    import sprout_interp as si
    from sprout_interp.core.texts import TEXTS
    from sprout_interp.features.search import repeated_names

    url, d = site
    m = si.load("sprout")
    for text, path in ((TEXTS["story"], "/attention?model=sprout"),
                       (NAME_TEXT, f"/attention?model=sprout&text={quote(NAME_TEXT)}")):
        again = repeated_names(m.to_str_tokens(text))
        second = again[again["occurrence"] == 2]
        span = list(range(int(second["pos"].min()), int(second["pos"].max()) + 1))
        plax = int(second[(second["name"] == "Plax") & (second["piece"] == 0)]["pos"].iloc[0])
        _open(d, url, path, 4)
        q = _query(d)
        assert int(q["pos"][0]) == plax - 1, q  # the copy: where the model predicts " Pl" again
        big = _large_pattern(d)
        shown = [int(x.split(":")[0]) for x in big["labels"]]
        assert set(span) | {int(again["pos"].min())} <= set(shown), (span, shown[0], shown[-1])  # both occurrences
        centre = (shown[0] + shown[-1]) / 2
        assert abs(centre - (plax - 1)) <= 1 or shown[0] == 0 and shown[-1] == len(m.to_str_tokens(text)) - 1, shown
        view, outlined = d.execute_script(TEXT_VIEW_JS)
        assert outlined is not None and view[1] - 1 <= outlined[1] and outlined[3] <= view[3] + 1, (view, outlined)
        token = d.execute_script("return Array.from(document.querySelectorAll('.sprout-attn .sa-tokens span'))"
                                 ".find(s => s.style.outlineStyle === 'solid').dataset.pos;")
        assert int(token) == plax - 1


def test_the_features_descriptions_are_shown_whole(site):
    """On a typed text the Features page lists its strongest features with a description each: every description
    is read whole in a cell that wraps, inside the page (a data grid's column cut them off at 1600 px)."""
    url, d = site
    _open(d, url, f"/features?model=sprout&layer=1&text={quote(NAME_TEXT)}", 0)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not d.execute_script(DESCRIPTIONS_JS)["cells"]:
        time.sleep(0.5)
    for w in WIDTHS:
        d.set_window_size(w, 1000)
        browser.settle(d)
        got = d.execute_script(DESCRIPTIONS_JS)
        assert len(got["cells"]) >= 5, (w, got)
        for text, left, right, scroll, client in got["cells"]:
            assert text.startswith(("fires", "dead", "never")), text
            assert scroll <= client + 1 and got["box"][0] - 1 <= left and right <= got["box"][1] + 1, (w, text)


#: the strongest features' descriptions, as table cells: (text, left, right, scrollWidth, clientWidth), and the
#: main column's box
DESCRIPTIONS_JS = """
const main = document.querySelector('[data-testid="stMainBlockContainer"]').getBoundingClientRect();
const cells = [];
for (const t of document.querySelectorAll('[data-testid="stTable"] table')) {
  const heads = Array.from(t.querySelectorAll('thead th')).map(h => h.textContent.trim());
  const i = heads.indexOf('description');
  if (i < 0) continue;
  for (const row of t.querySelectorAll('tbody tr')) {
    const c = row.children[i], r = c.getBoundingClientRect();
    cells.push([c.textContent.trim(), r.left, r.right, c.scrollWidth, c.clientWidth]);
  }
}
return {cells: cells, box: [main.left, main.right]};
"""


def _column_in_view(d, title: str, column: int) -> dict:
    info = d.execute_script(COLUMN_JS, title, column)
    assert info is not None, title
    lo, hi = info["range"]
    assert lo < column < hi, info  # drawn
    assert info["box"][0] <= info["x"] <= info["box"][1], info  # and scrolled into view
    return info


def test_the_logit_lens_opens_on_a_linked_position_and_on_the_repeated_name(site):
    """A link's ``pos`` past the grid's first 30 tokens moves the grid to it, drawn and scrolled into view; a typed
    text whose name comes back after the first 30 tokens opens where the name is copied (the token before its
    second word, not the first name's first token, where nothing can be predicted yet), the copied token in view
    too, its label showing the token's leading space."""
    url, d = site
    _open(d, url, "/logit_lens?model=gpt-4&text=dialogue&pos=75", 2)
    start = int(_query(d).get("start", ["0"])[0])
    for w in (WIDTHS[0], WIDTHS[-1]):
        d.set_window_size(w, 1000)
        browser.settle(d)
        _column_in_view(d, "top-1 guess after each block", 75 - start)
    assert start <= 75 < start + 30

    import sprout_interp as si
    from sprout_interp.features.search import repeated_names

    again = repeated_names(si.load("gpt-4").to_str_tokens(NAME_TEXT))
    plax = int(again[(again["occurrence"] == 2) & (again["name"] == "Plax") & (again["piece"] == 0)]["pos"].iloc[0])
    second = plax - 1  # where the name is copied: the model predicts " Pl" of the second "Zorbin Plax" there
    assert second >= 30  # beyond the first 30 tokens
    _open(d, url, f"/logit_lens?model=gpt-4&text={quote(NAME_TEXT)}", 2)
    assert int(browser.texts(d, '[data-testid="stNumberInputField"]', "value")[0]) == second
    start = int(_query(d)["start"][0])
    for w in (WIDTHS[0], WIDTHS[-1]):
        d.set_window_size(w, 1000)
        browser.settle(d)
        info = _column_in_view(d, "top-1 guess after each block", second - start)
        _column_in_view(d, "top-1 guess after each block", second + 1 - start)  # the copied " Pl"
    assert any(t.startswith("␣") for t in info["ticks"])  # " Pl" is drawn "␣Pl", not "Pl"


def test_the_contribution_graph_draws_every_block_and_a_click_opens_the_head(site):
    """Every block's heads and feed-forward have a row, no two nodes overlap at any width, and a click on a head's
    node opens that head on the attention page, on the patching page's text."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    url, d = site
    _open(d, url, "/patching?model=gpt-4", 3)
    for w in WIDTHS:
        d.set_window_size(w, 1000)
        browser.settle(d)
        g = d.execute_script(GRAPH_JS)
        assert {f"block {b} head {h}" for b in range(1, 5) for h in range(3)} <= set(g["rows"])
        assert {f"block {b} feed-forward" for b in range(1, 5)} | {"embedding", "output"} <= set(g["rows"])
        boxes = g["nodes"]
        assert len(boxes) >= 3
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert a[2] <= b[0] + 0.5 or b[2] <= a[0] + 0.5 or a[3] <= b[1] + 0.5 or b[3] <= a[1] + 0.5, (w, a, b)
    head = next(b for b in boxes if b[4][0] == 1)  # a head's node: customdata [kind, layer, head]
    layer, h = int(head[4][1]), int(head[4][2])
    d.execute_script("window.scrollTo(0, 0);")
    d.execute_script("""const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(g => ((g.querySelector(
        '.gtitle') || {}).textContent || '').startsWith('what pushes')); gd.scrollIntoView({block: 'center'});""")
    time.sleep(0.5)
    x, y = next(((b[0] + b[2]) / 2, (b[1] + b[3]) / 2) for b in d.execute_script(GRAPH_JS)["nodes"]
                if b[4][0] == 1 and int(b[4][1]) == layer and int(b[4][2]) == h)
    actions = ActionBuilder(d)
    actions.pointer_action.move_to_location(int(x), int(y)).pause(0.3).click()
    actions.perform()
    deadline = time.monotonic() + 120
    while "/attention" not in d.current_url and time.monotonic() < deadline:
        time.sleep(0.3)
    browser.wait_for_page(d, n_plots=3, timeout=600)
    q = _query(d)
    assert urlparse(d.current_url).path.endswith("/attention"), d.current_url
    assert q["layer"] == [str(layer)] and q["head"] == [str(h)], q
    assert q["text"][0].startswith("When the boat came in"), q  # the patching page's own text
    assert f"block {layer + 1} (layer {layer}), head {h}" in " ".join(browser.texts(d, "h3"))


def test_the_attribution_graph_keeps_its_nodes_apart_and_a_click_opens_a_features_card(site):
    """Every row from the embeddings to the logits is named, no two nodes overlap at any width (supernodes and
    pinned nodes from the link included), and a click on a feature node opens that feature's card."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    url, d = site
    _open(d, url, "/attribution_graph?model=gpt-4", 1)
    g = d.execute_script(ATTRIBUTION_JS)
    keys = d.execute_script("""const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(g =>
        (g._fullLayout.yaxis.ticktext || [])[0] === 'embeddings'); return gd._fullData.filter(t => t.hovertext)
        .flatMap(t => Array.from(t.hovertext)).map(h => h.split('key ').pop());""")
    feats = sorted(k for k in keys if k.startswith("f"))[:3]
    assert len(feats) == 3 and g["rows"][:2] == ["embeddings", "block 1"] and "logits" in g["rows"]
    link = f"/attribution_graph?model=gpt-4&pin={feats[2]}&super=two%20features:{feats[0]},{feats[1]}"
    _open(d, url, link, 1)
    for w in WIDTHS:
        d.set_window_size(w, 1000)
        browser.settle(d)
        g = d.execute_script(ATTRIBUTION_JS)
        assert {"embeddings", "block 1", "block 4", "logits"} <= set(g["rows"])
        boxes = g["nodes"]
        assert any(b[5] == "two features" for b in boxes), w  # the supernode, drawn
        assert len(boxes) >= 60
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert a[2] <= b[0] + 0.5 or b[2] <= a[0] + 0.5 or a[3] <= b[1] + 0.5 or b[3] <= a[1] + 0.5, (w, a, b)
    # a click on a feature node in view opens its card
    d.execute_script("""const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(g =>
        (g._fullLayout.yaxis.ticktext || [])[0] === 'embeddings'); gd.scrollIntoView({block: 'center'});""")
    time.sleep(0.5)
    width = d.execute_script("return window.innerWidth;")
    node = next(b for b in d.execute_script(ATTRIBUTION_JS)["nodes"]
                if b[4][0] == 0 and b[5] == "feature" and 300 < (b[0] + b[2]) / 2 < width - 60)
    actions = ActionBuilder(d)
    actions.pointer_action.move_to_location(int((node[0] + node[2]) / 2), int((node[1] + node[3]) / 2)).pause(0.3).click()
    actions.perform()
    deadline = time.monotonic() + 300
    while not _query(d).get("card") and time.monotonic() < deadline:
        time.sleep(0.5)
    card = _query(d)["card"][0]
    layer, _, feature = card[1:].split(".")
    while time.monotonic() < deadline and not any(f"Feature {feature}, block" in h for h in browser.texts(d, "h3")):
        time.sleep(0.5)
    assert any(f"Feature {feature}, block {int(layer) + 1} (layer {layer}) transcoder" in h for h in browser.texts(d, "h3"))
    assert browser.problems(d) == []


def test_the_attribution_graph_reopens_a_saved_graph_file_and_refuses_another_file(site, tmp_path):
    """A graph saved with graph.save (the page's download) and uploaded is shown as it was saved (its node count and
    its scores); a file that is no graph gets an error naming what it is, and the page keeps working."""
    from selenium.webdriver.common.by import By

    import sprout_interp as si

    url, d = site
    m = si.load("gpt-4")
    g = si.attribution_graph(m, "When Mary and John went to the store, Mary", max_feature_nodes=300)
    path = g.save(tmp_path / "mary.safetensors")
    rep, comp = si.graph_scores(g)
    bad = tmp_path / "not_a_graph.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + b"\x00" * 64)
    _open(d, url, "/attribution_graph?model=gpt-4", 1)
    d.find_element(By.XPATH, "//*[contains(text(), 'open a saved graph file')]").click()
    time.sleep(0.5)
    for f, want in ((path, f"{len(g.nodes):,}"), (bad, None)):
        d.find_element(By.CSS_SELECTOR, 'input[type=file][accept*=".safetensors"]').send_keys(str(f))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            said = " ".join(browser.texts(d, '[data-testid="stAlert"]') + browser.texts(d, '[data-testid="stMetricValue"]'))
            if ("uploaded graph" in said if want else "not an attribution graph file" in said):
                break
            time.sleep(0.5)
        if want:
            browser.wait_for_page(d, n_plots=1, timeout=300)
            values = browser.texts(d, '[data-testid="stMetricValue"]')
            assert values[0] == want and f"{rep:.3f}" in values and f"{comp:.3f}" in values, values
            assert "(from file)" in values
            assert browser.problems(d) == []
        else:
            assert any("not an attribution graph file" in p for p in browser.problems(d)), browser.problems(d)
        d.execute_script("const b = document.querySelector('[data-testid=\"stFileChipDeleteBtn\"]');"
                         "(b.querySelector('button') || b).click();")
        time.sleep(1.0)
