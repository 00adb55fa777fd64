"""Cached calls of the Attribution graph page: the transcoders, the graph of a prompt (kept in memory unpickled: a
full Sprout graph's adjacency is about 0.9 GB), an uploaded graph file, its influence and pruned views, the tokens
its features promote and a transcoder feature's card. Same rules as ``compute.py``: keyed by the model's key, pure
functions of their arguments, no tensor maths."""
from __future__ import annotations

import precomputed
import streamlit as st
from compute import tokens


@st.cache_resource(max_entries=4, show_spinner=False)
def graph_transcoders(_m, key: str):
    """The transcoders shipped beside the checkpoint, one per block (TranscoderNotFoundError when it has none)."""
    from sprout_interp.features.transcoder import load_transcoders

    return load_transcoders(_m)


@st.cache_resource(max_entries=2, show_spinner=False)
def graph_clt(_m, key: str):
    """The cross-layer transcoder shipped beside the checkpoint (TranscoderNotFoundError when it has none)."""
    from sprout_interp.features.clt import load_clt

    return load_clt(_m)


#: what the page calls each kind of transcoders (``local_replacement.TRANSCODER_KINDS``)
KIND_LABELS = {"per_layer": "per-layer transcoders", "clt": "cross-layer transcoder"}


@st.cache_data(max_entries=8, show_spinner=False)
def graph_kinds(_m, key: str) -> list[str]:
    """The kinds of transcoders the checkpoint ships, the best first (the default of ``si.attribution_graph``: the
    higher recorded held-out FVE); empty when it ships none."""
    from sprout_interp.circuits.local_replacement import best_kind, shipped_kinds

    kinds = list(shipped_kinds(_m))
    if not kinds:
        return []
    best = best_kind(_m)
    return [best] + [k for k in kinds if k != best]


def graph_kind() -> str:
    """The kind of transcoders the page's computed graph uses (its ``ag_kind`` choice; per-layer when there is no
    choice): its feature cards and promoted tokens are read from the same kind."""
    return st.session_state.get("ag_kind") or "per_layer"


#: where a text's graph ends by default (just after the position where the model predicts a repeated name's copied
#: token; None when no name repeats): ``precomputed.graph_end``, which the shipped first view used
graph_end = precomputed.graph_end


@st.cache_resource(max_entries=4, show_spinner=False)
def _graph_view_file(_m, key: str):
    """(the Attribution graph page's first view shipped beside the checkpoint, or None; why none), once per model."""
    return precomputed.read_graph_view(_m)


def shipped_graph(_m, key: str, text: str, end: int, max_features: int, kind: str):
    """The first view of the graph of ``text``'s first ``end`` tokens (``precomputed.GraphView``: node table,
    influence, scores, the pruned tables at the default thresholds, labels) when it was shipped beside the
    checkpoint for these very settings, else None (the page computes the graph)."""
    view = _graph_view_file(_m, key)[0]
    return view if view is not None and view.answers(text, end, max_features, kind) else None


@st.cache_resource(max_entries=3, show_spinner=False)
def attribution_graph(_m, key: str, text: str, end: int, max_features: int, kind: str = "per_layer"):
    """(the attribution graph of the text's first ``end`` tokens, seconds it took): circuit-tracer's defaults
    (bos first, logits covering 95% of the probability, at most 10) and at most ``max_features`` feature nodes,
    over the shipped transcoders of ``kind`` ("per_layer" or "clt"). A resource (not copied on each use): the
    adjacency holds (nodes)^2 float32."""
    import time

    from sprout_interp.circuits.attribution_graph import attribution_graph as make

    ts = graph_clt(_m, key) if kind == "clt" else graph_transcoders(_m, key)
    t0 = time.perf_counter()
    g = make(_m, tokens(_m, text)[0, :end], ts, max_feature_nodes=max_features)
    return g, time.perf_counter() - t0


@st.cache_resource(max_entries=3, show_spinner=False)
def uploaded_graph(digest: str, _data: bytes):
    """A graph file someone uploaded (``digest``: its SHA-256), read by load_graph (AttributionGraphError when
    it is not one)."""
    import os
    import tempfile

    from sprout_interp.circuits.graphs import load_graph

    fd, path = tempfile.mkstemp(suffix=".safetensors")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_data)
        return load_graph(path)
    finally:
        os.unlink(path)


@st.cache_resource(max_entries=6, show_spinner=False)
def graph_influence(_graph, gkey: str):
    """(each node's influence on the logits as a list in node order, replacement score, completeness score,
    seconds the scores took) of the graph named ``gkey``."""
    import time

    from sprout_interp.circuits.graphs import graph_scores, node_influence

    t0 = time.perf_counter()
    infl = node_influence(_graph).tolist()
    replacement, completeness = graph_scores(_graph)
    return infl, replacement, completeness, time.perf_counter() - t0


@st.cache_data(max_entries=64, show_spinner=False)
def graph_view(_graph, gkey: str, node_threshold: float, edge_threshold: float, keep: tuple):
    """(nodes, edges) of the graph ``gkey`` pruned at these thresholds, the nodes ``keep`` (indices) added."""
    from sprout_interp.plots.graph import graph_tables

    return graph_tables(_graph, node_threshold, edge_threshold, graph_influence(_graph, gkey)[0], keep)


def graph_promoted(_m, key: str, features: tuple) -> dict:
    """{(layer, feature): the three tokens it promotes most} for the graph's drawn features, over the transcoders of
    the graph's kind (a cross-layer transcoder's feature: its decoder rows to every layer it writes to, summed)."""
    return _graph_promoted(_m, key, graph_kind(), features)


def _kind_transcoders(_m, key: str, kind: str):
    return graph_clt(_m, key) if kind == "clt" else graph_transcoders(_m, key)


@st.cache_data(max_entries=64, show_spinner=False)
def _graph_promoted(_m, key: str, kind: str, features: tuple) -> dict:
    from sprout_interp.features.pages import transcoder_promoted

    df = transcoder_promoted(_m, _kind_transcoders(_m, key, kind), list(features))
    return {(int(r.layer), int(r.feature)): list(r.promoted) for r in df.itertuples()}


@st.cache_resource(max_entries=4, show_spinner=False)
def transcoder_index(_m, key: str, layer: int, kind: str = "per_layer"):
    """Every held-out token's active transcoder features of ``layer`` (96 windows of 128 tokens), of the
    transcoders of ``kind`` ("per_layer" or "clt")."""
    from sprout_interp.features.pages import index_transcoder_features

    return index_transcoder_features(_m, _layer_transcoder(_m, key, layer, kind))


def _layer_transcoder(_m, key: str, layer: int, kind: str):
    """Layer ``layer``'s transcoder of ``kind``: a per-layer one, or the CLT's features of that source layer."""
    ts = _kind_transcoders(_m, key, kind)
    return ts.layer_features(layer) if kind == "clt" else ts[layer]


def transcoder_page(_m, key: str, layer: int, feature: int):
    """One transcoder feature's page (FeatureSummary) on the held-out sample, over the transcoders of the graph's
    kind: a cross-layer transcoder's feature of ``layer`` fires from that layer's feed-forward input and promotes
    what its decoder rows to every layer it writes to, summed, promote."""
    return _transcoder_page(_m, key, layer, feature, graph_kind())


@st.cache_data(max_entries=256, show_spinner=False)
def _transcoder_page(_m, key: str, layer: int, feature: int, kind: str = "per_layer"):
    from sprout_interp.features.pages import transcoder_feature_summary

    return transcoder_feature_summary(_m, _layer_transcoder(_m, key, layer, kind), feature,
                                      transcoder_index(_m, key, layer, kind))


def graph_file(_graph) -> bytes:
    """The graph as the bytes of its .safetensors file (save_graph), for a download."""
    import tempfile
    from pathlib import Path

    from sprout_interp.circuits.graphs import save_graph

    with tempfile.TemporaryDirectory() as d:
        return save_graph(_graph, Path(d) / "graph.safetensors").read_bytes()


@st.cache_data(max_entries=64, show_spinner=False)
def feature_labels(_m, key: str, kind: str, features: tuple) -> dict:
    """{(layer, feature): its short measured label} for the graph's drawn features, over the shipped transcoders of
    ``kind`` (``si.feature_labels``: read from the ``labels.json`` shipped beside them when it fits, else measured on
    held-out text)."""
    from sprout_interp.features.labels import feature_labels as measured

    ts = None if kind == "clt" else graph_transcoders(_m, key)
    df = measured(_m, ts, list(features), kind=kind)
    return {(int(r.layer), int(r.feature)): str(r.label) for r in df.itertuples()}
