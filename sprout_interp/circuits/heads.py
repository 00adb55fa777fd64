"""Naming heads: ``(layer, head)`` pairs (layers 0-indexed as in code), checked against a model, with the one
label a person reads ("block 2 head 0 (layer 1)"), and the ablation kinds."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from sprout_interp.core.arguments import check_index, integer
from sprout_interp.core.errors import AblationError

__all__ = ["Head", "Kind", "KINDS", "CONVENTION", "all_heads", "check_heads", "check_kind", "block_label", "head_label",
           "heads_label"]

Kind = Literal["zero", "mean", "resample"]
KINDS = ("zero", "mean", "resample")
Head = tuple[int, int]
CONVENTION = "layer: 0-indexed as in code (blocks.{layer}); block: counted from 1 as the chapter does ('layer N'); heads 0-indexed"


def all_heads(model) -> list[Head]:
    """Every (layer, head) of the model, layer-major."""
    c = model.cfg
    return [(l, h) for l in range(c.n_layers) for h in range(c.n_heads)]


def check_heads(model, heads) -> list[Head]:
    """``heads`` as a list of ``(layer, head)`` ints; one pair may be passed alone. Raises AblationError, also for
    a layer or head that is not a whole number (a bool, a float, a string); numpy / torch integers are accepted."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    if heads is None:
        return all_heads(model)
    if isinstance(heads, tuple) and len(heads) == 2 and all(integer(x) is not None for x in heads):
        heads = [heads]
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise AblationError(f"heads is a list of (layer, head) pairs of whole numbers, got {heads!r}")
    what = (f"this model has {L} blocks, layers 0..{L - 1} in code (the chapter's blocks 1..{L}), and {H} heads per "
            f"block, numbered 0..{H - 1}")
    out = []
    for item in heads:
        try:
            l, h = item
        except (TypeError, ValueError):
            raise AblationError(f"a head is a (layer, head) pair of whole numbers, got {item!r}") from None
        try:
            l, h = check_index(l, "layer", L, what=what, error=AblationError), check_index(h, "head", H, what=what, error=AblationError)
        except AblationError as e:
            raise AblationError(f"there is no head (layer {l!r}, head {h!r}) in heads: {e}") from None
        out.append((l, h))
    if not out:
        raise AblationError("no heads given: pass a list of (layer, head) pairs")
    return out


def check_kind(kind) -> str:
    """``kind`` itself when it is one of :data:`KINDS`; :class:`AblationError` otherwise."""
    if kind not in KINDS:
        raise AblationError(f"kind must be one of {KINDS}, got {kind!r}")
    return kind




def block_label(layer: int) -> str:
    """How a block reads: ``"block 3 (layer 2)"`` for layer 2, the chapter's count, then the code's 0-indexed layer."""
    return f"block {layer + 1} (layer {layer})"


def head_label(layer: int, head: int, with_layer: bool = True) -> str:
    """How a head reads in tables, figures and verdicts: ``"block 2 head 0 (layer 1)"`` for ``(1, 0)``
    (block counted from 1 as the chapter does, the 0-indexed layer of code and hook names in brackets);
    ``with_layer=False``: ``"block 2 head 0"``, for a column beside ``layer`` and ``block`` columns or a
    figure's axis that says its convention.

    >>> head_label(1, 0)
    'block 2 head 0 (layer 1)'
    >>> head_label(1, 0, with_layer=False)
    'block 2 head 0'
    """
    short = f"block {layer + 1} head {head}"
    return f"{short} (layer {layer})" if with_layer else short


def heads_label(heads: Sequence[Head], with_layer: bool = True) -> str:
    """Several heads joined with ``" + "`` (:func:`head_label` each); ``"none"`` for no head.

    >>> heads_label([(1, 0), (2, 3)])
    'block 2 head 0 (layer 1) + block 3 head 3 (layer 2)'
    """
    return " + ".join(head_label(int(l), int(h), with_layer) for l, h in heads) or "none"
