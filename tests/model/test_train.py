"""The training loop on a tiny preset and tiny data: exact resume, atomic state, learning, schedule, checkpoint folder."""
from __future__ import annotations

import functools
import json
import math
import random
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures.weights import trained_like
from safetensors.torch import load_file

import sprout_model.prepare as prepare_mod
from sprout_model import GPT, Config
from sprout_model.batches import Batches
from sprout_model.checkpoint import load_folder
from sprout_model.presets import PRESETS
from sprout_model.run_state import RunStateError, read_state
from sprout_model.tokenizer import EOT, load_tokenizer, train_tokenizer
from sprout_model.train import TrainArgs, TrainArgsError, lr_at, train

pytestmark = pytest.mark.unit

TINY = Config(vocab_size=8192, context=64, n_layer=2, n_head=2, d_model=32, d_ff=64)
VOCAB = 300
B, T = 4, 32  # batch size, sequence length: 128 tokens a step

WORDS = ("the cat sat on mat and dog ran to a red ball while bird sang in tree "
         "then all of them slept by fire until morning came").split()


@pytest.fixture(autouse=True)
def tiny_preset(monkeypatch):
    monkeypatch.setitem(PRESETS, "tiny", TINY)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A prepared corpus built by prepare() from a folder of repetitive .txt files, with a 300-token BPE."""
    rng = random.Random(0)
    src = tmp_path_factory.mktemp("texts")
    for i in range(20):
        paras = []
        for _ in range(6):
            start = rng.randrange(len(WORDS) - 8)
            sentence = " ".join(WORDS[start: start + rng.randint(4, 8)]).capitalize() + "."
            paras.append(" ".join([sentence] * rng.randint(2, 4)))
        (src / f"story{i:02d}.txt").write_text("\n\n".join(paras) + "\n")
    out = tmp_path_factory.mktemp("data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prepare_mod, "train_tokenizer", functools.partial(train_tokenizer, vocab_size=VOCAB))
        meta = prepare_mod.prepare(str(src), out, val_fraction=0.1, seed=0)
    assert meta["vocab_size"] == VOCAB and meta["val_documents"] and meta["train_documents"] == 18
    assert meta["train_tokens"] > 20 * (T + 1) and meta["val_tokens"] > 4 * (T + 1)
    return out


def args(data: Path, out: Path, **kw) -> TrainArgs:
    base = dict(preset="tiny", data=str(data), out=str(out), tokens=8 * B * T, batch_size=B, seq_len=T,
                lr=1e-2, warmup=2, eval_every=4, eval_batches=2, save_every=2, seed=0)
    base.update(kw)
    return TrainArgs(**base)


def _state(out: Path) -> dict:
    return read_state(out / "state.pt")


def _assert_same(a, b, path="") -> None:
    """Recursive exact equality for nested dicts/lists of tensors and numbers."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def _without_wall(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if k != "wall_s"} for h in history]


# ---------------------------------------------------------------- the prepared data

def test_prepared_data_layout(data):
    meta = json.loads((data / "meta.json").read_text())
    tok = load_tokenizer(data / "tokenizer.json")
    assert tok.get_vocab_size() == VOCAB and tok.token_to_id(EOT) == 0
    train_ids = np.fromfile(data / "train.bin", dtype=np.uint16)
    val_ids = np.fromfile(data / "val.bin", dtype=np.uint16)
    assert len(train_ids) == meta["train_tokens"] and len(val_ids) == meta["val_tokens"]
    assert train_ids[-1] == 0 and val_ids[-1] == 0  # every document ends with EOT
    assert (train_ids == 0).sum() == meta["train_documents"]
    assert int(train_ids.max()) < VOCAB
    assert len(meta["corpus_sha256"]) == 64


# ---------------------------------------------------------------- (a) exact resume

def test_resume_gives_identical_weights_and_optimizer(data, tmp_path):
    straight = tmp_path / "straight"
    r = train(args(data, straight), progress=False)
    assert r["step"] == 8 and r["done"]

    split = tmp_path / "split"
    r1 = train(args(data, split, max_steps=4), progress=False)
    assert r1["step"] == 4 and not r1["done"]
    assert _state(split)["step"] == 4
    r2 = train(args(data, split), progress=False)
    assert r2["step"] == 8 and r2["done"] and r2["tokens_seen"] == 8 * B * T

    a, b = _state(straight), _state(split)
    _assert_same(a["model"], b["model"], "model")
    _assert_same(a["optimizer"], b["optimizer"], "optimizer")
    assert a["optimizer"]["state"], "the optimizer state should not be empty"
    assert a["data"] == b["data"]
    assert (a["step"], a["tokens_seen"], a["best_val"]) == (b["step"], b["tokens_seen"], b["best_val"])
    assert _without_wall(a["history"]) == _without_wall(b["history"])
    assert [h["step"] for h in a["history"]] == [4, 8]
    assert all(h["name_copying"] is None for h in a["history"])  # the probe's texts exceed context 64
    # the best checkpoints agree too
    sa = load_file(str(straight / "checkpoint" / "model.safetensors"))
    sb = load_file(str(split / "checkpoint" / "model.safetensors"))
    _assert_same(sa, sb, "checkpoint")
    # and the weights really moved
    torch.manual_seed(0)
    init = GPT(replace(TINY, vocab_size=VOCAB)).state_dict()
    assert not torch.equal(init["embed.weight"], a["model"]["embed.weight"])


def test_finished_run_does_not_train_further(data, tmp_path):
    out = tmp_path / "run"
    train(args(data, out), progress=False)
    before = _state(out)
    r = train(args(data, out), progress=False)
    assert r["step"] == 8 and r["done"]
    _assert_same(before["model"], _state(out)["model"])


def test_batches_resume_where_they_stopped():
    tokens = np.arange(1000, dtype=np.uint16)
    a = Batches(tokens, 10, 8, seed=5)
    seq = [a.next()[0] for _ in range(30)]  # several epochs (99 windows / 8 per batch)
    b = Batches(tokens, 10, 8, seed=5)
    for _ in range(17):
        b.next()
    c = Batches(tokens, 10, 8, seed=5)
    c.load_state(b.state())
    for i in range(17, 30):
        assert torch.equal(c.next()[0], seq[i])
    x, y = Batches(tokens, 10, 8, seed=5).next()
    assert x.shape == y.shape == (8, 10) and torch.equal(x[:, 1:], y[:, :-1])


def test_too_little_validation_text_is_a_clear_error(data, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    for f in ("meta.json", "tokenizer.json", "train.bin"):
        (small / f).write_bytes((data / f).read_bytes())
    np.arange(1, T, dtype=np.uint16).tofile(small / "val.bin")  # fewer than seq_len + 1 tokens
    with pytest.raises(ValueError, match=r"validation split has 31 tokens, fewer than seq_len\+1 = 33"):
        train(args(data=small, out=tmp_path / "run"), progress=False)
    assert not (tmp_path / "run" / "state.pt").exists()


# ---------------------------------------------------------------- (b) atomic state

class Killed(BaseException):
    """Stands in for kill -9 in the middle of writing a file."""


def test_kill_while_saving_leaves_a_good_state(data, tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    train(args(data, straight), progress=False)
    assert not list(straight.rglob("*.tmp")), "a finished run leaves no temporary files"

    out = tmp_path / "killed"
    real_save = torch.save
    calls = {"n": 0}

    def dying_save(obj, f, *a, **kw):
        calls["n"] += 1
        if calls["n"] >= 2:  # the save at step 4 is cut off half-way, and so is every later attempt
            Path(f).write_bytes(b"PK\x03\x04 half a zip file")
            raise Killed
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(Killed):
        train(args(data, out), progress=False)
    monkeypatch.setattr(torch, "save", real_save)

    # state.pt is the complete one from step 2; the half-written file is only ever the .tmp
    assert (out / "state.pt.tmp").exists()
    with pytest.raises(RunStateError, match="not a torch zip archive"):
        read_state(out / "state.pt.tmp")
    assert _state(out)["step"] == 2

    r = train(args(data, out), progress=False)  # resume, with the corrupt .tmp still lying there
    assert r["step"] == 8
    assert not list(out.rglob("*.tmp"))
    _assert_same(_state(straight)["model"], _state(out)["model"], "model")
    _assert_same(_state(straight)["optimizer"], _state(out)["optimizer"], "optimizer")


def test_corrupt_leftover_tmp_does_not_break_resume(data, tmp_path):
    out = tmp_path / "run"
    train(args(data, out, max_steps=4), progress=False)
    assert (out / "checkpoint" / "model.safetensors").exists()
    (out / "state.pt.tmp").write_bytes(b"\x00garbage" * 100)
    (out / "checkpoint" / "model.safetensors.tmp").write_bytes(b"garbage")
    r = train(args(data, out), progress=False)
    assert r["step"] == 8 and r["done"]
    assert not (out / "state.pt.tmp").exists()
    load_folder(out / "checkpoint")  # still a good checkpoint


# ---------------------------------------------------------------- (c) learning

def test_loss_decreases_on_repetitive_data(data, tmp_path, monkeypatch):
    # a context long enough for the invented-name probe's texts (about 150 tokens with this tokenizer)
    monkeypatch.setitem(PRESETS, "tiny", Config(**{**TINY.__dict__, "context": 256}))
    out = tmp_path / "learn"
    train(args(data, out, tokens=30 * B * T, warmup=3, eval_every=10, save_every=30), progress=False)
    hist = _state(out)["history"]
    assert [h["step"] for h in hist] == [10, 20, 30]
    assert all(math.isfinite(h["val_loss"]) for h in hist)
    # every evaluation also records the invented-name copying probe (a probability)
    assert all(0.0 <= h["name_copying"] <= 1.0 for h in hist)
    model, info = load_folder(out / "checkpoint")
    # a fresh model is near ln(300) = 5.7 nats; 30 steps on this repetitive text get far below
    assert hist[0]["val_loss"] > hist[-1]["val_loss"]
    assert hist[-1]["val_loss"] < math.log(VOCAB) - 2.0
    assert hist[-1]["train_loss"] < math.log(VOCAB) - 2.0
    assert info["val_loss"] == min(h["val_loss"] for h in hist)


# ---------------------------------------------------------------- (d) learning-rate schedule

def test_lr_schedule_warmup_peak_and_floor():
    a = TrainArgs(lr=1e-3, warmup=10, min_lr_frac=0.1, tokens=100 * 4 * 8, batch_size=4, seq_len=8)
    assert a.total_steps == 100
    warm = [lr_at(s, a) for s in range(10)]
    assert warm == pytest.approx([1e-3 * (s + 1) / 10 for s in range(10)])  # linear from lr/warmup to lr
    assert lr_at(9, a) == pytest.approx(1e-3)
    assert lr_at(10, a) == pytest.approx(1e-3)  # the peak
    decay = [lr_at(s, a) for s in range(10, 101)]
    assert all(x >= y for x, y in zip(decay, decay[1:]))  # never rises after the peak
    assert lr_at(55, a) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # half-way down the cosine
    assert lr_at(100, a) == pytest.approx(1e-4)  # ends at min_lr_frac * lr
    assert lr_at(99, a) == pytest.approx(1e-4, rel=0.01)
    assert lr_at(500, a) == pytest.approx(1e-4)  # and stays there
    assert min(lr_at(s, a) for s in range(200)) >= 1e-4 - 1e-12


def test_optimizer_uses_the_schedule(data, tmp_path):
    out = tmp_path / "run"
    a = args(data, out, max_steps=5)
    train(a, progress=False)
    for group in _state(out)["optimizer"]["param_groups"]:
        assert group["lr"] == pytest.approx(lr_at(4, a))  # the lr of the last step taken (step index 4)
    groups = _state(out)["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [a.weight_decay, 0.0, 0.0]  # norm gains are not decayed
    assert sum(len(g["params"]) for g in groups) == len(list(GPT(replace(TINY, vocab_size=VOCAB)).parameters()))
    # the QK-norm gains form their own group, whose lr --qk-gain-lr scales
    out2 = tmp_path / "run2"
    train(args(data, out2, max_steps=5, qk_gain_lr=3.0, embed_lr=5.0), progress=False)
    lrs = [g["lr"] for g in _state(out2)["optimizer"]["param_groups"]]
    assert lrs == pytest.approx([lr_at(4, a), lr_at(4, a), 3 * lr_at(4, a), 5 * lr_at(4, a)])
    assert len(_state(out2)["optimizer"]["param_groups"][3]["params"]) == 1  # the tied embedding
    assert len(_state(out2)["optimizer"]["param_groups"][2]["params"]) == 2 * TINY.n_layer


# ---------------------------------------------------------------- (e) the checkpoint folder

def test_checkpoint_folder(data, tmp_path):
    out = tmp_path / "run"
    a = args(data, out, eval_every=8)  # one evaluation, at the end: the checkpoint is the final model
    r = train(a, progress=False)
    folder = out / "checkpoint"
    assert {p.name for p in folder.iterdir()} == {"model.safetensors", "config.json", "tokenizer.json", "train.json"}

    meta = json.loads((data / "meta.json").read_text())
    info = json.loads((folder / "train.json").read_text())
    assert info["steps"] == 8
    assert info["tokens_seen"] == 8 * B * T
    assert isinstance(info["wall_time_s"], (int, float)) and info["wall_time_s"] >= 0
    assert info["val_loss"] == pytest.approx(r["best_val"], abs=1e-4)
    assert info["val_loss_unit"] == "nats/token"
    assert info["corpus_sha256"] == meta["corpus_sha256"]
    assert info["corpus"] == meta["corpus"]
    assert info["preset"] == "tiny"

    cfg = json.loads((folder / "config.json").read_text())
    assert cfg == {**TINY.to_dict(), "vocab_size": VOCAB}
    assert (folder / "tokenizer.json").read_bytes() == (data / "tokenizer.json").read_bytes()
    stored = load_file(str(folder / "model.safetensors"))
    assert "head.weight" not in stored and "embed.weight" in stored  # the tied matrix is stored once

    model, loaded_info = load_folder(folder)
    assert loaded_info == info
    assert model.head.weight is model.embed.weight
    ref = GPT(Config.from_dict(cfg))
    ref.load_state_dict(_state(out)["model"], strict=True)
    ref.eval()
    idx = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(idx)[0], ref(idx)[0])


# ---------------------------------------------------------------- staged recipes: --init-from, --n-layer, copy rows

def test_init_from_carries_weights_tokens_and_history(data, tmp_path):
    first = tmp_path / "first"
    train(args(data, first), progress=False)
    second = tmp_path / "second"
    r = train(args(data, second, init_from=str(first), lr=0.0, tokens=4 * B * T, eval_every=2), progress=False)
    assert r["tokens_seen"] == 12 * B * T  # 8 steps before, 4 here
    s1, s2 = _state(first), _state(second)
    _assert_same(s1["model"], s2["model"])  # lr 0: the weights are exactly the first run's
    assert s2["init"]["path"] == str(first) and s2["init"]["tokens_seen"] == 8 * B * T
    assert _without_wall(s2["history"][:2]) == _without_wall(s1["history"])
    info = json.loads((second / "checkpoint" / "train.json").read_text())
    assert info["init_from"]["tokens_seen"] == 8 * B * T and info["tokens_seen"] >= 10 * B * T
    # from a checkpoint folder (the best weights) too
    third = tmp_path / "third"
    train(args(data, third, init_from=str(first / "checkpoint"), lr=0.0, tokens=2 * B * T), progress=False)
    _assert_same(load_folder(first / "checkpoint")[0].state_dict(), load_folder(third / "checkpoint")[0].state_dict())


def test_growing_a_shallow_run_keeps_its_function(data, tmp_path):
    shallow = tmp_path / "shallow"
    train(args(data, shallow, n_layer=1), progress=False)
    small, _ = load_folder(shallow / "checkpoint")
    assert small.cfg.n_layer == 1
    grown_dir = tmp_path / "grown"
    train(args(data, grown_dir, init_from=str(shallow / "checkpoint"), lr=0.0, tokens=2 * B * T), progress=False)
    grown, _ = load_folder(grown_dir / "checkpoint")
    assert grown.cfg.n_layer == TINY.n_layer == 2
    x = torch.randint(1, VOCAB, (2, T))
    with torch.no_grad():
        torch.testing.assert_close(grown(x)[0], small(x)[0], atol=1e-4, rtol=1e-4)  # the new block is the identity
    assert torch.count_nonzero(grown.blocks[1].attn.qkv.weight) > 0  # but it is trainable, not dead


WIDE = Config(vocab_size=8192, context=64, n_layer=3, n_head=4, d_model=64, d_ff=96)  # TINY's head width, 16


def test_growing_wider_and_deeper_keeps_the_logits():
    from sprout_model.grow import load_grown
    small = trained_like(Config(**{**TINY.to_dict(), "vocab_size": VOCAB}), 0)
    big = GPT(Config(**{**WIDE.to_dict(), "vocab_size": VOCAB})).eval()
    load_grown(big, small.state_dict())
    x = torch.randint(0, VOCAB, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(big(x)[0], small(x)[0], atol=1e-4, rtol=1e-4)
        # nothing new reaches the stream yet, but every new weight that reads it is random, so it trains
        assert torch.count_nonzero(big.embed.weight[:, TINY.d_model:]) == 0
        assert torch.count_nonzero(big.blocks[0].attn.qkv.weight[TINY.d_model: WIDE.d_model]) > 0  # new heads' W_Q
        assert torch.count_nonzero(big.blocks[2].ffn.w1.weight) > 0
    # head h of the small model is head h of the big one: same attention pattern
    from sprout_interp.core.hooked import as_hooked
    _, c_small = as_hooked(small).run_with_cache(x, names_filter=lambda n: n.endswith("hook_pattern"))
    _, c_big = as_hooked(big).run_with_cache(x, names_filter=lambda n: n.endswith("hook_pattern"))
    for layer in range(TINY.n_layer):
        key = f"blocks.{layer}.attn.hook_pattern"
        torch.testing.assert_close(c_big[key][:, : TINY.n_head], c_small[key], atol=1e-5, rtol=1e-4)
    # and a step of training moves the grown model off its start everywhere, new parts included
    big.train()
    opt = torch.optim.AdamW(big.parameters(), lr=1e-3)
    _, loss = big(x[:, :-1], x[:, 1:])
    loss.backward()
    assert big.embed.weight.grad[:, TINY.d_model:].abs().sum() > 0
    assert big.blocks[0].attn.proj.weight.grad[:, TINY.d_model:].abs().sum() > 0  # new heads' W_O
    assert big.blocks[2].ffn.w2.weight.grad.abs().sum() > 0  # the new block's W2
    opt.step()


def test_init_from_a_smaller_preset_through_train(data, tmp_path, monkeypatch):
    monkeypatch.setitem(PRESETS, "wide", WIDE)
    small_dir = tmp_path / "small"
    train(args(data, small_dir, tokens=4 * B * T), progress=False)
    grown_dir = tmp_path / "grown"
    train(args(data, grown_dir, preset="wide", init_from=str(small_dir), lr=0.0, tokens=2 * B * T), progress=False)
    small = GPT(Config.from_dict({**TINY.to_dict(), "vocab_size": VOCAB}))
    small.load_state_dict(_state(small_dir)["model"])
    grown, info = load_folder(grown_dir / "checkpoint")
    assert grown.cfg.d_model == WIDE.d_model and grown.cfg.n_layer == WIDE.n_layer
    assert info["init_from"]["path"] == str(small_dir)
    x = torch.randint(1, VOCAB, (2, T))
    with torch.no_grad():
        # not to 1e-4 here: a briefly trained embedding is still tiny (RMS ~0.02), so RMSNorm's eps, which
        # the zero coordinates effectively double, shifts the logits by ~1e-3
        torch.testing.assert_close(grown.eval()(x)[0], small.eval()(x)[0], atol=1e-2, rtol=1e-2)
        assert abs(grown(x[:, :-1], x[:, 1:])[1] - small(x[:, :-1], x[:, 1:])[1]) < 1e-3


def test_grow_command_prints_both_losses(data, tmp_path, monkeypatch, capsys):
    from sprout_model.grow import main as grow_main
    monkeypatch.setitem(PRESETS, "wide", WIDE)
    small_dir = tmp_path / "small"
    train(args(data, small_dir, tokens=4 * B * T), progress=False)
    capsys.readouterr()
    grow_main([str(small_dir), "--preset", "wide", "--data", str(data), "--rows", "2", "--seq-len", str(T)])
    out = capsys.readouterr().out
    losses = [float(v) for v in re.findall(r"validation loss (\d+\.\d+)", out)]
    assert len(losses) == 2 and abs(losses[0] - losses[1]) < 1e-3 and 0 < losses[0] < 10, out
    assert f"{GPT(Config(**{**WIDE.to_dict(), 'vocab_size': VOCAB})).num_params():,} parameters" in out


def test_init_from_a_deeper_or_wider_model_is_a_clear_error(data, tmp_path):
    deep = tmp_path / "deep"
    train(args(data, deep, tokens=2 * B * T), progress=False)
    with pytest.raises(ValueError, match="2 blocks, more than this model's 1"):
        train(args(data, tmp_path / "x", n_layer=1, init_from=str(deep)), progress=False)
    from sprout_model.grow import load_grown
    narrow = GPT(Config(**{**TINY.to_dict(), "vocab_size": VOCAB}))
    with pytest.raises(ValueError, match="head width 16, this model's is 8"):
        load_grown(GPT(Config(**{**TINY.to_dict(), "vocab_size": VOCAB, "n_head": 4})), narrow.state_dict())
    with pytest.raises(ValueError, match="d_model"):
        load_grown(GPT(Config(**{**TINY.to_dict(), "vocab_size": VOCAB, "d_model": 16, "n_head": 1})), narrow.state_dict())
    with pytest.raises(FileNotFoundError, match="neither"):
        train(args(data, tmp_path / "y", init_from=str(tmp_path / "nothing")), progress=False)


@pytest.mark.parametrize("source", ["random", "text", "mixed"])
def test_copy_rows_repeat_with_a_period(source):
    tokens = np.arange(1, 5000, dtype=np.uint16)  # no repeats of its own
    b = Batches(tokens, seq_len=64, batch_size=32, seed=0, copy_rows=0.5, vocab_size=300, copy_source=source)
    x, y = b.next()
    rows = torch.cat([x, y[:, -1:]], dim=1).numpy()
    copied, kinds = 0, []
    for row in rows:
        periods = [p for p in range(8, 33) if np.array_equal(row[p:], row[:-p])]
        if periods:
            copied += 1
            p = periods[0]
            kinds.append("text" if np.all(np.diff(row[:p].astype(int)) == 1) else "random")
            if kinds[-1] == "random":
                assert row[:p].max() < 300 and row[:p].min() >= 1
        else:
            assert np.all(np.diff(row.astype(int)) == 1)  # untouched text
    assert 8 <= copied <= 24
    if source == "mixed":  # both kinds (the text ones repeat the row's own text)
        assert {"text", "random"} <= set(kinds)
    else:
        assert set(kinds) == {source}
    if source != "random":  # the random and text batches are unchanged by the mixed source's extra draws
        plain = Batches(tokens, seq_len=64, batch_size=32, seed=0, copy_rows=0.5, vocab_size=300, copy_source="random")
        px, _ = plain.next()
        untouched = [i for i in range(32) if np.all(np.diff(px[i].numpy().astype(int)) == 1)]
        assert all(np.all(np.diff(x[i].numpy().astype(int)) == 1) for i in untouched)  # the same rows were picked
    with pytest.raises(ValueError, match="copy_source"):
        Batches(tokens, seq_len=64, batch_size=32, seed=0, copy_rows=0.5, copy_source="nonsense")


def test_embed_mean_adds_one_shared_direction(data, tmp_path):
    plain, shifted = tmp_path / "plain", tmp_path / "shifted"
    train(args(data, plain, lr=0.0, tokens=B * T), progress=False)
    train(args(data, shifted, lr=0.0, tokens=B * T, embed_mean=2.0), progress=False)
    diff = _state(shifted)["model"]["embed.weight"] - _state(plain)["model"]["embed.weight"]
    assert torch.allclose(diff, diff[0].expand_as(diff), atol=1e-6)  # the same vector added to every row
    assert diff[0].norm().item() == pytest.approx(2.0, rel=1e-4)


def test_ship_writes_float16_and_the_loss_on_every_validation_window(data, tmp_path):
    from sprout_model.ship import VAL_SEQ_LEN, ship
    run = tmp_path / "run"
    train(args(data, run, seq_len=16), progress=False)
    root = tmp_path / "shipped"
    info = ship("tiny", run, data, root=root)
    model, saved = load_folder(root / "tiny")
    assert saved["val_loss"] == info["val_loss"] and (root / "tokenizer.json").is_file()
    assert not (root / "tiny" / "tokenizer.json").exists()
    val = np.memmap(data / "val.bin", dtype=np.uint16, mode="r")
    L = min(VAL_SEQ_LEN, TINY.context)  # 256 for the presets; the tiny model's context is 64
    windows = (len(val) - 1) // L
    assert f"all {windows:,} windows of {L} tokens" in info["val_loss_windows"]
    x = torch.from_numpy(np.stack([val[i * L: (i + 1) * L + 1] for i in range(windows)]).astype(np.int64))
    with torch.no_grad():
        expect = model(x[:, :-1], x[:, 1:])[1].item()
    assert abs(info["val_loss"] - expect) < 1e-4  # the mean over exactly those windows, no more, no fewer
    assert info["val_loss_training_windows"] is not None


def test_real_rows_mix_the_real_text_into_name_views():
    view = np.arange(1, 20_000, dtype=np.uint16)  # stands for a renamed view
    real = np.arange(30_000, 50_000, dtype=np.uint16)  # the real text: values no view has
    plain = Batches([view], seq_len=32, batch_size=64, seed=0)
    mixed = Batches([view], seq_len=32, batch_size=64, seed=0, real=real, real_rows=0.5)
    x_plain, _ = plain.next()
    x, y = mixed.next()
    from_real = (x >= 30_000).all(dim=1)
    assert 16 < int(from_real.sum()) < 48  # about half
    assert ((x < 20_000).all(dim=1) | from_real).all()  # every row is wholly one or the other
    assert torch.equal(x[~from_real], x_plain[~from_real])  # the other rows are the view's, as without mixing
    assert torch.equal(y[from_real][:, :-1], x[from_real][:, 1:])  # real rows are contiguous windows
    again = Batches([view], seq_len=32, batch_size=64, seed=0, real=real, real_rows=0.5)
    assert torch.equal(again.next()[0], x)  # a function of the position alone, so resuming repeats it
    with pytest.raises(ValueError, match="real training text"):
        Batches([view], seq_len=32, batch_size=64, seed=0, real_rows=0.5)


def test_real_rows_without_name_views_is_a_clear_error(data, tmp_path):
    with pytest.raises(ValueError, match="--real-rows mixes"):
        train(args(data, tmp_path / "r", real_rows=0.5), progress=False)


def test_ship_last_takes_the_last_step(data, tmp_path):
    from sprout_model.ship import ship
    run = tmp_path / "run"
    train(args(data, run, seq_len=16, eval_every=5), progress=False)  # 16 steps, evaluated every 5 and at the end
    info = ship("tiny", run, data, root=tmp_path / "shipped", last=True)
    state = _state(run)
    assert info["steps"] == state["step"] == 16 and info["tokens_seen"] == state["tokens_seen"] == 16 * B * 16
    model, _ = load_folder(tmp_path / "shipped" / "tiny")
    for k, v in state["model"].items():
        torch.testing.assert_close(model.state_dict()[k], v.half().float())  # the last weights, in 16 bits


# ---------------------------------------------------------------- devices, precision, torch batches, time-fitted schedules

# The history of args(data, out) (and with copy_rows=0.5) as the training loop gave it before it knew of devices:
# on the CPU in float32 it must give the same numbers (to the 4 decimals history keeps; 2e-4 leaves room for a
# last digit rounded the other way, and bf16 autocast, 2e-3 off in validation loss, would not pass).
RECORDED = {
    "plain": [(4, 5.0038, 4.8041, 0.994), (8, 4.3237, 4.3375, 1.003)],
    "copy_rows": [(4, 5.4415, 5.3056, 1.0), (8, 5.2657, 5.1018, 1.0)],
}


def _curve(out: Path) -> list[tuple]:
    return [(h["step"], h["train_loss"], h["val_loss"], h["copy_ratio"]) for h in _state(out)["history"]]


@pytest.mark.parametrize("kind", ["plain", "copy_rows"])
def test_cpu_fp32_gives_the_recorded_losses(data, tmp_path, kind):
    kw = {"copy_rows": 0.5} if kind == "copy_rows" else {}
    r = train(args(data, tmp_path / "run", device="cpu", dtype="fp32", **kw), progress=False)
    assert r["done"] and r["stopped"] == "done"
    got = _curve(tmp_path / "run")
    assert [g[0] for g in got] == [e[0] for e in RECORDED[kind]]
    for g, e in zip(got, RECORDED[kind]):
        assert g[1:] == pytest.approx(e[1:], abs=2e-4), (got, RECORDED[kind])
    assert "sampler" not in _state(tmp_path / "run")["data"]  # the numpy batches, as before


def test_bf16_autocast_on_cpu_trains_with_float32_weights(data, tmp_path):
    train(args(data, tmp_path / "fp32"), progress=False)
    r = train(args(data, tmp_path / "bf16", dtype="bf16"), progress=False)
    assert r["done"]
    a, b = _curve(tmp_path / "fp32"), _curve(tmp_path / "bf16")
    assert all(math.isfinite(v) for row in b for v in row[1:3])
    diffs = [abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra[1:3], rb[1:3])]
    assert max(diffs) < 0.05  # the same training, at lower precision
    assert max(diffs) > 5e-4  # ... and autocast really was on
    s = _state(tmp_path / "bf16")
    assert all(v.dtype == torch.float32 for v in s["model"].values())  # float32 master weights
    moments = [t for st in s["optimizer"]["state"].values() for k, t in st.items() if k != "step"]
    assert moments and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in moments)
    model, info = load_folder(tmp_path / "bf16" / "checkpoint")
    assert info["args"]["dtype"] == "bf16" and next(model.parameters()).dtype == torch.float32


def test_device_and_dtype_options_are_checked(data, tmp_path):
    from sprout_model.train import TrainArgsError, check_args
    with pytest.raises(TrainArgsError, match="--dtype must be one of fp32, bf16"):
        check_args(args(data, tmp_path, dtype="fp16"))
    with pytest.raises(TrainArgsError, match="not a device torch knows"):
        check_args(args(data, tmp_path, device="gpu0"))
    with pytest.raises(TrainArgsError, match="cpu or cuda only"):
        check_args(args(data, tmp_path, device="meta"))
    with pytest.raises(TrainArgsError, match="--sampler must be one of"):
        check_args(args(data, tmp_path, sampler="fast"))
    with pytest.raises(TrainArgsError, match="--fit-minutes must be a number above 0"):
        check_args(args(data, tmp_path, fit_minutes=0.0))
    if not torch.cuda.is_available():
        with pytest.raises(TrainArgsError, match="no CUDA device"):
            check_args(args(data, tmp_path, device="cuda"))


def test_torch_batches_are_batches_windows():
    from sprout_model.batches import TorchBatches
    views = [np.arange(1000, dtype=np.uint16), np.arange(5000, 6100, dtype=np.uint16)]
    a, b = Batches(views, 10, 8, seed=5), TorchBatches(views, 10, 8, seed=5)
    for i in range(40):  # several epochs, both views
        (xa, ya), (xb, yb) = a.next(), b.next()
        assert torch.equal(xa, xb) and torch.equal(ya, yb), i
        assert xb.dtype == torch.int64
    assert b.state() == {**a.state(), "sampler": "torch"}
    c = TorchBatches(views, 10, 8, seed=5)
    c.load_state(b.state())
    assert torch.equal(c.next()[0], b.next()[0])  # the position is the whole state


@pytest.mark.parametrize("source", ["random", "text", "mixed"])
def test_torch_batches_copy_rows_repeat_with_a_period(source):
    from sprout_model.batches import TorchBatches
    tokens = np.arange(1, 5000, dtype=np.uint16)
    b = TorchBatches(tokens, seq_len=64, batch_size=64, seed=0, copy_rows=0.5, vocab_size=300, copy_source=source)
    x, y = b.next()
    rows = torch.cat([x, y[:, -1:]], dim=1).numpy()
    periods_seen = set()
    copied, kinds = 0, []
    for row in rows:
        periods = [p for p in range(8, 33) if np.array_equal(row[p:], row[:-p])]
        if periods:
            copied += 1
            periods_seen.add(periods[0])
            kinds.append("text" if np.all(np.diff(row[: periods[0]].astype(int)) == 1) else "random")
            if kinds[-1] == "random":
                assert row[: periods[0]].max() < 300 and row[: periods[0]].min() >= 1
        else:
            assert np.all(np.diff(row.astype(int)) == 1)
    assert 16 <= copied <= 48 and len(periods_seen) > 5  # about half, at many periods
    assert set(kinds) == ({"text", "random"} if source == "mixed" else {source})
    again = TorchBatches(tokens, seq_len=64, batch_size=64, seed=0, copy_rows=0.5, vocab_size=300, copy_source=source)
    assert torch.equal(again.next()[0], x)
    with pytest.raises(ValueError, match="seq_len 15 or more"):
        TorchBatches(tokens, seq_len=12, batch_size=4, seed=0, copy_rows=0.5)


def test_torch_batches_real_rows():
    from sprout_model.batches import TorchBatches
    view = np.arange(1, 20_000, dtype=np.uint16)
    real = np.arange(30_000, 50_000, dtype=np.uint16)
    plain = TorchBatches([view], seq_len=32, batch_size=64, seed=0)
    x_plain, _ = plain.next()
    x, y = TorchBatches([view], seq_len=32, batch_size=64, seed=0, real=real, real_rows=0.5).next()
    from_real = (x >= 30_000).all(dim=1)
    assert 16 < int(from_real.sum()) < 48
    assert ((x < 20_000).all(dim=1) | from_real).all()
    assert torch.equal(x[~from_real], x_plain[~from_real])
    assert torch.equal(y[from_real][:, :-1], x[from_real][:, 1:])
    assert ((x[from_real][:, 0].long() - 30_000) % 32 == 0).all()  # whole windows of the real text


def test_torch_sampler_resumes_exactly_and_is_kept(data, tmp_path):
    from sprout_model.train import TrainArgsError
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(args(data, straight, sampler="torch", copy_rows=0.5), progress=False)
    train(args(data, split, sampler="torch", copy_rows=0.5, max_steps=3), progress=False)
    r = train(args(data, split, sampler="torch", copy_rows=0.5), progress=False)
    assert r["step"] == 8
    a, b = _state(straight), _state(split)
    _assert_same(a["model"], b["model"], "model")
    _assert_same(a["optimizer"], b["optimizer"], "optimizer")
    assert a["data"] == b["data"] and a["data"]["sampler"] == "torch"
    # not the numpy batches' copy rows: the same run with the numpy sampler learns from other rows
    assert _curve(straight) != [(s, *v) for s, *v in RECORDED["copy_rows"]]
    with pytest.raises(TrainArgsError, match="--sampler torch"):
        train(args(data, split, sampler="numpy", tokens=16 * B * T), progress=False)


class TickingClock:
    """Stands in for ``sprout_model.train``'s ``time`` module: every reading is ``tick`` seconds after the one before,
    so a step takes the same (made-up) time on any machine and a schedule fitted to it has a known length."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def time(self) -> float:
        self.now += self.tick
        return self.now


@pytest.fixture
def clock(monkeypatch) -> TickingClock:
    import sprout_model.train as train_mod

    c = TickingClock(0.05)  # two readings a step (its start and end): 0.1 s a step
    monkeypatch.setattr(train_mod, "time", c)
    return c


def test_fit_minutes_ends_the_schedule_in_time(data, tmp_path, clock):
    from sprout_model.train import FIT_AFTER
    out = tmp_path / "fit"
    cap = 100_000
    start = clock.now
    r = train(args(data, out, tokens=cap * B * T, fit_minutes=0.05, eval_every=10, save_every=50), progress=False)
    took = clock.now - start
    s = _state(out)
    fit = s["fit"]
    assert r["done"] and r["stopped"] == "done"  # the fitted schedule ran to its end ...
    assert fit["at_step"] == sum(FIT_AFTER) and sum(FIT_AFTER) < r["step"] == fit["steps"] < cap
    assert fit["s_per_step"] == pytest.approx(0.1, abs=0.011)  # the clock's step, measured after the first few
    assert s["args"]["tokens"] == fit["tokens"] == r["step"] * B * T
    assert 0.05 * 60 - 0.3 < took < 0.05 * 60  # ... in the 3 s asked for, to within 3 of its 0.1 s steps
    assert s["history"][-1]["step"] == r["step"]  # and evaluated its last step
    # resuming keeps the fitted schedule rather than fitting again
    r2 = train(args(data, out, tokens=cap * B * T, fit_minutes=0.05, eval_every=10, save_every=50), progress=False)
    assert r2["step"] == r["step"] and _state(out)["fit"] == fit


def test_stop_copy_ratio_stops_resumably(data, tmp_path):
    out = tmp_path / "stop"
    r = train(args(data, out, stop_copy_ratio=2.0), progress=False)  # any ratio is at or below 2
    assert r["step"] == 4 and not r["done"] and r["stopped"] == "stop_copy_ratio"
    assert _state(out)["step"] == 4 and (out / "checkpoint" / "model.safetensors").is_file()
    r = train(args(data, out, stop_copy_ratio=0.01), progress=False)  # a ratio nothing here reaches: to the end
    assert r["step"] == 8 and r["done"]


def test_ship_to_writes_a_candidate_elsewhere(monkeypatch, capsys, tmp_path):
    import sprout_model.ship as ship_mod

    calls = []

    def fake(preset, run, data, root, last):
        calls.append((preset, run, data, Path(root), last))
        return {"tokens_seen": 1, "val_loss": 4.0, "val_loss_windows": "w", "val_loss_training_windows": 4.1}

    monkeypatch.setattr(ship_mod, "ship", fake)
    ship_mod.main(["sprout", "--run", "runs/x", "--data", "data/d", "--to", str(tmp_path / "cand")])
    ship_mod.main(["sprout", "--run", "runs/x"])
    assert calls == [("sprout", "runs/x", "data/d", tmp_path / "cand", False), ("sprout", "runs/x", None, ship_mod.SHIPPED_DIR, False)]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"wrote sprout to {tmp_path / 'cand'}:") and out[1].startswith("shipped sprout:")


# ---------------------------------------------------------------- warmup-stable-decay and branches


def test_wsd_holds_the_rate_then_decays_linearly_over_the_cooldown():
    a = TrainArgs(preset="tiny", tokens=100 * B * T, batch_size=B, seq_len=T, lr=1.0, warmup=10, min_lr_frac=0.1,
                  schedule="wsd", cooldown_tokens=20 * B * T)
    lrs = [lr_at(s, a) for s in range(100)]
    assert lrs[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])  # the same warm-up as cosine
    assert lrs[10:80] == [1.0] * 70  # held until the last 20 steps
    assert lrs[80:] == pytest.approx([1 - 0.9 * (s / 20) for s in range(20)])  # straight down towards 0.1
    assert lr_at(100, a) == pytest.approx(0.1)
    cos = replace(a, schedule="cosine")
    assert lr_at(50, cos) < 1.0 and lr_at(99, cos) == pytest.approx(0.1, abs=1e-3)


@pytest.mark.parametrize("bad", [dict(cooldown_tokens=0), dict(cooldown_tokens=1e9), dict(schedule="linear"),
                                 dict(init_from="runs/x", branch_from="runs/y")])
def test_schedule_options_are_checked(data, tmp_path, bad):
    kw = dict(schedule="wsd", cooldown_tokens=4 * B * T)
    kw.update(bad)
    with pytest.raises(TrainArgsError):
        train(args(data, tmp_path / "r", **kw), progress=False)


def test_a_branch_continues_the_run_exactly_and_leaves_it_alone(data, tmp_path):
    """A wsd run of 16 steps, and at step 6 a branch with --tokens 10 steps and a 4-step cooldown: the branch's first
    steps are the run's own (same weights, optimizer, batches), its rate then decays, and the run is not touched."""
    main_args = args(data, tmp_path / "main", tokens=16 * B * T, schedule="wsd", cooldown_tokens=4 * B * T, eval_every=2)
    train(replace(main_args, max_steps=6), progress=False)
    before = (tmp_path / "main" / "state.pt").read_bytes()
    br = replace(main_args, out=str(tmp_path / "branch"), branch_from=str(tmp_path / "main"), tokens=10 * B * T)
    r = train(br, progress=False)
    assert r["done"] and r["step"] == 10
    assert (tmp_path / "main" / "state.pt").read_bytes() == before  # the run it came from is unchanged
    s = _state(tmp_path / "branch")
    assert s["branch"] == {"from": str(tmp_path / "main"), "at_step": 6, "at_tokens": 6 * B * T}
    assert [h["step"] for h in s["history"]] == [2, 4, 6, 8, 10]  # the run's history, then the branch's
    assert (tmp_path / "branch" / "checkpoint" / "model.safetensors").is_file()  # its own best checkpoint
    info = json.loads((tmp_path / "branch" / "checkpoint" / "train.json").read_text())
    assert info["branched_from"]["at_step"] == 6
    assert [lr_at(k, br) for k in range(6, 10)] == pytest.approx([1e-2, 1e-2 * 0.775, 1e-2 * 0.55, 1e-2 * 0.325])
    # the same steps taken by the run itself give the same weights while the two schedules agree (steps 6 and 7 at
    # the held rate in both): branching is resuming, into another folder
    assert train(replace(br, out=str(tmp_path / "branch7"), max_steps=7), progress=False)["step"] == 7
    assert train(replace(main_args, max_steps=7), progress=False)["step"] == 7
    _assert_same(_state(tmp_path / "main")["model"], _state(tmp_path / "branch7")["model"])


def test_resuming_a_fitted_run_without_fit_minutes_follows_tokens(data, tmp_path, clock):
    out = tmp_path / "fit"
    train(args(data, out, tokens=100_000 * B * T, fit_minutes=0.05, eval_every=10, save_every=50), progress=False)
    fitted = _state(out)["step"]
    r = train(args(data, out, tokens=(fitted + 3) * B * T, eval_every=10, save_every=50), progress=False)
    assert r["step"] == fitted + 3 and "fit" not in _state(out)
