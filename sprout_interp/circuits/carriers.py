"""The frozen linear model of one prompt split by the attention head that last carried each part to a position:
the machinery under QK attributions (:mod:`~sprout_interp.circuits.qk_attribution`) and head loadings
(:mod:`~sprout_interp.circuits.head_loadings`).

With the attention patterns and every norm's scale frozen (the local replacement model of
:mod:`~sprout_interp.circuits.local_replacement`), the residual stream ``x_p`` at position ``p`` entering block ``L``
is a sum of parts: what was written at ``p`` and never left it (the token's embedding, the feed-forward nodes of
blocks below ``L`` at ``p``, carried up through the transcoders' skip connections at ``p``), plus, for each head
``(l, h)`` with ``l < L``, what that head wrote at ``p`` (itself carried up through the skip connections at ``p``).
A head's write is linear in the stream at block ``l``'s input at every position, which is in turn a sum of every
node's write through any earlier path. So a gradient ``g`` at ``x_p`` splits into one group per last carrier:
``stays`` (``g`` pulled back through the skip connections at ``p`` only, read off the nodes at ``p``) and one group
per head ``(l, h)`` (pulled back to block ``l``'s mid-stream at ``p`` as ``stays`` is, then through head ``(l, h)``
alone, then through the whole frozen model below). The groups' values over every node add up to ``g · x_p``.

Over a cross-layer transcoder (``rep.kind == "clt"``) a feature of layer ``i`` writes into every feed-forward output
``j >= i`` at its position: each of those writes is a part of its own (written at block ``j``'s output, carried on by
heads of blocks after ``j`` only), and the feature's value on a carrier group is the sum over its writes below the
gradient (the frozen maps' ``read`` adds them up as it reads each layer; :func:`node_writes` lists them one by
one for :func:`carried_forward`). There is no skip connection then.

:func:`carried_backward` computes these groups for a batch of gradients in one pass through the model (the groups
and gradients as rows of one batch; at block ``l`` only the groups already started take part);
:func:`carried_forward` pushes given node writes forward along the same split, to the vector a part alone makes
at ``p`` (what the QK attribution's bilinear table reads). :func:`mlp_replacement` is the frozen model with each
block's whole feed-forward output as one node per position (no transcoders; nothing passes through a
feed-forward).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.circuits.attribution_graph import FrozenBackward
from sprout_interp.circuits.local_replacement import LocalReplacement, local_replacement
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.features.transcoder import Transcoder

__all__ = ["Carried", "mlp_replacement", "frozen_maps", "carried_backward", "carried_forward", "node_writes",
           "n_nodes"]


def n_nodes(rep: LocalReplacement) -> int:
    """Columns of the node values: the features, one error (or feed-forward) node per (layer, pos), one embedding
    per position, in the attribution graph's order (feature ``i``; error ``nF + layer * T + pos``; embedding
    ``nF + L * T + pos``)."""
    L, T = rep.patterns.shape[0], rep.tokens.numel()
    return rep.n_features + L * T + T


def mlp_replacement(model: HookedSprout, tokens: Int[Tensor, " pos"]) -> LocalReplacement:
    """The frozen linear model of the prompt ``tokens`` with no transcoders: each block's whole feed-forward output
    at each position is one node (held in the error slots, ``errors[l, p] = mlp_out``), nothing passes through a
    feed-forward (no skip connection), no features, no constants; patterns and norm scales frozen as in
    :func:`~sprout_interp.circuits.local_replacement.local_replacement` (``bos=False``: position 0 holds its nodes
    like any other). Made by that function with all-zero one-latent stand-in transcoders (no active feature, so
    each error node is the whole output)."""
    m = model
    dev = m.cfg.device if m.cfg.device is not None else next(m.model.parameters()).device
    stand_ins = {i: Transcoder(m.cfg.d_model, 1, 1, i).to(dev) for i in range(m.cfg.n_layers)}
    return local_replacement(m, tokens, stand_ins, bos=False)


def frozen_maps(model: HookedSprout, rep: LocalReplacement, top: Optional[int] = None) -> FrozenBackward:
    """The frozen model's maps for ``rep`` (the attribution graph's own, with no target rows yet; without the token
    images through block 0 the graph's rows read, since the carrier split goes through block 0 itself). ``top``: the
    passes read no block's output from block ``top`` on (a cross-layer transcoder's sources are built below it
    only; None: every block's)."""
    return FrozenBackward(model, rep, 0, n_nodes(rep), token_images=False, n_read=top)


@dataclass
class Carried:
    """What :func:`carried_backward` returns, for R gradients and G = 1 + n_via groups.

    Groups: ``g = l * H + h`` is head ``(l, h)`` as the last carrier (``l < n_via_layers``), the last group
    (``g = G - 1``) the part that stays at the position.

    Attributes:
        nodes (G, R, n_nodes): each node's value per group (columns as :func:`n_nodes` says).
        consts (G, R, L, P): the constant writes (``b_dec``) of each (layer, position) per group.
        n_via_layers: the layers whose heads are carriers; P: the positions the values cover (0..P-1).
    """

    nodes: Float[Tensor, "group r n"]
    consts: Float[Tensor, "group r layer pos"]
    n_via_layers: int
    P: int


def carried_backward(bw: FrozenBackward, rep: LocalReplacement, top: int, mid: bool, pos: Int[Tensor, " r"],
                     grads: Float[Tensor, "r d_model"]) -> Carried:
    """Split each gradient ``grads[r]`` at position ``pos[r]`` by the last carrier head (see the module docstring).

    ``top, mid``: where the gradients sit: block ``top``'s input (``mid=False``; blocks ``0..top-1``'s heads carry)
    or its stream after its attention (``mid=True``, a feed-forward's input; block ``top``'s heads carry too).
    One pass down through the frozen model for every group and gradient at once; at block ``l`` only the rows of
    the groups already started (heads of blocks above ``l`` and the staying part) are carried.
    """
    H, d = bw.H, bw.d
    R = grads.shape[0]
    NL = top + 1 if mid else top
    NG = NL * H + 1
    P = int(pos.max()) + 1
    L = rep.patterns.shape[0]
    dev = grads.device
    G = torch.zeros(P, NG * R, d, device=dev)  # rows: group-major (g * R + r)
    rows = torch.arange(R, device=dev)
    stay = slice((NG - 1) * R, NG * R)
    G[pos, (NG - 1) * R + rows] = grads.float()
    bw.adj = torch.zeros(NG * R, n_nodes(rep), device=dev)
    bw.const = torch.zeros(NG * R, device=dev)
    consts = torch.zeros(NG, R, L, P, device=dev)

    def start_heads(layer: int) -> None:
        """The groups of block ``layer``'s heads: the staying part's gradient at its mid-stream, back through one
        head: key ``m`` of head ``h`` gets ``A[pos, m] / s1[m] · (g W_O^h) W_V^h``."""
        gd = G[pos, stay.start + rows]  # (R, d)
        for h in range(H):
            w = (gd @ bw.WO[layer][h]) @ bw.WV[layer][h]  # (R, d)
            a = bw.A[layer, h][pos, :P] * bw.inv1[layer, :P]  # (R, P): row r's query pos[r] over keys
            g = layer * H + h
            G[:, g * R:(g + 1) * R] = a.T[:, :, None] * w[None]

    if mid:
        start_heads(top)
    for layer in range(top - 1, -1, -1):
        a = (layer + 1) * H * R  # rows of the groups started above this block, then the staying part
        act = G[:, a:].contiguous()
        bw.read(layer, act, a, NG * R)
        consts[(layer + 1) * H:, :, layer] = torch.einsum("pgrd,pd->grp", act.view(P, -1, R, d),
                                                          rep.consts[layer, :P])
        act = bw.skip(layer, act)
        G[:, a:] = act
        if a < stay.start:
            G[:, a:stay.start] = bw.attention(layer, G[:, a:stay.start].contiguous())
        start_heads(layer)
    tok = n_nodes(rep) - rep.tokens.numel()
    bw.adj[:, tok:tok + P] = torch.einsum("pbd,pd->bp", G, bw.embed[:P])
    return Carried(bw.adj.view(NG, R, -1), consts, NL, P)


def carried_forward(bw: FrozenBackward, top: int, target: int, origin: Int[Tensor, " b"], pos: Int[Tensor, " b"],
                    vecs: Float[Tensor, "b d_model"], via_layer: Int[Tensor, " b"], via_head: Int[Tensor, " b"]
                    ) -> Float[Tensor, "b d_model"]:
    """Each write ``vecs[b]`` (made at position ``pos[b]`` at the output of block ``origin[b]``; -1: an
    embedding, at block 0's input) pushed forward through the frozen model to block ``top``'s input at position
    ``target``, along one carrier group only: the whole model below block ``via_layer[b]``, then head
    ``(via_layer[b], via_head[b])`` alone into ``target``, then the skip connections at ``target``; a write with
    ``via_layer[b] == -1`` stays at ``target`` (it must be written there). A write that joins the stream at
    block ``via_layer[b]``'s output or later (``origin[b] >= via_layer[b] >= 0``: the head reads the stream before
    it) makes nothing along that group (zero), as :func:`carried_backward` gives it nothing there. Returns the vectors
    at ``target``."""
    B, d = vecs.shape
    dev = vecs.device
    vecs = vecs.masked_fill(((via_layer >= 0) & (origin >= via_layer))[:, None], 0.0)
    P = target + 1
    X = torch.zeros(B, P, d, device=dev)
    rows = torch.arange(B, device=dev)
    for layer in range(top):
        enter = origin == layer - 1
        if bool(enter.any()):
            X[rows[enter], pos[enter]] += vecs[enter]
        full = via_layer > layer
        here = via_layer == layer
        if bool(full.any()) or bool(here.any()):
            Xn = X * bw.inv1[layer, :P, None]
            if bool(full.any()):
                xf = Xn[full]
                add = torch.zeros_like(xf)
                for h in range(bw.H):
                    add += bw.A[layer, h, :P, :P] @ ((xf @ bw.WV[layer][h].T) @ bw.WO[layer][h].T)
                X[full] += add
            if bool(here.any()):
                idx = rows[here]
                out = torch.zeros(idx.numel(), d, device=dev)
                for h in via_head[here].unique().tolist():
                    sel = via_head[here] == h
                    z = torch.einsum("p,bpe->be", bw.A[layer, h, target, :P], Xn[idx[sel]] @ bw.WV[layer][h].T)
                    out[sel] = z @ bw.WO[layer][h].T
                X[idx] = 0
                X[idx, target] = out
        if bw.WS[layer] is not None:
            X += (X * bw.inv2[layer, :P, None]) @ bw.WS[layer].T
    last = origin == top - 1
    if bool(last.any()):
        X[rows[last], pos[last]] += vecs[last]
    return X[:, target]


def node_writes(bw: FrozenBackward, rep: LocalReplacement, nodes: Int[Tensor, " b"], top: int
                ) -> tuple[Int[Tensor, " w"], Int[Tensor, " w"], Int[Tensor, " w"], Float[Tensor, "w d_model"]]:
    """What nodes ``nodes`` (columns as :func:`n_nodes` says) write that reaches block ``top``'s input: one write
    per (node, block output it joins below ``top``). An embedding, an error node or a per-layer transcoder's
    feature writes once (at block ``-1``, i.e. the embedding, or its own block's output); a cross-layer
    transcoder's feature of layer ``i`` once per feed-forward output ``j`` it writes to (``i <= j < top``: its
    activation times ``W_dec[i][f, j - i]``), so its value on a carrier group is the sum of what each of those
    writes makes. Returns (``row``: which entry of ``nodes`` each write is; ``origin``: the block whose output it
    joins, -1 for an embedding; its position; the vector), writes into blocks ``>= top`` left out."""
    L, T = rep.patterns.shape[0], rep.tokens.numel()
    nF = rep.n_features
    dev = nodes.device
    rows, origins, poss, vecs = [], [], [], []
    f = (nodes < nF).nonzero()[:, 0]
    for b in f.tolist():
        n = int(nodes[b])
        i, p, k = int(rep.feat_layer[n]), int(rep.feat_pos[n]), int(rep.feat_index[n])
        for j in rep.targets(i):
            if j < top:
                rows.append(b)
                origins.append(j)
                poss.append(p)
                vecs.append(rep.decoder(i, j)[k] * rep.feat_act[n])
    e = ((nodes >= nF) & (nodes < nF + L * T)).nonzero()[:, 0]
    k = nodes[e] - nF
    e_origin, e_pos = k // T, k % T
    t = (nodes >= nF + L * T).nonzero()[:, 0]
    t_pos = nodes[t] - nF - L * T
    row = torch.cat([torch.tensor(rows, dtype=torch.long, device=dev), e, t])
    origin = torch.cat([torch.tensor(origins, dtype=torch.long, device=dev), e_origin, torch.full_like(t, -1)])
    pos = torch.cat([torch.tensor(poss, dtype=torch.long, device=dev), e_pos, t_pos])
    vec = torch.cat([torch.stack(vecs) if vecs else torch.zeros(0, bw.d, device=dev), rep.errors[e_origin, e_pos],
                     bw.embed[t_pos]])
    keep = origin < top
    return row[keep], origin[keep], pos[keep], vec[keep]
