"""sprout_interp.load_checkpoint: every accepted input, and every user mistake with its message."""
from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from fixtures.files import make_tokenizer
from safetensors.torch import save_file
from tokenizers import Tokenizer, models

import sprout_interp as si
from sprout_interp.core import loading
from sprout_interp.core.configs import build_model, infer_config, strip_prefixes
from sprout_interp.core.loading import load_checkpoint
from sprout_model import GPT
from sprout_model.checkpoint import SHIPPED_DIR as REAL_SHIPPED_DIR
from sprout_model.checkpoint import save_checkpoint

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("no_shipped")]

TOKENS = torch.tensor([[1, 5, 9, 2, 33, 63, 0, 7, 7, 12]])


def logits(model: GPT) -> torch.Tensor:
    with torch.no_grad():
        return model(TOKENS)[0]


@pytest.fixture
def folder(tmp_path, tiny_model) -> Path:
    tok = make_tokenizer(tmp_path / "src" / "tokenizer.json")
    return save_checkpoint(tiny_model, tmp_path / "ckpt", tok, {"steps": 3, "val_loss": 4.5})


# --- what loads ----------------------------------------------------------------------------------


def test_folder_round_trip(folder, tiny_model):
    c = load_checkpoint(folder)
    assert isinstance(c, si.LoadedCheckpoint)
    assert torch.equal(logits(c.model), logits(tiny_model))
    assert c.info == {"steps": 3, "val_loss": 4.5}
    assert c.name == "ckpt" and c.source == str(folder.resolve())
    assert c.tokenizer.get_vocab_size() == 64
    assert not c.model.training
    assert c.model.cfg == tiny_model.cfg
    assert c.model.head.weight is c.model.embed.weight


def test_16bit_folder_loads_as_float32(tmp_path, tiny_model):
    tok = make_tokenizer(tmp_path / "tokenizer.json")
    f = save_checkpoint(tiny_model, tmp_path / "half", tok, {}, dtype=torch.bfloat16)
    c = load_checkpoint(f)
    assert all(p.dtype == torch.float32 for p in c.model.parameters())
    assert torch.allclose(logits(c.model), logits(tiny_model), atol=0.05)
    assert c.info == {}


def test_a_file_inside_a_folder_means_the_folder(folder):
    assert load_checkpoint(folder / "config.json").source == str(folder.resolve())


def test_standalone_safetensors_infers_config(tmp_path, tiny_model):
    make_tokenizer(tmp_path / "tokenizer.json")
    sd = {k: v for k, v in tiny_model.state_dict().items() if k != "head.weight"}
    save_file(sd, str(tmp_path / "weights.safetensors"))
    c = load_checkpoint(tmp_path / "weights.safetensors")
    assert c.model.cfg == dataclasses.replace(tiny_model.cfg, context=512)
    assert torch.equal(logits(c.model), logits(tiny_model))
    assert c.name == "weights"


@pytest.mark.parametrize("prefix", ["", "_orig_mod.", "module.", "module._orig_mod."])
@pytest.mark.parametrize("wrapper", [None, "model", "state_dict"])
def test_course_pt_round_trips(tmp_path, tiny_model, prefix, wrapper):
    sd = {prefix + k: v for k, v in tiny_model.state_dict().items()}
    assert "head.weight" in tiny_model.state_dict()  # a course state dict holds both tied names
    obj = sd if wrapper is None else {wrapper: sd, "step": 7}
    make_tokenizer(tmp_path / "tokenizer.json")
    torch.save(obj, tmp_path / "course.pt")
    c = load_checkpoint(tmp_path / "course.pt")
    assert torch.equal(logits(c.model), logits(tiny_model))
    assert c.model.cfg == dataclasses.replace(tiny_model.cfg, context=512)  # inferred; context not in the weights
    assert c.model.head.weight is c.model.embed.weight
    assert c.name == "course"
    assert c.info == ({} if wrapper is None else {"step": 7})


def test_raw_dict_without_head_gets_it_tied(tmp_path, tiny_model):
    sd = {k: v for k, v in tiny_model.state_dict().items() if k != "head.weight"}
    make_tokenizer(tmp_path / "tokenizer.json")
    torch.save(sd, tmp_path / "nohead.pth")
    c = load_checkpoint(tmp_path / "nohead.pth")
    assert c.model.head.weight is c.model.embed.weight
    assert torch.equal(logits(c.model), logits(tiny_model))


def test_config_dict_wins_over_defaults(tmp_path, tiny_model):
    make_tokenizer(tmp_path / "tokenizer.json")
    torch.save({"model": tiny_model.state_dict(), "config": tiny_model.cfg.to_dict()}, tmp_path / "c.pt")
    c = load_checkpoint(tmp_path / "c.pt")
    assert c.model.cfg == tiny_model.cfg  # context 32 from the config, not the default 512
    assert c.model.cfg.context == 32


def test_partial_config_fills_in_from_shapes(tmp_path, tiny_model):
    make_tokenizer(tmp_path / "tokenizer.json")
    torch.save({"model": tiny_model.state_dict(), "config": {"context": 24, "rope_base": 500.0}}, tmp_path / "c.pt")
    cfg = load_checkpoint(tmp_path / "c.pt").model.cfg
    assert cfg == dataclasses.replace(tiny_model.cfg, context=24, rope_base=500.0)


@dataclasses.dataclass
class CourseConfig:
    """Stands for a course notebook's own Config dataclass; its methods must never run on load."""

    vocab_size: int = 64
    context: int = 32
    n_layer: int = 2
    n_head: int = 2
    d_model: int = 16
    d_ff: int = 24
    rope_base: float = 10000.0
    marker: str = ""

    def __setstate__(self, state):  # would run if the real class were used to unpickle
        Path(state["marker"]).write_text("ran")
        self.__dict__.update(state)


def test_config_object_is_read_without_running_its_class(tmp_path, tiny_model):
    marker = tmp_path / "setstate_ran"
    make_tokenizer(tmp_path / "tokenizer.json")
    torch.save({"model": tiny_model.state_dict(), "config": CourseConfig(context=20, marker=str(marker))}, tmp_path / "c.pt")
    c = load_checkpoint(tmp_path / "c.pt")
    assert c.model.cfg == dataclasses.replace(tiny_model.cfg, context=20)
    assert torch.equal(logits(c.model), logits(tiny_model))
    assert not marker.exists()


def test_our_config_object_loads(tmp_path, tiny_model):
    make_tokenizer(tmp_path / "tokenizer.json")
    torch.save({"state_dict": tiny_model.state_dict(), "config": tiny_model.cfg}, tmp_path / "c.pt")
    assert load_checkpoint(tmp_path / "c.pt").model.cfg == tiny_model.cfg


def test_infer_config_from_shapes():
    cfg = tiny_config(n_layer=3, n_head=4, d_model=32, d_ff=40, vocab_size=50)
    sd = GPT(cfg).state_dict()
    assert infer_config(sd) == dataclasses.replace(cfg, context=512, rope_base=10000.0)
    assert infer_config(strip_prefixes({"module." + k: v for k, v in sd.items()})).n_head == 4


def test_strip_prefixes():
    assert list(strip_prefixes({"module._orig_mod.embed.weight": 1, "_orig_mod.norm.weight": 2, "norm2": 3})) == [
        "embed.weight", "norm.weight", "norm2"]


def test_top_level_exports():
    assert si.load is si.load_hooked  # the notebook entry point returns the hooked wrapper
    for cls in (si.CheckpointNotFoundError, si.NotACheckpointError, si.UnsafeCheckpointError,
                si.StateDictMismatchError, si.VocabularyMismatchError, si.ContextLengthError,
                si.HookNameError, si.TokenizationError):
        assert issubclass(cls, si.SproutError)


# --- the tokenizer -------------------------------------------------------------------------------


def test_explicit_tokenizer_wins(folder, tmp_path):
    other = make_tokenizer(tmp_path / "other" / "tokenizer.json", vocab=64)
    c = load_checkpoint(folder, tokenizer=other)
    assert c.tokenizer.token_to_id("t5") == 5 and not c.warnings and "warnings" not in c.info  # the same as its own
    c2 = load_checkpoint(folder, tokenizer=other.parent)  # a folder holding one
    assert c2.tokenizer.get_vocab_size() == 64
    tok = Tokenizer.from_file(str(other))
    assert load_checkpoint(folder, tokenizer=tok).tokenizer is tok


def test_tokenizer_from_the_folder_above(tmp_path, tiny_model):
    make_tokenizer(tmp_path / "shared" / "tokenizer.json")
    f = save_checkpoint(tiny_model, tmp_path / "shared" / "gpt-x", None, {})
    assert not (f / "tokenizer.json").exists()
    c = load_checkpoint(f)
    assert c.tokenizer.get_vocab_size() == 64 and not c.warnings


def test_weights_without_their_own_tokenizer_are_refused(tmp_path, tiny_model, no_shipped):
    """Never the shipped tokenizer silently: the same size with other merges would mean other words."""
    make_tokenizer(no_shipped / "tokenizer.json")
    (tmp_path / "deep" / "er").mkdir(parents=True)
    torch.save(tiny_model.state_dict(), tmp_path / "deep" / "er" / "m.pt")
    with pytest.raises(si.CheckpointNotFoundError) as e:
        load_checkpoint(tmp_path / "deep" / "er" / "m.pt")
    msg = str(e.value)
    assert "no tokenizer.json beside the weights" in msg and "tokenizer=" in msg
    assert str(no_shipped / "tokenizer.json") in msg  # says where the shipped one is, without assuming it


def test_a_tokenizer_passed_for_weights_without_one_loads_with_a_warning(tmp_path, tiny_model, no_shipped):
    tok = make_tokenizer(no_shipped / "tokenizer.json")
    (tmp_path / "deep" / "er").mkdir(parents=True)
    torch.save(tiny_model.state_dict(), tmp_path / "deep" / "er" / "m.pt")
    c = load_checkpoint(tmp_path / "deep" / "er" / "m.pt", tokenizer=tok)
    assert len(c.warnings) == 1 and "could not be checked against the weights" in c.warnings[0]
    assert c.info["warnings"] == c.warnings  # kept where HookedSprout.info and the dashboard see it
    assert si.load(tmp_path / "deep" / "er" / "m.pt", tokenizer=tok).info["warnings"] == c.warnings


def test_a_tokenizer_other_than_its_own_loads_with_a_warning(folder, tmp_path):
    other = Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)}, unk_token="w0"))
    c = load_checkpoint(folder, tokenizer=other)
    assert c.tokenizer is other and "differs from the tokenizer.json beside the weights" in c.warnings[0]


def test_no_tokenizer_anywhere(tmp_path, tiny_model):
    (tmp_path / "a" / "b").mkdir(parents=True)
    torch.save(tiny_model.state_dict(), tmp_path / "a" / "b" / "m.pt")
    with pytest.raises(si.CheckpointNotFoundError, match="tokenizer") as e:
        load_checkpoint(tmp_path / "a" / "b" / "m.pt")
    assert "tokenizer=" in str(e.value)


def test_missing_explicit_tokenizer(folder, tmp_path):
    with pytest.raises(si.CheckpointNotFoundError, match="no tokenizer at"):
        load_checkpoint(folder, tokenizer=tmp_path / "nope.json")


def test_vocabulary_mismatch(folder, tmp_path):
    small = make_tokenizer(tmp_path / "small" / "tokenizer.json", vocab=50)
    with pytest.raises(si.VocabularyMismatchError) as e:
        load_checkpoint(folder, tokenizer=small)
    assert "50 tokens" in str(e.value) and "vocabulary of 64" in str(e.value)
    assert "tokenizer=" in str(e.value)


def test_vocabulary_mismatch_says_the_tokenizer_was_not_its_own(tmp_path, tiny_model, no_shipped):
    shipped = make_tokenizer(no_shipped / "tokenizer.json", vocab=8192)
    (tmp_path / "x" / "y").mkdir(parents=True)
    torch.save(tiny_model.state_dict(), tmp_path / "x" / "y" / "m.pt")
    with pytest.raises(si.VocabularyMismatchError) as e:
        load_checkpoint(tmp_path / "x" / "y" / "m.pt", tokenizer=shipped)
    assert "8,192" in str(e.value) and "64" in str(e.value) and "could not be checked" in str(e.value)


# --- shipped names -------------------------------------------------------------------------------


def test_shipped_name_resolution(tiny_model, no_shipped):
    make_tokenizer(no_shipped / "tokenizer.json")  # one tokenizer shared by all shipped folders
    save_checkpoint(tiny_model, no_shipped / "gpt-4", None, {"preset": "gpt-4"})
    for spelling in ("gpt-4", "GPT-4", " Gpt-4 "):
        c = load_checkpoint(spelling)
        assert c.name == "gpt-4" and c.source == str(no_shipped / "gpt-4") and c.info == {"preset": "gpt-4"}
        assert not c.warnings
    assert torch.equal(logits(c.model), logits(tiny_model))


def test_shipped_name_not_installed(no_shipped):
    with pytest.raises(si.CheckpointNotFoundError) as e:
        load_checkpoint("sprout")
    msg = str(e.value)
    assert "'sprout' is not installed" in msg and "--preset sprout" in msg and str(no_shipped / "sprout") in msg


# --- mistakes ------------------------------------------------------------------------------------


def test_missing_path_lists_the_shipped_names(tmp_path):
    with pytest.raises(si.CheckpointNotFoundError) as e:
        load_checkpoint(tmp_path / "nothing_here.pt")
    msg = str(e.value)
    assert "nothing_here.pt" in msg and "gpt-1, gpt-4, sprout" in msg
    assert isinstance(e.value, FileNotFoundError)


def test_misspelt_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(si.CheckpointNotFoundError, match="'gpt4'.*gpt-1, gpt-4, sprout"):
        load_checkpoint("gpt4")


@pytest.mark.parametrize("drop", ["config.json", "model.safetensors"])
def test_folder_missing_a_file(folder, drop):
    (folder / drop).unlink()
    with pytest.raises(si.NotACheckpointError) as e:
        load_checkpoint(folder)
    assert f"has no {drop}" in str(e.value) and "not a Sprout checkpoint" in str(e.value)


def test_run_folder_points_to_its_checkpoint(tmp_path, tiny_model):
    save_checkpoint(tiny_model, tmp_path / "run" / "checkpoint", make_tokenizer(tmp_path / "tokenizer.json"), {})
    with pytest.raises(si.NotACheckpointError, match=r"pass .*run/checkpoint"):
        load_checkpoint(tmp_path / "run")


def test_folder_of_pt_files_suggests_them(tmp_path, tiny_model):
    torch.save(tiny_model.state_dict(), tmp_path / "epoch3.pt")
    with pytest.raises(si.NotACheckpointError, match=r"epoch3\.pt: pass one of them"):
        load_checkpoint(tmp_path)


def test_corrupt_config_json(folder):
    (folder / "config.json").write_text("{not json")
    with pytest.raises(si.NotACheckpointError, match="config.json is not valid JSON"):
        load_checkpoint(folder)


def test_corrupt_safetensors(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 3])
    with pytest.raises(si.NotACheckpointError, match="cannot be read as safetensors") as e:
        load_checkpoint(folder)
    assert "damaged" in str(e.value)


@pytest.mark.parametrize(
    "content",
    [b"hello world, this is a text file and not a checkpoint\n", b"", bytes(range(256)) * 8],
    ids=["text", "empty", "binary"],
)
def test_file_that_is_not_a_checkpoint(tmp_path, content):
    p = tmp_path / "notes.pt"
    p.write_bytes(content)
    with pytest.raises(si.NotACheckpointError) as e:
        load_checkpoint(p)
    assert "is not a checkpoint torch can read" in str(e.value) and "torch.save" in str(e.value)


def test_truncated_pt(tmp_path, tiny_model):
    torch.save({"model": tiny_model.state_dict()}, tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(si.NotACheckpointError, match="not a checkpoint torch can read.*fetch it again"):
        load_checkpoint(tmp_path / "cut.pt")


@pytest.mark.parametrize("obj", [torch.zeros(3), [1, 2, 3], {"epoch": 3, "lr": 0.1}], ids=["tensor", "list", "no-weights"])
def test_pt_holding_something_else(tmp_path, obj):
    torch.save(obj, tmp_path / "x.pt")
    with pytest.raises(si.NotACheckpointError, match="torch.save") as e:
        load_checkpoint(tmp_path / "x.pt")
    if isinstance(obj, dict):
        assert "'epoch'" in str(e.value)


class Payload:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("how", ["torch.save", "torch.save-legacy", "pickle-2", "pickle-5"])
def test_malicious_pickle_is_refused_and_never_run(tmp_path, tiny_model, how):
    marker = tmp_path / "PWNED"
    p = tmp_path / "evil.pt"
    obj = {"model": tiny_model.state_dict(), "extra": Payload(marker)} if how.startswith("torch") else Payload(marker)
    if how == "torch.save":
        torch.save(obj, p)
    elif how == "torch.save-legacy":
        torch.save(obj, p, _use_new_zipfile_serialization=False)
    else:
        with open(p, "wb") as f:
            pickle.dump(obj, f, protocol=int(how[-1]))
    assert not marker.exists()
    with pytest.raises(si.UnsafeCheckpointError) as e:
        load_checkpoint(p)
    assert not marker.exists(), "the payload ran"
    msg = str(e.value)
    assert "refused" in msg and "not executed" in msg and "weights_only=True" in msg
    assert "open" in msg  # names what it would have called


def test_training_state_file_points_to_the_checkpoint(tmp_path, tiny_model):
    import numpy as np

    save_checkpoint(tiny_model, tmp_path / "run" / "checkpoint", make_tokenizer(tmp_path / "tokenizer.json"), {})
    torch.save({"model": tiny_model.state_dict(), "rng": np.random.get_state()}, tmp_path / "run" / "state.pt")
    with pytest.raises(si.UnsafeCheckpointError, match=r"numpy.*load the checkpoint folder beside it"):
        load_checkpoint(tmp_path / "run" / "state.pt")


def test_missing_keys(tmp_path, tiny_model):
    sd = tiny_model.state_dict()
    del sd["blocks.1.ffn.w2.weight"], sd["blocks.1.norm2.weight"]
    torch.save({"model": sd, "config": tiny_model.cfg.to_dict()}, tmp_path / "m.pt")
    with pytest.raises(si.StateDictMismatchError) as e:
        load_checkpoint(tmp_path / "m.pt", tokenizer=make_tokenizer(tmp_path / "t.json"))
    msg = str(e.value)
    assert "missing 2 key(s)" in msg and "blocks.1.ffn.w2.weight" in msg and "blocks.1.norm2.weight" in msg
    assert "n_layer=2" in msg


def test_unexpected_keys(tmp_path, tiny_model):
    sd = dict(tiny_model.state_dict())
    sd["blocks.0.attn.qkv.bias"] = torch.zeros(48)
    sd["lm_head.extra"] = torch.zeros(2)
    torch.save(sd, tmp_path / "m.pt")
    with pytest.raises(si.StateDictMismatchError) as e:
        load_checkpoint(tmp_path / "m.pt", tokenizer=make_tokenizer(tmp_path / "t.json"))
    msg = str(e.value)
    assert "unexpected 2 key(s)" in msg and "blocks.0.attn.qkv.bias" in msg and "lm_head.extra" in msg


def test_many_missing_keys_are_abbreviated(tmp_path, tiny_model):
    sd = {k: v for k, v in tiny_model.state_dict().items() if not k.startswith("blocks.1.")}
    torch.save({"model": sd, "config": tiny_model.cfg.to_dict()}, tmp_path / "m.pt")
    with pytest.raises(si.StateDictMismatchError, match=r"missing 9 key\(s\): .*\(and 4 more\)"):
        load_checkpoint(tmp_path / "m.pt", tokenizer=make_tokenizer(tmp_path / "t.json"))


def test_not_a_sprout_state_dict(tmp_path):
    torch.save({"fc.weight": torch.zeros(3, 3), "fc.bias": torch.zeros(3)}, tmp_path / "mlp.pt")
    with pytest.raises(si.StateDictMismatchError, match=r"lack embed\.weight.*fc\.bias, fc\.weight"):
        load_checkpoint(tmp_path / "mlp.pt", tokenizer=make_tokenizer(tmp_path / "t.json"))


def test_shape_mismatch_names_key_and_both_shapes(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["d_ff"] = 32  # the weights have 24
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(si.StateDictMismatchError) as e:
        load_checkpoint(folder)
    msg = str(e.value)
    assert "blocks.0.ffn.w1.weight has shape (24, 16) in the file but (32, 16)" in msg
    assert "and 5 more mismatched tensors" in msg  # w1, w3, w2 of both blocks
    assert "config.json" in msg


def test_untied_head_is_refused(tmp_path, tiny_model):
    sd = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    sd["head.weight"] += 1.0
    torch.save(sd, tmp_path / "untied.pt")
    with pytest.raises(si.StateDictMismatchError, match="without weight tying"):
        load_checkpoint(tmp_path / "untied.pt", tokenizer=make_tokenizer(tmp_path / "t.json"))


def test_build_model_accepts_a_config():
    cfg = tiny_config()
    src = GPT(cfg)
    m = build_model(src.state_dict(), cfg)
    assert m.cfg == cfg and torch.equal(logits(m), logits(src.eval()))


# --- the real shipped checkpoints ----------------------------------------------------------------

SHIPPED_PARAMS = {"gpt-1": 2_015_936, "gpt-4": 3_344_576, "sprout": 17_309_056}


@pytest.mark.integration
@pytest.mark.parametrize("name", list(SHIPPED_PARAMS))
def test_shipped_checkpoint_loads(name, monkeypatch):
    if not (REAL_SHIPPED_DIR / name).is_dir():
        pytest.skip(f"{REAL_SHIPPED_DIR / name} is not there yet")
    monkeypatch.setattr(loading, "SHIPPED_DIR", REAL_SHIPPED_DIR)
    c = si.load_checkpoint(name.upper())
    assert c.name == name and c.source == str(REAL_SHIPPED_DIR / name)
    assert c.model.num_params() == SHIPPED_PARAMS[name]
    assert c.model.cfg.vocab_size == c.tokenizer.get_vocab_size() == 8192
    assert all(p.dtype == torch.float32 for p in c.model.parameters()) and not c.model.training
    assert not c.warnings and "warnings" not in c.info  # the tokenizer shared beside the shipped folders
    assert c.info["tokens_seen"] > 0 and c.info["val_loss"] > 0
    ids = c.tokenizer.encode("The old man came home.").ids
    with torch.no_grad():
        out, loss = c.model(torch.tensor([ids[:-1]]), torch.tensor([ids[1:]]))
    assert torch.isfinite(out).all() and loss.item() < 9.0  # below the uniform 9.01 nats of an untrained model
