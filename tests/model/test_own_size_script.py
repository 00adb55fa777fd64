"""scripts/own_size_sprout.sh decides which stage of the own-size recipe comes next from the run folders.

Its --dry-run prints the commands it would run, so the stage logic is checked here on fake run states
(the real stages take hours): an absent or unfinished copy stage is run (resumed), a finished one (last
evaluation's copying ratio at or below COPY_STOP) is skipped, and the stable run always starts from it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sprout_model.run_state import write_state

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "own_size_sprout.sh"


def dry_run(runs: Path, **env: str) -> str:
    """The script's --dry-run output with RUNS=runs."""
    out = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHON": sys.executable, "RUNS": str(runs), **env})
    assert out.returncode == 0, out.stderr
    return out.stdout


def fake_copy_run(runs: Path, ratios: list[float]) -> None:
    """A copy-stage state.pt whose evaluations had these copying ratios."""
    folder = runs / "sprout-O-copy"
    folder.mkdir(parents=True)
    history = [{"step": 50 * (i + 1), "copy_ratio": r} for i, r in enumerate(ratios)]
    write_state({"model": {}, "history": history}, folder / "state.pt")


def commands(text: str) -> list[str]:
    return [line.split("run: ", 1)[1] for line in text.splitlines() if "run: " in line]


def copy_commands(text: str) -> list[str]:
    return [c for c in commands(text) if "--copy-rows 1.0" in c]


def stable_command(text: str) -> str:
    (c,) = [c for c in commands(text) if "--schedule wsd" in c]
    return c


@pytest.mark.parametrize("ratios", [None, [], [0.99, 0.95, 0.5]], ids=["no-run", "no-evaluation", "plateau"])
def test_an_unfinished_copy_stage_is_run_with_its_stop(tmp_path, ratios):
    if ratios is not None:
        fake_copy_run(tmp_path, ratios)
    out = dry_run(tmp_path)
    (c,) = copy_commands(out)
    assert f"--out {tmp_path}/sprout-O-copy" in c and "--stop-copy-ratio 0.2" in c and "--preset sprout" in c
    assert f"--init-from {tmp_path}/sprout-O-copy" in stable_command(out)


def test_a_finished_copy_stage_is_skipped_and_the_stable_run_starts_from_it(tmp_path):
    fake_copy_run(tmp_path, [0.99, 0.4, 0.18])
    out = dry_run(tmp_path)
    assert copy_commands(out) == []
    assert "copy stage: done (copying ratio 0.18 <= 0.2)" in out
    c = stable_command(out)
    assert f"--init-from {tmp_path}/sprout-O-copy" in c and f"--out {tmp_path}/sprout-O-wsd" in c
    assert "--data data/large-names" in c and "--tokens 60e6" in c and "--cooldown-tokens 12e6" in c


@pytest.mark.acceptance  # over 3 s
def test_the_stop_ratio_is_the_one_set(tmp_path):
    fake_copy_run(tmp_path, [0.18])
    assert copy_commands(dry_run(tmp_path, COPY_STOP="0.1")) != []
    assert copy_commands(dry_run(tmp_path, COPY_STOP="0.25")) == []
