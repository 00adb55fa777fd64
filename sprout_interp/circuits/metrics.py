"""Metrics of a run, bound to a batch: the mean next-token loss, the loss on a repeated sequence's second copy
(and its ratio to the first), a target's log-probability, or any function of the logits.

The metric protocol: an object with a ``name`` and ``bind(tokens, mask) -> BoundMetric``. A
:class:`BoundMetric` either names (row, pos, target) triples whose log-probabilities it reduces (the fast
paths compute logits only there) or wraps a function ``fn(logits, tokens) -> float``. Write your own metric by
returning ``BoundMetric(name, rows, pos, targets, reduce)`` from ``bind``, or pass a plain function.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.core.errors import AblationError
from sprout_interp.core.hooked import HookedSprout

__all__ = [
    "BoundMetric", "Loss", "CopyingLoss", "TargetLogProb", "bind_metric", "metric_from_resid", "logprobs_from_normed",
    "metric_reach", "metric_reach_of",
]


@dataclass
class BoundMetric:
    """A metric bound to a batch: either log-probabilities at (row, pos, target) triples, reduced over
    the last axis, or a function of the logits."""

    name: str
    rows: Optional[Tensor] = None
    pos: Optional[Tensor] = None
    targets: Optional[Tensor] = None
    reduce: Optional[Callable[[Tensor], Tensor]] = None
    fn: Optional[Callable] = None
    tokens: Optional[Tensor] = None

    def from_logits(self, logits: Float[Tensor, "batch pos d_vocab"]) -> Tensor:
        """The metric of one run's logits (differentiable)."""
        if self.fn is not None:
            out = self.fn(logits, self.tokens)
            return out if isinstance(out, Tensor) else torch.tensor(float(out))
        if 2 * self.rows.numel() >= logits.shape[0] * logits.shape[1]:  # most positions: no copy of the logits
            return self.reduce(F.log_softmax(logits.float(), dim=-1)[self.rows, self.pos, self.targets])
        lp = F.log_softmax(logits[self.rows, self.pos].float(), dim=-1)
        return self.reduce(lp.gather(-1, self.targets[:, None])[:, 0])


def _mean_loss_reduce(lp: Tensor) -> Tensor:
    return -lp.mean(-1)


class Loss:
    """Mean next-token loss (nats) over every real target."""

    name = "loss"

    def bind(self, tokens: Tensor, mask: Optional[Tensor]) -> BoundMetric:
        """This metric bound to one batch of token ids ``(batch, pos)`` and its mask (False at padding)."""
        B, T = tokens.shape
        if T < 2:
            raise AblationError("the loss needs at least 2 tokens per row")
        keep = torch.ones(B, T - 1, dtype=torch.bool, device=tokens.device)
        if mask is not None:
            keep = mask[:, :-1] & mask[:, 1:]
        rows, pos = keep.nonzero(as_tuple=True)
        return BoundMetric(self.name, rows, pos, tokens[rows, pos + 1], _mean_loss_reduce, tokens=tokens)


class CopyingLoss:
    """Loss on a repeated sequence, as ``sprout_model.evaluation.repeated_tokens_loss_ratio`` counts it.

    The rows are ``seq_len`` tokens followed by the same ``seq_len`` tokens (``seq_len`` is read off the
    tokens when None). The value is the mean loss on targets ``seq_len+1 .. 2*seq_len-1`` (the second
    copy, less its unpredictable first token), or with ``ratio=True`` that divided by the mean loss on
    targets ``1 .. seq_len-1`` (the same positions of the first copy).
    """

    def __init__(self, seq_len: Optional[int] = None, ratio: bool = False):
        self.seq_len = seq_len
        self.ratio = ratio
        self.name = "copying_ratio" if ratio else "copying"

    def bind(self, tokens: Tensor, mask: Optional[Tensor]) -> BoundMetric:
        """This metric bound to one batch of token ids ``(batch, pos)`` and its mask (False at padding)."""
        B, T = tokens.shape
        n = self.seq_len
        if n is None:
            n = T // 2
            if T % 2 or n < 2 or not torch.equal(tokens[:, :n], tokens[:, n:]):
                raise AblationError(
                    "the copying metrics need rows made of a sequence repeated twice "
                    "(sprout_model.evaluation.repeated_tokens_batch), or pass CopyingLoss(seq_len=...)"
                )
        if n < 2 or 2 * n > T:
            raise AblationError(f"CopyingLoss(seq_len={n}) needs rows of at least {2 * n} tokens, got {T}")
        second = torch.arange(n, 2 * n - 1, device=tokens.device)  # logits here predict targets n+1 .. 2n-1
        first = torch.arange(0, n - 1, device=tokens.device)  # ... and targets 1 .. n-1
        pos_one = torch.cat([second, first]) if self.ratio else second
        rows = torch.arange(B, device=tokens.device).repeat_interleave(len(pos_one))
        pos = pos_one.repeat(B)
        k = len(second)
        if self.ratio:
            def reduce(lp: Tensor) -> Tensor:
                lp = lp.unflatten(-1, (B, 2 * k))
                return lp[..., :k].mean((-2, -1)) / lp[..., k:].mean((-2, -1))
        else:
            reduce = _mean_loss_reduce
        return BoundMetric(self.name, rows, pos, tokens[rows, pos + 1], reduce, tokens=tokens)


class TargetLogProb:
    """Mean log-probability of ``targets[i]`` as the token after position ``positions[i]`` (logits at
    ``positions[i]``), in row ``rows[i]``; with ``rows=None`` the same (position, target) pairs in every row.

    Example: the continuation of a repeated name, ``TargetLogProb([p1, p2], [id1, id2])``.
    """

    name = "target_logprob"

    def __init__(self, positions: Sequence[int], targets: Sequence[int], rows: Optional[Sequence[int]] = None, name: Optional[str] = None):
        self.positions = [int(p) for p in positions]
        self.targets = [int(t) for t in targets]
        self.rows = None if rows is None else [int(r) for r in rows]
        if name:
            self.name = name
        if len(self.positions) != len(self.targets) or not self.positions or (self.rows is not None and len(self.rows) != len(self.positions)):
            raise AblationError("TargetLogProb needs as many positions as targets (and rows, if given), at least one")

    def bind(self, tokens: Tensor, mask: Optional[Tensor]) -> BoundMetric:
        """This metric bound to one batch of token ids ``(batch, pos)`` and its mask (False at padding)."""
        B, T = tokens.shape
        dev = tokens.device
        pos = torch.tensor(self.positions, device=dev)
        tgt = torch.tensor(self.targets, device=dev)
        if self.rows is None:
            rows = torch.arange(B, device=dev).repeat_interleave(len(pos))
            pos, tgt = pos.repeat(B), tgt.repeat(B)
        else:
            rows = torch.tensor(self.rows, device=dev)
        if int(pos.min()) < -T or int(pos.max()) >= T or int(rows.min()) < 0 or int(rows.max()) >= B:
            raise AblationError(f"TargetLogProb positions/rows outside the batch (batch {B}, {T} positions)")
        pos = pos % T
        return BoundMetric(self.name, rows, pos, tgt, lambda lp: lp.mean(-1), tokens=tokens)


def bind_metric(metric, tokens: Tensor, mask: Optional[Tensor]) -> BoundMetric:
    """Any accepted metric (a name, an object with ``bind``, or ``fn(logits[, tokens])``) bound to ``tokens``."""
    if isinstance(metric, str):
        table = {"loss": Loss(), "copying": CopyingLoss(), "copying_ratio": CopyingLoss(ratio=True)}
        if metric not in table:
            raise AblationError(
                f"unknown metric {metric!r}: use 'loss', 'copying', 'copying_ratio', TargetLogProb(...) or a function fn(logits, tokens)"
            )
        metric = table[metric]
    if hasattr(metric, "bind"):
        return metric.bind(tokens, mask)
    if callable(metric):
        try:
            n_args = len([p for p in inspect.signature(metric).parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty])
        except (TypeError, ValueError):
            n_args = 2
        fn = metric if n_args >= 2 else (lambda logits, tokens, _f=metric: _f(logits))
        return BoundMetric(getattr(metric, "__name__", "metric"), fn=fn, tokens=tokens)
    raise AblationError(f"metric must be a name, a metric object or a function of the logits, got {metric!r}")


def logprobs_from_normed(model: HookedSprout, x: Float[Tensor, "n d_model"], targets: Int[Tensor, " n"], chunk: int = 512) -> Tensor:
    """log P(target) from final-norm outputs: the target's logit minus the log-sum-exp of all logits,
    unembedding ``chunk`` rows at a time (the full logits are never held)."""
    W = model.model.head.weight
    out = (x.float() * W[targets].float()).sum(-1)
    for i in range(0, x.shape[0], chunk):
        out[i : i + chunk] -= torch.logsumexp(F.linear(x[i : i + chunk], W).float(), dim=-1)
    return out


def metric_from_resid(model: HookedSprout, bound: BoundMetric, resid: Tensor, groups: int, at: Optional[Tensor] = None) -> list[float]:
    """The metric of each of ``groups`` stacked copies of the batch, from the final residual stream
    ``(groups * batch, pos, d_model)``; with ``at`` (sorted positions) the stream holds only those positions."""
    B = resid.shape[0] // groups
    if bound.fn is not None:
        out = []
        for g in range(groups):
            logits = model.model.head(model.model.norm(resid[g * B : (g + 1) * B]))
            out.append(float(bound.from_logits(logits)))
        return out
    N = bound.rows.numel()
    rows = (bound.rows[None, :] + B * torch.arange(groups, device=resid.device)[:, None]).reshape(-1)
    pos = bound.pos if at is None else torch.searchsorted(at, bound.pos)
    x = model.model.norm(resid[rows, pos.repeat(groups)])
    lp = logprobs_from_normed(model, x, bound.targets.repeat(groups)).view(groups, N)
    return [float(v) for v in bound.reduce(lp)]




def metric_reach_of(bound: BoundMetric, toks: Tensor) -> tuple[float, int]:
    """(positions per row whose logits the metric reads, length of the prefix it depends on). Causal: the
    positions after the last one the metric reads change nothing it sees. A callable metric reads all."""
    B, T = toks.shape
    if bound.fn is not None:
        return float(T), T
    return bound.pos.numel() / B, int(bound.pos.max()) + 1


def metric_reach(metric, tokens: Tensor) -> tuple[float, int]:
    """For ``metric`` on token ids ``(batch, pos)``: the positions per row it reads and the prefix length
    the fast sweep runs; the ``read`` and ``prefix`` of :func:`sweep_macs`."""
    return metric_reach_of(bind_metric(metric, tokens, None), tokens)


