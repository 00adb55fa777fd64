"""Hostile artefacts: weights files whose tensors ask for more than they store, and tuned-lens and SAE folders held
to the checkpoint's rules.

One mechanism covers every artefact: ``core.files.read_json`` (bounded size, an object), ``core.loading.
read_safetensors`` (dtypes and shapes checked from the header before anything is read),
``core.configs.check_tensors`` (dense floating-point tensors that store every value they show, nothing allocated)
and ``core.configs.check_finite``. Each input gets a typed :class:`SproutError`; the ones that would cost
gigabytes run in a subprocess whose peak memory is counted. The hostile files are built here, in temporary
folders.
"""
from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from fixtures.files import make_tokenizer, refused
from safetensors.torch import save_file
from tokenizers import Tokenizer, models

from sprout_interp.core import errors, limits
from sprout_interp.core.configs import expected_shapes
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.core.loading import load_checkpoint
from sprout_interp.features.sae import SAE_CFG, SAE_WEIGHTS, SparseAutoencoder, load_sae, read_sae, save_sae
from sprout_interp.lens.tuned_lens import LENS_INFO, LENS_WEIGHTS, TunedLens, load_tuned_lens, save_tuned_lens
from sprout_model import GPT
from sprout_model.model import Config

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def state_dict(model: GPT, **changes: torch.Tensor) -> dict[str, torch.Tensor]:
    sd = {k: v.clone() for k, v in model.state_dict().items() if k != "head.weight"}
    sd.update(changes)
    return sd


def save_pt(path: Path, sd: dict, cfg: Config | None = None, legacy: bool = False) -> Path:
    make_tokenizer(path.parent / "tokenizer.json")
    obj = {"model": sd, "config": cfg.to_dict()} if cfg is not None else sd
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    return path


# --- A. tensors that show more values than the file stores --------------------------------------------------


def _repeating(kind: str, model: GPT) -> dict[str, torch.Tensor]:
    """The tiny model's state dict with one way of showing more values than are stored."""
    sd = state_dict(model)
    shape = sd["embed.weight"].shape
    if kind == "expand":
        sd["embed.weight"] = torch.zeros(1).expand(*shape)
    elif kind == "as_strided stride 0":
        sd["embed.weight"] = torch.as_strided(torch.ones(4), shape, (0, 0))
    elif kind == "overlapping rows":  # every row starts one value after the last: n + d - 1 values shown n * d times
        n, d = shape
        sd["embed.weight"] = torch.as_strided(torch.randn(n + d - 1), shape, (1, 1))
    elif kind == "one tensor for every layer":
        w1 = sd["blocks.0.ffn.w1.weight"]
        sd["blocks.1.ffn.w1.weight"] = w1  # saved once, shown twice: every layer could share one storage
    return sd


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("kind, words", [
    ("expand", ["embed.weight", "(64, 16)", "1 stored value", "repeats values"]),
    ("as_strided stride 0", ["embed.weight", "4 stored value", "strides (0, 0)"]),
    ("overlapping rows", ["embed.weight", "79 stored value", "strides (1, 1)"]),
    ("one tensor for every layer", ["views of the same stored values", "blocks.0.ffn.w1.weight", "blocks.1.ffn.w1.weight"]),
])
def test_views_that_show_more_values_than_are_stored_are_refused(tmp_path, tiny_model, kind, words, legacy):
    p = save_pt(tmp_path / "m.pt", _repeating(kind, tiny_model), tiny_model.cfg, legacy)
    refused(errors.InvalidWeightsError, "m.pt", *words, call=lambda: load_checkpoint(p))


def test_the_tied_head_saved_as_the_embedding_itself_still_loads(tmp_path, tiny_model):
    sd = dict(tiny_model.state_dict())
    assert sd["head.weight"] is sd["embed.weight"] or sd["head.weight"].data_ptr() == sd["embed.weight"].data_ptr()
    p = save_pt(tmp_path / "m.pt", sd, tiny_model.cfg)
    loaded = load_checkpoint(p).model
    assert torch.equal(loaded.embed.weight, tiny_model.embed.weight) and loaded.head.weight is loaded.embed.weight


def test_a_sliced_storage_still_loads(tmp_path, tiny_model):
    """A view of part of a bigger storage shows fewer values than are stored: nothing to refuse."""
    sd = state_dict(tiny_model)
    big = torch.cat([sd["norm.weight"], torch.zeros(100)])
    sd["norm.weight"] = big[:16]
    p = save_pt(tmp_path / "m.pt", sd, tiny_model.cfg)
    assert torch.equal(load_checkpoint(p).model.norm.weight, tiny_model.norm.weight)


@pytest.mark.parametrize("kind, words", [
    ("meta", ["meta tensor", "no values"]),
    ("sparse_coo", ["sparse_coo tensor", "to_dense()"]),
    ("sparse_csr", ["sparse_csr tensor", "to_dense()"]),
])
def test_meta_and_sparse_tensors_are_refused(tmp_path, tiny_model, kind, words):
    w = tiny_model.state_dict()["norm.weight"].reshape(4, 4)
    bad = {"meta": torch.empty(16, device="meta"), "sparse_coo": w.to_sparse(),
           "sparse_csr": w.to_sparse_csr()}[kind]
    p = save_pt(tmp_path / "m.pt", state_dict(tiny_model, **{"norm.weight": bad}), tiny_model.cfg)
    refused(errors.InvalidWeightsError, "norm.weight", *words, call=lambda: load_checkpoint(p))


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod."])
def test_a_key_and_its_prefixed_twin_are_refused_not_deduplicated(tmp_path, tiny_model, prefix):
    sd = state_dict(tiny_model)
    sd[prefix + "norm.weight"] = torch.ones(16)  # another value: which one is meant cannot be told
    p = save_pt(tmp_path / "m.pt", sd, tiny_model.cfg)
    refused(errors.StateDictMismatchError, "'norm.weight'", f"'{prefix}norm.weight'", "cannot be told",
            call=lambda: load_checkpoint(p))
    save_file(sd, str(tmp_path / "m.safetensors"))  # the safetensors header goes through the same function
    refused(errors.StateDictMismatchError, f"'{prefix}norm.weight'", call=lambda: load_checkpoint(tmp_path / "m.safetensors"))


def test_compressed_storage_records_are_refused(tmp_path, tiny_model):
    """A deflated record of zeros: a 1 MB file that torch would unpack to 64 MB (or any size) before reading it."""
    buf = io.BytesIO()
    big = torch.zeros(16 << 20)
    torch.save({"model": state_dict(tiny_model), "pad": big}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    p = tmp_path / "m.pt"
    make_tokenizer(tmp_path / "tokenizer.json")
    with zipfile.ZipFile(p, "w") as out:
        for info in src.infolist():
            out.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    assert p.stat().st_size < 1 << 20
    refused(errors.NotACheckpointError, "unpack to", "more than the", "compressed", call=lambda: load_checkpoint(p))


# --- B. tuned lens and SAE folders: the checkpoint's rules ---------------------------------------------------


@pytest.fixture
def model(tiny_model, tmp_path) -> HookedSprout:
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(64)}, unk_token="t0"))
    return HookedSprout(tiny_model, tokenizer=tok, name="tiny", source=str(tmp_path))


@pytest.fixture
def lens_dir(model, tmp_path) -> Path:
    lens = TunedLens.for_model(model)
    with torch.no_grad():
        for t in lens.translators:
            t.weight.normal_(0, 0.01)
    save_tuned_lens(lens, tmp_path)
    return tmp_path


@pytest.fixture
def sae_dir(model, tmp_path) -> Path:
    return save_sae(SparseAutoencoder.for_model(model, 1, d_sae=32, k=4), tmp_path / "sae")


def _edit_weights(path: Path, key: str, change) -> None:
    from safetensors.torch import load_file

    sd = load_file(str(path))
    sd[key] = change(sd[key].clone())
    save_file(sd, str(path))


def _edit_json(path: Path, change) -> None:
    d = json.loads(path.read_text())
    path.write_text(json.dumps(change(d)))


def _poison(value: float):
    def put(t: torch.Tensor) -> torch.Tensor:
        t.view(-1)[1] = value
        return t
    return put


@pytest.mark.parametrize("value, word", [(math.nan, "NaN"), (math.inf, "infinite"), (-math.inf, "infinite")])
def test_non_finite_lens_and_sae_weights_are_refused(model, lens_dir, sae_dir, value, word):
    _edit_weights(lens_dir / LENS_WEIGHTS, "translators.1.weight", _poison(value))
    refused(errors.InvalidWeightsError, "translators.1.weight", "1 NaN or infinite", LENS_WEIGHTS,
            call=lambda: load_tuned_lens(model))
    _edit_weights(sae_dir / SAE_WEIGHTS, "W_dec", _poison(value))
    refused(errors.InvalidWeightsError, "W_dec", "1 NaN or infinite", SAE_WEIGHTS, call=lambda: load_sae(model, 1, sae_dir))
    refused(errors.InvalidWeightsError, "W_dec", call=lambda: read_sae(sae_dir))


def test_lens_and_sae_json_are_size_capped_like_config_json(model, lens_dir, sae_dir, monkeypatch):
    _edit_json(lens_dir / LENS_INFO, lambda d: {**d, "pad": "x" * 50_000})
    _edit_json(sae_dir / SAE_CFG, lambda d: {**d, "pad": "x" * 50_000})
    monkeypatch.setattr(limits, "MAX_JSON_BYTES", 40_000)
    refused(errors.TunedLensMismatchError, LENS_INFO, "more than", "40,000", call=lambda: load_tuned_lens(model))
    refused(errors.SAEMismatchError, SAE_CFG, "more than", "40,000", call=lambda: read_sae(sae_dir))
    monkeypatch.setattr(limits, "MAX_JSON_BYTES", 16 << 20)  # the default: both load again
    assert load_tuned_lens(model).n_layers == 2 and read_sae(sae_dir).d_sae == 32


@pytest.mark.parametrize("text, words", [
    ("[1, 2]", ["JSON list, not an object"]),
    ('"lens"', ["JSON str, not an object"]),
    ("{not json", ["not valid JSON"]),
])
def test_lens_and_sae_json_that_is_not_an_object_is_refused(model, lens_dir, sae_dir, text, words):
    (lens_dir / LENS_INFO).write_text(text)
    refused(errors.TunedLensMismatchError, "cannot be read", *words, call=lambda: load_tuned_lens(model))
    (sae_dir / SAE_CFG).write_text(text)
    refused(errors.SAEMismatchError, "cannot be read", *words, call=lambda: read_sae(sae_dir))


@pytest.mark.parametrize("fp, shown", [([1, 2], "list"), ("sha", "str"), (7, "int"), ({"config": [1]}, "dict"),
                                       ({"config": {}, "weights_sha256": 5}, "dict")])
def test_a_fingerprint_that_is_not_an_object_is_refused(model, lens_dir, sae_dir, fp, shown):
    _edit_json(lens_dir / LENS_INFO, lambda d: {**d, "fingerprint": fp})
    refused(errors.TunedLensMismatchError, "damaged", "fingerprint", f"({shown})", call=lambda: load_tuned_lens(model))
    _edit_json(sae_dir / SAE_CFG, lambda d: {**d, "sprout": {**d["sprout"], "fingerprint": fp}})
    refused(errors.SAEMismatchError, "damaged", "fingerprint", f"({shown})", call=lambda: load_sae(model, 1, sae_dir))


@pytest.mark.parametrize("entry, value, words", [
    ("d_sae", 1_500_000, ["W_enc", "(16, 1500000)"]),  # checked against the header; nothing allocated first
    ("d_in", 4096, ["(4096, 32)"]),
    ("d_sae", "32", ["d_sae", "'32' (str)", "whole number"]),
    ("d_sae", 32.0, ["d_sae", "(float)"]),
    ("d_sae", True, ["d_sae", "(bool)"]),
    ("d_in", -16, ["d_in", "at least 1"]),
    ("k", None, ["k", "(NoneType)"]),
    ("k", 33, ["k must be between 1 and d_sae (32)"]),
    ("metadata", [1], ["metadata", "an object"]),
    ("hook_name", 3, ["hook_name", "(int)"]),
    ("architecture", "jumprelu", ["'jumprelu' SAE"]),
])
def test_sae_cfg_values_are_checked_before_anything_is_allocated(sae_dir, entry, value, words):
    def change(d):
        d[entry] = value
        if entry == "hook_name":
            d["metadata"]["hook_name"] = value
        return d
    _edit_json(sae_dir / SAE_CFG, change)
    refused(errors.SAEMismatchError, *words, call=lambda: read_sae(sae_dir))


def test_a_lens_file_of_other_shapes_is_refused_from_its_header(model, lens_dir):
    save_file({"translators.0.weight": torch.zeros(4096, 4096, dtype=torch.float16)}, str(lens_dir / LENS_WEIGHTS))
    refused(errors.TunedLensMismatchError, "other names or shapes", "(4096, 4096)", call=lambda: load_tuned_lens(model))


@pytest.mark.unchecked_types  # wrong types on purpose, to see the library's own message
@pytest.mark.parametrize("folder", [123, 1.5, True, None, b"/tmp", ["a"], ""])
def test_a_folder_that_is_not_a_path_is_refused(model, folder):
    if folder is not None:
        refused(errors.NotAPathError, "folder", call=lambda: load_tuned_lens(model, folder))
        refused(errors.NotAPathError, "folder", call=lambda: read_sae(folder))
    refused(errors.NotAPathError, "folder", call=lambda: load_sae(model, folder=folder if folder is not None else 7))


@pytest.mark.unchecked_types  # wrong types on purpose, to see the library's own message
@pytest.mark.parametrize("layer", ["1", 1.5, 1.0, True, False, -1, 2, [1]])
def test_load_sae_refuses_a_layer_that_is_not_a_layer(model, sae_dir, layer):
    """Never read as layer 1 (or 0): the SAE beside the checkpoint is not looked for at all."""
    (Path(model.source) / "saes").mkdir()
    sae_dir.rename(Path(model.source) / "saes" / "blocks.1.hook_resid_post")
    msg = refused(errors.ArgumentError, "layer", "0..1", call=lambda: load_sae(model, layer))
    assert repr(layer)[:10] in msg or str(layer) in msg
    assert load_sae(model, 1).layer == 1  # the real one is there


# --- the memory a refusal costs, counted in a subprocess -----------------------------------------------------


COUNT = textwrap.dedent("""
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a regression fails, it does not fill the machine
    import sprout_interp as si
    from sprout_interp.features.sae import read_sae

    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # bytes on Linux

    si.load_checkpoint(sys.argv[1])  # warm up: every lazy import and buffer an ordinary load needs
    read_sae(sys.argv[2])
    out = {"before": peak()}
    for kind, path in (("pt", sys.argv[3]), ("sae", sys.argv[4])):
        try:
            si.load_checkpoint(path) if kind == "pt" else read_sae(path)
            out[kind] = "loaded"
        except BaseException as e:
            out[kind] = type(e).__name__ + ": " + str(e)[:300]
    out["after"] = peak()
    print(json.dumps(out), flush=True)
""")


@pytest.mark.acceptance  # over 3 s
def test_a_few_kb_asking_for_gigabytes_is_refused_without_allocating_them(tmp_path, tiny_model, model):
    """A 3 KB .pt of zero-stride views claiming a 3 GiB model, and a cfg.json claiming d_sae 1,500,000 (2.3 GiB of
    float32 at d_in 384) beside a 2 KB weights file: each refused with its typed error while the process's
    peak memory grows by less than 64 MiB (the old loader built 4.7 GiB for each first)."""
    ok = save_pt(tmp_path / "ok" / "m.pt", state_dict(tiny_model), tiny_model.cfg)
    ok_sae = save_sae(SparseAutoencoder.for_model(model, 0, d_sae=32, k=4), tmp_path / "ok_sae")
    cfg = Config(vocab_size=100_000, context=64, n_layer=2, n_head=32, d_model=4096, d_ff=8192)
    one = torch.zeros(1)
    hostile = save_pt(tmp_path / "zs" / "m.pt",
                      {k: one.expand(*s) for k, s in expected_shapes(cfg).items() if k != "head.weight"}, cfg)
    assert hostile.stat().st_size < 8_000
    big_sae = save_sae(SparseAutoencoder.for_model(model, 0, d_sae=32, k=4), tmp_path / "big_sae")
    _edit_json(big_sae / SAE_CFG, lambda d: {**d, "d_in": 384, "d_sae": 1_500_000})
    r = subprocess.run([sys.executable, "-c", COUNT, str(ok), str(ok_sae), str(hostile), str(big_sae)],
                       capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert lines, r.stderr[-3000:]
    out = json.loads(lines[-1])
    assert out["pt"].startswith("InvalidWeightsError: embed.weight") and "1 stored value" in out["pt"], out["pt"]
    assert out["sae"].startswith("SAEMismatchError") and "(384, 1500000)" in out["sae"], out["sae"]
    grew = out["after"] - out["before"]
    assert grew < 64 << 20, f"peak memory grew by {grew / 2**20:,.0f} MiB while refusing"
