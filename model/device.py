"""Training on a lent GPU: the recipe run there, the checkpoint in parts that fit the way back, what travels.

    python -m sprout_model.device run --minutes 8 --out $OUT          # on the GPU (scripts/train_on_device.sh)
    python -m sprout_model.device run --cpu --preset tiny --minutes 1  # the same recipe here, small
    python -m sprout_model.device run --cpu --preset tiny --steps 20   # ... as a fixed number of steps a stage
    python -m sprout_model.device size --carry device                  # what a `run` call would send (64 MiB at most)
    python -m sprout_model.device join PARTS_FOLDER runs/device/checkpoint   # the parts back into a checkpoint folder

The device machine receives a copy of the working tree plus up to 8 carried ignored paths, 64 MiB in all,
and sends back at most 8 files of its ``$OUT``, each at most 16 MiB (64 MiB together). So the recipe trains
from scratch on a carried corpus (``scripts/device_pack.sh`` prepares ``device/data`` and moves the shipped
weights out of the tree for the call), and writes its best checkpoint as float16 safetensors parts of at
most 15 MiB with a ``manifest.json`` (the config, each part's tensors, size and SHA-256), beside the run's
``train.json`` and a ``device.json`` (timings, throughput, the final evaluation). :func:`join_parts`
reassembles them into an ordinary checkpoint folder (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``train.json``) that ``load_folder`` and ``sprout_interp.load`` read.

The recipe is the one that gave the shipped gpt-4 its induction circuit (TRAINING.md), scaled up: a copy-task
stage (every row random tokens repeating with a random period) until the copying ratio falls to
``--copy-stop`` or ``--copy-share`` of the time is spent, then real text with a quarter of copy rows
(``--init-from`` the copy stage) on a schedule fitted to the time left (``train --fit-minutes``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from .checkpoint import SHIPPED_DIR, load_folder
from .cli import NON_NEGATIVE, POSITIVE, ArgumentParser, input_errors_exit
from .presets import PRESETS

MiB = 1 << 20
SEND_LIMIT = 64 * MiB  # the working tree and the carried paths together
RETURN_FILES, RETURN_FILE_LIMIT, RETURN_LIMIT = 8, 16 * MiB, 64 * MiB  # what comes back from $OUT
PART_LIMIT = 15 * MiB  # one part of the checkpoint: under RETURN_FILE_LIMIT with room to spare
MANIFEST = "manifest.json"
PARTS_FORMAT = "sprout-checkpoint-parts"
CORPUS_FILES = ("train.bin", "val.bin", "meta.json", "tokenizer.json")


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
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
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

@dataclass
class Recipe:
    """The device run's settings; None means the GPU's value, or the CPU's with ``cpu`` (see PROFILES)."""

    out: str = "out/device-run"  # the parts, train.json and device.json ($OUT on the device)
    minutes: float | None = None  # wall time of the whole run, start to the last file written
    steps: int | None = None  # instead of fitting to the minutes: each stage at most this many steps (the copy stage
    # fewer where its copying ratio reaches --copy-stop first), the same work on any machine, however long it takes
    cpu: bool = False  # train on the CPU at a small scale (the same recipe, checked here)
    preset: str = "sprout"  # or "tiny": gpt-4's width with 2 blocks, for the CPU check
    data: str | None = None  # a prepared corpus; default device/data (scripts/device_pack.sh), else data/large-names
    work: str | None = None  # the run folders (their state.pt is too big to come back); default a new temp folder,
    keep_work: bool = False  # ... removed at the end unless this is set
    dtype: str | None = None
    compile: bool | None = None
    seed: int = 1337
    copy_share: float = 0.4  # the copy stage gets at most this share of the minutes
    copy_stop: float = 0.3  # ... and stops at the first evaluation with a copying ratio at or below this
    copy_batch: int | None = None
    copy_seq: int | None = None
    copy_lr: float = 2e-3
    copy_warmup: int | None = None
    copy_eval_every: int | None = None
    text_batch: int | None = None
    text_seq: int | None = None
    text_lr: float = 2e-3
    text_warmup: int | None = None
    text_copy_rows: float = 0.25
    text_eval_every: int | None = None
    text_eval_batches: int | None = None
    final_windows: int | None = None  # validation windows of 256 tokens for the final loss; 0: every one
    margin_s: float | None = None  # seconds kept after training for the final evaluation and the export


PROFILES = {
    # An H200: copy stage 16k tokens a step (the phase change needs steps more than tokens), text 131k.
    "gpu": dict(minutes=8.0, dtype="bf16", compile=True, copy_batch=64, copy_seq=256, copy_warmup=50,
                copy_eval_every=100, text_batch=256, text_seq=512, text_warmup=100, text_eval_every=100,
                text_eval_batches=4, final_windows=0, margin_s=40.0),
    "cpu": dict(minutes=1.0, dtype="fp32", compile=False, copy_batch=16, copy_seq=128, copy_warmup=10,
                copy_eval_every=10, text_batch=8, text_seq=256, text_warmup=10, text_eval_every=20,
                text_eval_batches=1, final_windows=32, margin_s=10.0),
}
COPY_SCHEDULE_STEPS = 20_000  # the copy stage's cosine is this long, so its lr stays near the peak until it stops
TEXT_TOKENS_CAP = 5e9  # the text stage's --tokens; --fit-minutes makes its schedule end in the time left


def filled(r: Recipe) -> Recipe:
    """``r`` with every None taken from its profile (gpu, or cpu with ``r.cpu``)."""
    prof = PROFILES["cpu" if r.cpu else "gpu"]
    return Recipe(**{f.name: prof[f.name] if getattr(r, f.name) is None and f.name in prof else getattr(r, f.name)
                     for f in fields(Recipe)})


def _corpus(r: Recipe) -> Path:
    for d in ([r.data] if r.data else ["device/data", "data/large-names"]):
        if all((Path(d) / f).is_file() for f in CORPUS_FILES):
            return Path(d)
    raise FileNotFoundError(f"no prepared corpus ({', '.join(CORPUS_FILES)}) in {r.data or 'device/data or data/large-names'}: "
                            "run scripts/device_pack.sh (it fills device/data), or pass --data FOLDER")


def describe_device(cpu: bool) -> dict:
    d = {"torch": torch.__version__, "python": platform.python_version(), "host_cpus": os.cpu_count()}
    if not cpu and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        d.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda,
                 bf16=torch.cuda.is_bf16_supported())
    return d


def _stage_summary(run: Path, result: dict, wall: float) -> dict:
    from .run_state import read_state
    s = read_state(run / "state.pt")
    own_tokens = s["tokens_seen"] - ((s.get("init") or {}).get("tokens_seen") or 0)
    return {**result, "process_wall_s": round(wall, 1), "train_wall_s": round(s["wall"], 1), "own_tokens": own_tokens,
            "tokens_per_s": round(own_tokens / s["wall"]) if s["wall"] else None, "fit": s.get("fit"),
            "last": s["history"][-1] if s["history"] else None}


def final_evaluation(folder: Path, data: Path, device: str, windows: int) -> dict:
    """What ``sprout_model.info`` and ``ship`` measure, on the float16 weights that come back: validation loss
    on ``windows`` evenly spaced 256-token windows (0: all), copying ratio (64 tokens, batch 32, seed 0),
    invented-name copying on the tuning and the held-out texts."""
    from .evaluation import HELDOUT_NAME_TEXTS, name_copying, repeated_tokens_loss_ratio
    from .tokenizer import load_tokenizer
    from .train import evaluate
    model, _ = load_folder(folder)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    model.to(device).eval()
    val = np.memmap(data / "val.bin", dtype=np.uint16, mode="r")
    seq = min(256, model.cfg.context)
    n = (len(val) - 1) // seq
    n = n if not windows else min(n, windows)
    loss = evaluate(model, val, seq, -(-n // 16), 16, device)
    tok = load_tokenizer(data / "tokenizer.json")
    copy = repeated_tokens_loss_ratio(model, seq_len=64, batch=32, seed=0)
    names, held = name_copying(model, tok), name_copying(model, tok, HELDOUT_NAME_TEXTS)
    return {"weights": "float16 (as they come back)", "val_loss": round(loss, 4), "val_windows": f"{n} x {seq}",
            "copy_ratio": round(copy.ratio, 4), "name_copying": round(names.mean_prob, 4),
            "heldout_name_copying": round(held.mean_prob, 4)}


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


def run_recipe(r: Recipe) -> dict:
    """Train the two stages within ``r.minutes``, evaluate, and export the best checkpoint to ``r.out``;
    returns what device.json holds. The export runs even when training fails (then re-raised)."""
    from .train import TrainArgs, train

    t0 = time.time()
    r = filled(r)
    if not (r.minutes and r.minutes > 0 and 0 < r.copy_share < 1):
        raise ValueError(f"--minutes must be above 0 and --copy-share between 0 and 1, got {r.minutes}, {r.copy_share}")
    if r.steps is not None and (isinstance(r.steps, bool) or not isinstance(r.steps, int) or r.steps < 1):
        raise ValueError(f"--steps must be a whole number above 0 (or left out, to fit the stages to --minutes), "
                         f"got {r.steps!r}")
    if r.preset != "tiny" and r.preset not in PRESETS:
        raise ValueError(f"--preset {r.preset!r} is not tiny or one of {', '.join(sorted(PRESETS))}")
    deadline = t0 + r.minutes * 60
    out = Path(r.out)
    out.mkdir(parents=True, exist_ok=True)
    data = _corpus(r)
    work = Path(r.work) if r.work else Path(tempfile.mkdtemp(prefix="sprout-device-"))
    device = "cpu" if r.cpu else "cuda"
    preset, n_layer = ("gpt-4", 2) if r.preset == "tiny" else (r.preset, None)
    report: dict = {"recipe": asdict(r), "data": str(data), "work": str(work), "machine": describe_device(r.cpu), "stages": {}}

    def log(msg: str) -> None:
        print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

    # the torch sampler on the CPU too, so that the check here runs the GPU's code
    common = dict(preset=preset, n_layer=n_layer, data=str(data), device=device, dtype=r.dtype, seed=r.seed,
                  save_every=1000, sampler="torch")
    log(f"{preset}{'' if n_layer is None else f' ({n_layer} blocks)'} on {device} ({r.dtype}, "
        f"{'compiled' if r.compile else 'eager'}), {r.minutes:g} minutes, corpus {data}, work {work}")
    copy_run, text_run = work / "copy", work / "text"
    copy_end = t0 + r.copy_share * r.minutes * 60
    compiled = {"on": bool(r.compile)}

    def copy_args(compile_: bool) -> TrainArgs | None:
        if r.steps is None:
            left = (copy_end - time.time()) / 60
            if left < 0.05:
                return None
        budget = dict(max_minutes=left) if r.steps is None else dict(max_steps=r.steps)
        return TrainArgs(**common, compile=compile_, out=str(copy_run), batch_size=r.copy_batch, seq_len=r.copy_seq,
                         lr=r.copy_lr, warmup=r.copy_warmup, tokens=float(COPY_SCHEDULE_STEPS * r.copy_batch * r.copy_seq),
                         copy_rows=1.0, eval_every=r.copy_eval_every, eval_batches=1, **budget,
                         stop_copy_ratio=r.copy_stop)

    def text_args(compile_: bool) -> TrainArgs | None:
        if r.steps is None:
            left = (deadline - time.time() - r.margin_s) / 60
            if left < 0.1:
                return None
        # fitted to the time left; or a whole schedule of --steps steps
        budget = (dict(tokens=TEXT_TOKENS_CAP, fit_minutes=left, max_minutes=left) if r.steps is None
                  else dict(tokens=float(r.steps * r.text_batch * r.text_seq)))
        init = str(copy_run) if (copy_run / "state.pt").is_file() else None
        return TrainArgs(**common, compile=compile_, out=str(text_run), init_from=init, batch_size=r.text_batch,
                         seq_len=r.text_seq, lr=r.text_lr, warmup=r.text_warmup, copy_rows=r.text_copy_rows,
                         eval_every=r.text_eval_every, eval_batches=r.text_eval_batches, **budget)

    def stage(name: str, build) -> None:
        """Train one stage; if compiled training fails, once more without compiling (and no later stage compiles)."""
        a = build(compiled["on"])
        if a is None:
            log(f"{name} stage: no time left")
            return
        log(f"{name} stage: {a.batch_size} x {a.seq_len} tokens a step, lr {a.lr:g}, copy rows {a.copy_rows:g}, "
            + (f"{a.max_minutes:.2f} minutes at most" if a.max_minutes is not None
               else f"{a.max_steps or a.total_steps:,} steps at most")
            + (f", until the copying ratio is <= {a.stop_copy_ratio:g}" if a.stop_copy_ratio
               else ", schedule fitted to them" if a.fit_minutes else "")
            + (f", from {a.init_from}" if a.init_from else ""))
        t = time.time()
        try:
            res = train(a, progress=False)
        except Exception as e:
            if not a.compile:
                raise
            log(f"compiled training failed ({type(e).__name__}: {str(e).strip()[:400]}); again without compiling")
            report["compile_failed"] = f"{type(e).__name__}: {str(e).strip()[:2000]}"
            compiled["on"] = False
            torch._dynamo.reset()
            shutil.rmtree(a.out, ignore_errors=True)
            a = build(False)
            if a is None:
                log(f"{name} stage: no time left")
                return
            t = time.time()
            res = train(a, progress=False)
        report["stages"][name] = _stage_summary(Path(a.out), res, time.time() - t)
        log(f"{name} stage ended ({res['stopped']}) at step {res['step']:,}, {res['tokens_seen']:,} tokens in all")
        if a.compile:
            torch._dynamo.reset()  # the next stage's shapes compile afresh, not as dynamic ones

    error = None
    try:
        stage("copy", copy_args)
        stage("text", text_args)
    except BaseException as e:  # export what there is, then let it go on
        error = e
        report["error"] = f"{type(e).__name__}: {e}"
        log(f"training stopped by {report['error']}")
    finally:
        best = next((work / s / "checkpoint" for s in ("text", "copy") if (work / s / "checkpoint" / "model.safetensors").is_file()), None)
        if best is None:
            log("no checkpoint to export")
        else:
            report["exported"] = str(best)
            try:
                report["final"] = final_evaluation(best, data, device, r.final_windows)
                log(f"final evaluation of {best}: {json.dumps(report['final'])}")
            except Exception as e:  # the weights matter more than their evaluation
                report["final"] = f"failed: {type(e).__name__}: {e}"
            manifest = split_checkpoint(best, out)
            log(f"exported {len(manifest['parts'])} parts ({sum(p['bytes'] for p in manifest['parts']):,} bytes) to {out}")
        report["wall_s"] = round(time.time() - t0, 1)
        (out / "device.json").write_text(json.dumps(report, indent=1, default=str))
        problems = check_out(out)
        for p in sorted(out.iterdir()):
            log(f"  {p.name:40s} {p.stat().st_size:>12,} bytes")
        if problems:
            log("WARNING, not all of it comes back: " + "; ".join(problems))
    if not r.work and not r.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    if error is not None:
        raise error
    return report


# ---------------------------------------------------------------- the command line

def _recipe_parser(sub) -> None:
    p = sub.add_parser("run", help="train the recipe and export the checkpoint in parts")
    for f in fields(Recipe):
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        if f.name in ("cpu", "keep_work"):
            p.add_argument(flag, action="store_true")
        elif f.name == "compile":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        elif f.name == "dtype":
            p.add_argument(flag, choices=("fp32", "bf16"), default=None)
        else:
            kind = {"minutes": float, "margin_s": float}.get(f.name)
            if kind is None:
                kind = type(default) if default is not None else (str if f.name in ("data", "work") else int)
            if kind is float:  # every float of the recipe is a size, a rate or a time: finite and not negative
                kind = NON_NEGATIVE
            p.add_argument(flag, type=kind, default=default)


@input_errors_exit
def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    _recipe_parser(sub)
    s = sub.add_parser("size", help="bytes a run call would send: the tree and the carried paths")
    s.add_argument("--repo", default=".")
    s.add_argument("--carry", nargs="*", default=[])
    s.add_argument("--without", nargs="*", default=[], help="git pathspecs of files to count as moved out of the tree")
    sp = sub.add_parser("split", help="a checkpoint folder into parts")
    sp.add_argument("folder")
    sp.add_argument("dest")
    sp.add_argument("--max-part-mib", type=POSITIVE, default=PART_LIMIT / MiB)
    j = sub.add_parser("join", help="a parts folder back into a checkpoint folder")
    j.add_argument("src")
    j.add_argument("dest")
    j.add_argument("--tokenizer", default=None)
    a = p.parse_args(argv)
    if a.cmd == "size":
        rep = sent_bytes(a.repo, a.carry, a.without)
        print(size_report(rep))
        if rep["missing_carry"]:
            raise FileNotFoundError(f"carried paths not there: {', '.join(rep['missing_carry'])}")
        if rep["total"] > rep["limit"]:
            raise ValueError(f"{rep['total']:,} bytes would be sent, more than {rep['limit']:,}: move more out of the tree")
    elif a.cmd == "split":
        m = split_checkpoint(a.folder, a.dest, int(a.max_part_mib * MiB))
        print(f"{len(m['parts'])} parts in {a.dest}")
    elif a.cmd == "join":
        dest = join_parts(a.src, a.dest, a.tokenizer)
        model, info = load_folder(dest)
        print(f"{dest}: {model.num_params():,} parameters, {info.get('tokens_seen', 0):,} tokens, "
              f"validation loss {info.get('val_loss')}")
    else:
        kw = {k: v for k, v in vars(a).items() if k != "cmd"}
        report = run_recipe(Recipe(**kw))
        print(json.dumps({k: report.get(k) for k in ("final", "wall_s")}, default=str))


if __name__ == "__main__":
    sys.exit(main())
