"""The chapter's parameter arithmetic, checked on real models.

    python analyses/parameter_counts.py [--models gpt-1 gpt-4 sprout]

For each preset: the chapter's formula (embedding V·d, per block 4d² + 2·head_dim + 3·d·d_ff + 2d,
final norm d), and the count of the loaded checkpoint's tensors; then the chapter's Sprout figures (17,309,056; 20,454,784 untied; 80% vs 18% on the vocabulary)
beside ours, with a verdict line each.
"""
from __future__ import annotations

import sys

import pandas as pd

from sprout_interp.anatomy.params import CALCULATOR_PRESETS, CHAPTER_COUNTS, counted_breakdown, param_breakdown
from sprout_interp.report.cli import print_table, script_parser, start

PIECES = ["embedding", "attention", "ffn", "norms", "per_block", "blocks", "final_norm", "total", "vocab_share"]


def main(argv: list[str] | None = None) -> int:
    p = script_parser("parameter_counts", __doc__)
    a = p.parse_args(argv)
    started = start("parameter_counts", a)
    if started is None:
        return 2
    models, out = started
    rows, verdicts = [], []
    for nm in models:
        cfg = nm.model.model.cfg
        formula = param_breakdown(cfg.d_model, cfg.n_layer, cfg.d_ff, cfg.vocab_size, cfg.n_head)
        loaded = counted_breakdown(nm.model.model)
        for piece in PIECES:
            rows.append({"model": nm.label, "piece": piece, "formula": formula[piece],
                         "checkpoint": loaded[piece]})
        same = all(formula[k] == loaded[k] for k in PIECES if k != "vocab_share")
        verdicts.append(f"- {nm.label}: formula = counted parameters for every piece: {'REPRODUCED' if same else 'DIFFERS'} "
                        f"(total {loaded['total']:,})")
        chapter = CHAPTER_COUNTS.get(nm.preset or "", {})
        for k, v in chapter.items():
            if k == "untied":
                ours = param_breakdown(cfg.d_model, cfg.n_layer, cfg.d_ff, cfg.vocab_size, cfg.n_head, tied=False)["total"]
            else:
                ours = loaded[k]
            ok = abs(ours - v) <= 0.02 if k == "vocab_share" else ours == v
            fmt = (lambda x: f"{x:.0%}") if k == "vocab_share" else (lambda x: f"{x:,}")
            verdicts.append(f"- {nm.label}, {k}: chapter {fmt(v)}, ours {fmt(ours)}: "
                            f"{'REPRODUCED' if ok else 'DIFFERS'}")
    df = pd.DataFrame(rows)
    wide = df.pivot_table(index="piece", columns="model", values="checkpoint", sort=False)
    print_table(wide.map(lambda x: f"{x:.1%}" if x < 1 else f"{int(x):,}").reset_index(),
                "parameters per piece, counted on the loaded checkpoints (per_block: one block; blocks: all)")
    calc = pd.DataFrame([{"preset": k, **{n: v for n, v in param_breakdown(**c).items() if n in ("total", "vocab_share")}}
                         for k, c in CALCULATOR_PRESETS.items()])
    calc["vocab_share"] = calc["vocab_share"].map(lambda x: f"{x:.0%}")
    calc["total"] = calc["total"].map(lambda x: f"{x:,}")
    print_table(calc, "the dashboard's calculator presets (formula)")
    print("\n== verdicts ==")
    print("\n".join(verdicts))
    df.to_csv(out / "parameter_counts.csv", index=False)
    print(f"\nwrote {out / 'parameter_counts.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
