"""analyses/name_copy_graph.py on the shipped gpt-4 at the story's second "Zorbin Plax": the verdict table's numbers
against interventions written here by hand with hooks (the transcoders' features recomputed on the clean run and their
decoder writes removed, the induction head's attention weight set to 0, the embeddings zeroed), and the frozen
numbers against the graph's own edges."""
from __future__ import annotations

import pytest
import torch
from conftest import analysis_script

from sprout_interp.circuits.induction import find_induction_circuit
from sprout_interp.core.hook_points import act_name
from sprout_interp.features.transcoder import load_transcoders, mlp_input

pytestmark = pytest.mark.acceptance


@pytest.fixture(scope="module")
def measured(gpt4):
    mod = analysis_script("name_copy_graph")
    label, text, surname = mod.prompts(held_out=False)[0]
    c = find_induction_circuit(gpt4)
    got = mod.measure_prompt(gpt4, text, surname, (c.induction_layer, c.induction_head), n_random=3, seed=0)
    rows = {r["intervention"].split(" (")[0]: r for r in got["rows"]}
    return mod, text, c, got, rows


def _tokens(gpt4, text):
    return torch.cat([torch.zeros(1, dtype=torch.long), gpt4.to_tokens(text)[0]])  # <|endoftext|> first


def _target_logit(logits, target):
    return float(logits[0, -1, target] - logits[0, -1].mean())


def test_the_prompt_ends_on_the_name_and_points_at_its_first_occurrence(gpt4, measured):
    mod, text, _, got, _ = measured
    toks = got["tokens"]
    assert text.endswith("Zorbin") and toks[got["p1"]] == " Pl" and toks[got["p1"] - 1] == toks[-1] == "in"
    assert got["last"] == len(toks) - 1 and got["graph"].n_logits == 1
    assert got["graph"].max_error() < 1e-4


def test_zeroing_the_first_occurrences_features_by_hand(gpt4, measured):
    _, text, _, got, rows = measured
    tokens, target, p1 = _tokens(gpt4, text), got["target"], got["p1"]
    ts = load_transcoders(gpt4)
    writes, counts = {}, {}

    def grab(act, hook, layer):  # the features on the clean run, decoded at p1-1 and p1 (no b_dec, no skip)
        tc = ts[layer]
        acts = tc.encode(mlp_input(gpt4, layer, act[0]).float())
        w = torch.zeros(act.shape[1], gpt4.cfg.d_model)
        w[p1 - 1:p1 + 1] = acts[p1 - 1:p1 + 1] @ tc.W_dec.detach().float()
        writes[layer] = w
        counts[layer] = int((acts[p1 - 1:p1 + 1] != 0).sum())
        return act

    L = gpt4.cfg.n_layers
    with torch.no_grad():
        clean = gpt4.run_with_hooks(tokens[None], fwd_hooks=[
            (act_name("normalized", i, "ln2"), lambda a, hook, i=i: grab(a, hook, i)) for i in range(L)])
        cut = gpt4.run_with_hooks(tokens[None], fwd_hooks=[
            (act_name("mlp_out", i), lambda a, hook, i=i: a - writes[i][None].to(a.dtype)) for i in range(L)])
    by_hand = _target_logit(cut, target) - _target_logit(clean, target)
    row = rows["features at p1-1 and p1"]
    assert row["real"] == pytest.approx(by_hand, abs=1e-4)
    assert row["n_nodes"] == sum(counts.values()) == 2 * L * ts[0].k  # TopK: k features at each position and layer
    # the frozen model's change is what the graph's edges predict, through every path
    assert row["frozen"] == pytest.approx(row["graph_total"], abs=1e-3)
    assert abs(row["real"] - row["frozen"]) > 1e-3  # the real model's patterns respond: measured, not predicted


def test_the_induction_heads_attention_weight_by_hand(gpt4, measured):
    _, text, c, got, rows = measured
    tokens, target, p1 = _tokens(gpt4, text), got["target"], got["p1"]

    def cut(act, hook):
        act = act.clone()
        act[0, c.induction_head, -1, p1] = 0
        return act

    with torch.no_grad():
        clean = gpt4(tokens[None])
        after = gpt4.run_with_hooks(tokens[None], fwd_hooks=[(act_name("pattern", c.induction_layer), cut)])
    row = next(r for r in rows.values() if r["part"] == "moved by the induction head's OV")
    assert row["real"] == pytest.approx(_target_logit(after, target) - _target_logit(clean, target), abs=1e-4)
    lp = torch.log_softmax(after[0, -1].float(), -1)[target] - torch.log_softmax(clean[0, -1].float(), -1)[target]
    assert row["real_logprob"] == pytest.approx(float(lp), abs=1e-4)


def test_zeroing_the_first_occurrences_tokens_by_hand(gpt4, measured):
    _, text, _, got, rows = measured
    tokens, target, p1 = _tokens(gpt4, text), got["target"], got["p1"]

    def cut(act, hook):
        act = act.clone()
        act[0, p1 - 1:p1 + 1] = 0
        return act

    with torch.no_grad():
        clean = gpt4(tokens[None])
        after = gpt4.run_with_hooks(tokens[None], fwd_hooks=[(act_name("embed"), cut)])
    row = rows["token embeddings at p1-1 and p1 zeroed"]
    assert row["real"] == pytest.approx(_target_logit(after, target) - _target_logit(clean, target), abs=1e-4)
    assert row["frozen"] == pytest.approx(row["graph_total"], abs=1e-3)


def test_the_verdict_table_shows_these_numbers(measured):
    mod, _, _, got, rows = measured
    import pandas as pd

    table = mod.verdict_table(pd.DataFrame([{"model": "gpt-4", "prompt": "story", **r} for r in got["rows"]]))
    first = table[table["part"] == "read at the first occurrence"].iloc[0]
    row = rows["features at p1-1 and p1"]
    assert first["real model"].startswith(f"{row['real']:+.2f}; control {row['real_control_max']:+.2f}")
    assert first["verdict in the real model"] == mod.part_verdict(row["real"], row["real_control_max"])
    into = table[table["part"] == "into the logit"].iloc[0]
    head = next(r for r in rows.values() if r["part"] == "moved by the induction head's OV")
    direct = next(r for r in got["rows"] if r["part"] == "into the logit")["frozen"]
    assert into["graph (frozen)"] == f"direct {direct:+.2f} of {head['frozen']:+.2f}: {direct / head['frozen']:.0%}"
    assert set(table["part"]) == {"read at the first occurrence", "read at the first occurrence: the tokens",
                                  "moved by the induction head's OV", "into the logit"}
