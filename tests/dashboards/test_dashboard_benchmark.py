"""The dashboard benchmark's load generator (benchmarks/dashboard_interaction.py, ``--load``): one training thread in
a subprocess that makes steps while it runs and is stopped on leaving, also when the measured block fails."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import dashboard_interaction as bench  # noqa: E402

pytestmark = pytest.mark.acceptance  # over 3 s: a subprocess imports torch and trains


def test_the_training_load_trains_while_it_runs_and_stops_even_on_failure():
    with bench.training_load() as load:
        t = time.perf_counter()
        while load.steps()[0] < 3 and time.perf_counter() - t < 120:
            time.sleep(0.2)
        steps, secs = load.steps()
        assert steps >= 3 and secs > 0
        proc = load.proc
    assert proc.poll() is not None and load.last[0] >= steps  # stopped; the steps it made are kept
    with pytest.raises(KeyError):
        with bench.training_load() as failing:
            kept = failing.proc
            raise KeyError("the measured block failed")
    assert kept.poll() is not None
    with bench.training_load(on=False) as off:
        assert off.proc is None and off.steps() == (0, 0.0)
