"""Every analysis takes a text, a list of texts or token ids the same way; the default mean reference is built once."""
from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

import sprout_interp as si
from sprout_interp import HookedSprout
from sprout_interp.circuits import ablation, replacements
from sprout_model import GPT
from sprout_model.tokenizer import train_tokenizer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tokenizer300():
    texts = ["the cat sat on the mat and the dog ran to a red ball while a bird sang in the tree"] * 20
    return train_tokenizer(texts, vocab_size=300)


@pytest.fixture
def worded(tokenizer300) -> HookedSprout:
    torch.manual_seed(0)
    return HookedSprout(GPT(tiny_config(vocab_size=300)).eval(), tokenizer=tokenizer300, name="tiny-300")


def test_residual_rms_takes_text_texts_and_ids(worded):
    text = "the cat sat on the mat"
    ids = worded.to_tokens(text)
    by_ids = si.residual_rms(worded, ids)
    by_text = si.residual_rms(worded, text)
    assert by_text.equals(by_ids)
    texts = [text, "a dog"]
    by_list = si.residual_rms(worded, texts)
    toks, mask = worded.to_tokens_with_mask(texts)
    assert by_list.equals(si.residual_rms(worded, toks, attention_mask=mask))
    assert by_list["n_tokens"].iloc[0] == int(mask.sum())


def test_default_mean_reference_is_built_once_per_model(worded, monkeypatch):
    calls = []
    ref = worded.to_tokens(["the cat sat on the mat and the dog ran", "a bird sang in the tree then all of them"])

    def fake_reference(model, *a, **kw):
        calls.append(model)
        return ref

    monkeypatch.setattr(replacements, "default_reference", fake_reference)  # where head_means looks it up
    first = ablation.head_means(worded)
    again = ablation.head_means(worded)
    assert len(calls) == 1 and torch.equal(first, again)
    assert torch.equal(first, ablation.head_means(worded, ref))  # the same means as passing the reference
    with torch.no_grad():
        worded.model.blocks[0].attn.qkv.weight.mul_(1.5)  # new weights: the means are recomputed
    changed = ablation.head_means(worded)
    assert len(calls) == 2 and not torch.equal(first, changed)
