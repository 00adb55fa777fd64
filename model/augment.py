"""Training-data augmentations that reward copying from context instead of memorising.

* Name randomisation: each document's recurring proper names are replaced by invented names,
  consistent within the document and drawn afresh for every view of the corpus, so a name can only be
  predicted from earlier in the same text (what an induction head does).
* Repeated random segments: a few rows of random tokens that repeat with a random period, so copying
  pays off at every distance rather than one fixed offset.

The validation split is never augmented: validation loss is always measured on real text.
"""
from __future__ import annotations

import collections
import random
import re
from typing import Iterable

import numpy as np

_WORD = re.compile(r"\b[A-Za-z][a-z]+\b")
_NOT_NAMES = {"mr", "mrs", "dr", "st", "sidenote", "god", "lord", "sir", "madame", "monsieur", "oh", "ah"}

ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "j", "k", "kr", "l", "m", "n", "p", "pl", "qu", "r",
          "s", "sk", "sl", "t", "th", "tr", "v", "w", "z", "zh", ""]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "y"]
CODAS = ["", "", "n", "r", "x", "l", "m", "s", "th", "nd", "rk", "b", "v"]


def find_names(texts: Iterable[str], min_count: int = 5, max_lower_share: float = 0.02) -> set[str]:
    """Lower-cased words that appear capitalised at least ``min_count`` times and almost never in lower case."""
    cap: collections.Counter[str] = collections.Counter()
    low: collections.Counter[str] = collections.Counter()
    for t in texts:
        for w in _WORD.findall(t):
            (cap if w[0].isupper() else low)[w.lower()] += 1
    return {w for w, c in cap.items() if c >= min_count and low[w] <= max_lower_share * c and len(w) >= 3} - _NOT_NAMES


def invent_name(rng: random.Random) -> str:
    """A pronounceable invented word of 2-3 syllables, capitalised ("Zorbin", "Plax"-like)."""
    n = rng.choice((1, 2, 2, 3))
    s = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(n)) + rng.choice(CODAS)
    return s[:1].upper() + s[1:]


def common_words(texts: Iterable[str], min_count: int = 20, min_len: int = 4, max_len: int = 9) -> list[str]:
    """Lower-case words of ``min_len``..``max_len`` letters seen at least ``min_count`` times in lower case,
    sorted (the raw material of :func:`splice_name`)."""
    low: collections.Counter[str] = collections.Counter(w for t in texts for w in _WORD.findall(t) if w[0].islower())
    return sorted(w for w, c in low.items() if c >= min_count and min_len <= len(w) <= max_len)


def splice_name(rng: random.Random, words: list[str]) -> str:
    """The start of one common word joined to the end of another, capitalised ("Mar" + "ick").

    Its pieces are ordinary word pieces, so a model cannot tell it is a name from its spelling and has to
    copy it from context against a strong prior for the usual continuation (``Mars`` -> ``h``)."""
    a, b = rng.sample(words, 2)
    s = a[: rng.randint(2, len(a) - 1)] + b[rng.randint(1, len(b) - 2):]
    return s[:1].upper() + s[1:]


def randomise_names(text: str, names: set[str], rng: random.Random, min_in_doc: int = 2,
                    words: list[str] | None = None, splice_share: float = 0.0, full_share: float = 0.0) -> str:
    """Replace every capitalised occurrence of each name that recurs in ``text`` by one invented name:
    a :func:`splice_name` of ``words`` with probability ``splice_share``, else an :func:`invent_name`.

    With probability ``full_share`` a name's replacement is instead a full name of two words, the second a
    :func:`splice_name` of ``words`` (an :func:`invent_name` without them), used at every mention: from its
    second mention on, the surname's first piece (often a common word's start, " Mars") can only be
    predicted by copying it from the earlier mention, against the prior for the ordinary word that
    usually follows a name (" had")."""
    counts = collections.Counter(w.lower() for w in _WORD.findall(text) if w[0].isupper() and w.lower() in names)
    mapping: dict[str, str] = {}
    used: set[str] = set()

    def one() -> str:
        spliced = splice_share > 0 and words and rng.random() < splice_share  # no draw at 0: old views unchanged
        return splice_name(rng, words) if spliced else invent_name(rng)

    def fresh() -> str:
        if full_share > 0 and rng.random() < full_share:  # no draw at 0 either
            return one() + " " + (splice_name(rng, words) if words else invent_name(rng))
        return one()

    for w, c in counts.items():
        if c < min_in_doc:
            continue
        new = fresh()
        while new.lower() in used or new.lower() in names:
            new = fresh()
        used.add(new.lower())
        mapping[w] = new
    if not mapping:
        return text

    def sub(m: re.Match) -> str:
        w = m.group(0)
        new = mapping.get(w.lower()) if w[0].isupper() else None
        if new is None:
            return w
        return new.upper() if w.isupper() and len(w) > 1 else new

    return _WORD.sub(sub, text)


def repeated_random_row(rng: np.random.Generator, length: int, vocab: int, min_period: int = 8,
                        max_period: int | None = None) -> np.ndarray:
    """``length`` tokens: a random segment (ids 1..vocab-1) repeated with a random period, so the
    continuation is only predictable by finding the earlier copy."""
    max_period = max_period or length // 2
    period = int(rng.integers(min_period, max_period + 1))
    seg = rng.integers(1, vocab, size=period)
    return np.resize(seg, length).astype(np.int64)


def repeated_text_row(rng: np.random.Generator, row: np.ndarray, min_period: int = 8,
                      max_period: int | None = None) -> np.ndarray:
    """The row's own first P tokens repeated to its length, P random in [min_period, max_period]
    (default half the row): real text, so the first copy is ordinary language modelling and the
    repeats are predictable only by finding the earlier copy (P varies, so no fixed offset works)."""
    max_period = max_period or len(row) // 2
    period = int(rng.integers(min_period, max_period + 1))
    return np.resize(row[:period], len(row)).astype(np.int64)
