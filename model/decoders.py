"""The binary formats of the Debian packages the "large" corpus reads as data, decoded without R or SWORD: R's
serialization (XDR, versions 2 and 3) and a package's lazy-load data database; a SWORD zCom/zText module's compressed
blocks; OSIS markup to plain paragraphs; Matthew Henry's chapter outlines dropped."""
from __future__ import annotations

import bz2
import gzip
import html
import lzma
import re
import struct
import zlib
from pathlib import Path
from typing import Iterator

from .cleaning import CorpusError, clean


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
