"""The two runs every patch compares, shared by activation patching (:mod:`~sprout_interp.circuits.patching`) and
path patching (:mod:`~sprout_interp.circuits.path_patching`): the inputs checked to one length, the metric bound
through the protocol of :mod:`~sprout_interp.circuits.metrics` (the bound metric says where it reads), and the
metric's value on each unpatched run, which a score puts at 1 (clean) and 0 (corrupted)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from sprout_interp.circuits.metrics import BoundMetric, bind_metric, metric_from_read_logits, read_positions
from sprout_interp.core.errors import MetricError, PatchingError
from sprout_interp.core.hooked import HookedSprout

__all__ = ["bind_patch_metric", "run_value", "patch_inputs", "patch_endpoints"]



def bind_patch_metric(metric, tokens: Tensor, d_vocab: Optional[int] = None) -> BoundMetric:
    """``metric`` bound to ``tokens``; a metric the protocol does not know is a PatchingError that says what is.
    With ``d_vocab`` the metric's token ids are checked against the vocabulary (every patch starts with
    :func:`run_value`, which passes it)."""
    try:
        return bind_metric(metric, tokens, None, d_vocab)
    except MetricError as e:
        raise PatchingError(
            f"{e}. Patching takes LogitDiff(answer, wrong), LogProb(target), Loss(), TargetLogProb(positions, targets) "
            "or a function of the logits (batch, pos, vocab) returning a scalar"
        ) from None


def run_value(model: HookedSprout, metric, tokens: Tensor) -> tuple[float, str]:
    """The metric of an unpatched run on ``tokens``, and its name."""
    bound = bind_patch_metric(metric, tokens, model.cfg.d_vocab)
    read = read_positions(bound, tokens.shape[1])
    with torch.no_grad():
        return float(metric_from_read_logits(bound, model(tokens)[:, read], read)[0]), bound.name


# --------------------------------------------------------------------------------------------
# inputs


def patch_inputs(model: HookedSprout, clean, corrupted) -> tuple[Tensor, Tensor]:
    """``clean`` and ``corrupted`` as ids of one length (no padding); a PatchingError when they differ."""
    c, _ = model.prepare_input(clean, padding=False, argument="clean")
    x, _ = model.prepare_input(corrupted, padding=False, argument="corrupted")
    if c.shape != x.shape:
        raise PatchingError(
            f"clean is {tuple(c.shape)} tokens and corrupted {tuple(x.shape)}: patching swaps activations position "
            "by position, so both must tokenize to the same length (change a name for another of the same length)"
        )
    return c, x


def patch_endpoints(model: HookedSprout, clean, corrupted, metric, direction: str
                    ) -> tuple[Tensor, Tensor, float, float, str]:
    """``direction`` checked, both inputs as ids, the metric on each unpatched run and its name:
    ``(clean ids, corrupted ids, clean value, corrupted value, metric name)``; runs the metric cannot tell apart
    are a PatchingError (a score divides by their difference)."""
    if direction not in ("denoise", "noise"):
        raise PatchingError(f"direction must be 'denoise' (clean into corrupted) or 'noise' (the reverse), got {direction!r}")
    clean_t, corrupt_t = patch_inputs(model, clean, corrupted)
    clean_v, name = run_value(model, metric, clean_t)
    corrupt_v, _ = run_value(model, metric, corrupt_t)
    if abs(clean_v - corrupt_v) < 1e-6:
        same = "the texts are the same" if torch.equal(clean_t, corrupt_t) else "the metric does not tell them apart"
        raise PatchingError(
            f"the {name} is {clean_v:.4g} on both runs ({same}): a score needs a clean and a corrupted run that differ"
        )
    return clean_t, corrupt_t, clean_v, corrupt_v, name
