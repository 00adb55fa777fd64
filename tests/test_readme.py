"""The README's notebook example runs as written on the shipped checkpoint."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def notebook_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Use in a notebook"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.integration
def test_readme_notebook_example_runs():
    if not (ROOT / "model/checkpoints/gpt-4/model.safetensors").is_file():
        pytest.skip("the shipped gpt-4 checkpoint is not there yet")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(notebook_block(), "README.md", "exec"), {})
    printed = out.getvalue()
    assert "'Z'" in printed or "Z" in printed.splitlines()[0]
    assert sum(line.startswith("block ") for line in printed.splitlines()) == 4  # one RMS line per block
    change = float(printed.strip().splitlines()[-1].split(":")[-1])
    assert change > 0  # zeroing a head changes the logits


def attribution_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### TransformerLens's cache methods and direct logit attribution"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.integration
def test_readme_attribution_example_runs_and_sums():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(attribution_block(), "README.md", "exec"), {})
    first = out.getvalue().splitlines()[0].split()
    assert first[:3] == ["sum", "of", "parts"]
    assert abs(float(first[3]) - float(first[-1])) < 1e-3


@pytest.mark.integration
def test_readme_patching_example_runs():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Activation patching, path patching, composition scores"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})
    printed = out.getvalue()
    assert "score" in printed and "over_baseline" in printed


@pytest.mark.integration
def test_readme_tuned_lens_example_runs():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Tuned lens"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("logit") and lines[1].startswith("tuned") and "'tuned'" in lines[2]
