"""Claim (chapter, "Eight floors and the way out"): an induction head needs an earlier layer to have
written into every token which token stood before it -- "one layer cannot do that; two can". gpt-4's
copying is done by "a previous-token head in layer 2 and an induction head in layer 3" (blocks counted
from 1), and the full Sprout copies too.

    python analyses/induction_heads.py                          # gpt-1, gpt-4, sprout (shipped)
    python analyses/induction_heads.py --models runs/gpt-4/checkpoint --seq-len 32 --batch 8

For every checkpoint: previous-token, duplicate-token and induction scores of every head on repeated
random tokens (--batch rows of --seq-len random tokens, each repeated twice) and on held-out text
(--n windows of --length tokens; the three ready-made texts when the corpus is not installed), each
head's part in in-context copying (the copying ratio, loss on the second copy / loss on the first, with
that head zero-ablated), each head's full OV circuit copying score (``ov_copying``: Σλ / Σ|λ| of W_E W_V W_O W_U,
from the weights), and the circuit (sprout_interp.circuits.induction.find_induction_circuit): candidates
ranked by the scores (previous-token heads by the weaker of their two scores: a head that looks back
only on random tokens is not a previous-token head), then each ablated alone (--kind, mean over held-out
text by default) and together, measuring invented-name copying, the induction head's induction score and
the held-out loss (--loss-n windows), so that each part of the circuit -- the previous-token head(s) and
the induction head -- is judged by its own ablation, and a head whose removal breaks the whole model is
not called a copying head. Tables give ``block`` (counted from 1, the chapter's "layer N") and
``layer`` (0-indexed, code); a head reads "block 2 head 0 (layer 1)".
Writes head_scores.csv, circuits.csv, circuit_evidence.csv, head_scores_<model>.html,
induction_pattern_<model>.html and plotly.min.js (shared by the figures) into out/induction_heads/.
"""
from __future__ import annotations

import sys
import time
from argparse import ArgumentParser, Namespace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd

from sprout_interp.circuits.ablation import ablation_sweep
from sprout_interp.circuits.attention import attention_patterns, head_scores
from sprout_interp.circuits.heads import head_label
from sprout_interp.circuits.induction import PARTLY_SHARE, REPRODUCED_SHARE, InductionCircuit, find_induction_circuit
from sprout_interp.circuits.ov_circuit import ov_copying_scores
from sprout_interp.core.texts import TEXTS
from sprout_interp.plots.heads import head_scores_figure, pattern_figure
from sprout_interp.report.claims import Claim, verdict_lines
from sprout_interp.report.cli import (
    NamedModel,
    evidence_table,
    held_out,
    held_out_arguments,
    mean_reference,
    models_frame,
    pct,
    print_table,
    run_claim_script,
    save_figure,
    script_parser,
    slug,
)
from sprout_model.evaluation import repeated_tokens_batch

SCRIPT = "induction_heads"
COMMAND = f".venv/bin/python analyses/{SCRIPT}.py"
CHAPTER_PREV_BLOCK, CHAPTER_INDUCTION_BLOCK = 2, 3  # gpt-4, blocks counted from 1
CIRCUIT = "a previous-token head in an earlier block feeds an induction head"
CIRCUIT_CHAPTER = "previous-token head in layer 2, induction head in layer 3 (gpt-4); one block cannot (gpt-1)"


def parser() -> ArgumentParser:
    """The script's arguments (the defaults are the claims table's settings)."""
    p = script_parser(SCRIPT, __doc__)
    p.add_argument("--seq-len", type=int, default=64, help="random tokens per copy (each row is this, twice)")
    p.add_argument("--batch", type=int, default=16, help="rows of repeated random tokens")
    held_out_arguments(p, 8, n_help="held-out windows for the natural-text scores",
                       seed_help="seed of the random tokens and of the held-out sample")
    p.add_argument("--threshold", type=float, default=0.3,
                   help="score a head needs to count as a previous-token / induction head")
    p.add_argument("--kind", choices=["mean", "zero"], default="mean", help="how the circuit's heads are ablated")
    p.add_argument("--ref-n", type=int, default=16, help="held-out windows for the mean-ablation reference (seed + 1)")
    p.add_argument("--loss-n", type=int, default=4, help="held-out windows for the held-out loss under ablation")
    p.add_argument("--no-copying", action="store_true", help="skip the per-head copying sweep (faster)")
    return p


def measure(models: list[NamedModel], args: Namespace, claims_only: bool = False) -> dict[str, Any]:
    """{"settings": the threshold; "models": model, preset, n_blocks; "scores": every head's scores per model (``head_scores``); "circuits":
    model -> its ``InductionCircuit`` (evidence: each candidate ablated alone and together); "patterns": model ->
    the induction head's attention on repeated random tokens and on the story, for the figures}.

    ``claims_only``: what the verdicts need and no more: no per-head copying sweep (only the clean copying ratio,
    on the same repeated tokens) and no attention patterns."""
    scores, circuits, patterns = [], {}, {}
    for nm in models:
        t = time.time()
        m = nm.model
        natural = held_out(m, SimpleNamespace(n=args.n, length=args.length, seed=args.seed))
        if natural is None:
            natural = list(TEXTS.values())
        df = head_scores(m, seq_len=args.seq_len, batch=args.batch, seed=args.seed, natural=natural,
                         copying=not (args.no_copying or claims_only))
        if claims_only and not args.no_copying:
            rep = repeated_tokens_batch(m.cfg.d_vocab, args.seq_len, args.batch, args.seed)
            df.attrs["clean_copying_ratio"] = float(ablation_sweep(m, rep, "copying_ratio", heads=[(0, 0)]).attrs["clean"])
        df.attrs["model"] = nm.label
        loss_text = held_out(m, SimpleNamespace(n=args.loss_n, length=args.length, seed=args.seed))
        means = mean_reference(m, args.ref_n, args.length, args.seed + 1) if args.kind == "mean" else None
        c = find_induction_circuit(m, scores=df, threshold=args.threshold, kind=args.kind, reference=means,
                                   held_out=loss_text if loss_text is not None else list(TEXTS.values()))
        c.model = nm.label
        ov = ov_copying_scores(m, ranks=False).set_index(["layer", "head"])["copying_score"]
        df["ov_copying"] = [float(ov[(int(l), int(h))]) for l, h in zip(df["layer"], df["head"])]
        df.insert(0, "model", nm.label)
        scores.append(df)
        circuits[nm.label] = c
        if not claims_only:
            rep = repeated_tokens_batch(m.cfg.d_vocab, min(args.seq_len, 24), 1, args.seed)
            story = m.to_tokens(TEXTS["story"])[:, :80]
            patterns[nm.label] = (attention_patterns(m, rep), [str(int(i)) for i in rep[0]],
                                  attention_patterns(m, story), m.to_str_tokens(story))
        print(f"[{nm.label}: {time.time() - t:.1f}s]", file=sys.stderr)
    return {"settings": {"threshold": args.threshold}, "models": models_frame(models),
            "scores": pd.concat(scores, ignore_index=True), "circuits": circuits, "patterns": patterns}


def scored(c: InductionCircuit, heads: list[tuple[int, int]], col: str) -> str:
    """'block 1 head 0 (layer 0) 0.44 / 0.45 + ...': each head with its score on random tokens / on text."""
    ev = c.evidence[c.evidence["n_heads"] == 1]
    got = []
    for l, h in heads:
        hit = ev[(ev["layer"] == l) & (ev["head"] == h)]
        s = "" if hit.empty else f" {hit.iloc[0][col + '_random']:.2f} / {hit.iloc[0][col + '_text']:.2f}"
        got.append(f"{head_label(l, h)}{s}")
    return " + ".join(got) or "none confirmed"


def judge(measured: dict[str, Any]) -> list[Claim]:
    """Per model, from its circuit: one block cannot make an induction head (gpt-1: REPRODUCED when its best
    induction score is under the threshold, ``measured["settings"]["threshold"]``); the previous-token part and the induction part, each by its own
    ablation (``InductionCircuit.verdicts``: REPRODUCED when it removes >= 50% of the name-copying gain specifically,
    PARTLY at >= 33%, else NOT established); gpt-4: in the chapter's blocks 2 and 3; the circuit as a whole
    (REPRODUCED only when both parts are); and the previous-token candidates the ablations left out."""
    out, threshold = [], measured["settings"]["threshold"]
    for r in measured["models"].itertuples():
        who, c = r.model, measured["circuits"][r.model]
        ev = {"evidence": c.evidence} if c.evidence is not None else {}
        ind = f"induction head {c.induction_label} (score {c.induction_score:.2f})"
        ratio = c.clean_copying_ratio
        rtxt = f", copying ratio {ratio:.3f}" if ratio is not None else ""
        prev = c.prev_label if c.prev_tokens else "none confirmed"
        if r.preset == "gpt-1" or r.n_blocks == 1:
            out.append(Claim(claim="one block cannot make an induction head", chapter="\"one layer cannot do that; two can\"",
                             verdict="REPRODUCED" if c.induction_score < threshold else "NOT reproduced",
                             ours=f"best {ind}{rtxt}", command=COMMAND, model=who, evidence=ev))
            continue
        parts = c.verdicts()
        out.append(Claim(claim=CIRCUIT, chapter=CIRCUIT_CHAPTER, verdict=parts["previous-token"][0],
                         ours=parts["previous-token"][1], command=COMMAND, model=who, evidence=ev,
                         part=f"previous-token part ({prev}), by its own ablation",
                         brief=f"scores on random tokens / text {scored(c, c.prev_tokens, 'prev_token')}"))
        ov_txt = ""
        sc = measured.get("scores")
        if sc is not None and "ov_copying" in sc:
            ov = sc[(sc["model"] == who) & (sc["layer"] == c.induction_layer) & (sc["head"] == c.induction_head)]
            ov_txt = f"; its full OV circuit's copying score {float(ov['ov_copying'].iloc[0]):+.2f} (+1: it writes the token it reads)"
        out.append(Claim(claim=CIRCUIT, chapter=CIRCUIT_CHAPTER, verdict=parts["induction"][0], ours=parts["induction"][1],
                         command=COMMAND, model=who, evidence=ev,
                         part=f"induction part ({c.induction_label}), by its own ablation",
                         brief=f"scores {scored(c, [(c.induction_layer, c.induction_head)], 'induction')}{ov_txt}"))
        if r.preset == "gpt-4":
            exact = (c.verdict() == "REPRODUCED" and {h[0] + 1 for h in c.prev_tokens} == {CHAPTER_PREV_BLOCK}
                     and c.induction_block == CHAPTER_INDUCTION_BLOCK)
            v = ("REPRODUCED" if exact else "NOT reproduced" if c.verdict() == "NOT reproduced" else
                 f"PARTLY (a circuit, {c.verdict()} by ablation, in other blocks)")
            out.append(Claim(claim=CIRCUIT, chapter=CIRCUIT_CHAPTER, verdict=v, command=COMMAND, model=who, evidence=ev,
                             part="previous-token head in layer 2 and induction head in layer 3",
                             ours=f"previous-token head(s) {prev}; {ind}{rtxt}",
                             brief=f"previous-token head(s) in block "
                                   f"{', '.join(str(b) for b in sorted({h[0] + 1 for h in c.prev_tokens})) or '-'}, "
                                   f"the induction head in block {c.induction_block} (the chapter: blocks 2 and 3)"))
        out.append(Claim(claim=CIRCUIT, chapter=CIRCUIT_CHAPTER, verdict=c.verdict(), command=COMMAND, model=who,
                         evidence=ev, part="both parts, each by its own ablation",
                         ours=f"{c.prev_label if c.prev_tokens else 'no previous-token head'} -> {c.induction_label}{rtxt}"))
        if c.evidence is not None:
            left = c.evidence[(c.evidence["role"] == "previous-token candidate") & ~c.evidence["chosen"].astype(bool)]
            for e in left.itertuples():
                out.append(Claim(claim=CIRCUIT, chapter=CIRCUIT_CHAPTER, verdict="not a previous-token head of the circuit",
                                 command=COMMAND, model=who, evidence={"evidence": left}, part=f"candidate {e.heads}",
                                 ours=f"previous-token score on random tokens / text {e.prev_token_random:.2f} / "
                                      f"{e.prev_token_text:.2f}; its own ablation removes {pct(e.copying_removed, 1)} of "
                                      "the name-copying gain"))
    return out


def report(measured: dict[str, Any], claims: list[Claim], args: Namespace, out: Path) -> None:
    """Print each model's head scores, circuit and evidence, the circuits' summary and the verdict lines; write the
    CSVs and figures."""
    all_scores, circuits = measured["scores"], measured["circuits"]
    preset = dict(zip(measured["models"]["model"], measured["models"]["preset"], strict=True))
    for label, c in circuits.items():
        df = all_scores[all_scores["model"] == label]
        shown = df.drop(columns=["model"]).copy()
        shown.insert(0, "layer", shown.pop("layer"))
        shown.insert(0, "block", shown.pop("block"))
        for col in shown.columns[3:]:
            shown[col] = shown[col].map(lambda v, col=col: f"{v:.3f}" if col.startswith("copying") else f"{v:.2f}")
        clean = ("" if c.clean_copying_ratio is None or "copying_ratio_ablated" not in df
                 else f", clean {c.clean_copying_ratio:.3f}")
        print_table(shown, f"{label}: head scores (block counted from 1 = the chapter's 'layer N'; layer = 0-indexed "
                           f"code index; *_random: {args.batch} rows of {args.seq_len} random tokens repeated twice; *_text: "
                           f"held-out text; copying_ratio_*: copying ratio with the head zero-ablated{clean})")
        print(f"\ncircuit: {c.summary()}")
        print_table(evidence_table(c), f"{label}: the circuit's candidates {args.kind}-ablated alone, then together: name "
                                       "copying (mean P(each later token of a name) over the five names, 2nd occurrence, "
                                       "1st in brackets), the share of its gain removed, held-out loss change (nats/token), "
                                       "specificity, and the induction head's induction score (repeated random tokens)")
        save_figure(head_scores_figure(df,
                                       title=f"{label}: head scores (blocks counted from 1; layer = code index)"),
                    out / f"head_scores_{slug(label)}")
        if label in measured["patterns"]:
            rep_pat, rep_labels, story_pat, story_labels = measured["patterns"][label]
            save_figure(pattern_figure(rep_pat, rep_labels, layer=c.induction_layer, head=c.induction_head,
                                       title=f"{label}: induction head {c.induction_label}, on random tokens repeated twice"),
                        out / f"induction_pattern_{slug(label)}")
            save_figure(pattern_figure(story_pat, story_labels, layer=c.induction_layer, head=c.induction_head,
                                       title=f"{label}: {c.induction_label} on the story"),
                        out / f"induction_pattern_story_{slug(label)}")

    all_scores.to_csv(out / "head_scores.csv", index=False)
    rows = []
    for r in measured["models"].itertuples():
        row = circuits[r.model].as_dict()
        row.update(model=r.model, preset=r.preset, n_blocks=r.n_blocks)
        rows.append(row)
    circ = pd.DataFrame(rows)
    circ.to_csv(out / "circuits.csv", index=False)
    pd.concat([c.evidence.assign(model=label) for label, c in circuits.items()],
              ignore_index=True).to_csv(out / "circuit_evidence.csv", index=False)
    objs = list(circuits.values())
    summary = pd.DataFrame({
        "model": circ["model"],
        "blocks": circ["n_blocks"],
        "previous-token head(s), score random / text": [scored(c, c.prev_tokens, "prev_token") for c in objs],
        "previous-token part": circ["previous-token_verdict"],
        "induction head, score random / text": [scored(c, [(c.induction_layer, c.induction_head)], "induction")
                                                for c in objs],
        "induction part": circ["induction_verdict"],
        "copying ratio": ["-" if c.clean_copying_ratio is None else f"{c.clean_copying_ratio:.3f}" for c in objs],
        "chapter": ["prev-token head in block 2, induction head in block 3" if preset[m] == "gpt-4" else
                    "one block: no induction head" if preset[m] == "gpt-1" else
                    "copies (100% / 98%)" if preset[m] == "sprout" else "" for m in circ["model"]],
    })
    print_table(summary, f"circuits (ranked by head scores, confirmed by {args.kind} ablation; each part's verdict from its "
                         "own ablation; copying ratio: loss on the second copy / first, lower = more copying)")
    print(f"\n== verdicts == (a head counts as a previous-token / induction head at a score >= {args.threshold:.2f} and when "
          f"its own {args.kind} ablation lowers the copying specifically; a part is REPRODUCED when its own ablation removes "
          f">= {pct(REPRODUCED_SHARE)} of the name-copying gain, PARTLY at >= {pct(PARTLY_SHARE)})")
    print(verdict_lines(claims))


def main(argv: list[str] | None = None) -> int:
    """Measure, judge and report; returns the exit status (2: no checkpoint could be loaded)."""
    return run_claim_script(SCRIPT, argv, parser, measure, judge, report,
                            wrote="head_scores.csv, circuits.csv, circuit_evidence.csv, head_scores_*.html, induction_pattern_*.html")


if __name__ == "__main__":
    sys.exit(main())
