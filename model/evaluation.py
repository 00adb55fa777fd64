"""Measurements on a trained model that need no corpus: the in-context copying figure.

In-context copying (what induction heads do): feed a sequence of random tokens twice in a row.
The first time through, the next token is unguessable, so the loss sits near log(vocab). The
second time, a model that can look back and copy predicts each token from its earlier
occurrence, and the loss drops. We report

    ratio = mean loss on copy two / mean loss on copy one

over the same positions of each copy: the targets at positions 1..seq_len-1 *within* copy one
(sequence positions 1..seq_len-1) against the targets at positions 1..seq_len-1 within copy two
(sequence positions seq_len+1..2*seq_len-1). Position 0 of each copy is left out of both: nothing
before it predicts it (for copy two, its predecessor is the last token of copy one, which appears
nowhere else). A ratio near 1.0 means no copying; a model with induction heads goes far below 0.5.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .corpus import open_tokens

EOT_ID = 0  # <|endoftext|> is never drawn


class CopyingLoss(NamedTuple):
    first: float  # mean loss (nats/token) on targets 1..seq_len-1 of copy one
    second: float  # mean loss (nats/token) on targets 1..seq_len-1 of copy two
    ratio: float  # second / first


def first_val_windows(data: str | Path, rows: int, seq_len: int, vocab_size: int) -> Tensor:
    """The first ``rows`` consecutive windows of ``seq_len + 1`` tokens of ``data``/val.bin, as an int64 tensor
    (rows, seq_len + 1): inputs ``[:, :-1]``, targets ``[:, 1:]``. Raises ValueError when the split is too short
    or either count is below 1, and CorpusError when the file holds an id of ``vocab_size`` or more."""
    val_file = Path(data) / "val.bin"
    val = open_tokens(val_file, vocab_size)
    if rows < 1 or seq_len < 1:
        raise ValueError(f"--rows and --seq-len must be 1 or more, got {rows} and {seq_len}")
    if len(val) < rows * (seq_len + 1):
        raise ValueError(f"{val_file} has {len(val):,} tokens, fewer than --rows x (--seq-len + 1) = "
                         f"{rows * (seq_len + 1):,}; pass smaller --rows or --seq-len")
    return torch.from_numpy(val[: rows * (seq_len + 1)].astype(np.int64)).view(rows, seq_len + 1)


def repeated_tokens_batch(vocab_size: int, seq_len: int = 64, batch: int = 32, seed: int = 0) -> Tensor:
    """(batch, 2*seq_len) LongTensor: random tokens from ids 1..vocab_size-1, each row repeated twice.

    Uses its own ``torch.Generator``, so the same arguments give the same batch on every machine
    and never disturb the global random state.
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2 (id 0 is never drawn), got {vocab_size}")
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}")
    g = torch.Generator().manual_seed(seed)
    half = torch.randint(1, vocab_size, (batch, seq_len), generator=g)
    return torch.cat([half, half], dim=1)


@torch.no_grad()
def repeated_tokens_loss_ratio(
    model: nn.Module, seq_len: int = 64, batch: int = 32, seed: int = 0, vocab_size: int | None = None
) -> CopyingLoss:
    """(first, second, ratio) for ``model`` on :func:`repeated_tokens_batch` (see the module docstring).

    ``model(idx)`` must return ``(logits, _)`` like ``GPT.forward``; ``vocab_size`` defaults to
    ``model.cfg.vocab_size``. The model is run in eval mode and its mode is restored afterwards.
    """
    cfg = getattr(model, "cfg", None)
    if vocab_size is None:
        if cfg is None:
            raise ValueError("pass vocab_size: the model has no .cfg to read it from")
        vocab_size = cfg.vocab_size
    context = getattr(cfg, "context", None)
    if context is not None and 2 * seq_len > context:
        raise ValueError(f"2 * seq_len = {2 * seq_len} tokens do not fit the model's context of {context}")
    tokens = repeated_tokens_batch(vocab_size, seq_len, batch, seed)
    try:
        device = next(model.parameters()).device
    except (AttributeError, StopIteration):
        device = torch.device("cpu")
    was_training = getattr(model, "training", False)
    if isinstance(model, nn.Module):
        model.eval()
    try:
        logits, _ = model(tokens.to(device))
    finally:
        if isinstance(model, nn.Module):
            model.train(was_training)
    # logits[:, t] predicts tokens[:, t + 1]
    loss = F.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.size(-1)), tokens[:, 1:].to(device).reshape(-1), reduction="none"
    ).view(batch, 2 * seq_len - 1)
    # target position p sits at loss column p - 1
    first = loss[:, 0 : seq_len - 1].mean().item()  # targets 1 .. seq_len-1
    second = loss[:, seq_len : 2 * seq_len - 1].mean().item()  # targets seq_len+1 .. 2*seq_len-1
    return CopyingLoss(first, second, second / first if first > 0 else float("nan"))


# --- Invented-name copying --------------------------------------------------------------------------
# Short texts written for this project, each with an invented two-word name that appears exactly twice,
# both times after a space (so both occurrences tokenize the same). At the second occurrence the name's
# first token is a surprise, but every later token can be copied from the first occurrence.
NAME_TEXTS: list[tuple[str, str]] = [
    ("Zorbin Plax", "When the boat came in, old Zorbin Plax was waiting on the pier with a lantern. The sailors "
                    "tied the ropes and carried the boxes up the hill, and the last man off the boat shook hands "
                    "with Zorbin Plax"),
    ("Quillon Marsk", "The letter on the table was signed by Quillon Marsk, and nobody in the house knew the name. "
                      "The maid said she had never seen the man. At supper the father read the letter aloud, "
                      "and when he had finished he asked again who Quillon Marsk"),
    ("Tessaly Vorn", "In the village everyone bought their honey from Tessaly Vorn, who kept forty hives behind "
                     "the mill. One summer the bees left the hives and flew into the forest, and the children "
                     "ran after them, shouting for Tessaly Vorn"),
    ("Brannock Idris", "The doctor who came that night was a tall man called Brannock Idris. He sat by the bed "
                       "until morning and did not speak. When the fever broke, the mother wept and thanked "
                       "Brannock Idris"),
    ("Velma Struan", "Her aunt, Velma Struan, lived alone in a grey house at the end of the road. Every winter "
                     "the girl was sent there with a basket of apples, and every winter the door was opened "
                     "by Velma Struan"),
]


# Five more texts of the same kind, never used to choose a recipe or a checkpoint: they check that a gain
# on NAME_TEXTS is copying in general and not a fit to five names (TRAINING.md reports both).
HELDOUT_NAME_TEXTS: list[tuple[str, str]] = [
    ("Dorrit Kalbeck", "The new teacher was a quiet woman named Dorrit Kalbeck. On the first morning she wrote "
                       "a long word on the board and waited. Nobody could read it, so she sat down and waited "
                       "longer, until a small boy at the back said the word and smiled at Dorrit Kalbeck"),
    ("Ansel Pruvin", "A cart stood outside the inn, and the innkeeper said it belonged to Ansel Pruvin, a "
                     "merchant from the south. All evening the travellers talked about the cart and what it "
                     "might carry. In the morning the cart was gone, and so was Ansel Pruvin"),
    ("Mirela Tosk", "The ship's cook was an old sailor, Mirela Tosk, who had been round the cape six times. "
                    "When the storm came the captain lost his hat and the mate lost his nerve, but the only "
                    "one who kept cooking was Mirela Tosk"),
    ("Hollis Varne", "Every letter from the city ended with the same name, Hollis Varne, written in green ink. "
                     "The girl kept them in a box under her bed. Years later, when she opened the box again, "
                     "the green ink had faded, but she could still read Hollis Varne"),
    ("Gideon Rusk", "They found the map in a drawer that had belonged to Gideon Rusk. It showed the river, the "
                    "old bridge and a cross drawn in pencil near the woods. The brothers set out at dawn to "
                    "find what had been hidden there by Gideon Rusk"),
]


class NameCopying(NamedTuple):
    mean_prob: float  # mean over texts of the mean probability of the name's later tokens, 2nd occurrence
    first_mean_prob: float  # the same tokens at the name's first occurrence (the baseline)
    per_text: list[dict]  # name, its tokens, and per-token probabilities at both occurrences


@torch.no_grad()
def name_copying(model: nn.Module, tokenizer, texts: list[tuple[str, str]] | None = None) -> NameCopying:
    """Probability the model gives each later token of an invented name (all but its first token) at the
    name's first and second occurrence in each text. ``model(idx)`` returns ``(logits, _)``; the texts go to the
    device of the model's parameters."""
    try:
        device = next(model.parameters()).device
    except (AttributeError, StopIteration):
        device = torch.device("cpu")
    results = []
    for name, text in texts or NAME_TEXTS:
        enc = tokenizer.encode(text, add_special_tokens=False)
        ids = torch.tensor([enc.ids], device=device)
        probs = torch.softmax(model(ids)[0][0].float(), -1)
        starts = [i for i in range(len(text)) if text.startswith(" " + name, i)]
        if len(starts) != 2:
            raise ValueError(f"{name!r} must appear exactly twice after a space in its text")
        spans = []
        for s in starts:
            lo, hi = s, s + len(name) + 1
            spans.append([i for i, (a, b) in enumerate(enc.offsets) if a < hi and b > lo])
        pieces = [enc.tokens[i] for i in spans[1]]
        occ = []
        for span in spans:
            occ.append([probs[i - 1, enc.ids[i]].item() for i in span[1:]])  # logits at i-1 predict token i
        results.append({"name": name, "tokens": pieces, "first": occ[0], "second": occ[1],
                        "first_mean": sum(occ[0]) / len(occ[0]), "second_mean": sum(occ[1]) / len(occ[1])})
    return NameCopying(
        sum(r["second_mean"] for r in results) / len(results),
        sum(r["first_mean"] for r in results) / len(results),
        results,
    )
