"""Metrics of a run, bound to a batch: the mean next-token loss, the loss on a repeated sequence's second copy
(and its ratio to the first), a target's log-probability, a logit difference, or any function of the logits.

One metric protocol serves ablations, sweeps and patching: an object with a ``name`` and
``bind(tokens, mask) -> BoundMetric``. A :class:`BoundMetric` either names (row, pos, target) triples whose
log-probabilities (or raw logits, ``space="logit"``) it reduces, so the fast paths compute logits only at
those positions, or wraps a function ``fn(logits, tokens) -> float``. Write your own metric by returning
``BoundMetric(name, rows, pos, targets, reduce)`` from ``bind``, or pass a plain function of the logits.

Metrics here: :class:`Loss`, :class:`CopyingLoss`, :class:`TargetLogProb`, :class:`LogProb` and
:class:`LogitDiff`; :func:`bind_metric` also takes the names ``"loss"``, ``"copying"``, ``"copying_ratio"``.
"""
from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Union, runtime_checkable

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.core.arguments import check_token_ids, describe, integer
from sprout_interp.core.errors import MetricError
from sprout_interp.core.hooked import HookedSprout

__all__ = [
    "Metric", "MetricLike", "BoundMetric", "Loss", "CopyingLoss", "TargetLogProb", "LogProb", "LogitDiff", "bind_metric", "metric_from_resid",
    "logprobs_from_normed", "metric_reach", "metric_reach_of", "read_positions", "metric_from_read_logits", "metric_value",
    "row_lengths", "row_positions",
]


@dataclass
class BoundMetric:
    """A metric bound to a batch: either values at (row, pos, target) triples, reduced over the last axis, or a
    function of the logits.

    The values are ``log p(target)`` at (row, pos) (``space="logprob"``) or the raw logit of ``target`` there
    (``space="logit"``, for differences of logits, which the log-softmax would only round). ``reduce`` maps
    ``(..., n_triples)`` to ``(...)``: one value per stacked copy of the batch.
    """

    name: str
    rows: Optional[Tensor] = None
    pos: Optional[Tensor] = None
    targets: Optional[Tensor] = None
    reduce: Optional[Callable[[Tensor], Tensor]] = None
    fn: Optional[Callable] = None
    tokens: Optional[Tensor] = None
    space: str = "logprob"

    def from_logits(self, logits: Float[Tensor, "batch pos d_vocab"]) -> Tensor:
        """The metric of one run's logits (differentiable)."""
        if self.fn is not None:
            return metric_value(self.fn(logits, self.tokens), self.name)
        if self.space == "logit":
            return self.reduce(_wide(logits[self.rows, self.pos, self.targets]))
        if 2 * self.rows.numel() >= logits.shape[0] * logits.shape[1]:  # most positions: no copy of the logits
            return self.reduce(F.log_softmax(_wide(logits), dim=-1)[self.rows, self.pos, self.targets])
        lp = F.log_softmax(_wide(logits[self.rows, self.pos]), dim=-1)
        return self.reduce(lp.gather(-1, self.targets[:, None])[:, 0])



def _wide(t: Tensor) -> Tensor:
    """``t`` in at least float32: half and bfloat16 widened, float64 kept (a float64 model's metric stays float64, so
    two ways of computing it agree to float64 rounding on any CPU, not to float32's)."""
    return t if t.dtype == torch.float64 else t.float()


def metric_value(out, name: str) -> Tensor:
    """What a function metric returned, as a 0-d float tensor (still differentiable when it is a tensor); a
    MetricError that says what it returned when that is not one finite number: None, a string, a bool, a vector,
    NaN or infinity. Every evaluation of a function metric (ablations, patching, steering, gradients) passes here."""
    if hasattr(out, "__array__") and not isinstance(out, (Tensor, numbers.Number)):
        out = torch.as_tensor(out)
    if isinstance(out, Tensor):
        if out.numel() != 1 or out.dtype == torch.bool or out.dtype.is_complex:
            raise MetricError(f"the metric {name!r} returned a {out.dtype} tensor of shape {tuple(out.shape)}: a metric "
                              "returns one real number, for example logits[:, -1, answer].mean()")
        value = out.reshape(()) if out.dtype.is_floating_point else out.reshape(()).float()
        x = float(value.detach())
    elif isinstance(out, numbers.Real) and not isinstance(out, bool):
        x = float(out)
        value = torch.tensor(x)
    else:
        raise MetricError(f"the metric {name!r} returned {describe(out)}: a metric returns one real number, "
                          "for example logits[:, -1, answer].mean()")
    if not math.isfinite(x):
        raise MetricError(f"the metric {name!r} returned {x}: a metric must be a finite number (NaN or infinity would "
                          "make every change and score meaningless)")
    return value


def _whole_numbers(values, name: str) -> list[int]:
    """``values`` (a list, tuple or 1-d integer tensor) as ints; a MetricError for a bool, a float or a string."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise MetricError(f"{name}={describe(values)} is not a list of whole numbers")
    out = [integer(v) for v in values]
    bad = [v for v, i in zip(values, out) if i is None]
    if bad:
        raise MetricError(f"{name} holds {describe(bad[0])}, which is not a whole number: {name} are whole numbers")
    return out


def _check_pos(pos, what: str) -> None:
    """A metric's ``pos`` must be a whole number (negative counts from the end): not a bool, a float or a string."""
    if integer(pos) is None:
        raise MetricError(f"{what} pos={describe(pos)} is not a whole number: pos is a position of the input "
                          "(0-based, negative counts from the end)")


@runtime_checkable
class Metric(Protocol):
    """What every metric object is: a ``name`` and ``bind(tokens, mask) -> BoundMetric``."""

    name: str

    def bind(self, tokens: Tensor, mask: Optional[Tensor]) -> BoundMetric:
        """This metric bound to one batch of token ids ``(batch, pos)`` and its mask (False at padding)."""
        ...


#: what the ablations, sweeps and patching take as a metric: a name ("loss", "copying", "copying_ratio"), a
#: :class:`Metric` object, or a function of the logits (``fn(logits)`` or ``fn(logits, tokens)``, a scalar)
MetricLike = Union[str, Metric, Callable[..., Any]]

def _mean_loss_reduce(lp: Tensor) -> Tensor:
    return -lp.mean(-1)


class Loss:
    """Mean next-token loss (nats) over every real target."""

    name = "loss"

    def bind(self, tokens: Tensor, mask: Optional[Tensor]) -> BoundMetric:
        """This metric bound to one batch of token ids ``(batch, pos)`` and its mask (False at padding)."""
        B, T = tokens.shape
        if T < 2:
            raise MetricError("the loss needs at least 2 tokens per row")
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
        if mask is not None and not bool(mask.all()):
            raise MetricError("the copying metrics read every row at the same positions: pass rows of equal length, no padding")
        n = self.seq_len
        if n is None:
            n = T // 2
            if T % 2 or n < 2 or not torch.equal(tokens[:, :n], tokens[:, n:]):
                raise MetricError(
                    "the copying metrics need rows made of a sequence repeated twice "
                    "(sprout_model.evaluation.repeated_tokens_batch), or pass CopyingLoss(seq_len=...)"
                )
        if n < 2 or 2 * n > T:
            raise MetricError(f"CopyingLoss(seq_len={n}) needs rows of at least {2 * n} tokens, got {T}")
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
        self.positions = _whole_numbers(positions, "TargetLogProb positions")
        self.targets = (check_token_ids(targets, "TargetLogProb targets", None, error=MetricError).reshape(-1).tolist()
                        if len(targets) else [])
        self.rows = None if rows is None else _whole_numbers(rows, "TargetLogProb rows")
        if name:
            self.name = name
        if len(self.positions) != len(self.targets) or not self.positions or (self.rows is not None and len(self.rows) != len(self.positions)):
            raise MetricError("TargetLogProb needs as many positions as targets (and rows, if given), at least one")

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
        if int(rows.min()) < 0 or int(rows.max()) >= B:
            raise MetricError(f"TargetLogProb rows must lie in 0..{B - 1} (the batch has {B} rows); got {self.rows}")
        n = row_lengths(tokens, mask)[rows]  # each triple's row length: negative positions count from its end
        pos = torch.where(pos < 0, pos + n, pos)
        if bool(((pos < 0) | (pos >= n)).any()):
            i = int(((pos < 0) | (pos >= n)).nonzero()[0, 0])
            raise MetricError(
                f"TargetLogProb position {self.positions[i % len(self.positions)]} is outside row {int(rows[i])}, which has "
                f"{int(n[i])} real tokens (0..{int(n[i]) - 1}, or negative from its end)"
            )
        return BoundMetric(self.name, rows, pos, tgt, lambda lp: lp.mean(-1), tokens=tokens)


def _per_row(ids, B: int, what: str, dev) -> Tensor:
    """One token id per batch row from an int or one id per row."""
    t = torch.as_tensor(ids, dtype=torch.long).reshape(-1).to(dev)
    if t.numel() == 1:
        return t.expand(B)
    if t.numel() != B:
        raise MetricError(f"{what} is one token id, or one per row of the batch ({B}); got {t.numel()} ids")
    return t


def row_lengths(tokens: Tensor, mask: Optional[Tensor]) -> Int[Tensor, " batch"]:
    """Each row's number of real tokens: the mask's count (right padding), or every position without a mask."""
    if mask is None:
        return torch.full((tokens.shape[0],), tokens.shape[1], dtype=torch.long, device=tokens.device)
    return mask.to(tokens.device).sum(1).long()


def row_positions(pos, tokens: Tensor, mask: Optional[Tensor], what: str) -> Int[Tensor, " batch"]:
    """``pos`` in each row of a right-padded batch: a negative ``pos`` counts from that row's own last real token
    (``-1`` is each text's last token, never padding); a position at or past a row's end is a MetricError."""
    lengths = row_lengths(tokens, mask)
    per = lengths + int(pos) if int(pos) < 0 else torch.full_like(lengths, int(pos))
    bad = (per < 0) | (per >= lengths)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        n = int(lengths[i])
        where = f"row {i}, which has" if tokens.shape[0] > 1 else "an input of"
        raise MetricError(f"{what}(pos={pos}) is outside {where} {n} real tokens (0..{n - 1}, or -{n}..-1 from its end)")
    return per


@dataclass(frozen=True)
class LogProb:
    """``log p(target)`` as the token after position ``pos`` (logits at ``pos``; nats), averaged over the batch.

    ``target``: one id for every row, or one per row (a list or a 1-d tensor).
    """

    target: Union[int, Sequence[int], Tensor]
    pos: int = -1
    name: str = "log-probability"

    def __post_init__(self):
        check_token_ids(self.target, "LogProb target", None, error=MetricError)
        _check_pos(self.pos, "LogProb")

    def bind(self, tokens: Tensor, mask: Optional[Tensor]) -> BoundMetric:
        """This metric bound to one batch of token ids ``(batch, pos)`` and its mask: a negative ``pos`` counts
        from each row's own last real token."""
        B, T = tokens.shape
        p = row_positions(self.pos, tokens, mask, "LogProb")
        rows = torch.arange(B, device=tokens.device)
        return BoundMetric(self.name, rows, p, _per_row(self.target, B, "target", tokens.device),
                           lambda lp: lp.mean(-1), tokens=tokens)


@dataclass(frozen=True)
class LogitDiff:
    """``logit[answer] - logit[wrong]`` at ``pos`` (log-odds, nats), averaged over the batch.

    ``answer``/``wrong``: one id for every row, or one per row (a list or a 1-d tensor).
    """

    answer: Union[int, Sequence[int], Tensor]
    wrong: Union[int, Sequence[int], Tensor]
    pos: int = -1
    name: str = "logit difference"

    def __post_init__(self):
        check_token_ids(self.answer, "LogitDiff answer", None, error=MetricError)
        check_token_ids(self.wrong, "LogitDiff wrong", None, error=MetricError)
        _check_pos(self.pos, "LogitDiff")

    def bind(self, tokens: Tensor, mask: Optional[Tensor]) -> BoundMetric:
        """This metric bound to one batch of token ids ``(batch, pos)`` and its mask: a negative ``pos`` counts
        from each row's own last real token."""
        B, T = tokens.shape
        p = row_positions(self.pos, tokens, mask, "LogitDiff")
        dev = tokens.device
        a, w = _per_row(self.answer, B, "answer", dev), _per_row(self.wrong, B, "wrong", dev)
        rows = torch.arange(B, device=dev).repeat_interleave(2)

        def reduce(x: Tensor) -> Tensor:
            x = x.unflatten(-1, (B, 2))
            return (x[..., 0] - x[..., 1]).mean(-1)

        return BoundMetric(self.name, rows, p.repeat_interleave(2), torch.stack([a, w], 1).reshape(-1), reduce,
                           tokens=tokens, space="logit")


def bind_metric(metric, tokens: Tensor, mask: Optional[Tensor], d_vocab: Optional[int] = None) -> BoundMetric:
    """Any accepted metric (a name, an object with ``bind``, or ``fn(logits[, tokens])``) bound to ``tokens``.

    With ``d_vocab`` (the model's vocabulary), the token ids the metric reads are checked to lie in ``0..d_vocab-1``
    (a MetricError naming the argument, ``answer``, ``wrong``, ``target`` or ``targets``, otherwise)."""
    if isinstance(metric, str):
        table = {"loss": Loss(), "copying": CopyingLoss(), "copying_ratio": CopyingLoss(ratio=True)}
        if metric not in table:
            raise MetricError(
                f"unknown metric {metric!r}: use 'loss', 'copying', 'copying_ratio', TargetLogProb(...), LogProb(...), "
                "LogitDiff(...) or a function fn(logits, tokens)"
            )
        metric = table[metric]
    if hasattr(metric, "bind"):
        bound = metric.bind(tokens, mask)
        if d_vocab is not None and bound.targets is not None and bound.targets.numel():
            for arg in ("answer", "wrong", "target", "targets"):
                if hasattr(metric, arg):
                    check_token_ids(getattr(metric, arg), f"{type(metric).__name__} {arg}", d_vocab, error=MetricError)
            check_token_ids(bound.targets, f"the token ids metric {bound.name!r} reads", d_vocab, error=MetricError)
        return bound
    if callable(metric):
        try:
            n_args = len([p for p in inspect.signature(metric).parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty])
        except (TypeError, ValueError):
            n_args = 2
        if mask is not None and not bool(mask.all()):
            raise MetricError(
                "a function metric sees the padded logits of texts of different lengths, and the padding would enter "
                "its value: pass texts of the same length, or a metric that reads each row at its own positions "
                "(Loss(), LogitDiff(...), LogProb(...), TargetLogProb(...))"
            )
        fn = metric if n_args >= 2 else (lambda logits, tokens, _f=metric: _f(logits))
        return BoundMetric(getattr(metric, "__name__", "metric"), fn=fn, tokens=tokens)
    raise MetricError(f"metric must be a name, a metric object (with .bind) or a function of the logits, got {metric!r}")


def logprobs_from_normed(model: HookedSprout, x: Float[Tensor, "n d_model"], targets: Int[Tensor, " n"], chunk: int = 512) -> Tensor:
    """log P(target) from final-norm outputs: the target's logit minus the log-sum-exp of all logits,
    unembedding ``chunk`` rows at a time (the full logits are never held)."""
    W = model.model.head.weight
    out = (_wide(x) * _wide(W[targets])).sum(-1)
    for i in range(0, x.shape[0], chunk):
        out[i : i + chunk] -= torch.logsumexp(_wide(F.linear(x[i : i + chunk], W)), dim=-1)
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
    if bound.space == "logit":
        W = model.model.head.weight
        lp = (_wide(x) * _wide(W[bound.targets.repeat(groups)])).sum(-1).view(groups, N)
    else:
        lp = logprobs_from_normed(model, x, bound.targets.repeat(groups)).view(groups, N)
    return [float(v) for v in bound.reduce(lp)]


def read_positions(bound: BoundMetric, T: int) -> list[int]:
    """The positions (0-based, sorted) whose logits ``bound`` reads in inputs of ``T`` tokens; all of them for a
    function of the logits."""
    if bound.fn is not None:
        return list(range(T))
    return sorted(set(bound.pos.tolist()))


def metric_from_read_logits(bound: BoundMetric, logits: Float[Tensor, "gb r d_vocab"], read: Sequence[int]) -> Tensor:
    """The metric of each stacked copy of the batch, from logits at ``read`` only (``read_positions``):
    ``logits`` is ``(groups * batch, len(read), vocab)``, copy-major; returns ``(groups,)``."""
    B = bound.tokens.shape[0]
    groups = logits.shape[0] // B
    if bound.fn is not None:  # read is every position: these are the full logits
        return torch.stack([_wide(torch.as_tensor(bound.from_logits(logits[g * B : (g + 1) * B]))).reshape(())
                            for g in range(groups)])
    N = bound.rows.numel()
    rows = (bound.rows[None, :] + B * torch.arange(groups, device=logits.device)[:, None]).reshape(-1)
    idx = torch.searchsorted(torch.tensor(list(read), device=logits.device), bound.pos).repeat(groups)
    targets = bound.targets.repeat(groups)
    if bound.space == "logit":
        vals = _wide(logits[rows, idx, targets])
    else:
        vals = F.log_softmax(_wide(logits[rows, idx]), dim=-1).gather(-1, targets[:, None])[:, 0]
    return bound.reduce(vals.view(groups, N))




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


