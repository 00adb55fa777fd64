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
of given tokens at given positions), ``LogProb`` / ``LogitDiff`` (one position, as patching takes them), or
any callable ``fn(logits, tokens) -> float``: the one metric protocol of :mod:`sprout_interp.circuits.metrics`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, NamedTuple, Optional

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.circuits.gradients import metric_gradients
from sprout_interp.circuits.heads import CONVENTION, KINDS, Head, Kind, all_heads, check_heads, check_kind, head_label
from sprout_interp.circuits.metrics import (
    BoundMetric,
    CopyingLoss,
    Loss,
    MetricLike,
    TargetLogProb,
    bind_metric,
    metric_from_resid,
    metric_reach,
    metric_reach_of,
)
from sprout_interp.circuits.replacements import Replacer, ablation_hooks, default_reference, head_means, is_means
from sprout_interp.core.arguments import check_count
from sprout_interp.core.errors import AblationError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout, as_hooked, is_hooked

__all__ = [
    "trimmed_positions", "KINDS", "CONVENTION", "AblationResult", "ablate", "ablation_sweep", "attribution_sweep", "head_means",
    "default_reference", "Loss", "CopyingLoss", "TargetLogProb", "AblatedRunner", "name_copying_under_ablation",
    "spearman", "all_heads", "check_heads", "ablated", "sweep_macs", "metric_reach", "Kind", "Head",
]


# --------------------------------------------------------------------------------------------
# ablate


class AblationResult(NamedTuple):
    """One ablated run: its logits, the per-token next-token loss (nats) and the mean over real targets."""
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
        kind: what replaces each ablated head's output ``blocks.{l}.attn.hook_z[..., h, :]`` (before ``W_O``):

            | kind | replacement |
            |---|---|
            | ``"zero"`` (default) | zeros |
            | ``"mean"`` | the head's mean output over the real tokens of ``reference`` (one ``d_head`` vector) |
            | ``"resample"`` | the head's output at the same position on another sequence: row ``b`` takes ``reference`` row ``b % R`` |
        reference: for ``"mean"``, token ids or precomputed :func:`head_means` (None: a seeded sample of held-out
            text, :func:`default_reference`); for ``"resample"``, token ids (None: the batch itself shifted by one
            row, or held-out text when the batch has one row); unused by ``"zero"``.
    Returns:
        :class:`AblationResult`: ``logits`` ``(batch, pos, d_vocab)``, ``loss`` (the per-token next-token loss,
        ``(batch, pos - 1)``, nats; 0 where the target is padding) and ``mean_loss`` (over real targets, nats).
    """
    model = as_hooked(model)
    heads = check_heads(model, heads)
    check_kind(kind)
    toks, mask = as_hooked(model).prepare_input(tokens, attention_mask)
    with model.lock:
        rep = Replacer(model, toks, heads, kind, reference, mask)
        with torch.no_grad():
            logits = model.run_with_hooks(toks, fwd_hooks=ablation_hooks(heads, rep))
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
        self.kind = check_kind(kind)
        self.reference = reference
        self.cfg = self.model.model.cfg
        if self.heads and kind == "mean" and not is_means(reference, self.model):
            self.reference = head_means(self.model, reference)  # compute once

    def __call__(self, idx: Tensor):
        """``(logits, None)`` of ``idx`` with the heads ablated, as ``GPT.__call__`` returns them."""
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
    if kind == "mean" and not is_means(reference, model) and any(conditions.values()):
        reference = head_means(model, reference)
    rows = []
    for label, heads in conditions.items():
        runner = AblatedRunner(model, list(heads), kind, reference)
        res = name_copying(runner, model.tokenizer, texts)
        hs = " + ".join(head_label(l, h) for l, h in runner.heads) or "-"
        for r in res.per_text:
            rows.append(dict(condition=label, heads=hs, name=r["name"], tokens="|".join(r["tokens"]),
                             first=r["first_mean"], second=r["second_mean"]))
        rows.append(dict(condition=label, heads=hs, name="(mean)", tokens="", first=res.first_mean_prob, second=res.mean_prob))
    df = pd.DataFrame(rows)
    df.attrs.update(kind=kind, convention="heads as L<layer>H<head>, 0-indexed as in code (block = layer + 1)")
    return df


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
    metric: MetricLike = "loss",
    kind: Kind = "zero",
    reference=None,
    heads=None,
    attention_mask=None,
    method: Literal["fast", "naive"] = "fast",
    heads_per_batch: Optional[int] = None,
    attribution: bool = False,
    progress: Optional[Callable[[int, int], None]] = None,
) -> pd.DataFrame:
    """Ablate each head alone and measure ``metric``; one row per head.

    Args:
        tokens: token ids ``(batch, pos)``, a text or a list of texts.
        metric: what is measured with each head ablated, one number per run:

            | metric | value, in its units |
            |---|---|
            | ``"loss"`` (default) or :class:`Loss` ``()`` | mean next-token loss (nats/token) |
            | ``"copying"`` or :class:`CopyingLoss` ``()`` | mean loss on the second copy of a repeated sequence (nats/token) |
            | ``"copying_ratio"`` or :class:`CopyingLoss` ``(ratio=True)`` | second-copy loss / first-copy loss (≈ 1: no copying) |
            | :class:`TargetLogProb` ``(positions, targets)`` | mean ``log p`` of given tokens at given positions (nats) |
            | :class:`~sprout_interp.circuits.metrics.LogProb` ``(target, pos=-1)`` | ``log p(target)`` at ``pos`` (nats) |
            | :class:`~sprout_interp.circuits.metrics.LogitDiff` ``(answer, wrong, pos=-1)`` | ``logit[answer] - logit[wrong]`` at ``pos`` (nats) |
            | ``fn(logits, tokens) -> float`` (or ``fn(logits)``) | the number it returns |
        kind, reference: as in :func:`ablate` (``"zero"``, ``"mean"`` or ``"resample"``).
        heads: the (layer, head) pairs to sweep (default: all).
        method: ``"fast"`` (default) is exact: the stream entering the ablated block is the clean one, computed
            once, and only the rest of the model runs again, several heads per forward, with the unembedding (and,
            where the metric reads at most 3/4 of the positions, the last block) only where the metric reads;
            ``"naive"`` runs one full forward per head, for checking.
        heads_per_batch: heads run together in one forward by the fast method (default: as many as
            keep a forward near 4,096 tokens, at least 1 and at most a layer's heads).
        attribution: also compute :func:`attribution_sweep` and add its ``estimate`` column;
            ``df.attrs["spearman"]`` is its rank correlation with ``change``.
        progress: called as ``progress(heads done, heads in all)`` after each head (naive) or group of heads
            (fast) is measured, e.g. to draw a progress bar.

    Returns:
        One row per head:

        | column | meaning |
        |---|---|
        | ``layer`` | 0-indexed, as in hook names |
        | ``block`` | ``layer + 1``, the chapter's count |
        | ``head`` | 0-indexed |
        | ``metric`` | the metric's name |
        | ``ablated`` | the metric with the head ablated, in the metric's units |
        | ``clean`` | the metric of the clean run |
        | ``change`` | ``ablated - clean`` |
        | ``estimate`` | the attribution estimate of ``change`` (``attribution=True`` only) |

        ``df.attrs`` say the metric, kind, method and layer convention.
    """
    model = as_hooked(model)
    heads = check_heads(model, heads)
    check_kind(kind)
    if method not in ("fast", "naive"):
        raise AblationError(f"method must be 'fast' or 'naive', got {method!r}")
    if heads_per_batch is not None:
        heads_per_batch = check_count(heads_per_batch, "heads_per_batch", what="heads run together in one forward; None "
                                      "picks about 4,096 tokens per forward", error=AblationError)
    toks, mask = as_hooked(model).prepare_input(tokens, attention_mask)
    bound = bind_metric(metric, toks, mask, model.cfg.d_vocab)
    with model.lock:
        rep = Replacer(model, toks, heads, kind, reference, mask)
        if method == "naive":
            df = _naive_sweep(model, toks, heads, rep, bound, kind, progress)
        else:
            _, P = metric_reach_of(bound, toks)
            df = _fast_sweep(model, toks[:, :P], heads, rep, bound, kind, heads_per_batch, progress)
        if attribution:
            est = _attribution(model, toks, heads, rep, bound)
            df["estimate"] = est
            df.attrs["spearman"] = spearman(df["change"], df["estimate"])
    return df


@torch.no_grad()
def _naive_sweep(model, toks, heads, rep, bound, kind, progress=None) -> pd.DataFrame:
    clean = float(bound.from_logits(model(toks)))
    values = []
    for l, h in heads:
        logits = model.run_with_hooks(toks, fwd_hooks=ablation_hooks([(l, h)], rep))
        values.append(float(bound.from_logits(logits)))
        if progress is not None:
            progress(len(values), len(heads))
    return _sweep_frame(heads, values, clean, bound.name, kind, "naive")


# the last block is run only where the metric reads when it reads at most this share of the positions
_TRIM_SHARE = 0.75


def trimmed_positions(model: HookedSprout, bound: BoundMetric, P: int) -> Optional[Int[Tensor, " u"]]:
    """The sorted positions whose logits the metric reads, when few enough (and the last block unhooked)
    for the last block to run only there; else None (the last block runs at every position)."""
    if bound.fn is not None:
        return None
    at = torch.unique(bound.pos)
    last = model.blocks[-1]
    if at.numel() > _TRIM_SHARE * P or any(is_hooked(m) for m in last.modules()):
        return None
    return at


@torch.no_grad()
def _fast_sweep(model: HookedSprout, toks, heads, rep: Replacer, bound: BoundMetric, kind, heads_per_batch,
                progress=None) -> pd.DataFrame:
    L = model.cfg.n_layers
    B, T = toks.shape
    C = model.cfg.d_model
    layers = sorted({l for l, _ in heads})
    names = [act_name("resid_pre", l) for l in layers] + [act_name("z", l) for l in layers]
    names.append(act_name("resid_post", L - 1))
    _, cache = model.run_with_cache(toks, names_filter=names, return_type=None, return_cache_object=False)
    clean = metric_from_resid(model, bound, cache[act_name("resid_post", L - 1)], 1)[0]
    at = trimmed_positions(model, bound, T)
    sel = slice(None) if at is None else at  # the positions the last block must produce
    if heads_per_batch is None:
        # about 4k tokens per forward: bigger batches spill the caches (benchmarks/ablation_sweep.py compares)
        heads_per_batch = max(1, min(model.cfg.n_heads, 4096 // max(1, B * T)))
    results: dict[Head, float] = {}
    for l in layers:
        keep = sel if l == L - 1 else slice(None)  # the positions block l must produce
        resid_pre, z = cache[act_name("resid_pre", l)][:, keep], cache[act_name("z", l)][:, keep]
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
                    resid = model.run_block_at(L - 1, resid, at)
            for h, v in zip(group, metric_from_resid(model, bound, resid, G, at)):
                results[(l, h)] = v
            if progress is not None:
                progress(len(results), len(heads))
    return _sweep_frame(heads, [results[hd] for hd in heads], clean, bound.name, kind, "fast")


def sweep_macs(cfg, seq_len: int, read: Optional[float | int] = None, prefix: Optional[int] = None) -> dict[str, float]:
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

    def block(t: int) -> int:
        return t * (4 * d * d + 3 * d * f) + d * t * (t + 1)  # causal: query i meets i+1 keys, twice (QK, AV)

    def tail(t: float | int) -> float | int:
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


def _attribution(model: HookedSprout, toks, heads, rep: Replacer, bound: BoundMetric) -> list[float]:
    names = {l: act_name("z", l) for l in sorted({l for l, _ in heads})}
    _, zs, grad = metric_gradients(model, toks, list(names.values()), bound)
    out = []
    for l, h in heads:
        z = zs[names[l]]
        diff = rep.value(l, h).to(z.dtype) - z[:, :, h]
        out.append(float((diff * grad[names[l]][:, :, h]).sum()))
    return out


def attribution_sweep(
    model,
    tokens,
    metric: MetricLike = "loss",
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
    check_kind(kind)
    toks, mask = as_hooked(model).prepare_input(tokens, attention_mask)
    bound = bind_metric(metric, toks, mask, model.cfg.d_vocab)
    with model.lock:
        rep = Replacer(model, toks, heads, kind, reference, mask)
        est = _attribution(model, toks, heads, rep, bound)
    df = pd.DataFrame({"layer": [l for l, _ in heads], "block": [l + 1 for l, _ in heads], "head": [h for _, h in heads],
                       "metric": bound.name, "estimate": est})
    df.attrs.update(metric=bound.name, kind=kind, method="attribution", convention=CONVENTION)
    return df


def spearman(a: Iterable[float | int], b: Iterable[float | int]) -> float:
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
    if check_kind(kind) == "resample":
        raise AblationError("resample ablation takes each head's output from another row of the same batch: use ablate(...)")
    rep = Replacer(model, torch.zeros(1, 1, dtype=torch.long, device=model.device), heads, kind, reference)
    return model.hooks(fwd_hooks=ablation_hooks(heads, rep))

