"""Attribution graphs in circuit-tracer's frontend JSON (sprout_interp.circuits.graph_json): the file's fields against
the graph they come from (node ids, Cantor pairs, layer strings, link weights read off the adjacency by hand), a round
trip through load_graph_json against the pruned tables the page draws, the folder's graph-metadata.json, labels, and
what is refused (bad arguments, hostile files). Tiny random models with random transcoders, with and without the
<|endoftext|> position. circuit-tracer's own reading of these files: tests/circuits/test_graph_json_circuit_tracer.py."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from conftest import tiny_config

import sprout_interp as si
from sprout_interp.circuits.attribution_graph import attribution_graph
from sprout_interp.circuits.graph_json import (
    FEATURE_TYPES,
    cantor_pair,
    cantor_unpair,
    graph_json,
    load_graph_json,
    read_graph_json,
    save_graph_json,
)
from sprout_interp.circuits.graphs import keep_nodes, node_influence, node_key, prune_graph
from sprout_interp.circuits.local_replacement import random_transcoders
from sprout_interp.core import limits
from sprout_interp.core.errors import AttributionGraphError, CheckpointNotFoundError, NotAPathError
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.plots.graph import graph_tables
from sprout_model import GPT

pytestmark = pytest.mark.unit

NODE_THR = 0.99  # the tiny graphs keep features at this threshold (at 0.8 only tokens and logits carry enough)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedSprout(GPT(tiny_config(n_layer=3)).eval(), name="tiny")


@pytest.fixture(scope="module", params=[True, False], ids=["bos", "nobos"])
def graph(request, model):
    ts = random_transcoders(model, k=4, d_transcoder=48, seed=1)
    tokens = torch.randint(1, 64, (12,), generator=torch.Generator().manual_seed(3))
    return attribution_graph(model, tokens, ts, bos=request.param, batch_size=7)


def _row(g, kind, **where):
    df = g.nodes[g.nodes["kind"] == kind]
    for c, v in where.items():
        df = df[df[c] == v]
    assert len(df) == 1
    return df.iloc[0]


def test_the_file_is_circuit_tracers_layout_of_the_pruned_graph(graph, tmp_path):
    g = graph
    p = save_graph_json(g, tmp_path, "tiny-graph", node_threshold=NODE_THR)
    assert p == tmp_path / "tiny-graph.json"
    obj = json.loads(p.read_text(encoding="utf-8"))
    assert list(obj) == ["metadata", "qParams", "nodes", "links"]
    T, L = g.n_pos, g.n_layers
    tokens = [f"#{int(t)}" for t in g.tokens]  # an ids-only model's token labels
    assert obj["metadata"] == {"slug": "tiny-graph", "scan": "tiny-transcoders", "transcoder_list": [],
                               "prompt_tokens": tokens, "prompt": "".join(tokens), "node_threshold": NODE_THR,
                               "schema_version": 1}
    assert obj["qParams"] == {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    nodes = {n["node_id"]: n for n in obj["nodes"]}
    assert len(nodes) == len(obj["nodes"])
    kinds = {n["feature_type"] for n in obj["nodes"]}
    assert kinds == set(FEATURE_TYPES.values())  # features, errors, embeddings and logits all kept at 0.99
    n_logit = 0
    for n in obj["nodes"]:
        assert list(n) == ["node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob", "is_target_logit",
                           "run_idx", "reverse_ctx_idx", "jsNodeId", "clerp", "influence", "activation"]
        ly, pos = n["layer"], n["ctx_idx"]
        if n["feature_type"] == "cross layer transcoder":
            layer, f = cantor_unpair(n["feature"])
            assert n["node_id"] == f"{layer}_{f}_{pos}" and ly == str(layer) and n["jsNodeId"] == f"{layer}_{f}-0"
            r = _row(g, "feature", layer=layer, pos=pos, feature=f)
            assert n["activation"] == float(np.float32(r["activation"])) and n["clerp"] == f"L{layer} #{f}"
            assert not (g.info["bos"] and pos == 0)  # position 0 has no features with <|endoftext|> there
        elif n["feature_type"] == "mlp reconstruction error":
            assert n["node_id"] == f"0_{ly}_{pos}" and n["feature"] == -1 and n["jsNodeId"] == f"{ly}_{pos}-0"
            assert 0 <= int(ly) < L and n["activation"] is None and n["clerp"] == f"Err: L{ly} pos {pos}"
        elif n["feature_type"] == "embedding":
            t = int(g.tokens[pos])
            assert n["node_id"] == f"E_{t}_{pos}" and ly == "E" and n["feature"] == pos
            assert n["jsNodeId"] == f"E_{t}-{pos}" and n["clerp"] == f'Emb: "#{t}"'
        else:
            r = _row(g, "logit", token_id=n["feature"])
            t, prob = n["feature"], float(np.float32(r["logit_prob"]))
            assert n["node_id"] == f"{L + 1}_{t}_{T - 1}" and ly == str(L + 1) and pos == T - 1
            assert n["jsNodeId"] == f"L_{t}-{T - 1}" and n["token_prob"] == prob and n["influence"] is None
            assert n["clerp"] == f'Output "#{t}" (p={prob:.3f})'
            assert n["is_target_logit"] == (r["node"] == g.n_features + g.n_errors + T)  # the most probable only
            n_logit += 1
        if n["feature_type"] != "logit":
            assert 0 < n["influence"] <= 1 + 1e-6 and n["token_prob"] == 0 and not n["is_target_logit"]
    assert n_logit == g.n_logits and sum(n["feature_type"] == "embedding" for n in obj["nodes"]) == T
    # each link's weight read off the adjacency by hand: rows = targets, columns = sources
    index = {}
    for r in g.nodes.itertuples():
        nid = {"feature": f"{r.layer}_{r.feature}_{r.pos}", "error": f"0_{r.layer}_{r.pos}",
               "embedding": f"E_{r.token_id}_{r.pos}", "logit": f"{L + 1}_{r.token_id}_{T - 1}"}[r.kind]
        index.setdefault(nid, r.node)
    assert obj["links"] and all(set(e) == {"source", "target", "weight"} for e in obj["links"])
    for e in obj["links"]:
        assert e["weight"] == float(g.adjacency[index[e["target"]], index[e["source"]]]) != 0
    pairs = [(index[e["target"]], index[e["source"]]) for e in obj["links"]]
    assert pairs == sorted(pairs)  # by target, then source: numpy's nonzero order, as circuit-tracer writes them
    touched = {e["source"] for e in obj["links"]} | {e["target"] for e in obj["links"]}
    assert all(nid in touched for nid, n in nodes.items() if n["feature_type"] not in ("embedding", "logit"))


def test_a_round_trip_gives_the_pruned_tables_the_page_draws(graph, tmp_path):
    g = graph
    labels = {0: "the first feature's own label", "t1": 'a token "quoted" ⏎', f"e{g.n_layers - 1}.{g.n_pos - 1}":
              "the last error node"}
    p = save_graph_json(g, tmp_path, "rt", node_threshold=NODE_THR, edge_threshold=0.97, labels=labels)
    back = load_graph_json(p)
    nodes, edges = graph_tables(g, NODE_THR, 0.97)
    assert back.n_layers == g.n_layers and back.prompt_tokens == [f"#{int(t)}" for t in g.tokens]
    assert back.slug == "rt" and back.metadata["node_threshold"] == NODE_THR
    assert list(back.nodes["key"]) == list(nodes["key"])  # the same nodes, in node order
    cols = ["kind", "layer", "block", "pos", "feature", "token_id", "token"]
    assert back.nodes[cols].values.tolist() == nodes[cols].values.tolist()
    assert (back.nodes["kind"] == "feature").sum() > 0
    np.testing.assert_allclose(back.nodes["activation"], nodes["activation"], rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(back.nodes["logit_prob"], nodes["logit_prob"], rtol=1e-6, equal_nan=True)
    cum = prune_graph(g, NODE_THR, 0.97).cumulative_scores.numpy()[nodes["node"].to_numpy()]
    kept = (back.nodes["kind"] != "logit").to_numpy()
    np.testing.assert_allclose(back.nodes["cumulative_influence"].to_numpy()[kept], cum[kept], rtol=1e-6)
    assert back.nodes["cumulative_influence"][~kept].isna().all()
    # the links: the same (source, target) pairs as the pruned edges, weights to 1e-6
    key_of = dict(zip(nodes["node"], nodes["key"]))
    ours = {(key_of[s], key_of[t]): w for s, t, w in zip(edges["source"], edges["target"], edges["weight"])}
    bk = list(back.nodes["key"])
    theirs = {(bk[s], bk[t]): w for s, t, w in zip(back.links["source"], back.links["target"], back.links["weight"])}
    assert ours.keys() == theirs.keys() and len(theirs) == len(back.links) > 0
    assert max(abs(ours[k] - theirs[k]) for k in ours) <= 1e-6
    # labels: given ones by index or key, the defaults elsewhere
    label = dict(zip(back.nodes["key"], back.nodes["label"]))
    r0 = g.nodes.iloc[0]
    first = node_key("feature", int(r0["layer"]), int(r0["pos"]), int(r0["feature"]), int(r0["token_id"]))
    if first in label:
        assert label[first] == "the first feature's own label"
    assert label["t1"] == 'a token "quoted" ⏎'
    if f"e{g.n_layers - 1}.{g.n_pos - 1}" in label:
        assert label[f"e{g.n_layers - 1}.{g.n_pos - 1}"] == "the last error node"
    top = g.nodes.iloc[g.n_features + g.n_errors + g.n_pos]
    assert label[f"l{int(top['token_id'])}"] == f'Output "#{int(top["token_id"])}" (p={top["logit_prob"]:.3f})'
    feats = back.nodes[(back.nodes["kind"] == "feature") & (back.nodes["key"] != first)]
    assert list(feats["label"]) == [f"L{r.layer} #{r.feature}" for r in feats.itertuples()]


def test_graph_metadata_lists_each_slug_once(graph, tmp_path):
    save_graph_json(graph, tmp_path, "a", node_threshold=NODE_THR)
    save_graph_json(graph, tmp_path, "b", node_threshold=0.9, scan="my-scan")
    save_graph_json(graph, tmp_path, "a", node_threshold=0.97)  # written again: its entry replaced, moved last
    meta = json.loads((tmp_path / "graph-metadata.json").read_text())
    assert [(m["slug"], m["node_threshold"], m["scan"]) for m in meta["graphs"]] == [
        ("b", 0.9, "my-scan"), ("a", 0.97, "tiny-transcoders")]
    assert meta["graphs"][1] == json.loads((tmp_path / "a.json").read_text())["metadata"]
    (tmp_path / "graph-metadata.json").write_text('{"graphs": 3}')
    with pytest.raises(AttributionGraphError, match="graph list"):
        save_graph_json(graph, tmp_path, "c")
    assert (tmp_path / "graph-metadata.json").read_text() == '{"graphs": 3}'  # refused, not overwritten


def test_the_scan_names_the_transcoder_kind(graph):
    g = si.AttributionGraph(graph.adjacency, graph.nodes, graph.tokens, graph.n_layers,
                            {**graph.info, "transcoder_kind": "clt", "transcoders": "gpt-4"})
    assert graph_json(g, "x")["metadata"]["scan"] == "gpt-4-clt"
    g.info = {}
    with pytest.raises(AttributionGraphError, match="scan"):
        graph_json(g, "x")
    assert graph_json(g, "x", scan="named")["metadata"]["scan"] == "named"


def test_cantor_pairs_unpair():
    for x, y in [(0, 0), (0, 7), (3, 117), (255, (1 << 24) - 1), (17, 0)]:
        assert cantor_unpair(cantor_pair(x, y)) == (x, y)
    assert [cantor_pair(1, 3), cantor_pair(0, 1)] == [13, 2]  # circuit-tracer's Node.feature_node(1, _, 3): 13


@pytest.mark.unchecked_types
@pytest.mark.parametrize("kw, match", [
    (dict(slug="../up"), "slug"), (dict(slug=""), "slug"), (dict(slug=3), "slug"), (dict(slug="a/b"), "slug"),
    (dict(node_threshold=1.5), "node_threshold"), (dict(edge_threshold="0.9"), "edge_threshold"),
    (dict(scan=""), "scan"), (dict(scan=["a", "b"]), "scan"),
    (dict(labels={10 ** 6: "x"}), "not a node"), (dict(labels={"f9.9.9": "x"}), "not a node"),
    (dict(labels={True: "x"}), "node index"), (dict(labels={-1: "x"}), "not a node"),
    (dict(labels={"l9999": "x"}), "not a node"), (dict(labels={0: 3}), "str"), (dict(labels={0: "x" * 501}), "str"),
    (dict(labels=["x"]), "mapping"),
])
def test_bad_arguments_are_named(graph, tmp_path, kw, match):
    args = dict(slug="ok", **kw) if "slug" not in kw else kw
    with pytest.raises(AttributionGraphError, match=match):
        save_graph_json(graph, tmp_path, **args)
    assert not (tmp_path / "ok.json").exists()


@pytest.mark.unchecked_types
def test_bad_graph_and_folder_are_named(graph, tmp_path):
    with pytest.raises(AttributionGraphError, match="AttributionGraph"):
        save_graph_json("graph", tmp_path, "x")
    (tmp_path / "file").write_text("x")
    with pytest.raises(AttributionGraphError, match="is a file"):
        save_graph_json(graph, tmp_path / "file", "x")
    with pytest.raises(NotAPathError):
        save_graph_json(graph, 3, "x")


# -- hostile files --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good(graph, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("good")
    return json.loads(save_graph_json(graph, folder, "g", node_threshold=NODE_THR).read_text())


def _first(obj, ftype):
    return next(n for n in obj["nodes"] if n["feature_type"] == ftype)


def _mutations():
    def drop(path):
        def f(o):
            *head, last = path
            d = o
            for k in head:
                d = d[k]
            del d[last]
        return f

    def setf(path, value):
        def f(o):
            *head, last = path
            d = o
            for k in head:
                d = d[k]
            d[last] = value(o) if callable(value) else value
        return f

    def node(ftype, key, value):
        def f(o):
            _first(o, ftype)[key] = value
        return f

    def dup(o):
        o["nodes"].append(dict(o["nodes"][0]))

    def same_node(o):  # a second id for a node already there
        o["nodes"].append(dict(_first(o, "embedding"), node_id="E_other"))

    return {
        "metadata": (drop(["metadata"]), "metadata is missing"),
        "slug": (drop(["metadata", "slug"]), "metadata.slug is missing"),
        "prompt_tokens type": (setf(["metadata", "prompt_tokens"], "abc"), "metadata.prompt_tokens must be a list"),
        "prompt token": (setf(["metadata", "prompt_tokens"], lambda o: [1] * len(o["metadata"]["prompt_tokens"])),
                         "list of strings"),
        "no tokens": (setf(["metadata", "prompt_tokens"], []), "1..65536 tokens"),
        "threshold": (setf(["metadata", "node_threshold"], 2), "node_threshold must be 0..1"),
        "threshold bool": (setf(["metadata", "node_threshold"], True), "node_threshold must be a number"),
        "qParams": (drop(["qParams"]), "qParams is missing"),
        "pinned": (setf(["qParams", "pinnedIds"], [3]), "pinnedIds must be a list of strings"),
        "supernodes": (setf(["qParams", "supernodes"], ["a"]), "supernodes must be a list of lists"),
        "nodes type": (setf(["nodes"], {}), "nodes must be a list"),
        "node type": (setf(["nodes", 0], 3), r"nodes\[0\] must be an object"),
        "node_id": (drop(["nodes", 0, "node_id"]), r"nodes\[0\].node_id is missing"),
        "node_id empty": (setf(["nodes", 0, "node_id"], ""), "1..200 characters"),
        "layer int": (setf(["nodes", 0, "layer"], 0), r"nodes\[0\].layer must be a string"),
        "layer word": (node("cross layer transcoder", "layer", "x1"), "layer must be a whole number as a string"),
        "embedding layer": (node("embedding", "layer", "0"), "must be 'E'"),
        "feature type": (setf(["nodes", 0, "feature_type"], "transcoder"), "feature_type must be one of"),
        "ctx bool": (setf(["nodes", 0, "ctx_idx"], True), "ctx_idx must be a whole number"),
        "ctx range": (setf(["nodes", 0, "ctx_idx"], 10 ** 6), "ctx_idx must be a position"),
        "ctx float": (setf(["nodes", 0, "ctx_idx"], 1.0), "ctx_idx must be a whole number"),
        "huge int": (setf(["nodes", 0, "feature"], 1 << 60), "at most"),
        "cantor": (node("cross layer transcoder", "feature", 10 ** 9), "pairs layer"),  # layer 44,721
        "negative feature": (node("cross layer transcoder", "feature", -3), "Cantor pair"),
        "token_prob": (node("logit", "token_prob", 3.0), "probability"),
        "influence": (setf(["nodes", 0, "influence"], "0.5"), "influence must be a number or null"),
        "activation size": (node("cross layer transcoder", "activation", 1e30), "at most"),
        "clerp type": (setf(["nodes", 0, "clerp"], None), "clerp must be a string"),
        "duplicate": (dup, "also nodes"),
        "same node": (same_node, "is the same node as"),
        "logit layers": (node("logit", "layer", "9"), None),
        "too many blocks": (lambda o: [n.__setitem__("layer", "999") for n in o["nodes"] if n["feature_type"] == "logit"],
                            "blocks"),
        "error layer": (node("mlp reconstruction error", "layer", "7"), r"layer must be 0\.\.2"),
        "links type": (setf(["links"], None), "links must be a list"),
        "link source": (setf(["links", 0, "source"], "nowhere"), r"links\[0\].source 'nowhere' is not a node"),
        "link target type": (setf(["links", 0, "target"], 5), r"links\[0\].target must be a string"),
        "weight missing": (drop(["links", 0, "weight"]), "weight is missing"),
        "weight string": (setf(["links", 0, "weight"], "1"), "weight must be a number"),
        "weight size": (setf(["links", 0, "weight"], 1e13), "weight must be at most"),
        "top": (lambda o: o.clear(), "metadata is missing"),
    }


@pytest.mark.parametrize("name", list(_mutations()))
def test_hostile_fields_are_named(good, name):
    mutate, match = _mutations()[name]
    obj = json.loads(json.dumps(good))
    mutate(obj)
    data = json.dumps(obj).encode()
    if match is None:  # logit nodes in two layers: only one was moved
        match = "several layers" if sum(n["feature_type"] == "logit" for n in good["nodes"]) > 1 else "blocks"
    with pytest.raises(AttributionGraphError, match=match):
        read_graph_json(data, "upload.json")


@pytest.mark.parametrize("text, match", [
    (b"\xff\xfe{}", "UTF-8"), (b"{not json", "not JSON"), (b"[1, 2]", "JSON object"), (b"[" * 100_000, "nested"),
    (b'{"metadata": NaN}', "not JSON"), (b'{"metadata": Infinity}', "not JSON"), (b"1" * 5000, "not JSON"),
])
def test_what_is_not_json_is_refused(text, match):
    with pytest.raises(AttributionGraphError, match=match):
        read_graph_json(text)


def test_non_finite_weights_are_refused(good):
    obj = json.loads(json.dumps(good))
    obj["links"][0]["weight"] = "__w__"
    bad = json.dumps(obj).replace('"__w__"', "1e999")  # a JSON number that parses to inf
    with pytest.raises(AttributionGraphError, match=r"links\[0\].weight must be a finite number"):
        read_graph_json(bad.encode())


@pytest.mark.unchecked_types
def test_files_that_are_not_graph_files(good, tmp_path, monkeypatch):
    p = tmp_path / "g.json"
    p.write_text(json.dumps(good))
    assert len(load_graph_json(p).nodes) == len(good["nodes"])
    monkeypatch.setattr(limits, "MAX_GRAPH_JSON_BYTES", 100)
    with pytest.raises(AttributionGraphError, match="bytes"):
        load_graph_json(p)
    with pytest.raises(AttributionGraphError, match="bytes"):
        read_graph_json(p.read_bytes())
    monkeypatch.undo()
    with pytest.raises(AttributionGraphError, match="not a circuit-tracer graph file"):
        load_graph_json(tmp_path)  # a folder
    with pytest.raises(CheckpointNotFoundError):
        load_graph_json(tmp_path / "missing.json")
    with pytest.raises(NotAPathError):
        load_graph_json(3)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.json")
        with pytest.raises(AttributionGraphError, match="FIFO"):
            load_graph_json(tmp_path / "fifo.json")  # refused without blocking on the pipe


def test_a_logit_keeps_circuit_tracers_label(graph):
    top = int(graph.nodes["token_id"].iloc[-graph.n_logits])
    for key in (f"l{top}", len(graph.nodes) - graph.n_logits):
        with pytest.raises(AttributionGraphError, match="logit node"):
            graph_json(graph, "x", labels={key: "renamed"})


def test_measured_labels_come_as_a_series_of_one_per_node(graph):
    """What circuits.graph_labels returns: one label per node in node order; its logit rows are left out."""
    import pandas as pd

    series = pd.Series([f"label {i}" for i in range(len(graph.nodes))], index=graph.nodes.index)
    obj = graph_json(graph, "x", node_threshold=NODE_THR, labels=series)
    back = read_graph_json(json.dumps(obj).encode())
    n = graph.nodes
    index = {node_key(r.kind, int(r.layer), int(r.pos), int(r.feature), int(r.token_id)): i for i, r in
             enumerate(n.itertuples())}
    for r in back.nodes.itertuples():
        if r.kind == "logit":
            assert r.label.startswith('Output "') and "(p=" in r.label
        else:
            assert r.label == f"label {index[r.key]}"
    with pytest.raises(AttributionGraphError, match="one label per node"):
        graph_json(graph, "x", labels=series.iloc[:-1])
    with pytest.raises(AttributionGraphError, match="row 2"):
        graph_json(graph, "x", labels=series.where(series.index != 2, 3))


def test_the_files_of_a_download_are_the_files_written(graph, tmp_path):
    from sprout_interp.circuits.graph_json import graph_json_files

    files = graph_json_files(graph, "dl", node_threshold=NODE_THR)
    p = save_graph_json(graph, tmp_path, "dl", node_threshold=NODE_THR)
    assert sorted(files) == ["dl.json", "graph-metadata.json"]
    assert files["dl.json"] == p.read_bytes()
    assert json.loads(files["graph-metadata.json"]) == json.loads((tmp_path / "graph-metadata.json").read_text())


def test_circuit_tracers_colliding_ids(graph, tmp_path):
    """A layer-0 feature numbered b and block b's error node at the same position share circuit-tracer's id "0_b_pos":
    save_graph_json gives the error node "0_b_pos_error"; load_graph_json reads circuit-tracer's own colliding file by
    the graph's structure and counts the links it cannot decide."""
    g = graph
    T = g.n_pos
    nodes = g.nodes.copy()
    # the kept layer-0 feature 6 at the last position renamed feature 2: its id is then block 2's error node's there
    row = nodes.index[(nodes["kind"] == "feature") & (nodes["layer"] == 0) & (nodes["pos"] == T - 1)
                      & (nodes["feature"] == 6)]
    assert len(row) == 1 and not ((nodes["layer"] == 0) & (nodes["pos"] == T - 1) & (nodes["feature"] == 2)).any()
    nodes.loc[row, "feature"] = 2
    g2 = si.AttributionGraph(g.adjacency, nodes, g.tokens, g.n_layers, g.info)
    obj = graph_json(g2, "c", node_threshold=NODE_THR)
    ids = [n["node_id"] for n in obj["nodes"]]
    assert f"0_2_{T - 1}" in ids and f"0_2_{T - 1}_error" in ids and len(set(ids)) == len(ids)
    back = read_graph_json(json.dumps(obj).encode())
    assert back.ambiguous_links == 0
    want, edges = graph_tables(g2, NODE_THR, 0.98)
    key = list(want["key"])
    assert list(back.nodes["key"]) == key
    assert sorted(zip(back.links["source"], back.links["target"])) == \
        sorted((key.index(k_s), key.index(k_t)) for k_s, k_t in
               zip(edges["source"].map(dict(zip(want["node"], want["key"]))),
                   edges["target"].map(dict(zip(want["node"], want["key"])))))
    # circuit-tracer's own file: both nodes "0_2_<last>"; a link into it is the feature's (an error node has no
    # incoming edge), a link from it into block 2 or lower is the feature's, into a logit either's: undecided
    ct = json.loads(json.dumps(obj))
    for n in ct["nodes"]:
        n["node_id"] = n["node_id"].removesuffix("_error")
    for e in ct["links"]:
        e["source"], e["target"] = e["source"].removesuffix("_error"), e["target"].removesuffix("_error")
    extra = dict(next(n for n in ct["nodes"] if n["feature_type"] == "cross layer transcoder"), node_id="1_47_x",
                 feature=cantor_pair(1, 47), layer="1", ctx_idx=T - 1)  # a block-2 feature the collided id feeds:
    ct["nodes"].append(extra)  # only the layer-0 feature can (block 2's error node is above it)
    ct["links"].append({"source": f"0_2_{T - 1}", "target": "1_47_x", "weight": 0.5})
    obj["links"].append(ct["links"][-1])
    back = read_graph_json(json.dumps(ct).encode())
    f_at, e_at = (int(back.nodes.index[back.nodes["key"] == k][0]) for k in (f"f0.{T - 1}.2", f"e2.{T - 1}"))
    src, tgt = back.links["source"].to_numpy(), back.links["target"].to_numpy()
    assert (tgt == f_at).sum() == sum(e["target"] == f"0_2_{T - 1}" for e in obj["links"]) > 0
    assert (tgt == e_at).sum() == 0
    layer_of = dict(zip(back.nodes["node_id"], back.nodes["layer"]))
    decided = [j for j, e in enumerate(obj["links"]) if e["source"] == f"0_2_{T - 1}" and layer_of[e["target"]] <= 2]
    assert decided and all(src[j] == f_at for j in decided)
    undecided = sum(e["source"] in (f"0_2_{T - 1}", f"0_2_{T - 1}_error") and back.nodes.loc[
        back.nodes["node_id"] == e["target"], "layer"].max() > 2 for e in obj["links"])
    assert back.ambiguous_links == undecided > 0 and "ambiguous" in repr(back)


def test_a_cross_layer_transcoder_graph_round_trips(model, tmp_path):
    """A CLT graph writes the same format (circuit-tracer names every feature "cross layer transcoder"), its scan
    naming the kind, and reads back to the pruned tables."""
    from sprout_interp.circuits.local_replacement import random_clt

    tokens = torch.randint(1, 64, (12,), generator=torch.Generator().manual_seed(3))
    g = attribution_graph(model, tokens, random_clt(model, d_transcoder=48, density=0.1, seed=2), batch_size=7)
    assert g.info["transcoder_kind"] == "clt"
    p = save_graph_json(g, tmp_path, "clt", node_threshold=NODE_THR)
    back = load_graph_json(p)
    assert back.metadata["scan"] == "tiny-clt"
    nodes, edges = graph_tables(g, NODE_THR, 0.98)
    assert list(back.nodes["key"]) == list(nodes["key"]) and (back.nodes["kind"] == "feature").sum() > 0
    assert len(back.links) == len(edges) > 0
    key = dict(zip(nodes["node"], nodes["key"]))
    want = {(key[s], key[t]): w for s, t, w in zip(edges["source"], edges["target"], edges["weight"])}
    bk = list(back.nodes["key"])
    got = {(bk[s], bk[t]): w for s, t, w in zip(back.links["source"], back.links["target"], back.links["weight"])}
    assert got.keys() == want.keys() and max(abs(got[k] - want[k]) for k in got) <= 1e-6


@pytest.mark.unchecked_types
def test_pins_and_supernodes_become_the_viewers_qparams(graph):
    nodes, _ = graph_tables(graph, NODE_THR, 0.98)
    kept = [k for k in nodes["key"] if k.startswith("f")][:3]
    index = {k: int(i) for k, i in zip(nodes["key"], nodes["node"])}
    dropped = next(node_key(r.kind, int(r.layer), int(r.pos), int(r.feature), int(r.token_id))
                   for r in graph.nodes.itertuples() if r.kind == "feature"
                   and node_key(r.kind, int(r.layer), int(r.pos), int(r.feature), int(r.token_id)) not in index)
    obj = graph_json(graph, "q", node_threshold=NODE_THR, pinned=[kept[0], index[kept[1]], dropped, kept[0]],
                     supernodes={"pair": [kept[1], kept[2]], "gone": [dropped]})
    back = read_graph_json(json.dumps(obj).encode())
    id_of = dict(zip(back.nodes["key"], back.nodes["node_id"]))
    # once each, in order; a node pruning drops written all the same (a pin or a supernode's member)
    assert obj["qParams"]["pinnedIds"] == [id_of[kept[0]], id_of[kept[1]], id_of[dropped]]
    assert obj["qParams"]["supernodes"] == [["pair", id_of[kept[1]], id_of[kept[2]]], ["gone", id_of[dropped]]]
    assert back.qparams["pinnedIds"] == obj["qParams"]["pinnedIds"]
    assert back.pinned == [kept[0], kept[1], dropped]
    for kw, match in ((dict(pinned=["f9.9.9"]), "pinned"), (dict(pinned="f0.1.2"), "list"),
                      (dict(pinned=[True]), "pinned"), (dict(supernodes={"": [0]}), "name"),
                      (dict(supernodes={"a": 3}), "list"), (dict(supernodes=[("a", [0])]), "mapping"),
                      (dict(supernodes={"a": [10 ** 6]}), "not a node")):
        with pytest.raises(AttributionGraphError, match=match):
            graph_json(graph, "q", **kw)


def test_a_pinned_node_below_the_threshold_is_written_with_its_links(graph, tmp_path):
    """A pinned feature whose influence is well under what the node threshold keeps (half of it) is written, with
    exactly its edges to and from the written nodes at least as strong as the weakest edge pruning kept (none of
    them within 1% of that cut), the rest of the file unchanged; load_graph_json gives the pin back."""
    pruned = prune_graph(graph, NODE_THR, 0.98)
    infl = node_influence(graph).double()
    vals = infl[infl != 0].sort(descending=True).values
    cut = float(vals[int((vals.cumsum(0) / vals.sum() < NODE_THR).sum())])  # the least influence the threshold keeps
    A = graph.adjacency.double()
    kept = pruned.node_mask.nonzero()[:, 0].tolist()
    weakest = float(A[pruned.edge_mask].abs().min())

    def edges_of(i: int) -> set:  # written by hand: (source, target) of the pin's edges at least as strong as weakest
        return ({(j, i) for j in kept if abs(float(A[i, j])) >= weakest}
                | {(i, j) for j in kept if abs(float(A[j, i])) >= weakest})

    def near_cut(i: int) -> bool:
        return any(abs(abs(float(v)) - weakest) < 0.01 * weakest for v in (*A[i, kept], *A[kept, i]))

    pick = [i for i in range(graph.n_features) if not pruned.node_mask[i] and float(infl[i]) < 0.5 * cut
            and len(edges_of(i)) >= 2 and not near_cut(i)]
    assert pick, "no feature far under the node threshold with strong edges"
    i = pick[0]
    r = graph.nodes.iloc[i]
    key = node_key("feature", int(r["layer"]), int(r["pos"]), int(r["feature"]), int(r["token_id"]))
    plain = read_graph_json(json.dumps(graph_json(graph, "p", node_threshold=NODE_THR)).encode())
    assert key not in set(plain.nodes["key"])  # pruning drops it
    p = save_graph_json(graph, tmp_path, "pinned", node_threshold=NODE_THR, pinned=[key])
    back = load_graph_json(p)
    assert back.pinned == [key] and len(back.qparams["pinnedIds"]) == 1
    assert set(back.nodes["key"]) == set(plain.nodes["key"]) | {key}
    node_keys = si.node_keys(graph)
    bk = list(back.nodes["key"])
    links = {(bk[s], bk[t]): w for s, t, w in zip(back.links["source"], back.links["target"], back.links["weight"])}
    want = {(node_keys[s], node_keys[t]): float(A[t, s]) for s, t in edges_of(i)}
    assert {k for k in links if key in k} == want.keys()
    assert max(abs(links[k] - want[k]) for k in want) <= 1e-6
    pk = list(plain.nodes["key"])
    assert {k for k in links if key not in k} == {(pk[s], pk[t]) for s, t in zip(plain.links["source"],
                                                                                   plain.links["target"])}
    # the page draws the same nodes and edges for that pin
    nodes, edges = graph_tables(graph, NODE_THR, 0.98, keep=[i])
    assert list(nodes["key"]) == bk
    assert {(node_keys[s], node_keys[t]) for s, t in zip(edges["source"], edges["target"])} == links.keys()


@pytest.mark.unchecked_types
def test_keep_nodes_names_what_is_not_a_node(graph):
    pruned = prune_graph(graph, NODE_THR, 0.98)
    n = len(graph.nodes)
    for bad in ([True], [n], [-1], "3", 3, [1.0]):
        with pytest.raises(AttributionGraphError, match="keep"):
            keep_nodes(graph, pruned, bad)
    same = keep_nodes(graph, pruned, [int(pruned.node_mask.nonzero()[0, 0])])  # a node pruning keeps: no change
    assert torch.equal(same.node_mask, pruned.node_mask) and torch.equal(same.edge_mask, pruned.edge_mask)
