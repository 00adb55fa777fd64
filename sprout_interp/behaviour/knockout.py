"""Block knockouts: how much the loss rises when whole blocks stop writing to the residual stream.

A block is knocked out by zeroing both things it adds to the stream, ``blocks.{l}.hook_attn_out`` and
``blocks.{l}.hook_mlp_out``: the stream then passes through it unchanged, as if it were not there.
It answers "does this block do anything?" (for instance, Sprout's blocks grown from a gpt-4) with one
number per block, in nats, from exact forwards. Head-level knockouts are in :mod:`sprout_interp.circuits.ablation`.

The default ``method="fast"`` is exact too: a knocked-out block passes its input on unchanged (x + 0 is x), so
each group's run starts from the clean stream entering its first block (kept from the clean run) instead of
running the blocks before it again; on Sprout (8 blocks) that is 36 block runs instead of 72.

Layers are 0-indexed in code; tables also carry ``blocks`` counted from 1, as the chapter does.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Optional, Union

import pandas as pd
import torch
from jaxtyping import Bool
from torch import Tensor

from sprout_interp.core.arguments import check_indices
from sprout_interp.core.errors import AblationError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout, as_hooked, is_hooked
from sprout_interp.core.tokens import ModelInput

__all__ = [
    "block_knockout",
]

Group = Union[int, Sequence[int]]


def _zero(x: Tensor, hook) -> Tensor:
    return torch.zeros_like(x)


def _label(layers: Sequence[int]) -> str:
    """Blocks counted from 1: "4", "5-8" for a run, "2, 5" otherwise."""
    b = [l + 1 for l in layers]
    if len(b) > 1 and b == list(range(b[0], b[-1] + 1)):
        return f"{b[0]}-{b[-1]}"
    return ", ".join(str(x) for x in b)


def _check_groups(model: HookedSprout, groups: Optional[Sequence[Group]]) -> list[list[int]]:
    L = model.cfg.n_layers
    if groups is None:
        return [[l] for l in range(L)]
    what = f"a group of blocks is a layer or a list of layers, 0-indexed as in code (0..{L - 1}: the chapter's blocks 1..{L})"
    if isinstance(groups, (str, bytes)) or not hasattr(groups, "__iter__"):
        raise AblationError(f"groups={groups!r} is not a list of groups: {what}")
    return [sorted(set(check_indices(g, "groups", L, what=what, error=AblationError))) for g in groups]


@torch.no_grad()
def block_knockout(
    model,
    tokens: ModelInput,
    groups: Optional[Sequence[Group]] = None,
    attention_mask: Optional[Bool[Tensor, "batch pos"]] = None,
    method: Literal["fast", "naive"] = "fast",
) -> pd.DataFrame:
    """Mean next-token loss with each group of blocks knocked out (attention and feed-forward outputs zeroed).

    Args:
        tokens: token ids ``(batch, pos)`` (or ``(pos,)``), a text or a list of texts (right-padded).
        groups: the blocks knocked out together, one run per group, each a layer or a list of layers
            (0-indexed); default: every block alone.
        attention_mask: True at real tokens (right padding); padded targets are not counted.
        method: ``"fast"`` (default) starts each run at its group's first block from the clean stream there, which
            is exact (the blocks before it see nothing of the knockout); the naive way is used when a hook is
            attached to the model, which the skipped blocks would otherwise not run. ``"naive"``: one full forward
            per group.

    Returns:
        DataFrame ``layers`` (0-indexed, as a tuple), ``blocks`` (counted from 1, "5-8"), ``loss``
        (nats, mean over real targets, the group knocked out), ``clean`` (nats) and ``change``
        (= loss − clean, nats: what the blocks were worth).
    """
    model = as_hooked(model)
    toks, attention_mask = as_hooked(model).prepare_input(tokens, attention_mask)
    if toks.shape[1] < 2:
        raise AblationError("a next-token loss needs at least 2 tokens per row")
    groups = _check_groups(model, groups)
    if method not in ("fast", "naive"):
        raise AblationError(f"method must be 'fast' or 'naive', got {method!r}")
    rows = []
    with model.lock:  # the stream kept from the clean run must be this model's, unchanged until the last run
        # the hook check under the lock too: another thread's hooks, attached only for its own run, are not ours
        if method == "fast" and any(is_hooked(mod) for mod in model.modules()):
            method = "naive"  # a hook inside a knocked-out block must still run, as it does in the naive forward
        if method == "fast":
            names = [act_name("resid_pre", l) for l in sorted({g[0] for g in groups})]
            clean, cache = model.run_with_cache(toks, return_type="loss", attention_mask=attention_mask,
                                                names_filter=names, return_cache_object=False)
            clean = float(clean)
        else:
            clean = float(model(toks, return_type="loss", attention_mask=attention_mask))
        for layers in groups:
            if method == "fast":  # the first block passes its input on: start after it, from the clean stream
                first = layers[0]
                rest = [(f"blocks.{l}.{name}", _zero) for l in layers[1:] for name in ("hook_attn_out", "hook_mlp_out")]
                loss = model.run_with_hooks(cache[act_name("resid_pre", first)], start_at_layer=first + 1,
                                            tokens=toks, return_type="loss", attention_mask=attention_mask,
                                            fwd_hooks=rest)
            else:
                hooks = [(f"blocks.{l}.{name}", _zero) for l in layers for name in ("hook_attn_out", "hook_mlp_out")]
                loss = model.run_with_hooks(toks, return_type="loss", attention_mask=attention_mask, fwd_hooks=hooks)
            loss = float(loss)
            rows.append(dict(layers=tuple(layers), blocks=_label(layers), loss=loss, clean=clean, change=loss - clean))
    df = pd.DataFrame(rows)
    df.attrs.update(units="nats", method=method,
                    convention="layers 0-indexed as in code; blocks counted from 1 as the chapter")
    return df
