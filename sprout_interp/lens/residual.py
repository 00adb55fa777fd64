"""The residual stream after the embedding and after every block, and how its size grows.

Rows of the stream, in order: row 0 is the stream right after the embedding (``hook_embed``), row
``r`` (r >= 1) the stream after block ``r`` as the chapter counts blocks (from 1), which is
``blocks.{r-1}.hook_resid_post`` in code (layers 0-indexed). Tables carry both: ``block``
(1-indexed, 0 = embedding) and ``layer`` (0-indexed hook layer, -1 = embedding).

The chapter (section "RMSNorm: keeping the numbers in check") measured its gpt-4: the root mean
square of the stream, averaged over held-out text, is about 0.18 after the embedding, around 10
after block 1 and around 35 after block 4, "some two hundred times bigger". :data:`CHAPTER_GPT4_RMS`
holds those figures so scripts and the dashboard can print them beside ours.
"""
from __future__ import annotations

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.tokens import ModelInput

__all__ = [
    "CHAPTER_GPT4_RMS", "CHAPTER_GPT4_GROWTH", "as_hooked", "stream_names", "row_labels",
    "residual_stack", "stream_rms", "residual_rms", "growth_claims",
]

#: The chapter's gpt-4 figures: RMS of the stream by block (0 = after the embedding, blocks from 1).
CHAPTER_GPT4_RMS: dict[int, float] = {0: 0.18, 1: 10.0, 4: 35.0}
#: "some two hundred times bigger": after the last block of gpt-4 (block 4) relative to the embedding.
CHAPTER_GPT4_GROWTH: float = 200.0




def stream_names(n_layers: int) -> list[str]:
    """Hook names of the stream rows: ``hook_embed`` then ``blocks.{l}.hook_resid_post`` for l = 0..n_layers-1."""
    return ["hook_embed"] + [act_name("resid_post", l) for l in range(n_layers)]


def row_labels(n_layers: int) -> list[str]:
    """People's names for the rows: "embedding", "block 1" … "block L" (blocks counted from 1, as the chapter does)."""
    return ["embedding"] + [f"block {l + 1}" for l in range(n_layers)]


def _mask(tokens: Tensor, attention_mask: Tensor | None) -> Tensor:
    if attention_mask is None:
        return torch.ones_like(tokens, dtype=torch.bool)
    if attention_mask.shape != tokens.shape:
        from sprout_interp.core.errors import SproutError

        raise SproutError(f"attention_mask has shape {tuple(attention_mask.shape)} but tokens have {tuple(tokens.shape)}")
    return attention_mask.to(tokens.device).bool()


@torch.no_grad()
def residual_stack(model, tokens) -> Float[Tensor, "row batch pos d_model"]:
    """The stream after the embedding and after each block, stacked (row 0 = embedding, row r = after block r).

    ``tokens``: a text, a list of texts of the same length, or ids ``(batch, pos)`` / ``(pos,)``. Texts of
    different lengths raise UnequalLengthsError (the stack would hold the padding's rows):
    :func:`residual_rms` takes them and leaves the padding out.
    """
    model = as_hooked(model)
    tokens, _ = model.prepare_input(tokens, padding=False, argument="tokens")
    names = stream_names(model.cfg.n_layers)
    _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None)
    return torch.stack([cache[n] for n in names])


@torch.no_grad()
def stream_rms(model, tokens) -> Float[Tensor, "row batch pos"]:
    """RMS over d_model of every stream row at every position: ``sqrt(mean_i x_i²)`` (the chapter's RMS(x), no ε)."""
    return residual_stack(model, tokens).float().pow(2).mean(-1).sqrt()


@torch.no_grad()
def residual_rms(
    model,
    tokens: ModelInput,
    attention_mask: Bool[Tensor, "batch pos"] | None = None,
    per_position: bool = False,
) -> pd.DataFrame:
    """RMS over d_model of the stream after the embedding and after each block.

    ``tokens``: a text, a list of texts (right-padded; the padding is left out), or token ids.

    The RMS of every position's vector is averaged over the real (unpadded, ``attention_mask`` True)
    positions of all sequences. Returns one row per stream row with columns ``row`` (label),
    ``block`` (1-indexed; 0 = embedding), ``layer`` (0-indexed hook layer; -1 = embedding), ``rms``,
    ``growth`` (rms / the embedding row's rms) and ``n_tokens``.

    With ``per_position=True`` it has one row per (stream row, position) instead, averaged over the
    sequences that are real at that position, with an extra ``pos`` column (``growth`` is then
    relative to the embedding at the same position).
    """
    model = as_hooked(model)
    tokens, attention_mask = model.prepare_input(tokens, attention_mask)
    mask = _mask(tokens, attention_mask)
    rms = stream_rms(model, tokens)  # (row, batch, pos)
    w = mask.to(rms.dtype)
    labels = row_labels(model.cfg.n_layers)
    R = rms.shape[0]
    if per_position:
        count = w.sum(0)  # (pos,)
        per = (rms * w).sum(1) / count.clamp(min=1)  # (row, pos)
        keep = (count > 0).nonzero().flatten().tolist()
        recs = [
            {"row": labels[r], "block": r, "layer": r - 1, "pos": p, "rms": per[r, p].item(),
             "growth": (per[r, p] / per[0, p]).item(), "n_tokens": int(count[p])}
            for r in range(R) for p in keep
        ]
        return pd.DataFrame.from_records(recs, columns=["row", "block", "layer", "pos", "rms", "growth", "n_tokens"])
    mean = (rms * w).sum((1, 2)) / w.sum().clamp(min=1)
    return pd.DataFrame({
        "row": labels, "block": list(range(R)), "layer": list(range(-1, R - 1)),
        "rms": mean.tolist(), "growth": (mean / mean[0]).tolist(), "n_tokens": int(mask.sum()),
    })


def growth_claims(rms: pd.DataFrame, chapter: dict[int, float] | None = None) -> pd.DataFrame:
    """Our RMS beside the chapter's figures, one line per block the chapter names (plus the overall growth).

    ``rms`` is one model's :func:`residual_rms` table. ``chapter`` maps block (0 = embedding) to the
    chapter's figure; default :data:`CHAPTER_GPT4_RMS`. Blocks the model does not have are left out.
    Columns: ``claim``, ``block``, ``chapter``, ``ours``, ``ratio`` (ours / chapter).
    The last line is the growth of the final block over the embedding, beside
    :data:`CHAPTER_GPT4_GROWTH` ("some two hundred times bigger").
    """
    chapter = CHAPTER_GPT4_RMS if chapter is None else chapter
    by_block = rms.set_index("block")
    recs = []
    for b, fig in sorted(chapter.items()):
        if b not in by_block.index:
            continue
        ours = float(by_block.loc[b, "rms"])
        label = "RMS after the embedding" if b == 0 else f"RMS after block {b}"
        recs.append({"claim": label, "block": b, "chapter": fig, "ours": ours, "ratio": ours / fig})
    last = int(by_block.index.max())
    g = float(by_block.loc[last, "growth"])
    recs.append({"claim": f"growth, block {last} / embedding", "block": last, "chapter": CHAPTER_GPT4_GROWTH,
                 "ours": g, "ratio": g / CHAPTER_GPT4_GROWTH})
    return pd.DataFrame.from_records(recs, columns=["claim", "block", "chapter", "ours", "ratio"])
