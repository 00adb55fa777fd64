"""Claim (chapter, "The logit lens: thoughts along the way"): read through the logit lens, confidence
grows through the middle layers and the last block steps back -- "on the three ready-made texts, 77% on
average after layer 7 and 59% after layer 8" (Sprout). Side claims: the embedding row nearly always
repeats the input token (tied weights); the right answer often ripens before the last block.

    python analyses/confidence_drop.py                      # gpt-1, gpt-4, sprout (shipped)
    python analyses/confidence_drop.py --models runs/gpt-4/checkpoint --n 16 --length 256

For every checkpoint: mean top-1 probability ("confidence"), top-1 accuracy, cross-entropy and
KL(final ‖ row) per row of the stream, on the three ready-made texts (sprout_interp.core.texts.TEXTS) and on
a seeded sample of held-out text (--n windows of --length tokens from the validation documents).
Rows: after the embedding (block 0), then after block 1 … (blocks counted from 1, as the chapter).
The same penultimate-vs-final figures through the tuned lens saved beside each checkpoint (does the last block
"step back" under the tuned lens too?), printed beside the logit lens's; tuned.csv holds them.
Writes by_layer.csv, claims.csv, tuned.csv, first_correct.csv, by_layer.html, lens_grid_<model>.html and plotly.min.js
(shared by the figures)
(PNG too where static export works) into out/confidence_drop/.
"""
from __future__ import annotations

import sys
import time
from argparse import ArgumentParser, Namespace
from pathlib import Path
from typing import Any

import pandas as pd

from sprout_interp.core.texts import TEXTS
from sprout_interp.lens.logit_lens import (
    CHAPTER_SPROUT_CONFIDENCE,
    embedding_echo_rate,
    logit_lens,
    penultimate_vs_final,
)
from sprout_interp.plots import layer_metrics_chart, logit_lens_grid
from sprout_interp.report.claims import Claim, verdict_lines
from sprout_interp.report.cli import (
    NamedModel,
    held_out,
    held_out_arguments,
    pct,
    print_table,
    run_claim_script,
    save_figure,
    script_parser,
    slug,
)

SCRIPT = "confidence_drop"
COMMAND = f".venv/bin/python analyses/{SCRIPT}.py"
CH_PEN, CH_FIN = CHAPTER_SPROUT_CONFIDENCE[7], CHAPTER_SPROUT_CONFIDENCE[8]
ECHO_NEARLY_ALWAYS = 0.9  # what we take "nearly always" to mean
FLAT = 0.01  # a change of confidence under 1 point is "no clear change"
STEPS_BACK = "read through the logit lens, the last block steps back"
STEPS_BACK_CHAPTER = "\"77% after layer 7, 59% after layer 8\" (Sprout, three texts)"
TUNED_STEPS_BACK = "the last block steps back, read through the tuned lens"
ECHO = "the embedding row repeats the input token"
ECHO_CHAPTER = f"\"nearly always\", taken as >= {pct(ECHO_NEARLY_ALWAYS)} of positions"
RIPE = "the right answer often appears before the last block"


def parser() -> ArgumentParser:
    """The script's arguments (the defaults are the claims table's settings)."""
    p = script_parser(SCRIPT, __doc__)
    held_out_arguments(p, 16, n_help="held-out windows (0: skip the held-out sample)")
    p.add_argument("--no-png", action="store_true", help="do not try the PNG export")
    return p


def measure(models: list[NamedModel], args: Namespace, claims_only: bool = False) -> dict[str, Any]:
    """{"by_layer": the logit lens's summary per model, text set and row; "claims": one row per model and text set
    (penultimate and final confidence, their drop and ratio, the embedding echo rate, the share of correct
    predictions ripe before the last block, ...); "tuned": penultimate and final confidence through the logit and the
    tuned lens; "first_correct": counts of the block where the next token first becomes top-1; "grids": model ->
    (the texts' LogitLens, its token labeller, positions shown), for the report's figure}.

    ``claims_only``: the three texts only (the claims table's rows), not the held-out sample."""
    layers, claims, firsts, tuned, grids = [], [], [], [], {}
    for nm in models:
        t = time.time()
        m = nm.model
        sets = [("texts", *m.to_tokens_with_mask(list(TEXTS.values())))]
        if args.n > 0 and not claims_only:
            sample = held_out(m, args)
            if sample is not None:
                sets.append(("held-out", sample, None))
        for set_name, toks, mask in sets:
            lens = logit_lens(m, toks, attention_mask=mask)
            s = lens.summary()
            s.insert(0, "text_set", set_name)
            s.insert(0, "model", nm.label)
            layers.append(s)
            pf = penultimate_vs_final(s)
            tl = logit_lens(m, toks, attention_mask=mask, k=1, lens="tuned")
            tpf = penultimate_vs_final(tl.summary())
            tuned.append({"model": nm.label, "text_set": set_name, "lens used": tl.lens,
                          "logit penultimate": pf["penultimate"], "logit final": pf["final"],
                          "tuned penultimate": tpf["penultimate"], "tuned final": tpf["final"],
                          "penultimate_row": s["row"].iloc[-2], "final_row": s["row"].iloc[-1]})
            fc = lens.first_correct_counts()
            fc.insert(0, "text_set", set_name)
            fc.insert(0, "model", nm.label)
            firsts.append(fc)
            last = fc.iloc[-1]
            blocks = s[s["block"] >= 1]
            peak = blocks.loc[blocks["confidence"].idxmax()]
            claims.append({
                "model": nm.label, "preset": nm.preset, "text_set": set_name, "n_tokens": int(s["n_tokens"].iloc[0]),
                "penultimate_row": s["row"].iloc[-2], "penultimate": pf["penultimate"],
                "final_row": s["row"].iloc[-1], "final": pf["final"], "drop": pf["drop"], "ratio": pf["ratio"],
                "chapter_penultimate": CH_PEN if nm.preset == "sprout" else float("nan"),
                "chapter_final": CH_FIN if nm.preset == "sprout" else float("nan"),
                "n_blocks": int(s["block"].iloc[-1]), "peak_row": peak["row"], "peak_confidence": float(peak["confidence"]),
                "final_accuracy": float(s["accuracy"].iloc[-1]), "final_cross_entropy": float(s["cross_entropy"].iloc[-1]),
                "echo_rate": embedding_echo_rate(lens), "mean_first_correct_block": lens.mean_first_correct(),
                "share_ripe_before_last": 1.0 - float(last["share"]) if fc["count"].sum() else float("nan"),
            })
            if set_name == "texts":
                grids[nm.label] = (lens, m.to_str_tokens, min(40, int(mask[0].sum())))
        print(f"[{nm.label}: {time.time() - t:.1f}s]", file=sys.stderr)
    return {"by_layer": pd.concat(layers, ignore_index=True), "claims": pd.DataFrame(claims),
            "tuned": pd.DataFrame(tuned), "first_correct": pd.concat(firsts, ignore_index=True), "grids": grids}


def _steps_back(drop: float, one: bool) -> str:
    """The verdict on "the last block steps back" from the confidence drop (penultimate - final)."""
    return ("not applicable" if one else "REPRODUCED in direction" if drop >= FLAT
            else "NO CLEAR CHANGE" if drop > -FLAT
            else "NOT reproduced (the final row is more confident)")


def judge(measured: dict[str, Any]) -> list[Claim]:
    """Per model and text set: the last block steps back (the confidence drops by at least FLAT; under FLAT either
    way: no clear change; "not applicable" with one block), the same through the tuned lens, the embedding row
    repeats the input token (REPRODUCED at ECHO_NEARLY_ALWAYS, PARTLY at 50%), the right answer often ripens before
    the last block (REPRODUCED when at least half of the correct predictions do). The claims table shows the three
    texts; the held-out sample's are printed by the script."""
    out = []
    tuned = measured["tuned"].set_index(["model", "text_set"])
    for c in measured["claims"].to_dict("records"):
        who, texts = {"model": c["model"], "part": c["text_set"]}, c["text_set"] == "texts"
        ev = {"claims": pd.DataFrame([c])}
        one = c["n_blocks"] < 2
        note = " (one block: the row before it is the embedding)" if one else ""
        ch = (f"; chapter {pct(CH_PEN)} -> {pct(CH_FIN)} ({100 * (CH_FIN - CH_PEN):+.0f} points, ratio {CH_FIN / CH_PEN:.2f})"
              if c["preset"] == "sprout" and texts else "")
        step = (f"{c['penultimate_row']} {pct(c['penultimate'], 1)} -> {c['final_row']} {pct(c['final'], 1)} "
                f"({-100 * c['drop']:+.1f} points, ratio {c['ratio']:.2f})")
        out.append(Claim(claim=STEPS_BACK, chapter=STEPS_BACK_CHAPTER, verdict=_steps_back(c["drop"], one) + note,
                         ours=step + ch, brief=step, command=COMMAND, evidence=ev, headline=texts, **who))
        tr = tuned.loc[(c["model"], c["text_set"])]
        if tr["lens used"] == "tuned":
            a, b = float(tr["tuned penultimate"]), float(tr["tuned final"])
            out.append(Claim(claim=TUNED_STEPS_BACK, chapter="", verdict=_steps_back(a - b, one) + note,
                             ours=f"{pct(a)} -> {pct(b)} ({100 * (b - a):+.1f} points; logit lens "
                                  f"{pct(tr['logit penultimate'])} -> {pct(tr['logit final'])})",
                             command=COMMAND, evidence={"tuned": tr.to_frame().T}, headline=texts and not one, **who))
        echo = ("REPRODUCED" if c["echo_rate"] >= ECHO_NEARLY_ALWAYS else "PARTLY" if c["echo_rate"] >= 0.5
                else "NOT reproduced")
        out.append(Claim(claim=ECHO, chapter=ECHO_CHAPTER, verdict=echo, brief=f"{pct(c['echo_rate'], 1)} of positions",
                         ours=f"{pct(c['echo_rate'], 1)} of positions (\"nearly always\" taken as >= {pct(ECHO_NEARLY_ALWAYS)})",
                         command=COMMAND, evidence=ev, headline=texts, **who))
        ripe = c["share_ripe_before_last"]
        verdict = ("not applicable (one block)" if one else "REPRODUCED" if ripe >= 0.5 else "PARTLY" if ripe > 0
                   else "NOT reproduced")
        out.append(Claim(claim=RIPE, chapter="", verdict=verdict, command=COMMAND, evidence=ev, headline=texts and not one,
                         ours=f"{pct(ripe)} of correct predictions were top-1 before the last block "
                              f"(mean first-correct block {c['mean_first_correct_block']:.2f}, final block {c['n_blocks']})",
                         brief=f"{pct(ripe)} of correct predictions (mean first-correct block "
                               f"{c['mean_first_correct_block']:.2f} of {c['n_blocks']})", **who))
    return out


def report(measured: dict[str, Any], claims: list[Claim], args: Namespace, out: Path) -> None:
    """Print the confidence by row, penultimate vs final (logit and tuned lens), the side claims and the verdict
    lines; write the CSVs and figures."""
    by_layer, claims_df, tdf = measured["by_layer"], measured["claims"], measured["tuned"]
    by_layer.to_csv(out / "by_layer.csv", index=False)
    claims_df.to_csv(out / "claims.csv", index=False)
    measured["first_correct"].to_csv(out / "first_correct.csv", index=False)
    for label, (lens, to_str_tokens, n) in measured["grids"].items():
        fig = logit_lens_grid(lens, to_str_tokens, batch=0, positions=range(n),
                              title=f"Logit lens, {label}: the story text, first 40 tokens "
                                    "(rows after block n, counted from 1; frame = actual next token)")
        _save(fig, out / f"lens_grid_{slug(label)}", args)

    wide = by_layer.pivot_table(index=["block", "row"], columns=["model", "text_set"], values="confidence", sort=False)
    wide = wide.reset_index().sort_values("block")
    table = pd.DataFrame({"row (blocks from 1)": wide["row"]})
    for col in wide.columns[2:]:
        table[f"{col[0]} {col[1]}"] = [pct(v) for v in wide[col]]
    table["chapter (sprout, texts)"] = [pct(CHAPTER_SPROUT_CONFIDENCE[b]) if b in CHAPTER_SPROUT_CONFIDENCE else ""
                                        for b in wide["block"]]
    print_table(table, "confidence by row: mean top-1 probability through the logit lens (texts = the three ready-made "
                       f"texts; held-out = {args.n} windows x {args.length} tokens, seed {args.seed})")

    side = pd.DataFrame({
        "model": claims_df["model"], "text set": claims_df["text_set"],
        "penultimate": [f"{r}: {pct(v)}" for r, v in zip(claims_df["penultimate_row"], claims_df["penultimate"], strict=True)],
        "final": [f"{r}: {pct(v)}" for r, v in zip(claims_df["final_row"], claims_df["final"], strict=True)],
        "change (points)": [f"{100 * d:+.1f}" for d in -claims_df["drop"]],
        "chapter (sprout, texts)": [f"block 7: {pct(CH_PEN)} -> block 8: {pct(CH_FIN)} ({100 * (CH_FIN - CH_PEN):+.0f})"
                                    if pre == "sprout" else "" for pre in claims_df["preset"]],
    })
    print_table(side, "penultimate vs final row (the chapter: 77% after layer 7, 59% after layer 8, Sprout)")

    tdf.to_csv(out / "tuned.csv", index=False)
    print_table(pd.DataFrame({
        "model": tdf["model"], "text set": tdf["text_set"], "lens used": tdf["lens used"],
        "logit lens": [f"{r} {pct(a)} -> {f} {pct(b)}" for r, f, a, b in
                       zip(tdf["penultimate_row"], tdf["final_row"], tdf["logit penultimate"], tdf["logit final"],
                           strict=True)],
        "tuned lens": [f"{pct(a)} -> {pct(b)} ({100 * (b - a):+.1f} points)" for a, b in
                       zip(tdf["tuned penultimate"], tdf["tuned final"], strict=True)],
    }), "penultimate vs final confidence through the logit and the tuned lens (the final row is the output in both)")

    extra = pd.DataFrame({
        "model": claims_df["model"], "text set": claims_df["text_set"],
        "embedding echo": [pct(v, 1) for v in claims_df["echo_rate"]],
        "mean first-correct block": [f"{v:.2f}" for v in claims_df["mean_first_correct_block"]],
        "ripe before last block": [pct(v) for v in claims_df["share_ripe_before_last"]],
        "peak (blocks)": [f"{r}: {pct(v)}" for r, v in zip(claims_df["peak_row"], claims_df["peak_confidence"], strict=True)],
        "final accuracy": [pct(v, 1) for v in claims_df["final_accuracy"]],
        "final CE (nats/token)": [f"{v:.3f}" for v in claims_df["final_cross_entropy"]],
    })
    print_table(extra, "side claims (first-correct: block where the actual next token first becomes top-1, "
                       "over positions the model gets right; 0 = embedding)")

    print(f"\n== verdicts == (a confidence change under {100 * FLAT:g} percentage point counts as no clear change)")
    print(verdict_lines(claims))
    fig = layer_metrics_chart(by_layer, chapter=CHAPTER_SPROUT_CONFIDENCE,
                              title="Logit lens by layer: confidence, accuracy, KL to the final row")
    _save(fig, out / "by_layer", args)


def main(argv: list[str] | None = None) -> int:
    """Measure, judge and report; returns the exit status (2: no checkpoint could be loaded)."""
    return run_claim_script(SCRIPT, argv, parser, measure, judge, report,
                            wrote="by_layer.csv, claims.csv, first_correct.csv, by_layer.html, lens_grid_*.html")


_png_note_shown = False


def _save(fig, path: Path, a: Namespace) -> None:
    global _png_note_shown
    _, note = save_figure(fig, path, png=not a.no_png)
    if note and not _png_note_shown:
        print(note, file=sys.stderr)
        _png_note_shown = True


if __name__ == "__main__":
    sys.exit(main())
