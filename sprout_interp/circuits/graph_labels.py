"""A short label for every node of an attribution graph, for the graph page, its tables and circuit-tracer's
``clerp``: a feature's measured label (:func:`sprout_interp.features.labels.feature_labels`), ``err L3 @5`` for the
error node of layer 3 (0-indexed, as in the node table) at position 5, ``emb " Pl"`` for an embedding, ``" ax"
p=0.31`` for a logit node with its probability.
"""
from __future__ import annotations

from typing import Optional

import pandas as pd

from sprout_interp.circuits.graphs import AttributionGraph
from sprout_interp.core.arguments import describe
from sprout_interp.core.errors import AttributionGraphError
from sprout_interp.features.labels import LABEL_COLUMNS, TranscodersArg, feature_labels, quote_token

__all__ = ["graph_labels"]


def graph_labels(graph: AttributionGraph, model, transcoders: TranscodersArg = None, *,
                 labels: Optional[pd.DataFrame] = None) -> pd.Series:
    """One plain-text label per node of ``graph``, in node order: a Series of strings indexed like ``graph.nodes``.

    - feature: its label from :func:`~sprout_interp.features.labels.feature_labels` (where it fires on held-out
      text, the token before, what it promotes; read from the shipped ``labels.json`` when it fits, else measured
      in one pass for all the graph's features), e.g. ``" Pl" after " Zorbin" -> "ax"``;
    - error: ``err L{layer} @{pos}`` (layer 0-indexed, pos 0-based: the node table's own numbers);
    - embedding: ``emb`` and its token, e.g. ``emb " Pl"``;
    - logit: its token and probability, e.g. ``" ax" p=0.31``.

    ``transcoders``: the ones the graph was made with (a TranscoderSet, ``{layer: Transcoder}``, a
    CrossLayerTranscoder or a folder; None: the model's shipped ones of the graph's kind,
    ``graph.info["transcoder_kind"]``). ``labels``: a table :func:`feature_labels`
    returned for these transcoders (any superset of the graph's features), to reuse it. Tokens are quoted by
    :func:`~sprout_interp.features.labels.quote_token`; labels still need HTML escaping where they are drawn.
    Raises AttributionGraphError when ``labels`` lacks a feature of the graph or is not such a table.
    """
    if not isinstance(graph, AttributionGraph):
        raise AttributionGraphError(f"graph={describe(graph)} is not an AttributionGraph (make one with "
                                    "sprout_interp.attribution_graph or load_graph)")
    nodes = graph.nodes
    feats = nodes[nodes["kind"] == "feature"]
    pairs = sorted({(int(r.layer), int(r.feature)) for r in feats[["layer", "feature"]].itertuples()})
    if labels is None:
        kind = graph.info.get("transcoder_kind") if transcoders is None else None
        labels = feature_labels(model, transcoders, pairs, kind=kind) if pairs else \
            pd.DataFrame(columns=list(LABEL_COLUMNS))
    elif not isinstance(labels, pd.DataFrame) or not {"layer", "feature", "label"} <= set(labels.columns):
        raise AttributionGraphError(f"labels={describe(labels)} is not a table of feature_labels (columns layer, "
                                    "feature, label): pass one, or None to measure")
    by = {(int(a), int(b)): str(c) for a, b, c in zip(labels["layer"], labels["feature"], labels["label"])}
    missing = [p for p in pairs if p not in by]
    if missing:
        raise AttributionGraphError(f"labels has no row for {len(missing)} of the graph's features (e.g. layer "
                                    f"{missing[0][0]} feature {missing[0][1]}): pass feature_labels of every "
                                    "(layer, feature) of the graph, or labels=None")
    out = []
    for r in nodes[["kind", "layer", "pos", "feature", "token", "logit_prob"]].itertuples(index=False):
        if r.kind == "feature":
            out.append(by[(int(r.layer), int(r.feature))])
        elif r.kind == "error":
            out.append(f"err L{int(r.layer)} @{int(r.pos)}")
        elif r.kind == "embedding":
            out.append(f"emb {quote_token(str(r.token))}")
        else:
            out.append(f"{quote_token(str(r.token))} p={float(r.logit_prob):.2f}")
    return pd.Series(out, index=nodes.index, name="label", dtype=object)
