"""The tutorial notebooks run top to bottom on the shipped checkpoints, and their saved outputs are current.

Each notebook in notebooks/ is executed in a fresh kernel, one at a time, with a timeout. Then:
- every code cell of the *saved* notebook has outputs and none of them is an error (the notebooks
  are read on a code host, where an unexecuted cell shows nothing);
- for cells tagged ``stable``, the text the fresh run prints equals the saved text, numbers within a
  small tolerance (thread scheduling moves the last digits). Cells tagged ``volatile`` (training with
  a tiny optimiser loop, timings) are only required to run.

To refresh the saved outputs after changing the library or a notebook:

    .venv/bin/python tests/test_notebooks.py            # every notebook, or name some
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

try:  # the test extra installs them; without it the tests below skip
    import nbclient
    import nbformat
except ImportError:  # pragma: no cover
    nbclient = nbformat = None
needs_executor = pytest.mark.skipif(nbformat is None, reason="pip install -e '.[test]' for nbclient + nbformat + ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TIMEOUT_S = 300  # per cell; a whole notebook takes 15-20 s on two cores
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
# One kernel at a time, on a single thread: on a 2-core machine that also runs other work, torch's
# two OpenMP threads contend for the cores and some operations (the SVDs of the composition scores)
# get a hundred times slower; progress bars would add stderr noise to the saved outputs. SPROUT_TEST_THREADS, where
# set, instead: the suite run under another thread count (docs/testing.md).
_THREADS = os.environ.get("SPROUT_TEST_THREADS", "").strip() or "1"
KERNEL_ENV = {"OMP_NUM_THREADS": _THREADS, "MKL_NUM_THREADS": _THREADS, "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
PROGRESS = re.compile(r"IProgress not found|\d+it/s\]|s/it\]|\|\s*\d+/\d+ \[")


def drop_progress_bars(nb) -> None:
    """Remove progress bars (and tqdm's notice that it cannot draw widgets) from stderr: not output."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs
                            if not (o["output_type"] == "stream" and o["name"] == "stderr"
                                    and (PROGRESS.search(o["text"]) or not o["text"].strip()))]


def execute(path: Path):
    """Run the notebook at ``path`` in a fresh kernel (cwd: notebooks/); return the executed notebook."""
    nb = nbformat.read(path, as_version=4)
    saved = {k: os.environ.get(k) for k in KERNEL_ENV}
    os.environ.update(KERNEL_ENV)
    try:
        client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3", record_timing=False,
                                         resources={"metadata": {"path": str(path.parent)}})
        client.execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    drop_progress_bars(nb)
    return nb


def cell_text(cell) -> str:
    """The text a reader sees: printed stdout and the plain-text form of results."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream" and out["name"] == "stdout":
            parts.append(out["text"])
        elif out["output_type"] in ("execute_result", "display_data"):
            parts.append(out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def same_text(saved: str, fresh: str, rel: float = 0.02, abs_: float = 0.011) -> bool:
    """Equal outside numbers; numbers equal within ``rel`` (relative) or ``abs_`` (absolute)."""
    if NUMBER.sub("#", saved) != NUMBER.sub("#", fresh):
        return False
    for a, b in zip(NUMBER.findall(saved), NUMBER.findall(fresh)):
        x, y = float(a.replace(",", "")), float(b.replace(",", ""))
        if abs(x - y) > max(abs_, rel * max(abs(x), abs(y))):
            return False
    return True


def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert names[:4] == ["01_quickstart.ipynb", "02_induction_circuit.ipynb", "03_chapter_claims.ipynb",
                         "04_your_checkpoint.ipynb"], names


@needs_executor
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_saved_notebook_has_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert cell.get("execution_count") is not None, f"{path.name} cell {i} was never run"
        assert cell.outputs, f"{path.name} cell {i} has no saved output"
        assert not [o for o in cell.outputs if o["output_type"] == "error"], f"{path.name} cell {i} saved an error"
        assert "stable" in cell.metadata.get("tags", []) or "volatile" in cell.metadata.get("tags", []), \
            f"{path.name} cell {i}: tag it stable (its output is checked) or volatile (only run)"


@needs_executor
@pytest.mark.acceptance  # runs each notebook top to bottom
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_matches_saved_outputs(path: Path):
    if not (ROOT / "model/checkpoints/gpt-4/model.safetensors").is_file():
        pytest.skip("the shipped checkpoints are not there yet")
    saved = nbformat.read(path, as_version=4)
    fresh = execute(path)  # raises CellExecutionError, with the cell and its traceback, on any error
    stale = []
    for i, (a, b) in enumerate(zip(saved.cells, fresh.cells)):
        if a.cell_type == "code" and "stable" in a.metadata.get("tags", []):
            if not same_text(cell_text(a), cell_text(b)):
                stale.append(f"cell {i}:\n--- saved\n{cell_text(a)}\n--- now\n{cell_text(b)}")
    assert not stale, (f"{path.name}: saved outputs are stale; rerun `.venv/bin/python tests/test_notebooks.py "
                       f"{path.name}`\n" + "\n".join(stale))


if __name__ == "__main__":
    wanted = sys.argv[1:]
    for path in NOTEBOOKS:
        if wanted and path.name not in wanted and path.stem not in wanted:
            continue
        t = time.time()
        nbformat.write(execute(path), path)
        print(f"{path.name}: executed and saved in {time.time() - t:.1f}s")
