"""Benchmark: the full single-head ablation sweep of a checkpoint, our fast exact sweep vs the naive loop.

    python benchmarks/ablation_sweep.py                       # shipped sprout, 8 x 256 tokens, 5 reps
    python benchmarks/ablation_sweep.py --model runs/sprout/checkpoint --reps 5
    python benchmarks/ablation_sweep.py --model random-sprout --reps 3   # untrained weights, same shapes and cost

Methods, each sweeping every head (sprout: 8 blocks x 6 heads = 48) on the same --batch x --seq tokens
(held-out text when the corpus is installed, else random tokens) with the same metric (--metric,
default the mean next-token loss) and ablation (--kind, default zero):

- naive: one full forward per head (``ablation_sweep(method="naive")``: ``run_with_hooks`` with the
  head's ``hook_z`` replaced, then the metric on the logits), plus the clean run;
- fast: ``ablation_sweep(method="fast")``: the clean stream entering each block is computed once; each
  head reruns only its own block's output projection and feed-forward and the blocks after it, several
  heads batched per forward, and the unembedding only where the metric reads; when the metric reads at
  most 3/4 of the positions, the last block too runs in full only there (elsewhere its keys and values);
- attribution: ``attribution_sweep``, one forward and one backward (a linear estimate, not exact).

The methods are interleaved (their order alternates every repetition) and the table gives the median,
minimum and maximum over --reps repetitions and the ratio of medians to the naive loop. The exactness of
the fast sweep (largest |fast - naive|) and the Spearman rank correlation of attribution patching with
the exact changes are printed too. Timings share the machine with whatever else runs on it.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import torch
from timing import interleaved, medians, ratio_table

from sprout_interp.circuits.ablation import ablation_sweep, attribution_sweep, metric_reach, spearman, sweep_macs


def _load(spec: str):
    import sprout_interp as si
    from sprout_interp.core.errors import CheckpointNotFoundError

    if spec.startswith("random-"):
        from sprout_interp import HookedSprout
        from sprout_model import GPT, preset

        torch.manual_seed(0)
        return HookedSprout(GPT(preset(spec[len("random-"):])).eval(), name=spec), "untrained weights (timing only)"
    try:
        m = si.load(spec)
    except CheckpointNotFoundError as e:
        print(f"cannot load {spec!r}: {e}\nthe shipped checkpoint may not be there yet: pass --model runs/sprout/checkpoint "
              "(a checkpoint you trained) or --model random-sprout (untrained weights, same cost)", file=sys.stderr)
        raise SystemExit(2)
    return m, str(m.source or spec)


def _tokens(m, batch: int, seq: int, seed: int):
    if m.tokenizer is not None:
        try:
            from sprout_interp.core.texts import validation_sample

            corpus = (m.info or {}).get("corpus") or "default"
            return torch.as_tensor(validation_sample(m.tokenizer, batch, seq, seed, corpus=corpus)), "held-out text"
        except (ImportError, OSError, ValueError, RuntimeError) as e:
            print(f"(held-out text unavailable: {e}; using random tokens)", file=sys.stderr)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, m.cfg.d_vocab, (batch, seq), generator=g), "random tokens"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sprout", help="shipped name, checkpoint path, or random-<preset>")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions (medians over these)")
    p.add_argument("--metric", default="loss", choices=["loss", "copying", "copying_ratio", "target"],
                   help="target: log-probability of each row's last token (one position per row)")
    p.add_argument("--kind", default="zero", choices=["zero", "mean", "resample"])
    p.add_argument("--heads-per-batch", type=int, default=None, help="heads per forward in the fast sweep (default: the library's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.time()
    m, src = _load(a.model)
    toks, what = _tokens(m, a.batch, a.seq, a.seed)
    if a.metric.startswith("copying"):
        from sprout_model.evaluation import repeated_tokens_batch

        toks, what = repeated_tokens_batch(m.cfg.d_vocab, a.seq // 2, a.batch, a.seed), "random tokens repeated twice"
    metric = a.metric
    if a.metric == "target":
        from sprout_interp.circuits.ablation import TargetLogProb

        metric = TargetLogProb([toks.shape[1] - 2] * toks.shape[0], toks[:, -1].tolist(), rows=range(toks.shape[0]),
                               name="target_logprob")
    reference = None
    if a.kind == "mean":
        from sprout_interp.circuits.ablation import head_means

        reference = head_means(m, toks.roll(1, 0))  # any reference; its cost is outside the timings
    n_heads = m.cfg.n_layers * m.cfg.n_heads
    print(f"model: {a.model} ({src}): {m.cfg.n_layers} blocks x {m.cfg.n_heads} heads = {n_heads} heads, "
          f"d_model {m.cfg.d_model}, {m.model.num_params():,} parameters")
    print(f"input: {toks.shape[0]} x {toks.shape[1]} tokens ({what}); metric {a.metric}; {a.kind} ablation; "
          f"{a.reps} interleaved repetitions")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} torch threads, load average {os.getloadavg()[0]:.1f} at start")

    def fast():
        return ablation_sweep(m, toks, metric, kind=a.kind, reference=reference, heads_per_batch=a.heads_per_batch)

    def naive():
        return ablation_sweep(m, toks, metric, kind=a.kind, reference=reference, method="naive")

    def attribution():
        return attribution_sweep(m, toks, metric, kind=a.kind, reference=reference)

    runs = {"naive": naive, "fast": fast, "attribution": attribution}
    times, results = interleaved(runs, a.reps, progress=True)
    err = float((results["fast"]["ablated"] - results["naive"]["ablated"]).abs().max())
    rho = spearman(results["naive"]["change"], results["attribution"]["estimate"])
    med = medians(times)
    labels = {
        "naive": "naive loop: one full forward per head",
        "fast": "fast exact sweep (reuse stream before the block, batched heads)",
        "attribution": "attribution patching (1 forward + 1 backward)",
    }
    print()
    print(ratio_table(times, "naive", labels))
    print()
    print(f"fast vs naive: ratio of medians {med['fast'] / med['naive']:.3f} (the floor is sweep_macs's ratio); "
          f"largest |fast - naive| over the {n_heads} heads: {err:.2e} ({a.metric})")
    print(f"attribution patching vs the exact sweep: Spearman rank correlation {rho:.3f}; time ratio {med['attribution'] / med['naive']:.3f}")
    B, T = toks.shape
    read, prefix = metric_reach(metric, toks)  # where the metric reads: the fast sweep's unembedding and prefix
    macs = sweep_macs(m.cfg, T, read=read, prefix=prefix)
    print(f"multiply-adds (sprout_interp.circuits.ablation.sweep_macs): naive {B * macs['naive'] / 1e9:,.0f}G, fast "
          f"{B * macs['fast'] / 1e9:,.0f}G, ratio {macs['ratio']:.3f}: the fast sweep's floor, measured {med['fast'] / med['naive']:.3f}")
    print(f"total {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
