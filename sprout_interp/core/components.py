"""The hooked pieces of one Sprout: its config in TransformerLens's names, the norms, attention, feed-forward,
block and unembedding, each calling the checkpoint's own modules and firing the hook points listed in
``sprout_interp.core.hooked``'s docstring. ``HookedSprout`` (``core.hooked``) assembles them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from sprout_interp.core.hook_points import heads_hook, hook_point, is_hooked
from sprout_model.model import GPT, Attention, Block, Config, FeedForward, RMSNorm, apply_rope

__all__ = ["HookedSproutConfig", "HookedRMSNorm", "HookedHeadNorm", "HookedAttention", "HookedMLP", "HookedBlock", "HookedUnembed"]


# --------------------------------------------------------------------------------------------
# config


@dataclass
class HookedSproutConfig:
    """TransformerLens-style names for a Sprout :class:`~sprout_model.Config` (kept as ``.sprout``)."""

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    d_vocab: int
    n_ctx: int
    rotary_base: float
    rotary_dim: int
    eps: float = 1e-6
    act_fn: str = "silu"
    normalization_type: str = "RMS"
    positional_embedding_type: str = "rotary"
    gated_mlp: bool = True
    attn_only: bool = False
    final_rms: bool = True
    tie_word_embeddings: bool = True
    default_prepend_bos: bool = False
    n_key_value_heads: Optional[int] = None  # every head has its own keys and values
    original_architecture: str = "Sprout"
    model_name: str = ""
    device: Optional[torch.device] = None
    dtype: torch.dtype = torch.float32
    sprout: Optional[Config] = field(default=None, repr=False)

    @property
    def d_vocab_out(self) -> int:
        return self.d_vocab

    @property
    def context(self) -> int:
        """Sprout's name for ``n_ctx``."""
        return self.n_ctx

    @classmethod
    def from_sprout(cls, cfg: Config, name: str = "") -> "HookedSproutConfig":
        """The TransformerLens-named view of a Sprout ``Config``."""
        return cls(
            n_layers=cfg.n_layer,
            n_heads=cfg.n_head,
            d_model=cfg.d_model,
            d_head=cfg.head_dim,
            d_mlp=cfg.d_ff,
            d_vocab=cfg.vocab_size,
            n_ctx=cfg.context,
            rotary_base=cfg.rope_base,
            rotary_dim=cfg.head_dim,
            model_name=name,
            sprout=cfg,
        )


# --------------------------------------------------------------------------------------------
# components: thin wrappers that call the GPT's own modules and place the hook points.
# The GPT's modules are held without registering them here, so they stay owned (and
# state-dict-named) by HookedSprout.model; a wrapper only owns its HookPoints.


class HookedRMSNorm(nn.Module):
    """A Sprout ``RMSNorm`` split the way TransformerLens splits its norms.

    ``hook_scale`` fires on ``sqrt(mean(x²) + eps)`` (batch, pos, 1) and ``hook_normalized`` on
    ``x / scale``, *before* the learned gain ``w``: TransformerLens's meaning of both names.
    Calling the module returns ``x / scale`` (like TransformerLens's ``RMSNormPre`` after
    ``fold_ln``); :meth:`with_gain` gives the full norm, ``w * x / scale``, which is what the next
    matrix reads. HookedSprout's ``W_Q``/``W_K``/``W_V``, ``W_gate``/``W_in`` and ``W_U`` have the
    gains folded in, so ``hook_normalized @ W`` is exactly what the model computes.
    """

    def __init__(self, norm: RMSNorm):
        super().__init__()
        object.__setattr__(self, "_norm", norm)
        self.hook_scale = hook_point(1)
        self.hook_normalized = hook_point(1)

    @property
    def w(self) -> Float[Tensor, " d"]:
        """The learned gain (TransformerLens's ``ln.w``)."""
        return self._norm.weight

    @property
    def module(self) -> RMSNorm:
        """The GPT's own RMSNorm this wrapper calls (not owned here: it stays ``HookedSprout.model``'s)."""
        return self._norm

    @property
    def eps(self) -> float:
        return self._norm.eps

    def hooked(self) -> bool:
        """True when a hook sits on this norm's scale or output, so they must be computed apart."""
        return is_hooked(self.hook_scale) or is_hooked(self.hook_normalized)

    def forward(self, x: Float[Tensor, "batch pos d"]) -> Float[Tensor, "batch pos d"]:
        """``x / scale`` (before the gain), firing ``hook_scale`` and ``hook_normalized``."""
        xf = x.to(torch.promote_types(x.dtype, torch.float32))  # at least float32 inside, as the GPT's RMSNorm
        inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self._norm.eps)
        scale = 1.0 / inv
        hooked_scale = self.hook_scale(scale)
        # x * rsqrt(...) is F.rms_norm's own arithmetic, so an unchanged scale gives the GPT's bits
        normed = xf * inv if hooked_scale is scale else xf / hooked_scale
        return self.hook_normalized(normed.type_as(x))

    def with_gain(self, x: Float[Tensor, "batch pos d"]) -> Float[Tensor, "batch pos d"]:
        """The whole norm, ``w * x / scale``; with nothing hooked, the GPT's own RMSNorm (bit for bit)."""
        if not self.hooked():
            return self._norm(x)
        return self(x) * self._norm.weight


class HookedHeadNorm(nn.Module):
    """A per-head QK-norm (Sprout's ``q_norm``/``k_norm``, no TransformerLens counterpart).

    The input is (batch, head, pos, d_head); ``hook_normalized`` shows (batch, pos, head, d_head)
    *after* the gain, since that gain sits before RoPE and cannot be folded into a matrix.
    """

    def __init__(self, norm: RMSNorm):
        super().__init__()
        object.__setattr__(self, "_norm", norm)
        self.hook_normalized = hook_point(1)

    @property
    def w(self) -> Float[Tensor, " d_head"]:
        """The learned gain, shared by all heads of the layer."""
        return self._norm.weight

    def forward(self, x: Float[Tensor, "batch head pos d_head"]) -> Float[Tensor, "batch head pos d_head"]:
        """The per-head QK-norm with its gain, firing ``hook_normalized`` as ``(batch, pos, head, d_head)``."""
        return heads_hook(self.hook_normalized, self._norm(x))


class HookedAttention(nn.Module):
    """Causal self-attention of one Sprout block, with TransformerLens's attention hook points.

    Internally q, k, v stay in the GPT's (batch, head, pos, d_head) layout so that the unhooked
    computation is the GPT's own; every per-head hook sees (batch, pos, head, d_head).
    """

    def __init__(self, attn: Attention, ln: RMSNorm):
        super().__init__()
        object.__setattr__(self, "_attn", attn)
        object.__setattr__(self, "_ln", ln)
        self.n_heads = attn.n_head
        self.d_head = attn.head_dim
        self.hook_q = hook_point(1)
        self.hook_k = hook_point(1)
        self.hook_v = hook_point(1)
        self.q_norm = HookedHeadNorm(attn.q_norm)
        self.k_norm = HookedHeadNorm(attn.k_norm)
        self.hook_rot_q = hook_point(1)
        self.hook_rot_k = hook_point(1)
        self.hook_attn_scores = hook_point(2)
        self.hook_pattern = hook_point(2)
        self.hook_z = hook_point(1)

    @property
    def module(self) -> Attention:
        """The GPT's own Attention this wrapper calls (its ``qkv``, ``proj``, ``q_norm``, ``k_norm``)."""
        return self._attn

    # weights, TransformerLens layout (one layer), ln1's gain folded in as TransformerLens's fold_ln does
    @property
    def W_Q(self) -> Float[Tensor, "head d_model d_head"]:
        """``hook_q[..., h, :] = ln1.hook_normalized @ W_Q[h]`` (the ln1 gain folded into the rows)."""
        return self._qkv_part(0)

    @property
    def W_K(self) -> Float[Tensor, "head d_model d_head"]:
        return self._qkv_part(1)

    @property
    def W_V(self) -> Float[Tensor, "head d_model d_head"]:
        return self._qkv_part(2)

    @property
    def W_O(self) -> Float[Tensor, "head d_head d_model"]:
        w = self._attn.proj.weight  # (d_model_out, head*d_head): out = z_flat @ w.T
        return w.view(w.shape[0], self.n_heads, self.d_head).permute(1, 2, 0)

    @property
    def b_Q(self) -> Float[Tensor, "head d_head"]:
        """Zeros: Sprout has no biases (kept so TransformerLens code that adds them runs)."""
        return self._attn.qkv.weight.new_zeros(self.n_heads, self.d_head)

    b_K = b_Q
    b_V = b_Q

    @property
    def b_O(self) -> Float[Tensor, " d_model"]:
        return self._attn.proj.weight.new_zeros(self._attn.proj.weight.shape[0])

    def _qkv_part(self, i: int) -> Float[Tensor, "head d_model d_head"]:
        w = self._attn.qkv.weight  # (3*d_model, d_model): rows [i*C:(i+1)*C] make q, k or v
        C = w.shape[1]
        return w[i * C : (i + 1) * C].view(self.n_heads, self.d_head, C).transpose(1, 2) * self._ln.weight[:, None]

    def needs_pattern(self) -> bool:
        """True when something hooks the scores or the pattern, so they must be materialised."""
        return is_hooked(self.hook_attn_scores) or is_hooked(self.hook_pattern)

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        cos: Float[Tensor, "pos half"],
        sin: Float[Tensor, "pos half"],
    ) -> Float[Tensor, "batch pos d_model"]:
        """This part's output, computed with the checkpoint's own modules, firing its hook points."""
        B, T, C = x.shape
        q, k, v = self._attn.heads(x)  # each (batch, head, pos, d_head), before QK-norm and RoPE
        q = heads_hook(self.hook_q, q)
        k = heads_hook(self.hook_k, k)
        v = heads_hook(self.hook_v, v)
        q, k = self.q_norm(q), self.k_norm(k)
        q = heads_hook(self.hook_rot_q, apply_rope(q, cos, sin))
        k = heads_hook(self.hook_rot_k, apply_rope(k, cos, sin))
        if self.needs_pattern():
            # (batch, head, T, T) tensors dominate a full cache: scale q instead of the scores and
            # mask in place, so each layer allocates only the scores and the pattern
            scores = torch.matmul(q * (1.0 / math.sqrt(self.d_head)), k.transpose(-2, -1))
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu_(1)
            scores = self.hook_attn_scores(scores.masked_fill_(future, float("-inf")))
            pattern = F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
            # a hook may mask a whole row (NaN); in place unless autograd needs the softmax's output for backward
            pattern = pattern.nan_to_num(0.0) if pattern.requires_grad else pattern.nan_to_num_(0.0)
            pattern = self.hook_pattern(pattern.to(v.dtype))
            y = torch.matmul(pattern, v)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        z = self.hook_z(y.transpose(1, 2))  # (batch, pos, head, d_head)
        return self._attn.proj(z.contiguous().view(B, T, C))


class HookedMLP(nn.Module):
    """Sprout's SwiGLU feed-forward: ``w2(silu(w1 x) * w3 x)``, with TransformerLens's gated-MLP hooks."""

    def __init__(self, ffn: FeedForward, ln: RMSNorm):
        super().__init__()
        object.__setattr__(self, "_ffn", ffn)
        object.__setattr__(self, "_ln", ln)
        self.hook_pre = hook_point(1)
        self.hook_pre_linear = hook_point(1)
        self.hook_post = hook_point(1)

    @property
    def module(self) -> FeedForward:
        """The GPT's own SwiGLU feed-forward this wrapper calls (``w1``, ``w2``, ``w3``)."""
        return self._ffn

    @property
    def W_gate(self) -> Float[Tensor, "d_model d_mlp"]:
        """``hook_pre = ln2.hook_normalized @ W_gate`` (Sprout's ``w1``, the ln2 gain folded in)."""
        return self._ffn.w1.weight.T * self._ln.weight[:, None]

    @property
    def W_in(self) -> Float[Tensor, "d_model d_mlp"]:
        """``hook_pre_linear = ln2.hook_normalized @ W_in`` (Sprout's ``w3``, the ln2 gain folded in)."""
        return self._ffn.w3.weight.T * self._ln.weight[:, None]

    @property
    def b_in(self) -> Float[Tensor, " d_mlp"]:
        return self._ffn.w3.weight.new_zeros(self._ffn.w3.weight.shape[0])

    b_gate = b_in

    @property
    def b_out(self) -> Float[Tensor, " d_model"]:
        return self._ffn.w2.weight.new_zeros(self._ffn.w2.weight.shape[0])

    @property
    def W_out(self) -> Float[Tensor, "d_mlp d_model"]:
        return self._ffn.w2.weight.T

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """The SwiGLU feed-forward's output, firing ``hook_pre``, ``hook_pre_linear`` and ``hook_post``."""
        pre = self.hook_pre(self._ffn.w1(x))
        pre_linear = self.hook_pre_linear(self._ffn.w3(x))
        post = self.hook_post(F.silu(pre) * pre_linear)
        return self._ffn.w2(post)


class HookedBlock(nn.Module):
    """One pre-norm Sprout block: ``x + attn(norm1 x)``, then ``+ ffn(norm2 x)``."""

    hook_out_is_single_residual_stream = True  # TransformerLens's logit tools check this

    def __init__(self, block: Block):
        super().__init__()
        # registration order = firing order, so hook_dict lists hooks in the order they run
        self.hook_resid_pre = hook_point(1)
        self.ln1 = HookedRMSNorm(block.norm1)
        self.attn = HookedAttention(block.attn, block.norm1)
        self.hook_attn_out = hook_point(1)
        self.hook_resid_mid = hook_point(1)
        self.ln2 = HookedRMSNorm(block.norm2)
        self.mlp = HookedMLP(block.ffn, block.norm2)
        self.hook_mlp_out = hook_point(1)
        self.hook_resid_post = hook_point(1)

    def forward(
        self, resid: Float[Tensor, "batch pos d_model"], cos: Tensor, sin: Tensor
    ) -> Float[Tensor, "batch pos d_model"]:
        """This part's output, computed with the checkpoint's own modules, firing its hook points."""
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(self.attn(self.ln1.with_gain(resid), cos, sin))
        resid = self.hook_resid_mid(resid + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2.with_gain(resid)))
        return self.hook_resid_post(resid + mlp_out)


class HookedUnembed(nn.Module):
    """``x @ W_U + b_U`` for ``x = ln_final.hook_normalized`` (TransformerLens's ``unembed``)."""

    def __init__(self, model: GPT):
        super().__init__()
        object.__setattr__(self, "_model", model)

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self._model.head.weight.T * self._model.norm.weight[:, None]

    @property
    def b_U(self) -> Float[Tensor, " d_vocab"]:
        return self._model.head.weight.new_zeros(self._model.head.weight.shape[0])

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
        """Logits of the final norm's output (``ln_final.hook_normalized @ W_U``)."""
        return self._model.head(x * self._model.norm.weight)
