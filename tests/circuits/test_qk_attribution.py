"""QK attributions and head loadings: every sum exact (key side, query side, the bilinear table, a graph edge's
parts); each component's value and each carrier group's sum against a float64 rebuild written from the chapter's
model code (tests/fixtures/course_model.py) by hand; against the real model by intervention (norm scales frozen by
hooks: exact; unfrozen: the direction and the size to first order); the argument checks; and checks that a wrong
cell, a wrong RoPE position or a dropped carrier group cannot pass. Tiny random models with random transcoders,
per-layer and cross-layer (a CLT feature writes into every later feed-forward output: each write its own part, carried
on only by later blocks' heads, checked write by write against the float64 rebuild); the shipped Sprout, gpt-4 and
gpt-1 with their own transcoders of both kinds."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_config

import sprout_interp as si
from sprout_interp.circuits.attribution_graph import attribution_graph
from sprout_interp.circuits.head_loadings import edge_heads, head_loadings
from sprout_interp.circuits.local_replacement import random_clt, random_transcoders
from sprout_interp.circuits.qk_attribution import qk_attribution, qk_maps
from sprout_interp.core.errors import AttributionGraphError, QKAttributionError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.features.clt import load_clt
from sprout_model import GPT
from sprout_model.evaluation import HELDOUT_NAME_TEXTS
from sprout_model.model import apply_rope

pytestmark = pytest.mark.unit

TOL = 1e-4
CHECKPOINTS = Path(__file__).resolve().parents[2] / "model" / "checkpoints"


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedSprout(GPT(tiny_config(n_layer=3, n_head=2, d_model=16)).eval(), name="tiny")


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(1, 64, (14,), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def clt(model):
    return random_clt(model, d_transcoder=48, density=0.1, seed=1)


def _transcoders(model, clt, tc):
    """The transcoders a case names: None (feed-forward outputs), per-layer with or without a skip connection, or
    the cross-layer transcoder."""
    if tc is None or tc == "clt":
        return None if tc is None else clt
    return random_transcoders(model, k=4, d_transcoder=48, skip=tc == "skip", seed=1)


def _sums(a) -> tuple[float, float, float]:
    return (float(a.key_components["value"].sum()), float(a.query_components["value"].sum()),
            float(a.terms["term"].sum()))


def _assert_exact(a, tol: float = TOL) -> None:
    k, q, t = _sums(a)
    scale = max(1.0, abs(a.score))
    assert abs(a.info["score_frozen"] - a.score) < tol * scale
    for s in (k, q, t):
        assert abs(s - a.score) < tol * scale, (k, q, t, a.score)
    assert a.info["push_gap"] < tol * scale


# -- exactness on tiny models ------------------------------------------------------------------------------


@pytest.mark.parametrize("tc", [None, "skip", "noskip", "clt"])
@pytest.mark.parametrize("cell", [(2, 1, 13, 4), (1, 0, 9, 9), (0, 1, 6, 2), (2, 0, 5, 0)])
def test_every_sum_is_the_score(model, tokens, clt, tc, cell):
    ts = _transcoders(model, clt, tc)
    layer, head, i, j = cell
    a = qk_attribution(model, tokens, layer, head, i, j, ts, top=7, n_components=5)
    _, cache = model.run_with_cache(tokens[None])
    assert a.score == pytest.approx(float(cache[act_name("attn_scores", layer)][0, head, i, j]), abs=1e-6)
    _assert_exact(a)
    pairs = (min(5, len(a.query_components)) + 1) * (min(5, len(a.key_components)) + 1)
    assert len(a.terms) == min(pairs, 7) + (pairs > 7)  # the 7 largest pairs and the remainder
    assert a.terms["term"].iloc[:-1].abs().is_monotonic_decreasing
    for side in (a.key_components, a.query_components):
        assert tuple(side.columns) == ("kind", "layer", "block", "pos", "token", "feature", "via_layer", "via_block",
                                       "via_head", "node", "value")
        assert (side["value"] != 0).all() and side["value"].abs().is_monotonic_decreasing
        assert set(side["kind"]) <= ({"mlp", "embedding"} if tc is None else
                                     {"feature", "error", "constant", "embedding"})
        assert ((side["via_layer"].isna()) | (side["via_layer"] < layer)).all()
        assert (side["block"] == side["layer"] + 1).all()
        by = a.key_by_head() if side is a.key_components else a.query_by_head()
        assert by["value"].sum() == pytest.approx(side["value"].sum(), abs=1e-9)
    # what never left the key's position was written there
    stays = a.key_components[a.key_components["via_layer"].isna()]
    assert (stays["pos"] == j).all()


# -- against a float64 rebuild from the chapter's model code --------------------------------------------------


def _course_copy(course, m: HookedSprout):
    c = m.cfg.sprout
    g = course.GPT(course.Config(vocab_size=c.vocab_size, context=c.context, n_layer=c.n_layer, n_head=c.n_head,
                                 d_model=c.d_model, d_ff=c.d_ff, rope_base=c.rope_base))
    g.load_state_dict(m.model.state_dict())
    return g.double().eval()


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@torch.no_grad()
def _hand_forward(course, g, tokens: torch.Tensor) -> list[dict]:
    """The chapter's forward written out by hand in float64, keeping what a frozen rerun needs: each block's
    input, ln1 scale, pattern, every head's write, the feed-forward's input (``ln2``: its normalized input times the
    gain; ``s2``: the scale) and output, the block's output and the raw per-head q and k."""
    T = tokens.numel()
    H, d = g.cfg.n_head, g.cfg.d_model
    dh = d // H
    x = g.embed.weight[tokens]
    cos, sin = g.cos[:T].double(), g.sin[:T].double()
    out = []
    for blk in g.blocks:
        s1 = _rms(x, blk.norm1.eps)
        qkv = (x / s1 * blk.norm1.weight) @ blk.attn.qkv.weight.T
        q, k, v = (t.view(T, H, dh).transpose(0, 1) for t in qkv.split(d, -1))
        qn = q / _rms(q, blk.attn.q_norm.eps) * blk.attn.q_norm.weight
        kn = k / _rms(k, blk.attn.k_norm.eps) * blk.attn.k_norm.weight
        qr, kr = course.apply_rope(qn, cos, sin), course.apply_rope(kn, cos, sin)
        scores = qr @ kr.transpose(-1, -2) / math.sqrt(dh)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        A = scores.softmax(-1)
        W_O = blk.attn.proj.weight
        heads = torch.stack([(A[h] @ v[h]) @ W_O[:, h * dh:(h + 1) * dh].T for h in range(H)])
        rec = {"x": x, "s1": s1, "A": A, "heads": heads, "q": q, "k": k, "scores": scores}
        x = x + heads.sum(0)
        rec["ln2"], rec["s2"] = blk.norm2(x), _rms(x, blk.norm2.eps)
        rec["mlp"] = blk.ffn(rec["ln2"])
        x = x + rec["mlp"]
        rec["out"] = x
        out.append(rec)
    return out


@torch.no_grad()
def _frozen_stream(g, rec: list[dict], layer: int, emb: torch.Tensor, mlps: torch.Tensor) -> torch.Tensor:
    """Block ``layer``'s input in the frozen model (patterns and ln1 scales of ``rec``) from the given writes."""
    H, d = g.cfg.n_head, g.cfg.d_model
    dh = d // H
    x = emb
    for lay in range(layer):
        blk, r = g.blocks[lay], rec[lay]
        v = ((x / r["s1"] * blk.norm1.weight) @ blk.attn.qkv.weight[2 * d:].T).view(-1, H, dh).transpose(0, 1)
        W_O = blk.attn.proj.weight
        x = x + sum((r["A"][h] @ v[h]) @ W_O[:, h * dh:(h + 1) * dh].T for h in range(H)) + mlps[lay]
    return x


@torch.no_grad()
def _frozen_score(course, g, rec: list[dict], layer: int, head: int, i: int, j: int, x_i: torch.Tensor,
                  x_j: torch.Tensor) -> float:
    """The score with ln1's and the QK-norms' scales frozen at ``rec``'s, from the streams ``x_i``, ``x_j``."""
    blk, r = g.blocks[layer], rec[layer]
    d = g.cfg.d_model
    dh = d // g.cfg.n_head
    W = blk.attn.qkv.weight
    Wq, Wk = W[:d][head * dh:(head + 1) * dh], W[d:2 * d][head * dh:(head + 1) * dh]
    sq = _rms(r["q"][head, i], blk.attn.q_norm.eps)
    sk = _rms(r["k"][head, j], blk.attn.k_norm.eps)
    q = (x_i / r["s1"][i] * blk.norm1.weight) @ Wq.T / sq * blk.attn.q_norm.weight
    k = (x_j / r["s1"][j] * blk.norm1.weight) @ Wk.T / sk * blk.attn.k_norm.weight
    cos, sin = g.cos.double(), g.sin.double()
    return float(course.apply_rope(q, cos[i], sin[i]) @ course.apply_rope(k, cos[j], sin[j]) / math.sqrt(dh))


@pytest.mark.parametrize("cell", [(2, 1, 13, 4), (2, 0, 11, 11), (1, 1, 8, 3)])
def test_values_against_a_float64_rebuild(course, model, tokens, cell):
    layer, head, i, j = cell
    a = qk_attribution(model, tokens, layer, head, i, j)
    g = _course_copy(course, model)
    rec = _hand_forward(course, g, tokens)
    assert float(rec[layer]["scores"][head, i, j]) == pytest.approx(a.score, abs=1e-5)
    L = model.cfg.n_layers
    emb = g.embed.weight[tokens]
    mlps = torch.stack([r["mlp"] for r in rec] + [torch.zeros_like(emb)] * (L - len(rec)))
    x = _frozen_stream(g, rec, layer, emb, mlps)
    assert torch.allclose(x, rec[layer]["x"], atol=1e-10)  # the frozen model reproduces the stream
    score = _frozen_score(course, g, rec, layer, head, i, j, x[i], x[j])
    assert score == pytest.approx(a.score, abs=1e-5)
    for side, pos, comps in (("key", j, a.key_components), ("query", i, a.query_components)):
        def moved(x_side):
            return _frozen_score(course, g, rec, layer, head, i, j, *((x[i], x_side) if side == "key" else
                                                                     (x_side, x[j])))
        # each node removed from the stream (all its carrier groups at once): the score drops by their sum
        for kind in ("embedding", "mlp"):
            for _, row in comps[comps["kind"] == kind].drop_duplicates(["layer", "pos"]).head(3).iterrows():
                e, mm = emb.clone(), mlps.clone()
                if kind == "embedding":
                    e[row["pos"]] = 0
                else:
                    mm[row["layer"], row["pos"]] = 0
                mine = comps[(comps["kind"] == kind) & (comps["layer"] == row["layer"]) & (comps["pos"] == row["pos"])]
                got = score - moved(_frozen_stream(g, rec, layer, e, mm)[pos])
                assert float(mine["value"].sum()) == pytest.approx(got, abs=TOL)
        # each carrier group: that head's write at the position alone; the rest: what was written there
        by = comps.groupby(["via_layer", "via_head"], dropna=False)["value"].sum()
        for lay in range(layer):
            for h in range(model.cfg.n_heads):
                want = moved(rec[lay]["heads"][h, pos])
                assert float(by.get((lay, h), 0.0)) == pytest.approx(want, abs=TOL)
        stays = emb[pos] + mlps[:layer, pos].sum(0)
        assert float(comps.loc[comps["via_layer"].isna(), "value"].sum()) == pytest.approx(moved(stays), abs=TOL)


@pytest.mark.parametrize("tc", ["noskip", "clt"])
@pytest.mark.parametrize("cell", [(2, 1, 13, 4), (2, 0, 11, 11)])
def test_each_position_and_carrier_gets_the_same_part_whatever_the_nodes(model, tokens, clt, tc, cell):
    """What the nodes written at one position and carried last by one head add up to does not depend on what the
    nodes are: each feed-forward's output whole, per-layer transcoder features without a skip connection (with
    their errors and constants), or a CLT's features, each of whose writes counts at its own block (a feature of
    layer 0 writes into blocks 1 and 2 here)."""
    layer, head, i, j = cell
    whole = qk_attribution(model, tokens, layer, head, i, j)
    split = qk_attribution(model, tokens, layer, head, i, j, _transcoders(model, clt, tc))
    keys = ["pos", "via_layer", "via_head"]
    for a, b in ((whole.key_components, split.key_components), (whole.query_components, split.query_components)):
        sa = a.groupby(keys, dropna=False)["value"].sum()
        sb = b.groupby(keys, dropna=False)["value"].sum().reindex(sa.index, fill_value=0.0)
        assert len(sa) > 5 and np.abs(sa.to_numpy() - sb.to_numpy()).max() < TOL
    if tc == "clt":  # layer 0's features write twice below block 3: some carried by block-2 heads, some staying
        k = split.key_components
        k0 = k[(k["kind"] == "feature") & (k["layer"] == 0)]
        assert k0["via_layer"].notna().any() and k0["via_layer"].isna().any()


def _clt_writes(g, rec: list[dict], clt, layer: int, pos: int, feature: int) -> torch.Tensor:
    """A CLT feature's writes in float64 from the hand-written forward, (n_layers, pos, d) as feed-forward outputs:
    its pre-activation read off the feed-forward's input by hand (the table lists it as active, so JumpReLU passes
    it: no threshold is decided here) times its decoder row to each layer ``j >= layer``, at its position."""
    L, T = len(rec), rec[0]["x"].shape[0]
    W_enc, b_enc = clt.W_enc[layer].double(), clt.b_enc[layer].double()
    act = rec[layer]["ln2"][pos] @ W_enc[feature] + b_enc[feature]
    out = torch.zeros(L, T, g.cfg.d_model, dtype=torch.float64)
    for j in range(layer, L):
        out[j, pos] = act * clt.W_dec[layer][feature, j - layer].double()
    return out


@torch.no_grad()
def _hand_carriers(g, rec: list[dict], writes: torch.Tensor, n_via: int, pos: int, read) -> dict:
    """The parts of ``writes`` (feed-forward outputs, (n_layers, pos, d), no embeddings) at ``pos`` by last carrier,
    in the frozen model of ``rec`` with no skip connection, each read by the linear map ``read``: for head ``(l, h)``
    of the first ``n_via`` blocks, that head's output at ``pos`` from the stream ``writes`` make at block ``l``'s
    input; None: the writes made at ``pos`` below block ``n_via`` (never moved)."""
    H, d = g.cfg.n_head, g.cfg.d_model
    dh = d // H
    out = {None: read(writes[:n_via, pos].sum(0))}
    zero = torch.zeros_like(rec[0]["x"])
    for lay in range(n_via):
        blk, r = g.blocks[lay], rec[lay]
        x = _frozen_stream(g, rec, lay, zero, writes)
        v = ((x / r["s1"] * blk.norm1.weight) @ blk.attn.qkv.weight[2 * d:].T).view(-1, H, dh).transpose(0, 1)
        W_O = blk.attn.proj.weight
        for h in range(H):
            out[(lay, h)] = read((r["A"][h, pos] @ v[h]) @ W_O[:, h * dh:(h + 1) * dh].T)
    return out


def _by_carrier(rows) -> dict:
    return {(None if pd.isna(vl) else (int(vl), int(vh))): float(v)
            for vl, vh, v in zip(rows["via_layer"], rows["via_head"], rows["value"])}


@pytest.mark.parametrize("cell", [(2, 1, 13, 4), (2, 0, 11, 11), (2, 1, 9, 2)])
def test_clt_features_against_a_float64_rebuild(course, model, tokens, clt, cell):
    """Each of the largest CLT features of each side, every carrier group: its value is the score (the other side
    whole) of what that head, written out by hand in float64 from the chapter's model code, brought to the position
    from the feature's writes into every feed-forward output below the score's block (none: its writes at the
    position itself); and removing all its writes from the frozen stream moves the score by the sum of its rows.
    Every component pushed forward write by write (the bilinear table's vectors) agrees with the backward pass."""
    layer, head, i, j = cell
    a = qk_attribution(model, tokens, layer, head, i, j, clt, top=5, n_components=4096)
    assert len(a.terms) == 6 and a.info["push_gap"] < TOL * max(1.0, abs(a.score))
    g = _course_copy(course, model)
    rec = _hand_forward(course, g, tokens)
    emb = g.embed.weight[tokens]
    mlps = torch.stack([r["mlp"] for r in rec])
    x = _frozen_stream(g, rec, layer, emb, mlps)
    score = _frozen_score(course, g, rec, layer, head, i, j, x[i], x[j])
    checked = twice = 0
    for side, pos, comps in (("key", j, a.key_components), ("query", i, a.query_components)):
        def moved(x_side):
            return _frozen_score(course, g, rec, layer, head, i, j, *((x[i], x_side) if side == "key" else
                                                                     (x_side, x[j])))
        feats = comps[comps["kind"] == "feature"].drop_duplicates(["layer", "pos", "feature"]).head(4)
        for f in feats.itertuples():
            w = _clt_writes(g, rec, clt, f.layer, f.pos, f.feature)
            mine = comps[(comps["kind"] == "feature") & (comps["layer"] == f.layer) & (comps["pos"] == f.pos)
                         & (comps["feature"] == f.feature)]
            want = _hand_carriers(g, rec, w, layer, pos, moved)
            got = _by_carrier(mine)
            assert set(got) <= set(want)
            for via, v in want.items():
                assert got.get(via, 0.0) == pytest.approx(v, abs=TOL), (side, f, via)
            removed = score - moved(_frozen_stream(g, rec, layer, emb, mlps - w)[pos])
            assert float(mine["value"].sum()) == pytest.approx(removed, abs=TOL)
            checked += 1
            twice += int(f.layer < layer - 1 and len(mine) > 1)
    assert checked >= 6 and twice >= 1  # a feature with writes into two blocks, parts from more than one carrier


def test_wrong_cells_rope_or_a_dropped_group_cannot_pass(model, tokens):
    """The checks above have power: a swapped query and key, a RoPE position off by one, or one carrier group
    left out each miss the real score by far more than the tolerance."""
    layer, head, i, j = 2, 1, 13, 4
    real = qk_attribution(model, tokens, layer, head, i, j)
    good = qk_maps(model, layer, head, tokens, i, j)
    assert float((good["x_q"] @ good["MQ"]) @ (good["x_k"] @ good["MK"])) / good["scale"] == pytest.approx(
        real.score, abs=1e-5)
    # a swapped cell: the query made at j and the key at i
    sw = qk_maps(model, layer, head, tokens, j, i)
    assert abs(float((sw["x_q"] @ sw["MQ"]) @ (sw["x_k"] @ sw["MK"])) / sw["scale"] - real.score) > 50 * TOL
    # RoPE one position off on the key side: one more rotation step
    cos, sin = model.model.cos.float(), model.model.sin.float()
    off = apply_rope(good["MK"], cos[1], sin[1])
    wrong = float((good["x_q"] @ good["MQ"]) @ (good["x_k"] @ off)) / good["scale"]
    assert abs(wrong - real.score) > 50 * TOL
    # a dropped carrier group: the key side no longer adds up
    by = real.key_by_head()
    assert abs(float(by["value"].iloc[1:].sum()) - real.score) > 50 * TOL


# -- head loadings ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tc", ["skip", "noskip", "clt"])
@pytest.mark.parametrize("bos", [True, False], ids=["bos", "nobos"])
def test_head_loadings_add_up_to_every_edge(model, tokens, clt, tc, bos):
    ts = _transcoders(model, clt, tc)
    g = attribution_graph(model, tokens[:10], ts, bos=bos)
    mask = g.adjacency != 0
    df = head_loadings(model, g, mask, ts)
    s = df.groupby(["target", "source"])["value"].sum()
    assert len(s) == int(mask.sum())
    t = torch.tensor(s.index.get_level_values(0).to_numpy())
    src = torch.tensor(s.index.get_level_values(1).to_numpy())
    assert np.abs(s.to_numpy() - g.adjacency[t, src].double().numpy()).max() < 1e-5
    assert ((df["via_layer"].isna()) | (df["via_layer"] <= torch.tensor(g.nodes["layer"].to_numpy())[
        torch.tensor(df["target"].to_numpy())].numpy())).all()
    # an edge between positions is carried by heads only; one edge alone gives the same parts
    nodes = g.nodes
    cross = df[(nodes["pos"].to_numpy()[df["target"]] != nodes["pos"].to_numpy()[df["source"]])]
    assert cross["via_layer"].notna().all()
    row = df.iloc[int(np.argmax(df["value"].abs().to_numpy()))]
    one = edge_heads(model, g, int(row["source"]), int(row["target"]), ts)
    assert float(one["value"].sum()) == pytest.approx(float(g.adjacency[int(row["target"]), int(row["source"])]),
                                                      abs=1e-5)


def test_head_loadings_of_a_graph_with_fewer_features(model, tokens):
    """A graph that keeps some features only (max_feature_nodes): its nodes are found among the prompt's active
    features, and the parts still add up to each of its edges (its pruned edges, the default)."""
    ts = random_transcoders(model, k=4, d_transcoder=48, seed=1)
    g = attribution_graph(model, tokens, ts, max_feature_nodes=9)
    assert g.n_features == 9 < g.info["n_active_features"]
    df = head_loadings(model, g, None, ts)
    s = df.groupby(["target", "source"])["value"].sum()
    t = torch.tensor(s.index.get_level_values(0).to_numpy())
    src = torch.tensor(s.index.get_level_values(1).to_numpy())
    assert len(s) > 0 and np.abs(s.to_numpy() - g.adjacency[t, src].double().numpy()).max() < 1e-5


def test_head_loadings_refuse_what_they_cannot_use(model, tokens):
    ts = random_transcoders(model, k=4, d_transcoder=48, seed=1)
    g = attribution_graph(model, tokens[:8], ts)
    emb = int((g.nodes["kind"] == "embedding").to_numpy().argmax())
    with pytest.raises(QKAttributionError, match="is no edge"):
        head_loadings(model, g, [(emb, emb)], ts)
    with pytest.raises(QKAttributionError, match="target"):
        head_loadings(model, g, [(10 ** 6, 0)], ts)
    with pytest.raises(QKAttributionError, match="transcoders the graph was made with"):
        head_loadings(model, g, None, random_transcoders(model, k=4, d_transcoder=48, seed=7))


def test_head_loadings_refuse_transcoders_of_another_kind(model, tokens, clt):
    """A graph over a CLT with per-layer transcoders, or the other way round: named, not misread."""
    ts = random_transcoders(model, k=4, d_transcoder=48, seed=1)
    g_clt, g_pl = attribution_graph(model, tokens[:8], clt), attribution_graph(model, tokens[:8], ts)
    with pytest.raises(QKAttributionError, match=r"over a cross-layer transcoder \('clt'\) but transcoders is per-layer"):
        head_loadings(model, g_clt, None, ts)
    with pytest.raises(QKAttributionError, match=r"over per-layer transcoders \('per_layer'\) but transcoders is a cross"):
        edge_heads(model, g_pl, 0, len(g_pl.nodes) - 1, clt)
    with pytest.raises(QKAttributionError, match="transcoders the graph was made with"):
        head_loadings(model, g_clt, None, random_clt(model, d_transcoder=48, density=0.1, seed=7))


@pytest.mark.parametrize("bos", [True, False], ids=["bos", "nobos"])
def test_clt_head_loadings_against_a_float64_rebuild(course, model, tokens, clt, bos):
    """A CLT graph's edges from a feature at another position into a block-3 feature and into the top logit, each
    split by carrier, against the float64 frozen model written out by hand from the chapter's model code: the
    source's writes into every feed-forward output (its activation read off by hand), carried to the target's
    position by that head alone at the end, read by the target (its encoder row through ln2's frozen scale; the
    logit's demeaned unembedding through the final norm's frozen scale)."""
    g = attribution_graph(model, tokens, clt, bos=bos)
    nodes = g.nodes
    course_g = _course_copy(course, model)
    toks = g.tokens
    rec = _hand_forward(course, course_g, toks)
    L = model.cfg.n_layers
    nF = g.n_features
    kind, lay, pos = (nodes[c].to_numpy() for c in ("kind", "layer", "pos"))
    logit = int(np.nonzero(kind == "logit")[0][0])
    feats = np.nonzero((kind == "feature") & (lay == L - 1))[0]
    target = int(feats[int(g.adjacency[torch.tensor(feats)][:, :nF].abs().amax(1).argmax())])
    pairs = []
    for t in (target, logit):
        w = g.adjacency[t, :nF].abs().double().numpy() * ((lay[:nF] == 0) & (pos[:nF] != pos[t]))
        for src in np.argsort(-w, kind="stable")[:3]:
            if w[src] > 0:
                pairs.append((t, int(src)))
    assert len(pairs) == 6
    df = head_loadings(model, g, pairs, clt)
    W_U = course_g.head.weight
    x_final = rec[-1]["out"][-1]
    s_final = _rms(x_final, course_g.norm.eps)
    for t, src in pairs:
        if t == logit:
            u = (W_U[int(nodes["token_id"].iloc[t])] - W_U.mean(0)) * course_g.norm.weight / s_final
            n_via = L
        else:
            tl, tp, tf = int(lay[t]), int(pos[t]), int(nodes["feature"].iloc[t])
            u = clt.W_enc[tl][tf].double() * course_g.blocks[tl].norm2.weight / rec[tl]["s2"][tp]
            n_via = tl + 1  # a feature reads after its own block's attention
        w = _clt_writes(course_g, rec, clt, int(lay[src]), int(pos[src]), int(nodes["feature"].iloc[src]))
        want = _hand_carriers(course_g, rec, w, n_via, int(pos[t]), lambda v: float(v @ u))
        got = _by_carrier(df[(df["target"] == t) & (df["source"] == src)])
        scale = max(1.0, abs(float(g.adjacency[t, src])))
        assert None not in got and set(got) <= set(want)  # between positions: carried by heads only
        for via, v in want.items():
            assert got.get(via, 0.0) == pytest.approx(v, abs=TOL * scale), (t, src, via)
        assert sum(want.values()) == pytest.approx(float(g.adjacency[t, src]), abs=TOL * scale)


# -- arguments ---------------------------------------------------------------------------------------------------


@pytest.mark.unchecked_types
@pytest.mark.parametrize("kw, match", [
    (dict(layer=True), "layer=True"), (dict(layer=3), "layer=3 is out of range: layer is 0..2"),
    (dict(head=2), "head is 0..1"), (dict(head=1.0), "not a whole number"),
    (dict(query_pos=14), "query_pos is 0..13"), (dict(key_pos=9), "key_pos=9 is after query_pos=5"),
    (dict(top=0), "top"), (dict(n_components=False), "n_components"),
])
def test_arguments_are_checked(model, tokens, kw, match):
    args = dict(layer=1, head=0, query_pos=5, key_pos=2) | kw
    with pytest.raises(QKAttributionError, match=match):
        qk_attribution(model, tokens, args.pop("layer"), args.pop("head"), args.pop("query_pos"),
                       args.pop("key_pos"), **args)


def test_negative_positions_count_from_the_end_and_batches_are_refused(model, tokens):
    a = qk_attribution(model, tokens, 1, 0, -1, -3)
    assert (a.query_pos, a.key_pos) == (13, 11)
    with pytest.raises(AttributionGraphError, match="one prompt"):
        qk_attribution(model, torch.stack([tokens, tokens]), 1, 0, 3, 1)


# -- the shipped checkpoints -------------------------------------------------------------------------------------


def _need(name: str) -> None:
    if not (CHECKPOINTS / name / "model.safetensors").is_file():
        pytest.skip(f"the shipped {name} checkpoint is not installed")


@pytest.fixture(scope="module")
def sprout():
    _need("sprout")
    return si.load("sprout")


def _name_cell(m, text: str, name: str) -> tuple[torch.Tensor, int, int]:
    """The prompt's ids, the second occurrence of the name's first token, the token after its first occurrence."""
    ids = m.prepare_input(text)[0][0]
    first = m.prepare_input(" " + name.split()[0])[0][0][0]
    at = (ids == first).nonzero()[:, 0].tolist()
    assert len(at) == 2
    return ids, at[1], at[0] + 1


@pytest.mark.integration
@pytest.mark.parametrize("which", [0, 1])  # held-out names, never trained on
def test_exact_on_sprout_with_and_without_transcoders(sprout, which):
    name, text = HELDOUT_NAME_TEXTS[which]
    ids, i, j = _name_cell(sprout, text, name)
    ids = ids[:i + 3 + 4 * which]  # texts of different lengths
    for ts in (None, si.sae.load_transcoders(sprout), load_clt(sprout)):
        a = qk_attribution(sprout, ids, 1, 0, i, j, ts)
        _assert_exact(a)
        # the chapter's K-composition: most of the induction head's key is the first occurrence's token, carried
        # to the next position by block-1 heads (a loose bound: 77-88% over the held-out names, on both sides of it)
        k = a.key_components
        assert k[(k["pos"] == j - 1) & (k["via_layer"] == 0)]["value"].sum() > 0.5 * a.score
        print(f"sprout {name!r} {a.info['transcoder_kind']}: score {a.score:.3f}, "
              f"key by head:\n{a.key_by_head().round(3).to_string()}")


@pytest.mark.integration
def test_exact_on_gpt4_and_gpt1(gpt4):
    name, text = HELDOUT_NAME_TEXTS[2]
    ids = gpt4.prepare_input(text)[0][0]
    ts = si.sae.load_transcoders(gpt4)
    for T, cell in ((ids.numel(), (3, 2, -1, 7)), (20, (1, 1, 19, 12))):
        for tc in (None, ts, load_clt(gpt4)):
            _assert_exact(qk_attribution(gpt4, ids[:T], *cell, tc))
    _need("gpt-1")
    _assert_exact(qk_attribution(si.load("gpt-1"), ids[:30], 0, 2, 29, 5))


def _frozen_hooks(m, layer: int, head: int, clean) -> list:
    """Hooks that hold block ``layer``'s ln1 scale and its QK-norm scales at their clean values (``clean``: a
    cache of the unchanged run), so the score is linear in the stream there."""
    d_raw = {}
    sq = _rms(clean[act_name("q", layer)].float(), m.blocks[layer].attn.module.q_norm.eps)
    sk = _rms(clean[act_name("k", layer)].float(), m.blocks[layer].attn.module.k_norm.eps)

    def keep(name):
        def f(act, hook):
            d_raw[name] = act
            return act
        return f

    def normed(name, s, w):
        def f(act, hook):
            return (d_raw[name].float() / s * w).to(act.dtype)
        return f

    attn = m.blocks[layer].attn
    return [(act_name("scale", layer, "ln1"), lambda act, hook: clean[act_name("scale", layer, "ln1")]),
            (act_name("q", layer), keep("q")), (act_name("k", layer), keep("k")),
            (f"blocks.{layer}.attn.q_norm.hook_normalized", normed("q", sq, attn.q_norm.w.detach().float())),
            (f"blocks.{layer}.attn.k_norm.hook_normalized", normed("k", sk, attn.k_norm.w.detach().float()))]


@pytest.mark.integration
def test_against_the_real_sprout_by_intervention(sprout):
    """(a) norm scales frozen by hooks: removing the top key-side carrier group's write (that head's output at the
    key) moves the real score by minus the group's sum, exactly; (b) unfrozen, zeroing that head's z at the key
    moves the score and the attention probability the way the table says, about as far; (c) one transcoder
    feature's decoder write at the key removed: exact when frozen, the right direction when not."""
    m = sprout
    name, text = HELDOUT_NAME_TEXTS[0]
    ids, i, j = _name_cell(m, text, name)
    layer, head = 1, 0
    a = qk_attribution(m, ids, layer, head, i, j)
    by = a.key_by_head()
    top = by[by["via_layer"].notna()].iloc[0]
    l, h, part = int(top["via_layer"]), int(top["via_head"]), float(top["value"])
    _, clean = m.run_with_cache(ids[None])
    score = act_name("attn_scores", layer)
    write = clean[act_name("z", l)][0, j, h] @ m.blocks[l].attn.W_O[h]

    def minus(vec, at):
        def f(act, hook):
            out = act.clone()
            out[0, at] -= vec.to(act.dtype)
            return out
        return f

    got = {}

    def grab(act, hook):
        got["s"] = act[0, head, i, j].item()
        return act

    def grab_p(act, hook):
        got["p"] = act[0, head, i, j].item()
        return act

    with torch.no_grad():
        m.run_with_hooks(ids[None], fwd_hooks=_frozen_hooks(m, layer, head, clean) + [
            (act_name("resid_pre", layer), minus(write, j)), (score, grab)])
    assert got["s"] - a.score == pytest.approx(-part, abs=TOL)  # (a)

    def no_z(act, hook):
        out = act.clone()
        out[0, j, h] = 0
        return out

    with torch.no_grad():
        m.run_with_hooks(ids[None], fwd_hooks=[(act_name("z", l), no_z), (score, grab),
                                               (act_name("pattern", layer), grab_p)])
    real = got["s"] - a.score
    p0 = clean[act_name("pattern", layer)][0, head, i, j].item()
    print(f"(b) head L{l}H{h} at the key: table {-part:+.3f}, real {real:+.3f} (ratio {real / -part:.2f}); "
          f"attention {p0:.3f} -> {got['p']:.3f}")
    assert np.sign(real) == np.sign(-part) and np.sign(got["p"] - p0) == np.sign(-part)  # (b)
    assert 0.25 < real / -part < 4
    # (c) a layer-0 feature at the key: nothing but the key side reads it before this score
    ts = si.sae.load_transcoders(m)
    b = qk_attribution(m, ids, layer, head, i, j, ts)
    kc = b.key_components
    f = kc[(kc["kind"] == "feature") & (kc["layer"] == layer - 1) & (kc["pos"] == j)].iloc[0]
    acts = ts[layer - 1].encode(clean[act_name("normalized", layer - 1, "ln2")][0, j] * m.blocks[layer - 1].ln2.w)
    vec = acts[int(f["feature"])] * ts[layer - 1].W_dec[int(f["feature"])]
    with torch.no_grad():
        m.run_with_hooks(ids[None], fwd_hooks=_frozen_hooks(m, layer, head, clean) + [
            (act_name("mlp_out", layer - 1), minus(vec, j)), (score, grab)])
        assert got["s"] - b.score == pytest.approx(-float(f["value"]), abs=TOL)
        m.run_with_hooks(ids[None], fwd_hooks=[(act_name("mlp_out", layer - 1), minus(vec, j)), (score, grab)])
    print(f"(c) feature L{layer - 1} f{int(f['feature'])} at the key: table {-float(f['value']):+.4f}, real "
          f"{got['s'] - b.score:+.4f}")
    if abs(float(f["value"])) > 0.05:
        assert np.sign(got["s"] - b.score) == np.sign(-float(f["value"]))


def _all_frozen_hooks(m, layer: int, head: int, clean, keep_pos: int, mlp_out: dict) -> list:
    """The real model made the frozen linear model below block ``layer``: every lower block's pattern and ln1
    scale held at ``clean``'s, its feed-forward output replaced by ``mlp_out[l]``; block ``layer``'s ln1 and
    QK-norm scales held (:func:`_frozen_hooks`); its input at ``keep_pos`` held too (one side of the score
    unchanged)."""
    def put(value):
        return lambda act, hook: value.to(act.dtype)

    def keep(act, hook):
        out = act.clone()
        out[0, keep_pos] = clean[hook.name][0, keep_pos]
        return out

    hooks = []
    for lay in range(layer):
        hooks += [(act_name("pattern", lay), put(clean[act_name("pattern", lay)])),
                  (act_name("scale", lay, "ln1"), put(clean[act_name("scale", lay, "ln1")])),
                  (act_name("mlp_out", lay), put(mlp_out[lay]))]
    return hooks + [(act_name("resid_pre", layer), keep)] + _frozen_hooks(m, layer, head, clean)


@pytest.mark.integration
def test_a_clt_feature_removed_from_the_frozen_real_sprout(sprout):
    """Sprout's shipped CLT, block 3 head 0 at the name's cell: the key side's largest feature of layer 0 writes
    into the feed-forward outputs of blocks 1 and 2, carried to the key by block-2 heads or not at all; taking both
    writes out of the real model, hooked into the frozen linear model (patterns, norm scales, the other feed-forward
    outputs held; the query's stream held), moves the score by minus the sum of its rows."""
    m = sprout
    name, text = HELDOUT_NAME_TEXTS[1]
    ids, i, j = _name_cell(m, text, name)
    ids = ids[:i + 1]
    layer, head = 2, 0
    clt = load_clt(m)
    a = qk_attribution(m, ids, layer, head, i, j, clt)
    _assert_exact(a)
    kc = a.key_components
    f0 = kc[(kc["kind"] == "feature") & (kc["layer"] == 0)]
    sums = f0.groupby(["pos", "feature"])["value"].sum()
    p, k = sums.index[int(np.argmax(sums.abs().to_numpy()))]
    p, k = int(p), int(k)
    rows = f0[(f0["pos"] == p) & (f0["feature"] == k)]
    names = [act_name("pattern", lay) for lay in range(layer)] + [act_name("scale", lay, "ln1") for lay in
                                                                   range(layer + 1)]
    names += [act_name(n, lay) for lay in range(layer) for n in ("mlp_out",)] + [
        act_name("normalized", 0, "ln2"), act_name("resid_pre", layer), act_name("q", layer), act_name("k", layer)]
    _, clean = m.run_with_cache(ids[None], names_filter=names)
    with torch.no_grad():
        act = clt.encode_layer(0, clean[act_name("normalized", 0, "ln2")][0, p].float() * m.blocks[0].ln2.w.float())[k]
    assert float(act) > 0
    mlp_out = {}
    for lay in range(layer):
        out = clean[act_name("mlp_out", lay)].clone()
        out[0, p] -= (act * clt.W_dec[0][k, lay]).to(out.dtype)
        mlp_out[lay] = out
    got = {}

    def grab(act_, hook):
        got["s"] = act_[0, head, i, j].item()
        return act_

    with torch.no_grad():
        m.run_with_hooks(ids[None], fwd_hooks=_all_frozen_hooks(m, layer, head, clean, i, mlp_out) + [
            (act_name("attn_scores", layer), grab)])
    print(f"CLT feature L0 f{k} at {p}: rows {len(rows)}, sum {float(rows['value'].sum()):+.4f}; frozen real "
          f"removal {got['s'] - a.score:+.4f}")
    assert got["s"] - a.score == pytest.approx(-float(rows["value"].sum()), abs=TOL * max(1.0, abs(a.score)))
    assert abs(float(rows["value"].sum())) > 100 * TOL and len(rows) > 1  # a part the check sees, several carriers


@pytest.mark.integration
def test_head_loadings_of_gpt4s_clt_graph_add_up(gpt4):
    """gpt-4's default graph is over its shipped CLT: head loadings take it with ``transcoders=None`` (the shipped
    CLT, the graph's kind), and each pruned edge's parts add up to it."""
    name, text = HELDOUT_NAME_TEXTS[2]
    ids = gpt4.prepare_input(text)[0][0][:24]
    g = attribution_graph(gpt4, ids, kind="clt", max_feature_nodes=150)
    assert g.transcoder_kind == "clt"
    df = head_loadings(gpt4, g)
    s = df.groupby(["target", "source"])["value"].sum()
    t = torch.tensor(s.index.get_level_values(0).to_numpy())
    src = torch.tensor(s.index.get_level_values(1).to_numpy())
    assert len(s) > 50 and np.abs(s.to_numpy() - g.adjacency[t, src].double().numpy()).max() < 1e-4
    assert df["via_layer"].notna().mean() > 0.1  # edges carried between positions are there
