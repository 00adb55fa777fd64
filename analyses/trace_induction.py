"""Claim (chapter, "Eight floors and the way out"): copying a name is done by two heads working in turn --
a previous-token head writes into every token which token stood before it, and a later induction head
uses that (through its keys) to find the earlier occurrence of the current token and copy what followed.

    python analyses/trace_induction.py                      # gpt-4 and sprout (shipped)
    python analyses/trace_induction.py --models sprout --texts 3

Causal tracing on the invented-name texts (sprout_model.evaluation.NAME_TEXTS). Clean: the text as it
is, where the name appears twice. Corrupted: the same text with the name's *first* occurrence replaced by
another invented name of the same token length, so nothing earlier says how the second occurrence goes
on. Metric: the log-probability (nats) of the name's second token at the second occurrence (the
chapter's "or" after "Z"). Steps, each with what the chapter's story predicts beside what was measured:

1. the residual stream patched by layer x position (clean into corrupted): the information sits at the
   first occurrence early on and has moved to the read position by the block after the induction head;
2. each head's output patched (all positions): the induction head restores the most;
3. path patching, every earlier head -> the induction head's keys only: the previous-token head's path
   restores the most;
4. the K-composition score of that pair among all pairs (weights only), against random matrices.

Heads: the induction head is the one with the highest induction score on repeated random tokens; the
previous-token head the one whose weaker previous-token score (random tokens, held-out text) is highest
among the heads before it (sprout_interp.circuits.attention.head_scores). Tables: layer (0-indexed), block (=
layer + 1, the chapter's count), head, pos (0-based input index); scores run from 0 (corrupted) to 1
(clean), averaged over the texts. Writes trace_resid.csv, trace_heads.csv, trace_paths.csv,
composition.csv and verdicts.csv into out/trace_induction/.
"""
from __future__ import annotations

from argparse import ArgumentParser, Namespace
from pathlib import Path
from typing import Any

import pandas as pd

from sprout_interp import patching as P
from sprout_interp.circuits.attention import head_scores
from sprout_interp.circuits.composition import composition_table
from sprout_interp.report.claims import Claim
from sprout_interp.report.cli import NamedModel, models_frame, print_table, run_claim_script, script_parser
from sprout_model.evaluation import NAME_TEXTS

# first tokens swapped in for the name's first token at its first occurrence (the first that is one token
# and differs from it is used)
SUBSTITUTES = ["M", "K", "D", "T", "R", "B", "G", "H"]
DEFAULT_MODELS = ["gpt-4", "sprout"]
SCRIPT = "trace_induction"
COMMAND = f".venv/bin/python analyses/{SCRIPT}.py"
CLAIM = "the copying, traced causally: the previous-token head writes, the induction head reads it through its keys"


def corrupted_pair(model, name: str, text: str):
    """(clean ids, corrupted ids, first-occurrence positions, read position, target id) for one text.

    The corrupted ids differ from the clean ones in one token: the name's first token at its first
    occurrence (the chapter's "Z" of the first "Zorbin"), swapped for another capital letter. So the
    tokens an induction head would copy are still there, but nothing marks them as following that first
    token. The metric reads the second occurrence's first token, predicting the name's second token.
    """
    clean = model.to_tokens(text)
    toks = model.to_str_tokens(clean)
    ends, offs = [], 0
    for t in toks:
        offs += len(t)
        ends.append(offs)
    starts = [e - len(t) for e, t in zip(ends, toks)]

    def token_at(char: int) -> int:
        return next(i for i, (a, b) in enumerate(zip(starts, ends)) if a <= char < b)

    first_char, second_char = text.index(name), text.rindex(name)
    p1, p2 = token_at(first_char), token_at(second_char)
    if first_char == second_char or p2 + 1 >= clean.shape[1] or clean[0, p1] != clean[0, p2]:
        return None
    span = [i for i in range(p1, len(toks)) if starts[i] < first_char + len(name)]
    corrupted = clean.clone()
    for sub in SUBSTITUTES:
        ids = model.to_tokens(sub)
        if ids.shape[1] == 1 and int(ids[0, 0]) != int(clean[0, p1]):
            corrupted[0, p1] = ids[0, 0]
            return clean, corrupted, span, p2, int(clean[0, p2 + 1])
    return None


def circuit_heads(model, seed: int = 0, threshold: float = 0.3):
    """(previous-token heads, induction head), heads as (layer, head), by scores (see the module docstring).

    The previous-token heads are every head before the induction head whose weaker previous-token score
    reaches ``threshold``, best first (at least the best one)."""
    s = head_scores(model, copying=False, seed=seed, natural_n=4, natural_length=128)
    ind = s.loc[s["induction_random"].idxmax()]
    before = s[s["layer"] < ind["layer"]].copy()
    before["weaker"] = before[["prev_token_random", "prev_token_text"]].min(axis=1)
    before = before.sort_values("weaker", ascending=False)
    chosen = before[before["weaker"] >= threshold]
    if chosen.empty:
        chosen = before.head(1)
    return [(int(r.layer), int(r.head)) for r in chosen.itertuples()], (int(ind["layer"]), int(ind["head"]))


def label(lh: tuple[int, int]) -> str:
    return f"block {lh[0] + 1} head {lh[1]} (layer {lh[0]})"


def trace(model, texts, prevs, ind) -> dict[str, pd.DataFrame]:
    """The measurements, averaged over the texts (each text patched on its own)."""
    resid, heads, paths, used = [], [], [], []
    H = model.cfg.n_heads
    for name, text in texts:
        pair = corrupted_pair(model, name, text)
        if pair is None:
            continue
        clean, corrupted, span, pos, target = pair
        metric = P.LogProb(target, pos=pos)
        try:
            r = P.activation_patch(model, clean, corrupted, metric, "resid_pre", "layer_pos")
        except P.PatchingError:
            continue
        r["region"] = "other"
        r.loc[r["pos"].isin(span), "region"] = "first occurrence"
        r.loc[r["pos"] == pos, "region"] = "read position"
        resid.append(r.assign(text=name))
        heads.append(P.activation_patch(model, clean, corrupted, metric, "z", "head").assign(text=name))
        senders = [(l, h) for l in range(ind[0]) for h in range(H)] + ([list(prevs)] if len(prevs) > 1 else [])
        pth = P.path_patch(model, clean, corrupted, metric, receivers=[(ind[0], ind[1], "k")], senders=senders)
        paths.append(pth.assign(text=name))
        used.append(dict(text=name, clean=r.attrs["clean"], corrupted=r.attrs["corrupted"]))
    resid_df, heads_df, paths_df = pd.concat(resid), pd.concat(heads), pd.concat(paths)
    by_region = resid_df.groupby(["layer", "block", "region"])["score"].sum().unstack("region").fillna(0.0)
    by_region = (by_region / len(used)).reset_index()
    return {
        "runs": pd.DataFrame(used),
        "resid": by_region,
        "heads": heads_df.groupby(["layer", "block", "head"])["score"].mean().reset_index(),
        "paths": paths_df.groupby(["heads", "layer", "block", "head"])["score"].mean().reset_index(),
    }


def judge_steps(model_label: str, t: dict, comp: pd.DataFrame, prevs, ind) -> list[dict]:
    """One verdict per step, each from its own measurement: dicts of model, step, predicted, measured, verdict
    ("CONSISTENT", "PARTLY" or "NOT SEEN")."""
    prev = prevs[0]
    out = []
    r = t["resid"]
    moved = r[(r["read position"] >= 0.5) & (r["read position"] > r["first occurrence"])]
    moved_layer = int(moved["layer"].min()) if len(moved) else None
    ok = moved_layer is not None and prev[0] < moved_layer <= ind[0] + 1
    out.append(dict(model=model_label, step="1 residual stream",
                    predicted=f"at the first occurrence up to layer {ind[0]}, at the read position (score >= 0.5) from layer "
                              f"{ind[0] + 1}: entering the block after the induction head's",
                    measured="never at the read position" if moved_layer is None
                    else f"at the read position from layer {moved_layer} (resid_pre of block {moved_layer + 1})",
                    verdict="CONSISTENT" if ok else "NOT SEEN"))
    hd = t["heads"].sort_values("score", ascending=False)
    top = (int(hd.iloc[0]["layer"]), int(hd.iloc[0]["head"]))
    ind_score = float(hd[(hd.layer == ind[0]) & (hd["head"] == ind[1])]["score"].iloc[0])
    out.append(dict(model=model_label, step="2 heads", predicted=f"{label(ind)} restores the most",
                    measured=f"top: {label(top)} ({hd.iloc[0]['score']:.2f}); {label(ind)}: {ind_score:.2f}",
                    verdict="CONSISTENT" if top == ind else "NOT SEEN"))
    pa = t["paths"].sort_values("score", ascending=False)
    single = pa[~pa["heads"].str.contains(r"\+")]
    topp = (int(single.iloc[0]["layer"]), int(single.iloc[0]["head"]))
    prev_row = single[(single.layer == prev[0]) & (single["head"] == prev[1])]
    prev_score = float(prev_row["score"].iloc[0])
    together = pa[pa["heads"].str.contains(r"\+")]
    extra = (f"; {together.iloc[0]['heads']} together: {together.iloc[0]['score']:.2f}" if len(together) else "")
    best = max(prev_score, float(together["score"].max()) if len(together) else prev_score)
    out.append(dict(model=model_label, step="3 path to the induction head's keys",
                    predicted=f"the previous-token head(s) -> {label(ind)} keys restore the most, and much",
                    measured=f"top single head: {label(topp)} ({single.iloc[0]['score']:.2f}); {label(prev)}: {prev_score:.2f}{extra}",
                    verdict="CONSISTENT" if topp in prevs and best >= 0.3 else ("PARTLY" if topp in prevs else "NOT SEEN")))
    k = comp[comp["mode"] == "K"].reset_index(drop=True)
    row = k[(k.sender_layer == prev[0]) & (k.sender_head == prev[1]) & (k.receiver_layer == ind[0]) & (k.receiver_head == ind[1])]
    rank = int(row.index[0]) + 1
    over = float(row["over_baseline"].iloc[0])
    out.append(dict(model=model_label, step="4 K-composition (weights)",
                    predicted="the pair is among the top 3 of all pairs, well above random",
                    measured=f"rank {rank} of {len(k)}, score {row['score'].iloc[0]:.3f} = {over:.1f}x the random baseline "
                             f"{row['baseline'].iloc[0]:.3f}",
                    verdict="CONSISTENT" if rank <= 3 and over > 2 else "NOT SEEN"))
    return out


def parser() -> ArgumentParser:
    """The script's arguments (the defaults are the claims table's settings)."""
    p = script_parser(SCRIPT, __doc__)
    p.set_defaults(models=DEFAULT_MODELS)
    p.add_argument("--texts", type=int, default=len(NAME_TEXTS), help="how many of the name texts to trace")
    return p


def measure(models: list[NamedModel], args: Namespace) -> dict[str, Any]:
    """{"models": model, preset, n_blocks; "traced": model -> (previous-token heads, induction head, the ``trace``
    tables: runs, resid, heads, paths), for every model of two blocks or more; "composition": K-composition of every
    head pair, per model}."""
    traced, comps = {}, []
    for nm in models:
        m = nm.model
        if m.cfg.n_layers < 2:
            continue
        prevs, ind = circuit_heads(m)
        traced[nm.label] = (prevs, ind, trace(m, NAME_TEXTS[: args.texts], prevs, ind))
        comps.append(composition_table(m, modes=("K",)).assign(model=nm.label))
    return {"models": models_frame(models), "traced": traced,
            "composition": pd.concat(comps, ignore_index=True) if comps else pd.DataFrame()}


def judge(measured: dict[str, Any]) -> list[Claim]:
    """One claim per model and step (``judge_steps``): the part is the step, ``ours`` what was measured, the evidence
    what the chapter's story predicts there and the tables it rests on."""
    out = []
    for label, (prevs, ind, t) in measured["traced"].items():
        comp = measured["composition"]
        comp = comp[comp["model"] == label].drop(columns="model").reset_index(drop=True)
        for v in judge_steps(label, t, comp, prevs, ind):
            out.append(Claim(claim=CLAIM, chapter="", ours=v["measured"], verdict=v["verdict"], command=COMMAND, model=label,
                             part=v["step"], evidence={"predicted": v["predicted"], "composition": comp, **t}))
    return out


def steps_frame(claims: list[Claim]) -> pd.DataFrame:
    """The claims as the table the script prints and writes: model, step, predicted, measured, verdict."""
    return pd.DataFrame([{"model": c.model, "step": c.part, "predicted": c.evidence["predicted"], "measured": c.ours,
                          "verdict": c.verdict} for c in claims], columns=["model", "step", "predicted", "measured", "verdict"])


def report(measured: dict[str, Any], claims: list[Claim], args: Namespace, out: Path) -> None:
    """Print each model's runs, patching tables and composition scores, then the steps' verdicts; write the CSVs."""
    frames = {"resid": [], "heads": [], "paths": []}
    for r in measured["models"].itertuples():
        name = r.model
        if name not in measured["traced"]:
            print(f"\n{name}: one block, no circuit of two heads to trace")
            continue
        prevs, ind, t = measured["traced"][name]
        print(f"\n{name}: previous-token head(s) {', '.join(label(h) for h in prevs)}, induction head {label(ind)} "
              "(by scores)")
        print_table(t["runs"], f"{name}: metric (log-probability of the name's second token, nats) on each run")
        print_table(t["resid"].round(3), f"{name}: residual patching score summed over each region, by layer (resid_pre)")
        print_table(t["heads"].sort_values("score", ascending=False).head(5).round(3), f"{name}: heads' outputs patched, top 5")
        print_table(t["paths"].sort_values("score", ascending=False).head(5).round(3),
                    f"{name}: path patching, each earlier head -> {label(ind)} keys, top 5")
        comp = measured["composition"]
        comp = comp[comp["model"] == name].drop(columns="model")
        print_table(comp.head(5).round(3), f"{name}: K-composition, top 5 pairs of {len(comp)}")
        for key in frames:
            frames[key].append(t[key].assign(model=name))
    if claims:
        vd = steps_frame(claims)
        print_table(vd, "the chapter's story, step by step")
        vd.to_csv(out / "verdicts.csv", index=False)
        for key, fname in (("resid", "trace_resid"), ("heads", "trace_heads"), ("paths", "trace_paths")):
            pd.concat(frames[key]).to_csv(out / f"{fname}.csv", index=False)
        measured["composition"].to_csv(out / "composition.csv", index=False)


def main(argv: list[str] | None = None) -> int:
    """Measure, judge and report; returns the exit status (2: no checkpoint could be loaded)."""
    return run_claim_script(SCRIPT, argv, parser, measure, judge, report,
                            wrote="verdicts.csv, trace_resid.csv, trace_heads.csv, trace_paths.csv, composition.csv")


if __name__ == "__main__":
    raise SystemExit(main())
