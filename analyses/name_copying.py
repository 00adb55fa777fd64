"""Claim (chapter, "Eight floors and the way out"): at the second "Zorbin Plax" of a text, "the one-layer
gpt-1 still doesn't expect 'or' after 'Z': below one percent, just like the first time. But gpt-4 puts
98% on 'or' and 93% on 'bin' [...] The full Sprout, with eight blocks, is surer still: 100% on 'or',
98% on 'bin', and it remembers 'Plax' too."

    python analyses/name_copying.py                             # gpt-1, gpt-4, sprout (shipped)
    python analyses/name_copying.py --models runs/gpt-1/checkpoint runs/gpt-4/checkpoint

Our tokenizer splits the name differently from the chapter's (" Z" "or" "b" "in" " Pl" "ax" rather than
Z / or / bin / Plax), so a chapter piece's probability is the product of its tokens' probabilities (the
chance of producing the whole piece). The texts are this project's (sprout_model.evaluation.NAME_TEXTS:
"Zorbin Plax" and four more invented names, each twice); the chapter's own text is not published.
Writes name_tokens.csv, zorbin_pieces.csv, compare_zorbin.csv, names.html, compare_zorbin.html and plotly.min.js (shared by the figures) into
out/name_copying/.
"""
from __future__ import annotations

import sys
import time

import pandas as pd

from sprout_model.evaluation import NAME_TEXTS
from sprout_interp.report.cli import pct, print_table, save_figure, script_parser, start
from sprout_interp.circuits.compare import compare_models, name_copying_table, piece_probabilities
from sprout_interp.core.errors import SproutError
from sprout_interp.plots.heads import compare_models_figure, name_copying_figure

NAME = "Zorbin Plax"
PIECES = ["or", "bin", " Plax"]  # the chapter's pieces after "Z"
CHAPTER = {  # the chapter's figures at the second occurrence (None: no number given)
    "gpt-1": {"or": 0.01},  # "below one percent"
    "gpt-4": {"or": 0.98, "bin": 0.93},
    "sprout": {"or": 1.00, "bin": 0.98, " Plax": None},  # "and it remembers 'Plax' too"
}
REMEMBERS = 0.5  # what we take "remembers Plax" to mean


def main(argv: list[str] | None = None) -> int:
    p = script_parser("name_copying", __doc__)
    a = p.parse_args(argv)
    t0 = time.time()
    started = start("name_copying", a)
    if started is None:
        return 2
    models, out = started
    ms = {nm.label: nm.model for nm in models}
    preset = {nm.label: nm.preset for nm in models}

    table = name_copying_table(ms)
    table.to_csv(out / "name_tokens.csv", index=False)
    first = next(iter(ms.values()))
    print(f"\nour tokens for {NAME!r}: {' | '.join(repr(t) for t in first.to_str_tokens(' ' + NAME))} "
          f"(the chapter's: 'Z' | 'or' | 'bin' | 'Plax')")

    # -- Zorbin Plax: per token, and per chapter piece
    z = table[table["name"] == NAME]
    tok_rows = z[z["model"] == z["model"].iloc[0]].pivot_table(index="index", columns="occurrence", values="token", aggfunc="first")
    per_tok = pd.DataFrame({"token": [repr(t) for t in tok_rows[2]]})
    for label in ms:
        for occ in (1, 2):
            per_tok[f"{label} {'1st' if occ == 1 else '2nd'}"] = [pct(v, 1) for v in z[(z["model"] == label) & (z["occurrence"] == occ)]["prob"]]
    print_table(per_tok, f"{NAME!r}: P(token | text before it) for each token after the first, at the 1st and 2nd occurrence")

    pieces, found = [], {}
    for label in ms:
        for occ in (1, 2):
            d = z[(z["model"] == label) & (z["occurrence"] == occ)]
            try:
                for pp in piece_probabilities(d["token"].tolist(), d["prob"].tolist(), PIECES):
                    pieces.append(dict(model=label, preset=preset[label], occurrence=occ, piece=pp["piece"].strip(),
                                       tokens="|".join(pp["tokens"]), prob=pp["prob"]))
                    found[(label, occ, pp["piece"])] = pp["prob"]
            except SproutError as e:
                print(f"{label}: {e}", file=sys.stderr)
    pieces_df = pd.DataFrame(pieces)
    pieces_df.to_csv(out / "zorbin_pieces.csv", index=False)
    rows = []
    for piece in PIECES:
        row = {"piece": piece.strip()}
        for label in ms:
            ch = CHAPTER.get(preset[label] or "", {})
            if piece in ch:
                row[f"chapter {preset[label]}"] = ("< 1%" if preset[label] == "gpt-1" else "remembers" if ch[piece] is None
                                                   else pct(ch[piece]))
            row[f"{label} 2nd"] = pct(found.get((label, 2, piece), float("nan")), 1)
            row[f"{label} 1st"] = pct(found.get((label, 1, piece), float("nan")), 1)
        rows.append(row)
    print_table(pd.DataFrame(rows).fillna(""), f"the chapter's table for the second {NAME!r}: P(piece) = product of its "
                                               "tokens' probabilities (1st = the same at the first occurrence, for contrast)")

    # -- every name
    summ = table.groupby(["name", "model", "occurrence"], sort=False)["prob"].mean().unstack(["model", "occurrence"])
    names_df = pd.DataFrame({"name": summ.index,
                             "tokens": ["|".join(table[(table["name"] == n) & (table["occurrence"] == 2)
                                                       & (table["model"] == first_label(ms))]["token"]) for n in summ.index]})
    for label in ms:
        names_df[f"{label} 2nd"] = [pct(v, 1) for v in summ[(label, 2)]]
        names_df[f"{label} 1st"] = [pct(v, 1) for v in summ[(label, 1)]]
    means = {label: (float(summ[(label, 2)].mean()), float(summ[(label, 1)].mean())) for label in ms}
    names_df.loc[len(names_df)] = ["(mean)", ""] + [pct(v, 1) for label in ms for v in means[label]]
    print_table(names_df, "invented names: mean P(each token after the first) at the 2nd and the 1st occurrence")

    cmp = compare_models(ms, NAME_TEXTS[0][1])
    cmp.to_csv(out / "compare_zorbin.csv", index=False)
    save_figure(compare_models_figure(cmp, title=f"P(actual next token) on the {NAME!r} text, per model"),
                out / "compare_zorbin", png=False)
    save_figure(name_copying_figure(table), out / "names", png=False)

    # -- verdicts
    print("\n== verdicts ==")
    for label in ms:
        pr = preset[label]
        o2, b2, p2 = (found.get((label, 2, pc), float("nan")) for pc in PIECES)
        o1 = found.get((label, 1, "or"), float("nan"))
        if pr == "gpt-1":
            v = ("REPRODUCED" if o2 < 0.01 and o1 < 0.01 else "PARTLY (below 1% only at the second)" if o2 < 0.01
                 else "NOT reproduced")
            print(f"- {label}: below 1% on 'or' after 'Z', at the second occurrence as at the first: {v}: "
                  f"{pct(o2, 2)} (2nd), {pct(o1, 2)} (1st)")
        elif pr == "gpt-4":
            v = ("REPRODUCED" if o2 >= 0.88 and b2 >= 0.83 else "PARTLY (copies, less surely)" if o2 >= 0.5 and b2 >= 0.5
                 else "NOT reproduced")
            print(f"- {label}: 98% on 'or' and 93% on 'bin' at the second occurrence: {v}: {pct(o2, 1)} on 'or', {pct(b2, 1)} on 'bin'"
                  f" (within 10 points counts as reproduced)")
        elif pr == "sprout":
            v = ("REPRODUCED" if o2 >= 0.9 and b2 >= 0.88 and p2 >= REMEMBERS else
                 "PARTLY (copies, less surely)" if o2 >= 0.5 and b2 >= 0.5 else "NOT reproduced")
            print(f"- {label}: 100% on 'or', 98% on 'bin' and remembers 'Plax': {v}: {pct(o2, 1)} on 'or', {pct(b2, 1)} on 'bin', "
                  f"{pct(p2, 1)} on 'Plax' (remembering taken as >= {pct(REMEMBERS)})")
    order = [nm.label for nm in sorted(models, key=lambda nm: nm.model.cfg.n_layers)]
    if len(order) > 1:
        vals = [means[label][0] for label in order]
        inc = all(x + 0.01 < y for x, y in zip(vals, vals[1:]))
        print(f"- deeper models copy more surely (over our five names, mean P at the 2nd occurrence, each deeper model "
              f"at least 1 point higher): "
              f"{'REPRODUCED' if inc else 'NOT reproduced'}: " + ", ".join(f"{l} {pct(v, 1)}" for l, v in zip(order, vals)))
    print(f"\nwrote {out}/name_tokens.csv, zorbin_pieces.csv, compare_zorbin.csv, names.html, compare_zorbin.html "
          f"in {time.time() - t0:.1f}s")
    return 0


def first_label(ms: dict) -> str:
    return next(iter(ms))


if __name__ == "__main__":
    sys.exit(main())
