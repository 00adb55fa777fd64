"""Attention patterns, head scores and the induction circuit.

Head scores (one number per head, from ``blocks.{l}.attn.hook_pattern``, rows = queries, columns = keys):

- **previous-token**: mean attention from each position ``q >= 1`` to ``q - 1``;
- **duplicate-token**: attention from a position to the earlier occurrences ``k < q`` of its own token,
  averaged over the positions whose token occurred before;
- **induction**: attention from a position to the tokens *after* the earlier occurrences of its own
  token (keys ``k < q`` with ``token[k - 1] == token[q]``), averaged over the positions that have one.

Each is measured (a) on the standard test, a seeded batch of random tokens repeated twice
(``sprout_model.evaluation.repeated_tokens_batch``), where an induction head attends to the token
after the first copy, and (b) on natural held-out text (``sprout_interp.texts.validation_sample``).
:func:`head_scores` adds each head's part in in-context copying: the copying ratio (loss on the second
copy / loss on the first) with that head ablated. :func:`find_induction_circuit` picks the best
previous-token head and the best induction head and says whether the first sits in an earlier block,
as the chapter's gpt-4 has it (a previous-token head in layer 2 and an induction head in layer 3).

Layers are 0-indexed as in code (``blocks.{layer}``); tables add ``block`` = layer + 1, the chapter's
"layer N". Heads are 0-indexed.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from typing import Optional, Sequence, Union

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .ablation import CONVENTION, Kind, ablation_sweep, as_hooked, prepare_tokens
from .errors import AblationError
from .hooked import HookedSprout

__all__ = [
    "attention_patterns", "score_masks", "pattern_scores", "head_scores", "find_induction_circuit",
    "InductionCircuit", "SCORE_COLUMNS",
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
    toks, mask = prepare_tokens(model, input, attention_mask)
    L = model.cfg.n_layers
    layers = list(range(L)) if layers is None else [int(l) for l in layers]
    for l in layers:
        if not 0 <= l < L:
            raise AblationError(f"there is no layer {l}: this model has {L} blocks, layers 0..{L - 1} in code (the chapter's 1..{L})")
    names = [f"blocks.{l}.attn.hook_pattern" for l in layers]
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
    toks, mask = prepare_tokens(model, tokens, attention_mask)
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

        hooks = [(f"blocks.{l}.attn.hook_pattern", partial(reduce, layer=l)) for l in range(L)]
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
        from .texts import held_out_for

        return held_out_for(model, n, length, seed)
    except (ImportError, OSError, ValueError, RuntimeError):  # RuntimeError: sprout_model.corpus.CorpusError
        from .texts import TEXTS

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
        reference: for ``copying_kind`` "mean"/"resample" (see ``sprout_interp.ablation.ablate``).

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
# the circuit


@dataclass
class InductionCircuit:
    """The best previous-token head and the best induction head of a model (layers 0-indexed; ``*_block`` = layer + 1).

    ``prev_earlier``: the previous-token head sits in an earlier block than the induction head (the
    chapter's order). ``prev_before_*``: the best previous-token head among the blocks before the
    induction head's (None when that is the first block). ``found``: both scores reach ``threshold``
    and a previous-token head that reaches it sits in an earlier block.
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

    @property
    def prev_block(self) -> int:
        return self.prev_layer + 1

    @property
    def induction_block(self) -> int:
        return self.induction_layer + 1

    def heads(self) -> list[tuple[int, int]]:
        """``[(prev_layer, prev_head), (induction_layer, induction_head)]``, 0-indexed, for ``ablate``."""
        return [(self.prev_layer, self.prev_head), (self.induction_layer, self.induction_head)]

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(prev_block=self.prev_block, induction_block=self.induction_block)
        return d

    def summary(self) -> str:
        """One line a person reads: blocks counted from 1 as in the chapter, code layers in brackets."""
        s = (
            f"{self.model or 'model'}: best previous-token head block {self.prev_block} head {self.prev_head} "
            f"(blocks.{self.prev_layer}, score {self.prev_score:.2f}); best induction head block {self.induction_block} "
            f"head {self.induction_head} (blocks.{self.induction_layer}, score {self.induction_score:.2f}); "
        )
        s += "previous-token head in an earlier block" if self.prev_earlier else "previous-token head NOT in an earlier block"
        if not self.prev_earlier and self.prev_before_layer is not None:
            s += f" (best earlier one: block {self.prev_before_layer + 1} head {self.prev_before_head}, score {self.prev_before_score:.2f})"
        return s + ("; circuit found" if self.found else f"; no circuit at threshold {self.threshold:.2f}")


def find_induction_circuit(
    model=None, scores: Optional[pd.DataFrame] = None, on: str = "random", threshold: float = 0.3, **head_scores_kwargs
) -> InductionCircuit:
    """The best previous-token head and the best induction head, and whether the former is earlier.

    ``scores``: a :func:`head_scores` table (computed with ``copying=False`` when None). ``on``:
    "random" (the repeated random tokens, default) or "text" (natural text) columns.
    """
    if on not in ("random", "text"):
        raise AblationError(f"on must be 'random' or 'text', got {on!r}")
    if scores is None:
        if model is None:
            raise AblationError("pass a model or a head_scores table")
        head_scores_kwargs.setdefault("copying", False)
        if on == "random":
            head_scores_kwargs.setdefault("natural", False)
        scores = head_scores(model, **head_scores_kwargs)
    pcol, icol = f"prev_token_{on}", f"induction_{on}"
    if pcol not in scores or icol not in scores:
        raise AblationError(f"the scores table has no {pcol!r}/{icol!r} columns (was it made with natural=False?)")
    p = scores.loc[scores[pcol].idxmax()]
    i = scores.loc[scores[icol].idxmax()]
    il = int(i["layer"])
    earlier = scores[scores["layer"] < il]
    pb = earlier.loc[earlier[pcol].idxmax()] if len(earlier) else None
    found = bool(i[icol] >= threshold and pb is not None and pb[pcol] >= threshold)
    name = scores.attrs.get("model", "") or (getattr(model, "name", "") if model is not None else "")
    ratio = scores.attrs.get("clean_copying_ratio")
    return InductionCircuit(
        model=name,
        prev_layer=int(p["layer"]), prev_head=int(p["head"]), prev_score=float(p[pcol]),
        induction_layer=il, induction_head=int(i["head"]), induction_score=float(i[icol]),
        prev_earlier=int(p["layer"]) < il,
        prev_before_layer=None if pb is None else int(pb["layer"]),
        prev_before_head=None if pb is None else int(pb["head"]),
        prev_before_score=None if pb is None else float(pb[pcol]),
        threshold=threshold, found=found, scores_on=on,
        clean_copying_ratio=None if ratio is None else float(ratio),
    )
