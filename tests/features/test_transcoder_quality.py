"""The transcoder recipe's loss (normalised MSE plus AuxK on dead features) against a hand-written float64
computation; scripts/transcoder_quality.py's tables against independent computations on a tiny random model; its
prompts; and the shipped Sprout transcoders: they load, and the quality config.yaml records for each layer is what
a fresh measurement on the same held-out text gives."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from sprout_interp.circuits.local_replacement import random_transcoders
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.features.train import topk_losses
from sprout_model import GPT

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("transcoder_quality", ROOT / "scripts" / "transcoder_quality.py")
tq = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tq)

D, DT, K = 16, 48, 4


def _auxk_by_hand(pre, recon, target, W_dec, dead, k_aux, aux_coef):
    """float64, one token at a time: the dead latents' k_aux largest pre-activations, ReLU'd, rebuild the error."""
    pre, recon, target, W_dec = (t.double() for t in (pre, recon, target, W_dec))
    err = target - recon
    mean = target.mean(0)
    nmse = sum(float((err[i] ** 2).sum()) for i in range(len(err))) / sum(
        float(((target[i] - mean) ** 2).sum()) for i in range(len(err)))
    dead_ids = [j for j in range(pre.shape[1]) if dead[j]]
    kk = min(k_aux, len(dead_ids))
    num = den = 0.0
    for i in range(len(pre)):
        chosen = sorted(dead_ids, key=lambda j: -float(pre[i, j]))[:kk]
        e_hat = sum((max(float(pre[i, j]), 0.0) * W_dec[j] for j in chosen), torch.zeros(W_dec.shape[1], dtype=torch.float64))
        num += float(((err[i] - e_hat) ** 2).sum())
        den += float((err[i] ** 2).sum())
    aux = num / den if dead_ids else 0.0  # no dead latent: no AuxK term
    return nmse + aux_coef * aux, nmse, aux


@pytest.mark.parametrize("n_dead,k_aux", [(0, 5), (3, 5), (20, 5)])
def test_auxk_loss_matches_float64_by_hand(n_dead, k_aux):
    g = torch.Generator().manual_seed(n_dead)
    B, L, d = 12, 30, 8
    pre = torch.randn(B, L, generator=g)  # continuous: no tie decides the dead latents' top k_aux
    W_dec = torch.randn(L, d, generator=g)
    W_dec = W_dec / W_dec.norm(dim=-1, keepdim=True)
    target, recon = torch.randn(B, d, generator=g) * 2 + 1, torch.randn(B, d, generator=g)
    dead = torch.zeros(L, dtype=torch.bool)
    dead[torch.randperm(L, generator=g)[:n_dead]] = True
    loss, nmse, aux = topk_losses(pre, recon, target, W_dec, dead, k_aux, 1 / 32)
    want = _auxk_by_hand(pre, recon, target, W_dec, dead, k_aux, 1 / 32)
    assert float(nmse) == pytest.approx(want[1], rel=1e-5)
    assert float(aux) == pytest.approx(want[2], rel=1e-5)
    assert float(loss) == pytest.approx(want[0], rel=1e-5)
    if n_dead:
        assert want[2] > 0.1  # the dead latents' term is really there


def test_auxk_gradient_reaches_only_dead_latents():
    g = torch.Generator().manual_seed(7)
    pre = torch.randn(10, 20, generator=g, requires_grad=True)
    W_dec = torch.randn(20, 6, generator=g)
    dead = torch.zeros(20, dtype=torch.bool)
    dead[[2, 5, 11]] = True
    recon = torch.randn(10, 6, generator=g)
    _, _, aux = topk_losses(pre, recon, torch.randn(10, 6, generator=g), W_dec, dead, 2, 1.0)
    aux.backward()
    assert float(pre.grad[:, ~dead].abs().max()) == 0.0
    assert float(pre.grad[:, dead].abs().max()) > 0.0


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedSprout(GPT(tiny_config()).eval(), name="tiny")


def test_cut_before_last_word():
    text = "Ann Lee sat. Then Ann Lee left."
    assert tq.cut_before_last_word(text, "Ann Lee") == "Ann Lee sat. Then Ann"
    assert tq.cut_before_last_word("Bob ran and Bob sat", "Bob") == "Bob ran and"
    with pytest.raises(Exception, match="twice"):
        tq.cut_before_last_word("Ann Lee sat.", "Ann Lee")


def test_script_tables_match_an_independent_computation(model):
    tcs = random_transcoders(model, k=K, d_transcoder=DT, skip=True, seed=0)
    t = torch.randint(0, 64, (3, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        q = tq.layer_table(model, "plt", tcs, tokens=t)
        assert list(q.columns) == ["layer", "block", "d_transcoder", "k", "n_tokens", "l0", "fve", "dead",
                                   "loss_recovered"]
        assert list(q["layer"]) == list(range(model.cfg.n_layers)) and set(q["n_tokens"]) == {t.numel()}
        _, cache = model.run_with_cache(t)
        for layer in range(model.cfg.n_layers):
            tc = tcs[layer]
            x = cache[f"blocks.{layer}.ln2.hook_normalized"].reshape(-1, D).double() * model.blocks[layer].ln2.w.double()
            y = cache[f"blocks.{layer}.hook_mlp_out"].reshape(-1, D).double()
            pre = x @ tc.W_enc.double().T + tc.b_enc.double()
            top = pre.sort(-1, descending=True).values
            assert float((top[:, K - 1] - top[:, K]).min()) > 1e-4  # no near-tie decides the TopK
            keep = pre >= top[:, K - 1:K]
            pred = (pre * keep) @ tc.W_dec.double() + tc.b_dec.double() + x @ tc.W_skip.double().T
            fve = 1 - float(((y - pred) ** 2).sum() / ((y - y.mean(0)) ** 2).sum())
            row = q[q.layer == layer].iloc[0]
            assert row.fve == pytest.approx(fve, abs=1e-5)
            assert row.l0 == K
            assert row.dead == int((keep.sum(0) == 0).sum())
        r = tq.replaced_at_once(model, "plt", tcs, tokens=t)
        assert set(r) == {"n_tokens", "ce_clean", "ce_replacement", "ce_mlp_zero", "gap_recovered"}
        ce = {}
        for mode in ("clean", "replacement", "zero"):  # by hand: each feed-forward's output swapped in a forward hook
            seen, hooks = {}, []
            for layer in range(model.cfg.n_layers) if mode != "clean" else ():
                def grab(a, hook, layer=layer):
                    seen[layer] = a.double() * model.blocks[layer].ln2.w.double()

                def put(out, hook, layer=layer, tc=tcs[layer]):
                    if mode == "zero":
                        return out * 0
                    x = seen[layer]
                    pre = x @ tc.W_enc.double().T + tc.b_enc.double()
                    top = pre.topk(K + 1, -1).values
                    assert float((top[..., K - 1] - top[..., K]).min()) > 1e-4  # no near-tie decides the TopK
                    keep = pre >= top[..., K - 1:K]
                    return ((pre * keep) @ tc.W_dec.double() + tc.b_dec.double() + x @ tc.W_skip.double().T).float()
                hooks += [(f"blocks.{layer}.ln2.hook_normalized", grab), (f"blocks.{layer}.hook_mlp_out", put)]
            logp = torch.log_softmax(model.run_with_hooks(t, fwd_hooks=hooks).double(), -1)
            ce[mode] = float(-logp[:, :-1].gather(-1, t[:, 1:, None]).mean())
        assert r["ce_clean"] == pytest.approx(ce["clean"], abs=1e-6)
        assert r["ce_replacement"] == pytest.approx(ce["replacement"], abs=1e-5)
        assert r["ce_mlp_zero"] == pytest.approx(ce["zero"], abs=1e-6)
        gap = (ce["zero"] - ce["replacement"]) / (ce["zero"] - ce["clean"])
        assert r["gap_recovered"] == pytest.approx(gap, abs=2e-5 / abs(ce["zero"] - ce["clean"]))
    # the graph table: one row per prompt, the scores of that prompt's own graph
    import sprout_interp as si

    ids = torch.randint(1, 64, (10,), generator=torch.Generator().manual_seed(4))
    graphs = tq.graph_table(model, tcs, None, prompts=[("random", ids)])
    g = si.attribution_graph(model, ids, tcs)
    assert graphs.loc[0, "positions"] == 11 and graphs.loc[0, "active_features"] == g.info["n_active_features"]
    assert (graphs.loc[0, "replacement"], graphs.loc[0, "completeness"]) == pytest.approx(si.graph_scores(g))
    assert 0 < graphs.loc[0, "replacement"] < 1


def test_a_set_may_mix_k_by_layer(model, tmp_path):
    from sprout_interp.core.errors import TranscoderMismatchError
    from sprout_interp.features.transcoder import TC_CONFIG, load_transcoders, save_transcoder_layer

    four, eight = (random_transcoders(model, k=k, d_transcoder=DT, skip=True, seed=k) for k in (K, 2 * K))
    save_transcoder_layer(four[0], tmp_path)
    save_transcoder_layer(eight[1], tmp_path)  # a later layer with twice the k, into the same folder
    cfg = json.loads((tmp_path / TC_CONFIG).read_text())
    assert cfg["k"] == K and cfg["sprout"]["layers"]["1"]["k"] == 2 * K
    ts = load_transcoders(model, tmp_path)
    assert [tc.k for tc in ts] == [K, 2 * K] and "4/8 by layer" in repr(ts)
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ts[1](x), eight[1](x), rtol=0, atol=0)
        assert int((ts[1].encode(x) != 0).sum(-1).max()) == 2 * K
    cfg["sprout"]["layers"]["1"]["k"] = DT // 4 + 1  # above a quarter of the width
    (tmp_path / TC_CONFIG).write_text(json.dumps(cfg))
    with pytest.raises(TranscoderMismatchError, match="'k' must be an int in 1..12"):
        load_transcoders(model, tmp_path)
    old = json.loads((tmp_path / TC_CONFIG).read_text())  # a folder written before layers named their own k
    old["sprout"]["layers"]["1"]["k"] = 2 * K
    del old["sprout"]["layers"]["0"]["k"]
    (tmp_path / TC_CONFIG).write_text(json.dumps(old))
    save_transcoder_layer(eight[1], tmp_path)  # layer 0 keeps the set's k, 4, not the new layer's
    assert [tc.k for tc in load_transcoders(model, tmp_path)] == [K, 2 * K]
    with pytest.raises(TranscoderMismatchError, match="width or skip"):
        save_transcoder_layer(random_transcoders(model, k=K, d_transcoder=2 * DT, skip=True)[0], tmp_path)


def test_least_squares_start_of_the_skip_connection(model):
    from sprout_interp.core.errors import ArgumentError
    from sprout_interp.features.transcoder_train import collect_mlp_pairs, train_transcoder

    tokens = torch.randint(0, 64, (16, 32), generator=torch.Generator().manual_seed(1))
    x, y = collect_mlp_pairs(model, 1, 512, tokens=tokens, progress=False)
    tc, _ = train_transcoder(model, 1, x, y, d_transcoder=DT, k=K, skip=True, batch_size=128, max_steps=0,
                             skip_init="least_squares", progress=False)  # no step: the start, scales folded back
    X = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], 1)
    sol = torch.linalg.lstsq(X, y.double(), driver="gelsd").solution  # an independent float64 solver
    torch.testing.assert_close(tc.W_skip.double(), sol[:D].T, rtol=0, atol=2e-5 * float(sol.abs().max()))
    torch.testing.assert_close(tc.b_dec.double(), sol[D], rtol=0, atol=2e-5 * float(sol.abs().max()))
    assert tc.info["training"]["skip_init"] == "least_squares"
    zero, _ = train_transcoder(model, 1, x, y, d_transcoder=DT, k=K, skip=True, batch_size=128, max_steps=0,
                               progress=False)
    assert float(zero.W_skip.detach().abs().max()) == 0.0 and "skip_init" not in zero.info["training"]
    with pytest.raises(ArgumentError, match="needs skip=True"):
        train_transcoder(model, 1, x, y, d_transcoder=DT, k=K, batch_size=128, skip_init="least_squares")
    with pytest.raises(ArgumentError, match="skip_init="):
        train_transcoder(model, 1, x, y, d_transcoder=DT, k=K, skip=True, batch_size=128, skip_init="ols")


@pytest.mark.acceptance
def test_the_shipped_sprout_transcoders_measure_what_their_config_records():
    """Each layer's quality in config.yaml (measured on the float32 weights when trained) against a fresh
    measurement of the shipped float16 files on the same held-out windows: FVE and loss recovered to 0.01, L0
    exactly, dead features to a few (a float16 weight can move a near-tie)."""
    from sprout_interp.core.hooked import load_hooked
    from sprout_interp.features.transcoder import load_transcoders, transcoder_folder
    from sprout_interp.features.transcoder_metrics import transcoder_quality

    m = load_hooked("sprout")
    if not (transcoder_folder(m) / "config.yaml").is_file():
        pytest.skip("the shipped Sprout transcoders are not installed")
    ts = load_transcoders(m)
    assert ts.layers == list(range(m.cfg.n_layers))
    q = transcoder_quality(m, ts, n=16, length=256)
    for tc in ts:
        rec, row = tc.info["quality"], q[q.layer == tc.layer].iloc[0]
        assert rec["n_tokens"] == row.n_tokens == 4096
        assert row.l0 == rec["l0"] == tc.k
        assert row.fve == pytest.approx(rec["fve"], abs=0.01), tc.layer
        assert row.loss_recovered == pytest.approx(rec["loss_recovered"], abs=0.01), tc.layer
        assert abs(row.dead - rec["dead"]) <= 3, tc.layer
