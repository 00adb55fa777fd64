"""Does a Sprout checkpoint meet the bar for replacing the shipped one? Its figures beside the shipped Sprout's.

    python analyses/model_acceptance.py --candidate /tmp/candidate/sprout      # written by `ship sprout --to /tmp/candidate`
    python analyses/model_acceptance.py --candidate runs/sprout/checkpoint --baseline sprout

The bar (each part measured on its own, the same way for both models):

- **every block works**: the later half of the blocks (5-8 in Sprout) together worth at least 0.30 nats on held-out
  text, and each block alone worth more than 0.02 nats (``sprout_interp.behaviour.knockout.block_knockout``: the
  rise of the mean loss when a block stops writing to the stream; --n windows of --length tokens, seed --seed, from
  the validation documents of --corpus, "default" unless told: its documents are held out for a model of "default"
  and of "large" alike);
- **not learned by heart**: the later half's worth on training text (as many windows of the training documents of
  the same corpus) at most 1.3 times its worth on held-out text;
- **better on held-out text**: the validation loss on every window of 256 tokens of --val (the windows the shipped
  models' validation losses are measured on) at least 0.10 nats below the baseline's, both measured here. Where the
  corpus has changed, the bar is against a model trained on the new corpus instead: ``--val-against gpt-4
  --val-by 0.15`` (that model's loss on the same windows, measured here, less 0.15 nats);
- **copying kept**: the copying ratio on repeated random tokens at most 0.1, and invented-name copying at least 80%
  on the name texts and on the held-out name texts (``sprout_model.info.describe``, the figures
  ``python -m sprout_model.info`` prints).

The fallback rule, for a candidate that misses the bar: it may still replace the baseline when it is **better on
held-out loss without losing copying**: its validation loss below the baseline's (by any amount), its copying ratio
at most 0.1, and its name copying on both name sets at least the baseline's. It is judged and printed beside the
bar (``fallback.csv``); the exit status stays the bar's.

Reported beside them, judged against nothing (what the chapter's Sprout shows): the logit-lens confidence after the
last two blocks on the three texts (the chapter: 77% -> 59%), the residual-stream RMS after each block (held-out),
and the best previous-token and induction heads on repeated random tokens. Writes acceptance.csv (one row per part
and model) report.csv (the reported figures) and fallback.csv into out/model_acceptance/. Exit status 0 when the candidate meets
every part, 1 when it does not, 2 when a model cannot be loaded.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from sprout_interp.behaviour.knockout import block_knockout
from sprout_interp.circuits.attention import head_scores
from sprout_interp.core.arguments import command_line
from sprout_interp.core.texts import TEXTS
from sprout_interp.lens.logit_lens import CHAPTER_SPROUT_CONFIDENCE, logit_lens, penultimate_vs_final
from sprout_interp.lens.residual import residual_rms
from sprout_interp.report.cli import held_out, held_out_arguments, load_models, out_dir, print_table, set_threads, training_text
from sprout_model.cli import ArgumentParser, Whole
from sprout_model.info import describe
from sprout_model.ship import VAL_SEQ_LEN
from sprout_model.train import loss_on_every_window

SCRIPT = "model_acceptance"
COMMAND = f".venv/bin/python analyses/{SCRIPT}.py"
LATE_WORTH = 0.30  # nats: the later half of the blocks together, held-out
BLOCK_WORTH = 0.02  # nats: every block alone, held-out
MEMORISED = 1.3  # at most: the later half's worth on training text / on held-out text
BETTER_BY = 0.10  # nats: the candidate's validation loss at least this far below the baseline's
COPYING_RATIO = 0.1  # at most
NAME_COPYING = 0.80  # at least, on the name texts and on the held-out name texts
DEFAULT_VAL = ("data/names-splice/val.bin", "data/default/val.bin")  # the same tokens: default's validation split


def parser() -> ArgumentParser:
    """The script's arguments."""
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--candidate", required=True, help="the checkpoint folder to judge")
    p.add_argument("--baseline", default="sprout", help="what it would replace (default: the shipped sprout)")
    p.add_argument("--val", default=None, help=f"validation tokens (uint16 .bin; default: the first of {', '.join(DEFAULT_VAL)})")
    p.add_argument("--val-against", default=None, metavar="MODEL",
                   help="judge the validation loss against this model's on the same windows (e.g. gpt-4 trained on a "
                        "changed corpus) instead of the baseline's")
    p.add_argument("--val-by", type=float, default=BETTER_BY,
                   help=f"nats the candidate's validation loss must be below the baseline's (or --val-against's); "
                        f"default {BETTER_BY}")
    p.add_argument("--report-val", nargs="*", default=[], metavar="FILE",
                   help="more validation tokens (uint16 .bin, e.g. data/large-names/val.bin) whose loss on every window "
                        "is reported beside the figures, not judged")
    p.add_argument("--corpus", default="default", help="corpus of the held-out and training samples")
    held_out_arguments(p, 16, n_help="held-out windows (and training-text windows) for the knockout",
                       length_help="tokens per window", seed_help="seed of both samples")
    p.add_argument("--out", default=None, help=f"output folder (default out/{SCRIPT})")
    p.add_argument("--threads", type=Whole(0), default=None, help="torch CPU threads (0: torch's default)")
    return p


def _val_tokens(arg: str | None) -> tuple[np.ndarray, str]:
    for path in ([arg] if arg else list(DEFAULT_VAL)):
        if Path(path).is_file():
            return np.memmap(path, dtype=np.uint16, mode="r"), path
    raise FileNotFoundError(f"no validation tokens at {arg or ' or '.join(DEFAULT_VAL)}: run `python -m sprout_model.prepare` "
                            "(or pass --val FILE)")


def window_loss(hooked, tokens: np.ndarray) -> tuple[float, int]:
    """(mean loss in nats/token, number of windows) of the wrapped GPT on every window of VAL_SEQ_LEN tokens (or its
    context, if shorter) of ``tokens``: the windows the shipped models' validation losses are measured on."""
    return loss_on_every_window(hooked.model, tokens, min(VAL_SEQ_LEN, hooked.cfg.n_ctx))


def measure_one(spec: str, hooked, args: argparse.Namespace, val: np.ndarray) -> dict:
    """Every figure of one model: knockout on held-out and training text, validation loss, copying, lens, RMS, heads."""
    n_layers = hooked.cfg.n_layers
    late = list(range(n_layers // 2, n_layers))
    groups = [[layer] for layer in range(n_layers)] + [late]
    held, train = held_out(hooked, args), training_text(hooked, args, args.n)
    if held is None or train is None:
        raise RuntimeError(f"the corpus {args.corpus!r} is not installed: pip install -e '.[train]'")
    k_held = block_knockout(hooked, held, groups=groups)
    k_train = block_knockout(hooked, train, groups=groups)
    loss, windows = window_loss(hooked, val)
    more = {path: window_loss(hooked, np.memmap(path, dtype=np.uint16, mode="r")) for path in args.report_val}
    row = describe(spec)
    toks, mask = hooked.to_tokens_with_mask(list(TEXTS.values()))
    pf = penultimate_vs_final(logit_lens(hooked, toks, attention_mask=mask).summary())
    rms = residual_rms(hooked, held)
    heads = head_scores(hooked, natural=False, copying=False)
    prev = heads.sort_values("prev_token_random", ascending=False).head(3)
    ind = heads.sort_values("induction_random", ascending=False).head(2)
    return {
        "held": k_held, "train": k_train, "val_loss": loss, "windows": windows, "info": row, "lens": pf, "rms": rms,
        "prev": prev, "ind": ind, "late_label": k_held["blocks"].iloc[-1], "more_val": more,
    }


def _heads(df: pd.DataFrame, col: str) -> str:
    return ", ".join(f"block {r.block} head {r.head} ({getattr(r, col):.2f})" for r in df.itertuples())


def judge(m: dict[str, dict], baseline: str, candidate: str, against: str | None = None,
          by: float = BETTER_BY) -> pd.DataFrame:
    """One row per part and model: ``part``, ``model``, ``value``, ``bar`` (the threshold, as text), ``meets``
    (bool). The validation part is each model's loss against ``m[against]["val_loss"] - by`` (nats; ``against``
    defaults to the baseline, which is then judged against itself)."""
    against = against or baseline
    val_bar = m[against]["val_loss"] - by
    rows = []
    for name in (baseline, candidate):
        f = m[name]
        held, train = f["held"], f["train"]
        late_h, late_t = float(held["change"].iloc[-1]), float(train["change"].iloc[-1])
        singles = held.iloc[:-1]
        ratio = late_t / late_h if late_h > 0 else float("inf")
        info = f["info"]
        rows += [
            dict(part=f"blocks {f['late_label']} together worth, held-out (nats)", model=name, value=late_h,
                 bar=f">= {LATE_WORTH}", meets=late_h >= LATE_WORTH),
            dict(part="the least any one block is worth, held-out (nats)", model=name, value=float(singles["change"].min()),
                 bar=f"> {BLOCK_WORTH} (block {singles.loc[singles['change'].idxmin(), 'blocks']})",
                 meets=bool((singles["change"] > BLOCK_WORTH).all())),
            dict(part=f"blocks {f['late_label']}: worth on training text / held-out", model=name, value=ratio,
                 bar=f"<= {MEMORISED}", meets=ratio <= MEMORISED),
            dict(part=f"validation loss, all {f['windows']:,} windows (nats)", model=name, value=f["val_loss"],
                 bar=f"<= {val_bar:.4f} ({against}'s {m[against]['val_loss']:.4f} - {by:g})",
                 meets=f["val_loss"] <= val_bar),
            dict(part="copying ratio, repeated random tokens", model=name, value=info["copying_ratio"],
                 bar=f"<= {COPYING_RATIO}", meets=info["copying_ratio"] <= COPYING_RATIO),
            dict(part="invented-name copying, the name texts", model=name, value=info["name_copying"],
                 bar=f">= {NAME_COPYING:.0%}", meets=info["name_copying"] >= NAME_COPYING),
            dict(part="invented-name copying, the held-out name texts", model=name, value=info["name_copying_heldout"],
                 bar=f">= {NAME_COPYING:.0%}", meets=info["name_copying_heldout"] >= NAME_COPYING),
        ]
    return pd.DataFrame(rows)


def fallback(m: dict[str, dict], baseline: str, candidate: str) -> pd.DataFrame:
    """The fallback rule (module docstring), one row per part: ``part``, ``candidate``, ``baseline``, ``bar`` (as text),
    ``meets`` (bool)."""
    c, b = m[candidate], m[baseline]
    ci, bi = c["info"], b["info"]
    rows = [
        dict(part="validation loss (nats)", candidate=c["val_loss"], baseline=b["val_loss"], bar=f"< {b['val_loss']:.4f}",
             meets=c["val_loss"] < b["val_loss"]),
        dict(part="copying ratio, repeated random tokens", candidate=ci["copying_ratio"], baseline=bi["copying_ratio"],
             bar=f"<= {COPYING_RATIO}", meets=ci["copying_ratio"] <= COPYING_RATIO),
        dict(part="invented-name copying, the name texts", candidate=ci["name_copying"], baseline=bi["name_copying"],
             bar=f">= {bi['name_copying']:.4f}", meets=ci["name_copying"] >= bi["name_copying"]),
        dict(part="invented-name copying, the held-out name texts", candidate=ci["name_copying_heldout"],
             baseline=bi["name_copying_heldout"], bar=f">= {bi['name_copying_heldout']:.4f}",
             meets=ci["name_copying_heldout"] >= bi["name_copying_heldout"]),
    ]
    return pd.DataFrame(rows)


def reported(m: dict[str, dict]) -> pd.DataFrame:
    """The figures reported beside the chapter's, judged against nothing: ``model``, ``figure``, ``ours``, ``chapter``."""
    rows = []
    for name, f in m.items():
        pf, rms = f["lens"], f["rms"].sort_values("block")
        rows += [
            dict(model=name, figure=f"logit-lens confidence after blocks {pf['penultimate_block']} and {pf['final_block']} "
                                    "(three texts)",
                 ours=f"{pf['penultimate']:.1%} -> {pf['final']:.1%}",
                 chapter=f"{CHAPTER_SPROUT_CONFIDENCE[7]:.0%} -> {CHAPTER_SPROUT_CONFIDENCE[8]:.0%}"),
            dict(model=name, figure="residual RMS after the embedding and each block (held-out)",
                 ours=" -> ".join(f"{v:.3g}" for v in rms["rms"]), chapter=""),
            dict(model=name, figure="best previous-token heads (score, random tokens)", ours=_heads(f["prev"], "prev_token_random"),
                 chapter="layer 2 (gpt-4)"),
            dict(model=name, figure="best induction heads (score, random tokens)", ours=_heads(f["ind"], "induction_random"),
                 chapter="layer 3 (gpt-4)"),
        ]
        rows += [dict(model=name, figure=f"validation loss, every window of {path}", ours=f"{loss:.4f} over {n:,} windows",
                      chapter="") for path, (loss, n) in f.get("more_val", {}).items()]
    return pd.DataFrame(rows)


@command_line
def main(argv: list[str] | None = None) -> int:
    """Measure both models, print and write the tables; the exit status says whether the candidate meets the bar."""
    args = parser().parse_args(argv)
    t0 = time.time()
    set_threads(args.threads)
    val, val_path = _val_tokens(args.val)
    loaded = load_models([args.baseline, args.candidate])
    if len(loaded) < 2:
        print("both the baseline and the candidate must load", file=sys.stderr)
        return 2
    baseline, candidate = args.baseline, args.candidate
    measured = {spec: measure_one(spec, nm.model, args, val) for spec, nm in zip((baseline, candidate), loaded, strict=True)}
    against, reference = args.val_against, {}
    if against and against not in measured:
        ref = load_models([against])
        if not ref:
            print(f"--val-against {against}: the model must load", file=sys.stderr)
            return 2
        loss, windows = window_loss(ref[0].model, val)
        reference = {against: {"val_loss": loss, "windows": windows}}
        print(f"{against}: validation loss {loss:.4f} over {windows:,} windows of {val_path} (the bar's reference)")
    verdicts = judge(measured | reference, baseline, candidate, against, args.val_by)
    fall = fallback(measured, baseline, candidate)
    rep = reported(measured)
    out = out_dir(SCRIPT, args.out)
    verdicts.to_csv(out / "acceptance.csv", index=False)
    rep.to_csv(out / "report.csv", index=False)
    fall.to_csv(out / "fallback.csv", index=False)
    wide = verdicts.pivot_table(index="part", columns="model", values="value", sort=False)
    show = pd.DataFrame({"part": wide.index})
    for name in (baseline, candidate):
        v = verdicts[verdicts["model"] == name].set_index("part")
        show[name] = [f"{v.loc[p, 'value']:.4g} {'meets' if v.loc[p, 'meets'] else 'misses'}" for p in wide.index]
    show["bar"] = verdicts[verdicts["model"] == candidate]["bar"].tolist()
    print_table(show, f"the bar for replacing {baseline} (validation tokens {val_path}; held-out and training samples: "
                      f"{args.n} x {args.length} tokens of corpus {args.corpus!r}, seed {args.seed})")
    print_table(rep, "reported beside the chapter's figures, judged against nothing")
    print_table(fall.assign(meets=fall["meets"].map({True: "meets", False: "misses"})),
                f"the fallback rule: better than {baseline} on held-out loss without losing copying")
    meets = bool(verdicts[verdicts["model"] == candidate]["meets"].all())
    missed = verdicts[(verdicts["model"] == candidate) & ~verdicts["meets"]]["part"].tolist()
    print(f"\n{candidate}: " + ("MEETS every part of the bar" if meets else "does NOT meet the bar: misses " + "; ".join(missed)))
    fmissed = fall[~fall["meets"]]["part"].tolist()
    print(f"{candidate}: " + ("meets the fallback rule" if not fmissed else "does NOT meet the fallback rule: misses "
                              + "; ".join(fmissed)))
    print(f"wrote {out / 'acceptance.csv'}, {out / 'report.csv'}, {out / 'fallback.csv'} in {time.time() - t0:.1f}s")
    return 0 if meets else 1


if __name__ == "__main__":
    sys.exit(main())
