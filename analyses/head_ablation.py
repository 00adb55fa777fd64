"""Claim (chapter, "Eight floors and the way out"): gpt-4 copies the invented name at its second
occurrence with "the very pair of heads from the previous chapter, a previous-token head in layer 2 and
an induction head in layer 3". Remove those heads and the copying should go.

    python analyses/head_ablation.py                            # gpt-1, gpt-4, sprout (shipped)
    python analyses/head_ablation.py --models runs/gpt-4/checkpoint --kind zero

For every checkpoint:
1. a sweep ablating each head alone (--kind: mean over held-out text by default, or zero / resample):
   the change in the loss on held-out text (--n windows of --length tokens) and in the copying ratio
   (loss on the second copy / loss on the first) on repeated random tokens (--batch rows of --seq-len
   tokens, twice), each beside the attribution-patching estimate and their rank correlation;
2. the circuit found by head scores (best previous-token head, best induction head), and the effect of
   ablating them, alone and together, on invented-name copying (sprout_model.evaluation.NAME_TEXTS:
   the mean probability of each name's later tokens at its second occurrence), against a control head.
Tables give ``block`` (counted from 1, the chapter's "layer N") and ``layer`` (0-indexed, code).
Writes sweeps.csv, name_copying.csv and sweep_<metric>_<model>.html into out/head_ablation/.
"""
from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import pandas as pd

from sprout_model.evaluation import repeated_tokens_batch
from sprout_interp.ablation import ablation_sweep, head_means, name_copying_under_ablation
from sprout_interp.attention import find_induction_circuit
from sprout_interp.cli import held_out, pct, print_table, script_parser, start
from sprout_interp.plots import save_figure
from sprout_interp.plots_heads import sweep_heatmap
from sprout_interp.texts import TEXTS

REPRODUCED, PARTLY = 0.5, 0.2  # share of the name-copying gain removed by ablating the pair
NO_COPYING = 0.05  # a clean gain (second - first occurrence) below this: the model does not copy names


def main(argv: list[str] | None = None) -> int:
    p = script_parser("head_ablation", __doc__)
    p.add_argument("--kind", choices=["mean", "zero", "resample"], default="mean", help="how a head is ablated")
    p.add_argument("--n", type=int, default=4, help="held-out windows for the loss sweep")
    p.add_argument("--length", type=int, default=256, help="tokens per held-out window")
    p.add_argument("--ref-n", type=int, default=16, help="held-out windows for the mean-ablation reference")
    p.add_argument("--seq-len", type=int, default=64, help="random tokens per copy for the copying sweep")
    p.add_argument("--batch", type=int, default=8, help="rows of repeated random tokens")
    p.add_argument("--seed", type=int, default=0, help="seed of the random tokens and the held-out sample")
    p.add_argument("--threshold", type=float, default=0.3, help="score a head needs to count as previous-token / induction head")
    p.add_argument("--top", type=int, default=5, help="heads listed per sweep")
    a = p.parse_args(argv)
    t0 = time.time()
    started = start("head_ablation", a)
    if started is None:
        return 2
    models, out = started

    sweeps, names, verdicts = [], [], []
    for nm in models:
        t = time.time()
        m = nm.model
        text = held_out(m, SimpleNamespace(n=a.n, length=a.length, seed=a.seed))
        text_label = f"{a.n} held-out windows x {a.length} tokens"
        if text is None:
            text, text_label = list(TEXTS.values()), "the three ready-made texts"
        reference = None
        if a.kind == "mean":
            ref = held_out(m, SimpleNamespace(n=a.ref_n, length=a.length, seed=a.seed + 1))
            reference = head_means(m, ref if ref is not None else list(TEXTS.values()))
        rep = repeated_tokens_batch(m.cfg.d_vocab, a.seq_len, a.batch, a.seed)
        runs = [("loss", text, f"loss on {text_label} (nats)"),
                ("copying_ratio", rep, f"copying ratio on {a.batch} x {a.seq_len} random tokens repeated twice")]
        for metric, toks, label in runs:
            sw = ablation_sweep(m, toks, metric, kind=a.kind, reference=reference, attribution=True)
            sw.insert(0, "model", nm.label)
            sweeps.append(sw)
            top = sw.sort_values("change", ascending=False).head(a.top)
            shown = pd.DataFrame({"block": top["block"], "layer": top["layer"], "head": top["head"],
                                  "ablated": top["ablated"].map("{:.4f}".format), "change": top["change"].map("{:+.4f}".format),
                                  "attribution estimate": top["estimate"].map("{:+.4f}".format)})
            print_table(shown, f"{nm.label}: {a.kind}-ablating one head, {label}: clean {sw.attrs['clean']:.4f}; "
                               f"the {a.top} heads whose removal raises it most (block from 1, layer 0-indexed); "
                               f"attribution patching vs exact: Spearman {sw.attrs['spearman']:.2f}")
            save_figure(sweep_heatmap(sw, title=f"{nm.label}: {a.kind}-ablating one head: change in {label} "
                                                f"(clean {sw.attrs['clean']:.3f})"),
                        out / f"sweep_{metric}_{_slug(nm.label)}", png=False)
        copy_sweep = sweeps[-1]

        c = find_induction_circuit(m, seq_len=a.seq_len, batch=a.batch, seed=a.seed, threshold=a.threshold)
        c.model = nm.label
        prev = (c.prev_layer, c.prev_head)
        if not c.prev_earlier and c.prev_before_layer is not None:
            prev = (c.prev_before_layer, c.prev_before_head)  # the circuit needs it before the induction head
        ind = (c.induction_layer, c.induction_head)
        conditions = {"clean": [], "induction head": [ind], "previous-token head": [prev]}
        if prev != ind:
            conditions["both"] = [prev, ind]
        others = [h for h in range(m.cfg.n_heads) if (c.induction_layer, h) not in (ind, prev)]
        if others:
            conditions["control (another head of the induction head's block)"] = [(c.induction_layer, others[-1])]
        nc = name_copying_under_ablation(m, conditions, kind=a.kind, reference=reference)
        nc.insert(0, "model", nm.label)
        names.append(nc)
        mean_rows = nc[nc["name"] == "(mean)"].set_index("condition")
        table = pd.DataFrame({
            "ablated": list(mean_rows.index),
            "heads (L=layer, 0-indexed)": mean_rows["heads"].to_list(),
            "2nd occurrence": [pct(v, 1) for v in mean_rows["second"]],
            "1st occurrence": [pct(v, 1) for v in mean_rows["first"]],
        })
        print(f"circuit: {c.summary()}")
        print_table(table, f"{nm.label}: invented-name copying with heads {a.kind}-ablated: mean P(each later token of "
                           "the name), over the five names")

        rank = int((copy_sweep["change"] > copy_sweep.set_index(["layer", "head"]).loc[ind, "change"]).sum()) + 1
        clean2, clean1 = mean_rows.loc["clean", "second"], mean_rows.loc["clean", "first"]
        gain = clean2 - clean1
        key = "both" if "both" in mean_rows.index else "induction head"
        lost = (clean2 - mean_rows.loc[key, "second"]) / gain if gain > 0 else float("nan")
        verdicts.append(dict(model=nm.label, preset=nm.preset, blocks=m.cfg.n_layers, circuit=c, prev=prev, gain=gain, clean2=clean2,
                             clean1=clean1, pair=mean_rows.loc[key, "second"], lost=lost, key=key, rank=rank,
                             n=len(copy_sweep), found=c.found, sp_loss=sweeps[-2].attrs["spearman"],
                             sp_copy=copy_sweep.attrs["spearman"]))
        print(f"[{nm.label}: {time.time() - t:.1f}s]", file=sys.stderr)

    pd.concat(sweeps, ignore_index=True).to_csv(out / "sweeps.csv", index=False)
    pd.concat(names, ignore_index=True).to_csv(out / "name_copying.csv", index=False)

    print(f"\n== verdicts == (ablation: {a.kind}; the pair 'carries' name copying when ablating it removes >= "
          f"{pct(REPRODUCED)} of the gain from the first to the second occurrence, 'partly' at >= {pct(PARTLY)})")
    for v in verdicts:
        c = v["circuit"]
        pair = (f"previous-token head block {v['prev'][0] + 1} head {v['prev'][1]} + induction head block "
                f"{c.induction_block} head {c.induction_head}")
        nums = (f"name copying {pct(v['clean1'], 1)} at the 1st occurrence, {pct(v['clean2'], 1)} at the 2nd; "
                f"{pct(v['pair'], 1)} with {'both' if v['key'] == 'both' else 'the induction head'} ablated")
        if v["gain"] < NO_COPYING:
            verdict = "NOT reproduced (the model does not copy names: nothing for the heads to carry)"
        elif v["lost"] >= REPRODUCED:
            verdict = "REPRODUCED"
        elif v["lost"] >= PARTLY:
            verdict = "PARTLY"
        else:
            verdict = "NOT reproduced"
        lost = "" if v["lost"] != v["lost"] or v["gain"] < NO_COPYING else f" ({pct(v['lost'])} of the gain removed)"
        circ = "" if v["found"] else f" [no circuit at threshold {c.threshold:.2f}: induction score {c.induction_score:.2f}]"
        print(f"- {v['model']}: a previous-token head and an induction head carry the copying: {verdict}: {pair}; {nums}{lost}{circ}")
        print(f"- {v['model']}: the induction head is the head whose removal hurts in-context copying most: "
              f"{'REPRODUCED' if v['rank'] == 1 else 'NOT reproduced'}: it ranks {v['rank']} of {v['n']} "
              f"by copying-ratio increase")
        print(f"- {v['model']}: attribution patching ranks heads like the exact sweep (Spearman): "
              f"loss {v['sp_loss']:.2f}, copying ratio {v['sp_copy']:.2f}")
    print(f"\nwrote {out}/sweeps.csv, name_copying.csv, sweep_*.html in {time.time() - t0:.1f}s")
    return 0


def _slug(s: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in s).strip("_")


if __name__ == "__main__":
    sys.exit(main())
