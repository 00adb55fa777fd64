"""Per-layer transcoders on a tiny random model: training, resuming, circuit-tracer's file layout, hostile files,
the replacement model and the quality numbers against hand-written loops."""
from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import tiny_config, unchecked_types
from safetensors.torch import load_file, save_file

from sprout_interp.circuits.local_replacement import random_transcoders
from sprout_interp.core import limits
from sprout_interp.core.errors import (
    InvalidWeightsError,
    NotAPathError,
    SproutError,
    TranscoderMismatchError,
    TranscoderNotFoundError,
)
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.features.transcoder import (
    FEATURE_INPUT_HOOK,
    FEATURE_OUTPUT_HOOK,
    TC_CONFIG,
    Transcoder,
    TranscoderSet,
    load_transcoders,
    mlp_input,
    save_transcoder_layer,
    save_transcoders,
)
from sprout_interp.features.transcoder_metrics import replacement_quality, run_with_transcoders, transcoder_quality
from sprout_interp.features.transcoder_train import collect_mlp_pairs, state_file, train_transcoder
from sprout_model import GPT

pytestmark = pytest.mark.unit

D, DT, K = 16, 48, 4  # tiny_config's d_model, the transcoders' width and k here


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedSprout(GPT(tiny_config()).eval(), name="tiny")


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 64, (48, 32), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def pairs(model, tokens):
    return collect_mlp_pairs(model, 1, 1536, tokens=tokens, progress=False)


def _train(model, pairs, **kw):
    args = dict(d_transcoder=DT, k=K, epochs=3, batch_size=128, lr=3e-3, dead_after=400, progress=False)
    args.update(kw)
    return train_transcoder(model, 1, *pairs, **args)


@pytest.fixture(scope="module")
def trained(model, pairs):
    return {skip: _train(model, pairs, skip=skip, epochs=8)[0] for skip in (False, True)}


def test_mlp_input_is_what_the_feed_forward_reads(model, tokens):
    _, cache = model.run_with_cache(tokens[:2], names_filter=["blocks.1.ln2.hook_normalized", "blocks.1.mlp.hook_pre"])
    x = mlp_input(model, 1, cache["blocks.1.ln2.hook_normalized"])
    w1 = model.model.blocks[1].ffn.w1.weight  # the GPT's own gate, which reads the norm's output after its gain
    torch.testing.assert_close(x @ w1.T, cache["blocks.1.mlp.hook_pre"], rtol=0, atol=1e-5)


def test_pairs_are_the_cached_input_and_output(model, tokens, pairs):
    x, y = pairs
    assert x.shape == y.shape == (1536, D)
    _, cache = model.run_with_cache(tokens[:1], names_filter=["blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"])
    torch.testing.assert_close(x[:32], mlp_input(model, 1, cache["blocks.1.ln2.hook_normalized"][0]), rtol=0, atol=0)
    torch.testing.assert_close(y[:32], cache["blocks.1.hook_mlp_out"][0], rtol=0, atol=0)


def test_encode_decode_are_circuit_tracers_topk_and_skip(trained):
    tc = trained[True]
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(2))
    pre = x @ tc.W_enc.T + tc.b_enc
    keep = pre >= pre.topk(K, dim=-1).values[:, -1:]  # the k largest, kept as they are (no ReLU)
    acts = pre * keep
    torch.testing.assert_close(tc.encode(x), acts)
    torch.testing.assert_close(tc(x), acts @ tc.W_dec + tc.b_dec + x @ tc.W_skip.T, rtol=0, atol=1e-5)
    assert int((tc.encode(x) != 0).sum(-1).max()) <= K
    with pytest.raises(SproutError, match="skip connection"):
        tc.decode(acts)


def test_loss_falls_over_counted_steps_and_rows_stay_unit(model, pairs):
    short, s1 = _train(model, pairs, max_steps=4)
    long, s2 = _train(model, pairs, epochs=12)
    assert (s1.steps, s1.tokens_seen) == (4, 4 * 128)
    assert (s2.steps, s2.tokens_seen) == (12 * (1536 // 128), 12 * 12 * 128)
    assert s2.final_nmse < 0.5 * s1.final_nmse, (s1.final_nmse, s2.final_nmse)
    torch.testing.assert_close(long.W_dec.norm(dim=-1), torch.ones(DT))
    assert long.info["finished"] and not short.info["finished"]


def test_resume_is_bit_identical_to_an_uninterrupted_run(model, pairs, tmp_path):
    whole, _ = _train(model, pairs, skip=True, run_dir=tmp_path / "a", save_every=5)
    first, st = _train(model, pairs, skip=True, run_dir=tmp_path / "b", save_every=5, max_steps=13)
    assert st.steps == 13 and state_file(tmp_path / "b", 1).is_file()
    assert torch.load(state_file(tmp_path / "b", 1), weights_only=True)["step"] == 13
    resumed, st2 = _train(model, pairs, skip=True, run_dir=tmp_path / "b", save_every=5)
    assert st2.steps == whole.info["training"]["total_steps"] == 36
    for name, p in whole.state_dict().items():
        assert torch.equal(p, resumed.state_dict()[name]), name
    assert not torch.equal(first.W_enc, whole.W_enc)
    with pytest.raises(SproutError, match="other settings.*k"):
        _train(model, pairs, skip=True, run_dir=tmp_path / "b", k=K + 1)


def test_seeded(model, pairs):
    a, _ = _train(model, pairs, max_steps=6)
    b, _ = _train(model, pairs, max_steps=6)
    c, _ = _train(model, pairs, max_steps=6, seed=1)
    assert torch.equal(a.W_enc, b.W_enc) and not torch.equal(a.W_enc, c.W_enc)


def test_files_have_circuit_tracers_names_shapes_and_config(model, trained, tmp_path):
    ts = TranscoderSet({1: trained[True]})
    save_transcoders(ts, tmp_path, torch.float32)
    sd = load_file(str(tmp_path / "layer_1.safetensors"))
    assert {k: tuple(v.shape) for k, v in sd.items()} == {
        "W_enc": (DT, D), "W_dec": (DT, D), "b_enc": (DT,), "b_dec": (D,), "W_skip": (D, D)}
    yaml = pytest.importorskip("yaml")
    cfg = yaml.safe_load((tmp_path / TC_CONFIG).read_text())
    assert (cfg["feature_input_hook"], cfg["feature_output_hook"]) == (FEATURE_INPUT_HOOK, FEATURE_OUTPUT_HOOK) == (
        "mlp.hook_in", "mlp.hook_out")
    assert cfg["transcoders"] == ["layer_1.safetensors"] and cfg["activation"] == "topk" and cfg["k"] == K
    assert cfg["sprout"]["output_hook"] == "blocks.{layer}.hook_mlp_out"
    back = load_transcoders(model, tmp_path)
    assert back.layers == [1] and back[1].has_skip
    with pytest.raises(SproutError, match="no transcoder for layer True"):
        back[True]  # a bool is not layer 1
    with pytest.raises(SproutError, match="layers=True"):
        load_transcoders(model, tmp_path, layers=[True])
    with pytest.raises(TranscoderNotFoundError, match="layer 0"):
        load_transcoders(model, tmp_path, layers=[0])
    for k, v in trained[True].state_dict().items():
        assert torch.equal(back[1].state_dict()[k], v), k
    half = tmp_path / "half"
    save_transcoders(ts, half)  # shipped: float16
    assert load_file(str(half / "layer_1.safetensors"))["W_enc"].dtype == torch.float16
    torch.testing.assert_close(load_transcoders(model, half)[1].W_dec, trained[True].W_dec, rtol=1e-3, atol=1e-3)


def _saved(trained, tmp_path, skip=True):
    save_transcoder_layer(trained[skip], tmp_path)
    return tmp_path


def test_hostile_and_foreign_folders_are_refused(model, trained, tmp_path, monkeypatch):
    with pytest.raises(TranscoderNotFoundError):
        load_transcoders(model, tmp_path / "nothing")
    good = _saved(trained, tmp_path / "good")
    cfg = json.loads((good / TC_CONFIG).read_text())
    sd = load_file(str(good / "layer_1.safetensors"))

    def variant(name, cfg_edit=None, sd_edit=None, raw_cfg=None):
        d = tmp_path / name
        d.mkdir()
        c = json.loads(json.dumps(cfg))
        if cfg_edit:
            cfg_edit(c)
        (d / TC_CONFIG).write_text(raw_cfg if raw_cfg is not None else json.dumps(c))
        s = dict(sd)
        if sd_edit:
            sd_edit(s)
        save_file(s, str(d / "layer_1.safetensors"))
        return d

    nan = variant("nan", sd_edit=lambda s: s.__setitem__("W_dec", s["W_dec"].clone().index_fill_(0, torch.tensor([3]), float("nan"))))
    inf = variant("inf", sd_edit=lambda s: s.__setitem__("b_enc", torch.full((DT,), float("inf"))))
    shape = variant("shape", sd_edit=lambda s: s.__setitem__("W_enc", torch.zeros(DT, D + 1)))
    big = variant("big", cfg_edit=lambda c: c.update(d_transcoder=1 << 23),
                  sd_edit=lambda s: s.__setitem__("W_enc", s["W_enc"]))
    ints = variant("ints", sd_edit=lambda s: s.__setitem__("b_dec", torch.zeros(D, dtype=torch.int32)))
    extra = variant("extra", sd_edit=lambda s: s.__setitem__("junk", torch.zeros(3)))
    noskip = variant("noskip", sd_edit=lambda s: s.pop("W_skip"))
    escape = variant("escape", cfg_edit=lambda c: c.update(transcoders=["../good/layer_1.safetensors"]))
    boolk = variant("boolk", cfg_edit=lambda c: c.update(k=True))
    hooks = variant("hooks", cfg_edit=lambda c: c.update(feature_input_hook="hook_resid_mid"))
    notobj = variant("notobj", raw_cfg="[1, 2]")
    broken = variant("broken", raw_cfg="{not json")
    for d, why in ((nan, "NaN or infinite"), (inf, "NaN or infinite"), (ints, "int32")):
        with pytest.raises(InvalidWeightsError, match=why):
            load_transcoders(model, d)
    with unchecked_types(), pytest.raises(NotAPathError):
        load_transcoders(model, 123)
    for d, why in ((shape, "holds tensors"), (big, "holds tensors"), (extra, "holds tensors"), (noskip, "holds tensors"),
                   (escape, "not a file layer_L"), (boolk, "'k' must be an int"), (hooks, "hooks must be"),
                   (notobj, "not an object"), (broken, "not valid JSON")):
        with pytest.raises(TranscoderMismatchError, match=why):
            load_transcoders(model, d)
    trunc = variant("trunc")
    raw = (trunc / "layer_1.safetensors").read_bytes()
    (trunc / "layer_1.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TranscoderMismatchError, match="layer_1.safetensors"):
        load_transcoders(model, trunc)
    monkeypatch.setattr(limits, "MAX_JSON_BYTES", 100)
    with pytest.raises(TranscoderMismatchError, match="more than"):
        load_transcoders(model, good)
    monkeypatch.undo()
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo"
        fifo.mkdir()
        os.mkfifo(fifo / TC_CONFIG)
        with pytest.raises(TranscoderMismatchError, match="not a regular file"):
            load_transcoders(model, fifo)


def test_another_checkpoint_or_width_is_refused(trained, tmp_path):
    good = _saved(trained, tmp_path)
    other = HookedSprout(GPT(tiny_config()).eval())  # same config, other weights
    with pytest.raises(TranscoderMismatchError, match="another checkpoint.*weights"):
        load_transcoders(other, good)
    wider = HookedSprout(GPT(tiny_config(d_model=32)).eval())
    with pytest.raises(TranscoderMismatchError, match="d_model 32"):
        load_transcoders(wider, good)
    with pytest.raises(TranscoderMismatchError, match="another model, width"):
        save_transcoder_layer(trained[False], good)  # no skip: not the same set


def test_replacement_with_errors_added_back_is_the_clean_model(model, tokens, trained):
    ts = {0: _train_layer0(model, tokens), 1: trained[True]}
    clean = model(tokens[:4])
    with_errors = run_with_transcoders(model, ts, tokens[:4], add_errors=True)
    torch.testing.assert_close(with_errors, clean, rtol=0, atol=1e-5)
    without = run_with_transcoders(model, ts, tokens[:4])
    assert (without - clean).abs().max() > 1e-3


def _train_layer0(model, tokens):
    x, y = collect_mlp_pairs(model, 0, 1536, tokens=tokens, progress=False)
    return train_transcoder(model, 0, x, y, d_transcoder=DT, k=K, epochs=2, batch_size=128, lr=3e-3,
                            progress=False, skip=True)[0]


TOPK_MARGIN = 1e-4  # the k-th largest pre-activation exceeds the next by this much (they are of order 1)


def _assert_clear_topk(tc, x):
    """No near-tie decides the TopK of ``x``: the library's forwards (other batch shapes, a loss-only run) give
    inputs that differ from the hand loop's by about 1e-6, so only a margin far above that makes both choose the
    same features on every CPU."""
    pre = tc.pre_acts(x).sort(-1, descending=True).values
    assert float((pre[..., tc.k - 1] - pre[..., tc.k]).min()) > TOPK_MARGIN


def test_quality_matches_a_hand_written_loop(model, tokens):
    # seeded random transcoders (pre-activations of order 1) whose every TopK choice is clear, asserted below:
    # trained ones on this tiny model have pre-activations near 1e-4 with exact ties, so the last bit of the
    # forward picked other features in the library than by hand on another CPU
    tcs = {tc.layer: tc for tc in random_transcoders(model, k=K, d_transcoder=DT, skip=True, seed=0)}
    with torch.no_grad():
        _check_quality(model, tokens, tcs)


def _check_quality(model, tokens, tcs):
    t = tokens[:6]
    q = transcoder_quality(model, tcs, tokens=t, batch=4)
    # by hand: one full forward per window set, the transcoder applied to the cached input
    ln = {l: model.blocks[l].ln2.w for l in tcs}
    _, cache = model.run_with_cache(t)
    logp = torch.log_softmax(model(t).double(), -1)
    ce_clean = -logp[:, :-1].gather(-1, t[:, 1:, None]).mean()
    for layer, tc in tcs.items():
        x = cache[f"blocks.{layer}.ln2.hook_normalized"].reshape(-1, D) * ln[layer]
        _assert_clear_topk(tc, x)
        y = cache[f"blocks.{layer}.hook_mlp_out"].reshape(-1, D).double()
        acts = tc.encode(x)
        pred = (acts @ tc.W_dec + tc.b_dec + x @ tc.W_skip.T).double()
        fve = 1 - (y - pred).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
        row = q[q.layer == layer].iloc[0]
        assert row.fve == pytest.approx(float(fve), abs=1e-6)
        lin = (x @ tc.W_skip.T + tc.b_dec).double()
        assert row.fve_skip_only == pytest.approx(float(1 - (y - lin).pow(2).sum() / (y - y.mean(0)).pow(2).sum()), abs=1e-6)
        assert row.l0 == pytest.approx(float((acts != 0).sum(-1).double().mean()))
        assert row.dead == int(((acts != 0).sum(0) == 0).sum())
        assert row.ce_clean == pytest.approx(float(ce_clean), abs=1e-6)

        def swap(out, hook, layer=layer, tc=tc):  # that layer's output from its own input, in this run
            return tc(seen[layer] * ln[layer])

        seen = {}
        spliced = model.run_with_hooks(t, fwd_hooks=[(f"blocks.{layer}.ln2.hook_normalized", lambda a, hook, layer=layer: seen.__setitem__(layer, a)),
                                                     (f"blocks.{layer}.hook_mlp_out", swap)])
        ce = -torch.log_softmax(spliced.double(), -1)[:, :-1].gather(-1, t[:, 1:, None]).mean()
        assert row.ce_spliced == pytest.approx(float(ce), abs=1e-6)
    r = replacement_quality(model, tcs, tokens=t, batch=4)
    seen = {}
    hooks = []
    for layer, tc in tcs.items():
        hooks.append((f"blocks.{layer}.ln2.hook_normalized", lambda a, hook, layer=layer: seen.__setitem__(layer, a)))
        hooks.append((f"blocks.{layer}.hook_mlp_out", lambda out, hook, layer=layer, tc=tc: tc(seen[layer] * ln[layer])))
    rep = model.run_with_hooks(t, fwd_hooks=hooks)
    for layer, tc in tcs.items():  # a later layer reads the replaced earlier ones: its TopK clear there too
        _assert_clear_topk(tc, seen[layer] * ln[layer])
    zero = model.run_with_hooks(t, fwd_hooks=[(f"blocks.{l}.hook_mlp_out", lambda out, hook: out * 0) for l in tcs])
    ce_rep, ce_zero = (-torch.log_softmax(o.double(), -1)[:, :-1].gather(-1, t[:, 1:, None]).mean() for o in (rep, zero))
    assert r["ce_replacement"] == pytest.approx(float(ce_rep), abs=1e-6)
    assert r["ce_mlp_zero"] == pytest.approx(float(ce_zero), abs=1e-6)
    gap = float((ce_zero - ce_rep) / (ce_zero - ce_clean))  # a random model's small gap: tolerance scaled by it
    assert r["gap_recovered"] == pytest.approx(gap, abs=4e-6 / float(abs(ce_zero - ce_clean)))


@pytest.mark.unchecked_types
def test_bad_arguments_say_what_is_wrong(model, pairs):
    for layer in (True, "0", 0.5, 2, -1):
        with pytest.raises(SproutError, match="layer"):
            mlp_input(model, layer, torch.zeros(1, D))
    with pytest.raises(SproutError, match="k=49 is out of range"):
        Transcoder(D, DT, DT + 1, 0)
    with pytest.raises(SproutError, match="skip=1"):
        _train(model, pairs, skip=1)
    with pytest.raises(SproutError, match="fewer than one batch"):
        _train(model, (pairs[0][:64], pairs[1][:64]))
    with pytest.raises(SproutError, match="batch_size"):
        _train(model, pairs, batch_size=0)
