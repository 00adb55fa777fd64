"""HookedSprout: Sprout with TransformerLens hook points, running the checkpoint's own weights.

``HookedSprout`` subclasses TransformerLens's :class:`~transformer_lens.HookedRootModule`. It does
not copy or re-implement the model: it holds the :class:`sprout_model.GPT` as ``.model`` and calls
that model's own ``Linear``/``RMSNorm``/``Embedding`` modules, ``Attention.heads`` and
``apply_rope``. The forward pass is only split where a hook point has to sit, so with no hooks the
logits are the GPT's, bit for bit on the same device (the tests check 1e-5).

Hook points (layers are **0-indexed in code**: the chapter's "layer 2" is ``blocks.1``)::

    hook_embed                              (batch, pos, d_model)  token embedding (Sprout has no position embedding)
    blocks.{l}.hook_resid_pre               (batch, pos, d_model)  stream entering block l (= resid_post of block l-1, same tensor)
    blocks.{l}.ln1.hook_scale               (batch, pos, 1)        sqrt(mean(resid_pre²) + eps), the RMS norm's divisor
    blocks.{l}.ln1.hook_normalized          (batch, pos, d_model)  resid_pre / scale, before the gain (TransformerLens's meaning)
    blocks.{l}.attn.hook_q / hook_k / hook_v (batch, pos, head, d_head)  raw projections (= ln1.hook_normalized @ W_Q[l]), before QK-norm and RoPE
    blocks.{l}.attn.q_norm.hook_normalized  (batch, pos, head, d_head)  q after per-head QK-norm, gain applied (Sprout only), before RoPE
    blocks.{l}.attn.k_norm.hook_normalized  (batch, pos, head, d_head)  k likewise
    blocks.{l}.attn.hook_rot_q / hook_rot_k (batch, pos, head, d_head)  after QK-norm and RoPE: what the dot products use
    blocks.{l}.attn.hook_attn_scores        (batch, head, query, key)   q·k / sqrt(d_head), future keys set to -inf
    blocks.{l}.attn.hook_pattern            (batch, head, query, key)   softmax of the scores; rows sum to 1
    blocks.{l}.attn.hook_z                  (batch, pos, head, d_head)  pattern-weighted values, before W_O
    blocks.{l}.hook_attn_out                (batch, pos, d_model)  attention output (= Σ_h z[h] @ W_O[l, h])
    blocks.{l}.hook_resid_mid               (batch, pos, d_model)  resid_pre + attn_out
    blocks.{l}.ln2.hook_scale / hook_normalized                   the feed-forward's norm, as ln1
    blocks.{l}.mlp.hook_pre                 (batch, pos, d_mlp)    ln2.hook_normalized @ W_gate[l] (Sprout's w1), the SiLU's input
    blocks.{l}.mlp.hook_pre_linear          (batch, pos, d_mlp)    ln2.hook_normalized @ W_in[l] (Sprout's w3), the linear branch
    blocks.{l}.mlp.hook_post                (batch, pos, d_mlp)    silu(pre) * pre_linear, the input of W_out (w2)
    blocks.{l}.hook_mlp_out                 (batch, pos, d_model)  feed-forward output
    blocks.{l}.hook_resid_post              (batch, pos, d_model)  resid_mid + mlp_out
    ln_final.hook_scale / hook_normalized                         the final norm, as ln1; logits = ln_final.hook_normalized @ W_U

Names, shapes and meanings are TransformerLens's. Its norms fire ``hook_normalized`` before the
gain and its weights come with the gains folded in (``fold_ln``); HookedSprout presents Sprout the
same way (``W_Q``/``W_K``/``W_V``, ``W_gate``/``W_in`` and ``W_U`` carry the gain of the norm that
feeds them), so ``ActivationCache`` methods with ``apply_ln=True``, ``logit_attrs`` and
``tokens_to_residual_directions`` give exact answers. The one Sprout-only name is the QK-norm's
``hook_normalized``, which holds the output *after* its gain. Every forward hook must return
``None`` or a tensor of the activation's shape and dtype (:class:`HookOutputError` otherwise).

Threads: PyTorch module hooks are global state on the model. Every forward, ``run_with_hooks``,
``run_with_cache``, ``hooks()`` block and ``generate`` holds one re-entrant lock for its whole
duration, so a ``HookedSprout`` shared between threads (Streamlit sessions) gives each caller
exactly the result it would get alone. Nested use from one thread is fine. Hooks added with
``add_hook``/``reset_hooks_end=False`` outlive the call on purpose and are then seen by everyone.

Why one file of this length: ``HookedSprout`` is the surface a TransformerLens user reaches for (weights as
``W_Q`` ..., hooks, caches, tokens, generation, export), and they look a method up in one class, as in
TransformerLens's ``HookedTransformer``. Everything that is not that surface lives elsewhere in ``core/``: the
hooked components (``components``), the cache (``cache``), the hook points and names (``hook_points``) and the
runners behind ``generate`` (``generation``).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import FactoredMatrix, HookedRootModule
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import Slice, lm_cross_entropy_loss
from transformer_lens.utilities import remove_batch_dim as _drop_batch_dim

from sprout_interp.core import tokens as _tok
from sprout_interp.core.arguments import check_index, check_token_ids, describe, integer
from sprout_interp.core.cache import SproutCache
from sprout_interp.core.components import (
    HookedAttention,
    HookedBlock,
    HookedHeadNorm,
    HookedMLP,
    HookedRMSNorm,
    HookedSproutConfig,
    HookedUnembed,
)
from sprout_interp.core.errors import (
    ArgumentError,
    ContextLengthError,
    HookNameError,
    SproutError,
    UnequalLengthsError,
    VocabularyMismatchError,
)
from sprout_interp.core.generation import HookedRunner, KVCacheRunner, check_sampling
from sprout_interp.core.hook_points import HookList, act_name, hook_point, is_hooked, unknown_name_message
from sprout_model.model import GPT, apply_rope

__all__ = [
    "HookedSprout", "HookedSproutConfig", "SproutCache", "load_hooked", "as_hooked", "is_hooked", "act_name",
    "HookedAttention", "HookedBlock", "HookedHeadNorm", "HookedMLP", "HookedRMSNorm", "HookedUnembed",
]


#: what every forward and ``check_tokens`` accept as input, for messages
_INPUT_FORMS = ("pass a text, a list of texts, or token ids: a (batch, pos) or (pos,) integer tensor, array or list of "
                "whole numbers, rows of equal length")


def _pos_slice_positions(pos_slice) -> list:
    """The positions a ``pos_slice`` names, each to be checked against an activation's length when it is cached
    (none for a slice or None); an ArgumentError for a form TransformerLens's ``Slice`` would misread (a bool is
    not position 1, a float is not a position)."""
    forms = ("pos_slice is None, a position (a whole number, negative from the end), a list or 1-d integer tensor of "
             "positions, a slice, or a (stop,) / (start, stop[, step]) tuple of whole numbers")
    if isinstance(pos_slice, Slice):  # already unwrapped (TransformerLens's run_with_cache does it): its positions
        return [pos_slice.slice] if pos_slice.mode == "int" else list(pos_slice.slice.reshape(-1)) if pos_slice.mode == "array" else []
    if pos_slice is None:
        return []
    if integer(pos_slice) is not None:
        return [pos_slice]
    if isinstance(pos_slice, (slice, tuple)):
        parts = (pos_slice.start, pos_slice.stop, pos_slice.step) if isinstance(pos_slice, slice) else pos_slice
        if not 1 <= len(parts) <= 3 or any(p is not None and integer(p) is None for p in parts):
            raise ArgumentError(f"pos_slice={describe(pos_slice)} is not a slice of whole numbers: {forms}")
        return []
    if isinstance(pos_slice, (list, Tensor)) or hasattr(pos_slice, "__array__"):
        items = pos_slice.reshape(-1) if isinstance(pos_slice, Tensor) else list(pos_slice)
        if isinstance(pos_slice, Tensor) and (pos_slice.dim() != 1 or pos_slice.dtype == torch.bool or
                                              pos_slice.dtype.is_floating_point):
            raise ArgumentError(f"pos_slice is a {pos_slice.dtype} tensor of shape {tuple(pos_slice.shape)}: {forms}")
        bad = [p for p in items if integer(p) is None]
        if bad or not len(items):
            raise ArgumentError(f"pos_slice={describe(pos_slice)} is not a list of positions: {forms}")
        return list(items)
    raise ArgumentError(f"pos_slice={describe(pos_slice)}: {forms}")


# --------------------------------------------------------------------------------------------
# the model


class HookedSprout(HookedRootModule):
    """A Sprout GPT with TransformerLens hook points (every name and shape: the module docstring, and the manual's
    conventions page).

    Layers are 0-indexed in code (``blocks.0`` is the chapter's "layer 1")::

        m = HookedSprout.from_loaded(load_checkpoint("gpt-4"))      # or sprout_interp.load("gpt-4")
        toks = m.to_tokens("Zorbin Plax came home.")                 # (1, pos)
        logits, cache = m.run_with_cache(toks, names_filter=lambda n: n.endswith("resid_post"))
        cache["blocks.3.hook_resid_post"]                            # (1, pos, d_model)

    Args:
        model: the :class:`sprout_model.GPT` to run; it is wrapped, not copied (``.model``).
        tokenizer: a ``tokenizers.Tokenizer`` (Sprout's byte-level BPE) or None for ids-only use.
        info: the checkpoint's ``train.json`` contents, if any.
        name: a label ("gpt-4", a path, ...).
        source: where the weights came from, if known.

    Attributes:
        cfg: :class:`HookedSproutConfig` (``n_layers``, ``n_heads``, ``d_model``, ``d_head``,
            ``d_mlp``, ``d_vocab``, ``n_ctx`` ...); ``cfg.sprout`` is the model's own Config.
        blocks: per-block hook wrappers; ``blocks[l].attn.W_O`` etc. give one layer's weights.
    """

    def __init__(
        self,
        model: GPT,
        tokenizer=None,
        info: Optional[dict] = None,
        name: str = "",
        source: Optional[str] = None,
    ):
        super().__init__()
        if not isinstance(model, GPT):
            raise SproutError(f"HookedSprout wraps a sprout_model.GPT, got {type(model).__name__}")
        if tokenizer is not None:
            n = tokenizer.get_vocab_size()
            if n != model.cfg.vocab_size:
                raise VocabularyMismatchError(
                    f"the tokenizer has {n} tokens but the model's embedding has {model.cfg.vocab_size} rows: "
                    "use the tokenizer.json that was trained with this checkpoint"
                )
        self.model = model
        self.hook_embed = hook_point(1)
        self.blocks = nn.ModuleList(HookedBlock(b) for b in model.blocks)
        self.ln_final = HookedRMSNorm(model.norm)
        self.unembed = HookedUnembed(model)
        self.tokenizer = tokenizer
        self.info = dict(info or {})
        self.name = name
        self.source = source
        p = next(model.parameters())
        self.cfg = HookedSproutConfig.from_sprout(model.cfg, name)
        self.cfg.device, self.cfg.dtype = p.device, p.dtype
        self._lock = threading.RLock()
        self.setup()
        self.train(model.training)  # the wrapper follows the GPT's mode (loaded checkpoints are in eval mode)

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def from_loaded(cls, loaded) -> "HookedSprout":
        """From a ``sprout_interp.core.loading.LoadedCheckpoint`` (``.model``, ``.tokenizer``, ``.info``, ``.name``, ``.source``)."""
        source = getattr(loaded, "source", None)
        return cls(
            loaded.model,
            tokenizer=getattr(loaded, "tokenizer", None),
            info=getattr(loaded, "info", None),
            name=getattr(loaded, "name", "") or "",
            source=None if source is None else str(source),
        )

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._lock = threading.RLock()

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        p = next(self.model.parameters())
        self.cfg.device, self.cfg.dtype = p.device, p.dtype
        return out

    def __repr__(self) -> str:
        c = self.cfg
        return (
            f"HookedSprout({self.name or 'unnamed'!r}: {c.n_layers} blocks, {c.n_heads} heads, d_model {c.d_model}, "
            f"d_mlp {c.d_mlp}, vocab {c.d_vocab}, context {c.n_ctx}, {len(self.hook_dict)} hook points)"
        )

    @property
    def device(self) -> torch.device:
        return self.model.embed.weight.device

    @property
    def lock(self) -> threading.RLock:
        """The re-entrant lock every forward holds: hold it to run several forwards (or add and remove
        hooks) with no other thread's hooks in between."""
        return self._lock

    # -- weights (TransformerLens layout) ------------------------------------------------------

    # Weights as TransformerLens presents them after ``fold_ln``: each norm's gain is folded into
    # the matrices that read that norm (W_Q/W_K/W_V: ln1; W_gate/W_in: ln2; W_U: ln_final), so
    # ``cache[".. hook_normalized"] @ W`` is exactly what the model computes. The GPT's own,
    # unfolded weights are ``m.model``'s parameters. The per-head QK-norm gains sit before RoPE
    # and cannot be folded: ``QK`` is the bilinear form on the raw projections (before QK-norm
    # and RoPE), as TransformerLens reports it for every rotary model.

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        """Token embedding: ``hook_embed = W_E[tokens]``. (Tied: ``W_U`` is ``W_E.T`` with ln_final's gain folded in.)"""
        return self.model.embed.weight

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        """Unembedding with ln_final's gain folded in: ``logits = ln_final.hook_normalized @ W_U + b_U``."""
        return self.model.head.weight.T * self.model.norm.weight[:, None]

    @property
    def b_U(self) -> Float[Tensor, " d_vocab"]:
        """Zeros: Sprout's head has no bias."""
        return self.model.head.weight.new_zeros(self.cfg.d_vocab)

    @property
    def W_Q(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        """Query weights per layer and head: ``hook_q[..., h, :] = ln1.hook_normalized @ W_Q[l, h]``."""
        return torch.stack([b.attn.W_Q for b in self.blocks])

    @property
    def W_K(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        """Key weights: ``hook_k[..., h, :] = ln1.hook_normalized @ W_K[l, h]``."""
        return torch.stack([b.attn.W_K for b in self.blocks])

    @property
    def W_V(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        """Value weights: ``hook_v[..., h, :] = ln1.hook_normalized @ W_V[l, h]``."""
        return torch.stack([b.attn.W_V for b in self.blocks])

    @property
    def W_O(self) -> Float[Tensor, "n_layers n_heads d_head d_model"]:
        """Output weights: ``hook_attn_out = Σ_h hook_z[..., h, :] @ W_O[l, h]``."""
        return torch.stack([b.attn.W_O for b in self.blocks])

    @property
    def b_Q(self) -> Float[Tensor, "n_layers n_heads d_head"]:
        """Zeros (no biases in Sprout); likewise ``b_K``, ``b_V``."""
        return torch.stack([b.attn.b_Q for b in self.blocks])

    b_K = b_Q
    b_V = b_Q

    @property
    def b_O(self) -> Float[Tensor, "n_layers d_model"]:
        return torch.stack([b.attn.b_O for b in self.blocks])

    @property
    def W_gate(self) -> Float[Tensor, "n_layers d_model d_mlp"]:
        """SwiGLU gate (Sprout's ``w1``): ``mlp.hook_pre = ln2.hook_normalized @ W_gate[l]``."""
        return torch.stack([b.mlp.W_gate for b in self.blocks])

    @property
    def W_in(self) -> Float[Tensor, "n_layers d_model d_mlp"]:
        """SwiGLU linear branch (Sprout's ``w3``): ``mlp.hook_pre_linear = ln2.hook_normalized @ W_in[l]``."""
        return torch.stack([b.mlp.W_in for b in self.blocks])

    @property
    def W_out(self) -> Float[Tensor, "n_layers d_mlp d_model"]:
        """Feed-forward output (Sprout's ``w2``): ``hook_mlp_out = mlp.hook_post @ W_out[l]``."""
        return torch.stack([b.mlp.W_out for b in self.blocks])

    @property
    def b_in(self) -> Float[Tensor, "n_layers d_mlp"]:
        return torch.stack([b.mlp.b_in for b in self.blocks])

    @property
    def b_out(self) -> Float[Tensor, "n_layers d_model"]:
        return torch.stack([b.mlp.b_out for b in self.blocks])

    @property
    def QK(self) -> FactoredMatrix:
        """``W_Q @ W_K.T`` per layer and head (n_layers, n_heads, d_model, d_model), before QK-norm and RoPE."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """``W_V @ W_O`` per layer and head, as a TransformerLens FactoredMatrix (n_layers, n_heads, d_model, d_model)."""
        return FactoredMatrix(self.W_V, self.W_O)

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> Float[Tensor, " d_model"]:
        """The biases written to the stream before ``layer``: zeros, as Sprout has none (TransformerLens API)."""
        return self.model.embed.weight.new_zeros(self.cfg.d_model)

    # -- hook names ----------------------------------------------------------------------------

    @property
    def hook_names(self) -> list[str]:
        """Every hook point name, in the order they fire."""
        return list(self.hook_dict)

    def get_hook_point(self, name: str) -> HookPoint:
        """The HookPoint called ``name``; an unknown name raises HookNameError with the closest valid names."""
        hp = self.hook_dict.get(name) if isinstance(name, str) else None
        if hp is None:
            raise HookNameError(unknown_name_message(str(name), list(self.hook_dict), self.cfg.n_layers))
        return hp

    def _check_hook_list(self, hooks: HookList, what: str) -> None:
        for item in hooks:
            try:
                name, fn = item
            except (TypeError, ValueError):
                raise SproutError(f"each of {what} must be a (name, hook_function) pair, got {item!r}") from None
            if isinstance(name, str):
                self.get_hook_point(name)
            elif not callable(name):
                raise SproutError(f"a hook's name must be a hook point name or a function of names, got {name!r}")
            if not callable(fn):
                raise SproutError(f"the hook for {name!r} is not callable: {fn!r}")

    def _names_filter_fn(self, names_filter) -> Callable[[str], bool]:
        if names_filter is None:
            return lambda name: True
        if isinstance(names_filter, str):
            self.get_hook_point(names_filter)
            return lambda name: name == names_filter
        if isinstance(names_filter, (list, tuple, set, frozenset)):
            for n in names_filter:
                self.get_hook_point(n)
            wanted = set(names_filter)
            return lambda name: name in wanted
        if callable(names_filter):
            return names_filter
        raise SproutError("names_filter must be None, a hook name, a list of hook names, or a function of a name")

    # -- hooks: TransformerLens behaviour, plus name checks and the lock -----------------------

    @contextmanager
    def hooks(
        self,
        fwd_hooks: HookList = [],
        bwd_hooks: HookList = [],
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
    ):
        """Context manager adding temporary hooks (TransformerLens semantics).

        Each hook is ``fn(activation, hook=HookPoint)``; returning a tensor replaces the activation.
        Names are checked first (:class:`HookNameError` for an unknown one). The hooks are removed
        when the block ends, also when it raises, and the model's lock is held throughout, so
        other threads neither see these hooks nor run between them.
        """
        self._check_hook_list(fwd_hooks, "fwd_hooks")
        self._check_hook_list(bwd_hooks, "bwd_hooks")
        with self._lock:
            with super().hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts) as m:
                yield m

    def run_with_hooks(
        self,
        *model_args: Any,
        fwd_hooks: HookList = [],
        bwd_hooks: HookList = [],
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        **model_kwargs: Any,
    ):
        """``forward(*model_args, **model_kwargs)`` with temporary hooks (TransformerLens semantics).

        Example, zero-ablate head 2 of block 1::

            def zero_head(z, hook):            # z: (batch, pos, head, d_head)
                z[:, :, 2] = 0.0
                return z
            logits = m.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)])
        """
        with self._lock:
            return super().run_with_hooks(
                *model_args,
                fwd_hooks=fwd_hooks,
                bwd_hooks=bwd_hooks,
                reset_hooks_end=reset_hooks_end,
                clear_contexts=clear_contexts,
                **model_kwargs,
            )

    def add_hook(self, name, hook, dir: Literal["fwd", "bwd"] = "fwd", is_permanent: bool = False, level=None, prepend=False):
        """Add a hook that stays until ``reset_hooks`` (global state: prefer ``hooks()``/``run_with_hooks``)."""
        if isinstance(name, str):
            self.get_hook_point(name)
        with self._lock:
            return super().add_hook(name, hook, dir=dir, is_permanent=is_permanent, level=level, prepend=prepend)

    def reset_hooks(self, clear_contexts: bool = True, direction="both", including_permanent: bool = False, level=None):
        """TransformerLens's ``reset_hooks``, holding the model's lock."""
        with self._lock:
            return super().reset_hooks(clear_contexts, direction, including_permanent, level=level)

    def get_caching_hooks(
        self,
        names_filter=None,
        incl_bwd: bool = False,
        device=None,
        remove_batch_dim: bool = False,
        cache: Optional[dict] = None,
        pos_slice=None,
    ) -> tuple[dict, list, list]:
        """TransformerLens's caching hooks, slicing each activation on its real position axis.

        ``pos_slice`` slices the position axis: dim 1 of every (batch, pos, ...) activation,
        including the per-head (batch, pos, head, d_head) ones, and the *query* axis of
        scores/patterns (batch, head, query, key), as TransformerLens 4's bridge does.
        """
        if cache is None:
            cache = {}
        keep = self._names_filter_fn(names_filter)
        positions = _pos_slice_positions(pos_slice)  # checked against each activation's length as it is cached
        pos_slice = Slice.unwrap(pos_slice)
        slicing = pos_slice.mode != "identity"
        self.is_caching = True

        def save_hook(tensor: Tensor, hook: HookPoint, is_backward: bool = False):
            name = hook.name + "_grad" if is_backward else hook.name
            t = tensor.detach().to(device)
            if slicing:
                dim = hook.pos_dim if hook.pos_dim is not None else 1
                if t.dim() > dim:
                    for p in positions:
                        check_index(p, "pos_slice", t.shape[dim], negative=True, what="a position of the input")
                    t = pos_slice.apply(t, dim=dim)
            if remove_batch_dim:
                t = _drop_batch_dim(t)
            cache[name] = t

        fwd, bwd = [], []
        for name in self.hook_dict:
            if keep(name):
                fwd.append((name, partial(save_hook, is_backward=False)))
                if incl_bwd:
                    bwd.append((name, partial(save_hook, is_backward=True)))
        return cache, fwd, bwd

    def run_with_cache(
        self,
        *model_args: Any,
        names_filter=None,
        device=None,
        remove_batch_dim: bool = False,
        incl_bwd: bool = False,
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        pos_slice=None,
        return_cache_object: bool = True,
        **model_kwargs: Any,
    ) -> tuple[Any, Union[SproutCache, dict[str, Tensor]]]:
        """Run ``forward`` and return ``(output, cache)`` (TransformerLens semantics).

        Only the hook points ``names_filter`` selects (a name, a list of names or a function of a
        name; None = all) get a caching hook, so ``names_filter=lambda n: n.endswith("resid_post")``
        costs almost nothing, and attention runs fused unless patterns/scores are selected.
        ``pos_slice`` keeps only some positions (see ``get_caching_hooks``). ``incl_bwd`` calls
        ``output.backward()`` (use ``return_type="loss"``) and also caches ``<name>_grad``.
        The cache is a :class:`SproutCache` (``return_cache_object=False``: a plain dict).
        """
        _pos_slice_positions(pos_slice)  # its form, before TransformerLens's Slice reads True as 1 and 1.5 as an error
        with self._lock:
            out, cache_dict = super().run_with_cache(
                *model_args,
                names_filter=names_filter,
                device=device,
                remove_batch_dim=remove_batch_dim,
                incl_bwd=incl_bwd,
                reset_hooks_end=reset_hooks_end,
                clear_contexts=clear_contexts,
                pos_slice=pos_slice,
                **model_kwargs,
            )
        if not return_cache_object:
            return out, cache_dict
        return out, SproutCache(cache_dict, self, has_batch_dim=not remove_batch_dim)

    # -- forward -------------------------------------------------------------------------------

    def _layer_index(self, i: Optional[int], what: str) -> Optional[int]:
        if i is None:
            return None
        L = self.cfg.n_layers
        j = integer(i)
        if j is None or not -L <= j <= L:
            raise ArgumentError(f"{what}={describe(i) if j is None else j} is not a layer boundary of a model with {L} "
                                f"blocks: {what} is a whole number 0..{L}, or -{L}..-1 from the end")
        return j + L if j < 0 else j

    def prepare_input(
        self, input, attention_mask=None, *, padding: bool = True, argument: str = "input"
    ) -> tuple[Int[Tensor, "batch pos"], Optional[Bool[Tensor, "batch pos"]]]:
        """``(tokens (batch, pos), mask or None)`` for a text, a list of texts, or token ids.

        The one way every analysis turns its input into model input: texts are tokenized (a list is
        right-padded and gets a mask, False at padding), ids are checked (integers, inside the
        vocabulary and the context; ``(pos,)`` becomes ``(1, pos)``). A mask that keeps every
        token is returned as None. Raises SproutError subclasses for bad input.

        A caller that reads every row at the same positions and cannot honour a mask passes
        ``padding=False``: then texts of different lengths (or a mask with padding) raise
        :class:`UnequalLengthsError` naming ``argument`` and each row's length, instead of letting the
        padding into its numbers.

        >>> import sprout_interp as si
        >>> m = si.load("gpt-1")
        >>> tokens, mask = m.prepare_input(["Once upon a time", "Hi"])
        >>> tuple(tokens.shape), mask.int().tolist()
        ((2, 5), [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
        >>> m.prepare_input("Once upon a time")[1] is None
        True
        """
        if isinstance(input, str) or (
            isinstance(input, (list, tuple)) and input and all(isinstance(t, str) for t in input)
        ):
            toks, mask = self.to_tokens_with_mask(input)
            if attention_mask is None and not bool(mask.all()):
                attention_mask = mask
        else:
            if hasattr(input, "__array__") and not isinstance(input, Tensor):
                input = torch.as_tensor(input)
            toks = self.check_tokens(input)
        if attention_mask is not None:
            attention_mask = self.check_mask(attention_mask, toks)
            if bool(attention_mask.all()):
                attention_mask = None
        if not padding and attention_mask is not None:
            lengths = ", ".join(str(int(n)) for n in attention_mask.sum(1))
            raise UnequalLengthsError(
                f"{argument} holds texts of different lengths ({lengths} tokens); this function reads every row at "
                "the same positions, so the padding would enter its numbers: pass one text at a time, or texts "
                "that tokenize to the same length"
            )
        return toks, attention_mask

    def run_block_at(
        self, layer: int, resid: Float[Tensor, "batch pos d_model"], at: Int[Tensor, " u"]
    ) -> Float[Tensor, "batch u d_model"]:
        """Block ``layer``'s output ``resid_post`` at positions ``at`` only (sorted, 0-based), from its input stream
        ``resid`` (``blocks.{layer}.hook_resid_pre``) at every position up to the last one in ``at``.

        Nothing reads the block's output at the other positions, so there it computes only the keys and values
        the positions in ``at`` attend to: no query, no output projection, no feed-forward. Same maths as the
        block's full forward at the positions it returns; no hook fires (run it on an unhooked block).
        """
        layer = check_index(layer, "layer", self.cfg.n_layers, negative=True, what="a block of this model, 0-indexed")
        blk = self.blocks[layer]
        attn = blk.attn.module
        n, P, C = resid.shape
        H, dh = attn.n_head, attn.head_dim
        x = blk.ln1.with_gain(resid)
        W = attn.qkv.weight  # rows [0:C] make q, [C:2C] k, [2C:3C] v
        k, v = F.linear(x, W[C:]).view(n, P, 2, H, dh).permute(2, 0, 3, 1, 4)  # each (n, head, pos, d_head)
        q = F.linear(x[:, at], W[:C]).view(n, -1, H, dh).transpose(1, 2)  # (n, head, u, d_head)
        q, k = blk.attn.q_norm(q), blk.attn.k_norm(k)
        cos, sin = self.model.cos, self.model.sin
        q, k = apply_rope(q, cos[at], sin[at]), apply_rope(k, cos[:P], sin[:P])
        causal = torch.arange(P, device=resid.device)[None, :] <= at[:, None]  # query at[i] sees keys 0..at[i]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        mid = resid[:, at] + attn.proj(y.transpose(1, 2).reshape(n, -1, C))
        return mid + blk.mlp(blk.ln2.with_gain(mid))

    def check_tokens(self, tokens) -> Int[Tensor, "batch pos"]:
        """Token ids as a (batch, pos) long tensor on the model's device; SproutError subclasses for bad ids."""
        return self._check_tokens(tokens)

    def check_mask(self, mask, tokens: Tensor) -> Bool[Tensor, "batch pos"]:
        """An attention mask as a bool (batch, pos) tensor matching ``tokens`` (right padding only)."""
        return self._check_mask(mask, tokens)

    def _check_tokens(self, tokens) -> Int[Tensor, "batch pos"]:
        if not isinstance(tokens, Tensor):
            if isinstance(tokens, (str, bytes, dict)) or tokens is None:
                raise ArgumentError(f"input={describe(tokens)} is not model input: {_INPUT_FORMS}")
            tokens = check_token_ids(tokens, "input", self.cfg.d_vocab, error=VocabularyMismatchError, type_error=ArgumentError)
        if tokens.dtype == torch.bool or tokens.dtype.is_floating_point or tokens.dtype.is_complex:
            raise ArgumentError(f"token ids must be integers, got a {tokens.dtype} tensor: {_INPUT_FORMS}")
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(0)
        if tokens.dim() != 2:
            raise SproutError(f"token ids must have shape (batch, pos) or (pos,), got {tuple(tokens.shape)}")
        T = tokens.shape[1]
        if T == 0 or tokens.shape[0] == 0:
            raise ContextLengthError(f"no tokens to run (shape {tuple(tokens.shape)}): the model needs at least one")
        if T > self.cfg.n_ctx:
            raise ContextLengthError(
                f"the input is {T} tokens long but the model's context is {self.cfg.n_ctx} tokens: "
                f"pass fewer tokens (tokens[:, :{self.cfg.n_ctx}]) or to_tokens(..., truncate=True)"
            )
        tokens = tokens.to(self.device, torch.long)
        lo, hi = torch.aminmax(tokens)
        if int(lo) < 0 or int(hi) >= self.cfg.d_vocab:
            bad = int(hi) if int(hi) >= self.cfg.d_vocab else int(lo)
            raise VocabularyMismatchError(
                f"token id {bad} is outside this model's vocabulary (0..{self.cfg.d_vocab - 1}): "
                "the ids come from another tokenizer"
            )
        return tokens

    def _check_mask(self, mask, tokens: Tensor) -> Bool[Tensor, "batch pos"]:
        mask = torch.as_tensor(mask, device=tokens.device)
        if mask.dim() == 1:
            mask = mask.unsqueeze(0)
        if mask.shape != tokens.shape:
            raise SproutError(f"attention_mask has shape {tuple(mask.shape)} but the tokens have {tuple(tokens.shape)}")
        mask = mask.bool()
        if (mask[:, 1:] & ~mask[:, :-1]).any():
            raise SproutError(
                "attention_mask must mark right padding (real tokens first, then padding): "
                "Sprout's causal attention would let real tokens see left padding; use to_tokens(list_of_texts)"
            )
        return mask

    def forward(
        self,
        input: Union[str, Sequence[str], Int[Tensor, "*batch pos"], Float[Tensor, "batch pos d_model"]],
        return_type: Optional[Literal["logits", "loss", "both"]] = "logits",
        loss_per_token: bool = False,
        prepend_bos: bool = False,
        start_at_layer: Optional[int] = None,
        stop_at_layer: Optional[int] = None,
        tokens: Optional[Int[Tensor, "*batch pos"]] = None,
        attention_mask: Optional[Bool[Tensor, "batch pos"]] = None,
        truncate: bool = False,
    ):
        """Run Sprout, firing every hook point on the way.

        Args:
            input: a string, a list of strings (right-padded; the loss ignores the padding), token
                ids ``(batch, pos)`` or ``(pos,)``, or, with ``start_at_layer``, the residual stream
                ``(batch, pos, d_model)`` entering that block.
            return_type: "logits" ``(batch, pos, d_vocab)``; "loss" (mean next-token cross-entropy in
                nats, or ``(batch, pos-1)`` with ``loss_per_token``); "both" ``(logits, loss)``;
                None (runs up to ``ln_final`` and returns None).
            prepend_bos: put ``<|endoftext|>`` before text input (Sprout's document separator).
            start_at_layer: skip the embedding and blocks before this one (0-indexed; negative counts
                from the end); ``input`` is then the residual stream. Pass ``tokens`` for a loss.
            stop_at_layer: stop before this block and return the residual stream
                ``(batch, pos, d_model)`` entering it (``blocks.{stop}.hook_resid_pre``);
                ``stop_at_layer=0`` returns the embedding; ``return_type`` is then ignored.
            tokens: the token ids, for a loss when ``start_at_layer`` is set.
            attention_mask: True at real tokens; only right padding is allowed (it only masks the loss).
            truncate: for text input, keep the first ``n_ctx`` tokens instead of raising ContextLengthError.
        """
        start = self._layer_index(start_at_layer, "start_at_layer")
        stop = self._layer_index(stop_at_layer, "stop_at_layer")
        if return_type not in ("logits", "loss", "both", None):
            raise SproutError(f"return_type must be 'logits', 'loss', 'both' or None, got {return_type!r}")
        if isinstance(input, (list, tuple)) and len(input) == 0:
            raise SproutError("the input is an empty list: pass a string, a list of strings or token ids (batch, pos)")
        with self._lock:
            if start is None:
                if isinstance(input, str) or (
                    isinstance(input, (list, tuple)) and len(input) > 0 and all(isinstance(t, str) for t in input)
                ):
                    toks, mask = self.to_tokens(input, prepend_bos=prepend_bos, truncate=truncate, return_mask=True)
                    if attention_mask is None and not bool(mask.all()):
                        attention_mask = mask
                else:
                    toks = self._check_tokens(input)
                tokens = toks
                resid = self.hook_embed(self.model.embed(tokens))
                start = 0
            else:
                resid = input
                if not isinstance(resid, Tensor) or resid.dim() != 3 or resid.shape[-1] != self.cfg.d_model:
                    shape = tuple(resid.shape) if isinstance(resid, Tensor) else type(resid).__name__
                    raise SproutError(
                        f"with start_at_layer the input is the residual stream (batch, pos, {self.cfg.d_model}), got {shape}"
                    )
                if resid.shape[1] > self.cfg.n_ctx:
                    raise ContextLengthError(
                        f"the residual stream has {resid.shape[1]} positions but the model's context is {self.cfg.n_ctx}"
                    )
                if tokens is not None:
                    tokens = self._check_tokens(tokens)
            if attention_mask is not None and tokens is not None:
                attention_mask = self._check_mask(attention_mask, tokens)
            T = resid.shape[1]
            cos, sin = self.model.cos[:T], self.model.sin[:T]
            end = self.cfg.n_layers if stop is None else stop
            for block in self.blocks[start:end]:
                resid = block(resid, cos, sin)
            if stop is not None:
                return resid
            normed = self.ln_final.with_gain(resid)
            if return_type is None:
                return None
            logits = self.model.head(normed)
            if return_type == "logits":
                return logits
            if tokens is None:
                raise SproutError("a loss needs the token ids: pass tokens=... together with start_at_layer")
            if tokens.shape[1] < 2:
                raise ContextLengthError("a next-token loss needs at least 2 tokens")
            loss = lm_cross_entropy_loss(logits.float(), tokens, attention_mask, per_token=loss_per_token)
            return loss if return_type == "loss" else (logits, loss)

    # -- tokens --------------------------------------------------------------------------------

    def to_tokens(
        self,
        input: Union[str, Sequence[str]],
        prepend_bos: bool = False,
        truncate: bool = False,
        return_mask: bool = False,
        move_to_device: bool = True,
    ) -> Union[Int[Tensor, "batch pos"], tuple[Int[Tensor, "batch pos"], Bool[Tensor, "batch pos"]]]:
        """Token ids ``(batch, pos)`` of a text or a list of texts.

        A list is right-padded with ``<|endoftext|>``; ``return_mask=True`` also returns the
        ``(batch, pos)`` bool mask, True at real tokens, False at padding (or use
        :meth:`to_tokens_with_mask`). ``prepend_bos`` puts ``<|endoftext|>`` first. A text longer
        than ``cfg.n_ctx`` tokens raises ContextLengthError naming both numbers, unless
        ``truncate=True`` (keeps the first ``n_ctx``); an empty text raises ContextLengthError;
        a lone surrogate raises TokenizationError.
        """
        toks, mask = _tok.texts_to_tokens(
            self.tokenizer, input, context=self.cfg.n_ctx, prepend_bos=prepend_bos, truncate=truncate
        )
        if move_to_device:
            toks, mask = toks.to(self.device), mask.to(self.device)
        return (toks, mask) if return_mask else toks

    def to_tokens_with_mask(
        self, input: Union[str, Sequence[str]], prepend_bos: bool = False, truncate: bool = False
    ) -> tuple[Int[Tensor, "batch pos"], Bool[Tensor, "batch pos"]]:
        """``(tokens, attention_mask)``: see :meth:`to_tokens`; the mask is False at padding."""
        return self.to_tokens(input, prepend_bos=prepend_bos, truncate=truncate, return_mask=True)

    def to_str_tokens(
        self, input: Union[str, Sequence[str], Sequence[int], Tensor], prepend_bos: bool = False, truncate: bool = False
    ) -> Union[list[str], list[list[str]]]:
        """One string per token, for a text, a list of texts, a list of ids, or ids ``(pos,)``/``(batch, pos)``.

        Returns a list of strings, or a list of lists for several texts / a batch of more than one.
        """
        if isinstance(input, str):
            ids = _tok.encode_text(self.tokenizer, input, context=self.cfg.n_ctx, prepend_bos=prepend_bos, truncate=truncate)
            return _tok.ids_to_str_tokens(self.tokenizer, ids)
        if isinstance(input, (list, tuple)) and len(input) > 0 and all(isinstance(t, str) for t in input):
            return [self.to_str_tokens(t, prepend_bos=prepend_bos, truncate=truncate) for t in input]
        ids = check_token_ids(input, "input", self.cfg.d_vocab, error=VocabularyMismatchError, type_error=ArgumentError)
        if ids.dim() == 2:
            if ids.shape[0] == 1:
                return _tok.ids_to_str_tokens(self.tokenizer, ids[0])
            return [_tok.ids_to_str_tokens(self.tokenizer, row) for row in ids]
        if ids.dim() == 0:
            ids = ids.unsqueeze(0)
        if ids.dim() != 1:
            raise SproutError(f"expected token ids of shape (pos,) or (batch, pos), got {tuple(ids.shape)}")
        return _tok.ids_to_str_tokens(self.tokenizer, ids)

    def to_string(self, tokens: Union[Sequence[int], Tensor]) -> Union[str, list[str]]:
        """The text of token ids: a string for ``(pos,)``, a list of strings for ``(batch, pos)``."""
        t = check_token_ids(tokens, "tokens", self.cfg.d_vocab, error=VocabularyMismatchError, type_error=ArgumentError)
        if t.dim() == 2:
            return [_tok.ids_to_string(self.tokenizer, row) for row in t]
        if t.dim() == 0:
            t = t.unsqueeze(0)
        return _tok.ids_to_string(self.tokenizer, t)

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token (raises SproutError otherwise)."""
        ids = _tok.encode_text(self.tokenizer, string, context=self.cfg.n_ctx)
        if len(ids) != 1:
            raise SproutError(f"{string!r} is {len(ids)} tokens, not one: {self.to_str_tokens(ids)}")
        return ids[0]

    def tokens_to_residual_directions(self, tokens: Union[str, int, Int[Tensor, "..."]]) -> Float[Tensor, "... d_model"]:
        """The unembedding direction(s) ``W_U[:, token]`` of a token (ln_final's gain folded in), shape ``(..., d_model)``.

        ``ln_final.hook_normalized @ direction`` is the token's logit, so direct logit attribution
        (``cache.logit_attrs``) sums to the true logit.
        """
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        ids = check_token_ids(tokens, "tokens", self.cfg.d_vocab, error=VocabularyMismatchError, type_error=ArgumentError)
        return self.model.head.weight[ids.to(self.device)] * self.model.norm.weight

    # -- generation ----------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        input: Union[str, Int[Tensor, "*batch pos"]],
        max_new_tokens: int = 32,
        temperature: float = 0.8,
        top_k: Optional[int] = None,
        top_p: Optional[float] = 0.95,
        seed: Optional[int] = None,
        stop_at_eot: bool = True,
        prepend_bos: bool = False,
        use_cache: bool = True,
    ) -> Union[str, Int[Tensor, "batch pos_plus_new"]]:
        """Sample a continuation with ``sprout_model.GPT.generate``'s sampler, through this model's forward.

        Hooks that are active (for example inside ``with m.hooks(...)``) apply to every step, so a
        head can be ablated during generation. Returns the prompt plus the new text for a string
        input, or the prompt plus new ids ``(batch, pos + new)`` for ids. ``seed`` makes the sample
        reproducible without touching the global random state; with ``stop_at_eot`` (batch 1 only)
        sampling stops after ``<|endoftext|>``. Prompts longer than the context raise
        ContextLengthError; the continuation itself may run past it (the window slides).
        ``use_cache`` keeps each block's keys and values between steps, so a new token costs one
        position instead of the whole context; it is used only while no hook is active (a hook
        sees every step's full forward) and gives the uncached tokens under greedy decoding.

        Arguments are checked first (:class:`ArgumentError` naming the one that is wrong):
        ``max_new_tokens`` is a whole number 0..4096 (``sprout_interp.core.generation.MAX_NEW_TOKENS``, a
        module attribute to raise for longer samples: past the context every token costs a full forward),
        ``temperature`` a finite number >= 0 (0: greedy), ``top_k`` None or a whole number 1..d_vocab,
        ``top_p`` None or a number in (0, 1].
        """
        max_new_tokens, temperature, top_k, top_p = check_sampling(max_new_tokens, temperature, top_k, top_p, self.cfg.d_vocab)
        text_in = isinstance(input, str)
        idx = self.to_tokens(input, prepend_bos=prepend_bos) if text_in else self._check_tokens(input)
        stop = {_tok.eot_id(self.tokenizer)} if stop_at_eot and idx.shape[0] == 1 else None
        with self._lock:
            hooked = any(is_hooked(hp) for hp in self.hook_dict.values())
            # hooks see every step's full forward, as documented; without hooks the keys and values are kept
            runner = KVCacheRunner(self.model) if use_cache and not hooked else HookedRunner(self)
            if seed is None:
                out = GPT.generate(runner, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, stop=stop)
            else:
                devices = [self.device] if self.device.type == "cuda" else []
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(seed)
                    out = GPT.generate(runner, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, stop=stop)
        return self.to_string(out[0]) if text_in else out

    # -- exports -------------------------------------------------------------------------------

    def to_hf(self):
        """(Qwen3ForCausalLM, PreTrainedTokenizerFast | None) with identical logits; see ``sprout_interp.core.export``."""
        from sprout_interp.core.export import to_hf

        return to_hf(self.model, self.tokenizer)

    def to_transformer_lens(self, compatibility_mode: bool = True):
        """A TransformerLens 4.x ``TransformerBridge`` over the exported Qwen3 model, built offline.

        In compatibility mode (the default) its weights, caches and attributions equal this model's;
        see ``sprout_interp.core.export.to_transformer_lens``.
        """
        from sprout_interp.core.export import to_transformer_lens

        return to_transformer_lens(self.model, self.tokenizer, compatibility_mode=compatibility_mode)


def as_hooked(model) -> "HookedSprout":
    """``model`` itself if it is a HookedSprout; a plain ``sprout_model.GPT`` is wrapped (no copy)."""
    if isinstance(model, HookedSprout):
        return model
    if isinstance(model, GPT):
        return HookedSprout(model)
    raise SproutError(f"expected a HookedSprout (sprout_interp.load(...)) or a sprout_model.GPT, got {type(model).__name__}")


def load_hooked(name_or_path: Union[str, Path], tokenizer=None) -> HookedSprout:
    """Load a checkpoint ("gpt-1", "gpt-4", "sprout", a folder or a course ``.pt``) as a HookedSprout.

    ``tokenizer`` (a ``tokenizers.Tokenizer``, a ``tokenizer.json`` path or a folder holding one)
    replaces the one found with the checkpoint; its size must match the model's vocabulary.
    Errors are :class:`~sprout_interp.core.errors.SproutError` subclasses (see ``load_checkpoint``).
    """
    from sprout_interp.core.loading import load_checkpoint  # lazy: keeps this module importable on its own

    if tokenizer is None:
        loaded = load_checkpoint(name_or_path)
    else:
        loaded = load_checkpoint(name_or_path, tokenizer=tokenizer)
    return HookedSprout.from_loaded(loaded)
