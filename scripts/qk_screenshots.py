"""Screenshots of the QK-attribution panel (dashboards/qk_view.py) on the Attention and the Attribution graph pages,
taken by headless Chromium at two window widths, for docs/qk_attribution.md.

    .venv/bin/python scripts/qk_screenshots.py                  # sprout, 1280 and 1920 px
    .venv/bin/python scripts/qk_screenshots.py --model gpt-4 --widths 1280

Opens each page with the panel open (``qk=1``; the Attention page on its default cell, the story's first repeat:
query 54 'or' of the second "Zorbin", key 2 'b' after the first), waits for the panel's lists and saves
``<out>/qk_<page>_<width>.png`` (the panel alone). Prints what ``browser.LAYOUT_JS`` and the error boxes report.
Needs Debian's chromium + chromium-driver and selenium (see scripts/browser.py).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import browser  # noqa: E402

PAGES = {"attention": ("/attention?qk=1", 2), "graph": ("/attribution_graph?qk=1", 1)}


def panel(driver, timeout: float = 600.0):
    """The opened QK panel's expander, once its top pairs are drawn."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stExpander"]'):
            if "QK attribution of one cell" in e.text and "Top pairs" in e.text:
                return e
        time.sleep(1.0)
    raise TimeoutError("the QK panel did not draw its lists")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="sprout", help="shipped name or checkpoint path")
    ap.add_argument("--out", type=Path, default=browser.ROOT / "docs" / "screenshots")
    ap.add_argument("--widths", type=int, nargs="+", default=[1280, 1920], help="browser window widths (pixels)")
    args = ap.parse_args(argv)
    _, _, why = browser.find_chromium()
    if why:
        print(f"cannot take screenshots: {why}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with browser.serve(args.model, log=args.out / "streamlit.log") as url, browser.chrome(args.widths[0], 1000) as d:
        for name, (path, n_plots) in PAGES.items():
            for width in args.widths:
                t = time.monotonic()
                d.set_window_size(width, 2600)
                d.get(url + path)
                browser.wait_for_page(d, n_plots=n_plots, timeout=900)
                box = panel(d)
                # the panel's top below Streamlit's header bar (which would cover its title in the picture)
                d.execute_script("arguments[0].scrollIntoView({block: 'start'});"
                                 "const m = document.querySelector('[data-testid=\"stMain\"]');"
                                 "if (m) m.scrollBy(0, -80); window.scrollBy(0, -80);", box)
                browser.settle(d)
                bad = browser.problems(d) + browser.layout_problems(d)[1]
                png = args.out / f"qk_{name}_{width}.png"
                panel(d).screenshot(str(png))
                print(f"{name:9s} {width:5d} px {time.monotonic() - t:6.1f} s  {png}"
                      + "".join(f"\n    PROBLEM: {b}" for b in bad))
    (args.out / "streamlit.log").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
