"""The benchmarks' shared timing harness: every variant timed each repetition, the order reversed every other one,
the warm-up untimed, medians and the markdown table from the recorded times."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from timing import interleaved, medians, ratio_table  # noqa: E402

pytestmark = pytest.mark.unit


def test_interleaved_reverses_the_order_every_other_repetition_and_keeps_the_last_results():
    calls = []
    variants = {k: (lambda k=k: calls.append(k) or f"{k}{len(calls)}") for k in ("a", "b", "c")}
    times, results = interleaved(variants, reps=4, warmup=True)
    assert calls == list("abc") + list("abc") + list("cba") + list("abc") + list("cba")
    assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4, "c": 4}
    assert results == {"a": "a15", "b": "b14", "c": "c13"}  # the last repetition ran reversed: c, b, a
    assert all(t >= 0 for v in times.values() for t in v)


def test_medians_and_the_ratio_table_come_from_the_recorded_times():
    times = {"naive": [4.0, 2.0, 3.0], "fast": [1.0, 0.5, 2.0]}
    assert medians(times) == {"naive": 3.0, "fast": 1.0}
    table = ratio_table(times, "naive", labels={"naive": "naive loop"}, extra={"header": "error", "fast": "1e-7"})
    rows = table.splitlines()
    assert rows[0] == "| variant | median s | fastest s | slowest s | ratio to naive loop | error |"
    assert rows[2] == "| naive loop | 3.000 | 2.000 | 4.000 | 1.000 |  |"
    assert rows[3] == "| fast | 1.000 | 0.500 | 2.000 | 0.333 | 1e-7 |"
