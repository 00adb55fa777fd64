"""QK attributions: why a head looks where it looks (Kamath, Ameisen et al. 2025, "Tracing Attention Computation
Through Feature Interactions"), exact in the frozen local replacement model, with each part of the query and the
key split by the attention head that last carried it there.

Sprout's pre-softmax score of head ``h`` of block ``L`` (``blocks.{L}.attn.hook_attn_scores``) at query ``i`` and
key ``j`` is ``q_i · k_j / sqrt(d_head)`` with ``q_i = RoPE_i(g_q ⊙ (W_Q^h ln1(x_i)) / s_q)`` and
``k_j = RoPE_j(g_k ⊙ (W_K^h ln1(x_j)) / s_k)``: ``ln1(x) = g1 ⊙ x / s1`` and ``s1``, ``s_q``, ``s_k`` the RMS
scales of ln1 and of the per-head QK-norms. With those scales frozen at their values on the prompt (RoPE is fixed
by the positions), ``q_i`` is linear in the stream ``x_i`` and ``k_j`` in ``x_j``, so
``score = g_key · x_j = g_query · x_i`` exactly, with ``g_key = ∂score/∂x_j`` (scales frozen), and any split of
``x_j`` into parts splits the score.

The parts (each side's *components*): the stream at block ``L``'s input is split in the frozen local replacement
model (:mod:`~sprout_interp.circuits.local_replacement`: patterns and every norm's scale frozen, each feed-forward
replaced by its transcoder plus an error node, or all of them by a cross-layer transcoder, whose feature of layer
``i`` writes into every feed-forward output ``j >= i``; with ``transcoders=None`` each feed-forward's whole output per
position is one node instead, kind ``mlp``) into every node's contribution, by the head that last carried it to the
position (:mod:`~sprout_interp.circuits.carriers`): ``via`` empty for what was written at the position and never
left it, ``via (l, h)`` for what head ``(l, h)`` wrote there (whatever earlier paths brought it to the positions
that head read). A cross-layer transcoder's feature is one component per last carrier, the sum over each of its
writes (a write into block ``j``'s output is carried on only by heads of later blocks). A component's ``value`` is
the score with that component alone on its side and the whole other side; each side's values add up to the score.

``terms``, the bilinear table: the ``n_components`` largest components of each side by ``|value|`` and one
"rest of the side" component each, every (query, key) pair's term ``q_a · k_b / sqrt(d_head)`` (``q_a`` the query
that component alone makes, pushed forward along its carrier group), the ``top`` largest by ``|term|`` and one
row with the rest: it adds up to the score too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor

from sprout_interp.circuits.carriers import (
    Carried,
    carried_backward,
    carried_forward,
    frozen_maps,
    mlp_replacement,
    n_nodes,
    node_writes,
)
from sprout_interp.circuits.local_replacement import (
    LocalReplacement,
    TranscodersLike,
    local_replacement,
    prompt_tokens,
    resolve_transcoders,
)
from sprout_interp.core.arguments import check_count, check_index
from sprout_interp.core.errors import QKAttributionError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout, as_hooked
from sprout_model.model import apply_rope

__all__ = ["QKAttribution", "qk_attribution", "KINDS", "COMPONENT_COLUMNS", "QK_UNITS", "component_label", "by_head",
           "qk_maps", "side_components"]

#: a component's kinds (the ``kind`` column's categories)
KINDS = ("feature", "error", "mlp", "embedding", "constant")
#: the columns of ``key_components`` / ``query_components``
COMPONENT_COLUMNS = ("kind", "layer", "block", "pos", "token", "feature", "via_layer", "via_block", "via_head", "node",
                     "value")
QK_UNITS = ("value / term: pre-softmax attention score (q · k / sqrt(d_head), hook_attn_scores); layer 0-indexed "
            "(embedding -1), block = layer + 1, pos 0-based; via_*: the head that last carried the component to the "
            "position (NA: written there and never moved)")


@dataclass(frozen=True)
class QKAttribution:
    """One attention score explained (see the module docstring).

    Attributes:
        score: the real model's pre-softmax score (``hook_attn_scores[0, head, query_pos, key_pos]``).
        layer, head, query_pos, key_pos: the cell; tokens (pos,): the prompt as the model read it.
        key_components, query_components: one row per component of that side's stream at block ``layer``'s input,
            largest ``|value|`` first: ``kind`` (feature, error, mlp, embedding, constant), ``layer`` (of the node;
            -1 for an embedding), ``block``, ``pos`` (where it was written), ``token`` (the token there),
            ``feature`` (-1 unless a feature), ``via_layer``, ``via_block``, ``via_head`` (the last carrier head;
            NA when it never left its position), ``node`` (its index in the attribution graph's node order for this
            prompt with ``bos=False`` and every feature; without transcoders, ``layer * pos_count + pos`` for a
            feed-forward output and ``n_layers * pos_count + pos`` for an embedding; -1 for a constant), ``value``
            (score units). Rows whose
            value is exactly 0 are left out (``info["zero_rows"]`` counts them).
        terms: ``query``, ``key`` (labels, :func:`component_label`), ``query_row``, ``key_row`` (row of the
            component tables; NA for a side's rest or the remainder), ``term``; the largest ``|term|`` first, the
            last row the remainder (``"(other pairs)"``).
        info: the model, the transcoders and their kind (``transcoder_kind``: "none", "per_layer" or "clt"), the
            score rebuilt in the frozen model (``score_frozen``), the QK maps'
            scale ``sqrt(d_head)``, ``zero_rows``, and ``push_gap``: the largest gap between a kept component's
            value and the score its pushed-forward vector makes with the whole other side (the forward push against
            the backward pass; float rounding only).
    """

    score: float
    layer: int
    head: int
    query_pos: int
    key_pos: int
    tokens: Int[Tensor, " pos"]
    key_components: pd.DataFrame = field(repr=False)
    query_components: pd.DataFrame = field(repr=False)
    terms: pd.DataFrame = field(repr=False)
    info: dict = field(default_factory=dict, repr=False)

    def key_by_head(self) -> pd.DataFrame:
        """The key side by last carrier: ``via_layer``, ``via_block``, ``via_head``, ``value`` (summed over nodes
        and positions; the NA row is what never left the key's position), largest ``|value|`` first."""
        return by_head(self.key_components)

    def query_by_head(self) -> pd.DataFrame:
        """The query side by last carrier, as :meth:`key_by_head`."""
        return by_head(self.query_components)


def by_head(components: pd.DataFrame) -> pd.DataFrame:
    """A component table summed by last carrier head: ``via_layer``, ``via_block``, ``via_head``, ``value``."""
    g = components.groupby(["via_layer", "via_head"], dropna=False, sort=True)["value"].sum().reset_index()
    g.insert(1, "via_block", (g["via_layer"] + 1).astype("Int64"))
    g = g.iloc[np.argsort(-g["value"].abs().to_numpy(), kind="stable")].reset_index(drop=True)
    g.attrs["units"] = QK_UNITS
    return g


def component_label(kind: str, layer: int, pos: int, token: str, feature: int = -1, via_layer=None,
                    via_head=None) -> str:
    """A short name for a component: ``"emb 'Bob'@5"``, ``"L0 f123 ' Bob'@5 via L1H2"`` (layers 0-indexed, as in
    hook names), ``"L3 error"``, ``"L3 mlp"``, ``"L3 const"``."""
    what = {"embedding": "emb", "feature": f"L{layer} f{feature}"}.get(kind, f"L{layer} {kind[:5]}")
    via = "" if via_layer is None or pd.isna(via_layer) else f" via L{int(via_layer)}H{int(via_head)}"
    return f"{what} {token!r}@{pos}{via}"


def _token_labels(m: HookedSprout, tokens: Tensor) -> list[str]:
    if m.tokenizer is None:
        return [f"#{int(i)}" for i in tokens]
    return list(m.to_str_tokens(tokens.reshape(-1).cpu()))


def qk_maps(m: HookedSprout, layer: int, head: int, tokens: Int[Tensor, " pos"], query_pos: int, key_pos: int
            ) -> dict:
    """The frozen QK maps of one cell: ``MQ``, ``MK`` (d_model, d_head) with ``q = x_i @ MQ`` and ``k = x_j @ MK``
    as the score reads them (ln1's gain and scale, the QK-norm's gain and scale, RoPE at the position), the streams
    ``x_i``, ``x_j`` at block ``layer``'s input, the real ``score`` and ``scale = sqrt(d_head)``."""
    blk = m.blocks[layer]
    names = [act_name("resid_pre", layer), act_name("scale", layer, "ln1"), act_name("q", layer), act_name("k", layer),
             act_name("attn_scores", layer)]
    stop = layer + 1 if layer + 1 < m.cfg.n_layers else None  # nothing above this block is read
    _, cache = m.run_with_cache(tokens[None], names_filter=names, stop_at_layer=stop)
    s1 = cache[names[1]][0, :, 0].float()
    cos, sin = m.model.cos.float(), m.model.sin.float()

    def side(W: Tensor, raw: Tensor, norm, pos: int) -> Tensor:
        s = torch.sqrt(raw.float().pow(2).mean() + norm.eps)
        M = W.detach().float() / s1[pos] * norm.weight.detach().float() / s
        return apply_rope(M, cos[pos], sin[pos])

    attn = blk.attn.module
    MQ = side(blk.attn.W_Q[head], cache[names[2]][0, query_pos, head], attn.q_norm, query_pos)
    MK = side(blk.attn.W_K[head], cache[names[3]][0, key_pos, head], attn.k_norm, key_pos)
    x = cache[names[0]][0].float()
    return {"MQ": MQ, "MK": MK, "x_q": x[query_pos], "x_k": x[key_pos],
            "score": float(cache[names[4]][0, head, query_pos, key_pos]), "scale": math.sqrt(m.cfg.d_head)}


def side_components(m: HookedSprout, rep: LocalReplacement, carried: Carried, labels: list[str], mlp: bool
                    ) -> tuple[pd.DataFrame, int]:
    """One side's component table (largest ``|value|`` first) from its :func:`carried_backward` split (one
    gradient), and the count of rows left out as exactly 0."""
    H = m.cfg.n_heads
    L, T = rep.patterns.shape[0], rep.tokens.numel()
    nF = rep.n_features
    vals = carried.nodes[:, 0].cpu()  # (G, n)
    G = vals.shape[0]
    g_idx, n_idx = vals.nonzero(as_tuple=True)
    cv = carried.consts[:, 0].cpu()  # (G, L, P)
    cg, cl, cp = cv.nonzero(as_tuple=True)
    zero = vals.numel() - g_idx.numel() + cv.numel() - cg.numel()
    n_idx_np, g_np = n_idx.numpy(), np.concatenate([g_idx.numpy(), cg.numpy()])
    value = np.concatenate([vals[g_idx, n_idx].double().numpy(), cv[cg, cl, cp].double().numpy()])
    order = np.argsort(-np.abs(value), kind="stable")  # every column is built in this order
    feat = n_idx_np < nF
    err = (n_idx_np >= nF) & (n_idx_np < nF + L * T)
    k = np.where(err, n_idx_np - nF, 0)
    p_emb = n_idx_np - nF - L * T
    f_layer, f_pos, f_idx = (t.cpu().numpy() for t in (rep.feat_layer, rep.feat_pos, rep.feat_index))
    fi = np.where(feat, n_idx_np, 0)
    nc = cg.numel()
    layer = np.concatenate([np.where(feat, f_layer[fi] if nF else 0, np.where(err, k // T, -1)), cl.numpy()])[order]
    pos = np.concatenate([np.where(feat, f_pos[fi] if nF else 0, np.where(err, k % T, p_emb)), cp.numpy()])[order]
    # kinds as codes of KINDS: feature 0, error 1, mlp 2, embedding 3, constant 4
    kind = np.concatenate([np.where(feat, 0, np.where(err, 2 if mlp else 1, 3)), np.full(nc, 4)])[order]
    feature = np.concatenate([np.where(feat, f_idx[fi] if nF else 0, -1), np.full(nc, -1)])[order]
    node = np.concatenate([n_idx_np, np.full(nc, -1)])[order]
    g_np, value = g_np[order], value[order]
    stays = g_np == G - 1
    via_layer = pd.arrays.IntegerArray(np.where(stays, 0, g_np // H).astype(np.int64), stays)
    via_head = pd.arrays.IntegerArray(np.where(stays, 0, g_np % H).astype(np.int64), stays.copy())
    cats, codes = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)
    layer = layer.astype(np.int64)
    df = pd.DataFrame({"kind": pd.Categorical.from_codes(kind, categories=KINDS), "layer": layer, "block": layer + 1,
                       "pos": pos.astype(np.int64),
                       "token": pd.Categorical.from_codes(codes.reshape(-1)[pos.astype(np.int64)], categories=cats),
                       "feature": feature.astype(np.int64), "via_layer": via_layer,
                       "via_block": pd.arrays.IntegerArray(via_layer.to_numpy(dtype=np.int64, na_value=0) + 1,
                                                           stays.copy()),
                       "via_head": via_head, "node": node.astype(np.int64), "value": value}, copy=False)
    df.attrs["units"] = QK_UNITS
    return df, int(zero)


def _component_vectors(bw, rep: LocalReplacement, top: int, target: int, rows: pd.DataFrame) -> Tensor:
    """The stream vector at ``target`` (block ``top``'s input) each component row alone makes, pushed forward
    along its carrier group (a cross-layer transcoder's feature: each of its writes below ``top`` pushed, summed)."""
    dev = rep.patterns.device
    is_const = (rows["kind"] == "constant").to_numpy()
    at = torch.tensor(np.nonzero(~is_const)[0], dtype=torch.long, device=dev)
    nodes = torch.tensor(rows["node"].to_numpy()[~is_const], dtype=torch.long, device=dev)
    row, origin, pos, vecs = node_writes(bw, rep, nodes, top)
    row = at[row]
    if is_const.any():
        c = torch.tensor(np.nonzero(is_const)[0], dtype=torch.long, device=dev)
        cl = torch.tensor(rows["layer"].to_numpy()[is_const], dtype=torch.long, device=dev)
        cp = torch.tensor(rows["pos"].to_numpy()[is_const], dtype=torch.long, device=dev)
        row, origin, pos = torch.cat([row, c]), torch.cat([origin, cl]), torch.cat([pos, cp])
        vecs = torch.cat([vecs, rep.consts[cl, cp]])
    vl = torch.tensor(rows["via_layer"].fillna(-1).to_numpy(dtype=np.int64), device=dev)[row]
    vh = torch.tensor(rows["via_head"].fillna(0).to_numpy(dtype=np.int64), device=dev)[row]
    out = carried_forward(bw, top, target, origin, pos, vecs, vl, vh)
    return torch.zeros(len(rows), out.shape[1], device=dev).index_add_(0, row, out)


def _terms(qv: Tensor, kv: Tensor, q_rows: pd.DataFrame, k_rows: pd.DataFrame, scale: float, top: int
           ) -> pd.DataFrame:
    """The bilinear table: rows ``qv`` (query components, the last the rest) against ``kv``."""
    t = (qv.double() @ kv.double().T / scale).numpy()
    nq, nk = t.shape
    qi, ki = np.divmod(np.arange(nq * nk), nk)
    flat = t.reshape(-1)
    order = np.argsort(-np.abs(flat), kind="stable")
    keep, rest = order[:top], order[top:]

    def labels(rows: pd.DataFrame, idx: np.ndarray, side: str) -> list[str]:
        out = [component_label(r.kind, r.layer, r.pos, r.token, r.feature, r.via_layer, r.via_head)
               for r in rows.itertuples()]
        out.append(f"(rest of the {side} side)")
        return [out[i] for i in idx]

    def rows_of(idx: np.ndarray, n: int) -> pd.arrays.IntegerArray:
        a = pd.array(idx, dtype="Int64")
        a[idx == n - 1] = pd.NA
        return a

    df = pd.DataFrame({"query": labels(q_rows, qi[keep], "query"), "key": labels(k_rows, ki[keep], "key"),
                       "query_row": rows_of(qi[keep], nq), "key_row": rows_of(ki[keep], nk), "term": flat[keep]})
    if rest.size:
        df.loc[len(df)] = {"query": "(other pairs)", "key": "(other pairs)", "query_row": pd.NA, "key_row": pd.NA,
                           "term": float(flat[rest].sum())}
    df.attrs["units"] = QK_UNITS
    return df


@torch.no_grad()
def qk_attribution(model, text, layer: int, head: int, query_pos: int, key_pos: int,
                   transcoders: TranscodersLike = None, *, top: int = 20, n_components: int = 12) -> QKAttribution:
    """Explain head ``head`` of block ``layer``'s pre-softmax score at (``query_pos``, ``key_pos``) on one prompt
    (see the module docstring and :class:`QKAttribution`).

    Args:
        text: one text, or token ids ``(pos,)`` / ``(1, pos)``, read as given (no ``<|endoftext|>`` put first).
        layer: 0-indexed (block ``layer + 1``); head: of that block.
        query_pos, key_pos: positions of the prompt (negative counts from the end); ``key_pos <= query_pos``.
        transcoders: None: each block's whole feed-forward output per position is one component (kind ``mlp``);
            per-layer transcoders (a TranscoderSet or ``{layer: Transcoder}``), a cross-layer transcoder (a
            CrossLayerTranscoder) or a folder of either (as
            :func:`~sprout_interp.circuits.attribution_graph.attribution_graph` takes): feature, error and
            constant components. A cross-layer transcoder's feature of layer ``i`` is one component per last
            carrier whose value sums its writes into every feed-forward output ``j`` (``i <= j < layer``), each
            carried from block ``j``'s output on.
        top: pairs kept in ``terms`` before its remainder row; n_components: components of each side in it.

    Raises QKAttributionError for a layer, head or position outside the model or the prompt (or a key after the
    query), AttributionGraphError for a batch of texts, TranscoderMismatchError / TranscoderNotFoundError for
    transcoders that do not fit.
    """
    m = as_hooked(model)
    L, H = m.cfg.n_layers, m.cfg.n_heads
    layer = check_index(layer, "layer", L, what=f"{m.name or 'the model'}'s blocks, 0-indexed",
                        error=QKAttributionError)
    head = check_index(head, "head", H, what=f"the heads of block {layer + 1}", error=QKAttributionError)
    top = check_count(top, "top", high=1 << 20, what="pairs kept in terms", error=QKAttributionError)
    n_components = check_count(n_components, "n_components", high=4096,
                               what="components of each side in the bilinear table", error=QKAttributionError)
    with m.lock:
        tokens = prompt_tokens(m, text, bos=False)
        T = tokens.numel()
        query_pos = check_index(query_pos, "query_pos", T, negative=True, what=f"a position of the {T}-token prompt",
                                error=QKAttributionError)
        key_pos = check_index(key_pos, "key_pos", T, negative=True, what=f"a position of the {T}-token prompt",
                              error=QKAttributionError)
        if key_pos > query_pos:
            raise QKAttributionError(
                f"key_pos={key_pos} is after query_pos={query_pos}: attention is causal, so key_pos is "
                f"0..{query_pos}")
        rep = mlp_replacement(m, tokens) if transcoders is None else local_replacement(
            m, tokens, resolve_transcoders(m, transcoders), bos=False, cross_layer=True)
        maps = qk_maps(m, layer, head, tokens, query_pos, key_pos)
    return _attribution(m, rep, maps, layer, head, query_pos, key_pos, transcoders is None, top, n_components)


def _attribution(m: HookedSprout, rep: LocalReplacement, maps: dict, layer: int, head: int, query_pos: int,
                 key_pos: int, mlp: bool, top: int, n_components: int) -> QKAttribution:
    MQ, MK, scale = maps["MQ"], maps["MK"], maps["scale"]
    q_all, k_all = maps["x_q"] @ MQ, maps["x_k"] @ MK
    g_key, g_query = MK @ q_all / scale, MQ @ k_all / scale
    bw = frozen_maps(m, rep, layer)  # the score reads block layer's input: no block's output above it
    dev = rep.patterns.device
    labels = _token_labels(m, rep.tokens)
    sides = {}
    for name, pos, g, M, other in (("key", key_pos, g_key, MK, q_all), ("query", query_pos, g_query, MQ, k_all)):
        carried = carried_backward(bw, rep, layer, False, torch.tensor([pos], device=dev), g[None])
        table, zero = side_components(m, rep, carried, labels, mlp)
        kept = table.iloc[:n_components]
        vecs = _component_vectors(bw, rep, layer, pos, kept) @ M if len(kept) else torch.zeros(0, M.shape[1])
        total = (maps["x_k"] if name == "key" else maps["x_q"]) @ M
        sides[name] = (table, zero, kept, torch.cat([vecs, (total - vecs.sum(0))[None]]).cpu())
    (kt, kz, kk, kv), (qt, qz, qk, qv) = sides["key"], sides["query"]
    terms = _terms(qv, kv, qk, kk, scale, top)
    gap_k = (kv[:-1].double() @ q_all.double().cpu() / scale - torch.tensor(kk["value"].to_numpy())).abs()
    gap_q = (qv[:-1].double() @ k_all.double().cpu() / scale - torch.tensor(qk["value"].to_numpy())).abs()
    push_gap = float(torch.cat([gap_k, gap_q, torch.zeros(1, dtype=torch.float64)]).max())
    info = {"model_name": m.name or "", "transcoders": "none (feed-forward outputs)" if mlp else
            ((rep.clt.info if rep.clt is not None else rep.transcoders[0].info).get("model_name", "") or "given"),
            "transcoder_kind": "none" if mlp else rep.kind, "scale": scale,
            "score_frozen": float(q_all.double() @ k_all.double() / scale), "zero_rows": {"key": kz, "query": qz},
            "push_gap": push_gap, "n_nodes": n_nodes(rep)}
    return QKAttribution(score=maps["score"], layer=layer, head=head, query_pos=query_pos, key_pos=key_pos,
                         tokens=rep.tokens.cpu(), key_components=kt, query_components=qt, terms=terms, info=info)

