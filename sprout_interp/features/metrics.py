"""How good an SAE is, on held-out text: sparsity, reconstruction, and what the reconstruction costs the model.

:func:`sae_quality` gives one row per SAE (SAELens's evaluation metrics):

- ``l0``: mean number of active latents per token (at most ``k`` for a TopK SAE);
- ``fve``: fraction of variance explained, ``1 - Σ‖x - x̂‖² / Σ‖x - mean(x)‖²`` over every held-out token;
- ``ce_clean``, ``ce_sae``, ``ce_zero``: next-token cross-entropy (nats/token) of the clean model, of the model
  with the SAE's hook point replaced by the reconstruction, and with it replaced by zeros;
- ``loss_recovered``: ``(ce_zero - ce_sae) / (ce_zero - ce_clean)``, 1 = as good as clean;
- ``dead``: latents that never fire on the sample; ``dense``: latents firing on more than ``dense_threshold`` of
  its tokens.

The held-out sample is :func:`sprout_interp.core.texts.held_out_for` (validation documents no shipped model
trained on). :func:`feature_density` gives every latent's firing frequency on the same kind of sample.
"""
from __future__ import annotations

from typing import Optional

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.core.arguments import check_count, check_number
from sprout_interp.core.errors import ArgumentError
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.texts import held_out_for
from sprout_interp.core.tokens import ModelInput
from sprout_interp.features.sae import SparseAutoencoder, check_for_model

__all__ = ["held_out_tokens", "measured_input", "sae_quality", "feature_density", "QUALITY_UNITS"]

QUALITY_UNITS = ("l0: latents/token; fve: fraction; ce_*: nats/token; loss_recovered: fraction; dead/dense: latents; "
                 "layer 0-indexed, block = layer + 1")


def held_out_tokens(model, n: int = 32, length: int = 256, seed: int = 0) -> Int[Tensor, "n length"]:
    """``n`` held-out windows of ``length`` tokens (``held_out_for``), the sample every metric here defaults to."""
    return held_out_for(as_hooked(model), n=n, length=length, seed=seed)


def _ce(logits: Tensor, tokens: Tensor) -> Tensor:
    """Per-token next-token cross-entropy, (batch, pos-1), nats."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten(), reduction="none").view(
        tokens.shape[0], -1)


def measured_input(m, tokens, n: int, length: int, seed: int, *, padding: bool = True,
                   next_token: bool = True) -> tuple[Tensor, Optional[Tensor]]:
    """The tokens and mask a metric runs on: ``n`` held-out windows of ``length`` by default, else ``tokens``
    through ``prepare_input`` (a list of texts of different lengths keeps its mask, so the padding counts nowhere;
    ``padding=False`` refuses such a list). With ``next_token`` (a next-token loss is measured) every window needs
    two tokens: ``length`` is from 2, and ``tokens`` of one token per text are refused. ArgumentError (naming
    ``n``, ``length``, ``seed`` or ``tokens``) for what cannot be measured."""
    low = 2 if next_token else 1
    if tokens is None:
        length = check_count(length, "length", low=low, what="tokens per held-out window" + (
            "; a next-token loss needs two" if next_token else ""))
        return held_out_tokens(m, n=n, length=length, seed=seed), None
    toks, mask = m.prepare_input(tokens, padding=padding, argument="tokens")
    if toks.shape[1] < low:
        raise ArgumentError(f"tokens holds {toks.shape[1]} token per text: a next-token loss needs at least two "
                            "(a token and the one after it)")
    return toks, mask


@torch.no_grad()
def _passes(model, sae: SparseAutoencoder, tokens: Tensor, mask: Optional[Tensor], batch: int):
    """Yield, per batch, at real (unpadded) positions only: (x (n, d), recon (n, d), top-k values (n, k), their
    latents (n, k), per-target CE clean / spliced / zero (targets,))."""
    m = as_hooked(model)
    name, layer = sae.hook_name, sae.layer
    for i in range(0, tokens.shape[0], batch):
        t = tokens[i:i + batch]
        real = torch.ones_like(t, dtype=torch.bool) if mask is None else mask[i:i + batch]
        targets = real[:, :-1] & real[:, 1:]
        logits, cache = m.run_with_cache(t, names_filter=name)
        x = cache[name]
        vals, idx = sae.topk(sae.pre_acts(x))
        recon = sae.decode_sparse(vals, idx).to(x.dtype)
        spliced = m(recon, start_at_layer=layer + 1, tokens=t)
        zeroed = m(torch.zeros_like(x), start_at_layer=layer + 1, tokens=t)
        yield (x[real], recon[real], vals[real], idx[real],
               _ce(logits, t)[targets], _ce(spliced, t)[targets], _ce(zeroed, t)[targets])


@torch.no_grad()
def feature_density(model, sae: SparseAutoencoder, tokens: Optional[ModelInput] = None,
                    batch: int = 8) -> Float[Tensor, " d_sae"]:
    """The fraction of tokens on which each latent is active, ``(d_sae,)``, on ``tokens`` (default the held-out sample)."""
    m = as_hooked(model)
    check_for_model(sae, m)
    batch = check_count(batch, "batch", what="windows per forward")
    tokens, mask = measured_input(m, tokens, 32, 256, 0, next_token=False)
    counts = torch.zeros(sae.d_sae, dtype=torch.float64)
    n = 0
    name = sae.hook_name
    for i in range(0, tokens.shape[0], batch):
        _, cache = m.run_with_cache(tokens[i:i + batch], names_filter=name, stop_at_layer=sae.layer + 1)
        vals, idx = sae.topk(sae.pre_acts(cache[name]))
        if mask is not None:  # the padding's positions fire nothing that counts
            vals, idx = vals[mask[i:i + batch]], idx[mask[i:i + batch]]
        counts += torch.bincount(idx[vals > 0].flatten().cpu(), minlength=sae.d_sae).double()
        n += vals[..., 0].numel()
    return (counts / max(n, 1)).float()


@torch.no_grad()
def sae_quality(
    model,
    sae: SparseAutoencoder,
    tokens: Optional[ModelInput] = None,
    n: int = 32,
    length: int = 256,
    seed: int = 0,
    batch: int = 8,
    dense_threshold: float = 0.1,
) -> pd.DataFrame:
    """One row of quality metrics for ``sae`` on ``tokens`` (default: ``n`` held-out windows of ``length``).

    The SAE must belong to the model (SAEMismatchError otherwise). Returns one row (units also in
    ``df.attrs["units"]``):

    | column | meaning |
    |---|---|
    | ``model``, ``layer``, ``block``, ``hook_name`` | where the SAE reads (layer 0-indexed, block = layer + 1) |
    | ``d_sae``, ``k`` | latents, and active latents per token |
    | ``n_tokens`` | held-out tokens measured |
    | ``l0`` | mean active latents per token (at most ``k``) |
    | ``fve`` | fraction of variance explained, ``1 - Σ‖x - x̂‖² / Σ‖x - mean(x)‖²`` |
    | ``ce_clean``, ``ce_sae``, ``ce_zero`` | next-token loss (nats/token): clean, the stream replaced by the reconstruction, by zeros |
    | ``loss_recovered`` | ``(ce_zero - ce_sae) / (ce_zero - ce_clean)``, 1 = as good as clean |
    | ``dead``, ``dense`` | latents never active on the sample; active on more than ``dense_threshold`` of its tokens |

    ``n`` is 1..``MAX_WINDOWS``, ``length`` from 2 (a next-token loss needs two tokens), ``batch`` from 1,
    ``dense_threshold`` 0..1 (ArgumentError otherwise, naming the argument).
    """
    m = as_hooked(model)
    check_for_model(sae, m)
    batch = check_count(batch, "batch", what="windows per forward")
    dense_threshold = check_number(dense_threshold, "dense_threshold", low=0.0, high=1.0,
                                   what="the share of tokens above which a latent counts as dense")
    tokens, mask = measured_input(m, tokens, n, length, seed)
    sq_err = sum_x = sum_x2 = l0 = 0.0
    n_tok = 0
    counts = torch.zeros(sae.d_sae, dtype=torch.float64)
    ce = {"clean": 0.0, "sae": 0.0, "zero": 0.0}
    n_ce = 0
    for x, recon, vals, idx, c_clean, c_sae, c_zero in _passes(m, sae, tokens, mask, batch):
        x64 = x.double()
        sq_err += float((x64 - recon.double()).pow(2).sum())
        sum_x = sum_x + x64.sum(0)
        sum_x2 += float(x64.pow(2).sum())
        active = vals > 0
        l0 += float(active.sum())
        counts += torch.bincount(idx[active].flatten().cpu(), minlength=sae.d_sae).double()
        n_tok += x.shape[0]
        for key, c in (("clean", c_clean), ("sae", c_sae), ("zero", c_zero)):
            ce[key] += float(c.double().sum())
        n_ce += c_clean.numel()
    total_var = sum_x2 - float((sum_x * sum_x).sum()) / n_tok
    ce = {k: v / n_ce for k, v in ce.items()}
    freq = counts / n_tok
    df = pd.DataFrame([{
        "model": m.name or "", "layer": sae.layer, "block": sae.layer + 1, "hook_name": sae.hook_name,
        "d_sae": sae.d_sae, "k": sae.k, "n_tokens": n_tok, "l0": l0 / n_tok, "fve": 1 - sq_err / total_var,
        "ce_clean": ce["clean"], "ce_sae": ce["sae"], "ce_zero": ce["zero"],
        "loss_recovered": (ce["zero"] - ce["sae"]) / (ce["zero"] - ce["clean"]),
        "dead": int((freq == 0).sum()), "dense": int((freq > dense_threshold).sum()),
    }])
    df.attrs.update(units=QUALITY_UNITS, dense_threshold=dense_threshold)
    return df
