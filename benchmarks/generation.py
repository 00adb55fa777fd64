"""Greedy generation speed: HookedSprout.generate (keys and values kept) vs without the cache vs Hugging Face.

    python benchmarks/generation.py [--model sprout] [--new 64] [--reps 5] [--threads 2]

The same prompt, greedy decoding (top_k=1) for ``--new`` tokens, three variants interleaved (one of
each per repetition, so machine noise hits them alike): ours with the key/value cache (the default),
ours recomputing the whole context every step (``use_cache=False``), and ``to_hf()``'s
``generate(do_sample=False)`` on the exported Qwen3 model (which keeps its own key/value cache).
Prints medians, tokens/s and the ratio to Hugging Face, and checks that all three produce the same
tokens.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from timing import interleaved, medians

import sprout_interp as si

PROMPT = ("Zorbin Plax came home late. The lamps were lit along the street, and the old dog was asleep by "
          "the door. Later that day, Zorbin Plax")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sprout")
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)

    m = si.load(a.model)
    hf, _ = m.to_hf()
    ids = m.to_tokens(PROMPT)
    variants = {
        "HookedSprout.generate (key/value cache)": lambda: m.generate(ids, a.new, top_k=1, stop_at_eot=False),
        "HookedSprout.generate(use_cache=False)": lambda: m.generate(ids, a.new, top_k=1, stop_at_eot=False,
                                                                     use_cache=False),
        "to_hf() generate(do_sample=False)": lambda: hf.generate(ids, max_new_tokens=a.new, min_new_tokens=a.new,
                                                                 do_sample=False, attention_mask=torch.ones_like(ids)),
    }
    with torch.no_grad():
        times, outs = interleaved(variants, a.reps, warmup=True)  # the tokens each variant makes come back too
    hf_med = medians(times)["to_hf() generate(do_sample=False)"]
    print(f"{a.model}: greedy, {ids.shape[1]}-token prompt + {a.new} new tokens, {a.reps} interleaved repetitions, "
          f"torch threads {torch.get_num_threads()}")
    print("| variant | median (s) | tokens/s | time / Hugging Face |")
    print("|---|---:|---:|---:|")
    for k, ts in times.items():
        med = medians(times)[k]
        print(f"| {k} | {med:.3f} | {a.new / med:,.0f} | {med / hf_med:.2f}x |")
    ref = outs["HookedSprout.generate (key/value cache)"]
    same = {k: torch.equal(o[:, : ref.shape[1]], ref) for k, o in outs.items()}
    print("same tokens as the cached run: " + ", ".join(f"{k}: {v}" for k, v in same.items()))


if __name__ == "__main__":
    main()
