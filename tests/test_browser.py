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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import browser  # noqa: E402  (scripts/browser.py)

sys.path.remove(str(ROOT / "scripts"))

pytestmark = [pytest.mark.integration, pytest.mark.slow]

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
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    with browser.serve("gpt-4", log=tmp_path / "streamlit.log") as url, browser.chrome() as d:
        d.get(url + "/logit_lens")
        browser.wait_for_page(d, n_plots=2)
        assert browser.problems(d) == []
        # the grid rendered: a heat-map drawn by plotly, with its title and the layer rows
        title = browser.texts(d, f"{GRID_CSS} .gtitle", "textContent")[0]
        assert "top-1 guess after each block" in title
        assert d.find_elements(By.CSS_SELECTOR, f"{GRID_CSS} .heatmaplayer image, {GRID_CSS} .hm image")
        rows = browser.texts(d, f"{GRID_CSS} .yaxislayer-above .ytick text", "textContent")
        assert {"embedding", "block 1", "block 4"} <= set(rows) and "block 5" not in rows

        # clicking a cell selects it (the path AppTest cannot reach): position 3, row "block 2"
        dx, dy = d.execute_script(f"""
            const gd = document.querySelector('{GRID_CSS}'), L = gd._fullLayout, r = gd.getBoundingClientRect();
            return [L.xaxis._offset + L.xaxis.l2p(3) - r.width / 2, L.yaxis._offset + L.yaxis.l2p(2) - r.height / 2];""")
        grid = d.find_element(By.CSS_SELECTOR, GRID_CSS)
        ActionChains(d).move_to_element_with_offset(grid, int(dx), int(dy)).pause(0.3).click().perform()
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
