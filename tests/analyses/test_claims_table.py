"""The claims table of docs/claims.md is generated from the claim scripts' judgements: the markdown rendering, each
script's judge() on hand-made measurements (so a wrong verdict fails here, fast), and the page's block equals what
``analyses/claims_table.py`` prints on the shipped checkpoints."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from conftest import analysis_script

from sprout_interp.circuits.induction import InductionCircuit
from sprout_interp.report.claims import (
    BEGIN,
    END,
    HEADER,
    Claim,
    claims_markdown,
    read_block,
    replace_block,
    verdict_line,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
NAN = math.nan


def _verdicts(claims: list[Claim], claim: str | None = None) -> dict[str, str]:
    """'model, part' -> verdict, for the claims with that claim text (all when None)."""
    return {c.who: c.verdict for c in claims if claim is None or c.claim == claim}


# ---------------------------------------------------------------------------------------------
# rendering


def test_one_row_per_claim_with_each_model_and_part_keeping_its_verdict():
    claims = [
        Claim("the last block steps back", "77% -> 59%", "34% -> 27%", "REPRODUCED in direction", "cmd a", model="gpt-4",
              part="texts"),
        Claim("the last block steps back", "77% -> 59%", "29% -> 29%", "NO CLEAR CHANGE", "cmd a", model="sprout",
              part="texts"),
        Claim("the last block steps back", "77% -> 59%", "30% -> 30%", "NO CLEAR CHANGE", "cmd a", model="sprout",
              part="held-out", headline=False),
        Claim("a | b\ncopies", "", "a long console line", "PARTLY", "cmd b", model="gpt-4", brief="short"),
    ]
    lines = claims_markdown(claims).splitlines()
    assert lines[:2] == HEADER.splitlines()
    assert lines[2] == ("| the last block steps back (chapter: 77% -> 59%) | gpt-4, texts: 34% -> 27%: **REPRODUCED in "
                        "direction**; sprout, texts: 29% -> 29%: **NO CLEAR CHANGE** | `cmd a` |")
    assert lines[3] == "| a \\| b copies | gpt-4: short: **PARTLY** | `cmd b` |"  # one line, pipes escaped, the brief text
    assert len(lines) == 4  # the held-out claim is printed by its script, not in the table
    assert verdict_line(claims[0]) == "- gpt-4, texts: the last block steps back: REPRODUCED in direction: 34% -> 27%"


def test_the_block_between_the_markers_is_read_and_replaced(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{BEGIN}\nold table\n{END}\nafter\n", encoding="utf-8")
    assert read_block(readme.read_text(encoding="utf-8")) == "old table\n"
    assert replace_block(readme, "| new |\n") is True
    assert readme.read_text(encoding="utf-8") == f"intro\n{BEGIN}\n| new |\n{END}\nafter\n"
    assert replace_block(readme, "| new |\n") is False  # unchanged: not rewritten
    with pytest.raises(ValueError, match="claims:begin"):
        read_block("no markers here")


# ---------------------------------------------------------------------------------------------
# each script's judge() on hand-made measurements


def test_confidence_drop_judges_the_step_back_by_a_one_point_threshold():
    mod = analysis_script("confidence_drop")
    base = {"preset": "gpt-4", "text_set": "texts", "penultimate_row": "block 3", "final_row": "block 4", "penultimate": 0.34,
            "ratio": 0.8, "n_blocks": 4, "echo_rate": 1.0, "mean_first_correct_block": 2.3, "share_ripe_before_last": 0.7}
    rows = [dict(base, model="drops", final=0.30, drop=0.04), dict(base, model="flat", final=0.335, drop=0.005),
            dict(base, model="rises", final=0.40, drop=-0.06, echo_rate=0.6, share_ripe_before_last=0.0),
            dict(base, model="one", n_blocks=1, final=0.2, drop=0.14, echo_rate=0.3)]
    tuned = pd.DataFrame([{"model": r["model"], "text_set": "texts", "lens used": "tuned", "logit penultimate": 0.34,
                           "logit final": r["final"], "tuned penultimate": 0.22, "tuned final": 0.27} for r in rows])
    claims = mod.judge({"claims": pd.DataFrame(rows), "tuned": tuned})
    assert _verdicts(claims, mod.STEPS_BACK) == {
        "drops, texts": "REPRODUCED in direction", "flat, texts": "NO CLEAR CHANGE",
        "rises, texts": "NOT reproduced (the final row is more confident)",
        "one, texts": "not applicable (one block: the row before it is the embedding)"}
    assert _verdicts(claims, mod.TUNED_STEPS_BACK)["drops, texts"] == "NOT reproduced (the final row is more confident)"
    assert _verdicts(claims, mod.ECHO) == {"drops, texts": "REPRODUCED", "flat, texts": "REPRODUCED", "rises, texts": "PARTLY",
                                           "one, texts": "NOT reproduced"}
    assert _verdicts(claims, mod.RIPE)["rises, texts"] == "NOT reproduced"


def test_lens_comparison_needs_a_lower_kl_at_every_row_before_the_output():
    mod = analysis_script("lens_comparison")

    def rows(model, tuned_kl, lens="tuned"):
        logit = [5.0, 1.0, 0.5, 0.0]
        return [{"model": model, "asked": asked, "lens": "logit" if asked == "logit" else lens, "block": b, "kl_final": kl}
                for asked, kls in (("logit", logit), ("tuned", tuned_kl)) for b, kl in enumerate(kls)]

    bb = pd.DataFrame(rows("all", [1.0, 0.5, 0.2, 0.0]) + rows("some", [1.0, 1.5, 0.2, 0.0])
                      + rows("none", [6.0, 1.5, 0.6, 0.0]) + rows("missing", [5.0, 1.0, 0.5, 0.0], lens="logit"))
    claims = mod.judge({"by_block": bb})
    assert _verdicts(claims) == {"all": "REPRODUCED", "some": "PARTLY", "none": "NOT reproduced", "missing": "NOT MEASURED"}
    assert "lower KL at 2 of 3 rows; not at blocks [1]" in next(c.ours for c in claims if c.model == "some")


def test_residual_growth_in_bands_of_the_chapters_figures():
    mod = analysis_script("residual_growth")
    models = pd.DataFrame({"model": ["gpt-4", "flat"], "preset": ["gpt-4", None], "n_blocks": [2, 2]})
    rms = pd.DataFrame({"model": ["gpt-4"] * 3 + ["flat"] * 3, "text_set": "held-out", "block": [0, 1, 2] * 2,
                        "rms": [0.2, 5.0, 20.0, 0.2, 5.0, 4.0], "growth": [1, 25, 100, 1, 25, 20]})
    claims_df = pd.DataFrame({"model": "gpt-4", "text_set": "held-out", "claim": ["RMS after the embedding", "RMS after block 1",
                                                                                 "growth, block 2 / embedding"],
                              "chapter": [0.18, 10.0, 200.0], "ours": [0.2, 5.0, 100.0], "ratio": [0.2 / 0.18, 0.5, 0.5]})
    knock = pd.DataFrame({"model": ["gpt-4"] * 6 + ["flat"] * 3, "text_set": ["held-out"] * 3 + ["train"] * 3 + ["held-out"] * 3,
                          "blocks": ["1", "2", "2-2"] * 3, "change": [1.0, 0.2, 0.2, 1.1, 0.5, 0.5, 2.0, 0.1, 0.1]})
    claims = mod.judge({"models": models, "rms": rms, "claims": claims_df, "knockout": knock})
    assert _verdicts(claims, mod.GROWS) == {"gpt-4": "REPRODUCED", "flat": "PARTLY (not monotonic)"}
    worth = {c.model: c.ours for c in claims if c.claim == mod.WORTH}  # the held-out rows only
    assert worth == {"gpt-4": "block 1 +1.000, block 2 +0.200, blocks 2-2 +0.200 nats",
                     "flat": "block 1 +2.000, block 2 +0.100, blocks 2-2 +0.100 nats"}
    memorised = [c for c in claims if c.claim == mod.MEMORISED]  # only where training text was measured
    assert [(c.model, c.headline) for c in memorised] == [("gpt-4", False)]
    assert memorised[0].ours == "blocks 2-2: +0.500 nats on training text, +0.200 held-out (x2.50)"
    assert _verdicts(claims, mod.FIGURES) == {"gpt-4, RMS after the embedding": "matches",
                                              "gpt-4, RMS after block 1": "same order of magnitude",
                                              "gpt-4, growth, block 2 / embedding": "same order of magnitude"}


def test_name_copying_by_the_chapters_figures_within_ten_points():
    mod = analysis_script("name_copying")
    models = pd.DataFrame({"model": ["gpt-1", "gpt-4", "sprout"], "preset": ["gpt-1", "gpt-4", "sprout"], "n_blocks": [1, 4, 8]})
    probs = {"gpt-1": (0.005, 0.0, 0.0), "gpt-4": (0.90, 0.85, 0.2), "sprout": (0.95, 0.95, 0.4)}  # 'or', 'bin', 'Plax' (2nd)
    pieces = pd.DataFrame([{"model": m, "occurrence": occ, "piece": piece, "prob": p if occ == 2 else 0.004}
                           for m, ps in probs.items() for occ in (1, 2) for piece, p in zip(["or", "bin", "Plax"], ps, strict=True)])
    tokens = pd.DataFrame([{"name": "N", "model": m, "occurrence": occ, "prob": p}
                           for m, p in (("gpt-1", 0.01), ("gpt-4", 0.5), ("sprout", 0.505)) for occ in (1, 2)])
    claims = mod.judge({"models": models, "pieces": pieces, "tokens": tokens})
    assert _verdicts(claims, mod.CLAIM) == {"gpt-1": "REPRODUCED", "gpt-4": "REPRODUCED",
                                            "sprout": "PARTLY (copies, less surely)"}  # 'Plax' under 50%: not remembered
    assert _verdicts(claims, mod.DEEPER) == {"": "NOT reproduced"}  # sprout is not a point above gpt-4


def _circuit(prev_removed: float, ind_removed: float, ind_specificity: float = 50.0) -> InductionCircuit:
    """A confirmed circuit, block 1 head 0 (layer 0) -> block 2 head 0 (layer 1), with hand-made ablation evidence; a
    second previous-token candidate, block 1 head 5 (layer 0), left out."""
    common = {"copying_first": 0.004, "loss_change": 0.1, "induction_text": NAN, "prev_token_text": NAN}
    rows = [
        dict(common, role="clean", condition="clean", heads="none", n_heads=0, layer=None, head=None, copying_removed=0.0,
             copying_second=0.6, specificity=NAN, induction_drop=0.0, induction_score=0.88, prev_token_random=NAN,
             induction_random=NAN, chosen=False),
        dict(common, role="induction candidate", condition="block 2 head 0 (layer 1)", heads="block 2 head 0 (layer 1)",
             n_heads=1, layer=1, head=0, copying_removed=ind_removed, copying_second=0.1, specificity=ind_specificity,
             induction_drop=NAN, induction_score=NAN, prev_token_random=0.03, prev_token_text=0.03, induction_random=0.88,
             induction_text=0.33, chosen=True),
        dict(common, role="previous-token candidate", condition="block 1 head 0 (layer 0)", heads="block 1 head 0 (layer 0)",
             n_heads=1, layer=0, head=0, copying_removed=prev_removed, copying_second=0.3, specificity=20.0, induction_drop=0.9,
             induction_score=0.05, prev_token_random=0.44, prev_token_text=0.45, induction_random=0.0, induction_text=0.02,
             chosen=True),
        dict(common, role="previous-token candidate", condition="block 1 head 5 (layer 0)", heads="block 1 head 5 (layer 0)",
             n_heads=1, layer=0, head=5, copying_removed=0.027, copying_second=0.58, specificity=1000.0, induction_drop=0.02,
             induction_score=0.86, prev_token_random=0.44, prev_token_text=0.06, induction_random=0.01, induction_text=0.03,
             chosen=False),
    ]
    ev = pd.DataFrame(rows)
    ev.attrs.update(clean_copying_first=0.004, clean_copying_second=0.6)
    return InductionCircuit(model="m", prev_layer=0, prev_head=0, prev_score=0.44, induction_layer=1, induction_head=0,
                            induction_score=0.88, prev_earlier=True, prev_before_layer=0, prev_before_head=0,
                            prev_before_score=0.44, threshold=0.3, found=True, scores_on="both", clean_copying_ratio=0.025,
                            prev_tokens=[(0, 0)], confirmed=True, kind="mean", copying="names", evidence=ev)


@pytest.mark.parametrize("prev_removed, ind_removed, ind_specificity, prev_word, ind_word, whole", [
    (0.60, 0.99, 50.0, "REPRODUCED", "REPRODUCED", "REPRODUCED"),
    (0.40, 0.99, 50.0, "PARTLY", "REPRODUCED", "PARTLY"),            # from a third of the gain: partly
    (0.30, 0.99, 50.0, "NOT established", "REPRODUCED", "NOT reproduced"),  # under a third: not established
    (0.60, 0.99, 1.0, "REPRODUCED", "NOT established", "NOT reproduced"),   # removes the copying by breaking the model
])
def test_induction_heads_judges_each_part_by_its_own_ablation(prev_removed, ind_removed, ind_specificity, prev_word,
                                                              ind_word, whole):
    mod = analysis_script("induction_heads")
    measured = {"settings": {"threshold": 0.3}, "circuits": {"gpt-4": _circuit(prev_removed, ind_removed, ind_specificity)},
                "models": pd.DataFrame({"model": ["gpt-4"], "preset": ["gpt-4"], "n_blocks": [4]}),
                "scores": pd.DataFrame({"model": "gpt-4", "layer": [0, 1, 1], "head": [0, 0, 1],
                                        "ov_copying": [0.1, 0.75, -0.3]})}
    claims = mod.judge(measured)
    got = _verdicts(claims)
    ind = next(c for c in claims if c.part.startswith("induction part"))
    assert "full OV circuit's copying score +0.75" in ind.brief  # block 2 head 0's own, not a neighbour's
    assert got["gpt-4, previous-token part (block 1 head 0 (layer 0)), by its own ablation"] == prev_word
    assert got["gpt-4, induction part (block 2 head 0 (layer 1)), by its own ablation"] == ind_word
    assert got["gpt-4, both parts, each by its own ablation"] == whole
    assert got["gpt-4, previous-token head in layer 2 and induction head in layer 3"] == (
        f"PARTLY (a circuit, {whole} by ablation, in other blocks)" if whole != "NOT reproduced" else "NOT reproduced")
    assert got["gpt-4, candidate block 1 head 5 (layer 0)"] == "not a previous-token head of the circuit"


def test_induction_heads_one_block_has_no_induction_head():
    mod = analysis_script("induction_heads")
    c = _circuit(0.0, 0.0)
    c.induction_score = 0.01
    measured = {"settings": {"threshold": 0.3}, "circuits": {"gpt-1": c},
                "models": pd.DataFrame({"model": ["gpt-1"], "preset": ["gpt-1"], "n_blocks": [1]})}
    assert _verdicts(mod.judge(measured)) == {"gpt-1": "REPRODUCED"}


def test_head_ablation_leaves_out_heads_that_break_the_model():
    mod = analysis_script("head_ablation")
    c = _circuit(0.6, 0.99)
    # per head: (layer, head, copying-ratio change, share of the copying gain removed, held-out loss change, specificity)
    heads = [(0, 0, 0.30, 0.31, 0.1, 20.0), (1, 0, 0.50, 0.51, 0.08, 60.0), (0, 1, 0.90, 0.92, 4.5, 1.2), (0, 5, 0.01, 0.01, 0.0, 5.0)]
    spec = pd.DataFrame(heads, columns=["layer", "head", "copy_change", "copying_removed", "loss_change", "specificity"])
    spec = spec.assign(model="gpt-4", sp_loss=NAN, sp_copy=NAN)
    measured = {"settings": {"circuit_kind": "mean", "min_specificity": 3.0}, "circuits": {"gpt-4": c}, "specificity": spec}
    claims = mod.judge(measured)
    ranks = next(x for x in claims if x.claim == mod.RANKS)
    assert ranks.verdict == "REPRODUCED"  # block 1 head 1 raises the ratio most, but by breaking the model
    assert "left out as breaking the model: block 1 head 1 (layer 0)" in ranks.ours and "specificity 1.2" in ranks.ours
    assert _verdicts(claims, mod.CARRY)["gpt-4, both parts"] == "REPRODUCED"
    assert not any(x.claim == mod.SPEARMAN for x in claims)  # not measured: no line


def test_trace_induction_turns_each_step_into_a_claim():
    mod = analysis_script("trace_induction")
    t = {"resid": pd.DataFrame({"layer": [0, 1, 2], "block": [1, 2, 3], "first occurrence": [0.9, 0.8, 0.1],
                                "read position": [0.0, 0.1, 0.9], "other": [0.0, 0.0, 0.0]}),
         "heads": pd.DataFrame({"layer": [0, 1], "block": [1, 2], "head": [0, 0], "score": [0.1, 0.7]}),
         "paths": pd.DataFrame({"heads": ["block 1 head 0 (layer 0)", "block 1 head 1 (layer 0)"], "layer": [0, 0],
                                "block": [1, 1], "head": [0, 1], "score": [0.2, 0.05]})}
    comp = pd.DataFrame({"mode": "K", "sender_layer": [0, 0], "sender_head": [1, 0], "receiver_layer": [1, 1],
                         "receiver_head": [0, 0], "score": [0.3, 0.2], "baseline": [0.05, 0.05], "over_baseline": [6.0, 4.0],
                         "model": "gpt-4"})
    claims = mod.judge({"traced": {"gpt-4": ([(0, 0)], (1, 0), t)}, "composition": comp})
    assert [c.part for c in claims] == ["1 residual stream", "2 heads", "3 path to the induction head's keys",
                                        "4 K-composition (weights)"]
    assert [c.verdict for c in claims] == ["CONSISTENT", "CONSISTENT", "PARTLY", "CONSISTENT"]  # the path restores 0.2 < 0.3
    assert list(mod.steps_frame(claims)["verdict"]) == [c.verdict for c in claims]


# ---------------------------------------------------------------------------------------------
# the page's block is the command's output


@pytest.mark.unit
def test_the_claims_table_is_on_one_page_with_its_markers():
    """The generated table lives in docs/claims.md, the page --write and --check read by default, and nowhere else."""
    table = analysis_script("claims_table")
    assert table.CLAIMS_PAGE == ROOT / "docs" / "claims.md"
    page = (ROOT / "docs" / "claims.md").read_text(encoding="utf-8")
    assert page.count(BEGIN) == page.count(END) == 1 and read_block(page).startswith("| claim (chapter) | ours | command |")
    assert BEGIN not in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.acceptance  # every claim script's measure on the shipped checkpoints
def test_the_claims_table_is_what_the_command_prints():
    """Every claim script's measure and judge on the shipped checkpoints (minutes: each script's own sample sizes)."""
    from sprout_interp.core.loading import SHIPPED_DIR
    from sprout_interp.report.cli import SHIPPED, load_models

    if not all((Path(SHIPPED_DIR) / name / "model.safetensors").is_file() for name in SHIPPED):
        pytest.skip("the shipped checkpoints are not installed")
    table = analysis_script("claims_table")
    got = claims_markdown(table.collect(load_models(list(SHIPPED))))
    page = read_block(table.CLAIMS_PAGE.read_text(encoding="utf-8"))
    assert page == got, "docs/claims.md's claims table is stale: run .venv/bin/python analyses/claims_table.py --write"
