"""Hostile input to the training tools: run folders, corpora and command lines built to break them.

Each input gets one clear message that says what to do, and nothing in a run folder ever runs code.
The hostile files are built here, in temporary folders; none is shipped.
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from sprout_model import GPT, Config
from sprout_model.checkpoint import save_checkpoint
from sprout_model.presets import PRESETS
from sprout_model.run_state import RunStateError, write_state
from sprout_model.train import TrainArgs, train

TINY = Config(vocab_size=300, context=64, n_layer=1, n_head=2, d_model=16, d_ff=32)
B, T = 2, 16


@pytest.fixture(autouse=True)
def tiny_preset(monkeypatch):
    monkeypatch.setitem(PRESETS, "tiny", TINY)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A prepared-corpus folder written directly (random token ids, no tokenizer): enough to train on."""
    out = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    rng.integers(1, TINY.vocab_size, 4000, dtype=np.uint16).tofile(out / "train.bin")
    rng.integers(1, TINY.vocab_size, 400, dtype=np.uint16).tofile(out / "val.bin")
    (out / "meta.json").write_text(json.dumps({"vocab_size": TINY.vocab_size, "corpus": "random",
                                               "corpus_sha256": "0" * 64}))
    return out


def args(data: Path, out: Path, **kw) -> TrainArgs:
    base = dict(preset="tiny", data=str(data), out=str(out), tokens=4 * B * T, batch_size=B, seq_len=T,
                warmup=1, eval_every=2, eval_batches=1, save_every=2, seed=0)
    base.update(kw)
    return TrainArgs(**base)


# --- a state.pt that would run code --------------------------------------------------------------


class Payload:
    """Unpickling this writes ``marker``: what an attacker's ``__reduce__`` would do instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def evil_run(folder: Path, marker: Path) -> Path:
    """A run folder (state.pt + checkpoint/) whose state.pt carries a code-running payload."""
    folder.mkdir(parents=True)
    model = GPT(TINY)
    save_checkpoint(model, folder / "checkpoint", None, {"steps": 1, "tokens_seen": 1, "history": []})
    torch.save({"format": 2, "model": model.state_dict(), "step": 1, "tokens_seen": 1, "history": [],
                "wall": 0.0, "best_val": 1.0, "args": {}, "init": None, "rng": Payload(marker)},
               folder / "state.pt")
    return folder


@pytest.fixture
def marker(tmp_path) -> Path:
    m = tmp_path / "marker"
    pickle.loads(pickle.dumps(Payload(m)))  # the payload is real: plain unpickling runs it
    assert m.read_text() == "ran"
    m.unlink()
    return m


def test_resuming_an_evil_run_runs_nothing(data, tmp_path, marker):
    run = evil_run(tmp_path / "run", marker)
    with pytest.raises(RunStateError, match="refused and not executed"):
        train(args(data, run), progress=False)
    assert not marker.exists()


def test_init_from_an_evil_run_runs_nothing(data, tmp_path, marker):
    run = evil_run(tmp_path / "evil", marker)
    with pytest.raises(RunStateError, match="refused and not executed"):
        train(args(data, tmp_path / "mine", init_from=str(run)), progress=False)
    assert not marker.exists()


def test_grow_and_ship_read_an_evil_run_without_running_it(tmp_path, marker):
    from sprout_model.grow import read_source
    from sprout_model.ship import last_weights

    run = evil_run(tmp_path / "evil", marker)
    with pytest.raises(RunStateError, match="refused and not executed"):
        read_source(run)
    with pytest.raises(RunStateError, match="refused and not executed"):
        last_weights(run)
    assert not marker.exists()


def test_our_own_state_round_trips(tmp_path):
    """The safe format still holds what a run needs (the evil tests above are not refusing everything)."""
    from sprout_model.run_state import read_state, rng_state

    write_state({"model": GPT(TINY).state_dict(), "rng": rng_state(), "args": {"batch_size": B}}, tmp_path / "s.pt")
    s = read_state(tmp_path / "s.pt")
    assert s["args"] == {"batch_size": B} and "embed.weight" in s["model"]
