"""How good a cross-layer transcoder is, on held-out text: per layer, and as a replacement model with every
feed-forward replaced at once (the per-layer transcoders' measures, :mod:`sprout_interp.features.transcoder_metrics`,
for a CLT).

:func:`run_with_clt` runs the model with every feed-forward output ``j`` replaced by the CLT's prediction
``ŷ_j = b_dec[j] + Σ_{i <= j} a_i @ W_dec[i][:, j - i]``, each ``a_i`` encoded from the input feed-forward ``i``
actually receives in that run; with ``add_errors=True`` each layer's error ``mlp_out - ŷ`` is added back, which
gives the clean model again (to float rounding).

:func:`clt_quality` gives one row per layer: ``l0`` and ``dead`` of the features that layer's input encodes
(source layer), ``fve`` of that layer's feed-forward output (target layer: every earlier layer's features
included), all on the clean model's inputs, and the next-token loss with that one output replaced
(``ce_spliced``; the features it reads encoded from the clean inputs) against clean and zeroed.
:func:`clt_replacement_quality` replaces every output at once (no errors): ``gap_recovered``.
"""
from __future__ import annotations

from typing import Literal, Optional, Union

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from sprout_interp.core.errors import SproutError
from sprout_interp.core.fingerprints import fingerprint, fingerprint_mismatch
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.tokens import ModelInput
from sprout_interp.features.clt import CrossLayerTranscoder
from sprout_interp.features.metrics import held_out_tokens
from sprout_interp.features.transcoder import input_hook, mlp_input, output_hook

__all__ = ["run_with_clt", "clt_quality", "clt_replacement_quality", "CLT_QUALITY_UNITS"]

CLT_QUALITY_UNITS = ("l0: features/token of the layer's own (source) features; fve: fraction of the layer's "
                     "feed-forward output variance explained (target: every earlier layer's features included); "
                     "dead: features of the layer never active; ce_*: nats/token; loss_recovered, gap_recovered: "
                     "fractions; layer 0-indexed, block = layer + 1")


def _check(m, clt) -> CrossLayerTranscoder:
    if not isinstance(clt, CrossLayerTranscoder):
        raise SproutError(f"clt must be a CrossLayerTranscoder (features.clt.load_clt), got {type(clt).__name__}")
    if (clt.n_layers, clt.d_model) != (m.cfg.n_layers, m.cfg.d_model):
        raise SproutError(f"the CLT spans {clt.n_layers} layers of width {clt.d_model}; {m.name or 'the model'} has "
                          f"{m.cfg.n_layers} of width {m.cfg.d_model}")
    got = clt.info.get("fingerprint")
    if got and fingerprint_mismatch(fingerprint(m), got):
        raise SproutError("the CLT was trained for another checkpoint: load the CLT of this model")
    return clt


def _hooks(m, clt: CrossLayerTranscoder, targets: list[int], mode: Literal["replace", "errors", "zero"]):
    """Forward hooks: encode each source layer's features from the input its feed-forward receives in this run,
    then put ŷ (``replace``), ŷ plus the error (``errors``) or zeros (``zero``) in place of each target output."""
    acts: dict[int, Tensor] = {}
    hooks = []
    if mode != "zero":
        for i in range(max(targets) + 1):
            def grab(a, hook, i=i):
                acts[i] = clt.encode_layer(i, mlp_input(m, i, a))
            hooks.append((input_hook(i), grab))
    for j in targets:
        def put(y, hook, j=j):
            if mode == "zero":
                return torch.zeros_like(y)
            pred = clt.decode_layer(j, acts).to(y.dtype)
            return pred + (y - pred) if mode == "errors" else pred
        hooks.append((output_hook(j), put))
    return hooks


def _loss(m, tokens: Tensor, hooks: list) -> Tensor:
    """Per-token next-token loss (batch, pos-1), nats, float64, of the model run with ``hooks``."""
    return m.run_with_hooks(tokens, return_type="loss", loss_per_token=True, fwd_hooks=hooks).double()


def run_with_clt(
    model,
    clt: CrossLayerTranscoder,
    tokens: ModelInput,
    add_errors: bool = False,
    return_type: Literal["logits", "loss"] = "logits",
) -> Union[Float[Tensor, "batch pos d_vocab"], Tensor]:
    """The replacement model's logits (or mean next-token loss, nats): every feed-forward output replaced by the
    CLT's prediction from the inputs the blocks actually give it, all at once; ``add_errors=True`` adds each
    layer's error back (then the result is the clean model's, to rounding)."""
    m = as_hooked(model)
    _check(m, clt)
    if not isinstance(add_errors, bool):
        raise SproutError(f"add_errors must be True or False, got {add_errors!r}")
    if return_type not in ("logits", "loss"):
        raise SproutError(f"return_type must be 'logits' or 'loss', got {return_type!r}")
    tokens, mask = m.prepare_input(tokens)
    with torch.no_grad():
        return m.run_with_hooks(tokens, return_type=return_type, attention_mask=mask,
                                fwd_hooks=_hooks(m, clt, list(range(clt.n_layers)), "errors" if add_errors else "replace"))


def _tokens(m, tokens, n, length, seed):
    if tokens is None:
        return held_out_tokens(m, n=n, length=length, seed=seed)
    return m.prepare_input(tokens, padding=False, argument="tokens")[0]


@torch.no_grad()
def clt_quality(
    model,
    clt: CrossLayerTranscoder,
    tokens: Optional[ModelInput] = None,
    n: int = 16,
    length: int = 256,
    seed: int = 0,
    batch: int = 4,
    losses: bool = True,
) -> pd.DataFrame:
    """One row per layer of the CLT on ``tokens`` (default ``n`` held-out windows of ``length``; units also in
    ``df.attrs["units"]``):

    | column | meaning |
    |---|---|
    | ``model``, ``layer``, ``block`` | the layer (0-indexed; block = layer + 1) |
    | ``d_transcoder`` | features per layer |
    | ``n_tokens`` | held-out tokens measured |
    | ``l0`` | mean active features per token among this layer's own features |
    | ``fve`` | fraction of this layer's feed-forward output variance explained, on the clean model's inputs |
    | ``dead`` | this layer's features never active on the sample |
    | ``ce_clean``, ``ce_spliced``, ``ce_zero`` | next-token loss (nats/token): clean, this output replaced, zeroed (``losses=False``: NaN) |
    | ``loss_recovered`` | ``(ce_zero - ce_spliced) / (ce_zero - ce_clean)`` |
    """
    m = as_hooked(model)
    _check(m, clt)
    tokens = _tokens(m, tokens, n, length, seed)
    L = clt.n_layers
    names = [input_hook(i) for i in range(L)] + [output_hook(i) for i in range(L)]
    acc = [{"sq": 0.0, "s1": 0.0, "s2": 0.0, "l0": 0.0, "fired": torch.zeros(clt.d_transcoder, dtype=torch.bool),
            "spliced": 0.0, "zero": 0.0} for _ in range(L)]
    clean = n_tok = n_ce = 0.0
    for s in range(0, tokens.shape[0], batch):
        t = tokens[s:s + batch]
        ce, cache = m.run_with_cache(t, names_filter=names, return_type="loss", loss_per_token=True)
        clean += float(ce.double().sum())
        n_ce += t.shape[0] * (t.shape[1] - 1)
        n_tok += t.numel()
        acts = [clt.encode_layer(i, mlp_input(m, i, cache[input_hook(i)])) for i in range(L)]
        for j in range(L):
            a = acc[j]
            y = cache[output_hook(j)].double()
            pred = clt.decode_layer(j, acts).double()
            a["sq"] += float((y - pred).pow(2).sum())
            a["s1"] = a["s1"] + y.reshape(-1, y.shape[-1]).sum(0)
            a["s2"] += float(y.pow(2).sum())
            active = acts[j] != 0
            a["l0"] += float(active.sum())
            a["fired"] |= active.reshape(-1, clt.d_transcoder).any(0).cpu()
            if losses:
                a["spliced"] += float(_loss(m, t, _hooks(m, clt, [j], "replace")).sum())
                a["zero"] += float(_loss(m, t, _hooks(m, clt, [j], "zero")).sum())
    rows = []
    for j in range(L):
        a = acc[j]
        var = a["s2"] - float((a["s1"] ** 2).sum()) / n_tok
        ce_c = clean / n_ce
        ce_s, ce_z = (a["spliced"] / n_ce, a["zero"] / n_ce) if losses else (float("nan"), float("nan"))
        rows.append({"model": m.name or "", "layer": j, "block": j + 1, "d_transcoder": clt.d_transcoder,
                     "n_tokens": int(n_tok), "l0": a["l0"] / n_tok, "fve": 1 - a["sq"] / var,
                     "dead": int((~a["fired"]).sum()), "ce_clean": ce_c, "ce_spliced": ce_s, "ce_zero": ce_z,
                     "loss_recovered": (ce_z - ce_s) / (ce_z - ce_c) if losses and ce_z != ce_c else float("nan")})
    df = pd.DataFrame(rows)
    df.attrs["units"] = CLT_QUALITY_UNITS
    return df


@torch.no_grad()
def clt_replacement_quality(
    model,
    clt: CrossLayerTranscoder,
    tokens: Optional[ModelInput] = None,
    n: int = 16,
    length: int = 256,
    seed: int = 0,
    batch: int = 4,
) -> dict:
    """Every feed-forward output replaced by the CLT at once (no error terms), on ``tokens`` (default ``n``
    held-out windows): ``{"n_tokens", "ce_clean", "ce_replacement", "ce_mlp_zero", "gap_recovered"}``, losses in
    nats/token, ``gap_recovered = (ce_mlp_zero - ce_replacement) / (ce_mlp_zero - ce_clean)``."""
    m = as_hooked(model)
    _check(m, clt)
    tokens = _tokens(m, tokens, n, length, seed)
    every = list(range(clt.n_layers))
    tot = {"clean": 0.0, "replacement": 0.0, "zero": 0.0}
    n_ce = 0
    for s in range(0, tokens.shape[0], batch):
        t = tokens[s:s + batch]
        tot["clean"] += float(_loss(m, t, []).sum())
        tot["replacement"] += float(_loss(m, t, _hooks(m, clt, every, "replace")).sum())
        tot["zero"] += float(_loss(m, t, _hooks(m, clt, every, "zero")).sum())
        n_ce += t.shape[0] * (t.shape[1] - 1)
    c, r, z = (tot[key] / n_ce for key in ("clean", "replacement", "zero"))
    return {"n_tokens": int(tokens.numel()), "ce_clean": c, "ce_replacement": r, "ce_mlp_zero": z,
            "gap_recovered": (z - r) / (z - c) if z != c else float("nan")}
