"""Sparse-autoencoder throughput on this machine: activation collection and TopK training, tokens/s.

    python benchmarks/sae.py [--model sprout] [--layers 1 3] [--tokens 20000] [--steps 60] [--threads 1]

Collection: ``collect_activations`` over ``--tokens`` training tokens (windows of 256), the model run only up to
the layer's block. Training: ``train_sae`` on those activations with the shipped settings (d_sae 8 x d_model,
k 32, batch 1024) for about ``--steps`` steps, tokens/s = tokens seen / seconds. Each figure is the median of
``--reps`` runs. The shipped SAEs' own times are in their cfg.json (``sprout.training``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import sprout_interp as si
from sprout_interp.features.train import collect_activations, train_sae


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sprout")
    p.add_argument("--layers", type=int, nargs="+", default=[1, 3])
    p.add_argument("--tokens", type=int, default=20_000)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    m = si.load(a.model)
    print(f"{a.model}: {m.cfg.n_layers} blocks, d_model {m.cfg.d_model}; torch threads {torch.get_num_threads()}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'layer':>5} {'block':>5} {'collect tok/s':>14} {'train tok/s':>12}")
    for layer in a.layers:
        collect, trained = [], []
        for rep in range(a.reps):
            t0 = time.perf_counter()
            acts = collect_activations(m, layer, a.tokens, seed=rep, progress=False)
            collect.append(len(acts) / (time.perf_counter() - t0))
            epochs = max(1, round(a.steps * 1024 / len(acts)))
            _, st = train_sae(m, layer, acts, epochs=epochs, batch_size=1024, progress=False, seed=rep)
            trained.append(st.tokens_per_s)
        print(f"{layer:>5} {layer + 1:>5} {statistics.median(collect):>14,.0f} {statistics.median(trained):>12,.0f}")


if __name__ == "__main__":
    main()
