"""Print a table of checkpoints: size, training, validation loss, and the in-context copying figure.

    python -m sprout_model.info                 # the shipped gpt-1, gpt-4 and sprout
    python -m sprout_model.info runs/gpt-4/checkpoint --json

Parameters are counted on the loaded model (the tied embedding once); tokens seen, steps (of all
training stages, when a run started from another with ``--init-from``) and the validation loss come
from the checkpoint's ``train.json``; perplexity is exp(validation loss).
The copying ratio is measured here, on the CPU, by
``sprout_model.evaluation.repeated_tokens_loss_ratio`` (seq_len 64, batch 32, seed 0).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from .checkpoint import SHIPPED, SHIPPED_DIR, load_folder, tokenizer_path
from .cli import ArgumentParser, OptionError, input_errors_exit
from .evaluation import HELDOUT_NAME_TEXTS, name_copying, repeated_tokens_loss_ratio
from .tokenizer import load_tokenizer

SEQ_LEN, BATCH, SEED = 64, 32, 0
COPYING_NOTE = (
    f"Copying ratio: {BATCH} sequences of {SEQ_LEN} random tokens (ids 1..vocab-1, seed {SEED}), each fed twice in "
    f"a row; mean loss on the targets at positions 1..{SEQ_LEN - 1} of the second copy divided by the mean loss on "
    f"positions 1..{SEQ_LEN - 1} of the first copy (the first token of each copy is left out: nothing predicts it). "
    "About 1.0 means no in-context copying; a model with induction heads goes far below 0.5."
)
NAME_NOTE = (
    "Name copying: mean probability of an invented two-word name's later tokens (all but its first token) at "
    "the name's second occurrence, over the five texts in sprout_model.evaluation.NAME_TEXTS; in brackets the "
    "same tokens at the first occurrence, where nothing can be copied. Held-out: the same measure on five "
    "other texts (HELDOUT_NAME_TEXTS) that were never used to choose a recipe or a checkpoint."
)


def resolve(name: str) -> Path:
    """A shipped name (any case) means its folder under sprout_model/checkpoints; anything else is a path."""
    return SHIPPED_DIR / name.lower() if name.lower() in SHIPPED else Path(name)


def total_steps(info: dict) -> int | None:
    """Optimizer steps over every stage: this run's plus those of the runs it started from (``--init-from``)."""
    steps, init = info.get("steps"), info.get("init_from")
    while steps is not None and isinstance(init, dict):
        steps += init.get("steps") or 0
        init = init.get("init_from")
    return steps


def own_tokens(info: dict) -> int | None:
    """Tokens trained at this checkpoint's own size: ``tokens_seen`` less the tokens of the first stage
    behind it (``--init-from``) that trained a different preset, e.g. the gpt-4 a Sprout was grown from."""
    tokens, preset, init = info.get("tokens_seen"), info.get("preset"), info.get("init_from")
    while tokens is not None and isinstance(init, dict):
        if (init.get("args") or {}).get("preset", preset) != preset:
            return tokens - (init.get("tokens_seen") or 0)
        init = init.get("init_from")
    return tokens


def describe(name: str) -> dict:
    """One row: the measured and recorded figures of a checkpoint folder, or ``missing``/``error`` with a reason."""
    folder = resolve(name)
    name = name.lower() if name.lower() in SHIPPED else name
    if not ((folder / "config.json").is_file() and (folder / "model.safetensors").is_file()):
        how = (f"not shipped in this copy; train it with `python -m sprout_model.train --preset {name}` "
               f"and pass runs/{name}/checkpoint"
               if name.lower() in SHIPPED else "expected a folder with config.json and model.safetensors")
        return {"name": name, "path": str(folder), "missing": True, "reason": f"no checkpoint at {folder} ({how})"}
    try:
        model, info = load_folder(folder)
        tok = tokenizer_path(folder)
        tokenizer = load_tokenizer(tok) if tok else None  # checked as sprout_interp.load checks it
    except Exception as e:  # a damaged folder (or tokenizer): say so and go on with the others
        return {"name": name, "path": str(folder), "missing": True, "reason": f"cannot load {folder}: {type(e).__name__}: {e}"}
    first, second, ratio = repeated_tokens_loss_ratio(model, seq_len=SEQ_LEN, batch=BATCH, seed=SEED)
    val = info.get("val_loss")
    names = name_copying(model, tokenizer) if tokenizer else None
    heldout = name_copying(model, tokenizer, HELDOUT_NAME_TEXTS) if tokenizer else None
    return {
        "name": name,
        "path": str(folder),
        "parameters": model.num_params(),
        "tokens_seen": info.get("tokens_seen"),
        "steps": total_steps(info),  # all stages
        "tokens_own_size": own_tokens(info),  # without the stages of a smaller preset it was grown from
        "val_loss": val,
        "perplexity": math.exp(val) if isinstance(val, (int, float)) else None,
        "copy_loss_first": first,
        "copy_loss_second": second,
        "copying_ratio": ratio,
        "name_copying": names.mean_prob if names else None,
        "name_copying_first": names.first_mean_prob if names else None,
        "name_copying_heldout": heldout.mean_prob if heldout else None,
    }


def _fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def markdown(rows: list[dict]) -> str:
    lines = [
        "| checkpoint | parameters | tokens seen | steps | val loss (nats/token) | perplexity "
        "| copying ratio (2nd / 1st repeat) | name copying (1st) | held-out names |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for r in rows:
        if r.get("missing"):
            notes.append(f"- {r['name']}: {r['reason']}")
            continue
        lines.append(
            f"| {r['name']} | {r['parameters']:,} | {_fmt(r['tokens_seen'], ',')} | {_fmt(r['steps'], ',')} | "
            f"{_fmt(r['val_loss'], '.3f')} | {_fmt(r['perplexity'], '.1f')} | "
            f"{r['copying_ratio']:.3f} ({r['copy_loss_second']:.2f} / {r['copy_loss_first']:.2f}) | "
            f"{_fmt(r['name_copying'], '.1%')} ({_fmt(r['name_copying_first'], '.1%')}) | "
            f"{_fmt(r['name_copying_heldout'], '.1%')} |"
        )
    out = "\n".join(lines) + "\n\n" + COPYING_NOTE + "\n\n" + NAME_NOTE
    if notes:
        out += "\n\nNot shown:\n" + "\n".join(notes)
    return out


@input_errors_exit
def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="*", default=list(SHIPPED), help="shipped names or checkpoint folders (default: the shipped ones)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of the markdown table")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    rows = [describe(n) for n in a.checkpoints]
    if all(r.get("missing") for r in rows):  # nothing to show: an input mistake, not an empty table
        raise OptionError("no checkpoint to describe: " + "; ".join(r["reason"] for r in rows))
    if a.json:
        print(json.dumps({"rows": rows, "copying_measure": COPYING_NOTE, "name_copying_measure": NAME_NOTE}, indent=1))
    else:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
