"""Byte-level BPE with exactly 8,192 tokens, trained with Hugging Face ``tokenizers``.

Byte-level means every string becomes bytes first, so any Unicode text round-trips exactly;
``<|endoftext|>`` (id 0) separates documents in the training stream.

A ``tokenizer.json`` read from elsewhere is untrusted input: :func:`check_tokenizer_spec` accepts only the shapes
:func:`train_tokenizer` makes (a byte-level BPE, or a plain word-level vocabulary, with no normalizer, no
truncation or padding, the ByteLevel pre-tokenizer or the GPT-2 split pattern before a ByteLevel without its own
regex, a ByteLevel decoder and post-processor or none, added tokens without whitespace). A normalizer that
multiplies the text, or a split regex that backtracks without end, is refused before the Rust library builds it.
This is the one check: ``prepare --tokenizer``, ``train``'s prepared corpus and ``sprout_interp.load`` all apply it
(:func:`load_tokenizer` reads, bounds and checks a file), and :func:`check_expansion` stops an encoding that gives
more ids than the text has bytes.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"
VOCAB_SIZE = 8192
PIECE_CHARS = 1 << 16  # encode_pieces: a text is encoded about this many characters at a time (measured on one
# core: 64K-character pieces encode twice as fast as 1M-character ones or a 4 MB text whole)
MAX_TOKENIZER_BYTES = 64 << 20  # the largest tokenizer.json read (Sprout's 8,192-token BPE is about 0.5 MB)
#: The GPT-2 pre-tokenization regex (what ByteLevel's ``use_regex=True`` applies): the one Split pattern accepted.
GPT2_SPLIT_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
ALLOWED = (
    "Sprout reads byte-level BPE tokenizers as sprout_model.tokenizer trains them (or a plain word-level "
    "vocabulary): no normalizer, no truncation or padding, the ByteLevel pre-tokenizer (or a Split with the GPT-2 "
    "pattern before a ByteLevel with use_regex=false), a ByteLevel decoder and post-processor or none, and added "
    "tokens without whitespace that strip nothing. Pass the tokenizer.json the model was trained with"
)
_BYTE_LEVEL_KEYS = {"type": str, "add_prefix_space": bool, "trim_offsets": bool, "use_regex": bool}
_MAX_ADDED_TOKENS, _MAX_ADDED_CHARS = 1024, 256


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


def _refuse(source: str, why: str) -> TokenizerError:
    return TokenizerError(f"{source} is not a tokenizer Sprout can use: {why}. {ALLOWED}")


def _check_byte_level(spec: dict, where: str, source: str, use_regex: bool | None = None) -> None:
    """A ByteLevel pre-tokenizer, decoder or post-processor: known keys of the right types only."""
    for k, v in spec.items():
        if k not in _BYTE_LEVEL_KEYS or not isinstance(v, _BYTE_LEVEL_KEYS[k]):
            raise _refuse(source, f"its {where} ByteLevel has the option {str(k)[:40]!r}={str(v)[:40]!r}")
    if use_regex is not None and spec.get("use_regex", True) is not use_regex:
        raise _refuse(source, f"its {where} ByteLevel has use_regex={not use_regex}, expected {use_regex} here")


def _check_pre_tokenizer(spec: Any, source: str) -> None:
    if spec is None:
        return
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind == "ByteLevel":
        _check_byte_level(spec, "pre-tokenizer", source, use_regex=True)
        return
    if kind == "Sequence":
        parts = spec.get("pretokenizers")
        if isinstance(parts, list) and len(parts) == 1 and isinstance(parts[0], dict) and parts[0].get("type") == "ByteLevel":
            _check_byte_level(parts[0], "pre-tokenizer", source, use_regex=True)
            return
        if isinstance(parts, list) and len(parts) == 2 and all(isinstance(p, dict) for p in parts):
            split, byte_level = parts
            if split.get("type") == "Split" and byte_level.get("type") == "ByteLevel":
                pattern = split.get("pattern")
                if pattern != {"Regex": GPT2_SPLIT_PATTERN}:
                    raise _refuse(source, f"its pre-tokenizer splits with the pattern {str(pattern)[:120]!r}; the only "
                                          f"split pattern accepted is GPT-2's, {GPT2_SPLIT_PATTERN!r}")
                if set(split) != {"type", "pattern", "behavior", "invert"} or split["behavior"] != "Isolated" \
                        or split["invert"] is not False:
                    raise _refuse(source, "its GPT-2 Split pre-tokenizer is not behavior='Isolated', invert=false")
                _check_byte_level(byte_level, "pre-tokenizer", source, use_regex=False)
                return
    raise _refuse(source, f"its pre-tokenizer is {str(kind or type(spec).__name__)[:60]!r}")


def _check_model(spec: Any, source: str) -> None:
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind not in ("BPE", "WordLevel", None):
        raise _refuse(source, f"its model is {str(kind)[:60]!r}, not BPE")
    if not isinstance(spec, dict) or not isinstance(spec.get("vocab"), dict):
        raise _refuse(source, "its model has no vocabulary")
    if kind == "WordLevel" or (kind is None and "merges" not in spec):
        if set(spec) - {"type", "vocab", "unk_token"} or not isinstance(spec.get("unk_token"), (str, type(None))):
            raise _refuse(source, "its WordLevel model has options other than vocab and unk_token")
        return
    want = {"dropout": (None,), "unk_token": (None,), "continuing_subword_prefix": (None,),
            "end_of_word_suffix": (None,), "fuse_unk": (False,), "byte_fallback": (False,), "ignore_merges": (False, True)}
    for k, v in spec.items():
        if k in ("type", "vocab", "merges"):
            continue
        if k not in want or not any(v is w for w in want[k]):
            raise _refuse(source, f"its BPE model has the option {str(k)[:40]!r}={str(v)[:40]!r} (Sprout's BPE has "
                                  "no dropout, unknown token, subword prefix or suffix, and no byte fallback)")
    if not isinstance(spec.get("merges", []), list):
        raise _refuse(source, "its BPE model's merges are not a list")


def _check_added_tokens(spec: Any, source: str) -> None:
    if spec is None:
        return
    if not isinstance(spec, list) or len(spec) > _MAX_ADDED_TOKENS:
        raise _refuse(source, f"its added_tokens are not a list of at most {_MAX_ADDED_TOKENS:,} tokens")
    for t in spec:
        content = t.get("content") if isinstance(t, dict) else None
        if not isinstance(content, str) or not 0 < len(content) <= _MAX_ADDED_CHARS or any(c.isspace() for c in content):
            raise _refuse(source, f"its added token {str(content)[:60]!r} is not 1 to {_MAX_ADDED_CHARS} characters "
                                  "without whitespace")
        if t.get("lstrip") or t.get("rstrip"):
            raise _refuse(source, f"its added token {content[:60]!r} strips the whitespace around it")


def check_tokenizer_spec(spec: Any, source: str = "the tokenizer") -> None:
    """Refuse a parsed ``tokenizer.json`` (any JSON value) whose components are not a Sprout tokenizer's (see the
    module docstring). ``source`` names it in the message. Returns None; raises :class:`TokenizerError` saying what
    is wrong and what is allowed."""
    if not isinstance(spec, dict):
        held = {list: "an array", str: "a string", bool: "true or false", type(None): "null"}.get(
            type(spec), "a number" if isinstance(spec, (int, float)) else type(spec).__name__)
        raise _refuse(source, f"it is not a JSON object (it holds {held})")
    for k in ("truncation", "padding", "normalizer"):
        if spec.get(k) is not None:
            raise _refuse(source, f"it has a {k} ({str(spec[k])[:120]}); Sprout's tokenizers have none")
    _check_added_tokens(spec.get("added_tokens"), source)
    _check_pre_tokenizer(spec.get("pre_tokenizer"), source)
    for part in ("decoder", "post_processor"):
        sub = spec.get(part)
        if sub is None:
            continue
        if not isinstance(sub, dict) or sub.get("type") != "ByteLevel":
            raise _refuse(source, f"its {part.replace('_', '-')} is "
                                  f"{str(sub.get('type') if isinstance(sub, dict) else type(sub).__name__)[:60]!r}")
        _check_byte_level(sub, part.replace("_", "-"), source)
    _check_model(spec.get("model"), source)


def check_expansion(text: str, n_ids: int, at: int = 0) -> None:
    """Raise :class:`TokenizerError` when ``text`` (found at character ``at``) was encoded to more ids than its
    UTF-8 bytes plus one (a prefix space): a byte-level BPE gives at most one id per byte, so such a tokenizer
    expands text (a normalizer or post-processor that adds characters or tokens)."""
    n_bytes = len(text.encode("utf-8", "surrogatepass"))
    if n_ids > n_bytes + 1:
        raise TokenizerError(
            f"the tokenizer turned {len(text):,} characters ({n_bytes:,} UTF-8 bytes) at character {at:,} into "
            f"{n_ids:,} token ids; a byte-level BPE gives at most one per byte, so this tokenizer expands "
            f"text (a normalizer or post-processor that adds characters or tokens) and is refused. {ALLOWED}")


def is_rust_panic(err: BaseException) -> bool:
    """Whether ``err`` is a Rust panic that pyo3 raised (``pyo3_runtime.PanicException``, which derives from
    ``BaseException``, not ``Exception``; the module cannot be imported, so the class is known by its name)."""
    return not isinstance(err, Exception) and any(c.__name__ == "PanicException" for c in type(err).__mro__)


def load_tokenizer(path: str | Path, max_bytes: int | None = None) -> Tokenizer:
    """The tokenizer in ``path``, read (at most ``max_bytes``, default :data:`MAX_TOKENIZER_BYTES`) and refused
    by :func:`check_tokenizer_spec` before the Rust library builds it. Raises :class:`TokenizerError` naming the
    file for one that is too large, not UTF-8 JSON, not a Sprout tokenizer or that the library cannot read;
    OSError for a file that cannot be opened."""
    limit = MAX_TOKENIZER_BYTES if max_bytes is None else max_bytes
    with open(path, "rb") as fh:
        raw = fh.read(limit + 1)
    if len(raw) > limit:
        raise TokenizerError(f"{path} is over {limit:,} bytes, far more than a tokenizer.json (Sprout's is about "
                             "0.5 MB): pass the tokenizer.json the model was trained with")
    try:
        text = raw.decode("utf-8")
        spec = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise TokenizerError(f"{path} is not a tokenizers file ({type(e).__name__}: {str(e)[:200]})") from None
    check_tokenizer_spec(spec, str(path))
    try:
        return Tokenizer.from_str(text)
    except BaseException as e:
        if not (isinstance(e, Exception) or is_rust_panic(e)):
            raise
        raise TokenizerError(f"{path} is not a tokenizers file ({type(e).__name__}: {str(e)[:200]})") from None


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text``; raises TokenizerError for strings that are not valid Unicode (lone surrogates), and
    for a tokenizer that expands text (:func:`check_expansion`)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise TokenizerError(
            f"the text holds a lone surrogate ({text[e.start:e.end]!r} at character {e.start}), which is not valid "
            "Unicode and has no UTF-8 bytes; decode your source with errors='replace' first"
        ) from None
    ids = tok.encode(text, add_special_tokens=False).ids
    check_expansion(text, len(ids))
    return ids


def check_corpus_tokenizer(tok: Tokenizer, source: str, vocab_size: int | None = None) -> Tokenizer:
    """``tok`` when it can write a prepared corpus and read its checkpoints: it has ``<|endoftext|>`` (put between
    documents), at most 65,536 tokens (the token files are uint16) and, when given, exactly ``vocab_size`` (the
    model's embedding rows: a loader refuses a tokenizer of another size). TokenizerError naming ``source``."""
    if tok.token_to_id(EOT) is None:
        raise TokenizerError(f"{source} has no {EOT} token, which a prepared corpus puts between documents")
    n = tok.get_vocab_size()
    if n > 1 << 16:
        raise TokenizerError(f"{source} has {n:,} tokens; the token files are uint16 (at most 65,536)")
    if vocab_size is not None and n != vocab_size:
        raise TokenizerError(f"{source} has {n:,} tokens but the prepared corpus says vocab_size {vocab_size:,}: a "
                             "checkpoint with it would load nowhere; run sprout_model.prepare again")
    return tok


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
