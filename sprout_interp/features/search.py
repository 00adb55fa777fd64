"""Finding features tied to the chapter's story, with the measurements that name them.

- :func:`name_positions`: where each invented name of ``sprout_model.evaluation``'s name texts sits (its first
  and second occurrence, token by token).
- :func:`second_name_features`: the latents that fire on a name's *second* occurrence and not on its first one
  (the same tokens) nor elsewhere: mean activation at each kind of position.
- :func:`previous_token_features`: latents whose firing is fixed by the token *before* the one they fire on (one
  previous token carries most of their activation while the current tokens vary), with their mean activation
  after that token and elsewhere.
- :func:`name_copying_with_features`: the chapter's name-copying measure with latents ablated (clamped to 0,
  error term kept) through :mod:`sprout_interp.features.splice`, beside a control of latents that fire as often.
- :func:`rate_matched_controls`: that control: for each latent, the other latent whose firing rate is closest.
- :func:`repeated_names`: the names any text repeats, found from its tokens alone (where a copy can be read).

All tables: ``layer`` 0-indexed, ``block`` = layer + 1, ``feature``, ``pos`` 0-based.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

import pandas as pd
import torch

from sprout_interp.core.errors import SproutError
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.tokens import tokenizer_call
from sprout_interp.features.pages import FeatureIndex, index_features
from sprout_interp.features.sae import SparseAutoencoder
from sprout_interp.features.splice import spliced

__all__ = [
    "name_texts", "name_positions", "second_name_features", "previous_token_features", "name_copying_with_features",
    "rate_matched_controls", "repeated_names",
]


def name_texts(which: str = "all") -> list[tuple[str, str]]:
    """The invented-name texts: ``"chosen"`` (NAME_TEXTS), ``"held_out"`` (HELDOUT_NAME_TEXTS) or ``"all"``."""
    from sprout_model.evaluation import HELDOUT_NAME_TEXTS, NAME_TEXTS

    sets = {"chosen": list(NAME_TEXTS), "held_out": list(HELDOUT_NAME_TEXTS),
            "all": list(NAME_TEXTS) + list(HELDOUT_NAME_TEXTS)}
    if which not in sets:
        raise SproutError(f"which must be one of {sorted(sets)}, got {which!r}")
    return sets[which]


def name_positions(model, texts: Optional[Sequence[tuple[str, str]]] = None) -> pd.DataFrame:
    """One row per token of each name occurrence: ``text, name, occurrence (1/2), piece (0 = the name's first
    token), pos, token``, found as ``sprout_model.evaluation.name_copying`` finds them (by character offsets)."""
    m = as_hooked(model)
    rows = []
    for t, (name, text) in enumerate(texts or name_texts()):
        enc = tokenizer_call("encoding a name text", m.tokenizer.encode, text, add_special_tokens=False)
        starts = [i for i in range(len(text)) if text.startswith(" " + name, i)]
        if len(starts) != 2:
            raise SproutError(f"{name!r} must appear exactly twice after a space in its text")
        for occ, s in enumerate(starts, 1):
            span = [i for i, (a, b) in enumerate(enc.offsets) if a < s + len(name) + 1 and b > s]
            for piece, p in enumerate(span):
                rows.append(dict(text=t, name=name, occurrence=occ, piece=piece, pos=p, token=enc.tokens[p]))
    return pd.DataFrame(rows)


def _index_texts(model, sae: SparseAutoencoder, texts) -> FeatureIndex:
    return index_features(model, sae, [text for _, text in texts])


def _means(acts: torch.Tensor, masks: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Mean activation of every latent over the positions of each mask: acts (batch, pos, d_sae)."""
    return {k: acts[v].mean(0) if bool(v.any()) else torch.zeros(acts.shape[-1]) for k, v in masks.items()}


def second_name_features(
    model, sae: SparseAutoencoder, texts: Optional[Sequence[tuple[str, str]]] = None, pieces: str = "later", n: int = 10,
) -> pd.DataFrame:
    """Latents ranked by how much more they fire on names' second occurrences than on anything else.

    ``pieces``: which tokens of an occurrence count: ``"first"`` (the name's first token), ``"later"`` (every
    token after it: where the model can copy) or ``"all"``. Columns: ``layer, block, feature, second`` (mean
    activation there), ``first`` (the same tokens at the first occurrence), ``elsewhere`` (every other real
    token), ``texts_firing`` (texts in which it fires on the second occurrence), ``score`` (second minus the
    larger of first and elsewhere).
    """
    texts = list(texts or name_texts())
    idx = _index_texts(model, sae, texts)
    pos = name_positions(model, texts)
    pos = pos[pos["piece"] == 0] if pieces == "first" else pos[pos["piece"] > 0] if pieces == "later" else pos
    B, T = idx.tokens.shape
    acts = torch.zeros(B, T, sae.d_sae).scatter_(-1, idx.idx, idx.vals)
    real = torch.ones(B, T, dtype=torch.bool) if idx.mask is None else idx.mask.clone()
    second, first = torch.zeros(B, T, dtype=torch.bool), torch.zeros(B, T, dtype=torch.bool)
    for r in pos.itertuples():
        (second if r.occurrence == 2 else first)[r.text, r.pos] = True
    names_all = torch.zeros(B, T, dtype=torch.bool)
    for r in name_positions(model, texts).itertuples():
        names_all[r.text, r.pos] = True
    mean = _means(acts, {"second": second, "first": first, "elsewhere": real & ~names_all})
    per_text = torch.stack([(acts[b][second[b]] > 0).any(0) for b in range(B)]).sum(0)
    score = mean["second"] - torch.maximum(mean["first"], mean["elsewhere"])
    top = torch.topk(score, n).indices
    df = pd.DataFrame({
        "layer": sae.layer, "block": sae.layer + 1, "feature": top.tolist(),
        "second": mean["second"][top].tolist(), "first": mean["first"][top].tolist(),
        "elsewhere": mean["elsewhere"][top].tolist(), "texts_firing": per_text[top].tolist(),
        "score": score[top].tolist(),
    })
    df.attrs.update(pieces=pieces, n_texts=B, units="mean activation (SAE units) over the positions of each kind")
    return df


def previous_token_features(
    model, sae: SparseAutoencoder, index: Optional[FeatureIndex] = None, n: int = 10, min_firings: int = 30,
) -> pd.DataFrame:
    """Latents whose firing is fixed by the previous token, on ``index`` (default the held-out sample).

    For every latent with at least ``min_firings`` firings: ``prev_share`` = the share of its activation mass on
    tokens that follow its most common previous token, ``cur_share`` = the same for its most common current token.
    The candidates with the largest ``prev_share - cur_share`` are ranked by ``tracking`` = ``prev_share`` x
    ``fires_after``: a latent that tracks the previous token fires (nearly) whenever that token came before, and
    (mostly) only then. Columns: ``layer, block, feature, prev_token, prev_share, cur_token,
    cur_share, distinct_current`` (distinct tokens it fires on after ``prev_token``), ``after`` (its mean
    activation at positions after ``prev_token``), ``elsewhere`` (its mean activation at every other position),
    ``fires_after`` (share of positions after ``prev_token`` on which it fires), ``firings``, ``tracking``.
    """
    index = index_features(model, sae) if index is None else index
    B, T = index.tokens.shape
    active = index.vals > 0
    if index.mask is not None:
        active &= index.mask[..., None]
    active[:, 0] = False  # no previous token at position 0
    b, p, s = active.nonzero(as_tuple=True)
    feats, vals = index.idx[b, p, s], index.vals[b, p, s]
    cur, prev = index.tokens[b, p], index.tokens[b, p - 1]
    V = int(index.tokens.max()) + 1
    firings = torch.bincount(feats, minlength=sae.d_sae)
    mass = torch.zeros(sae.d_sae).scatter_add_(0, feats, vals)

    def top_share(tok: torch.Tensor):
        key = feats * V + tok
        uniq, inv = torch.unique(key, return_inverse=True)
        m = torch.zeros(len(uniq)).scatter_add_(0, inv, vals)
        f_of = uniq // V
        best = torch.full((sae.d_sae,), -1.0)
        best.scatter_reduce_(0, f_of, m, reduce="amax")
        arg = torch.full((sae.d_sae,), -1, dtype=torch.long)
        hit = m == best[f_of]
        arg[f_of[hit]] = uniq[hit] % V
        return best.clamp_min(0) / mass.clamp_min(1e-9), arg

    prev_share, prev_tok = top_share(prev)
    cur_share, cur_tok = top_share(cur)
    score = torch.where(firings >= min_firings, prev_share - cur_share, torch.full_like(prev_share, -2.0))
    top = torch.topk(score, min(max(5 * n, 50), sae.d_sae)).indices.tolist()  # candidates, re-ranked below
    strings = index.token_strings
    real = torch.ones(B, T, dtype=torch.bool) if index.mask is None else index.mask
    rows = []
    for f in top:
        a = (index.vals * (index.idx == f)).sum(-1)  # (B, T)
        after = torch.zeros(B, T, dtype=torch.bool)
        after[:, 1:] = index.tokens[:, :-1] == int(prev_tok[f])
        after &= real
        other = real & ~after
        sel = (feats == f) & (prev == prev_tok[f])
        rows.append(dict(
            layer=sae.layer, block=sae.layer + 1, feature=f, prev_token=strings[int(prev_tok[f])],
            prev_share=float(prev_share[f]), cur_token=strings[int(cur_tok[f])], cur_share=float(cur_share[f]),
            distinct_current=int(torch.unique(cur[sel]).numel()),
            after=float(a[after].mean()) if bool(after.any()) else float("nan"),
            elsewhere=float(a[other].mean()) if bool(other.any()) else float("nan"),
            fires_after=float((a[after] > 0).float().mean()) if bool(after.any()) else float("nan"),
            firings=int(firings[f]),
        ))
    df = pd.DataFrame(rows)
    df["tracking"] = df["prev_share"] * df["fires_after"].fillna(0)
    df = df[df["firings"] >= min_firings].sort_values("tracking", ascending=False, kind="stable").head(n)
    df = df.reset_index(drop=True)
    df.attrs.update(n_tokens=index.n_tokens, units="shares of activation mass; after/elsewhere: mean activation")
    return df


def name_copying_with_features(
    model, sae: SparseAutoencoder, conditions: Mapping[str, Sequence[int]],
    texts: Optional[Sequence[tuple[str, str]]] = None,
) -> pd.DataFrame:
    """``sprout_model.evaluation.name_copying`` with each set of latents ablated (activation clamped to 0 at every
    position, error term kept, so only those latents' contribution leaves the stream). ``conditions`` maps a
    label to latents (``[]`` = clean). Columns: ``condition, features, first, second`` (mean probability of the
    names' later tokens at their first and second occurrence)."""
    from sprout_model.evaluation import name_copying

    m = as_hooked(model)
    texts = list(texts or name_texts())
    rows = []
    for label, feats in conditions.items():
        with torch.no_grad(), spliced(m, sae, keep_error=True, clamp={int(f): 0.0 for f in feats}):
            res = name_copying(lambda ids: (m(ids.to(m.device)), None), m.tokenizer, texts)
        rows.append(dict(condition=label, features=" ".join(str(int(f)) for f in feats) or "-",
                         first=res.first_mean_prob, second=res.mean_prob))
    df = pd.DataFrame(rows)
    df.attrs.update(layer=sae.layer, block=sae.layer + 1, units="probability")
    return df


def rate_matched_controls(table: pd.DataFrame, features: Sequence[int]) -> list[int]:
    """For each latent of ``features`` in order, the control latent whose firing rate is closest to its own.

    ``table``: :func:`sprout_interp.features.pages.feature_table`'s rows (columns ``feature``, ``frequency``:
    the share of tokens a latent fires on). A control is never one of ``features`` and never used twice, so
    ablating all the controls together matches ablating all the features together in how often something is
    removed; ties go to the lower latent id. Returns latent ids, one per feature, in the order given.
    """
    feats = [int(f) for f in features]
    if len(set(feats)) != len(feats):
        raise SproutError("rate_matched_controls: the features repeat; pass each latent once")
    rate = dict(zip(table["feature"].astype(int), table["frequency"].astype(float)))
    missing = [f for f in feats if f not in rate]
    if missing:
        raise SproutError(f"rate_matched_controls: latents {missing} are not in the table; "
                          "build it with feature_table(model, sae, index) over every latent")
    pool = sorted(set(rate) - set(feats))
    if len(pool) < len(feats):
        raise SproutError(f"rate_matched_controls: {len(feats)} features but only {len(pool)} other latents")
    controls = []
    for f in feats:
        pick = min(pool, key=lambda c: (abs(rate[c] - rate[f]), c))
        controls.append(pick)
        pool.remove(pick)
    return controls


def repeated_names(str_tokens: Sequence[str]) -> pd.DataFrame:
    """The names a typed text repeats, found from its tokens alone (no list of names needed, unlike
    :func:`name_positions`): one row per token of each occurrence of a capitalised word of two or more tokens (an
    invented name falls into pieces, so a copy of its later pieces can be measured) that appeared earlier in the
    text. Columns as :func:`name_positions`'s, less ``text``: ``name, occurrence`` (1 = first), ``piece`` (0 = the
    name's first token), ``pos`` (0-based index into ``str_tokens``), ``token``; names ordered by where they first
    repeat. Empty (with those columns) when nothing repeats.

    >>> df = repeated_names([" Old", " Z", "orbin", " came", ".", " Z", "orbin", " left"])
    >>> df[df.occurrence == 2].pos.tolist()
    [5, 6]
    """
    toks = [str(t) for t in str_tokens]
    words: list[tuple[str, list[int]]] = []  # (word, its positions) for every capitalised word of 2+ tokens
    i = 0
    while i < len(toks):
        head = toks[i].lstrip(" ")
        if head[:1].isupper() and head.isalpha():
            j = i + 1
            while j < len(toks) and toks[j][:1].isalpha() and toks[j].islower():  # a piece glued on, no space
                j += 1
            if j - i >= 2:
                words.append(("".join(toks[i:j]).strip(), list(range(i, j))))
            i = j
        else:
            i += 1
    seen: dict[str, list[list[int]]] = {}
    for word, span in words:
        seen.setdefault(word, []).append(span)
    repeated = sorted((spans for spans in seen.values() if len(spans) > 1), key=lambda spans: spans[1][0])
    rows = [dict(name=toks[spans[0][0]].lstrip(" ") + "".join(toks[p] for p in spans[0][1:]), occurrence=occ,
                 piece=piece, pos=p, token=toks[p])
            for spans in repeated for occ, span in enumerate(spans, 1) for piece, p in enumerate(span)]
    return pd.DataFrame(rows, columns=["name", "occurrence", "piece", "pos", "token"])
