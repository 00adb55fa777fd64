"""Our attribution graphs against circuit-tracer 0.5.0's on the same model, transcoders and ids: the whole
comparison end to end. ``scripts/setup_circuit_tracer.sh`` builds (or reuses) ``.venv-ct`` from PyPI, then
``scripts/compare_circuit_tracer.py`` runs circuit-tracer's ``attribute`` in that venv on ``to_hf()``'s export
with the shipped transcoders of gpt-4 and Sprout, and with a cross-layer transcoder of each (the shipped one where the
model has one, else a seeded random one, read by circuit-tracer's own ``load_clt``), on one short prompt, and matches
its graph to ours node by node."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("gpt-4", "sprout")
KINDS = ("per_layer", "clt")
CASES = [(m, k) for m in MODELS for k in KINDS]


@pytest.fixture(scope="module")
def comparison(tmp_path_factory) -> dict:
    """The comparison's JSON on the short prompt, one row per model and kind of transcoders (the setup and the
    script as a user runs them; subprocess.run kills either on its timeout, and the script stops its worker on any
    exit)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    setup = subprocess.run(["bash", str(ROOT / "scripts" / "setup_circuit_tracer.sh")], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=1200)
    assert setup.returncode == 0, f"setup_circuit_tracer.sh failed:\n{setup.stdout[-2000:]}\n{setup.stderr[-4000:]}"
    out = tmp_path_factory.mktemp("circuit-tracer") / "comparison.json"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_circuit_tracer.py"), "--models", *MODELS,
                          "--prompts", "short", "--kinds", *KINDS, "--clt", "auto", "--no-bench", "--json",
                          str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    assert run.returncode == 0, f"compare_circuit_tracer.py failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["kind"]) for r in rows] == CASES
    return {(r["model"], r["kind"]): r for r in rows}


@pytest.mark.parametrize("model, kind", CASES)
def test_same_nodes_as_circuit_tracer(comparison, model, kind):
    r = comparison[model, kind]
    assert r["graph_kind"] == kind
    assert r["same_tokens"] and r["positions"] == 14  # <|endoftext|> and "Zorbin Plax came home. Zorbin"
    # no near-tie decides which features are active: float rounding (about 1e-6 of a pre-activation) cannot move one
    assert r["cut_margin"] > 2e-6, f"a feature is {r['cut_margin']:.1e} from the cut"
    assert r["same_features"] and r["features"] == r["ct_features"] > 0
    assert r["same_logits"] and 1 <= len(r["logits"]) <= 10
    assert r["same_nodes"] and r["n_nodes"] == r["ct_n_nodes"] == r["matched"]


@pytest.mark.parametrize("model, kind", CASES)
def test_same_adjacency_as_circuit_tracer(comparison, model, kind):
    r = comparison[model, kind]
    assert r["max_abs_edge"] > 0.1  # a real graph, not two empty ones
    assert r["max_rel_diff"] <= 1e-4, f"largest difference {r['max_abs_diff']:.2e} at edge {r['worst_edge']}"
    assert r["max_abs_diff"] <= 1e-4 * max(1.0, r["max_abs_edge"])
    assert r["exactness"] <= 1e-3


@pytest.mark.parametrize("model, kind", CASES)
def test_same_scores_as_circuit_tracer(comparison, model, kind):
    r = comparison[model, kind]
    assert 0 < r["replacement"] < 1 and 0 < r["completeness"] < 1
    assert abs(r["replacement"] - r["ct_replacement"]) <= 1e-4
    assert abs(r["completeness"] - r["ct_completeness"]) <= 1e-4
