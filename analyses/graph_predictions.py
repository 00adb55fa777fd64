"""How well an attribution graph predicts the real model, over many prompts: each prompt's strongest features removed
one at a time in the real model (the decoder write taken out of the feed-forward's true output at its position,
everything else running), against what the graph predicts for that removal, with the final RMSNorm's scale frozen
(circuit-tracer's graph) and through its Jacobian (``si.attribution_graph(..., final_norm="jacobian")``).

    .venv/bin/python analyses/graph_predictions.py                         # gpt-4 and sprout, 24 + 9 prompts each
    .venv/bin/python analyses/graph_predictions.py --models gpt-4 --n 4 --k 2 --ready-made 24    # a quick look
    .venv/bin/python analyses/graph_predictions.py --kinds clt             # the cross-layer transcoders only

Prompts (``sprout_interp.circuits.graph_predictions.prediction_prompts``): ``--n`` held-out windows (text no shipped
model trained on) cut to lengths spread evenly from ``--min-len`` to ``--max-len`` tokens, and the three ready-made
texts cut at each ``--ready-made`` length; ``<|endoftext|>`` is put first. The target is the prompt's top logit (the
graph's one logit node), in the graph's unit: its logit minus the mean logit. Features are picked in the frozen graph,
``--k`` per prompt by each selection: ``influence`` (circuit-tracer's influence on the logit), ``logit_edge`` (largest
|direct edge| into it), ``last_layer`` (the same among the last block's features). The prediction is the graph's total
effect (every path through later features); the table gives, per model, selection and final norm, the correlation
of predicted and real changes, the share with the same sign and the median of |predicted - real| / |real|.
Each model's graphs are made with each of ``--kinds``: its shipped per-layer transcoders (``per_layer``, a feature's
removal takes its write out of its own feed-forward's output) and its shipped cross-layer transcoder (``clt``, out of
its own and every later feed-forward's output), on the same prompts.
Writes predictions.csv and summary.csv into out/graph_predictions/.
"""
from __future__ import annotations

import sys
from argparse import Namespace
from typing import Sequence

import pandas as pd

from sprout_interp.circuits.graph_predictions import logit_predictions, prediction_prompts, prediction_summary
from sprout_interp.circuits.local_replacement import TRANSCODER_KINDS
from sprout_interp.core.arguments import command_line
from sprout_interp.report.cli import NamedModel, out_dir, print_table, script_parser, start

SCRIPT = "graph_predictions"
COMMAND = f".venv/bin/python analyses/{SCRIPT}.py"


def parser():
    p = script_parser(SCRIPT, __doc__)
    p.set_defaults(models=["gpt-4", "sprout"])  # the models that ship transcoders of both kinds
    p.add_argument("--n", type=int, default=24, help="held-out prompts per model")
    p.add_argument("--min-len", type=int, default=12, help="tokens of the shortest held-out prompt")
    p.add_argument("--max-len", type=int, default=80, help="tokens of the longest held-out prompt")
    p.add_argument("--ready-made", type=int, nargs="*", default=[24, 48, 72],
                   help="lengths each ready-made text is cut to (none: no ready-made prompts)")
    p.add_argument("--k", type=int, default=3, help="features removed per prompt and selection")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out windows")
    p.add_argument("--kinds", nargs="+", choices=TRANSCODER_KINDS, default=list(TRANSCODER_KINDS),
                   help="which shipped transcoders replace the feed-forwards, each in turn")
    p.add_argument("--from-csv", nargs="+", default=None, metavar="CSV",
                   help="report the predictions.csv file(s) a run wrote instead of measuring again")
    return p


def measure(models: Sequence[NamedModel], args: Namespace, stream=None) -> pd.DataFrame:
    """:func:`logit_predictions` on each model's prompts with each of ``args.kinds``, one table with a ``model``
    column (the kind in ``transcoder_kind``)."""
    from sprout_model.corpus import CorpusError

    stream = sys.stderr if stream is None else stream
    frames = []
    for nm in models:
        try:
            prompts = prediction_prompts(nm.model, n=args.n, min_len=args.min_len, max_len=args.max_len,
                                         seed=args.seed, ready_made=args.ready_made)
        except CorpusError as e:
            print(f"held-out prompts skipped for {nm.label} ({e}): the ready-made texts only", file=stream)
            prompts = prediction_prompts(nm.model, n=0, ready_made=args.ready_made)
        for kind in args.kinds:
            df = logit_predictions(nm.model, prompts, kind=kind, k=args.k)
            df.insert(0, "model", nm.label)
            frames.append(df)
    return pd.concat(frames, ignore_index=True)


def markdown(summary: pd.DataFrame) -> str:
    """The summary as the docs' table: model, transcoders, selection, final norm, removals, r, sign agreement,
    median relative error."""
    lines = ["| model | transcoders | features removed | final norm | removals (prompts) | correlation | "
             "sign agreement | median relative error |", "|---|---|---|---|---|---|---|---|"]
    for _, r in summary.iterrows():
        lines.append(f"| {r['model']} | {r.get('transcoder_kind', 'per_layer')} | {r['select']} | {r['final_norm']} | "
                     f"{r['removals']} ({r['prompts']}) | "
                     f"{r['r']:.2f} | {100 * r['sign_agreement']:.0f}% | {r['median_rel_error']:.2f} |")
    return "\n".join(lines)


def report(df: pd.DataFrame, args: Namespace, out) -> None:
    if "transcoder_kind" not in df:  # a table written before graphs took either kind: the per-layer set's
        df = df.assign(transcoder_kind="per_layer")
    lengths = df.groupby(["model", "text"])["n_pos"].first()
    print(f"\nprompts: {lengths.groupby('model').size().to_dict()}, positions {int(lengths.min())}-"
          f"{int(lengths.max())} (with <|endoftext|>)")
    total = prediction_summary(df)
    direct = prediction_summary(df, "predicted_direct")
    print_table(total.round(3), "the graph's total prediction against the real removal")
    print_table(direct.round(3), "the direct edge alone against the real removal")
    unique = df.drop_duplicates(["model", "transcoder_kind", "text", "layer", "pos", "feature", "final_norm"]
                                ).assign(select="any")
    print_table(prediction_summary(unique, by=["block"]).sort_values(
        ["model", "transcoder_kind", "block", "final_norm"]).round(3),
                "by the removed feature's block (each removal once, whatever selected it)")
    print("\n" + markdown(total))
    df.to_csv(out / "predictions.csv", index=False)
    total.to_csv(out / "summary.csv", index=False)
    print(f"\nwrote {out}/predictions.csv and summary.csv")


@command_line
def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.from_csv:
        out = out_dir(SCRIPT, args.out)
        report(pd.concat([pd.read_csv(p) for p in args.from_csv], ignore_index=True), args, out)
        return 0
    started = start(SCRIPT, args)
    if started is None:
        return 2
    models, out = started
    report(measure(models, args), args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
