"""Checkpoint folders: ``model.safetensors`` + ``config.json`` + ``tokenizer.json`` + ``train.json``.

The tied output matrix is stored once (as ``embed.weight``) and tied again on load. Weights may be
stored in 16-bit to keep the repository small; they are always loaded as float32.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from .model import GPT, Config

SHIPPED_DIR = Path(__file__).resolve().parent / "checkpoints"
SHIPPED = ("gpt-1", "gpt-4", "sprout")
TIED = "head.weight"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system or file system cannot, and nothing has changed then."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def pid_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` exists (another user's counts: signalling it is refused, not absent)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True


def clean_stale_writes(folder: str | Path) -> list[Path]:
    """Remove what killed writers of ``folder`` left beside it: the temporary folders ``.<name>.tmp-<pid>`` and
    ``.<name>.old-<pid>`` (:func:`save_checkpoint`) whose process is gone, or whose pid is this process's (it is
    writing none when this runs; a run restarted after a kill may get its old pid back). A live writer's folder is
    kept. Returns the paths removed."""
    folder = Path(folder)
    removed = []
    for kind in ("tmp", "old"):
        for stale in folder.parent.glob(f".{folder.name}.{kind}-*"):
            pid = stale.name.rpartition("-")[2]
            if not pid.isdigit() or (int(pid) != os.getpid() and pid_alive(int(pid))):
                continue
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
            removed.append(stale)
    return removed


def save_checkpoint(
    model: GPT, folder: str | Path, tokenizer_file: str | Path | None, train_info: dict, dtype: torch.dtype = torch.float32
) -> Path:
    """Write a checkpoint folder atomically as a whole; returns the folder.

    Everything is written into a temporary folder beside it (``.<name>.tmp-<pid>``), which then takes the
    folder's place in one rename (an atomic exchange when the folder already exists), so a kill at any
    moment leaves the old folder or the new one, never a folder missing its tokenizer; what a killed writer left
    is removed first (:func:`clean_stale_writes`). Files of the old
    folder that are not rewritten (its tokenizer.json when ``tokenizer_file`` is None, anything else)
    are carried over.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_writes(folder)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    tmp.mkdir()
    try:
        sd = {k: v.detach().to("cpu", dtype).contiguous().clone() for k, v in model.state_dict().items() if k != TIED}
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt", "dtype": str(dtype)})
        (tmp / "config.json").write_text(json.dumps(model.cfg.to_dict(), indent=1))
        (tmp / "train.json").write_text(json.dumps(train_info, indent=1))
        if tokenizer_file is not None:
            shutil.copyfile(tokenizer_file, tmp / "tokenizer.json")
        if folder.is_dir():
            for f in folder.iterdir():
                if f.is_file() and not f.name.endswith(".tmp") and not (tmp / f.name).exists():
                    shutil.copyfile(f, tmp / f.name)
            if _exchange(tmp, folder):
                shutil.rmtree(tmp)  # now the old folder
                return folder
            old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
            os.rename(folder, old)  # without an atomic exchange: for a moment there is no folder, never half of one
            os.rename(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def tokenizer_path(folder: str | Path) -> Path | None:
    """The folder's tokenizer.json, or the one shared by the shipped checkpoints beside it."""
    folder = Path(folder)
    for p in (folder / "tokenizer.json", folder.parent / "tokenizer.json"):
        if p.is_file():
            return p
    return None


class CheckpointFolderError(ValueError):
    """A checkpoint folder that cannot be loaded: a file missing or damaged, or a config that does not fit."""


#: upper bounds of Config's whole-number fields: the largest model any loader here builds (sprout_interp's loader
#: reads them as ``sprout_interp.core.limits.LIMITS``) and so the largest a training run may make
CONFIG_LIMITS: dict[str, int] = {"vocab_size": 1_000_000, "context": 65_536, "n_layer": 256, "n_head": 16_384,
                                 "d_model": 16_384, "d_ff": 65_536}


def parameter_count(cfg: Config) -> int:
    """The number of distinct parameters of ``GPT(cfg)`` (the tied matrix once), computed without building it."""
    d, hd = cfg.d_model, cfg.d_model // cfg.n_head
    return cfg.vocab_size * d + d + cfg.n_layer * (4 * d * d + 2 * hd + 2 * d + 3 * d * cfg.d_ff)


def config_problem(cfg: Config) -> str | None:
    """What makes ``cfg`` a model no loader here builds, in one sentence naming the field and its valid range, or
    None: whole numbers from 1 to :data:`CONFIG_LIMITS`, ``d_model`` a multiple of ``n_head`` with an even head
    width, a finite ``rope_base`` above 0. Checked before anything is allocated."""
    for k, v in cfg.to_dict().items():
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if k == "rope_base":
            if not (number and math.isfinite(v) and v > 0):
                return f"rope_base is {v!r:.40}; it must be a positive number"
        elif not (number and isinstance(v, int) and 0 < v <= CONFIG_LIMITS[k]):
            return f"{k} is {v!r:.40}; it must be a positive whole number of at most {CONFIG_LIMITS[k]:,}"
    if cfg.d_model % cfg.n_head or cfg.head_dim % 2:
        return f"d_model {cfg.d_model} / n_head {cfg.n_head} is not a whole, even head width"
    return None


def _config(d: object, where: Path) -> Config:
    """The Config in ``d`` after checking it (:func:`config_problem`). Raises CheckpointFolderError."""
    if not isinstance(d, dict):
        raise CheckpointFolderError(f"{where} holds a JSON {type(d).__name__}, not an object")
    cfg = Config.from_dict(d)
    problem = config_problem(cfg)
    if problem:
        raise CheckpointFolderError(f"{where}: {problem}")
    return cfg


def load_folder(folder: str | Path) -> tuple[GPT, dict]:
    """A GPT in float32 from a checkpoint folder, with its train.json (empty if absent).

    The config is checked against the tensors' sizes in the safetensors header before the model is built,
    so a config asking for a huge model costs nothing. Raises CheckpointFolderError (a ValueError) saying
    what is wrong; ``sprout_interp.load_checkpoint`` checks far more and is what to use on others' files.
    """
    folder = Path(folder)
    for name in ("config.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise CheckpointFolderError(
                f"{folder} is not a checkpoint folder: it has no {name} (sprout_model.train writes one to <run>/checkpoint)"
            )
    try:
        cfg = _config(json.loads((folder / "config.json").read_text(encoding="utf-8")), folder / "config.json")
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            stored = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        wanted = parameter_count(cfg)
        if stored != wanted:
            raise CheckpointFolderError(
                f"{folder / 'config.json'} describes a model of {wanted:,} parameters but model.safetensors holds "
                f"{stored:,}: the config and the weights are from different models"
            )
        model = GPT(cfg)
        sd = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
        sd.setdefault(TIED, sd["embed.weight"])
        model.load_state_dict(sd, strict=True)
        info_file = folder / "train.json"
        info = json.loads(info_file.read_text(encoding="utf-8")) if info_file.is_file() else {}
    except CheckpointFolderError:
        raise
    except (ValueError, RecursionError, KeyError, RuntimeError, OSError, SafetensorError) as e:
        detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise CheckpointFolderError(
            f"{folder} cannot be loaded ({type(e).__name__}: {detail}); it is damaged or not a Sprout checkpoint folder"
        ) from None
    model.eval()
    return model, info
