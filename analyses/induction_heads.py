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
that head zero-ablated), and the detected circuit: the best previous-token head and the best induction
head. Tables give ``block`` (counted from 1, the chapter's "layer N") and ``layer`` (0-indexed, code).
Writes head_scores.csv, circuits.csv, head_scores_<model>.html and induction_pattern_<model>.html
into out/induction_heads/.
"""
from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import pandas as pd

from sprout_interp.attention import attention_patterns, find_induction_circuit, head_scores
from sprout_interp.cli import held_out, print_table, script_parser, start
from sprout_interp.plots import save_figure
from sprout_interp.plots_heads import head_scores_figure, pattern_figure
from sprout_interp.texts import TEXTS

CHAPTER_PREV_BLOCK, CHAPTER_INDUCTION_BLOCK = 2, 3  # gpt-4, blocks counted from 1


def main(argv: list[str] | None = None) -> int:
    p = script_parser("induction_heads", __doc__)
    p.add_argument("--seq-len", type=int, default=64, help="random tokens per copy (each row is this, twice)")
    p.add_argument("--batch", type=int, default=16, help="rows of repeated random tokens")
    p.add_argument("--n", type=int, default=8, help="held-out windows for the natural-text scores")
    p.add_argument("--length", type=int, default=256, help="tokens per held-out window")
    p.add_argument("--seed", type=int, default=0, help="seed of the random tokens and of the held-out sample")
    p.add_argument("--threshold", type=float, default=0.3, help="score a head needs to count as a previous-token / induction head")
    p.add_argument("--no-copying", action="store_true", help="skip the per-head copying ablation (faster)")
    a = p.parse_args(argv)
    t0 = time.time()
    started = start("induction_heads", a)
    if started is None:
        return 2
    models, out = started

    tables, circuits = [], []
    for nm in models:
        t = time.time()
        m = nm.model
        natural = held_out(m, SimpleNamespace(n=a.n, length=a.length, seed=a.seed))
        if natural is None:
            natural = list(TEXTS.values())
        df = head_scores(m, seq_len=a.seq_len, batch=a.batch, seed=a.seed, natural=natural, copying=not a.no_copying)
        df.attrs["model"] = nm.label
        c = find_induction_circuit(scores=df, threshold=a.threshold)
        df.insert(0, "model", nm.label)
        tables.append(df)
        row = c.as_dict()
        row.update(model=nm.label, preset=nm.preset, n_blocks=m.cfg.n_layers)
        circuits.append(row)

        shown = df.drop(columns=["model"]).copy()
        shown.insert(0, "layer", shown.pop("layer"))
        shown.insert(0, "block", shown.pop("block"))
        for col in shown.columns[3:]:
            shown[col] = shown[col].map(lambda v: f"{v:.3f}" if col.startswith("copying") else f"{v:.2f}")
        print_table(shown, f"{nm.label}: head scores (block counted from 1 = the chapter's 'layer N'; layer = 0-indexed "
                           f"code index; *_random: {a.batch} rows of {a.seq_len} random tokens repeated twice; *_text: "
                           f"held-out text; copying_ratio_*: copying ratio with the head zero-ablated"
                           + (f", clean {df.attrs['clean_copying_ratio']:.3f})" if "clean_copying_ratio" in df.attrs else ")"))
        print(f"circuit: {c.summary()}")
        save_figure(head_scores_figure(df, title=f"{nm.label}: head scores (blocks counted from 1; layer = code index)"),
                    out / f"head_scores_{_slug(nm.label)}", png=False)
        # the best induction head's pattern on one repeated row, and on the story
        from sprout_model.evaluation import repeated_tokens_batch

        rep = repeated_tokens_batch(m.cfg.d_vocab, min(a.seq_len, 24), 1, a.seed)
        pat = attention_patterns(m, rep)
        save_figure(pattern_figure(pat, [str(int(i)) for i in rep[0]], layer=c.induction_layer, head=c.induction_head,
                                   title=f"{nm.label}: best induction head, block {c.induction_block} head {c.induction_head} "
                                         f"(layer {c.induction_layer}), on random tokens repeated twice"),
                    out / f"induction_pattern_{_slug(nm.label)}", png=False)
        story = m.to_tokens(TEXTS["story"])[:, :80]
        save_figure(pattern_figure(attention_patterns(m, story), m.to_str_tokens(story), layer=c.induction_layer,
                                   head=c.induction_head,
                                   title=f"{nm.label}: block {c.induction_block} head {c.induction_head} on the story"),
                    out / f"induction_pattern_story_{_slug(nm.label)}", png=False)
        print(f"[{nm.label}: {time.time() - t:.1f}s]", file=sys.stderr)

    all_scores = pd.concat(tables, ignore_index=True)
    all_scores.to_csv(out / "head_scores.csv", index=False)
    circ = pd.DataFrame(circuits)
    circ.to_csv(out / "circuits.csv", index=False)

    summary = pd.DataFrame({
        "model": circ["model"],
        "blocks": circ["n_blocks"],
        "best prev-token head": [f"block {b} head {h} (layer {l}): {s:.2f}" for b, h, l, s in
                                 zip(circ["prev_block"], circ["prev_head"], circ["prev_layer"], circ["prev_score"])],
        "best induction head": [f"block {b} head {h} (layer {l}): {s:.2f}" for b, h, l, s in
                                zip(circ["induction_block"], circ["induction_head"], circ["induction_layer"], circ["induction_score"])],
        "prev earlier": circ["prev_earlier"],
        "copying ratio": [f"{v:.3f}" if v == v and v is not None else "-" for v in circ["clean_copying_ratio"].fillna(float("nan"))],
        "chapter": ["prev-token head in block 2, induction head in block 3" if pr == "gpt-4" else
                    "one block: no induction head" if pr == "gpt-1" else "copies (100% / 98%)" if pr == "sprout" else ""
                    for pr in circ["preset"]],
    })
    print_table(summary, f"detected circuits (scores on repeated random tokens; a head counts at >= {a.threshold:.2f}; "
                         "copying ratio: loss on the second copy / first, lower = more copying)")

    print(f"\n== verdicts == (a head counts as previous-token / induction head at a score >= {a.threshold:.2f})")
    for r in circuits:
        who = r["model"]
        ind = f"best induction head block {r['induction_block']} head {r['induction_head']} (score {r['induction_score']:.2f})"
        prev = f"best previous-token head block {r['prev_block']} head {r['prev_head']} (score {r['prev_score']:.2f})"
        ratio = r["clean_copying_ratio"]
        rtxt = f", copying ratio {ratio:.3f}" if ratio is not None else ""
        if r["preset"] == "gpt-1" or r["n_blocks"] == 1:
            v = "REPRODUCED" if r["induction_score"] < a.threshold else "NOT reproduced"
            print(f"- {who}: one block cannot make an induction head: {v}: {ind}{rtxt}")
        if r["preset"] == "gpt-4":
            exact = (r["found"] and r["prev_block"] == CHAPTER_PREV_BLOCK and r["induction_block"] == CHAPTER_INDUCTION_BLOCK)
            v = "REPRODUCED" if exact else "PARTLY (a circuit, in other blocks)" if r["found"] else "NOT reproduced"
            print(f"- {who}: previous-token head in layer 2 and induction head in layer 3: {v}: {prev}; {ind}{rtxt}")
        if r["n_blocks"] > 1:
            before = ("" if r["prev_earlier"] or r["prev_before_layer"] is None else
                      f"; best earlier previous-token head block {r['prev_before_layer'] + 1} head {r['prev_before_head']} "
                      f"(score {r['prev_before_score']:.2f})")
            v = "REPRODUCED" if r["found"] else "NOT reproduced"
            print(f"- {who}: a previous-token head in an earlier block than an induction head: {v}: {prev}; {ind}{before}{rtxt}")
    print(f"\nwrote {out}/head_scores.csv, circuits.csv, head_scores_*.html, induction_pattern_*.html in {time.time() - t0:.1f}s")
    return 0


def _slug(s: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in s).strip("_")


if __name__ == "__main__":
    sys.exit(main())
