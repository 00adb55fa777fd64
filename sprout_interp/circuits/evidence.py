"""Causal evidence about heads: what ablating a set of heads together does to in-context copying, to the
ordinary held-out loss and to an induction head's induction score, and how *specific* that is.

:func:`ablation_effects` measures each condition (a set of heads ablated together, zero or mean) against the
clean run; :func:`specificity` weighs the copying an ablation removes against the held-out loss it costs,
so a head whose removal breaks the whole model is not called a copying head.
:class:`EffectMeasurer` does the measuring with its setup (head means, texts, tokens) done once; the
induction-circuit finder (:mod:`sprout_interp.circuits.induction`) uses it for every candidate.

Copying is invented-name copying (``sprout_model.evaluation.name_copying``: the mean probability of a
name's later tokens at its first and second occurrence) or, without a tokenizer, the next-token
probability on repeated random tokens. Losses are nats/token; shares are 0-1. Layers are 0-indexed
(``blocks.{layer}``), ``block`` = layer + 1; heads read as :func:`sprout_interp.circuits.heads.head_label`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Optional, Sequence

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor

from sprout_interp.circuits.ablation import ablated
from sprout_interp.circuits.attention import natural_tokens, score_masks
from sprout_interp.circuits.heads import CONVENTION, Head, Kind, check_heads, head_label, heads_label
from sprout_interp.circuits.replacements import head_means
from sprout_interp.core.errors import AblationError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout, as_hooked

__all__ = ["ablation_effects", "specificity", "is_specific", "EffectMeasurer", "effect_row", "effects_frame",
           "COPYING_MEASURES", "NO_COPYING"]


COPYING_MEASURES = ("names", "repeated")
# a clean copying gain (mean probability, second occurrence minus first) below this: the model does not
# copy, so there is no share of it for an ablation to remove
NO_COPYING = 0.05


def specificity(copying_removed: float, loss_change: float, clean_loss: float, d_vocab: int) -> tuple[float, float]:
    """``(loss_share, specificity)`` of an ablation: is it copying that it removes, or the model?

    ``loss_share``: the rise of the held-out loss as a share of what the model has learned about
    held-out text, ``loss_change / (ln(d_vocab) - clean_loss)`` (a uniform guess scores ln(d_vocab)
    nats/token), so 1 means the ablation leaves the model knowing nothing.
    ``specificity``: ``copying_removed / loss_share``, the share of the copying gain removed per share
    of the model's general ability removed (unitless). A copying head scores far above 1; a head whose
    removal breaks the model scores about 1 or below. inf when the held-out loss does not rise while
    copying falls; NaN when neither moves.
    """
    known = math.log(d_vocab) - clean_loss
    loss_share = loss_change / known if known > 0 else float("nan")
    if loss_share > 0:
        return loss_share, copying_removed / loss_share
    return loss_share, (float("inf") if copying_removed > 0 else float("nan"))


def is_specific(spec: float, min_specificity: float) -> bool:
    """Whether a :func:`specificity` passes ``min_specificity`` (inf passes: copying fell, the loss did not rise)."""
    return bool(spec == float("inf") or (spec == spec and spec >= min_specificity))


def _mean_loss(model: HookedSprout, toks: Tensor, mask: Optional[Tensor], batch_size: int = 8) -> float:
    """Mean next-token loss (nats/token) over the real targets of ``toks``."""
    total, count = 0.0, 0
    for i in range(0, toks.shape[0], batch_size):
        t = toks[i : i + batch_size]
        logits = model(t)[:, :-1].float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1), reduction="none").view(t.shape[0], -1)
        keep = torch.ones_like(loss, dtype=torch.bool)
        if mask is not None:
            m = mask[i : i + batch_size]
            keep = m[:, :-1] & m[:, 1:]
        total += float(loss[keep].sum())
        count += int(keep.sum())
    return total / max(count, 1)


def _repeated_copying(model: HookedSprout, rep: Int[Tensor, "batch pos"]) -> tuple[float, float]:
    """Mean probability of the next token on the first copy (targets 1..n-1) and the second (n+1..2n-1)."""
    n = rep.shape[1] // 2
    probs = torch.softmax(model(rep).float(), -1)[:, :-1].gather(-1, rep[:, 1:, None])[..., 0]  # (batch, pos-1)
    return float(probs[:, : n - 1].mean()), float(probs[:, n:].mean())


def _name_copying(model: HookedSprout, texts) -> tuple[float, float]:
    """Mean probability of the invented names' later tokens at their first and second occurrence."""
    from sprout_model.evaluation import name_copying

    res = name_copying(lambda idx: (model(idx.to(model.device)), None), model.tokenizer, texts)
    return res.first_mean_prob, res.mean_prob


def _head_induction_score(model: HookedSprout, rep: Int[Tensor, "batch pos"], layer: int, head: int) -> float:
    """One head's induction score on ``rep`` (as :func:`pattern_scores`), running the model only up to its block."""
    mk = score_masks(rep)["induction"]
    has = mk.any(-1)
    got: dict[str, Tensor] = {}

    def grab(pattern, hook):
        got["p"] = (pattern[:, head].double() * mk.double()).sum(-1)  # (batch, query)
        return pattern

    model.run_with_hooks(rep, fwd_hooks=[(act_name("pattern", layer), grab)], stop_at_layer=layer + 1)
    return float(got["p"][has].mean()) if bool(has.any()) else float("nan")


class EffectMeasurer:
    """Measures, for a set of heads ablated together, the copying, the held-out loss and (optionally)
    the induction head's induction score. Setup (head means, texts, tokens) is done once."""

    def __init__(self, model: HookedSprout, kind: Kind, reference, copying: Optional[str], held_out, repeated,
                 texts=None, seed: int = 0):
        from sprout_model.evaluation import repeated_tokens_batch

        self.model = model
        if kind not in ("zero", "mean"):
            raise AblationError(f"the circuit's ablations are 'zero' or 'mean', got {kind!r}")
        self.kind = kind
        if kind == "mean" and not (isinstance(reference, Tensor) and reference.is_floating_point()):
            reference = head_means(model, reference)  # once, for every condition
        self.reference = reference
        if copying is None:
            copying = "names" if model.tokenizer is not None else "repeated"
        if copying not in COPYING_MEASURES:
            raise AblationError(f"copying must be one of {COPYING_MEASURES}, got {copying!r}")
        if copying == "names" and model.tokenizer is None:
            raise AblationError("name copying needs the model's tokenizer: pass copying='repeated'")
        self.copying, self.texts = copying, texts
        if held_out is None:
            if model.tokenizer is None:
                raise AblationError("the held-out loss needs text: pass held_out=<token ids (batch, pos)> (this model has no tokenizer)")
            held_out = natural_tokens(model, None, 4, 256, seed)
        self.held, self.held_mask = model.prepare_input(held_out)
        if repeated is None:
            n = min(64, model.cfg.n_ctx // 2)
            repeated = repeated_tokens_batch(model.cfg.d_vocab, n, 8, seed)
        self.rep, _ = model.prepare_input(repeated, padding=False, argument="repeated")

    @torch.no_grad()
    def run(self, heads: Sequence[Head], induction_head: Optional[Head] = None) -> dict:
        """``heads`` ablated together: ``copying_first``, ``copying_second`` (mean probabilities), ``loss``
        (held-out, nats/token) and ``induction_score`` of ``induction_head`` (NaN without one)."""
        m = self.model
        ctx = ablated(m, list(heads), self.kind, self.reference) if heads else m.hooks()
        with ctx:
            if self.copying == "names":
                first, second = _name_copying(m, self.texts)
            else:
                first, second = _repeated_copying(m, self.rep)
            loss = _mean_loss(m, self.held, self.held_mask)
            ind = float("nan") if induction_head is None else _head_induction_score(m, self.rep, *induction_head)
        return dict(copying_first=first, copying_second=second, loss=loss, induction_score=ind)

    @torch.no_grad()
    def induction(self, heads: Sequence[Head], induction_head: Head) -> float:
        """The induction head's induction score with ``heads`` ablated (nothing else measured)."""
        m = self.model
        with ablated(m, list(heads), self.kind, self.reference) if heads else m.hooks():
            return _head_induction_score(m, self.rep, *induction_head)


def effect_row(condition: str, role: str, heads: Sequence[Head], r: dict, clean: dict, d_vocab: int) -> dict:
    """One row of :func:`ablation_effects`' table from a measurement ``r`` (:meth:`EffectMeasurer.run`) and the clean one."""
    gain = clean["copying_second"] - clean["copying_first"]
    removed = (clean["copying_second"] - r["copying_second"]) / gain if gain > 0 else float("nan")
    loss_change = r["loss"] - clean["loss"]
    loss_share, spec = specificity(removed, loss_change, clean["loss"], d_vocab) if heads else (0.0, float("nan"))
    ci, ai = clean["induction_score"], r["induction_score"]
    single = len(heads) == 1
    return dict(
        role=role, condition=condition, heads=heads_label(heads), head_pairs=[(int(l), int(h)) for l, h in heads],
        n_heads=len(heads),
        layer=int(heads[0][0]) if single else pd.NA, block=int(heads[0][0]) + 1 if single else pd.NA,
        head=int(heads[0][1]) if single else pd.NA,
        copying_first=r["copying_first"], copying_second=r["copying_second"], copying_removed=removed,
        loss=r["loss"], loss_change=loss_change, loss_share=loss_share, specificity=spec,
        induction_score=ai, induction_drop=(ci - ai) / ci if ci == ci and ci > 0 else float("nan"),
    )


def effects_frame(rows: list[dict], clean: dict, measurer, induction_head: Optional[Head]) -> pd.DataFrame:
    """The table of :func:`effect_row` rows, with the clean values and the conventions in ``attrs``;
    ``measurer`` is an :class:`EffectMeasurer` (or anything with its ``kind`` and ``copying``)."""
    df = pd.DataFrame(rows)
    for c in ("layer", "block", "head"):
        df[c] = df[c].astype("Int64")
    df.attrs.update(
        convention=CONVENTION, kind=measurer.kind, copying=measurer.copying,
        clean_copying_first=clean["copying_first"], clean_copying_second=clean["copying_second"],
        clean_loss=clean["loss"], clean_induction_score=clean["induction_score"],
        induction_head=None if induction_head is None else head_label(*induction_head),
    )
    return df


def ablation_effects(
    model,
    conditions: Mapping[str, Sequence[Head]],
    induction_head: Optional[Head] = None,
    kind: Kind = "mean",
    reference=None,
    copying: Optional[str] = None,
    held_out=None,
    repeated=None,
    texts=None,
    seed: int = 0,
) -> pd.DataFrame:
    """Each set of heads ablated together: its effect on copying, on the held-out loss, and on the induction head.

    Args:
        conditions: label -> heads ``[(layer, head), ...]`` (0-indexed) ablated together; the clean
            run is always measured and comes first (condition "clean").
        induction_head: ``(layer, head)`` whose induction score (attention from a repeated token to
            the token after its earlier copy, on ``repeated``) is measured in every condition; this is
            the path a previous-token head feeds. None: not measured.
        kind, reference: "zero" or "mean" ablation; ``reference`` as in ``sprout_interp.circuits.ablation.ablate``
            (head means are computed once).
        copying: "names" (invented-name copying, ``sprout_model.evaluation.name_copying`` on
            ``texts``, default NAME_TEXTS: the mean probability of a name's later tokens) or "repeated"
            (mean probability of the next token on repeated random tokens); None: names when the model
            has a tokenizer.
        held_out: token ids (or texts) for the ordinary loss; None: 4 held-out windows of 256 tokens (seed ``seed``).
        repeated: repeated random tokens (``repeated_tokens_batch``); None: 8 rows of 64 tokens, twice.

    Returns:
        One row per condition: ``role, condition, heads`` (label), ``head_pairs`` (``[(layer, head), ...]``),
        ``n_heads, layer, block, head`` (single heads only), ``copying_first, copying_second`` (mean probabilities at the first and
        second occurrence), ``copying_removed`` (share of the clean copying gain, second minus first,
        that the ablation removes; 1 = all), ``loss`` and ``loss_change`` (held-out, nats/token),
        ``loss_share`` and ``specificity`` (see :func:`specificity`), ``induction_score`` and
        ``induction_drop`` (share of the clean induction score lost). ``attrs`` hold the clean values.
    """
    model = as_hooked(model)
    meas = EffectMeasurer(model, kind, reference, copying, held_out, repeated, texts, seed)
    induction_head = None if induction_head is None else check_heads(model, [induction_head])[0]
    clean = meas.run([], induction_head)
    d_vocab = model.cfg.d_vocab
    rows = [effect_row("clean", "clean", [], clean, clean, d_vocab)]
    for label, heads in conditions.items():
        heads = check_heads(model, heads) if heads else []
        if not heads:
            continue
        r = meas.run(heads, induction_head)
        rows.append(effect_row(label, "ablated", heads, r, clean, d_vocab))
    return effects_frame(rows, clean, meas, induction_head)


