"""Head loadings: each edge of an attribution graph split by the attention head that carried it (Kamath, Ameisen et
al. 2025, "Tracing Attention Computation Through Feature Interactions").

An edge ``source → target`` of an attribution graph (:mod:`~sprout_interp.circuits.attribution_graph`) is the
direct effect of the source's write on the target's input in the frozen local replacement model: every path
through the residual stream, the frozen attention heads and the transcoders' skip connections, no other node in
between. Split by the head that last carried it to the target's position
(:mod:`~sprout_interp.circuits.carriers`): one part per head ``(l, h)`` between the source's block and the
target's (a feature reads after its own block's attention, so that block's heads count; a logit node reads after
the last block), and one part (``via`` NA) for what reaches the target without leaving its position (the source
at the target's own position, through the residual stream and the skip connections there). The parts add up to
the edge exactly (float rounding only).

Over a cross-layer transcoder (a graph of kind "clt") a source feature of layer ``i`` writes into every
feed-forward output ``j >= i`` below the target's read: each write is carried on by heads of blocks after ``j`` only,
and a carrier's part is the sum over the writes it carried, as the edge is the sum over them all.
"""
from __future__ import annotations

from typing import Sequence, Union

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from sprout_interp.circuits.carriers import carried_backward, frozen_maps, n_nodes
from sprout_interp.circuits.graphs import AttributionGraph, PrunedGraph, prune_graph
from sprout_interp.circuits.local_replacement import (
    LocalReplacement,
    TranscodersLike,
    local_replacement,
    resolve_transcoders,
    transcoder_kind,
)
from sprout_interp.core.arguments import check_count, check_index
from sprout_interp.core.errors import QKAttributionError
from sprout_interp.core.hooked import HookedSprout, as_hooked

__all__ = ["LOADING_UNITS", "head_loadings", "edge_heads"]

LOADING_UNITS = ("value: the part of the edge adjacency[target, source] that head (via_layer, via_head) carried last "
                 "to the target's position, in the target's units (NA head: never left the position); layer "
                 "0-indexed, via_block = via_layer + 1; the values of one edge add up to it")

EdgesLike = Union[None, PrunedGraph, Tensor, Sequence[tuple[int, int]]]


def _edges(graph: AttributionGraph, edges: EdgesLike) -> Tensor:
    """The (target, source) pairs asked for, as a (k, 2) long tensor of nonzero edges."""
    n = graph.adjacency.shape[0]
    if edges is None:
        edges = prune_graph(graph)
    if isinstance(edges, PrunedGraph):
        edges = edges.edge_mask
    if isinstance(edges, Tensor) and edges.dtype == torch.bool:
        if edges.shape != (n, n):
            raise QKAttributionError(f"edges as a mask must be ({n}, {n}) like the graph's adjacency (rows = targets), "
                                     f"got {tuple(edges.shape)}")
        pairs = (edges & (graph.adjacency != 0)).nonzero()
    else:
        if isinstance(edges, (str, bytes)) or not hasattr(edges, "__iter__"):
            raise QKAttributionError(f"edges must be None (the pruned graph's edges), a PrunedGraph, a (n, n) bool "
                                     f"mask or (target, source) pairs, got {edges!r}"[:300])
        out = []
        for e in edges:
            if not isinstance(e, (tuple, list)) or len(e) != 2:
                raise QKAttributionError(f"each edge is a (target, source) pair of node indices, got {e!r}"[:200])
            t = check_index(e[0], "target", n, what="a node of the graph", error=QKAttributionError)
            s = check_index(e[1], "source", n, what="a node of the graph", error=QKAttributionError)
            out.append((t, s))
        pairs = torch.tensor(out, dtype=torch.long).view(-1, 2)
    kinds = graph.nodes["kind"].to_numpy()
    if len(pairs):
        bad_t = ~np.isin(kinds[pairs[:, 0].numpy()], ["feature", "logit"])
        bad_s = kinds[pairs[:, 1].numpy()] == "logit"
        if bad_t.any() or bad_s.any():
            t, s = pairs[int(np.argmax(bad_t | bad_s))].tolist()
            raise QKAttributionError(f"({t}, {s}) is no edge: a target is a feature or logit node (node {t} is a "
                                     f"{kinds[t]}), a source a feature, error or embedding node (node {s} is a "
                                     f"{kinds[s]})")
    return pairs


def _columns(graph: AttributionGraph, rep: LocalReplacement) -> Tensor:
    """Each graph node's column in the full replacement model's node values (-1 for logit nodes)."""
    df = graph.nodes
    T, L = graph.n_pos, graph.n_layers
    nF_g, nF_r = graph.n_features, rep.n_features
    cols = torch.full((len(df),), -1, dtype=torch.long)
    if nF_g:
        D = max(int(df["feature"].max()), int(rep.feat_index.max()) if nF_r else 0) + 1
        f = df.iloc[:nF_g]
        want = torch.tensor(((f["layer"] * T + f["pos"]) * D + f["feature"]).to_numpy(), dtype=torch.long)
        have = ((rep.feat_layer * T + rep.feat_pos) * D + rep.feat_index).cpu()
        at = torch.searchsorted(have, want).clamp(max=max(nF_r - 1, 0))
        if nF_r == 0 or not bool((have[at] == want).all()):
            raise QKAttributionError("the graph's features are not the active features of these transcoders on its "
                                     "prompt: pass the transcoders the graph was made with")
        cols[:nF_g] = at
    k = torch.arange(L * T + T)
    cols[nF_g:nF_g + L * T + T] = nF_r + k
    return cols


@torch.no_grad()
def head_loadings(model, graph: AttributionGraph, edges: EdgesLike = None, transcoders: TranscodersLike = None, *,
                  batch_size: int = 32) -> pd.DataFrame:
    """Every asked-for edge of ``graph`` split by the head that carried it last (see the module docstring).

    Args:
        graph: made by :func:`~sprout_interp.circuits.attribution_graph.attribution_graph` for ``model`` with
            ``transcoders`` and the frozen final norm. ``transcoders``: per-layer transcoders, a cross-layer
            transcoder or a folder of either, of the graph's kind (``graph.transcoder_kind``); None: the shipped
            transcoders of that kind.
        edges: None: the edges :func:`~sprout_interp.circuits.graphs.prune_graph` keeps (default thresholds); a
            PrunedGraph (its edges); an ``(n, n)`` bool mask (rows = targets); or (target, source) node pairs.
        batch_size: targets per backward pass.

    Returns a DataFrame, one row per (edge, carrier) with a nonzero part: ``target``, ``source`` (graph node
    indices), ``via_layer``, ``via_block``, ``via_head`` (NA: never left the target's position), ``value``
    (target units), ``edge`` (the graph's ``adjacency[target, source]``). Raises QKAttributionError for edges
    the graph does not have or transcoders that are not the graph's (another kind, or other features), and
    TranscoderNotFoundError when ``transcoders=None`` and the model does not ship the graph's kind.
    """
    m = as_hooked(model)
    batch_size = check_count(batch_size, "batch_size", high=1 << 16, error=QKAttributionError)
    if not isinstance(graph, AttributionGraph):
        raise QKAttributionError(f"graph must be an AttributionGraph (si.attribution_graph), got "
                                 f"{type(graph).__name__}")
    if graph.info.get("final_norm", "frozen") != "frozen":
        raise QKAttributionError("head loadings follow the frozen final norm: make the graph with "
                                 "final_norm='frozen'")
    if graph.n_layers != m.cfg.n_layers:
        raise QKAttributionError(f"the graph has {graph.n_layers} layers, {m.name or 'the model'} "
                                 f"{m.cfg.n_layers}: pass the model the graph was made for")
    pairs = _edges(graph, edges)
    kind = graph.transcoder_kind
    ts = resolve_transcoders(m, transcoders, kind if transcoders is None else None)
    if transcoder_kind(ts) != kind:
        what = {"clt": "a cross-layer transcoder", "per_layer": "per-layer transcoders"}
        raise QKAttributionError(f"the graph is over {what[kind]} ({kind!r}) but transcoders is "
                                 f"{what[transcoder_kind(ts)]}: pass the transcoders the graph was made with")
    with m.lock:
        rep = local_replacement(m, graph.tokens.to(m.cfg.device or "cpu"), ts, bool(graph.info.get("bos", True)),
                                cross_layer=True)
    return _loadings(m, graph, rep, pairs, batch_size)


def edge_heads(model, graph: AttributionGraph, source: int, target: int, transcoders: TranscodersLike = None
               ) -> pd.DataFrame:
    """One edge ``source → target`` of ``graph`` split by its last carrier head: ``via_layer``, ``via_block``,
    ``via_head``, ``value`` (largest ``|value|`` first; adds up to ``graph.adjacency[target, source]``)."""
    n = graph.adjacency.shape[0] if isinstance(graph, AttributionGraph) else 0
    s = check_index(source, "source", max(n, 1), what="a node of the graph", error=QKAttributionError)
    t = check_index(target, "target", max(n, 1), what="a node of the graph", error=QKAttributionError)
    df = head_loadings(model, graph, [(t, s)], transcoders)
    out = df[["via_layer", "via_block", "via_head", "value"]]
    return out.iloc[np.argsort(-out["value"].abs().to_numpy(), kind="stable")].reset_index(drop=True)


def _loadings(m: HookedSprout, graph: AttributionGraph, rep: LocalReplacement, pairs: Tensor, batch_size: int
              ) -> pd.DataFrame:
    L, H = m.cfg.n_layers, m.cfg.n_heads
    cols = _columns(graph, rep)
    nodes = graph.nodes
    dev = rep.patterns.device
    kinds = nodes["kind"].to_numpy()
    W_U = m.model.head.weight.detach().float()
    gf = m.ln_final.w.detach().float()
    parts = []
    targets = pairs[:, 0].unique() if len(pairs) else pairs[:, 0]
    # (top, mid) per target: a feature reads block layer's mid-stream, a logit node (layer L) the last block's output
    t_layer = torch.tensor(nodes["layer"].to_numpy(), dtype=torch.long)[targets]
    bw = frozen_maps(m, rep, int(t_layer.max()) if len(t_layer) else 0)  # no target reads a block's output above
    for lay in t_layer.unique().tolist():
        group = targets[t_layer == lay]
        for a in range(0, group.numel(), batch_size):
            tg = group[a:a + batch_size]
            pos = torch.tensor(nodes["pos"].to_numpy()[tg.numpy()], dtype=torch.long, device=dev)
            if kinds[int(tg[0])] == "logit":
                ids = torch.tensor(nodes["token_id"].to_numpy()[tg.numpy()], dtype=torch.long, device=dev)
                u = (W_U[ids] - W_U.mean(0)) * gf / rep.scale_final[-1]
                top, mid = L, False
            else:
                f = torch.tensor(nodes["feature"].to_numpy()[tg.numpy()], dtype=torch.long, device=dev)
                u = rep.encoder(lay)[0][f] * m.blocks[lay].ln2.w.detach().float() / rep.scale2[lay, pos, None]
                top, mid = lay, True
            c = carried_backward(bw, rep, top, mid, pos, u)
            G = c.nodes.shape[0]
            for r, t in enumerate(tg.tolist()):
                src = pairs[pairs[:, 0] == t, 1]
                v = c.nodes[:, r, cols[src].to(dev)].cpu()  # (G, k)
                g_idx, s_idx = v.nonzero(as_tuple=True)
                parts.append((np.full(g_idx.numel(), t), src[s_idx].numpy(), g_idx.numpy(),
                              v[g_idx, s_idx].double().numpy(), G))
    if parts:
        t_np, s_np = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        g_np = np.concatenate([p[2] for p in parts])
        stays = g_np == np.concatenate([np.full(len(p[2]), p[4] - 1) for p in parts])
        val = np.concatenate([p[3] for p in parts])
    else:
        t_np = s_np = g_np = np.zeros(0, dtype=np.int64)
        stays, val = np.zeros(0, dtype=bool), np.zeros(0)
    via_layer = pd.array(np.where(stays, 0, g_np // H), dtype="Int64")
    via_head = pd.array(np.where(stays, 0, g_np % H), dtype="Int64")
    via_layer[stays], via_head[stays] = pd.NA, pd.NA
    df = pd.DataFrame({"target": t_np.astype(np.int64), "source": s_np.astype(np.int64), "via_layer": via_layer,
                       "via_block": via_layer + 1, "via_head": via_head, "value": val})
    df["edge"] = graph.adjacency[torch.tensor(df["target"].to_numpy(), dtype=torch.long),
                                 torch.tensor(df["source"].to_numpy(), dtype=torch.long)].double().numpy() \
        if len(df) else np.zeros(0)
    df = df.sort_values(["target", "source"], kind="stable").reset_index(drop=True)
    df.attrs["units"] = LOADING_UNITS
    df.attrs["n_edges"] = int(len(pairs))
    df.attrs["n_nodes"] = n_nodes(rep)
    return df

