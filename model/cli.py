"""One-line errors for the command-line tools (train, prepare, grow, ship, info).

An input mistake (a missing or damaged file, a wrong option value, a corpus that cannot work) prints
``error: <what is wrong and what to do>`` on stderr and exits with status 2, as argparse does for a
misspelt option; a traceback is left for what is not the user's input (a bug).
"""
from __future__ import annotations

import argparse
import functools
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .corpus import CorpusError

INPUT_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, CorpusError)  # RunStateError, TokenizerError
# and the sprout_interp errors are ValueErrors or OSErrors too

F = TypeVar("F", bound=Callable)


class OptionError(ValueError):
    """A command-line option whose value cannot work (a folder that cannot be written, say)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, except that a mistake on the command line prints one ``error: ...`` line (no usage block), as
    every other input mistake of these tools does, and exits with status 2. A :class:`Number` refusal reads
    ``error: --flag must be ..., got ...``."""

    def error(self, message: str):  # type: ignore[override]
        text = " ".join(message.split())
        flag, _, rest = text.partition(": ")
        if flag.startswith("argument ") and rest.startswith(Number.SAYS):
            text = f"{flag[len('argument '):]} {rest}"
        else:
            text += " (--help lists the options)"
        print(f"error: {text}", file=sys.stderr)
        raise SystemExit(2)


class Number:
    """An argparse ``type`` for a float option: the text as a finite float from ``low`` to ``high`` where given
    (``above``, ``below``: that bound itself excluded). NaN and infinity are always refused, so no run trains on
    non-finite numbers. :meth:`problem` checks a value that did not come from the command line (a dataclass of
    options) by the same rule."""

    SAYS = "must be "

    def __init__(self, low: float | None = None, high: float | None = None, *, above: bool = False,
                 below: bool = False):
        self.low, self.high, self.above, self.below = low, high, above, below
        if low is not None and high is not None:
            if above and below:
                self.want = f"between {low:g} and {high:g}, both excluded"
            elif above or below:
                self.want = f"{'above' if above else 'at least'} {low:g} and {'below' if below else 'at most'} {high:g}"
            else:
                self.want = f"between {low:g} and {high:g}"
        elif low is not None:
            self.want = f"a number {'above' if above else 'of at least'} {low:g} (finite)"
        elif high is not None:
            self.want = f"a number {'below' if below else 'of at most'} {high:g} (finite)"
        else:
            self.want = "a finite number"

    def ok(self, v: float) -> bool:
        """Whether ``v`` is finite and within the bounds."""
        return math.isfinite(v) and (self.low is None or (v > self.low if self.above else v >= self.low)) and (
            self.high is None or (v < self.high if self.below else v <= self.high))

    def problem(self, v: object) -> str | None:
        """``"must be ..., got v"`` when ``v`` is not a number within the bounds, else None."""
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        return None if number and self.ok(float(v)) else f"{self.SAYS}{self.want}, got {v!r}"

    def __call__(self, text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{self.SAYS}{self.want}, got {text!r}") from None
        if not self.ok(v):
            raise argparse.ArgumentTypeError(f"{self.SAYS}{self.want}, got {text}")
        return v


class Whole:
    """An argparse ``type`` for a count option: the text as a whole number from ``low`` to ``high`` (None: no upper
    bound). Refused: ``error: --flag must be a whole number from 1 to 8, got 0`` (through :class:`ArgumentParser`)."""

    def __init__(self, low: int = 1, high: int | None = None):
        self.low, self.high = low, high
        self.want = f"a whole number {f'from {low} to {high}' if high is not None else f'of at least {low}'}"

    def __call__(self, text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{Number.SAYS}{self.want}, got {text!r}") from None
        if v < self.low or (self.high is not None and v > self.high):
            raise argparse.ArgumentTypeError(f"{Number.SAYS}{self.want}, got {v}")
        return v


FINITE = Number()
NON_NEGATIVE = Number(0.0)
POSITIVE = Number(0.0, above=True)
FRACTION = Number(0.0, 1.0)


def numbers(text: str) -> list[float]:
    """An argparse ``type``: comma-separated finite floats (``"0.7,0.3"``)."""
    return [FINITE(v.strip()) for v in text.split(",")]


def writable_folder(path: str | Path, flag: str) -> Path:
    """``path`` as a Path, after checking that a file can be written into it (or into the folder that would hold
    it, when it does not exist yet) without leaving anything behind; raises :class:`OptionError` naming ``flag``."""
    path = Path(path)
    probe = path
    while not probe.exists():
        if probe.is_symlink():
            raise OptionError(f"{flag} {path}: {probe} is a broken symbolic link; pass a folder you can write to")
        probe = probe.parent
    if not probe.is_dir():
        raise OptionError(f"{flag} {path}: {probe} is a file, not a folder; pass a folder you can write to")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise OptionError(f"{flag} {path}: nothing can be written in {probe} ({e.strerror or type(e).__name__}); pass "
                          "a folder you can write to") from None
    return path


def one_line(err: BaseException) -> str:
    """The error's message on one line (an OSError without a message still names its file)."""
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, OSError) and err.filename and str(err.filename) not in text:
        text += f": {err.filename}"
    return text


def input_errors_exit(main: F | None = None, *, errors: tuple[type[BaseException], ...] = INPUT_ERRORS):
    """Wrap a CLI ``main``: an input mistake (an instance of one of ``errors``) prints ``error: ...`` on stderr and
    exits with status 2. ``@input_errors_exit`` catches :data:`INPUT_ERRORS`; ``@input_errors_exit(errors=...)``
    the classes given (sprout_interp's command lines add its ``SproutError``)."""

    def wrap(main: F) -> F:
        @functools.wraps(main)
        def wrapped(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except errors as err:
                print(f"error: {one_line(err)}", file=sys.stderr)
                raise SystemExit(2) from None

        return wrapped  # type: ignore[return-value]

    return wrap if main is None else wrap(main)
