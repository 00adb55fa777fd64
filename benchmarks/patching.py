"""Activation patching speed: si.patching vs TransformerLens's patching loop, both on the same HookedSprout.

    python benchmarks/patching.py [--model sprout] [--seq 64] [--reps 3] [--heads]

A 64-token prompt and a corrupted copy (a few tokens changed), logit difference at the last
position. Residual-stream patching of every layer x position (``get_act_patch_resid_pre``), and with
``--heads`` every head x position of ``z`` (``get_act_patch_attn_head_out_by_pos``, 48 x 64 forwards
on sprout: minutes). The two methods run interleaved (one of each per repetition, so machine noise
hits them alike); prints medians, their ratio, the largest difference, and the multiply-add floor
(``sprout_interp.circuits.patching.patch_macs``).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformer_lens import patching as tlp

import sprout_interp as si
from sprout_interp import patching as P


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sprout")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--heads", action="store_true", help="also head x position patching of z (slow for TransformerLens)")
    a = p.parse_args(argv)
    m = si.load(a.model)
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, m.cfg.d_vocab, (1, a.seq), generator=g)
    corrupted = clean.clone()
    corrupted[0, [5, 20, 40]] = torch.randint(1, m.cfg.d_vocab, (3,), generator=g)
    ans, wrong = int(clean[0, 10]), int(clean[0, 30])

    def metric(logits):
        return (logits[:, -1, ans] - logits[:, -1, wrong]).mean()

    _, clean_cache = m.run_with_cache(clean)
    cases = [("resid_pre", "layer_pos", tlp.get_act_patch_resid_pre)]
    if a.heads:
        cases.append(("z", "head_pos", tlp.get_act_patch_attn_head_out_by_pos))
    print(f"{a.model}: {a.seq}-token prompt, logit difference at the last position, {a.reps} interleaved repetitions, "
          f"torch threads {torch.get_num_threads()}")
    print("| patching | patches | TransformerLens s | ours s | ours / TransformerLens | multiply-add floor | largest difference |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for site, by, tl_fn in cases:
        times = {"tl": [], "ours": []}
        for _ in range(a.reps):
            t0 = time.perf_counter()
            theirs = tl_fn(m, corrupted, clean_cache, metric)
            times["tl"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ours = P.activation_patch(m, clean, corrupted, P.LogitDiff(ans, wrong), site, by)
            times["ours"].append(time.perf_counter() - t0)
        if by == "head_pos":
            ours = ours.sort_values(["layer", "pos", "head"])
        diff = (torch.tensor(ours["value"].values, dtype=theirs.dtype) - theirs.flatten()).abs().max().item()
        tl_med, our_med = statistics.median(times["tl"]), statistics.median(times["ours"])
        floor = P.patch_macs(m.cfg, a.seq, site, by)["ratio"]
        print(f"| {site} by {by.replace('_', ' x ')} | {len(ours):,} | {tl_med:.2f} | {our_med:.2f} | "
              f"{our_med / tl_med:.3f} | {floor:.3f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
