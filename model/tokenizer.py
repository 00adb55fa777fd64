"""Byte-level BPE with exactly 8,192 tokens, trained with Hugging Face ``tokenizers``.

Byte-level means every string becomes bytes first, so any Unicode text round-trips exactly;
``<|endoftext|>`` (id 0) separates documents in the training stream.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"
VOCAB_SIZE = 8192
PIECE_CHARS = 1 << 16  # encode_pieces: a text is encoded about this many characters at a time (measured on one
# core: 64K-character pieces encode twice as fast as 1M-character ones or a 4 MB text whole)


class TokenizerError(ValueError):
    """Text the tokenizer cannot encode, or a tokenizer file that is not ours."""


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """A byte-level BPE of exactly ``vocab_size`` tokens (256 bytes + merges + EOT), trained on ``texts``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, so nothing is ever unknown
        show_progress=False,
    )
    tok.train_from_iterator((p for text in texts for p in pieces(text)), trainer=trainer)  # the same merges as whole
    # texts (pieces end where words do), without holding a long text's words at once
    if tok.get_vocab_size() != vocab_size:
        raise TokenizerError(f"trained {tok.get_vocab_size()} tokens, wanted {vocab_size}: the corpus is too small")
    return tok


def load_tokenizer(path: str | Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text``; raises TokenizerError for strings that are not valid Unicode (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise TokenizerError(
            f"the text holds a lone surrogate ({text[e.start:e.end]!r} at character {e.start}), which is not valid "
            "Unicode and has no UTF-8 bytes; decode your source with errors='replace' first"
        ) from None
    return tok.encode(text, add_special_tokens=False).ids


def pieces(text: str, piece_chars: int | None = None) -> Iterator[str]:
    """``text`` in consecutive pieces of about ``piece_chars`` characters (default :data:`PIECE_CHARS`), so a long document (a 20 MB
    file on one line) is tokenized, or counted for the tokenizer's training, a piece at a time: the tokenizer's
    own buffers take over 100 bytes a character of what it is given at once.

    A piece ends before a space that follows a non-space character: the byte-level pre-tokenizer starts a new
    word there anyway (`` word``) and BPE never merges across words, so the pieces' ids are exactly the whole
    text's, and a tokenizer trained on them is the one trained on the whole. Only a run of ``2 * piece_chars``
    characters with no such space is cut where it is (the ids next to that cut may differ)."""
    piece_chars = max(1, piece_chars or PIECE_CHARS)
    i, n = 0, len(text)
    while i < n:
        j = text.find(" ", i + piece_chars) if n - i > piece_chars else -1
        while j > 0 and text[j - 1].isspace():
            j = text.find(" ", j + 1)
        if j < 0 or j - i > 2 * piece_chars:
            j = n if n - i <= 2 * piece_chars else i + piece_chars
        yield text[i:j]
        i = j


def encode_pieces(tok: Tokenizer, text: str, piece_chars: int | None = None) -> Iterator[list[int]]:
    """The token ids of ``text``, one list for each of its :func:`pieces` (together exactly :func:`encode`'s ids,
    unless a run of ``2 * piece_chars`` characters has no space). Raises TokenizerError as :func:`encode` does."""
    for piece in pieces(text, piece_chars):
        yield encode(tok, piece)


def decode(tok: Tokenizer, ids: Iterable[int]) -> str:
    return tok.decode(list(ids), skip_special_tokens=False)
