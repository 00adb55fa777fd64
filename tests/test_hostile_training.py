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
from sprout_model.tokenizer import train_tokenizer
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
    texts = [f"The {w} walked to the harbour at {i} o'clock and sang." for i, w in enumerate(["cat", "dog", "man"] * 40)]
    train_tokenizer(texts, vocab_size=TINY.vocab_size).save(str(out / "tokenizer.json"))
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


# --- the command lines: one line, exit status 2 ------------------------------------------------------


def cli_error(main, argv: list[str], capsys) -> str:
    """Run a CLI ``main``; assert it exits 2 with a single ``error: ...`` line on stderr; return that line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def train_cli(data: Path, out: Path, *extra: str) -> list[str]:
    return ["--preset", "tiny", "--data", str(data), "--out", str(out), "--batch-size", str(B), "--seq-len", str(T),
            "--tokens", str(4 * B * T), "--eval-every", "2", "--eval-batches", "1", *extra]


@pytest.mark.parametrize("flags, words", [
    (["--batch-size", "0"], ["--batch-size must be 1 or more, got 0"]),
    (["--batch-size", "-4"], ["--batch-size must be 1 or more"]),
    (["--seq-len", "0"], ["--seq-len must be 1 or more"]),
    (["--seq-len", "1000"], ["--seq-len 1000 is longer than", "context of 64", "--seq-len 64 or less"]),
    (["--eval-every", "0"], ["--eval-every must be 1 or more"]),
    (["--save-every", "0"], ["--save-every must be 1 or more"]),
    (["--tokens", "0"], ["--tokens must be a number above 0"]),
    (["--tokens", "nan"], ["--tokens"]),
    (["--lr", "-1"], ["--lr"]),
    (["--copy-rows", "2"], ["--copy-rows must be between 0 and 1"]),
    (["--n-layer", "0"], ["--n-layer must be 1 or more"]),
], ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0].startswith("--") else None)
def test_train_options_that_cannot_work(data, tmp_path, capsys, flags, words):
    from sprout_model.train import main

    err = cli_error(main, train_cli(data, tmp_path / "run") + flags, capsys)
    assert all(w in err for w in words), err
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_train_without_a_prepared_corpus(tmp_path, capsys):
    from sprout_model.train import main

    err = cli_error(main, train_cli(tmp_path / "nothing", tmp_path / "run"), capsys)
    assert "not a prepared corpus" in err and "sprout_model.prepare" in err


def test_resuming_with_another_batch_size_or_sequence_length(data, tmp_path, capsys):
    from sprout_model.train import TrainArgsError, main

    run = tmp_path / "run"
    train(args(data, run, max_steps=2), progress=False)
    with pytest.raises(TrainArgsError, match=f"started with --batch-size {B}; resuming it with --batch-size {2 * B}"):
        train(args(data, run, batch_size=2 * B), progress=False)
    with pytest.raises(TrainArgsError, match=f"--seq-len {T // 2}.*Pass --seq-len {T} to resume"):
        train(args(data, run, seq_len=T // 2), progress=False)
    err = cli_error(main, train_cli(data, run, "--batch-size", "3"), capsys)
    assert "--batch-size 3" in err and "--out a new folder" in err
    assert train(args(data, run), progress=False)["step"] == 4  # the same options still resume


def test_truncated_state_is_one_line(data, tmp_path, capsys):
    from sprout_model.train import main

    run = tmp_path / "run"
    train(args(data, run, max_steps=2), progress=False)
    raw = (run / "state.pt").read_bytes()
    (run / "state.pt").write_bytes(raw[: len(raw) // 2])
    err = cli_error(main, train_cli(data, run), capsys)
    assert "state.pt" in err and "truncated" in err and "--init-from" in err


def test_evil_init_from_on_the_command_line(data, tmp_path, marker, capsys):
    from sprout_model.train import main

    run = evil_run(tmp_path / "evil", marker)
    err = cli_error(main, train_cli(data, tmp_path / "mine", "--init-from", str(run)), capsys)
    assert "refused and not executed" in err and not marker.exists()


def test_grow_ship_info_prepare_command_lines(data, tmp_path, capsys, marker):
    from sprout_model import grow, info, prepare, ship

    err = cli_error(grow.main, [str(tmp_path / "nowhere"), "--data", str(data)], capsys)
    assert "neither a run folder" in err
    err = cli_error(grow.main, [str(evil_run(tmp_path / "evil", marker)), "--data", str(data)], capsys)
    assert "refused" in err and not marker.exists()
    err = cli_error(ship.main, ["gpt-1", "--run", str(tmp_path / "no-run")], capsys)
    assert "no-run" in err
    err = cli_error(prepare.main, ["--corpus", str(tmp_path / "no-such-folder"), "--out", str(tmp_path / "d")], capsys)
    assert "unknown corpus" in err
    err = cli_error(prepare.main, ["--corpus", str(data), "--out", str(tmp_path / "d"), "--val-fraction", "1.5"], capsys)
    assert "--val-fraction must be between 0 and 1" in err
    bad = save_checkpoint(GPT(TINY), tmp_path / "bad", None, {})
    (bad / "config.json").write_text(json.dumps({**TINY.to_dict(), "n_layer": 10 ** 9}))
    assert info.main([str(bad)]) == 0  # info reports a damaged folder in its table and goes on
    assert "n_layer" in capsys.readouterr().out


def test_python_dash_m_prints_one_line_and_exits_2(data, tmp_path):
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "sprout_model.train", "--data", str(data), "--out", str(tmp_path / "r"),
                        "--batch-size", "0"], capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
                       env={**os.environ, "PYTHONPATH": str(root)})
    assert r.returncode == 2 and r.stderr.strip() == "error: --batch-size must be 1 or more, got 0", r.stderr


# --- checkpoint folders are written whole --------------------------------------------------------------

KILL_DURING_WRITE = """
import os, shutil, signal, sys
from sprout_model import GPT, Config
from sprout_model.checkpoint import save_checkpoint
real = shutil.copyfile
def dying(src, dst, *a, **k):
    real(src, dst, *a, **k)
    if str(dst).endswith("tokenizer.json"):
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9 with everything but the rename done
shutil.copyfile = dying
save_checkpoint(GPT(Config(vocab_size=64, context=16, n_layer=1, n_head=2, d_model=8, d_ff=16)), sys.argv[1], sys.argv[2], {"n": 2})
"""


def test_a_kill_during_a_checkpoint_write_leaves_no_half_folder(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from sprout_model.checkpoint import load_folder

    root = Path(__file__).resolve().parents[1]
    tok = tmp_path / "tokenizer.json"
    tok.write_text("{}")
    ckpt = tmp_path / "run" / "checkpoint"

    def killed_write() -> None:
        r = subprocess.run([sys.executable, "-c", KILL_DURING_WRITE, str(ckpt), str(tok)], timeout=120, check=False,
                           env={**os.environ, "PYTHONPATH": str(root)})
        assert r.returncode == -signal.SIGKILL

    killed_write()  # the first write: no folder at all, rather than one without its tokenizer
    assert not ckpt.exists()
    first = GPT(TINY)
    save_checkpoint(first, ckpt, tok, {"n": 1})  # the next write clears what the killed one left
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["checkpoint"]
    killed_write()  # a later write: the old folder, whole
    model, info = load_folder(ckpt)
    assert info == {"n": 1} and (ckpt / "tokenizer.json").is_file()
    assert torch.equal(model.state_dict()["embed.weight"], first.state_dict()["embed.weight"])


def test_load_folder_checks_the_config_against_the_weights(tmp_path):
    from sprout_model.checkpoint import CheckpointFolderError, load_folder

    f = save_checkpoint(GPT(TINY), tmp_path / "c", None, {})
    for bad, words in [({"n_layer": 10 ** 9}, "n_layer"), ({"d_ff": 10 ** 6}, "parameters"), ({"d_model": "16"}, "d_model"),
                       ({"rope_base": 0}, "rope_base"), ({"n_head": 3}, "head width"), ({"context": 10 ** 9}, "context")]:
        (f / "config.json").write_text(json.dumps({**TINY.to_dict(), **bad}))
        with pytest.raises(CheckpointFolderError, match=words):
            load_folder(f)
    (f / "config.json").write_text("[" * 100_000)
    with pytest.raises(CheckpointFolderError, match="cannot be loaded"):
        load_folder(f)


# --- corpora ------------------------------------------------------------------------------------------

PROSE = ("The old man walked down to the harbour every morning, and the boats came in with the tide. " * 6 + "\n\n") * 3


def test_binary_files_named_txt_are_skipped_with_a_message(tmp_path, capsys):
    from sprout_model.corpus import CorpusError, folder_documents, load_documents

    (tmp_path / "story.txt").write_text(PROSE)
    (tmp_path / "photo.txt").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40)
    (tmp_path / "random.txt").write_bytes(np.random.default_rng(0).integers(128, 256, 5000, dtype=np.uint8).tobytes())
    skipped: list[str] = []
    docs = list(folder_documents(tmp_path, skipped))
    assert [d.name for d in docs] == ["story.txt#0"]
    assert len(skipped) == 2 and all("binary data, not text" in s for s in skipped)
    assert "photo.txt" in capsys.readouterr().err
    (tmp_path / "story.txt").unlink()
    with pytest.raises(CorpusError, match="no text: every file is empty, binary"):
        load_documents(str(tmp_path))


def test_fifos_and_link_loops_in_a_corpus_do_not_hang(tmp_path):
    import os

    from sprout_model.corpus import folder_documents

    (tmp_path / "story.txt").write_text(PROSE)
    os.mkfifo(tmp_path / "pipe.txt")
    os.symlink(tmp_path, tmp_path / "loop")
    skipped: list[str] = []
    assert [d.name for d in folder_documents(tmp_path, skipped)] == ["story.txt#0"]
    assert any("pipe.txt: not a regular file" in s for s in skipped)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"])
def test_unicode_encodings_are_read_as_text(tmp_path, encoding):
    from sprout_model.corpus import folder_documents

    text = "Zoë said «bonjour» to Анна at the café, and 漢字 stayed. " * 8
    (tmp_path / "a.txt").write_bytes(text.encode(encoding))
    (doc,) = folder_documents(tmp_path)
    assert doc.text == text.strip()


def test_a_one_document_corpus_says_what_to_do(tmp_path):
    from sprout_model.corpus import CorpusError
    from sprout_model.prepare import prepare

    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "only.txt").write_text(PROSE)
    with pytest.raises(CorpusError, match="1 document.*at least two.*Add more .txt files"):
        prepare(str(tmp_path / "texts"), tmp_path / "out")


def test_too_little_text_for_the_tokenizer_says_what_to_do(tmp_path):
    from sprout_model.corpus import CorpusError
    from sprout_model.prepare import prepare

    (tmp_path / "texts").mkdir()
    for i in range(3):
        (tmp_path / "texts" / f"{i}.txt").write_text(PROSE)
    with pytest.raises(CorpusError, match="too little text.*Add more .txt files"):
        prepare(str(tmp_path / "texts"), tmp_path / "out")
