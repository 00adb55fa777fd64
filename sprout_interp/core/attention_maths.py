"""One block's attention for some positions only, with the keys and values of the positions before them given:
the maths a key/value cache (generation), a patch that changes nothing before position ``s0`` (activation
patching) and a head recomputed from a patched query, key or value share.

These run the GPT's own modules (``sprout_model.model.Block``: ``norm1``, ``attn.heads``, the QK-norms,
``apply_rope``, ``attn.proj``) with no hook, so the numbers are the model's full forward at the positions
computed (the callers' tests check them against one). Shapes follow the model's: ``(batch, head, pos, d_head)``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from sprout_model.model import Block, apply_rope

__all__ = ["rotated_qkv", "rotate", "attend", "attention_output"]


def rotate(norm, x: Float[Tensor, "... pos d_head"], cos: Tensor, sin: Tensor) -> Float[Tensor, "... pos d_head"]:
    """A query or key as attention scores it: the QK-norm ``norm`` (``attn.q_norm`` or ``attn.k_norm``), then
    RoPE at the positions of ``cos``/``sin`` (one row per position of ``x``)."""
    return apply_rope(norm(x), cos, sin)


def rotated_qkv(blk: Block, x: Float[Tensor, "batch pos d_model"], cos: Tensor, sin: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
    """Block ``blk``'s queries, keys and values for the stream ``x`` (its input, before ``norm1``), each
    ``(batch, head, pos, d_head)``; queries and keys QK-normed and rotated to the positions of ``cos``/``sin``."""
    q, k, v = blk.attn.heads(blk.norm1(x))
    return rotate(blk.attn.q_norm, q, cos, sin), rotate(blk.attn.k_norm, k, cos, sin), v


def attend(q: Float[Tensor, "batch head n d_head"], k: Float[Tensor, "batch head t d_head"],
           v: Float[Tensor, "batch head t d_head"]) -> Float[Tensor, "batch head n d_head"]:
    """Causal attention of the last ``n`` positions of a sequence of ``t``: query ``i`` sits at position
    ``t - n + i`` and sees keys ``0 .. t - n + i``. ``n == t``: the whole sequence; ``n == 1``: one new token
    against every stored key (no mask)."""
    n, t = q.shape[-2], k.shape[-2]
    if n == t:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if n == 1:
        return F.scaled_dot_product_attention(q, k, v)
    s0 = t - n
    seen = torch.arange(t, device=q.device)[None, :] <= torch.arange(s0, t, device=q.device)[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=seen)


def attention_output(blk: Block, y: Float[Tensor, "batch head pos d_head"]) -> Float[Tensor, "batch pos d_model"]:
    """The heads' outputs ``y`` concatenated and projected by ``W_O``: what the attention adds to the stream."""
    B, H, T, dh = y.shape
    return blk.attn.proj(y.transpose(1, 2).reshape(B, T, H * dh))
