"""Figures wider than the page: drawn at their own width in a box that scrolls sideways, scrolled to what was chosen.

A grid of tokens (the logit lens, the trajectories, the contribution graph) needs a fixed width per token for its
labels and cell text to stay readable and apart; squeezed into the page they would overlap. So it keeps its width,
the box around it scrolls, and the box opens with the chosen position's column in its middle.
"""
from __future__ import annotations

import show
import streamlit as st

# waits for the box's figure to be drawn, then scrolls the box as little as brings x value __X__ into view with room
# around it (so the row labels at the figure's left stay in view whenever they can)
_SCROLL_JS = """<script>
(function () {
  let tries = 0;
  const timer = setInterval(function () {
    const box = document.querySelector(".st-key-__BOX__"), gd = box && box.querySelector(".js-plotly-plot");
    const xa = gd && gd._fullLayout && gd._fullLayout.xaxis;
    if (xa && xa._length) {
      clearInterval(timer);
      const x = gd.getBoundingClientRect().left - box.getBoundingClientRect().left + box.scrollLeft + xa._offset + xa.l2p(__X__);
      const room = Math.min(120, box.clientWidth / 4);
      if (x < box.scrollLeft + room || x > box.scrollLeft + box.clientWidth - room)
        box.scrollLeft = Math.max(0, x < box.scrollLeft + room ? x - room : x - box.clientWidth + room);
    } else if (++tries > 150) clearInterval(timer);
  }, 100);
})();
</script>"""


def chart(fig, name: str, box: str, column: float, **kw):
    """``show.chart`` of ``fig`` at its own ``layout.width`` inside a box (Streamlit key ``box``) that scrolls
    sideways when the figure is wider than the page, opened with the figure's x value ``column`` in view.
    Returns what ``show.chart`` returns (the selection, with ``on_select``)."""
    px = int(fig.layout.width)
    st.html(f"<style>.st-key-{box} {{ overflow-x: auto; }} .st-key-{box} [data-testid='stElementContainer'], "
            f".st-key-{box} [data-testid='stPlotlyChart'] {{ min-width: {px}px; }}</style>")
    with st.container(key=box):
        out = show.chart(fig, name, width=px, **kw)
    st.html(_SCROLL_JS.replace("__BOX__", box).replace("__X__", f"{float(column):g}"), unsafe_allow_javascript=True)
    return out
