"""The CLT training command end to end on the shipped gpt-4 (4 blocks) and the training corpus: stopped with
--max-steps, its state reported by --status, resumed to the end (saving the CLT and its quality), then shipped in
float16; each folder loads with load_clt."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import sprout_interp as si
from sprout_interp.core.loading import SHIPPED_DIR
from sprout_interp.features import clt_train
from sprout_interp.features.clt import dec_file, enc_file, load_clt

pytestmark = pytest.mark.acceptance  # a training run

ARGS = ["--model", "gpt-4", "--d-transcoder", "64", "--k", "4", "--chunks", "2", "--chunk-tokens", "1024",
        "--passes", "1", "--length", "128", "--batch-size", "256", "--save-every", "2", "--log-every", "2",
        "--eval-windows", "2"]


@pytest.mark.skipif(not (SHIPPED_DIR / "gpt-4" / "model.safetensors").is_file(), reason="gpt-4 not installed")
def test_train_stop_status_resume_and_ship(tmp_path, capsys):
    from sprout_interp.core.texts import training_documents
    from sprout_model.corpus import CorpusError

    try:
        training_documents()
    except CorpusError as e:
        pytest.skip(f"no corpus: {e}")
    run = tmp_path / "run"
    assert clt_train.main([*ARGS, "--out", str(run), "--max-steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "stopped at step 3" in out and (run / clt_train.STATE_FILE).is_file()
    assert clt_train.main([*ARGS, "--out", str(run), "--status"]) == 0
    out = capsys.readouterr().out
    assert "step 3/8 (768 tokens)" in out and "fve" in out
    assert clt_train.main([*ARGS, "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "8/8 steps (2,048 tokens)" in out and "gap_recovered" in out
    assert not (run / clt_train.STATE_FILE).exists()
    m = si.load("gpt-4")
    clt = load_clt(m, run)
    assert (clt.n_layers, clt.d_transcoder, clt.d_model) == (4, 64, 192)
    assert [r["layer"] for r in clt.info["quality"]] == [0, 1, 2, 3] and "gap_recovered" in clt.info["replacement"]
    assert clt.info["training"]["steps"] == 8 and clt.info["finished"]
    ship = tmp_path / "ship"
    assert clt_train.main(["--model", "gpt-4", "--ship", str(run), "--out", str(ship)]) == 0
    shipped = load_clt(m, ship)
    assert all(shipped.state_dict()[n].equal(p.half().float()) for n, p in clt.state_dict().items())
    assert {f.name for f in ship.iterdir()} == {"config.yaml", *(enc_file(i) for i in range(4)),
                                                *(dec_file(i) for i in range(4))}
    assert json.loads((ship / "config.yaml").read_text())["model_kind"] == "cross_layer_transcoder"
    assert {v.dtype for v in load_file(ship / enc_file(0)).values()} == {torch.float16}
