"""Cached calls of the QK-attribution panel (``qk_view``) on the Attention and the Attribution graph pages: the text's
first induction cell, one cell's QK attribution on a text or on a graph's prompt, and the head loadings of a graph's
edges into one node. Same rules as ``compute.py``: keyed by the model's key (a graph by its key), pure functions of
their arguments, no tensor maths: each calls the library."""
from __future__ import annotations

import streamlit as st
from compute import tokens

_CACHE = dict(max_entries=32, show_spinner=False)


def _named(df):
    """A component or carrier table with ``carrier``: the head that last carried the row to its position
    (``head_label``), "" when it never left it."""
    from sprout_interp.circuits.heads import head_label

    df = df.copy()
    df["carrier"] = ["" if _na(v) else head_label(int(v), int(h)) for v, h in zip(df["via_layer"], df["via_head"])]
    return df


def _na(v) -> bool:
    import pandas as pd

    return v is None or bool(pd.isna(v))


def _shown(a) -> dict:
    """A QKAttribution as the panel reads it (plain tables and numbers: cached by value)."""
    return {"score": a.score, "key_components": _named(a.key_components), "query_components": _named(a.query_components),
            "key_by_head": _named(a.key_by_head()), "query_by_head": _named(a.query_by_head()), "terms": a.terms,
            "info": {k: v for k, v in a.info.items() if isinstance(v, (int, float, str, dict))}}


@st.cache_data(**_CACHE)
def repeat_cell(_m, key: str, text: str) -> tuple[int, int] | None:
    """The text's first induction cell (query, key): where a run of three tokens comes again, the key the token
    after its earlier copy (``circuits.head_writes.repeat_cell``); None when nothing repeats."""
    from sprout_interp.circuits.head_writes import repeat_cell as first_repeat

    return first_repeat(_m, tokens(_m, text))



@st.cache_data(**_CACHE)
def qk_attribution(_m, key: str, text: str, layer: int, head: int, query_pos: int, key_pos: int) -> dict:
    """Head ``head`` of block ``layer``'s QK attribution at (query_pos, key_pos) of the text (``si.qk_attribution``,
    each feed-forward's output one component): {"score", "key_components", "query_components", "key_by_head",
    "query_by_head", "terms", "info"}, each component and carrier row with ``carrier`` (the head that last carried
    it to the position, ``head_label``; "" when it never left its position)."""
    from sprout_interp.circuits.qk_attribution import qk_attribution as attribute

    return _shown(attribute(_m, tokens(_m, text)[0], layer, head, query_pos, key_pos))


def _graph_transcoders(_m, key: str, graph):
    """The shipped transcoders of the graph's kind (``info["transcoder_kind"]``): the cross-layer transcoder or the
    per-layer set (cached resources of ``graph_compute``)."""
    from graph_compute import graph_clt, graph_transcoders

    return graph_clt(_m, key) if graph.info.get("transcoder_kind") == "clt" else graph_transcoders(_m, key)


@st.cache_data(**_CACHE)
def graph_qk(_m, key: str, _graph, gkey: str, layer: int, head: int, query_pos: int, key_pos: int) -> dict:
    """As :func:`qk_attribution`, on the graph's own prompt (its tokens, ``<|endoftext|>`` first, so positions are the
    graph's) with the graph's transcoders (per-layer or cross-layer, its kind): feature, error and constant
    components, as the graph's nodes."""
    from sprout_interp.circuits.qk_attribution import qk_attribution as attribute

    return _shown(attribute(_m, _graph.tokens, layer, head, query_pos, key_pos, _graph_transcoders(_m, key, _graph)))


@st.cache_data(**_CACHE)
def edge_loadings(_m, key: str, _graph, gkey: str, pairs: tuple):
    """The graph's edges ``pairs`` ((target, source) node indices) split by the head that carried each last
    (``si.head_loadings`` with the graph's transcoders, of its kind), with ``carrier``: one row per edge and
    carrier."""
    from sprout_interp.circuits.head_loadings import head_loadings

    return _named(head_loadings(_m, _graph, list(pairs), _graph_transcoders(_m, key, _graph)))
