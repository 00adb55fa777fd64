"""Training per-layer transcoders (feed-forward input -> feed-forward output) with the SAEs' TopK recipe.

The recipe is :mod:`sprout_interp.features.train`'s (Gao et al. 2024) with the target changed from the input
to the feed-forward's output: the same normalised-MSE and AuxK losses (:func:`~sprout_interp.features.train.
topk_losses`, the normalisation now the target's variance), unit-norm decoder rows, the same learning-rate
schedule, and activations collected once into a memory-bounded buffer (:func:`~sprout_interp.features.train.
collect_hooks`). Inputs and targets are each scaled to mean norm sqrt(d_model) while training, and the scales
are folded back before saving (``W_enc`` and ``W_skip`` times ``s_in / s_out``, ``b_enc`` and ``b_dec`` divided
by ``s_out``, ``W_dec`` unchanged), so a saved transcoder reads and writes the raw stream and a feature's
activation is the norm of what it writes.

A run is resumable: with ``run_dir`` the whole training state (parameters, Adam's moments, the step, each
feature's tokens since it last fired) is written to ``layer_{l}.state.pt`` every ``save_every`` steps, and a
call with the same settings continues from it, bit for bit as if it had not stopped (each epoch's order comes
from its own seeded generator; the activations are collected again, deterministically). Steps and tokens are
counted; nothing depends on the clock.

    python -m sprout_interp.features.transcoder_train --model sprout --out runs/transcoders/sprout     # every layer
    python -m sprout_interp.features.transcoder_train --model gpt-4 --layers 0 1 --tokens 200000 --k 32
    python -m sprout_interp.features.transcoder_train --model sprout --ship runs/transcoders/sprout     # float16 copy
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from pathlib import Path
from typing import Optional, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.core.arguments import check_count, check_number, command_line, describe
from sprout_interp.core.errors import ArgumentError, SproutError
from sprout_interp.core.hooked import as_hooked
from sprout_interp.features.train import TrainStats, collect_hooks, drop_radial_grad_, lr_at, mark_fired_, topk_losses
from sprout_interp.features.transcoder import (
    TC_RECIPE,
    Transcoder,
    input_hook,
    layer_file,
    max_k,
    mlp_input,
    output_hook,
    save_transcoder_layer,
)
from sprout_model.cli import POSITIVE, ArgumentParser, Whole

__all__ = ["collect_mlp_pairs", "train_transcoder", "state_file", "main"]


def state_file(run_dir: Union[str, Path], layer: int) -> Path:
    """The resumable training state of ``layer`` in ``run_dir``: ``layer_{layer}.state.pt``."""
    return Path(run_dir) / f"layer_{int(layer)}.state.pt"


@torch.no_grad()
def collect_mlp_pairs(
    model,
    layer: int,
    n_tokens: int = 300_000,
    length: int = 256,
    batch: int = 16,
    seed: int = 0,
    tokens: Optional[Int[Tensor, "n pos"]] = None,
    progress: bool = True,
) -> tuple[Float[Tensor, "tokens d_model"], Float[Tensor, "tokens d_model"]]:
    """``(inputs, targets)`` of feed-forward ``layer`` at ``n_tokens`` training positions (float32): the input is
    ``blocks.{layer}.ln2.hook_normalized`` times ln2's gain, the target ``blocks.{layer}.hook_mlp_out``
    (:func:`~sprout_interp.features.train.collect_hooks`, memory-bounded)."""
    m = as_hooked(model)
    x, y = collect_hooks(m, [input_hook(layer), output_hook(layer)], n_tokens, length, batch, seed,
                         torch.float32, tokens, progress)
    x.copy_(mlp_input(m, layer, x))
    return x, y


#: how W_skip may start (train_transcoder's skip_init)
SKIP_INITS = ("zero", "least_squares")
#: training pairs the least-squares start of W_skip is fitted on
LSTSQ_ROWS = 50_000


def _least_squares(x: Float[Tensor, "n d"], y: Float[Tensor, "n e"]) -> tuple[Tensor, Tensor]:
    """``(W (d, e), b (e,))`` minimising ``||x @ W + b - y||²`` (float64 normal equations on centred data)."""
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    W = torch.linalg.solve(xc.T @ xc, xc.T @ yc)
    return W, my - mx @ W


def _norm_scale(x: Tensor, rows: int = 50_000) -> float:
    """The constant that brings the mean norm of ``x``'s first ``rows`` rows to sqrt(d) (the recipe's scale)."""
    return float(math.sqrt(x.shape[1]) / x[:rows].float().norm(dim=-1).mean().clamp_min(1e-12))


def train_transcoder(
    model,
    layer: int,
    inputs: Optional[Float[Tensor, "tokens d_model"]] = None,
    targets: Optional[Float[Tensor, "tokens d_model"]] = None,
    n_tokens: int = 300_000,
    d_transcoder: Optional[int] = None,
    k: int = 32,
    skip: bool = False,
    epochs: int = 4,
    batch_size: int = 2048,
    lr: float = 4e-4,
    aux_coef: float = 1 / 32,
    k_aux: Optional[int] = None,
    dead_after: int = 100_000,
    seed: int = 0,
    run_dir: Union[str, Path, None] = None,
    save_every: int = 100,
    max_steps: Optional[int] = None,
    skip_init: str = "zero",
    progress: bool = True,
) -> tuple[Transcoder, TrainStats]:
    """Train the TopK transcoder of feed-forward ``layer`` (the SAE recipe with the feed-forward's output as the
    target: normalised MSE, the AuxK loss, unit-norm decoder rows; the module docstring has every step).

    ``inputs``/``targets`` are the training pairs (:func:`collect_mlp_pairs`; collected here from ``n_tokens``
    training tokens when None). ``d_transcoder`` defaults to 8 x d_model, ``k_aux`` to d_model / 2;
    ``dead_after`` is in training tokens. With ``run_dir`` the state is saved every ``save_every`` steps and a
    saved state with the same settings is resumed. ``max_steps`` stops after that many steps in all (counting
    the resumed ones), saving the state first. ``skip_init`` (with ``skip``): ``"zero"`` starts ``W_skip`` at
    zero and ``b_dec`` at the mean output; ``"least_squares"`` starts them at the least-squares linear map from
    input to output (float64, on the first :data:`LSTSQ_ROWS` training pairs), so the features start on what a
    linear map leaves. Returns the transcoder (float32, raw units, with the
    fingerprint and training numbers in ``info``) and a :class:`~sprout_interp.features.train.TrainStats`
    (its seconds and tokens/s are this call's, informative only).
    """
    from tqdm.auto import tqdm

    m = as_hooked(model)
    d = m.cfg.d_model
    d_transcoder = check_count(d_transcoder if d_transcoder is not None else 8 * d, "d_transcoder")
    k = check_count(k, "k", high=max_k(d_transcoder),
                    what=f"active features per token, 1..{max_k(d_transcoder)}: at most a quarter of d_transcoder")
    epochs, batch_size, save_every = (check_count(v, n) for v, n in ((epochs, "epochs"), (batch_size, "batch_size"),
                                                                     (save_every, "save_every")))
    dead_after, seed = check_count(dead_after, "dead_after"), check_count(seed, "seed", low=0)
    if max_steps is not None:
        max_steps = check_count(max_steps, "max_steps", low=0)
    if not isinstance(skip, bool):
        raise ArgumentError(f"skip={describe(skip)} is not True or False: skip says whether to train W_skip")
    k_aux = check_count(k_aux if k_aux is not None else d // 2, "k_aux")
    lr = check_number(lr, "lr", low=0.0, low_open=True)
    aux_coef = check_number(aux_coef, "aux_coef", low=0.0)
    if skip_init not in SKIP_INITS or (skip_init != "zero" and not skip):
        raise ArgumentError(f"skip_init={describe(skip_init)} is not one of {SKIP_INITS}"
                            if skip_init not in SKIP_INITS else
                            f"skip_init={skip_init!r} needs skip=True: there is no W_skip to start")
    if inputs is None or targets is None:
        inputs, targets = collect_mlp_pairs(m, layer, n_tokens, seed=seed, progress=progress)
    if inputs.dim() != 2 or inputs.shape != targets.shape or inputs.shape[1] != d:
        raise SproutError(f"inputs and targets must both be (tokens, {d}), got {tuple(inputs.shape)} and "
                          f"{tuple(targets.shape)}")
    n = inputs.shape[0]
    steps_per_epoch = n // batch_size
    if steps_per_epoch == 0:
        raise SproutError(f"{n} training tokens are fewer than one batch of {batch_size}: collect more tokens "
                          "or lower batch_size")
    total = steps_per_epoch * epochs
    s_in, s_out = _norm_scale(inputs), _norm_scale(targets)
    settings = {"layer": layer, "d_transcoder": d_transcoder, "k": k, "skip": skip, "epochs": epochs,
                "batch_size": batch_size, "lr": lr, "aux_coef": aux_coef, "k_aux": k_aux, "dead_after": dead_after,
                "seed": seed, "tokens": n, "input_scale": s_in, "output_scale": s_out,
                **({"skip_init": skip_init} if skip_init != "zero" else {}),
                "data_sum": float(inputs[:4096].double().sum() + targets[:4096].double().sum())}
    tc = Transcoder.for_model(m, layer, d_transcoder, k, skip, seed=seed)
    with torch.no_grad():
        tc.b_dec.copy_(targets.float().mean(0) * s_out)
        if skip_init == "least_squares":
            W, b = _least_squares(inputs[:LSTSQ_ROWS].double() * s_in, targets[:LSTSQ_ROWS].double() * s_out)
            tc.W_skip.copy_(W.T)
            tc.b_dec.copy_(b)
    opt = torch.optim.Adam(tc.parameters(), lr=lr, betas=(0.9, 0.999), eps=6.25e-10)
    last_fired = torch.zeros(d_transcoder, dtype=torch.long)
    step = 0
    sf = state_file(run_dir, layer) if run_dir is not None else None

    if sf is not None and sf.is_file():
        st = torch.load(sf, map_location="cpu", weights_only=True)
        if st.get("settings") != settings:
            diff = sorted(k_ for k_ in settings if st.get("settings", {}).get(k_) != settings[k_])
            raise SproutError(f"{sf} was saved by a run with other settings ({', '.join(diff)} differ): resume with "
                              "the same settings, or delete it (or pick another run folder) to start afresh")
        tc.load_state_dict(st["params"])
        opt.load_state_dict(st["adam"])
        last_fired.copy_(st["last_fired"])
        step = int(st["step"])

    def save_state() -> None:
        if sf is None:
            return
        sf.parent.mkdir(parents=True, exist_ok=True)
        tmp = sf.with_name(sf.name + ".tmp")
        torch.save({"settings": settings, "params": tc.state_dict(), "adam": opt.state_dict(),
                    "last_fired": last_fired, "step": step}, tmp)
        tmp.replace(sf)

    stop = total if max_steps is None else min(total, max_steps)
    bar = tqdm(total=total, initial=step, desc=f"transcoder layer {layer}", unit="step", disable=not progress,
               mininterval=30)
    t0, start, nmse, aux, order, order_epoch = time.time(), step, float("nan"), 0.0, None, -1
    while step < stop:
        epoch, b = divmod(step, steps_per_epoch)
        if epoch != order_epoch:  # each epoch's order from its own generator, so a resumed run draws the same
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
            order_epoch = epoch
        ids = order[b * batch_size:(b + 1) * batch_size]
        x, y = inputs[ids].float() * s_in, targets[ids].float() * s_out
        pre = tc.pre_acts(x)
        vals, idx = tc.topk(pre)
        recon = tc.decode_sparse(vals, idx, x)  # reads k decoder rows per token, not all of them
        dead = last_fired >= dead_after
        loss, loss_main, loss_aux = topk_losses(pre, recon, y, tc.W_dec, dead, k_aux, aux_coef)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        drop_radial_grad_(tc.W_dec)
        for grp in opt.param_groups:
            grp["lr"] = lr_at(lr, step, total)
        opt.step()
        tc.normalize_decoder()
        mark_fired_(last_fired, idx.detach(), vals.detach(), x.shape[0])
        step += 1
        nmse, aux = loss_main.item(), loss_aux.item()
        bar.set_postfix(nmse=f"{nmse:.3f}", dead=int(dead.sum()), refresh=False)
        bar.update(1)
        if step % save_every == 0 or step == stop:
            save_state()
    bar.close()
    secs = time.time() - t0
    out = copy.deepcopy(tc).eval()
    with torch.no_grad():  # raw units: ŷ/s_out = topk(x @ (W_enc s_in/s_out).T + b_enc/s_out) @ W_dec + ...
        out.W_enc.mul_(s_in / s_out)
        out.b_enc.div_(s_out)
        out.b_dec.div_(s_out)
        if out.W_skip is not None:
            out.W_skip.mul_(s_in / s_out)
    done = step - start
    stats = TrainStats(steps=step, tokens_seen=step * batch_size, seconds=secs,
                       tokens_per_s=done * batch_size / max(secs, 1e-9), final_nmse=nmse, final_aux=aux,
                       dead_at_end=int((last_fired >= dead_after).sum()))
    out.info.update(
        recipe=TC_RECIPE, trained_on=m.name or str(getattr(m, "source", "")), layer=layer, block=layer + 1,
        finished=step >= total,
        training={**{k_: v for k_, v in settings.items() if k_ != "data_sum"}, "activation_tokens": n,
                  "steps": step, "total_steps": total, "tokens_seen": step * batch_size,
                  "final_nmse": round(nmse, 4), "dead_at_end": stats.dead_at_end,
                  "split": "training documents (sprout_interp.core.texts.training_sample_for)"},
    )
    return out, stats


@command_line
def main(argv: list[str] | None = None) -> int:
    """Command line: train the transcoders of some or all layers into --out, one after another, skipping the
    layers already there (and resuming a layer's saved state); or --ship a finished folder in float16."""
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sprout", help="a shipped name or a checkpoint path")
    p.add_argument("--layers", type=Whole(0), nargs="*", default=None, help="0-indexed layers (default: all)")
    p.add_argument("--out", default=None, help="run folder (layer_{i}.safetensors, config.yaml, states)")
    p.add_argument("--tokens", type=Whole(1), default=300_000, help="training activations collected per layer")
    p.add_argument("--length", type=Whole(1), default=256, help="tokens per training window")
    p.add_argument("--d-transcoder", type=Whole(1), default=None, help="features per layer (default: --expansion x d_model)")
    p.add_argument("--expansion", type=Whole(1), default=8, help="features per layer as a multiple of d_model")
    p.add_argument("--k", type=Whole(1), default=32, help="active features per token")
    p.add_argument("--skip", action="store_true", help="train a skip connection W_skip too")
    p.add_argument("--skip-init", choices=SKIP_INITS, default="zero",
                   help="how W_skip starts (with --skip): zero, or the least-squares linear map")
    p.add_argument("--epochs", type=Whole(1), default=4)
    p.add_argument("--batch-size", type=Whole(1), default=2048)
    p.add_argument("--lr", type=POSITIVE, default=4e-4)
    p.add_argument("--seed", type=Whole(0), default=0)
    p.add_argument("--save-every", type=Whole(1), default=100, help="steps between saved training states")
    p.add_argument("--max-steps", type=Whole(0), default=None, help="stop each layer after this many steps (resumable)")
    p.add_argument("--threads", type=Whole(1), default=1, help="torch CPU threads")
    p.add_argument("--eval-windows", type=Whole(0), default=16, help="held-out windows for each layer's quality (0: skip)")
    p.add_argument("--ship", default=None, metavar="RUN_FOLDER",
                   help="instead of training: copy RUN_FOLDER's transcoders in float16 to <checkpoint>/transcoders")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from sprout_interp.core.hooked import load_hooked
    from sprout_interp.features.transcoder import load_transcoders, save_transcoders, transcoder_folder
    from sprout_interp.features.transcoder_metrics import transcoder_quality

    m = load_hooked(a.model)
    if a.ship:
        ts = load_transcoders(m, a.ship)
        dest = Path(a.out) if a.out else transcoder_folder(m)
        save_transcoders(ts, dest, torch.float16)
        size = sum(f.stat().st_size for f in dest.iterdir())
        print(f"shipped layers {ts.layers} to {dest} in float16 ({size / 1e6:.1f} MB)")
        return 0
    if not a.out:
        p.error("--out RUN_FOLDER is needed to train (e.g. runs/transcoders/sprout)")
    if a.skip_init != "zero" and not a.skip:
        p.error(f"--skip-init {a.skip_init} needs --skip (there is no W_skip to start)")
    out = Path(a.out)
    layers = range(m.cfg.n_layers) if a.layers is None else a.layers
    for layer in layers:
        if (out / layer_file(layer)).is_file():
            print(f"layer {layer}: {out / layer_file(layer)} exists, skipped", flush=True)
            continue
        t0 = time.time()
        x, y = collect_mlp_pairs(m, layer, a.tokens, length=a.length, seed=a.seed, progress=False)
        collect_s = time.time() - t0
        print(f"layer {layer}: collected {len(x):,} (input, output) pairs in {collect_s:.0f}s "
              f"({len(x) / max(collect_s, 1e-9):,.0f} tokens/s)", flush=True)
        tc, st = train_transcoder(m, layer, x, y, d_transcoder=a.d_transcoder or a.expansion * m.cfg.d_model, k=a.k, skip=a.skip, epochs=a.epochs,
                                  batch_size=a.batch_size, lr=a.lr, seed=a.seed, run_dir=out,
                                  save_every=a.save_every, max_steps=a.max_steps, skip_init=a.skip_init)
        del x, y
        print(f"layer {layer}: {st.steps} steps ({st.tokens_seen:,} tokens) this call {st.seconds:.0f}s "
              f"({st.tokens_per_s:,.0f} tokens/s), final normalised MSE {st.final_nmse:.3f}, "
              f"{st.dead_at_end} dead", flush=True)
        if not tc.info["finished"]:
            if a.eval_windows:  # how far it got: the same held-out measure, of the weights as they stand
                print(transcoder_quality(m, {layer: tc}, n=a.eval_windows).to_string(index=False), flush=True)
            print(f"layer {layer}: stopped at step {st.steps} (--max-steps); run again to resume", flush=True)
            return 0
        tc.info["training"].update(collect_seconds=round(collect_s, 1), train_seconds=round(st.seconds, 1))
        if a.eval_windows:
            q = transcoder_quality(m, {layer: tc}, n=a.eval_windows)
            tc.info["quality"] = {c: (v.item() if hasattr(v, "item") else v) for c, v in q.iloc[0].to_dict().items()}
            print(q.to_string(index=False), flush=True)
        save_transcoder_layer(tc, out)
        state_file(out, layer).unlink(missing_ok=True)
        print(f"layer {layer}: saved {out / layer_file(layer)} (total {time.time() - t0:.0f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
