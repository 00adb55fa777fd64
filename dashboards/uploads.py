"""Checkpoint files uploaded through the sidebar: checked by name and size, written to a folder of their own named
by their content's hash (the same upload is the same model to the cache), the oldest folders deleted, and the
server's temporary paths kept out of what a person reads. The loader then checks the contents as it checks any path."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import sprout_interp as si

MAX_UPLOAD_MB = 512  # one upload of checkpoint files (Sprout's own weights are 70 MB in float32)
MAX_UPLOADS = 8  # upload folders kept on the server; older ones are deleted
#: the files an upload may hold: a checkpoint folder's, or one weights file
UPLOAD_NAMES = ("config.json", "tokenizer.json", "train.json", "model.safetensors")
WEIGHT_SUFFIXES = (".pt", ".pth", ".safetensors")


class UploadError(si.SproutError):
    """Uploaded files that cannot be a checkpoint (the message says what to upload instead)."""


def upload_dir() -> Path:
    """The server's folder of uploaded checkpoints (in the system's temporary folder)."""
    return Path(tempfile.gettempdir()) / "sprout-dashboard-uploads"


def save_upload(files) -> str:
    """Write uploaded checkpoint files to a folder of their own (named by their content's hash, so the same
    upload is the same model to the cache) and return the path to load: the folder, or the one weights file.
    Only a checkpoint folder's file names (:data:`UPLOAD_NAMES`) or one weights file are taken; the loader
    then checks the contents as it checks any path. "" when nothing is uploaded yet."""
    if not files:
        return ""
    names = [Path(f.name).name for f in files]
    if len(set(names)) != len(names):
        raise UploadError("Two uploaded files have the same name: upload each file once.")
    weights = [n for n in names if n.lower().endswith(WEIGHT_SUFFIXES)]
    if len(weights) != 1:
        raise UploadError(f"Upload exactly one weights file (.safetensors, .pt or .pth); got {len(weights)}.")
    others = [n for n in names if n not in weights]
    bad = [n for n in others if n not in UPLOAD_NAMES]
    if bad:
        raise UploadError(f"Only {', '.join(UPLOAD_NAMES)} may go with the weights; not {', '.join(bad)}.")
    total = sum(f.size for f in files)
    if total > MAX_UPLOAD_MB << 20:
        raise UploadError(f"The upload is {total / 2**20:,.0f} MB; at most {MAX_UPLOAD_MB} MB are accepted.")
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: Path(f.name).name):
        h.update(Path(f.name).name.encode() + b"\0")
        h.update(f.getvalue())
    base = upload_dir()
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    if hasattr(os, "getuid") and (base.is_symlink() or base.stat().st_uid != os.getuid()):
        raise UploadError(f"The upload folder {base} belongs to someone else: uploads are off on this server.")
    folder = base / h.hexdigest()[:24]
    w = weights[0]
    # a folder upload keeps the loader's names; a lone weights file keeps its suffix (what the loader reads it by)
    target = {n: n for n in others}
    target[w] = "model.safetensors" if w.lower().endswith(".safetensors") else "model" + Path(w).suffix.lower()
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        out = folder / target[Path(f.name).name]
        if not out.is_file() or out.stat().st_size != f.size:
            # a name of its own per writer (two sessions may upload the same files at once), then one rename
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=out.name + ".", suffix=".part")
            with os.fdopen(fd, "wb") as part:
                part.write(f.getvalue())
            os.replace(tmp, out)
    os.utime(folder)  # the newest use, for forget_old_uploads
    forget_old_uploads(keep=folder)
    # with its config the folder is a checkpoint folder; otherwise the loader reads the weights file (and a
    # tokenizer.json beside it)
    return str(folder if "config.json" in others else folder / target[w])


def forget_old_uploads(keep: Path, most: int = MAX_UPLOADS) -> None:
    """Delete all but the ``most`` newest upload folders (``keep`` always stays): uploads must not fill the disk.
    A model already loaded from a deleted folder stays usable until the cache lets it go."""
    import shutil

    try:
        folders = sorted((p for p in upload_dir().iterdir() if p.is_dir() and p != keep),
                         key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return
    for old in folders[max(most - 1, 0):]:
        shutil.rmtree(old, ignore_errors=True)


def hide_upload_paths(msg: str) -> str:
    """A loader message with the uploads' temporary folder written as "upload/"."""
    return msg.replace(str(upload_dir()) + os.sep, "upload/").replace(str(upload_dir().resolve()) + os.sep, "upload/")
