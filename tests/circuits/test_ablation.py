"""Head ablations and sweeps: the fast sweep must equal ablating each head with a plain full forward.

Unit tests use tiny random models (tests/conftest.py) whose attention output weights are scaled up so
that ablating a head changes the loss noticeably; the integration tests use the shipped checkpoints.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

from sprout_interp import HookedSprout
from sprout_interp.circuits.ablation import (
    AblatedRunner,
    CopyingLoss,
    TargetLogProb,
    ablate,
    ablation_sweep,
    attribution_sweep,
    head_means,
    spearman,
)
from sprout_interp.circuits.metrics import LogitDiff, LogProb
from sprout_interp.core.errors import AblationError, SproutError
from sprout_model import GPT
from sprout_model.evaluation import repeated_tokens_batch

pytestmark = pytest.mark.unit

CHECKPOINTS = Path(__file__).resolve().parents[2] / "model" / "checkpoints"
ATOL = 1e-5


def _strong(n_layer=3, n_head=2, seed=0, **kw) -> GPT:
    torch.manual_seed(seed)
    g = GPT(tiny_config(n_layer=n_layer, n_head=n_head, **kw)).eval()
    with torch.no_grad():
        for b in g.blocks:  # make every head matter
            b.attn.proj.weight.mul_(40.0)
            b.attn.qkv.weight.mul_(3.0)
    return g


@pytest.fixture(scope="module")
def gpt() -> GPT:
    return _strong()


@pytest.fixture(scope="module")
def hooked(gpt) -> HookedSprout:
    return HookedSprout(gpt)


@pytest.fixture(scope="module")
def toks() -> torch.Tensor:
    return repeated_tokens_batch(64, 8, batch=4, seed=1)  # (4, 16)


@pytest.fixture(scope="module")
def ref() -> torch.Tensor:
    return torch.randint(1, 64, (5, 20), generator=torch.Generator().manual_seed(7))


# ---------------------------------------------------------------- an independent "plain" forward


def _replacement(gpt: GPT, kind: str, ref: torch.Tensor, toks: torch.Tensor, l: int, h: int) -> torch.Tensor:
    """The value a head is replaced with, computed on the plain GPT with a torch pre-hook."""
    dh = gpt.cfg.d_model // gpt.cfg.n_head
    B, T = toks.shape
    if kind == "zero":
        return torch.zeros(B, T, dh)
    src = ref if kind == "mean" else ref[torch.arange(B) % ref.shape[0], :T]
    seen = {}
    hk = gpt.blocks[l].attn.proj.register_forward_pre_hook(lambda mod, args: seen.setdefault("z", args[0].detach().clone()))
    try:
        with torch.no_grad():
            gpt(src)
    finally:
        hk.remove()
    z = seen["z"][..., h * dh : (h + 1) * dh]  # (R, T', d_head)
    if kind == "mean":
        return z.mean((0, 1)).expand(B, T, dh)
    return z


def _plain_ablated_logits(gpt: GPT, toks, heads_values) -> torch.Tensor:
    """GPT.forward with each head's slice of the attention output projection's input replaced."""
    dh = gpt.cfg.d_model // gpt.cfg.n_head
    handles = []
    for (l, h), v in heads_values:
        def pre(mod, args, h=h, v=v):
            y = args[0].clone()
            y[..., h * dh : (h + 1) * dh] = v
            return (y,)

        handles.append(gpt.blocks[l].attn.proj.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            logits, _ = gpt(toks)
    finally:
        for hd in handles:
            hd.remove()
    return logits


def _loss(logits, toks):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), toks[:, 1:].reshape(-1)).item()


@pytest.mark.parametrize("kind", ["zero", "mean", "resample"])
def test_fast_sweep_equals_plain_full_forward_per_head(gpt, hooked, toks, ref, kind):
    reference = None if kind == "zero" else ref
    df = ablation_sweep(hooked, toks, "loss", kind=kind, reference=reference)
    assert list(df.columns) == ["layer", "block", "head", "metric", "ablated", "clean", "change"]
    assert len(df) == 3 * 2 and (df["block"] == df["layer"] + 1).all()
    with torch.no_grad():
        clean = _loss(gpt(toks)[0], toks)
    assert df["clean"].iloc[0] == pytest.approx(clean, abs=ATOL)
    for row in df.itertuples():
        v = _replacement(gpt, kind, ref, toks, row.layer, row.head)
        plain = _loss(_plain_ablated_logits(gpt, toks, [((row.layer, row.head), v)]), toks)
        assert row.ablated == pytest.approx(plain, abs=ATOL), (row.layer, row.head)
    assert df["change"].abs().max() > 1e-2  # the heads matter, so the check is not vacuous


@pytest.mark.parametrize("kind", ["zero", "mean", "resample"])
@pytest.mark.parametrize(
    "metric",
    ["loss", "copying", "copying_ratio", TargetLogProb([3, 9, 12], [5, 6, 7]),
     TargetLogProb([2, 14, 9, 5], [5, 6, 7, 8], rows=[0, 1, 2, 3]), lambda logits, tokens: logits[:, -1, 3].mean(),
     LogitDiff(answer=[3, 9, 4, 8], wrong=7, pos=10), LogProb(target=5, pos=-1)],
    ids=["loss", "copying", "copying_ratio", "target", "target_rows", "callable", "logit_diff", "log_prob"],
)
def test_fast_equals_naive_all_metrics(hooked, toks, ref, kind, metric):
    reference = None if kind == "zero" else ref
    fast = ablation_sweep(hooked, toks, metric, kind=kind, reference=reference)
    naive = ablation_sweep(hooked, toks, metric, kind=kind, reference=reference, method="naive")
    assert fast.attrs["method"] == "fast" and naive.attrs["method"] == "naive"
    torch.testing.assert_close(torch.tensor(fast["ablated"].to_numpy()), torch.tensor(naive["ablated"].to_numpy()), atol=ATOL, rtol=0)
    assert fast["clean"].iloc[0] == pytest.approx(naive["clean"].iloc[0], abs=ATOL)


def test_fast_sweep_runs_the_last_block_only_where_the_metric_reads(hooked, toks):
    """The copying and target metrics read few positions, so the fast sweep trims the last block (the
    equality tests above then cover that path); the loss reads them all, and a hook on the last block
    turns the trimming off so that the hook sees every position."""
    from sprout_interp.circuits.ablation import trimmed_positions
    from sprout_interp.circuits.metrics import bind_metric

    T = toks.shape[1]
    P = T - 1
    for metric, want in [("copying", list(range(8, 15))), (TargetLogProb([3, 9, 12], [5, 6, 7]), [3, 9, 12])]:
        at = trimmed_positions(hooked, bind_metric(metric, toks, None), P)
        assert at is not None and at.tolist() == want
    assert trimmed_positions(hooked, bind_metric("loss", toks, None), P) is None
    # the trimmed last block equals the full block at the positions it keeps
    resid = hooked(toks, stop_at_layer=2)
    full = hooked.blocks[2](resid, hooked.model.cos[:T], hooked.model.sin[:T])
    at = torch.tensor([0, 5, 6, 15])
    torch.testing.assert_close(hooked.run_block_at(2, resid, at), full[:, at], atol=1e-5, rtol=1e-5)
    # any block, not only the last: block 1 at chosen positions equals its full forward there
    resid1 = hooked(toks, stop_at_layer=1)
    full1 = hooked.blocks[1](resid1, hooked.model.cos[:T], hooked.model.sin[:T])
    torch.testing.assert_close(hooked.run_block_at(1, resid1, at), full1[:, at], atol=1e-5, rtol=1e-5)
    with pytest.raises(SproutError):
        hooked.run_block_at(hooked.cfg.n_layers, resid, at)
    with hooked.hooks(fwd_hooks=[("blocks.2.hook_mlp_out", lambda x, hook: x)]):
        assert trimmed_positions(hooked, bind_metric("copying", toks, None), P) is None
    assert trimmed_positions(hooked, bind_metric("copying", toks, None), P) is not None


def test_fast_sweep_keeps_the_users_hooks(hooked, toks):
    """A hook the user holds on the last block applies to both sweeps alike (the fast one stops trimming)."""
    halve = [("blocks.2.hook_attn_out", lambda x, hook: 0.5 * x)]
    with hooked.hooks(fwd_hooks=halve):
        fast = ablation_sweep(hooked, toks, "copying")
        naive = ablation_sweep(hooked, toks, "copying", method="naive")
    plain = ablation_sweep(hooked, toks, "copying")
    assert (fast["ablated"] - naive["ablated"]).abs().max() < ATOL
    assert (fast["ablated"] - plain["ablated"]).abs().max() > 1e-3  # the hook did change the result


def test_fast_sweep_heads_per_batch_and_subset(hooked, toks):
    base = ablation_sweep(hooked, toks, "loss", heads_per_batch=1)
    for g in (2, 5):
        other = ablation_sweep(hooked, toks, "loss", heads_per_batch=g)
        assert (other["ablated"] - base["ablated"]).abs().max() < ATOL
    sub = ablation_sweep(hooked, toks, "loss", heads=[(2, 1), (0, 0)])
    assert list(zip(sub["layer"], sub["head"])) == [(2, 1), (0, 0)]
    want = base.set_index(["layer", "head"]).loc[[(2, 1), (0, 0)], "ablated"].to_numpy()
    assert abs(sub["ablated"].to_numpy() - want).max() < ATOL


@pytest.mark.parametrize("method", ["fast", "naive"])
def test_sweep_reports_its_progress(hooked, toks, method):
    """``progress(done, total)`` after each head (naive) or group of heads (fast), ending at every head."""
    calls = []
    df = ablation_sweep(hooked, toks, method=method, heads_per_batch=2, progress=lambda d, t: calls.append((d, t)))
    n = len(df)
    assert calls[-1] == (n, n) and all(t == n for _, t in calls)
    assert [d for d, _ in calls] == sorted({d for d, _ in calls}) and calls[0][0] >= 1
    if method == "naive":
        assert len(calls) == n


def test_sweep_with_padding_ignores_padded_targets(hooked):
    g = torch.Generator().manual_seed(3)
    toks = torch.randint(1, 64, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[1, 7:] = False
    mask[2, 4:] = False
    fast = ablation_sweep(hooked, toks, "loss", attention_mask=mask)
    naive = ablation_sweep(hooked, toks, "loss", attention_mask=mask, method="naive")
    assert (fast["ablated"] - naive["ablated"]).abs().max() < ATOL
    # changing the padding changes nothing
    toks2 = toks.clone()
    toks2[~mask] = 5
    again = ablation_sweep(hooked, toks2, "loss", attention_mask=mask)
    assert (again["ablated"] - fast["ablated"]).abs().max() < ATOL
    r = ablate(hooked, toks, [(0, 1)], attention_mask=mask)
    assert r.loss.shape == (3, 11) and (r.loss[2, 3:] == 0).all()


def test_ablate_matches_plain_forward_several_heads(gpt, hooked, toks, ref):
    heads = [(0, 1), (2, 0), (2, 1)]
    for kind in ("zero", "mean", "resample"):
        reference = None if kind == "zero" else ref
        res = ablate(hooked, toks, heads, kind=kind, reference=reference)
        hv = [((l, h), _replacement(gpt, kind, ref, toks, l, h)) for l, h in heads]
        plain = _plain_ablated_logits(gpt, toks, hv)
        torch.testing.assert_close(res.logits, plain, atol=1e-4, rtol=0)
        assert res.loss.shape == (4, 15)
        assert res.mean_loss == pytest.approx(_loss(plain, toks), abs=ATOL)


def test_ablate_leaves_no_hooks(hooked, toks):
    ablate(hooked, toks, [(1, 0)], kind="mean", reference=toks)
    ablation_sweep(hooked, toks, "loss", kind="resample")
    attribution_sweep(hooked, toks, "loss")
    assert all(not hp._forward_hooks and not hp._backward_hooks for hp in hooked.hook_dict.values())
    with torch.no_grad():
        torch.testing.assert_close(hooked(toks), hooked.model(toks)[0], atol=1e-5, rtol=0)


def test_resample_default_uses_other_rows(gpt, hooked, toks):
    res = ablate(hooked, toks, [(1, 1)], kind="resample")
    v = _replacement(gpt, "resample", toks.roll(1, dims=0), toks, 1, 1)
    plain = _plain_ablated_logits(gpt, toks, [((1, 1), v)])
    torch.testing.assert_close(res.logits, plain, atol=1e-4, rtol=0)


def test_head_means_and_precomputed_reference(gpt, hooked, toks, ref):
    means = head_means(hooked, ref)
    assert means.shape == (3, 2, 8)
    v = _replacement(gpt, "mean", ref, toks, 2, 1)[0, 0]
    torch.testing.assert_close(means[2, 1], v, atol=1e-5, rtol=0)
    a = ablation_sweep(hooked, toks, "loss", kind="mean", reference=means)
    b = ablation_sweep(hooked, toks, "loss", kind="mean", reference=ref)
    assert (a["ablated"] - b["ablated"]).abs().max() < ATOL


def test_copying_metric_matches_evaluation_definition(gpt, hooked):
    from sprout_model.evaluation import repeated_tokens_loss_ratio

    toks = repeated_tokens_batch(64, 8, batch=4, seed=0)
    want = repeated_tokens_loss_ratio(gpt, seq_len=8, batch=4, seed=0)
    df = ablation_sweep(hooked, toks, "copying_ratio", heads=[(0, 0)])
    assert df["clean"].iloc[0] == pytest.approx(want.ratio, abs=1e-5)
    df = ablation_sweep(hooked, toks, "copying", heads=[(0, 0)])
    assert df["clean"].iloc[0] == pytest.approx(want.second, abs=1e-5)
    df = ablation_sweep(hooked, toks, CopyingLoss(seq_len=8), heads=[(0, 0)])
    assert df["clean"].iloc[0] == pytest.approx(want.second, abs=1e-5)


def test_target_logprob_metric(gpt, hooked, toks):
    df = ablation_sweep(hooked, toks[:1], TargetLogProb([2, 5], [9, 11]), heads=[(0, 0)])
    with torch.no_grad():
        lp = torch.log_softmax(gpt(toks[:1])[0][0], -1)
    assert df["clean"].iloc[0] == pytest.approx(((lp[2, 9] + lp[5, 11]) / 2).item(), abs=1e-5)
    df = ablation_sweep(hooked, toks[:2], TargetLogProb([2], [9], rows=[1]), heads=[(0, 0)])
    with torch.no_grad():
        lp = torch.log_softmax(gpt(toks[:2])[0][1], -1)
    assert df["clean"].iloc[0] == pytest.approx(lp[2, 9].item(), abs=1e-5)


def test_attribution_patching(hooked, toks):
    est = attribution_sweep(hooked, toks, "loss", kind="zero")
    assert list(est.columns) == ["layer", "block", "head", "metric", "estimate"] and len(est) == 6
    both = ablation_sweep(hooked, toks, "loss", kind="zero", attribution=True)
    assert (both["estimate"] - est["estimate"]).abs().max() < 1e-5
    assert -1 <= both.attrs["spearman"] <= 1
    # a gentle ablation (mean over the same tokens, heads barely changed) is close to linear
    g = _strong(seed=1)
    with torch.no_grad():
        for b in g.blocks:
            b.attn.proj.weight.div_(40.0)
    gentle = ablation_sweep(HookedSprout(g), toks, "loss", kind="mean", reference=toks, attribution=True)
    assert gentle.attrs["spearman"] > 0.8
    assert (gentle["estimate"] - gentle["change"]).abs().max() < 0.5 * gentle["change"].abs().max()


def test_attribution_estimate_is_gradient_dot_difference(gpt, hooked, toks):
    """estimate = (0 - z) . dloss/dz, checked with plain autograd on the GPT's output-projection input."""
    est = attribution_sweep(hooked, toks, "loss", kind="zero").set_index(["layer", "head"])["estimate"]
    dh = gpt.cfg.d_model // gpt.cfg.n_head
    for l in range(3):
        seen = {}

        def pre(mod, args):
            y = args[0].detach().requires_grad_(True)
            seen["y"] = y
            return (y,)

        hd = gpt.blocks[l].attn.proj.register_forward_pre_hook(pre)
        try:
            logits, _ = gpt(toks)
            (g,) = torch.autograd.grad(_loss_t(logits, toks), [seen["y"]])
        finally:
            hd.remove()
        for h in range(2):
            sl = slice(h * dh, (h + 1) * dh)
            want = float((-seen["y"][..., sl].detach() * g[..., sl]).sum())
            assert est[(l, h)] == pytest.approx(want, rel=1e-4, abs=1e-6)


def _loss_t(logits, toks):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), toks[:, 1:].reshape(-1))


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [5, 5, 5]) != spearman([1, 2, 3], [5, 5, 5])  # NaN
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)


def test_runner_stands_in_for_gpt(gpt, hooked, toks):
    clean, _ = AblatedRunner(hooked)(toks)
    torch.testing.assert_close(clean, gpt(toks)[0], atol=1e-5, rtol=0)
    abl, _ = AblatedRunner(hooked, [(1, 0)], "zero")(toks)
    torch.testing.assert_close(abl, ablate(hooked, toks, [(1, 0)]).logits, atol=0, rtol=0)


def test_plain_gpt_is_accepted(gpt, toks):
    df = ablation_sweep(gpt, toks, "loss", heads=[(0, 0)])
    assert len(df) == 1


@pytest.mark.unchecked_types
def test_errors_say_what_to_do(hooked, toks):
    with pytest.raises(AblationError, match=r"layers 0\.\.2 in code .*heads per block, numbered 0\.\.1"):
        ablate(hooked, toks, [(9, 0)])
    with pytest.raises(AblationError, match="head 5"):
        ablation_sweep(hooked, toks, heads=[(0, 5)])
    with pytest.raises(AblationError, match="kind must be one of"):
        ablate(hooked, toks, [(0, 0)], kind="noise")
    with pytest.raises(AblationError, match="unknown metric"):
        ablation_sweep(hooked, toks, metric="accuracy")
    with pytest.raises(AblationError, match="repeated twice"):
        ablation_sweep(hooked, torch.randint(1, 64, (2, 10)), metric="copying")
    with pytest.raises(AblationError, match="tokenizer"):
        ablate(hooked, toks, [(0, 0)], kind="mean")  # no tokenizer: no default reference
    with pytest.raises(AblationError, match="longer reference"):
        ablate(hooked, toks, [(0, 0)], kind="resample", reference=toks[:, :4])
    with pytest.raises(AblationError, match="head means"):
        ablate(hooked, toks, [(0, 0)], kind="mean", reference=torch.zeros(2, 2))
    with pytest.raises(SproutError):
        ablation_sweep(hooked, toks, method="slow")
    assert issubclass(AblationError, ValueError)


# ---------------------------------------------------------------- shipped checkpoints


def _need(name):
    if not (CHECKPOINTS / name / "model.safetensors").is_file():
        pytest.skip(f"model/checkpoints/{name}/model.safetensors is not there yet")


@pytest.mark.acceptance  # 15-27 s each
@pytest.mark.parametrize("kind", ["zero", "mean", "resample"])
def test_shipped_sprout_fast_sweep_equals_naive(kind):
    _need("sprout")
    import sprout_interp as si

    m = si.load("sprout")
    toks = repeated_tokens_batch(m.cfg.d_vocab, 32, batch=2, seed=0)
    ref = torch.randint(1, m.cfg.d_vocab, (4, 64), generator=torch.Generator().manual_seed(0))
    reference = None if kind == "zero" else ref
    heads = [(0, 0), (1, 3), (4, 5), (7, 2)]
    for metric in ("loss", "copying_ratio"):
        fast = ablation_sweep(m, toks, metric, kind=kind, reference=reference, heads=heads)
        naive = ablation_sweep(m, toks, metric, kind=kind, reference=reference, heads=heads, method="naive")
        assert (fast["ablated"] - naive["ablated"]).abs().max() < ATOL


@pytest.mark.acceptance  # over 3 s
def test_shipped_ablation_runs_on_text():
    _need("gpt-4")
    import sprout_interp as si

    m = si.load("gpt-4")
    res = ablate(m, ["Zorbin Plax came home.", "Zorbin Plax came home late, and Zorbin Plax slept."], [(1, 0)], kind="mean")
    assert res.logits.shape[0] == 2 and res.mean_loss > 0


def test_sweep_macs_counts_both_methods():
    from types import SimpleNamespace

    from sprout_interp.circuits.ablation import sweep_macs

    cfg = SimpleNamespace(d_model=4, d_mlp=8, d_vocab=10, n_layers=2, n_heads=2)
    # a block at 3 positions: 3 x (4·16 + 3·4·8) matrix products + 4 x (1+2+3) x 2 causal score/value products
    block = 3 * (64 + 96) + 4 * 3 * 4
    naive_one = 2 * block + 3 * 4 * 10
    tail = 3 * (16 + 96)  # W_O and the MLP of the ablated head's block
    fast = (2 * block + 3 * 40) + 2 * (tail + block + 3 * 40) + 2 * (tail + 3 * 40)
    got = sweep_macs(cfg, 3)
    assert got["naive"] == 5 * naive_one and got["fast"] == fast and got["ratio"] == pytest.approx(fast / (5 * naive_one))
    # reading fewer positions, or a shorter prefix, only lowers the fast sweep's count
    assert sweep_macs(cfg, 3, read=1)["fast"] < fast and sweep_macs(cfg, 3, read=1, prefix=2)["fast"] < sweep_macs(cfg, 3, read=1)["fast"]
    assert sweep_macs(cfg, 3, read=1)["naive"] == got["naive"]
    # reading 1 of 3 positions, the last block is trimmed: W_K, W_V at 3 positions, the rest of the block at 1
    last = 3 * 2 * 16 + 1 * (2 * 16 + 96 + 2 * 4 * 3)
    fast_read1 = (2 * block + 40) + 2 * (tail + last + 40) + 2 * (1 * (16 + 96) + 40)
    assert sweep_macs(cfg, 3, read=1)["fast"] == fast_read1


def test_metric_reach_is_what_the_fast_sweep_reads(toks):
    from sprout_interp.circuits.ablation import TargetLogProb, metric_reach

    B, T = toks.shape
    assert metric_reach("loss", toks) == (float(T - 1), T - 1)  # every position that has a next token
    target = TargetLogProb([5] * B, toks[:, 6].tolist(), rows=range(B))
    assert metric_reach(target, toks) == (1.0, 6)  # one position per row; nothing after position 5 matters


def test_ablated_context_runs_any_code_with_the_heads_ablated(hooked, toks, ref):
    from sprout_interp.circuits.ablation import ablated

    heads = [(0, 1), (2, 0)]
    with torch.no_grad():
        clean = hooked(toks)
        for kind, reference in (("zero", None), ("mean", ref), ("mean", head_means(hooked, ref))):
            with ablated(hooked, heads, kind, reference):
                inside = hooked(toks)
            torch.testing.assert_close(inside, ablate(hooked, toks, heads, kind, ref).logits, atol=ATOL, rtol=0)
            assert not torch.allclose(inside, clean, atol=1e-3)
        torch.testing.assert_close(hooked(toks), clean, atol=0, rtol=0)  # the hooks are gone afterwards
    assert all(not hp._forward_hooks for hp in hooked.hook_dict.values())
    with pytest.raises(AblationError, match="resample"):
        ablated(hooked, heads, "resample")
    with pytest.raises(AblationError, match="no head"):
        ablated(hooked, [(5, 0)], "zero")
