"""Hostile graphs, weights and settings: what used to load and then give a wrong number or run out of memory.

- Attribution-graph memory: a graph's own tensors are estimated (``graph_memory``) before any is allocated and held
  to ``memory_budget`` (``limits.MAX_GRAPH_BYTES``); with the default ``max_feature_nodes`` a long prompt keeps as
  many features as fit, exactly; a transcoder's ``k`` is at most a quarter of its width.
- Graph files: every field of ``load_graph``'s file checked against its range (probabilities, finite values,
  layers, features, token ids, edges only from lower layers at earlier or the same positions).
- SAE cfg.json settings: ``apply_b_dec_to_input`` applied (checked against a hand-written encode), the settings
  this toolkit does not apply refused by name.
- Finite but overflowing weights: ``core.configs.check_weights`` (|w| <= ``limits.MAX_WEIGHT_ABS``) for
  checkpoints, tuned lenses, SAEs and transcoders, and a checkpoint's probe forward (``check_runs``).

Each case comes with its neighbours just inside and just outside the bound.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fixtures.files import make_tokenizer, refused
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models

from sprout_interp.circuits.attribution_graph import attribution_graph, graph_memory
from sprout_interp.circuits.graphs import MAX_GRAPH_VALUE, load_graph
from sprout_interp.circuits.local_replacement import random_transcoders
from sprout_interp.core import errors, limits
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.core.loading import load_checkpoint
from sprout_interp.features.sae import SAE_CFG, SAE_WEIGHTS, SparseAutoencoder, load_sae, read_sae, save_sae
from sprout_interp.features.transcoder import TC_CONFIG, Transcoder, load_transcoders, max_k, save_transcoders
from sprout_interp.lens.tuned_lens import LENS_WEIGHTS, TunedLens, load_tuned_lens, save_tuned_lens
from sprout_model import GPT
from sprout_model.model import Config

pytestmark = pytest.mark.unit

BOUND = limits.MAX_WEIGHT_ABS


@pytest.fixture(scope="module")
def tiny() -> HookedSprout:
    torch.manual_seed(0)
    gpt = GPT(Config(vocab_size=64, context=32, n_layer=2, n_head=2, d_model=16, d_ff=24)).eval()
    vocab = {"<|endoftext|>": 0, **{f"t{i}": i for i in range(1, 64)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    return HookedSprout(gpt, tokenizer=tok, name="tiny")


@pytest.fixture(scope="module")
def ts(tiny):
    return random_transcoders(tiny, k=4, d_transcoder=48, skip=True, seed=1)


@pytest.fixture(scope="module")
def graph(tiny, ts):
    return attribution_graph(tiny, torch.randint(1, 64, (10,), generator=torch.Generator().manual_seed(3)), ts)


def _edit_weights(path: Path, key: str, value: float, at: int = 1) -> None:
    sd = load_file(str(path))
    t = sd[key].clone()
    t.view(-1)[at] = value
    sd[key] = t
    save_file(sd, str(path))


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


# --- attribution-graph memory -----------------------------------------------------------------------------------


def test_a_transcoder_folder_whose_k_is_its_width_is_refused_at_load(tiny, ts, tmp_path):
    """k = width was accepted and a graph then asked the allocator for gigabytes; k is at most a quarter of the
    width: 12 of 48 loads, 13 and 48 are refused naming k and its range."""
    save_transcoders(ts, tmp_path, torch.float32)
    assert max_k(48) == 12 and max_k(3) == 1
    cfg_path = tmp_path / TC_CONFIG
    saved = json.loads(cfg_path.read_text())

    def with_k(k, where: str) -> None:
        """k at the set's level (circuit-tracer's key) or in layer 0's own entry (a set may mix k by layer)."""
        cfg = json.loads(json.dumps(saved))
        if where == "set":
            cfg["k"] = k
            for info in cfg["sprout"]["layers"].values():
                info.pop("k", None)  # no layer's own k: the set's applies
        else:
            cfg["sprout"]["layers"]["0"]["k"] = k
        cfg_path.write_text(json.dumps(cfg))

    for where in ("set", "layer"):
        for k, ok in ((12, True), (13, False), (48, False), (0, False)):
            with_k(k, where)
            if ok:
                assert load_transcoders(tiny, tmp_path)[0].k == 12
            else:
                refused(errors.TranscoderMismatchError, "'k'", "1..12", call=lambda: load_transcoders(tiny, tmp_path))
    refused(errors.ArgumentError, "k=48", "1..12", call=lambda: Transcoder(16, 48, 48, 0))
    refused(errors.AttributionGraphError, "k=13", "1..12", call=lambda: random_transcoders(tiny, k=13, d_transcoder=48))


def test_memory_is_estimated_and_refused_before_allocating(tiny, ts, graph):
    tokens = graph.tokens
    n_feats = graph.n_features
    need = graph_memory(2, 16, 2, tokens.numel(), n_feats, 4, graph.n_logits)
    assert need["total"] == sum(v for k, v in need.items() if k != "total")
    assert need["rows"] == 4 * len(graph.nodes) ** 2  # every node's row holds every node
    # a budget below even one kept feature: refused naming memory_budget, the estimate and the budget
    msg = refused(errors.AttributionGraphError, "memory_budget=1,000 bytes", "needs about", "bytes",
                  "MAX_GRAPH_BYTES", call=lambda: attribution_graph(tiny, tokens, ts, memory_budget=1000))
    assert "batch_size=64" in msg
    refused(errors.AttributionGraphError, "memory_budget", call=lambda: attribution_graph(tiny, tokens, ts,
                                                                                         memory_budget=0))
    # just inside the full graph's need: every feature; just outside: fewer, as many as fit, exact
    full = graph_memory(2, 16, 2, tokens.numel(), n_feats, 4, graph.n_logits, max_feature_nodes=None)["total"]
    assert attribution_graph(tiny, tokens, ts, memory_budget=full).n_features == n_feats
    tight = graph_memory(2, 16, 2, tokens.numel(), n_feats, 4, graph.n_logits, max_feature_nodes=n_feats // 4)["total"]
    assert tight < full - 1
    g = attribution_graph(tiny, tokens, ts, memory_budget=tight)
    assert g.n_features == g.info["max_feature_nodes"] and n_feats // 4 <= g.n_features < n_feats
    assert graph_memory(2, 16, 2, tokens.numel(), n_feats, 4, graph.n_logits,
                        max_feature_nodes=g.n_features + 1)["total"] > tight  # the most that fit
    assert g.max_error() < 1e-4 and g.info["n_active_features"] == n_feats
    fits = g.n_features
    # an explicit max_feature_nodes past the budget is refused naming it and the largest that fits
    refused(errors.AttributionGraphError, f"max_feature_nodes={fits + 1}", f"1..{fits}", "memory_budget=",
            call=lambda: attribution_graph(tiny, tokens, ts, memory_budget=tight, max_feature_nodes=fits + 1))
    assert attribution_graph(tiny, tokens, ts, memory_budget=tight, max_feature_nodes=fits).n_features == fits


@pytest.mark.parametrize("name, L, d, H, k", [("gpt-4", 4, 192, 3, 32), ("sprout", 8, 384, 6, 32)])
def test_the_default_budget_keeps_a_whole_context_prompt_under_it(name, L, d, H, k):
    """At the context (512 positions, k features at every layer and position but the first), the shipped models'
    full graphs would need 18 and 74 GB; the default keeps a number of features that fits 1 GiB."""
    T, nF = 512, 511 * L * k
    assert graph_memory(L, d, H, T, nF, k)["total"] > 15 * 2 ** 30
    lo = max(n for n in range(0, nF, 50) if graph_memory(L, d, H, T, nF, k, max_feature_nodes=n)["total"]
             <= limits.MAX_GRAPH_BYTES)
    assert lo >= 400, lo  # still a useful graph (circuit-tracer's own examples keep a few thousand at most)


def test_rows_through_block_0_give_the_graph_the_token_images_give(tiny, ts, graph, monkeypatch):
    """A long prompt's rows go backward through block 0 instead of holding every token's image at every position
    (pos² · d_model floats): the same edges, more multiply-adds."""
    import sprout_interp.circuits.attribution_graph as ag

    assert ag.uses_token_images(graph.n_pos, 16) and not ag.uses_token_images(512, 384)
    assert graph_memory(2, 16, 2, graph.n_pos, graph.n_features, 4)["token_images"] > 0
    assert graph_memory(2, 384, 2, 512, graph.n_features, 4)["token_images"] == 0
    monkeypatch.setattr(ag, "uses_token_images", lambda n_pos, d_model: False)
    g = attribution_graph(tiny, graph.tokens, ts)
    torch.testing.assert_close(g.adjacency, graph.adjacency, rtol=1e-5, atol=1e-6)
    assert g.max_error() < 1e-4 and g.info["macs"] > graph.info["macs"]


def test_ranking_and_moving_the_rows_a_block_at_a_time_gives_the_same_graph(tiny, ts, graph, monkeypatch):
    """Left-out features: the influence ranking scales the rows, and the kept graph is moved out of the buffer, a
    block of rows at a time once the rows pass a block's size (no second copy of the buffer): the same features,
    edges and dropped values as in one piece."""
    import sprout_interp.circuits.attribution_graph as ag

    whole = attribution_graph(tiny, graph.tokens, ts, max_feature_nodes=30, rerank_every=7)
    monkeypatch.setattr(ag, "_CHUNK_BYTES", 4 * len(graph.nodes) * 3)  # three rows at a time
    blocks = attribution_graph(tiny, graph.tokens, ts, max_feature_nodes=30, rerank_every=7)
    assert blocks.nodes[["layer", "pos", "feature"]].equals(whole.nodes[["layer", "pos", "feature"]])
    torch.testing.assert_close(blocks.adjacency, whole.adjacency, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.tensor(blocks.nodes["dropped"].values), torch.tensor(whole.nodes["dropped"].values),
                               rtol=0, atol=1e-6, equal_nan=True)
    assert blocks.max_error() < 1e-4


# --- graph files ------------------------------------------------------------------------------------------------


def _tensors(path: Path) -> dict:
    return load_file(str(path))


def _meta(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.metadata()


def test_every_field_of_a_graph_file_is_checked(graph, tmp_path):
    good = graph.save(tmp_path / "good.safetensors")
    t, meta = _tensors(good), _meta(good)
    nF, nL, n = graph.n_features, graph.n_logits, len(graph.nodes)
    load_graph(good)

    def variant(name: str, **changes) -> Path:
        p = tmp_path / f"{name}.safetensors"
        save_file({**t, **changes}, str(p), metadata=meta)
        return p

    def put(col: str, at, value) -> torch.Tensor:
        v = t[col].clone()
        v[at] = value
        return v

    logit = n - nL
    probs = t["logit_prob"][logit:]
    at_one = put("logit_prob", slice(logit, n), probs / probs.sum())  # sums to 1: just inside
    load_graph(variant("sum_one", logit_prob=at_one))
    edge = tuple(int(i) for i in (t["adjacency"] != 0).nonzero()[0])  # an edge the graph has
    load_graph(variant("big_inside", adjacency=put("adjacency", edge, MAX_GRAPH_VALUE)))
    # TopK keeps the pre-activations as they are (circuit-tracer's TopK): a feature's activation may be negative
    load_graph(variant("negative_activation", activation=put("activation", 0, -1.0)))
    bad = {
        "negative probability": (dict(logit_prob=put("logit_prob", logit, -0.01)), "'logit_prob'"),
        "probabilities past 1": (dict(logit_prob=put("logit_prob", slice(logit, n), probs / probs.sum() * 1.01)),
                                 "sum to at most 1"),
        "inf input": (dict(input=put("input", 0, float("inf"))), "'input'"),
        "nan input": (dict(input=put("input", logit, float("nan"))), "'input'"),
        "inf activation": (dict(activation=put("activation", 0, float("inf"))), "'activation'"),
        "nan activation": (dict(activation=put("activation", 0, float("nan"))), "'activation'"),
        "huge activation": (dict(activation=put("activation", 0, -MAX_GRAPH_VALUE * 1.01)), "'activation'"),
        "nan norm": (dict(norm=put("norm", nF, float("nan"))), "'norm'"),
        "huge constant": (dict(constant=put("constant", 0, 1e30)), "'constant'"),
        "huge edge": (dict(adjacency=put("adjacency", edge, MAX_GRAPH_VALUE * 1.01)), "'adjacency'"),
        "cycle": (dict(adjacency=put("adjacency", (edge[1], edge[0]), 0.5)), "cycle"),
        "edge into an error": (dict(adjacency=put("adjacency", (nF, edge[1]), 0.5)), "'adjacency'"),
        "feature layer": (dict(layer=put("layer", 0, float(graph.n_layers))), "'layer'"),
        "feature index": (dict(feature=put("feature", 0, 48.0)), "'feature' 0..47"),
        "feature order": (dict(feature=put("feature", 0, t["feature"][1])), "sorted"),
        "error layer": (dict(layer=put("layer", nF, 1.0)), "error nodes"),
        "logit layer": (dict(layer=put("layer", logit, 0.0)), "logit nodes"),
        "logit token": (dict(token_id=put("token_id", logit, float(limits.LIMITS["vocab_size"]))), "'token_id'"),
        "token_id not the prompt's": (dict(token_id=put("token_id", nF, t["token_id"][nF] + 1)), "'token_id'"),
        "tokens": (dict(tokens=put("tokens", 0, -1.0)), "'tokens'"),
    }
    for what, (changes, word) in bad.items():
        msg = refused(errors.AttributionGraphError, "not an attribution graph", word,
                      call=lambda: load_graph(variant(what.replace(" ", "_").replace("'", ""), **changes)))
        assert what and msg


# --- SAE cfg.json settings --------------------------------------------------------------------------------------


@pytest.fixture
def sae_dir(tiny, tmp_path) -> Path:
    sae = SparseAutoencoder.for_model(tiny, 1, d_sae=32, k=4, seed=2)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        sae.b_dec.copy_(torch.randn(16, generator=g) * 3)  # far from zero: subtracting it or not changes features
        sae.b_enc.copy_(torch.randn(32, generator=g) * 0.1)
    return save_sae(sae, tmp_path / "sae", torch.float32)


@pytest.mark.parametrize("apply", [True, False])
def test_apply_b_dec_to_input_is_applied_as_a_hand_written_encode(sae_dir, apply):
    _edit_json(sae_dir / SAE_CFG, apply_b_dec_to_input=apply)
    sae = read_sae(sae_dir)
    sd = {k: v.double() for k, v in load_file(str(sae_dir / SAE_WEIGHTS)).items()}
    x = torch.randn(40, 16, generator=torch.Generator().manual_seed(7), dtype=torch.float64) * 4
    pre = ((x - sd["b_dec"]) if apply else x) @ sd["W_enc"] + sd["b_enc"]  # SAELens: process_sae_in, then encode
    other = ((x - sd["b_dec"]) if not apply else x) @ sd["W_enc"] + sd["b_enc"]
    want = torch.zeros_like(pre).scatter_(-1, pre.topk(4, dim=-1).indices, pre.topk(4, dim=-1).values.relu())
    got = sae.encode(x.float()).double()
    # the cut is decided in float64 by margins far larger than float32 rounding
    gap = pre.topk(5, dim=-1).values
    assert bool((gap[:, 3] - gap[:, 4] > 1e-3).all())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(pre.topk(4, dim=-1).indices.sort(-1).values, other.topk(4, dim=-1).indices.sort(-1).values)
    assert sae.apply_b_dec_to_input is apply
    back = read_sae(save_sae(sae, sae_dir.parent / "again", torch.float32))
    assert back.apply_b_dec_to_input is apply  # written as it was read


@pytest.mark.parametrize("entry, value, ok", [
    ("normalize_activations", "none", True),
    ("normalize_activations", "expected_average_only_in", False),
    ("normalize_activations", "constant_norm_rescale", False),
    ("normalize_activations", "layer_norm", False),
    ("normalize_activations", "bogus", False),
    ("dtype", "torch.float16", True), ("dtype", "bfloat16", True), ("dtype", "float17", False), ("dtype", 32, False),
    ("apply_b_dec_to_input", 1, False), ("apply_b_dec_to_input", "true", False),
    ("reshape_activations", "hook_z", False), ("rescale_acts_by_decoder_norm", True, False),
    ("rescale_acts_by_decoder_norm", False, True), ("activation_fn", "relu", False),
])
def test_sae_settings_are_applied_or_refused_by_name(sae_dir, entry, value, ok):
    _edit_json(sae_dir / SAE_CFG, **{entry: value})
    if ok:
        read_sae(sae_dir)
    else:
        refused(errors.SAEMismatchError, entry if entry != "activation_fn" else "topk", call=lambda: read_sae(sae_dir))


# --- finite but overflowing weights -----------------------------------------------------------------------------


def _checkpoint(tmp_path: Path, changes: dict) -> Path:
    torch.manual_seed(0)
    gpt = GPT(Config(vocab_size=64, context=32, n_layer=2, n_head=2, d_model=16, d_ff=24)).eval()
    sd = {k: v.clone() for k, v in gpt.state_dict().items() if k != "head.weight"}
    for key, value in changes.items():
        sd[key] = value(sd[key]) if callable(value) else value
    make_tokenizer(tmp_path / "tokenizer.json")
    p = tmp_path / "model.pt"
    torch.save({"model": sd, "config": gpt.cfg.to_dict()}, p)
    return p


def _at(value: float):
    def put(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t.view(-1)[1] = value
        return t
    return put


@pytest.mark.usefixtures("no_shipped")
def test_a_checkpoint_that_overflows_float32_is_refused(tmp_path, monkeypatch):
    ff = "blocks.0.ffn.w1.weight"
    msg = refused(errors.InvalidWeightsError, ff, "3e+38", f"|w| <= {BOUND:g}", "MAX_WEIGHT_ABS",
                  call=lambda: load_checkpoint(_checkpoint(tmp_path, {ff: _at(3e38)})))
    assert "float32" in msg
    load_checkpoint(_checkpoint(tmp_path, {ff: _at(BOUND)}))  # just inside
    refused(errors.InvalidWeightsError, ff, call=lambda: load_checkpoint(_checkpoint(tmp_path, {ff: _at(BOUND * 1.001)})))
    # a bound moved past float32's largest (the user's to move): each weight finite, 1e12, yet a feed-forward's
    # products overflow; the probe forward refuses it
    monkeypatch.setattr(limits, "MAX_WEIGHT_ABS", 1e39)
    big = {f"blocks.0.ffn.{w}.weight": (lambda t: torch.full_like(t, 1e12)) for w in ("w1", "w3", "w2")}
    refused(errors.InvalidWeightsError, "NaN or infinite logits", "probe input",
            call=lambda: load_checkpoint(_checkpoint(tmp_path, big)))
    small = {f"blocks.0.ffn.{w}.weight": (lambda t: torch.full_like(t, 1e8)) for w in ("w1", "w3", "w2")}
    load_checkpoint(_checkpoint(tmp_path, small))  # 1e8: products reach 1e33, inside float32


def test_lens_sae_and_transcoder_weights_that_overflow_are_refused(tiny, ts, tmp_path):
    m = HookedSprout(tiny.model, tokenizer=tiny.tokenizer, name="tiny", source=str(tmp_path))
    save_tuned_lens(TunedLens.for_model(m), tmp_path, torch.float32)
    sae_dir = save_sae(SparseAutoencoder.for_model(m, 1, d_sae=32, k=4), tmp_path / "sae", torch.float32)
    tc_dir = tmp_path / "tcs"
    save_transcoders(ts, tc_dir, torch.float32)
    cases = [(tmp_path / LENS_WEIGHTS, "translators.1.weight", lambda: load_tuned_lens(m)),
             (sae_dir / SAE_WEIGHTS, "W_enc", lambda: load_sae(m, folder=sae_dir)),
             (tc_dir / "layer_1.safetensors", "W_dec", lambda: load_transcoders(m, tc_dir))]
    for path, key, load in cases:
        _edit_weights(path, key, BOUND)  # just inside
        load()
        for value in (BOUND * 1.001, -3e38):
            _edit_weights(path, key, value)
            refused(errors.InvalidWeightsError, key, f"|w| <= {BOUND:g}", call=load)
        _edit_weights(path, key, 0.0)
