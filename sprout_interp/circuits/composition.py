"""Composition scores: how much one head's output is read by a later head's query, key or value.

Elhage et al., "A Mathematical Framework for Transformer Circuits" (2021): a head's OV circuit
``W_OV = W_V W_O`` writes to the stream; a later head reads the stream through its QK circuit
``W_QK = W_Q W_K^T`` (queries and keys) or its own OV circuit (values). The composition score of a
pair is ``||W_A W_B||_F / (||W_A||_F ||W_B||_F)`` with ``W_A`` the earlier head's OV and ``W_B`` the
later head's QK (Q-composition), QK^T (K-composition) or OV (V-composition), the same definition as
TransformerLens's ``all_composition_scores``.

Sprout's weights come from HookedSprout with the norms' gains folded in (``W_Q``, ``W_K``, ``W_V``);
what the scores cannot see: the RMS norm's division (one number per position), and the per-head
QK-norm and RoPE, which act between ``W_Q``/``W_K`` and the dot product. So a score ranks pairs by
how well their matrices line up, not by what the model does; :mod:`sprout_interp.circuits.patching` measures
that. Random matrices of the same shapes score far from zero; :func:`random_baseline` gives the
level a pair must clear to mean anything.

Tables: ``sender_layer``/``sender_block``/``sender_head`` (the earlier head), ``receiver_layer``/
``receiver_block``/``receiver_head``, ``mode`` (Q, K or V), ``score``, ``baseline`` and
``over_baseline`` (score / baseline). Layers are 0-indexed; blocks = layer + 1.
"""
from __future__ import annotations

from typing import Literal, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import FactoredMatrix
from transformer_lens.utilities import composition_scores as _tl_composition_scores

from sprout_interp.core.arguments import check_count
from sprout_interp.core.errors import ArgumentError
from sprout_interp.core.hooked import as_hooked

__all__ = ["composition_scores", "random_baseline", "composition_table", "MAX_SAMPLES"]

Mode = Literal["Q", "K", "V"]
#: The most random matrix pairs a baseline averages: each holds 4 x d_model x d_head floats at once (and the SVDs'
#: copies), and the baseline's mean settles long before (its spread over 64 samples is about 1% of the score).
MAX_SAMPLES = 4096


def _scores(left: FactoredMatrix, right: FactoredMatrix, broadcast: bool) -> Tensor:
    """TransformerLens's composition_scores on one thread: its many small SVDs run ~50x slower on two
    threads here when another process wants the cores, and no faster when none does."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _tl_composition_scores(left, right, broadcast_dims=broadcast)
    finally:
        torch.set_num_threads(threads)


def _check_mode(mode: str) -> str:
    if mode not in ("Q", "K", "V"):
        raise ArgumentError(f"mode must be 'Q', 'K' or 'V' (which input of the later head reads the earlier one), got {mode!r}")
    return mode


def _check_samples(samples) -> int:
    return check_count(samples, "samples", high=MAX_SAMPLES, what="random matrix pairs averaged for the baseline")


def _check_modes(modes) -> list[str]:
    """``modes`` as a list of 'Q', 'K', 'V' (one mode alone is a list of one; an empty list is refused)."""
    if isinstance(modes, str):
        modes = [modes]
    if not isinstance(modes, (list, tuple)) or not modes:
        raise ArgumentError(f"modes must be a non-empty list of 'Q', 'K' and 'V', got {modes!r}")
    return [_check_mode(m) for m in modes]


@torch.no_grad()
def composition_scores(model, mode: Mode = "K") -> Float[Tensor, "layer head layer2 head2"]:
    """Scores of every (earlier head, later head) pair, shape (n_layers, n_heads, n_layers, n_heads).

    ``scores[l1, h1, l2, h2]`` is how much head ``h2`` of layer ``l2`` reads head ``h1`` of layer ``l1``
    through its queries (``mode="Q"``), keys ("K") or values ("V"); 0 where ``l1 >= l2``. Unitless, in [0, 1].
    """
    model = as_hooked(model)
    _check_mode(mode)
    left = model.OV
    right = {"Q": model.QK, "K": model.QK.T, "V": model.OV}[mode]
    scores = _scores(left, right, True)
    L = model.cfg.n_layers
    later = torch.arange(L)[:, None, None, None] < torch.arange(L)[None, None, :, None]
    return torch.where(later.to(scores.device), scores, torch.zeros_like(scores))


@torch.no_grad()
def random_baseline(model, mode: Mode = "K", samples: int = 64, seed: int = 0) -> float:
    """The mean composition score of Gaussian random matrices with the model's shapes (unitless).

    Each sample draws ``W_V, W_O`` (d_model x d_head, d_head x d_model) for the earlier head and
    ``W_Q, W_K`` (or ``W_V, W_O``) for the later one; the score does not depend on their scale.
    """
    model = as_hooked(model)
    _check_mode(mode)
    samples = _check_samples(samples)
    seed = check_count(seed, "seed", low=0, what="the random matrices' seed")
    d, dh = model.cfg.d_model, model.cfg.d_head
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    left = FactoredMatrix(rand(samples, d, dh), rand(samples, dh, d))
    a, b = rand(samples, d, dh), rand(samples, dh, d)
    right = FactoredMatrix(a, b) if mode == "V" else FactoredMatrix(rand(samples, d, dh), rand(samples, d, dh).transpose(-2, -1))
    if mode == "K":
        right = right.T
    return float(_scores(left, right, False).mean())


def composition_table(model, modes: Sequence[Mode] = ("Q", "K", "V"), samples: int = 64) -> pd.DataFrame:
    """Every pair of heads in different layers (earlier -> later) and mode, with the random baseline.

    Args:
        modes: which compositions: ``"Q"`` (the later head's queries read the earlier head's output), ``"K"`` (its
            keys) and ``"V"`` (its values).
        samples: random matrix pairs of the same shapes averaged for each baseline, 1..``MAX_SAMPLES``
            (ArgumentError otherwise).

    Returns:
        One row per (sender, receiver, mode), sorted by ``over_baseline`` within each mode, largest first:

        | column | meaning |
        |---|---|
        | ``sender_layer``, ``sender_block``, ``sender_head`` | the earlier head (layer 0-indexed, block = layer + 1) |
        | ``receiver_layer``, ``receiver_block``, ``receiver_head`` | the later head |
        | ``mode`` | ``"Q"``, ``"K"`` or ``"V"`` |
        | ``score`` | ``‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F)``, unitless, in [0, 1] |
        | ``baseline`` | the same score of random matrices of these shapes |
        | ``over_baseline`` | ``score / baseline``: above 1, the pair lines up better than chance |
    """
    model = as_hooked(model)
    modes = _check_modes(modes)
    samples = _check_samples(samples)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    rows = []
    for mode in modes:
        s = composition_scores(model, mode)
        base = random_baseline(model, mode, samples)
        for l1 in range(L):
            for h1 in range(H):
                for l2 in range(l1 + 1, L):
                    for h2 in range(H):
                        v = float(s[l1, h1, l2, h2])
                        rows.append(dict(mode=mode, sender_layer=l1, sender_block=l1 + 1, sender_head=h1,
                                         receiver_layer=l2, receiver_block=l2 + 1, receiver_head=h2,
                                         score=v, baseline=base, over_baseline=v / base))
    df = pd.DataFrame(rows)
    if len(df):
        df = df.sort_values(["mode", "over_baseline"], ascending=[True, False]).reset_index(drop=True)
    df.attrs.update(convention="layers 0-indexed; block = layer + 1; score unitless in [0, 1]",
                    caveat="weights only: the RMS division, QK-norm and RoPE are not in the scores")
    return df
