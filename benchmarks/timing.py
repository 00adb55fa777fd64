"""The timing harness every benchmark shares: variants run interleaved, their order reversed every other
repetition, so a busy machine's noise hits all of them alike; medians, never single runs, and ratios of medians
taken within one run. No benchmark compares a time with a number measured on another day."""
from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, Optional


def interleaved(variants: dict[str, Callable[[], Any]], reps: int, warmup: bool = False,
                progress: bool = False) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """``(times, results)``: each variant's wall-clock seconds over ``reps`` repetitions (the order of the variants
    reversed every other repetition) and its last result. ``warmup`` runs each once first, untimed; ``progress``
    prints each repetition's times to stderr."""
    results: dict[str, Any] = {}
    if warmup:
        results = {k: f() for k, f in variants.items()}
    times: dict[str, list[float]] = {k: [] for k in variants}
    t_start = time.time()
    for r in range(reps):
        order = list(variants) if r % 2 == 0 else list(variants)[::-1]
        for k in order:
            t0 = time.perf_counter()
            results[k] = variants[k]()
            times[k].append(time.perf_counter() - t0)
        if progress:
            print(f"  rep {r + 1}/{reps}: " + ", ".join(f"{k} {times[k][-1]:.2f}s" for k in variants)
                  + f" (elapsed {time.time() - t_start:.0f}s)", file=sys.stderr, flush=True)
    return times, results


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """The median seconds of each variant."""
    return {k: statistics.median(v) for k, v in times.items()}


def ratio_table(times: dict[str, list[float]], base: str, labels: Optional[dict[str, str]] = None,
                extra: Optional[dict[str, str]] = None) -> str:
    """A markdown table: each variant's median, fastest and slowest seconds and its ratio of medians to ``base``;
    ``labels`` renames rows, ``extra`` adds a last column (its header the key ``"header"``, one value per variant)."""
    med = medians(times)
    extra = dict(extra or {})
    head = extra.pop("header", None)
    lines = ["| variant | median s | fastest s | slowest s | ratio to " + (labels or {}).get(base, base) + " |"
             + (f" {head} |" if head else ""),
             "|---|---:|---:|---:|---:|" + ("---:|" if head else "")]
    for k, ts in times.items():
        row = f"| {(labels or {}).get(k, k)} | {med[k]:.3f} | {min(ts):.3f} | {max(ts):.3f} | {med[k] / med[base]:.3f} |"
        lines.append(row + (f" {extra.get(k, '')} |" if head else ""))
    return "\n".join(lines)
