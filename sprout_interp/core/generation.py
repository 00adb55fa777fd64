"""What ``HookedSprout.generate`` runs each step: the hooked forward, or (when no hook is active) the GPT's own
modules with every block's keys and values kept, so each new token costs one position."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from sprout_model.model import GPT, Block, apply_rope

__all__ = ["HookedRunner", "KVCacheRunner"]


class HookedRunner:
    """Duck-types the bits of ``GPT`` that ``GPT.generate`` uses, running HookedSprout's forward."""

    def __init__(self, hooked):
        self.hooked = hooked
        self.cfg = hooked.model.cfg

    def __call__(self, idx: Tensor) -> tuple[Tensor, None]:
        """``(logits, None)`` for the sequence so far, as ``GPT.generate`` expects."""
        return self.hooked(idx), None


class KVCacheRunner:
    """Like :class:`HookedRunner`, but keeps every block's keys and values so each new token costs one position.

    ``GPT.generate`` calls it with the whole sequence so far (cropped to the context) and reads only
    the last position's logits. When the call extends the previous one by one token, only that token
    runs, against the stored keys and values; otherwise (the first call, or once the window slides
    past the context) the sequence is run in full and the store rebuilt. The arithmetic is the GPT's
    own modules, so greedy decoding gives the same tokens as the uncached forward.
    """

    def __init__(self, gpt: GPT):
        self.gpt = gpt
        self.cfg = gpt.cfg
        self.seen: Optional[Tensor] = None
        self.kv: list[tuple[Tensor, Tensor]] = []

    def _block(self, i: int, blk: Block, x: Tensor, start: int, fresh: bool) -> Tensor:
        T = x.shape[1]
        cos, sin = self.gpt.cos[start : start + T], self.gpt.sin[start : start + T]
        q, k, v = blk.attn.heads(blk.norm1(x))
        q, k = apply_rope(blk.attn.q_norm(q), cos, sin), apply_rope(blk.attn.k_norm(k), cos, sin)
        if fresh:
            self.kv.append((k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            k_all, v_all = (torch.cat((old, new), dim=2) for old, new in zip(self.kv[i], (k, v)))
            self.kv[i] = (k_all, v_all)
            y = F.scaled_dot_product_attention(q, k_all, v_all)  # one query: it sees every stored key
        x = x + blk.attn.proj(y.transpose(1, 2).reshape(x.shape))
        return x + blk.ffn(blk.norm2(x))

    def __call__(self, idx: Tensor) -> tuple[Tensor, None]:
        """``(logits, None)`` for the sequence so far, as ``GPT.generate`` expects."""
        prev = self.seen
        step = prev is not None and idx.shape[1] == prev.shape[1] + 1 and torch.equal(idx[:, :-1], prev)
        start = prev.shape[1] if step else 0
        x = self.gpt.embed(idx[:, start:])
        if not step:
            self.kv = []
        for i, blk in enumerate(self.gpt.blocks):
            x = self._block(i, blk, x, start, fresh=not step)
        self.seen = idx
        return self.gpt.head(self.gpt.norm(x[:, -1:])), None
