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
2. the circuit (sprout_interp.circuits.attention.find_induction_circuit): candidates ranked by head scores
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
from types import SimpleNamespace

import pandas as pd

from sprout_model.evaluation import repeated_tokens_batch
from sprout_interp.circuits.ablation import ablation_sweep, name_copying_under_ablation
from sprout_interp.circuits.attention import (
    PARTLY_SHARE,
    REPRODUCED_SHARE,
    ablation_effects,
    find_induction_circuit,
    head_label,
    heads_label,
    specificity,
)
from sprout_interp.report.cli import evidence_table, held_out, mean_reference, pct, print_table, save_figure, script_parser, start
from sprout_interp.plots.heads import sweep_heatmap
from sprout_interp.core.texts import TEXTS


def main(argv: list[str] | None = None) -> int:
    p = script_parser("head_ablation", __doc__)
    p.add_argument("--kind", choices=["mean", "zero", "resample"], default="mean",
                   help="how a head is ablated (the circuit's ablations use mean for resample)")
    p.add_argument("--n", type=int, default=4, help="held-out windows for the loss sweep and the circuit's held-out loss")
    p.add_argument("--length", type=int, default=256, help="tokens per held-out window")
    p.add_argument("--ref-n", type=int, default=16, help="held-out windows for the mean-ablation reference")
    p.add_argument("--seq-len", type=int, default=64, help="random tokens per copy for the copying sweep")
    p.add_argument("--batch", type=int, default=8, help="rows of repeated random tokens")
    p.add_argument("--seed", type=int, default=0, help="seed of the random tokens and the held-out sample")
    p.add_argument("--threshold", type=float, default=0.3, help="score a head needs to count as previous-token / induction head")
    p.add_argument("--min-specificity", type=float, default=3.0,
                   help="a head whose removal takes less than this many times more of the copying than of the model's "
                        "held-out ability breaks the model rather than copying")
    p.add_argument("--top", type=int, default=5, help="heads listed per sweep")
    a = p.parse_args(argv)
    t0 = time.time()
    started = start("head_ablation", a)
    if started is None:
        return 2
    models, out = started

    sweeps, names, evidence, verdicts = [], [], [], []
    for nm in models:
        t = time.time()
        m = nm.model
        text = held_out(m, SimpleNamespace(n=a.n, length=a.length, seed=a.seed))
        text_label = f"{a.n} held-out windows x {a.length} tokens"
        if text is None:
            text, text_label = list(TEXTS.values()), "the three ready-made texts"
        means = mean_reference(m, a.ref_n, a.length, a.seed + 1) if a.kind in ("mean", "resample") else None
        rep = repeated_tokens_batch(m.cfg.d_vocab, a.seq_len, a.batch, a.seed)
        runs = [("loss", text, f"loss on {text_label} (nats)"),
                ("copying_ratio", rep, f"copying ratio on {a.batch} x {a.seq_len} random tokens repeated twice")]
        done = {}
        for metric, toks, label in runs:
            sw = ablation_sweep(m, toks, metric, kind=a.kind, reference=means if a.kind == "mean" else None, attribution=True)
            sw.insert(0, "model", nm.label)
            done[metric] = sw
        loss_sw, copy_sw = done["loss"], done["copying_ratio"]
        spec = _sweep_specificity(loss_sw, copy_sw, m.cfg.d_vocab)
        for metric, _, label in runs:
            sw = done[metric]
            sw["specificity"] = spec["specificity"].to_numpy()
            sweeps.append(sw)
            top = sw.sort_values("change", ascending=False).head(a.top)
            shown = pd.DataFrame({"head": [head_label(l, h) for l, h in zip(top["layer"], top["head"])],
                                  "ablated": top["ablated"].map("{:.4f}".format), "change": top["change"].map("{:+.4f}".format),
                                  "attribution estimate": top["estimate"].map("{:+.4f}".format)})
            note = ""
            if metric == "copying_ratio":
                shown["held-out loss change"] = [f"{v:+.3f}" for v in spec.loc[top.index, "loss_change"]]
                shown["specificity"] = [f"{v:.1f}" for v in spec.loc[top.index, "specificity"]]
                note = ("; specificity: share of the copying gain removed (ratio rise / (1 - clean)) over share of the "
                        f"held-out ability removed (loss rise / (ln {m.cfg.d_vocab:,} - clean loss)); below "
                        f"{a.min_specificity:g} the head breaks the model")
            print_table(shown, f"{nm.label}: {a.kind}-ablating one head, {label}: clean {sw.attrs['clean']:.4f}; "
                               f"the {a.top} heads whose removal raises it most; attribution patching vs exact: Spearman "
                               f"{sw.attrs['spearman']:.2f}{note}")
            save_figure(sweep_heatmap(sw, title=f"{nm.label}: {a.kind}-ablating one head: change in {label} "
                                                f"(clean {sw.attrs['clean']:.3f})"),
                        out / f"sweep_{metric}_{_slug(nm.label)}")

        ckind = a.kind if a.kind in ("mean", "zero") else "mean"
        c = find_induction_circuit(m, seq_len=a.seq_len, batch=a.batch, seed=a.seed, threshold=a.threshold, kind=ckind,
                                   reference=means if ckind == "mean" else None, held_out=text,
                                   min_specificity=a.min_specificity)
        c.model = nm.label
        ind = (c.induction_layer, c.induction_head)
        used = {hd for pairs in c.evidence["head_pairs"] for hd in pairs}
        others = [(c.induction_layer, h) for h in range(m.cfg.n_heads) if (c.induction_layer, h) not in used]
        ev = c.evidence
        if others:
            ctrl = ablation_effects(m, {"control": [others[-1]]}, induction_head=ind, kind=ckind,
                                    reference=means if ckind == "mean" else None, held_out=text, seed=a.seed)
            row = ctrl[ctrl["condition"] == "control"].assign(role="control (a head of the induction head's block)", chosen=False)
            ev = pd.concat([ev, row], ignore_index=True)
            ev.attrs.update(c.evidence.attrs)
            c.evidence = ev
        table = evidence_table(c)
        print(f"\ncircuit: {c.summary()}")
        print_table(table, f"{nm.label}: each candidate head {ckind}-ablated alone, then together: name copying (mean "
                           "P(each later token of a name) over the five names, 2nd occurrence, 1st in brackets), the share "
                           "of its gain removed, held-out loss change (nats/token), specificity, and the induction head's "
                           "induction score (repeated random tokens)")
        evidence.append(ev.assign(model=nm.label))
        conditions = {r.condition: list(r.head_pairs) for r in ev.itertuples()}
        nc = name_copying_under_ablation(m, conditions, kind=ckind, reference=means if ckind == "mean" else None)
        nc["heads"] = nc["condition"].map(lambda cond: heads_label(conditions[cond]))
        nc.insert(0, "model", nm.label)
        names.append(nc)

        # heads whose removal raises the copying ratio by breaking the model: not specific, and more than a little
        breaks = (spec["copying_removed"] >= c.min_share) & ~spec["specificity"].map(
            lambda v: v == math.inf or (v == v and v >= a.min_specificity))
        ranked = spec[~breaks].sort_values("copy_change", ascending=False)
        order = list(zip(ranked["layer"], ranked["head"]))
        verdicts.append(dict(model=nm.label, circuit=c, ranks={hd: order.index(hd) + 1 for hd in c.heads() if hd in order},
                             n=len(order), breakers=spec[breaks], top=order[: len(c.heads())],
                             sp_loss=loss_sw.attrs["spearman"], sp_copy=copy_sw.attrs["spearman"], kind=ckind))
        print(f"[{nm.label}: {time.time() - t:.1f}s]", file=sys.stderr)

    pd.concat(sweeps, ignore_index=True).to_csv(out / "sweeps.csv", index=False)
    pd.concat(evidence, ignore_index=True).to_csv(out / "circuit.csv", index=False)
    pd.concat(names, ignore_index=True).to_csv(out / "name_copying.csv", index=False)

    print(f"\n== verdicts == (each part judged by its own ablation: REPRODUCED when it removes >= {pct(REPRODUCED_SHARE)} of "
          f"the name-copying gain (second minus first occurrence) with specificity >= {a.min_specificity:g} (and, for the "
          f"previous-token part, lowers the induction head's induction score); PARTLY at >= {pct(PARTLY_SHARE)}; "
          "the circuit is REPRODUCED only when both parts are)")
    for v in verdicts:
        c = v["circuit"]
        parts = c.verdicts()
        word, why = parts["previous-token"]
        print(f"- {v['model']}: previous-token part ({c.prev_label if c.prev_tokens else 'none confirmed'}), "
              f"by its own {v['kind']} ablation: {word}: {why}")
        word, why = parts["induction"]
        print(f"- {v['model']}: induction part ({c.induction_label}), by its own {v['kind']} ablation: {word}: {why}")
        together = c.row("the circuit together")
        both = "" if together is None else f"; all {int(together['n_heads'])} together remove {pct(float(together['copying_removed']), 1)}"
        print(f"- {v['model']}: a previous-token head and an induction head carry the copying: {c.verdict()}: "
              f"{heads_label(c.heads()) if c.prev_tokens else c.induction_label}{both}")
        k = len(c.heads())
        ranks = ", ".join(f"{head_label(*hd)} {v['ranks'].get(hd, 'breaks the model')}" for hd in c.heads())
        hit = set(v["top"]) == set(c.heads())
        claim = (f"{'REPRODUCED' if hit else 'NOT reproduced'}: ranks by copying-ratio increase among the {v['n']} heads whose "
                 f"removal does not break the model: {ranks}" + ("" if hit else f"; the top {k}: {heads_label(v['top'])}"))
        b = v["breakers"]
        if len(b):
            claim += "; left out as breaking the model: " + ", ".join(
                f"{head_label(int(r.layer), int(r.head))} (copying ratio {r.copy_change:+.3f}, held-out loss "
                f"{r.loss_change:+.2f} nats, specificity {r.specificity:.1f})" for r in b.itertuples())
        if not c.found:
            claim = "NOT reproduced: no circuit was confirmed (see the two parts above)"
        print(f"- {v['model']}: the circuit's heads are the heads whose removal hurts in-context copying (random tokens) "
              f"most: {claim}")
        print(f"- {v['model']}: attribution patching ranks heads like the exact sweep (Spearman): "
              f"loss {v['sp_loss']:.2f}, copying ratio {v['sp_copy']:.2f}")
    print(f"\nwrote {out}/sweeps.csv, circuit.csv, name_copying.csv, sweep_*.html in {time.time() - t0:.1f}s")
    return 0


def _sweep_specificity(loss_sw: pd.DataFrame, copy_sw: pd.DataFrame, d_vocab: int) -> pd.DataFrame:
    """Per head: copying-ratio change, share of the copying gain removed ((ablated - clean) / (1 - clean): a
    ratio of 1 is no copying), held-out loss change, and specificity (``sprout_interp.circuits.attention.specificity``)."""
    clean_ratio, clean_loss = float(copy_sw.attrs["clean"]), float(loss_sw.attrs["clean"])
    gain = 1.0 - clean_ratio
    rows = []
    for (l, h, cc), lc in zip(copy_sw[["layer", "head", "change"]].itertuples(index=False), loss_sw["change"]):
        removed = cc / gain if gain > 0 else float("nan")
        _, sp = specificity(removed, float(lc), clean_loss, d_vocab)
        rows.append(dict(layer=int(l), head=int(h), copy_change=float(cc), copying_removed=removed, loss_change=float(lc),
                         specificity=sp))
    return pd.DataFrame(rows, index=copy_sw.index)


def _slug(s: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in s).strip("_")


if __name__ == "__main__":
    sys.exit(main())
