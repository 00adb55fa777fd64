"""Reading an attribution graph node by node: any node's strongest inputs and outputs (:func:`node_edges`), and the
subgraph of chosen ("pinned") nodes and supernodes with the edges between them (:func:`subgraph`).

Edges are the graph's ``adjacency[target, source]`` (rows = targets): the direct effect of the source's write on
the target's input, in the target's units (a feature's pre-activation, a logit node's logit minus the mean logit).

:func:`subgraph` gives each pair of subgraph nodes (a pinned node alone, or a supernode: a named group of nodes)
three numbers:

* ``weight``: the direct edges summed, every member of the source group into every member of the target group
  (target units; a supernode's sum is over several targets' inputs);
* ``share``: what circuit-tracer's subgraph view draws (its frontend's ``init-cg-subgraph.js``): direct edges
  only, each as a share of its target's summed ``|input|``. A supernode target weights its members: member ``t``'s
  edges are divided by ``ext_t`` (its ``|input|`` from outside its own supernode) and multiplied by ``w_t =
  (ext_t / abs_t) / sum_k (ext_k / abs_k)`` over the supernode's members (``abs_t``: its whole ``|input|``), so a
  supernode's incoming share is about the mean of its members' shares. Edges inside one supernode are dropped;
* ``total``: the effect summed over every path from the source to the target whose inner nodes are all
  *unpinned* (circuit-tracer has no such number): the change of the target's input when the source's write is
  removed, in the frozen linear replacement model where every unpinned feature follows its own input one for
  one (circuit-tracer's TopK keeps its pre-activation as the activation; the active set fixed) and every pinned
  node, error node and embedding is held. A path ``s -> r1 -> ... -> rk -> t`` carries
  ``A[r1, s] * A[r2, r1] / a_r1 * ... * A[t, rk] / a_rk`` (``a_r``: feature ``r``'s activation, since its
  writes are proportional to it), so ``total = A_PP + (A_PR / a_R) (I - A_RR / a_R)^-1 A_RP`` (P pinned, R the
  rest). Target units, like ``weight``; a path through another pinned node is not counted, because the
  subgraph draws that path itself. With nothing else pinned, ``total`` is what
  :func:`~sprout_interp.circuits.graph_interventions.ablation_prediction` predicts for removing the source.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional, Union

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from sprout_interp.circuits.graphs import AttributionGraph, check_graph, node_key
from sprout_interp.core.arguments import check_count, check_index, describe
from sprout_interp.core.errors import AttributionGraphError

__all__ = ["EDGE_COLUMNS", "node_keys", "node_edges", "subgraph"]

#: the node-table columns each ranked edge names its other end by (and its ``key``)
EDGE_COLUMNS = ("node", "kind", "layer", "block", "pos", "feature", "token")
_ROWS = 1 << 22  # float64 products a block of rows at a time (about 32 MB a block)


def _check_mask(graph: AttributionGraph, edge_mask) -> Optional[Tensor]:
    if edge_mask is None:
        return None
    n = graph.adjacency.shape[0]
    if not isinstance(edge_mask, Tensor) or edge_mask.dtype != torch.bool or tuple(edge_mask.shape) != (n, n):
        raise AttributionGraphError(f"edge_mask={describe(edge_mask)} is not a bool tensor of shape ({n}, {n}) (rows "
                                    "= targets): pass prune_graph(graph).edge_mask, or None for every edge")
    return edge_mask


def node_keys(graph: AttributionGraph) -> list[str]:
    """Every node's key (:func:`~sprout_interp.circuits.graphs.node_key`: ``f<layer>.<pos>.<feature>``,
    ``e<layer>.<pos>``, ``t<pos>``, ``l<token id>``), in node order."""
    df = check_graph(graph).nodes
    return [node_key(k, int(ly), int(p), int(f), int(t)) for k, ly, p, f, t in
            zip(df["kind"], df["layer"], df["pos"], df["feature"], df["token_id"])]


def _node(graph: AttributionGraph, value, name: str, keys: Optional[list] = None) -> int:
    """A node given as its index or its key, as its index (AttributionGraphError naming ``name`` otherwise)."""
    size = graph.adjacency.shape[0]
    if isinstance(value, str):
        keys = node_keys(graph) if keys is None else keys
        if value not in keys:
            raise AttributionGraphError(f"{name}={value!r} is no node of this graph: a node index 0..{size - 1} or a "
                                        "key f<layer>.<pos>.<feature>, e<layer>.<pos>, t<pos> or l<token id>")
        return keys.index(value)
    return check_index(value, name, size, what="a node index of this graph, or its key", error=AttributionGraphError)


def _ranked(graph: AttributionGraph, ends: np.ndarray, weights: np.ndarray, n: int) -> pd.DataFrame:
    """The ``n`` strongest nonzero edges by ``|weight|`` (ties by node index), each named by its other end."""
    nz = np.flatnonzero(weights != 0)
    order = nz[np.lexsort((ends[nz], -np.abs(weights[nz])))][:n]
    df = graph.nodes.iloc[ends[order]][list(EDGE_COLUMNS)].reset_index(drop=True)
    df.insert(0, "rank", np.arange(1, len(df) + 1))
    df["weight"] = weights[order]
    return df


def node_edges(graph: AttributionGraph, node: Union[int, str], n: int = 10,
               edge_mask: Optional[Bool[Tensor, "n n"]] = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Node ``node``'s (an index, or a key as :func:`node_keys` gives) strongest incoming and outgoing edges:
    ``(inputs, outputs)``, each ranked by ``|weight|`` (ties by node index), at most ``n`` rows, nonzero edges only,
    from every edge of the full graph (not only those pruning keeps). Any kind of node: a feature has both; an error
    node or an embedding only outputs; a logit only inputs (the other table is then empty).

    Columns: ``rank`` (1 the strongest), the other end's ``node`` (index), ``key``, ``kind``, ``layer``, ``block``,
    ``pos``, ``feature``, ``token``; ``weight`` (``adjacency[target, source]``, in the target's units); ``share``: the
    weight over the node's summed ``|input|`` (inputs) or summed ``|output|`` (outputs), signed, over all its edges;
    outputs also ``target_share``: the weight over the target's summed ``|input|`` (circuit-tracer's ``pctInput``).
    With ``edge_mask`` (e.g. ``prune_graph(graph).edge_mask``; rows = targets), ``kept`` says whether pruning keeps
    the edge; the ranking is the full graph's either way. ``attrs``: ``units``, ``edges`` (which edges were
    ranked), ``abs_sum`` (the node's summed ``|input|`` or ``|output|``) and ``count`` (its nonzero edges).

    Raises AttributionGraphError for a node index outside ``0..n_nodes-1`` or a key of no node, ``n`` below 1 or a
    bad mask.
    """
    graph = check_graph(graph)
    size = graph.adjacency.shape[0]
    keys = node_keys(graph)
    node = _node(graph, node, "node", keys)
    n = check_count(n, "n", low=1, what="how many edges each list holds", error=AttributionGraphError)
    mask = _check_mask(graph, edge_mask)
    A = graph.adjacency
    row = A[node].double().numpy()  # sources into the node
    col = A[:, node].double().numpy()  # targets the node writes into
    idx = np.arange(size)
    inputs, outputs = _ranked(graph, idx, row, n), _ranked(graph, idx, col, n)
    for df in (inputs, outputs):
        df.insert(2, "key", [keys[i] for i in df["node"]])
    in_abs, out_abs = float(np.abs(row).sum()), float(np.abs(col).sum())
    inputs["share"] = inputs["weight"] / in_abs if in_abs else 0.0
    outputs["share"] = outputs["weight"] / out_abs if out_abs else 0.0
    if len(outputs):
        targets = torch.tensor(outputs["node"].to_numpy(), dtype=torch.long)
        t_abs = A[targets].double().abs().sum(1).numpy()
        outputs["target_share"] = outputs["weight"].to_numpy() / np.where(t_abs > 0, t_abs, 1.0)
    else:
        outputs["target_share"] = pd.Series(dtype=float)
    if mask is not None:
        inputs["kept"] = mask[node, torch.tensor(inputs["node"].to_numpy(), dtype=torch.long)].numpy()
        outputs["kept"] = mask[torch.tensor(outputs["node"].to_numpy(), dtype=torch.long), node].numpy()
    for df, abs_sum, count, what in ((inputs, in_abs, int((row != 0).sum()), "input"),
                                     (outputs, out_abs, int((col != 0).sum()), "output")):
        df.attrs = {"units": "weight: adjacency[target, source] in the target's units (a feature's pre-activation, a "
                             f"logit node's logit minus the mean logit); share: of the node's summed |{what}|",
                    "edges": "every edge of the graph" + ("; kept: pruning keeps it" if mask is not None else ""),
                    "abs_sum": abs_sum, "count": count}
    return inputs, outputs


def _groups(graph: AttributionGraph, nodes, supernodes, keys: list[str]) -> list[tuple[str, list[int]]]:
    """(name, member indices) per subgraph node: each supernode (its name), then each pinned node in no supernode
    (name ''). A node in two supernodes counts in the first."""
    size = graph.adjacency.shape[0]
    if isinstance(nodes, (str, bytes, Mapping)) or not hasattr(nodes, "__iter__"):
        raise AttributionGraphError(f"nodes={describe(nodes)} is not a list of node indices (0..{size - 1})")
    pins = [_node(graph, v, f"nodes[{i}]", keys) for i, v in enumerate(nodes)]
    supernodes = {} if supernodes is None else supernodes
    if not isinstance(supernodes, Mapping):
        raise AttributionGraphError(f"supernodes={describe(supernodes)} is not a mapping {{name: [node indices]}}")
    seen: set[int] = set()
    out: list[tuple[str, list[int]]] = []
    for name, members in supernodes.items():
        if not isinstance(name, str) or not name:
            raise AttributionGraphError(f"supernodes has the name {describe(name)}: a supernode's name is a "
                                        "non-empty string")
        if isinstance(members, (str, bytes, Mapping)) or not hasattr(members, "__iter__"):
            raise AttributionGraphError(f"supernodes[{name!r}]={describe(members)} is not a list of node indices")
        ms = [_node(graph, v, f"supernodes[{name!r}][{i}]", keys) for i, v in enumerate(members)]
        ms = [m for m in dict.fromkeys(ms) if m not in seen]
        if ms:
            seen.update(ms)
            out.append((name, ms))
    for p in dict.fromkeys(pins):
        if p not in seen:
            seen.add(p)
            out.append(("", [p]))
    if not out:
        raise AttributionGraphError("nodes and supernodes name no node: pin at least one node index")
    return out


def _blocks(A: Tensor, mask: Optional[Tensor], rows: Tensor, cols: Tensor) -> Tensor:
    """``(A * mask)[rows][:, cols]`` in float64 (no copy of the whole adjacency), a block of rows at a time."""
    step = max(1, _ROWS // max(int(cols.numel()), 1))
    parts = []
    for i in range(0, int(rows.numel()), step):
        part = A[rows[i:i + step]][:, cols].double()
        parts.append(part if mask is None else part * mask[rows[i:i + step]][:, cols])
    return torch.cat(parts) if parts else torch.zeros(0, int(cols.numel()), dtype=torch.float64)


def _through_rest(graph: AttributionGraph, A: Tensor, mask: Optional[Tensor], pinned: Tensor
                  ) -> Float[Tensor, "p p"]:
    """``total`` between every pair of pinned nodes (rows = targets), float64: see the module docstring.

    One pass over the features' layers in order (a feature reads only features of earlier layers): ``z`` (n_features,
    p) is what each pinned node's write adds to each feature's input through unpinned features, ``z[l] = A[l, P] +
    A[l, <l] (z[<l] / a)``, with a pinned feature passing nothing on (its ``1 / a`` set to 0)."""
    nF = graph.n_features
    act = torch.tensor(graph.nodes["activation"].to_numpy()[:nF], dtype=torch.float64)
    inv = torch.where(act != 0, 1 / act.masked_fill(act == 0, 1.0), torch.zeros_like(act))  # a feature at 0 writes 0
    inv[pinned[pinned < nF]] = 0.0  # paths through a pinned node are the subgraph's own
    direct = _blocks(A, mask, pinned, pinned)
    if not nF:
        return direct
    feats = torch.arange(nF)
    z = _blocks(A, mask, feats, pinned)  # what each pinned node writes into each feature's input directly
    layer = torch.tensor(graph.nodes["layer"].to_numpy()[:nF])
    starts = torch.searchsorted(layer, torch.arange(int(layer.max()) + 2)).tolist() if nF else [0]
    for lo, hi in zip(starts[:-1], starts[1:]):  # the features of one layer: rows lo..hi, their sources 0..lo
        if hi <= lo or lo == 0:
            continue
        scaled = z[:lo] * inv[:lo, None]
        step = max(1, _ROWS // lo)
        for r in range(lo, hi, step):
            rows = slice(r, min(hi, r + step))
            part = A[rows, :lo].double()
            if mask is not None:
                part = part * mask[rows, :lo]
            z[rows] += part @ scaled
    return direct + _blocks(A, mask, pinned, feats) @ (z * inv[:, None])


def subgraph(graph: AttributionGraph, nodes: Sequence, supernodes: Optional[Mapping] = None,
             edge_mask: Optional[Bool[Tensor, "n n"]] = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The pinned nodes ``nodes`` (node indices or keys, as :func:`node_keys` gives) and the ``supernodes``
    (``{name: [node indices or keys]}``; each drawn as one node, its members pinned too) with the edges between
    them: ``(nodes, edges)``. See the module docstring for the three numbers an edge carries. ``edge_mask`` (rows =
    targets; e.g. ``prune_graph(graph).edge_mask``, as circuit-tracer's frontend sees only its file's links): only
    those edges count, in every number; None: every edge of the graph.

    ``nodes``: one row per subgraph node, supernodes first: ``id`` (0..k-1, what the edges refer to), ``name``
    (the supernode's; '' for a node alone), ``kind`` (the node's, or "supernode"), ``node`` (its index; -1 for a
    supernode), ``key`` (its key; ``S:<name>`` a supernode), ``members`` (node indices), ``layer``, ``block``,
    ``pos`` (a supernode: its members' means rounded, where a figure puts it), ``feature`` and ``token`` (a node
    alone's; -1 and '' for a supernode), ``abs_input`` (the members' summed ``|input|``, the counted edges).
    ``edges``: ``source``, ``target`` (ids), ``weight``, ``share``, ``total`` (float64), every ordered pair with a
    nonzero ``weight`` or ``total``, strongest ``|total|`` first (ties by ids). A node in two supernodes counts in
    the first; a pinned node that is also a supernode's member is drawn inside it.

    Raises AttributionGraphError for a node index outside the graph or a key of no node, no node at all, or a bad
    mask.
    """
    graph = check_graph(graph)
    mask = _check_mask(graph, edge_mask)
    keys = node_keys(graph)
    groups = _groups(graph, nodes, supernodes, keys)
    A = graph.adjacency
    members = [m for _, ms in groups for m in ms]
    pinned = torch.tensor(members, dtype=torch.long)
    group_of = np.repeat(np.arange(len(groups)), [len(ms) for _, ms in groups])
    direct = _blocks(A, mask, pinned, pinned).numpy()  # rows = target members, columns = source members
    total = _through_rest(graph, A, mask, pinned).numpy()
    # circuit-tracer's share: each target member's |input|, from outside its own supernode, and its weighting
    abs_in = _blocks(A, mask, pinned, torch.arange(A.shape[0])).abs().sum(1).numpy()
    same = group_of[:, None] == group_of[None, :]
    is_super = np.array([bool(name) for name, _ in groups])[group_of]
    inside = np.where(same & is_super[:, None], np.abs(direct), 0.0).sum(1)
    ext = abs_in - inside
    frac = np.divide(ext, abs_in, out=np.zeros_like(ext), where=abs_in > 0)
    norm = np.bincount(group_of, weights=frac, minlength=len(groups))[group_of]
    w = np.divide(frac, norm, out=np.zeros_like(frac), where=norm > 0)
    per_target = np.divide(w, ext, out=np.zeros_like(w), where=ext > 0)
    k = len(groups)
    onehot = np.zeros((len(members), k))
    onehot[np.arange(len(members)), group_of] = 1.0
    weight = onehot.T @ direct @ onehot  # [target group, source group]
    share = onehot.T @ (direct * per_target[:, None]) @ onehot
    summed = onehot.T @ total @ onehot
    rows = []
    nodes_df = graph.nodes
    for gid, (name, ms) in enumerate(groups):
        part = nodes_df.iloc[ms]
        alone = not name
        rows.append(dict(id=gid, name=name, kind=part["kind"].iloc[0] if alone else "supernode",
                         node=ms[0] if alone else -1, key=keys[ms[0]] if alone else f"S:{name}",
                         members=list(ms),
                         layer=int(part["layer"].iloc[0]) if alone else int(round(float(part["layer"].mean()))),
                         pos=int(part["pos"].iloc[0]) if alone else int(round(float(part["pos"].mean()))),
                         feature=int(part["feature"].iloc[0]) if alone else -1,
                         token=str(part["token"].iloc[0]) if alone else "",
                         abs_input=float(abs_in[group_of == gid].sum())))
    out_nodes = pd.DataFrame(rows)
    out_nodes.insert(out_nodes.columns.get_loc("pos"), "block", out_nodes["layer"] + 1)
    t_ids, s_ids = np.nonzero((weight != 0) | (summed != 0))
    keep = t_ids != s_ids
    t_ids, s_ids = t_ids[keep], s_ids[keep]
    edges = pd.DataFrame({"source": s_ids, "target": t_ids, "weight": weight[t_ids, s_ids],
                          "share": share[t_ids, s_ids], "total": summed[t_ids, s_ids]})
    edges = edges.iloc[np.lexsort((edges["target"], edges["source"], -edges["total"].abs()))].reset_index(drop=True)
    units = ("weight: the direct edges summed; total: summed over every path through unpinned nodes (both in the "
             "target's units, summed over a supernode's members); share: circuit-tracer's subgraph view, direct "
             "edges as a share of the target's |input|")
    edges.attrs = {"units": units, "edges": "every edge of the graph" if mask is None else "the edges of edge_mask"}
    out_nodes.attrs = {"units": "layer 0-indexed (embeddings -1, logits n_layers), block = layer + 1, pos 0-based; "
                                "abs_input: summed |input| of the counted edges, in the members' units"}
    return out_nodes, edges
