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
from sprout_model.prepare import MAX_NAME_VIEWS
from sprout_model.presets import PRESETS
from sprout_model.run_state import RunStateError, write_state
from sprout_model.tokenizer import train_tokenizer
from sprout_model.train import TrainArgs, train

pytestmark = pytest.mark.unit

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
    (["--tokens", "0"], ["--tokens must be above 0 and at most 1e+12, got 0"]),
    (["--tokens", "nan"], ["--tokens must be above 0"]),
    (["--tokens", "1e30"], ["--tokens must be above 0 and at most 1e+12, got 1e30"]),
    (["--lr", "-1"], ["--lr must be a number of at least 0 (finite), got -1"]),
    (["--lr", "nan"], ["--lr must be a number of at least 0"]),
    (["--copy-rows", "2"], ["--copy-rows must be between 0 and 1"]),
    (["--n-layer", "0"], ["--n-layer must be 1 or more"]),
    # NaN and infinity in any float option (these trained to a state.pt of NaN weights, exit 0)
    (["--weight-decay", "nan"], ["--weight-decay must be a number of at least 0 (finite), got nan"]),
    (["--qk-gain-lr", "nan"], ["--qk-gain-lr must be", "got nan"]),
    (["--embed-mean", "inf"], ["--embed-mean must be", "got inf"]),
    (["--embed-lr=-inf"], ["--embed-lr must be", "got -inf"]),
    (["--min-lr-frac", "nan"], ["--min-lr-frac must be between 0 and 1, got nan"]),
    (["--beta2", "nan"], ["--beta2 must be at least 0 and below 1, got nan"]),
    (["--grad-clip", "inf"], ["--grad-clip must be a number above 0 (finite), got inf"]),
    (["--real-rows", "nan"], ["--real-rows must be between 0 and 1"]),
    (["--fit-minutes", "nan"], ["--fit-minutes must be a number above 0"]),
    (["--stop-copy-ratio", "inf"], ["--stop-copy-ratio must be"]),
    (["--lr", "ten"], ["--lr must be", "got 'ten'"]),
    # accepted and ignored, or accepted to stop at once
    (["--max-minutes", "-1"], ["--max-minutes must be a number above 0 (finite), got -1"]),
    (["--cooldown-tokens", "-1"], ["--cooldown-tokens must be a number of at least 0 (finite), got -1"]),
    (["--cooldown-tokens", "8"], ["--cooldown-tokens is the decay of --schedule wsd", "cosine schedule has none"]),
    # sizes: the loaders' limits before anything is allocated (--n-layer 1000 allocated 7.9 GB, unbounded --threads
    # crashed in the allocator)
    (["--n-layer", "1000"], ["--n-layer 1000: n_layer is 1000", "at most 256"]),
    (["--threads", "100000"], ["--threads must be from 1 to this machine's", "got 100000"]),
    (["--threads", "0"], ["--threads must be from 1"]),
    (["--preset", "bogus"], ["argument --preset: invalid choice: 'bogus'"]),
    (["--out", "/proc/self"], ["--out /proc/self: nothing can be written in /proc/self"]),
    (["--out", "/proc/self/run"], ["--out /proc/self/run: nothing can be written in /proc/self"]),
], ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0].startswith("--") else None)
def test_train_options_that_cannot_work(data, tmp_path, capsys, flags, words):
    from sprout_model.train import main

    err = cli_error(main, train_cli(data, tmp_path / "run") + flags, capsys)
    assert all(w in err for w in words), err
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize("field, value", [("weight_decay", float("nan")), ("qk_gain_lr", float("nan")),
                                          ("embed_mean", float("inf")), ("embed_lr", float("nan")),
                                          ("max_minutes", -1.0), ("cooldown_tokens", -1.0), ("tokens", 1e30),
                                          ("lr", True), ("threads", 10 ** 6), ("n_layer", 1000)])
def test_train_refuses_the_same_options_given_in_code(data, tmp_path, field, value):
    """TrainArgs built in code meet the command line's rules (check_args), before anything is written."""
    from sprout_model.train import TrainArgsError

    with pytest.raises(TrainArgsError, match="--" + field.replace("_", "-")):
        train(args(data, tmp_path / "run", **{field: value}), progress=False)
    assert not (tmp_path / "run").exists()


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
    good = save_checkpoint(GPT(Config(**{**TINY.to_dict(), "context": 128})), tmp_path / "good", None, {})
    assert info.main([str(good), str(bad)]) == 0  # info reports a damaged folder in its table and goes on
    out = capsys.readouterr().out
    assert "| " + str(good) in out and f"- {bad}: cannot load" in out and "n_layer" in out
    hostile = save_checkpoint(GPT(TINY), tmp_path / "hostile", None, {})
    (hostile / "tokenizer.json").write_text("[]")  # a tokenizer no loader reads: reported like a damaged folder
    assert info.main([str(good), str(hostile)]) == 0
    out = capsys.readouterr().out
    assert "| " + str(good) in out and f"- {hostile}: cannot load" in out and "not a JSON object" in out, out


def cli_case(cli: str, argv: str, *words: str):
    """One refusal: the tool, its arguments (``{ckpt}``, ``{data}``, ``{tmp}`` filled in), the words of its error."""
    return pytest.param(cli, argv.split(), list(words), id=f"{cli} {argv}".replace("{tmp}/", "").replace("{", "").replace("}", ""))


@pytest.mark.parametrize("cli, argv, words", [
    cli_case("grow", "{ckpt} --preset bogus --data {data}", "argument --preset: invalid choice: 'bogus'"),
    cli_case("grow", "{ckpt} --rows 0 --data {data}", "--rows and --seq-len must be 1 or more"),
    cli_case("grow", "{ckpt} --seq-len 100000 --data {data}", "--seq-len 100000 is longer than sprout's context of 512"),
    cli_case("stack", "{ckpt} --blocks 2 --copies-of 1 --out {tmp}/out --seq-len 0",
             "--rows and --seq-len must be 1 or more, got 16 and 0"),
    cli_case("stack", "{ckpt} --blocks 2 --copies-of 1 --out {tmp}/out --rows -1", "--rows and --seq-len must be 1 or more"),
    cli_case("stack", "{ckpt} --blocks 2 --copies-of 1 --out {tmp}/out --seq-len 100000 --data {data}",
             "--seq-len 100000 is longer than the checkpoint's context of 64"),
    cli_case("stack", "{ckpt} --blocks 2 --copies-of 1 --out {tmp}/out --out-scales 0.5,nan",
             "--out-scales must be a finite number, got nan"),
    cli_case("stack", "{ckpt} --blocks 2 --copies-of 1 --out {tmp}/out --out-scales inf",
             "--out-scales must be a finite number, got inf"),
    cli_case("stack", "{ckpt} --blocks 2 --copies-of 1 --out /proc/self/stacked",
             "--out /proc/self/stacked: nothing can be written in /proc/self"),
    cli_case("info", "{tmp}/nowhere {tmp}/nor-here", "no checkpoint to describe", "nowhere", "nor-here"),
    cli_case("info", "{tmp}/nowhere --bogus", "unrecognized arguments: --bogus"),
    cli_case("ship", "gpt-1 --run {tmp}/run --to /proc/self", "--to /proc/self: nothing can be written"),
    cli_case("prepare", "--corpus {tmp} --out {tmp}/out --full-name-share 0.5",
             "--full-name-share shapes the names of the --name-views versions", "pass --name-views K"),
    cli_case("prepare", "--corpus {tmp} --out {tmp}/out --splice-share 0.5", "--splice-share shapes", "--name-views"),
    cli_case("prepare", "--corpus {tmp} --out {tmp}/out --val-fraction nan",
             "--val-fraction must be between 0 and 1, both excluded, got nan"),
    cli_case("prepare", "--corpus {tmp} --out {tmp}/out --full-name-share inf --name-views 2",
             "--full-name-share must be between 0 and 1, got inf"),
    cli_case("prepare", "--corpus {tmp} --out /proc/self", "--out /proc/self: nothing can be written"),
])
def test_other_command_lines_refuse_with_one_line(data, tmp_path, capsys, cli, argv, words):
    import importlib

    main = importlib.import_module(f"sprout_model.{cli}").main
    ckpt = save_checkpoint(GPT(Config(**{**TINY.to_dict(), "n_layer": 2})), tmp_path / "ckpt", None, {})
    argv = [a.format(ckpt=ckpt, data=data, tmp=tmp_path) for a in argv]
    err = cli_error(main, argv, capsys)
    assert all(w in err for w in words), err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def hostile_data(data: Path, folder: Path, **files: np.ndarray) -> Path:
    """A copy of the prepared corpus ``data`` in ``folder`` with the token files in ``files`` (name: ids) replaced."""
    import shutil

    shutil.copytree(data, folder)
    for name, ids in files.items():
        ids.astype(np.uint16).tofile(folder / f"{name}.bin")
    return folder


@pytest.mark.parametrize("split", ["train", "val"])
def test_token_ids_past_the_vocabulary_are_refused_when_the_file_is_opened(data, tmp_path, capsys, monkeypatch, split):
    """An id the model has no row for stopped training with an IndexError at the first batch that drew it (or the
    first evaluation): now the file is refused when it is opened, read a chunk at a time, naming the id and where."""
    from sprout_model import corpus
    from sprout_model.train import main

    monkeypatch.setattr(corpus, "TOKEN_CHUNK", 1000, raising=False)  # the bad id sits in the third chunk
    ids = np.fromfile(data / f"{split}.bin", dtype=np.uint16)
    ids[2345 if split == "train" else 345] = TINY.vocab_size  # one past the last id
    bad = hostile_data(data, tmp_path / "bad", **{split: ids})
    err = cli_error(main, train_cli(bad, tmp_path / "run"), capsys)
    at = 2345 if split == "train" else 345
    assert f"{bad / (split + '.bin')} holds token id 300 at position {at:,}" in err, err
    assert "vocabulary has 300 ids (0 to 299)" in err and "sprout_model.prepare" in err
    assert not (tmp_path / "run" / "state.pt").exists()


def test_open_tokens_checks_every_chunk_and_the_file_size(tmp_path, monkeypatch):
    from sprout_model import corpus
    from sprout_model.corpus import CorpusError, open_tokens
    from sprout_model.evaluation import first_val_windows

    monkeypatch.setattr(corpus, "TOKEN_CHUNK", 7)
    ids = np.arange(50, dtype=np.uint16) % 40
    ids.tofile(tmp_path / "ok.bin")
    assert open_tokens(tmp_path / "ok.bin", 40).tolist() == ids.tolist()  # ids 0..39 all fit 40
    with pytest.raises(CorpusError, match=r"holds token id 39 at position 39,"):
        open_tokens(tmp_path / "ok.bin", 39)  # the last full chunk's last id
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(CorpusError, match="3 bytes, not a whole number of uint16 token ids"):
        open_tokens(tmp_path / "odd.bin", 40)
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(CorpusError, match="holds no tokens"):
        open_tokens(tmp_path / "empty.bin", 40)
    (tmp_path / "d").mkdir()
    np.full(100, 65535, dtype=np.uint16).tofile(tmp_path / "d" / "val.bin")
    with pytest.raises(CorpusError, match="token id 65,535 at position 0"):  # grow and stack read it so too
        first_val_windows(tmp_path / "d", 2, 8, 300)


def test_python_dash_m_prints_one_line_and_exits_2(data, tmp_path):
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
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


@pytest.mark.acceptance  # over 3 s
def test_a_kill_during_a_checkpoint_write_leaves_no_half_folder(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from sprout_model.checkpoint import load_folder

    root = Path(__file__).resolve().parents[2]
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
    for bad, words in [({"n_layer": 10 ** 9}, "n_layer"), ({"d_ff": 60_000}, "parameters"), ({"d_model": "16"}, "d_model"),
                       ({"n_layer": 1000}, "n_layer is 1000; it must be a positive whole number of at most 256"),
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


# --- a long document on one line ------------------------------------------------------------------------


def one_line_text(n_words: int, seed: int = 0) -> str:
    """Prose-like words on one line: no newline for a whole document."""
    rng = np.random.default_rng(seed)
    lexicon = ["".join(rng.choice(list("abcdefghijklmnoprstuvwy"), rng.integers(2, 9))) for _ in range(400)]
    lexicon += ["o'clock", "isn't", "1897,", "harbour.", "«café»", "—", "漢字"]
    return " ".join(rng.choice(lexicon, n_words))


class RecordingTokenizer:
    """A tokenizer that records the length of every text it is asked to encode, and otherwise is ``tok``."""

    def __init__(self, tok):
        self.tok, self.lengths = tok, []

    def encode(self, text, *args, **kwargs):
        self.lengths.append(len(text))
        return self.tok.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_prepare_encodes_a_one_line_document_a_piece_at_a_time(data, tmp_path, monkeypatch):
    """A 20 MB document on one line was handed to the tokenizer whole (peak 3.2 GB; 4.3 GB where the tokenizer
    was trained on it too); it now goes in pieces of about PIECE_CHARS characters, and the token files hold
    exactly the whole documents' ids."""
    from sprout_model import prepare as prep
    from sprout_model import tokenizer as tk
    from sprout_model.corpus import load_documents, split_corpus

    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "long.txt").write_text(one_line_text(8000))  # about 45,000 characters, no newline
    for i in range(3):
        (texts / f"{i}.txt").write_text(PROSE)
    monkeypatch.setattr(tk, "PIECE_CHARS", 1000, raising=False)
    real = prep.reuse_tokenizer(data / "tokenizer.json")
    recording = RecordingTokenizer(real)
    monkeypatch.setattr(prep, "reuse_tokenizer", lambda path: recording)
    meta = prep.prepare(str(texts), tmp_path / "out", val_fraction=0.25, tokenizer=data / "tokenizer.json")
    assert max(recording.lengths) <= 2000, max(recording.lengths)
    eot = real.token_to_id(tk.EOT)
    train_docs, val_docs = split_corpus(str(texts), load_documents(str(texts)), 0.25, 0)
    assert max(len(d.text) for d in train_docs + val_docs) > 40_000
    for split, docs in (("train", train_docs), ("val", val_docs)):
        want = [i for d in docs for i in [*real.encode(d.text, add_special_tokens=False).ids, eot]]
        assert np.fromfile(tmp_path / "out" / f"{split}.bin", dtype=np.uint16).tolist() == want
        assert meta[f"{split}_tokens"] == len(want)


def test_pieces_end_where_words_do(data):
    from sprout_model.corpus import word_count
    from sprout_model.tokenizer import encode, encode_pieces, load_tokenizer, pieces

    tok = load_tokenizer(data / "tokenizer.json")
    rng = np.random.default_rng(1)
    parts = ["a", "bb", "'s", "1", ".", "é", "漢", "\n", "\t", "  ", " \n "]
    text = "".join(rng.choice(parts) + ("" if k % 3 else " x") for k in range(3000))  # " x" at least every 3 parts
    for size in (10, 17, 64, 500):
        cut = list(pieces(text, size))
        assert "".join(cut) == text and max(map(len, cut)) <= 2 * size
        assert [i for ids in encode_pieces(tok, text, size) for i in ids] == encode(tok, text)
    run = "x" * 5000  # no space at all: cut where it is, never more than twice the size
    assert "".join(pieces(run, 100)) == run and max(map(len, pieces(run, 100))) <= 200
    assert word_count(text, chunk=7) == len(text.split())


def test_the_tokenizer_trained_in_pieces_is_the_one_trained_whole(monkeypatch):
    from sprout_model import tokenizer as tk

    docs = [one_line_text(6000, seed=2), PROSE]
    whole = tk.train_tokenizer(docs, vocab_size=300).to_str()
    monkeypatch.setattr(tk, "PIECE_CHARS", 300)
    assert tk.train_tokenizer(docs, vocab_size=300).to_str() == whole


@pytest.mark.parametrize("argv, words", [
    (["run", "--minutes", "nan"], ["--minutes must be a number of at least 0 (finite), got nan"]),
    (["run", "--copy-lr", "-1"], ["--copy-lr must be a number of at least 0", "got -1"]),
    (["run", "--text-copy-rows", "inf"], ["--text-copy-rows must be", "got inf"]),
    (["split", "a", "b", "--max-part-mib", "0"], ["--max-part-mib must be a number above 0"]),
])
def test_the_gpu_recipe_refuses_non_finite_and_negative_numbers(argv, words, capsys):
    from sprout_model import device

    err = cli_error(device.main, argv, capsys)
    assert all(w in err for w in words), err


# --- prepare and train refuse what no loader reads, before writing anything -------------------------------

EXPANDING = {"type": "Replace", "pattern": {"String": "a"}, "content": "x" * 4000}  # 144 KB of text became 139 MB


def run_cli(module: str, *argv: str) -> tuple[int, list[str]]:
    """``python -m sprout_model.<module> argv`` in a subprocess: (exit status, the lines of its stderr)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", f"sprout_model.{module}", *argv], capture_output=True, text=True,
                       timeout=300, check=False, env={**os.environ, "PYTHONPATH": str(root)}, cwd=root)
    return r.returncode, r.stderr.strip().splitlines()


def hostile_tokenizer(data: Path, folder: Path, **parts) -> Path:
    """The ``data`` fixture's tokenizer.json with some top-level parts replaced, written to ``folder``."""
    spec = json.loads((data / "tokenizer.json").read_text())
    spec.update(parts)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder / "tokenizer.json"


@pytest.fixture
def texts(tmp_path) -> Path:
    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.txt").write_text(PROSE)
    return folder


@pytest.mark.parametrize("views", [str(MAX_NAME_VIEWS + 1), "2.5"])
def test_prepare_name_views_is_bounded_on_the_command_line(texts, tmp_path, views):
    """--name-views had no upper bound: a 144 KB corpus wrote 1,498 files and kept going."""
    code, err = run_cli("prepare", "--corpus", str(texts), "--out", str(tmp_path / "out"), "--name-views", views)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and "--name-views" in err[0], err
    if views != "2.5":  # argparse's own one line for a non-integer
        assert f"from 0 to {MAX_NAME_VIEWS}" in err[0] and f"got {views}" in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("views", ["-1", "1000000", str(MAX_NAME_VIEWS + 1)])
def test_prepare_name_views_out_of_range_is_one_line(texts, tmp_path, capsys, views):
    from sprout_model import prepare

    err = cli_error(prepare.main, ["--corpus", str(texts), "--out", str(tmp_path / "out"), "--name-views", views], capsys)
    assert f"--name-views must be a whole number from 0 to {MAX_NAME_VIEWS}" in err and f"got {views}" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("views", [MAX_NAME_VIEWS + 1, -1, True, 2.0, "4"])
def test_prepare_refuses_name_views_out_of_range_in_code(texts, tmp_path, views):
    from sprout_model.prepare import prepare

    with pytest.raises(ValueError, match=rf"--name-views must be a whole number from 0 to {MAX_NAME_VIEWS}"):
        prepare(str(texts), tmp_path / "out", name_views=views)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["expanding normalizer", "json array", "backtracking split", "not json", "no eot",
                                  "too many tokens"])
def test_prepare_refuses_a_tokenizer_the_loader_refuses(data, texts, tmp_path, capsys, kind, monkeypatch):
    """prepare accepted a tokenizer that si.load refuses (an expanding normalizer: 144 KB became 139 MB), and train
    then wrote a checkpoint nothing can load. Now prepare applies the loader's check before writing anything."""
    from sprout_model import prepare, tokenizer

    folder = tmp_path / "tok"
    if kind == "expanding normalizer":
        path, words = hostile_tokenizer(data, folder, normalizer=EXPANDING), ["has a normalizer", "Replace"]
    elif kind == "json array":
        folder.mkdir()
        (path := folder / "tokenizer.json").write_text("[]")
        words = ["not a JSON object (it holds an array)"]
    elif kind == "backtracking split":
        split = {"type": "Split", "pattern": {"Regex": "(a|a)*$"}, "behavior": "Isolated", "invert": False}
        spec = json.loads((data / "tokenizer.json").read_text())
        path = hostile_tokenizer(data, folder, pre_tokenizer={"type": "Sequence",
                                                              "pretokenizers": [split, spec["pre_tokenizer"]]})
        words = ["(a|a)*$", "GPT-2"]
    elif kind == "not json":
        folder.mkdir()
        (path := folder / "tokenizer.json").write_text("{" * 100)
        words = ["is not a tokenizers file"]
    elif kind == "no eot":
        spec = json.loads((data / "tokenizer.json").read_text())
        spec["added_tokens"] = []
        spec["model"]["vocab"] = {k: v for k, v in spec["model"]["vocab"].items() if k != "<|endoftext|>"}
        path, words = hostile_tokenizer(data, folder, **spec), ["has no <|endoftext|> token"]
    else:
        monkeypatch.setattr(tokenizer, "MAX_TOKENIZER_BYTES", 1000)
        path, words = data / "tokenizer.json", ["is over 1,000 bytes"]
    err = cli_error(prepare.main, ["--corpus", str(texts), "--out", str(tmp_path / "out"), "--tokenizer", str(path)], capsys)
    assert err.startswith("error: --tokenizer: ") and all(w in err for w in words), err
    assert not (tmp_path / "out").exists()


def test_prepare_with_an_expanding_tokenizer_exits_2_in_a_subprocess(data, texts, tmp_path):
    path = hostile_tokenizer(data, tmp_path / "tok", normalizer=EXPANDING)
    code, err = run_cli("prepare", "--corpus", str(texts), "--out", str(tmp_path / "out"), "--tokenizer", str(path))
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --tokenizer: "), err
    assert "has a normalizer" in err[0] and not (tmp_path / "out").exists()


def test_the_tokenizer_prepare_trains_passes_the_loaders_check(data):
    """What prepare trains is what the check accepts (the check refuses nothing of ours)."""
    from sprout_model.tokenizer import check_corpus_tokenizer, check_tokenizer_spec, load_tokenizer

    check_tokenizer_spec(json.loads((data / "tokenizer.json").read_text()), "trained")
    assert check_corpus_tokenizer(load_tokenizer(data / "tokenizer.json"), "t", TINY.vocab_size).get_vocab_size() == 300


@pytest.mark.parametrize("kind", ["expanding normalizer", "another size", "json array"])
def test_train_refuses_a_prepared_corpus_whose_tokenizer_no_loader_reads(data, tmp_path, capsys, kind):
    """A prepared corpus with such a tokenizer trained to a checkpoint that sprout_interp.load refuses; now train
    refuses it naming --data, before the run folder exists."""
    import shutil

    from sprout_model.train import main

    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    if kind == "expanding normalizer":
        hostile_tokenizer(data, bad, normalizer=EXPANDING)
        words = ["has a normalizer"]
    elif kind == "another size":
        texts = [f"The {w} walked to the harbour at {i} o'clock and sang." for i, w in enumerate(["cat", "dog", "man"] * 40)]
        train_tokenizer(texts, vocab_size=280).save(str(bad / "tokenizer.json"))
        words = ["has 280 tokens but the prepared corpus says vocab_size 300", "would load nowhere"]
    else:
        (bad / "tokenizer.json").write_text("[]")
        words = ["not a JSON object"]
    err = cli_error(main, train_cli(bad, tmp_path / "run"), capsys)
    assert err.startswith("error: --data: ") and all(w in err for w in words), err
    assert not (tmp_path / "run").exists()


# --- what a killed checkpoint write leaves is cleaned on the next start --------------------------------------


def dead_pid() -> int:
    """The id of a process that has exited (reused only after the kernel cycles through every pid)."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def leftover(folder: Path, kind: str, pid: int) -> Path:
    """A half-written ``.<name>.<kind>-<pid>`` folder beside ``folder``, as a killed save_checkpoint leaves it."""
    stale = folder.with_name(f".{folder.name}.{kind}-{pid}")
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"\0" * 1000)
    return stale


def test_stale_checkpoint_folders_are_removed_when_a_run_starts(data, tmp_path):
    """Each killed run left a .checkpoint.tmp-PID folder (a whole model's weights) that nothing removed; the next
    start removes those whose process is gone (or whose pid is this process's), and keeps a live writer's."""
    import os
    import subprocess
    import sys

    run = tmp_path / "run"
    gone = [leftover(run / "checkpoint", "tmp", dead_pid()), leftover(run / "checkpoint", "old", dead_pid()),
            leftover(run / "checkpoint", "tmp", os.getpid())]
    live_writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        live = leftover(run / "checkpoint", "tmp", live_writer.pid)
        other = run / ".checkpoint.tmp-notapid"  # not one of ours: left alone
        other.mkdir()
        train(args(data, run, max_steps=1, save_every=10, eval_every=10), progress=False)
        assert not any(p.exists() for p in gone)
        assert live.is_dir() and other.is_dir()
        assert (run / "state.pt").is_file()
    finally:
        live_writer.kill()
        live_writer.wait()


def test_clean_stale_writes_beside_any_checkpoint_folder(tmp_path):
    """save_checkpoint (every tool that writes a checkpoint) and the device join clean the same way."""
    import os
    import subprocess
    import sys

    from sprout_model.checkpoint import clean_stale_writes, pid_alive

    ckpt = tmp_path / "ckpt"
    dead = dead_pid()
    assert not pid_alive(dead) and pid_alive(os.getpid()) and not pid_alive(0) and not pid_alive(2 ** 40)
    stale = [leftover(ckpt, "tmp", dead), leftover(ckpt, "old", dead)]
    neighbour = leftover(tmp_path / "other", "tmp", dead)  # another folder's leftovers: not this folder's to clean
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        live = leftover(ckpt, "tmp", sleeper.pid)
        assert sorted(clean_stale_writes(ckpt)) == sorted(stale)
        assert live.is_dir() and neighbour.is_dir()
        save_checkpoint(GPT(TINY), ckpt, None, {})
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ckpt", live.name, ".other.tmp-" + str(dead)])
    finally:
        sleeper.kill()
        sleeper.wait()
    assert clean_stale_writes(ckpt) == [live]  # its writer is gone now
