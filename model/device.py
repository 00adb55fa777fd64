"""Training on a lent GPU: the recipe run there (what travels there and back, and the checkpoint in parts that fit
the way back, are :mod:`sprout_model.transport`'s).

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
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch

from .checkpoint import load_folder
from .cli import NON_NEGATIVE, POSITIVE, ArgumentParser, input_errors_exit
from .presets import PRESETS
from .transport import PART_LIMIT, MiB, check_out, join_parts, sent_bytes, size_report, split_checkpoint

CORPUS_FILES = ("train.bin", "val.bin", "meta.json", "tokenizer.json")


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
