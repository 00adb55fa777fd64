"""Train a preset on a prepared corpus, resumably.

    python -m sprout_model.prepare                      # once: corpus, tokenizer, token files
    python -m sprout_model.train --preset gpt-4 --tokens 8e6
    python -m sprout_model.train --preset sprout --device cuda --dtype bf16 --compile --batch-size 256 --seq-len 512

The run folder (default ``runs/<preset>``) holds ``state.pt`` (model, optimizer, step, data position,
RNG states; written atomically every ``--save-every`` steps and on Ctrl-C) and ``checkpoint/``, the
checkpoint folder of the best validation loss so far. Running the same command again resumes.

``--device cuda`` trains on a GPU: the weights and the optimizer's state stay float32 there (``--dtype bf16``
runs the forward pass under bfloat16 autocast), the batches are drawn on the GPU from the token arrays moved
there once (``TorchBatches``), and ``state.pt`` and the checkpoints are written from CPU copies, so any
machine reads them. ``sprout_model.device`` runs the whole recipe on a lent GPU within a time budget.
"""
from __future__ import annotations

import json
import math
import os
import signal
import time
from argparse import RawDescriptionHelpFormatter
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .batches import Batches, TorchBatches
from .checkpoint import clean_stale_writes, config_problem, parameter_count, save_checkpoint
from .cli import FRACTION, NON_NEGATIVE, POSITIVE, ArgumentParser, Number, input_errors_exit, writable_folder
from .corpus import open_tokens
from .evaluation import NAME_TEXTS, name_copying, repeated_tokens_loss_ratio
from .grow import load_grown, read_source
from .model import GPT, Config
from .presets import PRESETS, preset
from .run_state import read_state, rng_state, set_rng_state, write_state
from .tokenizer import TokenizerError, check_corpus_tokenizer, load_tokenizer


@dataclass
class TrainArgs:
    preset: str = "gpt-4"
    data: str = "data/default"
    out: str | None = None
    tokens: float = 8e6  # total training tokens; sets the number of steps and the schedule's length
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_frac: float = 0.1  # the schedule decays to this fraction of lr
    schedule: str = "cosine"  # "cosine": warm-up, then cosine decay over all of --tokens; "wsd": warm-up, lr held,
    # then a linear decay over the last --cooldown-tokens (warmup-stable-decay: a run of unknown length keeps a
    # steady rate, and a --branch-from copy with a nearer --tokens decays from where it is)
    cooldown_tokens: float = 0.0  # --schedule wsd: the decay's length in tokens, at the end of --tokens
    warmup: int = 200
    weight_decay: float = 0.1
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_batches: int = 20
    save_every: int = 100
    seed: int = 1337
    compile: bool = False
    threads: int | None = None
    max_minutes: float | None = None  # stop (resumably) after this much wall time in this process
    max_steps: int | None = None  # stop (resumably) at this step; the schedule still uses --tokens
    name_views: bool = False  # train on the name-randomised views written by `prepare --name-views K`
    copy_rows: float = 0.0  # share of rows replaced by a segment repeating with a random period
    qk_gain_lr: float = 1.0  # learning-rate multiplier for the QK-norm gains (see TRAINING.md)
    embed_lr: float = 1.0  # learning-rate multiplier for the (tied) embedding
    embed_mean: float = 0.0  # fresh runs: add one shared random direction of this norm to every embedding row
    real_rows: float = 0.0  # with --name-views: this share of rows comes from the real (un-renamed) text
    copy_source: str = "random"  # the repeated segment: "random" tokens, the start of the row's own "text", or "mixed" (each row either, evenly)
    n_layer: int | None = None  # train a shallower version of the preset (a first stage that --init-from grows)
    branch_from: str | None = None  # a new run (--out) that continues another run exactly: its weights, optimizer,
    # step, data position and history, under this run's --tokens and schedule (a cooldown off a wsd run); the other
    # run is not changed. Its best checkpoint is its own: the first evaluation writes one
    init_from: str | None = None  # start from another run's weights (its folder's state.pt, or a checkpoint
    # folder); fresh optimizer and schedule; its tokens and history carry over into this run's counts; a
    # shallower or narrower run (a smaller preset) is grown to this size keeping its function (grow.py)
    device: str = "cpu"  # "cuda" (or "cuda:N"): train there; state.pt and checkpoints are written from CPU copies
    dtype: str = "fp32"  # "bf16": the forward pass under bfloat16 autocast (float32 weights and optimizer state)
    sampler: str = "auto"  # "numpy": Batches (host memory); "torch": TorchBatches (the tokens on --device);
    # "auto": numpy on the CPU, torch on a GPU
    fit_minutes: float | None = None  # shorten the schedule (--tokens is then the most) so that it ends after about
    # this many minutes of this process's wall time, measured on the steps after the first few (see FIT_AFTER)
    stop_copy_ratio: float | None = None  # stop (resumably) at the first evaluation whose copying ratio is at or
    # below this: the end of a copy-task stage, whose next stage starts from this run with --init-from

    def model_config(self) -> Config:
        """The preset's Config, with ``n_layer`` overridden when set (vocab_size as the preset says)."""
        cfg = preset(self.preset)
        if self.n_layer is not None:
            cfg.n_layer = self.n_layer
        return cfg

    @property
    def total_steps(self) -> int:
        return max(1, int(self.tokens // (self.batch_size * self.seq_len)))


class TrainArgsError(ValueError):
    """Training options that cannot work together or with the run folder being resumed."""


MAX_TOKENS = 1e12  # --tokens: a thousand times what Sprout was trained on; a bigger number is a typo (1e30 would
# set a schedule of 1e28 steps)
#: the range of every float option, checked on the command line (an argparse type) and in check_args alike
FLOATS: dict[str, Number] = {
    "tokens": Number(0.0, MAX_TOKENS, above=True), "lr": NON_NEGATIVE, "min_lr_frac": FRACTION,
    "cooldown_tokens": NON_NEGATIVE, "weight_decay": NON_NEGATIVE, "beta2": Number(0.0, 1.0, below=True),
    "grad_clip": POSITIVE, "max_minutes": POSITIVE, "copy_rows": FRACTION, "qk_gain_lr": NON_NEGATIVE,
    "embed_lr": NON_NEGATIVE, "embed_mean": NON_NEGATIVE, "real_rows": FRACTION, "fit_minutes": POSITIVE,
    "stop_copy_ratio": POSITIVE,
}
DTYPES = ("fp32", "bf16")
SCHEDULES = ("cosine", "wsd")
SAMPLERS = ("auto", "numpy", "torch")
FIT_AFTER = (3, 10)  # --fit-minutes: skip this many steps (compilation), then time this many


def resolve_device(a: TrainArgs) -> torch.device:
    """The torch.device of ``--device``; raises TrainArgsError (saying what to pass) for one this machine lacks."""
    try:
        device = torch.device(a.device)
    except (RuntimeError, ValueError):
        raise TrainArgsError(f"--device {a.device!r} is not a device torch knows; pass cpu or cuda") from None
    if device.type not in ("cpu", "cuda"):
        raise TrainArgsError(f"--device {a.device!r}: training runs on cpu or cuda only")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TrainArgsError(f"--device {a.device}: this machine has no CUDA device (or torch was built without "
                                 "CUDA); pass --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise TrainArgsError(f"--device {a.device}: there are {torch.cuda.device_count()} CUDA devices here")
        if a.dtype == "bf16" and not torch.cuda.is_bf16_supported():
            raise TrainArgsError(f"--dtype bf16: {torch.cuda.get_device_name(device)} does not support bfloat16; "
                                 "pass --dtype fp32")
    return device


def resolve_sampler(a: TrainArgs, device: torch.device) -> str:
    """``--sampler`` with "auto" decided: numpy batches on the CPU, torch batches on a GPU."""
    if a.sampler != "auto":
        return a.sampler
    return "numpy" if device.type == "cpu" else "torch"


def autocast(device: torch.device, dtype: str) -> AbstractContextManager:
    """The forward pass's precision: bfloat16 autocast for ``dtype`` "bf16", plain float32 otherwise."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")


def to_cpu(obj):
    """``obj`` (tensors in nested dicts, lists and tuples) with every tensor a detached CPU tensor."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def check_args(a: TrainArgs) -> None:
    """Raise TrainArgsError (one line: what is wrong, what to pass instead) for options that cannot work."""
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise TrainArgsError(msg)

    for name in ("batch_size", "seq_len", "eval_every", "eval_batches", "save_every"):
        v = getattr(a, name)
        need(v >= 1, f"--{name.replace('_', '-')} must be 1 or more, got {v}")
    for name, kind in FLOATS.items():
        v = getattr(a, name)
        problem = None if v is None else kind.problem(v)
        need(problem is None, f"--{name.replace('_', '-')} {problem}")
    need(a.warmup >= 0, f"--warmup must be 0 or more, got {a.warmup}")
    need(a.n_layer is None or a.n_layer >= 1, f"--n-layer must be 1 or more, got {a.n_layer}")
    cpus = os.cpu_count() or 1
    need(a.threads is None or 1 <= a.threads <= cpus, f"--threads must be from 1 to this machine's {cpus} CPUs, got {a.threads}")
    need(a.max_steps is None or a.max_steps >= 0, f"--max-steps must be 0 or more, got {a.max_steps}")
    need(a.schedule in SCHEDULES, f"--schedule must be one of {', '.join(SCHEDULES)}, got {a.schedule!r}")
    need(a.schedule != "wsd" or 0 < a.cooldown_tokens <= a.tokens,
         f"--schedule wsd needs --cooldown-tokens above 0 and at most --tokens ({a.tokens:g}), got {a.cooldown_tokens:g}")
    need(a.schedule == "wsd" or not a.cooldown_tokens,
         f"--cooldown-tokens is the decay of --schedule wsd; the {a.schedule} schedule has none: pass --schedule wsd or drop it")
    need(not (a.branch_from and a.init_from), "--branch-from continues a run and --init-from starts a new one: pass one")
    need(a.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {a.dtype!r}")
    need(a.sampler in SAMPLERS, f"--sampler must be one of {', '.join(SAMPLERS)}, got {a.sampler!r}")
    need(a.preset in PRESETS, f"--preset {a.preset!r} is not one of {', '.join(sorted(PRESETS))}")
    problem = config_problem(a.model_config())  # the loader's limits: a model it would refuse is never allocated
    need(problem is None, f"{f'--n-layer {a.n_layer}' if a.n_layer is not None else f'--preset {a.preset}'}: {problem} "
                          "(the largest model the loaders build)")
    context = a.model_config().context
    need(a.seq_len <= context, f"--seq-len {a.seq_len} is longer than the {a.preset} model's context of {context} "
                               f"tokens; pass --seq-len {context} or less")
    resolve_device(a)
    writable_folder(a.out or f"runs/{a.preset}", "--out")  # a probe: nothing is left there


RESUME_MUST_MATCH = ("preset", "n_layer", "batch_size", "seq_len")  # a resumed run keeps its shapes and batches


def check_resume(saved: dict | None, a: TrainArgs, out: Path) -> None:
    """Raise TrainArgsError when ``a`` differs from the saved run's options in what exact resuming needs."""
    saved = saved or {}
    for k in RESUME_MUST_MATCH:
        if k in saved and saved[k] != getattr(a, k):
            flag = "--" + k.replace("_", "-")
            raise TrainArgsError(
                f"{out} was started with {flag} {saved[k]}; resuming it with {flag} {getattr(a, k)} would not continue "
                f"the same run. Pass {flag} {saved[k]} to resume, or --out a new folder for a new run"
            )


def lr_at(step: int, a: TrainArgs) -> float:
    """Linear warm-up, then down to min_lr_frac·lr at the last step: by a cosine over the rest ("cosine"), or held at
    lr and then linearly over the last ``cooldown_tokens`` ("wsd")."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    if a.schedule == "wsd":
        cool = max(1, int(a.cooldown_tokens // (a.batch_size * a.seq_len)))
        start = a.total_steps - cool
        if step < start:
            return a.lr
        return a.lr * (1 - (1 - a.min_lr_frac) * min(1.0, (step - start) / cool))
    progress = min(1.0, (step - a.warmup) / max(1, a.total_steps - a.warmup))
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model: torch.nn.Module, val: np.ndarray, seq_len: int, n_batches: int, batch_size: int,
             device: str | torch.device | None = None, dtype: str = "fp32") -> float:
    """Mean cross-entropy in nats/token on fixed, evenly spaced validation windows (on ``device``, by default
    the model's, with the forward pass in ``dtype`` as in training)."""
    model.eval()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    n = (len(val) - 1) // seq_len
    idx = np.linspace(0, n - 1, num=min(n, n_batches * batch_size)).astype(int)
    losses = []
    for i in range(0, len(idx), batch_size):
        rows = np.stack([val[s * seq_len: s * seq_len + seq_len + 1] for s in idx[i: i + batch_size]]).astype(np.int64)
        x = torch.from_numpy(rows).to(device)
        with autocast(device, dtype):
            _, loss = model(x[:, :-1], x[:, 1:])
        losses.append(loss.item() * len(rows))
    model.train()
    return sum(losses) / len(idx)


def loss_on_every_window(model: torch.nn.Module, val: np.ndarray, seq_len: int, batch_size: int = 16) -> tuple[float, int]:
    """The mean next-token loss (nats/token) over every non-overlapping window of ``seq_len`` inputs of ``val``
    (each with its next token as the last target), and the number of windows: the shipped validation loss, the
    same windows for every model of one tokenizer. The model is left in the mode it was in."""
    windows, was_training = (len(val) - 1) // seq_len, model.training
    with torch.no_grad():  # evaluate() spaces its windows evenly: asking for all of them takes each once
        loss = evaluate(model, val, seq_len, -(-windows // batch_size), batch_size)
    model.train(was_training)  # evaluate() ends in training mode, for the training loop
    return loss, windows


def _load_init(model: GPT, src: Path) -> tuple[int, list, dict]:
    """Load another run's weights into ``model`` (grown if smaller); returns (its tokens, its history,
    a summary of it). ``src``: a run folder or a checkpoint folder (see ``grow.read_source``)."""
    sd, prev = read_source(src)
    load_grown(model, sd)
    summary = {"path": str(src), **{k: prev[k] for k in ("steps", "tokens_seen", "args", "init_from")}}
    return prev["tokens_seen"], list(prev["history"]), summary


def _param_groups(model: GPT, a: TrainArgs) -> list[dict]:
    """AdamW groups, in this order: matrices (decayed), norm gains (not decayed), the QK-norm gains
    (not decayed, lr × ``qk_gain_lr``: they set how sharp attention can be), and the embedding (lr ×
    ``embed_lr``) only when that differs from 1, so older runs' state.pt still resumes."""
    own_embed = a.embed_lr != 1.0
    groups = {"decay": [], "gains": [], "qk": [], "embed": []}
    for n, p in model.named_parameters():
        if n.endswith(("q_norm.weight", "k_norm.weight")):
            groups["qk"].append(p)
        elif p.dim() < 2:
            groups["gains"].append(p)
        elif own_embed and n == "embed.weight":
            groups["embed"].append(p)
        else:
            groups["decay"].append(p)
    out = [{"params": groups["decay"], "weight_decay": a.weight_decay, "lr_mult": 1.0},
           {"params": groups["gains"], "weight_decay": 0.0, "lr_mult": 1.0},
           {"params": groups["qk"], "weight_decay": 0.0, "lr_mult": a.qk_gain_lr}]
    if own_embed:
        out.append({"params": groups["embed"], "weight_decay": a.weight_decay, "lr_mult": a.embed_lr})
    return out


def train(a: TrainArgs, progress: bool = True) -> dict:
    """Train (or resume) a run; returns its summary (also in ``<out>/checkpoint/train.json``).

    The summary: ``step``, ``tokens_seen``, ``best_val``, ``done`` (the schedule's last step was taken) and
    ``stopped`` (why the loop ended: "done", "max_steps", "max_minutes", "stop_copy_ratio", "signal" or
    "interrupted").
    """
    check_args(a)
    a = replace(a)  # --fit-minutes changes its tokens; the caller's stays as it was
    device = resolve_device(a)
    sampler = resolve_sampler(a, device)
    if a.threads:
        torch.set_num_threads(a.threads)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in float32
    out = Path(a.out or f"runs/{a.preset}")
    data = Path(a.data)
    missing = [f for f in ("meta.json", "train.bin", "val.bin", "tokenizer.json") if not (data / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{data} is not a prepared corpus (no {', '.join(missing)}): run `python -m sprout_model.prepare "
            "--out FOLDER` first and pass --data FOLDER"
        )
    try:
        meta = json.loads((data / "meta.json").read_text(encoding="utf-8"))
        meta["vocab_size"] = int(meta["vocab_size"])
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise TrainArgsError(f"{data / 'meta.json'} is damaged ({type(e).__name__}: {e}); run sprout_model.prepare again") from None
    state_file = out / "state.pt"
    s = read_state(state_file) if state_file.exists() else None  # checked before anything is written
    branched = s is None and a.branch_from is not None
    if branched:
        src = Path(a.branch_from) / "state.pt"
        if not src.is_file():
            raise TrainArgsError(f"--branch-from {a.branch_from}: no state.pt there to continue")
        s = read_state(src)
    if s is not None:
        check_resume(s.get("args"), a, Path(a.branch_from) if branched else out)
        saved_sampler = s["data"].get("sampler", "numpy")
        if saved_sampler != sampler:
            raise TrainArgsError(f"{out} drew its batches with --sampler {saved_sampler}; resuming it with {sampler} would "
                                 f"not continue the same run. Pass --sampler {saved_sampler} to resume, or --out a new folder")
        if s.get("fit") and a.fit_minutes:
            a.tokens = s["fit"]["tokens"]  # the schedule it was fitted to (without --fit-minutes, --tokens rules)
    vocab = meta["vocab_size"]
    # the tokenizer every checkpoint of the run carries, checked as a loader checks it, before anything is written:
    # a checkpoint with a tokenizer that sprout_interp.load refuses would load nowhere
    try:
        tokenizer = check_corpus_tokenizer(load_tokenizer(data / "tokenizer.json"), str(data / "tokenizer.json"), vocab)
    except TokenizerError as e:
        raise TrainArgsError(f"--data: {e}") from None
    out.mkdir(parents=True, exist_ok=True)
    for stale in clean_stale_writes(out / "checkpoint"):  # a killed run's half-written checkpoint folders
        print(f"removed {stale}, left by a run that was killed while writing a checkpoint")
    train_tokens = real_tokens = open_tokens(data / "train.bin", vocab)
    if a.real_rows and not a.name_views:
        raise ValueError("--real-rows mixes the real text into --name-views training; without --name-views every row is real")
    if a.name_views:
        files = sorted(data.glob("train_names*.bin"))
        if not files:
            raise FileNotFoundError(f"no train_names*.bin in {data}: run `python -m sprout_model.prepare --name-views 4` first")
        train_tokens = [open_tokens(f, vocab) for f in files]
    val_tokens = open_tokens(data / "val.bin", vocab)
    # the invented-name copying probe of info.py, tracked at every evaluation (with the tokenizer read above):
    # copying is what the shipped models must keep
    if len(val_tokens) < a.seq_len + 1:  # evaluate() would divide by zero at the first validation
        raise ValueError(
            f"the validation split has {len(val_tokens)} tokens, fewer than seq_len+1 = {a.seq_len + 1}: "
            "prepare with a larger --val-fraction or more text, or train with a smaller --seq-len"
        )

    cfg = a.model_config()
    cfg.vocab_size = vocab
    problem = config_problem(cfg)
    if problem:
        raise TrainArgsError(f"{data / 'meta.json'}: vocab_size {vocab:,} gives a model no loader builds ({problem}); "
                             "run sprout_model.prepare again")
    if tokenizer is not None and max(len(tokenizer.encode(t).ids) for _, t in NAME_TEXTS) > cfg.context:
        tokenizer = None  # the probe's texts do not fit this model's context: history records None
    torch.manual_seed(a.seed)
    model = GPT(cfg)
    if a.embed_mean:
        # A direction every token shares lets a head's query and key be the same for every token, so
        # attention can depend on position alone (a previous-token head); with 8,192 rarely seen tokens,
        # training builds such a direction only slowly (see TRAINING.md, "embedding mean").
        with torch.no_grad():
            c = torch.randn(cfg.d_model)
            model.embed.weight += a.embed_mean * c / c.norm()
    if sampler == "numpy":
        batches = Batches(train_tokens, a.seq_len, a.batch_size, a.seed, a.copy_rows, cfg.vocab_size, a.copy_source,
                          real_tokens, a.real_rows)
    else:
        batches = TorchBatches(train_tokens, a.seq_len, a.batch_size, a.seed, a.copy_rows, cfg.vocab_size, a.copy_source,
                               real_tokens, a.real_rows, device=device)
    step, tokens_seen, wall, best, history, fit, branch = 0, 0, 0.0, float("inf"), [], None, None

    init = None
    if a.init_from and s is None:
        tokens_seen, history, init = _load_init(model, Path(a.init_from))
        print(f"starting from {a.init_from} ({tokens_seen:,} tokens already seen)")
    if s is not None:
        model.load_state_dict(s["model"])
        batches.load_state(s["data"])
        set_rng_state(s["rng"])
        step, tokens_seen, wall, best, history = s["step"], s["tokens_seen"], s["wall"], s["best_val"], s["history"]
        init, fit, branch = s.get("init"), s.get("fit") if a.fit_minutes else None, s.get("branch")
        if branched:
            best = float("inf")  # this run's checkpoint folder is its own
            branch = {"from": str(a.branch_from), "at_step": step, "at_tokens": tokens_seen}
            print(f"branched from {a.branch_from} at step {step:,} ({tokens_seen:,} tokens) into {out}")
        else:
            print(f"resumed {out} at step {step:,} ({tokens_seen:,} tokens)")
    model.to(device)  # float32 master weights; the optimizer is made for them where they now are
    opt = torch.optim.AdamW(_param_groups(model, a), lr=a.lr, betas=(0.9, a.beta2),
                            **({"fused": True} if device.type == "cuda" else {}))
    if s is not None:
        opt.load_state_dict(s["optimizer"])  # moves the saved (CPU) moments to the parameters' device

    fwd = torch.compile(model) if a.compile else model

    def save_state() -> None:
        write_state({
            "model": to_cpu(model.state_dict()), "optimizer": to_cpu(opt.state_dict()), "data": batches.state(),
            "rng": rng_state(), "step": step, "tokens_seen": tokens_seen, "wall": wall, "best_val": best,
            "history": history, "args": asdict(a), "init": init, **({"fit": fit} if fit else {}),
            **({"branch": branch} if branch else {}),
        }, state_file)

    def train_info(val_loss: float) -> dict:
        return {
            "preset": a.preset, "corpus": meta["corpus"], "corpus_sha256": meta["corpus_sha256"],
            "tokens_seen": tokens_seen, "steps": step, "wall_time_s": round(wall, 1),
            "val_loss": round(val_loss, 4), "val_loss_unit": "nats/token", "args": asdict(a),
            "init_from": init, "history": history, **({"fit": fit} if fit else {}),
            **({"branched_from": branch} if branch else {}),
        }

    def measure() -> tuple[float, float, float | None]:
        """Validation loss, copying ratio and invented-name copying (None where the probe does not fit)."""
        val = evaluate(model, val_tokens, a.seq_len, a.eval_batches, a.batch_size, device, a.dtype)
        copy = repeated_tokens_loss_ratio(model, seq_len=min(64, cfg.context // 2), batch=8, seed=0).ratio
        model.eval()
        names = name_copying(model, tokenizer).mean_prob if tokenizer is not None else None
        model.train()
        return val, copy, names

    stop = {"now": False}
    old_handler = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    t_start = time.time()
    fit_from = step + FIT_AFTER[0] if a.fit_minutes and fit is None else None  # time the steps after these
    t_fit = None
    stopped = "done"
    bar = tqdm(total=a.total_steps, initial=step, disable=not progress, dynamic_ncols=True)
    model.train()
    try:
        while step < a.total_steps:
            if stop["now"]:
                stopped = "signal"
                break
            if a.max_steps is not None and step >= a.max_steps:
                stopped = "max_steps"
                break
            if a.max_minutes is not None and time.time() - t_start > a.max_minutes * 60:
                stopped = "max_minutes"
                break
            t0 = time.time()
            for g in opt.param_groups:
                g["lr"] = lr_at(step, a) * g.get("lr_mult", 1.0)
            x, y = batches.next()
            with autocast(device, a.dtype):
                _, loss = fwd(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
            opt.step()
            train_loss = loss.item()  # waits for the step, so dt is its time on a GPU too
            step += 1
            tokens_seen += x.numel()
            dt = time.time() - t0
            wall += dt
            bar.update(1)
            bar.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{x.numel() / dt:,.0f}")
            if fit_from is not None and step == fit_from:
                t_fit = time.time()
            elif t_fit is not None and step == fit_from + FIT_AFTER[1]:
                fit, t_fit = _fit_schedule(a, step, (time.time() - t_fit) / FIT_AFTER[1], measure, t_start), None
                a.tokens = fit["tokens"]
                bar.total = a.total_steps
                bar.write(f"schedule fitted to {a.fit_minutes:.2f} minutes: {a.total_steps:,} steps "
                          f"({fit['s_per_step']:.3f} s a step, {fit['eval_s']:.2f} s an evaluation)")
            if step % a.eval_every == 0 or step == a.total_steps:
                val, copy, names = measure()
                history.append({"step": step, "tokens": tokens_seen, "train_loss": round(train_loss, 4),
                                "val_loss": round(val, 4), "copy_ratio": round(copy, 3),
                                "name_copying": None if names is None else round(names, 4), "wall_s": round(wall, 1)})
                bar.write(f"step {step:,}  tokens {tokens_seen:,}  train {train_loss:.3f}  val {val:.3f}  "
                          f"copy ratio {copy:.3f}" + ("" if names is None else f"  names {names:.1%}"))
                if val < best:  # keep the best checkpoint by validation loss
                    best = val
                    save_checkpoint(model, out / "checkpoint", data / "tokenizer.json", train_info(val))
                if a.stop_copy_ratio is not None and copy <= a.stop_copy_ratio and step < a.total_steps:
                    stopped = "stop_copy_ratio"
                    bar.write(f"copying ratio {copy:.3f} <= {a.stop_copy_ratio:g}: stopping (the same command resumes)")
                    break
            if step % a.save_every == 0:
                save_state()
    except KeyboardInterrupt:
        stopped = "interrupted"
        bar.write("interrupted: saving state, run the same command to resume")
    finally:
        bar.close()
        save_state()
        signal.signal(signal.SIGTERM, old_handler)
    return {"step": step, "tokens_seen": tokens_seen, "best_val": best, "done": step >= a.total_steps, "stopped": stopped}


def _fit_schedule(a: TrainArgs, step: int, s_per_step: float, measure, t_start: float) -> dict:
    """--fit-minutes: the tokens of a schedule that ends about ``a.fit_minutes`` after ``t_start``, at the
    measured time a step and an evaluation (timed once here, its result dropped); never more than --tokens,
    never fewer than one more step. 3% of the time left is kept for saving checkpoints."""
    t0 = time.time()
    measure()
    eval_s = time.time() - t0
    left = a.fit_minutes * 60 - (time.time() - t_start)
    more = int(0.97 * left / (s_per_step + eval_s / a.eval_every))
    steps = max(step + 1, min(a.total_steps, step + more))
    return {"tokens": float(steps * a.batch_size * a.seq_len), "steps": steps, "at_step": step,
            "s_per_step": round(s_per_step, 4), "eval_s": round(eval_s, 3), "minutes": a.fit_minutes}


@input_errors_exit
def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__, formatter_class=RawDescriptionHelpFormatter)
    for f, default in asdict(TrainArgs()).items():
        flag = "--" + f.replace("_", "-")
        if f == "preset":
            p.add_argument(flag, default=default, choices=sorted(PRESETS))
        elif f in ("dtype", "sampler", "schedule"):
            p.add_argument(flag, default=default, choices={"dtype": DTYPES, "sampler": SAMPLERS, "schedule": SCHEDULES}[f])
        elif isinstance(default, bool):
            p.add_argument(flag, action="store_true")
        elif f in FLOATS:
            p.add_argument(flag, type=FLOATS[f], default=default)
        elif default is None:
            p.add_argument(flag, default=None, type=str if f in ("out", "init_from", "branch_from") else int)
        else:
            p.add_argument(flag, type=type(default), default=default)
    a = TrainArgs(**vars(p.parse_args(argv)))
    check_args(a)
    cfg = a.model_config()
    print(f"{a.preset} ({cfg.n_layer} blocks): {parameter_count(cfg):,} parameters, {a.total_steps:,} steps of "
          f"{a.batch_size}x{a.seq_len} tokens")
    print(json.dumps(train(a)))


if __name__ == "__main__":
    main()
