"""Attention patterns and head scores: where each head looks, and how much like a previous-token,
duplicate-token or induction head it looks.

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
copy / loss on the first) with that head ablated. Scores are correlational; the causal evidence is in
:mod:`sprout_interp.circuits.evidence` and the circuit built on both in :mod:`sprout_interp.circuits.induction`.

Layers are 0-indexed as in code (``blocks.{layer}``); tables add ``block`` = layer + 1, the chapter's
"layer N". Heads are 0-indexed.
"""
from __future__ import annotations

from functools import partial
from typing import Optional, Sequence, Union

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sprout_interp.circuits.ablation import ablation_sweep
from sprout_interp.circuits.heads import CONVENTION, Kind
from sprout_interp.core.arguments import check_count, check_index, check_indices
from sprout_interp.core.errors import AblationError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout, as_hooked

__all__ = ["attention_patterns", "score_masks", "pattern_scores", "head_scores", "natural_tokens", "attention_row", "SCORE_COLUMNS"]

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
    what = f"this model has {L} blocks, layers 0..{L - 1} in code (the chapter's 1..{L})"
    layers = list(range(L)) if layers is None else check_indices(layers, "layers", L, what=what, error=AblationError)
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
    batch_size = check_count(batch_size, "batch_size", what="rows run together in one forward", error=AblationError)
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


def natural_tokens(model: HookedSprout, natural, n: int, length: int, seed: int):
    """``natural`` if given, else ``n`` held-out windows of ``length`` tokens (seeded), else the three ready-made
    texts where no corpus is installed: the natural text the head scores and the evidence read."""
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
        One row per head; the scores are shares of attention, from 0 to 1:

        | column | meaning |
        |---|---|
        | ``layer``, ``block``, ``head`` | layer 0-indexed (code), block = layer + 1 (the chapter's count), head 0-indexed |
        | ``prev_token_random``, ``prev_token_text`` | mean attention from each position to the one before it, on repeated random tokens / on text |
        | ``duplicate_random``, ``duplicate_text`` | attention to earlier occurrences of the position's own token |
        | ``induction_random``, ``induction_text`` | attention to the tokens *after* earlier occurrences of its own token |
        | ``copying_ratio_ablated`` | loss on the second copy / loss on the first, with the head ablated (``copying=True``) |
        | ``copying_ratio_change`` | that minus the clean ratio (``df.attrs["clean_copying_ratio"]``); positive: the head helps copying |
    """
    from sprout_model.evaluation import repeated_tokens_batch

    model = as_hooked(model)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    seq_len = check_count(seq_len, "seq_len", low=2, high=model.cfg.n_ctx // 2, error=AblationError,
                          what=f"random tokens repeated twice: 2 * seq_len must fit the model's context of {model.cfg.n_ctx}")
    batch = check_count(batch, "batch", what="rows of repeated random tokens", error=AblationError)
    if natural is None:
        natural_n = check_count(natural_n, "natural_n", what="held-out windows scored", error=AblationError)
        natural_length = check_count(natural_length, "natural_length", low=2, error=AblationError,
                                     what="tokens per held-out window; windows are cut to the context")
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
        nat = pattern_scores(model, natural_tokens(model, natural, natural_n, natural_length, seed))
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



@torch.no_grad()
def attention_row(model, input, layer: int, head: int, pos: int = -1) -> pd.DataFrame:
    """Where one head looks from one position: a row per earlier position ``src_pos`` (0-based) with its
    ``token`` and attention ``weight`` (the weights sum to 1); ``attrs`` hold layer, block (= layer + 1), head, pos."""
    model = as_hooked(model)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    layer = check_index(layer, "layer", L, what=f"this model has {L} blocks, layers 0..{L - 1} in code", error=AblationError)
    head = check_index(head, "head", H, what=f"{H} heads per block", error=AblationError)
    pats = attention_patterns(model, input, layers=[layer])
    T = pats.shape[-1]
    p = check_index(pos, "pos", T, negative=True, what=f"a position of the input's {T} tokens", error=AblationError)
    toks, _ = model.prepare_input(input)
    names = model.to_str_tokens(toks[0, : p + 1]) if model.tokenizer is not None else [f"#{i}" for i in toks[0, : p + 1].tolist()]
    df = pd.DataFrame({"src_pos": range(p + 1), "token": names, "weight": pats[0, head, p, : p + 1].tolist()})
    df.attrs.update(layer=layer, block=layer + 1, head=head, pos=p)
    return df
