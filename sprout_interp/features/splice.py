"""Running the model with SAEs spliced in (SAELens's ``run_with_saes``), through HookedSprout's hooks.

At an SAE's hook point the stream ``x`` is replaced by

- the reconstruction ``x̂`` (``keep_error=False``): the model then runs on what the SAE explains, and nothing
  else;
- ``x̂ + (x - x̂)`` = ``x`` with the error term kept (``keep_error=True``): the output is the clean model's, but
  every feature edit below changes the stream by exactly ``Δact × W_dec[f]``, so a feature can be ablated or
  steered without the reconstruction's own loss getting in the way;

and features can be edited on the way: ``clamp={f: value}`` sets feature ``f``'s activation (0 ablates it),
``scale={f: factor}`` multiplies it, ``add={f: value}`` adds to it (steering, even where it was off), at every
position or only at ``positions``. Edits act after the TopK, so the other features keep their values.

Everything goes through the model's hooks (``HookedSprout.hooks``), so inside ``with spliced(model, sae, ...):``
every function of the toolkit -- ablation, patching, logit lens, name copying, generation -- sees the edited
stream::

    with spliced(model, sae, keep_error=True, clamp={1234: 0.0}):
        res = name_copying(lambda idx: (model(idx), None), model.tokenizer)
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Optional, Union

import torch
from jaxtyping import Float
from torch import Tensor

from sprout_interp.core.errors import SproutError
from sprout_interp.core.hooked import as_hooked
from sprout_interp.features.inputs import feature_input
from sprout_interp.features.sae import SparseAutoencoder, check_for_model

__all__ = ["sae_hook", "spliced", "run_with_saes", "run_with_sae_cache"]

SAEs = Union[SparseAutoencoder, Sequence[SparseAutoencoder]]


def _as_list(saes: SAEs) -> list[SparseAutoencoder]:
    out = [saes] if isinstance(saes, SparseAutoencoder) else list(saes)
    if not out or not all(isinstance(s, SparseAutoencoder) for s in out):
        raise SproutError("pass a SparseAutoencoder (load_sae(model, layer)) or a list of them")
    names = [s.hook_name for s in out]
    if len(set(names)) != len(names):
        raise SproutError(f"two SAEs on the same hook point ({names}): splice one per hook point")
    return out


def _check_features(sae: SparseAutoencoder, edits: Optional[Mapping[int, float]], what: str) -> dict[int, float]:
    out = {}
    for f, v in (edits or {}).items():
        if not isinstance(f, int) or isinstance(f, bool) or not 0 <= f < sae.d_sae:
            raise SproutError(f"{what}: feature {f!r} is not a latent of this SAE (0..{sae.d_sae - 1})")
        out[f] = float(v)
    return out


def sae_hook(
    sae: SparseAutoencoder,
    keep_error: bool = False,
    clamp: Optional[Mapping[int, float]] = None,
    scale: Optional[Mapping[int, float]] = None,
    add: Optional[Mapping[int, float]] = None,
    positions: Optional[Sequence[int]] = None,
    store: Optional[dict] = None,
):
    """The forward hook (``fn(x, hook)``) that splices ``sae`` in at its hook point, with the feature edits.

    ``positions`` (0-based) limits the edits to those positions (the reconstruction still replaces every
    position unless ``keep_error``). ``store``, a dict, receives ``store[sae.hook_name] = feature activations
    (batch, pos, d_sae)`` after the edits.
    """
    clamp, scale, add = (_check_features(sae, e, n) for e, n in ((clamp, "clamp"), (scale, "scale"), (add, "add")))
    feats = sorted(set(clamp) | set(scale) | set(add))

    def hook(x: Float[Tensor, "batch pos d_model"], hook=None) -> Float[Tensor, "batch pos d_model"]:
        acts = sae.encode(x)
        delta = None
        if feats:
            where = torch.zeros(x.shape[1], dtype=torch.bool, device=x.device)
            if positions is None:
                where[:] = True
            else:
                pos = [p + x.shape[1] if p < 0 else p for p in positions]
                if any(not 0 <= p < x.shape[1] for p in pos):
                    raise SproutError(f"positions {list(positions)} are outside the input's 0..{x.shape[1] - 1}")
                where[pos] = True
            new = acts.clone()
            for f in feats:
                a = new[..., f]
                v = a * scale[f] if f in scale else a
                v = torch.full_like(a, clamp[f]) if f in clamp else v
                v = v + add.get(f, 0.0)
                new[..., f] = torch.where(where, v, a)
            delta = (new - acts)[..., feats] @ sae.W_dec[feats]
            acts = new
        if store is not None:
            store[sae.hook_name] = acts.detach()
        if keep_error:  # x = x̂ + error: only the edits change the stream
            out = x if delta is None else x + delta
        else:
            out = sae.decode(acts)
        return out.to(x.dtype)

    return hook


@contextmanager
def spliced(
    model,
    saes: SAEs,
    keep_error: bool = False,
    clamp: Optional[Mapping[int, float]] = None,
    scale: Optional[Mapping[int, float]] = None,
    add: Optional[Mapping[int, float]] = None,
    positions: Optional[Sequence[int]] = None,
    store: Optional[dict] = None,
) -> Iterator:
    """Context manager: inside it, every forward of ``model`` runs with ``saes`` spliced in (see the module
    docstring). The feature edits apply to the first SAE (pass one SAE to steer). Each SAE must belong to the
    model (SAEMismatchError otherwise). Yields the model."""
    m = as_hooked(model)
    saes = _as_list(saes)
    for s in saes:
        check_for_model(s, m)
    hooks = []
    for i, s in enumerate(saes):
        edits = dict(clamp=clamp, scale=scale, add=add, positions=positions) if i == 0 else {}
        hooks.append((s.hook_name, sae_hook(s, keep_error=keep_error, store=store, **edits)))
    with m.hooks(fwd_hooks=hooks):
        yield m


def run_with_saes(
    model,
    input,
    saes: SAEs,
    keep_error: bool = False,
    clamp: Optional[Mapping[int, float]] = None,
    scale: Optional[Mapping[int, float]] = None,
    add: Optional[Mapping[int, float]] = None,
    positions: Optional[Sequence[int]] = None,
    attention_mask=None,
    return_type: str = "logits",
):
    """The model's output (``return_type`` as ``HookedSprout.forward``: logits ``(batch, pos, vocab)`` or a loss) on
    ``input`` (a text, texts or ids) with ``saes`` spliced in and the feature edits applied. A text longer than the
    context is cut to it, with a :class:`~sprout_interp.features.inputs.TruncatedTextWarning`."""
    m = as_hooked(model)
    toks, mask, _ = feature_input(m, input, attention_mask)
    with torch.no_grad(), spliced(m, saes, keep_error, clamp, scale, add, positions):
        return m(toks, attention_mask=mask, return_type=return_type)


def run_with_sae_cache(
    model, input, saes: SAEs, keep_error: bool = True, attention_mask=None,
) -> tuple[Float[Tensor, "batch pos vocab"], dict[str, Float[Tensor, "batch pos d_sae"]]]:
    """(logits, {hook_name: feature activations (batch, pos, d_sae)}) with ``saes`` spliced in (error kept by
    default, so the logits are the clean model's)."""
    m = as_hooked(model)
    toks, mask, _ = feature_input(m, input, attention_mask)
    store: dict = {}
    with torch.no_grad(), spliced(m, saes, keep_error=keep_error, store=store):
        logits = m(toks, attention_mask=mask)
    return logits, store
