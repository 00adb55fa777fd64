"""Text <-> token ids for Sprout's byte-level BPE, with the errors a person can act on.

These are plain functions on a ``tokenizers.Tokenizer``; :class:`sprout_interp.core.hooked.HookedSprout`
wraps them as ``to_tokens`` / ``to_str_tokens`` / ``to_string``.

Conventions
-----------
* ``<|endoftext|>`` (id 0 in Sprout's tokenizers) separates documents in the training stream. It is
  the token ``prepend_bos=True`` puts in front (Sprout has no separate BOS token), and the token that
  right-pads a batch of texts of different lengths.
* A batch is always **right**-padded. Under causal attention a real token never sees the padding
  that follows it, so the activations and logits at real positions are exactly those of the text
  run alone; the boolean ``attention_mask`` (True = real token) says which positions to ignore.
* Nothing is silently cut: a text longer than the context raises
  :class:`~sprout_interp.core.errors.ContextLengthError` unless ``truncate=True`` (which keeps the
  *first* ``context`` tokens, as TransformerLens does).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from sprout_interp.core.errors import ContextLengthError, SproutError, TokenizationError
from sprout_model.tokenizer import EOT, TokenizerError
from sprout_model.tokenizer import encode as _encode

#: What ``HookedSprout.prepare_input`` (and every analysis that takes input through it) accepts: a text, a list of
#: texts, or token ids ``(pos,)`` / ``(batch, pos)``.
ModelInput = str | Sequence[str] | Int[Tensor, "*batch pos"]

__all__ = [
    "ModelInput",
    "EOT",
    "eot_id",
    "encode_text",
    "texts_to_tokens",
    "ids_to_str_tokens",
    "ids_to_string",
]


def _require(tokenizer) -> None:
    if tokenizer is None:
        raise SproutError(
            "this model has no tokenizer, so it cannot read text: pass token ids (a LongTensor of shape "
            "(batch, pos)) instead, or load the model with a tokenizer (sprout_interp.load(path) finds the "
            "checkpoint's tokenizer.json; HookedSprout(model, tokenizer=Tokenizer.from_file(...)))"
        )


def eot_id(tokenizer) -> int:
    """Id of ``<|endoftext|>`` in this tokenizer (0 in Sprout's); 0 if there is no tokenizer."""
    if tokenizer is None:
        return 0
    i = tokenizer.token_to_id(EOT)
    if i is None:
        raise TokenizationError(f"the tokenizer has no {EOT!r} token, so it is not a Sprout tokenizer")
    return int(i)


def encode_text(
    tokenizer,
    text: str,
    *,
    context: int,
    prepend_bos: bool = False,
    truncate: bool = False,
) -> list[int]:
    """Token ids of one text, checked against the model's context window.

    Raises ``TokenizationError`` for text that is not valid Unicode (a lone surrogate),
    ``ContextLengthError`` for an empty text or one longer than ``context`` tokens
    (unless ``truncate``, which keeps the first ``context`` tokens).
    """
    _require(tokenizer)
    if not isinstance(text, str):
        raise SproutError(f"expected a string, got {type(text).__name__}")
    if text == "" and not prepend_bos:
        raise ContextLengthError(
            "the text is empty (0 tokens): the model needs at least one token to predict from; "
            "type some text, or pass prepend_bos=True to start from <|endoftext|> alone"
        )
    try:
        ids = _encode(tokenizer, text)
    except TokenizerError as e:
        raise TokenizationError(str(e)) from None
    if prepend_bos:
        ids = [eot_id(tokenizer)] + ids
    if len(ids) > context:
        if not truncate:
            raise ContextLengthError(
                f"the text is {len(ids)} tokens long but the model's context is {context} tokens: "
                f"shorten it, or pass truncate=True to keep the first {context} tokens"
            )
        ids = ids[:context]
    return ids


def texts_to_tokens(
    tokenizer,
    texts: str | Sequence[str],
    *,
    context: int,
    prepend_bos: bool = False,
    truncate: bool = False,
) -> tuple[Int[Tensor, "batch pos"], Bool[Tensor, "batch pos"]]:
    """Tokens of one text or a list of texts, right-padded with ``<|endoftext|>``, and the mask.

    Returns ``(tokens, attention_mask)``: LongTensor ``(batch, pos)`` on the CPU, and a bool tensor
    of the same shape that is True at real tokens and False at padding.
    """
    _require(tokenizer)
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, Sequence) or len(texts) == 0:
        raise SproutError("expected a string or a non-empty list of strings")
    rows = []
    for i, t in enumerate(texts):
        try:
            rows.append(encode_text(tokenizer, t, context=context, prepend_bos=prepend_bos, truncate=truncate))
        except SproutError as e:
            if len(texts) == 1:
                raise
            raise type(e)(f"text {i} of {len(texts)}: {e}") from None
    n = max(len(r) for r in rows)
    pad = eot_id(tokenizer)
    tokens = torch.full((len(rows), n), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.bool)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
    return tokens, mask


def _as_id_list(tokens) -> list[int]:
    if isinstance(tokens, Tensor):
        return [int(t) for t in tokens.tolist()]
    return [int(t) for t in tokens]


def ids_to_str_tokens(tokenizer, ids: Sequence[int] | Tensor) -> list[str]:
    """One string per token id (a token that is part of a multi-byte character shows as '\\ufffd')."""
    _require(tokenizer)
    return list(tokenizer.decode_batch([[i] for i in _as_id_list(ids)], skip_special_tokens=False))


def ids_to_string(tokenizer, ids: Sequence[int] | Tensor) -> str:
    """The text of a sequence of token ids (special tokens kept)."""
    _require(tokenizer)
    return tokenizer.decode(_as_id_list(ids), skip_special_tokens=False)
