"""Byte-level BPE with exactly 8,192 tokens, trained with Hugging Face ``tokenizers``.

Byte-level means every string becomes bytes first, so any Unicode text round-trips exactly;
``<|endoftext|>`` (id 0) separates documents in the training stream.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"
VOCAB_SIZE = 8192


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
    tok.train_from_iterator(texts, trainer=trainer)
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


def decode(tok: Tokenizer, ids: Iterable[int]) -> str:
    return tok.decode(list(ids), skip_special_tokens=False)
