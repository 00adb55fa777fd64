"""scripts/induction_toy.py: the copying probe runs, and its rows repeat with the period they claim."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.unit

spec = importlib.util.spec_from_file_location("induction_toy", Path(__file__).parents[2] / "scripts" / "induction_toy.py")
toy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(toy)


def test_rows_repeat_with_random_or_fixed_periods():
    rng = np.random.default_rng(0)
    x = toy.rows(rng, 16, 65, alphabet=50, fixed_period=None).numpy()
    periods = set()
    for row in x:
        p = next(p for p in range(8, 33) if np.array_equal(row[p:], row[:-p]))
        periods.add(p)
        assert row.min() >= 1 and row.max() < 50
    assert len(periods) > 3  # not one fixed offset
    x = toy.rows(rng, 4, 64, alphabet=50, fixed_period=32).numpy()
    assert np.array_equal(x[:, :32], x[:, 32:])


def test_probe_runs_and_reports(capsys):
    toy.main(["--vocab", "40", "--alphabet", "20", "--d-model", "16", "--layers", "2", "--heads", "2", "--seq-len", "32",
              "--batch", "4", "--steps", "2", "--every", "1", "--threads", "1", "--embed-mean", "0.3", "--embed-lr", "2"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert "parameters" in lines[0] and len(lines) == 4  # header + steps 0, 1, 2
    assert lines[-1].startswith("2 ") and lines[-1].count("[") == 2  # full-vocabulary and alphabet ratios
