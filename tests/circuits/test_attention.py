"""Attention patterns, head scores and the induction circuit, on tiny random models and hand-made patterns."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import pinned_threads, tiny_config

from sprout_interp import HookedSprout
from sprout_interp.circuits import induction
from sprout_interp.circuits.ablation import ablate
from sprout_interp.circuits.attention import SCORE_COLUMNS, attention_patterns, head_scores, pattern_scores, score_masks
from sprout_interp.circuits.evidence import ablation_effects, specificity
from sprout_interp.circuits.heads import head_label, heads_label
from sprout_interp.circuits.induction import find_induction_circuit
from sprout_interp.core.errors import AblationError
from sprout_model import GPT
from sprout_model.evaluation import repeated_tokens_batch

pytestmark = pytest.mark.unit

CHECKPOINTS = Path(__file__).resolve().parents[2] / "model" / "checkpoints"


@pytest.fixture(scope="module")
def hooked() -> HookedSprout:
    torch.manual_seed(0)
    return HookedSprout(GPT(tiny_config(n_layer=3, n_head=2)).eval())


def _forced(hooked, make):
    """Hooks replacing every block's pattern with ``make(T)`` (query, key)."""
    def hook(pattern, hook):
        T = pattern.shape[-1]
        return make(T).to(pattern.dtype).expand_as(pattern).clone()

    return [(f"blocks.{l}.attn.hook_pattern", hook) for l in range(hooked.cfg.n_layers)]


def _prev_token(T):
    p = torch.zeros(T, T)
    p[0, 0] = 1.0
    p[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    return p


def _induction(n):
    def make(T):
        p = torch.eye(T)  # first copy: attend to itself
        for q in range(n, T):
            p[q] = 0.0
            p[q, q - n + 1] = 1.0  # the token after the earlier copy of token q
        return p

    return make


UNIQUE_REPEATED = torch.arange(1, 9).repeat(2)[None].repeat(3, 1)  # (3, 16): 8 distinct tokens, twice


def test_score_masks_by_hand():
    toks = torch.tensor([[5, 6, 5, 6, 7]])
    m = score_masks(toks)
    assert m["prev_token"][0].nonzero().tolist() == [[1, 0], [2, 1], [3, 2], [4, 3]]
    assert m["duplicate"][0].nonzero().tolist() == [[2, 0], [3, 1]]
    assert m["induction"][0].nonzero().tolist() == [[2, 1], [3, 2]]  # after the earlier 5 is 6; after the earlier 6 is 5
    pad = score_masks(toks, torch.tensor([[True, True, True, False, False]]))
    assert pad["duplicate"][0].nonzero().tolist() == [[2, 0]]


def test_previous_token_pattern_scores_one(hooked):
    with hooked.hooks(fwd_hooks=_forced(hooked, _prev_token)):
        s = pattern_scores(hooked, UNIQUE_REPEATED)
    assert torch.allclose(s["prev_token"], torch.ones(3, 2))
    assert torch.allclose(s["induction"], torch.zeros(3, 2))
    assert torch.allclose(s["duplicate"], torch.zeros(3, 2))


def test_induction_pattern_scores_one(hooked):
    with hooked.hooks(fwd_hooks=_forced(hooked, _induction(8))):
        s = pattern_scores(hooked, UNIQUE_REPEATED)
    assert torch.allclose(s["induction"], torch.ones(3, 2))
    assert torch.allclose(s["duplicate"], torch.zeros(3, 2))
    assert torch.allclose(s["prev_token"], torch.zeros(3, 2))


def test_duplicate_pattern_scores_one(hooked):
    def dup(T):
        p = torch.eye(T)
        for q in range(8, T):
            p[q] = 0.0
            p[q, q - 8] = 1.0
        return p

    with hooked.hooks(fwd_hooks=_forced(hooked, dup)):
        s = pattern_scores(hooked, UNIQUE_REPEATED)
    assert torch.allclose(s["duplicate"], torch.ones(3, 2))
    assert torch.allclose(s["induction"], torch.zeros(3, 2))


def test_pattern_scores_batching_does_not_matter(hooked):
    toks = repeated_tokens_batch(64, 8, batch=5, seed=3)
    a = pattern_scores(hooked, toks, batch_size=2)
    b = pattern_scores(hooked, toks, batch_size=16)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0)


def test_attention_patterns_shapes_and_padding(hooked):
    toks = torch.randint(1, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    one = attention_patterns(hooked, toks[0])
    assert one.shape == (3, 2, 10, 10)
    torch.testing.assert_close(one.sum(-1), torch.ones(3, 2, 10), atol=1e-5, rtol=0)
    assert torch.all(one.triu(1) == 0)
    _, cache = hooked.run_with_cache(toks[:1])
    torch.testing.assert_close(one[1], cache["blocks.1.attn.hook_pattern"][0], atol=1e-6, rtol=0)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 6:] = False
    both = attention_patterns(hooked, toks, attention_mask=mask)
    assert [p.shape for p in both] == [(3, 2, 10, 10), (3, 2, 6, 6)]
    torch.testing.assert_close(both[1], attention_patterns(hooked, toks[1, :6]), atol=1e-6, rtol=0)
    sub = attention_patterns(hooked, toks[0], layers=[2, 0])
    torch.testing.assert_close(sub, one[[2, 0]])
    with pytest.raises(AblationError, match="layers 0..2 in code"):
        attention_patterns(hooked, toks[0], layers=[3])


def test_head_scores_table(hooked):
    natural = torch.randint(1, 64, (3, 20), generator=torch.Generator().manual_seed(1))
    df = head_scores(hooked, seq_len=8, batch=4, natural=natural)
    assert list(df.columns) == ["layer", "block", "head", *SCORE_COLUMNS, "copying_ratio_ablated", "copying_ratio_change"]
    assert len(df) == 6 and (df["block"] == df["layer"] + 1).all()
    assert ((df[list(SCORE_COLUMNS)] >= 0) & (df[list(SCORE_COLUMNS)] <= 1 + 1e-6)).all().all()
    assert "0-indexed" in df.attrs["convention"] and df.attrs["clean_copying_ratio"] > 0
    s = pattern_scores(hooked, natural)
    assert df["induction_text"].to_numpy() == pytest.approx(s["induction"].flatten().numpy(), abs=1e-6)
    lean = head_scores(hooked, seq_len=8, batch=4, natural=False, copying=False)
    assert list(lean.columns) == ["layer", "block", "head", "prev_token_random", "duplicate_random", "induction_random"]
    with pytest.raises(AblationError, match="context"):
        head_scores(hooked, seq_len=20)


def _table(prev, ind):
    rows = []
    for l in range(len(prev)):
        for h in range(len(prev[0])):
            rows.append(dict(layer=l, block=l + 1, head=h, prev_token_random=prev[l][h], induction_random=ind[l][h]))
    return pd.DataFrame(rows)


def test_find_induction_circuit_from_scores():
    df = _table(prev=[[0.1, 0.2], [0.9, 0.1], [0.2, 0.1], [0.1, 0.0]], ind=[[0, 0], [0.1, 0], [0.05, 0.8], [0.3, 0]])
    c = find_induction_circuit(scores=df)
    assert (c.prev_layer, c.prev_head, c.induction_layer, c.induction_head) == (1, 0, 2, 1)
    assert (c.prev_block, c.induction_block) == (2, 3)  # the chapter's "layer 2" and "layer 3"
    assert c.prev_earlier and c.found and c.heads() == [(1, 0), (2, 1)]
    assert "block 2 head 0 (layer 1)" in c.summary() and "not confirmed" in c.summary()
    assert not c.confirmed and c.scores_on == "random"  # no text columns: ranked on the random tokens
    assert all(w == "NOT established" for w, _ in c.verdicts().values())  # scores alone establish nothing
    # the best previous-token head sits after the induction head: say so, and name the best earlier one
    df2 = _table(prev=[[0.5, 0.2], [0.1, 0.1], [0.95, 0.1]], ind=[[0, 0], [0.7, 0], [0.1, 0]])
    c2 = find_induction_circuit(scores=df2)
    assert not c2.prev_earlier and (c2.prev_before_layer, c2.prev_before_head) == (0, 0) and c2.found
    assert "NOT in an earlier block" in c2.summary()
    # a one-block model cannot have the circuit
    c3 = find_induction_circuit(scores=_table(prev=[[0.9, 0.1]], ind=[[0.5, 0.1]]))
    assert not c3.found and c3.prev_before_layer is None
    assert c3.as_dict()["induction_block"] == 1


def test_find_induction_circuit_ranks_previous_token_heads_on_both_texts():
    """A head that looks back one token on random tokens but not on text is not the best previous-token head."""
    df = _table(prev=[[0.44, 0.44], [0.0, 0.0]], ind=[[0, 0], [0.9, 0]])
    df["prev_token_text"] = [0.06, 0.45, 0.0, 0.0]
    df["induction_text"] = [0.0, 0.0, 0.3, 0.0]
    df.loc[0, "prev_token_random"] = 0.441  # head 0 wins on random tokens alone
    assert find_induction_circuit(scores=df, on="random").prev_head == 0
    c = find_induction_circuit(scores=df)
    assert c.scores_on == "both" and (c.prev_layer, c.prev_head) == (0, 1) and c.prev_score == pytest.approx(0.44)


def test_find_induction_circuit_runs_on_a_model(hooked):
    held = torch.randint(1, 64, (2, 16), generator=torch.Generator().manual_seed(2))
    c = find_induction_circuit(hooked, seq_len=8, batch=4, natural=held, kind="zero", held_out=held)
    assert 0 <= c.prev_layer < 3 and 0 <= c.induction_layer < 3 and c.scores_on == "both"
    assert c.confirmed and c.copying == "repeated"  # no tokenizer: copying on the repeated random tokens
    ev = c.evidence
    assert ev["condition"].iloc[0] == "clean" and ev["copying_removed"].iloc[0] == 0
    assert set(ev["role"]) <= {"clean", "induction candidate", "previous-token candidate", "set"}
    assert set(c.verdicts()) == {"previous-token", "induction"}
    lean = find_induction_circuit(hooked, seq_len=8, batch=4, natural=False, confirm=False)
    assert not lean.confirmed and lean.scores_on == "random" and lean.evidence is None
    with pytest.raises(AblationError):
        find_induction_circuit(hooked, on="bogus")
    with pytest.raises(AblationError, match="held_out"):  # no tokenizer, no text for the held-out loss
        find_induction_circuit(hooked, seq_len=8, batch=4, natural=held, kind="zero")
    with pytest.raises(AblationError, match="needs the model"):
        find_induction_circuit(scores=head_scores(hooked, seq_len=8, batch=4, natural=False, copying=False), confirm=True)


def test_head_label_and_specificity():
    assert head_label(1, 0) == "block 2 head 0 (layer 1)"
    assert heads_label([(0, 0), (0, 2)]) == "block 1 head 0 (layer 0) + block 1 head 2 (layer 0)" and heads_label([]) == "none"
    known = math.log(8192) - 4.0  # what a model at 4 nats/token has learned, against a uniform guess
    share, spec = specificity(0.75, 0.134, 4.0, 8192)
    assert share == pytest.approx(0.134 / known) and spec == pytest.approx(0.75 / share)
    _, breaks = specificity(1.0, 4.49, 4.0, 8192)  # removes all copying by breaking the model
    assert breaks < 1.2
    assert specificity(0.5, 0.0, 4.0, 8192)[1] == float("inf")
    assert math.isnan(specificity(0.0, -0.01, 4.0, 8192)[1])


def test_ablation_effects_on_a_model(hooked):
    held = torch.randint(1, 64, (2, 16), generator=torch.Generator().manual_seed(2))
    rep = repeated_tokens_batch(64, 8, batch=4, seed=1)
    ev = ablation_effects(hooked, {"one": [(0, 1)], "two": [(0, 1), (2, 0)], "nothing": []}, induction_head=(1, 0),
                          kind="zero", held_out=held, repeated=rep)
    assert ev["condition"].tolist() == ["clean", "one", "two"]
    assert ev["heads"].tolist() == ["none", "block 1 head 1 (layer 0)", "block 1 head 1 (layer 0) + block 3 head 0 (layer 2)"]
    assert ev["layer"].iloc[1] == 0 and ev["block"].iloc[1] == 1 and ev["head"].iloc[1] == 1 and pd.isna(ev["layer"].iloc[2])
    # the held-out loss is ablate()'s, the clean induction score pattern_scores'
    ab = ablate(hooked, held, [(0, 1)], kind="zero")
    assert ev["loss"].iloc[1] == pytest.approx(ab.mean_loss, abs=1e-5)
    assert ev["loss_change"].iloc[1] == pytest.approx(ab.mean_loss - ev.attrs["clean_loss"], abs=1e-5)
    assert ev["induction_score"].iloc[0] == pytest.approx(float(pattern_scores(hooked, rep)["induction"][1, 0]), abs=1e-5)
    assert ev["induction_score"].iloc[2] != ev["induction_score"].iloc[0]  # block 1 feeds block 2's pattern
    with torch.no_grad():
        probs = torch.softmax(hooked(rep), -1)[:, :-1].gather(-1, rep[:, 1:, None])[..., 0]
    assert ev.attrs["clean_copying_second"] == pytest.approx(float(probs[:, 8:].mean()), abs=1e-6)
    assert ev.attrs["copying"] == "repeated" and ev.attrs["kind"] == "zero"
    with pytest.raises(AblationError, match="zero' or 'mean"):
        ablation_effects(hooked, {}, kind="resample", held_out=held)


class _FakeMeasurer:
    """Stands in for the ablation runs: each set of heads gets the numbers in ``EFFECTS`` (clean when absent)."""

    CLEAN = dict(copying_first=0.004, copying_second=0.633, loss=2.0, induction_score=0.88)  # ln(64) - 2.0 = 2.16 nats learned
    EFFECTS: dict = {}

    def __init__(self, model, kind, reference, copying, held_out, repeated, texts=None, seed=0):
        self.kind, self.copying = kind, "names"

    def run(self, heads, induction_head=None):
        r = dict(self.CLEAN, **self.EFFECTS.get(frozenset(heads), {}))
        if induction_head is None:
            r["induction_score"] = float("nan")
        return r

    def induction(self, heads, induction_head):
        return self.run(heads, induction_head)["induction_score"]


def _circuit_scores():
    """Block 1: head 0 looks back on both texts, head 1 on random tokens only; block 2: heads 0, 1 induction."""
    df = _table(prev=[[0.44, 0.44], [0.0, 0.0], [0.0, 0.0]], ind=[[0, 0], [0.8, 0.9], [0, 0]])
    df["prev_token_text"] = [0.45, 0.06, 0.0, 0.0, 0.0, 0.0]
    df["induction_text"] = [0.0, 0.0, 0.3, 0.1, 0.0, 0.0]
    df.attrs.update(seq_len=8, batch=2, seed=0, model="fake")
    return df


def test_circuit_confirmation_picks_heads_by_their_own_ablation(hooked, monkeypatch):
    monkeypatch.setattr(induction, "EffectMeasurer", _FakeMeasurer)
    monkeypatch.setattr(_FakeMeasurer, "EFFECTS", {
        frozenset({(1, 1)}): dict(copying_second=0.0, loss=6.50),  # the best induction score, but it breaks the model
        frozenset({(1, 0)}): dict(copying_second=0.01, loss=2.06),
        frozenset({(0, 0)}): dict(copying_second=0.16, loss=2.13, induction_score=0.4),
        frozenset({(0, 1)}): dict(copying_second=0.62, loss=2.00, induction_score=0.86),  # looks back on random tokens only
        frozenset({(0, 0), (1, 0)}): dict(copying_second=0.002, loss=2.20, induction_score=0.02),
        frozenset({(0, 0), (0, 1)}): dict(copying_second=0.15, loss=2.14, induction_score=0.39),
    })
    c = find_induction_circuit(hooked, scores=_circuit_scores())
    assert (c.induction_layer, c.induction_head) == (1, 0)  # not head 1, which breaks the model
    assert c.prev_tokens == [(0, 0)] and c.heads() == [(0, 0), (1, 0)] and c.found
    ev = c.evidence.set_index("condition")
    assert ev.loc["block 2 head 1 (layer 1)", "specificity"] < 3 and not ev.loc["block 2 head 1 (layer 1)", "chosen"]
    assert ev.loc["block 1 head 0 (layer 0)", "copying_removed"] == pytest.approx((0.633 - 0.16) / (0.633 - 0.004))
    assert ev.loc["block 1 head 0 (layer 0)", "induction_drop"] == pytest.approx(1 - 0.4 / 0.88)
    assert "block 1 head 1 (layer 0)" in ev.index and not ev.loc["block 1 head 1 (layer 0)", "chosen"]
    assert "the circuit together" in ev.index
    v = c.verdicts()
    assert v["induction"][0] == "REPRODUCED" and v["previous-token"][0] == "REPRODUCED"
    assert "75.2%" in v["previous-token"][1] and "block 1 head 0 (layer 0)" in v["previous-token"][1]
    assert c.as_dict()["prev_label"] == "block 1 head 0 (layer 0)" and "evidence" not in c.as_dict()
    # the previous-token head removes too little of the copying alone: the part is not established
    monkeypatch.setitem(_FakeMeasurer.EFFECTS, frozenset({(0, 0)}), dict(copying_second=0.45, loss=2.05, induction_score=0.6))
    weak = find_induction_circuit(hooked, scores=_circuit_scores())
    assert weak.prev_tokens == [(0, 0)] and weak.verdicts()["previous-token"][0] == "NOT established"
    assert weak.verdicts()["induction"][0] == "REPRODUCED"


def test_circuit_confirmation_returns_shared_previous_token_heads(hooked, monkeypatch):
    """Two previous-token heads that each matter little alone but together carry the copying are both returned."""
    monkeypatch.setattr(induction, "EffectMeasurer", _FakeMeasurer)
    scores = _circuit_scores()
    scores["prev_token_text"] = [0.45, 0.4, 0.0, 0.0, 0.0, 0.0]
    monkeypatch.setattr(_FakeMeasurer, "EFFECTS", {
        frozenset({(1, 0)}): dict(copying_second=0.01, loss=2.06),
        frozenset({(1, 1)}): dict(copying_second=0.6, loss=2.01),
        frozenset({(0, 0)}): dict(copying_second=0.62, loss=2.02, induction_score=0.85),
        frozenset({(0, 1)}): dict(copying_second=0.61, loss=2.02, induction_score=0.84),
        frozenset({(0, 0), (0, 1)}): dict(copying_second=0.05, loss=2.10, induction_score=0.1),
    })
    c = find_induction_circuit(hooked, scores=scores)
    assert sorted(c.prev_tokens) == [(0, 0), (0, 1)]
    pe = c.prev_effect()
    assert pe["condition"] == "previous-token heads together" and pe["copying_removed"] > 0.9
    word, text = c.verdicts()["previous-token"]
    assert word == "REPRODUCED" and "each alone" in text
    # with neither alone nor together lowering anything, none is confirmed and the part is not established
    monkeypatch.setitem(_FakeMeasurer.EFFECTS, frozenset({(0, 0), (0, 1)}), dict(copying_second=0.6, loss=2.05))
    none = find_induction_circuit(hooked, scores=scores)
    assert none.prev_tokens == [] and not none.found
    assert none.verdicts()["previous-token"][0] == "NOT established"


@pytest.mark.acceptance  # 3-9 s each
@pytest.mark.parametrize("name", ["gpt-1", "gpt-4", "sprout"])
def test_shipped_head_scores(name):
    if not (CHECKPOINTS / name / "model.safetensors").is_file():
        pytest.skip(f"model/checkpoints/{name}/model.safetensors is not there yet")
    import sprout_interp as si
    from sprout_interp.core.texts import TEXTS

    m = si.load(name)
    df = head_scores(m, seq_len=32, batch=4, natural=list(TEXTS.values()), copying=False)
    assert len(df) == m.cfg.n_layers * m.cfg.n_heads
    assert ((df[list(SCORE_COLUMNS)] >= 0) & (df[list(SCORE_COLUMNS)] <= 1 + 1e-5)).all().all()
    pats = attention_patterns(m, TEXTS["story"])
    torch.testing.assert_close(pats.sum(-1), torch.ones(pats.shape[:-1]), atol=1e-4, rtol=0)
    c = find_induction_circuit(scores=df)
    assert c.model == name or c.model


@pytest.mark.acceptance  # over 10 s
def test_shipped_sprout_circuit_parts_each_rest_on_their_own_ablation():
    """On the shipped Sprout each part of the circuit is judged by its own ablation: the previous-token head(s)
    chosen must, ablated without the induction head, remove at least a third of the name-copying gain, or the
    verdict must say that part is not established; a head that only breaks the model is never chosen."""
    if not (CHECKPOINTS / "sprout" / "model.safetensors").is_file():
        pytest.skip("model/checkpoints/sprout/model.safetensors is not there yet")
    import sprout_interp as si

    threads = torch.get_num_threads()
    torch.set_num_threads(pinned_threads())  # one core is often busy; two threads would fight over the other
    try:
        c = find_induction_circuit(si.load("sprout"), batch=8)
    finally:
        torch.set_num_threads(threads)
    assert c.confirmed and c.copying == "names" and c.kind == "mean"
    v = c.verdicts()
    pe, ie = c.prev_effect(), c.induction_effect()
    if v["previous-token"][0] != "NOT established":
        assert pe is not None and pe["copying_removed"] >= 1 / 3, v["previous-token"]
        for h in c.prev_tokens:  # each chosen head scores as a previous-token head on random tokens and on text
            row = c.row(head_label(*h))
            assert min(row["prev_token_random"], row["prev_token_text"]) >= c.threshold
    if v["induction"][0] != "NOT established":
        assert ie["copying_removed"] >= 1 / 3 and ie["specificity"] >= c.min_specificity
    ev = c.evidence.set_index("condition")
    # block 1 head 5 looks back one token on random tokens far more than on text, and ablated alone it removes
    # less of the copying than the bar a part must clear and less than each chosen previous-token head alone
    assert (0, 5) not in c.prev_tokens
    if "block 1 head 5 (layer 0)" in ev.index:
        h5 = ev.loc["block 1 head 5 (layer 0)", "copying_removed"]
        assert h5 < 1 / 3
        chosen = [head_label(*h) for h in c.prev_tokens if head_label(*h) in ev.index]
        assert chosen and all(h5 < ev.loc[label, "copying_removed"] for label in chosen), ev
    assert (0, 1) not in c.heads()  # its removal raises the held-out loss by several nats: it breaks the model
    assert c.prev_tokens and all(layer < c.induction_layer for layer, _ in c.prev_tokens)
