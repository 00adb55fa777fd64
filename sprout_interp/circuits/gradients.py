"""The gradient of a metric at hook points: what every first-order (attribution) estimate is built from.

:func:`metric_gradients` runs one forward and one backward pass and returns, for each named hook point, the
activation and the metric's total derivative with respect to it (through everything after it, including the
later hook points). Attribution patching (``patching.attribution_patch``) and the attribution estimate of head
ablations (``ablation.attribution_sweep``) are both ``Σ (new activation − activation) · gradient`` over a slice.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

import torch
from jaxtyping import Int
from torch import Tensor

from sprout_interp.circuits.metrics import BoundMetric
from sprout_interp.core.errors import MetricError
from sprout_interp.core.hooked import HookedSprout

__all__ = ["metric_gradients"]


def metric_gradients(
    model: HookedSprout, tokens: Int[Tensor, "batch pos"], names: Sequence[str], bound: BoundMetric,
    frozen: Optional[Mapping[str, Sequence[int]]] = None,
) -> tuple[float, dict[str, Tensor], dict[str, Tensor]]:
    """One forward of ``tokens`` and one backward of ``bound``'s metric.

    Each named activation gets a zero leaf added (``act + 0``), so the forward is unchanged and the leaf's
    gradient is the metric's derivative with respect to that activation with every other path left in place.
    ``frozen`` maps some of the names to heads (dim 2 of a ``(batch, pos, head, d_head)`` activation) whose slice
    is cut from what comes before it: no derivative flows back through those heads' inputs, as when path
    patching recomputes a receiver's input and the rest of the model cannot reach it.

    Returns:
        ``(value, acts, grads)``: the metric on the unpatched run (its own units), and per hook name the
        activation (detached) and the gradient of the metric with respect to it (same shape; zeros where the
        metric does not depend on it).

    Raises:
        MetricError: the metric is not a differentiable scalar of the logits.
    """
    leaves: dict[str, tuple[Tensor, Tensor]] = {}

    frozen = frozen or {}

    def open_up(act: Tensor, hook) -> Tensor:
        leaf = torch.zeros_like(act, requires_grad=True)
        leaves[hook.name] = (act.detach(), leaf)
        heads = list(frozen.get(hook.name, ()))
        if heads:
            cut = torch.zeros(act.shape[2], dtype=torch.bool, device=act.device)
            cut[heads] = True
            act = torch.where(cut[:, None], act.detach(), act)
        return act + leaf

    with torch.enable_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(n, open_up) for n in names])
        value = bound.from_logits(logits)
        if value.numel() != 1 or not value.requires_grad:
            raise MetricError(
                f"the {bound.name} is not a differentiable scalar of the logits: a first-order estimate needs its "
                "gradient, so a function of the logits must return one tensor computed from them (no .item(), "
                "float() or numpy inside)"
            )
        grads = torch.autograd.grad(value.reshape(()), [leaves[n][1] for n in names], allow_unused=True)
    acts = {n: leaves[n][0] for n in names}
    return float(value.detach()), acts, {
        n: (torch.zeros_like(acts[n]) if g is None else g) for n, g in zip(names, grads)}
