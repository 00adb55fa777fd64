"""Small helpers shared by the ``analyses/`` scripts: loading the models a script was asked for
(skipping missing shipped checkpoints with a clear message), recognising which of the chapter's
models a checkpoint is, formatting tables and writing figures (one plotly.js per output folder).
No tensor maths here.
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sprout_interp.core.arguments import command_line
from sprout_interp.core.errors import CheckpointNotFoundError, SproutError
from sprout_interp.plots.common import PLOTLY_JS, plotly_js, save_figure
from sprout_model.checkpoint import SHIPPED
from sprout_model.cli import ArgumentParser, Whole
from sprout_model.info import total_steps
from sprout_model.presets import PRESETS

__all__ = [
    "PLOTLY_JS",
    "SHIPPED",
    "NamedModel",
    "candidates_left_out",
    "evidence_table",
    "held_out",
    "held_out_arguments",
    "load_models",
    "mean_reference",
    "models_frame",
    "out_dir",
    "pct",
    "plotly_js",
    "run_claim_script",
    "preset_of",
    "print_table",
    "save_figure",
    "script_parser",
    "set_threads",
    "slug",
    "start",
    "training_text",
]


@dataclass
class NamedModel:
    """A loaded model with the label a script's tables call it by."""

    label: str  # what tables call it: the shipped name, else the preset (or folder) name, made unique
    preset: str | None  # "gpt-1" / "gpt-4" / "sprout" when the architecture is one of the chapter's, else None
    model: object  # HookedSprout
    spec: str = ""  # what the user passed

    def describe(self) -> str:
        """'gpt-4 = runs/gpt-4/checkpoint: 4 blocks, 1,234,567 parameters, 400 steps, 1.6M tokens, val loss 5.06'.

        Steps are those of every training stage (``sprout_model.info.total_steps``: this run's and those of
        the runs it started from), the number ``python -m sprout_model.info`` prints.
        """
        m = self.model
        info = getattr(m, "info", None) or {}
        bits = [f"{m.cfg.n_layers} block{'' if m.cfg.n_layers == 1 else 's'}", f"{m.model.num_params():,} parameters"]
        steps = total_steps(info)
        if steps is not None:
            bits.append(f"{steps:,} steps")
        if "tokens_seen" in info:
            bits.append(f"{info['tokens_seen'] / 1e6:.1f}M tokens")
        if "val_loss" in info:
            bits.append(f"val loss {info['val_loss']:.3f} nats/token")
        src = getattr(m, "source", None) or self.spec
        return f"{self.label} = {src}: " + ", ".join(bits)


def preset_of(model) -> str | None:
    """Which of the chapter's presets a HookedSprout is: its ``train.json`` "preset", else the one whose
    architecture matches; None for anything else."""
    cfg = model.model.cfg
    p = (getattr(model, "info", None) or {}).get("preset")
    if p in PRESETS and PRESETS[p] == cfg:
        return p
    return next((name for name, c in PRESETS.items() if c == cfg), None)


def load_models(specs: Sequence[str], stream=None) -> list[NamedModel]:
    """Load every name or path in ``specs``; a missing one is reported on ``stream`` (stderr) and skipped."""
    from sprout_interp.core.hooked import load_hooked as load

    stream = sys.stderr if stream is None else stream
    out = []
    for spec in specs:
        try:
            m = load(spec)
        except CheckpointNotFoundError as e:
            hint = f" (or pass --models runs/{spec}/checkpoint after training it)" if spec in SHIPPED else ""
            print(f"skipping {spec}: {e}{hint}", file=stream)
            continue
        except SproutError as e:
            print(f"skipping {spec}: {e}", file=stream)
            continue
        preset = preset_of(m)
        label = spec if spec in SHIPPED else (preset or Path(spec).name or str(spec))
        taken = {o.label for o in out}
        base, i = label, 2
        while label in taken:
            label, i = f"{base}#{i}", i + 1
        out.append(NamedModel(label=label, preset=preset, model=m, spec=str(spec)))
    return out


_held_out_note_shown = False


def held_out(model, args, stream=None):
    """The script's held-out sample for ``model``: ``validation_sample(model.tokenizer, args.n, args.length,
    args.seed)`` from ``args.corpus`` when the script has that argument and it is set, else from
    ``sprout_interp.core.texts.sample_corpus(model)`` ("default" for a model of "default" or "large"); None,
    with a note on ``stream`` (stderr), when the corpus packages are not installed."""
    from sprout_interp.core.texts import held_out_for

    return _sample(held_out_for, model, args, args.n, stream)


def training_text(model, args, n: int, stream=None):
    """The script's sample of ``model``'s training text: ``n`` windows of ``args.length`` tokens (seed
    ``args.seed``) from the training documents of the same corpus as :func:`held_out`; None, with a note, when
    the corpus packages are not installed."""
    from sprout_interp.core.texts import training_sample_for

    return _sample(training_sample_for, model, args, n, stream)


def _sample(sampler, model, args, n: int, stream):
    from sprout_model.corpus import CorpusError

    global _held_out_note_shown
    try:
        return sampler(model, n, args.length, args.seed, corpus=getattr(args, "corpus", None))
    except CorpusError as e:
        if not _held_out_note_shown:
            print(f"held-out sample skipped ({e}); only the three texts are measured",
                  file=sys.stderr if stream is None else stream)
            _held_out_note_shown = True
        return None


_means: dict[tuple, tuple] = {}  # (id(model), n, length, seed) -> (model, head means): scripts run in one process share them


def mean_reference(model, n: int, length: int, seed: int, stream=None):
    """Head means (``sprout_interp.circuits.ablation.head_means``) over the held-out sample ``(n, length, seed)``, the
    mean-ablation reference of the scripts; over the three ready-made texts when the corpus is not installed.

    Computed once per model and sample in a process (the claims table runs two scripts that both need them)."""
    from types import SimpleNamespace

    from sprout_interp.circuits.ablation import head_means
    from sprout_interp.core.texts import TEXTS

    key = (id(model), n, length, seed)
    if key not in _means or _means[key][0] is not model:
        ref = held_out(model, SimpleNamespace(n=n, length=length, seed=seed), stream)
        _means[key] = (model, head_means(model, ref if ref is not None else list(TEXTS.values())))
    return _means[key][1]


def out_dir(script: str, out: str | None = None) -> Path:
    """``out`` or ``out/<script>/`` (created)."""
    p = Path(out) if out else Path("out") / script
    p.mkdir(parents=True, exist_ok=True)
    return p


def slug(s: str) -> str:
    """A model label as a file-name part: 'runs/gpt-4#2' -> 'runs_gpt-4_2'."""
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in s).strip("_")


def pct(x: float, digits: int = 0) -> str:
    """0.771 -> '77%' (NaN -> '-')."""
    return "-" if math.isnan(x) else f"{100 * x:.{digits}f}%"


def print_table(df: pd.DataFrame, title: str, stream=None) -> None:
    """A titled plain-text table, all columns, no index."""
    stream = sys.stdout if stream is None else stream
    print(f"\n== {title} ==", file=stream)
    with pd.option_context("display.width", 250, "display.max_columns", None, "display.max_colwidth", 60):
        print(df.to_string(index=False), file=stream)


def script_parser(name: str, description: str | None):
    """The argument parser every analysis script starts from: --models, --out and --threads. A mistake on the
    command line prints one ``error: ...`` line and exits with status 2 (``sprout_model.cli.ArgumentParser``)."""
    import argparse

    p = ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(SHIPPED), help="shipped names or checkpoint paths")
    p.add_argument("--out", default=None, help=f"output folder (default out/{name})")
    p.add_argument("--threads", type=Whole(0), default=None,
                   help="torch CPU threads (default or 0: torch's; 1 is fastest on a busy machine)")
    return p


def held_out_arguments(p, n: int, length: int = 256, n_help: str = "held-out windows",
                       length_help: str = "tokens per held-out window", seed_help: str = "seed of the held-out sample") -> None:
    """Add the held-out sample's ``--n`` (windows), ``--length`` (tokens per window) and ``--seed`` to parser ``p``,
    the arguments :func:`held_out` reads; each script gives its own defaults and says what the windows are for."""
    p.add_argument("--n", type=Whole(0), default=n, help=n_help)
    p.add_argument("--length", type=Whole(1), default=length, help=length_help)
    p.add_argument("--seed", type=Whole(0), default=0, help=seed_help)


def set_threads(n: int | None) -> None:
    """Run torch on ``n`` CPU threads (None or 0: leave torch's default)."""
    import torch

    if n:
        torch.set_num_threads(n)


@command_line
def run_claim_script(script: str, argv: Sequence[str] | None, parser, measure, judge, report, wrote: str = "",
                     usable=None) -> int:
    """What every claim script's ``main`` does: parse ``argv`` with ``parser()``, load the models (:func:`start`),
    ``measure(models, args)``, ``report(measured, judge(measured), args, out)`` and print what was written
    (``wrote``: the files, relative to the output folder). Returns the exit status: 0, or 2 when no checkpoint
    could be loaded or ``usable(measured)`` is False (nothing to judge); a refused argument (a ``SproutError``)
    prints one ``error: ...`` line and exits with status 2 (``core.arguments.command_line``)."""
    args = parser().parse_args(argv)
    t0 = time.time()
    started = start(script, args)
    if started is None:
        return 2
    models, out = started
    measured = measure(models, args)
    if usable is not None and not usable(measured):
        return 2
    report(measured, judge(measured), args, out)
    if wrote:
        print(f"\nwrote {out}/{wrote} in {time.time() - t0:.1f}s")
    return 0


def start(name: str, args) -> tuple[list[NamedModel], Path] | None:
    """Apply --threads, load --models (reporting what is missing) and make the output folder.

    Returns (models, output folder), or None after printing why nothing could be loaded.
    """
    set_threads(args.threads)
    models = load_models(args.models)
    if not models:
        print("no checkpoint could be loaded; train one (python -m sprout_model.train --preset NAME) and pass "
              "--models runs/NAME/checkpoint", file=sys.stderr)
        return None
    out = out_dir(name, args.out)
    print("models:")
    for nm in models:
        print(f"  {nm.describe()}")
    return models, out


# --------------------------------------------------------------------------------------------
# figures: plotly.js written once per folder, each figure's HTML refers to it


# --------------------------------------------------------------------------------------------
# the induction circuit's evidence, as a person reads it


def evidence_table(circuit) -> pd.DataFrame:
    """The ablations behind an ``InductionCircuit`` (``circuit.evidence``), one row per condition, formatted:
    which heads, their scores, name copying at both occurrences, the share of the copying gain removed,
    the held-out loss change (nats/token), specificity, and the induction head's induction score."""
    ev = circuit.evidence
    copy = "name copying" if circuit.copying == "names" else "copying"

    def num(v, spec):
        return "-" if v is None or math.isnan(v) else format(v, spec)

    def pair(a: str, b: str) -> list[str]:
        nan = [float("nan")] * len(ev)
        return [f"{num(x, '.2f')} / {num(y, '.2f')}" for x, y in zip(ev.get(a, nan), ev.get(b, nan))]

    return pd.DataFrame({
        "ablated": ev["condition"].where(ev["n_heads"] != 1, ev["role"]),
        "heads": ev["heads"],
        "prev-token score random / text": pair("prev_token_random", "prev_token_text"),
        "induction score random / text": pair("induction_random", "induction_text"),
        f"{copy} 2nd (1st)": [f"{pct(b, 1)} ({pct(a, 1)})" for a, b in zip(ev["copying_first"], ev["copying_second"])],
        "gain removed": [pct(v, 1) for v in ev["copying_removed"]],
        "held-out loss change": [num(v, "+.3f") for v in ev["loss_change"]],
        "specificity": [num(v, ".1f") for v in ev["specificity"]],
        "induction head's score": [num(v, ".2f") for v in ev["induction_score"]],
        "chosen": ["yes" if c else "" for c in ev["chosen"]],
    })


def models_frame(models: Sequence[NamedModel]) -> pd.DataFrame:
    """One row per loaded model: ``model`` (its label), ``preset`` (the chapter's preset or None) and ``n_blocks``,
    what a script's judge needs to know about the models it measured."""
    return pd.DataFrame({"model": [nm.label for nm in models], "preset": [nm.preset for nm in models],
                         "n_blocks": [int(nm.model.cfg.n_layers) for nm in models]})


def candidates_left_out(circuit) -> pd.DataFrame:
    """The previous-token candidates of an ``InductionCircuit`` that its ablations did not choose (each one's
    ``evidence`` row: heads, scores, ``copying_removed``, ...); empty without evidence."""
    ev = circuit.evidence
    if ev is None:
        return pd.DataFrame()
    return ev[(ev["role"] == "previous-token candidate") & ~ev["chosen"].astype(bool)]
