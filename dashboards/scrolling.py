"""Figures wider than the page: drawn at their own width in a box that scrolls sideways, scrolled to what was chosen,
with their labels pinned in view.

A grid of tokens (the logit lens, the trajectories, the contribution and attribution graphs) needs a fixed width per
token for its labels and cell text to stay readable and apart; squeezed into the page they would overlap. So it keeps
its width, the box around it scrolls, and the box opens with the chosen position's column in its middle. What names
the cells stays in view while they scroll, as a spreadsheet freezes its first column: the row labels at the figure's
left (and right) edge move with the scroll over a band of the figure's background, and the titles (the figure's, its
axes', its subplots') keep their place in the visible part of the box.
"""
from __future__ import annotations

import show
import streamlit as st

#: CSS class of the band behind pinned row labels, and of every pinned group (``scripts/browser.py`` reads them).
BAND_CLASS = "sprout-pin-band"
PINNED_CLASS = "sprout-pinned"

# waits for the box's figure to be drawn, then scrolls the box as little as brings x value __X__ into view with room
# around it, and pins the figure's row labels and titles in view (again after every scroll, resize and redraw)
_SCROLL_JS = """<script>
(function () {
  const BAND = "__BAND__", PINNED = "__PINNED__";
  const find = () => {
    const box = document.querySelector(".st-key-__BOX__"), gd = box && box.querySelector(".js-plotly-plot");
    return [box, gd];
  };
  function shift(el, dx) {  // translate a group sideways by dx px, on top of the transform plotly gave it
    if (el.dataset.pinBase === undefined) el.dataset.pinBase = el.getAttribute("transform") || "";
    el.setAttribute("transform", (el.dataset.pinBase + " translate(" + dx + ",0)").trim());
    el.classList.add(PINNED);
  }
  function pin() {
    const [box, gd] = find(), L = gd && gd._fullLayout;
    if (!L || !L.width) return;
    const W = L.width, C = box.clientWidth;
    const s = box.scrollLeft - (gd.getBoundingClientRect().left - box.getBoundingClientRect().left + box.scrollLeft);
    const xs = Object.keys(L).filter(k => /^xaxis\\d*$/.test(k)).map(k => L[k]).filter(a => a && a._length);
    if (!xs.length) return;
    const plotL = Math.min(...xs.map(a => a._offset)), plotR = Math.max(...xs.map(a => a._offset + a._length));
    const left = s, right = Math.min(0, s + C - W);  // how far pinned left / right labels move
    // row labels: the tick layers of the y axes drawn in the left or right margin
    const layers = new Set();
    gd.querySelectorAll("g[class$='tick']").forEach(t => { if (/^y\\d*tick$/.test(t.getAttribute("class"))) layers.add(t.parentElement); });
    layers.forEach(g => {
      if (g.dataset.pinBase !== undefined) g.setAttribute("transform", g.dataset.pinBase);
      const b = g.getBBox();
      const side = b.x + b.width <= plotL + 2 ? "left" : b.x >= plotR - 2 ? "right" : null;
      if (!side) return;
      let band = g.previousElementSibling;
      if (!band || !band.classList.contains(BAND)) {  // the figure's background behind the labels, over the cells
        band = document.createElementNS("http://www.w3.org/2000/svg", "rect");
        band.setAttribute("class", BAND);
        band.style.pointerEvents = "none";
        g.parentElement.insertBefore(band, g);
      }
      band.setAttribute("x", side === "left" ? 0 : plotR);
      band.setAttribute("width", side === "left" ? plotL : W - plotR);
      const ya = L["yaxis" + (g.querySelector("g[class$='tick']").getAttribute("class").slice(1, -4))] || {};
      const top = Math.min(b.y, ya._offset === undefined ? b.y : ya._offset);  // the rows of this axis only
      const bottom = Math.max(b.y + b.height, ya._offset === undefined ? 0 : ya._offset + ya._length);
      band.setAttribute("y", top);
      band.setAttribute("height", bottom - top);
      band.setAttribute("fill", L.paper_bgcolor || "white");
      shift(band, side === "left" ? left : right);
      shift(g, side === "left" ? left : right);
    });
    // titles: the figure's, its axes', and annotations placed on the paper (subplot titles), kept in the visible part
    const notes = (L.annotations || []);
    gd.querySelectorAll(".infolayer > g").forEach(g => {
      const cls = (g.getAttribute("class") || "").split(" ")[0];  // plotly's own class (ours is added after it)
      const isNote = cls === "annotation" && (notes[+g.dataset.index] || {}).xref === "paper";
      if (!(cls === "g-gtitle" || /^g-[xy]\\d*title$/.test(cls) || isNote)) return;
      if (g.dataset.pinBase !== undefined) g.setAttribute("transform", g.dataset.pinBase);
      const b = g.getBBox();
      const dx = b.x < C / 2 ? left : W - (b.x + b.width) < C / 2 ? right : s + C / 2 - (b.x + b.width / 2);
      shift(g, dx);
    });
  }
  // again a moment later too: plotly and Streamlit may still be drawing when a size change is reported
  const soon = () => { requestAnimationFrame(pin); setTimeout(pin, 250); setTimeout(pin, 1000); };
  let tries = 0;
  const timer = setInterval(function () {
    const [box, gd] = find();
    const xa = gd && gd._fullLayout && gd._fullLayout.xaxis;
    if (xa && xa._length) {
      clearInterval(timer);
      const x = gd.getBoundingClientRect().left - box.getBoundingClientRect().left + box.scrollLeft + xa._offset + xa.l2p(__X__);
      const room = Math.min(120, box.clientWidth / 4) + (xa._offset || 0);  // clear of the pinned row labels
      if (x < box.scrollLeft + room || x > box.scrollLeft + box.clientWidth - room)
        box.scrollLeft = Math.max(0, x < box.scrollLeft + room ? x - room : x - box.clientWidth + room);
      if (!box.dataset.pinning) {
        box.dataset.pinning = "1";
        box.addEventListener("scroll", () => requestAnimationFrame(pin), {passive: true});
        window.addEventListener("resize", soon);
        // the box's own width changes after the window's (Streamlit lays the page out again), and the browser then
        // clamps its scroll without a scroll event: pin again whenever the box or the figure changes size
        if (window.ResizeObserver) {
          const watch = new ResizeObserver(soon);
          watch.observe(box);
          watch.observe(gd);
        }
      }
      if (!gd.dataset.pinning && gd.on) {
        gd.dataset.pinning = "1";
        gd.on("plotly_afterplot", soon);
      }
      pin();
    } else if (++tries > 150) clearInterval(timer);
  }, 100);
})();
</script>"""


def chart(fig, name: str, box: str, column: float, **kw):
    """``show.chart`` of ``fig`` at its own ``layout.width`` inside a box (Streamlit key ``box``) that scrolls
    sideways when the figure is wider than the page, opened with the figure's x value ``column`` in view; the row
    labels in the figure's margins and its titles stay in view as the box scrolls.
    Returns what ``show.chart`` returns (the selection, with ``on_select``)."""
    px = int(fig.layout.width)
    st.html(f"<style>.st-key-{box} {{ overflow-x: auto; }} .st-key-{box} [data-testid='stElementContainer'], "
            f".st-key-{box} [data-testid='stPlotlyChart'] {{ min-width: {px}px; }}</style>")
    with st.container(key=box):
        out = show.chart(fig, name, width=px, **kw)
    js = _SCROLL_JS.replace("__BOX__", box).replace("__X__", f"{float(column):g}")
    st.html(js.replace("__BAND__", BAND_CLASS).replace("__PINNED__", PINNED_CLASS), unsafe_allow_javascript=True)
    return out
