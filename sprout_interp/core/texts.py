"""Ready-made texts for the analyses and the dashboard, and a seeded sample of held-out text.

The three short texts were written for this project (like the chapter's "three ready-made texts"):
a story that repeats an invented name, a dialogue, and a descriptive passage. ``validation_sample``
draws fixed windows from the corpus's validation documents (the same document split as
``python -m sprout_model.prepare``: seed 0, 5% of documents), which no shipped model trained on.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from sprout_interp.core.arguments import check_count
from sprout_interp.core.tokens import tokenizer_call, tokenizer_from_json

__all__ = [
    "validation_documents", "training_documents", "validation_sample", "corpus_of", "sample_corpus", "held_out_for", "training_sample",
    "training_sample_for", "clear_caches", "TEXTS",
]

TEXTS: dict[str, str] = {
    "story": (
        "Zorbin Plax came home late from the harbour, his coat wet through and his boots full of sand. "
        "His sister opened the door before he could knock. \"You are soaked,\" she said. \"Come in and sit "
        "by the fire.\" Zorbin Plax took off his coat and sat down without a word. For a long time he only "
        "watched the flames. At last he told her what he had seen on the water: a boat with no sails and no "
        "oars, drifting in against the wind. When the fire had burned low, Zorbin Plax stood up and went "
        "to the window to look at the sea once more."
    ),
    "dialogue": (
        "\"Where have you been all morning?\" asked the captain.\n\n"
        "\"At the market, sir,\" said the boy. \"You told me to buy bread and salt.\"\n\n"
        "\"I told you to be back by nine. It is nearly noon.\"\n\n"
        "\"The baker had no bread, sir, so I walked to the mill, and the miller's wife gave me a loaf "
        "for nothing because her son is sick and she wanted me to carry a letter to the doctor.\"\n\n"
        "The captain looked at him for a moment and then laughed. \"Well, and did you carry it?\"\n\n"
        "\"Yes, sir. The doctor is coming this afternoon.\""
    ),
    "description": (
        "The valley lay quiet under the first snow of the year. On the far side of the river the pine "
        "woods rose in dark rows toward the ridge, and above them the sky was pale and still. Smoke went "
        "straight up from the chimneys of the village, and the church bell, which had been cracked for "
        "as long as anyone could remember, rang the hour with a dull and broken sound. In the fields the "
        "old walls were white on top and black below, and a single crow walked slowly along one of them, "
        "as if it had lost something and did not expect to find it again."
    ),
}

VAL_FRACTION, SPLIT_SEED = 0.05, 0  # must match sprout_model.prepare's defaults


@functools.lru_cache(maxsize=2)
def _split(corpus: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    from sprout_model.corpus import load_documents, split_corpus

    train, val = split_corpus(corpus, load_documents(corpus), VAL_FRACTION, SPLIT_SEED)
    return tuple(d.text for d in train), tuple(d.text for d in val)


def validation_documents(corpus: str = "default") -> tuple[str, ...]:
    """Texts of the corpus's held-out documents (needs the corpus packages: ``pip install -e '.[train]'``).

    The same document split as ``python -m sprout_model.prepare`` (``split_corpus`` with seed 0 and
    5% of documents: a corpus that extends "default" keeps "default"'s split), so no model trained by this
    project on that corpus saw them.
    """
    return _split(corpus)[1]


def training_documents(corpus: str = "default") -> tuple[str, ...]:
    """Texts of the corpus's training documents: the other 95% of the split of :func:`validation_documents`."""
    return _split(corpus)[0]


@functools.lru_cache(maxsize=4)
def _encoded(tokenizer_json: str, corpus: str) -> tuple[tuple[int, ...], ...]:
    tok = tokenizer_from_json(tokenizer_json, "the model's tokenizer")
    docs = validation_documents(corpus)
    return tuple(tuple(e.ids) for e in tokenizer_call("encoding held-out documents", tok.encode_batch, list(docs),
                                                       add_special_tokens=False))


def clear_caches() -> None:
    """Forget the held-out and training documents and their tokens read so far (each is read once per process and
    kept): the next call reads the corpus again, as a freshly started process does."""
    _split.cache_clear()
    _encoded.cache_clear()


#: The most windows one sample draws: each is a row of ``length`` ids held at once, and every metric here runs them.
MAX_WINDOWS = 100_000


def _sample_args(n, length, seed) -> tuple[int, int, int]:
    """``n`` (windows, 1..MAX_WINDOWS), ``length`` (tokens per window, from 1) and ``seed`` (from 0) as ints;
    ArgumentError (a ValueError) naming the argument otherwise."""
    return (check_count(n, "n", high=MAX_WINDOWS, what="windows drawn"),
            check_count(length, "length", what="tokens per window"),
            check_count(seed, "seed", low=0, what="the draw's seed"))


def validation_sample(tokenizer, n: int = 16, length: int = 256, seed: int = 0, corpus: str = "default") -> torch.Tensor:
    """``n`` windows of ``length`` token ids from held-out documents: a LongTensor ``(n, length)``.

    A fixed, seeded sample: the documents are visited in an order drawn with ``seed`` and one window
    starts at a seeded random offset in each (a document is visited again only when ``n`` exceeds the
    number of documents long enough). Every window lies inside one document, so no ``<|endoftext|>``.
    ``tokenizer`` is the model's ``tokenizers.Tokenizer`` (``model.tokenizer``); encodings are cached
    per tokenizer, so several models sharing one tokenizer encode the documents once.
    """
    n, length, seed = _sample_args(n, length, seed)
    enc = _encoded(tokenizer.to_str(), corpus)
    long_enough = [i for i, ids in enumerate(enc) if len(ids) > length]
    if not long_enough:
        raise ValueError(f"no held-out document of corpus {corpus!r} is longer than {length} tokens")
    rng = np.random.default_rng(seed)
    order = [long_enough[i] for i in rng.permutation(len(long_enough))]
    rows = []
    for j in range(n):
        ids = enc[order[j % len(order)]]
        start = int(rng.integers(0, len(ids) - length))
        rows.append(ids[start: start + length])
    return torch.tensor(rows, dtype=torch.long)


def corpus_of(model) -> str:
    """The corpus a loaded model was trained on: the one named in its train.json, "default" when none is."""
    return (getattr(model, "info", None) or {}).get("corpus") or "default"


def sample_corpus(model) -> str:
    """The corpus :func:`held_out_for` and :func:`training_sample_for` draw from for a loaded model by default:
    "default" for a model of "default" or of a corpus that extends it (``sprout_model.corpus.EXTENDS``: the
    extension keeps "default"'s split, so its validation documents are held out and its training documents
    trained on), so the shipped models, whichever of the two corpora each trained on, are measured and fitted
    on the same text; a model of any other corpus (a folder of .txt), its own."""
    from sprout_model.corpus import EXTENDS

    corpus = corpus_of(model)
    return "default" if corpus in EXTENDS else corpus


def held_out_for(model, n: int = 16, length: int = 256, seed: int = 0, corpus: str | None = None) -> torch.Tensor:
    """:func:`validation_sample` for a loaded model: its tokenizer, ``corpus`` (default:
    :func:`sample_corpus`), windows no longer than its context. Raises CorpusError without the corpus.

    A corpus other than the model's own is held-out text for it only when its validation documents are among
    the model's: "default"'s are among "large"'s (``sprout_model.corpus``), so "default" measures a model of
    either corpus on the same windows."""
    corpus = corpus or sample_corpus(model)
    return validation_sample(model.tokenizer, n=n, length=min(length, model.cfg.n_ctx), seed=seed, corpus=corpus)


def training_sample(tokenizer, n: int = 64, length: int = 256, seed: int = 0, corpus: str = "default") -> torch.Tensor:
    """``n`` windows of ``length`` token ids from the corpus's training documents: a LongTensor ``(n, length)``.

    The sibling of :func:`validation_sample` for fitting things to the model's own training text (the
    tuned lens), deterministic for a seed: the training documents are visited in a seeded order and taken
    until they hold about three times the characters the windows need (only those are encoded, so a small
    sample is quick); windows are then drawn inside one document each, documents with probability
    proportional to how many windows fit in them, offsets uniform.
    """
    n, length, seed = _sample_args(n, length, seed)
    docs = training_documents(corpus)
    rng = np.random.default_rng(seed)
    chosen, chars = [], 0
    for i in rng.permutation(len(docs)):
        if chars >= 3 * 5 * n * length:  # about 5 characters per token
            break
        chosen.append(docs[int(i)])
        chars += len(docs[int(i)])
    enc = [e.ids for e in tokenizer_call("encoding training documents", tokenizer.encode_batch, chosen,
                                         add_special_tokens=False)]
    room = np.array([max(len(ids) - length, 0) for ids in enc], dtype=np.float64)
    if not room.any():
        raise ValueError(f"no training document of corpus {corpus!r} is longer than {length} tokens")
    picks = rng.choice(len(enc), size=n, p=room / room.sum())
    rows = []
    for d in picks:
        ids = enc[int(d)]
        start = int(rng.integers(0, len(ids) - length))
        rows.append(ids[start: start + length])
    return torch.tensor(rows, dtype=torch.long)


def training_sample_for(model, n: int = 64, length: int = 256, seed: int = 0, corpus: str | None = None) -> torch.Tensor:
    """:func:`training_sample` for a loaded model: its tokenizer, ``corpus`` (default: :func:`sample_corpus`,
    the same as :func:`held_out_for`'s), windows no longer than its context. Raises CorpusError without the
    corpus packages."""
    corpus = corpus or sample_corpus(model)
    return training_sample(model.tokenizer, n=n, length=min(length, model.cfg.n_ctx), seed=seed, corpus=corpus)
