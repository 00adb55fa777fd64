"""Each head's full OV circuit: does what it writes, when it attends to a token, promote that same token?

Elhage et al., "A Mathematical Framework for Transformer Circuits" (2021), and Olsson et al., "In-context Learning
and Induction Heads" (2022): a head that attends to token ``t`` adds ``x_t W_V W_O`` to the stream, and through the
unembedding that is ``x_t W_V W_O W_U`` on the logits. For the token embeddings ``W_E`` this is the *full OV
circuit* ``W_E W_V W_O W_U``, a (d_vocab, d_vocab) matrix of rank d_head: row ``t`` is what the head does to every
logit when it reads ``t``. A copying head (an induction head's OV, a name mover) has it dominated by positive
eigenvalues and its own token high in each row.

- :func:`full_ov_circuit`: that matrix for one head, as a TransformerLens ``FactoredMatrix`` (never built in full).
- :func:`ov_copying_scores`: per head the eigenvalue copying score ``Σλ / Σ|λ|`` (1: every eigenvalue positive,
  the circuit copies; -1: it suppresses what it reads; near 0: neither) and how often the token read is among the
  ``k`` tokens the head promotes most.

Weights as HookedSprout gives them (``W_V`` carries ln1's gain, ``W_U`` ln_final's). With ``normalize=True`` each
embedding row is divided by its RMS, as ln1 divides a stream that holds only that token (a positive number per
token; ln_final's division is one positive number per position and changes no ranking). What these cannot see:
the blocks between the embedding and the head (for a head after block 1 the stream holds more than the token), so
they describe what the weights are built to do, not what a text makes them do; ablations and patching measure that.

Tables: ``layer`` (0-indexed), ``block`` (= layer + 1), ``head``.
"""
from __future__ import annotations

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import FactoredMatrix

from sprout_interp.core.arguments import check_count, check_index
from sprout_interp.core.errors import ArgumentError
from sprout_interp.core.hooked import as_hooked

__all__ = ["full_ov_circuit", "ov_copying_scores"]


def _embeddings(model, normalize: bool) -> Float[Tensor, "d_vocab d_model"]:
    w = model.W_E.detach().float()
    if not normalize:
        return w
    return w * torch.rsqrt(w.pow(2).mean(-1, keepdim=True) + model.blocks[0].ln1.eps)


def _check_head(model, layer: int, head: int) -> None:
    L, H = model.cfg.n_layers, model.cfg.n_heads
    what = f"this model has layers 0-{L - 1} and heads 0-{H - 1}"
    try:
        check_index(layer, "layer", L, what=what), check_index(head, "head", H, what=what)
    except ArgumentError as e:
        raise ArgumentError(f"no head {head!r} in layer {layer!r}: {e}") from None


@torch.no_grad()
def full_ov_circuit(model, layer: int, head: int, normalize: bool = True) -> FactoredMatrix:
    """``W_E W_V W_O W_U`` of one head as a FactoredMatrix of shape (d_vocab, d_vocab), factored through d_head.

    Row ``t``, column ``u``: the change (in logits, before ln_final's division) the head makes to token ``u``'s
    logit per unit of attention on a position holding token ``t``. ``normalize=True`` (default) divides each
    embedding row by its RMS, as ln1 divides a stream that holds only that token; ``False`` uses the raw rows.
    """
    model = as_hooked(model)
    _check_head(model, layer, head)
    e = _embeddings(model, normalize)
    return FactoredMatrix(e @ model.W_V[layer, head].detach().float(),
                          model.W_O[layer, head].detach().float() @ model.W_U.detach().float())


@torch.no_grad()
def ov_copying_scores(model, normalize: bool = True, k: int = 5, ranks: bool = True, chunk: int = 1024) -> pd.DataFrame:
    """Every head's full-OV copying: eigenvalue score and how often it promotes the token it reads.

    Returns one row per head: ``layer, block, head``, ``copying_score`` (``Σλ / Σ|λ|`` over the full OV circuit's
    d_head eigenvalues, real part; unitless in [-1, 1]), ``self_top_k`` (share of the vocabulary whose own token is
    among the ``k`` largest entries of its row: the head, reading it, promotes it), ``self_rank_median`` (the
    median rank of a token's own logit in its row, 0 = the largest). ``attrs``: ``k``, ``normalize``, ``units``.
    The eigenvalues cost a (d_head x d_head) matrix per head; the ranks one (d_vocab x d_head) @ (d_head x
    d_vocab) product per head, in row chunks of ``chunk`` (Sprout: ~35 s on one thread): ``ranks=False`` leaves
    those two columns out.
    """
    model = as_hooked(model)
    k = check_count(k, "k", what="the top entries of a row that count as promoting")
    chunk = check_count(chunk, "chunk", what="vocabulary rows multiplied at a time")
    e = _embeddings(model, normalize)
    W_V, W_O, W_U = (w.detach().float() for w in (model.W_V, model.W_O, model.W_U))
    V = e.shape[0]
    rows = []
    for l in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            left, right = e @ W_V[l, h], W_O[l, h] @ W_U  # (vocab, d_head), (d_head, vocab)
            lam = torch.linalg.eigvals(right @ left)  # the nonzero eigenvalues of left @ right
            score = float(lam.sum().real / lam.abs().sum()) if float(lam.abs().sum()) > 0 else float("nan")
            row = dict(layer=l, block=l + 1, head=h, copying_score=score)
            if ranks:
                rank = torch.empty(V, dtype=torch.long)
                for s in range(0, V, chunk):
                    block = left[s:s + chunk] @ right  # (c, vocab)
                    own = block[torch.arange(block.shape[0]), torch.arange(s, s + block.shape[0])]
                    rank[s:s + block.shape[0]] = (block > own[:, None]).sum(-1)
                row.update(self_top_k=float((rank < k).float().mean()), self_rank_median=float(rank.float().median()))
            rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs.update(k=k, normalize=normalize, units="copying_score unitless in [-1, 1]; self_top_k a share of "
                    "the vocabulary; self_rank_median a rank (0 = the largest entry of the row)",
                    convention="layer 0-indexed; block = layer + 1; head from 0")
    return df
