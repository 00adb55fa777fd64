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
that head zero-ablated), and the circuit (sprout_interp.circuits.attention.find_induction_circuit): candidates
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
from types import SimpleNamespace

import pandas as pd

from sprout_interp.circuits.attention import (
    PARTLY_SHARE,
    REPRODUCED_SHARE,
    attention_patterns,
    find_induction_circuit,
    head_label,
    head_scores,
)
from sprout_interp.report.cli import evidence_table, held_out, mean_reference, pct, print_table, save_figure, script_parser, start
from sprout_interp.plots.heads import head_scores_figure, pattern_figure
from sprout_interp.core.texts import TEXTS

CHAPTER_PREV_BLOCK, CHAPTER_INDUCTION_BLOCK = 2, 3  # gpt-4, blocks counted from 1


def main(argv: list[str] | None = None) -> int:
    p = script_parser("induction_heads", __doc__)
    p.add_argument("--seq-len", type=int, default=64, help="random tokens per copy (each row is this, twice)")
    p.add_argument("--batch", type=int, default=16, help="rows of repeated random tokens")
    p.add_argument("--n", type=int, default=8, help="held-out windows for the natural-text scores")
    p.add_argument("--length", type=int, default=256, help="tokens per held-out window")
    p.add_argument("--seed", type=int, default=0, help="seed of the random tokens and of the held-out sample")
    p.add_argument("--threshold", type=float, default=0.3, help="score a head needs to count as a previous-token / induction head")
    p.add_argument("--kind", choices=["mean", "zero"], default="mean", help="how the circuit's heads are ablated")
    p.add_argument("--ref-n", type=int, default=16, help="held-out windows for the mean-ablation reference (seed + 1)")
    p.add_argument("--loss-n", type=int, default=4, help="held-out windows for the held-out loss under ablation")
    p.add_argument("--no-copying", action="store_true", help="skip the per-head copying sweep (faster)")
    a = p.parse_args(argv)
    t0 = time.time()
    started = start("induction_heads", a)
    if started is None:
        return 2
    models, out = started

    tables, circuits, evidence, objs = [], [], [], []
    for nm in models:
        t = time.time()
        m = nm.model
        natural = held_out(m, SimpleNamespace(n=a.n, length=a.length, seed=a.seed))
        if natural is None:
            natural = list(TEXTS.values())
        df = head_scores(m, seq_len=a.seq_len, batch=a.batch, seed=a.seed, natural=natural, copying=not a.no_copying)
        df.attrs["model"] = nm.label
        loss_text = held_out(m, SimpleNamespace(n=a.loss_n, length=a.length, seed=a.seed))
        means = mean_reference(m, a.ref_n, a.length, a.seed + 1) if a.kind == "mean" else None
        c = find_induction_circuit(m, scores=df, threshold=a.threshold, kind=a.kind, reference=means,
                                   held_out=loss_text if loss_text is not None else list(TEXTS.values()))
        c.model = nm.label
        df.insert(0, "model", nm.label)
        tables.append(df)
        row = c.as_dict()
        row.update(model=nm.label, preset=nm.preset, n_blocks=m.cfg.n_layers)
        circuits.append(row)
        objs.append(c)
        evidence.append(c.evidence.assign(model=nm.label))

        shown = df.drop(columns=["model"]).copy()
        shown.insert(0, "layer", shown.pop("layer"))
        shown.insert(0, "block", shown.pop("block"))
        for col in shown.columns[3:]:
            shown[col] = shown[col].map(lambda v: f"{v:.3f}" if col.startswith("copying") else f"{v:.2f}")
        print_table(shown, f"{nm.label}: head scores (block counted from 1 = the chapter's 'layer N'; layer = 0-indexed "
                           f"code index; *_random: {a.batch} rows of {a.seq_len} random tokens repeated twice; *_text: "
                           f"held-out text; copying_ratio_*: copying ratio with the head zero-ablated"
                           + (f", clean {df.attrs['clean_copying_ratio']:.3f})" if "clean_copying_ratio" in df.attrs else ")"))
        print(f"\ncircuit: {c.summary()}")
        print_table(evidence_table(c), f"{nm.label}: the circuit's candidates {a.kind}-ablated alone, then together: name "
                                       "copying (mean P(each later token of a name) over the five names, 2nd occurrence, "
                                       "1st in brackets), the share of its gain removed, held-out loss change (nats/token), "
                                       "specificity, and the induction head's induction score (repeated random tokens)")
        save_figure(head_scores_figure(df, title=f"{nm.label}: head scores (blocks counted from 1; layer = code index)"),
                    out / f"head_scores_{_slug(nm.label)}")
        # the induction head's pattern on one repeated row, and on the story
        from sprout_model.evaluation import repeated_tokens_batch

        rep = repeated_tokens_batch(m.cfg.d_vocab, min(a.seq_len, 24), 1, a.seed)
        pat = attention_patterns(m, rep)
        save_figure(pattern_figure(pat, [str(int(i)) for i in rep[0]], layer=c.induction_layer, head=c.induction_head,
                                   title=f"{nm.label}: induction head {c.induction_label}, on random tokens repeated twice"),
                    out / f"induction_pattern_{_slug(nm.label)}")
        story = m.to_tokens(TEXTS["story"])[:, :80]
        save_figure(pattern_figure(attention_patterns(m, story), m.to_str_tokens(story), layer=c.induction_layer,
                                   head=c.induction_head, title=f"{nm.label}: {c.induction_label} on the story"),
                    out / f"induction_pattern_story_{_slug(nm.label)}")
        print(f"[{nm.label}: {time.time() - t:.1f}s]", file=sys.stderr)

    all_scores = pd.concat(tables, ignore_index=True)
    all_scores.to_csv(out / "head_scores.csv", index=False)
    circ = pd.DataFrame(circuits)
    circ.to_csv(out / "circuits.csv", index=False)
    pd.concat(evidence, ignore_index=True).to_csv(out / "circuit_evidence.csv", index=False)

    def scored(c, heads, col: str) -> str:
        """'block 1 head 0 (layer 0) 0.44 / 0.45 + ...': each head with its score on random tokens / on text."""
        ev = c.evidence[c.evidence["n_heads"] == 1]
        got = []
        for l, h in heads:
            hit = ev[(ev["layer"] == l) & (ev["head"] == h)]
            s = "" if hit.empty else f" {hit.iloc[0][col + '_random']:.2f} / {hit.iloc[0][col + '_text']:.2f}"
            got.append(f"{head_label(l, h)}{s}")
        return " + ".join(got) or "none confirmed"

    summary = pd.DataFrame({
        "model": circ["model"],
        "blocks": circ["n_blocks"],
        "previous-token head(s), score random / text": [scored(c, c.prev_tokens, "prev_token") for c in objs],
        "previous-token part": circ["previous-token_verdict"],
        "induction head, score random / text": [scored(c, [(c.induction_layer, c.induction_head)], "induction")
                                                for c in objs],
        "induction part": circ["induction_verdict"],
        "copying ratio": [f"{v:.3f}" if v == v and v is not None else "-" for v in circ["clean_copying_ratio"].fillna(float("nan"))],
        "chapter": ["prev-token head in block 2, induction head in block 3" if pr == "gpt-4" else
                    "one block: no induction head" if pr == "gpt-1" else "copies (100% / 98%)" if pr == "sprout" else ""
                    for pr in circ["preset"]],
    })
    print_table(summary, f"circuits (ranked by head scores, confirmed by {a.kind} ablation; each part's verdict from its own "
                         "ablation; copying ratio: loss on the second copy / first, lower = more copying)")

    print(f"\n== verdicts == (a head counts as a previous-token / induction head at a score >= {a.threshold:.2f} and when its "
          f"own {a.kind} ablation lowers the copying specifically; a part is REPRODUCED when its own ablation removes >= "
          f"{pct(REPRODUCED_SHARE)} of the name-copying gain, PARTLY at >= {pct(PARTLY_SHARE)})")
    for r, c in zip(circuits, objs):
        who = r["model"]
        ind = f"induction head {c.induction_label} (score {c.induction_score:.2f})"
        ratio = r["clean_copying_ratio"]
        rtxt = f", copying ratio {ratio:.3f}" if ratio is not None else ""
        if r["preset"] == "gpt-1" or r["n_blocks"] == 1:
            v = "REPRODUCED" if c.induction_score < a.threshold else "NOT reproduced"
            print(f"- {who}: one block cannot make an induction head: {v}: best {ind}{rtxt}")
        if r["n_blocks"] > 1:
            parts = c.verdicts()
            print(f"- {who}: previous-token part ({c.prev_label if c.prev_tokens else 'none confirmed'}), by its own "
                  f"ablation: {parts['previous-token'][0]}: {parts['previous-token'][1]}")
            print(f"- {who}: induction part ({c.induction_label}), by its own ablation: {parts['induction'][0]}: "
                  f"{parts['induction'][1]}")
        if r["preset"] == "gpt-4":
            exact = (c.verdict() == "REPRODUCED" and {h[0] + 1 for h in c.prev_tokens} == {CHAPTER_PREV_BLOCK}
                     and c.induction_block == CHAPTER_INDUCTION_BLOCK)
            v = ("REPRODUCED" if exact else "NOT reproduced" if c.verdict() == "NOT reproduced" else
                 f"PARTLY (a circuit, {c.verdict()} by ablation, in other blocks)")
            print(f"- {who}: previous-token head in layer 2 and induction head in layer 3: {v}: previous-token head(s) "
                  f"{c.prev_label if c.prev_tokens else 'none confirmed'}; {ind}{rtxt}")
        if r["n_blocks"] > 1:
            print(f"- {who}: a previous-token head in an earlier block feeds an induction head (both parts, each by its own "
                  f"ablation): {c.verdict()}: {c.prev_label if c.prev_tokens else 'no previous-token head'} -> "
                  f"{c.induction_label}{rtxt}")
    print(f"\nwrote {out}/head_scores.csv, circuits.csv, circuit_evidence.csv, head_scores_*.html, induction_pattern_*.html "
          f"in {time.time() - t0:.1f}s")
    return 0


def _slug(s: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in s).strip("_")


if __name__ == "__main__":
    sys.exit(main())
