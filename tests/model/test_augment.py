"""Name randomisation for training data: names found, replaced consistently, spliced names made of word pieces."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from sprout_model.augment import common_words, find_names, randomise_names, splice_name
from sprout_model.prepare import prepare

pytestmark = pytest.mark.unit

STORY = ("Holmes looked at Watson. " * 6 + "the quiet garden was quiet and the garden gate was open. " * 25
         + "Holmes smiled, and Watson said nothing to Holmes.")
WORDS = ["marsh", "pick", "velvet", "island", "strong", "bring", "remember", "quiet"]


def test_find_names_keeps_capitalised_words_that_are_never_lower_case():
    names = find_names([STORY])
    assert {"holmes", "watson"} <= names
    assert "garden" not in names and "the" not in names


def test_common_words_are_frequent_lower_case_words_of_the_asked_length():
    # "looked" (6 times) is too rare, "the"/"was"/"and" too short, the names are never lower case
    assert common_words([STORY], min_count=20) == ["garden", "gate", "open", "quiet"]
    assert common_words([STORY], min_count=20, min_len=5) == ["garden", "quiet"]


def test_splice_name_joins_a_start_and_an_end_of_two_different_words():
    rng = random.Random(0)
    for _ in range(200):
        s = splice_name(rng, WORDS)
        assert s[0].isupper() and s[1:].islower() and len(s) >= 3
        low = s.lower()
        # some word's start (at least 2 letters) followed by another word's end (at least 2 letters)
        assert any(low.startswith(a[:i]) and any(b.endswith(low[i:]) and b != a and len(low) - i >= 2
                                                for b in WORDS)
                   for a in WORDS for i in range(2, len(a)))


def test_randomise_names_is_consistent_within_a_document_and_keeps_the_rest():
    names = find_names([STORY])
    out = randomise_names(STORY, names, random.Random(1))
    assert "Holmes" not in out and "Watson" not in out
    assert out.count("the quiet garden was quiet") == 25  # ordinary words untouched
    first = re.match(r"(\w+) looked at (\w+)\.", out)
    new_holmes, new_watson = first.groups()
    assert new_holmes != new_watson
    assert out.count(new_holmes) == STORY.count("Holmes") and out.count(new_watson) == STORY.count("Watson")


def test_splice_share_picks_the_kind_of_invented_name():
    names = find_names([STORY])

    def invented(seed: int, **kw) -> str:
        return re.match(r"(\w+) looked", randomise_names(STORY, names, random.Random(seed), **kw)).group(1)

    # share 0 draws exactly the names of the original augmentation (views prepared before stay valid)
    assert [invented(s, words=WORDS, splice_share=0.0) for s in range(30)] == [invented(s) for s in range(30)]
    spliced = [invented(s, words=WORDS, splice_share=1.0) for s in range(30)]
    assert all(any(n.lower().startswith(w[:2]) for w in WORDS) for n in spliced)
    assert spliced != [invented(s) for s in range(30)]
    half = [invented(s, words=WORDS, splice_share=0.5) for s in range(200)]
    from_words = sum(any(n.lower().startswith(w[:2]) and any(b.endswith(n.lower()[-2:]) for b in WORDS)
                         for w in WORDS) for n in half)
    assert 60 < from_words < 200  # about half are splices (some syllable names pass this test by chance)


def test_full_share_gives_two_word_names_whose_surname_is_spliced_and_repeats():
    names = find_names([STORY])

    def first_words(seed: int, **kw) -> str:
        return re.match(r"(.+?) looked at", randomise_names(STORY, names, random.Random(seed), **kw)).group(1)

    # share 0 draws exactly the views prepared before it existed
    assert ([first_words(s, words=WORDS, splice_share=0.5, full_share=0.0) for s in range(30)]
            == [first_words(s, words=WORDS, splice_share=0.5) for s in range(30)])
    for s in range(30):
        out = randomise_names(STORY, names, random.Random(s), words=WORDS, splice_share=0.5, full_share=1.0)
        holmes = first_words(s, words=WORDS, splice_share=0.5, full_share=1.0)
        first, surname = holmes.split(" ")
        assert first[0].isupper() and surname[0].isupper()
        low = surname.lower()  # a common word's start and another's end
        assert any(low.startswith(a[:i]) and any(b.endswith(low[i:]) for b in WORDS if b != a)
                   for a in WORDS for i in range(2, len(a)))
        assert out.count(holmes) == STORY.count("Holmes")  # the whole full name at every mention
        assert "the quiet garden was quiet" in out
    half = [" " in first_words(s, words=WORDS, splice_share=0.5, full_share=0.5) for s in range(200)]
    assert 60 < sum(half) < 140
    # without words the surname is a syllable name
    assert " " in first_words(0, full_share=1.0)


def test_prepare_writes_views_with_full_names_and_records_the_share(tmp_path):
    tokenizer = Path(__file__).resolve().parents[2] / "model" / "checkpoints" / "tokenizer.json"
    (tmp_path / "texts").mkdir()
    for i in range(6):
        (tmp_path / "texts" / f"{i}.txt").write_text((STORY + "\n\n") * 3)
    meta = prepare(str(tmp_path / "texts"), tmp_path / "out", val_fraction=0.2, name_views=1, splice_share=0.5,
                   tokenizer=tokenizer, full_name_share=1.0)
    assert meta["full_name_share"] == 1.0 == json.loads((tmp_path / "out" / "meta.json").read_text())["full_name_share"]
    view = Tokenizer.from_file(str(tokenizer)).decode(
        np.fromfile(tmp_path / "out" / "train_names0.bin", dtype=np.uint16).tolist(), skip_special_tokens=False)
    docs = [d for d in view.split("<|endoftext|>") if d.strip()]
    assert len(docs) == meta["train_documents"] and "Holmes" not in view
    for d in docs:  # every name is two words, the same two at every mention of the document
        holmes = re.match(r"\s*(\w+ \w+) looked at (\w+ \w+)\.", d).group(1)
        assert d.count(holmes) == d.count(" looked at ") + d.count(" smiled,") + d.count("nothing to ")
    with pytest.raises(ValueError, match="--full-name-share must be between 0 and 1"):
        prepare(str(tmp_path / "texts"), tmp_path / "bad", name_views=1, full_name_share=1.5)
