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
from argparse import ArgumentParser, Namespace
from pathlib import Path

import pandas as pd

from sprout_interp.lens.logit_lens import logit_lens
from sprout_interp.plots.trajectories import lens_comparison_chart
from sprout_interp.report.claims import Claim, verdict_lines
from sprout_interp.report.cli import NamedModel, held_out, held_out_arguments, print_table, run_claim_script, save_figure, script_parser

SCRIPT = "lens_comparison"
COMMAND = f".venv/bin/python analyses/{SCRIPT}.py"
CLAIM = "the tuned lens is closer to the final output than the logit lens at every row before the output"
CHAPTER = "Belrose et al. 2023, not the chapter"


def parser() -> ArgumentParser:
    """The script's arguments (the defaults are the claims table's settings)."""
    p = script_parser(SCRIPT, __doc__)
    held_out_arguments(p, 8, 128)
    return p


def measure(models: list[NamedModel], args: Namespace) -> dict[str, pd.DataFrame]:
    """{"settings": the held-out sample's n, length and seed; "by_block": model, lens ("logit", or "tuned" where a
    tuned lens was used), asked, row, block, kl_final, cross_entropy, ... per stream row, the logit lens's rows then the
    tuned lens's for each model}; models without a held-out sample (the corpus packages not installed) are left out."""
    rows = []
    for nm in models:
        sample = held_out(nm.model, args)
        if sample is None:
            continue
        for which in ("logit", "tuned"):
            ll = logit_lens(nm.model, sample, k=1, lens=which)
            if ll.notice:
                print(f"{nm.label}: {ll.notice}", file=sys.stderr)
            s = ll.summary()
            s.insert(0, "asked", which)
            s.insert(0, "lens", ll.lens)
            s.insert(0, "model", nm.label)
            rows.append(s)
    return {"settings": {"n": args.n, "length": args.length, "seed": args.seed},
            "by_block": pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()}


def _kl(v: float) -> str:
    """A KL for a person: two decimals from 1 nat up, three significant figures below (ties at small KLs stay visible)."""
    return f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def judge(measured: dict[str, pd.DataFrame]) -> list[Claim]:
    """Per model: REPRODUCED when the tuned lens's KL to the final output is lower than the logit lens's at every row
    before the output, PARTLY at some, NOT reproduced at none; NOT MEASURED without a tuned lens beside the checkpoint."""
    out = []
    bb, st = measured["by_block"], measured.get("settings")
    if bb.empty:
        return out
    chapter = CHAPTER + (f"; ours: mean KL(final || lens), held-out {st['n']} x {st['length']} tokens, logit -> tuned, nats"
                         if st else "")
    for label, d in bb.groupby("model", sort=False):
        lo = d[d["asked"] == "logit"].reset_index(drop=True)
        tu = d[d["asked"] == "tuned"].reset_index(drop=True)
        if tu["lens"].iloc[0] != "tuned":
            out.append(Claim(claim=CLAIM, chapter=chapter, ours="no tuned lens beside the checkpoint",
                             verdict="NOT MEASURED", command=COMMAND, model=label, evidence={"by_block": d}))
            continue
        inner = lo["block"] < lo["block"].max()
        better = tu["kl_final"][inner] < lo["kl_final"][inner]
        n_better, n_rows = int(better.sum()), int(inner.sum())
        worse = [int(b) for b in lo["block"][inner][~better]]
        v = "REPRODUCED" if n_better == n_rows else "PARTLY" if n_better else "NOT reproduced"
        kls = ", ".join(f"{'embedding' if b == 0 else f'block {b}'} {_kl(x)} -> {_kl(y)}"
                        for b, x, y in zip(lo["block"][inner], lo["kl_final"][inner], tu["kl_final"][inner], strict=True))
        out.append(Claim(claim=CLAIM, chapter=chapter, verdict=v, command=COMMAND, model=label,
                         ours=f"lower KL at {n_better} of {n_rows} rows" + (f"; not at blocks {worse}" if worse else "")
                              + f" ({kls})",
                         evidence={"by_block": d}))
    return out


def report(measured: dict[str, pd.DataFrame], claims: list[Claim], args: Namespace, out: Path) -> None:
    """Print each model's KL and cross-entropy by row and the verdict lines; write by_block.csv and the figure."""
    by_block = measured["by_block"]
    for label, d in by_block.groupby("model", sort=False):
        lo = d[d["asked"] == "logit"]
        tu = d[d["asked"] == "tuned"]
        table = pd.DataFrame({
            "row (blocks from 1)": lo["row"].to_numpy(),
            "KL logit": [f"{v:.3f}" for v in lo["kl_final"]], "KL tuned": [f"{v:.3f}" for v in tu["kl_final"]],
            "CE logit": [f"{v:.3f}" for v in lo["cross_entropy"]], "CE tuned": [f"{v:.3f}" for v in tu["cross_entropy"]],
        })
        print_table(table, f"{label}: mean KL(final || lens) and cross-entropy, nats/token, held-out "
                           f"{args.n} windows x {args.length} tokens, seed {args.seed}")
    shown = by_block.drop(columns="asked")
    shown.to_csv(out / "by_block.csv", index=False)
    print("\n== verdicts == (the tuned lens is closer to the final output than the logit lens at every row before the output)")
    print(verdict_lines(claims))
    save_figure(lens_comparison_chart(shown, "kl_final"), out / "kl_by_block", png=False)


def main(argv: list[str] | None = None) -> int:
    """Measure, judge and report; returns the exit status (2: no checkpoint or no held-out sample)."""
    return run_claim_script(SCRIPT, argv, parser, measure, judge, report,
                            wrote="by_block.csv, kl_by_block.html", usable=lambda measured: not measured["by_block"].empty)


if __name__ == "__main__":
    sys.exit(main())
