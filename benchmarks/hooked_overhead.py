"""How much the hook points cost: plain GPT forward vs HookedSprout vs the TransformerLens bridge.

    python benchmarks/hooked_overhead.py [--model sprout] [--batch 8] [--seq 512] [--reps 5]

All variants run on the same weights and the same random tokens, interleaved (one of each per
repetition, so machine noise hits them alike); the table gives medians and the ratio to the plain
forward. "full cache memory" is the bytes held by the tensors of a full cache.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from timing import interleaved, medians

import sprout_interp as si
from sprout_interp.lens.residual import stream_names


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sprout")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-bridge", action="store_true", help="skip the TransformerLens bridge")
    a = p.parse_args(argv)

    m = si.load(a.model)
    gpt = m.model
    toks = torch.randint(1, m.cfg.d_vocab, (a.batch, a.seq), generator=torch.Generator().manual_seed(0))
    resid = set(stream_names(m.cfg.n_layers))
    variants = {
        "plain model.GPT forward": lambda: gpt(toks),
        "HookedSprout forward, no hooks": lambda: m(toks),
        "run_with_cache, resid_post stream only": lambda: m.run_with_cache(toks, names_filter=lambda n: n in resid),
        "run_with_cache, every hook point": lambda: m.run_with_cache(toks),
    }
    if not a.no_bridge:
        bridge = m.to_transformer_lens()
        variants["TransformerLens bridge run_with_cache, everything"] = lambda: bridge.run_with_cache(toks)

    with torch.inference_mode():
        times, _ = interleaved(variants, a.reps, warmup=True)
        _, cache = m.run_with_cache(toks)
        cache_bytes = sum(v.numel() * v.element_size() for v in cache.values())

    base = medians(times)["plain model.GPT forward"]
    print(f"{a.model} at batch {a.batch} x {a.seq} tokens, {a.reps} interleaved repetitions, torch threads "
          f"{torch.get_num_threads()}")
    print("| variant | median (s) | ratio to plain forward |")
    print("|---|---:|---:|")
    for k, ts in times.items():
        med = medians(times)[k]
        print(f"| {k} | {med:.3f} | {med / base:.2f}x |")
    print(f"\nfull cache memory: {cache_bytes / 2**20:,.0f} MiB in {len(cache)} tensors")


if __name__ == "__main__":
    main()
