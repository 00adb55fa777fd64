"""Attribution-graph speed: si.attribution_graph for a 64-token prompt, beside the multiply-add floor.

    python benchmarks/attribution_graph.py [--model sprout] [--seq 64] [--reps 3] [--threads 1]
                                           [--transcoders random|FOLDER] [--k 32]

A seeded random prompt of ``--seq`` tokens (``<|endoftext|>`` put first, as circuit-tracer does). The
transcoders are the model's shipped set when there is one, else seeded random TopK ones of width 4 x d_model
(``random_transcoders``; a graph costs the same for any set with the same k and skip connection), or the folder
given. Each repetition times the whole graph, then a reference matrix product of the backward passes' own shape
(rows x d_model times d_model x d_model), interleaved so machine noise hits both alike. Prints medians, the graph's
multiply-adds (counted as it runs), the floor (those multiply-adds at the reference product's rate on this
machine), circuit-tracer's multiply-adds for the same graph (``graph_macs``: a lower bound for its backward
passes) and the ratio, the largest exactness error, and the graph's size.

On a shared machine, one thread is the honest setting: two threads wait on each other when other work holds the
cores (``--threads``).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import sprout_interp as si
from sprout_interp.circuits.attribution_graph import graph_macs
from sprout_interp.circuits.local_replacement import random_transcoders
from sprout_interp.core.errors import TranscoderNotFoundError
from sprout_interp.features.transcoder import load_transcoders


def reference_rate(d: int, rows: int = 8192, reps: int = 5) -> float:
    """Multiply-adds per second of a (rows, d) x (d, d) float32 product, the backward passes' commonest shape."""
    a, b = torch.randn(rows, d), torch.randn(d, d)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return rows * d * d * reps / (time.perf_counter() - t0)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sprout")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--transcoders", default=None, help="'random', or a folder (default: the shipped set, else random)")
    p.add_argument("--k", type=int, default=32, help="active features per token of random transcoders")
    p.add_argument("--batch-size", type=int, default=64)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    m = si.load(a.model)
    if a.transcoders not in (None, "random"):
        ts, which = load_transcoders(m, Path(a.transcoders)), a.transcoders
    else:
        try:
            if a.transcoders == "random":
                raise TranscoderNotFoundError("random asked for")
            ts, which = load_transcoders(m), "shipped"
        except TranscoderNotFoundError:
            ts, which = random_transcoders(m, k=a.k, seed=0), f"random TopK k={a.k}"
    tc = ts[ts.layers[0]]
    prompt = torch.randint(1, m.cfg.d_vocab, (a.seq,), generator=torch.Generator().manual_seed(0))
    times, rates, graph = [], [], None
    for _ in range(a.reps):
        t0 = time.perf_counter()
        graph = si.attribution_graph(m, prompt, ts, batch_size=a.batch_size)
        times.append(time.perf_counter() - t0)
        rates.append(reference_rate(m.cfg.d_model))
    t_med, rate = statistics.median(times), statistics.median(rates)
    macs = graph.info["macs"]
    est = graph_macs(m.cfg.n_layers, m.cfg.d_model, m.cfg.n_heads, graph.n_pos,
                     graph.n_features / (m.cfg.n_layers * (graph.n_pos - 1)), tc.has_skip, graph.n_logits)
    print(f"{a.model}: a {a.seq}-token prompt (+ <|endoftext|>), transcoders {which} (width {tc.d_transcoder}, "
          f"k {tc.k}, {'skip' if tc.has_skip else 'no skip'}), {a.reps} interleaved repetitions, torch threads "
          f"{torch.get_num_threads()}")
    print(f"graph: {graph.n_features:,} features, {graph.n_errors:,} errors, {graph.n_pos} embeddings, "
          f"{graph.n_logits} logits; adjacency {tuple(graph.adjacency.shape)}; largest |input - (edges + constant)| "
          f"{graph.max_error():.1e}")
    print("| graph s (median) | multiply-adds | reference GMAC/s | floor s | graph / floor | circuit-tracer "
          "multiply-adds | ours / circuit-tracer |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {t_med:.2f} | {macs:.3g} | {rate / 1e9:.2f} | {macs / rate:.2f} | {t_med / (macs / rate):.2f} | "
          f"{est['circuit_tracer']:.3g} | {est['ratio']:.3f} |")


if __name__ == "__main__":
    main()
