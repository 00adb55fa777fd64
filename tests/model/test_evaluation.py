"""The in-context copying figure (sprout_model.evaluation) and the checkpoint table (sprout_model.info)."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from conftest import tiny_config

from sprout_model import GPT, info
from sprout_model.checkpoint import save_checkpoint
from sprout_model.evaluation import CopyingLoss, repeated_tokens_batch, repeated_tokens_loss_ratio

pytestmark = pytest.mark.unit

BIG = 50.0  # a logit this far above the rest puts ~all mass on one token (exp(-50) ~ 2e-22)


class Copier(nn.Module):
    """A perfect in-context copier: at position t it puts all mass on the token seq_len-1 back,
    which, in a sequence repeated twice, is exactly the next token of the second copy (the target
    seq_len back). Before it has anything to copy it spreads mass uniformly."""

    def __init__(self, vocab: int, seq_len: int = 64):
        super().__init__()
        self.cfg = SimpleNamespace(vocab_size=vocab, context=2 * seq_len)
        self.seq_len = seq_len
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, idx):
        B, T = idx.shape
        logits = torch.zeros(B, T, self.cfg.vocab_size)
        t = torch.arange(self.seq_len - 1, T)
        logits[:, t] = BIG * nn.functional.one_hot(idx[:, t - (self.seq_len - 1)], self.cfg.vocab_size).float()
        return logits, None


class Oracle(nn.Module):
    """Knows the answer (by peeking) only at the listed target positions; uniform elsewhere."""

    def __init__(self, vocab: int, targets: set[int]):
        super().__init__()
        self.cfg = SimpleNamespace(vocab_size=vocab, context=512)
        self.targets = targets

    def forward(self, idx):
        B, T = idx.shape
        logits = torch.zeros(B, T, self.cfg.vocab_size)
        for p in self.targets:  # logits at p - 1 predict the token at p
            logits[torch.arange(B), p - 1, idx[:, p]] = BIG
        return logits, None


def test_batch_is_two_copies_of_random_tokens_without_eot():
    b = repeated_tokens_batch(vocab_size=100, seq_len=64, batch=32, seed=0)
    assert b.shape == (32, 128) and b.dtype == torch.long
    assert torch.equal(b[:, :64], b[:, 64:])
    assert b.min().item() >= 1 and b.max().item() <= 99  # id 0 (<|endoftext|>) never drawn
    assert len(b[:, :64].unique()) > 90  # uniform over the 99 allowed ids, not a constant


def test_seeding():
    a = repeated_tokens_batch(8192, 64, 32, seed=0)
    assert torch.equal(a, repeated_tokens_batch(8192, 64, 32, seed=0))
    assert not torch.equal(a, repeated_tokens_batch(8192, 64, 32, seed=1))
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    repeated_tokens_batch(8192, 64, 32, seed=0)  # its own generator: the global stream is untouched
    assert torch.equal(torch.rand(3), before)


def test_random_model_does_not_copy():
    torch.manual_seed(0)
    model = GPT(tiny_config(context=128)).eval()
    r = repeated_tokens_loss_ratio(model)
    assert isinstance(r, CopyingLoss)
    first, second, ratio = r
    assert abs(first - math.log(64)) < 0.05  # a fresh model is close to uniform over 64 tokens
    assert abs(ratio - 1.0) < 0.01
    assert ratio == pytest.approx(second / first)
    assert repeated_tokens_loss_ratio(model) == r  # same seed, same figure


def test_perfect_copier_has_ratio_near_zero():
    first, second, ratio = repeated_tokens_loss_ratio(Copier(vocab=64))
    assert first == pytest.approx(math.log(64), abs=1e-5)  # nothing to copy yet: uniform
    assert second < 1e-12 and ratio < 1e-12


@pytest.mark.parametrize(
    "targets, first_frac, second_frac",
    [
        ({64}, 1.0, 1.0),  # the first token of copy two is not counted
        ({0 + 64 + 1, 127}, 1.0, 61 / 63),  # positions 1 and 63 of copy two are
        ({1}, 62 / 63, 1.0),  # position 1 of copy one is
        (set(range(1, 64)), 0.0, 1.0),
    ],
)
def test_which_positions_count(targets, first_frac, second_frac):
    first, second, _ = repeated_tokens_loss_ratio(Oracle(64, targets), batch=4)
    assert first == pytest.approx(first_frac * math.log(64), abs=1e-5)
    assert second == pytest.approx(second_frac * math.log(64), abs=1e-5)


def test_mode_is_restored_and_context_checked():
    torch.manual_seed(0)
    model = GPT(tiny_config(context=32)).train()
    first, second, ratio = repeated_tokens_loss_ratio(model, seq_len=16, batch=4)
    assert model.training and first > 0
    with pytest.raises(ValueError, match="context of 32"):
        repeated_tokens_loss_ratio(model, seq_len=17)


# --- python -m sprout_model.info --------------------------------------------------------------


@pytest.fixture
def ckpt(tmp_path):
    torch.manual_seed(0)
    model = GPT(tiny_config(context=128))
    train = {"tokens_seen": 123_456, "steps": 78, "val_loss": 2.0}
    return save_checkpoint(model, tmp_path / "tiny", None, train), model


def test_info_row(ckpt):
    folder, model = ckpt
    row = info.describe(str(folder))
    assert row["parameters"] == model.num_params() == 5_488
    assert (row["tokens_seen"], row["steps"], row["val_loss"]) == (123_456, 78, 2.0)
    assert row["perplexity"] == pytest.approx(math.exp(2.0))
    expected = repeated_tokens_loss_ratio(model, seq_len=64, batch=32, seed=0)
    assert row["copying_ratio"] == pytest.approx(expected.ratio)
    table = info.markdown([row])
    assert f"| {folder} | 5,488 | 123,456 | 78 | 2.000 | 7.4 | {expected.ratio:.3f} " in table
    assert "positions 1..63 of the second copy" in table
    assert row["name_copying"] is None and row["name_copying_heldout"] is None  # no tokenizer in this folder
    assert table.rstrip().splitlines()[0].endswith("| held-out names |")


def test_name_texts_are_well_formed_with_the_shipped_tokenizer():
    from sprout_model.checkpoint import SHIPPED_DIR
    from sprout_model.evaluation import HELDOUT_NAME_TEXTS, NAME_TEXTS
    from sprout_model.tokenizer import load_tokenizer

    tok = load_tokenizer(SHIPPED_DIR / "tokenizer.json")
    assert not {n for n, _ in NAME_TEXTS} & {n for n, _ in HELDOUT_NAME_TEXTS}
    for name, text in NAME_TEXTS + HELDOUT_NAME_TEXTS:
        assert text.count(" " + name) == 2 and text.rstrip().endswith(name), name
        enc = tok.encode(text, add_special_tokens=False)
        pieces = [[t for t, (a, b) in zip(enc.tokens, enc.offsets) if a < s + len(name) + 1 and b > s]
                  for s in (text.index(" " + name), text.rindex(" " + name))]
        assert pieces[0] == pieces[1] and len(pieces[0]) >= 3, (name, pieces)  # the same pieces both times
        assert len(enc.ids) <= 256  # fits every preset's context


def test_info_missing_checkpoints_do_not_crash(ckpt, tmp_path, monkeypatch, capsys):
    folder, _ = ckpt
    monkeypatch.setattr(info, "SHIPPED_DIR", tmp_path / "nothing")
    assert info.main([str(folder), "GPT-4"]) == 0
    out = capsys.readouterr().out
    assert "| 5,488 |" in out
    assert f"- gpt-4: no checkpoint at {tmp_path / 'nothing' / 'gpt-4'}" in out and "--preset gpt-4" in out


def test_info_json(ckpt, capsys):
    folder, _ = ckpt
    info.main(["--json", str(folder), str(folder / "nope")])
    out = json.loads(capsys.readouterr().out)
    ok, missing = out["rows"]
    assert ok["parameters"] == 5_488 and 0.9 < ok["copying_ratio"] < 1.1
    assert missing["missing"] is True and "nope" in missing["reason"]
    assert "positions 1..63" in out["copying_measure"]


def test_info_counts_the_steps_of_every_stage():
    staged = {"steps": 100, "init_from": {"steps": 40, "init_from": {"steps": 7, "init_from": None}}}
    assert info.total_steps(staged) == 147
    assert info.total_steps({"steps": 5}) == 5 and info.total_steps({}) is None


def test_info_counts_the_tokens_trained_at_the_checkpoints_own_size():
    gpt4 = {"tokens_seen": 20_000, "args": {"preset": "gpt-4"}, "init_from": None}
    sprout_a = {"tokens_seen": 23_000, "args": {"preset": "sprout"}, "init_from": gpt4}
    grown = {"preset": "sprout", "tokens_seen": 30_000, "init_from": sprout_a}
    assert info.own_tokens(grown) == 10_000  # 3,000 + 7,000 as a Sprout, not the gpt-4's 20,000
    assert info.own_tokens({"preset": "gpt-4", "tokens_seen": 5, "init_from": gpt4}) == 5  # same preset
    assert info.own_tokens({"tokens_seen": 7}) == 7 and info.own_tokens({}) is None
