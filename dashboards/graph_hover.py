"""Hover a node of the attribution graph and follow its edges: the node's incoming and outgoing edges drawn on top,
the rest of the graph dimmed, in the browser alone (plotly's hover events; no Streamlit rerun).

The figure (:func:`sprout_interp.plots.graph.attribution_graph_figure`) lists its drawn edges in
``layout.meta.edges`` as ``[source, target, weight]`` node indices and gives each node's marker the customdata
``[kind, node index]``; the script below finds a hovered node's edges in that list, draws them in a group of its own
(class :data:`HIGHLIGHT_CLASS`, one ``path`` per edge with ``data-source``, ``data-target`` and ``data-weight``)
above the edges and below the nodes, and sets the opacity of every other edge trace and unconnected node to
:data:`DIM`; leaving the node restores the figure. ``tests/dashboards/test_graph_browser.py`` reads these from the DOM.
"""
from __future__ import annotations

import streamlit as st

#: the class of the group that holds a hovered node's edges
HIGHLIGHT_CLASS = "sprout-graph-hl"
#: the opacity of the edges and nodes a hover leaves out
DIM = 0.08

_JS = """<script>
(function () {
  const BOX = "__BOX__", HL = "__HL__", DIM = __DIM__;
  const SVG = "http://www.w3.org/2000/svg";
  function find() {
    const box = document.querySelector(".st-key-" + BOX);
    return box && box.querySelector(".js-plotly-plot");
  }
  function clear(gd) {
    gd.querySelectorAll("." + HL).forEach(g => g.remove());
    gd.querySelectorAll(".scatterlayer .trace").forEach(t => { t.style.opacity = ""; });
    gd.querySelectorAll(".scatterlayer path.point").forEach(p => { p.style.opacity = ""; });
    delete gd.dataset.hovered;
  }
  function show(gd, node) {
    clear(gd);
    const L = gd._fullLayout, meta = (gd.layout && gd.layout.meta) || L.meta || {};
    const edges = (meta.edges || []).filter(e => e[0] === node || e[1] === node);
    const at = {};  // node index -> [x, y] in data units, from the markers' traces
    const traces = gd.querySelectorAll(".scatterlayer .trace");
    gd._fullData.forEach((t, i) => {
      if (!t.customdata || t.mode !== "markers") return;
      t.customdata.forEach((c, k) => { at[c[1]] = [t.x[k], t.y[k]]; });
    });
    const near = new Set([node]);
    edges.forEach(e => { near.add(e[0]); near.add(e[1]); });
    const xa = L.xaxis, ya = L.yaxis, big = Math.max(1e-12, ...edges.map(e => Math.abs(e[2])));
    let lastEdge = null;
    gd._fullData.forEach((t, i) => {
      if (t.mode === "lines" && /^edges /.test(t.name || "")) { traces[i].style.opacity = DIM; lastEdge = traces[i]; }
      if (t.customdata && t.mode === "markers")
        traces[i].querySelectorAll("path.point").forEach((p, k) => {
          p.style.opacity = near.has(t.customdata[k][1]) ? 1 : DIM;
        });
    });
    const g = document.createElementNS(SVG, "g");
    g.setAttribute("class", HL);
    g.style.pointerEvents = "none";
    edges.forEach(e => {
      const a = at[e[0]], b = at[e[1]];
      if (!a || !b) return;
      const p = document.createElementNS(SVG, "path");
      p.setAttribute("d", `M${xa.l2p(a[0])},${ya.l2p(a[1])}L${xa.l2p(b[0])},${ya.l2p(b[1])}`);
      p.setAttribute("stroke", e[2] >= 0 ? "#2166ac" : "#b2182b");
      p.setAttribute("stroke-width", (1 + 3 * Math.abs(e[2]) / big).toFixed(2));
      p.setAttribute("fill", "none");
      p.setAttribute("opacity", "0.9");
      p.dataset.source = e[0]; p.dataset.target = e[1]; p.dataset.weight = e[2];
      g.appendChild(p);
    });
    const layer = gd.querySelector(".scatterlayer");
    if (lastEdge && lastEdge.nextSibling) layer.insertBefore(g, lastEdge.nextSibling);
    else if (layer) layer.insertBefore(g, layer.firstChild);
    gd.dataset.hovered = node;
  }
  let tries = 0;
  const timer = setInterval(function () {
    const gd = find();
    if (gd && gd.on && gd._fullLayout) {
      clearInterval(timer);
      if (gd.dataset.hoverEdges) return;
      gd.dataset.hoverEdges = "1";
      gd.on("plotly_hover", ev => {
        const pt = ev.points && ev.points[0];
        if (pt && pt.customdata && pt.data.mode === "markers") show(gd, pt.customdata[1]);
      });
      gd.on("plotly_unhover", () => clear(gd));
      gd.on("plotly_afterplot", () => { if (gd.dataset.hovered !== undefined) clear(gd); });
    } else if (++tries > 300) clearInterval(timer);
  }, 100);
})();
</script>"""


def hover_edges(box: str) -> None:
    """Inject the script that highlights a hovered node's edges in the attribution graph drawn inside the
    Streamlit container keyed ``box`` (call after drawing it)."""
    js = _JS.replace("__BOX__", box).replace("__HL__", HIGHLIGHT_CLASS).replace("__DIM__", repr(DIM))
    st.html(js, unsafe_allow_javascript=True)
