"""Claim (chapter, "Eight floors and the way out"): at a name's second occurrence the model "found what followed
[the name's start] earlier in the text and copied it" -- "a previous-token head in layer 2 and an induction head in
layer 3". Read in an attribution graph (circuit-tracer's method on the shipped transcoders), the story has three
parts: what is read at the first occurrence (the features at the first " Plax" and at its previous token), moved
by the induction head's OV (attention from the first occurrence's position to the last one), into the logit.

    python analyses/name_copy_graph.py                       # gpt-4 and sprout (shipped, with their transcoders)
    python analyses/name_copy_graph.py --models gpt-4 --no-held-out --random 5    # about 30 s
    python analyses/name_copy_graph.py --models sprout --random 40 --no-held-out
    python analyses/name_copy_graph.py --kind per_layer      # over the per-layer transcoders (default: the best kind)

Prompts: the story of ``sprout_interp.core.texts.TEXTS`` (the chapter's "Zorbin Plax" text; the chapter's own is
not published) cut before the second " Plax", so the last token is the name's "in" and the target is " Pl"; and,
held out, three texts with invented names of their own (not the five the head-level circuit is chosen on), each
cut before the surname's second occurrence. ``p1`` is the first occurrence of the target token right after an
earlier copy of the last token (the induction head's key); ``p1 - 1`` is that earlier copy.

Each graph has the target as its one logit node (``attribution_targets``); it keeps every active feature where its
tensors fit the memory budget (``sprout_interp.core.limits.MAX_GRAPH_BYTES``), else the features of most influence
as circuit-tracer picks them (the report says how many); a feature intervention zeroes the graph's feature nodes,
and the features it left out are held in the frozen model (no edge follows them) and keep their writes in the real
one. Each part rests on its own
intervention, measured in the frozen replacement model (exact; the graph's edges predict it) and in the real model
(patterns, norms and feed-forwards all respond), on the target's logit minus the mean logit (the graph's unit):

1. read at the first occurrence: every feature node at ``p1 - 1`` and ``p1`` zeroed (its decoder write removed;
   in the real model from the feed-forward's true output), against ``--random`` draws of as many feature nodes at
   other positions (not the last); and the tokens themselves: the embedding nodes at ``p1 - 1`` and ``p1`` zeroed,
   against as many embeddings at other positions;
2. moved by the induction head's OV: the induction head's attention weight from the last position to ``p1`` set
   to 0 (the head of ``find_induction_circuit``, confirmed by ablation), against the same weight of every other
   head;
3. into the logit: the same intervention with every feature held (frozen model: nothing downstream responds, so
   only the head's write reaches the logit, through the residual stream and later heads' frozen patterns): the
   share of the head's effect (frozen, features following) that goes straight into the logit, not through later
   features. Measured in the frozen model only: the real model with everything downstream held is the same
   computation.

Beside them, for context: the features at ``p1`` alone and at ``p1 - 1`` alone, the current token's features
alone and every error node zeroed (each against random features). Verdicts, each part judged twice (in the graph:
its frozen replacement model, whose changes the edges predict exactly, against frozen controls; and in the real
model): REPRODUCED when the change lowers the target's logit by at least ``DROP`` and by at least ``SPECIFIC``
times the largest change of its controls, PARTLY when one of the two holds; part 3 REPRODUCED at a direct share of
at least ``DIRECT_SHARE``, PARTLY at half of that. The graph freezes the attention patterns, so what the first occurrence
does through the induction head's queries and keys (the previous-token head's write that makes it attend) is in
the real model's numbers and not in the graph's.
Writes interventions.csv, verdicts.csv and one graph file per model and prompt into out/name_copy_graph/.
"""
from __future__ import annotations

import sys
from argparse import ArgumentParser, Namespace
from pathlib import Path
from typing import Any

import pandas as pd

from sprout_interp.circuits.graph_interventions import copy_interventions
from sprout_interp.circuits.induction import find_induction_circuit
from sprout_interp.circuits.local_replacement import resolve_transcoders
from sprout_interp.core.texts import TEXTS
from sprout_interp.report.claims import Claim, verdict_lines
from sprout_interp.report.cli import NamedModel, models_frame, print_table, run_claim_script, script_parser, slug

SCRIPT = "name_copy_graph"
COMMAND = f".venv/bin/python analyses/{SCRIPT}.py"
CLAIM = "the copy of a name, read as a graph of features"
CHAPTER = "found what followed earlier in the text and copied it (previous-token head, then induction head)"
#: the transcoders the graphs use: None, the best shipped kind (``local_replacement.best_kind``, by held-out FVE: the
#: cross-layer transcoder for both shipped models), as ``si.attribution_graph`` picks it. The verdicts hold over
#: both kinds (docs/attribution_graphs.md compares them): no part needs one-block features, since zeroing a CLT
#: feature removes its writes to every later feed-forward and holding it holds them all. ``--kind`` names one.
KIND = None
DROP = 1.0  # logit units (nats of the target's logit against the mean) a part's intervention must remove
SPECIFIC = 3.0  # times the largest control change
DIRECT_SHARE = 0.5  # of the induction head's effect going straight into the logit
#: held-out texts: invented names not among sprout_model.evaluation.NAME_TEXTS, each cut before the surname's 2nd use
HELD_OUT = {
    "Dellwyn Farrow": "The ferry was late that morning, and on its deck stood Dellwyn Farrow with a sack of letters "
                      "over his shoulder. The harbour master counted the crates twice, signed the paper, and waved "
                      "the last boat in to Dellwyn Farrow",
    "Ismene Tarquill": "Nobody on the street had heard of Ismene Tarquill until the bakery closed. In the spring she "
                       "bought the empty shop, painted the door blue, and hung a small sign over it that said "
                       "Ismene Tarquill",
    "Corvin Ashmoor": "The new teacher, Corvin Ashmoor, came on the first day of term with a box of old maps. The "
                      "children watched him pin the maps to every wall, and at the end of the week they wrote a card "
                      "to Corvin Ashmoor",
}


def prompts(held_out: bool = True) -> list[tuple[str, str, str]]:
    """(label, text cut before the surname's second occurrence, surname with its space) for every prompt: the
    story's "Zorbin Plax" first, then the held-out names."""
    s = TEXTS["story"]
    out = [("story (Zorbin Plax)", s[:s.index(" Plax", s.index(" Plax") + 1)], " Plax")]
    if held_out:
        for name, text in HELD_OUT.items():
            surname = " " + name.split()[1]
            out.append((f"held-out ({name})", text[:text.rindex(surname)], surname))
    return out


def parser() -> ArgumentParser:
    """The script's arguments."""
    p = script_parser(SCRIPT, __doc__)
    p.set_defaults(models=["gpt-4", "sprout"])
    p.add_argument("--random", type=int, default=20, help="random draws of control features per intervention")
    p.add_argument("--seed", type=int, default=0, help="seed of the control draws")
    p.add_argument("--no-held-out", action="store_true", help="only the story's Zorbin Plax")
    p.add_argument("--kind", choices=("per_layer", "clt"), default=KIND,
                   help="which shipped transcoders replace the feed-forwards (default: the best shipped kind, by "
                        "held-out FVE)")
    return p


# -- the interventions (sprout_interp.circuits.graph_interventions.copy_interventions) ----------------------------


def measure_prompt(m, text: str, surname: str, induction: tuple[int, int], n_random: int, seed: int,
                   kind: str | None = KIND) -> dict[str, Any]:
    """Every intervention on one prompt (``copy_interventions``; see the module docstring), over the shipped
    transcoders of ``kind`` (None: the best shipped kind)."""
    return copy_interventions(m, text, surname, induction, n_random=n_random, seed=seed,
                              transcoders=resolve_transcoders(m, None, kind))


def measure(models: list[NamedModel], args: Namespace) -> dict[str, Any]:
    """{"models": model, preset, n_blocks; "circuits": model -> its InductionCircuit; "rows": one row per model,
    prompt and intervention (see :func:`measure_prompt`); "prompts": (model, prompt) -> that prompt's graph,
    target and positions}."""
    rows, circuits, info = [], {}, {}
    for nm in models:
        m = nm.model
        c = find_induction_circuit(m)
        circuits[nm.label] = c
        for label, text, surname in prompts(not args.no_held_out):
            got = measure_prompt(m, text, surname, (c.induction_layer, c.induction_head), args.random, args.seed,
                                 getattr(args, "kind", KIND))
            info[(nm.label, label)] = got
            for r in got["rows"]:
                rows.append({"model": nm.label, "prompt": label, **r})
    return {"models": models_frame(models), "circuits": circuits, "rows": pd.DataFrame(rows), "prompts": info}


# -- verdicts ---------------------------------------------------------------------------------------------------


def part_verdict(change: float, control: float) -> str:
    """A part's verdict from its own intervention's change of the target logit and its controls' largest change:
    REPRODUCED when it drops by ``DROP`` and ``SPECIFIC`` times the largest control, PARTLY when one holds."""
    big = change <= -DROP
    specific = change < 0 and abs(change) >= SPECIFIC * abs(control)
    return "REPRODUCED" if big and specific else "PARTLY" if big or specific else "NOT reproduced"


def direct_verdict(direct: float, total: float) -> tuple[str, float]:
    share = direct / total if total != 0 else float("nan")
    v = ("REPRODUCED" if share >= DIRECT_SHARE else "PARTLY" if share >= DIRECT_SHARE / 2 else "NOT reproduced")
    return v, share


def verdict_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per model, prompt and part: the intervention it rests on, its numbers and its verdict."""
    out = []
    for (model, prompt), g in rows.groupby(["model", "prompt"], sort=False):
        head = g[g["part"] == "moved by the induction head's OV"].iloc[0]
        for r in g[g["part"] != "context"].to_dict("records"):
            if r["part"] == "into the logit":
                v_graph, share = direct_verdict(r["frozen"], head["frozen"])
                v_real = "-"
                graph = f"direct {r['frozen']:+.2f} of {head['frozen']:+.2f}: {share:.0%}"
                real = "-"
            else:
                v_graph = part_verdict(r["frozen"], r["frozen_control_max"])
                v_real = part_verdict(r["real"], r["real_control_max"])
                pred = (f"edges {r['graph_total']:+.2f}" if r["graph_total"] == r["graph_total"] else
                        f"edges p1-1, p1 -> logit {r['graph_direct']:+.2f}")
                graph = f"{r['frozen']:+.2f} ({pred}); control {r['frozen_control_max']:+.2f}"
                real = f"{r['real']:+.2f}; control {r['real_control_max']:+.2f}"
            out.append({"model": model, "prompt": prompt, "part": r["part"], "intervention": r["intervention"],
                        "graph (frozen)": graph, "verdict in the graph": v_graph, "real model": real,
                        "verdict in the real model": v_real})
    return pd.DataFrame(out)


def judge(measured: dict[str, Any]) -> list[Claim]:
    """Per model, part and side (the graph: its frozen replacement model; the real model): the verdict on the story's
    prompt, and over the held-out prompts (REPRODUCED when every one is, PARTLY when any is or is PARTLY)."""
    table = verdict_table(measured["rows"])
    out = []
    for model, g in table.groupby("model", sort=False):
        c = measured["circuits"][model]
        for part, p in g.groupby("part", sort=False):
            story = p[p["prompt"].str.startswith("story")]
            held = p[~p["prompt"].str.startswith("story")]
            for side, col, num in (("in the graph", "verdict in the graph", "graph (frozen)"),
                                   ("in the real model", "verdict in the real model", "real model")):
                if (p[col] == "-").all():
                    continue
                for r in story.to_dict("records"):
                    out.append(Claim(claim=CLAIM, chapter=CHAPTER, verdict=r[col], ours=r[num], command=COMMAND,
                                     model=model, evidence={"rows": measured["rows"]},
                                     part=f"{part}, {side} ({r['intervention']}; induction head {c.induction_label})"))
                if len(held):
                    v = list(held[col])
                    n_rep = v.count("REPRODUCED")
                    verdict = ("REPRODUCED" if n_rep == len(v) else "PARTLY" if n_rep or "PARTLY" in v
                               else "NOT reproduced")
                    out.append(Claim(claim=CLAIM, chapter=CHAPTER, verdict=verdict, command=COMMAND, model=model,
                                     part=f"{part}, {side}, held-out names", headline=False,
                                     ours=f"{n_rep} of {len(v)} REPRODUCED: " + "; ".join(held[num])))
    return out


def kept(got: dict[str, Any]) -> str:
    """How many of the prompt's active features a graph keeps (all, or as many as fit the memory budget)."""
    n, active = got["graph"].n_features, got["n_active_features"]
    return "keeps every active feature" if n == active else \
        f"keeps {n:,} of the {active:,} active features, as many as fit its memory budget"


def report(measured: dict[str, Any], claims: list[Claim], args: Namespace, out: Path) -> None:
    """Print the head-level circuit, every intervention and the verdict table; write the CSVs and the graphs."""
    rows = measured["rows"]
    for model, c in measured["circuits"].items():
        kinds = {got["graph"].transcoder_kind for (mm, _), got in measured["prompts"].items() if mm == model}
        over = {"clt": "its cross-layer transcoder", "per_layer": "its per-layer transcoders"}
        print(f"\n{model}: graphs over {' and '.join(over[k] for k in sorted(kinds))}; head-level circuit "
              f"(find_induction_circuit, mean ablation): {c.summary()}")
        for (mm, label), got in measured["prompts"].items():
            if mm != model:
                continue
            toks = got["tokens"]
            print(f"  {label}: {len(toks)} tokens, target {toks[got['p1']]!r} (P = {got['p_target']:.3f}); p1 = "
                  f"{got['p1']} ({toks[got['p1'] - 1]!r} {toks[got['p1']]!r}), last = {got['last']} "
                  f"({toks[got['last']]!r}); the graph: {got['graph']!r} ({kept(got)}), exact to "
                  f"{got['graph'].max_error():.1e}; "
                  f"edges from p1-1 and p1 into the logit: {got['first_share']:+.0%} of all |edges| into it")
            got["graph"].save(out / f"graph_{slug(model)}_{slug(label)}.safetensors")
    shown = rows.copy()
    for col in ("graph_direct", "graph_total", "frozen", "frozen_control_max", "real", "real_logprob",
                "real_control_max"):
        shown[col] = shown[col].map(lambda v: "-" if v != v else f"{v:+.2f}")
    print_table(shown, "interventions: change of the target's logit minus the mean logit (graph_*: what the graph's "
                       "edges predict, direct = every node held, total = features follow; frozen: the frozen linear "
                       "replacement model; real: the real model; real_logprob: change of log P(target); *_control_max: "
                       f"the largest change of the controls, {args.random} random draws of as many features elsewhere, "
                       "or every other head's same attention weight)")
    table = verdict_table(rows)
    print_table(table, f"verdicts (each part on its own intervention, in the graph's frozen replacement model and in "
                       f"the real model: REPRODUCED when the target logit drops >= {DROP:g} and >= {SPECIFIC:g}x the "
                       f"largest control, PARTLY when one holds; into the logit: direct share >= {DIRECT_SHARE:.0%})")
    rows.to_csv(out / "interventions.csv", index=False)
    table.to_csv(out / "verdicts.csv", index=False)
    print("\n== verdicts ==")
    print(verdict_lines(claims))


def main(argv: list[str] | None = None) -> int:
    """Measure, judge and report; returns the exit status (2: no checkpoint could be loaded)."""
    return run_claim_script(SCRIPT, argv, parser, measure, judge, report,
                            wrote="interventions.csv, verdicts.csv, graph_*.safetensors")


if __name__ == "__main__":
    sys.exit(main())
