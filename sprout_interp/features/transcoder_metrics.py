"""How good transcoders are, on held-out text: per layer, and as a replacement model with every MLP replaced.

:func:`run_with_transcoders` runs the model with the feed-forward of each layer in a set replaced by its
transcoder's prediction from the input the block actually gives it (the replacement model); with
``add_errors=True`` each layer's error ``mlp_out - ŷ`` is added back, which gives the clean model again (to
float rounding): the identity the attribution graph's error nodes rest on.

:func:`transcoder_quality` gives one row per layer: ``l0`` (active features per token), ``fve`` (fraction of
the feed-forward output's variance explained, ``1 - Σ‖y - ŷ‖² / Σ‖y - mean(y)‖²`` over every held-out
token, on the clean model's inputs), ``fve_skip_only`` (the same for the skip connection alone, ``x @ W_skip.T +
b_dec``: what the features add beyond a linear map; NaN without one), ``dead`` (features never active on the
sample), and the next-token loss
with that layer alone replaced (``ce_spliced``) against the clean one and the one with that feed-forward
zeroed, ``loss_recovered = (ce_zero - ce_spliced) / (ce_zero - ce_clean)``.

:func:`replacement_quality` replaces every layer of the set at once (no error terms): ``ce_replacement``
against ``ce_clean`` and ``ce_mlp_zero`` (the same feed-forwards zeroed), and ``gap_recovered``.
"""
from __future__ import annotations

from typing import Literal, Optional, Union

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from sprout_interp.core.arguments import check_count, describe
from sprout_interp.core.errors import SproutError
from sprout_interp.core.fingerprints import fingerprint, fingerprint_mismatch
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.tokens import ModelInput
from sprout_interp.features.metrics import measured_input
from sprout_interp.features.transcoder import (
    Transcoder,
    TranscoderSet,
    input_hook,
    mlp_input,
    output_hook,
)

__all__ = ["run_with_transcoders", "transcoder_quality", "replacement_quality", "TC_QUALITY_UNITS"]

TC_QUALITY_UNITS = ("l0: features/token; fve: fraction; dead: features; ce_*: nats/token; loss_recovered and "
                    "gap_recovered: fractions; layer 0-indexed, block = layer + 1")

Transcoders = Union[TranscoderSet, dict[int, Transcoder]]




def _as_dict(m, ts: Transcoders) -> dict[int, Transcoder]:
    """The set as {layer: Transcoder}, each checked against the model (width, layer, fingerprint)."""
    if not isinstance(ts, (TranscoderSet, dict)):
        raise SproutError(f"transcoders={describe(ts)} is not transcoders: pass a TranscoderSet or {{layer: Transcoder}}")
    d = {tc.layer: tc for tc in ts} if isinstance(ts, TranscoderSet) else dict(ts)
    if not d:
        raise SproutError("no transcoders given: pass a TranscoderSet or {layer: Transcoder}")
    fp = fingerprint(m)
    for layer, tc in d.items():
        if not isinstance(tc, Transcoder) or tc.layer != layer:
            raise SproutError(f"transcoders[{layer!r}] must be the Transcoder of layer {layer!r}, got {tc!r}")
        if tc.d_model != m.cfg.d_model or not 0 <= layer < m.cfg.n_layers:
            raise SproutError(f"the transcoder of layer {layer} (d_model {tc.d_model}) does not fit "
                              f"{m.name or 'the model'} (d_model {m.cfg.d_model}, layers 0..{m.cfg.n_layers - 1})")
        got = tc.info.get("fingerprint")
        if got and fingerprint_mismatch(fp, got):
            raise SproutError(f"the transcoder of layer {layer} was trained for another checkpoint "
                              f"({tc.info.get('trained_on') or 'unknown'}): load the transcoders of this model")
    return d


def _hooks(m, tcs: dict[int, Transcoder], mode: Literal["replace", "errors", "zero"], record: Optional[dict] = None):
    """Forward hooks: capture each layer's ln2 output, then put ŷ (``replace``), ŷ plus the error (``errors``)
    or zeros (``zero``) in place of its feed-forward output. ``record`` (optional) gets (x, ŷ, y) per layer."""
    seen: dict[int, Tensor] = {}
    hooks = []
    for layer, tc in tcs.items():
        def grab(act, hook, layer=layer):
            seen[layer] = act

        def put(y, hook, layer=layer, tc=tc):
            if mode == "zero":
                return torch.zeros_like(y)
            x = mlp_input(m, layer, seen.pop(layer))
            pred = tc(x).to(y.dtype)
            if record is not None:
                record[layer] = (x, pred, y)
            return pred + (y - pred) if mode == "errors" else pred

        if mode != "zero":
            hooks.append((input_hook(layer), grab))
        hooks.append((output_hook(layer), put))
    return hooks


def _loss(m, tokens: Tensor, hooks: list) -> Tensor:
    """Per-token next-token loss (batch, pos-1), nats, float64, of the model run with ``hooks``."""
    return m.run_with_hooks(tokens, return_type="loss", loss_per_token=True, fwd_hooks=hooks).double()


def run_with_transcoders(
    model,
    transcoders: Transcoders,
    tokens: ModelInput,
    add_errors: bool = False,
    return_type: Literal["logits", "loss"] = "logits",
) -> Union[Float[Tensor, "batch pos d_vocab"], Tensor]:
    """The replacement model's logits (or mean next-token loss, nats): every layer in ``transcoders`` has its
    feed-forward output replaced by the transcoder's prediction from that block's actual input, all at once.
    ``add_errors=True`` adds each layer's error back (then the result is the clean model's, to rounding)."""
    m = as_hooked(model)
    tcs = _as_dict(m, transcoders)
    if not isinstance(add_errors, bool):
        raise SproutError(f"add_errors must be True or False, got {add_errors!r}")
    if return_type not in ("logits", "loss"):
        raise SproutError(f"return_type must be 'logits' or 'loss', got {return_type!r}")
    tokens, mask = m.prepare_input(tokens)  # texts of different lengths: the loss leaves their padding out
    with torch.no_grad():
        return m.run_with_hooks(tokens, return_type=return_type, attention_mask=mask,
                                fwd_hooks=_hooks(m, tcs, "errors" if add_errors else "replace"))


@torch.no_grad()
def transcoder_quality(
    model,
    transcoders: Transcoders,
    tokens: Optional[ModelInput] = None,
    n: int = 16,
    length: int = 256,
    seed: int = 0,
    batch: int = 4,
) -> pd.DataFrame:
    """One row per layer of ``transcoders`` on ``tokens`` (default ``n`` held-out windows of ``length``).

    Returns one row per layer (units also in ``df.attrs["units"]``):

    | column | meaning |
    |---|---|
    | ``model``, ``layer``, ``block`` | the feed-forward replaced (layer 0-indexed, block = layer + 1) |
    | ``d_transcoder``, ``k``, ``skip`` | features, active features per token, whether it has a skip connection |
    | ``n_tokens`` | held-out tokens measured |
    | ``l0`` | mean active features per token |
    | ``fve`` | fraction of the feed-forward output's variance explained, on the clean model's inputs |
    | ``fve_skip_only`` | the same for the skip connection alone (NaN without one) |
    | ``dead`` | features never active on the sample |
    | ``ce_clean``, ``ce_spliced``, ``ce_zero`` | next-token loss (nats/token): clean, this layer replaced, its feed-forward zeroed |
    | ``loss_recovered`` | ``(ce_zero - ce_spliced) / (ce_zero - ce_clean)``, 1 = as good as clean |
    """
    m = as_hooked(model)
    tcs = _as_dict(m, transcoders)
    batch = check_count(batch, "batch", what="windows per forward")
    tokens = measured_input(m, tokens, n, length, seed, padding=False)[0]
    rows = []
    names = [input_hook(layer) for layer in tcs] + [output_hook(layer) for layer in tcs]
    acc = {layer: {"sq": 0.0, "sq_skip": 0.0, "s1": 0.0, "s2": 0.0, "l0": 0.0, "fired": torch.zeros(tc.d_transcoder, dtype=torch.bool),
                   "spliced": 0.0, "zero": 0.0} for layer, tc in tcs.items()}
    clean = n_tok = n_ce = 0.0
    for i in range(0, tokens.shape[0], batch):
        t = tokens[i:i + batch]
        ce, cache = m.run_with_cache(t, names_filter=names, return_type="loss", loss_per_token=True)
        clean += float(ce.double().sum())
        n_ce += t.shape[0] * (t.shape[1] - 1)
        n_tok += t.numel()
        for layer, tc in tcs.items():
            a = acc[layer]
            x = mlp_input(m, layer, cache[input_hook(layer)])
            y = cache[output_hook(layer)].double()
            vals, idx = tc.topk(tc.pre_acts(x))
            pred = tc.decode_sparse(vals, idx, x).double()
            a["sq"] += float((y - pred).pow(2).sum())
            a["sq_skip"] += float((y - (tc.skip(x) + tc.b_dec).double()).pow(2).sum())
            a["s1"] = a["s1"] + y.reshape(-1, y.shape[-1]).sum(0)
            a["s2"] += float(y.pow(2).sum())
            active = vals != 0
            a["l0"] += float(active.sum())
            a["fired"][idx[active].flatten().cpu()] = True
            one = {layer: tc}
            a["spliced"] += float(_loss(m, t, _hooks(m, one, "replace")).sum())
            a["zero"] += float(_loss(m, t, _hooks(m, one, "zero")).sum())
    for layer, tc in tcs.items():
        a = acc[layer]
        var = a["s2"] - float((a["s1"] ** 2).sum()) / n_tok
        ce_c, ce_s, ce_z = clean / n_ce, a["spliced"] / n_ce, a["zero"] / n_ce
        rows.append({"model": m.name or "", "layer": layer, "block": layer + 1, "d_transcoder": tc.d_transcoder,
                     "k": tc.k, "skip": tc.has_skip, "n_tokens": int(n_tok), "l0": a["l0"] / n_tok,
                     "fve": 1 - a["sq"] / var,
                     "fve_skip_only": 1 - a["sq_skip"] / var if tc.has_skip else float("nan"), "dead": int((~a["fired"]).sum()), "ce_clean": ce_c,
                     "ce_spliced": ce_s, "ce_zero": ce_z,
                     "loss_recovered": (ce_z - ce_s) / (ce_z - ce_c) if ce_z != ce_c else float("nan")})
    df = pd.DataFrame(rows)
    df.attrs["units"] = TC_QUALITY_UNITS
    return df


@torch.no_grad()
def replacement_quality(
    model,
    transcoders: Transcoders,
    tokens: Optional[ModelInput] = None,
    n: int = 16,
    length: int = 256,
    seed: int = 0,
    batch: int = 4,
) -> dict:
    """The replacement model with every layer of ``transcoders`` replaced at once (no error terms), on
    ``tokens`` (default ``n`` held-out windows): ``{"layers", "n_tokens", "ce_clean", "ce_replacement",
    "ce_mlp_zero", "gap_recovered"}``, losses in nats/token, ``gap_recovered = (ce_mlp_zero -
    ce_replacement) / (ce_mlp_zero - ce_clean)`` (1 = as good as the clean model)."""
    m = as_hooked(model)
    tcs = _as_dict(m, transcoders)
    batch = check_count(batch, "batch", what="windows per forward")
    tokens = measured_input(m, tokens, n, length, seed, padding=False)[0]
    tot = {"clean": 0.0, "replacement": 0.0, "zero": 0.0}
    n_ce = 0
    for i in range(0, tokens.shape[0], batch):
        t = tokens[i:i + batch]
        tot["clean"] += float(_loss(m, t, []).sum())
        tot["replacement"] += float(_loss(m, t, _hooks(m, tcs, "replace")).sum())
        tot["zero"] += float(_loss(m, t, _hooks(m, tcs, "zero")).sum())
        n_ce += t.shape[0] * (t.shape[1] - 1)
    c, r, z = (tot[key] / n_ce for key in ("clean", "replacement", "zero"))
    return {"layers": sorted(tcs), "n_tokens": int(tokens.numel()), "ce_clean": c, "ce_replacement": r,
            "ce_mlp_zero": z, "gap_recovered": (z - r) / (z - c) if z != c else float("nan")}
