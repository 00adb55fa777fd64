"""Attribution graphs in circuit-tracer's frontend JSON: written as its ``create_graph_files`` writes them, and read
back (ours, or one circuit-tracer wrote) for viewing.

The format (circuit-tracer 0.5, ``frontend/graph_models.py``): one ``<slug>.json`` per graph holding ``metadata``
(``slug``, ``scan``, ``transcoder_list``, ``prompt_tokens``, ``prompt``, ``node_threshold``, ``schema_version``),
``qParams`` (the viewer's pinned nodes, supernodes and click: ours from ``pinned`` and ``supernodes``), ``nodes``
and ``links``; beside it the folder's ``graph-metadata.json`` (``{"graphs": [metadata, ...]}``, one entry per slug)
lists the graphs its local server (``circuit_tracer.frontend.local_server``) offers. Only the nodes and edges
:func:`~sprout_interp.circuits.graphs.prune_graph` keeps are written (the same pruning as circuit-tracer's), and
among them only nodes that an edge touches, plus every embedding and logit node; and the pinned nodes and
supernodes' members, whatever the pruning, with their strong edges (:func:`~sprout_interp.circuits.graphs.keep_nodes`).

The format's quirks live here and nowhere else (our node table keeps our own conventions):

- node ids: a feature ``"{layer}_{feature}_{pos}"``, an error node ``"0_{layer}_{pos}"``, an embedding
  ``"E_{token id}_{pos}"``, a logit ``"{n_layers + 1}_{token id}_{pos}"`` (pos the last position); ``jsNodeId``
  ``"{layer}_{feature}-0"``, ``"{layer}_{pos}-0"``, ``"E_{token id}-{pos}"``, ``"L_{token id}-{pos}"``. A layer-0
  feature whose index is a block number ``b`` and block ``b``'s error node at the same position share an id in
  circuit-tracer's files (both ``"0_b_pos"``; its viewer then joins both nodes' links to the error node). There, and
  only there, :func:`save_graph_json` differs: the error node's id is ``"0_b_pos_error"``. :func:`load_graph_json`
  reads circuit-tracer's colliding ids by the graph's structure (an error node has no incoming edge, a source sits
  below its target) and counts the links it cannot decide (``GraphJSON.ambiguous_links``).
- ``layer`` is a string: ``"E"`` for embeddings, the 0-indexed layer for features and error nodes, ``n_layers + 1``
  for logits (our node table: -1 and ``n_layers``).
- ``feature_type``: ``"cross layer transcoder"`` for every feature node, whatever the transcoders (circuit-tracer
  0.5 writes that for per-layer transcoders too), ``"mlp reconstruction error"``, ``"embedding"``, ``"logit"``.
- ``feature``: the Cantor pairing ``(l + f)(l + f + 1)/2 + f`` of a feature's (layer ``l``, index ``f``); an
  embedding's position; a logit's token id; -1 for an error node.
- ``influence``: the *cumulative* influence share (the share of the whole graph's influence on the logits carried by
  this node and every node more influential than it; smaller is more influential), None for logit nodes;
  ``activation`` features only; ``token_prob`` and ``is_target_logit`` (the most probable) logits only.
- ``links``: ``source``, ``target`` (node ids) and ``weight`` = ``adjacency[target, source]``: the direct effect of
  the source on the target's input, in the target's units.
- ``clerp``, the label a viewer shows: circuit-tracer writes ``Output " ax" (p=0.312)`` for logits and nothing for the
  rest; we write a label for every node (``labels``, else ``L3 #117``, ``Err: L3 pos 5``, ``Emb: " Pl"``).

:func:`load_graph_json` checks every field (types, sizes within ``core.limits.MAX_GRAPH_JSON_BYTES``, finite weights,
links between known nodes, positions inside the prompt, the Cantor pairs) and only parses: nothing in a file is run.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
import pandas as pd

from sprout_interp.circuits.graphs import (
    MAX_GRAPH_VALUE,
    AttributionGraph,
    check_graph,
    keep_nodes,
    node_key,
    prune_graph,
)
from sprout_interp.core import limits
from sprout_interp.core.arguments import describe
from sprout_interp.core.errors import AttributionGraphError, NotACheckpointError, SproutError
from sprout_interp.core.files import as_path, read_bytes

__all__ = ["LabelsLike", "FEATURE_TYPES", "GraphJSON", "graph_json", "graph_json_files", "save_graph_json",
           "add_graph_metadata", "load_graph_json", "read_graph_json", "cantor_pair", "cantor_unpair", "default_labels"]

#: labels for the nodes: {node index or node key: text}, a Series of one per node in node order, or None
LabelsLike = Union[Mapping, pd.Series, None]
#: our node kinds as circuit-tracer's ``feature_type``
FEATURE_TYPES = {"feature": "cross layer transcoder", "error": "mlp reconstruction error", "embedding": "embedding",
                 "logit": "logit"}
_KIND_OF = {v: k for k, v in FEATURE_TYPES.items()}
_SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MAX_LABEL = 500  # characters of one label (circuit-tracer's own are a few words)
_MAX_INT = 1 << 53  # a JSON whole number beyond this is not exact in JavaScript, where the viewer reads it
_QPARAMS = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
_LOGIT_CLERP = re.compile(r'^Output "(.*)" \(p=[^)]*\)$', re.S)


def cantor_pair(x: int, y: int) -> int:
    """circuit-tracer's ``feature`` of a feature node: the Cantor pairing of (layer ``x``, feature ``y``)."""
    return (x + y) * (x + y + 1) // 2 + y


def cantor_unpair(z: int) -> tuple[int, int]:
    """The (layer, feature) whose :func:`cantor_pair` is ``z`` (``z >= 0``), computed in whole numbers."""
    w = (math.isqrt(8 * z + 1) - 1) // 2
    y = z - w * (w + 1) // 2
    return w - y, y


def default_labels(graph: AttributionGraph) -> list[str]:
    """A label per node of ``graph`` in node order: ``L3 #117`` a feature (layer 0-indexed, its index), ``Err: L3 pos
    5`` an error node, ``Emb: " Pl"`` an embedding, ``Output " ax" (p=0.312)`` a logit (circuit-tracer's own)."""
    graph = check_graph(graph)
    out = []
    for r in graph.nodes.itertuples():
        if r.kind == "feature":
            out.append(f"L{int(r.layer)} #{int(r.feature)}")
        elif r.kind == "error":
            out.append(f"Err: L{int(r.layer)} pos {int(r.pos)}")
        elif r.kind == "embedding":
            out.append(f'Emb: "{r.token}"')
        else:
            out.append(f'Output "{r.token}" (p={float(r.logit_prob):.3f})')
    return out


def _labels(graph: AttributionGraph, labels: LabelsLike) -> list[str]:
    """The default labels with ``labels`` laid over them, each checked: a mapping {node index or node key: text}
    (naming a logit node is refused), or a Series of one label per node in node order (its logit rows are left
    out). A logit node keeps circuit-tracer's own label: its viewer parses the token and probability from it."""
    out = default_labels(graph)
    if labels is None:
        return out
    nodes = graph.nodes
    if isinstance(labels, pd.Series):  # one label per node in node order, as circuits.graph_labels gives them
        if len(labels) != len(nodes) or not labels.index.equals(nodes.index):
            raise AttributionGraphError(f"labels: a Series must hold one label per node, indexed like graph.nodes "
                                        f"({len(nodes)} rows), got {len(labels)} rows")
        bad = [i for i, t in enumerate(labels.tolist()) if not isinstance(t, str) or len(t) > _MAX_LABEL]
        if bad:
            raise AttributionGraphError(f"labels: row {bad[0]} must be a str of at most {_MAX_LABEL} characters")
        logit = (nodes["kind"] == "logit").to_numpy()
        return [o if is_logit else t for o, t, is_logit in zip(out, labels.tolist(), logit)]
    if not isinstance(labels, Mapping):
        raise AttributionGraphError(f"labels={describe(labels)} must be a mapping {{node index or node key: text}} "
                                    "(node keys as node_key names them: f<layer>.<pos>.<feature>, e<layer>.<pos>, "
                                    "t<pos>, l<token id>), a Series of one label per node (circuits.graph_labels), "
                                    "or None for the default labels")
    index = {node_key(r.kind, r.layer, r.pos, r.feature, r.token_id): i for i, r in enumerate(nodes.itertuples())}
    for k, text in labels.items():
        if isinstance(k, bool) or not isinstance(k, (int, str)):
            raise AttributionGraphError(f"labels: key {describe(k)} must be a node index (int) or a node key (str)")
        i = k if isinstance(k, int) else index.get(k)
        if i is None or not 0 <= i < len(nodes):
            raise AttributionGraphError(f"labels: {k!r} is not a node of this graph: pass node indices 0..{len(nodes) - 1} "
                                        "or node keys (f<layer>.<pos>.<feature>, e<layer>.<pos>, t<pos>, l<token id>)"
                                        [:300])
        if nodes["kind"].iat[i] == "logit":
            raise AttributionGraphError(f"labels: {k!r} is a logit node, whose label stays circuit-tracer's "
                                        "'Output \"<token>\" (p=<probability>)': its viewer reads the token and the "
                                        "probability from it")
        if not isinstance(text, str) or len(text) > _MAX_LABEL:
            raise AttributionGraphError(f"labels[{k!r}] must be a str of at most {_MAX_LABEL} characters, got "
                                        f"{describe(text)}"[:300])
        out[i] = text
    return out


def _scan(graph: AttributionGraph, scan) -> str:
    if scan is None:
        info = graph.info
        kind = info.get("transcoder_kind") or info.get("kind")
        base = info.get("scan") or info.get("transcoders") or info.get("model_name")
        if not isinstance(base, str) or not base:
            raise AttributionGraphError("scan=None and the graph names no transcoders: pass scan='<name of the "
                                        "transcoders>' (circuit-tracer's metadata needs one)")
        if info.get("scan"):
            return base
        return f"{base}-{'clt' if kind == 'clt' else 'transcoders'}"
    if not isinstance(scan, str) or not scan.strip() or len(scan) > 200:
        raise AttributionGraphError(f"scan={describe(scan)} must be a non-empty str of at most 200 characters naming "
                                    "the transcoders (circuit-tracer's list form hashes the names with Python's "
                                    "per-process salt, so it is not taken)")
    return scan


def _slug(slug) -> str:
    if not isinstance(slug, str) or not _SLUG.match(slug):
        raise AttributionGraphError(f"slug={describe(slug)} must be 1 to 128 letters, digits, '.', '_' or '-', "
                                    "starting with a letter or digit (it names the file <slug>.json)")
    return slug


def graph_json(graph: AttributionGraph, slug: str, node_threshold: float = 0.8, edge_threshold: float = 0.98,
               labels: LabelsLike = None, scan: Optional[str] = None, pinned: Iterable = (),
               supernodes: Optional[Mapping] = None) -> dict:
    """The JSON object circuit-tracer's ``create_graph_files`` writes for ``graph`` pruned at these thresholds
    (see the module docstring), with every node's ``clerp`` label from ``labels`` over :func:`default_labels`:
    ``{node index or node key: text}`` (not a logit node, whose label circuit-tracer's viewer parses), or a Series
    of one label per node in node order, such as the measured labels of
    ``sprout_interp.circuits.graph_labels.graph_labels(graph, model)`` (its logit rows left out). ``scan`` (the
    transcoders' name) defaults to the graph's own. ``pinned`` (node indices or keys) and ``supernodes`` ({name:
    [node indices or keys]}) become the viewer's ``qParams`` (``pinnedIds``; ``supernodes`` as ``[name, id, ...]``)
    and their nodes are written whatever the thresholds, each with its edges to and from the nodes written at least
    as strong as the weakest edge pruning kept (:func:`~sprout_interp.circuits.graphs.keep_nodes`: the nodes and
    links the graph page draws with those pins; circuit-tracer's own ``create_graph_files`` writes no pins)."""
    graph = check_graph(graph)
    slug = _slug(slug)
    scan = _scan(graph, scan)
    pins, groups = _pins(graph, pinned, supernodes)
    held = list(dict.fromkeys(pins + [i for _, members in groups for i in members]))
    # the pinned nodes and the supernodes' members kept whatever the thresholds, with their strong edges, as the
    # page draws them (plots.graph.graph_tables); circuit-tracer's create_graph_files has no pins (pinnedIds [])
    pruned = keep_nodes(graph, prune_graph(graph, node_threshold, edge_threshold), held)
    text = _labels(graph, labels)
    df = graph.nodes
    L, T = graph.n_layers, graph.n_pos
    first_logit = len(df) - graph.n_logits
    kind, layer, pos = df["kind"].to_numpy(), df["layer"].to_numpy(), df["pos"].to_numpy()
    feature, token_id = df["feature"].to_numpy(), df["token_id"].to_numpy()
    activation, prob = df["activation"].to_numpy(), df["logit_prob"].to_numpy()
    cum = pruned.cumulative_scores.float().tolist()  # float32 values, as circuit-tracer's tensors give them
    nodes = {}
    for i in pruned.node_mask.nonzero()[:, 0].tolist():
        k, ly, p = kind[i], int(layer[i]), int(pos[i])
        if k == "feature":
            f = int(feature[i])
            node = dict(node_id=f"{ly}_{f}_{p}", feature=cantor_pair(ly, f), layer=str(ly), ctx_idx=p,
                        js=f"{ly}_{f}-0", influence=cum[i], activation=_float32(activation[i]))
        elif k == "error":
            node = dict(node_id=f"0_{ly}_{p}", feature=-1, layer=str(ly), ctx_idx=p, js=f"{ly}_{p}-0",
                        influence=cum[i], activation=None)
        elif k == "embedding":
            t = int(token_id[i])
            node = dict(node_id=f"E_{t}_{p}", feature=p, layer="E", ctx_idx=p, js=f"E_{t}-{p}", influence=cum[i],
                        activation=None)
        else:
            t, pp = int(token_id[i]), _float32(prob[i])
            node = dict(node_id=f"{L + 1}_{t}_{T - 1}", feature=t, layer=str(L + 1), ctx_idx=T - 1,
                        js=f"L_{t}-{T - 1}", influence=None, activation=None, token_prob=pp,
                        is_target_logit=i == first_logit)
        nodes[i] = {"node_id": node["node_id"], "feature": node["feature"], "layer": node["layer"],
                    "ctx_idx": node["ctx_idx"], "feature_type": FEATURE_TYPES[k],
                    "token_prob": node.get("token_prob", 0.0), "is_target_logit": node.get("is_target_logit", False),
                    "run_idx": 0, "reverse_ctx_idx": 0, "jsNodeId": node["js"], "clerp": text[i],
                    "influence": node["influence"], "activation": node["activation"]}
    feature_ids = {n["node_id"] for n in nodes.values() if n["feature_type"] == FEATURE_TYPES["feature"]}
    for n in nodes.values():  # circuit-tracer's ids collide where a layer-0 feature numbered b sits at block b's
        # error node's position (both "0_b_pos"); its viewer then joins both nodes' links to the error node
        if n["feature_type"] == FEATURE_TYPES["error"] and n["node_id"] in feature_ids:
            n["node_id"] += "_error"
    dst, src = pruned.edge_mask.nonzero(as_tuple=True)  # row-major: by target, then source, as numpy's nonzero
    weights = graph.adjacency[dst, src].float().tolist()
    links = [{"source": nodes[s]["node_id"], "target": nodes[d]["node_id"], "weight": w}
             for s, d, w in zip(src.tolist(), dst.tolist(), weights) if s in nodes and d in nodes]
    touched = {e["source"] for e in links} | {e["target"] for e in links}
    held_ids = {nodes[i]["node_id"] for i in held}
    used = [n for n in nodes.values() if n["node_id"] in touched or n["node_id"] in held_ids
            or n["feature_type"] in ("embedding", "logit")]
    tokens = [str(t) for t in df["token"].to_numpy()[graph.n_features + graph.n_errors:
                                                      graph.n_features + graph.n_errors + T]]
    meta = {"slug": slug, "scan": scan, "transcoder_list": [], "prompt_tokens": tokens, "prompt": "".join(tokens),
            "node_threshold": float(node_threshold), "schema_version": 1}
    written = {n["node_id"] for n in used}
    id_of = {i: n["node_id"] for i, n in nodes.items() if n["node_id"] in written}
    qparams = dict(_QPARAMS, pinnedIds=[id_of[i] for i in pins if i in id_of],
                   supernodes=[[name] + [id_of[i] for i in members if i in id_of] for name, members in groups
                               if any(i in id_of for i in members)])
    return {"metadata": meta, "qParams": qparams, "nodes": used, "links": links}


def _pins(graph: AttributionGraph, pinned, supernodes) -> tuple[list[int], list[tuple[str, list[int]]]]:
    """``pinned`` and ``supernodes`` as node indices, each node named by its index or its key (checked)."""
    nodes = graph.nodes
    index = None

    def one(k, what: str) -> int:
        nonlocal index
        if isinstance(k, str):
            if index is None:
                index = {node_key(r.kind, r.layer, r.pos, r.feature, r.token_id): i
                         for i, r in enumerate(nodes.itertuples())}
            i = index.get(k)
        else:
            i = k if isinstance(k, int) and not isinstance(k, bool) else None
        if i is None or not 0 <= i < len(nodes):
            raise AttributionGraphError(f"{what}: {describe(k)} is not a node of this graph: pass node indices "
                                        f"0..{len(nodes) - 1} or node keys (f<layer>.<pos>.<feature>, e<layer>.<pos>, "
                                        "t<pos>, l<token id>)"[:300])
        return i

    if isinstance(pinned, (str, bytes)) or not isinstance(pinned, Iterable):
        raise AttributionGraphError(f"pinned={describe(pinned)} must be a list of node indices or node keys")
    pins = list(dict.fromkeys(one(k, "pinned") for k in pinned))
    groups = []
    if supernodes is not None:
        if not isinstance(supernodes, Mapping):
            raise AttributionGraphError(f"supernodes={describe(supernodes)} must be a mapping {{name: [node indices "
                                        "or keys]}}")
        for name, members in supernodes.items():
            if not isinstance(name, str) or not name or len(name) > _MAX_LABEL:
                raise AttributionGraphError(f"supernodes: name {describe(name)} must be a str of 1 to {_MAX_LABEL} "
                                            "characters")
            if isinstance(members, (str, bytes)) or not isinstance(members, Iterable):
                raise AttributionGraphError(f"supernodes[{name!r}] must be a list of node indices or keys")
            groups.append((name, list(dict.fromkeys(one(k, f"supernodes[{name!r}]") for k in members))))
    return pins, groups


def _float32(v) -> float:
    """A float32 value as the Python float circuit-tracer's ``.item()`` gives."""
    return float(np.float32(v))


def graph_json_files(graph: AttributionGraph, slug: str, node_threshold: float = 0.8, edge_threshold: float = 0.98,
                     labels: LabelsLike = None, scan: Optional[str] = None, pinned: Iterable = (),
                     supernodes: Optional[Mapping] = None) -> dict[str, bytes]:
    """A folder circuit-tracer's local server serves, as ``{file name: bytes}``: ``<slug>.json`` (:func:`graph_json`,
    the bytes :func:`save_graph_json` writes) and a ``graph-metadata.json`` listing that graph alone (for a
    download: unpack it and serve the folder)."""
    obj = graph_json(graph, slug, node_threshold, edge_threshold, labels, scan, pinned, supernodes)
    return {f"{obj['metadata']['slug']}.json": _dumps(obj),
            "graph-metadata.json": json.dumps({"graphs": [obj["metadata"]]}, indent=2).encode("utf-8")}


def _dumps(obj: dict) -> bytes:
    return json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False).encode("utf-8")


def save_graph_json(graph: AttributionGraph, folder: Union[str, Path], slug: str, node_threshold: float = 0.8,
                    edge_threshold: float = 0.98, labels: LabelsLike = None, scan: Optional[str] = None,
                    pinned: Iterable = (), supernodes: Optional[Mapping] = None) -> Path:
    """Write :func:`graph_json` to ``<folder>/<slug>.json`` and add its metadata to the folder's
    ``graph-metadata.json`` (:func:`add_graph_metadata`), as circuit-tracer's ``create_graph_files`` does; the
    folder is made if missing. Serve it with ``circuit_tracer.frontend.local_server.serve(folder)``, or reopen it
    with :func:`load_graph_json`. Returns the JSON file's path."""
    obj = graph_json(graph, slug, node_threshold, edge_threshold, labels, scan, pinned, supernodes)
    d = as_path(folder, "folder", "a folder for the graph's JSON files")
    if d.exists() and not d.is_dir():
        raise AttributionGraphError(f"folder={str(d)!r} is a file, not a folder: pass a folder for <slug>.json and "
                                    "graph-metadata.json")
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{obj['metadata']['slug']}.json"
    path.write_bytes(_dumps(obj))
    add_graph_metadata(obj["metadata"], d)
    return path


def add_graph_metadata(metadata: dict, folder: Union[str, Path]) -> Path:
    """circuit-tracer's ``add_graph_metadata``: ``metadata`` replaces the entry of its slug in the folder's
    ``graph-metadata.json`` (``{"graphs": [...]}``, made when missing; the others kept in order). A file there that
    is not such a list is refused, not overwritten. Returns its path."""
    d = as_path(folder, "folder", "a folder of graph JSON files")
    p = d / "graph-metadata.json"
    if p.exists():
        try:
            old = json.loads(read_bytes(p, limits.MAX_GRAPH_JSON_BYTES, "graph-metadata.json").decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            old = None
        except SproutError as e:
            raise AttributionGraphError(f"{p} cannot be read: {str(e)[:200]}") from None
        if not (isinstance(old, dict) and isinstance(old.get("graphs"), list)
                and all(isinstance(g, dict) for g in old["graphs"])):
            raise AttributionGraphError(f"{p} is not circuit-tracer's graph list ({{\"graphs\": [...]}}): move it "
                                        "away or choose another folder")
    else:
        old = {"graphs": []}
    old["graphs"] = [g for g in old["graphs"] if g.get("slug") != metadata["slug"]] + [metadata]
    p.write_text(json.dumps(old, indent=2), encoding="utf-8")
    return p


# -- reading ------------------------------------------------------------------------------------------------------


@dataclass
class GraphJSON:
    """A graph read from circuit-tracer's JSON (:func:`load_graph_json`): what the graph page draws.

    Attributes:
        nodes: one row per node in the file's order: ``node`` (the row's index, what ``links`` name), ``key``
            (:func:`~sprout_interp.circuits.graphs.node_key`), ``kind`` (feature / error / embedding / logit),
            ``layer`` (0-indexed; -1 embeddings, ``n_layers`` logits), ``block`` (layer + 1), ``pos`` (0-based),
            ``feature`` (the transcoder feature's index; -1 unless a feature), ``token_id`` (the embedding's or the
            logit's token; a feature's or error node's the embedding's at its position; -1 when the file does not
            say), ``token``, ``label`` (the file's ``clerp``), ``cumulative_influence`` (the file's ``influence``:
            the share of the influence carried by this node and every more influential one; NaN for logits),
            ``activation`` (features; NaN otherwise), ``logit_prob`` (logits; NaN otherwise), ``is_target_logit``,
            ``node_id`` and ``js_node_id`` (circuit-tracer's ids).
        links: ``source``, ``target`` (``node`` numbers), ``weight`` (the direct effect of the source on the target's
            input), ``source_id``, ``target_id`` (the file's ids), in the file's order.
        metadata, qparams: the file's ``metadata`` and ``qParams``; prompt_tokens: the prompt's tokens; n_layers:
            the model's blocks (the logits' layer - 1).
        ambiguous_links: links whose end the file does not decide (circuit-tracer's colliding ids, where a layer-0
            feature and an error node share one and either could be the source): joined to the later node, as its
            viewer does; 0 in files ``save_graph_json`` writes.
    """

    nodes: pd.DataFrame
    links: pd.DataFrame
    metadata: dict
    qparams: dict
    prompt_tokens: list
    n_layers: int
    ambiguous_links: int = 0

    @property
    def slug(self) -> str:
        return self.metadata["slug"]

    @property
    def n_pos(self) -> int:
        return len(self.prompt_tokens)

    @property
    def pinned(self) -> list[str]:
        """The file's pinned nodes (``qParams.pinnedIds``) as node keys, in the file's order (an id the file's
        nodes do not hold is left out; a colliding id names the later node, as circuit-tracer's viewer reads it)."""
        key_of = dict(zip(self.nodes["node_id"], self.nodes["key"]))
        return [key_of[i] for i in dict.fromkeys(self.qparams["pinnedIds"]) if i in key_of]

    def __repr__(self) -> str:
        counts = self.nodes["kind"].value_counts()
        return (f"GraphJSON({self.slug!r}, scan {self.metadata['scan']!r}, {self.n_pos} positions, {self.n_layers} "
                f"blocks: {int(counts.get('feature', 0))} features, {int(counts.get('error', 0))} errors, "
                f"{int(counts.get('embedding', 0))} embeddings, {int(counts.get('logit', 0))} logits, "
                f"{len(self.links)} links" + (f", {self.ambiguous_links} of them ambiguous" if self.ambiguous_links
                                              else "") + ")")


def load_graph_json(path: Union[str, Path]) -> GraphJSON:
    """A graph in circuit-tracer's frontend JSON (``<slug>.json``, ours from :func:`save_graph_json` or one its
    ``create_graph_files`` wrote), every field checked (see :func:`read_graph_json`).

    Raises NotAPathError for a path that is not one, CheckpointNotFoundError when nothing is there,
    AttributionGraphError naming the field for a file that is not such a graph."""
    p = as_path(path, "path", "a circuit-tracer graph .json file")
    try:
        data = read_bytes(p, limits.MAX_GRAPH_JSON_BYTES, "circuit-tracer graph .json")
    except NotACheckpointError as e:  # too large, or not a regular file
        raise AttributionGraphError(f"{p} is not a circuit-tracer graph file: {str(e)[:300]}") from None
    return read_graph_json(data, str(p))


def read_graph_json(data: bytes, name: str = "the graph file") -> GraphJSON:
    """:func:`load_graph_json` of the file's bytes (an upload): at most ``core.limits.MAX_GRAPH_JSON_BYTES``, UTF-8
    JSON, every field of circuit-tracer's ``Model`` present with its type (``metadata``, ``qParams``, ``nodes``:
    ``node_id``, ``feature``, ``layer``, ``ctx_idx``, ``feature_type``, ``jsNodeId`` … ; ``links``: ``source``,
    ``target``, ``weight``), ids unique, links between known nodes with finite weights of size at most
    ``MAX_GRAPH_VALUE``, positions inside the prompt, layers inside the model. AttributionGraphError names the first
    field that is wrong. Only parsed: nothing in the file is run."""
    if not isinstance(data, (bytes, bytearray)):
        raise AttributionGraphError(f"data={describe(data)} must be the file's bytes")
    if not isinstance(name, str):
        name = "the graph file"
    where = name[:200]

    def bad(field_: str, why: str) -> AttributionGraphError:
        return AttributionGraphError(f"{where} is not a circuit-tracer graph file: {field_} {why}"[:600])

    if len(data) > limits.MAX_GRAPH_JSON_BYTES:
        raise bad("the file", f"is {len(data):,} bytes, more than {limits.MAX_GRAPH_JSON_BYTES:,} "
                              "(sprout_interp.core.limits.MAX_GRAPH_JSON_BYTES)")
    try:
        obj = json.loads(bytes(data).decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise bad("the file", "is not UTF-8 text") from None
    except RecursionError:
        raise bad("the file", "is JSON nested too deeply") from None
    except ValueError as e:
        raise bad("the file", f"is not JSON ({str(e)[:120]})") from None
    return _parse(obj, bad)


def _no_constant(word: str):
    raise ValueError(f"{word} is not a JSON number")


def _parse(obj, bad) -> GraphJSON:
    def need(d: dict, key: str, kinds, at: str, default=..., none: bool = False):
        if key not in d:
            if default is not ...:
                return default
            raise bad(f"{at}{key}", "is missing")
        v = d[key]
        if v is None and none:
            return None
        ok = isinstance(v, kinds) and not (isinstance(v, bool) and bool not in _tuple(kinds))
        if not ok:
            raise bad(f"{at}{key}", f"must be {_names(kinds)}{' or null' if none else ''}, got {describe(v)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise bad(f"{at}{key}", "must be a finite number")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > _MAX_INT:
            raise bad(f"{at}{key}", f"must be at most {_MAX_INT} in size")
        if isinstance(v, str) and len(v) > 10_000:
            raise bad(f"{at}{key}", "is longer than 10,000 characters")
        return v

    if not isinstance(obj, dict):
        raise bad("the file", f"must hold a JSON object, got {describe(obj)}")
    meta = need(obj, "metadata", dict, "")
    qp = need(obj, "qParams", dict, "")
    nodes_in = need(obj, "nodes", list, "")
    links_in = need(obj, "links", list, "")
    md = {}
    for key, kinds in (("slug", str), ("scan", str), ("prompt", str)):
        md[key] = need(meta, key, kinds, "metadata.")
    for key in ("transcoder_list", "prompt_tokens"):
        v = need(meta, key, list, "metadata.")
        if not all(isinstance(s, str) and len(s) <= 10_000 for s in v):
            raise bad(f"metadata.{key}", "must be a list of strings")
        md[key] = list(v)
    thr = need(meta, "node_threshold", (int, float), "metadata.", None, none=True)
    if thr is not None and not 0 <= thr <= 1:
        raise bad("metadata.node_threshold", f"must be 0..1, got {thr}")
    md["node_threshold"] = thr
    md["schema_version"] = need(meta, "schema_version", int, "metadata.", 1, none=True)
    tokens = md["prompt_tokens"]
    T = len(tokens)
    if not 0 < T <= limits.LIMITS["context"]:
        raise bad("metadata.prompt_tokens", f"must hold 1..{limits.LIMITS['context']} tokens, got {T}")
    qparams = {}
    for key in ("pinnedIds", "supernodes", "linkType", "clickedId", "sg_pos"):
        v = need(qp, key, list if key in ("pinnedIds", "supernodes") else str, "qParams.")
        if key == "pinnedIds" and not all(isinstance(s, str) for s in v):
            raise bad("qParams.pinnedIds", "must be a list of strings")
        if key == "supernodes" and not all(isinstance(g, list) and all(isinstance(s, str) for s in g) for g in v):
            raise bad("qParams.supernodes", "must be a list of lists of strings")
        qparams[key] = v
    max_nodes = limits.MAX_GRAPH_JSON_BYTES // 64  # a node takes well over 64 bytes of JSON
    if len(nodes_in) > max_nodes or len(links_in) > limits.MAX_GRAPH_JSON_BYTES // 16:
        raise bad("nodes", "or links are more than the file's size allows")
    rows = []
    for i, n in enumerate(nodes_in):
        at = f"nodes[{i}]."
        if not isinstance(n, dict):
            raise bad(f"nodes[{i}]", f"must be an object, got {describe(n)}")
        nid = need(n, "node_id", str, at)
        ftype = need(n, "feature_type", str, at)
        if ftype not in _KIND_OF:
            raise bad(f"{at}feature_type", f"must be one of {sorted(_KIND_OF)}, got {ftype[:60]!r}")
        kind = _KIND_OF[ftype]
        feat = need(n, "feature", int, at)
        layer_s = need(n, "layer", str, at)
        ctx = need(n, "ctx_idx", int, at)
        js = need(n, "jsNodeId", str, at, nid)
        clerp = need(n, "clerp", str, at, "")
        prob = need(n, "token_prob", (int, float), at, 0.0)
        target = need(n, "is_target_logit", bool, at, False)
        need(n, "run_idx", int, at, 0)
        need(n, "reverse_ctx_idx", int, at, 0)
        infl = need(n, "influence", (int, float), at, None, none=True)
        act = need(n, "activation", (int, float), at, None, none=True)
        if not nid or len(nid) > 200:
            raise bad(f"{at}node_id", "must be 1..200 characters")
        if not 0 <= ctx < T:
            raise bad(f"{at}ctx_idx", f"must be a position 0..{T - 1} of the prompt, got {ctx}")
        if not 0 <= prob <= 1:
            raise bad(f"{at}token_prob", f"must be a probability 0..1, got {prob}")
        if infl is not None and abs(infl) > MAX_GRAPH_VALUE or act is not None and abs(act) > MAX_GRAPH_VALUE:
            raise bad(f"{at}influence", f"and activation must be at most {MAX_GRAPH_VALUE:g} in size")
        if kind == "embedding":
            if layer_s != "E":
                raise bad(f"{at}layer", f"of an embedding node must be 'E', got {layer_s[:20]!r}")
            layer = -1
        else:
            if not re.fullmatch(r"0|[1-9][0-9]{0,5}", layer_s):
                raise bad(f"{at}layer", f"must be a whole number as a string (or 'E' for an embedding), got "
                                        f"{layer_s[:20]!r}")
            layer = int(layer_s)
        index, token_id = -1, -1
        if kind == "feature":
            if feat < 0:
                raise bad(f"{at}feature", f"of a feature node must be the Cantor pair of (layer, index) >= 0, got {feat}")
            fl, index = cantor_unpair(feat)
            if fl != layer:
                raise bad(f"{at}feature", f"{feat} pairs layer {fl} with feature {index}, but the node's layer is "
                                          f"{layer}")
        elif kind == "embedding":
            m = re.fullmatch(r"E_([0-9]{1,9})_([0-9]{1,9})", nid)
            token_id = int(m.group(1)) if m and int(m.group(2)) == ctx else -1
        elif kind == "logit":
            if feat < 0:  # a token id, or circuit-tracer's virtual index (vocabulary size + i) of a custom target
                raise bad(f"{at}feature", f"of a logit node must be its token id >= 0, got {feat}")
            token_id = feat
        rows.append(dict(kind=kind, layer=layer, pos=ctx, feature=index, token_id=token_id, label=clerp,
                         cumulative_influence=math.nan if infl is None else float(infl),
                         activation=math.nan if act is None or kind != "feature" else float(act),
                         logit_prob=float(prob) if kind == "logit" else math.nan, is_target_logit=target,
                         node_id=nid, js_node_id=js))
    ids: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        ids.setdefault(r["node_id"], []).append(i)
    for nid, at_ in ids.items():
        if len(at_) > 1 and not _known_collision([rows[i] for i in at_]):
            raise bad(f"nodes[{at_[1]}].node_id", f"{nid[:60]!r} is also nodes[{at_[0]}]'s: each node needs an id "
                                                  "of its own (only circuit-tracer's collision of a layer-0 feature "
                                                  "numbered b with block b's error node at the same position is read)")
    logit_layers = {r["layer"] for r in rows if r["kind"] == "logit"}
    if len(logit_layers) > 1:
        raise bad("nodes", f"has logit nodes in several layers ({sorted(logit_layers)[:4]}): they all sit above the "
                           "last block")
    inner = [r["layer"] for r in rows if r["kind"] in ("feature", "error")]
    L = logit_layers.pop() - 1 if logit_layers else (max(inner) + 1 if inner else 1)
    if not 0 < L <= limits.LIMITS["n_layer"]:
        raise bad("nodes", f"imply {L} blocks (the logits' layer - 1): a model has 1..{limits.LIMITS['n_layer']}")
    for i, r in enumerate(rows):
        if r["kind"] in ("feature", "error") and not 0 <= r["layer"] < L:
            raise bad(f"nodes[{i}].layer", f"must be 0..{L - 1} (the logits sit at layer {L + 1}), got {r['layer']}")
        if r["kind"] == "logit":
            r["layer"] = L
    emb = {r["pos"]: r["token_id"] for r in rows if r["kind"] == "embedding"}
    for r in rows:
        if r["kind"] in ("feature", "error"):
            r["token_id"] = emb.get(r["pos"], -1)
        if r["kind"] == "logit":
            m = _LOGIT_CLERP.match(r["label"])
            r["token"] = m.group(1) if m else ""
        else:
            r["token"] = tokens[r["pos"]]
    links, ambiguous = [], 0
    for j, e in enumerate(links_in):
        at = f"links[{j}]."
        if not isinstance(e, dict):
            raise bad(f"links[{j}]", f"must be an object, got {describe(e)}")
        s, t = need(e, "source", str, at), need(e, "target", str, at)
        w = need(e, "weight", (int, float), at)
        for key, v in (("source", s), ("target", t)):
            if v not in ids:
                raise bad(f"{at}{key}", f"{v[:60]!r} is not a node of the file")
        if abs(w) > MAX_GRAPH_VALUE:
            raise bad(f"{at}weight", f"must be at most {MAX_GRAPH_VALUE:g} in size, got {w:g}")
        ti, t_sure = _resolve(ids[t], rows, None)
        si_, s_sure = _resolve(ids[s], rows, rows[ti])
        ambiguous += not (t_sure and s_sure)
        links.append((si_, ti, float(w), s, t))
    nodes = pd.DataFrame(rows, columns=["kind", "layer", "pos", "feature", "token_id", "token", "label",
                                        "cumulative_influence", "activation", "logit_prob", "is_target_logit",
                                        "node_id", "js_node_id"])
    nodes.insert(0, "node", range(len(nodes)))
    nodes.insert(2, "key", [node_key(r.kind, r.layer, r.pos, r.feature, r.token_id) for r in nodes.itertuples()])
    nodes.insert(4, "block", nodes["layer"] + 1)
    dup = nodes["key"].duplicated(keep=False)
    if dup.any():
        i, j = nodes.index[dup][:2]
        raise bad(f"nodes[{j}]", f"is the same node as nodes[{i}] ({nodes['key'][i]}: kind, layer, position and "
                                 "feature): each node once")
    links_df = pd.DataFrame(links, columns=["source", "target", "weight", "source_id", "target_id"])
    return GraphJSON(nodes=nodes, links=links_df, metadata=md, qparams=qparams, prompt_tokens=list(tokens),
                     n_layers=L, ambiguous_links=ambiguous)


def _known_collision(rows: list[dict]) -> bool:
    """Whether nodes sharing one id are circuit-tracer's collision: a layer-0 feature numbered ``b`` and block ``b``'s
    error node at the same position (both ``"0_b_pos"``)."""
    if len(rows) != 2:
        return False
    f, e = sorted(rows, key=lambda r: r["kind"] != "feature")
    return (f["kind"] == "feature" and e["kind"] == "error" and f["layer"] == 0 and f["feature"] == e["layer"]
            and f["pos"] == e["pos"])


def _resolve(candidates: list[int], rows: list[dict], target: Optional[dict]) -> tuple[int, bool]:
    """The node a link's id names, and whether the graph's structure decides it: an error node has no incoming edge
    (so a target is the feature), and a source sits at a lower layer and an earlier or the same position than its
    target. Undecided (both could be the source): the later node in the file, as circuit-tracer's viewer reads it."""
    if len(candidates) == 1:
        return candidates[0], True
    if target is None:
        fit = [i for i in candidates if rows[i]["kind"] in ("feature", "logit")]
    else:
        fit = [i for i in candidates if rows[i]["layer"] < target["layer"] and rows[i]["pos"] <= target["pos"]]
    return (fit[0], True) if len(fit) == 1 else (candidates[-1], False)


def _tuple(kinds) -> tuple:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _names(kinds) -> str:
    words = {str: "a string", int: "a whole number", float: "a number", bool: "true or false", dict: "an object",
             list: "a list"}
    ks = _tuple(kinds)
    return "a number" if set(ks) == {int, float} else " or ".join(words[k] for k in ks)

