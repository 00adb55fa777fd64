"""Claim (chapter, "Eight floors and the way out"): a previous-token head writes into every token which token stood
before it, and the induction head uses that through its keys: at a name's second occurrence it looks at the token
that followed the name's first occurrence. Read here from the induction head's own score, with a QK attribution.

    python analyses/induction_qk.py                         # gpt-4 and sprout (shipped)
    python analyses/induction_qk.py --models gpt-4 --texts 2

Heads: the induction circuit ``find_induction_circuit`` confirms by ablation (its induction head and its
previous-token head(s)). Texts: the story of ``sprout_interp.core.texts.TEXTS`` ("Zorbin Plax", the chapter's
example; the chapter's own text is not published) and the held-out invented-name texts of
``sprout_model.evaluation.HELDOUT_NAME_TEXTS`` (never used to choose a checkpoint or a head). Cell: the earliest token
of the name's second occurrence that has a copy in its first (the query), and the token after that copy (the key).

The QK attribution (``sprout_interp.circuits.qk_attribution``: attention patterns and every norm's scale frozen,
each feed-forward's output one component) splits the head's pre-softmax score at the cell into the components of
its key and of its query, each with the head that last carried it to the position. Parts, each judged from its
own measurement (``sprout_interp.circuits.induction_qk``):

1. key side, attribution: the share of the score carried to the key by the previous-token head(s) from the
   earlier copy's position (REPRODUCED at ``SHARE`` or more on every text, PARTLY on their mean);
2. key side, control: the same carried part and the score at the same cell of the same text with the earlier copy
   swapped for another token (the key's own token unchanged): REPRODUCED when the carried part is below ``CONTROL``
   times the cell's on their mean and lower on every text, PARTLY when lower on every text; the earlier copy itself
   as the key is shown beside it;
3. key side, intervention (real model): the write at the key of the previous-token head that carries the most
   there (by the attribution) removed, key side only: REPRODUCED when the attention probability drops by at least
   ``DROP`` of its value on every text and the mean drop is at least ``SPECIFIC`` times the mean of the largest
   drop from any other head of that block removed at the key, PARTLY when one holds;
4. query side, attribution: the share of the score from the current token (components written at the query
   position, by any route): REPRODUCED at ``SHARE`` or more on every text, PARTLY on their mean;
5. query side, intervention (real model): the current token's embedding removed at the query position (query side
   only): REPRODUCED when the probability drops by at least ``DROP`` on every text, PARTLY on their mean.

Scores are pre-softmax attention scores (``hook_attn_scores``), probabilities attention weights (``hook_pattern``).
Writes cells.csv, components.csv, removals.csv and verdicts.csv into out/induction_qk/.
"""
from __future__ import annotations

import sys
from argparse import ArgumentParser, Namespace
from pathlib import Path
from typing import Any

import pandas as pd

from sprout_interp.circuits.head_writes import write_label
from sprout_interp.circuits.induction import find_induction_circuit
from sprout_interp.circuits.induction_qk import induction_qk
from sprout_interp.core.texts import TEXTS
from sprout_interp.report.claims import Claim, verdict_lines
from sprout_interp.report.cli import NamedModel, models_frame, pct, print_table, run_claim_script, script_parser
from sprout_model.evaluation import HELDOUT_NAME_TEXTS

SCRIPT = "induction_qk"
COMMAND = f".venv/bin/python analyses/{SCRIPT}.py"
CLAIM = "why the induction head looks at the token after the name's first occurrence (QK attribution)"
CHAPTER = "the previous-token head writes the token before; the induction head finds it through its keys"
SHARE = 0.5  # of the score, for a side's part to count as what makes it
CONTROL = 0.5  # the control's carried part below this times the cell's
DROP = 0.5  # of the attention probability a removal must take away
SPECIFIC = 3.0  # times the mean of the largest other-head drop
STORY = "Zorbin Plax"


def texts(n: int | None = None) -> list[tuple[str, str]]:
    """(name, text): the story's Zorbin Plax first, then the held-out name texts (the first ``n - 1`` of them)."""
    held = HELDOUT_NAME_TEXTS if n is None else HELDOUT_NAME_TEXTS[: max(n - 1, 0)]
    return [(STORY, TEXTS["story"]), *held]


def parser() -> ArgumentParser:
    """The script's arguments (the defaults are the claims table's settings)."""
    p = script_parser(SCRIPT, __doc__)
    p.set_defaults(models=["gpt-4", "sprout"])
    p.add_argument("--texts", type=int, default=len(HELDOUT_NAME_TEXTS) + 1,
                   help="how many texts: the story, then the held-out name texts")
    return p


def measure(models: list[NamedModel], args: Namespace) -> dict[str, Any]:
    """{"models": model, preset, n_blocks; "circuits": model -> its InductionCircuit; "cells", "components",
    "removals": :func:`induction_qk`'s tables with a ``model`` column, for every model of two blocks or more whose
    circuit is found}."""
    circuits, frames = {}, {"cells": [], "components": [], "removals": []}
    for nm in models:
        m = nm.model
        if m.cfg.n_layers < 2:
            continue
        c = find_induction_circuit(m)
        circuits[nm.label] = c
        if not c.found:
            continue
        prev = c.prev_tokens or [(c.prev_layer, c.prev_head)]
        got = induction_qk(m, texts(args.texts), (c.induction_layer, c.induction_head), prev)
        for k in frames:
            frames[k].append(got[k].assign(model=nm.label))
    out = {k: pd.concat(v, ignore_index=True) if v else pd.DataFrame() for k, v in frames.items()}
    return {"models": models_frame(models), "circuits": circuits, **out}


def _span(values: pd.Series, fmt) -> str:
    """'story X; held-out mean Y (min..max)' of a per-text series indexed by name."""
    story = values.get(STORY)
    held = values.drop(STORY, errors="ignore")
    bits = [] if story is None else [f"story {fmt(story)}"]
    if len(held):
        bits.append(f"held-out mean {fmt(held.mean())} ({fmt(held.min())} to {fmt(held.max())}, {len(held)} names)")
    return "; ".join(bits)


def _carrier(cells: pd.Series, prev: list[tuple[int, int]]) -> tuple[int, int]:
    """The previous-token head carrying the most at one induction cell (its key_via column)."""
    return max(prev, key=lambda lh: cells[f"key_via_L{lh[0]}H{lh[1]}"])


def _signed(x: float) -> str:
    return "-" if x != x else f"{100 * x:+.0f}%"


def _one(x: float) -> str:
    return f"{x:.1f}"


def _brief(values: pd.Series, fmt) -> str:
    """'X (story), Y to Z (held-out)': the short form the claims table shows."""
    story = values.get(STORY)
    held = values.drop(STORY, errors="ignore")
    bits = [] if story is None else [f"{fmt(story)} (story)"]
    if len(held):
        bits.append(f"{fmt(held.min())} to {fmt(held.max())} (held-out)")
    return ", ".join(bits)


def parts(measured: dict[str, Any], model: str) -> list[dict]:
    """One dict per part (see the module docstring) for ``model``: part, ours, brief, verdict, evidence."""
    c = measured["circuits"][model]
    prev = c.prev_tokens or [(c.prev_layer, c.prev_head)]
    cells = measured["cells"][measured["cells"]["model"] == model]
    rem = measured["removals"][measured["removals"]["model"] == model]
    cell = cells[cells["condition"] == "induction"].set_index("name")
    swap = cells[cells["condition"] == "swapped"].set_index("name")
    copy = cells[cells["condition"] == "copy"].set_index("name")
    heads = f"{c.induction_label} (previous-token: {c.prev_label})"
    out = []

    share = cell["key_prev_share"]
    v = "REPRODUCED" if (share >= SHARE).all() else "PARTLY" if share.mean() >= SHARE else "NOT reproduced"
    out.append(dict(part="1 key side: carried by the previous-token head(s) from the earlier copy", verdict=v,
                    ours=f"{heads}: {_span(share, pct)} of the score (score {_span(cell['score'], _one)})",
                    brief=f"{_brief(share, pct)} of the score", evidence={"cells": cell}))

    ratio = swap["key_prev_from_copy"] / cell["key_prev_from_copy"]
    lower = (swap["key_prev_from_copy"] < cell["key_prev_from_copy"]) & (swap["score"] < cell["score"])
    v = ("REPRODUCED" if lower.all() and ratio.mean() < CONTROL else "PARTLY" if lower.all() else "NOT reproduced")
    out.append(dict(part="2 key side: against the same cell with the earlier copy swapped", verdict=v,
                    ours=f"carried part {_span(cell['key_prev_from_copy'], _one)} at the cell, "
                         f"{_span(swap['key_prev_from_copy'], _one)} swapped; score {_span(cell['score'], _one)} at the "
                         f"cell, {_span(swap['score'], _one)} swapped, {_span(copy['score'], _one)} with the earlier copy "
                         f"itself as the key; probability {_span(cell['prob'], pct)} at the cell, "
                         f"{_span(swap['prob'], pct)} swapped",
                    brief=f"carried part {_brief(cell['key_prev_from_copy'], _one)} at the cell, "
                          f"{_brief(swap['key_prev_from_copy'], _one)} swapped; score "
                          f"{_brief(swap['score'], _one)} swapped",
                    evidence={"cells": cells}))

    drops, others, named = {}, {}, {}
    for name, g in rem.groupby("name", sort=False):
        lh = _carrier(cell.loc[name], prev)
        label = write_label(("head", lh[0], lh[1], int(cell.loc[name, "key_pos"])))
        base = float(g["prob"].iloc[0])
        hit = g[g["removed"] == label]
        drops[name] = float(hit["prob_change"].iloc[0]) / base
        named[name] = (lh, float(hit["score_change"].iloc[0]), float(hit["table_change"].iloc[0]))
        others[name] = float(g.loc[g["role"] == "another head at the key", "prob_change"].min()) / base
    drops, others = pd.Series(drops), pd.Series(others)
    big = (drops <= -DROP).all()
    specific = -drops.mean() >= SPECIFIC * max(-others.clip(upper=0).mean(), 1e-9)
    v = "REPRODUCED" if big and specific else "PARTLY" if big or specific else "NOT reproduced"
    sc = pd.Series({k: s for k, (_, s, _) in named.items()})
    tc = pd.Series({k: t for k, (_, _, t) in named.items()})
    out.append(dict(part="3 key side: the carrying head's write at the key removed (real model)", verdict=v,
                    ours=f"attention probability {_span(drops, _signed)} of its value; score change "
                         f"{_span(sc, lambda x: f'{x:+.1f}')} (the attribution's, norms frozen: "
                         f"{_span(tc, lambda x: f'{x:+.1f}')}); any other head of that block removed there instead: "
                         f"at most {_span(others, _signed)}",
                    brief=f"probability {_brief(drops, _signed)}; other heads at most {_brief(others, _signed)}",
                    evidence={"removals": rem, "carriers": pd.Series({k: str(x[0]) for k, x in named.items()})}))

    qs = cell["query_own"] / cell["score"]
    qp = cell["query_prev"] / cell["score"]
    v = "REPRODUCED" if (qs >= SHARE).all() else "PARTLY" if qs.mean() >= SHARE else "NOT reproduced"
    out.append(dict(part="4 query side: the current token itself", verdict=v,
                    ours=f"{_span(qs, pct)} of the score written at the query position; carried there by the "
                         f"previous-token head(s): {_span(qp, pct)}",
                    brief=f"{_brief(qs, pct)} of the score from the query's own position", evidence={"cells": cell}))

    base = rem[rem["role"] == "nothing"].set_index("name")["prob"]
    qd = rem[rem["role"] == "the query's embedding"].set_index("name")["prob_change"] / base
    pq = rem[rem["role"] == "previous-token heads at the query"].set_index("name")["prob_change"] / base
    v = "REPRODUCED" if (qd <= -DROP).all() else "PARTLY" if qd.mean() <= -DROP else "NOT reproduced"
    out.append(dict(part="5 query side: the current token's embedding removed at the query (real model)", verdict=v,
                    ours=f"attention probability {_span(qd, _signed)} of its value; the previous-token head(s)' "
                         f"writes removed at the query instead: {_span(pq, _signed)}",
                    brief=f"probability {_brief(qd, _signed)}", evidence={"removals": rem}))
    return out


def judge(measured: dict[str, Any]) -> list[Claim]:
    """One claim per model and part (:func:`parts`), each from its own measurement."""
    out = []
    for label in measured["circuits"]:
        if measured["cells"].empty or label not in set(measured["cells"]["model"]):
            continue
        for p in parts(measured, label):
            out.append(Claim(claim=CLAIM, chapter=CHAPTER, ours=p["ours"], verdict=p["verdict"], command=COMMAND,
                             model=label, part=p["part"], evidence=p["evidence"], brief=p["brief"]))
    return out


def report(measured: dict[str, Any], claims: list[Claim], args: Namespace, out: Path) -> None:
    """Print each model's heads, cells, top components and removals, then the verdicts; write the CSVs."""
    cells, comps, rem = measured["cells"], measured["components"], measured["removals"]
    for label, c in measured["circuits"].items():
        print(f"\n{label}: {c.summary()}")
        if cells.empty or label not in set(cells["model"]):
            print(f"{label}: no induction circuit found, nothing to attribute")
            continue
        cm = cells[cells["model"] == label]
        cols = ["name", "condition", "query_pos", "query_token", "key_pos", "key_token", "score", "prob",
                "key_prev_from_copy", *[k for k in cm.columns if k.startswith("key_via_")], "key_prev_share",
                "query_own", "query_prev", "key_top", "query_top"]
        print_table(cm[cols].round(3), f"{label}: the induction head's score at each cell (induction: query at the "
                                       "name's second occurrence, key after its earlier copy; swapped: the earlier "
                                       "copy replaced by another token; copy: the earlier copy itself as the key)")
        story = comps[(comps["model"] == label) & (comps["name"] == STORY)]
        for side in ("key", "query"):
            t = story[story["side"] == side][["kind", "layer", "pos", "token", "carrier", "value"]]
            print_table(t.round(3), f"{label}, {STORY}: the {side} side's largest components (value: the score with "
                                    "that component alone on this side)")
        rm = rem[rem["model"] == label]
        print_table(rm[["name", "role", "removed", "score", "prob", "score_change", "prob_change", "table_change"]]
                    .round(3), f"{label}: writes removed in the real model (table_change: the attribution's change "
                               "for the same removal, norms frozen)")
    vd = pd.DataFrame([{"model": c.model, "part": c.part, "verdict": c.verdict, "ours": c.ours} for c in claims],
                      columns=["model", "part", "verdict", "ours"])
    print_table(vd, "verdicts, each part from its own measurement")
    if not cells.empty:
        cells.to_csv(out / "cells.csv", index=False)
        comps.to_csv(out / "components.csv", index=False)
        rem.to_csv(out / "removals.csv", index=False)
    vd.to_csv(out / "verdicts.csv", index=False)
    print("\n== verdicts ==")
    print(verdict_lines(claims))


def main(argv: list[str] | None = None) -> int:
    """Measure, judge and report; returns the exit status (2: no checkpoint could be loaded)."""
    return run_claim_script(SCRIPT, argv, parser, measure, judge, report,
                            wrote="cells.csv, components.csv, removals.csv, verdicts.csv")


if __name__ == "__main__":
    sys.exit(main())
