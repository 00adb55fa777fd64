"""A run folder's ``state.pt``: written and read so that loading it can never run code.

The file holds only what ``torch.load(weights_only=True)`` accepts: tensors, numbers, strings,
``None``, lists, tuples and dicts. The one thing a training run keeps that is not of that kind,
numpy's RNG state (a tuple holding a ``numpy.ndarray``), is stored as a tensor plus numbers and
rebuilt on load. Every reader (resume, ``--init-from``, ``grow``, ``ship``) goes through
:func:`read_state`, so a ``state.pt`` carrying a pickled ``__reduce__`` payload is refused by torch's
restricted unpickler before anything in it runs.

A ``state.pt`` from before this format (it pickled the numpy array itself) is refused with a message
that says how to go on: start a new run from its ``checkpoint/`` folder with ``--init-from``.
"""
from __future__ import annotations

import os
import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = 2  # the "format" key of a state.pt this module writes
MAX_STATE_BYTES = 8 << 30  # no run state of a preset here comes near; a bigger file is not ours


class RunStateError(ValueError):
    """A run folder's ``state.pt`` that cannot be used: not ours, truncated, from an older format, or unsafe."""


def rng_state() -> dict:
    """Torch, numpy and Python RNG states in forms ``weights_only=True`` accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": random.getstate(),
    }


def set_rng_state(s: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(s["torch"])
    n = s["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    version, internal, gauss = s["python"]
    random.setstate((version, tuple(internal), gauss))


def write_state(obj: dict, path: Path) -> None:
    """Write ``obj`` (with ``format`` added) atomically: a kill leaves the old file or the new one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({**obj, "format": FORMAT}, tmp)
    os.replace(tmp, path)


def read_state(path: Path) -> dict[str, Any]:
    """The dict in a run's ``state.pt``, read with ``weights_only=True`` (nothing in it can run).

    Raises :class:`RunStateError` with what to do for a file that is not a regular file, too big,
    truncated, from the older pickled-numpy format, or refused by torch's restricted unpickler.
    """
    path = Path(path)
    if not path.is_file():
        raise RunStateError(f"{path} is not a regular file: a run folder's state.pt is written by sprout_model.train")
    size = path.stat().st_size
    if size > MAX_STATE_BYTES:
        raise RunStateError(f"{path} is {size:,} bytes, more than any run state here ({MAX_STATE_BYTES:,}): not ours")
    if not zipfile.is_zipfile(path):
        raise RunStateError(
            f"{path} is not a torch zip archive (truncated, or not written by sprout_model.train). Its "
            f"checkpoint/ folder, if there is one, still holds the best weights: --init-from {path.parent}/checkpoint"
        )
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise RunStateError(
            f"{path} holds something other than tensors, numbers, strings, lists and dicts, so it was refused "
            "and not executed (runs are read with torch.load(weights_only=True)). A state.pt written before "
            "the safe format pickled numpy's RNG state; if this is your own older run, start a new run from "
            f"its best weights with --init-from {path.parent}/checkpoint. Torch said: {str(e).splitlines()[0]}"
        ) from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile) as e:
        raise RunStateError(f"{path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}): "
                            f"truncated or damaged; --init-from {path.parent}/checkpoint starts from its best weights") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or "model" not in obj:
        raise RunStateError(f"{path} is not a sprout_model.train run state (format {FORMAT})")
    return obj
