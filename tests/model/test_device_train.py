"""What a lent GPU run needs, checked on the CPU: the checkpoint split into parts that come back and joined
again bit for bit, the size of what a run call sends, the pack and unpack scripts, the imports the device has,
and scripts/train_on_device.sh end to end on a tiny model."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from sprout_model import GPT, Config, preset
from sprout_model.checkpoint import load_folder, save_checkpoint
from sprout_model.transport import (
    MANIFEST,
    PART_LIMIT,
    RETURN_FILE_LIMIT,
    RETURN_FILES,
    SEND_LIMIT,
    PartsError,
    check_out,
    join_parts,
    sent_bytes,
    split_checkpoint,
)

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "model" / "checkpoints" / "tokenizer.json"
SMALL = Config(vocab_size=8192, context=64, n_layer=10, n_head=2, d_model=64, d_ff=256)  # 2.4 MB in 16 bits
MiB = 1 << 20


def _checkpoint(tmp_path: Path, cfg: Config, name: str = "ckpt") -> tuple[GPT, Path]:
    torch.manual_seed(0)
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():  # trained-looking weights, gains far from 1 too
            p.add_(torch.randn_like(p) * 0.1)
    folder = save_checkpoint(model, tmp_path / name, TOKENIZER, {"steps": 3, "tokens_seen": 99, "history": [{"step": 3}]})
    return model, folder


# ---------------------------------------------------------------- the checkpoint in parts

def test_split_and_join_give_the_same_tensors_bit_for_bit(tmp_path):
    model, folder = _checkpoint(tmp_path, SMALL)
    parts = tmp_path / "parts"
    limit = 1_100_000  # forces three parts: blocks 0-7, blocks 8-9, the embedding (1,048,576 bytes) and the final gain
    manifest = split_checkpoint(folder, parts, max_part_bytes=limit)
    files = sorted(p.name for p in parts.iterdir())
    assert len(manifest["parts"]) == 3
    assert files == sorted([p["file"] for p in manifest["parts"]] + [MANIFEST, "train.json"])
    assert all((parts / p["file"]).stat().st_size <= limit for p in manifest["parts"])
    names = [n for p in manifest["parts"] for n in p["tensors"]]
    assert len(names) == len(set(names))

    dest = join_parts(parts, tmp_path / "joined" / "checkpoint")
    assert {p.name for p in dest.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json", "train.json"}
    joined = load_file(str(dest / "model.safetensors"))
    original = load_file(str(folder / "model.safetensors"))  # float32, as train writes it
    assert joined.keys() == original.keys() == set(names)
    from_parts = {}
    for p in manifest["parts"]:
        from_parts.update(load_file(str(parts / p["file"])))
    for k, v in original.items():
        assert joined[k].dtype == torch.float16
        assert torch.equal(joined[k].view(torch.int16), v.half().view(torch.int16)), k  # bit for bit
        assert torch.equal(joined[k].view(torch.int16), from_parts[k].view(torch.int16)), k
    assert json.loads((dest / "config.json").read_text()) == json.loads((folder / "config.json").read_text())
    assert (dest / "train.json").read_bytes() == (folder / "train.json").read_bytes()
    assert (dest / "tokenizer.json").read_bytes() == TOKENIZER.read_bytes()

    loaded, info = load_folder(dest)
    assert info["tokens_seen"] == 99
    ref = GPT(SMALL)
    ref.load_state_dict({k: v.half().float() for k, v in model.state_dict().items()})
    idx = torch.randint(0, SMALL.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(idx)[0], ref.eval()(idx)[0])
    import sprout_interp
    lc = sprout_interp.load_checkpoint(dest)
    assert lc.model.cfg == SMALL


def test_sprout_comes_back_in_parts_under_the_limits(tmp_path):
    _, folder = _checkpoint(tmp_path, preset("sprout"))
    out = tmp_path / "out"
    manifest = split_checkpoint(folder, out)
    (out / "device.json").write_text("{}")
    (out / "log.txt").write_text("log\n")
    sizes = [p["bytes"] for p in manifest["parts"]]
    assert len(sizes) == 3 and max(sizes) <= PART_LIMIT < RETURN_FILE_LIMIT
    assert 33 * MiB < sum(sizes) < 34 * MiB  # 17.3M parameters in 16 bits
    assert len(list(out.iterdir())) <= RETURN_FILES and check_out(out) == []
    join_parts(out, tmp_path / "joined")
    model, _ = load_folder(tmp_path / "joined")
    assert model.num_params() == GPT(preset("sprout")).num_params()


def test_a_damaged_or_missing_part_is_refused(tmp_path):
    _, folder = _checkpoint(tmp_path, SMALL)
    parts = tmp_path / "parts"
    manifest = split_checkpoint(folder, parts, max_part_bytes=1_100_000)
    first, second = (parts / p["file"] for p in manifest["parts"][:2])
    with pytest.raises(FileExistsError):
        join_parts(parts, folder)
    data = bytearray(second.read_bytes())
    data[-1] ^= 1
    second.write_bytes(bytes(data))
    with pytest.raises(PartsError, match="size or SHA-256 differ"):
        join_parts(parts, tmp_path / "j1")
    first.unlink()
    with pytest.raises(PartsError, match="missing"):
        join_parts(parts, tmp_path / "j2")
    assert not (tmp_path / "j1").exists() and not (tmp_path / "j2").exists()
    (parts / MANIFEST).unlink()
    with pytest.raises(PartsError, match="export did not finish"):
        join_parts(parts, tmp_path / "j3")


def test_join_wants_the_tokenizer_the_run_trained_with(tmp_path):
    _, folder = _checkpoint(tmp_path, SMALL)
    split_checkpoint(folder, tmp_path / "parts")
    other = tmp_path / "other.json"
    other.write_text(TOKENIZER.read_text().replace('"<|endoftext|>"', '"<|end|>"', 1))
    with pytest.raises(PartsError, match="not the tokenizer the run trained with"):
        join_parts(tmp_path / "parts", tmp_path / "j", tokenizer=other)
    join_parts(tmp_path / "parts", tmp_path / "j", tokenizer=TOKENIZER)


def test_a_tensor_bigger_than_a_part_is_a_clear_error(tmp_path):
    _, folder = _checkpoint(tmp_path, SMALL)
    with pytest.raises(ValueError, match="embed.weight is 1,048,576 bytes, more than a part"):
        split_checkpoint(folder, tmp_path / "parts", max_part_bytes=1_000_000)


def test_check_out_counts_files_and_sizes(tmp_path):
    for i in range(RETURN_FILES + 1):
        (tmp_path / f"f{i}").write_bytes(b"x")
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(RETURN_FILE_LIMIT + 1)
    problems = check_out(tmp_path)
    assert any("more than 8 come back" in p for p in problems) and any(p.startswith("big.bin") for p in problems)


# ---------------------------------------------------------------- what a run call sends, and the pack scripts

def _git(repo: Path, *cmd: str) -> None:
    subprocess.run(["git", "-C", str(repo), *cmd], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A small git repository shaped like this one: shipped weights under model/checkpoints, a prepared corpus."""
    r = tmp_path / "repo"
    (r / "model" / "checkpoints" / "m" / "saes" / "s").mkdir(parents=True)
    (r / "data" / "c").mkdir(parents=True)
    (r / ".gitignore").write_text("/data/\n/device/\n")
    (r / "README.md").write_text("hello\n")
    (r / "model" / "checkpoints" / "tokenizer.json").write_bytes(TOKENIZER.read_bytes())
    rng = np.random.default_rng(0)
    for f, n in (("m/model.safetensors", 3 * MiB), ("m/saes/s/sae_weights.safetensors", MiB)):
        (r / "model" / "checkpoints" / f).write_bytes(rng.bytes(n))
    for f, n in (("train.bin", 2 * MiB), ("val.bin", 100_000), ("meta.json", 10), ("tokenizer.json", 20), ("train_names2.bin", 5000)):
        (r / "data" / "c" / f).write_bytes(rng.bytes(n))
    _git(r, "init", "-q")
    _git(r, "add", ".")
    _git(r, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    (r / "notes.txt").write_text("untracked, not ignored: it travels too\n")
    return r


def test_sent_bytes_counts_the_tree_and_the_carry(repo):
    s = sent_bytes(repo, ["data/c"])
    tracked = sum(p.stat().st_size for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts and "data" not in p.parts)
    assert s["tree"] == tracked  # tracked + untracked-not-ignored (notes.txt); the ignored data/ only as carry
    assert s["carry"] == sum(p.stat().st_size for p in (repo / "data" / "c").iterdir())
    assert s["total"] == s["tree"] + s["carry"] and s["limit"] == SEND_LIMIT == 64 * MiB
    assert s["biggest"][0] == (3 * MiB, "model/checkpoints/m/model.safetensors")
    (repo / "model" / "checkpoints" / "m" / "model.safetensors").unlink()  # moved aside: no longer sent
    assert sent_bytes(repo)["tree"] == tracked - 3 * MiB
    assert sent_bytes(repo, ["nothing"])["missing_carry"] == ["nothing"]
    # what device_pack.sh --dry-run reports: the tree as if every tracked weight file were moved aside
    without = sent_bytes(repo, without=["model/checkpoints/*.safetensors"])
    assert without["tree"] == tracked - 3 * MiB - MiB


def _script(name: str, repo: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "scripts" / name), *args], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})}, timeout=120)


def test_pack_then_unpack_restore(repo, tmp_path):
    aside = tmp_path / "aside"
    weights = {p.relative_to(repo): p.read_bytes() for p in (repo / "model").rglob("*.safetensors")}
    r = _script("device_pack.sh", repo, "--data", "data/c", "--name-view", "2", "--aside", str(aside))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (repo / "device" / "data").iterdir()) == [
        "meta.json", "tokenizer.json", "train.bin", "train_names0.bin", "val.bin"]
    assert (repo / "device" / "data" / "train.bin").read_bytes() == (repo / "data" / "c" / "train.bin").read_bytes()
    assert not any((repo / p).exists() for p in weights) and all((aside / p).is_file() for p in weights)
    assert "fits" in r.stdout and "carry" in r.stdout and "device" in r.stdout
    tree = sent_bytes(repo)["tree"]
    assert f"{tree:,} bytes" in r.stdout  # the size printed is the tree without the weights
    # a second pack before the weights are back is refused: it would move nothing and lose track of them
    again = _script("device_pack.sh", repo, "--data", "data/c", "--aside", str(aside))
    assert again.returncode == 1 and "device_unpack.sh --restore" in again.stderr
    r = _script("device_unpack.sh", repo, "--restore", "--aside", str(aside))
    assert r.returncode == 0, r.stderr
    assert {p: (repo / p).read_bytes() for p in weights} == weights
    assert not aside.exists() or not any(aside.rglob("*"))
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True).stdout
    assert status.strip() == "?? notes.txt"  # the tree is as it was; device/ is ignored


def test_pack_refuses_more_than_a_call_sends_and_puts_the_weights_back(repo, tmp_path):
    with open(repo / "data" / "c" / "train.bin", "r+b") as f:
        f.truncate(SEND_LIMIT)  # sparse: 64 MiB on paper, with the rest the total is over
    aside = tmp_path / "aside"
    r = _script("device_pack.sh", repo, "--data", "data/c", "--aside", str(aside))
    assert r.returncode == 1
    assert "DOES NOT FIT" in r.stdout and "putting the weights back" in r.stderr
    assert (repo / "model" / "checkpoints" / "m" / "model.safetensors").stat().st_size == 3 * MiB
    assert subprocess.run(["git", "-C", str(repo), "ls-files", "--deleted"], capture_output=True, text=True).stdout == ""


@pytest.mark.acceptance  # over 5 s
def test_unpack_joins_the_parts_and_restores(repo, tmp_path):
    _, folder = _checkpoint(tmp_path, SMALL)
    parts = tmp_path / "files_at"
    split_checkpoint(folder, parts, max_part_bytes=1_100_000)
    (parts / "device.json").write_text('{"wall_s": 1}')
    aside = tmp_path / "aside"
    assert _script("device_pack.sh", repo, "--data", "data/c", "--aside", str(aside)).returncode == 0
    r = _script("device_unpack.sh", repo, str(parts), "out/dev", "--aside", str(aside), "--tokenizer", str(TOKENIZER))
    assert r.returncode == 0, r.stderr
    assert (repo / "model" / "checkpoints" / "m" / "model.safetensors").is_file()
    model, _ = load_folder(repo / "out" / "dev" / "checkpoint")
    assert model.cfg == SMALL and (repo / "out" / "dev" / "device.json").is_file()
    r = _script("device_unpack.sh", repo, str(parts), "out/dev", "--aside", str(aside), "--tokenizer", str(TOKENIZER))
    assert r.returncode != 0 and "already exists" in r.stderr  # never overwritten


# ---------------------------------------------------------------- the device's python

DEVICE_PACKAGES = {"torch", "numpy", "tokenizers", "safetensors", "tqdm", "jaxtyping"}  # what the GPU machine has


def test_what_train_and_device_import_is_on_the_device():
    model_dir = REPO / "model"
    seen, todo, third = set(), ["device", "train"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        tree = ast.parse((model_dir / f"{name}.py").read_text())
        for node in ast.walk(tree):  # function-level imports too: they run on the device as well
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                todo.append(node.module.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                third.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                third.update(a.name.split(".")[0] for a in node.names)
    third -= set(sys.stdlib_module_names) | {"__future__"}
    assert third <= DEVICE_PACKAGES, third - DEVICE_PACKAGES
    assert {"train", "device", "checkpoint", "evaluation", "run_state", "corpus"} <= seen


# ---------------------------------------------------------------- the whole script, tiny, on the CPU


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A small prepared corpus (prose-like text, the shipped tokenizer), as device_pack.sh would carry: the real
    data/large-names when it is prepared here, else one made from a folder of .txt files in a few seconds."""
    real = REPO / "data" / "large-names"
    if all((real / f).is_file() for f in ("train.bin", "val.bin", "meta.json", "tokenizer.json")):
        return real
    import random

    import sprout_model.prepare as prepare_mod

    src = tmp_path_factory.mktemp("txt")
    rng = random.Random(0)
    words = ("the ship came in and old Zorbin Plax was waiting on the pier while sailors tied ropes to the posts "
             "a man shook hands with him and they walked up the hill to the town where the market was").split()
    for i in range(24):
        (src / f"doc{i}.txt").write_text("\n\n".join(" ".join(rng.choices(words, k=120)) + "." for _ in range(30)))
    out = tmp_path_factory.mktemp("prepared")
    prepare_mod.prepare(str(src), out, val_fraction=0.25, seed=0, tokenizer=TOKENIZER)
    return out


@pytest.mark.acceptance
def test_train_on_device_script_end_to_end_on_cpu(tmp_path, corpus):
    data = corpus
    out = tmp_path / "OUT"
    out.mkdir()
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "train_on_device.sh"), "--cpu", "--preset", "tiny", "--steps", "12",
         "--data", str(data), "--copy-batch", "8", "--copy-seq", "64", "--text-batch", "4", "--text-seq", "128",
         "--final-windows", "8", "--margin-s", "4"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "OUT": str(out), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "sprout_model from" in r.stdout and "sprout-shim" in r.stdout  # imported through the link, as on the device
    names = sorted(p.name for p in out.iterdir())
    assert names == ["device.json", "log.txt", MANIFEST, "model-00001-of-00001.safetensors", "train.json"]
    assert check_out(out) == []
    report = json.loads((out / "device.json").read_text())
    copy, text = report["stages"]["copy"], report["stages"]["text"]
    assert set(report["stages"]) == {"copy", "text"}
    # --steps: each stage a fixed number of steps, nothing fitted to the clock
    assert copy["stopped"] == "max_steps" and copy["step"] == 12 and copy["own_tokens"] == 12 * 8 * 64
    assert text["stopped"] == "done" and text["step"] == 12 and text["own_tokens"] == 12 * 4 * 128 and text["fit"] is None
    assert report["final"]["val_loss"] > 0 and 0 < report["final"]["copy_ratio"] < 2
    dest = join_parts(out, tmp_path / "back")
    model, info = load_folder(dest)
    assert model.cfg.n_layer == 2 and info["args"]["sampler"] == "torch" and info["init_from"]["path"].endswith("copy")
    shutil.rmtree(tmp_path / "back")


@pytest.mark.acceptance
def test_a_failed_compile_trains_the_stage_again_eagerly(tmp_path, monkeypatch, capsys, corpus):
    data = corpus
    import sprout_model.train as train_mod
    from sprout_model.device import Recipe, run_recipe
    real, calls = train_mod.train, []

    def train(a, progress=True):
        calls.append(a.compile)
        if a.compile:
            raise RuntimeError("inductor: no working C++ compiler")  # what a broken toolchain looks like
        return real(a, progress)

    monkeypatch.setattr(train_mod, "train", train)
    report = run_recipe(Recipe(out=str(tmp_path / "out"), cpu=True, preset="tiny", compile=True, steps=4,
                               data=str(data), copy_batch=8, copy_seq=64, text_batch=4, text_seq=128, final_windows=4,
                               margin_s=3.0))
    assert calls == [True, False, False]  # the copy stage compiled, failed, ran eagerly; the text stage did not try
    assert "no working C++ compiler" in report["compile_failed"] and set(report["stages"]) == {"copy", "text"}
    assert "again without compiling" in capsys.readouterr().out
    assert (tmp_path / "out" / MANIFEST).is_file()


@pytest.mark.parametrize("steps", [0, -3, True, 2.5, "12"])
def test_a_step_budget_must_be_a_whole_number_of_steps(steps, tmp_path):
    from sprout_model.device import Recipe, run_recipe
    with pytest.raises(ValueError, match=r"--steps must be a whole number above 0 .*got"):
        run_recipe(Recipe(out=str(tmp_path / "out"), cpu=True, preset="tiny", steps=steps, data=str(tmp_path)))
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_parts_hold_only_tensors_the_model_has(tmp_path):
    _, folder = _checkpoint(tmp_path, SMALL)
    parts = tmp_path / "parts"
    manifest = split_checkpoint(folder, parts, max_part_bytes=1_100_000)
    f = parts / manifest["parts"][0]["file"]
    extra = {**load_file(str(f)), "stray": torch.zeros(1, dtype=torch.float16)}
    save_file(extra, str(f))
    manifest["parts"][0].update(bytes=f.stat().st_size, sha256=__import__("hashlib").sha256(f.read_bytes()).hexdigest())
    (parts / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(PartsError, match="other tensors"):
        join_parts(parts, tmp_path / "j")
