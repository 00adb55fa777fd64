"""The attribution graph object (:func:`sprout_interp.circuits.attribution_graph.attribution_graph` makes it): its
file, pruning by influence on the logits and its replacement and completeness scores, as circuit-tracer defines them.

Influence (circuit-tracer's ``compute_node_influence``): the adjacency's absolute values, each row scaled to sum
1 (``normalized``); the logit nodes weighted by their probabilities; a node's influence is the weighted sum over
every path from it to the logits of the product of normalized edges, ``w @ (N + N² + ...)``.

:func:`prune_graph` keeps the nodes that carry ``node_threshold`` of the total influence (tokens and logits
always), then the edges that carry ``edge_threshold`` of the edge influence among them, then drops feature and
error nodes left without an outgoing edge and features without an incoming one, until nothing changes;
:func:`keep_nodes` adds nodes a person pinned, with their strong edges.
:func:`graph_scores`: the replacement score, the share of the tokens' and errors' influence that starts at
tokens (features explain everything: 1); the completeness score, the share of each node's normalized input
that comes from non-error nodes, weighted by influence plus logit weight.
"""
from __future__ import annotations

import json
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Union

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sprout_interp.circuits.local_replacement import TRANSCODER_KINDS
from sprout_interp.core import limits
from sprout_interp.core.arguments import check_number, describe
from sprout_interp.core.configs import check_finite
from sprout_interp.core.errors import AttributionGraphError, NotACheckpointError, SproutError
from sprout_interp.core.files import as_path
from sprout_interp.core.loading import read_safetensors

__all__ = ["KINDS", "FINAL_NORMS", "graph_kind", "GRAPH_UNITS", "AttributionGraph", "save_graph", "load_graph", "normalized_adjacency",
           "node_influence", "PrunedGraph", "prune_graph", "keep_nodes", "graph_scores", "check_graph", "node_key"]

KINDS = ("feature", "error", "embedding", "logit")
#: how a graph's logit rows pass the final RMSNorm: its scale frozen (circuit-tracer's graph) or its Jacobian at the
#: prompt (first-order edges into the logits); ``graph.info["final_norm"]``, "frozen" in files written before it
FINAL_NORMS = ("frozen", "jacobian")
GRAPH_UNITS = ("adjacency[t, s]: the direct effect of node s's write on node t's input, in t's units (a feature's "
               "pre-activation, a logit node's logit minus the mean logit), rows = targets; layer 0-indexed (embedding "
               "nodes -1, logit nodes n_layers), block = layer + 1; pos 0-based")
_FORMAT = "sprout-interp attribution graph"
_COLUMNS = ("layer", "pos", "feature", "token_id", "activation", "logit_prob", "input", "constant", "dropped", "norm")
_OPTIONAL = {"dropped": 0.0}  # columns a file written before they existed may lack, with the value they stand for



def node_key(kind: str, layer: int, pos: int, feature: int, token_id: int) -> str:
    """A node's name that stays the same when the graph is computed again (a link keeps it): ``f{layer}.{pos}.
    {feature}`` a feature, ``e{layer}.{pos}`` an error node, ``t{pos}`` an embedding, ``l{token_id}`` a logit
    (layer 0-indexed, pos 0-based)."""
    if kind == "feature":
        return f"f{int(layer)}.{int(pos)}.{int(feature)}"
    if kind == "error":
        return f"e{int(layer)}.{int(pos)}"
    if kind == "embedding":
        return f"t{int(pos)}"
    return f"l{int(token_id)}"

@dataclass
class AttributionGraph:
    """An attribution graph (see the module docstring).

    Attributes:
        adjacency (n, n) float32: direct effects, rows = targets, columns = sources, in circuit-tracer's node order.
        nodes: one row per node: ``node``, ``kind`` (feature / error / embedding / logit), ``layer`` (-1 for
            embeddings, n_layers for logits), ``block`` (layer + 1), ``pos``, ``feature`` (-1 unless a feature),
            ``token_id`` and ``token`` (the token at ``pos``; a logit node's own token), ``activation``
            (features), ``logit_prob`` (logits), ``input`` and ``constant`` (features and logits: what the node
            reads, and the part no node writes), ``dropped`` (features and logits: the summed direct effect of the
            active features left out by ``max_feature_nodes``; 0 when none was), ``norm`` (the size of what the
            node writes; NaN for logits).
        tokens (pos,): the prompt; n_layers: the model's blocks; info: model name, bos, logit choice, transcoders.
    """

    adjacency: Float[Tensor, "n n"]
    nodes: pd.DataFrame
    tokens: Int[Tensor, " pos"]
    n_layers: int
    info: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        norm = "" if self.final_norm == "frozen" else f"; final norm: {self.final_norm}"
        norm += "; cross-layer transcoder" if self.transcoder_kind == "clt" else ""
        return (f"AttributionGraph({self.info.get('model_name') or 'model'}, {self.n_pos} positions: {self.n_features} "
                f"features, {self.n_errors} errors, {self.n_pos} embeddings, {self.n_logits} logits{norm})")

    @property
    def final_norm(self) -> str:
        """How the logit rows pass the final RMSNorm (``FINAL_NORMS``): "frozen" (its scale frozen, circuit-tracer's
        graph, exact in its replacement model) or "jacobian" (first-order edges into the logits)."""
        return self.info.get("final_norm", "frozen")

    @property
    def transcoder_kind(self) -> str:
        """Which transcoders replaced the feed-forwards (``TRANSCODER_KINDS``): "per_layer" (one per block) or "clt"
        (a cross-layer transcoder: a feature's edges sum its writes to every later layer); ``info["transcoder_kind"]``,
        "per_layer" in files written before it."""
        return self.info.get("transcoder_kind", "per_layer")

    @property
    def n_pos(self) -> int:
        return int(self.tokens.numel())

    @property
    def n_features(self) -> int:
        return int((self.nodes["kind"] == "feature").sum())

    @property
    def n_errors(self) -> int:
        return self.n_layers * self.n_pos

    @property
    def n_logits(self) -> int:
        return int((self.nodes["kind"] == "logit").sum())

    @property
    def logit_probs(self) -> Float[Tensor, " k"]:
        """The logit nodes' probabilities, in node order."""
        return torch.tensor(self.nodes["logit_prob"].values[-self.n_logits:], dtype=torch.float32)

    def max_error(self) -> float:
        """The largest ``|input - (sum of incoming edges + constant + dropped)|`` over the feature and logit nodes:
        how exact the graph is (float32 rounding only)."""
        rows = torch.tensor((self.nodes["kind"].isin(["feature", "logit"])).values)
        rest = torch.tensor(self.nodes["constant"].values)
        if "dropped" in self.nodes:
            rest = rest + torch.tensor(self.nodes["dropped"].values)
        n, step = rows.numel(), max(1, (1 << 22) // max(rows.numel(), 1))  # float64 sums, a block of rows at a time
        sums = torch.cat([self.adjacency[i:i + step].double().sum(1) for i in range(0, n, step)]) if n else rest
        got = sums[rows] + rest[rows]
        return float((torch.tensor(self.nodes["input"].values)[rows] - got).abs().max()) if bool(rows.any()) else 0.0

    def save(self, path: Union[str, Path]) -> Path:
        """Write the graph to ``path`` (a ``.safetensors`` file, reopened by :func:`load_graph`)."""
        return save_graph(self, path)


def save_graph(graph: AttributionGraph, path: Union[str, Path]) -> Path:
    """Write ``graph`` to one ``.safetensors`` file: the adjacency and the node table's numbers as float32
    tensors, the rest (kinds, token strings, info) as JSON in its metadata. Returns the path."""
    from safetensors.torch import save_file

    graph = check_graph(graph)

    p = as_path(path, "path", "a .safetensors file to write")
    if p.suffix != ".safetensors":
        raise AttributionGraphError(f"path must end in .safetensors, got {p.name!r}")
    df = graph.nodes
    tensors = {"adjacency": graph.adjacency.float().contiguous(), "tokens": graph.tokens.float()}
    tensors.update({c: torch.tensor(df[c].values if c in df else [_OPTIONAL[c]] * len(df), dtype=torch.float32)
                    for c in _COLUMNS})
    meta = {"format": _FORMAT, "version": 1, "n_layers": graph.n_layers,
            "counts": [graph.n_features, graph.n_errors, graph.n_pos, graph.n_logits],
            "tokens": list(df["token"].values[graph.n_features + graph.n_errors:graph.n_features + graph.n_errors
                                              + graph.n_pos]),
            "logit_tokens": list(df["token"].values[len(df) - graph.n_logits:]), "info": graph.info}
    p.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(p), metadata={"sprout_interp": json.dumps(meta, default=str)})
    return p


def load_graph(path: Union[str, Path]) -> AttributionGraph:
    """A graph written by :func:`save_graph`; everything is checked before it is used (sizes from the header
    before reading, finite values, whole numbers where the table has them, counts that add up).

    Raises NotAPathError for a path that is not one, AttributionGraphError for a file that is not a graph.
    """
    from safetensors import safe_open

    p = as_path(path, "path", "a .safetensors graph file")

    def bad(why: str) -> AttributionGraphError:
        return AttributionGraphError(f"{p} is not an attribution graph file ({why}): write it with "
                                     "graph.save(path) (sprout_interp.circuits.attribution_graph.save_graph)")

    def check_shapes(shapes: dict) -> None:
        want = {"adjacency", "tokens", *_COLUMNS}
        if not want - set(_OPTIONAL) <= set(shapes) <= want:
            raise bad(f"tensors {sorted(shapes)[:12]}, expected {sorted(want)}")
        n = shapes["layer"][0] if len(shapes["layer"]) == 1 else -1
        if shapes["adjacency"] != (n, n) or any(shapes[c] != (n,) for c in _COLUMNS if c in shapes) or \
                len(shapes["tokens"]) != 1:
            raise bad("the adjacency is not (n, n) for n nodes, or a column is not (n,)")

    try:
        sd = read_safetensors(p, str(p), check_shapes)
        with safe_open(str(p), "pt") as f:
            meta = json.loads((f.metadata() or {}).get("sprout_interp", "null"))
    except NotACheckpointError as e:
        raise bad(str(e).split(" (", 1)[-1][:200]) from None
    except (ValueError, RecursionError):
        raise bad("its metadata is not JSON") from None
    except SproutError as e:
        raise bad(str(e)[:200]) from None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise bad("no sprout-interp graph metadata")
    counts, L = meta.get("counts"), meta.get("n_layers")
    T = sd["tokens"].numel()
    ok = (isinstance(counts, list) and len(counts) == 4 and all(isinstance(c, int) and c >= 0 for c in counts)
          and isinstance(L, int) and 0 < L <= limits.LIMITS["n_layer"] and sum(counts) == sd["layer"].numel()
          and counts[1] == L * T and counts[2] == T and isinstance(meta.get("tokens"), list)
          and len(meta["tokens"]) == T and isinstance(meta.get("logit_tokens"), list)
          and len(meta["logit_tokens"]) == counts[3] and isinstance(meta.get("info", {}), dict))
    if not ok:
        raise bad("its node counts, layers or token lists do not add up")
    try:
        check_finite({"adjacency": sd["adjacency"], "tokens": sd["tokens"], "layer": sd["layer"]}, str(p))
    except SproutError as e:
        raise bad(str(e)[:200]) from None
    ints = {c: sd[c] for c in ("layer", "pos", "feature", "token_id")}
    ints["tokens"] = sd["tokens"]
    for c, t in ints.items():
        if not bool(torch.isfinite(t).all()) or not bool((t == t.round()).all()) or bool((t.abs() > 1 << 24).any()):
            raise bad(f"column {c!r} does not hold whole numbers")
    nF, nE, nT, nL = counts
    kinds = ["feature"] * nF + ["error"] * nE + ["embedding"] * nT + ["logit"] * nL
    pos = sd["pos"].long()
    if bool(((pos < 0) | (pos >= T)).any()):
        raise bad("a node's position is outside the prompt")
    if (meta.get("info") or {}).get("final_norm", "frozen") not in FINAL_NORMS:
        raise bad(f"its info's 'final_norm' must be one of {FINAL_NORMS}")
    if (meta.get("info") or {}).get("transcoder_kind", "per_layer") not in TRANSCODER_KINDS:
        raise bad(f"its info's 'transcoder_kind' must be one of {TRANSCODER_KINDS}")
    why = _check_values(sd, counts, L, meta.get("info") or {})
    if why:
        raise bad(why)
    toks = [str(s) for s in meta["tokens"]]
    labels = [toks[p] for p in pos[:nF + nE + nT].tolist()] + [str(s) for s in meta["logit_tokens"]]
    df = pd.DataFrame({"node": range(len(kinds)), "kind": kinds, "layer": sd["layer"].long().tolist()})
    df["block"] = df["layer"] + 1
    df["pos"], df["feature"] = pos.tolist(), sd["feature"].long().tolist()
    df["token_id"], df["token"] = sd["token_id"].long().tolist(), labels
    for c in ("activation", "logit_prob", "input", "constant", "dropped", "norm"):
        df[c] = sd[c].double().tolist() if c in sd else [_OPTIONAL[c]] * len(df)
    df.attrs["units"] = GRAPH_UNITS
    return AttributionGraph(adjacency=sd["adjacency"].float(), nodes=df, tokens=sd["tokens"].long(), n_layers=L,
                            info=dict(meta.get("info") or {}))




#: The largest |value| a graph file's edges and node values may hold. A real edge is part of a pre-activation or a
#: logit (the shipped models' are below 100); at 1e12 a row's sum of |edges| over even 2^24 nodes stays below 2e19,
#: whose square is still a finite float32, so influence and pruning never overflow.
MAX_GRAPH_VALUE = 1e12


def _check_values(sd: dict, counts: list, L: int, info: dict) -> str:
    """What is wrong with a graph file's values, each field against the range the format gives it ('' when
    nothing is). Node order: features sorted by (layer, pos, feature), errors (layer, pos), embeddings, logits."""
    nF, nE, nT, nL = counts
    n, T = sum(counts), nT
    feats, errs, embs, logits = slice(0, nF), slice(nF, nF + nE), slice(nF + nE, nF + nE + nT), slice(n - nL, n)
    layer, pos, feature = sd["layer"].long(), sd["pos"].long(), sd["feature"].long()
    tokens, token_id = sd["tokens"].long(), sd["token_id"].long()
    vocab = limits.LIMITS["vocab_size"]
    if bool(((tokens < 0) | (tokens >= vocab)).any()):
        return f"'tokens' must hold token ids 0..{vocab - 1}"
    width = info.get("d_transcoder")
    width = width if isinstance(width, int) and not isinstance(width, bool) and width > 0 else 1 << 24
    if bool(((layer[feats] < 0) | (layer[feats] >= L)).any()) or bool(((feature[feats] < 0) |
                                                                          (feature[feats] >= width)).any()):
        return f"a feature node's 'layer' must be 0..{L - 1} and its 'feature' 0..{width - 1}"
    key = (layer[feats] * T + pos[feats]) * width + feature[feats]
    if nF > 1 and not bool((key[1:] > key[:-1]).all()):
        return "feature nodes must be sorted by (layer, pos, feature), each once"
    ep = torch.arange(nE)
    if not (torch.equal(layer[errs], ep // T) and torch.equal(pos[errs], ep % T)):
        return f"error nodes must be one per (layer 0..{L - 1}, pos 0..{T - 1}), in that order"
    if not (bool((layer[embs] == -1).all()) and torch.equal(pos[embs], torch.arange(T))):
        return f"embedding nodes must have 'layer' -1 and 'pos' 0..{T - 1} in order"
    if not (bool((layer[logits] == L).all()) and bool((pos[logits] == T - 1).all())):
        return f"logit nodes must have 'layer' {L} (n_layers) and 'pos' {T - 1} (the last)"
    if bool((feature[nF:] != -1).any()):
        return "only feature nodes have a 'feature' (the others -1)"
    if not torch.equal(token_id[:nF + nE + nT], tokens[pos[:nF + nE + nT]]):
        return "'token_id' of a feature, error or embedding node must be the prompt's token at its 'pos'"
    if bool(((token_id[logits] < 0) | (token_id[logits] >= vocab)).any()) or \
            token_id[logits].unique().numel() != nL:
        return f"a logit node's 'token_id' must be a token id 0..{vocab - 1}, each once"
    prob = sd["logit_prob"][logits].double()
    if not bool(torch.isfinite(prob).all()) or bool((prob < 0).any()) or float(prob.sum()) > 1 + 1e-4:
        return "'logit_prob' of the logit nodes must be probabilities 0..1 that sum to at most 1"
    values = {"activation": (feats, None), "norm": (slice(0, n - nL), 0.0), "input": (None, None),
              "constant": (None, None), "dropped": (None, None)}
    read = torch.cat([torch.arange(nF), torch.arange(n - nL, n)])  # the nodes that read: features and logits
    for c, (rows, low) in values.items():
        if c not in sd:
            continue
        v = sd[c][read] if rows is None else sd[c][rows]
        if not bool(torch.isfinite(v).all()) or bool((v.abs() > MAX_GRAPH_VALUE).any()) or \
                (low is not None and bool((v < low).any())):
            at = "features and logits" if rows is None else "features" if c == "activation" else "all but logits"
            return (f"'{c}' of the {at} must be finite numbers in "
                    f"{'0' if low is not None else f'-{MAX_GRAPH_VALUE:g}'}..{MAX_GRAPH_VALUE:g}")
    adj = sd["adjacency"]
    if float(adj.abs().max()) > MAX_GRAPH_VALUE if adj.numel() else False:
        return f"'adjacency' must hold edges of size at most {MAX_GRAPH_VALUE:g}"
    # a direct effect goes from a node of a lower layer at an earlier or the same position into a feature or a
    # logit (the graph is acyclic): checked a block of rows at a time, without an n x n index list
    reads = torch.zeros(n, dtype=torch.bool)
    reads[read] = True
    step = max(1, (1 << 24) // max(n, 1))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        allowed = (layer[None, :] < layer[r0:r1, None]) & (pos[None, :] <= pos[r0:r1, None]) & reads[r0:r1, None]
        if bool(((adj[r0:r1] != 0) & ~allowed).any()):
            return ("'adjacency' has an edge that is not from a lower layer at an earlier or the same position into "
                    "a feature or logit node (rows = targets): a graph's edges cannot form a cycle")
    return ""


# -- influence, pruning and scores ----------------------------------------------------------------------------


def normalized_adjacency(adjacency: Float[Tensor, "n n"]) -> Float[Tensor, "n n"]:
    """``|adjacency|`` with each row scaled to sum 1 (rows that sum to 0 stay 0): each target's inputs as shares."""
    a = adjacency.abs()
    return a.div_(a.sum(dim=1, keepdim=True).clamp(min=1e-10))


def _influence(normalized: Float[Tensor, "n n"], weights: Float[Tensor, " n"], max_iter: int = 1000) -> Tensor:
    """``weights @ (N + N² + ...)``; the graph has no cycle, so the powers reach zero after its depth."""
    cur = weights @ normalized
    total = cur.clone()
    for _ in range(max_iter):
        if not bool(cur.any()):
            return total
        cur = cur @ normalized
        total += cur
    raise AttributionGraphError(f"influence did not settle after {max_iter} steps: the adjacency has a cycle, so it "
                                "is not an attribution graph")


def graph_kind(graph) -> str:
    """The kind of transcoders ``graph`` was made with ("per_layer" or "clt"; see
    :attr:`AttributionGraph.transcoder_kind`)."""
    return check_graph(graph).transcoder_kind


def check_graph(graph) -> AttributionGraph:
    """``graph`` itself when it is an :class:`AttributionGraph`; AttributionGraphError naming it otherwise."""
    if not isinstance(graph, AttributionGraph):
        raise AttributionGraphError(f"graph={describe(graph)} is not an AttributionGraph: pass what attribution_graph "
                                    "returns, or load_graph(path) of a saved one")
    return graph


def _logit_weights(graph: AttributionGraph) -> Float[Tensor, " n"]:
    w = torch.zeros(graph.adjacency.shape[0], dtype=graph.adjacency.dtype)
    if graph.n_logits:
        w[-graph.n_logits:] = graph.logit_probs.to(w.dtype)
    return w


def node_influence(graph: AttributionGraph) -> Float[Tensor, " n"]:
    """Each node's influence on the logit nodes (see the module docstring), in node order; 0 for the logits."""
    graph = check_graph(graph)
    return _influence(normalized_adjacency(graph.adjacency), _logit_weights(graph))


def _threshold(scores: Float[Tensor, " m"], fraction: float, zeros: int = 0) -> float:
    """The score at which the scores sorted from the largest first carry ``fraction`` of their total (``zeros``:
    how many more scores of 0 there are besides ``scores``)."""
    vals = scores[scores != 0]
    zeros += scores.numel() - vals.numel()
    if vals.numel() == 0:
        return 0.0
    vals = vals.sort(descending=True).values
    cum = vals.cumsum(0) / vals.sum()
    i = int(torch.searchsorted(cum, torch.tensor([fraction], dtype=cum.dtype))[0])
    if i < vals.numel():
        return float(vals[i])
    return 0.0 if zeros else float(vals[-1])


class PrunedGraph(NamedTuple):
    """What :func:`prune_graph` keeps: ``node_mask`` (n,), ``edge_mask`` (n, n) (rows = targets), and each node's
    ``cumulative_scores`` (n,): the share of the total influence carried by it and every node above it."""

    node_mask: Bool[Tensor, " n"]
    edge_mask: Bool[Tensor, "n n"]
    cumulative_scores: Float[Tensor, " n"]


def prune_graph(graph: AttributionGraph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> PrunedGraph:
    """circuit-tracer's pruning (see the module docstring): nodes carrying ``node_threshold`` of the influence
    (embeddings and logits always kept), edges among them carrying ``edge_threshold`` of the edge influence, then
    feature and error nodes left without an outgoing edge, and features without an incoming one, dropped (with
    their edges) until nothing changes. Thresholds are fractions 0..1 (AttributionGraphError otherwise)."""
    graph = check_graph(graph)
    node_threshold = check_number(node_threshold, "node_threshold", low=0.0, high=1.0, error=AttributionGraphError)
    edge_threshold = check_number(edge_threshold, "edge_threshold", low=0.0, high=1.0, error=AttributionGraphError)
    nF, keep_always = graph.n_features, graph.n_pos + graph.n_logits
    w = _logit_weights(graph)
    infl = node_influence(graph)
    node_mask = infl >= _threshold(infl, node_threshold)
    node_mask[-keep_always:] = True
    # edges among the kept nodes only (every other row and column of the pruned matrix is zero)
    kept = node_mask.nonzero()[:, 0]
    edge = graph.adjacency[kept][:, kept].abs()  # normalized, then scaled into edge scores, in place
    edge.div_(edge.sum(dim=1, keepdim=True).clamp(min=1e-10))
    edge.mul_((_influence(edge, w[kept]) + w[kept])[:, None])
    n = graph.adjacency.shape[0]
    sub = edge >= _threshold(edge.flatten(), edge_threshold, zeros=n * n - edge.numel())
    del edge
    on = node_mask[kept].clone()
    inner = kept < n - keep_always  # features and errors
    feats = kept < nF
    while True:
        before = on.clone()
        on[inner] &= sub[:, inner].any(0)  # features and errors write into something kept
        on[feats] &= sub[feats].any(1)  # features read something kept
        sub[~on] = False
        sub[:, ~on] = False
        if torch.equal(before, on):
            break
    node_mask = torch.zeros_like(node_mask)
    node_mask[kept[on]] = True
    edge_mask = torch.zeros(n, n, dtype=torch.bool)
    edge_mask[kept[:, None], kept[None, :]] = sub
    order = infl.argsort(descending=True)
    cumulative = torch.empty_like(infl)
    cumulative[order] = infl[order].cumsum(0) / infl.sum().clamp(min=1e-30)
    return PrunedGraph(node_mask, edge_mask, cumulative)


def keep_nodes(graph: AttributionGraph, pruned: PrunedGraph, keep: Iterable[int]) -> PrunedGraph:
    """``pruned`` (:func:`prune_graph` of ``graph``) with the nodes ``keep`` names (node indices) kept whatever
    their influence, as a person's pinned nodes are: each node it adds comes with its edges to and from every node
    then kept (the added ones too), those at least as strong (``|adjacency|``) as the weakest edge pruning kept
    (none where it kept no edge); ``cumulative_scores`` unchanged. AttributionGraphError for an index that is not a
    node of ``graph``."""
    graph = check_graph(graph)
    n = graph.adjacency.shape[0]
    if isinstance(keep, (str, bytes)) or not isinstance(keep, Iterable):
        raise AttributionGraphError(f"keep={describe(keep)} must be a list of node indices")
    idx = []
    for k in keep:
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= int(k) < n:
            raise AttributionGraphError(f"keep: {describe(k)} is not a node of this graph: node indices are 0..{n - 1}")
        idx.append(int(k))
    node_mask, edge_mask = pruned.node_mask.clone(), pruned.edge_mask.clone()
    extra = [i for i in dict.fromkeys(idx) if not bool(node_mask[i])]
    if not extra:
        return PrunedGraph(node_mask, edge_mask, pruned.cumulative_scores)
    add = torch.tensor(extra)
    node_mask[add] = True
    if bool(pruned.edge_mask.any()):
        weakest = graph.adjacency[pruned.edge_mask].abs().min()
        shown = node_mask.nonzero()[:, 0]
        edge_mask[add[:, None], shown[None, :]] |= graph.adjacency[add][:, shown].abs() >= weakest  # into them
        edge_mask[shown[:, None], add[None, :]] |= graph.adjacency[shown][:, add].abs() >= weakest  # out of them
        edge_mask[add, add] = False  # no edge from a node to itself
    return PrunedGraph(node_mask, edge_mask, pruned.cumulative_scores)


def graph_scores(graph: AttributionGraph) -> tuple[float, float]:
    """circuit-tracer's ``compute_graph_scores``: (replacement score, completeness score), each 0..1 (see the
    module docstring); 1 means the features explain the logits with no help from the error nodes."""
    graph = check_graph(graph)
    nF, nE, nT = graph.n_features, graph.n_errors, graph.n_pos
    errors, toks = slice(nF, nF + nE), slice(nF + nE, nF + nE + nT)
    w = _logit_weights(graph)
    normalized = normalized_adjacency(graph.adjacency)
    infl = _influence(normalized, w)
    token_infl, error_infl = infl[toks].sum(), infl[errors].sum()
    replacement = token_infl / (token_infl + error_infl)
    non_error = 1 - normalized[:, errors].sum(dim=-1)
    out = infl + w
    completeness = (non_error * out).sum() / out.sum()
    return float(replacement), float(completeness)
