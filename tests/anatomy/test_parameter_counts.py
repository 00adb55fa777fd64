"""analyses/parameter_counts.py reproduces every parameter figure of the chapter on the shipped checkpoints."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import tiny_config

from sprout_interp.anatomy.params import counted_breakdown, param_breakdown
from sprout_model import GPT

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_formula_equals_counted_tensors_on_a_tiny_model():
    cfg = tiny_config()
    counted = counted_breakdown(GPT(cfg))
    formula = param_breakdown(cfg.d_model, cfg.n_layer, cfg.d_ff, cfg.vocab_size, cfg.n_head)
    assert counted == formula


@pytest.mark.integration
def test_script_reproduces_the_chapter(tmp_path, capsys):
    if not all((ROOT / f"model/checkpoints/{n}/model.safetensors").is_file() for n in ("gpt-1", "gpt-4", "sprout")):
        pytest.skip("the shipped checkpoints are not all there")
    spec = importlib.util.spec_from_file_location("parameter_counts", ROOT / "analyses/parameter_counts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "sprout, total: the chapter's parameter counts: REPRODUCED: chapter 17,309,056, ours 17,309,056" in out
    assert "sprout, untied: the chapter's parameter counts: REPRODUCED: chapter 20,454,784, ours 20,454,784" in out
    assert "gpt-1: formula = counted parameters for every piece: REPRODUCED: total 2,015,936" in out
    assert "gpt-4: formula = counted parameters for every piece: REPRODUCED: total 3,344,576" in out
    assert "DIFFERS" not in out
    assert (tmp_path / "parameter_counts.csv").is_file()
