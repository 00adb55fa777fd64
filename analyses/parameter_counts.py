"""The chapter's parameter arithmetic, checked on real models.

    python analyses/parameter_counts.py [--models gpt-1 gpt-4 sprout]

For each preset: the chapter's formula (embedding V·d, per block 4d² + 2·head_dim + 3·d·d_ff + 2d,
final norm d), and the count of the loaded checkpoint's tensors; then the chapter's Sprout figures (17,309,056;
20,454,784 untied; 80% vs 18% on the vocabulary) beside ours, with a verdict line each.
"""
from __future__ import annotations

import sys
from argparse import ArgumentParser, Namespace
from pathlib import Path

import pandas as pd

from sprout_interp.anatomy.params import (
    CALCULATOR_PRESETS,
    CHAPTER_COUNTS,
    counted_breakdown,
    param_breakdown,
)
from sprout_interp.report.claims import Claim, verdict_lines
from sprout_interp.report.cli import NamedModel, print_table, run_claim_script, script_parser

NAME = "parameter_counts"
COMMAND = f".venv/bin/python analyses/{NAME}.py"
PIECES = ["embedding", "attention", "ffn", "norms", "per_block", "blocks", "final_norm", "total", "vocab_share"]
CLAIM = "the chapter's parameter counts"
CHAPTER = ("Sprout has 17,309,056 parameters (20,454,784 untied); per block 589,824 + 128 attention, 1,179,648 SwiGLU, "
         "768 norms; 80% of gpt-1 and 18% of Sprout on the vocabulary")


def parser() -> ArgumentParser:
    """The script's arguments (the defaults are the claims table's settings)."""
    return script_parser(NAME, __doc__)


def measure(models: list[NamedModel], args: Namespace) -> dict[str, pd.DataFrame]:
    """{"pieces": model, piece, formula, checkpoint (the formula's count and the loaded tensors' count of every
    piece), "chapter": model, preset, piece, chapter, ours (each figure the chapter gives for the model's preset)}."""
    rows, chapter_rows = [], []
    for nm in models:
        cfg = nm.model.model.cfg
        formula = param_breakdown(cfg.d_model, cfg.n_layer, cfg.d_ff, cfg.vocab_size, cfg.n_head)
        loaded = counted_breakdown(nm.model.model)
        for piece in PIECES:
            rows.append({"model": nm.label, "piece": piece, "formula": formula[piece], "checkpoint": loaded[piece]})
        for k, v in CHAPTER_COUNTS.get(nm.preset or "", {}).items():
            if k == "untied":
                ours = param_breakdown(cfg.d_model, cfg.n_layer, cfg.d_ff, cfg.vocab_size, cfg.n_head, tied=False)["total"]
            else:
                ours = loaded[k]
            chapter_rows.append({"model": nm.label, "preset": nm.preset, "piece": k, "chapter": v, "ours": ours})
    return {"pieces": pd.DataFrame(rows, columns=["model", "piece", "formula", "checkpoint"]),
            "chapter": pd.DataFrame(chapter_rows, columns=["model", "preset", "piece", "chapter", "ours"])}


def judge(measured: dict[str, pd.DataFrame]) -> list[Claim]:
    """Per model: the formula equals the counted tensors for every piece (REPRODUCED / DIFFERS; not in the claims
    table); per figure the chapter gives: ours equals it (the vocabulary share within 2 points)."""
    out = []
    pieces = measured["pieces"]
    for label, d in pieces.groupby("model", sort=False):
        exact = d[d["piece"] != "vocab_share"]
        same = bool((exact["formula"] == exact["checkpoint"]).all())
        total = int(d.loc[d["piece"] == "total", "checkpoint"].iloc[0])
        out.append(Claim(claim="formula = counted parameters for every piece", chapter="", ours=f"total {total:,}",
                         verdict="REPRODUCED" if same else "DIFFERS", command=COMMAND, model=label, headline=False,
                         evidence={"pieces": d}))
        for r in measured["chapter"][measured["chapter"]["model"] == label].itertuples():
            share = r.piece == "vocab_share"
            ok = abs(r.ours - r.chapter) <= 0.02 if share else r.ours == r.chapter
            fmt = (lambda x: f"{x:.0%}") if share else (lambda x: f"{int(x):,}")
            out.append(Claim(claim=CLAIM, chapter=CHAPTER, ours=f"chapter {fmt(r.chapter)}, ours {fmt(r.ours)}",
                             brief=fmt(r.ours) if fmt(r.ours) == fmt(r.chapter) else f"{fmt(r.ours)} (chapter {fmt(r.chapter)})",
                             verdict="REPRODUCED" if ok else "DIFFERS", command=COMMAND, model=label, part=r.piece,
                             evidence={"chapter": pd.DataFrame([r._asdict()]).drop(columns="Index")}))
    return out


def report(measured: dict[str, pd.DataFrame], claims: list[Claim], args: Namespace, out: Path) -> None:
    """Print the counts, the dashboard's calculator presets and the verdict lines; write parameter_counts.csv."""
    df = measured["pieces"]
    wide = df.pivot_table(index="piece", columns="model", values="checkpoint", sort=False)
    print_table(wide.map(lambda x: f"{x:.1%}" if x < 1 else f"{int(x):,}").reset_index(),
                "parameters per piece, counted on the loaded checkpoints (per_block: one block; blocks: all)")
    calc = pd.DataFrame([{"preset": k, **{n: v for n, v in param_breakdown(**c).items() if n in ("total", "vocab_share")}}
                         for k, c in CALCULATOR_PRESETS.items()])
    calc["vocab_share"] = calc["vocab_share"].map(lambda x: f"{x:.0%}")
    calc["total"] = calc["total"].map(lambda x: f"{x:,}")
    print_table(calc, "the dashboard's calculator presets (formula)")
    print("\n== verdicts ==")
    print(verdict_lines(claims))
    df.to_csv(out / "parameter_counts.csv", index=False)
    print(f"\nwrote {out / 'parameter_counts.csv'}")


def main(argv: list[str] | None = None) -> int:
    """Measure, judge and report; returns the exit status (2: no checkpoint could be loaded)."""
    return run_claim_script(NAME, argv, parser, measure, judge, report)


if __name__ == "__main__":
    sys.exit(main())
