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

A tokenizer is untrusted input (a ``tokenizer.json`` comes with any checkpoint folder or upload):

* :func:`check_tokenizer` accepts only the shapes Sprout's tokenizers have (``sprout_model.tokenizer`` trains
  them): a byte-level BPE, or a plain word-level vocabulary, with no normalizer, no truncation or padding, the
  ByteLevel pre-tokenizer (or the GPT-2 split pattern before a ByteLevel without its own regex), a ByteLevel
  decoder or none. Anything else (a normalizer that multiplies the text, a split regex that backtracks
  without end ...) is refused with :class:`~sprout_interp.core.errors.TokenizationError` when it is loaded.
* :func:`encode_ids` tokenizes in chunks of at most :data:`CHUNK_CHARS` characters, cut where the pre-tokenizer
  cuts anyway (so the ids are those of the whole text), and refuses a tokenizer that gives more ids than a
  chunk has UTF-8 bytes: what one call may allocate is bounded whatever the text's length.
* Every call into the Rust tokenizer goes through :func:`tokenizer_call`, which turns a Rust panic
  (``pyo3_runtime.PanicException``, a ``BaseException`` that ``except Exception`` does not catch) into
  ``TokenizationError``.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, Union

import torch
from jaxtyping import Bool, Int
from tokenizers import Tokenizer
from torch import Tensor

from sprout_interp.core.arguments import describe, integer
from sprout_interp.core.errors import ArgumentError, ContextLengthError, SproutError, TokenizationError
from sprout_model.tokenizer import (
    ALLOWED,
    EOT,
    GPT2_SPLIT_PATTERN,
    TokenizerError,
    check_expansion,
    check_tokenizer_spec,
    is_rust_panic,
)
from sprout_model.tokenizer import encode as _encode

_T = TypeVar("_T")

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
    "token_bytes",
    "byte_labels",
    "token_labels",
    "merge_byte_labels",
    "CONTINUED",
    "CHUNK_CHARS",
    "GPT2_SPLIT_PATTERN",
    "is_rust_panic",
    "tokenizer_call",
    "check_tokenizer",
    "tokenizer_from_json",
    "encode_ids",
    "token_id",
]

#: Characters one call into the Rust tokenizer reads at most; a module attribute, so a test can change it.
CHUNK_CHARS = 256
#: The longest run with no space before a non-space character that one chunk grows to hold whole (characters);
#: a chunk's ids are still bounded by its UTF-8 bytes.
LONGEST_RUN = 16_384
_SPACE_BEFORE_TEXT = re.compile(r" (?=\S)")


def tokenizer_call(what: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)``, a call into the Rust tokenizer, with a Rust panic raised as ``TokenizationError``.

    ``what`` says what the call does ("encoding the text"), for the message. Ordinary exceptions pass
    unchanged, and so do ``KeyboardInterrupt``, ``SystemExit`` and every other ``BaseException``.
    """
    try:
        return fn(*args, **kwargs)
    except BaseException as err:
        if not is_rust_panic(err):
            raise
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise TokenizationError(
            f"the tokenizer crashed inside its Rust code while {what} ({type(err).__name__}: {first}). A byte-level "
            "BPE as sprout_model.tokenizer trains it does not: load the model with the tokenizer.json it was "
            "trained with, or shorten the text"
        ) from None


def check_tokenizer(tokenizer: Any, source: str = "the tokenizer") -> None:
    """Refuse a tokenizer whose components are not those of a Sprout tokenizer (see the module docstring).

    ``tokenizer`` is a ``tokenizers.Tokenizer``, the text of a ``tokenizer.json`` or its parsed JSON value (a
    ``tokenizer.json`` holding ``[]`` is refused as no JSON object); ``source`` names it in the message. The check
    itself is ``sprout_model.tokenizer.check_tokenizer_spec``, the one the training tools apply. Returns None;
    raises ``TokenizationError`` saying what is wrong and what is allowed.
    """
    if isinstance(tokenizer, str):
        try:
            spec = json.loads(tokenizer)
        except (ValueError, RecursionError):
            raise TokenizationError(f"{source} is not a tokenizer Sprout can use: it is not valid JSON. {ALLOWED}") from None
    elif isinstance(tokenizer, Tokenizer):
        spec = json.loads(tokenizer_call("writing the tokenizer out", tokenizer.to_str))
    else:
        spec = tokenizer
    try:
        check_tokenizer_spec(spec, source)
    except TokenizerError as e:
        raise TokenizationError(str(e)) from None


def tokenizer_from_json(text: str, source: str = "the tokenizer"):
    """A ``tokenizers.Tokenizer`` from the text of a ``tokenizer.json``, checked by :func:`check_tokenizer` first.

    Raises ``TokenizationError`` for a refused shape; the tokenizers library's own error (an ``Exception``)
    for JSON it cannot read.
    """
    check_tokenizer(text, source)
    return tokenizer_call(f"reading {source}", Tokenizer.from_str, text)


def _chunk_end(text: str, start: int, size: int) -> int:
    """Where the chunk from ``start`` ends: before the last space that precedes a character other than whitespace
    in its second half (the GPT-2 pre-tokenizer cuts there too: ``' ?\\p{L}+'`` and its siblings start a piece at
    such a space, and a run of whitespace leaves its last space to the piece after it; so the ids do not change),
    else after ``size`` characters. Python's ``isspace`` holds for every Unicode White_Space character."""
    end = start + size
    if end >= len(text):
        return len(text)
    lo = start + max(size // 2, 1)
    p = text.rfind(" ", lo, end)
    while p >= lo:
        if not text[p + 1].isspace():
            return p
        p = text.rfind(" ", lo, p)
    # A long run with no such space (a number, a text without spaces): the chunk grows to the next one, up to
    # LONGEST_RUN characters, so the ids still equal the whole text's; only a longer run is cut inside.
    limit = min(len(text), start + LONGEST_RUN)
    nxt = _SPACE_BEFORE_TEXT.search(text, end, limit)
    if nxt is not None:
        return nxt.start()
    return len(text) if limit == len(text) else end


def encode_ids(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` (no special tokens added), read in chunks of at most :data:`CHUNK_CHARS` characters.

    A chunk ends where the GPT-2 pre-tokenizer splits anyway, so a Sprout tokenizer gives the ids of the whole
    text (a run with no space before a character other than whitespace, such as a long number or a text
    without spaces, stays in one chunk up to :data:`LONGEST_RUN` characters; only a longer run is cut inside). Raises ``TokenizationError`` for
    a lone surrogate, for a tokenizer that gives more ids than a chunk has UTF-8 bytes (+1, for a prefix space) —
    it expands text, which no byte-level BPE does — and for a Rust panic inside the tokenizer.
    """
    _require(tokenizer)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            _encode(tokenizer, text)  # raises TokenizerError with the surrogate's place before it calls the tokenizer
        except TokenizerError as e:
            raise TokenizationError(str(e)) from None
    size = max(int(CHUNK_CHARS), 2)
    ids: list[int] = []
    start = 0
    while start < len(text):
        end = _chunk_end(text, start, size)
        chunk = text[start:end]
        got = tokenizer_call("encoding the text", tokenizer.encode, chunk, add_special_tokens=False).ids
        try:
            check_expansion(chunk, len(got), start)
        except TokenizerError as e:
            raise TokenizationError(str(e)) from None
        ids.extend(got)
        start = end
    return ids


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
    ids = encode_ids(tokenizer, text)
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
    return list(tokenizer_call("decoding token ids", tokenizer.decode_batch, [[i] for i in _as_id_list(ids)],
                               skip_special_tokens=False))


def ids_to_string(tokenizer, ids: Sequence[int] | Tensor) -> str:
    """The text of a sequence of token ids (special tokens kept)."""
    _require(tokenizer)
    return tokenizer_call("decoding token ids", tokenizer.decode, _as_id_list(ids), skip_special_tokens=False)


# -- readable labels for tokens that are pieces of a UTF-8 character ------------------------------------------


def _byte_alphabet() -> dict[str, int]:
    """The byte-level BPE's alphabet (GPT-2's ``bytes_to_unicode``): the character a byte is written as in the
    vocabulary -> that byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_OF = _byte_alphabet()
#: the label of a token whose bytes all continue a character that an earlier token of the text starts (the
#: character itself is on that token): U+25CC DOTTED CIRCLE, the usual stand-in for "attached to what comes before"
CONTINUED = "◌"
_BYTE_MARK = re.compile(r"⟨0x([0-9A-F]{2})⟩")


def token_bytes(tokenizer, ids: Sequence[int] | Tensor) -> list[bytes]:
    """The bytes each token id stands for (a byte-level BPE's token can hold part of a UTF-8 character; special
    tokens and the tokens of a vocabulary that is not byte-level: their text's UTF-8)."""
    _require(tokenizer)
    byte_level = type(getattr(tokenizer, "decoder", None)).__name__ == "ByteLevel"
    out = []
    for i in _as_id_list(ids):
        piece = tokenizer_call("reading a token", tokenizer.id_to_token, i)
        if piece is None:
            raise TokenizationError(f"token id {i} is not in the vocabulary (0..{tokenizer.get_vocab_size() - 1})")
        if byte_level and all(ch in _BYTE_OF for ch in piece):
            out.append(bytes(_BYTE_OF[ch] for ch in piece))
        else:
            out.append(ids_to_string(tokenizer, [i]).encode("utf-8"))
    return out


def byte_labels(pieces: Sequence[bytes]) -> list[str]:
    """One readable label per token of a text, given each token's bytes: every UTF-8 character is written on the
    token that holds its first byte, merged across the tokens it spans; a token whose bytes all continue a
    character begun before it is labelled :data:`CONTINUED`; a byte that belongs to no complete character (a lone
    piece, a character cut by the text's end) is written ``⟨0xE2⟩``."""
    owner = [t for t, p in enumerate(pieces) for _ in p]  # the token of each byte
    data = b"".join(pieces)
    labels = [""] * len(pieces)
    i = 0
    while i < len(data):
        lead = data[i]
        size = 1 if lead < 0x80 else 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else \
            4 if 0xF0 <= lead <= 0xF4 else 0
        ch = None
        if size and i + size <= len(data):
            try:
                ch = data[i:i + size].decode("utf-8")
            except UnicodeDecodeError:
                ch = None
        if ch is None:  # not the start of a whole character: the byte alone
            labels[owner[i]] += f"⟨0x{lead:02X}⟩"
            i += 1
        else:
            labels[owner[i]] += ch
            i += size
    return [lab if lab or not p else CONTINUED for lab, p in zip(labels, pieces)]


def token_labels(tokenizer, ids: Sequence[int] | Tensor) -> list[str]:
    """One readable label per token id of a text (:func:`byte_labels` of :func:`token_bytes`): where
    :func:`ids_to_str_tokens` shows each piece of a split character as '\ufffd', this merges the pieces into the
    character, or shows a lone piece's bytes as ``⟨0xE2⟩``. For one id alone (a vocabulary table), a piece shows
    its bytes."""
    return byte_labels(token_bytes(tokenizer, ids))


def merge_byte_labels(labels: Sequence[str]) -> list[str]:
    """Labels made for tokens one at a time (:func:`token_labels` of a single id, where a piece shows as
    ``⟨0xE2⟩``) relabelled as one text: adjacent pieces that form a character are merged as :func:`byte_labels`
    merges them. Labels without a byte mark are kept as they are."""
    if not any(_BYTE_MARK.search(lab) for lab in labels):
        return list(labels)
    pieces = []
    for lab in labels:
        parts = _BYTE_MARK.split(lab)  # text, byte, text, byte, ..., text
        pieces.append(b"".join(bytes([int(x, 16)]) if k % 2 else x.encode("utf-8") for k, x in enumerate(parts)))
    return byte_labels(pieces)


def token_id(model, token: Union[str, int], name: str = "token") -> int:
    """The id of ``token`` for ``model`` (a HookedSprout): a whole-number id (numpy / torch integers too), or a
    string that is exactly one token (``model.to_single_token``; else SproutError saying its pieces). ``name`` is
    the argument it came in, for the ArgumentError of an id outside the vocabulary or of something that is no
    token (a bool, a float)."""
    if isinstance(token, str):
        return model.to_single_token(token)
    i, V = integer(token), model.cfg.d_vocab
    if i is None:
        raise ArgumentError(f"{name}={describe(token)} is not a token: pass a string of one token or a whole-number id 0..{V - 1}")
    if not 0 <= i < V:
        raise ArgumentError(f"{name}: token id {i} is outside the vocabulary (0..{V - 1})")
    return i
