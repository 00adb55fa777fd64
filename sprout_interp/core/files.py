"""Reading the files of a checkpoint safely: only regular files and folders, each of bounded size, checked on
the open file itself (a FIFO or device swapped in after a check can neither block nor stream forever).

Every failure is a :class:`~sprout_interp.core.errors.SproutError` whose message says what to do.
"""
from __future__ import annotations

import errno
import io
import json
import os
import stat
from pathlib import Path

from sprout_interp.core import limits
from sprout_interp.core.errors import CheckpointNotFoundError, NotACheckpointError, NotAPathError, UnreadablePathError
from sprout_model.checkpoint import SHIPPED

__all__ = ["as_path", "path_kind", "not_regular", "open_regular", "read_bytes", "read_json"]


def as_path(value: object, name: str, what: str = "a folder") -> Path:
    """``value`` (a ``str`` or ``os.PathLike``) as a Path; ``name`` is the argument as the user wrote it.

    Raises :class:`NotAPathError` for anything else (a number, a bool, None, bytes ...): nothing is turned into
    a path by ``str()``, so ``123`` never reads a folder named "123".
    """
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if isinstance(text, str):
        if not text.strip():
            raise NotAPathError(f"{name} is empty: pass the path of {what}")
        return Path(text)
    raise NotAPathError(
        f"{name} must be the path of {what} (a str or os.PathLike), got {type(value).__name__} {str(value)[:60]!r}; "
        f"pass it as a path: {name}='path/to/it'"
    )


def path_kind(p: Path) -> str | None:
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


def not_regular(p: Path, kind: str) -> NotACheckpointError:
    """The error for a path that is a FIFO, a device or another special file, not a regular file."""
    return NotACheckpointError(
        f"{p} is a {kind}, not a regular file: Sprout reads checkpoints only from regular files and folders. Pass a "
        "checkpoint folder, a .safetensors or .pt file, or a shipped name (" + ", ".join(SHIPPED) + ")"
    )


def open_regular(p: Path, limit: int, what: str) -> io.BufferedIOBase:
    """``p`` opened for reading after checking, on the open file itself, that it is a regular file of at
    most ``limit`` bytes (so a FIFO swapped in after a check can neither block nor stream forever)."""
    kind = path_kind(p)
    if kind is None:
        raise CheckpointNotFoundError(f"no {what} at {p}")
    if kind != "file":
        raise not_regular(p, kind)
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise not_regular(p, "special file")
    if st.st_size > limit:
        os.close(fd)
        raise NotACheckpointError(
            f"{p} is {st.st_size:,} bytes, more than a Sprout {what} can be ({limit:,}); this is not one. "
            "If it really is, raise its limit in sprout_interp.core.limits"
        )
    return os.fdopen(fd, "rb")


def read_bytes(p: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``p``, at most ``limit`` of them (:func:`open_regular`)."""
    with open_regular(p, limit, what) as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew after the check
        raise NotACheckpointError(f"{p} is more than {limit:,} bytes, more than a Sprout {what} can be")
    return data


def read_json(p: Path, what: str) -> dict:
    """The JSON object in ``p`` (at most ``limits.MAX_JSON_BYTES``); ``what`` names the file in messages."""
    raw = read_bytes(p, limits.MAX_JSON_BYTES, f"{what} file")
    try:
        d = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise NotACheckpointError(f"{p} is not valid JSON ({str(e)[:200]}); the {what} file of a checkpoint folder is a JSON object") from None
    except RecursionError:
        raise NotACheckpointError(f"{p} is JSON nested too deeply; the {what} file of a checkpoint folder is a flat JSON object") from None
    if not isinstance(d, dict):
        raise NotACheckpointError(f"{p} holds a JSON {type(d).__name__}, not an object; the {what} file of a checkpoint folder is a JSON object")
    return d
