"""The attribution graph in circuit-tracer's frontend JSON on the graph page (:mod:`sprout_interp.circuits.graph_json`):
:func:`download` offers the pruned graph as ``<slug>.json`` and as a folder for circuit-tracer's local server (a
.zip with ``graph-metadata.json``), made only when clicked; :func:`show_upload` draws a graph someone uploaded in
that format (ours or one circuit-tracer wrote), read-only: the figure (hover a node to follow its links, as on a
computed graph: :mod:`graph_hover`), its nodes and links."""
from __future__ import annotations

import hashlib
import io
import re
import zipfile
from collections.abc import Mapping, Sequence
from typing import Optional

import graph_hover
import scrolling
import show
import state
import streamlit as st

from sprout_interp.plots.common import escape_label, show_token

__all__ = ["download", "show_upload", "slug_for"]

_KINDS = {"feature": "feature", "error": "error node", "embedding": "embedding", "logit": "logit"}


def slug_for(*parts: object) -> str:
    """A file name circuit-tracer's slug may be: the parts joined by '-', every other character '-', at most 100."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(str(p) for p in parts)).strip("-._")[:100]
    return s or "graph"


def _labels(labels: Optional[Mapping]) -> Optional[dict]:
    """The page's labels by node key, without the logits' (circuit-tracer's viewer parses its own from those)."""
    if not labels:
        return None
    return {str(k): str(v)[:500] for k, v in labels.items() if not str(k).startswith("l")}


def download(graph, node_threshold: float, edge_threshold: float, labels: Optional[Mapping[str, str]] = None,
             pinned: Sequence[str] = (), supernodes: Optional[Mapping[str, Sequence[str]]] = None,
             slug: Optional[str] = None, key: str = "ag_json") -> None:
    """Two download buttons for ``graph`` pruned at the page's thresholds, in circuit-tracer's frontend JSON:
    ``<slug>.json`` (reopen it on this page, ``si.load_graph_json`` or circuit-tracer's viewer) and a .zip of the
    folder its local server serves. ``labels``: {node key: label} the page shows (written as each node's
    ``clerp``); ``pinned`` and ``supernodes`` (node keys) are written whatever the thresholds (as the page draws
    them) and go into its ``qParams``, so circuit-tracer's viewer opens with them; ``slug``: the file's name, by
    default the model's and the prompt's length."""
    from sprout_interp.circuits.graph_json import graph_json_files

    slug = slug_for(slug or f"{graph.info.get('model_name') or 'graph'}-{graph.n_pos}-tokens")
    names = _labels(labels)

    def files() -> dict:  # ``graph`` may be a function that computes it (the page's first view read from a file)
        return graph_json_files(graph() if callable(graph) else graph, slug, float(node_threshold), float(edge_threshold), labels=names,
                                pinned=list(pinned), supernodes=dict(supernodes or {}))

    def zipped() -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in files().items():
                z.writestr(f"{slug}/{name}", data)
        return buf.getvalue()

    c = st.columns(2)
    c[0].download_button("⬇ circuit-tracer's JSON (.json)", data=lambda: files()[f"{slug}.json"],
                         file_name=f"{slug}.json", mime="application/json", on_click="ignore", key=f"{key}_file")
    c[1].download_button("⬇ circuit-tracer's server folder (.zip)", data=zipped, file_name=f"{slug}.zip",
                         mime="application/zip", on_click="ignore", key=f"{key}_zip")
    st.caption(f"`{slug}.json` holds the graph pruned at this page's thresholds (node_threshold={node_threshold:g}, "
               f"edge_threshold={edge_threshold:g}; the pinned nodes and supernodes kept whatever the thresholds, with "
               "their strong edges, as drawn above) in circuit-tracer's "
               "viewer format, with its node ids and a label on every node: reopen it above, or with "
               "`si.load_graph_json`. The .zip holds it with `graph-metadata.json`, a folder circuit-tracer's local "
               "server serves: unpack it and run `python -c \"from circuit_tracer.frontend.local_server import serve; "
               f"serve('{slug}'); input()\"` in its environment (its page loads d3 from the web). The same graph from "
               f"Python (default labels): `si.save_graph_json(graph, 'folder', '{slug}', node_threshold={node_threshold:g}, "
               f"edge_threshold={edge_threshold:g}" + (f", pinned={list(pinned)!r}" if pinned else "")
               + (f", supernodes={dict(supernodes)!r}" if supernodes else "") + ")`.")


@st.cache_resource(max_entries=3, show_spinner=False)
def _read(digest: str, _data: bytes, name: str):
    from sprout_interp.circuits.graph_json import read_graph_json

    return read_graph_json(_data, name)


def _hover(r) -> str:
    tok = show_token(str(r.token))
    where = (f"block {int(r.layer) + 1} (layer {int(r.layer)}), pos {int(r.pos)} ({tok})"
             if r.kind in ("feature", "error") else f"pos {int(r.pos)} ({tok})")
    if r.kind == "feature":
        head = f"<b>feature {int(r.feature)}</b>, {where}<br>activation {r.activation:.3f}"
    elif r.kind == "logit":
        head = f"<b>logit</b> {tok}: probability {r.logit_prob:.3f}"
    else:
        head = f"<b>{_KINDS[r.kind]}</b>, {where}"
    cum = "" if r.kind == "logit" else (f"<br>cumulative influence {r.cumulative_influence:.3f} (the share carried "
                                        "by this node and every stronger one)")
    label = f"<i>{escape_label(str(r.label))}</i><br>" if r.label else ""
    return label + head + cum + f"<br>id {escape_label(str(r.node_id))}"


def show_upload(data: bytes, name: str) -> None:
    """A graph in circuit-tracer's JSON, uploaded (``data``: the file's bytes): checked by
    ``read_graph_json`` (a file it refuses is named on the page), then drawn read-only with its nodes and links."""
    from sprout_interp.plots.graph import attribution_graph_figure

    digest = hashlib.sha256(data).hexdigest()
    with st.spinner("reading the graph file…"), state.shown_errors("the uploaded graph"):
        g = _read(digest, data, str(name)[:200])
    nodes, links = g.nodes.copy(), g.links
    counts = nodes["kind"].value_counts()
    st.info(f"Showing the uploaded graph in circuit-tracer's JSON ({state.md(name)}: {state.md(g.slug)}, transcoders "
            f"{state.md(g.metadata['scan'])}), read-only: the nodes and links as the file holds them, already pruned "
            "(at node_threshold "
            f"{g.metadata['node_threshold'] if g.metadata['node_threshold'] is not None else 'not given'}). Remove "
            "the file above to compute a graph for the text in the sidebar.")
    if g.ambiguous_links:
        st.warning(f"{g.ambiguous_links} of its links name an id that circuit-tracer gave two nodes (a layer-0 feature "
                   "numbered b and block b's error node at the same position): they are drawn from the error node, "
                   "as circuit-tracer's viewer draws them, though either could be their source.")
    k = st.columns(4)
    k[0].metric("nodes", f"{len(nodes):,}", help=f"{int(counts.get('feature', 0))} features, "
                                                 f"{int(counts.get('error', 0))} error nodes, "
                                                 f"{int(counts.get('embedding', 0))} embeddings, "
                                                 f"{int(counts.get('logit', 0))} logits")
    k[1].metric("links", f"{len(links):,}")
    k[2].metric("positions", f"{g.n_pos}")
    k[3].metric("blocks", f"{g.n_layers}")
    # the figure sizes nodes by influence: a file holds each node's cumulative share (smaller is stronger), so the
    # drawing uses 1 - that share (logits: 0, as in our own graphs); the hover names the file's own value
    nodes["influence"] = (1.0 - nodes["cumulative_influence"]).where(nodes["kind"] != "logit", 0.0).fillna(0.0)
    drawn = {r.key: str(r.label)[:40] for r in nodes.itertuples() if r.label and r.kind in ("feature", "logit")}
    pinned = g.pinned  # the file's pins ringed, as in its viewer
    fig = attribution_graph_figure(nodes, links[["source", "target", "weight"]], g.prompt_tokens, g.n_layers,
                                   pinned=pinned, labels=drawn)
    hover = {int(r.node): _hover(r) for r in nodes.itertuples()}
    for tr in fig.data:
        cd = getattr(tr, "customdata", None)
        if cd is not None and len(cd) and tr.hovertext is not None:
            tr.hovertext = [hover.get(int(c[1]), "") for c in cd]
    prompt = "".join(g.prompt_tokens)
    st.markdown(f"**{state.md(g.slug)}**: {'…' if len(prompt) > 200 else ''}{state.md(prompt[-200:])}")
    if fig.layout.width:
        scrolling.chart(fig, "uploaded circuit-tracer graph", "ag_json_box", fig.layout.xaxis.range[1]
                        if fig.layout.xaxis.range else 0)
    else:  # in a keyed box, as the computed graph, for the hover script to find
        with st.container(key="ag_json_box"):
            show.chart(fig, "uploaded circuit-tracer graph", width="stretch")
    graph_hover.hover_edges("ag_json_box")  # a hovered node's links drawn on top, the rest dimmed
    st.caption("x = position (the prompt's tokens), y = block (from 1): features (circles), error nodes (grey "
               "squares), embeddings (triangles) and logits (stars); blue edges raise their target, red lower it; "
               "**hover a node to follow its links** (drawn on top, the rest dimmed). "
               "Node size: 1 − the file's cumulative influence (its rank, not its own share). Reproduce: `python -c "
               "\"import sprout_interp as si; g = si.load_graph_json('<file>.json'); print(g); print(g.nodes)\"`")
    with st.expander("the nodes and links (tables)"):
        cols = ["key", "kind", "layer", "block", "pos", "feature", "token", "label", "activation", "logit_prob",
                "cumulative_influence", "node_id"]
        show.table(nodes[cols], "uploaded graph nodes")
        key = list(nodes["key"])
        show.table(links.assign(source=[key[i] for i in links["source"]], target=[key[i] for i in links["target"]])
                   [["source", "target", "weight", "source_id", "target_id"]], "uploaded graph links")
