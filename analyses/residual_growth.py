"""Claim (chapter, "RMSNorm: keeping the numbers in check"): the residual stream keeps growing. In the
chapter's gpt-4 the root mean square of the stream, averaged over held-out text, is about 0.18 right
after the embedding, around 10 after the first block and around 35 after the fourth, "some two hundred
times bigger".

    python analyses/residual_growth.py                      # gpt-1, gpt-4, sprout (shipped)
    python analyses/residual_growth.py --models runs/gpt-4/checkpoint --n 16 --length 256

For every checkpoint: the RMS over d_model of the stream after the embedding (block 0) and after each
block (counted from 1, as the chapter; ``blocks.{n-1}.hook_resid_post`` in code), averaged over all
positions, on a seeded sample of held-out text (--n windows of --length tokens from the validation
documents) and on the three ready-made texts. Beside it, what each block is worth: the rise of the
mean loss (nats) on the held-out sample when the block stops writing to the stream
(``sprout_interp.behaviour.knockout.block_knockout``), each block alone and the later half of the blocks together,
and the same on --train-n windows of the model's training text: a block worth much more there than on held-out
text has learned the training text by heart. ``--corpus default`` takes both samples from "default" for every
model (its documents are split the same inside "large"). Writes
rms.csv, claims.csv, knockout.csv and rms_growth.html (log scale; PNG too where static export works; it loads
plotly.min.js from the same folder)
into out/residual_growth/.
"""
from __future__ import annotations

import math
import sys
from argparse import ArgumentParser, Namespace
from pathlib import Path

import pandas as pd

from sprout_interp.behaviour.knockout import block_knockout
from sprout_interp.core.texts import TEXTS
from sprout_interp.lens.residual import CHAPTER_GPT4_GROWTH, CHAPTER_GPT4_RMS, growth_claims, residual_rms
from sprout_interp.plots import rms_growth_chart
from sprout_interp.report.claims import Claim, verdict_line
from sprout_interp.report.cli import (
    NamedModel,
    held_out,
    held_out_arguments,
    models_frame,
    print_table,
    run_claim_script,
    save_figure,
    script_parser,
    training_text,
)

SCRIPT = "residual_growth"
COMMAND = f".venv/bin/python analyses/{SCRIPT}.py"
CLOSE, SAME_ORDER = 1.5, 3.0  # ratio bands for the verdicts: within ×1.5 "matches", within ×3 "same order"
GROWS = "the residual stream keeps growing block after block"
FIGURES = "the chapter's gpt-4 RMS"
FIGURES_CHAPTER = ("gpt-4, held-out text: ≈0.18 after the embedding, ≈10 after block 1, ≈35 after block 4, "
                   "\"some two hundred times\"")
WORTH = "what each block is worth: the held-out loss rise when it stops writing to the stream"
MEMORISED = "what the later blocks are worth on training text, against held-out text"


def _band(ratio: float) -> str:
    r = max(ratio, 1 / ratio) if ratio > 0 else float("inf")
    return "matches" if r <= CLOSE else "same order of magnitude" if r <= SAME_ORDER else "differs"


def parser() -> ArgumentParser:
    """The script's arguments (the defaults are the claims table's settings)."""
    p = script_parser(SCRIPT, __doc__)
    held_out_arguments(p, 16, n_help="held-out windows (0: only the three texts)")
    p.add_argument("--train-n", type=int, default=16,
                   help="windows of the model's training text for the knockout beside the held-out one (0: none)")
    p.add_argument("--corpus", default=None,
                   help="corpus of both samples (default: \"default\" for models of \"default\" and \"large\", "
                        "which are measured on the same windows; a model of a folder of .txt, its own)")
    p.add_argument("--no-png", action="store_true", help="do not try the PNG export")
    return p


def measure(models: list[NamedModel], args: Namespace, claims_only: bool = False) -> dict[str, pd.DataFrame]:
    """{"models": model, preset, n_blocks; "rms": model, text_set, block, row, rms, growth per stream row;
    "claims": our RMS beside the chapter's figures (``growth_claims``) per model and text set; "knockout": the loss
    rise when each block (and the later half together) stops writing to the stream, on the first text set and, beside
    the held-out sample, on ``--train-n`` windows of the training text (text_set "train")}.

    ``claims_only``: the text set the verdicts read and no other (the held-out sample when there is one)."""
    tables, claims, knockouts = [], [], []
    for nm in models:
        m = nm.model
        sets = []
        if args.n > 0:
            sample = held_out(m, args)
            if sample is not None:
                sets.append(("held-out", sample, None))
        if not (claims_only and sets):
            sets.append(("texts", *m.to_tokens_with_mask(list(TEXTS.values()))))
        L = m.cfg.n_layers
        groups = [[l] for l in range(L)] + ([list(range(L // 2, L))] if L >= 4 else [])
        knock_sets = sets[:1]
        if sets[0][0] == "held-out" and getattr(args, "train_n", 0) > 0:
            train = training_text(m, args, args.train_n)
            if train is not None:
                knock_sets.append(("train", train, None))
        for set_name, toks, mask in knock_sets:
            k = block_knockout(m, toks, groups=groups, attention_mask=mask)
            k.insert(0, "text_set", set_name)
            k.insert(0, "model", nm.label)
            knockouts.append(k)
        for set_name, toks, mask in sets:
            r = residual_rms(m, toks, attention_mask=mask)
            r.insert(0, "text_set", set_name)
            r.insert(0, "model", nm.label)
            tables.append(r)
            c = growth_claims(r)
            c.insert(0, "text_set", set_name)
            c.insert(0, "model", nm.label)
            c.insert(2, "preset", nm.preset)
            claims.append(c)
    return {"models": models_frame(models), "rms": pd.concat(tables, ignore_index=True),
            "claims": pd.concat(claims, ignore_index=True), "knockout": pd.concat(knockouts, ignore_index=True)}


def main_set(measured: dict[str, pd.DataFrame]) -> str:
    """The text set the verdicts read: the held-out sample when there is one, else the three texts."""
    return "held-out" if (measured["rms"]["text_set"] == "held-out").any() else "texts"


def judge(measured: dict[str, pd.DataFrame]) -> list[Claim]:
    """Per model: the stream grows (REPRODUCED when the RMS rises after every block, PARTLY when only overall); for
    gpt-4 each chapter figure in bands (within x1.5 "matches", x3 "same order of magnitude", else "differs"); and what
    each block is worth (measured, no chapter figure)."""
    rms, claims_df, knock, ms = measured["rms"], measured["claims"], measured["knockout"], main_set(measured)
    out = []
    for nm in measured["models"].itertuples():
        r = rms[(rms["model"] == nm.model) & (rms["text_set"] == ms)].sort_values("block")
        vals = r["rms"].tolist()
        grows = all(b > a_ for a_, b in zip(vals, vals[1:], strict=False))
        out.append(Claim(claim=GROWS, chapter="", command=COMMAND, model=nm.model, evidence={"rms": r},
                         verdict="REPRODUCED" if grows else "PARTLY (not monotonic)" if vals[-1] > vals[0] else "NOT reproduced",
                         ours=" -> ".join(f"{v:.3g}" for v in vals) + f" (x{r['growth'].iloc[-1]:.1f} overall)"))
        if nm.preset == "gpt-4":
            c = claims_df[(claims_df["model"] == nm.model) & (claims_df["text_set"] == ms)]
            for row in c.itertuples():
                out.append(Claim(claim=FIGURES, chapter=FIGURES_CHAPTER, command=COMMAND, model=nm.model, part=row.claim,
                                 verdict=_band(row.ratio), evidence={"claims": c[c["claim"] == row.claim]},
                                 ours=f"chapter ~{row.chapter:g}, ours {row.ours:.3g} (x{row.ratio:.2f} the chapter's)"))
        mk = knock[knock["model"] == nm.model]
        k = mk[mk["text_set"] == mk["text_set"].iloc[0]]
        out.append(Claim(claim=WORTH, chapter="", command=COMMAND, model=nm.model, verdict="measured (no chapter figure)",
                         evidence={"knockout": k},
                         ours=", ".join(f"{'blocks' if '-' in str(b) else 'block'} {b} +{v:.3f}"
                                        for b, v in zip(k["blocks"], k["change"], strict=True)) + " nats"))
        train = mk[mk["text_set"] == "train"]
        if len(train) and "-" in str(k["blocks"].iloc[-1]):
            late, late_train = k["change"].iloc[-1], train["change"].iloc[-1]
            ratio = late_train / late if late > 0 else math.inf
            out.append(Claim(claim=MEMORISED, chapter="", command=COMMAND, model=nm.model, headline=False,
                             verdict="measured (no chapter figure)", evidence={"knockout": mk},
                             ours=f"blocks {k['blocks'].iloc[-1]}: +{late_train:.3f} nats on training text, "
                                  f"+{late:.3f} held-out (x{ratio:.2f})"))
    return out


def report(measured: dict[str, pd.DataFrame], claims: list[Claim], args: Namespace, out: Path) -> None:
    """Print the RMS and growth by row, the knockout, the chapter's figures beside ours and the verdict lines; write
    the CSVs and the figure."""
    rms, claims_df, knock, ms = measured["rms"], measured["claims"], measured["knockout"], main_set(measured)
    rms.to_csv(out / "rms.csv", index=False)
    claims_df.to_csv(out / "claims.csv", index=False)
    knock.to_csv(out / "knockout.csv", index=False)

    wide = rms.pivot_table(index=["block", "row"], columns=["model", "text_set"], values="rms", sort=False)
    wide = wide.reset_index().sort_values("block")
    table = pd.DataFrame({"row (blocks from 1)": wide["row"]})
    for col in wide.columns[2:]:
        table[f"{col[0]} {col[1]}"] = ["-" if math.isnan(v) else f"{v:.3g}" for v in wide[col]]
    table["chapter gpt-4"] = [f"~{CHAPTER_GPT4_RMS[b]:g}" if b in CHAPTER_GPT4_RMS else "" for b in wide["block"]]
    print_table(table, "RMS of the residual stream after the embedding and after each block "
                       f"(mean over positions; held-out = {args.n} windows x {args.length} tokens, seed {args.seed}; "
                       "texts = the three ready-made texts)")

    growth = rms.pivot_table(index=["block", "row"], columns=["model", "text_set"], values="growth", sort=False)
    growth = growth.reset_index().sort_values("block")
    gtable = pd.DataFrame({"row (blocks from 1)": growth["row"]})
    for col in growth.columns[2:]:
        gtable[f"{col[0]} {col[1]}"] = ["-" if math.isnan(v) else f"x{v:.1f}" for v in growth[col]]
    chapter_growth = {b: v / CHAPTER_GPT4_RMS[0] for b, v in CHAPTER_GPT4_RMS.items()}
    gtable["chapter gpt-4"] = [f"x{chapter_growth[b]:.0f}" if b in chapter_growth else "" for b in growth["block"]]
    print_table(gtable, "growth relative to the embedding row")

    ktable = pd.DataFrame({
        "model": knock["model"], "text set": knock["text_set"], "blocks knocked out (from 1)": knock["blocks"],
        "loss (nats)": [f"{v:.3f}" for v in knock["loss"]], "rise (nats)": [f"+{v:.3f}" for v in knock["change"]],
    })
    print_table(ktable, "what each block is worth: the loss when it stops writing to the stream (its attention and "
                        "feed-forward outputs zeroed), against the clean loss (sprout_interp.behaviour.knockout.block_knockout)")
    if (knock["text_set"] == "train").any():
        side = knock.pivot_table(index=["model", "blocks"], columns="text_set", values="change", sort=False).reset_index()
        side = side.dropna(subset=["train"])
        print_table(pd.DataFrame({
            "model": side["model"], "blocks knocked out (from 1)": side["blocks"],
            "rise, held-out (nats)": [f"+{v:.3f}" for v in side["held-out"]],
            "rise, training text (nats)": [f"+{v:.3f}" for v in side["train"]],
            "training / held-out": [f"x{t / h:.2f}" if h > 0 else "-" for t, h in zip(side["train"], side["held-out"], strict=True)],
        }), f"what each block is worth on training text against held-out text ({args.train_n} and {args.n} windows of "
            f"{args.length} tokens, seed {args.seed}): well above x1 is text learned by heart")

    side = claims_df[claims_df["text_set"] == ms].copy()
    side_print = pd.DataFrame({
        "model": side["model"], "claim (chapter: gpt-4, held-out text)": side["claim"],
        "chapter": [f"~{v:g}" for v in side["chapter"]], "ours": [f"{v:.3g}" for v in side["ours"]],
        "ours / chapter": [f"{v:.2f}" for v in side["ratio"]],
    })
    print_table(side_print, f"the chapter's figures beside ours ({ms})")

    print("\n== verdicts ==")
    presets = dict(zip(measured["models"]["model"], measured["models"]["preset"], strict=True))
    for c in claims:
        print(verdict_line(c))
        if c.claim == GROWS and presets[c.model] != "gpt-4":
            print(f"  ({c.model} is not the chapter's gpt-4: its figures are shown for comparison only)")
    if "gpt-4" not in presets.values():
        print("- no gpt-4 checkpoint among the models: the chapter's figures (0.18, 10, 35, x200) are for gpt-4")
    print(f"  (bands: 'matches' within x{CLOSE}, 'same order of magnitude' within x{SAME_ORDER} of the chapter's figure)")

    fig = rms_growth_chart(rms, chapter=CHAPTER_GPT4_RMS, chapter_label="chapter (gpt-4, held-out text)",
                           title=f"Residual stream RMS after each block (log scale); chapter's gpt-4: "
                                 f"0.18 -> 10 -> 35, ~x{CHAPTER_GPT4_GROWTH:.0f}")
    _, note = save_figure(fig, out / "rms_growth", png=not args.no_png)
    if note:
        print(note, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Measure, judge and report; returns the exit status (2: no checkpoint could be loaded)."""
    return run_claim_script(SCRIPT, argv, parser, measure, judge, report, wrote="rms.csv, claims.csv, knockout.csv, rms_growth.html")


if __name__ == "__main__":
    sys.exit(main())
