"""The tuned lens (Belrose et al. 2023, "Eliciting Latent Predictions from Transformers with the Tuned Lens"):
one learned affine translator per stream row, so that the translated stream, read through the final RMSNorm
and the tied head exactly as the logit lens reads it, predicts the model's final output.

Rows are the logit lens's: row 0 = after the embedding, row r = after block r (blocks counted from 1). Rows
0 … L-1 get a translator each; the last row is the model's output and needs none (as in the ``tuned-lens``
package, whose lens has one translator per layer but the last). A translator is the identity plus a learned
residual, ``h ↦ h + (W h + b)``, with ``W`` and ``b`` started at zero, so an untrained lens *is* the logit
lens; ``translators.{i}.weight`` / ``.bias`` hold ``W`` and ``b`` (the ``tuned-lens`` package's
``layer_translators.{i}`` convention).

Training minimises KL(final ‖ lens), in nats, averaged over tokens and rows, on windows of the corpus's
training documents; evaluation uses the validation documents. A lens is saved beside its checkpoint as
``tuned_lens.safetensors`` (float16) + ``tuned_lens.json`` (how it was trained and a fingerprint of the
checkpoint: config, sha256 of the weights and of the vocabulary); loading it for any other checkpoint
raises :class:`~sprout_interp.core.errors.TunedLensMismatchError`.
"""
from __future__ import annotations

import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from sprout_interp.core.arguments import check_count, check_number, command_line
from sprout_interp.core.configs import check_weights
from sprout_interp.core.errors import ArgumentError, NotACheckpointError, SproutError, TunedLensMismatchError
from sprout_interp.core.files import as_path, read_json
from sprout_interp.core.fingerprints import check_fingerprint, fingerprint, fingerprint_mismatch
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.loading import read_safetensors
from sprout_interp.lens.residual import residual_stack
from sprout_model.cli import POSITIVE, ArgumentParser, Whole

__all__ = [
    "LENS_WEIGHTS", "LENS_INFO", "TunedLens", "read_out", "lens_path", "save_tuned_lens",
    "load_tuned_lens", "find_tuned_lens", "train_tuned_lens", "lens_kl", "MissingTunedLensWarning",
]

LENS_WEIGHTS, LENS_INFO = "tuned_lens.safetensors", "tuned_lens.json"


class MissingTunedLensWarning(UserWarning):
    """``lens="tuned"`` was asked for a checkpoint without a tuned lens: the logit lens was used instead."""


def read_out(model, stream: Float[Tensor, "... d_model"]) -> Float[Tensor, "... vocab"]:
    """Logits of a stream vector through the model's final RMSNorm and tied head (no hooks fire)."""
    gpt = as_hooked(model).model
    return gpt.head(gpt.norm(stream))


class TunedLens(nn.Module):
    """Affine translators for stream rows 0 … n_rows-1 (embedding, blocks 1 … L-1); the last row (the output)
    is read as it is. ``translate(stack)`` maps a full stack of L+1 rows to the translated stack.

    Attributes:
        translators: ``n_layers`` ``Linear(d_model, d_model)`` residuals, zero at the start (= the logit lens).
        info: how the lens was trained and the fingerprint of its checkpoint (the ``tuned_lens.json`` content).
    """

    def __init__(self, d_model: int, n_layers: int, info: Optional[dict] = None):
        super().__init__()
        self.d_model, self.n_layers = int(d_model), int(n_layers)
        self.translators = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(n_layers))
        for t in self.translators:
            nn.init.zeros_(t.weight)
            nn.init.zeros_(t.bias)
        self.info = dict(info or {})

    @classmethod
    def for_model(cls, model) -> "TunedLens":
        """An untrained (identity) lens with the model's shapes and its fingerprint."""
        m = as_hooked(model)
        lens = cls(m.cfg.d_model, m.cfg.n_layers, {"fingerprint": fingerprint(m)})
        p = next(m.parameters())
        return lens.to(p.device)

    def translate_row(self, row: int, h: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """Row ``row``'s stream translated: ``h + W h + b`` (the last row unchanged)."""
        if row >= self.n_layers:
            return h
        t = self.translators[row]
        return h + F.linear(h.to(t.weight.dtype), t.weight, t.bias).to(h.dtype)

    def translate(self, stack: Float[Tensor, "row ... d_model"]) -> Float[Tensor, "row ... d_model"]:
        """Every row of a residual stack (row 0 = embedding … row L = output) translated."""
        if stack.shape[0] != self.n_layers + 1:
            raise SproutError(f"the tuned lens has {self.n_layers} translators for {self.n_layers + 1} rows, "
                              f"but the stack has {stack.shape[0]} rows: use a lens trained for this model")
        return torch.stack([self.translate_row(r, stack[r]) for r in range(stack.shape[0])])

    def forward(self, model, stack: Float[Tensor, "row ... d_model"]) -> Float[Tensor, "row ... vocab"]:
        """Logits of every translated row, read as the logit lens reads the stream."""
        return read_out(model, self.translate(stack))


# -- save / load ------------------------------------------------------------------------------------------


def lens_path(model) -> Optional[Path]:
    """The folder a model's lens lives in: its checkpoint folder (the folder of a weights file), or None."""
    src = getattr(as_hooked(model), "source", None)
    if not src:
        return None
    p = Path(src)
    return p if p.is_dir() else p.parent


def save_tuned_lens(lens: TunedLens, folder: str | Path, dtype: torch.dtype = torch.float16) -> Path:
    """Write ``tuned_lens.safetensors`` (the translators in ``dtype``; float16 keeps git small) and
    ``tuned_lens.json`` (``lens.info``) into ``folder``; returns the weights' path."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in lens.state_dict().items()}
    save_file(sd, str(folder / LENS_WEIGHTS), metadata={"format": "sprout-tuned-lens"})
    info = dict(lens.info, d_model=lens.d_model, n_translators=lens.n_layers, weights_dtype=str(dtype).split(".")[-1])
    (folder / LENS_INFO).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return folder / LENS_WEIGHTS


def load_tuned_lens(model, folder: str | Path | None = None) -> TunedLens:
    """The tuned lens saved for ``model`` (in ``folder``, default its checkpoint folder), in float32.

    Read as a checkpoint is: ``tuned_lens.json`` of bounded size and an object, the weights' dtypes and shapes
    checked from the header against the model before any tensor is read, then their values finite.
    Raises :class:`~sprout_interp.core.errors.TunedLensNotFoundError` when there is none,
    :class:`~sprout_interp.core.errors.NotAPathError` when ``folder`` is not a path,
    :class:`~sprout_interp.core.errors.InvalidWeightsError` for NaN, infinite or non-float weights, and
    :class:`~sprout_interp.core.errors.TunedLensMismatchError` when it was trained for another checkpoint (a
    different config, vocabulary or weights) or is damaged (its files oversized, malformed or of other shapes).
    """
    from sprout_interp.core.errors import TunedLensNotFoundError

    m = as_hooked(model)
    folder = lens_path(m) if folder is None else as_path(folder, "folder", f"a folder holding {LENS_WEIGHTS} + {LENS_INFO}")
    if folder is None or not (folder / LENS_WEIGHTS).is_file() or not (folder / LENS_INFO).is_file():
        where = "the model has no checkpoint folder" if folder is None else f"{folder} has no {LENS_WEIGHTS} + {LENS_INFO}"
        raise TunedLensNotFoundError(
            f"no tuned lens for {m.name or 'this model'}: {where}. Train one with "
            "`python -m sprout_interp.lens.tuned_lens --models NAME_OR_PATH` (or train_tuned_lens + save_tuned_lens), "
            "or use lens=\"logit\"")
    where = f"the tuned lens in {folder}"
    try:
        info = read_json(folder / LENS_INFO, "tuned lens")
    except SproutError as e:  # damaged, oversized, not an object, unreadable
        raise TunedLensMismatchError(f"{where} cannot be read: {e}. Train it again") from None
    bad = fingerprint_mismatch(fingerprint(m), check_fingerprint(info.get("fingerprint", {}), where, TunedLensMismatchError), "lens")
    if bad:
        raise TunedLensMismatchError(
            f"{where} was trained for another checkpoint: its {', '.join(bad)} differ from "
            f"{m.name or 'this model'}'s. Train a lens for this checkpoint (python -m sprout_interp.lens.tuned_lens "
            "--models ...) or use lens=\"logit\"")
    with torch.device("meta"):  # the shapes this model needs, nothing allocated
        want = {k: tuple(v.shape) for k, v in TunedLens(m.cfg.d_model, m.cfg.n_layers).state_dict().items()}

    def check_shapes(got: dict[str, tuple[int, ...]]) -> None:
        if got != want:
            odd = sorted((k for k in set(got) | set(want) if got.get(k) != want.get(k)), key=lambda k: (k not in got, k))
            raise TunedLensMismatchError(
                f"{where} holds tensors of other names or shapes than this model needs ({odd[0][:80]}: "
                f"{got.get(odd[0])} in the file, {want.get(odd[0])} needed; {len(odd)} differ); train it again")

    source = str(folder / LENS_WEIGHTS)
    try:
        sd = read_safetensors(folder / LENS_WEIGHTS, source, check_shapes)
    except NotACheckpointError as e:  # damaged or oversized
        raise TunedLensMismatchError(f"{where} cannot be read: {e}") from None
    check_weights(sd, source)
    lens = TunedLens(m.cfg.d_model, m.cfg.n_layers, info)
    lens.load_state_dict({k: v.float() for k, v in sd.items()})
    return lens.to(next(m.parameters()).device).eval()


def find_tuned_lens(model, lens="tuned") -> tuple[Optional[TunedLens], Optional[str]]:
    """Resolve a ``lens=`` argument: (TunedLens or None for the logit lens, a notice or None).

    ``"logit"`` → (None, None); a :class:`TunedLens` → itself; ``"tuned"`` → the saved lens, or, when the
    checkpoint has none, (None, notice) and a :class:`MissingTunedLensWarning`: the logit lens is used
    instead. A lens trained for another checkpoint is never silently replaced: that raises.
    """
    from sprout_interp.core.errors import TunedLensNotFoundError

    if isinstance(lens, TunedLens):
        return lens, None
    if lens in (None, "logit"):
        return None, None
    if lens != "tuned":
        raise ArgumentError(f"lens must be \"logit\", \"tuned\" or a TunedLens, got {lens!r}")
    try:
        return load_tuned_lens(model), None
    except TunedLensNotFoundError as e:
        notice = f"{e} -- showing the logit lens instead."
        warnings.warn(notice, MissingTunedLensWarning, stacklevel=3)
        return None, notice


# -- training ---------------------------------------------------------------------------------------------


def _row_kl(model, lens: TunedLens, stack: Tensor, log_p_final: Tensor) -> Tensor:
    """KL(final ‖ translated row) per row, (rows-1, n) nats, for stack (rows, n, d) and final log-probs (n, V)."""
    out = []
    for r in range(stack.shape[0] - 1):
        logq = F.log_softmax(read_out(model, lens.translate_row(r, stack[r])).float(), -1)
        out.append((log_p_final.exp() * (log_p_final - logq)).sum(-1))
    return torch.stack(out)


@torch.no_grad()
def _targets(model, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """(stack (rows, n, d), final log-probs (n, V)) for ``tokens`` (batch, pos), flattened over batch × pos."""
    stack = residual_stack(model, tokens)
    R, B, T, d = stack.shape
    stack = stack.reshape(R, B * T, d)
    return stack, F.log_softmax(read_out(model, stack[-1]).float(), -1)


@torch.no_grad()
def lens_kl(model, lens: Optional[TunedLens], tokens: Int[Tensor, "batch pos"], batch: int = 4) -> Float[Tensor, " row"]:
    """Mean KL(final ‖ row) per stream row (nats; the last row is 0), for a tuned lens or None (the logit
    lens), over every position of ``tokens``, ``batch`` windows at a time."""
    m = as_hooked(model)
    ident = lens if lens is not None else TunedLens.for_model(m)
    tot, n = None, 0
    for s in range(0, tokens.shape[0], batch):
        stack, lpf = _targets(m, tokens[s:s + batch])
        kl = _row_kl(m, ident, stack, lpf).sum(-1)
        tot = kl if tot is None else tot + kl
        n += stack.shape[1]
    return torch.cat([tot / n, tot.new_zeros(1)])


def _windows(model, tokens, name: str) -> Tensor:
    """Training or validation windows as a ``(batch, pos)`` id tensor of at least one window, checked against the
    vocabulary and the context (``prepare_input``); texts of different lengths are refused, since every window's
    every position is read."""
    if isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and tokens.shape[0] == 0:
        raise ArgumentError(f"{name} holds no windows: pass a (batch, pos) tensor of token ids with at least one row")
    return model.prepare_input(tokens, padding=False, argument=name)[0]


def train_tuned_lens(
    model,
    tokens: Int[Tensor, "batch pos"],
    steps: int = 100,
    batch: int = 4,
    lr: float = 1.0,
    optimizer: str = "sgd",
    momentum: float = 0.9,
    weight_decay: float = 1e-3,
    seed: int = 0,
    val_tokens: Optional[Int[Tensor, "val_batch val_pos"]] = None,
    progress: bool = True,
    extra_info: Optional[dict] = None,
) -> TunedLens:
    """Train a tuned lens for ``model`` on windows ``tokens`` (from the training split).

    Each step takes ``batch`` windows (cycled through ``tokens`` in a seeded order) and minimises KL(final ‖
    translated row), nats, averaged over positions and rows. ``optimizer="sgd"`` is the paper's: SGD with
    Nesterov momentum ``momentum``, ``lr`` decayed linearly to 0 over ``steps``, weight decay ``weight_decay``;
    ``"adam"`` uses Adam with the same linear decay (then take ``lr`` about 1e-3). Gradients are clipped to
    norm 1. ``val_tokens``, when given, are scored before and after (mean KL per row, nats) into the lens's
    ``info``, with the loss curve (first, every tenth and last step), the settings, the wall time and the
    checkpoint's fingerprint.

    ``steps`` and ``batch`` are whole numbers from 1, ``lr`` a finite number above 0, ``momentum`` 0 to below 1,
    ``weight_decay`` at least 0; ``tokens`` and ``val_tokens`` token ids or texts of one length (ArgumentError
    otherwise, naming the argument).
    """
    m = as_hooked(model)
    steps = check_count(steps, "steps", what="optimiser steps; a lens of no steps is the untrained identity")
    batch = check_count(batch, "batch", what="windows per step")
    lr = check_number(lr, "lr", low=0.0, low_open=True, what="the learning rate")
    momentum = check_number(momentum, "momentum", low=0.0, high=1.0, high_open=True, what="SGD's Nesterov momentum")
    weight_decay = check_number(weight_decay, "weight_decay", low=0.0)
    seed = check_count(seed, "seed", low=0, what="the window order's and initialisation's seed")
    if optimizer not in ("sgd", "adam"):
        raise ArgumentError(f"optimizer must be \"sgd\" or \"adam\", got {optimizer!r}")
    tokens = _windows(m, tokens, "tokens")
    val_tokens = None if val_tokens is None else _windows(m, val_tokens, "val_tokens")
    torch.manual_seed(seed)
    lens = TunedLens.for_model(m)
    lens.train()
    params = list(lens.parameters())
    if optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=True, weight_decay=weight_decay)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / steps))
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(tokens.shape[0], generator=g)
    val_before = lens_kl(m, None, val_tokens).tolist() if val_tokens is not None else None
    curve: list[tuple[int, float]] = []
    t0 = time.time()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=f"tuned lens {m.name or ''}".strip(), file=sys.stderr, unit="step")
    n_tok = 0
    for step in range(steps):
        idx = torch.arange(step * batch, (step + 1) * batch) % tokens.shape[0]
        if (step * batch) // tokens.shape[0] != ((step + 1) * batch - 1) // tokens.shape[0]:
            order = torch.randperm(tokens.shape[0], generator=g)  # a new epoch: a new order
        stack, lpf = _targets(m, tokens[order[idx]])
        n_tok += stack.shape[1]
        loss = _row_kl(m, lens, stack, lpf).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        v = loss.item()
        if not math.isfinite(v):
            raise SproutError(f"the tuned-lens loss became {v} at step {step}: lower lr (now {lr}) or use optimizer=\"adam\"")
        if step == 0 or step == steps - 1 or (step + 1) % max(1, steps // 10) == 0:
            curve.append((step + 1, round(v, 5)))
        if bar is not None:
            bar.update(1)
            bar.set_postfix(kl=f"{v:.3f}")
    if bar is not None:
        bar.close()
    lens.eval()
    info = {
        "method": "tuned lens (Belrose et al. 2023): h + W h + b per row, KL(final || lens) averaged over rows",
        "fingerprint": fingerprint(m), "checkpoint": m.name, "optimizer": optimizer, "lr": lr,
        "lr_schedule": "linear decay to 0", "momentum": momentum if optimizer == "sgd" else None,
        "nesterov": optimizer == "sgd", "weight_decay": weight_decay, "grad_clip": 1.0, "steps": steps,
        "windows_per_step": batch, "window_tokens": int(tokens.shape[1]), "tokens_per_step": batch * int(tokens.shape[1]),
        "tokens_seen": n_tok, "distinct_windows": int(tokens.shape[0]), "seed": seed,
        "train_seconds": round(time.time() - t0, 1), "torch_threads": torch.get_num_threads(),
        "loss": "mean KL(final || row), nats/token, rows 0..L-1", "loss_curve": curve,
    }
    if val_tokens is not None:
        after = lens_kl(m, lens, val_tokens).tolist()
        info["validation"] = {"windows": int(val_tokens.shape[0]), "window_tokens": int(val_tokens.shape[1]),
                              "kl_logit_lens": [round(x, 5) for x in val_before],
                              "kl_tuned_lens": [round(x, 5) for x in after]}
    info.update(extra_info or {})
    lens.info = info
    return lens


@command_line
def main(argv: list[str] | None = None) -> int:
    """Train and save tuned lenses: ``python -m sprout_interp.lens.tuned_lens --models gpt-1 gpt-4 sprout``."""
    from sprout_interp.core.hooked import load_hooked
    from sprout_interp.core.loading import SHIPPED
    from sprout_interp.core.texts import held_out_for, training_sample_for

    p = ArgumentParser(description=main.__doc__)
    p.add_argument("--models", nargs="+", default=list(SHIPPED))
    p.add_argument("--steps", type=Whole(1), default=100)
    p.add_argument("--batch", type=Whole(1), default=4, help="windows per step")
    p.add_argument("--length", type=Whole(1), default=256, help="tokens per window")
    p.add_argument("--windows", type=Whole(1), default=400, help="distinct training windows drawn")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--lr", type=POSITIVE, default=None, help="default 1.0 for sgd (the paper's), 1e-3 for adam")
    p.add_argument("--seed", type=Whole(0), default=0)
    p.add_argument("--val", type=Whole(1), default=16, help="validation windows scored before and after")
    p.add_argument("--threads", type=Whole(0), default=None, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", default=None, help="folder to write into (default: the checkpoint folder)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    lr = a.lr if a.lr is not None else (1.0 if a.optimizer == "sgd" else 1e-3)
    for name in a.models:
        m = load_hooked(name)
        train = training_sample_for(m, n=a.windows, length=a.length, seed=a.seed)
        val = held_out_for(m, n=a.val, length=a.length, seed=a.seed)
        lens = train_tuned_lens(m, train, steps=a.steps, batch=a.batch, lr=lr, optimizer=a.optimizer, seed=a.seed,
                                val_tokens=val, extra_info={"command": "python -m sprout_interp.lens.tuned_lens "
                                                            + " ".join(argv if argv is not None else sys.argv[1:])})
        where = save_tuned_lens(lens, a.out or lens_path(m))
        v = lens.info["validation"]
        print(f"{name}: {lens.info['train_seconds']}s, wrote {where}")
        for r, (x, y) in enumerate(zip(v["kl_logit_lens"], v["kl_tuned_lens"])):
            print(f"  row {r}: KL to final (validation) logit {x:.3f} -> tuned {y:.3f} nats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
