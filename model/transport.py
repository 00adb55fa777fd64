"""What travels to and from a lent GPU machine, and the checkpoint in parts that fit the way back.

The device machine receives a copy of the working tree plus up to 8 carried ignored paths (:data:`SEND_LIMIT` in
all; :func:`sent_bytes` counts them) and sends back at most :data:`RETURN_FILES` files of its ``$OUT``, each at most
:data:`RETURN_FILE_LIMIT` (:func:`check_out` lists what would not come back). :func:`split_checkpoint` writes a
checkpoint folder as float16 safetensors parts of at most :data:`PART_LIMIT` with a ``manifest.json`` (the config,
each part's tensors, size and SHA-256); :func:`join_parts` checks and reassembles them into an ordinary checkpoint
folder. :mod:`sprout_model.device` runs the recipe that produces them.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .checkpoint import SHIPPED_DIR, clean_stale_writes, load_folder

MiB = 1 << 20
SEND_LIMIT = 64 * MiB  # the working tree and the carried paths together
RETURN_FILES, RETURN_FILE_LIMIT, RETURN_LIMIT = 8, 16 * MiB, 64 * MiB  # what comes back from $OUT
PART_LIMIT = 15 * MiB  # one part of the checkpoint: under RETURN_FILE_LIMIT with room to spare
MANIFEST = "manifest.json"
PARTS_FORMAT = "sprout-checkpoint-parts"


class PartsError(ValueError):
    """A parts folder that cannot be joined: its manifest or a part missing, truncated or changed."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------- what travels

def _tree_files(repo: Path, pathspecs: tuple[str, ...] = ()) -> list[str]:
    """The files a `run` call copies: tracked ones and untracked ones git does not ignore (those matching
    the git ``pathspecs`` only, when given)."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                          "--", *pathspecs], check=True, capture_output=True).stdout
    return sorted({p for p in out.decode("utf-8", "surrogateescape").split("\0") if p})


def _size(path: Path) -> int:
    """Bytes of a file (a link counts as itself), or of every file under a folder; 0 for what is not there."""
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    if path.is_dir():
        return sum(_size(p) for p in path.rglob("*") if p.is_symlink() or p.is_file())
    return 0


def sent_bytes(repo: str | Path = ".", carry: tuple[str, ...] | list[str] = (),
               without: tuple[str, ...] | list[str] = ()) -> dict:
    """What a `run` call sends: ``tree`` (bytes of the tracked and untracked-not-ignored files that exist, less
    those matching the git pathspecs ``without``: what device_pack.sh would move aside), ``carry`` (bytes under
    each carried path), ``total``, ``limit`` (64 MiB), the ``biggest`` files of the tree, and ``missing_carry``
    (carried paths that are not there)."""
    repo = Path(repo)
    gone = set(_tree_files(repo, tuple(without))) if without else set()
    sizes = {p: _size(repo / p) for p in _tree_files(repo) if p not in gone}
    carried = {c: _size(repo / c) for c in carry}
    tree = sum(sizes.values())
    return {"tree": tree, "carry": sum(carried.values()), "carry_paths": carried, "total": tree + sum(carried.values()),
            "limit": SEND_LIMIT, "tree_files": sum(1 for v in sizes.values() if v),
            "biggest": sorted(((v, k) for k, v in sizes.items()), reverse=True)[:5],
            "missing_carry": [c for c in carry if not (repo / c).exists()]}


def size_report(s: dict) -> str:
    lines = [f"tree  {s['tree']:>12,} bytes ({s['tree'] / MiB:6.1f} MiB, {s['tree_files']} files; biggest: "
             + ", ".join(f"{k} {v / MiB:.1f} MiB" for v, k in s["biggest"][:3]) + ")"]
    for c, v in s["carry_paths"].items():
        lines.append(f"carry {v:>12,} bytes ({v / MiB:6.1f} MiB)  {c}")
    verdict = "fits" if s["total"] <= s["limit"] else "DOES NOT FIT"
    lines.append(f"total {s['total']:>12,} bytes ({s['total'] / MiB:6.1f} MiB) of {s['limit'] / MiB:.0f} MiB: {verdict}")
    return "\n".join(lines)


# ---------------------------------------------------------------- the checkpoint in parts

def split_checkpoint(folder: str | Path, dest: str | Path, max_part_bytes: int = PART_LIMIT,
                     dtype: torch.dtype = torch.float16) -> dict:
    """Write the checkpoint ``folder``'s weights into ``dest`` as safetensors parts of at most
    ``max_part_bytes`` each (float tensors in ``dtype``), with its train.json and a manifest.json written
    last; returns the manifest. Raises ValueError for a tensor bigger than a part can hold."""
    folder, dest = Path(folder), Path(dest)
    sd = load_file(str(folder / "model.safetensors"))
    sd = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in sorted(sd.items())}
    room = max_part_bytes - 1024  # the safetensors header: 8 bytes, the metadata, and a JSON entry per tensor
    groups: list[list[str]] = [[]]
    used = 0
    for k, v in sd.items():
        data = v.numel() * v.element_size()
        n = data + len(k) + 128  # the entry: name, dtype, shape, offsets, padding
        if n > room:
            raise ValueError(f"{k} is {data:,} bytes, more than a part of {max_part_bytes:,} bytes can hold")
        if used + n > room and groups[-1]:
            groups.append([])
            used = 0
        groups[-1].append(k)
        used += n
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MANIFEST).unlink(missing_ok=True)  # a folder without its manifest is never mistaken for a whole one
    parts = []
    for i, names in enumerate(groups, 1):
        f = dest / f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        tmp = f.with_name(f.name + ".tmp")
        save_file({k: sd[k] for k in names}, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, f)
        size = f.stat().st_size
        if size > max_part_bytes:
            raise ValueError(f"{f} came out at {size:,} bytes, more than {max_part_bytes:,}")
        parts.append({"file": f.name, "bytes": size, "sha256": sha256(f), "tensors": names})
    info_file = folder / "train.json"
    if info_file.is_file():
        shutil.copyfile(info_file, dest / "train.json")
    tok = folder / "tokenizer.json"
    manifest = {"format": PARTS_FORMAT, "version": 1, "dtype": str(dtype).removeprefix("torch."),
                "config": json.loads((folder / "config.json").read_text(encoding="utf-8")),
                "tokenizer_sha256": sha256(tok) if tok.is_file() else None,
                "train_json_sha256": sha256(dest / "train.json") if info_file.is_file() else None, "parts": parts}
    tmp = dest / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, dest / MANIFEST)
    return manifest


def read_parts(src: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The manifest and the tensors of a parts folder, every part checked against the manifest first."""
    src = Path(src)
    try:
        manifest = json.loads((src / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PartsError(f"{src} has no {MANIFEST}: the export did not finish (or this is not a parts folder)") from None
    except ValueError as e:
        raise PartsError(f"{src / MANIFEST} is damaged ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != PARTS_FORMAT:
        raise PartsError(f"{src / MANIFEST} is not a {PARTS_FORMAT} manifest")
    sd: dict[str, torch.Tensor] = {}
    for part in manifest["parts"]:
        f = src / part["file"]
        if not f.is_file():
            raise PartsError(f"{f} is missing: a file over {RETURN_FILE_LIMIT // MiB} MiB, or beyond the first "
                             f"{RETURN_FILES} files, does not come back from the device")
        if f.stat().st_size != part["bytes"] or sha256(f) != part["sha256"]:
            raise PartsError(f"{f} is not the part the manifest describes (size or SHA-256 differ): truncated or changed")
        tensors = load_file(str(f))
        if set(tensors) != set(part["tensors"]) or set(tensors) & set(sd):
            raise PartsError(f"{f} holds other tensors than the manifest lists for it")
        sd.update(tensors)
    return manifest, sd


def join_parts(src: str | Path, dest: str | Path, tokenizer: str | Path | None = None) -> Path:
    """Reassemble the parts folder ``src`` into the checkpoint folder ``dest`` (which must not exist):
    model.safetensors (the parts' tensors, bit for bit), config.json, train.json and tokenizer.json (``tokenizer``,
    else one in ``src``, else the shipped one; it must be the one the run trained with). Checks that
    ``load_folder`` reads the result; returns ``dest``."""
    src, dest = Path(src), Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} already exists; pass a new folder (a joined checkpoint is never overwritten)")
    manifest, sd = read_parts(src)
    candidates = [Path(tokenizer)] if tokenizer else [src / "tokenizer.json", SHIPPED_DIR / "tokenizer.json"]
    tok = next((p for p in candidates if p.is_file()), None)
    if tok is None:
        raise FileNotFoundError(f"no tokenizer.json among {', '.join(map(str, candidates))}; pass --tokenizer FILE")
    want = manifest.get("tokenizer_sha256")
    if want and sha256(tok) != want:
        raise PartsError(f"{tok} is not the tokenizer the run trained with (SHA-256 {want[:12]}…); pass the corpus's "
                         "tokenizer.json with --tokenizer")
    dest.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_writes(dest)  # what a killed join left, this process's pid included
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    tmp.mkdir()
    try:
        save_file(dict(sorted(sd.items())), str(tmp / "model.safetensors"),
                  metadata={"format": "pt", "dtype": f"torch.{manifest['dtype']}"})
        (tmp / "config.json").write_text(json.dumps(manifest["config"], indent=1))
        if (src / "train.json").is_file():
            shutil.copyfile(src / "train.json", tmp / "train.json")
        shutil.copyfile(tok, tmp / "tokenizer.json")
        load_folder(tmp)  # raises CheckpointFolderError if the config and the tensors disagree
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


# ---------------------------------------------------------------- the recipe


def check_out(out: Path) -> list[str]:
    """Problems with ``out`` as what comes back: more than 8 files, a file over 16 MiB, over 64 MiB in all."""
    files = [p for p in out.rglob("*") if p.is_file()]
    problems = [f"{p.name}: {p.stat().st_size:,} bytes, over {RETURN_FILE_LIMIT:,}" for p in files
                if p.stat().st_size > RETURN_FILE_LIMIT]
    if len(files) > RETURN_FILES:
        problems.append(f"{len(files)} files, more than {RETURN_FILES} come back")
    if sum(p.stat().st_size for p in files) > RETURN_LIMIT:
        problems.append(f"{sum(p.stat().st_size for p in files):,} bytes in all, over {RETURN_LIMIT:,}")
    return problems
