"""analyses/graph_predictions.py end to end on a tiny checkpoint that ships both kinds of transcoders (random ones):
one table per kind on the same prompts, each the library's own (logit_predictions with that kind), and a table a run
wrote before the kind column read back as the per-layer set's."""
from __future__ import annotations

import shutil

import pandas as pd
import pytest
import torch
from conftest import analysis_script

import sprout_interp as si
from sprout_interp.circuits.graph_predictions import logit_predictions, prediction_prompts
from sprout_interp.circuits.local_replacement import random_clt, random_transcoders
from sprout_interp.features.clt import save_clt
from sprout_interp.features.transcoder import save_transcoders

pytestmark = pytest.mark.acceptance  # the script end to end


def test_each_kind_on_the_same_prompts(tiny_checkpoint, tmp_path, capsys):
    folder = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    m = si.load(str(folder))
    save_transcoders(random_transcoders(m, k=4, d_transcoder=32, skip=False, seed=2), folder / "transcoders",
                     dtype=torch.float32)
    save_clt(random_clt(m, d_transcoder=32, density=0.1, seed=3), folder / "clt")
    out = tmp_path / "out"
    args = ["--models", str(folder), "--out", str(out), "--n", "0", "--ready-made", "10", "--k", "1"]
    assert analysis_script("graph_predictions").main(args) == 0
    text = capsys.readouterr().out
    df = pd.read_csv(out / "predictions.csv")
    assert sorted(df["transcoder_kind"].unique()) == ["clt", "per_layer"]
    prompts = prediction_prompts(m, n=0, ready_made=[10])
    for kind in ("per_layer", "clt"):
        got = df[df["transcoder_kind"] == kind].drop(columns="model").reset_index(drop=True)
        want = logit_predictions(m, prompts, kind=kind, k=1)
        assert len(got) == len(want) == 3 * 3 * 2  # three prompts, three rules, two final norms
        for col in ("text", "target", "layer", "pos", "feature", "final_norm"):
            assert got[col].tolist() == want[col].tolist(), (kind, col)
        for col in ("predicted_direct", "predicted_total", "real"):
            assert (got[col] - want[col]).abs().max() < 1e-9, (kind, col)
    assert "| per_layer | influence | frozen | 3 (3) |" in text and "| clt | influence | frozen | 3 (3) |" in text
    # a table from before the kind column is the per-layer set's
    old = tmp_path / "old.csv"
    df[df["transcoder_kind"] == "per_layer"].drop(columns="transcoder_kind").to_csv(old, index=False)
    assert analysis_script("graph_predictions").main(["--from-csv", str(old), "--out", str(tmp_path / "o2")]) == 0
    text = capsys.readouterr().out
    assert "| per_layer | influence | frozen | 3 (3) |" in text and "| clt |" not in text
