"""Several models on the same text: the probability each gives the actual next token.

- :func:`compare_models` – one row per predicted token, one probability column per model.
- :func:`name_copying_table` – invented-name copying (``sprout_model.evaluation.name_copying``) for
  several models in one long table.
- :func:`piece_probabilities` – the probability of a multi-token piece ("bin" = "b" then "in") as
  the product of its tokens' probabilities, to set our tokens beside the chapter's.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from sprout_interp.core.arguments import describe
from sprout_interp.core.errors import ArgumentError, SproutError
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.tokens import tokenizer_call

__all__ = ["compare_models", "name_copying_table", "piece_probabilities", "model_dict"]


def model_dict(models) -> dict[str, object]:
    """``{label: HookedSprout}`` from a mapping, or from a list of models (labelled by ``.name``) / shipped names / paths
    (labelled as given). Names and paths are loaded with ``sprout_interp.load``."""
    if isinstance(models, Mapping):
        items = list(models.items())
    else:
        if isinstance(models, str) or not isinstance(models, Sequence):
            models = [models]
        items = [(m if isinstance(m, str) else None, m) for m in models]
    out: dict[str, object] = {}
    for label, m in items:
        if isinstance(m, str):
            from sprout_interp.core.hooked import load_hooked as load

            m = load(m)
        m = as_hooked(m)
        label = str(label if label is not None else (m.name or f"model {len(out)}"))
        while label in out:
            label += "'"
        out[label] = m
    if not out:
        raise SproutError("no models to compare")
    return out


@torch.no_grad()
def compare_models(models, text: str | Sequence[str], prepend_bos: bool = False) -> pd.DataFrame:
    """The probability each model gives the actual next token, at every position of ``text``.

    ``models``: ``{label: model}`` or a list of HookedSprout / shipped names / paths. The models
    must tokenize ``text`` the same way (Sprout's models share one tokenizer). ``text``: a text, or a list of
    texts (of any lengths: each is read to its own end, exactly as alone; the padding is never predicted).

    Returns one row per predicted token: ``pos`` (its 0-based input index, from 1),
    ``context`` (the token before it), ``token`` (the token predicted), then one column per model
    label with P(token | everything before it). ``df.attrs["tokens"]`` holds every token string. For a list of
    texts, a first column ``text`` (the text's 0-based index in the list) and ``df.attrs["tokens"]`` a list per text.
    """
    ms = model_dict(models)
    ref_label, ref = next(iter(ms.items()))
    if ref.tokenizer is None:
        raise SproutError(f"{ref_label} has no tokenizer: compare_models needs text tokenized by the models' tokenizer")
    several = isinstance(text, (list, tuple))
    if several and (not text or not all(isinstance(t, str) for t in text)):
        raise ArgumentError(f"text must be a text or a non-empty list of texts, got {describe(text)}")
    if not several and not isinstance(text, str):
        raise ArgumentError(f"text must be a text or a non-empty list of texts, got {describe(text)}")
    texts = list(text) if several else [text]
    toks, mask = ref.to_tokens(texts, prepend_bos=prepend_bos, return_mask=True)
    lengths = [int(n) for n in mask.sum(1)]
    if min(lengths) < 2:
        which = f"text {lengths.index(min(lengths))} is" if several else "the text is"
        raise SproutError(f"{which} a single token: there is no next token to predict")
    strs = [ref.to_str_tokens(toks[i, :n]) for i, n in enumerate(lengths)]
    cols = {}
    for label, m in ms.items():
        if m.tokenizer is None or not torch.equal(m.to_tokens(texts, prepend_bos=prepend_bos).cpu(), toks.cpu()):
            raise SproutError(
                f"{label} tokenizes the text differently from {ref_label}: compare_models needs models that share a tokenizer"
            )
        logits = m(toks.to(m.device), attention_mask=None if bool(mask.all()) else mask.to(m.device))
        probs = torch.softmax(logits[:, :-1].float(), dim=-1)
        p = probs.gather(-1, toks[:, 1:, None].to(probs.device))[..., 0].cpu()
        cols[label] = np.concatenate([p[i, :n - 1].numpy() for i, n in enumerate(lengths)])
    df = pd.DataFrame({
        "pos": [j for n in lengths for j in range(1, n)],
        "context": [t for s in strs for t in s[:-1]], "token": [t for s in strs for t in s[1:]], **cols})
    if several:
        df.insert(0, "text", [i for i, n in enumerate(lengths) for _ in range(n - 1)])
    df.attrs.update(tokens=strs if several else strs[0], models=list(ms), text=text)
    return df


def name_copying_table(models, texts=None) -> pd.DataFrame:
    """Invented-name copying for each model, one row per (model, name, occurrence, token).

    ``texts``: ``[(name, text), ...]`` with each name twice after a space (default
    ``sprout_model.evaluation.NAME_TEXTS``). Columns: ``model, name, occurrence`` (1 or 2),
    ``index`` (the token's place in the name, 1 = the second token; the first token is a surprise
    and left out), ``token`` (as text: " Pl", not the BPE's "ĠPl"), ``prob`` (P(token | text before it)).
    """
    from sprout_model.evaluation import name_copying

    rows = []
    for label, m in model_dict(models).items():
        if m.tokenizer is None:
            raise SproutError(f"{label} has no tokenizer")
        res = name_copying(m.model, m.tokenizer, texts)
        for r in res.per_text:
            later = [_readable(m.tokenizer, t) for t in r["tokens"][1:]]
            for occ, key in ((1, "first"), (2, "second")):
                for i, (tok, p) in enumerate(zip(later, r[key]), start=1):
                    rows.append(dict(model=label, name=r["name"], occurrence=occ, index=i, token=tok, prob=p))
    return pd.DataFrame(rows)


def _readable(tokenizer, token: str) -> str:
    """A tokenizer's internal token string (byte-level BPE: "ĠPl") as text (" Pl")."""
    dec = getattr(tokenizer, "decoder", None)
    if dec is None:
        return token
    try:
        return tokenizer_call("decoding a token", dec.decode, [token])
    except Exception:  # a decoder that cannot read the token (a Rust panic arrives as TokenizationError)
        return token


def piece_probabilities(tokens: Sequence[str], probs: Sequence[float], pieces: Sequence[str]) -> list[dict]:
    """Group consecutive ``tokens`` (with their probabilities) into ``pieces`` of text.

    Each piece's probability is the product of its tokens' probabilities (the chance of producing
    the whole piece). Leading spaces are ignored when matching; a piece the tokens do not line up with
    raises SproutError. Returns ``[{"piece", "tokens", "prob"}, ...]``.
    """
    out, i = [], 0
    for piece in pieces:
        want, got, toks, p = piece.strip(), "", [], 1.0
        while i < len(tokens) and len(got.strip()) < len(want):
            got += tokens[i]
            toks.append(tokens[i])
            p *= float(probs[i])
            i += 1
        if got.strip() != want:
            raise SproutError(f"the tokens {list(tokens)} do not line up with the piece {piece!r}")
        out.append({"piece": piece, "tokens": toks, "prob": p})
    return out
