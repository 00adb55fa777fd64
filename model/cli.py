"""One-line errors for the command-line tools (train, prepare, grow, ship, info).

An input mistake (a missing or damaged file, a wrong option value, a corpus that cannot work) prints
``error: <what is wrong and what to do>`` on stderr and exits with status 2, as argparse does for a
misspelt option; a traceback is left for what is not the user's input (a bug).
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

from .corpus import CorpusError

INPUT_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, CorpusError)  # RunStateError, TokenizerError
# and the sprout_interp errors are ValueErrors or OSErrors too

F = TypeVar("F", bound=Callable)


def one_line(err: BaseException) -> str:
    """The error's message on one line (an OSError without a message still names its file)."""
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, OSError) and err.filename and str(err.filename) not in text:
        text += f": {err.filename}"
    return text


def input_errors_exit(main: F) -> F:
    """Wrap a CLI ``main``: an input mistake prints ``error: ...`` on stderr and exits with status 2."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except INPUT_ERRORS as err:
            print(f"error: {one_line(err)}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapped  # type: ignore[return-value]
