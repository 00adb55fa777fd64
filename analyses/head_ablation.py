"""Claim (chapter, "Eight floors and the way out"): gpt-4 copies the invented name at its second
occurrence with "the very pair of heads from the previous chapter, a previous-token head in layer 2 and
an induction head in layer 3". Remove those heads and the copying should go.

    python analyses/head_ablation.py                            # gpt-1, gpt-4, sprout (shipped)
    python analyses/head_ablation.py --models runs/gpt-4/checkpoint --kind zero

For every checkpoint:
1. a sweep ablating each head alone (--kind: mean over held-out text by default, or zero / resample):
   the change in the loss on held-out text (--n windows of --length tokens) and in the copying ratio
   (loss on the second copy / loss on the first) on repeated random tokens (--batch rows of --seq-len
   tokens, twice), each beside the attribution-patching estimate and their rank correlation, and each
   head's specificity (the share of the copying it removes against the share of the model's held-out
   ability it removes), so a head whose removal breaks the model is not taken for a copying head;
2. the circuit (sprout_interp.circuits.induction.find_induction_circuit): candidates ranked by head scores
   (previous-token heads by the weaker of their scores on random tokens and on natural text), each
   ablated alone, then together, measuring invented-name copying (sprout_model.evaluation.NAME_TEXTS:
   the mean probability of each name's later tokens at its second occurrence), the induction head's
   induction score and the held-out loss; a control head of the induction head's block beside them.
   The previous-token part and the induction part each get a verdict from their own ablation.
Tables give ``block`` (counted from 1, the chapter's "layer N") and ``layer`` (0-indexed, code); a head
reads "block 2 head 0 (layer 1)".
Writes sweeps.csv, circuit.csv, name_copying.csv, sweep_<metric>_<model>.html and plotly.min.js (shared
by the figures) into out/head_ablation/.
"""
from __future__ import annotations

import math
import sys
import time
from argparse import ArgumentParser, Namespace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd

from sprout_interp.circuits.ablation import ablation_sweep, name_copying_under_ablation
from sprout_interp.circuits.evidence import ablation_effects, specificity
from sprout_interp.circuits.heads import head_label, heads_label
from sprout_interp.circuits.induction import PARTLY_SHARE, REPRODUCED_SHARE, find_induction_circuit
from sprout_interp.core.texts import TEXTS
from sprout_interp.plots.heads import sweep_heatmap
from sprout_interp.report.claims import Claim, verdict_lines
from sprout_interp.report.cli import (
    NamedModel,
    candidates_left_out,
    evidence_table,
    held_out,
    held_out_arguments,
    mean_reference,
    pct,
    print_table,
    run_claim_script,
    save_figure,
    script_parser,
    slug,
)
from sprout_model.evaluation import repeated_tokens_batch

SCRIPT = "head_ablation"
COMMAND = f".venv/bin/python analyses/{SCRIPT}.py"
CARRY = "a previous-token head and an induction head carry the copying"
CARRY_CHAPTER = ("\"a previous-token head in layer 2 and an induction head in layer 3\" (gpt-4): remove those heads and the "
                 "copying should go")
RANKS = "the circuit's heads are the heads whose removal hurts in-context copying (random tokens) most"
SPEARMAN = "attribution patching ranks heads like the exact sweep (Spearman)"


def parser() -> ArgumentParser:
    """The script's arguments (the defaults are the claims table's settings)."""
    p = script_parser(SCRIPT, __doc__)
    p.add_argument("--kind", choices=["mean", "zero", "resample"], default="mean",
                   help="how a head is ablated (the circuit's ablations use mean for resample)")
    held_out_arguments(p, 4, n_help="held-out windows for the loss sweep and the circuit's held-out loss",
                       seed_help="seed of the random tokens and the held-out sample")
    p.add_argument("--ref-n", type=int, default=16, help="held-out windows for the mean-ablation reference")
    p.add_argument("--seq-len", type=int, default=64, help="random tokens per copy for the copying sweep")
    p.add_argument("--batch", type=int, default=8, help="rows of repeated random tokens")
    p.add_argument("--threshold", type=float, default=0.3, help="score a head needs to count as previous-token / induction head")
    p.add_argument("--min-specificity", type=float, default=3.0,
                   help="a head whose removal takes less than this many times more of the copying than of the model's "
                        "held-out ability breaks the model rather than copying")
    p.add_argument("--top", type=int, default=5, help="heads listed per sweep")
    return p


def measure(models: list[NamedModel], args: Namespace, claims_only: bool = False) -> dict[str, Any]:
    """{"settings": kind, circuit kind, min_specificity and the sweeps' labels; "sweeps": one row per model, metric
    ("loss", "copying_ratio") and head (change when the head is ablated alone, attribution estimate, specificity);
    "specificity": per model and head the copying-ratio change, the share of the copying gain removed, the held-out
    loss change and specificity; "circuits": model -> its ``InductionCircuit`` (evidence: each candidate ablated
    alone and together, and a control head); "names": name copying under each of those ablations}.

    ``claims_only``: what the verdicts need and no more: no attribution estimates, control head or name-copying
    table."""
    ckind = args.kind if args.kind in ("mean", "zero") else "mean"
    sweeps, specs, circuits, names, labels = [], [], {}, [], {}
    for nm in models:
        t = time.time()
        m = nm.model
        text = held_out(m, SimpleNamespace(n=args.n, length=args.length, seed=args.seed))
        text_label = f"{args.n} held-out windows x {args.length} tokens"
        if text is None:
            text, text_label = list(TEXTS.values()), "the three ready-made texts"
        means = mean_reference(m, args.ref_n, args.length, args.seed + 1) if args.kind in ("mean", "resample") else None
        rep = repeated_tokens_batch(m.cfg.d_vocab, args.seq_len, args.batch, args.seed)
        labels[nm.label] = {"loss": f"loss on {text_label} (nats)",
                            "copying_ratio": f"copying ratio on {args.batch} x {args.seq_len} random tokens repeated twice"}
        done = {}
        for metric, toks in (("loss", text), ("copying_ratio", rep)):
            sw = ablation_sweep(m, toks, metric, kind=args.kind, reference=means if args.kind == "mean" else None,
                                attribution=not claims_only)
            sw.insert(0, "model", nm.label)
            done[metric] = sw
        spec = _sweep_specificity(done["loss"], done["copying_ratio"], m.cfg.d_vocab)
        for sw in done.values():
            sw["specificity"] = spec["specificity"].to_numpy()
            sweeps.append(sw)
        specs.append(spec.assign(model=nm.label, clean_loss=done["loss"].attrs["clean"], d_vocab=m.cfg.d_vocab,
                                 clean_ratio=done["copying_ratio"].attrs["clean"],
                                 sp_loss=done["loss"].attrs.get("spearman", math.nan),
                                 sp_copy=done["copying_ratio"].attrs.get("spearman", math.nan)))

        c = find_induction_circuit(m, seq_len=args.seq_len, batch=args.batch, seed=args.seed, threshold=args.threshold,
                                   kind=ckind, reference=means if ckind == "mean" else None, held_out=text,
                                   min_specificity=args.min_specificity)
        c.model = nm.label
        circuits[nm.label] = c
        if claims_only:
            continue
        ind = (c.induction_layer, c.induction_head)
        used = {hd for pairs in c.evidence["head_pairs"] for hd in pairs}
        others = [(c.induction_layer, h) for h in range(m.cfg.n_heads) if (c.induction_layer, h) not in used]
        ev = c.evidence
        if others:
            ctrl = ablation_effects(m, {"control": [others[-1]]}, induction_head=ind, kind=ckind,
                                    reference=means if ckind == "mean" else None, held_out=text, seed=args.seed)
            row = ctrl[ctrl["condition"] == "control"].assign(role="control (a head of the induction head's block)", chosen=False)
            ev = pd.concat([ev, row], ignore_index=True)
            ev.attrs.update(c.evidence.attrs)
            c.evidence = ev
        conditions = {r.condition: list(r.head_pairs) for r in ev.itertuples()}
        nc = name_copying_under_ablation(m, conditions, kind=ckind, reference=means if ckind == "mean" else None)
        nc["heads"] = nc["condition"].map(lambda cond, conditions=conditions: heads_label(conditions[cond]))
        nc.insert(0, "model", nm.label)
        names.append(nc)
        print(f"[{nm.label}: {time.time() - t:.1f}s]", file=sys.stderr)
    return {"settings": {"kind": args.kind, "circuit_kind": ckind, "min_specificity": args.min_specificity,
                         "labels": labels},
            "sweeps": pd.concat(sweeps, ignore_index=True), "specificity": pd.concat(specs, ignore_index=True),
            "circuits": circuits, "names": pd.concat(names, ignore_index=True) if names else pd.DataFrame()}


def judge(measured: dict[str, Any]) -> list[Claim]:
    """Per model, from its circuit and sweeps: the previous-token part and the induction part, each by its own
    ablation (``InductionCircuit.verdicts``: REPRODUCED when it removes >= 50% of the name-copying gain with
    specificity >= min_specificity, and for the previous-token part lowers the induction head's induction score;
    PARTLY at >= 33%; else NOT established); both carry the copying (REPRODUCED only when both parts are); the
    circuit's heads are the top heads of the copying-ratio sweep among those whose removal does not break the
    model; the previous-token candidates the ablations left out; and, when measured, how attribution patching
    ranks the heads."""
    st = measured["settings"]
    kind, min_spec = st["circuit_kind"], st["min_specificity"]
    out = []
    for label, c in measured["circuits"].items():
        spec = measured["specificity"][measured["specificity"]["model"] == label]
        ev = {"evidence": c.evidence, "specificity": spec}
        parts = c.verdicts()
        prev = c.prev_label if c.prev_tokens else "none confirmed"
        for part, name in (("previous-token", f"previous-token part ({prev})"), ("induction", f"induction part ({c.induction_label})")):
            out.append(Claim(claim=CARRY, chapter=CARRY_CHAPTER, verdict=parts[part][0], ours=parts[part][1], command=COMMAND,
                             model=label, part=f"{name}, by its own {kind} ablation", evidence=ev))
        together = c.row("the circuit together")
        both = "" if together is None else f"; all {int(together['n_heads'])} together remove {pct(float(together['copying_removed']), 1)}"
        out.append(Claim(claim=CARRY, chapter=CARRY_CHAPTER, verdict=c.verdict(), command=COMMAND, model=label, evidence=ev,
                         part="both parts", ours=f"{heads_label(c.heads()) if c.prev_tokens else c.induction_label}{both}"))
        for e in candidates_left_out(c).itertuples():
            out.append(Claim(claim=CARRY, chapter=CARRY_CHAPTER, verdict="not a previous-token head of the circuit",
                             command=COMMAND, model=label, part=f"candidate {e.heads}", evidence=ev,
                             ours=f"alone removes {pct(e.copying_removed, 1)} of the name-copying gain (2nd occurrence "
                                  f"{pct(e.copying_second, 1)}), held-out loss {e.loss_change:+.3f} nats"))

        # heads whose removal raises the copying ratio by breaking the model: not specific, and more than a little
        breaks = (spec["copying_removed"] >= c.min_share) & ~spec["specificity"].map(
            lambda v: v == math.inf or (not math.isnan(v) and v >= min_spec))
        ranked = spec[~breaks].sort_values("copy_change", ascending=False)
        order = list(zip(ranked["layer"], ranked["head"], strict=True))
        rank = {hd: order.index(hd) + 1 for hd in c.heads() if hd in order}
        top = order[: len(c.heads())]
        hit = set(top) == set(c.heads())
        ranks = ", ".join(f"{head_label(*hd)} {rank.get(hd, 'breaks the model')}" for hd in c.heads())
        ours = (f"ranks by copying-ratio increase among the {len(order)} heads whose removal does not break the model: {ranks}"
                + ("" if hit else f"; the top {len(c.heads())}: {heads_label(top)}"))
        b = spec[breaks]
        if len(b):
            ours += "; left out as breaking the model: " + ", ".join(
                f"{head_label(int(r.layer), int(r.head))} (copying ratio {r.copy_change:+.3f}, held-out loss "
                f"{r.loss_change:+.2f} nats, specificity {r.specificity:.1f})" for r in b.itertuples())
        verdict = "REPRODUCED" if hit else "NOT reproduced"
        if not c.found:
            verdict, ours = "NOT reproduced", "no circuit was confirmed (see the two parts above)"
        out.append(Claim(claim=RANKS, chapter="", verdict=verdict, ours=ours, command=COMMAND, model=label, evidence=ev))
        sp_loss, sp_copy = float(spec["sp_loss"].iloc[0]), float(spec["sp_copy"].iloc[0])
        if not (math.isnan(sp_loss) and math.isnan(sp_copy)):
            out.append(Claim(claim=SPEARMAN, chapter="", verdict="measured (no chapter figure)", command=COMMAND, model=label,
                             ours=f"loss {sp_loss:.2f}, copying ratio {sp_copy:.2f}", headline=False, evidence=ev))
    return out


def report(measured: dict[str, Any], claims: list[Claim], args: Namespace, out: Path) -> None:
    """Print each model's sweeps, circuit and evidence, and the verdict lines; write the CSVs and figures."""
    st, sweeps = measured["settings"], measured["sweeps"]
    ckind = st["circuit_kind"]
    for label, c in measured["circuits"].items():
        spec = measured["specificity"][measured["specificity"]["model"] == label].reset_index(drop=True)
        d_vocab = int(spec["d_vocab"].iloc[0])
        for metric, text in st["labels"][label].items():
            sw = sweeps[(sweeps["model"] == label) & (sweeps["metric"] == metric)].reset_index(drop=True)
            clean = float(sw["clean"].iloc[0])
            sw.attrs.update(metric=metric, kind=args.kind, clean=clean)  # what the heatmap's title and axis read
            top = sw.sort_values("change", ascending=False).head(args.top)
            shown = pd.DataFrame({"head": [head_label(l, h) for l, h in zip(top["layer"], top["head"], strict=True)],
                                  "ablated": top["ablated"].map("{:.4f}".format), "change": top["change"].map("{:+.4f}".format),
                                  "attribution estimate": top["estimate"].map("{:+.4f}".format)})
            note = ""
            if metric == "copying_ratio":
                shown["held-out loss change"] = [f"{v:+.3f}" for v in spec.loc[top.index, "loss_change"]]
                shown["specificity"] = [f"{v:.1f}" for v in spec.loc[top.index, "specificity"]]
                note = ("; specificity: share of the copying gain removed (ratio rise / (1 - clean)) over share of the "
                        f"held-out ability removed (loss rise / (ln {d_vocab:,} - clean loss)); below "
                        f"{args.min_specificity:g} the head breaks the model")
            sp = float(spec["sp_loss" if metric == "loss" else "sp_copy"].iloc[0])
            print_table(shown, f"{label}: {args.kind}-ablating one head, {text}: clean {clean:.4f}; "
                               f"the {args.top} heads whose removal raises it most; attribution patching vs exact: Spearman "
                               f"{sp:.2f}{note}")
            save_figure(sweep_heatmap(sw, title=f"{label}: {args.kind}-ablating one head: change in {text} "
                                                f"(clean {clean:.3f})"),
                        out / f"sweep_{metric}_{slug(label)}")
        print(f"\ncircuit: {c.summary()}")
        print_table(evidence_table(c), f"{label}: each candidate head {ckind}-ablated alone, then together: name copying "
                                       "(mean P(each later token of a name) over the five names, 2nd occurrence, 1st in "
                                       "brackets), the share of its gain removed, held-out loss change (nats/token), "
                                       "specificity, and the induction head's induction score (repeated random tokens)")
    sweeps.to_csv(out / "sweeps.csv", index=False)
    pd.concat([c.evidence.assign(model=label) for label, c in measured["circuits"].items()],
              ignore_index=True).to_csv(out / "circuit.csv", index=False)
    measured["names"].to_csv(out / "name_copying.csv", index=False)
    print(f"\n== verdicts == (each part judged by its own ablation: REPRODUCED when it removes >= {pct(REPRODUCED_SHARE)} of "
          f"the name-copying gain (second minus first occurrence) with specificity >= {args.min_specificity:g} (and, for the "
          f"previous-token part, lowers the induction head's induction score); PARTLY at >= {pct(PARTLY_SHARE)}; "
          "the circuit is REPRODUCED only when both parts are)")
    print(verdict_lines(claims))


def main(argv: list[str] | None = None) -> int:
    """Measure, judge and report; returns the exit status (2: no checkpoint could be loaded)."""
    return run_claim_script(SCRIPT, argv, parser, measure, judge, report, wrote="sweeps.csv, circuit.csv, name_copying.csv, sweep_*.html")


def _sweep_specificity(loss_sw: pd.DataFrame, copy_sw: pd.DataFrame, d_vocab: int) -> pd.DataFrame:
    """Per head: copying-ratio change, share of the copying gain removed ((ablated - clean) / (1 - clean): a
    ratio of 1 is no copying), held-out loss change, and specificity (``sprout_interp.circuits.evidence.specificity``)."""
    clean_ratio, clean_loss = float(copy_sw.attrs["clean"]), float(loss_sw.attrs["clean"])
    gain = 1.0 - clean_ratio
    rows = []
    for (l, h, cc), lc in zip(copy_sw[["layer", "head", "change"]].itertuples(index=False), loss_sw["change"]):
        removed = cc / gain if gain > 0 else float("nan")
        _, sp = specificity(removed, float(lc), clean_loss, d_vocab)
        rows.append(dict(layer=int(l), head=int(h), copy_change=float(cc), copying_removed=removed, loss_change=float(lc),
                         specificity=sp))
    return pd.DataFrame(rows, index=copy_sw.index)



if __name__ == "__main__":
    sys.exit(main())
