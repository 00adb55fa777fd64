"""Save a PNG of every dashboard page, taken by headless Chromium, for the README and the docs.

    .venv/bin/python scripts/screenshots.py                 # the app's default model (the best installed)
    .venv/bin/python scripts/screenshots.py --model gpt-4 --out docs/screenshots --widths 1920 1280

Starts `streamlit run dashboards/app.py` on a free localhost port, opens each page, waits for its
figures, presses the page's "run" button where it has one (the full ablation sweep, the copying
sweep) and saves `<out>/<page>.png` at the first of `--widths` (browser window widths in pixels) and
`<out>/<width>/<page>.png` at each other one. It prints what `browser.LAYOUT_JS` finds wrong on each page at each
width (overlapping or cut labels, squashed patterns; tests/dashboards/test_layout_browser.py fails on the same). Needs Debian's
chromium + chromium-driver and selenium (see scripts/browser.py).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import browser  # noqa: E402

# page -> (URL path, figures drawn at first, text of a button to press (or None), figures after pressing)
PAGES = {
    "anatomy": ("/", 1, None, 1),
    "logit_lens": ("/logit_lens?trajectories=1", 3, None, 3),  # the trajectories' section opened
    "residual": ("/residual", 2, None, 2),
    "attention": ("/attention?repeated=1", 4, "measure each head's part in copying", 5),  # the test opened
    "ablations": ("/ablations", 1, "run the full sweep", 2),
    "patching": ("/patching", 3, None, 3),
    "compare": ("/compare", 2, None, 2),
    "positions": ("/positions?qk=model", 3, None, 3),  # a real head beside the random demo
    "features": ("/features?layer=1&feature=2899", 2, None, 2),  # the name feature's page (README, "Features")
    # a typed story that repeats "Zorbin Plax": the features that fire on it, each with its description whole
    "features_on_text": ("/features?layer=1&text=Zorbin+Plax+came+home+late+from+the+harbour%2C+and+his+wife+was+"
                         "waiting+at+the+door+with+a+lamp.+The+sailors+tied+the+ropes%2C+and+at+last+Zorbin+Plax+said"
                         "+hello+to+the+children.", 0, None, 0),
    "steering": ("/steering", 2, "sample the continuations", 2),  # the she/he contrast, continuations sampled
    # the notebook-07 question: the neurons voting against the second " Mars" of "Quillon Marsk" (README, "Neurons")
    # (its text is sprout_model.evaluation.NAME_TEXTS's "Quillon Marsk", URL-encoded)
    # the second "Zorbin Plax" of the story on Sprout: the first " Pl" pinned, two block-4 features at the last
    # position grouped, and the stronger one's card open (README, "Attribution graph")
    "attribution_graph": ("/attribution_graph?kind=per_layer&pin=t5&super=end%20readers:f3.57.912,f3.57.304&card=f3.57.912", 2, None, 2),
    "neurons": (('/neurons?text=The+letter+on+the+table+was+signed+by+Quillon+Marsk%2C+and+nobody+in+the+house+knew+th'
                 'e+name.+The+maid+said+she+had+never+seen+the+man.+At+supper+the+father+read+the+letter+aloud%2C+and+'
                 'when+he+had+finished+he+asked+again+who+Quillon+Marsk&pos=54&answer=+Mars&wrong=+had&held_out=1'),
                3, None, 3),
}


def press(driver, label: str) -> None:
    from selenium.webdriver.common.by import By

    for b in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMain"] button'):
        if label in b.text:
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", b)
            b.click()
            return
    raise RuntimeError(f"no button {label!r} on the page")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="shipped name or checkpoint path (default: the app's default)")
    ap.add_argument("--out", type=Path, default=browser.ROOT / "docs" / "screenshots")
    ap.add_argument("--pages", nargs="*", default=list(PAGES), choices=list(PAGES))
    ap.add_argument("--widths", type=int, nargs="+", default=[1920, 1280],
                    help="browser window widths (pixels); the first one's screenshots go straight into --out")
    args = ap.parse_args(argv)

    _, _, why = browser.find_chromium()
    if why:
        print(f"cannot take screenshots: {why}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    saved = []
    with browser.serve(args.model, log=args.out / "streamlit.log") as url, browser.chrome(args.widths[0], 1000) as d:
        for page in args.pages:
            path, n0, button, n1 = PAGES[page]
            for i, width in enumerate(args.widths):
                t = time.monotonic()
                d.set_window_size(width, 1000)
                d.get(url + path)
                browser.wait_for_page(d, n_plots=n0, timeout=600)
                if button:
                    press(d, button)
                    time.sleep(1.0)
                    browser.wait_for_page(d, n_plots=n1, timeout=600)
                browser.settle(d)
                bad = browser.problems(d) + browser.layout_problems(d)[1]
                png = browser.full_page_screenshot(d, (args.out if i == 0 else args.out / str(width)) / f"{page}.png")
                saved.append(png)
                print(f"{page:11s} {width:5d} px {time.monotonic() - t:6.1f} s  {png}"
                      + "".join(f"\n    PROBLEM: {b}" for b in bad))
    (args.out / "streamlit.log").unlink(missing_ok=True)
    print(f"saved {len(saved)} screenshots in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
