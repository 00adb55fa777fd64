"""Cross-layer transcoders on a tiny random model: the maths against a float64 loop, training and resuming,
circuit-tracer's file layout and the loader's checks, zero cross-layer decoders against a per-layer transcoder,
the replacement model and the quality numbers against hand-written loops."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_config
from safetensors.torch import load_file, save_file

from sprout_interp.core.errors import SproutError, TranscoderMismatchError, TranscoderNotFoundError
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.features.clt import CrossLayerTranscoder, dec_file, enc_file, load_clt, save_clt
from sprout_interp.features.clt_metrics import clt_quality, clt_replacement_quality, run_with_clt
from sprout_interp.features.clt_train import (
    LOCK_FILE,
    STATE_FILE,
    RunFolderBusyError,
    clt_from_state,
    collect_clt_chunk,
    train_clt,
)
from sprout_interp.features.transcoder import Transcoder, mlp_input
from sprout_interp.features.transcoder_metrics import run_with_transcoders
from sprout_model import GPT

pytestmark = pytest.mark.unit

D, DT, K, L = 16, 48, 4, 2  # tiny_config's d_model, the CLT's width per layer, k, layers


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedSprout(GPT(tiny_config()).eval(), name="tiny")


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 64, (48, 32), generator=torch.Generator().manual_seed(1))


def _train(model, tokens, run_dir=None, **kw):
    args = dict(d_transcoder=DT, k=K, chunks=2, chunk_tokens=768, passes=2, batch_size=128, lr=3e-3,
                dead_after=256, tokens=tokens, progress=False, log_every=3)
    args.update(kw)
    return train_clt(model, run_dir, **args)


@pytest.fixture(scope="module")
def trained(model, tokens):
    return _train(model, tokens, None, passes=4)


def _loop_predict(clt, xs):
    """ŷ of every layer for inputs xs (L, n, d) by explicit loops over layers and features, float64."""
    n = xs.shape[1]
    W_enc, b_enc, thr = clt.W_enc.double(), clt.b_enc.double(), clt.threshold.double()
    acts = torch.zeros(L, n, DT, dtype=torch.float64)
    for i in range(L):
        for f in range(DT):
            pre = xs[i].double() @ W_enc[i, f] + b_enc[i, f]
            acts[i, :, f] = torch.where(pre > thr[i, f], pre, torch.zeros_like(pre))
    out = torch.zeros(L, n, D, dtype=torch.float64)
    for j in range(L):
        out[j] = clt.b_dec[j].double()
        for i in range(j + 1):
            for f in range(DT):
                out[j] += acts[i, :, f, None] * clt.W_dec[i][f, j - i].double()
    return acts, out


def test_encode_decode_are_circuit_tracers_jumprelu_clt(trained):
    clt = trained[0]
    xs = torch.randn(L, 7, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64).float()
    acts, out = _loop_predict(clt, xs)
    torch.testing.assert_close(clt.encode(xs).double(), acts, rtol=0, atol=1e-5)
    torch.testing.assert_close(clt(xs).double(), out, rtol=0, atol=1e-4)
    assert [tuple(w.shape) for w in clt.W_dec] == [(DT, 2, D), (DT, 1, D)]
    assert clt.W_enc.shape == (L, DT, D) and clt.threshold.shape == (L, DT)
    assert bool((clt.threshold > 0).all()) and 0 < int((clt.encode(xs) != 0).sum()) < L * 7 * DT / 2


def test_thresholds_make_k_features_per_token_on_the_last_chunk(model, tokens, trained):
    clt = trained[0]
    xs, _ = collect_clt_chunk(model, 768, tokens=tokens[24:])  # chunk 1 of 2: the rows the thresholds were set on
    with torch.no_grad():
        acts = clt.encode(torch.stack(xs))
    n = xs[0].shape[0]
    for i in range(L):
        assert abs(int((acts[i] != 0).sum()) - K * n) <= 2, i  # k per token, to a cut rounding may move by one


def test_loss_falls_over_counted_steps(model, tokens, trained):
    short, s1 = _train(model, tokens, None, passes=4, max_steps=3)
    long, s2 = trained
    assert (s1.steps, s1.total_steps, s1.tokens_seen) == (3, 48, 3 * 128)
    assert (s2.steps, s2.total_steps, s2.tokens_seen) == (2 * 4 * 6, 48, 48 * 128)
    assert max(s2.nmse) < 0.7 * min(s1.nmse), (s1.nmse, s2.nmse)
    assert long.info["finished"] and not short.info["finished"]


def test_training_rows_stay_unit_in_training_units(model, tokens, tmp_path):
    _train(model, tokens, tmp_path, max_steps=5, save_every=5)
    st = torch.load(tmp_path / STATE_FILE, weights_only=True)
    for i in range(L):
        norms = st["params"][f"W_dec.{i}"].flatten(1).norm(dim=-1)
        torch.testing.assert_close(norms, torch.ones(DT))


def test_resume_is_bit_identical_to_an_uninterrupted_run(model, tokens, tmp_path):
    kw = dict(save_every=5, dead_after=100, d_transcoder=256, k=1, chunk_tokens=512)  # dead features: AuxK takes part
    whole, sw = _train(model, tokens, tmp_path / "a", **kw)
    _train(model, tokens, tmp_path / "b", max_steps=6, **kw)  # inside chunk 0, between two saves
    st = torch.load(tmp_path / "b" / STATE_FILE, weights_only=True)
    assert st["step"] == 6 and set(st["chunk_sums"]) == {"0"}
    mid = clt_from_state(model, tmp_path / "b")
    assert mid.info["training"]["steps"] == 6 and not mid.info["finished"]
    _train(model, tokens, tmp_path / "b", max_steps=11, **kw)  # across the chunk boundary at step 8
    resumed, sr = _train(model, tokens, tmp_path / "b", **kw)
    assert sw.steps == sr.steps == 16
    for name, p in whole.state_dict().items():
        assert torch.equal(p, resumed.state_dict()[name]), name
    assert sum(whole.info["training"]["dead_at_end"]) > 0
    assert not torch.equal(mid.W_enc, whole.W_enc)
    with pytest.raises(SproutError, match="other settings.*k"):
        _train(model, tokens, tmp_path / "b", **dict(kw, k=2))


def test_a_second_trainer_on_a_busy_run_folder_is_refused(model, tokens, tmp_path):
    import fcntl

    tmp_path.mkdir(exist_ok=True)
    with open(tmp_path / LOCK_FILE, "w") as held:  # what a training process holds while it runs
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunFolderBusyError, match="another process is training"):
            _train(model, tokens, tmp_path, max_steps=1)
    assert not (tmp_path / STATE_FILE).exists()
    _, st = _train(model, tokens, tmp_path, max_steps=1)  # released: it runs, and releases it in turn
    _, st = _train(model, tokens, tmp_path, max_steps=2)
    assert st.steps == 2


def test_seeded(model, tokens):
    a, _ = _train(model, tokens, None, max_steps=4)
    b, _ = _train(model, tokens, None, max_steps=4)
    c, _ = _train(model, tokens, None, max_steps=4, seed=1)
    assert torch.equal(a.W_enc, b.W_enc) and not torch.equal(a.W_enc, c.W_enc)


def test_chunk_is_every_layers_cached_input_and_output(model, tokens):
    xs, ys = collect_clt_chunk(model, 64, tokens=tokens[:2])
    _, cache = model.run_with_cache(tokens[:2])
    for i in range(L):
        x = mlp_input(model, i, cache[f"blocks.{i}.ln2.hook_normalized"]).reshape(-1, D)
        torch.testing.assert_close(xs[i], x, rtol=0, atol=1e-5)  # batches of another size: the last bits differ
        torch.testing.assert_close(ys[i], cache[f"blocks.{i}.hook_mlp_out"].reshape(-1, D), rtol=0, atol=1e-5)


def test_files_have_circuit_tracers_names_shapes_and_config(model, trained, tmp_path):
    clt = trained[0]
    save_clt(clt, tmp_path, torch.float16)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["config.yaml"] + [enc_file(i) for i in range(L)] + [dec_file(i) for i in range(L)])
    for i in range(L):
        enc, dec = load_file(tmp_path / enc_file(i)), load_file(tmp_path / dec_file(i))
        assert {k: tuple(v.shape) for k, v in enc.items()} == {
            f"W_enc_{i}": (DT, D), f"b_enc_{i}": (DT,), f"b_dec_{i}": (D,), f"threshold_{i}": (DT,)}
        assert {k: tuple(v.shape) for k, v in dec.items()} == {f"W_dec_{i}": (DT, L - i, D)}
        assert all(v.dtype == torch.float16 for v in [*enc.values(), *dec.values()])
    cfg = json.loads((tmp_path / "config.yaml").read_text())
    assert (cfg["model_kind"], cfg["feature_input_hook"], cfg["feature_output_hook"]) == (
        "cross_layer_transcoder", "mlp.hook_in", "mlp.hook_out")
    back = load_clt(model, tmp_path)
    for name, p in clt.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], p.half().float(), rtol=0, atol=0)
    assert back.info["training"]["steps"] == 48


def test_loader_refuses_what_it_cannot_use(model, trained, tmp_path):
    clt = trained[0]
    with pytest.raises(TranscoderNotFoundError, match="no config.yaml"):
        load_clt(model, tmp_path)
    save_clt(clt, tmp_path)
    bad = load_file(tmp_path / dec_file(1))
    save_file({"W_dec_1": torch.zeros(DT, 2, D)}, tmp_path / dec_file(1))
    with pytest.raises(TranscoderMismatchError, match="W_dec_1.safetensors holds tensors"):
        load_clt(model, tmp_path)
    save_file(bad, tmp_path / dec_file(1))
    (tmp_path / enc_file(0)).unlink()
    with pytest.raises(TranscoderMismatchError, match="W_enc_0.safetensors is missing"):
        load_clt(model, tmp_path)
    save_clt(clt, tmp_path)
    torch.manual_seed(5)
    other = HookedSprout(GPT(tiny_config()).eval(), name="other")
    with pytest.raises(TranscoderMismatchError, match="another checkpoint"):
        load_clt(other, tmp_path)
    deeper = HookedSprout(GPT(tiny_config(n_layer=3)).eval(), name="deeper")
    with pytest.raises(TranscoderMismatchError, match="spans 2 layers"):
        load_clt(deeper, tmp_path)
    cfg = json.loads((tmp_path / "config.yaml").read_text())
    (tmp_path / "config.yaml").write_text(json.dumps(dict(cfg, model_kind="transcoder_set")))
    with pytest.raises(TranscoderMismatchError, match="model_kind"):
        load_clt(model, tmp_path)


def _per_layer_equivalent(model, seed=3):
    """A CLT whose decoders to later layers are zero, and per-layer TopK transcoders (k = DT / 4) with the same
    weights, built so that both keep the same features: a quarter of each layer's features have b_enc = +10 and
    the rest -10, far beyond what x @ W_enc.T (|.| < 3 here) moves them, so TopK keeps the +10 ones and the
    JumpReLU (threshold 0) too: no tie or near-tie decides either cut."""
    g = torch.Generator().manual_seed(seed)
    clt = CrossLayerTranscoder(L, D, DT)
    tcs = {}
    with torch.no_grad():
        for i in range(L):
            tc = Transcoder(D, DT, DT // 4, i)
            for p in (tc.W_enc, tc.W_dec, tc.b_dec):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            on = torch.randperm(DT, generator=g)[:DT // 4]
            tc.b_enc.fill_(-10.0)
            tc.b_enc[on] = 10.0
            clt.W_enc[i].copy_(tc.W_enc)
            clt.b_enc[i].copy_(tc.b_enc)
            clt.b_dec[i].copy_(tc.b_dec)
            clt.W_dec[i][:, 0].copy_(tc.W_dec)
            tcs[i] = tc
    return clt, tcs


@torch.no_grad()
def test_zero_cross_layer_decoders_equal_per_layer_transcoders(model, tokens):
    clt, tcs = _per_layer_equivalent(model)
    t = tokens[:3]
    torch.testing.assert_close(run_with_clt(model, clt, t), run_with_transcoders(model, tcs, t), rtol=0, atol=1e-5)
    xs = torch.randn(L, 5, D, generator=torch.Generator().manual_seed(4))
    assert max(float((xs[i] @ tcs[i].W_enc.T).abs().max()) for i in range(L)) < 3
    for i in range(L):
        torch.testing.assert_close(clt(xs)[i], tcs[i](xs[i]), rtol=0, atol=1e-5)
    clt.W_dec[0][:, 1].fill_(0.01)  # a feature of layer 0 writing to layer 1 changes layer 1's output only
    torch.testing.assert_close(clt(xs)[0], tcs[0](xs[0]), rtol=0, atol=1e-5)
    assert (clt(xs)[1] - tcs[1](xs[1])).abs().max() > 1e-2


def test_replacement_with_errors_added_back_is_the_clean_model(model, tokens, trained):
    clt = trained[0]
    clean = model(tokens[:4])
    torch.testing.assert_close(run_with_clt(model, clt, tokens[:4], add_errors=True), clean, rtol=0, atol=1e-5)
    assert (run_with_clt(model, clt, tokens[:4]) - clean).abs().max() > 1e-3


def _ce(logits, t):
    return -torch.log_softmax(logits.double(), -1)[:, :-1].gather(-1, t[:, 1:, None]).mean()


@torch.no_grad()
def test_quality_matches_a_hand_written_loop(model, tokens, trained):
    clt = trained[0]
    t = tokens[:6]
    q = clt_quality(model, clt, tokens=t, batch=4)
    _, cache = model.run_with_cache(t)
    xs = torch.stack([cache[f"blocks.{i}.ln2.hook_normalized"].reshape(-1, D) * model.blocks[i].ln2.w
                      for i in range(L)])
    acts, pred = _loop_predict(clt, xs)
    ce_clean = _ce(model(t), t)
    for j in range(L):
        y = cache[f"blocks.{j}.hook_mlp_out"].reshape(-1, D).double()
        row = q[q.layer == j].iloc[0]
        assert row.fve == pytest.approx(float(1 - (y - pred[j]).pow(2).sum() / (y - y.mean(0)).pow(2).sum()), abs=1e-5)
        assert row.l0 == pytest.approx(float((acts[j] != 0).sum(-1).double().mean()))
        assert row.dead == int(((acts[j] != 0).sum(0) == 0).sum())
        assert row.ce_clean == pytest.approx(float(ce_clean), abs=1e-6)
    # every output replaced, each layer's features read from the replaced run's own inputs: by hand, layer by layer
    seen, a = {}, {}

    def grab(x, hook, i):
        seen[i] = x * model.blocks[i].ln2.w
        pre = seen[i] @ clt.W_enc[i].T + clt.b_enc[i]
        a[i] = pre * (pre > clt.threshold[i])

    def put(y, hook, j):
        return clt.b_dec[j] + sum(a[i] @ clt.W_dec[i][:, j - i] for i in range(j + 1))

    hooks = [h for i in range(L) for h in ((f"blocks.{i}.ln2.hook_normalized", lambda x, hook, i=i: grab(x, hook, i)),
                                           (f"blocks.{i}.hook_mlp_out", lambda y, hook, i=i: put(y, hook, i)))]
    rep = model.run_with_hooks(t, fwd_hooks=hooks)
    zero = model.run_with_hooks(t, fwd_hooks=[(f"blocks.{i}.hook_mlp_out", lambda y, hook: y * 0) for i in range(L)])
    r = clt_replacement_quality(model, clt, tokens=t, batch=4)
    ce_rep, ce_zero = _ce(rep, t), _ce(zero, t)
    assert r["ce_replacement"] == pytest.approx(float(ce_rep), abs=1e-6)
    assert r["ce_mlp_zero"] == pytest.approx(float(ce_zero), abs=1e-6)
    gap = float((ce_zero - ce_rep) / (ce_zero - ce_clean))
    assert r["gap_recovered"] == pytest.approx(gap, abs=4e-6 / float(abs(ce_zero - ce_clean)))


@pytest.mark.unchecked_types
def test_bad_arguments_say_what_is_wrong(model, tokens, trained):
    with pytest.raises(SproutError, match="k"):
        _train(model, tokens, None, k=DT + 1)
    with pytest.raises(SproutError, match="less than one batch"):
        _train(model, tokens, None, batch_size=10_000)
    with pytest.raises(SproutError, match="CrossLayerTranscoder"):
        clt_quality(model, "not a clt", tokens=tokens[:2])
    with pytest.raises(SproutError, match="add_errors"):
        run_with_clt(model, trained[0], tokens[:2], add_errors=1)
    with pytest.raises(SproutError, match="xs must be"):
        trained[0].encode(torch.zeros(3, 4, D))
