"""The chapter's RoPE check, made reusable: a rotated query·key score depends only on the distance."""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from sprout_model.model import apply_rope, rope_tables

__all__ = ["random_qk", "rope_score", "score_grid", "turn_lengths", "head_qk", "head_score_grid", "scores_by_distance"]


def random_qk(head_dim: int = 64, seed: int = 1) -> tuple[Float[Tensor, " head_dim"], Float[Tensor, " head_dim"]]:
    """A seeded random query and key of unit length."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(head_dim, generator=g), torch.randn(head_dim, generator=g)
    return q / q.norm(), k / k.norm()


def rope_score(q: Tensor, k: Tensor, m: int, n: int, base: float = 10000.0) -> float:
    """(RoPE(q, m) · RoPE(k, n)) for a query at position m and a key at position n."""
    d = q.shape[-1]
    cos, sin = rope_tables(d, max(m, n) + 1, base)
    return float(apply_rope(q, cos[m], sin[m]) @ apply_rope(k, cos[n], sin[n]))


def score_grid(q: Tensor, k: Tensor, size: int = 64, base: float = 10000.0) -> Float[Tensor, "m n"]:
    """score[m, n] for all query positions m and key positions n below ``size``: constant along diagonals."""
    d = q.shape[-1]
    cos, sin = rope_tables(d, size, base)
    rq = apply_rope(q.expand(size, d), cos, sin)
    rk = apply_rope(k.expand(size, d), cos, sin)
    return rq @ rk.T


def turn_lengths(head_dim: int = 64, base: float = 10000.0) -> Float[Tensor, " pairs"]:
    """Positions per full turn of each pair i: 2π/θᵢ (pair 0 ≈ 6.3, the last ≈ 47,000 for head_dim 64)."""
    theta = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    return 2 * torch.pi / theta


# -- a real head's queries and keys -------------------------------------------------------------


def _head_cache(model, input, layer: int, head: int, names: list[str]) -> dict:
    from sprout_interp.core.arguments import check_index
    from sprout_interp.core.errors import AblationError
    from sprout_interp.core.hooked import as_hooked

    model = as_hooked(model)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    try:
        layer = check_index(layer, "layer", L, what=f"this model has {L} blocks, layers 0..{L - 1} in code", error=AblationError)
    except AblationError as e:
        raise AblationError(f"there is no layer {layer!r}: {e}") from None
    try:
        head = check_index(head, "head", H, what=f"this model has {H} heads per block", error=AblationError)
    except AblationError as e:
        raise AblationError(f"there is no head {head!r}: {e}") from None
    toks, _ = model.prepare_input(input)
    if toks.shape[0] != 1:
        raise AblationError(f"one text or one row of token ids, please (got {toks.shape[0]} rows)")
    full = [f"blocks.{int(layer)}.{n}" for n in names]
    _, cache = model.run_with_cache(toks, names_filter=full, return_type=None, return_cache_object=False)
    return {n: cache[f] for n, f in zip(names, full)}


def head_qk(model, input, layer: int, head: int) -> tuple[Float[Tensor, "pos d_head"], Float[Tensor, "pos d_head"]]:
    """The model's own queries and keys of one head (``layer`` 0-indexed) at every position of one text,
    after QK-norm and before RoPE (``attn.q_norm.hook_normalized``/``k_norm``): the vectors that RoPE then
    rotates by their position. :func:`rope_score` of a pair at (m, n) and at (m + s, n + s) agree."""
    c = _head_cache(model, input, layer, head, ["attn.q_norm.hook_normalized", "attn.k_norm.hook_normalized"])
    q, k = c["attn.q_norm.hook_normalized"][0, :, int(head)], c["attn.k_norm.hook_normalized"][0, :, int(head)]
    return q.detach().float().cpu(), k.detach().float().cpu()


def head_score_grid(model, input, layer: int, head: int) -> Float[Tensor, "query key"]:
    """One head's real attention scores on one text, ``q·k / sqrt(d_head)`` before the softmax
    (``attn.hook_attn_scores``); future keys are NaN."""
    s = _head_cache(model, input, layer, head, ["attn.hook_attn_scores"])["attn.hook_attn_scores"][0, int(head)]
    s = s.detach().float().cpu().clone()
    s[torch.isinf(s)] = float("nan")
    return s


def scores_by_distance(model, input, layer: int, head: int, grid: Tensor | None = None):
    """Does a real head's score depend only on the distance? Its scores (:func:`head_score_grid`) grouped by
    distance m − n (query position m, key position n ≤ m).

    Returns a DataFrame ``layer`` (0-indexed), ``block`` (layer + 1), ``head``, ``distance``, ``mean``,
    ``std``, ``n`` (pairs at that distance); ``attrs["r2"]`` is the share of the scores' variance that the
    distance explains (1 when, as for one fixed q and k rotated by RoPE, the score is a function of the
    distance alone; near 0 when what the tokens are decides it).
    """
    import pandas as pd

    g = head_score_grid(model, input, layer, head) if grid is None else grid
    T = g.shape[0]
    m, n = torch.tril_indices(T, T)
    vals, dist = g[m, n].double(), (m - n)
    df = pd.DataFrame({"distance": dist.numpy(), "score": vals.numpy()})
    by = df.groupby("distance")["score"]
    out = pd.DataFrame({"mean": by.mean(), "std": by.std(ddof=0), "n": by.size()}).reset_index()
    out.insert(0, "head", int(head))
    out.insert(0, "block", int(layer) + 1)
    out.insert(0, "layer", int(layer))
    total = float(((df["score"] - df["score"].mean()) ** 2).sum())
    within = float(((df["score"] - by.transform("mean")) ** 2).sum())
    out.attrs.update(r2=(1.0 - within / total) if total > 0 else 1.0, units="q·k / sqrt(d_head)",
                     convention="layer = index in code (blocks.{layer}); block = layer + 1")
    return out
