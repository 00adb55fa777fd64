"""Checking the plain arguments of the public API: indices (a layer, a head, a position, a neuron, a token id),
counts (``k``, ``seq_len``, ``heads_per_batch`` ...) and numbers (a temperature, a probability).

Nothing is converted silently: a bool is not an index (``True`` is not layer 1), a float is not one (``0.5`` is
no layer, and ``1.0`` is refused too, so a computed float never picks a layer by luck), a string is not one
(``"0"``). Python ints and numpy / torch integer scalars (a 0-d integer tensor) are accepted. Each check raises
the error class its caller passes (the family of the function: ``AblationError``, ``PatchingError`` ...;
:class:`~sprout_interp.core.errors.ArgumentError` by default), with a message that names the argument, what it
got and the range it takes.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

import torch

from sprout_interp.core.errors import ArgumentError, SproutError
from sprout_model.cli import INPUT_ERRORS, input_errors_exit

__all__ = ["integer", "describe", "check_index", "check_indices", "check_count", "check_number", "check_numbers",
           "check_token_ids", "command_line"]


def integer(value) -> Optional[int]:
    """``value`` as an ``int`` when it is a whole-number scalar (a Python int, a numpy integer, a 0-d integer
    tensor); None for anything else (a bool, a float, a string, a list, None ...)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.dtype == torch.bool or value.dtype.is_floating_point or value.dtype.is_complex:
            return None
        return int(value)
    if isinstance(value, numbers.Integral):  # numpy integers are Integral; numpy's bool is not
        return int(value)
    return None


def describe(value) -> str:
    """What ``value`` is, for a message: ``"True (a bool)"``, ``"0.5 (a float)"``, ``"'0' (a str)"``."""
    text = repr(value)
    if "\n" in text:  # a tensor's or an array's repr: one line in a message
        text = " ".join(text.split())
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} (a {type(value).__name__})"


def check_index(value, name: str, size: int, *, negative: bool = False, what: str = "",
                error: type[SproutError] = ArgumentError) -> int:
    """``value`` as an index ``0..size-1``; with ``negative``, ``-size..-1`` count from the end (and are returned
    as ``0..size-1``).

    ``name`` is the argument as the user wrote it (``"layer"``, ``"pos"``, ``"heads[0] layer"``); ``what`` says
    what the range is (``"this model's 8 blocks, 0-indexed"``). Raises ``error`` for a non-integer or an index
    outside the range.
    """
    span = f"0..{size - 1}" + (f", or -{size}..-1 from the end" if negative else "")
    of = f" ({what})" if what else ""
    i = integer(value)
    if i is None:
        raise error(f"{name}={describe(value)} is not a whole number: {name} is {span}{of}")
    if not (-size if negative else 0) <= i < size:
        raise error(f"{name}={i} is out of range: {name} is {span}{of}")
    return i % size if negative else i


def check_indices(values, name: str, size: int, *, negative: bool = False, what: str = "",
                  error: type[SproutError] = ArgumentError) -> list[int]:
    """A list of indices (each as :func:`check_index`) from a list, tuple or 1-d integer tensor / array; one index
    alone is taken as a list of one. A string or a non-iterable is refused, and so is an empty list."""
    if integer(values) is not None:
        values = [values]
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise error(f"{name}={describe(values)} is not a list of indices: {name} holds whole numbers 0..{size - 1}"
                    + (f" ({what})" if what else ""))
    out = [check_index(v, name, size, negative=negative, what=what, error=error) for v in values]
    if not out:
        raise error(f"{name} is empty: pass at least one index 0..{size - 1}" + (f" ({what})" if what else ""))
    return out


def check_count(value, name: str, *, low: int = 1, high: Optional[int] = None, what: str = "",
                error: type[SproutError] = ArgumentError) -> int:
    """``value`` as a whole number ``low..high`` (``high`` None: no upper bound); ``error`` otherwise."""
    span = f"{low}..{high}" if high is not None else f"at least {low}"
    of = f" ({what})" if what else ""
    i = integer(value)
    if i is None:
        raise error(f"{name}={describe(value)} is not a whole number: {name} is {span}{of}")
    if i < low or (high is not None and i > high):
        raise error(f"{name}={i} is out of range: {name} is {span}{of}")
    return i


def check_number(value, name: str, *, low: Optional[float] = None, high: Optional[float] = None,
                 low_open: bool = False, high_open: bool = False, what: str = "",
                 error: type[SproutError] = ArgumentError) -> float:
    """``value`` as a finite float inside ``[low, high]`` (``low_open``/``high_open``: that end excluded; None: no
    bound); ints and floats are numbers, a bool or a string is not."""
    lo = "" if low is None else (f"> {low}" if low_open else f">= {low}")
    hi = "" if high is None else (f"< {high}" if high_open else f"<= {high}")
    span = " and ".join(s for s in (lo, hi) if s)
    span = f" {span}" if span else ""
    of = f" ({what})" if what else ""
    ok_type = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if isinstance(value, torch.Tensor):
        ok_type = value.dim() == 0 and value.dtype != torch.bool and not value.dtype.is_complex
    if not ok_type:
        raise error(f"{name}={describe(value)} is not a number: {name} is a finite number{span}{of}")
    x = float(value)
    if not math.isfinite(x):
        raise error(f"{name}={x} is not finite: {name} is a finite number{span}{of}")
    if (low is not None and (x <= low if low_open else x < low)) or (high is not None and (x >= high if high_open else x > high)):
        raise error(f"{name}={x} is out of range: {name} is a finite number{span}{of}")
    return x


def check_numbers(values, name: str, *, low: Optional[float] = None, high: Optional[float] = None, what: str = "",
                  error: type[SproutError] = ArgumentError) -> list[float]:
    """A list of finite floats (each as :func:`check_number`, inside ``[low, high]``) from a list, tuple or 1-d
    tensor / array; one number alone is a list of one. A string is not a sequence of numbers (``"12"`` is not
    ``[1, 2]``), and neither is a dict, a set (no order) or an empty list."""
    if isinstance(values, torch.Tensor) and values.dim() == 0 or isinstance(values, numbers.Real):
        values = [values]
    if isinstance(values, (str, bytes, dict, set, frozenset)) or not hasattr(values, "__iter__") or (
            isinstance(values, torch.Tensor) and values.dim() != 1) or (getattr(values, "ndim", 1) != 1):
        raise error(f"{name}={describe(values)} is not a list of numbers: {name} is one finite number or a list of "
                    "them" + (f" ({what})" if what else ""))
    each = f"{name} holds one or more numbers" + (f": {what}" if what else "")
    out = [check_number(v, f"{name}[{i}]", low=low, high=high, what=each, error=error) for i, v in enumerate(values)]
    if not out:
        raise error(f"{name} is empty: pass one or more finite numbers" + (f" ({what})" if what else ""))
    return out


def _id_tensor(ids, name: str, span: str, error: type[SproutError]) -> torch.Tensor:
    """Token ids in any accepted form as a long tensor of the same shape; ``error`` for anything else."""
    one = integer(ids)
    if one is not None:
        return torch.tensor(one, dtype=torch.long)
    if isinstance(ids, torch.Tensor):
        if ids.dtype == torch.bool or ids.dtype.is_floating_point or ids.dtype.is_complex:
            raise error(f"{name} must be integer token ids ({span}), got a {ids.dtype} tensor")
        return ids.long()
    if hasattr(ids, "__array__") and not isinstance(ids, (str, bytes)):
        try:
            t = torch.as_tensor(ids)
        except (TypeError, ValueError, RuntimeError):
            raise error(f"{name}={describe(ids)} is not token ids: pass whole numbers {span}") from None
        return _id_tensor(t, name, span, error)
    if isinstance(ids, (list, tuple)) and len(ids) > 0:
        if all(isinstance(r, (list, tuple)) or isinstance(r, torch.Tensor) and r.dim() > 0 for r in ids):
            rows = [_id_tensor(r, name, span, error) for r in ids]
            if len({r.shape for r in rows}) > 1:
                lengths = ", ".join(str(len(r)) for r in rows)
                raise error(f"{name} has rows of different lengths ({lengths}): token ids are a (batch, pos) grid of "
                            "whole numbers; pass texts (they are padded for you) or rows of one length")
            return torch.stack(rows)
        vals = [integer(i) for i in ids]
        bad = [i for i, v in zip(ids, vals) if v is None]
        if bad:
            raise error(f"{name} holds {describe(bad[0])}, which is not a token id: token ids are whole numbers {span}")
        return torch.tensor(vals, dtype=torch.long)
    raise error(f"{name}={describe(ids)} is not token ids: pass a whole number {span}, a list of them, or an "
                "integer tensor (pos,) / (batch, pos)")


def check_token_ids(ids, name: str, d_vocab: Optional[int], *, error: type[SproutError] = ArgumentError,
                    type_error: Optional[type[SproutError]] = None) -> torch.Tensor:
    """Token ids (one id, a list or nested list of ids, an integer tensor or array) as a long tensor of the same
    shape (a single id: 0-d), each inside ``0..d_vocab-1`` (``d_vocab`` None: only negative ids are refused).

    A negative id would wrap around to the end of the vocabulary, so it is refused, not read. ``error`` is raised
    for an id outside the range, ``type_error`` (default: ``error``) for something that is not whole numbers.
    """
    span = "0..d_vocab-1" if d_vocab is None else f"0..{d_vocab - 1}"
    t = _id_tensor(ids, name, span, type_error or error)
    if t.numel():
        lo, hi = torch.aminmax(t)
        lo, hi = int(lo), int(hi)
        if lo < 0 or (d_vocab is not None and hi >= d_vocab):
            bad = lo if lo < 0 else hi
            raise error(f"{name} holds token id {bad}, outside the vocabulary: token ids are {span}")
    return t


#: a command line's ``main`` wrapped so that a refused argument (a :class:`SproutError`, or one of the input
#: mistakes the training tools report: a bad value, an unreadable file, a missing corpus) prints one ``error: ...``
#: line on stderr and exits with status 2, never a traceback: ``sprout_model.cli.input_errors_exit``, the tools' one
#: wrapper, with sprout_interp's errors added. Parsers are ``sprout_model.cli.ArgumentParser`` (one line for argparse's
#: own mistakes too).
command_line = input_errors_exit(errors=(SproutError, *INPUT_ERRORS))
