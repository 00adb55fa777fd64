"""From a config and a state dict to a model: the config's types and ranges first, then the shapes it implies,
then the weights themselves (plain dense arrays that store every value they show, floating point, finite,
``head.weight`` tied to the embedding).

A config may be partial or absent: what it leaves out is read off the tensor shapes (``context`` and
``rope_base`` are not visible in them and default to 512 and 10000). Everything is checked before the model is
allocated; a failure is :class:`~sprout_interp.core.errors.InvalidConfigError`,
:class:`~sprout_interp.core.errors.StateDictMismatchError` or :class:`~sprout_interp.core.errors.InvalidWeightsError`.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch

from sprout_interp.core import limits
from sprout_interp.core.errors import InvalidConfigError, InvalidWeightsError, StateDictMismatchError
from sprout_model.checkpoint import TIED
from sprout_model.model import GPT, Config, rope_tables

__all__ = ["validate_config", "expected_shapes", "strip_prefixes", "infer_config", "plan_config", "build_model",
           "describe_config", "not_float", "few_keys", "check_tensors", "check_finite", "check_weights",
           "check_runs", "DEFAULT_CONTEXT",
           "DEFAULT_ROPE_BASE", "PREFIXES"]

DEFAULT_CONTEXT = 512
DEFAULT_ROPE_BASE = 10000.0
PREFIXES = ("_orig_mod.", "module.")


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return f"{str(v).lower()} (a boolean)"
    if isinstance(v, str):
        return f"the text {v[:40]!r}"
    if isinstance(v, (int, float)):
        return f"{v:,}" if isinstance(v, int) and abs(v) < 10 ** 30 else repr(v)[:40]
    return f"a {type(v).__name__}"


def validate_config(cfg: Mapping[str, Any], source: str = "the config") -> dict[str, Any]:
    """The config's known fields, checked: whole numbers from 1 to their bound in :data:`limits.LIMITS`, ``d_model``
    a multiple of ``n_head`` with an even head width, ``rope_base`` (and ``eps`` if given) finite and positive.

    Returns the Config fields found (``rope_base`` as a float). Raises :class:`InvalidConfigError`.
    """
    out: dict[str, Any] = {}
    example = Config().to_dict()
    for k, top in limits.LIMITS.items():
        if k not in cfg:
            continue
        v = cfg[k]
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidConfigError(
                f"{k} in {source} is {_show(v)}; it must be a whole number from 1 to {top:,} (such as {example[k]}). "
                "Fix the config, or drop the entry to have it read off the weights"
            )
        if not 1 <= v <= top:
            raise InvalidConfigError(
                f"{k} in {source} is {_show(v)}; it must be from 1 to {top:,} (Sprout's is {example[k]}). Fix the "
                "config, or drop the entry to have it read off the weights"
            )
        out[k] = v
    for k in ("rope_base", "eps"):
        if k not in cfg:
            continue
        v = cfg[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise InvalidConfigError(
                f"{k} in {source} is {_show(v)}; it must be a finite number above 0 (Sprout's "
                f"{k} is {example.get(k, 1e-6)}). Fix the config, or drop the entry for the default"
            )
        if k == "rope_base":
            out[k] = float(v)
    if "d_model" in out and "n_head" in out:
        d, h = out["d_model"], out["n_head"]
        if d % h:
            raise InvalidConfigError(f"d_model {d} in {source} is not a multiple of n_head {h}; every head needs the same width")
        if (d // h) % 2:
            raise InvalidConfigError(
                f"the head width d_model / n_head = {d} / {h} = {d // h} in {source} is odd; RoPE rotates pairs of "
                "coordinates, so it must be even"
            )
    return out


def _model_bytes(cfg: Config) -> int:
    """float32 bytes of the model's parameters and RoPE tables, computed without building it."""
    d, f, hd = cfg.d_model, cfg.d_ff, cfg.d_model // cfg.n_head
    params = cfg.vocab_size * d + d + cfg.n_layer * (4 * d * d + 2 * hd + 2 * d + 3 * d * f)
    return 4 * (params + cfg.context * hd)


def expected_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """The state-dict shapes of ``GPT(cfg)``, computed without building it (``head.weight`` included)."""
    d, f, hd, v = cfg.d_model, cfg.d_ff, cfg.d_model // cfg.n_head, cfg.vocab_size
    out: dict[str, tuple[int, ...]] = {"embed.weight": (v, d)}
    for i in range(cfg.n_layer):
        p = f"blocks.{i}."
        out.update({p + "norm1.weight": (d,), p + "attn.qkv.weight": (3 * d, d), p + "attn.proj.weight": (d, d),
                    p + "attn.q_norm.weight": (hd,), p + "attn.k_norm.weight": (hd,), p + "norm2.weight": (d,),
                    p + "ffn.w1.weight": (f, d), p + "ffn.w3.weight": (f, d), p + "ffn.w2.weight": (d, f)})
    out["norm.weight"] = (d,)
    out[TIED] = (v, d)
    return out


def strip_prefixes(sd: Mapping[str, Any]) -> dict[str, Any]:
    """Keys without ``_orig_mod.`` (torch.compile) and ``module.`` (DDP) prefixes, in any combination.

    Raises :class:`StateDictMismatchError` when two keys name the same weight once stripped (``x`` and
    ``module.x``): which of the two is meant cannot be known, so neither is dropped silently.
    """
    out: dict[str, Any] = {}
    first: dict[str, str] = {}
    for key, v in sd.items():
        k = str(key)
        while k.startswith(PREFIXES):
            k = k[len(next(p for p in PREFIXES if k.startswith(p))):]
        if k in first:
            raise StateDictMismatchError(
                f"the weights hold both {first[k][:80]!r} and {str(key)[:80]!r}, which name the same weight {k[:80]!r} once "
                f"the {' / '.join(PREFIXES)} prefixes (torch.compile, DDP) are stripped; which one is meant cannot be told. "
                "Save one copy of the weights: torch.save(model.state_dict(), path) from the unwrapped model"
            )
        first[k] = str(key)
        out[k] = v
    return out


def few_keys(keys: list[str]) -> str:
    """A few of ``keys`` for a message, long ones shortened, with how many more there are."""
    keys = [k if len(k) <= 80 else k[:77] + "..." for k in keys[:limits.SHOW]] + keys[limits.SHOW:]
    return ", ".join(keys[:limits.SHOW]) + (f" (and {len(keys) - limits.SHOW} more)" if len(keys) > limits.SHOW else "")


def _infer(shapes: Mapping[str, tuple[int, ...]], context: int, rope_base: float) -> Config:
    needed = ["embed.weight", "blocks.0.attn.q_norm.weight", "blocks.0.ffn.w1.weight"]
    missing = [k for k in needed if k not in shapes]
    if missing:
        raise StateDictMismatchError(
            f"cannot read the model's shape: the weights lack {few_keys(missing)} (found keys such as "
            f"{few_keys(sorted(shapes)) or 'none'}). This is not a Sprout/course GPT state dict, or its keys are renamed"
        )
    for k, dims in zip(needed, (2, 1, 2)):
        if len(shapes[k]) != dims:
            raise StateDictMismatchError(f"{k} has shape {tuple(shapes[k])}, not the {dims}-D shape of a Sprout weight")
    vocab_size, d_model = shapes["embed.weight"]
    head_dim = math.prod(shapes["blocks.0.attn.q_norm.weight"])
    if head_dim == 0 or d_model % head_dim:
        raise StateDictMismatchError(
            f"d_model {d_model} (from embed.weight) is not a multiple of the head size {head_dim} "
            "(from blocks.0.attn.q_norm.weight), so the head count cannot be inferred; pass a config"
        )
    n_layer = 1 + max(int(m.group(1)) for k in shapes if (m := re.match(r"blocks\.(\d{1,6})\.", k)))
    return Config(
        vocab_size=int(vocab_size), context=context, n_layer=n_layer, n_head=d_model // head_dim,
        d_model=int(d_model), d_ff=int(shapes["blocks.0.ffn.w1.weight"][0]), rope_base=rope_base,
    )


def infer_config(sd: Mapping[str, torch.Tensor], context: int = DEFAULT_CONTEXT, rope_base: float = DEFAULT_ROPE_BASE) -> Config:
    """The Config a Sprout state dict was built with, read off its shapes (context and rope_base are not in them)."""
    return _infer({k: tuple(v.shape) for k, v in sd.items()}, context, rope_base)


def plan_config(shapes: Mapping[str, tuple[int, ...]], cfg: Mapping[str, Any] | Config | None = None,
                source: str = "the weights") -> Config:
    """The Config of the model the tensors of these ``shapes`` fit, checked, before anything is allocated.

    ``cfg`` fields that are present win (after :func:`validate_config`); the others are inferred from
    the shapes. The tied ``head.weight`` may be absent. Raises :class:`InvalidConfigError` for a config
    out of range and :class:`StateDictMismatchError` for shapes that do not fit it.
    """
    cfg = cfg.to_dict() if isinstance(cfg, Config) else dict(cfg or {})
    label = f"the config of {source}"
    given = validate_config(cfg, label)
    if {"vocab_size", "d_model", "n_layer", "n_head", "d_ff"} <= set(given):
        config = Config.from_dict(given)  # a full config: a wrong one shows up as a shape mismatch below
    else:
        config = Config.from_dict({**_infer(shapes, DEFAULT_CONTEXT, DEFAULT_ROPE_BASE).to_dict(), **given})
        validate_config(config.to_dict(), f"{label} (read off the weights where the config is silent)")
    if _model_bytes(config) > limits.MAX_MODEL_BYTES:
        raise InvalidConfigError(
            f"{label} describes a model of {_model_bytes(config) / 2**30:,.1f} GiB in float32 ({describe_config(config)}, "
            f"context {config.context:,}), more than the loader builds ({limits.MAX_MODEL_BYTES / 2**30:.0f} GiB); this is "
            "not a Sprout-sized model. Check the config"
        )
    shapes = dict(shapes)
    if TIED not in shapes and "embed.weight" in shapes:
        shapes[TIED] = shapes["embed.weight"]  # stored once; tied again on load
    expected = expected_shapes(config)
    missing = [k for k in expected if k not in shapes]
    unexpected = [k for k in shapes if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} key(s): {few_keys(missing)}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} key(s): {few_keys(unexpected)}")
        raise StateDictMismatchError(
            f"the weights in {source} do not fit a Sprout model with {describe_config(config)}: {'; '.join(parts)}. "
            "Check that the file holds a Sprout/course GPT state dict and that its config matches the weights"
        )
    bad = [(k, tuple(shapes[k]), want) for k, want in expected.items() if tuple(shapes[k]) != want]
    if bad:
        k, got, want = bad[0]
        more = f" (and {len(bad) - 1} more mismatched tensors)" if len(bad) > 1 else ""
        raise StateDictMismatchError(
            f"shape mismatch in {source}: {k} has shape {got} in the file but {want} in a Sprout model with "
            f"{describe_config(config)}{more}. The config does not match the weights: fix config.json (or the 'config' "
            "entry), or drop it to have the shapes inferred"
        )
    return config


_DTYPE_NAMES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32",
                "U32": "uint32", "I64": "int64", "U64": "uint64", "C64": "complex64", "C128": "complex128"}


def not_float(key: str, dtype: Any, source: str) -> InvalidWeightsError:
    """The error for a tensor that is not floating point (``dtype`` a torch dtype or a safetensors dtype name)."""
    name = _DTYPE_NAMES.get(str(dtype), str(dtype).replace("torch.", ""))
    return InvalidWeightsError(
        f"{key[:80]} in {source} holds {name} values; Sprout's weights are floating point "
        "(float32, float16 or bfloat16). Save the model's own state_dict(), not a quantised or converted copy"
    )


def check_tensors(sd: Mapping[str, torch.Tensor], source: str, ties: Mapping[str, str] | None = None) -> None:
    """Refuse, with :class:`InvalidWeightsError`, tensors that are not plain dense floating-point arrays storing
    every value they show; reads shapes, strides and storage sizes only, so it allocates nothing.

    Refused: meta tensors (a shape, no values), sparse or nested tensors, non-floating-point dtypes, and views
    that show more values than are stored: a zero stride (``expand``, ``as_strided``), a view larger than its
    storage, or tensors sharing stored values. Such a view costs nothing in the file but its full size once
    copied into a model, so without this check a file of a few KB asks for gigabytes: the bytes all tensors show
    may not exceed the bytes their storages hold. ``ties`` maps a key to the key it may share its values with
    (``{"head.weight": "embed.weight"}``: one tensor saved under two names), counted once when it does.
    """
    ties = dict(ties or {})
    stored: dict[int, int] = {}  # storage address -> bytes it holds
    views: dict[str, tuple] = {}  # key -> (storage address, offset, shape, strides)
    shows: dict[str, int] = {}  # key -> bytes it shows
    for k, v in sd.items():
        where = f"{str(k)[:80]} in {source}"
        if v.is_meta:
            raise InvalidWeightsError(
                f"{where} is a meta tensor: it has a shape but no values (a model built on the meta device and "
                "saved before its weights were loaded). Save the trained model's state_dict()"
            )
        if v.is_nested or v.layout != torch.strided:
            kind = "nested" if v.is_nested else str(v.layout).replace("torch.", "")
            raise InvalidWeightsError(
                f"{where} is a {kind} tensor; Sprout's weights are dense arrays. Save the model's own state_dict(), "
                "or convert the tensor with .to_dense()"
            )
        if not v.is_floating_point():
            raise not_float(str(k), v.dtype, source)
        size, store = v.element_size(), v.untyped_storage()
        have, need = store.nbytes() - v.storage_offset() * size, v.numel() * size
        if need > have or any(st == 0 and n > 1 for n, st in zip(v.shape, v.stride())):
            raise InvalidWeightsError(
                f"{where} has shape {tuple(v.shape)} ({v.numel():,} values, {need / 2**20:,.1f} MiB) but is a view "
                f"of {max(have, 0) // size:,} stored value(s) (strides {tuple(v.stride())}): it repeats values "
                "(expand, as_strided, a zero stride), which would cost its full size in memory though the file holds "
                "a fraction of it. Sprout's weights store every value: save the model's own state_dict()"
            )
        views[str(k)] = (store.data_ptr(), v.storage_offset(), tuple(v.shape), tuple(v.stride()))
        shows[str(k)] = need
        stored[store.data_ptr()] = store.nbytes()
    shown = sum(n for k, n in shows.items() if views.get(ties.get(k, "")) != views[k])  # a tie counted once
    if shown > sum(stored.values()):
        per_storage = Counter(view[0] for view in views.values())
        shared = [k for k, view in views.items() if per_storage[view[0]] > 1]
        raise InvalidWeightsError(
            f"the tensors in {source} show {shown / 2**20:,.1f} MiB of values but store "
            f"{sum(stored.values()) / 2**20:,.1f} MiB: {few_keys(shared)} are views of the same stored values, which "
            "would each cost their full size in memory. Sprout's weights store each tensor's own values: save the "
            "model's own state_dict()"
        )


def check_finite(sd: Mapping[str, torch.Tensor], source: str) -> None:
    """Refuse, with :class:`InvalidWeightsError`, tensors holding NaN or infinite values (one bool tensor of a
    tensor's size is allocated at a time)."""
    for k, v in sd.items():
        if not torch.isfinite(v).all():
            n = int((~torch.isfinite(v)).sum())
            raise InvalidWeightsError(
                f"{str(k)[:80]} in {source} holds {n:,} NaN or infinite value(s); with them every result computed "
                "from these weights is meaningless. Use an earlier save, from before training diverged"
            )


def check_weights(sd: Mapping[str, torch.Tensor], source: str) -> None:
    """Refuse, with :class:`InvalidWeightsError`, weights that cannot run in float32: NaN or infinite values
    (:func:`check_finite`), or a finite value larger in size than ``limits.MAX_WEIGHT_ABS`` (1e4; see there why),
    which overflows float32 once multiplied and summed. The one check of weight values for checkpoints, tuned
    lenses, SAEs and transcoders."""
    check_finite(sd, source)
    bound = limits.MAX_WEIGHT_ABS
    for k, v in sd.items():
        if v.numel() and v.is_floating_point():
            big = float(v.detach().abs().max())
            if big > bound:
                raise InvalidWeightsError(
                    f"{str(k)[:80]} in {source} holds a value of size {big:.3g}, outside the range |w| <= {bound:g} "
                    "that a weight must keep to run in float32 without overflow (trained weights are of order 1; "
                    "sprout_interp.core.limits.MAX_WEIGHT_ABS sets the bound). These weights are damaged or not "
                    "trained: use an earlier save")


@torch.no_grad()
def check_runs(model: GPT, source: str) -> None:
    """Refuse, with :class:`InvalidWeightsError`, a model whose forward pass on a probe input (token ids 0..15,
    or the whole vocabulary if smaller) gives a NaN or infinite logit: weights each within bounds whose products
    still overflow float32 through the depth of the model."""
    n = min(16, model.cfg.vocab_size, model.cfg.context)
    logits, _ = model(torch.arange(n, device=next(model.parameters()).device)[None])
    if not bool(torch.isfinite(logits).all()):
        raise InvalidWeightsError(
            f"the model in {source} gives NaN or infinite logits on the probe input (token ids 0..{n - 1}): its "
            "weights overflow float32 in the forward pass (every logit must be finite). They are damaged or not "
            "trained: use an earlier save")


def _empty_gpt(config: Config) -> GPT:
    """A GPT of ``config`` whose parameters are uninitialised (the weights loaded next replace every one) and whose
    rotation tables are computed: built on the meta device, so the random initialisation of its 17M parameters,
    most of a checkpoint's load time, is skipped. A GPT with buffers other than the rotation tables is built the
    ordinary way."""
    with torch.device("meta"):
        model = GPT(config)
    if {n for n, _ in model.named_buffers()} != {"cos", "sin"}:
        return GPT(config)
    model.to_empty(device="cpu")
    model.head.weight = model.embed.weight  # to_empty makes a tensor per module: tie them again, as GPT does
    cos, sin = rope_tables(config.head_dim, config.context, config.rope_base)
    model.cos.copy_(cos)
    model.sin.copy_(sin)
    return model


def build_model(sd: Mapping[str, Any], cfg: Mapping[str, Any] | Config | None = None, source: str = "the weights") -> GPT:
    """A float32 eval-mode GPT holding ``sd`` (prefixes stripped, ``head.weight`` tied), checked key by key.

    ``cfg`` fields that are present win; the others are inferred from the shapes. Everything is checked
    before the model is built (:func:`check_tensors`, then :func:`plan_config`); the weights must be finite
    floating-point numbers that the file stores, each within ``limits.MAX_WEIGHT_ABS`` (:func:`check_weights`), and
    the model's logits on a probe input finite (:func:`check_runs`).
    """
    sd = {k: v for k, v in strip_prefixes(sd).items() if isinstance(v, torch.Tensor)}
    check_tensors(sd, source, ties={TIED: "embed.weight"})
    config = plan_config({k: tuple(v.shape) for k, v in sd.items()}, cfg, source)
    if TIED in sd and "embed.weight" in sd and not torch.equal(sd[TIED], sd["embed.weight"]):
        raise StateDictMismatchError(
            f"head.weight differs from embed.weight in {source}: these weights were trained without weight "
            "tying, but Sprout's output matrix is its embedding (one tensor). They cannot be loaded unchanged"
        )
    sd.setdefault(TIED, sd["embed.weight"])
    sd = {k: v.float() for k, v in sd.items()}
    check_weights(sd, source)
    model = _empty_gpt(config)
    if not (torch.isfinite(model.cos).all() and torch.isfinite(model.sin).all()):
        raise InvalidConfigError(
            f"rope_base {config.rope_base!r} in the config of {source} gives non-finite rotation angles; use a "
            "value such as 10000"
        )
    model.load_state_dict(sd, strict=True)
    model = model.float().eval()
    check_runs(model, source)
    return model


def describe_config(cfg: Config) -> str:
    """The config's shape fields as one line, for messages."""
    return (f"vocab_size={cfg.vocab_size}, n_layer={cfg.n_layer}, n_head={cfg.n_head}, "
            f"d_model={cfg.d_model}, d_ff={cfg.d_ff}")
