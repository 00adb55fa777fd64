"""The residual stream after the embedding and after every block, and how its size grows.

Rows are ordered: row 0 is the stream right after the embedding, row l+1 the stream after block l
(0-indexed in code), i.e. "after block l+1" as the chapter counts.
"""
from __future__ import annotations

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor


def stream_names(n_layers: int) -> list[str]:
    """Hook names of the stream: ``hook_embed`` then ``blocks.{l}.hook_resid_post`` for l = 0..n_layers-1."""
    return ["hook_embed"] + [f"blocks.{l}.hook_resid_post" for l in range(n_layers)]


def row_labels(n_layers: int) -> list[str]:
    """People's names for the rows: "embedding", "block 1" … "block L" (blocks counted from 1, as the chapter does)."""
    return ["embedding"] + [f"block {l + 1}" for l in range(n_layers)]


@torch.no_grad()
def residual_stack(model, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "row batch pos d_model"]:
    """The stream after the embedding and after each block, stacked (row 0 = embedding)."""
    names = stream_names(model.cfg.n_layers)
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return torch.stack([cache[n] for n in names])


def _mask(tokens: Tensor, attention_mask: Tensor | None) -> Tensor:
    return torch.ones_like(tokens, dtype=torch.bool) if attention_mask is None else attention_mask.bool()


@torch.no_grad()
def residual_rms(
    model,
    tokens: Int[Tensor, "batch pos"],
    attention_mask: Bool[Tensor, "batch pos"] | None = None,
    per_position: bool = False,
) -> pd.DataFrame:
    """RMS over d_model of the stream, averaged over the real (unpadded) positions of every sequence.

    Returns one row per stream row with columns ``row`` (label), ``block`` (1-indexed; 0 = embedding),
    ``layer`` (0-indexed hook layer; -1 = embedding), ``rms`` and ``growth`` (rms / the embedding's rms).
    With ``per_position=True`` it has one row per (stream row, position) instead, averaged over the batch,
    with an extra ``pos`` column.
    """
    stack = residual_stack(model, tokens)
    rms = stack.pow(2).mean(-1).sqrt()  # (row, batch, pos)
    mask = _mask(tokens, attention_mask).to(rms.dtype)
    labels = row_labels(model.cfg.n_layers)
    if per_position:
        per = (rms * mask).sum(1) / mask.sum(0).clamp(min=1)  # (row, pos)
        recs = [
            {"row": labels[r], "block": r, "layer": r - 1, "pos": p, "rms": per[r, p].item(),
             "growth": (per[r, p] / per[0, p]).item()}
            for r in range(per.shape[0]) for p in range(per.shape[1]) if mask[:, p].any()
        ]
        return pd.DataFrame.from_records(recs)
    mean = (rms * mask).sum((1, 2)) / mask.sum()
    return pd.DataFrame({
        "row": labels, "block": range(len(labels)), "layer": range(-1, len(labels) - 1),
        "rms": mean.tolist(), "growth": (mean / mean[0]).tolist(),
    })
