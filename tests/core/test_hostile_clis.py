"""Hostile command lines: every entry point a person runs (``python -m sprout_interp....``, ``analyses/*.py``, the
user-facing ``scripts/*.py``) answers a refused argument with exit status 2 and one ``error: ...`` line on stderr
naming it, never a Python traceback, and writes nothing.

Each case runs the real command in a subprocess. The refusals tested are ones met before any model or corpus is
read (a count out of range, a word where a number goes), except the few ``raised inside`` cases, which name a
checkpoint that does not exist: the ``SproutError`` the loader raises must reach the person as one line too.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
MISSING = "/nonexistent/sprout-checkpoint"

#: ``python -m`` modules of sprout_interp: (module, argv with one refused argument, what the error line names)
MODULES = [
    ("sprout_interp.lens.tuned_lens", ["--steps", "-1"], "--steps"),
    ("sprout_interp.lens.tuned_lens", ["--batch", "0"], "--batch"),
    ("sprout_interp.lens.tuned_lens", ["--lr", "nan"], "--lr"),
    ("sprout_interp.features.train", ["--layer", "0", "--k", "0"], "--k"),
    ("sprout_interp.features.train", ["--layer", "-1"], "--layer"),
    ("sprout_interp.features.transcoder_train", ["--batch-size", "0"], "--batch-size"),
    ("sprout_interp.features.transcoder_train", ["--layers", "0", "x"], "--layers"),
    ("sprout_interp.features.clt_train", ["--chunks", "0"], "--chunks"),
    ("sprout_interp.features.clt_train", ["--seed", "-3"], "--seed"),
    ("sprout_interp.features.labels", ["--n-texts", "0"], "--n-texts"),
    ("sprout_interp.features.labels", ["--top", "-1"], "--top"),
]

#: scripts run by path: (script, argv, what the error line names)
SCRIPTS = [
    *((f"analyses/{p.name}", ["--threads", "-1"], "--threads")
      for p in sorted((ROOT / "analyses").glob("*.py")) if p.name != "model_acceptance.py"),
    ("analyses/model_acceptance.py", ["--candidate", MISSING, "--threads", "-1"], "--threads"),
    ("analyses/confidence_drop.py", ["--length", "0"], "--length"),
    ("analyses/induction_heads.py", ["--seed", "-1"], "--seed"),
    ("scripts/induction_toy.py", ["--steps", "-1"], "--steps"),
    ("scripts/induction_toy.py", ["--threads", "0"], "--threads"),
    ("scripts/compare_circuit_tracer.py", ["--reps", "0"], "--reps"),
]

#: a SproutError raised inside main (after parsing): the checkpoint does not exist
RAISED_INSIDE = [
    (["-m", "sprout_interp.lens.tuned_lens", "--models", MISSING], MISSING),
    (["-m", "sprout_interp.features.train", "--model", MISSING, "--layer", "0"], MISSING),
    (["-m", "sprout_interp.features.transcoder_train", "--model", MISSING], MISSING),
    (["-m", "sprout_interp.features.clt_train", "--model", MISSING, "--status"], MISSING),
    (["-m", "sprout_interp.features.labels", "--model", MISSING], MISSING),
    (["scripts/precompute_dashboard.py", MISSING], MISSING),
]


def run(argv: list[str], cwd: Path) -> tuple[int, list[str]]:
    """``python argv`` from ``cwd`` (HF offline): (exit status, the lines of its stderr)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    return r.returncode, r.stderr.splitlines()


def one_error_line(code: int, err: list[str], names: str) -> str:
    """Assert exit status 2, no traceback and exactly one ``error:`` line naming ``names``; return that line.

    ``python -m sprout_interp.lens.tuned_lens`` (and the features modules) also print runpy's RuntimeWarning that the
    module was imported by its package before it ran: the package's ``__init__`` imports it; that line is Python's,
    printed before ``main`` runs, and is the only other line allowed."""
    text = "\n".join(err)
    assert "Traceback" not in text, text
    lines = [ln for ln in err if not ln.startswith("<frozen runpy>") or "RuntimeWarning" not in ln]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, text)
    assert names in lines[0], text
    return lines[0]


@pytest.mark.parametrize(("module", "argv", "names"), MODULES, ids=[f"{m}{' '.join(a)}" for m, a, _ in MODULES])
def test_python_dash_m_refuses_in_one_line(module, argv, names, tmp_path):
    code, err = run(["-m", module, *argv], tmp_path)
    line = one_error_line(code, err, names)
    assert "must be" in line, line  # the range it takes, not only the name
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(("script", "argv", "names"), SCRIPTS, ids=[f"{s} {' '.join(a)}" for s, a, _ in SCRIPTS])
def test_scripts_refuse_in_one_line(script, argv, names, tmp_path):
    code, err = run([str(ROOT / script), *argv], tmp_path)
    line = one_error_line(code, err, names)
    assert "must be" in line, line
    assert not any(tmp_path.iterdir())  # no out/ folder made


@pytest.mark.parametrize("argv", [a for a, _ in RAISED_INSIDE], ids=[" ".join(a[:2]) for a, _ in RAISED_INSIDE])
def test_a_sprout_error_inside_main_is_one_line(argv, tmp_path):
    if not argv[0].startswith("-"):
        argv = [str(ROOT / argv[0]), *argv[1:]]
    code, err = run(argv, tmp_path)
    one_error_line(code, err, MISSING)


def test_a_word_for_a_count_is_one_line(tmp_path):
    code, err = run(["-m", "sprout_interp.lens.tuned_lens", "--steps", "ten"], tmp_path)
    assert one_error_line(code, err, "--steps") == "error: --steps must be a whole number of at least 1, got 'ten'"


def test_every_entry_point_is_covered():
    """Each ``if __name__ == "__main__"`` module of sprout_interp is tested above, and each is wrapped by
    ``command_line`` (so a new one added without the wrapper fails here)."""
    found = set()
    for p in sorted((ROOT / "sprout_interp").rglob("*.py")):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body):
            module = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            found.add(module)
            main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
            assert any(ast.unparse(d) == "command_line" for d in main.decorator_list), f"{module}.main lacks @command_line"
    assert found == {m for m, _, _ in MODULES}


@pytest.mark.integration  # reads the shipped gpt-1
def test_a_layer_the_model_lacks_is_one_line(tmp_path):
    code, err = run(["-m", "sprout_interp.features.train", "--model", "gpt-1", "--layer", "99", "--tokens", "100"],
                    tmp_path)
    assert one_error_line(code, err, "layer 99") == "error: layer 99 is out of range: the model has layers 0..0"
    assert not any(tmp_path.iterdir())
