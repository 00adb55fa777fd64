"""Our circuit-tracer JSON read by circuit-tracer 0.5.0 itself (in ``.venv-ct``, subprocesses): its pydantic
``Model`` validates our file (and one with pinned nodes and a supernode that pruning drops, kept in it) and dumps
it back unchanged; its local frontend server
(``circuit_tracer.frontend.local_server``) serves our folder (the graph and ``graph-metadata.json`` answer); and
for the same graph (the shipped gpt-4 with seeded random transcoders on a short prompt, our adjacency handed to its
``Graph``), its ``create_graph_files`` writes the same file as ``save_graph_json``: the same metadata, node ids,
fields and links with equal weights (labels aside: it writes none but the logits'), which ``load_graph_json`` opens
to the same tables. Skipped, with the reason, when ``.venv-ct`` is not built (``bash scripts/setup_circuit_tracer.sh``)."""
from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import sprout_interp as si
from sprout_interp.circuits.local_replacement import random_transcoders
from sprout_interp.plots.graph import graph_tables

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
CT_PY = ROOT / ".venv-ct" / "bin" / "python"
PROMPT = "Zorbin Plax came home. Zorbin"
SLUG = "zorbin"

# circuit-tracer's side: its Model validates our file; its create_graph_files writes the same graph's file
WORKER = r"""
import json, sys
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer
from circuit_tracer.attribution.targets import LogitTarget
from circuit_tracer.frontend.graph_models import Model
from circuit_tracer.graph import Graph
from circuit_tracer.utils.create_graph_files import create_graph_files
from circuit_tracer.utils.tl_nnsight_mapping import UnifiedConfig

tensors, tok_dir, ours, out, report = sys.argv[1:6]
args = json.loads(sys.argv[6])
t = load_file(tensors)
tok = AutoTokenizer.from_pretrained(tok_dir)
cfg = UnifiedConfig(n_layers=args["n_layers"], d_model=args["d_model"], d_head=args["d_head"], n_heads=args["n_heads"],
                    d_mlp=args["d_mlp"], d_vocab=args["d_vocab"], tokenizer_name=tok_dir, model_name="gpt-4",
                    original_architecture="Qwen3ForCausalLM")
ids = t["input_tokens"]
nF = t["active_features"].shape[0]
graph = Graph(input_string=tok.decode(ids), input_tokens=ids, active_features=t["active_features"],
              adjacency_matrix=t["adjacency"], cfg=cfg, selected_features=torch.arange(nF),
              activation_values=t["activation_values"],
              logit_targets=[LogitTarget(token_str=tok.decode(i), vocab_idx=int(i)) for i in t["logit_ids"].tolist()],
              logit_probabilities=t["logit_probabilities"], scan=args["scan"])
create_graph_files(graph, args["slug"], out, node_threshold=args["node_threshold"],
                   edge_threshold=args["edge_threshold"])
out_ = {}
for name, path in [("ours", ours)] + [(p, p) for p in args["more"]]:
    text = open(path, encoding="utf-8").read()
    model = Model.model_validate_json(text)
    out_[name] = {"valid": True, "dump_equal": model.model_dump() == json.loads(text), "n_nodes": len(model.nodes),
                  "n_links": len(model.links), "pinned": model.qParams.pinnedIds,
                  "supernodes": model.qParams.supernodes}
json.dump(out_, open(report, "w"))
"""

# circuit-tracer's local frontend server on a port the system chooses, until its stdin closes
SERVER = r"""
import sys
from circuit_tracer.frontend.local_server import serve
server = serve(data_dir=sys.argv[1], port=0)
print(server.httpd.server_address[1], flush=True)
sys.stdin.read()
server.stop()
"""


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture(scope="module")
def files(gpt4, tmp_path_factory) -> dict:
    """Our file and circuit-tracer's for the same graph, and circuit-tracer's report on ours."""
    if not CT_PY.is_file():
        pytest.skip(".venv-ct is not built: run `bash scripts/setup_circuit_tracer.sh` (circuit-tracer 0.5.0 in a "
                    "virtual environment of its own)")
    tmp = tmp_path_factory.mktemp("graph-json")
    ts = random_transcoders(gpt4, k=16, d_transcoder=768, seed=0)
    g = si.attribution_graph(gpt4, PROMPT, ts)
    ours = si.save_graph_json(g, tmp / "ours", SLUG)
    # and with pins: two features pruning drops (one grouped into a supernode with a kept node), written all the same
    drop = [i for i in range(g.n_features) if not bool(si.prune_graph(g).node_mask[i])][:2]
    keys = si.node_keys(g)
    pinned = si.save_graph_json(g, tmp / "pinned", SLUG, pinned=[drop[0], len(g.nodes) - 1],
                                supernodes={"pair": [keys[drop[1]], keys[len(g.nodes) - 1]]})
    tok = tmp / "tokenizer"
    tok.mkdir()
    gpt4.tokenizer.save(str(tok / "tokenizer.json"))
    (tok / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    nodes = g.nodes
    feats, logits = nodes[nodes["kind"] == "feature"], nodes[nodes["kind"] == "logit"]
    save_file({"adjacency": g.adjacency.float().contiguous(),
               "active_features": torch.tensor(feats[["layer", "pos", "feature"]].to_numpy(), dtype=torch.long).contiguous(),
               "activation_values": torch.tensor(feats["activation"].to_numpy(), dtype=torch.float32),
               "input_tokens": g.tokens.long().contiguous(),
               "logit_ids": torch.tensor(logits["token_id"].to_numpy(), dtype=torch.long),
               "logit_probabilities": torch.tensor(logits["logit_prob"].to_numpy(), dtype=torch.float32)},
              str(tmp / "graph.safetensors"))
    cfg = gpt4.cfg
    args = {"n_layers": g.n_layers, "d_model": cfg.d_model, "d_head": cfg.d_head, "n_heads": cfg.n_heads,
            "d_mlp": cfg.d_mlp, "d_vocab": cfg.d_vocab, "scan": json.loads(ours.read_text())["metadata"]["scan"],
            "slug": SLUG, "node_threshold": 0.8, "edge_threshold": 0.98, "more": [str(pinned)]}
    (tmp / "worker.py").write_text(WORKER)
    run = subprocess.run([str(CT_PY), str(tmp / "worker.py"), str(tmp / "graph.safetensors"), str(tok), str(ours),
                          str(tmp / "theirs"), str(tmp / "report.json"), json.dumps(args)],
                         capture_output=True, text=True, timeout=600, env=_env(), cwd=tmp)
    assert run.returncode == 0, run.stderr[-4000:]
    return {"graph": g, "ours": ours, "theirs": tmp / "theirs" / f"{SLUG}.json", "folder": tmp / "ours",
            "pinned": pinned, "pins": [keys[drop[0]], keys[len(g.nodes) - 1], keys[drop[1]]],
            "report": json.loads((tmp / "report.json").read_text())}


def test_circuit_tracers_model_validates_our_file(files):
    rep = files["report"]["ours"]
    obj = json.loads(files["ours"].read_text())
    assert rep["valid"] and rep["dump_equal"]  # every field ours, none added or changed by its defaults
    assert rep["n_nodes"] == len(obj["nodes"]) > 100 and rep["n_links"] == len(obj["links"]) > 1000


def test_circuit_tracers_model_validates_our_file_with_pins_pruning_drops(files):
    rep = files["report"][str(files["pinned"])]
    obj, plain = (json.loads(files[k].read_text()) for k in ("pinned", "ours"))
    assert rep["valid"] and rep["dump_equal"]
    assert rep["n_nodes"] == len(obj["nodes"]) == len(plain["nodes"]) + 2  # the two dropped features written
    back = si.load_graph_json(files["pinned"])
    first, logit, second = files["pins"]
    assert back.pinned == [first, logit]
    id_of = dict(zip(back.nodes["key"], back.nodes["node_id"]))
    assert rep["pinned"] == [id_of[first], id_of[logit]]
    assert rep["supernodes"] == [["pair", id_of[second], id_of[logit]]]


def test_circuit_tracers_server_serves_our_folder(files):
    folder = files["folder"]
    script = folder.parent / "server.py"
    script.write_text(SERVER)
    proc = subprocess.Popen([str(CT_PY), str(script), str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), cwd=folder.parent)
    try:
        port = int(proc.stdout.readline())
        got = {}
        for name in (f"{SLUG}.json", "graph-metadata.json"):  # the socket listens once serve() returns
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/{name}", timeout=30) as r:
                assert r.status == 200 and r.headers["Content-Type"] == "application/json"
                got[name] = json.loads(r.read())
        assert got[f"{SLUG}.json"] == json.loads(files["ours"].read_text())
        assert got["graph-metadata.json"] == {"graphs": [got[f"{SLUG}.json"]["metadata"]]}
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_circuit_tracer_writes_the_same_file_for_the_same_graph(files):
    ours, theirs = (json.loads(files[k].read_text()) for k in ("ours", "theirs"))
    assert ours["metadata"] == theirs["metadata"] and ours["qParams"] == theirs["qParams"]
    assert ours["metadata"]["prompt_tokens"][:5] == ["<|endoftext|>", "Z", "or", "b", "in"]
    assert not any(n["node_id"].endswith("_error") for n in ours["nodes"])  # no id of circuit-tracer's collides here
    assert [n["node_id"] for n in ours["nodes"]] == [n["node_id"] for n in theirs["nodes"]]
    kinds = [n["feature_type"] for n in theirs["nodes"]]
    counts = {k: kinds.count(k) for k in set(kinds)}  # 74 features and 14 error nodes kept on this machine
    assert counts["cross layer transcoder"] > 20 and counts["mlp reconstruction error"] > 0
    assert counts["embedding"] == 14 and counts["logit"] == 10 and len(counts) == 4
    for a, b in zip(ours["nodes"], theirs["nodes"]):
        assert list(a) == list(b)
        same = {k for k in a if k not in ("clerp", "influence")}
        assert {k: a[k] for k in same} == {k: b[k] for k in same}
        if a["influence"] is None:
            assert b["influence"] is None
        else:  # cumulative shares from two float32 influence computations
            assert abs(a["influence"] - b["influence"]) <= 1e-5
        if a["feature_type"] == "logit":
            assert a["clerp"] == b["clerp"] and a["clerp"].startswith('Output "')
        else:
            assert b["clerp"] == "" and a["clerp"]  # circuit-tracer labels only the logits; we label every node
    assert ours["links"] == theirs["links"]  # node ids and weights equal, in the same order


def test_load_graph_json_opens_circuit_tracers_file(files):
    g = files["graph"]
    theirs, ours = si.load_graph_json(files["theirs"]), si.load_graph_json(files["ours"])
    nodes, edges = graph_tables(g)
    assert list(theirs.nodes["key"]) == list(nodes["key"]) == list(ours.nodes["key"])
    cols = ["kind", "layer", "block", "pos", "feature", "token_id", "token", "is_target_logit", "node_id", "js_node_id"]
    assert theirs.nodes[cols].values.tolist() == ours.nodes[cols].values.tolist()
    assert theirs.nodes[["kind", "layer", "pos", "feature", "token_id", "token"]].values.tolist() == \
        nodes[["kind", "layer", "pos", "feature", "token_id", "token"]].values.tolist()
    np.testing.assert_allclose(theirs.nodes["activation"], nodes["activation"], rtol=1e-6, equal_nan=True)
    assert theirs.links[["source", "target"]].values.tolist() == ours.links[["source", "target"]].values.tolist()
    key = list(nodes["key"])
    want = {(key[list(nodes["node"]).index(s)], key[list(nodes["node"]).index(t)]): w
            for s, t, w in zip(edges["source"], edges["target"], edges["weight"])}
    got = {(key[s], key[t]): w for s, t, w in zip(theirs.links["source"], theirs.links["target"], theirs.links["weight"])}
    assert got.keys() == want.keys() and max(abs(got[k] - want[k]) for k in got) <= 1e-6
    assert theirs.n_layers == g.n_layers == 4 and theirs.prompt_tokens == ours.prompt_tokens
    logits = theirs.nodes[theirs.nodes["kind"] == "logit"]
    assert logits["token"].iloc[0] == " Pl" and logits["label"].tolist() == ours.nodes.loc[logits.index, "label"].tolist()
