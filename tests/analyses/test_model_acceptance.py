"""analyses/model_acceptance.py: the bar a Sprout must meet to replace the shipped one. Its judge on hand-made figures
(each part can fail alone), and the script end to end on two tiny checkpoints, every figure against an independent
computation (a loop of full forwards for the validation loss, block_knockout on the same samples, info.describe)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import analysis_script, tiny_config

from sprout_interp.behaviour.knockout import block_knockout
from sprout_interp.core import texts
from sprout_interp.core.texts import TEXTS
from sprout_interp.report.cli import load_models
from sprout_model import GPT
from sprout_model.checkpoint import load_folder, save_checkpoint
from sprout_model.info import describe
from sprout_model.tokenizer import train_tokenizer

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _figures(late=0.4, least=0.05, late_train=0.44, val=3.8, ratio=0.05, names=0.9, heldout=0.85):
    """One model's measurements as measure_one returns them, for a 4-block model (later half: blocks 3-4)."""
    held = pd.DataFrame({"blocks": ["1", "2", "3", "4", "3-4"], "change": [2.0, 0.5, least, 0.3, late]})
    train = held.assign(change=[2.0, 0.5, least, 0.3, late_train])
    return {"held": held, "train": train, "val_loss": val, "windows": 10, "late_label": "3-4",
            "info": {"copying_ratio": ratio, "name_copying": names, "name_copying_heldout": heldout}}


def _meets(df: pd.DataFrame, model: str) -> dict[str, bool]:
    return {p.split(",")[0].split(" (")[0]: bool(v) for p, v in zip(df[df["model"] == model]["part"],
                                                                  df[df["model"] == model]["meets"], strict=True)}


def test_a_candidate_meeting_every_part_meets_the_bar():
    mod = analysis_script("model_acceptance")
    df = mod.judge({"base": _figures(late=0.1, val=4.0), "cand": _figures()}, "base", "cand")
    assert df[df["model"] == "cand"]["meets"].all()
    assert not df[df["model"] == "base"]["meets"].all()  # the baseline is judged too, against itself for the loss


@pytest.mark.parametrize("change, part", [
    (dict(late=0.29, late_train=0.3), "blocks 3-4 together worth"),
    (dict(least=0.02), "the least any one block is worth"),
    (dict(late_train=0.53), "blocks 3-4: worth on training text / held-out"),
    (dict(val=3.91), "validation loss"),
    (dict(ratio=0.11), "copying ratio"),
    (dict(names=0.79), "invented-name copying"),
    (dict(heldout=0.79), "invented-name copying"),
])
def test_each_part_fails_on_its_own(change, part):
    mod = analysis_script("model_acceptance")
    df = mod.judge({"base": _figures(val=4.0), "cand": _figures(**change)}, "base", "cand")
    cand = df[df["model"] == "cand"]
    failed = cand[~cand["meets"]]["part"].tolist()
    assert len(failed) == 1 and failed[0].startswith(part), failed


def test_the_validation_part_can_be_judged_against_another_model_by_another_margin():
    mod = analysis_script("model_acceptance")
    figs = {"base": _figures(val=3.9), "cand": _figures(val=3.92), "gpt-4": {"val_loss": 4.1}}
    assert not _meets(mod.judge(figs, "base", "cand"), "cand")["validation loss"]  # 0.10 below the baseline: no
    df = mod.judge(figs, "base", "cand", against="gpt-4", by=0.15)
    assert _meets(df, "cand")["validation loss"] and df[df["model"] == "cand"]["meets"].all()
    assert df[df["part"].str.startswith("validation")]["bar"].iloc[0] == "<= 3.9500 (gpt-4's 4.1000 - 0.15)"
    assert not _meets(mod.judge(figs | {"gpt-4": {"val_loss": 4.06}}, "base", "cand", "gpt-4", 0.15), "cand")["validation loss"]
    assert set(mod.judge(figs, "base", "cand", "gpt-4", 0.15)["model"]) == {"base", "cand"}  # the reference is not judged


def test_the_fallback_rule_needs_a_lower_loss_and_no_copying_lost():
    mod = analysis_script("model_acceptance")
    base = _figures(val=3.9, names=0.65, heldout=0.68)
    ok = mod.fallback({"base": base, "cand": _figures(val=3.89, names=0.65, heldout=0.70, late=0.1)}, "base", "cand")
    assert ok["meets"].all()  # misses the bar (blocks, names < 80%) but meets the fallback
    for change, part in [(dict(val=3.9), "validation loss"), (dict(names=0.649), "invented-name copying, the name"),
                         (dict(heldout=0.679), "invented-name copying, the held-out"), (dict(ratio=0.11), "copying ratio")]:
        fig = dict(val=3.89, names=0.65, heldout=0.68) | change
        df = mod.fallback({"base": base, "cand": _figures(**fig)}, "base", "cand")
        assert df[~df["meets"]]["part"].tolist() and all(p.startswith(part) for p in df[~df["meets"]]["part"]), (change, df)


@pytest.fixture
def two_checkpoints(tmp_path):
    tok = train_tokenizer(list(TEXTS.values()) * 3, vocab_size=300)
    tok.save(str(tmp_path / "tokenizer.json"))
    out = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        g = GPT(tiny_config(vocab_size=300, context=1024, n_layer=4)).eval()
        out.append(save_checkpoint(g, tmp_path / f"tiny{seed}", tmp_path / "tokenizer.json", {"steps": 1}))
    val = np.random.default_rng(0).integers(1, 300, 16 * 5 + 1).astype(np.uint16)  # 5 windows of 16, and one token
    val.tofile(tmp_path / "val.bin")
    return out, tmp_path / "val.bin"


@pytest.mark.acceptance  # the script end to end
def test_the_script_measures_both_models_as_independent_code_does(two_checkpoints, tmp_path, monkeypatch, capsys):
    (base, cand), val_path = two_checkpoints
    docs = tuple(" ".join(list(TEXTS.values())[i % 3].split()[j:] + ["end"]) for i, j in enumerate(range(0, 40, 5)))
    train_docs = tuple(" ".join(d.split()[::-1]) for d in docs)
    monkeypatch.setattr(texts, "validation_documents", lambda corpus="default": docs)
    monkeypatch.setattr(texts, "training_documents", lambda corpus="default": train_docs)
    mod = analysis_script("model_acceptance")
    monkeypatch.setattr(mod, "VAL_SEQ_LEN", 16)
    ref = shutil.copytree(base, tmp_path / "reference")  # the bar's reference: base's weights under another name
    try:
        rc = mod.main(["--candidate", str(cand), "--baseline", str(base), "--val", str(val_path), "--n", "2",
                       "--length", "16", "--out", str(tmp_path / "o"), "--report-val", str(val_path),
                       "--val-against", str(ref), "--val-by", "0.5"])
        held = texts.validation_sample(load_models([str(base)])[0].model.tokenizer, n=2, length=16, seed=0)
        train = texts.training_sample(load_models([str(base)])[0].model.tokenizer, n=2, length=16, seed=0)
    finally:
        texts._encoded.cache_clear()
    assert rc == 1  # random tiny models meet no part of the bar
    got = pd.read_csv(tmp_path / "o" / "acceptance.csv")
    assert set(got["model"]) == {str(base), str(cand)}
    val = np.fromfile(val_path, dtype=np.uint16).astype(np.int64)
    for spec in (base, cand):
        rows = got[got["model"] == str(spec)].set_index("part")
        m = load_models([str(spec)])[0].model
        groups = [[0], [1], [2], [3], [2, 3]]
        kh, kt = block_knockout(m, held, groups=groups), block_knockout(m, train, groups=groups)
        assert rows.loc["blocks 3-4 together worth, held-out (nats)", "value"] == pytest.approx(kh["change"].iloc[-1], abs=1e-5)
        assert rows.loc["the least any one block is worth, held-out (nats)", "value"] == pytest.approx(
            kh["change"].iloc[:-1].min(), abs=1e-5)
        assert rows.loc["blocks 3-4: worth on training text / held-out", "value"] == pytest.approx(
            kt["change"].iloc[-1] / kh["change"].iloc[-1], rel=1e-4)
        # the validation loss: every window of 16 inputs, one full forward each, averaged by hand
        g, _ = load_folder(spec)
        with torch.no_grad():
            losses = [g(torch.from_numpy(val[i * 16: i * 16 + 16])[None], torch.from_numpy(val[i * 16 + 1: i * 16 + 17])[None])[1].item()
                      for i in range(5)]
        assert rows.loc["validation loss, all 5 windows (nats)", "value"] == pytest.approx(np.mean(losses), abs=1e-5)
        d = describe(str(spec))
        assert rows.loc["copying ratio, repeated random tokens", "value"] == pytest.approx(d["copying_ratio"])
        assert rows.loc["invented-name copying, the name texts", "value"] == pytest.approx(d["name_copying"])
    bars = got[got["part"].str.startswith("validation loss")]["bar"]
    base_val = got[(got["model"] == str(base)) & got["part"].str.startswith("validation loss")]["value"].item()
    assert (bars == f"<= {base_val - 0.5:.4f} ({ref}'s {base_val:.4f} - 0.5)").all()
    report = pd.read_csv(tmp_path / "o" / "report.csv")
    assert len(report) == 10 and report["figure"].str.contains("logit-lens confidence after blocks 3 and 4").sum() == 2
    more = report[report["figure"] == f"validation loss, every window of {val_path}"].set_index("model")["ours"]
    for spec in (base, cand):  # the same file reported again: the judged loss, over the same 5 windows
        value = got[(got["model"] == str(spec)) & got["part"].str.startswith("validation loss")]["value"].item()
        assert more[str(spec)] == f"{value:.4f} over 5 windows"
    out = capsys.readouterr().out
    assert "does NOT meet the bar" in out and "the bar for replacing" in out
    assert f"{ref}: validation loss {base_val:.4f} over 5 windows" in out
    fall = pd.read_csv(tmp_path / "o" / "fallback.csv").set_index("part")
    base_rows = got[got["model"] == str(base)].set_index("part")
    cand_rows = got[got["model"] == str(cand)].set_index("part")
    loss_part = "validation loss, all 5 windows (nats)"
    assert fall.loc["validation loss (nats)", "candidate"] == pytest.approx(cand_rows.loc[loss_part, "value"])
    assert fall.loc["validation loss (nats)", "baseline"] == pytest.approx(base_rows.loc[loss_part, "value"])
    assert bool(fall.loc["validation loss (nats)", "meets"]) == (cand_rows.loc[loss_part, "value"] < base_rows.loc[loss_part, "value"])
    assert "fallback rule" in out
