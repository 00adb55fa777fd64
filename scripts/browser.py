"""Run the dashboard on a free localhost port and drive it with headless Chromium (selenium 4).

Shared by ``tests/dashboards/test_browser.py`` and ``scripts/screenshots.py``. Uses Debian's ``chromium`` and
``chromium-driver`` (``apt-get install -y chromium chromium-driver``; ``.ci/run`` installs them when
missing); the driver path is passed explicitly, so selenium never tries to download one.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboards" / "app.py"
CHROME_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
#: CSS of the boxes that mean something went wrong on a page.
EXCEPTION_CSS = '[data-testid="stException"]'
ERROR_CSS = '[data-testid="stAlertContentError"]'
PLOT_CSS = '[data-testid="stPlotlyChart"] .main-svg'


def find_chromium() -> tuple[Optional[str], Optional[str], str]:
    """(chromium, chromedriver, why not) -- the paths, or None and a reason a person can act on."""
    chrome = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium", shutil.which("chromium-browser"),
                               shutil.which("google-chrome")) if p and os.path.exists(p)), None)
    driver = next((p for p in (shutil.which("chromedriver"), "/usr/bin/chromedriver") if p and os.path.exists(p)), None)
    if chrome is None:
        return None, driver, "Chromium is not installed (apt-get install -y chromium chromium-driver)"
    if driver is None:
        return chrome, None, "chromedriver is not installed (apt-get install -y chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return chrome, driver, "selenium is not installed (pip install -e '.[test]')"
    return chrome, driver, ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(model: Optional[str] = None, port: Optional[int] = None, timeout: float = 90.0,
          log: Optional[Path] = None) -> Iterator[str]:
    """Start ``streamlit run dashboards/app.py`` on a free localhost port; yields its base URL; stops it after.

    ``model`` is passed as ``-- --model NAME`` (default: the app's own choice, the best shipped checkpoint).
    """
    port = port or free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port),
           "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    if model:
        cmd += ["--", "--model", model]
    out = open(log, "w") if log else subprocess.DEVNULL
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with code {proc.returncode}" + (f"; see {log}" if log else ""))
            try:
                with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"streamlit did not answer on {url} within {timeout:.0f} s")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            out.close()


@contextlib.contextmanager
def chrome(width: int = 1600, height: int = 1200) -> Iterator:
    """A headless Chromium WebDriver with a fresh profile; quit and cleaned up afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    path, driver_path, why = find_chromium()
    if why:
        raise RuntimeError(why)
    profile = tempfile.mkdtemp(prefix="sprout-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = path
    for f in CHROME_FLAGS + [f"--user-data-dir={profile}", f"--window-size={width},{height}"]:
        opts.add_argument(f)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for_page(driver, n_plots: int = 1, timeout: float = 180.0) -> None:
    """Wait until the page has drawn ``n_plots`` plotly figures and Streamlit has finished running the script
    (or an exception box appeared)."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if driver.find_elements(By.CSS_SELECTOR, EXCEPTION_CSS):
            return
        running = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]')
        spinners = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stSpinner"]')
        plots = driver.find_elements(By.CSS_SELECTOR, PLOT_CSS)
        if len(plots) >= n_plots and not running and not spinners:
            time.sleep(1.0)  # let plotly finish laying out
            return
        time.sleep(0.5)
    raise TimeoutError(f"the page did not draw {n_plots} figure(s) within {timeout:.0f} s")


def script_result(driver, js: str, *args, timeout: float = 60.0):
    """What the JavaScript ``js`` (run with ``args``) returns once it returns something other than null, polled
    every 0.3 s for up to ``timeout`` seconds (None if it never does): for a figure or table the page draws late."""
    deadline = time.monotonic() + timeout
    got = driver.execute_script(js, *args)
    while got is None and time.monotonic() < deadline:
        time.sleep(0.3)
        got = driver.execute_script(js, *args)
    return got


def texts(driver, css: str, attribute: str = "innerText") -> list[str]:
    """``attribute`` of every element matching ``css``, read in one script call: Streamlit re-renders
    elements at any moment, and reading them one by one from Python can hit a stale element."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => e[arguments[1]]);", css, attribute)


def problems(driver) -> list[str]:
    """Texts of the exception and error boxes on the page (empty when all is well)."""
    return [t for css in (EXCEPTION_CSS, ERROR_CSS) for t in texts(driver, css)]


def full_page_screenshot(driver, path: Path, max_height: int = 9000) -> Path:
    """Resize the window to the page's height (up to ``max_height``), scroll to the top, and save a PNG."""
    height = driver.execute_script(
        "const m = document.querySelector('[data-testid=\"stMain\"]') || document.body;"
        "return Math.max(m.scrollHeight, document.body.scrollHeight);")
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, min(int(height) + 80, max_height))
    time.sleep(1.0)
    driver.execute_script("window.scrollTo(0, 0); const m = document.querySelector('[data-testid=\"stMain\"]');"
                          "if (m) m.scrollTo(0, 0);")
    time.sleep(0.3)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    return path


#: Every plotly figure on the page, measured as drawn (JS; returns ``{figures: [...], problems: [...]}``): the figure
#: inside the page (or inside a box that scrolls sideways, where its row labels, titles and axis titles stay inside
#: the part of the box a reader sees); each heat-map image filling its axes, a square pattern (same labels across and
#: down) drawn square; scatter lines inside their axes; every text label (ticks, titles, annotations, cell text)
#: inside the figure and no two overlapping (their drawn boxes, rotation included; a text hidden under the band
#: behind pinned row labels does not count); an annotation centred in a rectangle shape inside it. Then the page:
#: every table's columns inside their box, every button's whole label, and the attention text view wrapping
#: inside its box. At most three problems of a kind per figure, then a count.
LAYOUT_JS = r"""
// Every plotly figure on the page, measured as drawn: returns {figures: [...], problems: [...]}.
const TOL = 1.5;
const out = {figures: [], problems: []};
const vw = document.documentElement.clientWidth;
const span = (a, b) => `${a.toFixed(0)}–${b.toFixed(0)}`;
const where = (r) => `${span(r.left, r.right)} × ${span(r.top, r.bottom)}`;
const size = (r) => `${(r.right - r.left).toFixed(0)}×${(r.bottom - r.top).toFixed(0)}`;
function visible(el) {
  for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
    const s = getComputedStyle(e);
    if (s.display === 'none' || s.visibility === 'hidden' || parseFloat(s.opacity) === 0) return false;
  }
  return true;
}
function quad(el) {  // the text's box as drawn (rotation included): four corners in viewport pixels
  const b = el.getBBox(), m = el.getScreenCTM();
  if (!m || b.width === 0 || b.height === 0) return null;
  return [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height], [b.x, b.y + b.height]]
    .map(([x, y]) => [m.a * x + m.c * y + m.e, m.b * x + m.d * y + m.f]);
}
function bounds(q) {
  const xs = q.map(p => p[0]), ys = q.map(p => p[1]);
  return {left: Math.min(...xs), right: Math.max(...xs), top: Math.min(...ys), bottom: Math.max(...ys)};
}
function overlap(a, b) {  // separating-axis test of two convex quads, each shrunk by TOL px
  for (const q of [a, b]) for (let i = 0; i < 4; i++) {
    const p = q[i], r = q[(i + 1) % 4], nx = r[1] - p[1], ny = p[0] - r[0], len = Math.hypot(nx, ny) || 1;
    const pa = a.map(v => (v[0] * nx + v[1] * ny) / len), pb = b.map(v => (v[0] * nx + v[1] * ny) / len);
    if (Math.max(...pa) - TOL <= Math.min(...pb) + TOL || Math.max(...pb) - TOL <= Math.min(...pa) + TOL) return false;
  }
  return true;
}
function scroller(el) {  // the nearest ancestor that scrolls sideways (one whose content overflows it first), or
  let first = null;       // the one that clips, or null
  for (let e = el.parentElement; e && e !== document.body; e = e.parentElement) {
    const o = getComputedStyle(e).overflowX;
    if (o === 'auto' || o === 'scroll') {
      if (e.scrollWidth > e.clientWidth + 1) return {scrolls: true, el: e};
      first = first || {scrolls: true, el: e};
    } else if (o === 'hidden' || o === 'clip') return first || {scrolls: false, el: e};
  }
  return first;
}
const gds = Array.from(document.querySelectorAll('.js-plotly-plot')).filter(g => g._fullLayout && visible(g));
gds.forEach((gd, k) => {
  const L = gd._fullLayout, svg = gd.querySelector('.main-svg'), box = svg.getBoundingClientRect();
  const title = ((gd.querySelector('.gtitle') || {}).textContent || '').trim();
  const name = `figure ${k + 1} "${title.slice(0, 60) || '(untitled)'}"`;
  const fig = {title: title, width: box.width, height: box.height, heatmaps: [], texts: 0};
  const said = {};
  const bad = (what, kind = 'other') => {  // at most 3 problems of a kind per figure, then a count
    said[kind] = (said[kind] || 0) + 1;
    if (said[kind] <= 3) out.problems.push(`${name}: ${what}`);
  };
  // the figure itself: inside the page, or inside a box that scrolls sideways
  const sc = scroller(gd);
  if (sc && !sc.scrolls) {
    const r = sc.el.getBoundingClientRect();
    if (box.left < r.left - TOL || box.right > r.right + TOL)
      bad(`cut by its container: figure ${span(box.left, box.right)} px, container ${span(r.left, r.right)} px`);
  } else if (!sc && (box.left < -TOL || box.right > vw + TOL)) {
    bad(`runs off the page: ${box.left.toFixed(0)}–${box.right.toFixed(0)} px of a ${vw} px page`);
  }
  // heat-maps: each image fills its axes; a pattern (square z, the same labels across and down) is drawn square
  for (const [id, plot] of Object.entries(L._plots || {})) {
    const xa = plot.xaxis, ya = plot.yaxis;
    if (!xa || !ya || !plot.plot) continue;
    const traces = gd._fullData.filter(t => t.type === 'heatmap' && t.visible === true && t.xaxis === xa._id && t.yaxis === ya._id);
    const imgs = Array.from(plot.plot.node().querySelectorAll('.hm image')).filter(visible);
    if (!traces.length || !imgs.length) continue;
    const ax = {left: box.left + xa._offset, right: box.left + xa._offset + xa._length,
                top: box.top + ya._offset, bottom: box.top + ya._offset + ya._length};
    traces.forEach((t, i) => {
      const img = imgs[i]; if (!img) return;
      const r = img.getBoundingClientRect();
      const nz = t.z.length, nx = nz ? t.z[0].length : 0;
      const pattern = nz === nx && nz > 1 && Array.isArray(t.x) && Array.isArray(t.y) && t.x.length === t.y.length
        && t.x.every((v, j) => String(v) === String(t.y[j]));
      const h = {subplot: id, name: t.name || '', z: [nz, nx], pattern: pattern,
                 image: [r.left, r.top, r.width, r.height], axes: [ax.left, ax.top, ax.right - ax.left, ax.bottom - ax.top]};
      fig.heatmaps.push(h);
      const label = `heat-map ${t.name ? '"' + t.name + '" ' : ''}(${id})`;
      const fillW = r.width / Math.max(ax.right - ax.left, 1), fillH = r.height / Math.max(ax.bottom - ax.top, 1);
      if (r.left > ax.left + 2 || r.right < ax.right - 2 || r.top > ax.top + 2 || r.bottom < ax.bottom - 2)
        bad(`${label} fills ${(100 * Math.min(fillW, 1)).toFixed(0)}% × ${(100 * Math.min(fillH, 1)).toFixed(0)}% of its axes `
            + `(image ${r.width.toFixed(0)}×${r.height.toFixed(0)} px in ${size(ax)} px)`, 'fill');
      if (pattern && Math.abs(r.width - r.height) > Math.max(2, 0.02 * Math.max(r.width, r.height)))
        bad(`${label}: a ${nz}×${nx} pattern drawn ${r.width.toFixed(0)}×${r.height.toFixed(0)} px, not square`, 'square');
    });
  }
  // the title: above every plot area, not over one
  const head = gd.querySelector('.gtitle');
  if (head && head.textContent.trim()) {
    const t = head.getBoundingClientRect();
    for (const [id, plot] of Object.entries(L._plots || {})) {
      const xa = plot.xaxis, ya = plot.yaxis;
      if (!xa || !ya) continue;
      const ax = {left: box.left + xa._offset, right: box.left + xa._offset + xa._length,
                  top: box.top + ya._offset, bottom: box.top + ya._offset + ya._length};
      if (t.left < ax.right - TOL && t.right > ax.left + TOL && t.top < ax.bottom - TOL && t.bottom > ax.top + TOL)
        bad(`the title (${where(t)} px) runs over the plot area ${id} (${where(ax)} px)`, 'title');
    }
  }
  // lines of scatter traces: inside their axes (a line that leaves them is cut off where a reader cannot see it)
  for (const [id, plot] of Object.entries(L._plots || {})) {
    const xa = plot.xaxis, ya = plot.yaxis;
    if (!xa || !ya || !plot.plot) continue;
    const ax = {left: box.left + xa._offset, right: box.left + xa._offset + xa._length,
                top: box.top + ya._offset, bottom: box.top + ya._offset + ya._length};
    for (const ln of plot.plot.node().querySelectorAll('.scatterlayer .js-line')) {
      if (!visible(ln)) continue;
      const r = ln.getBoundingClientRect();
      if (r.width + r.height === 0) continue;
      if (r.left < ax.left - 3 || r.right > ax.right + 3 || r.top < ax.top - 3 || r.bottom > ax.bottom + 3)
        bad(`a line runs outside its axes (${id}): ${where(r)} px, axes ${where(ax)}`, 'line');
    }
  }
  // text: every label inside the figure, and no two labels overlapping
  const texts = Array.from(svg.parentElement.querySelectorAll('svg.main-svg text'))
    .filter(t => !t.closest('.hoverlayer') && t.textContent.trim() && visible(t))
    .map(t => ({el: t, q: quad(t), s: t.textContent.trim()})).filter(t => t.q);
  fig.texts = texts.length;
  for (const t of texts) {
    const b = bounds(t.q);
    if (b.left < box.left - TOL || b.right > box.right + TOL || b.top < box.top - TOL || b.bottom > box.bottom + TOL)
      bad(`text "${t.s.slice(0, 50)}" cut by the figure's edge (${where(b)} px; figure ${where(box)})`, 'cut');
    else if (!sc && (b.left < -TOL || b.right > vw + TOL)) bad(`text "${t.s.slice(0, 50)}" off the page`, 'cut');
  }
  // a figure in a box that scrolls sideways: what names its cells (the row labels in its margins, its titles, its
  // axes' titles, subplot titles) stays inside the part of the box a reader sees
  if (sc && sc.scrolls) {
    const r = sc.el.getBoundingClientRect(), seen = {left: Math.max(r.left, 0), right: Math.min(r.right, vw)};
    const xs = Object.keys(L).filter(k => /^xaxis\d*$/.test(k)).map(k => L[k]).filter(a => a && a._length);
    const plotL = box.left + Math.min(...xs.map(a => a._offset)), plotR = box.left + Math.max(...xs.map(a => a._offset + a._length));
    const notes = L.annotations || [];
    for (const t of texts) {
      const b = bounds(t.q), tick = t.el.closest("g[class$='tick']"), info = t.el.closest('.infolayer > g');
      const cls = info ? (info.getAttribute('class') || '').split(' ')[0] : '';  // plotly's class, not the pin's
      const heading = info && (cls === 'g-gtitle' || /^g-[xy]\d*title$/.test(cls)
        || (cls === 'annotation' && (notes[+info.dataset.index] || {}).xref === 'paper'));
      const margin = tick && /^y\d*tick$/.test(tick.getAttribute('class'))
        && (t.el.closest('.sprout-pinned') || b.right <= plotL + 2 || b.left >= plotR - 2);
      if (!heading && !margin) continue;
      if (b.left < seen.left - TOL || b.right > seen.right + TOL)
        bad(`${heading ? 'title' : 'row label'} "${t.s.slice(0, 50)}" out of view in its scrolling box (${span(b.left, b.right)} px; `
            + `the box shows ${span(seen.left, seen.right)})`, 'scroll');
    }
  }
  // a text under the band behind pinned row labels is hidden by it: not an overlap with those labels
  const bands = Array.from(gd.querySelectorAll('.sprout-pin-band')).map(e => e.getBoundingClientRect());
  const covered = (b) => bands.some(r => b.left < r.right && b.right > r.left && b.top < r.bottom && b.bottom > r.top);
  let pairs = 0;
  for (let i = 0; i < texts.length; i++) {
    const bi = bounds(texts[i].q);
    for (let j = i + 1; j < texts.length; j++) {
      const bj = bounds(texts[j].q);
      if (bi.right < bj.left || bj.right < bi.left || bi.bottom < bj.top || bj.bottom < bi.top) continue;
      const pi = texts[i].el.closest('.sprout-pinned'), pj = texts[j].el.closest('.sprout-pinned');
      if ((pi && !pj && covered(bj)) || (pj && !pi && covered(bi))) continue;
      if (overlap(texts[i].q, texts[j].q)) {
        pairs++;
        bad(`texts "${texts[i].s.slice(0, 40)}" and "${texts[j].s.slice(0, 40)}" overlap`, 'overlap');
      }
    }
  }
  for (const [kind, n] of Object.entries(said)) if (n > 3) out.problems.push(`${name}: ... and ${n - 3} more (${kind})`);
  out.figures.push(fig);
});
// labels drawn in a box of the figure (an annotation centred in a rectangle shape, the anatomy diagram's parts):
// inside the smallest such box that holds its centre
for (const gd of gds) {
  const L = gd._fullLayout, shapes = L.shapes || [];
  const rects = Array.from(gd.querySelectorAll('.shapelayer path')).filter(e => visible(e)
    && (shapes[+e.dataset.index] || {}).type === 'rect').map(e => e.getBoundingClientRect());
  const title = ((gd.querySelector('.gtitle') || {}).textContent || '').trim().slice(0, 40) || '(untitled)';
  for (const a of gd.querySelectorAll('.infolayer .annotation text')) {
    const q = quad(a);
    if (!q || !visible(a) || !a.textContent.trim()) continue;
    const b = bounds(q), cx = (b.left + b.right) / 2, cy = (b.top + b.bottom) / 2;
    const holds = rects.filter(r => r.left <= cx && cx <= r.right && r.top <= cy && cy <= r.bottom)
      .sort((u, v) => u.width * u.height - v.width * v.height);
    const r = holds[0];
    if (r && (b.left < r.left - TOL || b.right > r.right + TOL || b.top < r.top - TOL || b.bottom > r.bottom + TOL))
      out.problems.push(`figure "${title}": label "${a.textContent.trim().slice(0, 50)}" spills out of its box `
                        + `(${where(b)} px; box ${where(r)})`);
  }
}
// tables: their columns inside their box (a column pushed past the edge is cut off, whatever scrolls it back);
// buttons: their whole label (Streamlit cuts a long one to "…")
for (const df of document.querySelectorAll('[data-testid="stDataFrame"]')) {
  const sc = df.querySelector('.dvn-scroller');
  if (sc && visible(df) && sc.scrollWidth > sc.clientWidth + 1) {
    const head = Array.from(df.querySelectorAll('[role="columnheader"]')).map(h => h.textContent.trim()).filter(Boolean);
    out.problems.push(`a table's columns are cut: ${sc.scrollWidth} px of columns in a ${sc.clientWidth} px box`
                      + (head.length ? ` (columns ${head.slice(0, 8).join(', ')})` : ''));
  }
}
for (const t of document.querySelectorAll('[data-testid="stTable"]')) {
  if (visible(t) && t.scrollWidth > t.clientWidth + 1)
    out.problems.push(`a table is wider than its box: ${t.scrollWidth} px in ${t.clientWidth} px`);
}
for (const b of document.querySelectorAll('[data-testid="stMain"] button')) {
  if (!visible(b) || !b.textContent.trim()) continue;
  const cut = Array.from(b.querySelectorAll('*')).some(e => e.children.length === 0 && e.scrollWidth > e.clientWidth + 1)
    || Array.from(b.querySelectorAll('div, p, span')).some(e => e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).textOverflow === 'ellipsis');
  if (cut) out.problems.push(`the button "${b.textContent.trim().slice(0, 60)}" shows its label cut`);
}
// the attention text view: its tokens wrap inside their box
for (const v of document.querySelectorAll('.sprout-attn .sa-tokens')) {
  if (v.scrollWidth > v.clientWidth + 1)
    out.problems.push(`the attention text view does not wrap: ${v.scrollWidth} px of tokens in a ${v.clientWidth} px box`);
}
return out;
"""


def layout_problems(driver) -> tuple[list[dict], list[str]]:
    """(each figure's measurements, every problem found) by :data:`LAYOUT_JS` on the page as drawn now."""
    out = driver.execute_script(LAYOUT_JS)
    return out["figures"], out["problems"]


def settle(driver, timeout: float = 20.0) -> None:
    """Wait until every figure on the page keeps its drawn size for a second (after a resize Streamlit lays them
    out again)."""
    js = ("return Array.from(document.querySelectorAll('.js-plotly-plot .main-svg:first-child'))"
          ".map(s => { const r = s.getBoundingClientRect(); return [r.width, r.height, r.left]; });")
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        now = driver.execute_script(js)
        if now == last:
            return
        last = now
        time.sleep(1.0)
