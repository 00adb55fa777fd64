"""Checkpoint folders: ``model.safetensors`` + ``config.json`` + ``tokenizer.json`` + ``train.json``.

The tied output matrix is stored once (as ``embed.weight``) and tied again on load. Weights may be
stored in 16-bit to keep the repository small; they are always loaded as float32.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .model import GPT, Config

SHIPPED_DIR = Path(__file__).resolve().parent / "checkpoints"
SHIPPED = ("gpt-1", "gpt-4", "sprout")
TIED = "head.weight"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save_checkpoint(
    model: GPT, folder: str | Path, tokenizer_file: str | Path | None, train_info: dict, dtype: torch.dtype = torch.float32
) -> Path:
    """Write a checkpoint folder atomically file by file; returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(dtype).contiguous().clone() for k, v in model.state_dict().items() if k != TIED}
    tmp = folder / "model.safetensors.tmp"
    save_file(sd, str(tmp), metadata={"format": "pt", "dtype": str(dtype)})
    os.replace(tmp, folder / "model.safetensors")
    atomic_write_bytes(folder / "config.json", json.dumps(model.cfg.to_dict(), indent=1).encode())
    atomic_write_bytes(folder / "train.json", json.dumps(train_info, indent=1).encode())
    if tokenizer_file is not None and Path(tokenizer_file).resolve() != (folder / "tokenizer.json").resolve():
        shutil.copyfile(tokenizer_file, folder / "tokenizer.json.tmp")
        os.replace(folder / "tokenizer.json.tmp", folder / "tokenizer.json")
    return folder


def tokenizer_path(folder: str | Path) -> Path | None:
    """The folder's tokenizer.json, or the one shared by the shipped checkpoints beside it."""
    folder = Path(folder)
    for p in (folder / "tokenizer.json", folder.parent / "tokenizer.json"):
        if p.is_file():
            return p
    return None


def load_folder(folder: str | Path) -> tuple[GPT, dict]:
    """A GPT in float32 from a checkpoint folder, with its train.json (empty if absent). No error wrapping."""
    folder = Path(folder)
    cfg = Config.from_dict(json.loads((folder / "config.json").read_text()))
    model = GPT(cfg)
    sd = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    sd.setdefault(TIED, sd["embed.weight"])
    model.load_state_dict(sd, strict=True)
    model.eval()
    info_file = folder / "train.json"
    info = json.loads(info_file.read_text()) if info_file.is_file() else {}
    return model, info
