"""Readable labels for tokens that hold part of a UTF-8 character (sprout_interp.core.tokens.token_labels and kin).

A byte-level BPE splits a character such as 'ï' or '日' into tokens of one or two bytes; decoded one at a time each
piece is '\\ufffd'. The labels merge the pieces into the character (on the token holding its first byte, the others
'◌'), or show a piece that forms no character as ⟨0xE2⟩; checked against Python's own UTF-8 decoding.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from sprout_interp.core import loading
from sprout_interp.core.tokens import (
    CONTINUED,
    _byte_alphabet,
    byte_labels,
    ids_to_str_tokens,
    merge_byte_labels,
    token_bytes,
    token_labels,
    tokenizer_from_json,
)

pytestmark = pytest.mark.unit
TOKENIZER = Path(loading.SHIPPED_DIR) / "tokenizer.json"


@pytest.fixture(scope="module")
def tok():
    if not TOKENIZER.is_file():
        pytest.skip("the shipped tokenizer is not installed")
    return tokenizer_from_json(TOKENIZER.read_text(encoding="utf-8"), str(TOKENIZER))


def test_pieces_of_a_character_are_merged_or_shown_as_bytes():
    e9 = "é".encode()  # c3 a9
    ni = "日".encode()  # e6 97 a5
    assert byte_labels([b"caf", e9[:1], e9[1:]]) == ["caf", "é", CONTINUED]
    assert byte_labels([b" ", ni[:1], ni[1:2], ni[2:] + b"s"]) == [" ", "日", CONTINUED, "s"]
    assert byte_labels([b"a", ni[:2]]) == ["a", "⟨0xE6⟩⟨0x97⟩"]  # cut by the end of the text
    assert byte_labels([ni[1:], b"x"]) == ["⟨0x97⟩⟨0xA5⟩", "x"]  # begun before the text
    assert byte_labels([b"\xff", b"\xc3(", b""]) == ["⟨0xFF⟩", "⟨0xC3⟩(", ""]  # never UTF-8; an empty token stays empty
    assert byte_labels([]) == []
    assert merge_byte_labels(["a", "⟨0xC3⟩", "⟨0xA9⟩t"]) == ["a", "é", "t"]
    assert merge_byte_labels(["plain", " text"]) == ["plain", " text"]


def test_the_byte_alphabet_is_the_tokenizers():
    from tokenizers import pre_tokenizers

    alphabet = _byte_alphabet()
    assert sorted(alphabet.values()) == list(range(256))
    assert set(alphabet) == set(pre_tokenizers.ByteLevel.alphabet())


def test_labels_of_tokenized_text_agree_with_utf8_decoding(tok):
    """On texts mixing ASCII, accents, dashes, CJK and emoji: each token's bytes are the UTF-8 of its text (together
    the text's bytes); the labels, '◌' left out, spell the text; each character sits on the token that holds its
    first byte (found from the tokens' byte lengths); no '\\ufffd' is left where ids_to_str_tokens has them."""
    rng = random.Random(0)
    alphabet = list("abc XYZ.,'") + list("éïçñ—’“”") + list("日本語中文") + ["🙂", "🌱", "ß", "Ω"]
    split = 0
    for _ in range(40):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        ids = tok.encode(text, add_special_tokens=False).ids
        pieces = token_bytes(tok, ids)
        assert b"".join(pieces) == text.encode("utf-8")
        labels = token_labels(tok, ids)
        assert len(labels) == len(ids)
        assert "".join(lab for lab in labels if lab != CONTINUED) == text
        assert "\ufffd" not in "".join(labels)
        starts, at = [], 0
        for p in pieces:
            starts.append(at)
            at += len(p)
        byte_pos = 0
        for ch in text:
            owner = max(t for t, s in enumerate(starts) if s <= byte_pos and len(pieces[t]))
            assert ch in labels[owner]
            byte_pos += len(ch.encode("utf-8"))
        one_by_one = [token_labels(tok, [i])[0] for i in ids]
        assert merge_byte_labels(one_by_one) == labels
        split += sum("\ufffd" in s for s in ids_to_str_tokens(tok, ids))
    assert split > 10  # the texts did split characters across tokens


def test_a_piece_alone_shows_its_bytes(tok):
    ids = tok.encode("日", add_special_tokens=False).ids
    assert len(ids) > 1  # the shipped vocabulary splits it
    assert "".join(token_labels(tok, [i])[0] for i in ids) == "⟨0xE6⟩⟨0x97⟩⟨0xA5⟩"


def test_feature_contexts_show_a_split_character_whole():
    """A feature page's context window (features.pages.top_contexts, also the neurons' pages) merges the pieces of a
    character that its vocabulary labels show as bytes, and keeps the window one label per token."""
    import torch

    from sprout_interp.features.pages import top_contexts

    strings = ["caf", "⟨0xC3⟩", "⟨0xA9⟩", " au", " lait"]
    toks = torch.tensor([[0, 1, 2, 3, 4]])
    acts = torch.tensor([[0.0, 0.5, 2.0, 0.0, 0.1]])
    ctx = top_contexts(acts, toks, strings, torch.tensor([2]))
    assert ctx.loc[0, "tokens"] == ["caf", "é", CONTINUED, " au", " lait"] and ctx.loc[0, "center"] == 2
    assert len(ctx.loc[0, "acts"]) == 5
