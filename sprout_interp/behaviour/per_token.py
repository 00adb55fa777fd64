"""Per-token tables of the actual next token: its probability and loss, clean and with heads ablated.

Small helpers the dashboard (and a notebook) read token by token. One row per *predicted* token:
``pos`` is the 0-based input index of the predicted token (from 1; the token at 0 has nothing
before it), ``token`` that token and ``context`` the token before it (at ``pos - 1``): as in every
table of the library, ``token`` is the input token at ``pos``. Losses are
next-token cross-entropies in nats; probabilities are ``exp(-loss)``.

Layer convention for ``heads``: ``(layer, head)`` pairs, layers 0-indexed as in code
(``blocks.{layer}``), which is the chapter's block ``layer + 1``; heads 0-indexed.
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor

from sprout_interp.circuits.ablation import ablate
from sprout_interp.circuits.heads import Kind, check_heads
from sprout_interp.core.errors import ContextLengthError
from sprout_interp.core.hooked import as_hooked

__all__ = ["next_token_table", "ablation_effect"]


def _frame(model, toks: Tensor) -> pd.DataFrame:
    strs = model.to_str_tokens(toks[0]) if model.tokenizer is not None else [f"#{i}" for i in toks[0].tolist()]
    return pd.DataFrame({"pos": range(1, toks.shape[1]), "context": strs[:-1], "token": strs[1:]})


@torch.no_grad()
def next_token_table(model, tokens: Int[Tensor, "1 pos"] | str) -> pd.DataFrame:
    """One row per predicted token of one text: ``pos, context, token, prob, loss``.

    ``df.attrs["mean_loss"]`` is the mean loss (nats/token) over the text.
    """
    model = as_hooked(model)
    toks, _ = model.prepare_input(tokens)
    if toks.shape[0] != 1:
        raise ContextLengthError(f"next_token_table reads one text, got a batch of {toks.shape[0]}")
    if toks.shape[1] < 2:
        raise ContextLengthError("the text is a single token: there is no next token to predict")
    loss = model(toks, return_type="loss", loss_per_token=True)[0].float().cpu()
    df = _frame(model, toks)
    df["prob"] = torch.exp(-loss).numpy()
    df["loss"] = loss.numpy()
    df.attrs.update(mean_loss=float(loss.mean()))
    return df


@torch.no_grad()
def ablation_effect(
    model,
    tokens: Int[Tensor, "1 pos"] | str,
    heads: Sequence[tuple[int, int]],
    kind: Kind = "zero",
    reference=None,
) -> pd.DataFrame:
    """What ablating ``heads`` together does to each actual next token of one text.

    Columns: ``pos, context, token, clean_prob, ablated_prob, prob_change`` (ablated − clean),
    ``clean_loss, ablated_loss, loss_change`` (nats). ``df.attrs``: ``clean_loss``, ``ablated_loss``,
    ``loss_change`` (means over the text), ``heads``, ``kind``. ``kind`` and ``reference`` are as in
    :func:`sprout_interp.circuits.ablation.ablate`.
    """
    model = as_hooked(model)
    heads = check_heads(model, list(heads))
    toks, _ = model.prepare_input(tokens)
    clean = next_token_table(model, toks)
    res = ablate(model, toks, heads, kind=kind, reference=reference)
    abl = res.loss[0].float().cpu()
    df = clean.rename(columns={"prob": "clean_prob", "loss": "clean_loss"})
    df["ablated_prob"] = torch.exp(-abl).numpy()
    df["prob_change"] = df["ablated_prob"] - df["clean_prob"]
    df["ablated_loss"] = abl.numpy()
    df["loss_change"] = df["ablated_loss"] - df["clean_loss"]
    df = df[["pos", "context", "token", "clean_prob", "ablated_prob", "prob_change",
             "clean_loss", "ablated_loss", "loss_change"]]
    c, a = clean.attrs["mean_loss"], float(abl.mean())
    df.attrs.update(clean_loss=c, ablated_loss=a, loss_change=a - c, heads=list(heads), kind=kind)
    return df
