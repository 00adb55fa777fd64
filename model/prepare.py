"""Build the corpus, split it by document, train the tokenizer and write token files.

    python -m sprout_model.prepare [--corpus default|fiction|large|FOLDER] [--out data/default]

Writes ``tokenizer.json``, ``train.bin`` and ``val.bin`` (uint16 token ids, documents joined by
``<|endoftext|>``) and ``meta.json`` (sizes, the corpus hash, and documents, characters and tokens by source)
into the output folder, and prints the table by source.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from .augment import common_words, find_names, randomise_names
from .cli import FRACTION, ArgumentParser, Number, input_errors_exit, writable_folder
from .corpus import CorpusError, corpus_hash, describe, describe_sources, load_documents, source_counts, source_of, split_corpus
from .tokenizer import EOT, TokenizerError, check_corpus_tokenizer, encode_pieces, load_tokenizer, train_tokenizer

DATA_ROOT = Path("data")
MAX_NAME_VIEWS = 32  # --name-views: each view is one more copy of the training split's tokens, and train reads
# one view per epoch (version e mod K in epoch e), so more views than a run's epochs are never read; the recipes use 4


def reuse_tokenizer(path: str | Path) -> Tokenizer:
    """A ``tokenizer.json`` to encode with, checked as ``sprout_interp.load`` checks a checkpoint's (its size, its
    JSON, a Sprout tokenizer's components: :func:`~sprout_model.tokenizer.load_tokenizer`) and fit for a corpus (it
    has the end-of-text token, at most 65,536 tokens). CorpusError naming ``--tokenizer`` otherwise."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise CorpusError(f"--tokenizer: no tokenizer at {p}; pass a tokenizer.json (such as "
                          "sprout_model/checkpoints/tokenizer.json)")
    try:
        return check_corpus_tokenizer(load_tokenizer(p), str(p))
    except TokenizerError as e:
        raise CorpusError(f"--tokenizer: {e}") from None


def write_tokens(path: Path, tok: Tokenizer, texts: Iterable[str], eot: int) -> list[int]:
    """Write the ids of each text followed by ``eot`` to ``path`` (uint16), a piece at a time
    (:func:`~sprout_model.tokenizer.encode_pieces`): memory holds one piece's ids, never a whole split's.
    Returns the number of tokens written for each text, its ``eot`` included."""
    counts = []
    with open(path, "wb") as fh:
        for text in texts:
            n = 1
            for ids in encode_pieces(tok, text):
                np.asarray(ids, dtype=np.uint16).tofile(fh)
                n += len(ids)
            np.asarray([eot], dtype=np.uint16).tofile(fh)
            counts.append(n)
    return counts


def prepare(corpus: str = "default", out: str | Path | None = None, val_fraction: float = 0.05, seed: int = 0,
            name_views: int = 0, splice_share: float = 0.0, tokenizer: str | Path | None = None,
            full_name_share: float = 0.0) -> dict:
    """Run the whole pipeline; returns the metadata it also writes to ``meta.json``.

    ``tokenizer``: the path of a ``tokenizer.json`` to encode with instead of training one on the corpus (for
    example the shipped models', ``sprout_model/checkpoints/tokenizer.json``, so that a model trained on a bigger
    corpus keeps their vocabulary and is measured on the same validation windows).

    ``name_views``: 0 to :data:`MAX_NAME_VIEWS` renamed copies of the training split. ``tokenizer`` is checked as
    ``sprout_interp.load`` checks a checkpoint's tokenizer, before anything is written.

    Raises CorpusError (or ValueError for an argument out of range) with what to do.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be between 0 and 1 (such as 0.05), got {val_fraction}")
    if isinstance(name_views, bool) or not isinstance(name_views, int) or not 0 <= name_views <= MAX_NAME_VIEWS:
        raise ValueError(f"--name-views must be a whole number from 0 to {MAX_NAME_VIEWS} (each view is another copy "
                         f"of the training split's tokens; train reads one per epoch), got {name_views!r}")
    for flag, v in (("--splice-share", splice_share), ("--full-name-share", full_name_share)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{flag} must be between 0 and 1, got {v}")
        if v and not name_views:
            raise ValueError(f"{flag} shapes the names of the --name-views versions, and none are written: pass "
                             "--name-views K (such as 4) too, or drop it")
    out = Path(out) if out else DATA_ROOT / (corpus if not Path(corpus).is_dir() else Path(corpus).name)
    tok = reuse_tokenizer(tokenizer) if tokenizer is not None else None  # refused before anything is written
    t0 = time.time()
    docs = load_documents(corpus)
    train, val = split_corpus(corpus, docs, val_fraction, seed)
    out.mkdir(parents=True, exist_ok=True)
    print(describe(train, val), end="")
    if tok is None:
        try:
            tok = train_tokenizer(d.text for d in train)
        except TokenizerError as e:
            raise CorpusError(
                f"{e}: the training split ({sum(len(d.text) for d in train):,} characters) is too little text to learn "
                "the tokenizer's vocabulary from. Add more .txt files (a few MB of prose)"
            ) from None
    tok.save(str(out / "tokenizer.json"))
    eot = tok.token_to_id(EOT)
    meta = {"corpus": corpus, "corpus_sha256": corpus_hash(train + val), "vocab_size": tok.get_vocab_size(),
            "val_documents": sorted(d.name for d in val),
            "tokenizer": "trained on the training split" if tokenizer is None else f"reused: {Path(tokenizer).name}",
            "tokenizer_sha256": hashlib.sha256(tok.to_str().encode()).hexdigest()}
    sources = source_counts(train, val)
    for name, part in (("train", train), ("val", val)):
        for row in sources.values():
            row[f"{name}_tokens"] = 0
        counts = write_tokens(out / f"{name}.bin", tok, (d.text for d in part), eot)
        for d, n in zip(part, counts):
            sources[source_of(d.name)][f"{name}_tokens"] += n  # with the document's <|endoftext|>
        meta[f"{name}_tokens"] = sum(counts)
        meta[f"{name}_documents"] = len(part)
        meta[f"{name}_chars"] = sum(len(d.text) for d in part)
    if name_views:
        # versions of the training split with each document's recurring names replaced by invented
        # ones, fresh in every version (validation stays real text)
        names = find_names(d.text for d in train)
        words = ([w for w in common_words(d.text for d in train) if w not in names]
                 if splice_share or full_name_share else None)
        for k in range(name_views):
            rng = random.Random(f"{seed}-{k}")
            write_tokens(out / f"train_names{k}.bin", tok, (randomise_names(
                d.text, names, rng, words=words, splice_share=splice_share, full_share=full_name_share) for d in train), eot)
        meta["name_views"] = name_views
        meta["names_found"] = len(names)
        meta["splice_share"] = splice_share
        meta["full_name_share"] = full_name_share
    meta["chars_per_token"] = round(meta["train_chars"] / meta["train_tokens"], 3)
    meta["sources"] = sources
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    print(describe_sources(sources), end="")
    print(f"tokens: train {meta['train_tokens']:,}, validation {meta['val_tokens']:,}; "
          f"{meta['chars_per_token']} characters/token; {time.time() - t0:.0f}s -> {out}")
    return meta


@input_errors_exit
def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="default", help="default, fiction, large (default + more books), or a folder of .txt files")
    p.add_argument("--out", default=None, help="output folder (default data/<corpus>)")
    p.add_argument("--val-fraction", type=Number(0.0, 1.0, above=True, below=True), default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name-views", type=int, default=0,
                   help=f"also write K versions (0 to {MAX_NAME_VIEWS}) of the training split with recurring names randomised")
    p.add_argument("--splice-share", type=FRACTION, default=0.0,
                   help="with --name-views: share of invented names spliced from two common words (augment.splice_name)")
    p.add_argument("--full-name-share", type=FRACTION, default=0.0,
                   help="with --name-views: share of names replaced by a two-word full name whose second word is "
                        "spliced from two common words (augment.randomise_names)")
    p.add_argument("--tokenizer", default=None,
                   help="encode with this tokenizer.json instead of training one (e.g. sprout_model/checkpoints/tokenizer.json)")
    a = p.parse_args(argv)
    if a.out is not None:
        writable_folder(a.out, "--out")
    prepare(a.corpus, a.out, a.val_fraction, a.seed, a.name_views, a.splice_share, a.tokenizer, a.full_name_share)


if __name__ == "__main__":
    main()
