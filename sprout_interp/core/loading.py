"""Load Sprout weights and their tokenizer from a shipped name, a checkpoint folder or a course file.

Accepted inputs:

- a shipped name: ``"gpt-1"``, ``"gpt-4"``, ``"sprout"`` (any case), found in
  ``sprout_model/checkpoints/<name>/``. A shipped name wins over a local folder of the same
  name; write ``"./sprout"`` for the folder;
- a checkpoint folder: ``config.json`` + ``model.safetensors`` + ``tokenizer.json`` (+
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

What is refused, before anything big is allocated (each with a :class:`SproutError` subclass
whose message says what to do):

- anything but a regular file or a folder (devices such as ``/dev/zero``, FIFOs, sockets), a
  symlink loop, a path that cannot be read, files larger than the limits below;
- a config whose values are not positive whole numbers in range (``n_layer`` up to 256, ``context``
  up to 65,536, ...), whose ``d_model`` is not a multiple of ``n_head`` with an even head width, or
  whose ``rope_base`` is not a finite positive number; a config that does not fit the tensor shapes
  (read from the safetensors header before any tensor is read);
- a ``.pt`` whose pickle is far longer than its tensors need (its cost to unpickle is bounded);
- weights holding NaN or infinity, or tensors that are not floating point (bool, integer, complex);
- weights without a ``tokenizer.json`` of their own (beside them, or in the folder above, where the
  shipped checkpoints share one), unless a tokenizer is passed; a passed tokenizer that cannot be
  checked against the weights loads with a warning kept in ``LoadedCheckpoint.warnings`` (and
  ``info["warnings"]``).
"""
from __future__ import annotations

import errno
import io
import json
import math
import os
import pickle
import pickletools
import re
import stat
import struct
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from sprout_interp.core.errors import (
    CheckpointNotFoundError,
    InvalidConfigError,
    InvalidWeightsError,
    MissingTokenizerError,
    NotACheckpointError,
    NotAPathError,
    SproutError,
    StateDictMismatchError,
    UnreadablePathError,
    UnsafeCheckpointError,
    VocabularyMismatchError,
)
from sprout_model.checkpoint import SHIPPED, TIED
from sprout_model.checkpoint import SHIPPED_DIR as _SHIPPED_DIR
from sprout_model.model import GPT, Config

__all__ = [
    "LoadedCheckpoint", "load_checkpoint", "safetensors_header", "validate_config", "expected_shapes",
    "strip_prefixes", "infer_config", "plan_config", "build_model", "SHIPPED",
]

SHIPPED_DIR: Path = _SHIPPED_DIR  # module attribute so tests can point it at a temporary folder
DEFAULT_CONTEXT = 512
DEFAULT_ROPE_BASE = 10000.0
PREFIXES = ("_orig_mod.", "module.")
STATE_KEYS = ("model", "state_dict", "model_state_dict")
CONFIG_KEYS = ("config", "cfg", "model_config")
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
_SHOW = 5  # how many keys an error message names

# What a load may read and build. Module attributes, so a test (or a user with a bigger model) can change them.
MAX_WEIGHTS_BYTES = 4 << 30  # a .safetensors or .pt file; Sprout's own is 70 MB in float32
MAX_JSON_BYTES = 16 << 20  # config.json, train.json (a long run's history is well under 1 MB)
MAX_TOKENIZER_BYTES = 64 << 20  # tokenizer.json (Sprout's 8,192-token BPE is about 0.5 MB)
MAX_MODEL_BYTES = 8 << 30  # float32 parameters plus the RoPE tables of the model that would be built
MAX_PICKLE_BYTES = 64 << 20  # the pickle inside a .pt
PICKLE_OPS = 200_000  # pickle opcodes allowed in a .pt, plus PICKLE_OPS_PER_TENSOR for each tensor in it
PICKLE_OPS_PER_TENSOR = 200
LIMITS = {"vocab_size": 1_000_000, "context": 65_536, "n_layer": 256, "n_head": 16_384, "d_model": 16_384,
          "d_ff": 65_536}  # upper bounds of the config's whole-number fields
_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}  # safetensors dtype names


@dataclass
class LoadedCheckpoint:
    """A validated checkpoint: the GPT, its tokenizer (or None), where it came from, its training info and any warnings."""
    model: GPT  # float32, eval mode, on the CPU
    tokenizer: Tokenizer
    info: dict = field(default_factory=dict)  # train.json (empty if none), plus "warnings" when there are any
    source: str = ""  # the resolved path the weights came from
    name: str = ""  # a short display name ("gpt-4", a folder or file name)
    warnings: list[str] = field(default_factory=list)  # what a person should know, e.g. an unchecked tokenizer


def load_checkpoint(name_or_path: str | os.PathLike, tokenizer: str | os.PathLike | Tokenizer | None = None) -> LoadedCheckpoint:
    """A float32 eval-mode :class:`GPT` with its tokenizer; see the module docstring for the inputs.

    ``tokenizer`` overrides the tokenizer: a ``tokenizer.json`` path, a folder holding one, or a
    ``tokenizers.Tokenizer``; when the weights have no tokenizer of their own, or another one, the
    result carries a warning saying so. Without it, the ``tokenizer.json`` beside the weights or in
    the folder above them is used, and weights with neither are refused.
    Raises a :class:`~sprout_interp.core.errors.SproutError` subclass for every input mistake.
    """
    try:
        return _load(name_or_path, tokenizer)
    except SproutError:
        raise
    except PermissionError as e:
        raise UnreadablePathError(
            f"{e.filename or name_or_path} cannot be read: permission denied. Make it readable, or copy the "
            "checkpoint to a folder you can read"
        ) from None
    except OSError as e:  # an I/O error, a file that vanished half-way, a name too long for the system
        raise UnreadablePathError(
            f"{e.filename or name_or_path} cannot be read ({e.strerror or type(e).__name__}); check the path, "
            "or copy the checkpoint to a local folder"
        ) from None
    except RecursionError:
        raise NotACheckpointError(
            f"{name_or_path} holds data nested too deeply to be a checkpoint; pass a checkpoint folder or a .pt "
            "file written by torch.save"
        ) from None
    except MemoryError:
        raise NotACheckpointError(
            f"{name_or_path} needs more memory than this machine has; it is not a Sprout-sized checkpoint"
        ) from None


def _load(name_or_path: str | os.PathLike, tokenizer: str | os.PathLike | Tokenizer | None) -> LoadedCheckpoint:
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike, Tokenizer)):
        raise NotAPathError(
            f"tokenizer must be a path to a tokenizer.json, a folder holding one, or a tokenizers.Tokenizer; "
            f"got {type(tokenizer).__name__}"
        )
    path, name = _resolve(name_or_path)
    info: dict = {}
    if path.is_dir():
        sd, cfg, info = _read_folder(path)
        weights_dir = path
    elif path.suffix == ".safetensors":
        cfg_file = path.parent / "config.json"
        cfg = _read_json(cfg_file, "config") if _kind(cfg_file) is not None else None
        sd = _read_safetensors(path, cfg, str(path))
        if _kind(path.parent / "train.json") is not None:
            info = _read_train_json(path.parent / "train.json")
        weights_dir = path.parent
    else:
        sd, cfg, info = _read_torch_file(path)
        weights_dir = path.parent
    model = build_model(sd, cfg, source=str(path))
    tok, notes = _resolve_tokenizer(tokenizer, weights_dir)
    info = dict(info)
    if notes:
        info["warnings"] = list(notes)
    n_tok = tok.get_vocab_size()
    if n_tok != model.cfg.vocab_size:
        hint = f" ({notes[0]})" if notes else ""
        raise VocabularyMismatchError(
            f"the tokenizer has {n_tok:,} tokens but the model in {path} has a vocabulary of "
            f"{model.cfg.vocab_size:,} (its embedding has {model.cfg.vocab_size:,} rows){hint}. Pass the "
            "tokenizer.json the model was trained with: load_checkpoint(path, tokenizer='.../tokenizer.json')"
        )
    return LoadedCheckpoint(model=model, tokenizer=tok, info=info, source=str(path), name=name, warnings=list(notes))


# --- files: only regular files and folders, of bounded size -------------------------------------


def _kind(p: Path) -> str | None:
    """"file", "folder", another kind ("FIFO", "character device", ...) or None when nothing is there.

    Raises our error for a symlink loop, a path no file can have, or one that cannot be read.
    """
    try:
        mode = os.stat(p).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        raise UnreadablePathError(
            f"{p} cannot be read: permission denied. Make it readable, or copy the checkpoint to a folder you can read"
        ) from None
    except ValueError:  # an embedded NUL character
        raise CheckpointNotFoundError(
            f"{str(p)!r} holds a NUL character, which no file name can; check the path you typed"
        ) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotACheckpointError(
                f"{p} is a symbolic link that leads back to itself (a loop); point it at a real checkpoint file or folder"
            ) from None
        if e.errno == errno.ENAMETOOLONG:
            raise CheckpointNotFoundError(f"the path {str(p)[:80]!r}… is longer than the system allows") from None
        raise UnreadablePathError(f"{p} cannot be read ({e.strerror}); check the path") from None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    for test, kind in ((stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return "special file"


def _not_regular(p: Path, kind: str) -> NotACheckpointError:
    return NotACheckpointError(
        f"{p} is a {kind}, not a regular file: Sprout reads checkpoints only from regular files and folders. Pass a "
        "checkpoint folder, a .safetensors or .pt file, or a shipped name (" + ", ".join(SHIPPED) + ")"
    )


def _open_regular(p: Path, limit: int, what: str) -> io.BufferedIOBase:
    """``p`` opened for reading after checking, on the open file itself, that it is a regular file of at
    most ``limit`` bytes (so a FIFO swapped in after a check can neither block nor stream forever)."""
    kind = _kind(p)
    if kind is None:
        raise CheckpointNotFoundError(f"no {what} at {p}")
    if kind != "file":
        raise _not_regular(p, kind)
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _not_regular(p, "special file")
    if st.st_size > limit:
        os.close(fd)
        raise NotACheckpointError(
            f"{p} is {st.st_size:,} bytes, more than a Sprout {what} can be ({limit:,}); this is not one. "
            "If it really is, raise sprout_interp.core.loading's limit for it"
        )
    return os.fdopen(fd, "rb")


def _read_bytes(p: Path, limit: int, what: str) -> bytes:
    with _open_regular(p, limit, what) as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew after the check
        raise NotACheckpointError(f"{p} is more than {limit:,} bytes, more than a Sprout {what} can be")
    return data


# --- where the checkpoint is -------------------------------------------------------------------


def _resolve(name_or_path: str | os.PathLike) -> tuple[Path, str]:
    if isinstance(name_or_path, str) and name_or_path.strip().lower() in SHIPPED:
        name = name_or_path.strip().lower()
        folder = Path(SHIPPED_DIR) / name
        if _kind(folder) != "folder":
            raise CheckpointNotFoundError(
                f"the shipped checkpoint {name!r} is not installed (looked in {folder}). Use a full clone of "
                f"the repository, which ships it, or train it: `python -m sprout_model.prepare` then "
                f"`python -m sprout_model.train --preset {name}`, and load its runs/{name}/checkpoint folder"
            )
        return folder, name
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise NotAPathError(
            f"expected a shipped name ({', '.join(SHIPPED)}) or the path of a checkpoint, got "
            f"{type(name_or_path).__name__}"
        )
    if not str(os.fspath(name_or_path)).strip():
        raise CheckpointNotFoundError(
            "the path is empty: pass a shipped name (" + ", ".join(SHIPPED) + "), a checkpoint folder or a .pt file"
        )
    try:
        path = Path(name_or_path).expanduser()
    except RuntimeError:  # "~someone" with no such user
        path = Path(name_or_path)
    kind = _kind(path)
    if kind is None:
        raise CheckpointNotFoundError(
            f"no checkpoint at {str(name_or_path)!r}: it is neither a shipped name ({', '.join(SHIPPED)}) nor an "
            f"existing file or folder (looked for {path.absolute()}). Check the spelling, or pass a checkpoint "
            "folder or a .pt/.pth file"
        )
    if kind not in ("file", "folder"):
        raise _not_regular(path, kind)
    path = Path(os.path.realpath(path))
    if kind == "file" and path.name in ("config.json", "train.json", "tokenizer.json"):
        path, kind = path.parent, "folder"  # a file inside a checkpoint folder: load the folder
    if kind == "folder":
        name = f"{path.parent.name}/{path.name}" if path.name in ("checkpoint", "checkpoints", "final", "best", "latest") else path.name
    else:
        name = path.stem
    return path, name


def _read_json(p: Path, what: str) -> dict:
    raw = _read_bytes(p, MAX_JSON_BYTES, f"{what} file")
    try:
        d = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise NotACheckpointError(f"{p} is not valid JSON ({str(e)[:200]}); the {what} file of a checkpoint folder is a JSON object") from None
    except RecursionError:
        raise NotACheckpointError(f"{p} is JSON nested too deeply; the {what} file of a checkpoint folder is a flat JSON object") from None
    if not isinstance(d, dict):
        raise NotACheckpointError(f"{p} holds a JSON {type(d).__name__}, not an object; the {what} file of a checkpoint folder is a JSON object")
    return d


def _read_train_json(p: Path) -> dict:
    try:
        return _read_json(p, "train")
    except (NotACheckpointError, CheckpointNotFoundError) as e:  # the weights are still usable
        return {"train_json_note": str(e)}


def _hints(folder: Path) -> str:
    """What a folder that is not a checkpoint holds that could be meant (a few entries, never an error)."""
    hints = []
    try:
        sub = sorted(p.parent.name for _, p in zip(range(1000), folder.glob("*/model.safetensors"))
                     if (p.parent / "config.json").is_file())
        files = sorted(p.name for _, p in zip(range(10_000), folder.iterdir())
                       if p.suffix in TORCH_SUFFIXES + (".safetensors",) and p.is_file())
    except OSError:
        return "pass a checkpoint folder, a .pt/.pth file or a shipped name (" + ", ".join(SHIPPED) + ")"
    if sub:
        hints.append(f"it holds checkpoint folder(s) {', '.join(sub[:_SHOW])}: pass {folder / sub[0]}")
    if files and not sub:
        hints.append(f"it holds weight file(s) {', '.join(files[:_SHOW])}: pass one of them")
    return "; ".join(hints) if hints else "pass a checkpoint folder, a .pt/.pth file or a shipped name (" + ", ".join(SHIPPED) + ")"


def _read_folder(folder: Path) -> tuple[dict, dict, dict]:
    missing = []
    for f in ("config.json", "model.safetensors"):
        kind = _kind(folder / f)
        if kind is None:
            missing.append(f)
        elif kind != "file":
            raise _not_regular(folder / f, kind)
    if missing:
        raise NotACheckpointError(
            f"{folder} is a folder but not a Sprout checkpoint: it has no {' and no '.join(missing)}. A checkpoint "
            f"folder holds model.safetensors and config.json (plus tokenizer.json and train.json); {_hints(folder)}"
        )
    cfg = _read_json(folder / "config.json", "config")
    sd = _read_safetensors(folder / "model.safetensors", cfg, str(folder))
    info = _read_train_json(folder / "train.json") if _kind(folder / "train.json") is not None else {}
    return sd, cfg, info


def safetensors_header(p: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (safetensors dtype name, shape)} from the header of ``p``; no tensor is read.

    Raises :class:`NotACheckpointError` for a file that is not safetensors or whose header is damaged.
    """
    def bad(why: str) -> NotACheckpointError:
        return NotACheckpointError(
            f"{p} cannot be read as safetensors ({why}); the file is damaged or not a safetensors file. Copy or "
            "download it again, or re-save the model with save_checkpoint"
        )

    with _open_regular(p, MAX_WEIGHTS_BYTES, "weights file") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise bad("shorter than its 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 100 << 20):
            raise bad(f"its header claims {n:,} bytes, more than the file holds")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise bad("its header is not valid JSON") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        shape = v.get("shape") if isinstance(v, dict) else None
        dtype = v.get("dtype") if isinstance(v, dict) else None
        if not (isinstance(dtype, str) and isinstance(shape, list)
                and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape)):
            raise bad(f"the entry for {str(k)[:80]!r} has no valid dtype and shape")
        out[str(k)] = (dtype, tuple(shape))
    return out


def _read_safetensors(p: Path, cfg: Mapping[str, Any] | None, source: str) -> dict:
    """The tensors of ``p``, read only after their dtypes, and their shapes against ``cfg``, are checked."""
    from safetensors.torch import load_file

    header = safetensors_header(p)
    for k, (dtype, _) in header.items():
        if dtype not in _FLOAT_DTYPES:
            raise _not_float(strip_prefixes({k: 0}).popitem()[0], dtype, source)
    plan_config({k: s for k, (_, s) in strip_prefixes(header).items()}, cfg, source)
    try:
        return load_file(str(p))
    except Exception as e:  # safetensors raises its own SafetensorError (or OSError) for damaged files
        raise NotACheckpointError(
            f"{p} cannot be read as safetensors ({type(e).__name__}: {str(e)[:200]}); the file is damaged or not a "
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


def _scan_pickles(stream: io.BufferedIOBase, path: Path, count: int) -> list[str]:
    """The classes and functions up to ``count`` pickles in a row name, read statically, never executed.

    Stops at the first thing that is not a pickle (a legacy torch file's raw storage bytes). Raises
    :class:`NotACheckpointError` when the opcodes outnumber what the tensors they describe need
    (``PICKLE_OPS`` plus ``PICKLE_OPS_PER_TENSOR`` a tensor), so unpickling costs bounded time.
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
                if ops > PICKLE_OPS + PICKLE_OPS_PER_TENSOR * tensors:
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
    """The ``data.pkl`` of a torch zip archive, of bounded size."""
    try:
        with zipfile.ZipFile(path) as z:
            pkls = [i for i in z.infolist() if i.filename.endswith("data.pkl")]
            if len(pkls) != 1:
                raise _not_a_checkpoint(path, ValueError(f"a zip archive with {len(pkls)} data.pkl records"))
            if pkls[0].file_size > MAX_PICKLE_BYTES:
                raise NotACheckpointError(
                    f"{path} is refused: its pickle is {pkls[0].file_size:,} bytes unpacked, more than weights need "
                    f"({MAX_PICKLE_BYTES:,}). Re-save just the weights with torch.save(model.state_dict(), path)"
                )
            with z.open(pkls[0]) as f:
                data = f.read(MAX_PICKLE_BYTES + 1)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, ValueError) as e:
        raise _not_a_checkpoint(path, e) from None
    if len(data) > MAX_PICKLE_BYTES:
        raise NotACheckpointError(f"{path} is refused: its pickle unpacks to more than {MAX_PICKLE_BYTES:,} bytes")
    return data


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
    with _open_regular(path, MAX_WEIGHTS_BYTES, "weights file") as f:
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


# --- the config: types and ranges first ----------------------------------------------------------


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return f"{str(v).lower()} (a boolean)"
    if isinstance(v, str):
        return f"the text {v[:40]!r}"
    if isinstance(v, (int, float)):
        return f"{v:,}" if isinstance(v, int) and abs(v) < 10 ** 30 else repr(v)[:40]
    return f"a {type(v).__name__}"


def validate_config(cfg: Mapping[str, Any], source: str = "the config") -> dict[str, Any]:
    """The config's known fields, checked: whole numbers from 1 to their bound in :data:`LIMITS`, ``d_model``
    a multiple of ``n_head`` with an even head width, ``rope_base`` (and ``eps`` if given) finite and positive.

    Returns the Config fields found (``rope_base`` as a float). Raises :class:`InvalidConfigError`.
    """
    out: dict[str, Any] = {}
    example = Config().to_dict()
    for k, top in LIMITS.items():
        if k not in cfg:
            continue
        v = cfg[k]
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidConfigError(
                f"{k} in {source} is {_show(v)}; it must be a whole number from 1 to {top:,} (such as {example[k]}). "
                "Fix the config, or drop the entry to have it read off the weights"
            )
        if not 1 <= v <= top:
            raise InvalidConfigError(
                f"{k} in {source} is {_show(v)}; it must be from 1 to {top:,} (Sprout's is {example[k]}). Fix the "
                "config, or drop the entry to have it read off the weights"
            )
        out[k] = v
    for k in ("rope_base", "eps"):
        if k not in cfg:
            continue
        v = cfg[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise InvalidConfigError(
                f"{k} in {source} is {_show(v)}; it must be a finite number above 0 (Sprout's "
                f"{k} is {example.get(k, 1e-6)}). Fix the config, or drop the entry for the default"
            )
        if k == "rope_base":
            out[k] = float(v)
    if "d_model" in out and "n_head" in out:
        d, h = out["d_model"], out["n_head"]
        if d % h:
            raise InvalidConfigError(f"d_model {d} in {source} is not a multiple of n_head {h}; every head needs the same width")
        if (d // h) % 2:
            raise InvalidConfigError(
                f"the head width d_model / n_head = {d} / {h} = {d // h} in {source} is odd; RoPE rotates pairs of "
                "coordinates, so it must be even"
            )
    return out


def _model_bytes(cfg: Config) -> int:
    """float32 bytes of the model's parameters and RoPE tables, computed without building it."""
    d, f, hd = cfg.d_model, cfg.d_ff, cfg.d_model // cfg.n_head
    params = cfg.vocab_size * d + d + cfg.n_layer * (4 * d * d + 2 * hd + 2 * d + 3 * d * f)
    return 4 * (params + cfg.context * hd)


def expected_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """The state-dict shapes of ``GPT(cfg)``, computed without building it (``head.weight`` included)."""
    d, f, hd, v = cfg.d_model, cfg.d_ff, cfg.d_model // cfg.n_head, cfg.vocab_size
    out: dict[str, tuple[int, ...]] = {"embed.weight": (v, d)}
    for i in range(cfg.n_layer):
        p = f"blocks.{i}."
        out.update({p + "norm1.weight": (d,), p + "attn.qkv.weight": (3 * d, d), p + "attn.proj.weight": (d, d),
                    p + "attn.q_norm.weight": (hd,), p + "attn.k_norm.weight": (hd,), p + "norm2.weight": (d,),
                    p + "ffn.w1.weight": (f, d), p + "ffn.w3.weight": (f, d), p + "ffn.w2.weight": (d, f)})
    out["norm.weight"] = (d,)
    out[TIED] = (v, d)
    return out


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
    keys = [k if len(k) <= 80 else k[:77] + "..." for k in keys[:_SHOW]] + keys[_SHOW:]
    return ", ".join(keys[:_SHOW]) + (f" (and {len(keys) - _SHOW} more)" if len(keys) > _SHOW else "")


def _infer(shapes: Mapping[str, tuple[int, ...]], context: int, rope_base: float) -> Config:
    needed = ["embed.weight", "blocks.0.attn.q_norm.weight", "blocks.0.ffn.w1.weight"]
    missing = [k for k in needed if k not in shapes]
    if missing:
        raise StateDictMismatchError(
            f"cannot read the model's shape: the weights lack {_few(missing)} (found keys such as "
            f"{_few(sorted(shapes)) or 'none'}). This is not a Sprout/course GPT state dict, or its keys are renamed"
        )
    for k, dims in zip(needed, (2, 1, 2)):
        if len(shapes[k]) != dims:
            raise StateDictMismatchError(f"{k} has shape {tuple(shapes[k])}, not the {dims}-D shape of a Sprout weight")
    vocab_size, d_model = shapes["embed.weight"]
    head_dim = math.prod(shapes["blocks.0.attn.q_norm.weight"])
    if head_dim == 0 or d_model % head_dim:
        raise StateDictMismatchError(
            f"d_model {d_model} (from embed.weight) is not a multiple of the head size {head_dim} "
            "(from blocks.0.attn.q_norm.weight), so the head count cannot be inferred; pass a config"
        )
    n_layer = 1 + max(int(m.group(1)) for k in shapes if (m := re.match(r"blocks\.(\d{1,6})\.", k)))
    return Config(
        vocab_size=int(vocab_size), context=context, n_layer=n_layer, n_head=d_model // head_dim,
        d_model=int(d_model), d_ff=int(shapes["blocks.0.ffn.w1.weight"][0]), rope_base=rope_base,
    )


def infer_config(sd: Mapping[str, torch.Tensor], context: int = DEFAULT_CONTEXT, rope_base: float = DEFAULT_ROPE_BASE) -> Config:
    """The Config a Sprout state dict was built with, read off its shapes (context and rope_base are not in them)."""
    return _infer({k: tuple(v.shape) for k, v in sd.items()}, context, rope_base)


def plan_config(shapes: Mapping[str, tuple[int, ...]], cfg: Mapping[str, Any] | Config | None = None,
                source: str = "the weights") -> Config:
    """The Config of the model the tensors of these ``shapes`` fit, checked, before anything is allocated.

    ``cfg`` fields that are present win (after :func:`validate_config`); the others are inferred from
    the shapes. The tied ``head.weight`` may be absent. Raises :class:`InvalidConfigError` for a config
    out of range and :class:`StateDictMismatchError` for shapes that do not fit it.
    """
    cfg = cfg.to_dict() if isinstance(cfg, Config) else dict(cfg or {})
    label = f"the config of {source}"
    given = validate_config(cfg, label)
    if {"vocab_size", "d_model", "n_layer", "n_head", "d_ff"} <= set(given):
        config = Config.from_dict(given)  # a full config: a wrong one shows up as a shape mismatch below
    else:
        config = Config.from_dict({**_infer(shapes, DEFAULT_CONTEXT, DEFAULT_ROPE_BASE).to_dict(), **given})
        validate_config(config.to_dict(), f"{label} (read off the weights where the config is silent)")
    if _model_bytes(config) > MAX_MODEL_BYTES:
        raise InvalidConfigError(
            f"{label} describes a model of {_model_bytes(config) / 2**30:,.1f} GiB in float32 ({_describe(config)}, "
            f"context {config.context:,}), more than the loader builds ({MAX_MODEL_BYTES / 2**30:.0f} GiB); this is "
            "not a Sprout-sized model. Check the config"
        )
    shapes = dict(shapes)
    if TIED not in shapes and "embed.weight" in shapes:
        shapes[TIED] = shapes["embed.weight"]  # stored once; tied again on load
    expected = expected_shapes(config)
    missing = [k for k in expected if k not in shapes]
    unexpected = [k for k in shapes if k not in expected]
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
    bad = [(k, tuple(shapes[k]), want) for k, want in expected.items() if tuple(shapes[k]) != want]
    if bad:
        k, got, want = bad[0]
        more = f" (and {len(bad) - 1} more mismatched tensors)" if len(bad) > 1 else ""
        raise StateDictMismatchError(
            f"shape mismatch in {source}: {k} has shape {got} in the file but {want} in a Sprout model with "
            f"{_describe(config)}{more}. The config does not match the weights: fix config.json (or the 'config' "
            "entry), or drop it to have the shapes inferred"
        )
    return config


_DTYPE_NAMES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32",
                "U32": "uint32", "I64": "int64", "U64": "uint64", "C64": "complex64", "C128": "complex128"}


def _not_float(key: str, dtype: Any, source: str) -> InvalidWeightsError:
    name = _DTYPE_NAMES.get(str(dtype), str(dtype).replace("torch.", ""))
    return InvalidWeightsError(
        f"{key[:80]} in {source} holds {name} values; Sprout's weights are floating point "
        "(float32, float16 or bfloat16). Save the model's own state_dict(), not a quantised or converted copy"
    )


def build_model(sd: Mapping[str, Any], cfg: Mapping[str, Any] | Config | None = None, source: str = "the weights") -> GPT:
    """A float32 eval-mode GPT holding ``sd`` (prefixes stripped, ``head.weight`` tied), checked key by key.

    ``cfg`` fields that are present win; the others are inferred from the shapes. Everything is checked
    before the model is built (see :func:`plan_config`); the weights must be finite floating-point numbers.
    """
    sd = {k: v for k, v in strip_prefixes(sd).items() if isinstance(v, torch.Tensor)}
    for k, v in sd.items():
        if not v.is_floating_point():
            raise _not_float(k, v.dtype, source)
    config = plan_config({k: tuple(v.shape) for k, v in sd.items()}, cfg, source)
    if TIED in sd and "embed.weight" in sd and not torch.equal(sd[TIED], sd["embed.weight"]):
        raise StateDictMismatchError(
            f"head.weight differs from embed.weight in {source}: these weights were trained without weight "
            "tying, but Sprout's output matrix is its embedding (one tensor). They cannot be loaded unchanged"
        )
    sd.setdefault(TIED, sd["embed.weight"])
    sd = {k: v.float() for k, v in sd.items()}
    for k, v in sd.items():
        if not torch.isfinite(v).all():
            n = int((~torch.isfinite(v)).sum())
            raise InvalidWeightsError(
                f"{k[:80]} in {source} holds {n:,} NaN or infinite value(s); a model with them computes nothing "
                "meaningful. Load an earlier checkpoint of the run, from before training diverged"
            )
    model = GPT(config)
    if not (torch.isfinite(model.cos).all() and torch.isfinite(model.sin).all()):
        raise InvalidConfigError(
            f"rope_base {config.rope_base!r} in the config of {source} gives non-finite rotation angles; use a "
            "value such as 10000"
        )
    model.load_state_dict(sd, strict=True)
    return model.float().eval()


def _describe(cfg: Config) -> str:
    return (f"vocab_size={cfg.vocab_size}, n_layer={cfg.n_layer}, n_head={cfg.n_head}, "
            f"d_model={cfg.d_model}, d_ff={cfg.d_ff}")


# --- the tokenizer -------------------------------------------------------------------------------


def _read_tokenizer(p: Path) -> Tokenizer:
    raw = _read_bytes(p, MAX_TOKENIZER_BYTES, "tokenizer file")
    try:
        return Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:
        raise NotACheckpointError(
            f"{p} is not a Hugging Face tokenizers file ({type(e).__name__}: {str(e)[:200]}); pass the "
            "tokenizer.json the model was trained with"
        ) from None


def _own_tokenizer(weights_dir: Path) -> Path | None:
    """The tokenizer.json beside the weights, or the one shared by the shipped checkpoints in the folder above."""
    for p in (weights_dir / "tokenizer.json", weights_dir.parent / "tokenizer.json"):
        if _kind(p) is not None:
            return p
    return None


def _resolve_tokenizer(tokenizer: str | os.PathLike | Tokenizer | None, weights_dir: Path) -> tuple[Tokenizer, list[str]]:
    """(the tokenizer, warnings); refuses weights with no tokenizer of their own when none is passed."""
    own = _own_tokenizer(weights_dir)
    if tokenizer is None:
        if own is not None:
            return _read_tokenizer(own), []
        shipped = Path(SHIPPED_DIR) / "tokenizer.json"
        also = (f" (Sprout's shipped one is {shipped}, right only for models trained on the prepared default "
                "corpus)") if shipped.is_file() else ""
        raise MissingTokenizerError(
            f"no tokenizer.json beside the weights in {weights_dir} or in the folder above: with another "
            "tokenizer than the one it was trained with, every token id would mean another word. Put the "
            f"model's tokenizer.json beside it, or pass it: load_checkpoint(path, tokenizer='path/to/tokenizer.json'){also}"
        )
    if isinstance(tokenizer, Tokenizer):
        tok, where = tokenizer, "the tokenizer passed"
    else:
        p = Path(tokenizer)
        try:
            p = p.expanduser()
        except RuntimeError:  # "~someone" with no such user: looked up as typed
            pass
        if _kind(p) == "folder":
            p = p / "tokenizer.json"
        if _kind(p) is None:
            raise CheckpointNotFoundError(
                f"no tokenizer at {p}: pass the path of a tokenizer.json file (or a folder holding one)"
            )
        tok, where = _read_tokenizer(p), f"the tokenizer passed ({p})"
    if own is None:
        return tok, [(
            f"{where} could not be checked against the weights, which have no tokenizer.json of their own in "
            f"{weights_dir}: if the model was trained with another tokenizer, every token id means another word"
        )]
    if _read_tokenizer(own).to_str() != tok.to_str():
        return tok, [(
            f"{where} differs from the tokenizer.json beside the weights ({own}): if the model was trained with "
            "that one, every token id means another word"
        )]
    return tok, []
