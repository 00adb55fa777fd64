"""The dashboard in a real browser: `streamlit run` on a free localhost port, driven by headless Chromium.

Skipped (with the reason) only where Chromium, its driver or selenium cannot be found; `.ci/run`
installs Debian's `chromium` and `chromium-driver` when they are missing.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from sprout_interp.core import loading

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import browser  # noqa: E402  (scripts/browser.py)

sys.path.remove(str(ROOT / "scripts"))

pytestmark = pytest.mark.acceptance

GRID_CSS = '[data-testid="stPlotlyChart"] .js-plotly-plot'


@pytest.fixture(scope="module")
def chromium():
    _, _, why = browser.find_chromium()
    if why:
        pytest.skip(f"no browser to test with: {why}")
    if not (Path(loading.SHIPPED_DIR) / "gpt-4" / "model.safetensors").is_file():
        pytest.skip("the shipped gpt-4 checkpoint is not installed")


def _inputs(d) -> list[str]:

    return browser.texts(d, '[data-testid="stNumberInputField"]', "value")


def test_logit_lens_page_in_chromium(chromium, tmp_path):
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.common.by import By

    with browser.serve("gpt-4", log=tmp_path / "streamlit.log") as url, browser.chrome() as d:
        d.get(url + "/logit_lens?start=0")  # the window from the first token (by default it opens on the copy)
        browser.wait_for_page(d, n_plots=2)
        assert browser.problems(d) == []
        # the grid rendered: a heat-map drawn by plotly, with its title and the layer rows
        title = browser.texts(d, f"{GRID_CSS} .gtitle", "textContent")[0]
        assert "top-1 guess after each block" in title
        assert d.find_elements(By.CSS_SELECTOR, f"{GRID_CSS} .heatmaplayer image, {GRID_CSS} .hm image")
        rows = browser.texts(d, f"{GRID_CSS} .yaxislayer-above .ytick text", "textContent")
        assert {"embedding", "block 1", "block 4"} <= set(rows) and "block 5" not in rows

        # clicking a cell selects it (the path AppTest cannot reach): position 3, row "block 2". The grid is
        # wider than the page (it scrolls sideways), so the click goes to the cell's point in the viewport
        # (an offset from the element would start at its visible part's centre, not its own)
        x, y = d.execute_script(f"""
            const gd = document.querySelector('{GRID_CSS}'), L = gd._fullLayout;
            gd.scrollIntoView({{block: 'center', inline: 'start'}});
            const r = gd.getBoundingClientRect();
            return [r.left + L.xaxis._offset + L.xaxis.l2p(3), r.top + L.yaxis._offset + L.yaxis.l2p(2)];""")
        actions = ActionBuilder(d)
        actions.pointer_action.move_to_location(int(x), int(y)).pause(0.3).click()
        actions.perform()
        deadline = time.monotonic() + 30
        while _inputs(d)[:1] != ["3"] and time.monotonic() < deadline:
            time.sleep(0.3)
        browser.wait_for_page(d, n_plots=2)
        assert _inputs(d)[:1] == ["3"]
        assert "block 2, position 3" in [h.strip() for h in browser.texts(d, "h3")]
        assert browser.problems(d) == []
        browser.full_page_screenshot(d, tmp_path / "logit_lens.png")
        assert (tmp_path / "logit_lens.png").stat().st_size > 20_000

        # the navigation works: another page from the sidebar
        d.find_element(By.CSS_SELECTOR, '[data-testid="stSidebarNav"] a[href$="/residual"]').click()
        deadline = time.monotonic() + 60
        while not any("Residual stream" in h for h in browser.texts(d, "h2")) and time.monotonic() < deadline:
            time.sleep(0.3)
        browser.wait_for_page(d, n_plots=1)
        assert any("Residual stream" in h for h in browser.texts(d, "h2"))
        assert browser.problems(d) == []


def test_patching_page_in_chromium(chromium, tmp_path):
    """The patching page draws its three figures in a real browser, with the block x position heatmap's labels."""
    with browser.serve("gpt-4", log=tmp_path / "streamlit.log") as url, browser.chrome() as d:
        d.get(url + "/patching")
        browser.wait_for_page(d, n_plots=3, timeout=300)
        assert browser.problems(d) == []
        titles = browser.texts(d, ".js-plotly-plot .gtitle", "textContent")
        assert any("block x position" in t for t in titles) and any("each head's output patched" in t for t in titles)
        rows = browser.texts(d, ".js-plotly-plot .yaxislayer-above .ytick text", "textContent")
        assert {"block 1", "block 4"} <= set(rows)
        browser.full_page_screenshot(d, tmp_path / "patching.png")
        assert (tmp_path / "patching.png").stat().st_size > 20_000


#: figures each page draws at first (pages added later are waited for by their title and finished run)
FIRST_FIGURES = {"": 1, "logit_lens": 2, "residual": 2, "attention": 3, "ablations": 1, "patching": 3, "compare": 2,
                 "positions": 1}

#: the bounding boxes of a figure's y tick labels that overlap a plotted panel (JS; argument: the title's start)
OVERLAPS_JS = """
const gd = Array.from(document.querySelectorAll('.js-plotly-plot'))
  .find(g => ((g.querySelector('.gtitle') || {}).textContent || '').startsWith(arguments[0]));
if (!gd) return null;
const labels = Array.from(gd.querySelectorAll('.yaxislayer-above .ytick text'))
  .map(t => t.getBoundingClientRect()).filter(r => r.width > 0);
const panels = Array.from(gd.querySelectorAll('.heatmaplayer image, .hm image')).map(r => r.getBoundingClientRect());
let hits = 0;
for (const t of labels) for (const p of panels)
  if (t.left < p.right - 1 && t.right > p.left + 1 && t.top < p.bottom - 1 && t.bottom > p.top + 1) hits++;
return [labels.length, panels.length, hits];
"""


def _wait_for_header(d, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not [h for h in browser.texts(d, "h2") if h.strip()] and time.monotonic() < deadline:
        time.sleep(0.3)


def _query(d) -> dict[str, list[str]]:
    from urllib.parse import parse_qs, urlparse

    return parse_qs(urlparse(d.current_url).query)


def test_every_page_in_chromium(chromium, tmp_path):
    """Every page in the sidebar's navigation draws without an error box, and keeps model and text in its URL."""
    with browser.serve("gpt-4", log=tmp_path / "streamlit.log") as url, browser.chrome(1500, 1000) as d:
        d.get(url)
        _wait_for_header(d)
        paths = d.execute_script("return Array.from(document.querySelectorAll('[data-testid=\"stSidebarNav\"] a'))"
                                 ".map(a => new URL(a.href).pathname.replace(/^\\//, ''));")
        assert set(FIRST_FIGURES) <= set(paths), paths
        for path in paths:
            d.set_window_size(1500, 1000)
            d.get(f"{url}/{path}?model=gpt-4&text=dialogue")
            _wait_for_header(d)
            browser.wait_for_page(d, n_plots=FIRST_FIGURES.get(path, 0), timeout=600)
            assert browser.problems(d) == [], path
            q = _query(d)
            assert q.get("model") == ["gpt-4"] and q.get("text") == ["dialogue"], (path, q)
            png = browser.full_page_screenshot(d, tmp_path / f"{path or 'anatomy'}.png")
            assert png.stat().st_size > 20_000


def test_attention_page_in_chromium(chromium, tmp_path):
    """All heads drawn, the head-score labels clear of the neighbouring panels, the hover view live, the
    state in the URL surviving a reload, and a click on a head's small pattern choosing that head."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.common.by import By

    with browser.serve("gpt-4", log=tmp_path / "streamlit.log") as url, browser.chrome(1500, 1100) as d:
        # 24 tokens centred on position 12: tokens 0-23 (the text view shows every token up to the window's end)
        d.get(url + "/attention?model=gpt-4&text=dialogue&layer=0&head=2&n=24&pos=12")
        browser.wait_for_page(d, n_plots=3, timeout=600)
        assert browser.problems(d) == []
        drawn = d.execute_script("""
            const gd = Array.from(document.querySelectorAll('.js-plotly-plot'))
              .find(g => ((g.querySelector('.gtitle') || {}).textContent || '').startsWith('every head'));
            return gd ? [gd.data.filter(t => t.type === 'heatmap').length, gd.querySelectorAll('.heatmaplayer image, .hm image').length,
                         Array.from(gd.querySelectorAll('.annotation-text')).map(a => a.textContent)] : null;""")
        assert drawn is not None and drawn[0] == drawn[1] == 4 * 3, drawn  # every head of every block, drawn
        assert {f"block {l + 1} head {h}" for l in range(4) for h in range(3)} <= set(drawn[2])

        labels, panels, hits = d.execute_script(OVERLAPS_JS, "head scores")
        assert labels >= 4 and panels == 6 and hits == 0  # no block label over a neighbouring panel

        # the hover view: hovering a token shades what it attends to
        spans = d.find_elements(By.CSS_SELECTOR, ".sprout-attn .sa-tokens span")
        assert len(spans) == 24
        d.execute_script("arguments[0].scrollIntoView({block: 'center'});", spans[10])
        ActionChains(d).move_to_element(spans[10]).pause(0.3).perform()
        info = browser.texts(d, ".sprout-attn .sa-info")[0]
        assert info.startswith("position 10 ") and "attends to:" in info
        assert spans[10].value_of_css_property("outline-style") == "solid"

        # the choices survive a reload of the URL
        d.refresh()
        browser.wait_for_page(d, n_plots=3, timeout=600)
        q = _query(d)
        assert q["layer"] == ["0"] and q["head"] == ["2"] and q["n"] == ["24"] and q["text"] == ["dialogue"]
        assert "block 1 (layer 0), head 2" in " ".join(browser.texts(d, "h3"))

        # a click on a head's small pattern chooses it: block 3 head 1. Its whole panel answers (the pointer over
        # each corner hovers that head's marker), and a click off the centre chooses it
        at_js = """
            const gd = Array.from(document.querySelectorAll('.js-plotly-plot'))
              .find(g => ((g.querySelector('.gtitle') || {}).textContent || '').startsWith('every head'));
            const L = gd._fullLayout, i = 2 * 3 + 1 + 1, xa = L['xaxis' + i], ya = L['yaxis' + i];
            const r = gd.getBoundingClientRect();
            return [r.left + xa._offset + arguments[0] * xa._length, r.top + ya._offset + arguments[1] * ya._length];"""
        hovered_js = "const h = document.querySelector('.js-plotly-plot') && Array.from(document.querySelectorAll(" \
                     "'.js-plotly-plot')).map(g => g._hoverdata).find(h => h && h.length); " \
                     "return h && h[0].customdata ? h[0].customdata : null;"
        d.execute_script("Array.from(document.querySelectorAll('.js-plotly-plot')).find(g => ((g.querySelector("
                         "'.gtitle') || {}).textContent || '').startsWith('every head')).scrollIntoView({block: 'center'});")
        for fx, fy in ((0.02, 0.02), (0.98, 0.02), (0.02, 0.98), (0.98, 0.98)):
            x, y = d.execute_script(at_js, fx, fy)
            actions = ActionBuilder(d)
            actions.pointer_action.move_to_location(int(x), int(y)).pause(0.3)
            actions.perform()
            assert d.execute_script(hovered_js) == [2, 1], (fx, fy)
        x, y = d.execute_script(at_js, 0.2, 0.85)
        actions = ActionBuilder(d)
        actions.pointer_action.move_to_location(int(x), int(y)).pause(0.3).click()
        actions.perform()
        deadline = time.monotonic() + 120
        while "block 3 (layer 2), head 1" not in " ".join(browser.texts(d, "h3")) and time.monotonic() < deadline:
            time.sleep(0.3)
        browser.wait_for_page(d, n_plots=3, timeout=600)
        assert "block 3 (layer 2), head 1" in " ".join(browser.texts(d, "h3"))
        assert (_selectbox_shows(d, "block"), _selectbox_shows(d, "head")) == ("block 3 (layer 2)", "1")
        q = _query(d)
        assert q["layer"] == ["2"] and q["head"] == ["1"]
        assert browser.problems(d) == []
        browser.full_page_screenshot(d, tmp_path / "attention.png")
        assert (tmp_path / "attention.png").stat().st_size > 20_000


def test_logit_lens_state_survives_a_reload(chromium, tmp_path):
    with browser.serve("gpt-4", log=tmp_path / "streamlit.log") as url, browser.chrome() as d:
        d.get(url + "/logit_lens?model=gpt-1&text=description&pos=4&row=0&tokens=60")
        browser.wait_for_page(d, n_plots=2, timeout=600)
        assert browser.problems(d) == []
        assert _inputs(d)[:1] == ["4"] and "embedding, position 4" in [h.strip() for h in browser.texts(d, "h3")]
        box = d.execute_script("const b = document.querySelector('.st-key-lens_grid_box'); "
                               "return [b.scrollWidth, b.clientWidth];")
        assert box[0] > box[1]  # 60 tokens at a readable size: the grid scrolls sideways
        d.refresh()
        browser.wait_for_page(d, n_plots=2, timeout=600)
        q = _query(d)
        assert q["model"] == ["gpt-1"] and q["pos"] == ["4"] and q["row"] == ["0"]
        assert _inputs(d)[:1] == ["4"]
        rows = d.execute_script(f"return Array.from(document.querySelector('{GRID_CSS}')"
                                ".querySelectorAll('.yaxislayer-above .ytick text')).map(t => t.textContent);")
        assert set(rows) == {"embedding", "block 1"}  # gpt-1 from the link, not the server's default model


def _selectbox_shows(d, label: str) -> str:
    """The value a selectbox shows on screen (what a person reads, not what the server holds)."""
    return d.execute_script("""
        for (const box of document.querySelectorAll('[data-testid="stSelectbox"]')) {
          const lab = box.querySelector('label');
          if (lab && lab.innerText.trim() === arguments[0]) {
            const input = box.querySelector('input');
            return input ? input.value : box.innerText.replace(lab.innerText, '').trim();
          }
        }
        return null;""", label)


def test_logit_lens_picker_and_detail_agree_after_typing_a_text(chromium, tmp_path):
    """Pick a cell, then type another text: the row picker on screen and the detail panel name the same cell."""
    from urllib.parse import quote

    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    first = "Zorbin Plax came home late from the harbour, and his wife was waiting."
    with browser.serve("gpt-4", log=tmp_path / "streamlit.log") as url, browser.chrome() as d:
        d.get(f"{url}/logit_lens?model=gpt-4&text={quote(first)}&pos=5&row=1")
        browser.wait_for_page(d, n_plots=2, timeout=600)
        assert _selectbox_shows(d, "row") == "block 1" and "block 1, position 5" in browser.texts(d, "h3")[0]
        box = d.find_element(By.CSS_SELECTOR, '[data-testid="stSidebar"] textarea')
        box.send_keys(Keys.END, " Then the boat left again, and the pier was empty.")
        box.send_keys(Keys.CONTROL, Keys.ENTER)
        deadline = time.monotonic() + 120
        while "position 5" in browser.texts(d, "h3")[0] and time.monotonic() < deadline:
            time.sleep(0.3)
        browser.wait_for_page(d, n_plots=2, timeout=600)
        shown = _selectbox_shows(d, "row")
        detail = browser.texts(d, "h3")[0].strip()
        assert shown == "block 4" and detail == f"{shown}, position {_inputs(d)[0]}"
        assert browser.problems(d) == []


def test_figures_download_opens_offline(chromium, tmp_path):
    """The page's figures file draws every figure from its own inline plotly.js, with the network cut off."""
    import plotly.graph_objects as go

    from sprout_interp.plots.common import figures_html

    page = tmp_path / "figures.html"
    page.write_text(figures_html([("a", go.Figure(go.Scatter(x=[0, 1], y=[1, 2]))),
                                  ("b", go.Figure(go.Heatmap(z=[[1, 2], [3, 4]])))], "offline"), encoding="utf-8")
    with browser.chrome() as d:
        d.set_network_conditions(offline=True, latency=0, throughput=0)
        d.get(page.as_uri())
        deadline = time.monotonic() + 30
        while len(d.find_elements("css selector", ".js-plotly-plot .main-svg")) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert d.execute_script("return typeof Plotly") == "object"
        assert len(d.find_elements("css selector", ".js-plotly-plot")) == 2
