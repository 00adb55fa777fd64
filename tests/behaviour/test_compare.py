"""compare_models, name_copying_table and piece_probabilities, on tiny random models sharing a small BPE."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from tokenizers import Tokenizer

from sprout_interp import HookedSprout
from sprout_interp.behaviour.compare import compare_models, name_copying_table, piece_probabilities
from sprout_interp.circuits.ablation import name_copying_under_ablation
from sprout_interp.core.errors import SproutError
from sprout_model import GPT
from sprout_model.evaluation import NAME_TEXTS, name_copying
from sprout_model.tokenizer import train_tokenizer

pytestmark = pytest.mark.unit

VOCAB = 300
CHECKPOINTS = Path(__file__).resolve().parents[2] / "model" / "checkpoints"
TEXT = "Zorbin Plax came home, and Zorbin Plax sat down."


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_tokenizer([t for _, t in NAME_TEXTS] * 10 + [TEXT] * 5, vocab_size=VOCAB)


def _model(seed, n_layer, tok) -> HookedSprout:
    torch.manual_seed(seed)
    g = GPT(tiny_config(vocab_size=VOCAB, context=256, n_layer=n_layer, n_head=2)).eval()
    return HookedSprout(g, tokenizer=tok, name=f"tiny-{n_layer}")


@pytest.fixture(scope="module")
def models(tok):
    return {"one": _model(0, 1, tok), "two": _model(1, 2, tok)}


def test_compare_models_probabilities(models, tok):
    df = compare_models(models, TEXT)
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    assert list(df.columns) == ["pos", "context", "token", "one", "two"]
    assert len(df) == len(ids) - 1 and df["pos"].tolist() == list(range(1, len(ids)))
    assert df["token"].tolist() == models["one"].to_str_tokens(TEXT)[1:]
    for label, m in models.items():
        with torch.no_grad():
            p = torch.softmax(m.model(torch.tensor([ids]))[0][0], -1)
        want = [p[i - 1, ids[i]].item() for i in range(1, len(ids))]
        assert df[label].to_numpy() == pytest.approx(want, abs=1e-6)
    assert df.attrs["models"] == ["one", "two"]
    listed = compare_models(list(models.values()), TEXT)  # labelled by .name
    assert list(listed.columns)[3:] == ["tiny-1", "tiny-2"]


def test_compare_models_refuses_different_tokenizers(models):
    other_tok = train_tokenizer([t[::-1] for _, t in NAME_TEXTS] * 10, vocab_size=VOCAB)
    other = _model(2, 1, other_tok)
    with pytest.raises(SproutError, match="tokenizes the text differently"):
        compare_models({"a": models["one"], "b": other}, TEXT)
    with pytest.raises(SproutError, match="no models"):
        compare_models({}, TEXT)


def test_name_copying_table_matches_evaluation(models, tok):
    df = name_copying_table(models)
    assert list(df.columns) == ["model", "name", "occurrence", "index", "token", "prob"]
    res = name_copying(models["two"].model, tok)
    for r in res.per_text:
        got = df[(df["model"] == "two") & (df["name"] == r["name"]) & (df["occurrence"] == 2)]
        assert got["prob"].to_numpy() == pytest.approx(r["second"], abs=1e-7)
        assert got["token"].tolist() == [tok.decoder.decode([t]) for t in r["tokens"][1:]]
    assert not df["token"].str.contains("Ġ").any()
    assert set(df["model"]) == {"one", "two"} and set(df["occurrence"]) == {1, 2}


def test_name_copying_under_ablation(models, tok):
    m = models["two"]
    ref = torch.randint(1, VOCAB, (4, 200), generator=torch.Generator().manual_seed(0))
    df = name_copying_under_ablation(m, {"clean": [], "block 2 head 0": [(1, 0)]}, kind="mean", reference=ref)
    clean = df[(df["condition"] == "clean") & (df["name"] == "(mean)")]["second"].item()
    assert clean == pytest.approx(name_copying(m.model, tok).mean_prob, abs=1e-6)
    assert set(df["heads"]) == {"-", "block 2 head 0 (layer 1)"} and len(df) == 2 * (len(NAME_TEXTS) + 1)


def test_piece_probabilities():
    toks = [" Z", "or", "b", "in", " Pl", "ax"]
    probs = [0.01, 0.9, 0.5, 0.8, 0.4, 0.5]
    out = piece_probabilities(toks[1:], probs[1:], ["or", "bin", " Plax"])
    assert [o["piece"] for o in out] == ["or", "bin", " Plax"]
    assert [o["tokens"] for o in out] == [["or"], ["b", "in"], [" Pl", "ax"]]
    assert [o["prob"] for o in out] == pytest.approx([0.9, 0.4, 0.2])
    with pytest.raises(SproutError, match="line up"):
        piece_probabilities(["orb", "in"], [0.5, 0.5], ["or", "bin"])


@pytest.mark.acceptance  # over 3 s
def test_shipped_compare_models():
    names = [n for n in ("gpt-1", "gpt-4", "sprout") if (CHECKPOINTS / n / "model.safetensors").is_file()]
    if not names:
        pytest.skip("no shipped checkpoint is there yet")
    df = compare_models(names, TEXT)
    assert list(df.columns)[3:] == names
    assert ((df[names] >= 0) & (df[names] <= 1)).all().all()


def test_every_per_token_table_puts_token_at_pos(models):
    """One vocabulary across tables: ``token`` is the input token at ``pos`` (0-based), ``context`` the one before
    and ``next_token`` the one after, whichever function made the table."""
    from sprout_interp.behaviour.per_token import ablation_effect, next_token_table
    from sprout_interp.lens.logit_lens import trajectories

    m = models["two"]
    strs = m.to_str_tokens(TEXT)
    tables = {"compare_models": compare_models(models, TEXT), "next_token_table": next_token_table(m, TEXT),
              "ablation_effect": ablation_effect(m, TEXT, [(1, 0)]), "trajectories": trajectories(m, TEXT, lenses=("logit",))}
    for name, df in tables.items():
        assert "position" not in df.columns, name
        assert df["pos"].min() >= 0 and df["pos"].max() == len(strs) - 1, name
        assert all(t == strs[p] for p, t in zip(df["pos"], df["token"])), name
        if "context" in df:
            assert all(c == strs[p - 1] for p, c in zip(df["pos"], df["context"])), name
        if "next_token" in df:
            last = df["pos"] == len(strs) - 1
            assert df.loc[last, "next_token"].isna().all(), name  # nothing follows the last token
            assert all(n == strs[p + 1] for p, n in zip(df.loc[~last, "pos"], df.loc[~last, "next_token"])), name
