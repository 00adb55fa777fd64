"""Course ``.pt`` files: ``torch.load(weights_only=True)`` and nothing else.

The pickle is first read statically (never executed): its length and opcode count are bounded by the tensors it
describes, and every global it names must be one torch allows; a pickled ``*Config`` object is rebuilt as an inert
attribute bag, never by importing its class. A file that would run code is refused with
:class:`~sprout_interp.core.errors.UnsafeCheckpointError`.
"""
from __future__ import annotations

import io
import pickle
import pickletools
import re
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from sprout_interp.core import limits
from sprout_interp.core.errors import InvalidConfigError, NotACheckpointError, UnsafeCheckpointError
from sprout_interp.core.files import open_regular
from sprout_model.checkpoint import SHIPPED

__all__ = ["read_torch_file", "STATE_KEYS", "CONFIG_KEYS", "TORCH_SUFFIXES"]

STATE_KEYS = ("model", "state_dict", "model_state_dict")
CONFIG_KEYS = ("config", "cfg", "model_config")
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


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


def _scan_pickles(stream: io.BufferedIOBase, path: Path, count: int) -> list[str]:
    """The classes and functions up to ``count`` pickles in a row name, read statically, never executed.

    Stops at the first thing that is not a pickle (a legacy torch file's raw storage bytes). Raises
    :class:`NotACheckpointError` when the opcodes outnumber what the tensors they describe need
    (``limits.PICKLE_OPS`` plus ``limits.PICKLE_OPS_PER_TENSOR`` a tensor), so unpickling costs bounded time.
    """
    names: list[str] = []
    ops = tensors = 0
    for _ in range(count):
        found, strings = [], []
        try:
            for op, arg, _pos in pickletools.genops(stream):
                ops += 1
                if op.name in ("BINPERSID", "PERSID"):
                    tensors += 1
                elif op.name in ("GLOBAL", "INST"):
                    found.append(str(arg).replace(" ", "."))
                elif op.name == "STACK_GLOBAL":
                    found.append(".".join(strings[-2:]) if len(strings) >= 2 else "<a global>")
                elif isinstance(arg, str):
                    strings.append(arg)
                    del strings[:-2]
                if ops > limits.PICKLE_OPS + limits.PICKLE_OPS_PER_TENSOR * tensors:
                    raise NotACheckpointError(
                        f"{path} is refused: its pickle runs to more than {ops:,} instructions for {tensors:,} "
                        "tensors, far more than weights need, so unpickling it would cost time out of all proportion. Re-save "
                        "just the weights: torch.save({'model': model.state_dict(), 'config': asdict(cfg)}, path)"
                    )
        except NotACheckpointError:
            raise
        except Exception:
            break
        names += found  # only pickles that parse to their STOP count
    return list(dict.fromkeys(names))


def _zip_pickle(path: Path) -> bytes:
    """The ``data.pkl`` of a torch zip archive, of bounded size.

    The other records (the tensors' storages) may unpack to no more bytes than the file holds: torch.save stores
    them uncompressed, and a compressed one would make a small file ask for gigabytes when torch reads it.
    """
    try:
        with zipfile.ZipFile(path) as z:
            pkls = [i for i in z.infolist() if i.filename.endswith("data.pkl")]
            if len(pkls) != 1:
                raise _not_a_checkpoint(path, ValueError(f"a zip archive with {len(pkls)} data.pkl records"))
            unpacked = sum(i.file_size for i in z.infolist() if i is not pkls[0])
            if unpacked > path.stat().st_size:
                raise NotACheckpointError(
                    f"{path} is refused: its records unpack to {unpacked:,} bytes, more than the {path.stat().st_size:,}-byte "
                    "file holds (they are compressed, which torch.save never does), so reading it would allocate "
                    "far more than the file's size. Re-save the weights with torch.save(model.state_dict(), path)"
                )
            if pkls[0].file_size > limits.MAX_PICKLE_BYTES:
                raise NotACheckpointError(
                    f"{path} is refused: its pickle is {pkls[0].file_size:,} bytes unpacked, more than weights need "
                    f"({limits.MAX_PICKLE_BYTES:,}). Re-save just the weights with torch.save(model.state_dict(), path)"
                )
            with z.open(pkls[0]) as f:
                data = f.read(limits.MAX_PICKLE_BYTES + 1)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, ValueError) as e:
        raise _not_a_checkpoint(path, e) from None
    if len(data) > limits.MAX_PICKLE_BYTES:
        raise NotACheckpointError(f"{path} is refused: its pickle unpacks to more than {limits.MAX_PICKLE_BYTES:,} bytes")
    return data


def _refuse(path: Path, unsafe: list[str]) -> UnsafeCheckpointError:
    shown = ", ".join(unsafe[:limits.SHOW]) + (f" and {len(unsafe) - limits.SHOW} more" if len(unsafe) > limits.SHOW else "")
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
    with open_regular(path, limits.MAX_WEIGHTS_BYTES, "weights file") as f:
        is_zip = zipfile.is_zipfile(f)
        if not is_zip:
            f.seek(0)
            scanned = _scan_pickles(f, path, 8)  # legacy torch files are a few pickles in a row, then raw bytes
    if is_zip:
        import io

        _scan_pickles(io.BytesIO(_zip_pickle(path)), path, 1)
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
            more_scanned = [] if is_zip else [g for g in scanned if not _allowed_by_torch(g)]
            more = [g for g in dict.fromkeys(named + more_scanned) if g not in unsafe]
            if not more:
                if re.search(r"GLOBAL|reduce|Can only (create|build)|is blocked", str(e)):
                    raise _refuse(path, unsafe or ["an object torch does not allow"]) from None
                raise _not_a_checkpoint(path, e) from None
            unsafe += more  # retry, standing in for any *Config classes; refuse anything else
        except (RecursionError, MemoryError):
            raise
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


def read_torch_file(path: Path) -> tuple[dict, dict | None, dict]:
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
    keys = ", ".join(repr(k)[:60] for k in list(obj)[:8])
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
    raise InvalidConfigError(f"the 'config' in {path} is a {type(cfg).__name__}; expected a dict or a Config object")
