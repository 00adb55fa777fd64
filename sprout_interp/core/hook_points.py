"""Hook points that check what a hook returns, hook names, and the messages for a name that is not one.

``act_name`` is TransformerLens's ``get_act_name`` (``act_name("z", 3)`` -> ``"blocks.3.attn.hook_z"``), the one
place hook names are built from a short name and a layer; every module of the package uses it.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal, Optional, Union

import torch.nn as nn
from jaxtyping import Float
from torch import Tensor
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_act_name

from sprout_interp.core.errors import (
    HookOutputError,
)

__all__ = ["CheckedHookPoint", "hook_point", "heads_hook", "is_hooked", "act_name", "unknown_name_message", "HookFn", "HookList"]

HookFn = Callable[..., Any]
HookList = Sequence[tuple[Union[str, Callable[[str], bool]], HookFn]]


class CheckedHookPoint(HookPoint):
    """A HookPoint whose forward hooks must return ``None`` or a tensor of the activation's shape and dtype.

    PyTorch would broadcast a wrong-shaped replacement (one head's pattern for three) or silently
    shorten the output (a ``hook_embed`` hook returning fewer positions); here such a hook raises
    :class:`HookOutputError` naming the hook point, the expected and the returned shape.
    """

    def add_hook(self, hook, dir: Literal["fwd", "bwd"] = "fwd", *args: Any, **kwargs: Any):
        """TransformerLens's ``add_hook``, with forward hooks wrapped so that a wrong shape or dtype raises."""
        if dir == "fwd":
            hook = _checked(hook)
        return super().add_hook(hook, dir, *args, **kwargs)


def _checked(fn: HookFn) -> HookFn:
    def checked(act: Tensor, hook: HookPoint) -> Optional[Tensor]:
        out = fn(act, hook=hook)
        if out is None or out is act:
            return out
        if not isinstance(out, Tensor):
            raise HookOutputError(
                f"the hook on {hook.name!r} returned a {type(out).__name__}; return None or a tensor of shape "
                f"{tuple(act.shape)} ({act.dtype})"
            )
        if out.shape != act.shape or out.dtype != act.dtype:
            raise HookOutputError(
                f"the hook on {hook.name!r} returned shape {tuple(out.shape)} ({out.dtype}) where the activation "
                f"has shape {tuple(act.shape)} ({act.dtype}); a hook must return the activation's shape and dtype"
            )
        return out

    checked.__wrapped__ = fn  # type: ignore[attr-defined]
    return checked


def hook_point(pos_dim: Optional[int]) -> HookPoint:
    """A shape-checked HookPoint that knows which axis of its activation is the (query) position."""
    hp = CheckedHookPoint()
    hp.pos_dim = pos_dim
    return hp


def is_hooked(module: nn.Module) -> bool:
    """Whether anything (TransformerLens or plain PyTorch) has registered a hook on ``module``."""
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or getattr(module, "_backward_pre_hooks", None)
    )


def heads_hook(hp: HookPoint, x: Float[Tensor, "batch head pos d_head"]) -> Float[Tensor, "batch head pos d_head"]:
    """Fire ``hp`` on a per-head activation kept as (batch, head, pos, d_head), showing it as (batch, pos, head, d_head).

    The transposes are views, so with no hook this costs nothing, and an in-place edit of the view
    the hook receives edits the activation.
    """
    return hp(x.transpose(1, 2)).transpose(1, 2)

def unknown_name_message(name: str, valid: Sequence[str], n_layers: Optional[int]) -> str:
    """The message for a hook name that is not one: the block range and the closest valid names."""
    msg = f"unknown hook name {name!r}"
    suggestions: list[str] = []
    m = re.match(r"^blocks\.(-?\d+)\.(.+)$", name)
    if m and n_layers is not None and not 0 <= int(m.group(1)) < n_layers:
        msg += f"; this model has {n_layers} blocks, numbered 0 to {n_layers - 1} in code (the chapter counts from 1)"
        cand = f"blocks.{n_layers - 1}.{m.group(2)}"
        if cand in valid:
            suggestions.append(cand)
    for c in difflib.get_close_matches(name, list(valid), n=5, cutoff=0.6):
        if c not in suggestions:
            suggestions.append(c)
    if suggestions:
        msg += ". Closest valid names: " + ", ".join(suggestions[:5])
    return msg + ". model.hook_dict.keys() lists every hook point."



def act_name(name: str, layer: Optional[int] = None, layer_type: Optional[str] = None) -> str:
    """The full hook name for a short name and a 0-indexed layer, as TransformerLens's ``get_act_name``:
    ``act_name("resid_post", 3)`` -> ``"blocks.3.hook_resid_post"``, ``act_name("z", 0)`` ->
    ``"blocks.0.attn.hook_z"``, ``act_name("rot_k", 1)`` -> ``"blocks.1.attn.hook_rot_k"``, ``act_name("embed")`` ->
    ``"hook_embed"``. A full name is returned unchanged.

    >>> act_name("z", 3)
    'blocks.3.attn.hook_z'
    >>> act_name("pre", 0)
    'blocks.0.mlp.hook_pre'
    >>> act_name("blocks.1.hook_resid_post")
    'blocks.1.hook_resid_post'
    """
    if "." in name or name.startswith("hook_"):
        return name
    return get_act_name(name, layer, layer_type)
