"""The attribution graph as a person reads it, measured in Chromium at 1280, 1600, 1920 and 2560 px: the default
prompt (gpt-4's and Sprout's) and a typed 49-token story, each with the whole pruned graph inside the visible plot
(every node, and the source of the strongest edge), labels beside the strongest nodes that overlap no other label
and no marker, every token named under its column with no two token labels overlapping, and nothing else on the
figures overlapping or cut (``scripts/browser.py``'s ``LAYOUT_JS``). Then a hover: the hovered node's incoming and
outgoing edges drawn on top (exactly those, ending on the drawn markers), every other edge and node dimmed, and all
restored when the pointer leaves, without a Streamlit rerun.

One Streamlit server and one Chromium per model (module fixtures stop both, even on failure)."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from sprout_interp.core import loading

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import browser  # noqa: E402  (scripts/browser.py)

sys.path.remove(str(ROOT / "scripts"))

pytestmark = pytest.mark.acceptance

WIDTHS = (1280, 1600, 1920, 2560)
#: a typed story of 49 tokens whose invented name comes back
STORY = ("Zorbin Plax came home late from the harbour, and his wife was waiting at the door with a lamp. The "
         "sailors tied the ropes, and at last Zorbin Plax said hello to the children.")
#: the fewest node labels the graph must draw (the page asks for 16; one may find no room)
MIN_LABELS = 12

#: the graph as drawn: the visible part of its plot area, its markers, its annotations' boxes by name, its edges
GEOMETRY_JS = """
const gd = Array.from(document.querySelectorAll('.js-plotly-plot'))
  .find(g => (g._fullLayout.yaxis.ticktext || [])[0] === 'embeddings');
if (!gd) return null;
const L = gd._fullLayout, r = gd.getBoundingClientRect(), xa = L.xaxis, ya = L.yaxis;
let left = Math.max(r.left + xa._offset, 0), right = Math.min(r.left + xa._offset + xa._length, window.innerWidth);
for (let e = gd.parentElement; e && e !== document.body; e = e.parentElement) {  // a box that clips or scrolls it
  const o = getComputedStyle(e).overflowX;
  if (o !== 'visible') { const b = e.getBoundingClientRect(); left = Math.max(left, b.left); right = Math.min(right, b.right); }
}
const traces = gd.querySelectorAll('.scatterlayer .trace'), nodes = [];
gd._fullData.forEach((t, i) => {
  if (!t.customdata || t.mode !== 'markers') return;
  traces[i].querySelectorAll('path.point').forEach((p, k) => {
    const b = p.getBoundingClientRect();
    nodes.push({node: t.customdata[k][1], box: [b.left, b.top, b.right, b.bottom],
                opacity: parseFloat(getComputedStyle(p).opacity) * parseFloat(getComputedStyle(traces[i]).opacity)});
  });
});
const notes = [];
gd.querySelectorAll('.infolayer .annotation').forEach(a => {
  const spec = L.annotations[+a.dataset.index] || {}, t = a.querySelector('text');
  if (!t) return;
  const b = t.getBoundingClientRect();
  notes.push({name: spec.name, text: t.textContent, box: [b.left, b.top, b.right, b.bottom]});
});
const edgeOpacity = gd._fullData.map((t, i) => [t.name, t.mode === 'lines' && /^edges /.test(t.name || '')
  ? parseFloat(getComputedStyle(traces[i]).opacity) : null]).filter(x => x[1] !== null);
const hl = Array.from(gd.querySelectorAll('.sprout-graph-hl path')).map(p => ({
  source: +p.dataset.source, target: +p.dataset.target, d: p.getAttribute('d'),
  box: (b => [b.left, b.top, b.right, b.bottom])(p.getBoundingClientRect())}));
const svg = gd.querySelector('.main-svg').getBoundingClientRect();
return {visible: [left, right], plot: [svg.left + xa._offset, svg.top + ya._offset], nodes: nodes, notes: notes, edges: (L.meta || {}).edges || [],
        edgeOpacity: edgeOpacity, hl: hl, fits: (L.meta || {}).fits, tokens: L.annotations.filter(a => a.name === 'token').length};
"""


def _overlap(a, b, tol: float = 0.5) -> bool:
    return a[0] < b[2] - tol and b[0] < a[2] - tol and a[1] < b[3] - tol and b[1] < a[3] - tol


def _open(d, url: str, path: str) -> None:
    d.set_window_size(WIDTHS[0], 1000)
    d.get(url + path)
    browser.wait_for_page(d, n_plots=1, timeout=900)
    assert browser.problems(d) == [], path


def _graph_at(d, width: int) -> dict:
    d.set_window_size(width, 1000)
    browser.settle(d)
    g = d.execute_script(GEOMETRY_JS)
    assert g is not None, width
    return g


def check_layout(d, width: int, n_tokens: int) -> dict:
    """At ``width``: every node and the strongest edge's source inside the visible plot, at least MIN_LABELS node
    labels overlapping no label and no marker, every token labelled once with no two token labels overlapping, and
    nothing else on the page's figures overlapping or cut. Returns the geometry."""
    g = _graph_at(d, width)
    lo, hi = g["visible"]
    for n in g["nodes"]:
        cx = (n["box"][0] + n["box"][2]) / 2
        assert lo - 0.5 <= cx <= hi + 0.5, (width, "node off the visible plot", n, (lo, hi))
    assert g["edges"], (width, "the figure lists its drawn edges (layout.meta.edges)")
    strongest = max(g["edges"], key=lambda e: abs(e[2]))
    src = [n for n in g["nodes"] if n["node"] == strongest[0]]
    assert src and lo <= src[0]["box"][0] and src[0]["box"][2] <= hi, (width, strongest, src, (lo, hi))
    assert g["fits"], (width, "the default graph is laid out to fit the page")
    labels = [a for a in g["notes"] if a["name"] == "node label"]
    tokens = [a for a in g["notes"] if a["name"] == "token"]
    assert len(labels) >= MIN_LABELS, (width, [a["text"] for a in labels])
    assert len(tokens) == g["tokens"] == n_tokens, (width, len(tokens), n_tokens)
    assert [int(a["text"].split(":")[0]) for a in tokens] == list(range(n_tokens))
    for group in (labels, tokens, labels + tokens):
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                assert not _overlap(a["box"], b["box"]), (width, a, b)
    for a in labels:
        for n in g["nodes"]:
            assert not _overlap(a["box"], n["box"], 1.0), (width, "a label covers a node", a, n)
    _, problems = browser.layout_problems(d)
    problems = [p for p in problems if p.startswith("figure")]  # the page's other parts: test_layout_browser.py
    assert problems == [], (width, problems)
    return g


def check_hover(d, shot: Path | None = None) -> None:
    """Hover the node with the most drawn edges in and out: exactly its incoming and outgoing edges drawn on top, from marker
    to marker; every edge trace and every unconnected node dimmed; all restored when the pointer leaves. ``shot``:
    a screenshot of the window while the node is hovered."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    d.execute_script("""Array.from(document.querySelectorAll('.js-plotly-plot')).find(g =>
        (g._fullLayout.yaxis.ticktext || [])[0] === 'embeddings').scrollIntoView({block: 'center'});""")
    time.sleep(0.5)
    g = d.execute_script(GEOMETRY_JS)
    ins: dict[int, int] = {}
    outs: dict[int, int] = {}
    for s, t, _ in g["edges"]:
        outs[s] = outs.get(s, 0) + 1
        ins[t] = ins.get(t, 0) + 1
    # a node with edges both ways (a feature or error node between its inputs and what it writes to)
    node = max(set(ins) & set(outs), key=lambda n: (min(ins[n], outs[n]), ins[n] + outs[n], -n))
    want = {(s, t) for s, t, _ in g["edges"] if node in (s, t)}
    assert any(s == node for s, _ in want) and any(t == node for _, t in want)
    box = next(n["box"] for n in g["nodes"] if n["node"] == node)
    actions = ActionBuilder(d)
    actions.pointer_action.move_to_location(int((box[0] + box[2]) / 2), int((box[1] + box[3]) / 2)).pause(0.5)
    actions.perform()
    deadline = time.monotonic() + 10
    while not g["hl"] and time.monotonic() < deadline:
        time.sleep(0.2)
        g = d.execute_script(GEOMETRY_JS)
    got = {(h["source"], h["target"]) for h in g["hl"]}
    assert got == want, (node, sorted(got ^ want))
    if shot is not None:
        d.save_screenshot(str(shot))
    centre = {n["node"]: ((n["box"][0] + n["box"][2]) / 2, (n["box"][1] + n["box"][3]) / 2) for n in g["nodes"]}
    for h in g["hl"]:  # each drawn from its source's marker to its target's
        x0, y0, x1, y1 = (float(v) for v in h["d"].replace("M", "").replace("L", ",").split(","))
        px, py = g["plot"]
        for (x, y), end in (((x0, y0), h["source"]), ((x1, y1), h["target"])):
            assert abs(px + x - centre[end][0]) <= 1.5 and abs(py + y - centre[end][1]) <= 1.5, (h, centre[end])
    assert all(o <= 0.1 for _, o in g["edgeOpacity"]), g["edgeOpacity"]
    near = {node} | {s for s, _ in want} | {t for _, t in want}
    for n in g["nodes"]:
        assert (n["opacity"] > 0.9) == (n["node"] in near), n
    actions = ActionBuilder(d)  # away from the graph: restored
    actions.pointer_action.move_to_location(5, 5).pause(0.5)
    actions.perform()
    time.sleep(0.5)
    g = d.execute_script(GEOMETRY_JS)
    assert not g["hl"] and all(o > 0.1 for _, o in g["edgeOpacity"]) and all(n["opacity"] > 0.9 for n in g["nodes"])


def _site(model: str, tmp_path_factory):
    _, _, why = browser.find_chromium()
    if why:
        pytest.skip(f"no browser to test with: {why}")
    if not (Path(loading.SHIPPED_DIR) / model / "transcoders").is_dir():
        pytest.skip(f"the shipped {model} transcoders are not installed")
    log = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    return browser.serve(model, log=log, timeout=300), browser.chrome(WIDTHS[0], 1000)


@pytest.fixture(scope="module")
def gpt4(tmp_path_factory):
    server, chrome = _site("gpt-4", tmp_path_factory)
    with server as url, chrome as d:
        yield url, d


def _n_tokens(model: str, text: str, end: int | None = None) -> int:
    import sprout_interp as si

    strs = si.load(model).to_str_tokens(text)
    return (end if end is not None else len(strs)) + 1  # <|endoftext|> first


def _end(d) -> int:
    from urllib.parse import parse_qs, urlparse

    return int(parse_qs(urlparse(d.current_url).query)["end"][0])


@pytest.mark.parametrize("typed", [False, True], ids=["default prompt", "typed story"])
def test_the_whole_graph_fits_with_labels_apart_and_hover_follows_edges(gpt4, typed):
    from sprout_interp.core.texts import TEXTS

    url, d = gpt4
    _open(d, url, "/attribution_graph?model=gpt-4" + (f"&text={quote(STORY)}" if typed else ""))
    n = _n_tokens("gpt-4", STORY if typed else TEXTS["story"], _end(d))
    for w in WIDTHS:
        check_layout(d, w, n)
    check_hover(d)


def test_sprouts_default_graph_fits_with_labels_apart(tmp_path_factory):
    """The dashboard's default model: Sprout's story graph (its 2,048 features, 58 positions) at every width."""
    from sprout_interp.core.texts import TEXTS

    server, chrome = _site("sprout", tmp_path_factory)
    with server as url, chrome as d:
        _open(d, url, "/attribution_graph?model=sprout")
        n = _n_tokens("sprout", TEXTS["story"], _end(d))
        for w in WIDTHS:
            check_layout(d, w, n)
        check_hover(d)


#: the read-only view of an uploaded circuit-tracer JSON, once the page has drawn it (its own info line)
UPLOADED = "Showing the uploaded graph in circuit-tracer's JSON"


def test_hover_follows_edges_on_an_uploaded_circuit_tracer_json(gpt4, tmp_path):
    """A graph written by si.save_graph_json and uploaded to the page (the read-only view of circuit-tracer's
    JSON): hovering a node draws exactly its incoming and outgoing edges on top, as on a computed graph
    (check_hover), at 1280 and 1920 px; screenshots of the view (and of the hover) at both widths land in tmp_path."""
    from selenium.webdriver.common.by import By

    import sprout_interp as si

    m = si.load("gpt-4")
    g = si.attribution_graph(m, m.to_tokens(STORY)[0], max_feature_nodes=512)
    path = si.save_graph_json(g, tmp_path, "story-upload")
    url, d = gpt4
    _open(d, url, "/attribution_graph?model=gpt-4")
    d.find_element(By.CSS_SELECTOR, ".st-key-ag_upload input[type='file']").send_keys(str(path))
    deadline = time.monotonic() + 300
    while not any(UPLOADED in t for t in browser.texts(d, "[data-testid='stMain']")):
        assert time.monotonic() < deadline, browser.problems(d)
        time.sleep(0.5)
    browser.wait_for_page(d, n_plots=1, timeout=300)
    assert browser.problems(d) == []
    for w in (1280, 1920):
        g_ = _graph_at(d, w)
        assert len(g_["nodes"]) == len(si.load_graph_json(path).nodes) and g_["edges"], w
        check_hover(d, tmp_path / f"uploaded_json_hover_{w}.png")
        browser.full_page_screenshot(d, tmp_path / f"uploaded_json_{w}.png")
