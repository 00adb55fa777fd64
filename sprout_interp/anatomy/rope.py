"""The chapter's RoPE check, made reusable: a rotated query·key score depends only on the distance."""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from sprout_model.model import apply_rope, rope_tables


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
