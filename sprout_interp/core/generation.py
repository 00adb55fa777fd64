"""What ``HookedSprout.generate`` runs each step: the hooked forward, or (when no hook is active) the GPT's own
modules with every block's keys and values kept, so each new token costs one position; and the check of its
sampling arguments (:func:`check_sampling`, with the :data:`MAX_NEW_TOKENS` limit)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from sprout_interp.core.arguments import check_count, check_number
from sprout_interp.core.attention_maths import attend, attention_output, rotated_qkv
from sprout_model.model import GPT, Block

__all__ = ["HookedRunner", "KVCacheRunner", "MAX_NEW_TOKENS", "check_sampling"]

#: The most tokens one ``generate`` call may add. Each one is a forward (one position with the key/value cache,
#: the whole context once the window slides past it), so a typo such as 10**9 would run for days; read at every
#: call, so ``sprout_interp.core.generation.MAX_NEW_TOKENS = 20_000`` allows longer samples.
MAX_NEW_TOKENS = 4096


def check_sampling(max_new_tokens, temperature, top_k, top_p, d_vocab: int) -> tuple[int, float, Optional[int], Optional[float]]:
    """``(max_new_tokens, temperature, top_k, top_p)`` as plain numbers, or an ArgumentError naming the argument
    ``GPT.generate`` would misread or loop on: ``max_new_tokens`` 0..:data:`MAX_NEW_TOKENS`, ``temperature`` finite
    and >= 0 (0: greedy), ``top_k`` None or 1..``d_vocab``, ``top_p`` None or in (0, 1]."""
    max_new_tokens = check_count(max_new_tokens, "max_new_tokens", low=0, high=MAX_NEW_TOKENS,
                                 what="sprout_interp.core.generation.MAX_NEW_TOKENS is the limit; raise it for longer samples")
    temperature = check_number(temperature, "temperature", low=0.0, what="0 samples greedily, 1 from the model's own distribution")
    if top_k is not None:
        top_k = check_count(top_k, "top_k", low=1, high=d_vocab, what="keep the k most likely tokens; None keeps all")
    if top_p is not None:
        top_p = check_number(top_p, "top_p", low=0.0, high=1.0, low_open=True,
                             what="keep the most likely tokens up to this probability mass; None or 1 keeps all")
    return max_new_tokens, temperature, top_k, top_p


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
        q, k, v = rotated_qkv(blk, x, self.gpt.cos[start : start + T], self.gpt.sin[start : start + T])
        if fresh:
            self.kv.append((k, v))
        else:
            k, v = (torch.cat((old, new), dim=2) for old, new in zip(self.kv[i], (k, v)))
            self.kv[i] = (k, v)
        x = x + attention_output(blk, attend(q, k, v))  # one new query sees every stored key
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
