"""Copy a finished run's best checkpoint into ``model/checkpoints/<preset>/`` in 16-bit.

    python -m sprout_model.ship gpt-4 [--run runs/gpt-4] [--data data/default]
    python -m sprout_model.ship sprout --run runs/sprout --data data/names-splice --to /tmp/candidate   # measure first

Weights are stored as float16 (half the bytes; loaded back as float32) and the tokenizer is shared by
all shipped checkpoints as ``model/checkpoints/tokenizer.json``. The validation loss is measured again
on the 16-bit weights, on every window of 256 tokens of the validation split (the same windows for
every preset, whatever each run evaluated during training), so ``train.json`` describes what ships
and the three shipped losses compare like with like.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from .checkpoint import SHIPPED, SHIPPED_DIR, load_folder, save_checkpoint
from .cli import ArgumentParser, input_errors_exit, writable_folder
from .corpus import open_tokens
from .model import GPT
from .run_state import read_state
from .train import loss_on_every_window

VAL_SEQ_LEN = 256  # the shipped validation loss: every non-overlapping window of this many tokens


def last_weights(run: Path) -> tuple[GPT, dict]:
    """The run's last weights (``state.pt``) and a train.json for them: the checkpoint folder's, with the
    steps, tokens, history and validation loss of the last step."""
    model, info = load_folder(run / "checkpoint")
    state = read_state(run / "state.pt")
    last = GPT(model.cfg)
    last.load_state_dict(state["model"])
    info = {**info, "steps": state["step"], "tokens_seen": state["tokens_seen"], "history": state["history"],
            "wall_time_s": round(state["wall"], 1), "weights": "last step (state.pt), not the best validation loss"}
    if state["history"]:
        info["val_loss"] = state["history"][-1]["val_loss"]
    return last, info


def ship(preset: str, run: str | Path | None = None, data: str | Path | None = None, root: Path = SHIPPED_DIR,
         last: bool = False) -> dict:
    """Write the shipped folder ``root/<preset>`` (and ``root/tokenizer.json``) from the run's best
    checkpoint, or with ``last`` from its last weights; returns its train.json."""
    run = Path(run or f"runs/{preset}")
    src = run / "checkpoint"
    model, info = last_weights(run) if last else load_folder(src)
    dst = Path(root) / preset
    save_checkpoint(model, dst, None, info, dtype=torch.float16)
    shutil.copyfile(src / "tokenizer.json", Path(root) / "tokenizer.json")
    (dst / "tokenizer.json").unlink(missing_ok=True)  # one shared tokenizer beside the folders
    shipped, _ = load_folder(dst)
    args = info.get("args", {})
    data = Path(data or args.get("data", "data/default"))
    if (data / "val.bin").is_file():
        val = open_tokens(data / "val.bin", shipped.cfg.vocab_size)
        seq_len = min(VAL_SEQ_LEN, shipped.cfg.context)
        loss, windows = loss_on_every_window(shipped, val, seq_len)
        info["val_loss_training_windows"] = info.get("val_loss")  # float32, the windows this run evaluated on
        info["val_loss"] = round(loss, 4)
        info["val_loss_windows"] = f"all {windows:,} windows of {seq_len} tokens of {data / 'val.bin'}"
        info["weights_dtype"] = "float16"
        (dst / "train.json").write_text(json.dumps(info, indent=1))
    return info


@input_errors_exit
def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("preset", choices=SHIPPED)
    p.add_argument("--run", default=None)
    p.add_argument("--data", default=None)
    p.add_argument("--last", action="store_true",
                   help="ship the last weights (state.pt) instead of the best checkpoint, e.g. when the "
                        "validation loss is flat at the end and the last step is the one that saw every token")
    p.add_argument("--to", default=None,
                   help="write the folder here instead of model/checkpoints: a candidate to measure (sprout_model.info, "
                        "the analyses' --models) before it replaces what ships")
    a = p.parse_args(argv)
    writable_folder(a.to or SHIPPED_DIR, "--to")
    info = ship(a.preset, a.run, a.data, root=Path(a.to) if a.to else SHIPPED_DIR, last=a.last)
    what = f"wrote {a.preset} to {a.to}" if a.to else f"shipped {a.preset}"
    print(f"{what}: {info['tokens_seen']:,} tokens, validation loss {info['val_loss']} nats/token "
          f"over {info.get('val_loss_windows')} (during training: {info.get('val_loss_training_windows')})")


if __name__ == "__main__":
    main()
