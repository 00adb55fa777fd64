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

import itertools
import math
import sys
from argparse import ArgumentParser, Namespace
from pathlib import Path

import pandas as pd

from sprout_interp.behaviour.compare import (
    compare_models,
    name_copying_table,
    piece_probabilities,
)
from sprout_interp.core.errors import SproutError
from sprout_interp.plots.heads import compare_models_figure, name_copying_figure
from sprout_interp.report.claims import Claim, verdict_lines
from sprout_interp.report.cli import (
    NamedModel,
    models_frame,
    pct,
    print_table,
    run_claim_script,
    save_figure,
    script_parser,
)
from sprout_model.evaluation import NAME_TEXTS

SCRIPT = "name_copying"
COMMAND = f".venv/bin/python analyses/{SCRIPT}.py"
NAME = "Zorbin Plax"
PIECES = ["or", "bin", " Plax"]  # the chapter's pieces after "Z"
CHAPTER = {  # the chapter's figures at the second occurrence (None: no number given)
    "gpt-1": {"or": 0.01},  # "below one percent"
    "gpt-4": {"or": 0.98, "bin": 0.93},
    "sprout": {"or": 1.00, "bin": 0.98, " Plax": None},  # "and it remembers 'Plax' too"
}
REMEMBERS = 0.5  # what we take "remembers Plax" to mean
CLAIM = "the second \"Zorbin Plax\" is copied"
CHAPTER_FIGURES = "gpt-1 < 1% on \"or\"; gpt-4 98% \"or\", 93% \"bin\"; Sprout 100%, 98%, remembers \"Plax\""
DEEPER = ("deeper models copy more surely (over our five invented names, mean P of a name's later tokens at its 2nd "
          "occurrence, each deeper model at least 1 point higher)")


def parser() -> ArgumentParser:
    """The script's arguments (the defaults are the claims table's settings)."""
    return script_parser(SCRIPT, __doc__)


def measure(models: list[NamedModel], args: Namespace) -> dict[str, pd.DataFrame]:
    """{"models": model, preset, n_blocks; "tokens": P(token) of every name token at both occurrences
    (``name_copying_table``); "zorbin_tokens": our tokens of the name; "pieces": model, preset, occurrence,
    piece, tokens, prob (the chapter's pieces of the Zorbin Plax text); "compare": P(actual next token) on
    that text, per model}."""
    ms = {nm.label: nm.model for nm in models}
    preset = {nm.label: nm.preset for nm in models}
    table = name_copying_table(ms)
    first = next(iter(ms.values()))
    z = table[table["name"] == NAME]
    pieces = []
    for label in ms:
        for occ in (1, 2):
            d = z[(z["model"] == label) & (z["occurrence"] == occ)]
            try:
                for pp in piece_probabilities(d["token"].tolist(), d["prob"].tolist(), PIECES):
                    pieces.append({"model": label, "preset": preset[label], "occurrence": occ, "piece": pp["piece"].strip(),
                                       "tokens": "|".join(pp["tokens"]), "prob": pp["prob"]})
            except SproutError as e:
                print(f"{label}: {e}", file=sys.stderr)
    return {"models": models_frame(models), "tokens": table,
            "zorbin_tokens": pd.DataFrame({"token": first.to_str_tokens(" " + NAME)}),
            "pieces": pd.DataFrame(pieces, columns=["model", "preset", "occurrence", "piece", "tokens", "prob"]),
            "compare": compare_models(ms, NAME_TEXTS[0][1])}


def _found(pieces: pd.DataFrame) -> dict[tuple[str, int, str], float]:
    """(model, occurrence, piece as in PIECES) -> P(piece)."""
    raw = {pc.strip(): pc for pc in PIECES}
    return {(r.model, int(r.occurrence), raw[r.piece]): float(r.prob) for r in pieces.itertuples()}


def name_means(tokens: pd.DataFrame) -> pd.DataFrame:
    """Mean P(each token after the first) per name, model and occurrence: index name, columns (model, occurrence)."""
    return tokens.groupby(["name", "model", "occurrence"], sort=False)["prob"].mean().unstack(["model", "occurrence"])


def judge(measured: dict[str, pd.DataFrame]) -> list[Claim]:
    """Per chapter model: the chapter's figures at the second Zorbin Plax (gpt-1 below 1% on "or" at both occurrences;
    gpt-4 within 10 points of 98% / 93%, PARTLY from 50%; Sprout within 10 points of 100% / 98% and >= 50% on "Plax");
    over every loaded model, deeper models copy more surely (each deeper model at least 1 point higher on our five
    names' mean P at the 2nd occurrence)."""
    found = _found(measured["pieces"])
    mf = measured["models"]
    out = []
    for r in mf.itertuples():
        label, pr = r.model, r.preset
        o2, b2, p2 = (found.get((label, 2, pc), math.nan) for pc in PIECES)
        o1 = found.get((label, 1, "or"), math.nan)
        ev = {"pieces": measured["pieces"][measured["pieces"]["model"] == label]}
        if pr == "gpt-1":
            v = ("REPRODUCED" if o2 < 0.01 and o1 < 0.01 else "PARTLY (below 1% only at the second)" if o2 < 0.01
                 else "NOT reproduced")
            brief = f"{pct(o2, 2)} on 'or' (2nd), {pct(o1, 2)} (1st)"
            ours = f"{brief}; chapter below 1% at both"
        elif pr == "gpt-4":
            v = ("REPRODUCED" if o2 >= 0.88 and b2 >= 0.83 else "PARTLY (copies, less surely)" if o2 >= 0.5 and b2 >= 0.5
                 else "NOT reproduced")
            brief = f"{pct(o2, 1)} on 'or', {pct(b2, 1)} on 'bin', {pct(p2, 1)} on 'Plax'"
            ours = f"{brief}; chapter 98% and 93% (within 10 points counts as reproduced)"
        elif pr == "sprout":
            v = ("REPRODUCED" if o2 >= 0.9 and b2 >= 0.88 and p2 >= REMEMBERS else
                 "PARTLY (copies, less surely)" if o2 >= 0.5 and b2 >= 0.5 else "NOT reproduced")
            brief = f"{pct(o2, 1)} on 'or', {pct(b2, 1)} on 'bin', {pct(p2, 1)} on 'Plax'"
            ours = f"{brief}; chapter 100%, 98% and remembers 'Plax' (remembering taken as >= {pct(REMEMBERS)})"
        else:
            continue
        out.append(Claim(claim=CLAIM, chapter=CHAPTER_FIGURES, ours=ours, brief=brief, verdict=v, command=COMMAND,
                         model=label, evidence=ev))
    if len(mf) > 1:
        summ = name_means(measured["tokens"])
        order = list(mf.sort_values("n_blocks", kind="stable")["model"])
        vals = [float(summ[(label, 2)].mean()) for label in order]
        inc = all(x + 0.01 < y for x, y in itertools.pairwise(vals))
        out.append(Claim(claim=DEEPER, chapter="", verdict="REPRODUCED" if inc else "NOT reproduced", command=COMMAND,
                         ours=", ".join(f"{l} {pct(v, 1)}" for l, v in zip(order, vals, strict=True)),
                         evidence={"name_means": summ}))
    return out


def report(measured: dict[str, pd.DataFrame], claims: list[Claim], args: Namespace, out: Path) -> None:
    """Print the name's tokens, the chapter's table, every name's copying and the verdict lines; write the CSVs
    and figures."""
    table, pieces_df = measured["tokens"], measured["pieces"]
    labels = list(measured["models"]["model"])
    preset = dict(zip(measured["models"]["model"], measured["models"]["preset"]))
    table.to_csv(out / "name_tokens.csv", index=False)
    print(f"\nour tokens for {NAME!r}: {' | '.join(repr(t) for t in measured['zorbin_tokens']['token'])} "
          f"(the chapter's: 'Z' | 'or' | 'bin' | 'Plax')")

    z = table[table["name"] == NAME]
    tok_rows = z[z["model"] == z["model"].iloc[0]].pivot_table(index="index", columns="occurrence", values="token",
                                                                aggfunc="first")
    per_tok = pd.DataFrame({"token": [repr(t) for t in tok_rows[2]]})
    for label in labels:
        for occ in (1, 2):
            per_tok[f"{label} {'1st' if occ == 1 else '2nd'}"] = [
                pct(v, 1) for v in z[(z["model"] == label) & (z["occurrence"] == occ)]["prob"]]
    print_table(per_tok, f"{NAME!r}: P(token | text before it) for each token after the first, at the 1st and 2nd occurrence")

    pieces_df.to_csv(out / "zorbin_pieces.csv", index=False)
    found = _found(pieces_df)
    rows = []
    for piece in PIECES:
        row = {"piece": piece.strip()}
        for label in labels:
            ch = CHAPTER.get(preset[label] or "", {})
            if piece in ch:
                row[f"chapter {preset[label]}"] = ("< 1%" if preset[label] == "gpt-1" else "remembers" if ch[piece] is None
                                                   else pct(ch[piece]))
            row[f"{label} 2nd"] = pct(found.get((label, 2, piece), math.nan), 1)
            row[f"{label} 1st"] = pct(found.get((label, 1, piece), math.nan), 1)
        rows.append(row)
    print_table(pd.DataFrame(rows).fillna(""), f"the chapter's table for the second {NAME!r}: P(piece) = product of its "
                                               "tokens' probabilities (1st = the same at the first occurrence, for contrast)")

    summ = name_means(table)
    names_df = pd.DataFrame({"name": summ.index,
                             "tokens": ["|".join(table[(table["name"] == n) & (table["occurrence"] == 2)
                                                       & (table["model"] == labels[0])]["token"]) for n in summ.index]})
    for label in labels:
        names_df[f"{label} 2nd"] = [pct(v, 1) for v in summ[(label, 2)]]
        names_df[f"{label} 1st"] = [pct(v, 1) for v in summ[(label, 1)]]
    means = {label: (float(summ[(label, 2)].mean()), float(summ[(label, 1)].mean())) for label in labels}
    names_df.loc[len(names_df)] = ["(mean)", ""] + [pct(v, 1) for label in labels for v in means[label]]
    print_table(names_df, "invented names: mean P(each token after the first) at the 2nd and the 1st occurrence")

    cmp = measured["compare"]
    cmp.to_csv(out / "compare_zorbin.csv", index=False)
    save_figure(compare_models_figure(cmp, title=f"P(actual next token) on the {NAME!r} text, per model"),
                out / "compare_zorbin", png=False)
    save_figure(name_copying_figure(table), out / "names", png=False)
    print("\n== verdicts ==")
    print(verdict_lines(claims))


def main(argv: list[str] | None = None) -> int:
    """Measure, judge and report; returns the exit status (2: no checkpoint could be loaded)."""
    return run_claim_script(SCRIPT, argv, parser, measure, judge, report,
                            wrote="name_tokens.csv, zorbin_pieces.csv, compare_zorbin.csv, names.html, compare_zorbin.html")


if __name__ == "__main__":
    sys.exit(main())
