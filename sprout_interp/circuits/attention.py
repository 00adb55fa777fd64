"""Attention patterns, head scores and the induction circuit.

Head scores (one number per head, from ``blocks.{l}.attn.hook_pattern``, rows = queries, columns = keys):

- **previous-token**: mean attention from each position ``q >= 1`` to ``q - 1``;
- **duplicate-token**: attention from a position to the earlier occurrences ``k < q`` of its own token,
  averaged over the positions whose token occurred before;
- **induction**: attention from a position to the tokens *after* the earlier occurrences of its own
  token (keys ``k < q`` with ``token[k - 1] == token[q]``), averaged over the positions that have one.

Each is measured (a) on the standard test, a seeded batch of random tokens repeated twice
(``sprout_model.evaluation.repeated_tokens_batch``), where an induction head attends to the token
after the first copy, and (b) on natural held-out text (``sprout_interp.core.texts.validation_sample``).
:func:`head_scores` adds each head's part in in-context copying: the copying ratio (loss on the second
copy / loss on the first) with that head ablated.

:func:`find_induction_circuit` ranks heads by these scores and confirms them causally: it ablates each
candidate alone (mean ablation by default) and measures, with :func:`ablation_effects`, what that
removes of the copying (invented-name copying at a name's second occurrence), of the induction head's
induction score (the path from a previous-token head to the induction head) and of the ordinary
held-out loss. A head counts only when its own ablation removes copying *specifically*
(:func:`specificity`: copying removed against held-out loss lost), so a head whose removal breaks the
whole model is not called a copying head. The previous-token part and the induction part are judged
each from its own ablation (:meth:`InductionCircuit.verdicts`). The chapter's gpt-4 has a
previous-token head in layer 2 and an induction head in layer 3.

Layers are 0-indexed as in code (``blocks.{layer}``); tables add ``block`` = layer + 1, the chapter's
"layer N". Heads are 0-indexed; a person reads them as :func:`head_label` writes them, "block 2 head 0 (layer 1)".
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Optional, Sequence, Union

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sprout_interp.circuits.ablation import ablated, ablation_sweep
from sprout_interp.circuits.heads import CONVENTION, Kind, check_heads
from sprout_interp.circuits.replacements import head_means
from sprout_interp.core.errors import AblationError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout, as_hooked

__all__ = [
    "attention_patterns", "score_masks", "pattern_scores", "head_scores", "find_induction_circuit",
    "InductionCircuit", "SCORE_COLUMNS", "ablation_effects", "specificity", "head_label", "heads_label",
]

SCORE_COLUMNS = (
    "prev_token_random", "duplicate_random", "induction_random",
    "prev_token_text", "duplicate_text", "induction_text",
)


# --------------------------------------------------------------------------------------------
# patterns


@torch.no_grad()
def attention_patterns(
    model, input, layers: Optional[Sequence[int]] = None, attention_mask=None
) -> Union[Float[Tensor, "layer head query key"], list[Float[Tensor, "layer head query key"]]]:
    """Attention patterns ``(layer, head, query, key)`` of one text or token row; rows sum to 1.

    ``input``: a text or token ids ``(pos,)``/``(1, pos)`` give one tensor; a list of texts or ids
    ``(batch, pos)`` with several rows give a list with one tensor per row, each cut to that row's
    real length (padding is dropped: with right padding and causal attention, real tokens never see it).
    ``layers`` picks blocks (0-indexed, default all); the first axis follows that order.
    """
    model = as_hooked(model)
    toks, mask = model.prepare_input(input, attention_mask)
    L = model.cfg.n_layers
    layers = list(range(L)) if layers is None else [int(l) for l in layers]
    for l in layers:
        if not 0 <= l < L:
            raise AblationError(f"there is no layer {l}: this model has {L} blocks, layers 0..{L - 1} in code (the chapter's 1..{L})")
    names = [act_name("pattern", l) for l in layers]
    _, cache = model.run_with_cache(toks, names_filter=names, return_type=None, return_cache_object=False)
    pats = torch.stack([cache[n] for n in names], dim=1)  # (batch, layer, head, q, k)
    lengths = [toks.shape[1]] * toks.shape[0] if mask is None else [int(n) for n in mask.sum(1)]
    text_list = isinstance(input, (list, tuple)) and len(input) > 0 and all(isinstance(t, str) for t in input)
    if not text_list and toks.shape[0] == 1:
        return pats[0, :, :, : lengths[0], : lengths[0]]
    return [pats[b, :, :, :n, :n] for b, n in enumerate(lengths)]


# --------------------------------------------------------------------------------------------
# scores


def score_masks(
    tokens: Int[Tensor, "batch pos"], attention_mask: Optional[Bool[Tensor, "batch pos"]] = None
) -> dict[str, Bool[Tensor, "batch query key"]]:
    """Which (query, key) cells each score counts: ``prev_token``, ``duplicate``, ``induction`` (see the module docstring).

    Padding queries (mask False) count nowhere.
    """
    B, T = tokens.shape
    dev = tokens.device
    q = torch.arange(T, device=dev)[:, None]
    k = torch.arange(T, device=dev)[None, :]
    before = (k < q)[None]  # strictly earlier keys
    same = tokens[:, :, None] == tokens[:, None, :]  # (b, q, k): token[q] == token[k]
    after_same = torch.zeros_like(same)
    after_same[:, :, 1:] = same[:, :, :-1]  # token[q] == token[k - 1]
    masks = {
        "prev_token": (k == q - 1)[None].expand(B, T, T),
        "duplicate": same & before,
        "induction": after_same & before,
    }
    if attention_mask is not None:
        masks = {n: m & attention_mask[:, :, None] for n, m in masks.items()}
    return masks


@torch.no_grad()
def pattern_scores(
    model, tokens, attention_mask=None, batch_size: int = 16
) -> dict[str, Float[Tensor, "n_layers n_heads"]]:
    """``{"prev_token", "duplicate", "induction"}`` → ``(n_layers, n_heads)`` scores on ``tokens``.

    Each is the attention mass on the score's cells, per query, averaged over the queries that have
    at least one such cell (over the whole batch). Patterns are reduced inside the hooks, one block at
    a time, so they are never all held at once.
    """
    model = as_hooked(model)
    toks, mask = model.prepare_input(tokens, attention_mask)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    sums = {n: torch.zeros(L, H, dtype=torch.float64, device=model.device) for n in ("prev_token", "duplicate", "induction")}
    counts = {n: 0 for n in sums}
    for i in range(0, toks.shape[0], batch_size):
        t = toks[i : i + batch_size]
        m = None if mask is None else mask[i : i + batch_size]
        masks = score_masks(t, m)
        has = {n: mk.any(-1) for n, mk in masks.items()}  # (b, q): queries with a cell

        def reduce(pattern, hook, layer):
            for n, mk in masks.items():
                per_q = torch.einsum("bhqk,bqk->bhq", pattern.double(), mk.double())
                sums[n][layer] += (per_q * has[n][:, None].double()).sum((0, 2))
            return pattern

        hooks = [(act_name("pattern", l), partial(reduce, layer=l)) for l in range(L)]
        model.run_with_hooks(t, return_type=None, fwd_hooks=hooks)
        for n in counts:
            counts[n] += int(has[n].sum())
    return {n: (sums[n] / counts[n]).float() if counts[n] else torch.full((L, H), float("nan")) for n in sums}


def _natural_tokens(model: HookedSprout, natural, n: int, length: int, seed: int):
    if natural is not None:
        return natural
    if model.tokenizer is None:
        raise AblationError("natural-text scores need the model's tokenizer, or pass natural=<token ids>; natural=False skips them")
    try:
        from sprout_interp.core.texts import held_out_for

        return held_out_for(model, n, length, seed)
    except (ImportError, OSError, ValueError, RuntimeError):  # RuntimeError: sprout_model.corpus.CorpusError
        from sprout_interp.core.texts import TEXTS

        return list(TEXTS.values())  # no corpus here: the three ready-made texts


def head_scores(
    model,
    seq_len: int = 64,
    batch: int = 16,
    seed: int = 0,
    natural=None,
    natural_n: int = 8,
    natural_length: int = 256,
    copying: bool = True,
    copying_kind: Kind = "zero",
    reference=None,
) -> pd.DataFrame:
    """One row per (layer, head): previous-token, duplicate-token and induction scores, and in-context copying.

    Args:
        seq_len, batch, seed: the repeated random tokens (``repeated_tokens_batch``): ``batch`` rows of
            ``seq_len`` random tokens, each repeated twice.
        natural: natural text to score (token ids, a text or a list of texts); None draws
            ``natural_n`` held-out windows of ``natural_length`` tokens (the three ready-made texts
            when the corpus is not installed); False skips the ``*_text`` columns.
        copying: add ``copying_ratio_ablated`` (the copying ratio, loss on the second copy / loss on
            the first, with the head ablated alone by ``copying_kind``) and ``copying_ratio_change``
            (minus the clean ratio, which is in ``df.attrs["clean_copying_ratio"]``; a head that does
            copying raises the ratio when removed).
        reference: for ``copying_kind`` "mean"/"resample" (see ``sprout_interp.circuits.ablation.ablate``).

    Returns:
        DataFrame ``layer, block, head, prev_token_random, duplicate_random, induction_random,
        prev_token_text, duplicate_text, induction_text[, copying_ratio_ablated, copying_ratio_change]``;
        ``layer`` is 0-indexed (code), ``block`` = layer + 1 (the chapter's "layer N").
    """
    from sprout_model.evaluation import repeated_tokens_batch

    model = as_hooked(model)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    if 2 * seq_len > model.cfg.n_ctx:
        raise AblationError(f"2 * seq_len = {2 * seq_len} tokens do not fit the model's context of {model.cfg.n_ctx}")
    rep = repeated_tokens_batch(model.cfg.d_vocab, seq_len, batch, seed).to(model.device)
    rnd = pattern_scores(model, rep)
    df = pd.DataFrame({
        "layer": [l for l in range(L) for _ in range(H)],
        "block": [l + 1 for l in range(L) for _ in range(H)],
        "head": [h for _ in range(L) for h in range(H)],
    })
    for n in ("prev_token", "duplicate", "induction"):
        df[f"{n}_random"] = rnd[n].flatten().cpu().numpy()
    if natural is not False:
        nat = pattern_scores(model, _natural_tokens(model, natural, natural_n, natural_length, seed))
        for n in ("prev_token", "duplicate", "induction"):
            df[f"{n}_text"] = nat[n].flatten().cpu().numpy()
    if copying:
        sw = ablation_sweep(model, rep, metric="copying_ratio", kind=copying_kind, reference=reference)
        df["copying_ratio_ablated"] = sw["ablated"].to_numpy()
        df["copying_ratio_change"] = sw["change"].to_numpy()
        df.attrs["clean_copying_ratio"] = float(sw.attrs["clean"])
        df.attrs["copying_kind"] = copying_kind
    df.attrs.update(convention=CONVENTION, seq_len=seq_len, batch=batch, seed=seed, model=model.name)
    return df


# --------------------------------------------------------------------------------------------
# causal evidence: what ablating heads does to copying, to the held-out loss and to the induction head

Head = tuple[int, int]
COPYING_MEASURES = ("names", "repeated")
# a clean copying gain (mean probability, second occurrence minus first) below this: the model does not
# copy, so there is no share of it for an ablation to remove
NO_COPYING = 0.05


def head_label(layer: int, head: int) -> str:
    """``'block 2 head 0 (layer 1)'``: the chapter's block (counted from 1), the head, the code's layer (0-indexed)."""
    return f"block {layer + 1} head {head} (layer {layer})"


def heads_label(heads: Sequence[Head]) -> str:
    """Several heads joined with ' + ' (:func:`head_label` each); 'none' for no head."""
    return " + ".join(head_label(int(l), int(h)) for l, h in heads) or "none"


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


def _is_specific(spec: float, min_specificity: float) -> bool:
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


class _Measurer:
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
            held_out = _natural_tokens(model, None, 4, 256, seed)
        self.held, self.held_mask = model.prepare_input(held_out)
        if repeated is None:
            n = min(64, model.cfg.n_ctx // 2)
            repeated = repeated_tokens_batch(model.cfg.d_vocab, n, 8, seed)
        self.rep, _ = model.prepare_input(repeated)

    @torch.no_grad()
    def run(self, heads: Sequence[Head], induction_head: Optional[Head] = None) -> dict:
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


def _effect_row(condition: str, role: str, heads: Sequence[Head], r: dict, clean: dict, d_vocab: int) -> dict:
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


def _effects_frame(rows: list[dict], clean: dict, measurer, induction_head: Optional[Head]) -> pd.DataFrame:
    # measurer: a _Measurer, or anything with its attributes (the tests pass a stand-in)
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
    meas = _Measurer(model, kind, reference, copying, held_out, repeated, texts, seed)
    induction_head = None if induction_head is None else check_heads(model, [induction_head])[0]
    clean = meas.run([], induction_head)
    d_vocab = model.cfg.d_vocab
    rows = [_effect_row("clean", "clean", [], clean, clean, d_vocab)]
    for label, heads in conditions.items():
        heads = check_heads(model, heads) if heads else []
        if not heads:
            continue
        r = meas.run(heads, induction_head)
        rows.append(_effect_row(label, "ablated", heads, r, clean, d_vocab))
    return _effects_frame(rows, clean, meas, induction_head)


# --------------------------------------------------------------------------------------------
# the circuit


REPRODUCED_SHARE, PARTLY_SHARE = 0.5, 1 / 3  # share of the copying gain a part's own ablation must remove


@dataclass
class InductionCircuit:
    """The induction circuit of a model: its induction head and the previous-token head(s) that feed it.

    Layers are 0-indexed as in code; ``*_block`` = layer + 1, the chapter's count.

    Scores: ``prev_score`` is the previous-token head's ranking score (with ``scores_on="both"`` the
    weaker of its scores on repeated random tokens and on natural text: a previous-token head attends
    to the token before on any text); ``induction_score`` the induction head's score on repeated
    random tokens (on ``"text"``: natural text). ``prev_earlier``/``prev_before_*`` compare the
    best-scoring previous-token head with the induction head's block.

    Causal confirmation (``confirmed``, when a model was given): each candidate head is ablated alone
    (``kind``), and the previous-token heads together, and ``evidence`` holds one row per condition
    (:func:`ablation_effects`' columns plus the head scores and ``chosen``). The induction head is
    the best-scoring candidate whose own ablation removes copying specifically; ``prev_tokens`` are
    the heads in earlier blocks that score as previous-token heads and whose own ablation lowers the
    copying or the induction head's induction score, specifically (not by breaking the model); when no
    single one does but several together do, the work is shared and all of them are returned.
    ``prev_layer``/``prev_head`` is the first of ``prev_tokens`` (best own effect), or with no
    confirmation the best-scoring previous-token head.
    ``found``: confirmed, both parts hold (an induction head whose removal removes copying and at
    least one previous-token head that feeds it); without confirmation, both scores reach
    ``threshold`` with a previous-token head in an earlier block. :meth:`verdicts` judges each part.
    """

    model: str
    prev_layer: int
    prev_head: int
    prev_score: float
    induction_layer: int
    induction_head: int
    induction_score: float
    prev_earlier: bool
    prev_before_layer: Optional[int]
    prev_before_head: Optional[int]
    prev_before_score: Optional[float]
    threshold: float
    found: bool
    scores_on: str
    clean_copying_ratio: Optional[float] = None
    prev_tokens: list[Head] = field(default_factory=list)
    confirmed: bool = False
    kind: Optional[str] = None
    copying: Optional[str] = None  # "names" or "repeated": what the evidence's copying columns measure
    min_share: float = 0.1
    min_specificity: float = 3.0
    evidence: Optional[pd.DataFrame] = field(default=None, repr=False, compare=False)

    @property
    def prev_block(self) -> int:
        return self.prev_layer + 1

    @property
    def induction_block(self) -> int:
        return self.induction_layer + 1

    @property
    def prev_label(self) -> str:
        """The previous-token head(s), :func:`head_label` joined by ' + ' (the best-scoring one without confirmation)."""
        return heads_label(self.prev_tokens or [(self.prev_layer, self.prev_head)])

    @property
    def induction_label(self) -> str:
        return head_label(self.induction_layer, self.induction_head)

    def heads(self) -> list[Head]:
        """The circuit's heads ``[(layer, head), ...]``, 0-indexed, for ``ablate``: previous-token head(s), then the
        induction head. Confirmed: the previous-token heads the ablations confirmed (none when none was);
        from scores only: the best-scoring previous-token head."""
        prev = self.prev_tokens if self.confirmed else [(self.prev_layer, self.prev_head)]
        return [*prev, (self.induction_layer, self.induction_head)]

    def row(self, condition: str) -> Optional[pd.Series]:
        """The ``evidence`` row of a condition (see :meth:`conditions`), or None."""
        if self.evidence is None:
            return None
        hit = self.evidence[self.evidence["condition"] == condition]
        return None if hit.empty else hit.iloc[0]

    def prev_effect(self) -> Optional[pd.Series]:
        """The evidence row of the previous-token head(s) ablated together without the induction head."""
        if not self.prev_tokens:
            return None
        return self.row(PREV_SET if len(self.prev_tokens) > 1 else head_label(*self.prev_tokens[0]))

    def induction_effect(self) -> Optional[pd.Series]:
        """The evidence row of the induction head ablated alone."""
        return self.row(self.induction_label)

    def copying_gain(self) -> float:
        """The clean copying gain (mean probability, second occurrence minus first); NaN without evidence."""
        if self.evidence is None:
            return float("nan")
        return float(self.evidence.attrs["clean_copying_second"] - self.evidence.attrs["clean_copying_first"])

    def as_dict(self) -> dict:
        """The circuit as plain values (heads, scores, evidence), for JSON or a table."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "evidence"}
        d.update(prev_block=self.prev_block, induction_block=self.induction_block, prev_label=self.prev_label,
                 induction_label=self.induction_label)
        for part, (word, _) in self.verdicts().items():
            d[f"{part}_verdict"] = word
        pe, ie = self.prev_effect(), self.induction_effect()
        for name, r in (("prev", pe), ("induction", ie)):
            for col in ("copying_removed", "loss_change", "specificity", "induction_drop"):
                d[f"{name}_{col}"] = float(r[col]) if r is not None else None
        return d

    def verdicts(self, reproduced: float = REPRODUCED_SHARE, partly: float = PARTLY_SHARE) -> dict[str, tuple[str, str]]:
        """``{"previous-token": (verdict, evidence), "induction": (verdict, evidence)}``, each part judged by its own ablation.

        A part is "REPRODUCED" when its own ablation (the previous-token head(s) together without the
        induction head; the induction head alone) removes at least ``reproduced`` of the copying gain,
        specifically (each head's specificity at least ``min_specificity``) and, for the previous-token
        part, lowers the induction head's induction score by at least ``min_share``; "PARTLY" at
        ``partly`` or more; otherwise "NOT established". Without ablation evidence nothing is established.
        """
        if not self.confirmed or self.evidence is None:
            why = "scores only: no head was ablated"
            return {"previous-token": ("NOT established", why), "induction": ("NOT established", why)}
        measure = "name-copying" if self.copying == "names" else "copying"
        gain = self.copying_gain()
        if not gain >= NO_COPYING:
            why = (f"the model does not copy: clean {measure} {_pct(self.evidence.attrs['clean_copying_second'])} "
                   f"at the second occurrence, {_pct(self.evidence.attrs['clean_copying_first'])} at the first")
            return {"previous-token": ("NOT established", why), "induction": ("NOT established", why)}

        def judge(share: float, specific: bool, path: bool) -> str:
            if share >= reproduced and specific and path:
                return "REPRODUCED"
            return "PARTLY" if share >= partly and specific else "NOT established"

        ie = self.induction_effect()
        ind_specific = _is_specific(float(ie["specificity"]), self.min_specificity)
        ind = (judge(float(ie["copying_removed"]), ind_specific, self.induction_score >= self.threshold),
               f"{self.induction_label} (induction score {self.induction_score:.2f}) ablated alone: {_effect_text(ie, measure)}"
               + ("" if ind_specific else "; NOT specific: its removal breaks the model, not copying alone"))
        pe = self.prev_effect()
        if pe is None:
            cands = self.evidence[self.evidence["role"] == "previous-token candidate"]
            best = "" if cands.empty else (
                f"; best candidate {cands.iloc[0]['heads']} alone: {_effect_text(cands.iloc[0], measure)}")
            return {"previous-token": ("NOT established", f"no head before {self.induction_label} lowers the copying or "
                                       f"its induction score, specifically, when ablated{best}"),
                    "induction": ind}
        singles = [self.row(head_label(*h)) for h in self.prev_tokens]
        all_specific = _is_specific(float(pe["specificity"]), self.min_specificity) and all(
            _is_specific(float(r["specificity"]), self.min_specificity) or float(r["copying_removed"]) < self.min_share
            for r in singles)  # a head that matters only with the others is judged by the set
        path = float(pe["induction_drop"]) >= self.min_share
        each = ""
        if len(singles) > 1:
            each = " (each alone: " + ", ".join(f"{r['heads']} {_pct(float(r['copying_removed']))}" for r in singles) + ")"
        prev = (judge(float(pe["copying_removed"]), all_specific, path),
                f"{self.prev_label} ablated {'together ' if len(singles) > 1 else ''}without the induction head: "
                f"{_effect_text(pe, measure)}{each}")
        return {"previous-token": prev, "induction": ind}

    def verdict(self) -> str:
        """The circuit as a whole: "REPRODUCED" only when both parts are (:meth:`verdicts`), "PARTLY" when
        both are at least partly established, else "NOT reproduced"."""
        words = [w for w, _ in self.verdicts().values()]
        if all(w == "REPRODUCED" for w in words):
            return "REPRODUCED"
        return "PARTLY" if "NOT established" not in words else "NOT reproduced"

    def summary(self) -> str:
        """One line a person reads: blocks counted from 1 as in the chapter, code layers in brackets."""
        name = self.model or "model"
        if not self.confirmed:
            s = (f"{name}: best previous-token head {head_label(self.prev_layer, self.prev_head)} (score "
                 f"{self.prev_score:.2f}); best induction head {self.induction_label} (score {self.induction_score:.2f}); ")
            s += "previous-token head in an earlier block" if self.prev_earlier else "previous-token head NOT in an earlier block"
            if not self.prev_earlier and self.prev_before_layer is not None:
                s += (f" (best earlier one: {head_label(self.prev_before_layer, self.prev_before_head)}, "
                      f"score {self.prev_before_score:.2f})")
            s += "; circuit found" if self.found else f"; no circuit at threshold {self.threshold:.2f}"
            return s + " (head scores only, not confirmed by ablation)"
        v = self.verdicts()
        prev = self.prev_label if self.prev_tokens else "none confirmed"
        return (f"{name}: induction head {self.induction_label} (score {self.induction_score:.2f}): {v['induction'][0]}; "
                f"previous-token head(s) {prev}: {v['previous-token'][0]} ({self.kind} ablation, each part alone)")


PREV_SET = "previous-token heads together"
PREV_CANDIDATES_SET = "previous-token candidates together"
PREV_SCORED_SET = "previous-token heads by score together"
CIRCUIT_SET = "the circuit together"


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}%"


def _effect_text(r: pd.Series, measure: str) -> str:
    """'removes 75.4% of the name-copying gain (63.3% -> 16.1%), held-out loss +0.134 nats (specificity 28.1)...'."""
    s = (f"removes {_pct(float(r['copying_removed']))} of the {measure} gain (2nd occurrence "
         f"{_pct(float(r['copying_second']))}), held-out loss {float(r['loss_change']):+.3f} nats "
         f"(specificity {float(r['specificity']):.1f})")
    if float(r["induction_drop"]) == float(r["induction_drop"]):
        s += f", induction head's induction score {float(r['induction_score']):.2f} ({-100 * float(r['induction_drop']):+.0f}%)"
    return s


def _ranks(scores: pd.DataFrame, on: str) -> tuple[pd.Series, pd.Series]:
    """(previous-token ranking score, induction ranking score) per row of a head_scores table."""
    if on == "both":
        prev = scores[["prev_token_random", "prev_token_text"]].min(axis=1)
    else:
        prev = scores[f"prev_token_{on}"]
    ind = scores["induction_text" if on == "text" else "induction_random"]
    return prev, ind


def find_induction_circuit(
    model=None,
    scores: Optional[pd.DataFrame] = None,
    on: str = "both",
    threshold: float = 0.3,
    confirm: Optional[bool] = None,
    kind: Kind = "mean",
    reference=None,
    copying: Optional[str] = None,
    held_out=None,
    min_share: float = 0.1,
    min_specificity: float = 3.0,
    max_candidates: int = 6,
    **head_scores_kwargs,
) -> InductionCircuit:
    """The induction head and the previous-token head(s) that feed it, ranked by head scores and confirmed by ablation.

    Ranking: induction heads by their induction score on repeated random tokens; previous-token
    heads, with ``on="both"`` (default), by the weaker of their previous-token scores on repeated
    random tokens and on natural text (a head that looks back one token only on random tokens is not
    a previous-token head). ``on="random"``/``"text"`` rank by one of them.

    Confirmation (``confirm``, default: when a model is given; nothing is confirmed when the model does
    not copy, a clean gain below ``NO_COPYING``): heads scoring at least ``threshold``
    as induction heads (at most ``max_candidates``, at least the best) are ablated alone; the induction
    head is the one whose ablation removes the largest share of the copying gain while being specific
    (``min_specificity``, see :func:`specificity`) and removing at least ``min_share``. Then each head
    in an earlier block that scores at least ``threshold`` as a previous-token head on either text (at
    most ``max_candidates``) is ablated alone, measuring the copying and the induction head's
    induction score: the previous-token heads are those that score at least ``threshold`` (ranking
    score), are specific and lower either by at least ``min_share``; several when several do, or all
    of them when only together they do. The previous-token heads together, all candidates together
    and the whole circuit are ablated too. ``kind``/``reference``/``copying``/``held_out``: as in
    :func:`ablation_effects`.

    ``scores``: a :func:`head_scores` table (computed with ``copying=False`` when None; its
    ``seq_len``/``batch``/``seed`` give the repeated tokens of the induction-score check).
    ``head_scores_kwargs`` go to :func:`head_scores`.

    Returns:
        :class:`InductionCircuit`; ``.evidence`` holds every ablation's numbers, ``.verdicts()`` judges
        the previous-token and the induction part each from its own ablation.
    """
    from sprout_model.evaluation import repeated_tokens_batch

    if on not in ("both", "random", "text"):
        raise AblationError(f"on must be 'both', 'random' or 'text', got {on!r}")
    confirm = model is not None if confirm is None else confirm
    if confirm and model is None:
        raise AblationError("confirming the circuit by ablation needs the model: pass it, or confirm=False")
    if scores is None:
        if model is None:
            raise AblationError("pass a model or a head_scores table")
        head_scores_kwargs.setdefault("copying", False)
        if on == "random":
            head_scores_kwargs.setdefault("natural", False)
        scores = head_scores(model, **head_scores_kwargs)
    if on == "both" and not {"prev_token_text", "induction_text"} <= set(scores.columns):
        on = "random"  # no natural-text scores in the table: rank on the random tokens alone
    need = {"prev_token_random", "induction_random"} if on != "text" else {"prev_token_text", "induction_text"}
    if not need <= set(scores.columns):
        raise AblationError(f"the scores table has no {sorted(need - set(scores.columns))} columns (was it made with natural=False?)")
    scores = scores.reset_index(drop=True)
    prank, irank = _ranks(scores, on)
    i = int(irank.idxmax())
    il = int(scores.loc[i, "layer"])
    p = int(prank.idxmax())
    earlier = prank[scores["layer"] < il]
    pb = None if earlier.empty else int(earlier.idxmax())
    name = scores.attrs.get("model", "") or (getattr(model, "name", "") if model is not None else "")
    ratio = scores.attrs.get("clean_copying_ratio")
    circ = InductionCircuit(
        model=name,
        prev_layer=int(scores.loc[p, "layer"]), prev_head=int(scores.loc[p, "head"]), prev_score=float(prank[p]),
        induction_layer=il, induction_head=int(scores.loc[i, "head"]), induction_score=float(irank[i]),
        prev_earlier=int(scores.loc[p, "layer"]) < il,
        prev_before_layer=None if pb is None else int(scores.loc[pb, "layer"]),
        prev_before_head=None if pb is None else int(scores.loc[pb, "head"]),
        prev_before_score=None if pb is None else float(prank[pb]),
        threshold=threshold,
        found=bool(irank[i] >= threshold and pb is not None and prank[pb] >= threshold),
        scores_on=on,
        clean_copying_ratio=None if ratio is None else float(ratio),
        min_share=min_share, min_specificity=min_specificity,
    )
    if not confirm:
        return circ

    model = as_hooked(model)
    seq_len = int(scores.attrs.get("seq_len", 64))
    rep = repeated_tokens_batch(model.cfg.d_vocab, min(seq_len, model.cfg.n_ctx // 2), int(scores.attrs.get("batch", 16)),
                                int(scores.attrs.get("seed", 0))).to(model.device)
    meas = _Measurer(model, kind, reference, copying, held_out, rep, seed=int(scores.attrs.get("seed", 0)))
    d_vocab = model.cfg.d_vocab
    key = list(zip(scores["layer"].astype(int), scores["head"].astype(int)))
    score_cols = [c for c in SCORE_COLUMNS if c in scores]

    def with_scores(row: dict, idx: Optional[int]) -> dict:
        for c in score_cols:
            row[c] = float(scores.loc[idx, c]) if idx is not None else float("nan")
        row["rank_score"] = float("nan") if idx is None else float(prank[idx] if row["role"].startswith("previous") else irank[idx])
        return row

    # 1. the induction head: the candidates by score, each ablated alone
    clean0 = meas.run([])
    order = irank.sort_values(ascending=False, kind="stable")
    cand_i = [int(ix) for ix in order.index[: max_candidates] if irank[ix] >= threshold] or [i]
    ind_rows = []
    for ix in cand_i:
        r = _effect_row(head_label(*key[ix]), "induction candidate", [key[ix]], meas.run([key[ix]]), clean0, d_vocab)
        ind_rows.append(with_scores(r, ix))
    copies = clean0["copying_second"] - clean0["copying_first"] >= NO_COPYING  # else there is no copying to remove
    ok = [r for r, ix in zip(ind_rows, cand_i) if copies and irank[ix] >= threshold
          and _is_specific(r["specificity"], min_specificity) and r["copying_removed"] >= min_share]
    if ok:
        best = max(ok, key=lambda r: r["copying_removed"])
        bi = cand_i[ind_rows.index(best)]
        circ.induction_layer, circ.induction_head, circ.induction_score = key[bi][0], key[bi][1], float(irank[bi])
    ind_head = (circ.induction_layer, circ.induction_head)
    il = circ.induction_layer

    # 2. previous-token heads: earlier blocks, scoring on either text; each alone, with the induction head's score
    clean = dict(clean0, induction_score=meas.induction([], ind_head))
    earlier = prank[scores["layer"] < il]
    pb = None if earlier.empty else int(earlier.idxmax())
    circ.prev_before_layer = None if pb is None else int(scores.loc[pb, "layer"])
    circ.prev_before_head = None if pb is None else int(scores.loc[pb, "head"])
    circ.prev_before_score = None if pb is None else float(prank[pb])
    circ.prev_earlier = circ.prev_layer < il
    prev_any = scores[[c for c in ("prev_token_random", "prev_token_text") if c in scores]].max(axis=1)
    order = prank[scores["layer"] < il].sort_values(ascending=False, kind="stable")
    cand_p = [int(ix) for ix in order.index if prev_any[ix] >= threshold][: max_candidates]
    prev_rows = []
    for ix in cand_p:
        r = _effect_row(head_label(*key[ix]), "previous-token candidate", [key[ix]], meas.run([key[ix]], ind_head), clean, d_vocab)
        prev_rows.append(with_scores(r, ix))

    def feeds(r: dict) -> bool:
        return copies and (r["copying_removed"] >= min_share or r["induction_drop"] >= min_share)

    scored = [(r, ix) for r, ix in zip(prev_rows, cand_p) if prank[ix] >= threshold]
    chosen = sorted([(r, ix) for r, ix in scored if feeds(r) and _is_specific(r["specificity"], min_specificity)],
                    key=lambda t: -t[0]["copying_removed"])
    set_rows = []
    if len(cand_p) > 1 and set(cand_p) != {ix for _, ix in chosen}:
        heads = [key[ix] for ix in cand_p]
        set_rows.append(with_scores(_effect_row(PREV_CANDIDATES_SET, "set", heads, meas.run(heads, ind_head), clean, d_vocab), None))
    if not chosen and len(scored) > 1:  # no head alone: is the work shared between them?
        heads = [key[ix] for _, ix in scored]
        if len(scored) == len(cand_p):
            together = set_rows[0]
        else:
            together = with_scores(_effect_row(PREV_SCORED_SET, "set", heads, meas.run(heads, ind_head), clean, d_vocab), None)
            set_rows.append(together)
        if feeds(together) and _is_specific(together["specificity"], min_specificity):
            chosen = sorted(scored, key=lambda t: -t[0]["copying_removed"])
    circ.prev_tokens = [key[ix] for _, ix in chosen]
    if len(chosen) > 1:
        same = [r for r in set_rows if set(r["head_pairs"]) == set(circ.prev_tokens)]
        if same:
            same[0]["condition"] = PREV_SET
        else:
            set_rows.insert(0, with_scores(_effect_row(PREV_SET, "set", circ.prev_tokens, meas.run(circ.prev_tokens, ind_head),
                                                       clean, d_vocab), None))
    if circ.prev_tokens:
        heads = [*circ.prev_tokens, ind_head]
        set_rows.append(with_scores(_effect_row(CIRCUIT_SET, "set", heads, meas.run(heads, ind_head), clean, d_vocab), None))
        circ.prev_layer, circ.prev_head = circ.prev_tokens[0]
        circ.prev_score = float(prank[chosen[0][1]])
        circ.prev_earlier = True
    clean_row = _effect_row("clean", "clean", [], clean, clean, d_vocab)
    rows = [with_scores(clean_row, None), *ind_rows, *prev_rows, *set_rows]
    chosen_heads = {*circ.prev_tokens, *([ind_head] if ok else [])}
    for r in rows:
        r["chosen"] = r["n_heads"] == 1 and (int(r["layer"]), int(r["head"])) in chosen_heads
    circ.evidence = _effects_frame(rows, clean, meas, ind_head)
    circ.evidence.attrs.update(model=name, scores_on=on, threshold=threshold, min_share=min_share, min_specificity=min_specificity)
    ie = circ.induction_effect()
    circ.found = bool(ok) and bool(circ.prev_tokens) and ie is not None
    circ.confirmed, circ.kind, circ.copying = True, kind, meas.copying
    return circ


@torch.no_grad()
def attention_row(model, input, layer: int, head: int, pos: int = -1) -> pd.DataFrame:
    """Where one head looks from one position: a row per earlier position ``src_pos`` (0-based) with its
    ``token`` and attention ``weight`` (the weights sum to 1); ``attrs`` hold layer, block (= layer + 1), head, pos."""
    model = as_hooked(model)
    pats = attention_patterns(model, input, layers=[layer])
    T = pats.shape[-1]
    p = pos + T if pos < 0 else pos
    H = model.cfg.n_heads
    if not (0 <= p < T and 0 <= head < H):
        raise AblationError(f"no head {head} or position {pos} here: heads 0..{H - 1}, positions 0..{T - 1}")
    toks, _ = model.prepare_input(input)
    names = model.to_str_tokens(toks[0, : p + 1]) if model.tokenizer is not None else [f"#{i}" for i in toks[0, : p + 1].tolist()]
    df = pd.DataFrame({"src_pos": range(p + 1), "token": names, "weight": pats[0, head, p, : p + 1].tolist()})
    df.attrs.update(layer=layer, block=layer + 1, head=head, pos=p)
    return df
