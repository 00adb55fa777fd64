"""The README's notebook example runs as written on the shipped checkpoint."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_block(heading: str) -> str:
    """Run the first ```python block after ``heading`` in the README; returns what it printed."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index(heading):], re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})
    return out.getvalue()


@pytest.mark.integration
def test_readme_notebook_example_runs():
    if not (ROOT / "model/checkpoints/gpt-4/model.safetensors").is_file():
        pytest.skip("the shipped gpt-4 checkpoint is not there yet")
    printed = run_block("## Use in a notebook")
    assert "'Z'" in printed or "Z" in printed.splitlines()[0]
    assert sum(line.startswith("block ") for line in printed.splitlines()) == 4  # one RMS line per block
    change = float(printed.strip().splitlines()[-1].split(":")[-1])
    assert change > 0  # zeroing a head changes the logits


@pytest.mark.integration
def test_readme_attribution_example_runs_and_sums():
    first = run_block("### TransformerLens's cache methods and direct logit attribution").splitlines()[0].split()
    assert first[:3] == ["sum", "of", "parts"]
    assert abs(float(first[3]) - float(first[-1])) < 1e-3


@pytest.mark.integration
def test_readme_patching_example_runs():
    printed = run_block("### Activation patching, path patching, composition scores")
    assert "score" in printed and "over_baseline" in printed
    r = float(re.search(r"attribution vs exact: r = (-?[0-9.]+)", printed).group(1))
    assert 0.8 <= r <= 1.0  # on gpt-4's heads the estimate ranks like the exact scores


@pytest.mark.integration
def test_readme_steering_example_runs_and_the_vector_beats_random_pushes():
    lines = run_block("### Activation steering").strip().splitlines()
    assert lines[0].split() == ["coeff", "value", "change"]
    changes = [float(line.split()[-1]) for line in lines[1:4]]
    assert changes[0] < 0 == changes[1] < changes[2]  # minus the vector: more " he"; plus it: more " she"
    vec, rnd = (float(x) for x in re.search(r"vector ([-+0-9.]+) nats, random at most ([0-9.]+)", lines[4]).groups())
    assert vec > 2 * rnd
    assert lines[5].startswith("Once upon a time, the old doctor")


@pytest.mark.integration
def test_readme_tuned_lens_example_runs():
    lines = run_block("### Tuned lens").splitlines()
    assert lines[0].startswith("logit") and lines[1].startswith("tuned") and "'tuned'" in lines[2]


@pytest.mark.integration
def test_readme_features_example_runs_and_ablating_the_name_feature_costs_loss():
    import sprout_interp as si

    *_, clean_line, ablated_line = run_block("## Features (sparse autoencoders)").strip().splitlines()
    clean, ablated = float(clean_line.split()[1]), float(ablated_line.split()[3])
    m = si.load("sprout")
    assert clean == pytest.approx(m("Zorbin Plax came home. The next day Zorbin Plax", return_type="loss").item(), abs=1e-3)
    assert ablated > clean + 0.05  # the feature carries part of the name's copying, so the clamp costs loss


@pytest.mark.integration
def test_readme_neurons_example_runs_and_ablating_the_pushers_lowers_the_logit_difference():
    out = run_block("## Neurons (the feed-forward's own units)").strip().splitlines()
    assert out[0].split() == ["block", "neuron", "activation", "attribution", "promotes"] and len(out) >= 8
    clean, ablated, change = (float(v) for v in out[7].split()[1:4])
    assert change == pytest.approx(ablated - clean, abs=2e-3)
    assert change < 0  # the neurons that push towards " Pl" directly, zeroed: the logit difference falls


def test_readme_shows_a_screenshot_of_every_dashboard_page():
    import ast

    tree = ast.parse((ROOT / "scripts/screenshots.py").read_text())
    pages = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "PAGES")
    views = {p.stem for p in (ROOT / "dashboards/views").glob("*.py")}
    assert set(pages) == views  # scripts/screenshots.py takes one of every page
    readme = (ROOT / "README.md").read_text()
    for page in pages:
        assert f"(docs/screenshots/{page}.png)" in readme, page
        assert (ROOT / "docs/screenshots" / f"{page}.png").is_file(), page
