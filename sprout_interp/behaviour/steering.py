"""Activation steering: add a direction to the residual stream and watch what the model does.

A steering vector is a difference of mean activations at one hook point (ActAdd, Turner et al. 2023; contrastive
activation addition, Rimsky et al. 2024): the residual stream over texts that have a property ("She ...")
minus the same over texts that lack it ("He ..."). Adding ``coeff × vector`` there on every forward moves the
model towards the property; a negative ``coeff`` moves it away.

- :func:`steering_vector` -- the vector ``(d_model,)``: mean over ``positive`` of the stream at the last real
  token (``read="last"``) or averaged over every real token (``read="mean"``), minus the same over ``negative``.
  Units: the stream's own at that hook point (compare its norm with the stream's, which grows block by block).
- :func:`steered` -- a context manager; inside it every forward of the model, generation included, has
  ``coeff × vector`` added at ``blocks.{layer}.hook_{site}``, at every position or only at ``positions``.
- :func:`steering_effect` -- a metric of the steered model for several coefficients: a DataFrame ``coeff,
  metric, value, clean, change, added_norm, stream_norm``. ``method="fast"`` (default) runs the blocks before the
  steered one once, then the rest with every coefficient in one batch, unembedding only where the metric reads;
  it equals ``method="naive"``, one full forward per coefficient with a hook (the loop one writes with
  ``run_with_hooks``; the tests check both against the chapter's own model code).
- :func:`steering_layers` -- the same vector made and added at each layer in turn: where does it steer?
- :func:`steering_controls` -- the same dose in random directions of the vector's norm: does the vector steer, or
  does any push of that size move the metric?
- :func:`steered_generations` -- the continuation of a prompt for each coefficient, with one seed for all.

Sites: ``"resid_pre"`` (the stream entering block ``layer``) and ``"resid_post"`` (leaving it; the last block's
``resid_post`` is what the final norm reads). Tables carry ``layer`` (0-indexed as in code) and ``block`` (=
layer + 1, the chapter's count); metrics are the protocol of :mod:`sprout_interp.circuits.metrics` (``"loss"``,
``LogitDiff(answer, wrong)``, ``LogProb(target)``, ... or a function of the logits), in their own units.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal, Optional, Union

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from sprout_interp.circuits.ablation import trimmed_positions
from sprout_interp.circuits.metrics import (
    BoundMetric,
    MetricLike,
    bind_metric,
    metric_from_read_logits,
    metric_from_resid,
    read_positions,
)
from sprout_interp.core.arguments import check_count, check_index, check_indices, check_number, check_numbers, integer
from sprout_interp.core.errors import SteeringError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout, as_hooked, is_hooked

__all__ = ["SITES", "READS", "EXAMPLE", "steering_vector", "steered", "steering_effect", "steering_layers", "steering_controls",
           "steered_generations"]

Site = Literal["resid_pre", "resid_post"]
Read = Literal["last", "mean"]
Number = Union[int, float]
Coeffs = Union[Number, Sequence[Number]]
SITES: tuple[str, ...] = ("resid_pre", "resid_post")
READS: tuple[str, ...] = ("last", "mean")
DEFAULT_COEFFS: tuple[float, ...] = (-4.0, -2.0, -1.0, 0.0, 1.0, 2.0, 4.0)
# A contrast that differs in "She" / "He" alone, every pair ending on the same token, and a prompt that names no
# one's sex: the docs' and the dashboard's example (the metric: logit[answer] - logit[wrong] after the prompt)
EXAMPLE = dict(
    positive=("She said that", "She was tired, and", "Then she told them that", "She looked at the door and"),
    negative=("He said that", "He was tired, and", "Then he told them that", "He looked at the door and"),
    prompt="When the doctor came in, the nurse said that",
    answer=" she",
    wrong=" he",
)
_UNITS = "value, clean, change: the metric's own units; added_norm: |coeff| x the vector's L2 norm"
_TOKENS_PER_FORWARD = 4096  # the steered copies of a batch run together up to about this many tokens


# --------------------------------------------------------------------------------------------
# arguments


def _layer(model: HookedSprout, layer, site: str) -> int:
    if site not in SITES:
        raise SteeringError(f"site={site!r}: steering adds to the residual stream, one of {SITES}")
    return check_index(layer, "layer", model.cfg.n_layers, negative=True, what="a block of this model, 0-indexed",
                       error=SteeringError)


def _vector(model: HookedSprout, vector) -> Tensor:
    v = torch.as_tensor(vector)
    if v.dim() != 1 or v.shape[0] != model.cfg.d_model or not v.dtype.is_floating_point:
        raise SteeringError(f"the steering vector must be floats of shape ({model.cfg.d_model},) (d_model), got "
                            f"{tuple(v.shape)} {v.dtype}")
    if not bool(torch.isfinite(v).all()):
        raise SteeringError("the steering vector holds NaN or infinity")
    return v.detach()


def _coeffs(coeffs, name: str = "coeffs") -> list[float]:
    """The multipliers as floats: one finite number or a list of them (a string such as ``"12"`` is no list of
    numbers, and a bool is no multiplier)."""
    return check_numbers(coeffs, name, what="multipliers of the steering vector; 0 is the unsteered model",
                         error=SteeringError)


def _coeff(coeff) -> float:
    """One multiplier as a float (a list, a string or a bool is not one)."""
    return check_number(coeff, "coeff", what="the multiplier of the steering vector; 0 is the unsteered model",
                        error=SteeringError)


def _positions(positions, T: int) -> Optional[list[int]]:
    """``positions`` as sorted 0-based indices into an input of ``T`` tokens (None: every position)."""
    if positions is None:
        return None
    if integer(positions) is None and not isinstance(positions, str) and hasattr(positions, "__len__") and len(positions) == 0:
        raise SteeringError("positions is empty: pass None to steer at every position")
    what = f"the input has {T} tokens: a position outside the input cannot be steered"
    return sorted(set(check_indices(positions, "positions", T, negative=True, what=what, error=SteeringError)))


def _read(x: Float[Tensor, "batch pos d_model"], mask: Optional[Tensor], read: str) -> Float[Tensor, "batch d_model"]:
    """Each row's stream at its last real token, or averaged over its real tokens."""
    B, T, _ = x.shape
    real = torch.ones(B, T, dtype=torch.bool, device=x.device) if mask is None else mask
    if read == "last":
        last = real.long().cumsum(1).argmax(1)  # the last True of each row (right padding)
        return x[torch.arange(B, device=x.device), last]
    w = real.to(x.dtype)[..., None]
    return (x * w).sum(1) / w.sum(1).clamp(min=1)


def _cache_upto(model: HookedSprout, toks: Tensor, names: list[str], last_layer: int) -> dict[str, Tensor]:
    """The activations at ``names`` (hooks of blocks up to ``last_layer``), running no block after that one."""
    upto = {"stop_at_layer": last_layer + 1} if last_layer + 1 < model.cfg.n_layers else {"return_type": None}
    with torch.no_grad():
        return model.run_with_cache(toks, names_filter=names, return_cache_object=False, **upto)[1]


def _streams(model: HookedSprout, texts, layers: list[int], site: str, read: str) -> dict[int, Tensor]:
    """The mean over ``texts`` (a text, a list of texts, or ids) of the stream at ``site`` of each of ``layers``."""
    if read not in READS:
        raise SteeringError(f"read={read!r}: one of {READS} (the last real token, or the mean over real tokens)")
    toks, mask = model.prepare_input(texts)
    cache = _cache_upto(model, toks, [act_name(site, l) for l in layers], max(layers))
    return {l: _read(cache[act_name(site, l)], mask, read).mean(0) for l in layers}


def _stream_norm(x: Tensor, mask: Optional[Tensor]) -> float:
    """The mean L2 norm of the stream over real tokens (the scale a steering vector is added to)."""
    n = x.float().norm(dim=-1)
    return float(n.mean() if mask is None else n[mask].mean())


# --------------------------------------------------------------------------------------------
# the vector and the hook


def steering_vector(
    model,
    positive,
    negative,
    layer: int,
    site: Site = "resid_pre",
    read: Read = "last",
) -> Float[Tensor, " d_model"]:
    """The mean stream at ``blocks.{layer}.hook_{site}`` over ``positive`` minus the same over ``negative``.

    Args:
        positive, negative: a text, a list of texts (right-padded; padding is never read) or token ids; the two
            need not be the same length or number.
        read: ``"last"`` reads each text's last real token (what the next token is predicted from), ``"mean"``
            averages over its real tokens.
    Returns:
        ``(d_model,)``, in the stream's units and dtype at that hook point, on the model's device.
    """
    model = as_hooked(model)
    layer = _layer(model, layer, site)
    with model.lock:
        pos, neg = _streams(model, positive, [layer], site, read), _streams(model, negative, [layer], site, read)
    return pos[layer] - neg[layer]


def _adder(vector: Tensor, coeff: float, positions: Optional[Sequence[int]]):
    def add(x: Tensor, hook=None) -> Tensor:
        v = (coeff * vector).to(device=x.device, dtype=x.dtype)
        if positions is None:
            return x + v
        keep = [p for p in positions if p < x.shape[1]]  # an input shorter than the positions: those it has
        out = x.clone()
        out[:, keep] += v
        return out
    return add


@contextmanager
def steered(
    model,
    vector,
    layer: int,
    coeff: Number = 1.0,
    site: Site = "resid_pre",
    positions: Optional[Sequence[int]] = None,
) -> Iterator[HookedSprout]:
    """Inside the block, every forward of ``model`` (generation and every function of the toolkit included) has
    ``coeff × vector`` added at ``blocks.{layer}.hook_{site}``: at every position, or only at ``positions``
    (0-based indices of each forward's input; those past its end are skipped). The hook is removed on exit,
    also when the block raises; the model's lock is held throughout. Yields the model."""
    model = as_hooked(model)
    layer = _layer(model, layer, site)
    v = _vector(model, vector)
    c = _coeff(coeff)
    if positions is not None:
        one = integer(positions) is not None or isinstance(positions, str) or not hasattr(positions, "__iter__")
        if any((integer(p) or 0) < 0 for p in ([positions] if one else positions)):
            raise SteeringError("steered() positions count from 0 in each forward's input; a negative position would "
                                "move with the input's length (generation): pass 0-based positions")
        positions = _positions(positions, model.cfg.n_ctx)
    with model.hooks(fwd_hooks=[(act_name(site, layer), _adder(v, c, positions))]):
        yield model


# --------------------------------------------------------------------------------------------
# effects


def _naive_values(model: HookedSprout, toks: Tensor, bound: BoundMetric, adds: Tensor, layer: int, site: str,
                  pos: Optional[list[int]]) -> list[float]:
    read = read_positions(bound, toks.shape[1])
    out = []
    for add in adds:
        with torch.no_grad():
            logits = model.run_with_hooks(toks, fwd_hooks=[(act_name(site, layer), _adder(add, 1.0, pos))])
        out.append(float(metric_from_read_logits(bound, logits[:, read], read)[0]))
    return out


def _fast_values(model: HookedSprout, resid: Tensor, bound: BoundMetric, adds: Tensor, start: int,
                 pos: Optional[list[int]]) -> list[float]:
    """The metric with each row of ``adds`` ``(G, d_model)`` added to the stream ``resid`` entering block ``start``
    (``n_layers``: the final stream), the rows batched."""
    L = model.cfg.n_layers
    B, T, C = resid.shape
    at = trimmed_positions(model, bound, T) if start < L else None
    per = max(1, _TOKENS_PER_FORWARD // max(1, B * T))
    sel = slice(None) if pos is None else pos
    out: list[float] = []
    with torch.no_grad():
        for i in range(0, adds.shape[0], per):
            group = adds[i : i + per].to(resid)
            G = group.shape[0]
            x = resid.repeat(G, 1, 1)
            x.view(G, B, T, C)[:, :, sel] += group[:, None, None, :]
            if start < L:
                stop = L if at is None else L - 1  # with `at`, the last block runs only where the metric reads
                if start < stop:
                    x = model(x, start_at_layer=start, stop_at_layer=stop)
                if at is not None:
                    x = model.run_block_at(L - 1, x, at)
            out.extend(metric_from_resid(model, bound, x, G, at))
    return out


def _measure(model: HookedSprout, input, adds: dict[int, Tensor], site: str, metric, positions, attention_mask,
             method: str) -> tuple[dict[int, tuple[list[float], float]], str, str]:
    """For each layer of ``adds``: (the metric unsteered and then with each row of ``adds[layer]`` added at that layer,
    the stream's mean norm there); the metric's name; the method used. The input's clean stream is run once, up to
    the last of the layers."""
    if method not in ("fast", "naive"):
        raise SteeringError(f"method={method!r}: 'fast' or 'naive'")
    toks, mask = model.prepare_input(input, attention_mask)
    pos = _positions(positions, toks.shape[1])
    bound = bind_metric(metric, toks, mask, model.cfg.d_vocab)
    names = {l: act_name(site, l) for l in adds}
    out = {}
    with model.lock:
        hooked = any(is_hooked(hp) for hp in model.hook_dict.values())
        cache = _cache_upto(model, toks, list(names.values()), max(adds))  # no block after the last one runs clean
        used = "naive" if method == "naive" or hooked else "fast"
        for l, rows in adds.items():
            # row 0: the unsteered model; a row of zeros (a coefficient of 0) adds nothing, so it is not run again:
            # it gets row 0's value
            nonzero = rows.any(-1).nonzero().flatten().tolist()
            run = torch.cat([torch.zeros_like(rows[:1]), rows[nonzero]])
            resid = cache[names[l]]
            if used == "fast":
                ran = _fast_values(model, resid, bound, run, l if site == "resid_pre" else l + 1, pos)
            else:
                ran = _naive_values(model, toks, bound, run, l, site, pos)
            values = [ran[0]] * (rows.shape[0] + 1)
            for j, i in enumerate(nonzero):
                values[i + 1] = ran[j + 1]
            out[l] = (values, _stream_norm(resid, mask))
    return out, bound.name, used


def _scaled(v: Tensor, coeffs: list[float]) -> Tensor:
    """``(len(coeffs), d_model)``: each coefficient times the vector, the rows :func:`_measure` adds."""
    return torch.tensor(coeffs, dtype=v.dtype, device=v.device)[:, None] * v


def _effect_frame(v: Tensor, coeffs: list[float], values: list[float], stream_norm: float, name: str,
                  **attrs) -> pd.DataFrame:
    """One row per coefficient from :func:`_measure`'s values (the first: the unsteered model)."""
    clean, norm = values[0], float(v.float().norm())
    df = pd.DataFrame({"coeff": coeffs, "metric": name, "value": values[1:], "clean": clean,
                       "change": [x - clean for x in values[1:]], "added_norm": [abs(c) * norm for c in coeffs],
                       "stream_norm": stream_norm})
    df.attrs.update(attrs, block=attrs["layer"] + 1, vector_norm=norm)
    df.attrs["units"] = _UNITS + "; stream_norm: the stream's mean L2 norm over real tokens at the steered hook, on this input"
    return df


def steering_effect(
    model,
    input,
    vector,
    layer: int,
    coeffs: Coeffs = DEFAULT_COEFFS,
    metric: MetricLike = "loss",
    site: Site = "resid_pre",
    positions: Optional[Sequence[int]] = None,
    attention_mask=None,
    method: Literal["fast", "naive"] = "fast",
) -> pd.DataFrame:
    """The metric on ``input`` with ``coeff × vector`` added at ``blocks.{layer}.hook_{site}``, for each coefficient.

    Args:
        input: a text, a list of texts (right-padded, with a mask) or token ids.
        vector: ``(d_model,)``, for example from :func:`steering_vector`.
        coeffs: the multipliers (0 gives the unsteered model).
        metric: any metric of :mod:`sprout_interp.circuits.metrics`, e.g. ``LogitDiff(she, he)``.
        positions: steer only these 0-based positions of the input (None: every position).
        method: ``"fast"`` (the blocks before ``layer`` run once, the coefficients batched) or ``"naive"`` (one
            hooked full forward per coefficient); the same numbers to float rounding. A hook of the user's own on
            the model makes ``"fast"`` run ``"naive"``, so that hook is honoured.
    Returns:
        A DataFrame, one row per coefficient: ``coeff, metric, value, clean`` (coefficient 0), ``change`` (value -
        clean), ``added_norm`` (``|coeff| × ‖vector‖``), ``stream_norm`` (the stream's mean norm there);
        ``attrs``: layer, block, site, method, units.
    """
    model = as_hooked(model)
    layer = _layer(model, layer, site)
    v = _vector(model, vector)
    cs = _coeffs(coeffs)
    measured, name, used = _measure(model, input, {layer: _scaled(v, cs)}, site, metric, positions, attention_mask,
                                    method)
    return _effect_frame(v, cs, *measured[layer], name, layer=layer, site=site, method=used)


def steering_layers(
    model,
    positive,
    negative,
    input,
    coeff: Number = 4.0,
    metric: MetricLike = "loss",
    site: Site = "resid_pre",
    read: Read = "last",
    positions: Optional[Sequence[int]] = None,
    layers: Optional[Sequence[int]] = None,
    method: Literal["fast", "naive"] = "fast",
) -> pd.DataFrame:
    """Where does the contrast steer? For each layer, :func:`steering_vector` of ``positive`` minus ``negative`` at
    that layer, added ``coeff`` times there, and the metric on ``input``.

    The stream grows block by block and each layer's vector is read from the stream at that layer, so one
    ``coeff`` is a comparable dose at every layer (``added_norm`` / ``stream_norm`` says how big).

    Returns:
        A DataFrame, one row per layer: ``layer, block, coeff, metric, value, clean, change, vector_norm,
        added_norm, stream_norm`` (units as :func:`steering_effect`'s).
    """
    model = as_hooked(model)
    L = model.cfg.n_layers
    layers = list(range(L)) if layers is None else [_layer(model, l, site) for l in layers]
    if not layers:
        raise SteeringError("layers is empty: pass None for every layer")
    c = _coeff(coeff)
    with model.lock:
        pos_m, neg_m = _streams(model, positive, layers, site, read), _streams(model, negative, layers, site, read)
        vectors = {l: pos_m[l] - neg_m[l] for l in layers}
        measured, name, used = _measure(model, input, {l: _scaled(v, [c]) for l, v in vectors.items()}, site, metric,
                                        positions, None, method)
    rows = [_effect_frame(vectors[l], [c], *measured[l], name, layer=l, site=site, method=used) for l in layers]
    rows = [df.assign(layer=l, block=l + 1, vector_norm=df.attrs["vector_norm"]) for l, df in zip(layers, rows)]
    out = pd.concat(rows, ignore_index=True)[["layer", "block", "coeff", "metric", "value", "clean", "change",
                                              "vector_norm", "added_norm", "stream_norm"]]
    out.attrs.update(site=site, read=read, units=rows[0].attrs["units"] + "; vector_norm: the L2 norm of that layer's "
                     "vector")
    return out


def steering_controls(
    model,
    input,
    vector,
    layer: int,
    coeff: Number = 4.0,
    metric: MetricLike = "loss",
    site: Site = "resid_pre",
    positions: Optional[Sequence[int]] = None,
    n: int = 8,
    seed: int = 0,
) -> pd.DataFrame:
    """The steering vector beside ``n`` random directions of its norm (uniform on the sphere, from ``seed``), each
    added ``coeff`` times at the same hook: the specificity check. A vector that carries a property moves its
    metric far more than random pushes of the same size, which mostly just add damage.

    Returns:
        A DataFrame, one row for the vector (``kind="steering"``, ``draw=-1``) then one per draw (``kind="random"``,
        ``draw`` 0..n-1): ``kind, draw, coeff, metric, value, clean, change, added_norm``; ``attrs``: layer, block,
        site, seed, and ``random_abs_change_max``, the largest ``|change|`` of the draws.
    """
    model = as_hooked(model)
    layer = _layer(model, layer, site)
    v = _vector(model, vector)
    n = check_count(n, "n", what="random directions drawn; at least one random direction", error=SteeringError)
    seed = check_count(seed, "seed", low=0, what="the random directions' seed", error=SteeringError)
    gen = torch.Generator().manual_seed(seed)
    draws = torch.randn(n, v.shape[0], generator=gen, dtype=torch.float64)
    draws = (draws / draws.norm(dim=1, keepdim=True) * float(v.float().norm())).to(v)
    c = _coeff(coeff)
    measured, name, _ = _measure(model, input, {layer: c * torch.cat([v[None], draws])}, site, metric, positions,
                                 None, "fast")
    values = measured[layer][0]
    out = pd.DataFrame({"kind": ["steering"] + ["random"] * n, "draw": list(range(-1, n)), "coeff": c, "metric": name,
                        "value": values[1:], "clean": values[0], "change": [x - values[0] for x in values[1:]],
                        "added_norm": abs(c) * float(v.float().norm())})
    out.attrs.update(layer=layer, block=layer + 1, site=site, seed=seed,
                     units=_UNITS,
                     random_abs_change_max=float(out["change"].iloc[1:].abs().max()))
    return out


def steered_generations(
    model,
    prompt: str,
    vector,
    layer: int,
    coeffs: Coeffs = (-4.0, 0.0, 4.0),
    site: Site = "resid_pre",
    positions: Optional[Sequence[int]] = None,
    max_new_tokens: int = 24,
    temperature: Number = 0.8,
    seed: int = 0,
) -> pd.DataFrame:
    """The continuation of ``prompt`` under each coefficient, sampled with the same ``seed`` (so the coefficient
    is the only difference; coefficient 0 is the model's own sample).

    Returns:
        A DataFrame ``coeff, continuation`` (the new text only), one row per coefficient; ``attrs``: layer,
        block, site, prompt, seed, temperature.
    """
    model = as_hooked(model)
    layer = _layer(model, layer, site)
    v = _vector(model, vector)
    cs = _coeffs(coeffs)
    if not isinstance(prompt, str) or not prompt:
        raise SteeringError("prompt must be a non-empty text")
    n_prompt = len(model.to_str_tokens(prompt))
    texts = []
    for c in cs:
        with steered(model, v, layer, c, site, positions):
            ids = model.generate(model.to_tokens(prompt), max_new_tokens=max_new_tokens, temperature=temperature,
                                 seed=seed)
        texts.append(model.to_string(ids[0, n_prompt:]))
    df = pd.DataFrame({"coeff": cs, "continuation": texts})
    df.attrs.update(layer=layer, block=layer + 1, site=site, prompt=prompt, seed=seed, temperature=temperature)
    return df

