"""Training a sparse autoencoder on one layer of the residual stream, following one published recipe.

The recipe is Gao et al. 2024, "Scaling and evaluating sparse autoencoders" (the TopK SAE):

- TopK activation with ``k`` active latents per token (no L1 penalty; L0 is ``k`` by construction);
- decoder rows kept at unit norm: the gradient's component along each row is removed before every Adam step and
  the rows are renormalised after it;
- the encoder started as the transpose of the (random, unit-norm) decoder, ``b_dec`` at the mean activation;
- the loss is the normalised MSE ``||x - x̂||² / ||x - mean||²`` plus ``aux_coef`` (1/32) times the AuxK loss:
  the ``k_aux`` (d_in/2) largest pre-activations among *dead* latents (none fired in the last ``dead_after``
  training tokens) reconstruct the main reconstruction's error, which brings dead latents back;
- inputs are scaled by one constant so that their mean norm is sqrt(d_in) (as SAELens's
  ``expected_average_only_in``), and that constant is folded back into ``b_enc``/``b_dec`` before saving, so a
  saved SAE reads the raw stream;
- Adam, a constant learning rate with a linear decay over the last 20% of steps.

Activations come from the training split (:func:`sprout_interp.core.texts.training_sample_for`), collected once
into memory in chunks of ``batch`` windows (never more than one chunk's forward pass at a time beside the
buffer), then trained on for several epochs in a seeded order.

    python -m sprout_interp.features.train --model sprout --layer 3            # -> model/checkpoints/sprout/saes/...
    python -m sprout_interp.features.train --model gpt-1 --layer 0 --tokens 50000 --out /tmp/sae
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from jaxtyping import Float
from torch import Tensor

from sprout_interp.core.arguments import check_count, check_number, command_line, describe
from sprout_interp.core.errors import ArgumentError, SproutError
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.texts import training_sample_for
from sprout_interp.core.tokens import ModelInput
from sprout_interp.features.sae import RECIPE, SparseAutoencoder, resid_hook, sae_folder, save_sae
from sprout_model.cli import POSITIVE, ArgumentParser, Whole

__all__ = ["collect_hooks", "collect_activations", "train_sae", "TrainStats", "topk_losses", "drop_radial_grad_", "lr_at", "mark_fired_",
           "MAX_BUFFER_BYTES", "main"]

#: The activation buffer may not exceed this (bytes); 2 GB holds 1.3M float32 Sprout activations.
MAX_BUFFER_BYTES = 2 * 1024**3


_BLOCK = re.compile(r"^blocks\.(\d+)\.")


@torch.no_grad()
def collect_hooks(
    model,
    names: Sequence[str],
    n_tokens: int = 300_000,
    length: int = 256,
    batch: int = 16,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    tokens: Optional[ModelInput] = None,
    progress: bool = True,
) -> list[Float[Tensor, "tokens d"]]:
    """The activations of the hook points ``names`` at ``n_tokens`` positions of the training split: one
    ``(tokens, d)`` tensor per name, row ``i`` of each from the same token.

    Windows of ``length`` tokens are drawn with ``training_sample_for(model, n, length, seed)`` (or ``tokens``
    is used as given); the model runs ``batch`` windows at a time and only up to the last block a name needs,
    each chunk written straight into preallocated buffers of ``dtype``. Raises SproutError when the buffers
    together would exceed :data:`MAX_BUFFER_BYTES`.
    """
    from tqdm.auto import tqdm

    m = as_hooked(model)
    names = list(names)
    if not names:
        raise SproutError("names must list at least one hook point, e.g. ['blocks.0.hook_resid_post']")
    for n in names:
        m.get_hook_point(n)
    blocks = [int(b.group(1)) for b in map(_BLOCK.match, names) if b]
    stop = max(blocks) + 1 if len(blocks) == len(names) else None
    if tokens is None:
        length = min(length, m.cfg.n_ctx)
        tokens = training_sample_for(m, n=max(1, math.ceil(n_tokens / length)), length=length, seed=seed)
    tokens, mask = m.prepare_input(tokens)  # texts of different lengths: only their real tokens are collected
    total = min(n_tokens, tokens.numel() if mask is None else int(mask.sum()))
    _, probe = m.run_with_cache(tokens[:1, :1], names_filter=names, stop_at_layer=stop)
    widths = [probe[n].shape[-1] for n in names]
    need = total * sum(widths) * torch.finfo(dtype).bits // 8
    if need > MAX_BUFFER_BYTES:
        raise SproutError(f"{total:,} activations of {'+'.join(map(str, widths))} {dtype} values need {need / 1e9:.1f} "
                          f"GB, more than the {MAX_BUFFER_BYTES / 1e9:.1f} GB allowed: ask for fewer tokens")
    outs = [torch.empty(total, w, dtype=dtype) for w in widths]
    done = 0
    bar = tqdm(total=total, desc=f"activations {', '.join(names)}", unit="tok", disable=not progress, leave=False)
    for i in range(0, tokens.shape[0], batch):
        if done >= total:
            break
        _, cache = m.run_with_cache(tokens[i:i + batch], names_filter=names, stop_at_layer=stop)
        got = 0
        real = None if mask is None else mask[i:i + batch]
        for out, n, w in zip(outs, names, widths):
            acts = (cache[n].reshape(-1, w) if real is None else cache[n][real])[: total - done]
            out[done:done + len(acts)] = acts.to("cpu", dtype)
            got = len(acts)
        done += got
        bar.update(got)
    bar.close()
    return [o[:done] for o in outs]


def collect_activations(
    model,
    layer: int,
    n_tokens: int = 300_000,
    length: int = 256,
    batch: int = 16,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    tokens: Optional[ModelInput] = None,
    progress: bool = True,
) -> Float[Tensor, "tokens d_model"]:
    """``blocks.{layer}.hook_resid_post`` at ``n_tokens`` positions of the training split, ``(tokens, d_model)``
    (:func:`collect_hooks` of that one hook point). Raises SproutError for a layer out of range."""
    m = as_hooked(model)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < m.cfg.n_layers:
        raise SproutError(f"layer {layer!r} is out of range: the model has layers 0..{m.cfg.n_layers - 1}")
    return collect_hooks(m, [resid_hook(layer)], n_tokens, length, batch, seed, dtype, tokens, progress)[0]


@dataclass
class TrainStats:
    """What a training run did: steps, tokens seen, seconds, tokens/s, last losses (normalised MSE, AuxK)."""

    steps: int
    tokens_seen: int
    seconds: float
    tokens_per_s: float
    final_nmse: float
    final_aux: float
    dead_at_end: int


def mark_fired_(last_fired: Tensor, idx: Tensor, vals: Tensor, n: int) -> None:
    """Advance every latent's 'tokens since it last fired' by ``n`` and reset those that fired now."""
    last_fired += n
    fired = idx[vals != 0]
    last_fired[fired] = 0


def topk_losses(
    pre: Float[Tensor, "batch d_latent"],
    recon: Float[Tensor, "batch d_out"],
    target: Float[Tensor, "batch d_out"],
    W_dec: Float[Tensor, "d_latent d_out"],
    dead: Tensor,
    k_aux: int,
    aux_coef: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(loss, normalised MSE, AuxK loss)`` of one TopK training batch (dimensionless).

    The normalised MSE is ``||target - recon||² / ||target - mean(target)||²`` over the batch; the AuxK loss
    lets the ``k_aux`` largest ReLU'd pre-activations among the ``dead`` latents reconstruct the (detached)
    error through ``W_dec``, normalised by the error's own energy; ``loss = nmse + aux_coef * aux``. An SAE's
    target is its input; a transcoder's is the MLP's output.
    """
    err = target - recon
    var = (target - target.mean(0)).pow(2).sum()
    loss_main = err.pow(2).sum() / var
    loss_aux = torch.zeros(())
    if bool(dead.any()) and aux_coef > 0:
        kk = min(k_aux, int(dead.sum()))
        dpre = pre.masked_fill(~dead, float("-inf"))
        av, ai = dpre.topk(kk, dim=-1, sorted=False)
        za = torch.zeros_like(pre).scatter(-1, ai, av.relu())
        e_hat = za @ W_dec
        e = err.detach()
        loss_aux = (e - e_hat).pow(2).sum() / e.pow(2).sum().clamp_min(1e-12)
    return loss_main + aux_coef * loss_aux, loss_main, loss_aux


@torch.no_grad()
def drop_radial_grad_(W_dec: Tensor) -> None:
    """Remove from ``W_dec.grad`` its component along each (unit-norm) row, so a step keeps rows on the sphere."""
    gW = W_dec.grad
    gW -= (gW * W_dec).sum(-1, keepdim=True) * W_dec


def lr_at(lr: float, step: int, total: int) -> float:
    """The recipe's schedule: ``lr`` constant, then a linear decay to 0 over the last 20% of ``total`` steps."""
    decay_from = int(0.8 * total)
    if step < decay_from:
        return lr
    return lr * max(0.0, (total - step) / max(1, total - decay_from))


def train_sae(
    model,
    layer: int,
    acts: Optional[Float[Tensor, "tokens d_model"]] = None,
    n_tokens: int = 300_000,
    d_sae: Optional[int] = None,
    k: int = 32,
    epochs: int = 4,
    batch_size: int = 2048,
    lr: float = 4e-4,
    aux_coef: float = 1 / 32,
    k_aux: Optional[int] = None,
    dead_after: int = 100_000,
    seed: int = 0,
    progress: bool = True,
    max_seconds: Optional[float] = None,
) -> tuple[SparseAutoencoder, TrainStats]:
    """Train a TopK SAE on ``blocks.{layer}.hook_resid_post`` (Gao et al. 2024's recipe: ``k`` active latents,
    unit-norm decoder rows, the AuxK loss for dead latents, Adam; the module docstring has every step).

    ``acts`` are the training activations (``collect_activations``; collected here from ``n_tokens`` training
    tokens when None). ``d_sae`` defaults to 8 × d_model, ``k_aux`` to d_in / 2. ``max_seconds`` stops early
    (the learning-rate decay is then cut short). Returns the SAE (float32, reading the raw stream, with the
    fingerprint and training numbers in ``info``) and a :class:`TrainStats`.

    One function on purpose: it is the training loop (initialisation, TopK step, auxiliary loss on dead
    latents, decoder renormalisation, schedule, stats), and a reader checking it against the recipe reads it in
    order, as in SAELens's trainer.
    """
    from tqdm.auto import tqdm

    m = as_hooked(model)
    d_in = m.cfg.d_model
    # every setting checked before the activations are collected: epochs=0 or a batch larger than the sample
    # returned an untrained SAE
    d_sae = check_count(d_sae if d_sae is not None else 8 * d_in, "d_sae", what="latents")
    k = check_count(k, "k", high=d_sae, what=f"active latents per token, at most d_sae ({d_sae})")
    epochs, batch_size, dead_after = (check_count(v, name) for v, name in ((epochs, "epochs"), (batch_size, "batch_size"),
                                                                          (dead_after, "dead_after")))
    n_tokens, seed = check_count(n_tokens, "n_tokens", what="training tokens collected"), check_count(seed, "seed", low=0)
    k_aux = check_count(k_aux if k_aux is not None else d_in // 2, "k_aux")
    lr = check_number(lr, "lr", low=0.0, low_open=True)
    aux_coef = check_number(aux_coef, "aux_coef", low=0.0)
    if max_seconds is not None:
        max_seconds = check_number(max_seconds, "max_seconds", low=0.0, low_open=True)
    if acts is None:
        acts = collect_activations(m, layer, n_tokens, seed=seed, progress=progress)
    if not isinstance(acts, Tensor) or acts.dim() != 2 or acts.shape[1] != d_in:
        raise SproutError(f"acts must be (tokens, {d_in}), got {tuple(getattr(acts, 'shape', ())) or describe(acts)}")
    if acts.shape[0] < batch_size:
        raise ArgumentError(f"{acts.shape[0]} training activations are fewer than one batch of batch_size={batch_size}: "
                            "no training step would run; collect more tokens or lower batch_size")
    torch.manual_seed(seed)
    sae = SparseAutoencoder.for_model(m, layer, d_sae, k, seed=seed)
    n = acts.shape[0]
    scale = float(math.sqrt(d_in) / acts[: min(n, 50_000)].float().norm(dim=-1).mean())
    mean = acts.float().mean(0) * scale
    with torch.no_grad():
        sae.b_dec.copy_(mean)
    opt = torch.optim.Adam(sae.parameters(), lr=lr, betas=(0.9, 0.999), eps=6.25e-10)
    steps_per_epoch = n // batch_size
    total = max(1, steps_per_epoch * epochs)
    decay_from = int(0.8 * total)
    last_fired = torch.zeros(d_sae, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    bar = tqdm(total=total, desc=f"SAE {resid_hook(layer)}", unit="step", disable=not progress)
    t0, step, nmse, aux = time.time(), 0, float("nan"), 0.0
    for _ in range(epochs):
        order = torch.randperm(n, generator=g)
        for b in range(steps_per_epoch):
            x = acts[order[b * batch_size:(b + 1) * batch_size]].float() * scale
            pre = sae.pre_acts(x)
            vals, idx = sae.topk(pre)
            z = torch.zeros_like(pre).scatter(-1, idx, vals)
            recon = sae.decode(z)
            dead = last_fired >= dead_after
            loss, loss_main, loss_aux = topk_losses(pre, recon, x, sae.W_dec, dead, k_aux, aux_coef)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            drop_radial_grad_(sae.W_dec)  # keep decoder rows on the unit sphere
            if step >= decay_from:
                for grp in opt.param_groups:
                    grp["lr"] = lr_at(lr, step, total)
            opt.step()
            sae.normalize_decoder()
            mark_fired_(last_fired, idx.detach(), vals.detach(), x.shape[0])
            step += 1
            nmse, aux = loss_main.item(), loss_aux.item()
            if step % 10 == 0:
                bar.set_postfix(nmse=f"{nmse:.3f}", dead=int(dead.sum()))
            bar.update(1)
            if max_seconds is not None and time.time() - t0 > max_seconds:
                break
        if max_seconds is not None and time.time() - t0 > max_seconds:
            break
    bar.close()
    secs = time.time() - t0
    with torch.no_grad():  # read the raw stream: x*scale - b' = scale*(x - b'/scale); acts scale by 1/scale
        sae.b_dec.div_(scale)
        sae.b_enc.div_(scale)
    stats = TrainStats(steps=step, tokens_seen=step * batch_size, seconds=secs,
                       tokens_per_s=step * batch_size / max(secs, 1e-9), final_nmse=nmse, final_aux=aux,
                       dead_at_end=int((last_fired >= dead_after).sum()))
    sae.info.update(
        recipe=RECIPE, trained_on=m.name or str(getattr(m, "source", "")), layer=layer, block=layer + 1,
        training={"activation_tokens": n, "epochs": epochs, "steps": step, "batch_size": batch_size, "lr": lr,
                  "aux_coef": aux_coef, "k_aux": k_aux, "dead_after_tokens": dead_after, "seed": seed,
                  "input_scale": scale, "seconds": round(secs, 1), "tokens_per_s": round(stats.tokens_per_s),
                  "final_nmse": round(nmse, 4), "dead_at_end": stats.dead_at_end,
                  "split": "training documents (sprout_interp.core.texts.training_sample_for)"},
    )
    return sae.eval(), stats


@command_line
def main(argv: list[str] | None = None) -> int:
    """Command line: train one layer's SAE and save it beside the checkpoint (or in --out), with its quality."""
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sprout", help="a shipped name or a checkpoint path")
    p.add_argument("--layer", type=Whole(0), required=True, help="0-indexed layer (block = layer + 1)")
    p.add_argument("--tokens", type=Whole(1), default=300_000, help="training activations collected")
    p.add_argument("--length", type=Whole(1), default=256, help="tokens per training window")
    p.add_argument("--d-sae", type=Whole(1), default=None, help="latents (default 8 x d_model)")
    p.add_argument("--k", type=Whole(1), default=32, help="active latents per token")
    p.add_argument("--epochs", type=Whole(1), default=4)
    p.add_argument("--batch-size", type=Whole(1), default=2048)
    p.add_argument("--lr", type=POSITIVE, default=4e-4)
    p.add_argument("--seed", type=Whole(0), default=0)
    p.add_argument("--threads", type=Whole(1), default=1, help="torch CPU threads")
    p.add_argument("--max-minutes", type=POSITIVE, default=None, help="stop training after this long")
    p.add_argument("--eval-windows", type=Whole(0), default=32, help="held-out windows for the quality metrics (0: skip)")
    p.add_argument("--out", default=None, help="folder (default <checkpoint>/saes/blocks.{layer}.hook_resid_post)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from sprout_interp.core.hooked import load_hooked
    from sprout_interp.features.metrics import sae_quality

    m = load_hooked(a.model)
    t0 = time.time()
    acts = collect_activations(m, a.layer, a.tokens, length=a.length, seed=a.seed)
    collect_s = time.time() - t0
    print(f"collected {len(acts):,} activations of {resid_hook(a.layer)} in {collect_s:.0f}s "
          f"({len(acts) / collect_s:,.0f} tokens/s)")
    sae, st = train_sae(m, a.layer, acts, d_sae=a.d_sae, k=a.k, epochs=a.epochs, batch_size=a.batch_size, lr=a.lr,
                        seed=a.seed, max_seconds=None if a.max_minutes is None else 60 * a.max_minutes)
    sae.info["training"].update(collect_seconds=round(collect_s, 1), collect_tokens_per_s=round(len(acts) / collect_s))
    print(f"trained {st.steps} steps ({st.tokens_seen:,} tokens) in {st.seconds:.0f}s ({st.tokens_per_s:,.0f} tokens/s), "
          f"final normalised MSE {st.final_nmse:.3f}, {st.dead_at_end} dead latents")
    if a.eval_windows:
        q = sae_quality(m, sae, n=a.eval_windows)
        sae.info["quality"] = {k: (v.item() if hasattr(v, "item") else v) for k, v in q.iloc[0].to_dict().items()}
        print(q.to_string(index=False))
    folder = Path(a.out) if a.out else sae_folder(m, a.layer)
    save_sae(sae, folder)
    print(f"saved {folder} (total {time.time() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
