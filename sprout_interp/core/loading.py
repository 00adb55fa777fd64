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
- a ``.pt`` whose pickle is far longer than its tensors need (its cost to unpickle is bounded), or whose
  storage records unpack to more bytes than the file holds (compressed);
- tensors that show more values than the file stores (a zero stride from ``expand`` or ``as_strided``, views
  sharing one storage), meta, sparse or nested tensors, and a state dict holding both ``x`` and ``module.x``
  (``sprout_interp.core.configs.check_tensors``, ``strip_prefixes``); the tuned lens and SAE readers use the same
  checks (``read_safetensors``, ``check_finite``);
- weights holding NaN or infinity, or tensors that are not floating point (bool, integer, complex);
- a tokenizer whose components are not a Sprout tokenizer's (a normalizer, padding, a pre-tokenizer other than
  ByteLevel or GPT-2's split pattern ...: ``sprout_interp.core.tokens.check_tokenizer``), with TokenizationError;
- weights without a ``tokenizer.json`` of their own (beside them, or in the folder above, where the
  shipped checkpoints share one), unless a tokenizer is passed; a passed tokenizer that cannot be
  checked against the weights loads with a warning kept in ``LoadedCheckpoint.warnings`` (and
  ``info["warnings"]``).
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from sprout_interp.core import limits
from sprout_interp.core.configs import build_model, check_tensors, not_float, plan_config, strip_prefixes
from sprout_interp.core.errors import (
    CheckpointNotFoundError,
    MissingTokenizerError,
    NotACheckpointError,
    NotAPathError,
    SproutError,
    UnreadablePathError,
    VocabularyMismatchError,
)
from sprout_interp.core.files import not_regular, open_regular, path_kind, read_bytes, read_json
from sprout_interp.core.pickles import TORCH_SUFFIXES, read_torch_file
from sprout_interp.core.tokens import check_tokenizer, tokenizer_call
from sprout_model.checkpoint import SHIPPED
from sprout_model.checkpoint import SHIPPED_DIR as _SHIPPED_DIR
from sprout_model.model import GPT

__all__ = ["LoadedCheckpoint", "load_checkpoint", "safetensors_header", "read_safetensors", "SHIPPED", "SHIPPED_DIR"]

SHIPPED_DIR: Path = _SHIPPED_DIR  # module attribute so tests can point it at a temporary folder
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
    """A float32 eval-mode :class:`GPT` with its tokenizer.

    ``name_or_path``: a shipped name (``"gpt-1"``, ``"gpt-4"``, ``"sprout"``; it wins over a folder of that name,
    write ``"./sprout"`` for the folder), a checkpoint folder (``config.json`` + ``model.safetensors``, a
    ``tokenizer.json`` beside it or in the folder above), a ``.safetensors`` file, or a course ``.pt`` / ``.pth``
    (a state dict, or a dict holding one under ``model`` or ``state_dict`` with an optional ``config``), read with
    ``torch.load(weights_only=True)`` only. What is refused, and why: the manual's loading page.

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
        cfg = read_json(cfg_file, "config") if path_kind(cfg_file) is not None else None
        sd = _read_safetensors(path, cfg, str(path))
        if path_kind(path.parent / "train.json") is not None:
            info = _read_train_json(path.parent / "train.json")
        weights_dir = path.parent
    else:
        sd, cfg, info = read_torch_file(path)
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


def _resolve(name_or_path: str | os.PathLike) -> tuple[Path, str]:
    if isinstance(name_or_path, str) and name_or_path.strip().lower() in SHIPPED:
        name = name_or_path.strip().lower()
        folder = Path(SHIPPED_DIR) / name
        if path_kind(folder) != "folder":
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
    kind = path_kind(path)
    if kind is None:
        raise CheckpointNotFoundError(
            f"no checkpoint at {str(name_or_path)!r}: it is neither a shipped name ({', '.join(SHIPPED)}) nor an "
            f"existing file or folder (looked for {path.absolute()}). Check the spelling, or pass a checkpoint "
            "folder or a .pt/.pth file"
        )
    if kind not in ("file", "folder"):
        raise not_regular(path, kind)
    path = Path(os.path.realpath(path))
    if kind == "file" and path.name in ("config.json", "train.json", "tokenizer.json"):
        path, kind = path.parent, "folder"  # a file inside a checkpoint folder: load the folder
    if kind == "folder":
        name = f"{path.parent.name}/{path.name}" if path.name in ("checkpoint", "checkpoints", "final", "best", "latest") else path.name
    else:
        name = path.stem
    return path, name


def _read_train_json(p: Path) -> dict:
    try:
        return read_json(p, "train")
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
        hints.append(f"it holds checkpoint folder(s) {', '.join(sub[:limits.SHOW])}: pass {folder / sub[0]}")
    if files and not sub:
        hints.append(f"it holds weight file(s) {', '.join(files[:limits.SHOW])}: pass one of them")
    return "; ".join(hints) if hints else "pass a checkpoint folder, a .pt/.pth file or a shipped name (" + ", ".join(SHIPPED) + ")"


def _read_folder(folder: Path) -> tuple[dict, dict, dict]:
    missing = []
    for f in ("config.json", "model.safetensors"):
        kind = path_kind(folder / f)
        if kind is None:
            missing.append(f)
        elif kind != "file":
            raise not_regular(folder / f, kind)
    if missing:
        raise NotACheckpointError(
            f"{folder} is a folder but not a Sprout checkpoint: it has no {' and no '.join(missing)}. A checkpoint "
            f"folder holds model.safetensors and config.json (plus tokenizer.json and train.json); {_hints(folder)}"
        )
    cfg = read_json(folder / "config.json", "config")
    sd = _read_safetensors(folder / "model.safetensors", cfg, str(folder))
    info = _read_train_json(folder / "train.json") if path_kind(folder / "train.json") is not None else {}
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

    with open_regular(p, limits.MAX_WEIGHTS_BYTES, "weights file") as f:
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


def read_safetensors(p: Path, source: str, check_shapes: Callable[[dict[str, tuple[int, ...]]], object]) -> dict[str, torch.Tensor]:
    """The tensors of ``p`` (of at most ``limits.MAX_WEIGHTS_BYTES``), read only after the header's dtypes
    (floating point) and ``check_shapes(header shapes)``, which raises for shapes it refuses, have passed; so
    nothing is allocated for a header that asks for more than its reader allows. The tensors read then pass
    :func:`~sprout_interp.core.configs.check_tensors`. The one reader of weights files for checkpoints, tuned
    lenses and SAEs; values are not checked here (:func:`~sprout_interp.core.configs.check_finite`).

    Raises :class:`NotACheckpointError` for a damaged file, :class:`InvalidWeightsError` for other dtypes.
    """
    from safetensors.torch import load_file

    header = safetensors_header(p)
    for k, (dtype, _) in header.items():
        if dtype not in _FLOAT_DTYPES:
            raise not_float(strip_prefixes({k: 0}).popitem()[0], dtype, source)
    check_shapes({k: s for k, (_, s) in header.items()})
    try:
        sd = load_file(str(p))
    except Exception as e:  # safetensors raises its own SafetensorError (or OSError) for damaged files
        raise NotACheckpointError(
            f"{p} cannot be read as safetensors ({type(e).__name__}: {str(e)[:200]}); the file is damaged or not a "
            "safetensors file. Copy or download it again, or save it again"
        ) from None
    check_tensors(sd, source)
    return sd


def _read_safetensors(p: Path, cfg: Mapping[str, Any] | None, source: str) -> dict:
    """The tensors of ``p``, read only after their dtypes, and their shapes against ``cfg``, are checked."""
    return read_safetensors(p, source, lambda shapes: plan_config(strip_prefixes(shapes), cfg, source))


def _read_tokenizer(p: Path) -> Tokenizer:
    """The tokenizer in ``p``, read boundedly and refused (TokenizationError) unless it has a Sprout tokenizer's
    components (``check_tokenizer``), before the Rust library builds it."""
    raw = read_bytes(p, limits.MAX_TOKENIZER_BYTES, "tokenizer file")
    try:
        text = raw.decode("utf-8")
        json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise NotACheckpointError(
            f"{p} is not a Hugging Face tokenizers file ({type(e).__name__}: {str(e)[:200]}); pass the "
            "tokenizer.json the model was trained with"
        ) from None
    check_tokenizer(text, str(p))  # the text: a file holding a JSON string is no tokenizer's text
    try:
        return tokenizer_call(f"reading {p}", Tokenizer.from_str, text)
    except SproutError:
        raise
    except Exception as e:
        raise NotACheckpointError(
            f"{p} is not a Hugging Face tokenizers file ({type(e).__name__}: {str(e)[:200]}); pass the "
            "tokenizer.json the model was trained with"
        ) from None


def _own_tokenizer(weights_dir: Path) -> Path | None:
    """The tokenizer.json beside the weights, or the one shared by the shipped checkpoints in the folder above."""
    for p in (weights_dir / "tokenizer.json", weights_dir.parent / "tokenizer.json"):
        if path_kind(p) is not None:
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
        check_tokenizer(tok, where)
    else:
        p = Path(tokenizer)
        try:
            p = p.expanduser()
        except RuntimeError:  # "~someone" with no such user: looked up as typed
            pass
        if path_kind(p) == "folder":
            p = p / "tokenizer.json"
        if path_kind(p) is None:
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
