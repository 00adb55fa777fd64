"""The logit lens: exactness against the model's own output, chunking, padding, the per-row metrics and
the claim helpers; the confidence_drop script end to end on a tiny checkpoint; the shipped checkpoints."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import analysis_script, tiny_config

from sprout_interp.core import loading
from sprout_interp.core.hooked import HookedSprout
from sprout_interp.core.texts import TEXTS
from sprout_interp.lens.logit_lens import (
    CHAPTER_SPROUT_CONFIDENCE,
    LogitLens,
    embedding_echo_rate,
    lens_log_probs,
    logit_lens,
    penultimate_vs_final,
    read_out,
)
from sprout_model import GPT
from sprout_model.tokenizer import train_tokenizer

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_DIR = ROOT / "model" / "checkpoints"


@pytest.fixture
def toks() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (3, 12), generator=g)


def _naive(g: GPT, toks: torch.Tensor):
    """Everything the lens reports, computed the slow obvious way from the plain GPT."""
    x = g.embed(toks)
    rows = [x]
    cos, sin = g.cos[: toks.shape[1]], g.sin[: toks.shape[1]]
    for b in g.blocks:
        x = b(x, cos, sin)
        rows.append(x)
    lp = torch.stack([F.log_softmax(g.head(g.norm(r)), -1) for r in rows])  # (R, B, T, V)
    return lp


# --- exactness -----------------------------------------------------------------------------------


def test_final_row_is_the_models_output_distribution(hooked, tiny_model, toks):
    lens = logit_lens(hooked, toks, k=5)
    with torch.no_grad():
        probs = F.softmax(tiny_model(toks)[0], -1)  # the plain GPT, not the hooked wrapper
    top_p, top_i = probs.topk(5, -1)
    torch.testing.assert_close(lens.topk_probs[-1], top_p, atol=1e-5, rtol=0)
    assert torch.equal(lens.topk_ids[-1], top_i)
    nxt = probs[:, :-1].gather(-1, toks[:, 1:, None])[..., 0]
    torch.testing.assert_close(lens.next_prob[-1, :, :-1], nxt, atol=1e-5, rtol=0)
    ent = -(probs * probs.log()).sum(-1)
    torch.testing.assert_close(lens.entropy[-1], ent, atol=1e-5, rtol=1e-5)
    assert torch.all(lens.kl_final[-1] == 0)


def test_every_row_matches_the_naive_computation(hooked, tiny_model, toks):
    lens = logit_lens(hooked, toks, k=4)
    with torch.no_grad():
        lp = _naive(tiny_model, toks)
        ref = lens_log_probs(hooked, toks)
    torch.testing.assert_close(ref, lp, atol=1e-6, rtol=0)
    R = tiny_model.cfg.n_layer + 1
    assert lens.topk_ids.shape == (R, 3, 12, 4) and lens.rows == ["embedding", "block 1", "block 2"]
    p = lp.exp()
    torch.testing.assert_close(lens.topk_probs, p.topk(4, -1).values, atol=1e-5, rtol=0)
    tgt = toks[:, 1:]
    lp_t = lp[:, :, :-1].gather(-1, tgt[None, ..., None].expand(R, -1, -1, 1))
    torch.testing.assert_close(lens.next_prob[:, :, :-1], lp_t[..., 0].exp(), atol=1e-5, rtol=0)
    rank = (lp[:, :, :-1] > lp_t).sum(-1)
    assert torch.equal(lens.next_rank[:, :, :-1], rank)
    assert torch.all(lens.next_rank[:, :, -1] == -1) and torch.all(torch.isnan(lens.next_prob[:, :, -1]))
    torch.testing.assert_close(lens.entropy, -(p * lp).sum(-1), atol=1e-5, rtol=1e-5)
    kl = (p[-1:] * (lp[-1:] - lp)).sum(-1)
    torch.testing.assert_close(lens.kl_final, kl.clamp(min=0), atol=2e-5, rtol=1e-4)


def test_read_out_is_final_norm_then_tied_head(hooked, tiny_model, toks):
    with torch.no_grad():
        _, cache = hooked.run_with_cache(toks)
        out = read_out(hooked, cache["blocks.1.hook_resid_post"])
        torch.testing.assert_close(out, tiny_model(toks)[0], atol=1e-5, rtol=0)
    assert tiny_model.head.weight is tiny_model.embed.weight


def test_cross_entropy_is_the_models_loss_in_nats(hooked, toks):
    lens = logit_lens(hooked, toks)
    with torch.no_grad():
        loss = hooked(toks, return_type="loss")
    assert lens.cross_entropy[-1].item() == pytest.approx(loss.item(), abs=1e-5)
    assert lens.summary()["cross_entropy"].iloc[-1] == pytest.approx(loss.item(), abs=1e-5)


@pytest.mark.parametrize("chunk", [1, 5, 7, 36, 10_000])
def test_chunked_equals_unchunked(hooked, toks, chunk):
    full = logit_lens(hooked, toks, chunk=None)
    part = logit_lens(hooked, toks, chunk=chunk)
    for f in ("topk_ids", "next_rank"):
        assert torch.equal(getattr(full, f), getattr(part, f)), f
    for f in ("topk_probs", "next_prob", "entropy", "kl_final"):
        torch.testing.assert_close(getattr(part, f), getattr(full, f), atol=1e-6, rtol=1e-6, equal_nan=True)


def test_plain_gpt_and_1d_tokens_are_accepted(tiny_model, hooked, toks):
    a = logit_lens(tiny_model, toks[0])
    b = logit_lens(hooked, toks[:1])
    assert torch.equal(a.topk_ids, b.topk_ids)
    torch.testing.assert_close(a.topk_probs, b.topk_probs)


def test_no_hook_is_left_registered(hooked, toks):
    logit_lens(hooked, toks)
    assert not any(hp._forward_hooks for hp in hooked.hook_dict.values())


# --- padding -------------------------------------------------------------------------------------


def test_padding_is_left_out(hooked):
    a = torch.tensor([5, 9, 2, 33, 7, 1, 4, 8])
    b = torch.tensor([3, 3, 60, 12, 40])
    toks = torch.zeros(2, 8, dtype=torch.long)
    toks[0], toks[1, :5] = a, b
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[0], mask[1, :5] = True, True
    lens = logit_lens(hooked, toks, attention_mask=mask)
    la, lb = logit_lens(hooked, a), logit_lens(hooked, b)
    # real positions are the same as alone (causal attention: right padding cannot leak back)
    torch.testing.assert_close(lens.topk_probs[:, 1, :5], lb.topk_probs[:, 0], atol=1e-6, rtol=0)
    torch.testing.assert_close(lens.next_prob[:, 1, :5], lb.next_prob[:, 0], atol=1e-6, rtol=0, equal_nan=True)
    assert lens.has_next[1].tolist() == [True] * 4 + [False] * 4
    assert lens.has_next[0].tolist() == [True] * 7 + [False]
    # the means pool the real positions of both sequences
    conf = torch.cat([la.topk_probs[:, 0, :, 0], lb.topk_probs[:, 0, :, 0]], 1).mean(1)
    torch.testing.assert_close(lens.confidence, conf, atol=1e-6, rtol=0)
    ce = torch.cat([-la.next_prob[:, 0, :-1].log(), -lb.next_prob[:, 0, :-1].log()], 1).mean(1)
    torch.testing.assert_close(lens.cross_entropy, ce, atol=1e-5, rtol=0)
    s = lens.summary()
    assert s["n_tokens"].iloc[0] == 13 and s["n_predictions"].iloc[0] == 11
    cells = lens.cells()
    assert len(cells) == 3 * 13 and not ((cells["batch"] == 1) & (cells["pos"] >= 5)).any()
    assert (cells.loc[(cells["batch"] == 1) & (cells["pos"] == 4), "next_id"] == -1).all()


def test_text_batch_from_to_tokens_with_mask():
    tok = train_tokenizer(list(TEXTS.values()) * 3, vocab_size=300)
    torch.manual_seed(0)
    m = HookedSprout(GPT(tiny_config(vocab_size=300, context=1024)).eval(), tokenizer=tok)
    toks, mask = m.to_tokens_with_mask(["Zorbin Plax came home.", "The valley lay quiet under the first snow."])
    lens = logit_lens(m, toks, attention_mask=mask)
    assert int(lens.mask.sum()) == int(mask.sum())
    cells = lens.cells(m.to_str_tokens)
    first = cells[(cells["batch"] == 0) & (cells["block"] == 0)]
    assert "".join(first["token"]) == "Zorbin Plax came home."
    assert first["next_token"].iloc[0] == m.to_str_tokens(toks[0, 1:2])[0]


# --- metrics and conventions ---------------------------------------------------------------------


def test_summary_conventions(hooked, toks):
    s = logit_lens(hooked, toks).summary()
    assert list(s.columns) == ["row", "block", "layer", "confidence", "accuracy", "cross_entropy", "entropy",
                               "kl_final", "n_tokens", "n_predictions"]
    assert s["row"].tolist() == ["embedding", "block 1", "block 2"]
    assert s["block"].tolist() == [0, 1, 2] and s["layer"].tolist() == [-1, 0, 1]
    assert s["kl_final"].iloc[-1] == 0
    assert ((s["confidence"] > 0) & (s["confidence"] <= 1)).all()
    assert ((s["accuracy"] >= 0) & (s["accuracy"] <= 1)).all()
    # entropy of an 64-way distribution is at most log 64 nats
    assert (s["entropy"] <= math.log(64) + 1e-5).all()


def _fake_lens(top1: list[list[int]], tokens: list[int]) -> LogitLens:
    """A lens over one sequence whose top-1 per row is given (rows × positions)."""
    R, T = len(top1), len(tokens)
    ids = torch.tensor(top1).view(R, 1, T, 1)
    toks = torch.tensor([tokens])
    mask = torch.ones(1, T, dtype=torch.bool)
    has_next = torch.ones(1, T, dtype=torch.bool)
    has_next[0, -1] = False
    z = torch.zeros(R, 1, T)
    return LogitLens(rows=["embedding"] + [f"block {i}" for i in range(1, R)], tokens=toks, mask=mask,
                     has_next=has_next, topk_ids=ids, topk_probs=torch.full((R, 1, T, 1), 0.5),
                     next_prob=z, next_rank=z.long(), entropy=z, kl_final=z)


def test_first_correct_row():
    # tokens 1 2 3 4 5: the next tokens are 2 3 4 5 (and none for the last)
    lens = _fake_lens([
        [1, 2, 3, 4, 5],  # embedding: echoes the input; never right here
        [2, 9, 9, 9, 9],  # block 1: right at pos 0
        [9, 3, 9, 5, 9],  # block 2: right at pos 1 and 3
        [2, 3, 9, 9, 9],  # block 3 (final): right at pos 0, 1
    ], [1, 2, 3, 4, 5])
    assert lens.first_correct_row().tolist() == [[1, 2, -1, -1, -1]]
    assert lens.first_correct_row(require_final=False).tolist() == [[1, 2, -1, 2, -1]]
    assert lens.mean_first_correct() == pytest.approx(1.5)
    counts = lens.first_correct_counts()
    assert counts["count"].tolist() == [0, 1, 1, 0] and counts["share"].tolist() == [0, 0.5, 0.5, 0]
    assert embedding_echo_rate(lens) == 1.0
    assert lens.accuracy.tolist() == [0.0, 0.25, 0.5, 0.5]


def test_embedding_echo_rate_counts_real_positions(hooked, toks):
    lens = logit_lens(hooked, toks)
    with torch.no_grad():
        top = lens_log_probs(hooked, toks)[0].argmax(-1)
    assert embedding_echo_rate(lens) == pytest.approx((top == toks).float().mean().item())
    lens.mask[:, 6:] = False
    assert embedding_echo_rate(lens) == pytest.approx((top == toks)[:, :6].float().mean().item())


def test_penultimate_vs_final():
    s = pd.DataFrame({"block": [0, 1, 2, 3], "confidence": [0.9, 0.5, 0.77, 0.59]})
    d = penultimate_vs_final(s)
    assert d["penultimate_block"] == 2 and d["final_block"] == 3
    assert d["drop"] == pytest.approx(0.18) and d["ratio"] == pytest.approx(0.59 / 0.77)
    assert CHAPTER_SPROUT_CONFIDENCE == {7: 0.77, 8: 0.59}


# --- the script ----------------------------------------------------------------------------------


def test_confidence_drop_script_runs(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    rc = analysis_script("confidence_drop").main(["--models", str(tiny_checkpoint), "--n", "0", "--out", str(out), "--no-png"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "penultimate vs final" in text and "== verdicts ==" in text and "77%" in text
    for f in ("by_layer.csv", "claims.csv", "first_correct.csv", "by_layer.html", "lens_grid_tiny.html"):
        assert (out / f).is_file(), f
    by_layer = pd.read_csv(out / "by_layer.csv")
    assert by_layer["block"].tolist() == [0, 1, 2] and set(by_layer["text_set"]) == {"texts"}


def test_confidence_drop_script_reports_a_missing_shipped_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(loading, "SHIPPED_DIR", tmp_path / "none")
    rc = analysis_script("confidence_drop").main(["--models", "sprout", "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "skipping sprout" in err and "not installed" in err


# --- shipped checkpoints -------------------------------------------------------------------------


def _shipped(name: str):
    if not (SHIPPED_DIR / name / "model.safetensors").is_file():
        pytest.skip(f"shipped checkpoint {name} is not there (model/checkpoints/{name}/model.safetensors)")
    import sprout_interp as si

    return si.load(name)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["gpt-1", "gpt-4", "sprout"])
def test_shipped_lens_on_the_three_texts(name):
    m = _shipped(name)
    toks, mask = m.to_tokens_with_mask(list(TEXTS.values()))
    lens = logit_lens(m, toks, attention_mask=mask, chunk=128)
    with torch.no_grad():
        probs = F.softmax(m.model(toks)[0], -1)
    torch.testing.assert_close(lens.topk_probs[-1], probs.topk(5, -1).values, atol=1e-5, rtol=0)
    nxt = probs[:, :-1].gather(-1, toks[:, 1:, None])[..., 0]
    real = lens.has_next[:, :-1]
    torch.testing.assert_close(lens.next_prob[-1, :, :-1][real], nxt[real], atol=1e-5, rtol=0)
    full = logit_lens(m, toks, attention_mask=mask, chunk=None)
    torch.testing.assert_close(full.topk_probs, lens.topk_probs, atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        loss = m(toks, return_type="loss", attention_mask=mask)
    assert lens.cross_entropy[-1].item() == pytest.approx(loss.item(), abs=1e-4)
    s = lens.summary()
    assert len(s) == m.cfg.n_layers + 1
    assert 0 <= embedding_echo_rate(lens) <= 1
