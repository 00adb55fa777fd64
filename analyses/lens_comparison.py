"""Claim (Belrose et al. 2023, "Eliciting Latent Predictions from Transformers with the Tuned Lens"): the tuned
lens is closer to the model's final output than the logit lens at every layer.

    python analyses/lens_comparison.py                      # gpt-1, gpt-4, sprout (shipped, with their lenses)
    python analyses/lens_comparison.py --n 16 --length 256 --threads 1

For every checkpoint, per stream row (block 0 = embedding, blocks counted from 1): mean KL(final ‖ lens) and
cross-entropy against the actual next token (nats/token) of the logit lens and of the tuned lens saved beside
the checkpoint, on a seeded held-out sample (--n windows of --length tokens from the validation documents).
The last row is the model's output through both lenses (KL 0), so the verdict covers the rows before it.
Writes by_block.csv, kl_by_block.html and plotly.min.js into out/lens_comparison/.
"""
from __future__ import annotations

import sys
import time

import pandas as pd

from sprout_interp.report.cli import held_out, print_table, save_figure, script_parser, start
from sprout_interp.lens.logit_lens import logit_lens
from sprout_interp.plots.trajectories import lens_comparison_chart


def main(argv: list[str] | None = None) -> int:
    p = script_parser("lens_comparison", __doc__)
    p.add_argument("--n", type=int, default=8, help="held-out windows")
    p.add_argument("--length", type=int, default=128, help="tokens per held-out window")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out sample")
    a = p.parse_args(argv)
    t0 = time.time()
    started = start("lens_comparison", a)
    if started is None:
        return 2
    models, out = started
    rows, verdicts = [], []
    for nm in models:
        sample = held_out(nm.model, a)
        if sample is None:
            return 2
        got = {}
        for which in ("logit", "tuned"):
            ll = logit_lens(nm.model, sample, k=1, lens=which)
            if ll.notice:
                print(f"{nm.label}: {ll.notice}", file=sys.stderr)
            s = ll.summary()
            s.insert(0, "lens", ll.lens)
            s.insert(0, "model", nm.label)
            got[which] = s
            rows.append(s)
        lo, tu = got["logit"], got["tuned"]
        inner = lo["block"] < lo["block"].max()
        better = (tu["kl_final"][inner] < lo["kl_final"][inner])
        verdicts.append((nm.label, got["tuned"]["lens"].iloc[0], int(better.sum()), int(inner.sum()),
                         [int(b) for b in lo["block"][inner][~better]]))
        table = pd.DataFrame({
            "row (blocks from 1)": lo["row"],
            "KL logit": [f"{v:.3f}" for v in lo["kl_final"]], "KL tuned": [f"{v:.3f}" for v in tu["kl_final"]],
            "CE logit": [f"{v:.3f}" for v in lo["cross_entropy"]], "CE tuned": [f"{v:.3f}" for v in tu["cross_entropy"]],
        })
        print_table(table, f"{nm.label}: mean KL(final || lens) and cross-entropy, nats/token, held-out "
                           f"{a.n} windows x {a.length} tokens, seed {a.seed}")
    by_block = pd.concat(rows, ignore_index=True)
    by_block.to_csv(out / "by_block.csv", index=False)
    print("\n== verdicts == (the tuned lens is closer to the final output than the logit lens at every row before the output)")
    for label, used, n_better, n_rows, worse in verdicts:
        if used != "tuned":
            print(f"- {label}: NOT MEASURED (no tuned lens beside the checkpoint)")
            continue
        v = "REPRODUCED" if n_better == n_rows else "PARTLY" if n_better else "NOT reproduced"
        extra = f"; not at blocks {worse}" if worse else ""
        print(f"- {label}: {v}: lower KL at {n_better} of {n_rows} rows{extra}")
    save_figure(lens_comparison_chart(by_block, "kl_final"), out / "kl_by_block", png=False)
    print(f"\nwrote {out}/by_block.csv, kl_by_block.html in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
