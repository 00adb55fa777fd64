"""Load Sprout weights and their tokenizer from a shipped name, a checkpoint folder or a course file.

Accepted inputs:

- a shipped name: ``"gpt-1"``, ``"gpt-4"``, ``"sprout"`` (any case), found in
  ``sprout_model/checkpoints/<name>/``. A shipped name wins over a local folder of the same
  name; write ``"./sprout"`` for the folder;
- a checkpoint folder: ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``,
  ``train.json``), as written by ``sprout_model.checkpoint.save_checkpoint``;
- a ``.safetensors`` file (config from a ``config.json`` beside it, else inferred from shapes);
- a course-style ``.pt``/``.pth`` file written by ``torch.save``: a raw state dict, or a dict
  holding it under ``model`` or ``state_dict`` and optionally a ``config`` (a dict, or a
  ``Config`` dataclass object). It is read with ``torch.load(weights_only=True)`` only, so a
  file that would run code when unpickled is refused, never executed. A pickled ``*Config``
  object is rebuilt as an inert attribute bag, never by importing its class.

``_orig_mod.`` (``torch.compile``) and ``module.`` (DDP) key prefixes are stripped. Without a
config the shape of every hyper-parameter is read off the weights (``context`` is not visible in
the weights and defaults to 512, ``rope_base`` to 10000).
"""
from __future__ import annotations

import json
import os
import pickle
import pickletools
import re
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from tokenizers import Tokenizer

from sprout_model.checkpoint import SHIPPED, TIED, tokenizer_path
from sprout_model.checkpoint import SHIPPED_DIR as _SHIPPED_DIR
from sprout_model.model import GPT, Config

from .errors import (
    CheckpointNotFoundError,
    NotACheckpointError,
    StateDictMismatchError,
    UnsafeCheckpointError,
    VocabularyMismatchError,
)

SHIPPED_DIR: Path = _SHIPPED_DIR  # module attribute so tests can point it at a temporary folder
DEFAULT_CONTEXT = 512
DEFAULT_ROPE_BASE = 10000.0
PREFIXES = ("_orig_mod.", "module.")
STATE_KEYS = ("model", "state_dict", "model_state_dict")
CONFIG_KEYS = ("config", "cfg", "model_config")
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
_SHOW = 5  # how many keys an error message names


@dataclass
class LoadedCheckpoint:
    model: GPT  # float32, eval mode, on the CPU
    tokenizer: Tokenizer
    info: dict = field(default_factory=dict)  # train.json (empty if none), plus notes such as "tokenizer_note"
    source: str = ""  # the resolved path the weights came from
    name: str = ""  # a short display name ("gpt-4", a folder or file name)


def load_checkpoint(name_or_path: str | os.PathLike, tokenizer: str | os.PathLike | Tokenizer | None = None) -> LoadedCheckpoint:
    """A float32 eval-mode :class:`GPT` with its tokenizer; see the module docstring for the inputs.

    ``tokenizer`` overrides the tokenizer: a ``tokenizer.json`` path, a folder holding one, or a
    ``tokenizers.Tokenizer``. Otherwise the first of: ``tokenizer.json`` beside the weights, in
    the folder above them, or the shipped one (then ``info["tokenizer_note"]`` says so).
    Raises a :class:`~sprout_interp.errors.SproutError` subclass for every input mistake.
    """
    path, name = _resolve(name_or_path)
    info: dict = {}
    if path.is_dir():
        sd, cfg, info = _read_folder(path)
        weights_dir = path
    elif path.suffix == ".safetensors":
        sd = _read_safetensors(path)
        cfg = _read_json(path.parent / "config.json", "config") if (path.parent / "config.json").is_file() else None
        if (path.parent / "train.json").is_file():
            info = _read_train_json(path.parent / "train.json")
        weights_dir = path.parent
    else:
        sd, cfg, info = _read_torch_file(path)
        weights_dir = path.parent
    model = build_model(sd, cfg, source=str(path))
    tok, note = _resolve_tokenizer(tokenizer, weights_dir)
    info = dict(info)
    if note:
        info["tokenizer_note"] = note
    n_tok = tok.get_vocab_size()
    if n_tok != model.cfg.vocab_size:
        hint = f" ({note})" if note else ""
        raise VocabularyMismatchError(
            f"the tokenizer has {n_tok:,} tokens but the model in {path} has a vocabulary of "
            f"{model.cfg.vocab_size:,} (its embedding has {model.cfg.vocab_size:,} rows){hint}. Pass the "
            "tokenizer.json the model was trained with: load_checkpoint(path, tokenizer='.../tokenizer.json')"
        )
    return LoadedCheckpoint(model=model, tokenizer=tok, info=info, source=str(path), name=name)


# --- where the checkpoint is -------------------------------------------------------------------


def _resolve(name_or_path: str | os.PathLike) -> tuple[Path, str]:
    if isinstance(name_or_path, str) and name_or_path.strip().lower() in SHIPPED:
        name = name_or_path.strip().lower()
        folder = Path(SHIPPED_DIR) / name
        if not folder.is_dir():
            raise CheckpointNotFoundError(
                f"the shipped checkpoint {name!r} is not installed (looked in {folder}). Use a full clone of "
                f"the repository, which ships it, or train it: `python -m sprout_model.prepare` then "
                f"`python -m sprout_model.train --preset {name}`, and load its runs/{name}/checkpoint folder"
            )
        return folder, name
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"expected a shipped name or a path, got {type(name_or_path).__name__}")
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise CheckpointNotFoundError(
            f"no checkpoint at {str(name_or_path)!r}: it is neither a shipped name ({', '.join(SHIPPED)}) nor an "
            f"existing file or folder (looked for {path.resolve()}). Check the spelling, or pass a checkpoint "
            "folder or a .pt/.pth file"
        )
    path = path.resolve()
    if path.is_file() and path.name in ("config.json", "train.json", "tokenizer.json"):
        path = path.parent  # a file inside a checkpoint folder: load the folder
    if path.is_dir():
        name = f"{path.parent.name}/{path.name}" if path.name in ("checkpoint", "checkpoints", "final", "best", "latest") else path.name
    else:
        name = path.stem
    return path, name


def _read_json(p: Path, what: str) -> dict:
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise NotACheckpointError(f"{p} is not valid JSON ({e}); the {what} file of a checkpoint folder is a JSON object") from None
    if not isinstance(d, dict):
        raise NotACheckpointError(f"{p} holds a JSON {type(d).__name__}, not an object; the {what} file of a checkpoint folder is a JSON object")
    return d


def _read_train_json(p: Path) -> dict:
    try:
        return _read_json(p, "train")
    except NotACheckpointError as e:  # the weights are still usable
        return {"train_json_note": str(e)}


def _read_folder(folder: Path) -> tuple[dict, dict, dict]:
    missing = [f for f in ("config.json", "model.safetensors") if not (folder / f).is_file()]
    if missing:
        hints = []
        sub = sorted(p.parent.name for p in folder.glob("*/model.safetensors") if (p.parent / "config.json").is_file())
        if sub:
            hints.append(f"it holds checkpoint folder(s) {', '.join(sub)}: pass {folder / sub[0]}")
        files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix in TORCH_SUFFIXES + (".safetensors",))
        if files and not sub:
            hints.append(f"it holds weight file(s) {', '.join(files[:_SHOW])}: pass one of them")
        hint = "; ".join(hints) if hints else "pass a checkpoint folder, a .pt/.pth file or a shipped name (" + ", ".join(SHIPPED) + ")"
        raise NotACheckpointError(
            f"{folder} is a folder but not a Sprout checkpoint: it has no {' and no '.join(missing)}. A checkpoint "
            f"folder holds model.safetensors and config.json (plus tokenizer.json and train.json); {hint}"
        )
    cfg = _read_json(folder / "config.json", "config")
    sd = _read_safetensors(folder / "model.safetensors")
    info = _read_train_json(folder / "train.json") if (folder / "train.json").is_file() else {}
    return sd, cfg, info


def _read_safetensors(p: Path) -> dict:
    from safetensors.torch import load_file

    try:
        return load_file(str(p))
    except Exception as e:  # safetensors raises its own SafetensorError (or OSError) for damaged files
        raise NotACheckpointError(
            f"{p} cannot be read as safetensors ({type(e).__name__}: {e}); the file is damaged or not a "
            "safetensors file. Copy or download it again, or re-save the model with save_checkpoint"
        ) from None


# --- course .pt files: torch.load(weights_only=True) and nothing else ----------------------------


class _InertConfig:
    """Stands in for a pickled ``*Config`` object: keeps its fields, runs no code of the original class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


def _is_config_name(full_name: str) -> bool:
    return bool(re.fullmatch(r"\w*Config", full_name.rsplit(".", 1)[-1]))


def _allowed_by_torch(full_name: str) -> bool:
    try:
        from torch import _weights_only_unpickler as wou

        return full_name in wou._get_allowed_globals() or full_name in wou._get_user_allowed_globals()
    except Exception:  # private API moved: fall back to torch's own namespace and plain containers
        return full_name.startswith("torch.") or full_name in ("collections.OrderedDict", "_codecs.encode")


def _pickle_globals(path: Path) -> list[str]:
    """The classes and functions a (non-zip) pickle stream names, read statically, never executed."""
    names: list[str] = []
    try:
        with open(path, "rb") as f:
            for _ in range(8):  # legacy torch files are a few pickles in a row, then raw storage bytes
                found, strings = [], []
                for op, arg, _pos in pickletools.genops(f):
                    if op.name in ("GLOBAL", "INST"):
                        found.append(str(arg).replace(" ", "."))
                    elif op.name == "STACK_GLOBAL":
                        found.append(".".join(strings[-2:]) if len(strings) >= 2 else "<a global>")
                    elif isinstance(arg, str):
                        strings.append(arg)
                names += found  # only pickles that parse to their STOP count
    except Exception:
        pass
    return list(dict.fromkeys(names))


def _refuse(path: Path, unsafe: list[str]) -> UnsafeCheckpointError:
    shown = ", ".join(unsafe[:_SHOW]) + (f" and {len(unsafe) - _SHOW} more" if len(unsafe) > _SHOW else "")
    hint = ""
    if (path.parent / "checkpoint" / "model.safetensors").is_file():
        hint = f" This looks like a training-state file; load the checkpoint folder beside it: {path.parent / 'checkpoint'}."
    return UnsafeCheckpointError(
        f"refused to load {path}: unpickling it would import or call {shown}, which could run arbitrary code, "
        "so it was not executed. Sprout reads .pt files with torch.load(weights_only=True): tensors, numbers, "
        "strings and plain containers only. If you trust the file, re-save just the weights where you made it: "
        "torch.save({'model': model.state_dict(), 'config': dataclasses.asdict(cfg)}, 'sprout.pt')." + hint
    )


def _torch_load(path: Path) -> Any:
    is_zip = zipfile.is_zipfile(path)
    unsafe: list[str] = []
    if is_zip:
        try:
            unsafe = list(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
        except Exception as e:
            if "torchscript" in str(e).lower():
                raise NotACheckpointError(
                    f"{path} is a TorchScript archive (torch.jit.save), not a state dict; save "
                    "model.state_dict() with torch.save and load that file"
                ) from None
            raise _not_a_checkpoint(path, e) from None
    for _attempt in range(4):
        config_like = [g for g in unsafe if _is_config_name(g)]
        if len(config_like) < len(unsafe):
            raise _refuse(path, [g for g in unsafe if not _is_config_name(g)])
        try:
            with torch.serialization.safe_globals([(_InertConfig, g) for g in config_like]), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Detected pickle protocol")  # refused anyway if unsafe
                return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            named = re.findall(r"GLOBAL (\S+) (?:was not an allowed global|whose module)", str(e))
            scanned = [] if is_zip else [g for g in _pickle_globals(path) if not _allowed_by_torch(g)]
            more = [g for g in dict.fromkeys(named + scanned) if g not in unsafe]
            if not more:
                if re.search(r"GLOBAL|reduce|Can only (create|build)|is blocked", str(e)):
                    raise _refuse(path, unsafe or ["an object torch does not allow"]) from None
                raise _not_a_checkpoint(path, e) from None
            unsafe += more  # retry, standing in for any *Config classes; refuse anything else
        except Exception as e:
            raise _not_a_checkpoint(path, e) from None
    raise _refuse(path, unsafe)


def _not_a_checkpoint(path: Path, e: BaseException) -> NotACheckpointError:
    detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    return NotACheckpointError(
        f"{path} is not a checkpoint torch can read ({type(e).__name__}{': ' + detail if detail else ''}). Expected "
        "a file written by torch.save (a state dict, or a dict with 'model'/'state_dict' and 'config'), a "
        "checkpoint folder, or a shipped name (" + ", ".join(SHIPPED) + "). If it was copied or downloaded, it may "
        "be incomplete: fetch it again"
    )


def _read_torch_file(path: Path) -> tuple[dict, dict | None, dict]:
    """(state dict, config dict or None, the wrapper's plain entries such as a step count)."""
    obj = _torch_load(path)
    if not isinstance(obj, Mapping):
        raise NotACheckpointError(
            f"{path} holds a {type(obj).__name__}, not a state dict. Save the weights with "
            "torch.save(model.state_dict(), path) or torch.save({'model': model.state_dict(), 'config': asdict(cfg)}, path)"
        )
    cfg = None
    for k in CONFIG_KEYS:
        if k in obj and not isinstance(obj[k], torch.Tensor):
            cfg = obj[k]
            break
    for k in STATE_KEYS:
        if k in obj and isinstance(obj[k], Mapping):
            extra = {str(n): v for n, v in obj.items() if isinstance(v, (int, float, str, bool))}
            return dict(obj[k]), _config_dict(cfg, path), extra
    if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return dict(obj), _config_dict(cfg, path), {}
    keys = ", ".join(repr(k) for k in list(obj)[:8])
    raise NotACheckpointError(
        f"{path} holds a dict with keys {keys} but no weights: expected a state dict of tensors, or a dict holding "
        f"one under {' or '.join(repr(k) for k in STATE_KEYS[:2])}. Save with torch.save({{'model': model.state_dict()}}, path)"
    )


def _config_dict(cfg: Any, path: Path) -> dict | None:
    if cfg is None:
        return None
    if isinstance(cfg, Mapping):
        return dict(cfg)
    if hasattr(cfg, "__dict__"):
        return dict(vars(cfg))
    raise NotACheckpointError(f"the 'config' in {path} is a {type(cfg).__name__}; expected a dict or a Config object")


# --- from a state dict to a model ---------------------------------------------------------------


def strip_prefixes(sd: Mapping[str, Any]) -> dict[str, Any]:
    """Keys without ``_orig_mod.`` (torch.compile) and ``module.`` (DDP) prefixes, in any combination."""
    out = {}
    for k, v in sd.items():
        k = str(k)
        while k.startswith(PREFIXES):
            k = k[len(next(p for p in PREFIXES if k.startswith(p))):]
        out[k] = v
    return out


def _few(keys: list[str]) -> str:
    return ", ".join(keys[:_SHOW]) + (f" (and {len(keys) - _SHOW} more)" if len(keys) > _SHOW else "")


def infer_config(sd: Mapping[str, torch.Tensor], context: int = DEFAULT_CONTEXT, rope_base: float = DEFAULT_ROPE_BASE) -> Config:
    """The Config a Sprout state dict was built with, read off its shapes (context and rope_base are not in them)."""
    needed = ["embed.weight", "blocks.0.attn.q_norm.weight", "blocks.0.ffn.w1.weight"]
    missing = [k for k in needed if k not in sd]
    if missing:
        raise StateDictMismatchError(
            f"cannot read the model's shape: the weights lack {_few(missing)} (found keys such as "
            f"{_few(sorted(sd)) or 'none'}). This is not a Sprout/course GPT state dict, or its keys are renamed"
        )
    vocab_size, d_model = sd["embed.weight"].shape
    head_dim = sd["blocks.0.attn.q_norm.weight"].numel()
    if head_dim == 0 or d_model % head_dim:
        raise StateDictMismatchError(
            f"d_model {d_model} (from embed.weight) is not a multiple of the head size {head_dim} "
            "(from blocks.0.attn.q_norm.weight), so the head count cannot be inferred; pass a config"
        )
    n_layer = 1 + max(int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k)))
    return Config(
        vocab_size=int(vocab_size), context=context, n_layer=n_layer, n_head=d_model // head_dim,
        d_model=int(d_model), d_ff=int(sd["blocks.0.ffn.w1.weight"].shape[0]), rope_base=rope_base,
    )


def build_model(sd: Mapping[str, Any], cfg: Mapping[str, Any] | Config | None = None, source: str = "the weights") -> GPT:
    """A float32 eval-mode GPT holding ``sd`` (prefixes stripped, ``head.weight`` tied), checked key by key.

    ``cfg`` fields that are present win; the others are inferred from the shapes.
    """
    sd = {k: v for k, v in strip_prefixes(sd).items() if isinstance(v, torch.Tensor)}
    cfg = cfg.to_dict() if isinstance(cfg, Config) else dict(cfg or {})
    given = {k: v for k, v in cfg.items() if k in Config().to_dict()}
    if {"vocab_size", "d_model", "n_layer", "n_head", "d_ff"} <= set(given):
        config = Config.from_dict(given)  # a full config: a wrong one shows up as a shape mismatch below
    else:
        config = Config.from_dict({**infer_config(sd).to_dict(), **given})
    if config.n_head <= 0 or config.d_model % config.n_head:
        raise StateDictMismatchError(f"the config in {source} has d_model {config.d_model} not divisible by n_head {config.n_head}")
    model = GPT(config)
    if TIED in sd and "embed.weight" in sd and sd[TIED].shape == sd["embed.weight"].shape:
        if not torch.equal(sd[TIED], sd["embed.weight"]):
            raise StateDictMismatchError(
                f"head.weight differs from embed.weight in {source}: these weights were trained without weight "
                "tying, but Sprout's output matrix is its embedding (one tensor). They cannot be loaded unchanged"
            )
    if TIED not in sd and "embed.weight" in sd:
        sd[TIED] = sd["embed.weight"]  # stored once; tie it again
    expected = model.state_dict()
    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} key(s): {_few(missing)}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} key(s): {_few(unexpected)}")
        raise StateDictMismatchError(
            f"the weights in {source} do not fit a Sprout model with {_describe(config)}: {'; '.join(parts)}. "
            "Check that the file holds a Sprout/course GPT state dict and that its config matches the weights"
        )
    bad = [(k, tuple(sd[k].shape), tuple(v.shape)) for k, v in expected.items() if tuple(sd[k].shape) != tuple(v.shape)]
    if bad:
        k, got, want = bad[0]
        more = f" (and {len(bad) - 1} more mismatched tensors)" if len(bad) > 1 else ""
        raise StateDictMismatchError(
            f"shape mismatch in {source}: {k} has shape {got} in the file but {want} in a Sprout model with "
            f"{_describe(config)}{more}. The config does not match the weights: fix config.json (or the 'config' "
            "entry), or drop it to have the shapes inferred"
        )
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sd.items()}, strict=True)
    return model.float().eval()


def _describe(cfg: Config) -> str:
    return (f"vocab_size={cfg.vocab_size}, n_layer={cfg.n_layer}, n_head={cfg.n_head}, "
            f"d_model={cfg.d_model}, d_ff={cfg.d_ff}")


# --- the tokenizer -------------------------------------------------------------------------------


def _read_tokenizer(p: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:
        raise NotACheckpointError(
            f"{p} is not a Hugging Face tokenizers file ({type(e).__name__}: {str(e)[:200]}); pass the "
            "tokenizer.json the model was trained with"
        ) from None


def _resolve_tokenizer(tokenizer: str | os.PathLike | Tokenizer | None, weights_dir: Path) -> tuple[Tokenizer, str | None]:
    if isinstance(tokenizer, Tokenizer):
        return tokenizer, None
    if tokenizer is not None:
        p = Path(tokenizer).expanduser()
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise CheckpointNotFoundError(
                f"no tokenizer at {p}: pass the path of a tokenizer.json file (or a folder holding one)"
            )
        return _read_tokenizer(p), None
    p = tokenizer_path(weights_dir)
    if p is not None:
        return _read_tokenizer(p), None
    shipped = Path(SHIPPED_DIR) / "tokenizer.json"
    if shipped.is_file():
        return _read_tokenizer(shipped), (
            f"no tokenizer.json beside the weights in {weights_dir} or above them; assumed the shipped "
            f"tokenizer ({shipped}). Pass tokenizer=... if the model was trained with another one"
        )
    raise CheckpointNotFoundError(
        f"no tokenizer.json beside the weights in {weights_dir}, nor in the folder above, and the shipped "
        f"tokenizer is not installed ({shipped}). Pass tokenizer='path/to/tokenizer.json'"
    )
