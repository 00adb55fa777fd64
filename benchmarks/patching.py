"""Activation patching speed: si.patching vs TransformerLens's patching loop, both on the same HookedSprout.

    python benchmarks/patching.py [--model sprout] [--seq 64] [--reps 3] [--heads]

A 64-token prompt and a corrupted copy (a few tokens changed), logit difference at the last
position. Residual-stream patching of every layer x position (``get_act_patch_resid_pre``), and with
``--heads`` every head x position of ``z`` (``get_act_patch_attn_head_out_by_pos``, 48 x 64 forwards
on sprout: minutes). The two methods run interleaved (one of each per repetition, so machine noise
hits them alike); prints medians, their ratio, the largest difference, and the multiply-add floor
(``sprout_interp.circuits.patching.patch_macs``).

Then attribution patching (``attribution_patch``: one forward and one backward pass) against the exact fast path
on the dashboard patching page's name pair (the first "Zorbin" renamed; logit " Pl" − " the" at the last
position), interleaved the same way: medians, their ratio, and how closely the estimate follows the exact
scores (Pearson r and the largest error, in score units, from ``patching_agreement``).
"""
from __future__ import annotations

import argparse

import torch
from timing import interleaved, medians
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
        times, out = interleaved({"tl": lambda: tl_fn(m, corrupted, clean_cache, metric),
                                  "ours": lambda: P.activation_patch(m, clean, corrupted, P.LogitDiff(ans, wrong), site, by)},
                                 a.reps)
        theirs, ours = out["tl"], out["ours"]
        if by == "head_pos":
            ours = ours.sort_values(["layer", "pos", "head"])
        diff = (torch.tensor(ours["value"].values, dtype=theirs.dtype) - theirs.flatten()).abs().max().item()
        tl_med, our_med = medians(times)["tl"], medians(times)["ours"]
        floor = P.patch_macs(m.cfg, a.seq, site, by)["ratio"]
        print(f"| {site} by {by.replace('_', ' x ')} | {len(ours):,} | {tl_med:.2f} | {our_med:.2f} | "
              f"{our_med / tl_med:.3f} | {floor:.3f} | {diff:.1e} |")

    attribution_table(m, a.reps)


NAME_PAIR = ("When the boat came in, old Zorbin Plax was waiting on the pier. The sailors tied the ropes, and the last "
             "man off the boat shook hands with Zorbin")


def attribution_table(m, reps: int) -> None:
    """Attribution patching against the exact fast path on the name pair (times interleaved, medians)."""
    from sprout_interp.core.tokens import token_id

    clean, corrupted = NAME_PAIR, NAME_PAIR.replace("Zorbin", "Velmat", 1)
    metric = P.LogitDiff(token_id(m, " Pl"), token_id(m, " the"))
    n_tok = m.prepare_input(clean)[0].shape[1]
    print(f"\nattribution patching vs exact, the name pair ({n_tok} tokens), {reps} interleaved repetitions")
    print("| patching | patches | exact s | attribution s | attribution / exact | r | largest score error |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for site, by in (("resid_pre", "layer_pos"), ("z", "head"), ("z", "head_pos")):
        times, out = interleaved({"exact": lambda: P.activation_patch(m, clean, corrupted, metric, site, by),
                                  "attr": lambda: P.attribution_patch(m, clean, corrupted, metric, site, by)}, reps)
        agree = P.patching_agreement(out["exact"], out["attr"])
        exact = out["exact"]
        ex_med, at_med = medians(times)["exact"], medians(times)["attr"]
        print(f"| {site} by {by.replace('_', ' x ')} | {len(exact):,} | {ex_med:.2f} | {at_med:.2f} | "
              f"{at_med / ex_med:.3f} | {agree.attrs['r']:.2f} | {agree.attrs['max_abs_error']:.2f} |")


if __name__ == "__main__":
    main()
