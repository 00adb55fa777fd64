"""Attribution graphs: the direct effect of every active transcoder feature, error node and input token on every
other feature and on the top logits, in the local replacement model of one prompt (Ameisen et al. 2025, "Circuit
Tracing"; the library ``circuit-tracer``, whose node kinds, node order, logit choice and definitions this module
follows).

The local replacement model: each block's feed-forward is replaced by its transcoder
(:mod:`sprout_interp.features.transcoder`), plus an error node per (layer, position) that holds what the
transcoder misses on this prompt (``mlp_out - ŷ``), so it reproduces the real forward exactly; the attention
patterns and every RMSNorm's scale (``hook_scale``: ln1, ln2 and ln_final) are frozen at their values on the
prompt (the QK-norm only shapes the frozen patterns). The model is then linear in the residual stream: what a
node reads is a sum of what the nodes before it wrote, carried by the frozen attention (values and outputs),
the skip connections and the residual stream, plus constants (each transcoder's ``b_dec``; at a zeroed first
position, its whole feed-forward output beyond the skip connection).

Nodes, in circuit-tracer's order: the active features sorted by (layer, pos, feature), one error node per
(layer, pos), one embedding node per position, then the logit nodes: the most probable next tokens at the last
position until their probability reaches ``desired_logit_prob`` (at most ``max_n_logits``). What a node reads
(its *input*): a feature, ``W_enc[f] · x`` at its position (its pre-activation without ``b_enc``; ``x`` the
feed-forward's input); a logit node, its token's logit minus the mean logit over the vocabulary (circuit-tracer's
demeaned unembedding). What a node writes: a feature, its activation times ``W_dec[f]``; an error node, its
error vector; an embedding node, its token's embedding. ``adjacency[t, s]`` is the direct effect of ``s``'s
write on ``t``'s input (rows = targets); error and embedding rows are zero. Exact: for every feature and logit
node, ``input == adjacency[t].sum() + constant`` (:meth:`AttributionGraph.max_error`).

With a cross-layer transcoder (``transcoders`` a CrossLayerTranscoder, or ``kind="clt"``: circuit-tracer's CLT
graph) a feature of layer ``i`` writes its activation times ``W_dec[i][f, j - i]`` into every feed-forward output
``j >= i``; its edge into a node is the sum of what the node reads of each of those writes, the error node of
(``j``, pos) is ``mlp_out_j - ŷ_j`` with ``ŷ_j`` the CLT's whole reconstruction, and the constant there ``b_dec[j]``
(no skip connection). ``transcoders=None`` uses the best kind the model ships
(:func:`~sprout_interp.circuits.local_replacement.best_kind`); ``graph.info["transcoder_kind"]`` says which.

``max_feature_nodes`` keeps only that many feature nodes, chosen as circuit-tracer 0.5 chooses them: by their
influence on the logits through the rows computed so far, re-ranked every ``rerank_every`` rows (see
:func:`attribution_graph`); the rest lose their columns and their summed effect on each kept node is its
``dropped`` value, so the graph stays exact.

``final_norm="jacobian"`` changes the logit rows only: the final RMSNorm's frozen scale is replaced by its
Jacobian at the prompt's own stream (:func:`~sprout_interp.circuits.local_replacement.rms_norm_jacobian`), so an
edge into a logit node is the real model's first-order change of that logit per the source's write, everything
before the final norm frozen as in the graph. The frozen scale makes a write's effect on the logit linear but
misses that a large write also changes the norm's scale (all the logits shrink or grow with it); the Jacobian keeps
that to first order. A logit row then no longer sums to its input: the norm undoes a scaling of the whole stream,
so every write together moves the logits by only ``eps / s²`` of their value, and the node's ``constant`` holds the
rest (see :func:`attribution_graph`). Feature rows are the same in both modes.

With ``bos=True`` (circuit-tracer's convention) the prompt starts with ``<|endoftext|>`` (prepended when it
does not) and position 0 has no feature or error nodes: its feed-forward output counts as a constant.

Computed by backward passes through the frozen linear model written out by hand, one batch of target rows at a
time (as circuit-tracer does with autograd): rows of one layer and neighbouring positions, only over the positions
up to the batch's last one (causal attention), only down through the blocks below. Right after a row's own
attention its gradient is a few vectors spread over the positions by the patterns; it stays in that form through
the next block's skip connection and attention where that is cheaper. No row goes backward through block 0: the
token edges are its gradient at block 0's output dotted with each token's image there, carried forward once.
:func:`graph_macs` counts the multiply-adds (against circuit-tracer's).
"""
from __future__ import annotations

import math
from typing import Optional, Union

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.circuits.graphs import FINAL_NORMS, GRAPH_UNITS, AttributionGraph
from sprout_interp.circuits.local_replacement import (
    LocalReplacement,
    TranscodersLike,
    local_replacement,
    resolve_transcoders,
    rms_norm_jacobian,
    salient_logits,
)
from sprout_interp.core import limits
from sprout_interp.core.arguments import check_count, check_indices, check_number
from sprout_interp.core.errors import (
    AttributionGraphError,
)
from sprout_interp.core.hooked import HookedSprout, as_hooked

__all__ = ["FINAL_NORMS", "FrozenBackward", "attribution_graph", "partial_influence", "graph_macs", "graph_memory",
           "uses_token_images"]


class _Backward:
    """The transposed maps of the frozen linear model, for batches of target rows (row vectors, as gradients)."""

    def __init__(self, m: HookedSprout, rep: LocalReplacement, n_rows: int, n_cols: int,
                 token_images: Optional[bool] = None, n_read: Optional[int] = None):
        """``n_read``: with a cross-layer transcoder, build the sources of the first ``n_read`` blocks' outputs
        only, for a pass that reads nothing above them (None: every block's)."""
        L, T, d = m.cfg.n_layers, rep.tokens.numel(), m.cfg.d_model
        self.H, self.dh, self.d = m.cfg.n_heads, m.cfg.d_head, d
        f = torch.float32
        dev = dict(device=rep.patterns.device)  # the model's device; the graph comes back on the CPU
        self.WO, self.WV, self.WS, self.g2 = [], [], [], []
        for blk in m.blocks:  # per head, contiguous: grad z_h = g @ WO[h] (d, dh); grad resid += grad v_h @ WV[h] / s1
            W = blk.attn.module.qkv.weight.detach().to(f)[2 * d:] * blk.ln1.w.detach().to(f)[None, :]  # v = (x/s1) @ W.T
            proj = blk.attn.module.proj.weight.detach().to(f)  # out = z_flat @ proj.T
            self.WO.append([proj[:, h * self.dh:(h + 1) * self.dh].contiguous() for h in range(self.H)])
            self.WV.append([W[h * self.dh:(h + 1) * self.dh].contiguous() for h in range(self.H)])
            self.g2.append(blk.ln2.w.detach().to(f))
        for tc in rep.transcoders:  # skip(x) = x @ W_skip.T with x = resid * g2 / s2: grad resid = g @ W_skip * g2 / s2
            self.WS.append(None if tc.W_skip is None else tc.W_skip.detach().to(f) * self.g2[tc.layer][None, :])
        if rep.clt is not None:  # a cross-layer transcoder has no skip connection
            self.WS = [None] * L
        self.A_T = rep.patterns.transpose(-1, -2).contiguous()  # (L, H, key, query)
        self.A = rep.patterns
        self.inv1, self.inv2 = 1.0 / rep.scale1, 1.0 / rep.scale2
        # per layer, the vectors each position's sources write: K feature slots, the error, the constant
        nF = rep.n_features
        self.cross_layer = rep.clt is not None
        if self.cross_layer:
            self._clt_sources(rep, L if n_read is None else n_read, T, d)
        else:
            self._sources(rep, L, T, d, nF)
        self.embed = m.model.embed.weight.detach().to(f)[rep.tokens]
        if token_images is None:
            token_images = uses_token_images(T, d)
        # (pos, d, token), or None: rows then go backward through block 0 (more multiply-adds, no T² d tensor)
        self.F1T = self._tokens_through_block0(rep) if token_images else None
        self.tok_cols = nF + L * T + torch.arange(T, **dev)
        self.adj = torch.zeros(n_rows, n_cols, **dev)  # rows: targets as the caller places them
        self.const = torch.zeros(n_rows, **dev)
        self.macs = 0.0

    def _sources(self, rep: LocalReplacement, L: int, T: int, d: int, nF: int) -> None:
        """Per-layer transcoders: ``srcT`` (L, T, d, S) the vectors each (layer, position) writes (its K feature
        slots, the error, the constant) and ``cols`` (L, T, S) their node indices (-1: an empty slot, or the
        constant)."""
        dev = dict(device=rep.patterns.device)
        counts = torch.zeros(L, T, dtype=torch.long, **dev)
        counts.index_put_((rep.feat_layer, rep.feat_pos), torch.ones_like(rep.feat_pos), accumulate=True)
        K = int(counts.max()) if nF else 0
        self.S = K + 2
        self.srcT = torch.zeros(L, T, d, self.S, **dev)  # (L, T, d, S), filled in place: no second copy
        self.cols = torch.full((L, T, self.S), -1, dtype=torch.long, **dev)
        first = torch.cumsum(counts.flatten(), 0) - counts.flatten()  # node index of each (layer, pos)'s first feature
        slot = torch.arange(nF, **dev) - first[rep.feat_layer * T + rep.feat_pos]
        for tc in rep.transcoders:  # a layer at a time: no (features, d) copy of every decoder row at once
            span = slice(*rep.layer_span(tc.layer))
            dec = tc.W_dec.detach().float()[rep.feat_index[span]] * rep.feat_act[span, None]
            self.srcT[rep.feat_layer[span], rep.feat_pos[span], :, slot[span]] = dec
        self.cols[rep.feat_layer, rep.feat_pos, slot] = torch.arange(nF, **dev)
        self.srcT[:, :, :, K] = rep.errors
        self.cols[:, :, K] = nF + torch.arange(L * T, **dev).view(L, T)
        self.srcT[:, :, :, K + 1] = rep.consts

    def _clt_sources(self, rep: LocalReplacement, L: int, T: int, d: int) -> None:
        """A cross-layer transcoder: ``srcT[j]`` (T, d, S_j) the vectors written into feed-forward ``j``'s output
        at each position (every feature of a layer ``i <= j`` there, times its decoder row to ``j``; the error of
        ``j``; the constant ``b_dec[j]``) and ``cols[j]`` (T, S_j) their node indices (-1: an empty slot, or the
        constant). A feature's edge into a row is the sum of what the row reads of it at every layer it writes to
        (:meth:`read` adds them up)."""
        dev = dict(device=rep.patterns.device)
        nF = rep.n_features
        self.srcT, self.cols = [], []
        for j in range(L):  # L: the layers whose sources are built (the first L)
            hi = rep.layer_span(j)[1]  # features of layers 0..j: node indices 0..hi (sorted by layer, pos, feature)
            pos = rep.feat_pos[:hi]
            counts = torch.zeros(T, dtype=torch.long, **dev)
            counts.index_put_((pos,), torch.ones_like(pos), accumulate=True)
            K = int(counts.max()) if hi else 0
            order = torch.sort(pos, stable=True).indices  # by position, then node index
            first = torch.cumsum(counts, 0) - counts
            slot = torch.empty_like(pos)
            slot[order] = torch.arange(hi, **dev) - first[pos[order]]
            src = torch.zeros(T, d, K + 2, **dev)
            cols = torch.full((T, K + 2), -1, dtype=torch.long, **dev)
            for i in range(j + 1):  # a source layer at a time: no (features, layers, d) copy of the decoders
                span = slice(*rep.layer_span(i))
                dec = rep.decoder(i, j)[rep.feat_index[span]] * rep.feat_act[span, None]
                src[rep.feat_pos[span], :, slot[span]] = dec
            cols[pos, slot] = torch.arange(hi, **dev)
            src[:, :, K] = rep.errors[j]
            cols[:, K] = nF + j * T + torch.arange(T, **dev)
            src[:, :, K + 1] = rep.consts[j]
            self.srcT.append(src)
            self.cols.append(cols)
        self.S = max((int(c.shape[-1]) for c in self.cols), default=2)

    def _tokens_through_block0(self, rep: LocalReplacement) -> Float[Tensor, "pos d tok"]:
        """Each token embedding carried forward through the frozen block 0 (attention, then the skip connection) to
        ``resid_post`` of block 0: its image at every position, ``F[q, :, j]`` for token ``j`` at position ``q``. A
        row's token edges are then its gradient there dotted with these images, so no row runs backward through
        block 0. Filled a block of positions at a time (no temporary of the whole ``pos x d x tok`` size)."""
        T, d = self.embed.shape
        F = torch.zeros(T, d, T, device=self.embed.device)
        at = torch.arange(T, device=self.embed.device)
        F[at, :, at] = self.embed  # token j at its own position
        outs = [(((self.embed * self.inv1[0, :, None]) @ self.WV[0][h].T) @ self.WO[0][h].T).T  # (d, token)
                for h in range(self.H)]
        step = max(1, (8 << 20) // max(1, d * T))
        for q0 in range(0, T, step):
            blk = F[q0:q0 + step]
            for h in range(self.H):
                blk += self.A[0, h, q0:q0 + step, None, :] * outs[h][None]  # from token j to query q: A[q, j]
            if self.WS[0] is not None:
                blk += torch.matmul(self.WS[0], blk * self.inv2[0, q0:q0 + step, None, None])
        return F

    def attention(self, layer: int, G: Float[Tensor, "p b d"]) -> Float[Tensor, "p b d"]:
        """The gradient at ``resid_pre`` of block ``layer`` from the one at its ``resid_mid`` (frozen pattern):
        per head, onto ``z`` (W_O), summed over the queries that read each key (the pattern), onto the stream (W_V)."""
        P, B, d = G.shape
        flat = G.view(P * B, d)
        out = G.clone()
        acc = out.view(P * B, d)
        for h in range(self.H):
            gz = (flat @ self.WO[layer][h]).view(P, B * self.dh)
            gv = (self.A_T[layer, h, :P, :P] @ gz).mul_(self.inv1[layer, :P, None])  # key q: sum_p A[p, q] gz[p]
            acc.addmm_(gv.view(P * B, self.dh), self.WV[layer][h])
        self.macs += B * P * (2 * d * d + P * d)
        return out

    def skip(self, layer: int, G: Float[Tensor, "p b d"]) -> Float[Tensor, "p b d"]:
        """The gradient at ``resid_mid`` of block ``layer`` from the one at its ``resid_post`` (skip connection)."""
        if self.WS[layer] is None:
            return G
        P, B, d = G.shape
        self.macs += B * P * d * d
        out = (G.view(P * B, d) @ self.WS[layer]).view(P, B, d).mul_(self.inv2[layer, :P, None, None])
        return out.add_(G)

    def read(self, layer: int, G: Float[Tensor, "p b d"], r0: int, r1: int) -> None:
        """Edges from the sources written at block ``layer``'s output (its features, errors, constants) into rows
        ``r0:r1``, whose gradient at that ``resid_post`` is ``G``."""
        P, B, d = G.shape
        src = self.srcT[layer][:P]
        vals = torch.bmm(G, src)  # (P, B, S)
        self.macs += B * P * src.shape[-1] * d
        cols = self.cols[layer][:P]
        keep = cols >= 0
        if self.cross_layer:  # a CLT feature writes to several layers: its edge is the sum over them
            self.adj[r0:r1, cols[keep]] += vals.transpose(0, 1)[:, keep]
        else:
            self.adj[r0:r1, cols[keep]] = vals.transpose(0, 1)[:, keep]
        self.const[r0:r1] += vals[:, :, -1].sum(0)

    def down(self, top: int, G: Float[Tensor, "p b d"], r0: int, r1: int) -> None:
        """From the gradient at ``resid_post`` of block ``top - 1`` (``resid_pre`` of block ``top``) down, reading
        every layer's sources, to block 0's output, where the token edges are read off the tokens' images."""
        P = G.shape[0]
        if top == 0:
            self.adj[r0:r1, self.tok_cols[:P]] = torch.bmm(G, self.embed[:P, :, None])[:, :, 0].T
            return
        for layer in range(top - 1, 0, -1):
            self.read(layer, G, r0, r1)
            G = self.attention(layer, self.skip(layer, G))
        self.read(0, G, r0, r1)
        if self.F1T is None:  # through block 0 too, then each position's gradient dotted with its token's embedding
            G = self.attention(0, self.skip(0, G))
            self.adj[r0:r1, self.tok_cols[:P]] = torch.bmm(G, self.embed[:P, :, None])[:, :, 0].T
            self.macs += G.shape[1] * P * G.shape[2]
            return
        self.adj[r0:r1, self.tok_cols[:P]] = torch.bmm(G, self.F1T[:P, :, :P]).sum(0)
        self.macs += G.shape[1] * P * P * G.shape[2]

    def feature_rows(self, layer: int, pos: Int[Tensor, " b"], u: Float[Tensor, "b d"], r0: int, r1: int) -> None:
        """Rows of features of block ``layer`` at positions ``pos`` reading direction ``u`` of its ``resid_mid``.

        Right after it, a row's gradient is a sum of few vectors each spread over the positions by a pattern (``u``
        at its own position, one per head after block ``layer``'s attention): kept in that form through the next
        skip connection and attention's W_O and W_V (a few vectors each instead of one per position) when that is
        cheaper, then expanded to one vector per position for the rest of the way down."""
        B, d = u.shape
        P = int(pos.max()) + 1
        rows = torch.arange(B, device=u.device)
        V = torch.stack([u] + [(u @ self.WO[layer][h]) @ self.WV[layer][h] for h in range(self.H)], 1)  # (B, 1+H, d)
        C = torch.zeros(B, 1 + self.H, P, device=u.device)  # each vector's weight at each position
        C[rows, 0, pos] = 1.0
        C[:, 1:] = self.A[layer][:, pos, :P].transpose(0, 1) * self.inv1[layer, :P]
        self.macs += B * (2 * d * d + P * (1 + self.H) * d)
        G = torch.einsum("biq,bid->qbd", C, V).contiguous()
        if layer < 2 or not self.factored_pays(layer - 1, P):
            self.down(layer, G, r0, r1)
            return
        m = layer - 1  # block m's skip connection and attention, on the vectors rather than the positions
        self.read(m, G, r0, r1)
        n = V.shape[1]
        if self.WS[m] is not None:
            V, C = torch.cat([V, V @ self.WS[m]], 1), torch.cat([C, C * self.inv2[m, :P]], 1)
            self.macs += B * n * d * d
        Vs, Cs = [V], [C]
        for h in range(self.H):
            Vs.append((V @ self.WO[m][h]) @ self.WV[m][h])  # (B, n, d)
            Cs.append((C @ self.A[m, h, :P, :P]) * self.inv1[m, :P])  # key r: sum over queries q of A[q, r] C[q]
        n = V.shape[1]
        V, C = torch.cat(Vs, 1), torch.cat(Cs, 1)
        self.macs += B * (2 * n * d * d + self.H * n * P * P + V.shape[1] * P * d)
        self.down(m, torch.einsum("biq,bid->qbd", C, V).contiguous(), r0, r1)

    def factored_pays(self, m: int, P: int) -> bool:
        """Whether block ``m``'s skip connection and attention cost fewer multiply-adds on the 1 + H vectors of a
        row's factored gradient than on its ``P`` positions."""
        dense, factored = _hop_macs(self.d, self.H, self.WS[m] is not None, P)
        return factored < dense


#: the frozen linear model's transposed maps as other backward passes through it use them (its per-head ``WO``/``WV``,
#: skip connections ``WS``, patterns, norm scales and per-(layer, position) sources; ``read``, ``skip``, ``attention``)
FrozenBackward = _Backward


_CHUNK_BYTES = 16 << 20  # the block of buffer rows scaled or moved at a time once the rows pass it
_TOKEN_IMAGES_BYTES = 64 << 20  # the largest tokens' images kept (pos² · d_model floats: 58 MiB at 200 of Sprout's)


def uses_token_images(n_pos: int, d_model: int) -> bool:
    """Whether a graph's rows read the token edges off each token carried forward through block 0 once (faster;
    ``n_pos² · d_model`` floats, kept up to 64 MiB) rather than going backward through block 0 themselves."""
    return 4 * n_pos * n_pos * d_model <= _TOKEN_IMAGES_BYTES


def graph_memory(n_layers: int, d_model: int, n_heads: int, n_pos: int, n_features: int, k: int,
                 n_logits: int = 10, max_feature_nodes: Optional[int] = None, batch_size: int = 64,
                 cross_layer: bool = False, source_slots: Optional[int] = None) -> dict[str, int]:
    """Bytes an attribution graph's own tensors take at their peak, by part, before any is allocated: a prompt of
    ``n_pos`` positions with ``n_features`` active features, at most ``k`` of them at one (layer, position),
    keeping ``max_feature_nodes`` of them (None: all). Parts: ``sources`` (the ``k + 2`` vectors each (layer,
    position) writes, and their node indices), ``token_images`` (every token carried through block 0 to every
    position, ``n_pos² · d_model``, when :func:`uses_token_images`), ``patterns`` (the frozen attention and its transpose), ``batches`` (a batch
    of ``batch_size`` rows' gradients), ``rows`` (the adjacency rows computed: every node's, or the logits' and
    the kept features'), ``kept`` (the kept graph's adjacency when features are left out, with a block of rows
    moved into it) and ``table`` (the node table); ``total`` is their sum. Python, torch and the model are not in
    it (about 0.4 GiB for Sprout).

    With ``cross_layer`` (a cross-layer transcoder, ``k`` still the most features at one (layer, position)) each
    layer ``j``'s sources hold the decoder rows into ``j`` of every feature of layers ``0..j`` at each position, at
    most ``(j + 1) k + 2`` vectors: the ``sources`` part counts them all, plus the largest block of decoder rows
    gathered at once (``k · n_pos · d_model``). ``source_slots``, when known (a prompt's own count: the vectors one
    position's sources take, summed over the layers), replaces that bound."""
    L, d, H, T, nF = n_layers, d_model, n_heads, n_pos, n_features
    n = nF + L * T + T + n_logits
    S = k + 2
    slots = sum((j + 1) * k + 2 for j in range(L)) if cross_layer else L * S  # vectors at one position, all layers
    if source_slots is not None:
        slots = source_slots
    every = max_feature_nodes is None or max_feature_nodes >= nF
    keep = nF if every else max_feature_nodes
    n2 = keep + L * T + T + n_logits
    parts = {
        # srcT, cols, the replacement's (L, T, d) tensors; a CLT's decoder rows into one layer, gathered a layer at a time
        "sources": 4 * T * d * slots + 8 * T * slots + 4 * L * T * d * 4 + (4 * k * T * d if cross_layer else 0),
        "token_images": 4 * T * T * d + min(4 * T * T * d, 8 << 20) if uses_token_images(T, d) else 0,
        "patterns": 2 * 4 * L * H * T * T,
        "batches": 4 * batch_size * T * (5 * d + 2 * S),  # a batch's gradient, its copies through a block, reads
        "rows": 4 * n * (n if every else keep + n_logits),
        # then, left-out features: the influence ranking's block of scaled rows, or the kept adjacency with a block
        # of rows, its kept columns and its left-out ones being moved into it, whichever is larger
        "kept": 0 if every else 4 * n2 * n2 + 3 * min(_CHUNK_BYTES, 4 * n * (keep + n_logits)),
        "table": 400 * n2,
    }
    parts["total"] = sum(parts.values())
    return parts


def _feature_budget(m: HookedSprout, rep: LocalReplacement, n_logits: int, max_feature_nodes: Optional[int],
                    batch_size: int, budget: int) -> Optional[int]:
    """The ``max_feature_nodes`` a graph is made with: None (every active feature) or a number. Asked for None,
    every feature when the graph fits ``budget`` bytes, else the largest number that fits; asked for a number, that
    number if it fits. Raises AttributionGraphError naming the argument, the estimate and the budget otherwise."""
    L, T, nF = m.cfg.n_layers, rep.tokens.numel(), rep.n_features
    counts = torch.zeros(L * T, dtype=torch.long)
    counts.index_put_((rep.feat_layer.cpu() * T + rep.feat_pos.cpu(),), torch.ones(nF, dtype=torch.long),
                      accumulate=True)
    slots = None
    if rep.clt is not None:  # each layer's sources: every earlier layer's features at the position, as _clt_sources
        cum = counts.view(L, T).cumsum(0)
        slots = int((cum.max(dim=1).values + 2).sum())
    shape = dict(n_layers=L, d_model=m.cfg.d_model, n_heads=m.cfg.n_heads, n_pos=T, n_features=nF,
                 k=int(counts.max()) if nF else 0, n_logits=n_logits, batch_size=batch_size,
                 cross_layer=rep.clt is not None, source_slots=slots)

    def need(keep: Optional[int]) -> dict[str, int]:
        return graph_memory(**shape, max_feature_nodes=keep)

    def gib(b: int) -> str:
        return f"{b / 2 ** 30:.2f} GiB" if b >= 1 << 28 else f"{b / 2 ** 20:.1f} MiB" if b >= 1 << 20 else f"{b:,} bytes"

    if max_feature_nodes is None and need(None)["total"] <= budget:
        return None
    asked = None if max_feature_nodes is None else min(max_feature_nodes, nF)
    if asked is not None and need(asked)["total"] <= budget:
        return max_feature_nodes
    lo, hi = 0, nF - 1  # the largest number of features left out that fits: need() grows with it below nF
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need(mid)["total"] <= budget else (lo, mid - 1)
    parts = need(asked if asked is not None else max(lo, 1))
    show = ", ".join(f"{k} {gib(v)}" for k, v in parts.items() if k != "total")
    where = (f"this prompt's graph ({T} positions, {nF:,} active features, up to {shape['k']} at one layer and "
             f"position)")
    if lo >= 1 and asked is not None:
        raise AttributionGraphError(
            f"max_feature_nodes={max_feature_nodes} needs about {gib(parts['total'])} for {where}, more than "
            f"memory_budget={budget:,} bytes ({gib(budget)}; default sprout_interp.core.limits.MAX_GRAPH_BYTES): "
            f"max_feature_nodes must be 1..{lo} here"
            f"{' (or None: every feature fits)' if need(None)['total'] <= budget else ''}, or raise memory_budget "
            f"({show})")
    if lo >= 1:
        return lo
    raise AttributionGraphError(
        f"{where} needs about {gib(parts['total'])} even with one feature kept, more than memory_budget={budget:,} "
        f"bytes ({gib(budget)}; default sprout_interp.core.limits.MAX_GRAPH_BYTES): shorten the text, lower "
        f"batch_size={batch_size}, use transcoders of a smaller k, or raise memory_budget ({show})")


def _hop_macs(d: int, H: int, skip: bool, P: int) -> tuple[int, int]:
    """Multiply-adds per row of one block's skip connection and attention backward: on ``P`` positions, and on the
    1 + H vectors of a factored gradient (then expanded to the positions)."""
    n = (1 + H) * (2 if skip else 1)  # vectors after the skip connection
    factored = (1 + H) * d * d * skip + 2 * n * d * d + H * n * P * P + n * (1 + H) * P * d
    return P * ((3 if skip else 2) * d * d + P * d), factored


def attribution_graph(model, text, transcoders: TranscodersLike = None, *, kind: Optional[str] = None,
                      bos: bool = True,
                      max_n_logits: int = 10, desired_logit_prob: float = 0.95, batch_size: int = 64,
                      max_feature_nodes: Optional[int] = None, rerank_every: int = 2048,
                      attribution_targets=None, final_norm: str = "frozen", memory_budget: Optional[int] = None,
                      progress: bool = False) -> AttributionGraph:
    """The attribution graph of ``model`` on one prompt (see the module docstring for its nodes and edges).

    Args:
        text: one text, or token ids ``(pos,)`` / ``(1, pos)``.
        transcoders: what replaces the feed-forwards: per-layer transcoders, one per block (a TranscoderSet,
            ``{layer: Transcoder}``), a cross-layer transcoder (a CrossLayerTranscoder: each feature writes to its
            own and every later feed-forward output), a folder holding either, or None: the shipped transcoders of
            ``kind``.
        kind: with ``transcoders=None``, which shipped transcoders: "per_layer" (``<checkpoint>/transcoders/``),
            "clt" (``<checkpoint>/clt/``) or None, the best the model ships (the higher recorded held-out FVE:
            :func:`~sprout_interp.circuits.local_replacement.best_kind`). With ``transcoders`` given, its kind if
            named. ``graph.info["transcoder_kind"]`` records the kind used.
        bos: circuit-tracer's convention: ``<|endoftext|>`` first (prepended if missing), no feature or error
            nodes at position 0; False: the ids as given, every position's features.
        max_n_logits, desired_logit_prob: which logit nodes (circuit-tracer's defaults 10 and 0.95).
        attribution_targets: token ids (a list or a 1-d tensor) to be the logit nodes instead, in that order, each
            with its probability (circuit-tracer's ``attribution_targets`` given as a tensor of token indices):
            for a token the model does not rank among its most probable.
        batch_size: target rows per backward pass (memory: about ``batch_size * pos * d_model * 16`` bytes).
        max_feature_nodes: keep at most this many feature nodes, chosen as circuit-tracer 0.5's ``attribute``
            chooses them (None: every active feature when the graph fits ``memory_budget``, else as many as fit,
            chosen the same way; a number above the active count keeps them all). The logit
            rows come first; then, until the budget is spent, the features' influence on the logits is computed
            over the rows known so far (circuit-tracer's ``compute_partial_influences``: ``|rows|`` normalized to
            sum 1, weighted by the logit probabilities, every path), the ``rerank_every`` unvisited features of
            most influence get their rows, and the ranking is done again. Ties keep node order (circuit-tracer's
            ``argsort`` leaves them unordered). The features left out lose their columns, as in circuit-tracer;
            their summed direct effect on each kept node goes to the node table's ``dropped`` column (circuit-tracer
            keeps it nowhere), so ``input == edges + constant + dropped`` still holds exactly.
        rerank_every: features whose rows are computed between two rankings: circuit-tracer's
            ``update_interval * batch_size`` (4 * 512 by default; pass its product to match another call).
        final_norm: how the logit rows pass the final RMSNorm. ``"frozen"`` (circuit-tracer's graph): its scale
            frozen at its value on the prompt, as every norm's; each logit node's input is then exactly its edges
            plus its constant, in the frozen replacement model. ``"jacobian"``: the norm's Jacobian at the prompt
            (:func:`~sprout_interp.circuits.local_replacement.rms_norm_jacobian`), so an edge into a logit node is
            the real model's first-order change of that logit per the source's write (patterns and the other
            norms' scales still frozen, later feed-forwards replaced as in the graph). The rows still add up:
            a logit node's ``constant`` is then what the norm's Jacobian gives the constant writes plus
            ``(1 - eps / s²)`` times its input (``s`` the final scale at the last position), the part of the input
            no first-order edge carries (the norm undoes a scaling of the whole stream). Feature rows are the same
            in both modes; the choice is ``graph.info["final_norm"]`` and travels in the graph file. A graph made
            with ``max_feature_nodes`` may keep other features in each mode (the influence ranking reads the
            logit rows).
        memory_budget: the bytes the graph's own tensors may take at their peak (None:
            ``sprout_interp.core.limits.MAX_GRAPH_BYTES``, 1 GiB), estimated by :func:`graph_memory` before any
            is allocated. The rows grow with the square of the prompt (every node's row holds every node), so with
            ``max_feature_nodes=None`` a long prompt keeps the features of most influence that fit (the others'
            effect stays in ``dropped``: the graph is as exact); a ``max_feature_nodes`` that does not fit is
            refused, naming the largest that does.
        progress: show a progress bar over the batches.

    Returns an :class:`AttributionGraph`; ``graph.adjacency`` is ``(n, n)`` float32, rows = targets, in the
    targets' units (see ``GRAPH_UNITS``). Raises AttributionGraphError (or UnequalLengthsError) for a batch of
    texts or a ``kind`` that is not one or does not match ``transcoders``, TranscoderNotFoundError for a ``kind`` the
    model does not ship (naming those it does) and TranscoderNotFoundError / TranscoderMismatchError for transcoders
    that do not cover or fit the model.
    """
    m = as_hooked(model)
    max_n_logits = check_count(max_n_logits, "max_n_logits", high=m.cfg.d_vocab, error=AttributionGraphError)
    desired_logit_prob = check_number(desired_logit_prob, "desired_logit_prob", low=0.0, high=1.0,
                                      error=AttributionGraphError)
    batch_size = check_count(batch_size, "batch_size", high=1 << 20, error=AttributionGraphError)
    if max_feature_nodes is not None:
        max_feature_nodes = check_count(max_feature_nodes, "max_feature_nodes", high=1 << 31,
                                        what="feature nodes kept; None keeps every active feature",
                                        error=AttributionGraphError)
    rerank_every = check_count(rerank_every, "rerank_every", high=1 << 31,
                               what="feature rows computed between two influence rankings",
                               error=AttributionGraphError)
    targets = None
    if attribution_targets is not None:
        targets = check_indices(attribution_targets, "attribution_targets", m.cfg.d_vocab,
                                what="token ids of the logit nodes", error=AttributionGraphError)
        if len(set(targets)) != len(targets):
            raise AttributionGraphError(f"attribution_targets={targets} names a token twice: each logit node is one "
                                        "token; pass each id once")
    if final_norm not in FINAL_NORMS:
        raise AttributionGraphError(f"final_norm must be one of {FINAL_NORMS} (the frozen scale, circuit-tracer's "
                                    f"graph; or the norm's Jacobian for first-order logit edges), got {final_norm!r}"
                                    [:300])
    budget = limits.MAX_GRAPH_BYTES if memory_budget is None else memory_budget
    budget = check_count(budget, "memory_budget", high=1 << 50, what="bytes the graph's tensors may take",
                         error=AttributionGraphError)
    transcoders = resolve_transcoders(m, transcoders, kind)
    with m.lock:
        rep = local_replacement(m, text, transcoders, bos, cross_layer=True)
    n_logits = len(targets) if targets is not None else min(max_n_logits, m.cfg.d_vocab)
    max_feature_nodes = _feature_budget(m, rep, n_logits, max_feature_nodes, batch_size, budget)
    return _graph(m, rep, max_n_logits, desired_logit_prob, batch_size, progress, max_feature_nodes, rerank_every,
                  targets, final_norm)


def partial_influence(rows: Float[Tensor, "r n"], row_nodes: Int[Tensor, " r"],
                      logit_probs: Float[Tensor, " k"], max_iter: int = 128) -> Float[Tensor, " n"]:
    """circuit-tracer's ``compute_partial_influences``: each node's influence on the logit nodes (the last ``k``
    columns) through the rows computed so far (``rows[i]`` is node ``row_nodes[i]``'s incoming edges; a node
    without a row passes nothing on). ``|rows|`` each scaled to sum 1 (floor 1e-8), ``p @ (N + N² + ...)``.

    Rows of more than ``_CHUNK_BYTES`` are scaled a block at a time at every step instead of once (the same
    values, without a second copy of the rows)."""
    r, n = rows.shape
    step = max(1, _CHUNK_BYTES // max(1, 4 * n))
    if r <= step:
        N = rows.abs()
        N /= N.sum(dim=1, keepdim=True).clamp(min=1e-8)
        blocks = [(0, r, N)]
    else:
        sums = torch.cat([rows[i:i + step].abs().sum(dim=1, keepdim=True) for i in range(0, r, step)]).clamp(min=1e-8)
        blocks = [(i, min(r, i + step), None) for i in range(0, r, step)]
    prod = torch.zeros(n, dtype=rows.dtype, device=rows.device)
    prod[-logit_probs.numel():] = logit_probs.to(rows.dtype)
    total = torch.zeros_like(prod)
    for _ in range(max_iter):
        w = prod[row_nodes]
        prod = torch.zeros_like(total)
        for i, j, N in blocks:
            prod += w[i:j] @ (N if N is not None else rows[i:j].abs().div_(sums[i:j]))
        if not bool(prod.any()):
            return total
        total += prod
    raise AttributionGraphError(f"influence did not settle after {max_iter} steps: the rows have a cycle")


@torch.no_grad()
def _graph(m: HookedSprout, rep: LocalReplacement, max_n_logits: int, desired_logit_prob: float, batch_size: int,
           progress: bool, max_feature_nodes: Optional[int] = None, rerank_every: int = 2048,
           targets: Optional[list] = None, final_norm: str = "frozen") -> AttributionGraph:
    from tqdm.auto import tqdm

    L, T = m.cfg.n_layers, rep.tokens.numel()
    if targets is None:
        logit_ids, logit_p = salient_logits(rep.logits, max_n_logits, desired_logit_prob)
    else:
        logit_ids = torch.tensor(targets, dtype=torch.long, device=rep.logits.device)
        logit_p = torch.softmax(rep.logits.float(), dim=-1)[logit_ids]
    nF, nL = rep.n_features, logit_ids.numel()
    n = nF + L * T + T + nL
    every = max_feature_nodes is None or max_feature_nodes >= nF
    n_keep = nF if every else max_feature_nodes
    # rows of the buffer: with every feature, row = node; else the logits first, then features as computed
    bw = _Backward(m, rep, n if every else n_keep + nL, n)
    W_U = m.model.head.weight.detach().float()
    gf = m.ln_final.w.detach().float()
    unembed = W_U[logit_ids] - W_U.mean(0)  # each logit node's demeaned unembedding, read after the final norm
    if final_norm == "jacobian":  # its first-order map at the last resid_post, applied to the rows
        J = rms_norm_jacobian(rep.final_normalized * rep.scale_final[-1], gf, m.ln_final.eps)
        logit_vecs = (unembed.double() @ J).float()
    else:
        logit_vecs = unembed * gf / rep.scale_final[-1]  # read at the last resid_post
    logit_row0 = n - nL if every else 0
    enc = [rep.encoder(layer)[0] for layer in range(L)]
    g2 = [blk.ln2.w.detach().float() for blk in m.blocks]

    def feature_rows(nodes: Tensor, st: int) -> None:
        """Rows of feature nodes ``nodes`` (ascending), into buffer rows from ``st`` on, a layer at a time."""
        layers = rep.feat_layer[nodes]
        for layer in layers.unique().tolist():
            sel = nodes[layers == layer]
            r = st + int((layers < layer).sum())
            for a in range(0, sel.numel(), batch_size):
                idx = sel[a:a + batch_size]
                pos = rep.feat_pos[idx]
                u = enc[layer][rep.feat_index[idx]] * g2[layer] * bw.inv2[layer, pos, None]
                bw.feature_rows(layer, pos, u, r + a, r + a + idx.numel())
                bar.update(idx.numel())

    with tqdm(total=n_keep + nL, disable=not progress, desc="attribution graph rows", unit="row") as bar:
        for r in range(0, nL, batch_size):
            k = min(nL - r, batch_size)
            G = torch.zeros(T, k, m.cfg.d_model, device=logit_vecs.device)
            G[-1] = logit_vecs[r:r + k]
            bw.down(L, G, logit_row0 + r, logit_row0 + r + k)
            bar.update(k)
        if every:
            for layer in range(L):
                lo, hi = rep.layer_span(layer)
                feature_rows(torch.arange(lo, hi, device=rep.feat_layer.device), lo)
        else:
            dev = rep.feat_layer.device
            row_nodes = torch.zeros(n_keep + nL, dtype=torch.long, device=dev)
            row_nodes[:nL] = torch.arange(n - nL, n, device=dev)
            visited = torch.zeros(nF, dtype=torch.bool, device=dev)
            st = nL
            while st - nL < n_keep:
                infl = partial_influence(bw.adj[:st], row_nodes[:st], logit_p.to(bw.adj.device))
                rank = torch.sort(infl[:nF], descending=True, stable=True).indices
                pending = rank[~visited[rank]][:min(rerank_every, n_keep - (st - nL))].sort().values
                feature_rows(pending, st)
                row_nodes[st:st + pending.numel()] = pending
                visited[pending] = True
                st += pending.numel()
    adj, const = bw.adj, bw.const
    dropped = torch.zeros(n, device=adj.device)
    if not every:
        keep = visited.nonzero()[:, 0]
        cols = torch.cat([keep, torch.arange(nF, n, device=dev)])
        order = torch.cat([nL + row_nodes[nL:].argsort(), torch.arange(nL, device=dev)])  # features, then logits
        n2 = cols.numel()
        dest = torch.cat([torch.arange(n_keep, device=dev), torch.arange(n2 - nL, n2, device=dev)])
        out = (~visited).nonzero()[:, 0]
        rows, bw.adj = adj, None
        dropped = torch.zeros(n2, device=rows.device)
        adj = torch.zeros(n2, n2, device=rows.device)
        step = max(1, _CHUNK_BYTES // max(1, 4 * n))
        for i in range(0, order.numel(), step):  # a block of rows at a time: no second copy of the buffer
            blk = rows[order[i:i + step]]
            adj[dest[i:i + step]] = blk[:, cols]
            dropped[dest[i:i + step]] = blk[:, out].sum(1)
        del rows, blk
        c = const[order]
        const = torch.zeros(n2, device=adj.device)
        const[:n_keep], const[n2 - nL:] = c[:n_keep], c[n_keep:]
        rep = _keep_features(rep, keep)
        n = n2
    inputs = torch.full((n,), math.nan)
    inputs[:n_keep] = rep.feat_input.cpu()
    inputs[n - nL:] = (rep.logits[logit_ids] - rep.logits.mean()).cpu()
    if final_norm == "jacobian":  # the part of each logit's input that no first-order edge carries
        s = float(rep.scale_final[-1])
        const[n - nL:] += (inputs[n - nL:] * (1.0 - m.ln_final.eps / s ** 2)).to(const.device)
    nan = torch.isnan(inputs)
    const = torch.where(nan, torch.full_like(inputs, math.nan), const.cpu())
    dropped = torch.where(nan, torch.full_like(inputs, math.nan), dropped.cpu())
    return AttributionGraph(adjacency=adj.cpu(), nodes=_node_table(m, rep, logit_ids, logit_p, inputs, const, dropped),
                            tokens=rep.tokens.cpu(), n_layers=L,
                            info={"model_name": m.name or "", "bos": rep.bos, "max_n_logits": max_n_logits,
                                  "desired_logit_prob": desired_logit_prob, "macs": bw.macs,
                                  "max_feature_nodes": max_feature_nodes, "rerank_every": rerank_every,
                                  "attribution_targets": targets, "final_norm": final_norm,
                                  "n_active_features": nF, **_transcoder_info(rep)})


def _transcoder_info(rep: LocalReplacement) -> dict:
    """What a graph's info records of its transcoders: their kind ("per_layer" or "clt"), model name, k (None for
    a CLT: JumpReLU), width per layer and skip connection."""
    if rep.clt is not None:
        return {"transcoder_kind": "clt", "transcoders": rep.clt.info.get("model_name", "") or "", "k": None,
                "d_transcoder": rep.clt.d_transcoder, "skip": False}
    tc = rep.transcoders[0]
    return {"transcoder_kind": "per_layer", "transcoders": tc.info.get("model_name", "") or "", "k": tc.k,
            "d_transcoder": tc.d_transcoder, "skip": tc.has_skip}


def _keep_features(rep: LocalReplacement, keep: Int[Tensor, " m"]) -> LocalReplacement:
    """``rep`` with only the feature nodes ``keep`` (ascending node indices)."""
    from dataclasses import replace

    return replace(rep, feat_layer=rep.feat_layer[keep], feat_pos=rep.feat_pos[keep], feat_index=rep.feat_index[keep],
                   feat_act=rep.feat_act[keep], feat_input=rep.feat_input[keep])


def _labels(m: HookedSprout, ids: Tensor) -> list[str]:
    if m.tokenizer is None:  # ids-only model: labels show the ids
        return [f"#{int(i)}" for i in ids]
    return list(m.to_str_tokens(ids.reshape(-1).cpu()))


def _node_table(m: HookedSprout, rep: LocalReplacement, logit_ids: Tensor, logit_p: Tensor, inputs: Tensor,
                const: Tensor, dropped: Tensor) -> pd.DataFrame:
    L, T, nF, nL = m.cfg.n_layers, rep.tokens.numel(), rep.n_features, logit_ids.numel()
    tokens, logit_ids, logit_p = rep.tokens.cpu(), logit_ids.cpu(), logit_p.cpu()
    f_layer, f_pos, f_index, f_act = (t.cpu() for t in (rep.feat_layer, rep.feat_pos, rep.feat_index, rep.feat_act))
    toks = _labels(m, tokens)
    nan = math.nan
    dec_norm = torch.cat([rep.decoder_norms(layer).cpu()[f_index[slice(*rep.layer_span(layer))]]
                          for layer in range(L)]) if nF else torch.zeros(0)
    ep = torch.arange(L * T)
    cols = {
        "kind": ["feature"] * nF + ["error"] * (L * T) + ["embedding"] * T + ["logit"] * nL,
        "layer": torch.cat([f_layer, ep // T, torch.full((T,), -1), torch.full((nL,), L)]).tolist(),
        "pos": torch.cat([f_pos, ep % T, torch.arange(T), torch.full((nL,), T - 1)]).tolist(),
        "feature": torch.cat([f_index, torch.full((L * T + T + nL,), -1)]).tolist(),
    }
    tok_ids = torch.cat([tokens[f_pos], tokens.repeat(L), tokens, logit_ids]).tolist()
    labels = [toks[p] for p in cols["pos"][:nF + L * T + T]] + _labels(m, logit_ids)
    df = pd.DataFrame({"node": range(len(tok_ids)), **cols, "token_id": tok_ids, "token": labels})
    df.insert(3, "block", df["layer"] + 1)
    df["activation"] = f_act.tolist() + [nan] * (L * T + T + nL)
    df["logit_prob"] = [nan] * (nF + L * T + T) + logit_p.tolist()
    df["input"], df["constant"], df["dropped"] = inputs.tolist(), const.tolist(), dropped.tolist()
    emb = m.model.embed.weight.detach().float().cpu()[tokens].norm(dim=-1)
    df["norm"] = torch.cat([f_act.abs() * dec_norm, rep.errors.norm(dim=-1).flatten().cpu(), emb,
                            torch.full((nL,), nan)]).tolist()
    df.attrs["units"] = GRAPH_UNITS
    return df


def graph_macs(n_layers: int, d_model: int, n_heads: int, n_pos: int, n_features_per_pos: Union[int, float],
               skip: bool = True, n_logits: int = 10) -> dict[str, float]:
    """Multiply-adds of this module's backward passes for a prompt of ``n_pos`` positions (position 0 without
    features, as with ``bos``) with ``n_features_per_pos`` active features at each other (layer, position) (k for
    TopK), batches of one position's rows (the tokens' images through block 0 not counted: ``n_pos²·d²``), against
    circuit-tracer's: every batch through every position of every layer up to its own, its first attention step
    dense (its forward pass, the padding of its batches and the edge reads of error and token nodes not counted,
    so its count is a lower bound). The ratio ``ours / circuit_tracer`` is the floor a timing ratio can approach.
    """
    L, d, H, T, k = n_layers, d_model, n_heads, n_pos, n_features_per_pos
    S = k + 2  # the sources a read dots at each position: features, the error, the constants
    ours = ct = 0.0
    for layer in range(L + 1):  # the features of each layer, then the logit nodes (read after the last block)
        rows, positions = (k, range(1, T)) if layer < L else (n_logits, [T - 1])
        for p in positions:
            P = p + 1 if layer < L else T
            dense, factored = _hop_macs(d, H, skip, P)
            if layer < L:  # the first attention step, factored
                ours += rows * (2 * d * d + P * (1 + H) * d)
                ct += rows * T * (2 * d * d + T * d)
            if layer:  # the reads at blocks layer-1 .. 0, the hops through blocks layer-1 .. 1, the tokens' images
                hops = (layer - 1) * dense
                if layer < L and layer >= 2 and factored < dense:
                    hops += factored - dense
                ours += rows * (hops + layer * P * S * d + P * P * d)
            ct += rows * layer * T * ((3 if skip else 2) * d * d + T * d + k * d)
    return {"ours": ours, "circuit_tracer": ct, "ratio": ours / ct}
