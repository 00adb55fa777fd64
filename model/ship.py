"""Copy a finished run's best checkpoint into ``model/checkpoints/<preset>/`` in 16-bit.

    python -m sprout_model.ship gpt-4 [--run runs/gpt-4] [--data data/default]

Weights are stored as float16 (half the bytes; loaded back as float32) and the tokenizer is shared by
all shipped checkpoints as ``model/checkpoints/tokenizer.json``. The validation loss is measured again
on the 16-bit weights, on the same windows training used, so ``train.json`` describes what ships.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch

from .checkpoint import SHIPPED, SHIPPED_DIR, load_folder, save_checkpoint
from .train import evaluate


def ship(preset: str, run: str | Path | None = None, data: str | Path | None = None) -> dict:
    """Write the shipped folder for ``preset``; returns its train.json."""
    src = Path(run or f"runs/{preset}") / "checkpoint"
    model, info = load_folder(src)
    dst = SHIPPED_DIR / preset
    save_checkpoint(model, dst, None, info, dtype=torch.float16)
    shutil.copyfile(src / "tokenizer.json", SHIPPED_DIR / "tokenizer.json")
    (dst / "tokenizer.json").unlink(missing_ok=True)  # one shared tokenizer beside the folders
    shipped, _ = load_folder(dst)
    args = info.get("args", {})
    data = Path(data or args.get("data", "data/default"))
    if (data / "val.bin").is_file():
        val = np.memmap(data / "val.bin", dtype=np.uint16, mode="r")
        with torch.no_grad():
            loss = evaluate(shipped, val, args.get("seq_len", 256), args.get("eval_batches", 20), args.get("batch_size", 16))
        info["val_loss_float32"] = info.get("val_loss")
        info["val_loss"] = round(loss, 4)
        info["weights_dtype"] = "float16"
        (dst / "train.json").write_text(json.dumps(info, indent=1))
    return info


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("preset", choices=SHIPPED)
    p.add_argument("--run", default=None)
    p.add_argument("--data", default=None)
    a = p.parse_args(argv)
    info = ship(a.preset, a.run, a.data)
    print(f"shipped {a.preset}: {info['tokens_seen']:,} tokens, validation loss {info['val_loss']} nats/token "
          f"(float32 before rounding: {info.get('val_loss_float32')})")


if __name__ == "__main__":
    main()
