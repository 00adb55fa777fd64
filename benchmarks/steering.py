"""Activation steering speed: steering_effect's fast path vs the loop of hooked full forwards.

    python benchmarks/steering.py [--model sprout] [--coeffs 17] [--rows 8] [--reps 3] [--threads 2]

The shipped she/he contrast (``steering.EXAMPLE``), its vector added at one layer with ``--coeffs`` coefficients
from -8 to 8, on ``--rows`` prompts of held-out text cut to 64 tokens, the metric the logit difference
``logit[" she"] - logit[" he"]`` at the last position. Per layer, interleaved (one of each per repetition, so
machine noise hits them alike): ``method="fast"`` (the blocks before the steered one once, the coefficients
batched, unembedding only where the metric reads) and ``method="naive"`` (one ``run_with_hooks`` full forward per
coefficient, the loop one writes with TransformerLens). Prints medians, their ratio and the largest difference.
"""
from __future__ import annotations

import argparse

import torch
from timing import interleaved, medians

import sprout_interp as si
from sprout_interp.behaviour import steering
from sprout_interp.circuits.metrics import LogitDiff
from sprout_interp.core.texts import held_out_for


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sprout")
    p.add_argument("--coeffs", type=int, default=17)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, nargs="*", default=None, help="0-indexed (default: first, middle, last)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)

    m = si.load(a.model)
    L = m.cfg.n_layers
    layers = a.layers if a.layers is not None else sorted({0, L // 2, L - 1})
    ex = steering.EXAMPLE
    metric = LogitDiff(m.to_single_token(ex["answer"]), m.to_single_token(ex["wrong"]))
    tokens = held_out_for(m, a.rows, 64, seed=0)
    coeffs = [float(c) for c in torch.linspace(-8, 8, a.coeffs).tolist()]
    print(f"{a.model}: {a.rows} x {tokens.shape[1]} held-out tokens, {a.coeffs} coefficients, logit difference at the "
          f"last position, {a.reps} interleaved repetitions, torch threads {torch.get_num_threads()}")
    print("| steered at | naive loop s | fast s | fast / naive | largest difference |")
    print("|---|---:|---:|---:|---:|")
    for layer in layers:
        v = steering.steering_vector(m, list(ex["positive"]), list(ex["negative"]), layer)
        runs = {meth: (lambda meth=meth: steering.steering_effect(m, tokens, v, layer, coeffs, metric, method=meth))
                for meth in ("naive", "fast")}
        times, out = interleaved(runs, a.reps, warmup=True)  # the numbers each gives come back too
        med = medians(times)
        diff = float((out["fast"]["value"] - out["naive"]["value"]).abs().max())
        print(f"| block {layer + 1} (layer {layer}) resid_pre | {med['naive']:.3f} | {med['fast']:.3f} | "
              f"{med['fast'] / med['naive']:.3f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
