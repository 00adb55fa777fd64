"""Claims about the sparse autoencoders shipped with Sprout (``model/checkpoints/sprout/saes/``):

1. quality: on the middle layer (layer 3 = block 4) the SAE recovers at least 90% of the loss at L0 <= 40
   (loss recovered = (CE zero-ablated - CE spliced) / (CE zero-ablated - CE clean), held-out text);
2. a feature fires on the second occurrence of an invented name (sprout_model.evaluation's ten name texts), not
   on the same tokens the first time, nor elsewhere; and whether name copying needs it: ablating it (clamped to
   0, error term kept) lowers name copying at the second occurrence by 5 points or more, and more than twice as
   much as ablating a feature that fires as often. Each of the five best-firing candidates is ablated alone,
   beside its own control of equal firing rate; the verdict names the one whose ablation moves copying most;
3. a feature tracks the previous token: one previous token carries most of its activation while the tokens it
   fires on vary, and it fires after that token far more than elsewhere.

    python analyses/sae_features.py                              # sprout, every layer with a shipped SAE
    python analyses/sae_features.py --layers 3 --n 16 --length 256 --threads 1

Quality on --n held-out windows of --length tokens (seed --seed); pages and previous-token search on 96 held-out
windows of 128 tokens. Tables: layer 0-indexed, block = layer + 1, feature = latent index, pos 0-based.
Writes quality.csv, second_name.csv, previous_token.csv, ablation.csv and a page (HTML) per named feature into
out/sae_features/.
"""
from __future__ import annotations

import sys
import time
from argparse import Namespace
from pathlib import Path

import pandas as pd

from sprout_interp.core.arguments import command_line
from sprout_interp.core.errors import SproutError
from sprout_interp.features.metrics import sae_quality
from sprout_interp.features.pages import feature_summary, feature_table, index_features
from sprout_interp.features.sae import available_saes, load_sae
from sprout_interp.features.search import (
    name_copying_with_features,
    previous_token_features,
    rate_matched_controls,
    second_name_features,
)
from sprout_interp.plots.features import activation_histogram, contexts_html, logit_effect_chart
from sprout_interp.report.claims import Claim, verdict_lines
from sprout_interp.report.cli import held_out_arguments, pct, print_table, save_figure, script_parser, start

SCRIPT = "sae_features"
COMMAND = f".venv/bin/python analyses/{SCRIPT}.py"
MIDDLE = 3  # Sprout's middle layer (8 blocks)
TARGET_RECOVERED, TARGET_L0 = 0.90, 40
SECOND_RATIO = 3.0  # "fires on the second occurrence": mean there >= 3x its mean at the first and elsewhere
PREV_SHARE, PREV_RATIO, PREV_DISTINCT = 0.5, 5.0, 5
CAUSAL_DROP = 0.05  # "copying needs it": ablating it alone lowers name copying by 5 points or more


def parser():
    p = script_parser(SCRIPT, __doc__)
    p.set_defaults(models=["sprout"])
    p.add_argument("--layers", type=int, nargs="+", default=None, help="layers (default: every shipped SAE)")
    held_out_arguments(p, 32, n_help="held-out windows for the quality metrics")
    return p


def measure(model, args: Namespace) -> dict:
    """Per layer: the quality row, the second-occurrence candidates, the previous-token candidates, name copying
    with the best second-occurrence feature (and controls of equal firing rate) ablated, and feature pages."""
    layers = args.layers or available_saes(model)
    out = {"quality": [], "second": [], "previous": [], "ablation": [], "pages": {}}
    for layer in layers:
        try:
            sae = load_sae(model, layer)
        except SproutError as e:
            print(f"layer {layer}: {e}", file=sys.stderr)
            continue
        out["quality"].append(sae_quality(model, sae, n=args.n, length=args.length, seed=args.seed))
        index = index_features(model, sae)
        second = second_name_features(model, sae, pieces="later", n=5)
        prev = previous_token_features(model, sae, index, n=5)
        candidates = [int(f) for f in second["feature"]]
        table = feature_table(model, sae, index)
        controls = rate_matched_controls(table, candidates)  # each candidate's closest firing rate
        conditions = {"clean": []}
        for f, c in zip(candidates, controls):  # each candidate alone, beside its own control
            conditions[f"feature {f}"] = [f]
            conditions[f"control {c} (for {f})"] = [c]
        conditions["top 3"] = candidates[:3]
        conditions["3 controls"] = controls[:3]
        abl = name_copying_with_features(model, sae, conditions)
        abl.insert(0, "layer", layer)
        abl.insert(1, "block", layer + 1)
        out["second"].append(second)
        out["previous"].append(prev)
        out["ablation"].append(abl)
        named = named_second_feature(second, abl)
        for f in {named, int(prev["feature"].iloc[0])}:
            out["pages"][(layer, f)] = feature_summary(model, sae, f, index)
    return {k: (pd.concat(v, ignore_index=True) if isinstance(v, list) and v else v) for k, v in out.items()}


def second_ratio(row) -> float:
    """A candidate's mean activation at a name's second occurrence over the larger of its means at the first
    occurrence and elsewhere."""
    return row["second"] / max(row["first"], row["elsewhere"], 1e-9)


def fires_on_second_occurrence(row) -> bool:
    """A candidate row fires on a name's second occurrence: its mean there is SECOND_RATIO x its mean at the first
    occurrence and elsewhere, in 7 or more of the ten name texts."""
    return second_ratio(row) >= SECOND_RATIO and row["texts_firing"] >= 7


def copying_drops(abl: pd.DataFrame, feature: int) -> tuple[float, float]:
    """(fall in name copying with the feature ablated alone, the same with its rate-matched control), in
    probability (0.05 = 5 points)."""
    sec = dict(zip(abl["condition"], abl["second"]))
    ctrl = next(v for k, v in sec.items() if k.endswith(f"(for {feature})"))
    return sec["clean"] - sec[f"feature {feature}"], sec["clean"] - ctrl


def named_second_feature(second: pd.DataFrame, abl: pd.DataFrame) -> int:
    """The candidate the verdict names: among those that fire on the second occurrence (>= SECOND_RATIO x, in 7 or
    more of the ten texts), the one whose ablation alone lowers name copying most; the top-ranked one if none
    does. Every candidate's own ablation and control are in the ablation table either way."""
    found = [int(r["feature"]) for _, r in second.iterrows() if fires_on_second_occurrence(r)]
    if not found:
        return int(second["feature"].iloc[0])
    return max(found, key=lambda f: copying_drops(abl, f)[0])


def judge(m: dict) -> list[Claim]:
    """One verdict per claim and layer, each from its own measurement (thresholds at the top of the script)."""
    claims = []
    q = m["quality"]
    for r in q.itertuples():
        ok = r.loss_recovered >= TARGET_RECOVERED and r.l0 <= TARGET_L0
        claims.append(Claim(
            claim=f"SAE recovers >= {pct(TARGET_RECOVERED)} of the loss at L0 <= {TARGET_L0}", chapter="",
            ours=f"{pct(r.loss_recovered, 1)} recovered at L0 {r.l0:.0f}, variance explained {pct(r.fve, 1)}",
            verdict=("MET" if ok else "NOT met") + ("" if r.layer == MIDDLE else " (side layer)"),
            command=COMMAND, model="sprout", part=f"layer {r.layer} (block {r.block})", headline=r.layer == MIDDLE))
    for layer, s in m["second"].groupby("layer"):
        abl = m["ablation"][m["ablation"]["layer"] == layer]
        named = named_second_feature(s, abl)
        top = s[s["feature"] == named].iloc[0]
        rank = int(list(s["feature"]).index(named)) + 1
        ratio = second_ratio(top)
        sec = dict(zip(abl["condition"], abl["second"]))
        clean = sec["clean"]
        drop, ctrl = copying_drops(abl, named)
        drop3, ctrl3 = clean - sec["top 3"], clean - sec["3 controls"]
        found = fires_on_second_occurrence(top)
        causal = drop >= CAUSAL_DROP and drop > 2 * max(ctrl, 0.0)
        effect = (f"ablated, name copying {pct(clean, 1)} -> {pct(clean - drop, 1)} (a control of equal firing rate: "
                  f"{-ctrl * 100:+.1f} points); the top three together {-drop3 * 100:+.1f} points (three controls "
                  f"{-ctrl3 * 100:+.1f})")
        claims.append(Claim(
            claim="a feature fires on the second occurrence of an invented name", chapter="",
            ours=(f"feature {named} (rank {rank} of {len(s)} by firing; the one whose ablation alone moves copying "
                  f"most): mean {top['second']:.2f} at 2nd-occurrence name tokens vs "
                  f"{top['first']:.2f} at the 1st and {top['elsewhere']:.2f} elsewhere ({ratio:.1f}x), in "
                  f"{int(top['texts_firing'])}/10 texts; {effect}"),
            verdict=("FOUND" if found else "NOT found") + ("" if not found else ", and copying needs it" if causal
                                                            else f" (a correlate: ablating it moves copying by less "
                                                                 f"than {CAUSAL_DROP * 100:.0f} points)"),
            command=COMMAND, model="sprout", part=f"layer {layer} (block {layer + 1})"))
    for layer, p in m["previous"].groupby("layer"):
        top = p.iloc[0]
        ratio = top["after"] / max(top["elsewhere"], 1e-9)
        found = top["prev_share"] >= PREV_SHARE and ratio >= PREV_RATIO and top["distinct_current"] >= PREV_DISTINCT
        claims.append(Claim(
            claim="a feature tracks the previous token", chapter="",
            ours=(f"feature {int(top['feature'])}: {pct(top['prev_share'])} of its activation follows "
                  f"{top['prev_token']!r} over {int(top['distinct_current'])} different current tokens (the most "
                  f"common one only {pct(top['cur_share'])}); mean {top['after']:.2f} after {top['prev_token']!r} "
                  f"vs {top['elsewhere']:.3f} elsewhere ({ratio:.0f}x), fires on {pct(top['fires_after'])} of them"),
            verdict="FOUND" if found else "NOT found", command=COMMAND, model="sprout",
            part=f"layer {layer} (block {layer + 1})"))
    return claims


def report(m: dict, claims: list[Claim], out: Path) -> None:
    """Print the tables and verdicts; write the CSVs and one HTML page per named feature."""
    q = m["quality"]
    q.to_csv(out / "quality.csv", index=False)
    shown = q[["layer", "block", "d_sae", "k", "n_tokens", "l0", "fve", "ce_clean", "ce_sae", "ce_zero",
               "loss_recovered", "dead", "dense"]].copy()
    for c in ("fve", "loss_recovered"):
        shown[c] = [pct(v, 1) for v in shown[c]]
    for c in ("ce_clean", "ce_sae", "ce_zero"):
        shown[c] = [f"{v:.3f}" for v in shown[c]]
    shown["l0"] = [f"{v:.1f}" for v in shown["l0"]]
    print_table(shown, "SAE quality on held-out text (CE in nats/token; dense = fires on > 10% of tokens)")
    m["second"].to_csv(out / "second_name.csv", index=False)
    print_table(m["second"].round(3), "features firing on the later tokens of a name's 2nd occurrence (mean activation)")
    m["previous"].to_csv(out / "previous_token.csv", index=False)
    print_table(m["previous"].round(3), "features whose firing is fixed by the previous token")
    m["ablation"].to_csv(out / "ablation.csv", index=False)
    ab = m["ablation"].copy()
    for c in ("first", "second"):
        ab[c] = [pct(v, 1) for v in ab[c]]
    print_table(ab, "name copying (mean P of a name's later tokens) with one feature ablated, error term kept")
    for (layer, f), s in m["pages"].items():
        print(f"\nfeature {f}, layer {layer} (block {layer + 1}): {s.description}; fires on {pct(s.frequency, 2)} of "
              f"{s.n_tokens:,} held-out tokens")
        for r in s.contexts.head(4).itertuples():
            left = "".join(r.tokens[:r.center])[-50:]
            right = "".join(r.tokens[r.center + 1:])[:20]
            print(f"   {r.activation:6.2f}  ...{left}[[{r.token}]]{right}".replace("\n", "\\n"))
        name = f"feature_L{layer}_{f}"
        save_figure(activation_histogram(s), out / f"{name}_histogram", png=False)
        save_figure(logit_effect_chart(s), out / f"{name}_logits", png=False)
        (out / f"{name}_contexts.html").write_text(
            f"<h3>feature {f}, layer {layer} (block {layer + 1})</h3><p>{s.description}</p>"
            + contexts_html(s.contexts), encoding="utf-8")
    print("\n== verdicts ==")
    print(verdict_lines(claims))


@command_line
def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    t0 = time.time()
    started = start(SCRIPT, a)
    if started is None:
        return 2
    models, out = started
    for nm in models:
        measured = measure(nm.model, a)
        if not isinstance(measured["quality"], pd.DataFrame):
            print(f"{nm.label}: no SAE to measure (train one: python -m sprout_interp.features.train --model "
                  f"{nm.spec} --layer {MIDDLE})", file=sys.stderr)
            return 2
        report(measured, judge(measured), out)
    print(f"\nwrote {out}/ in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
