"""Training a cross-layer transcoder (:mod:`sprout_interp.features.clt`) with the per-layer transcoders' conventions.

Each step reads a batch of tokens' feed-forward inputs and outputs at every layer (collected with
:func:`~sprout_interp.features.train.collect_hooks`, the inputs times ln2's gain as for the per-layer transcoders).
For every source layer ``i`` the ReLU'd pre-activations of the batch pass a BatchTopK (the ``k x batch`` largest
of the whole batch kept, so ``k`` features per token on average; Bussmann et al. 2024) and each kept feature writes
through ``W_dec[i]`` to layers ``i..n_layers-1``. The loss is the sum over target layers of each output's
normalised MSE (the per-layer recipe's, :func:`~sprout_interp.features.train.topk_losses`' normalisation) plus
``aux_coef`` times an AuxK loss per source layer: its dead features' ``k_aux`` largest pre-activations
reconstruct the (detached) errors of the layers they write to. Each feature's decoder (all its target layers
together) is kept at unit norm, inputs and outputs are scaled per layer to mean norm sqrt(d_model) and the scales
are folded into ``W_enc`` and ``W_dec`` before saving; Adam with the SAEs' schedule
(:func:`~sprout_interp.features.train.lr_at`). circuit-tracer's CLT knows JumpReLU, not TopK, so the returned
CLT is a JumpReLU whose threshold, per layer, is the BatchTopK cut over the first 8,192 tokens of the last chunk
(the ``k x n``-th largest ReLU'd pre-activation of those ``n`` tokens: ``k`` features per token on average
there). While training, the running mean (decay 0.99) of each batch's smallest kept activation is kept as the
threshold of a run's current state (:func:`clt_from_state`: Bussmann et al.'s rule).

The data come in ``chunks``: chunk ``c`` holds ``chunk_tokens`` tokens of fresh training windows
(``training_sample_for(seed=seed * 100_000 + c)``), trained on for ``passes`` shuffled passes, so a long run sees
many distinct tokens in bounded memory. A run is resumable: with ``run_dir`` the whole state (parameters, Adam's
moments, the step, each feature's tokens since it last fired, the thresholds' running means, the scales) is
written to ``clt.state.pt`` every ``save_every`` steps (atomically: a kill -9 loses at most those steps), and a
call with the same settings continues from it bit for bit as if it had not stopped (each pass's order comes from
its own seeded generator; the current chunk is collected again, deterministically, and checked against the sum
recorded when it was first collected). Steps and tokens are counted; nothing depends on the clock.

    python -m sprout_interp.features.clt_train --model sprout --out runs/clt/sprout            # train or resume
    python -m sprout_interp.features.clt_train --model sprout --out runs/clt/sprout --status   # where it stands
    python -m sprout_interp.features.clt_train --model sprout --ship runs/clt/sprout           # float16 copy
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.core.arguments import check_count, check_number, command_line
from sprout_interp.core.errors import SproutError
from sprout_interp.core.hooked import as_hooked
from sprout_interp.features.clt import CLT_RECIPE, CrossLayerTranscoder
from sprout_interp.features.train import collect_hooks, lr_at
from sprout_interp.features.transcoder import input_hook, mlp_input, output_hook
from sprout_model.cli import POSITIVE, ArgumentParser, Whole

__all__ = ["STATE_FILE", "LOCK_FILE", "RunFolderBusyError", "CLTStats", "collect_clt_chunk", "train_clt", "clt_from_state", "main"]

STATE_FILE = "clt.state.pt"
LOCK_FILE = "clt.lock"
THRESHOLD_DECAY = 0.99
#: the training tokens (of the last chunk) a finished CLT's thresholds are set on
CALIBRATION_TOKENS = 8192
#: the command line's exit status when another process is training in the run folder
BUSY = 3


class RunFolderBusyError(SproutError):
    """Another process is training in the same run folder."""


@dataclass
class CLTStats:
    """What a CLT training call did: steps (in all, resumed ones counted), tokens seen, this call's seconds and
    tokens/s (informative only), each target layer's normalised MSE over the last logged steps, dead features
    per source layer at the end."""

    steps: int
    total_steps: int
    tokens_seen: int
    seconds: float
    tokens_per_s: float
    nmse: list[float] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)


@torch.no_grad()
def collect_clt_chunk(
    model,
    n_tokens: int,
    length: int = 256,
    seed: int = 0,
    tokens: Optional[Int[Tensor, "n pos"]] = None,
    progress: bool = False,
) -> tuple[list[Float[Tensor, "tokens d_model"]], list[Float[Tensor, "tokens d_model"]]]:
    """Every layer's feed-forward ``(inputs, targets)`` at ``n_tokens`` training positions, one forward for all:
    two lists of ``(tokens, d_model)`` float32 tensors, row ``t`` of each from the same token; inputs are
    ``blocks.{l}.ln2.hook_normalized`` times ln2's gain, targets ``blocks.{l}.hook_mlp_out``."""
    m = as_hooked(model)
    L = m.cfg.n_layers
    acts = collect_hooks(m, [input_hook(i) for i in range(L)] + [output_hook(i) for i in range(L)], n_tokens,
                         length, 16, seed, torch.float32, tokens, progress)
    xs, ys = acts[:L], acts[L:]
    for i, x in enumerate(xs):
        x.copy_(mlp_input(m, i, x))
    return xs, ys


def _chunk_seed(seed: int, chunk: int) -> int:
    return seed * 100_000 + chunk


def _chunk_tokens(tokens: Optional[Tensor], chunk: int, n_chunks: int) -> Optional[Tensor]:
    if tokens is None:
        return None
    n = tokens.shape[0]
    return tokens[chunk * n // n_chunks:(chunk + 1) * n // n_chunks]


def _data_sum(xs: list[Tensor], ys: list[Tensor]) -> float:
    return float(sum(t[:4096].double().sum() for t in xs + ys))


def _norm_scale(x: Tensor, rows: int = 50_000) -> float:
    return float(math.sqrt(x.shape[1]) / x[:rows].float().norm(dim=-1).mean().clamp_min(1e-12))


def _batch_topk(pre: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """BatchTopK of one source layer: ``(values, token rows, feature ids)`` of the ``k x batch`` largest ReLU'd
    pre-activations, sorted by position in the flattened batch (so each token's features are contiguous)."""
    B, dt = pre.shape
    vals, flat = pre.relu().flatten().topk(min(k * B, B * dt), sorted=False)
    flat, order = flat.sort()
    return vals[order], flat // dt, flat % dt


def _write(W_dec_i: Tensor, vals: Tensor, rows: Tensor, feats: Tensor, B: int) -> Tensor:
    """What the kept features of one source layer write, ``(B, n_targets * d_model)``: Σ vals x decoder rows,
    token by token (an embedding bag: only the kept rows of ``W_dec[i]`` are read)."""
    counts = torch.bincount(rows, minlength=B)
    offsets = torch.cumsum(counts, 0) - counts
    return F.embedding_bag(feats, W_dec_i.flatten(1), offsets, mode="sum", per_sample_weights=vals)


def _step_losses(clt: CrossLayerTranscoder, xb: Tensor, yb: Tensor, k: int, dead: Tensor, k_aux: int,
                 aux_coef: float):
    """One batch: ``(loss, per-target normalised MSE (L,), aux loss, kept (vals, rows, feats) per source layer)``.
    ``xb``, ``yb``: (B, L, d) in training units."""
    B, L, d = xb.shape
    outs = [clt.b_dec[j].expand(B, d) for j in range(L)]
    kept, pres = [], []
    for i in range(L):
        pre = xb[:, i] @ clt.W_enc[i].T + clt.b_enc[i]
        vals, rows, feats = _batch_topk(pre, k)
        w = _write(clt.W_dec[i], vals, rows, feats, B).view(B, L - i, d)
        for j in range(i, L):
            outs[j] = outs[j] + w[:, j - i]
        kept.append((vals.detach(), rows, feats))
        pres.append(pre)
    recon = torch.stack(outs, 1)
    err = yb - recon
    var = (yb - yb.mean(0)).pow(2).sum((0, 2))
    nmse = err.pow(2).sum((0, 2)) / var
    loss = nmse.sum()
    aux = torch.zeros(())
    if aux_coef > 0 and bool(dead.any()):
        e_all = err.detach()
        for i in range(L):
            if not bool(dead[i].any()):
                continue
            kk = min(k_aux, int(dead[i].sum()))
            av, ai = pres[i].masked_fill(~dead[i], float("-inf")).topk(kk, dim=-1, sorted=False)
            e_hat = F.embedding_bag(ai, clt.W_dec[i].flatten(1), mode="sum", per_sample_weights=av.relu())
            e = e_all[:, i:].reshape(B, -1)
            aux = aux + (e - e_hat).pow(2).sum() / e.pow(2).sum().clamp_min(1e-12)
        loss = loss + aux_coef * aux
    return loss, nmse.detach(), aux.detach(), kept


@torch.no_grad()
def _drop_radial_grad_(clt: CrossLayerTranscoder) -> None:
    for w in clt.W_dec:
        if w.grad is None:
            continue
        g, wf = w.grad.view(w.shape[0], -1), w.view(w.shape[0], -1)
        g -= (g * wf).sum(-1, keepdim=True) * wf


@torch.no_grad()
def _calibrated_thresholds(clt: CrossLayerTranscoder, xs: list[Tensor], s_in: list[float], k: int,
                           rows: int = CALIBRATION_TOKENS) -> Tensor:
    """Each layer's JumpReLU threshold (training units) so that its features fire ``k`` times per token on average
    over the first ``rows`` tokens of ``xs``: halfway between the ``k x n``-th and the next largest ReLU'd
    pre-activation of those ``n`` tokens (the BatchTopK cut over the whole sample; 0 where fewer are positive)."""
    out = torch.zeros(clt.n_layers, dtype=torch.float64)
    for i in range(clt.n_layers):
        x = xs[i][:rows] * s_in[i]
        pre = (x @ clt.W_enc[i].T + clt.b_enc[i]).relu().flatten()
        top = pre.topk(min(k * x.shape[0] + 1, pre.numel())).values
        out[i] = float(top[-2:].double().mean()) if len(top) > k * x.shape[0] else 0.0
    return out


def _lock_run(run_dir):
    """An exclusive lock on ``run_dir`` (``clt.lock``; the kernel releases it when the process ends, however it
    ends): a second trainer on the same run folder is refused instead of writing the same state file. Returns the
    open lock file (None without a run folder)."""
    if run_dir is None:
        return None
    import fcntl

    Path(run_dir).mkdir(parents=True, exist_ok=True)
    fh = open(Path(run_dir) / LOCK_FILE, "w")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise RunFolderBusyError(f"another process is training in {run_dir} (it holds {LOCK_FILE}): let it finish, "
                                 "or stop it, before starting another") from None
    return fh


def _fold(clt: CrossLayerTranscoder, s_in: list[float], s_out: list[float], thr: Tensor) -> CrossLayerTranscoder:
    """The CLT in raw units (scales folded into W_enc and W_dec, b_dec divided) with JumpReLU thresholds ``thr``."""
    out = copy.deepcopy(clt).eval()
    with torch.no_grad():
        for i in range(out.n_layers):
            out.W_enc[i].mul_(s_in[i])
            out.b_dec[i].div_(s_out[i])
            out.threshold[i].fill_(float(thr[i]))
            for j in range(i, out.n_layers):
                out.W_dec[i][:, j - i].div_(s_out[j])
    return out


def _settings(d_transcoder, k, chunks, chunk_tokens, passes, length, batch_size, lr, aux_coef, k_aux, dead_after,
              seed) -> dict:
    return {"d_transcoder": d_transcoder, "k": k, "chunks": chunks, "chunk_tokens": chunk_tokens, "passes": passes,
            "length": length, "batch_size": batch_size, "lr": lr, "aux_coef": aux_coef, "k_aux": k_aux,
            "dead_after": dead_after, "seed": seed, "threshold_decay": THRESHOLD_DECAY}


def train_clt(
    model,
    run_dir: Union[str, Path, None] = None,
    d_transcoder: Optional[int] = None,
    k: int = 32,
    chunks: int = 8,
    chunk_tokens: int = 32_768,
    passes: int = 4,
    length: int = 256,
    batch_size: int = 512,
    lr: float = 1e-3,
    aux_coef: float = 1 / 32,
    k_aux: Optional[int] = None,
    dead_after: int = 100_000,
    seed: int = 0,
    tokens: Optional[Int[Tensor, "n pos"]] = None,
    save_every: int = 50,
    log_every: int = 100,
    max_steps: Optional[int] = None,
    progress: bool = True,
) -> tuple[CrossLayerTranscoder, CLTStats]:
    """Train (or, from ``run_dir``'s saved state with the same settings, resume) the cross-layer transcoder of
    every feed-forward of ``model`` (the module docstring has the recipe).

    ``d_transcoder`` (features per layer) defaults to 4 x d_model, ``k`` is the features per token per layer,
    ``k_aux`` defaults to d_model / 2, ``dead_after`` is in training tokens. The data are ``chunks`` chunks of
    ``chunk_tokens`` tokens of ``length``-token training windows, each used for ``passes`` passes of batches of
    ``batch_size``; ``tokens`` (optional, (n, pos) ids) replaces the training windows, split into ``chunks``
    equal row blocks. ``max_steps`` stops after that many steps in all (the resumed ones counted), saving the
    state first. Every ``log_every`` steps one line goes to stdout (step, tokens, each layer's normalised MSE).
    Returns the CLT (float32, raw units, JumpReLU thresholds, its training numbers in ``info``) and a
    :class:`CLTStats`.
    """
    lock = _lock_run(run_dir)  # held until this call returns or raises (or its process ends)
    try:
        return _train_clt(model, run_dir, d_transcoder, k, chunks, chunk_tokens, passes, length, batch_size, lr,
                          aux_coef, k_aux, dead_after, seed, tokens, save_every, log_every, max_steps, progress)
    finally:
        if lock is not None:
            lock.close()


def _train_clt(model, run_dir, d_transcoder, k, chunks, chunk_tokens, passes, length, batch_size, lr, aux_coef, k_aux,
               dead_after, seed, tokens, save_every, log_every, max_steps, progress):
    m = as_hooked(model)
    L, d = m.cfg.n_layers, m.cfg.d_model
    d_transcoder = check_count(d_transcoder if d_transcoder is not None else 4 * d, "d_transcoder")
    k = check_count(k, "k", high=d_transcoder, what="active features per token per layer, at most d_transcoder")
    chunks, chunk_tokens, passes, length, batch_size, save_every, log_every = (
        check_count(v, n) for v, n in ((chunks, "chunks"), (chunk_tokens, "chunk_tokens"), (passes, "passes"),
                                       (length, "length"), (batch_size, "batch_size"), (save_every, "save_every"),
                                       (log_every, "log_every")))
    dead_after, seed = check_count(dead_after, "dead_after"), check_count(seed, "seed", low=0)
    k_aux = check_count(k_aux if k_aux is not None else d // 2, "k_aux")
    lr = check_number(lr, "lr", low=0.0, low_open=True)
    aux_coef = check_number(aux_coef, "aux_coef", low=0.0)
    if max_steps is not None:
        max_steps = check_count(max_steps, "max_steps", low=0)
    if tokens is not None and (not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.shape[0] < chunks):
        raise SproutError(f"tokens must be a (n, pos) tensor of ids with at least chunks={chunks} rows")
    if tokens is not None:
        chunk_tokens = min(chunk_tokens, (tokens.shape[0] // chunks) * tokens.shape[1])
    steps_per_pass = chunk_tokens // batch_size
    if steps_per_pass == 0:
        raise SproutError(f"a chunk of {chunk_tokens} tokens is less than one batch of {batch_size}: raise "
                          "chunk_tokens or lower batch_size")
    per_chunk = steps_per_pass * passes
    total = per_chunk * chunks
    settings = _settings(d_transcoder, k, chunks, chunk_tokens, passes, length, batch_size, lr, aux_coef, k_aux,
                         dead_after, seed)

    clt = CrossLayerTranscoder.for_model(m, d_transcoder, seed=seed)
    opt = torch.optim.Adam(clt.parameters(), lr=lr, betas=(0.9, 0.999), eps=6.25e-10)
    last_fired = torch.zeros(L, d_transcoder, dtype=torch.long)
    thr = torch.full((L,), float("nan"), dtype=torch.float64)
    step, s_in, s_out, sums = 0, None, None, {}
    sf = Path(run_dir) / STATE_FILE if run_dir is not None else None
    if sf is not None and sf.is_file():
        st = torch.load(sf, map_location="cpu", weights_only=True)
        if st.get("settings") != settings:
            diff = sorted(k_ for k_ in settings if st.get("settings", {}).get(k_) != settings[k_])
            raise SproutError(f"{sf} was saved by a run with other settings ({', '.join(diff)} differ): resume with "
                              "the same settings, or pick another run folder to start afresh")
        clt.load_state_dict(st["params"])
        opt.load_state_dict(st["adam"])
        last_fired.copy_(st["last_fired"])
        thr.copy_(st["threshold"])
        step, s_in, s_out, sums = int(st["step"]), list(st["s_in"]), list(st["s_out"]), dict(st["chunk_sums"])

    def save_state() -> None:
        if sf is None:
            return
        sf.parent.mkdir(parents=True, exist_ok=True)
        tmp = sf.with_name(sf.name + ".tmp")
        torch.save({"settings": settings, "params": clt.state_dict(), "adam": opt.state_dict(),
                    "last_fired": last_fired, "threshold": thr, "step": step, "s_in": s_in, "s_out": s_out,
                    "chunk_sums": sums, "total_steps": total, "tokens_seen": step * batch_size}, tmp)
        tmp.replace(sf)

    stop = total if max_steps is None else min(total, max_steps)
    t0, start = time.time(), step
    xs = ys = None
    chunk_now, order_key, order = -1, None, None
    nmse_acc, n_acc, last_nmse = torch.zeros(L, dtype=torch.float64), 0, [float("nan")] * L
    while step < stop:
        c, within = divmod(step, per_chunk)
        p, b = divmod(within, steps_per_pass)
        if c != chunk_now:
            xs = ys = None
            tc = time.time()
            xs, ys = collect_clt_chunk(m, chunk_tokens, length, _chunk_seed(seed, c),
                                       _chunk_tokens(tokens, c, chunks), progress=False)
            got = _data_sum(xs, ys)
            if str(c) in sums and sums[str(c)] != got:
                raise SproutError(f"chunk {c} of {sf} collected different activations now ({got!r}, was "
                                  f"{sums[str(c)]!r}): the model, corpus or settings changed; start a new run folder")
            sums[str(c)] = got
            if s_in is None:
                s_in, s_out = [_norm_scale(x) for x in xs], [_norm_scale(y) for y in ys]
                with torch.no_grad():
                    for j in range(L):
                        clt.b_dec[j].copy_(ys[j].mean(0) * s_out[j])
            chunk_now = c
            if progress:
                print(f"chunk {c}/{chunks}: collected {len(xs[0]):,} tokens in {time.time() - tc:.0f}s", flush=True)
        if order_key != (c, p):  # each pass's order from its own generator, so a resumed run draws the same
            order = torch.randperm(len(xs[0]), generator=torch.Generator().manual_seed(seed * 1_000_003 + c * 1_009 + p))
            order_key = (c, p)
        ids = order[b * batch_size:(b + 1) * batch_size]
        xb = torch.stack([xs[i][ids] * s_in[i] for i in range(L)], 1)
        yb = torch.stack([ys[i][ids] * s_out[i] for i in range(L)], 1)
        dead = last_fired >= dead_after
        loss, nmse, aux, kept = _step_losses(clt, xb, yb, k, dead, k_aux, aux_coef)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clt.threshold.grad = None
        _drop_radial_grad_(clt)
        for grp in opt.param_groups:
            grp["lr"] = lr_at(lr, step, total)
        opt.step()
        clt.normalize_decoder()
        with torch.no_grad():
            last_fired += len(ids)
            for i, (vals, rows, feats) in enumerate(kept):
                pos = vals > 0
                last_fired[i][feats[pos]] = 0
                low = float(vals[pos].min()) if bool(pos.any()) else 0.0
                thr[i] = low if math.isnan(float(thr[i])) else THRESHOLD_DECAY * float(thr[i]) + (1 - THRESHOLD_DECAY) * low
        step += 1
        nmse_acc += nmse.double()
        n_acc += 1
        if step % log_every == 0 or step == stop:
            last_nmse = (nmse_acc / n_acc).tolist()
            nmse_acc.zero_()
            n_acc = 0
            if progress:
                secs = time.time() - t0
                print(f"step {step}/{total} ({step * batch_size:,} tokens): nmse per layer "
                      f"{' '.join(f'{v:.3f}' for v in last_nmse)} | aux {float(aux):.3f} | dead per layer "
                      f"{(last_fired >= dead_after).sum(1).tolist()} | {(step - start) * batch_size / max(secs, 1e-9):,.0f}"
                      f" tokens/s this call", flush=True)
        if step % save_every == 0 or step == stop:
            save_state()
    secs = time.time() - t0
    if s_in is None:  # nothing left to do and no state: nothing was trained
        raise SproutError("no training step was run (max_steps=0 and no saved state): nothing to return")
    if xs is None:  # resumed where it had stopped: the last chunk again, for the thresholds
        c = min(step - 1, total - 1) // per_chunk
        xs, _ = collect_clt_chunk(m, chunk_tokens, length, _chunk_seed(seed, c), _chunk_tokens(tokens, c, chunks))
    thr = _calibrated_thresholds(clt, xs, s_in, k)
    out = _fold(clt, s_in, s_out, thr)
    dead_now = (last_fired >= dead_after).sum(1).tolist()
    stats = CLTStats(steps=step, total_steps=total, tokens_seen=step * batch_size, seconds=secs,
                     tokens_per_s=(step - start) * batch_size / max(secs, 1e-9), nmse=last_nmse, dead=dead_now)
    out.info.update(
        recipe=CLT_RECIPE, trained_on=m.name or str(getattr(m, "source", "")), finished=step >= total,
        training={**settings, "steps": step, "total_steps": total, "tokens_seen": step * batch_size,
                  "distinct_tokens": chunks * chunk_tokens, "final_nmse": [round(v, 4) for v in last_nmse],
                  "dead_at_end": dead_now, "thresholds": [round(float(t), 5) for t in thr],
                  "threshold_rule": f"BatchTopK cut over {CALIBRATION_TOKENS} tokens of the last chunk",
                  "input_scales": s_in, "output_scales": s_out,
                  "split": "training documents (sprout_interp.core.texts.training_sample_for)"},
    )
    return out, stats


def clt_from_state(model, run_dir: Union[str, Path]) -> CrossLayerTranscoder:
    """The CLT of an unfinished run as it stands in ``run_dir``'s saved state, in raw units with its current
    thresholds (for measuring a run midway; training goes on untouched)."""
    m = as_hooked(model)
    sf = Path(run_dir) / STATE_FILE
    if not sf.is_file():
        raise SproutError(f"{sf} does not exist: no unfinished CLT run in {run_dir}")
    st = torch.load(sf, map_location="cpu", weights_only=True)
    clt = CrossLayerTranscoder.for_model(m, st["settings"]["d_transcoder"])
    clt.load_state_dict(st["params"])
    out = _fold(clt, list(st["s_in"]), list(st["s_out"]), st["threshold"])
    out.info.update(recipe=CLT_RECIPE, trained_on=m.name or "", finished=False,
                    training={**st["settings"], "steps": int(st["step"]), "total_steps": int(st["total_steps"])})
    return out


@command_line
def main(argv: list[str] | None = None) -> int:
    """Command line: train or resume a CLT into --out (saving it there, float32, with its quality, when done);
    --status: where a run stands (and, with --eval-windows, the quality of its current state); --ship: copy a
    finished run in float16 beside the checkpoint."""
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sprout", help="a shipped name or a checkpoint path")
    p.add_argument("--out", default=None, help="run folder (clt.state.pt while training; the CLT's files when done)")
    p.add_argument("--d-transcoder", type=Whole(1), default=None, help="features per layer (default: --expansion x d_model)")
    p.add_argument("--expansion", type=Whole(1), default=4, help="features per layer as a multiple of d_model")
    p.add_argument("--k", type=Whole(1), default=32, help="active features per token per layer (BatchTopK)")
    p.add_argument("--chunks", type=Whole(1), default=8, help="chunks of fresh training tokens")
    p.add_argument("--chunk-tokens", type=Whole(1), default=32_768, help="tokens per chunk")
    p.add_argument("--passes", type=Whole(1), default=4, help="passes over each chunk")
    p.add_argument("--length", type=Whole(1), default=256, help="tokens per training window")
    p.add_argument("--batch-size", type=Whole(1), default=512)
    p.add_argument("--lr", type=POSITIVE, default=1e-3)
    p.add_argument("--seed", type=Whole(0), default=0)
    p.add_argument("--save-every", type=Whole(1), default=50, help="steps between saved training states")
    p.add_argument("--log-every", type=Whole(1), default=100, help="steps between log lines")
    p.add_argument("--max-steps", type=Whole(0), default=None, help="stop after this many steps in all (resumable)")
    p.add_argument("--threads", type=Whole(1), default=1, help="torch CPU threads")
    p.add_argument("--eval-windows", type=Whole(0), default=16, help="held-out windows for the quality (0: skip)")
    p.add_argument("--status", action="store_true", help="report an unfinished run's progress instead of training")
    p.add_argument("--ship", default=None, metavar="RUN_FOLDER",
                   help="instead of training: copy RUN_FOLDER's finished CLT in float16 to <checkpoint>/clt")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    import json

    from sprout_interp.core.hooked import load_hooked
    from sprout_interp.features.clt import clt_folder, load_clt, save_clt
    from sprout_interp.features.clt_metrics import clt_quality, clt_replacement_quality

    m = load_hooked(a.model)
    if a.ship:
        clt = load_clt(m, a.ship)
        dest = Path(a.out) if a.out else clt_folder(m)
        save_clt(clt, dest, torch.float16)
        size = sum(f.stat().st_size for f in dest.iterdir())
        print(f"shipped the CLT of {m.name} to {dest} in float16 ({size / 1e6:.1f} MB)")
        return 0
    if not a.out:
        p.error("--out RUN_FOLDER is needed (e.g. runs/clt/sprout)")
    out = Path(a.out)
    if a.status:
        if (out / "config.yaml").is_file() and not (out / STATE_FILE).is_file():
            print(f"{out}: finished; {json.dumps(load_clt(m, out).info.get('quality'))}")
            return 0
        clt = clt_from_state(m, out)
        t = clt.info["training"]
        print(f"{out}: step {t['steps']}/{t['total_steps']} ({t['steps'] * t['batch_size']:,} tokens)", flush=True)
        if a.eval_windows:
            print(clt_quality(m, clt, n=a.eval_windows).to_string(index=False))
        return 0
    if (out / "config.yaml").is_file() and not (out / STATE_FILE).is_file():
        print(f"{out} holds a finished CLT: nothing to do (--status shows its quality)")
        return 0
    try:
        clt, st = train_clt(m, out, d_transcoder=a.d_transcoder or a.expansion * m.cfg.d_model, k=a.k,
                            chunks=a.chunks, chunk_tokens=a.chunk_tokens, passes=a.passes, length=a.length,
                            batch_size=a.batch_size, lr=a.lr, seed=a.seed, save_every=a.save_every,
                            log_every=a.log_every, max_steps=a.max_steps)
    except RunFolderBusyError as e:
        print(e, flush=True)
        return BUSY
    print(f"{st.steps}/{st.total_steps} steps ({st.tokens_seen:,} tokens), this call {st.seconds:.0f}s "
          f"({st.tokens_per_s:,.0f} tokens/s); nmse per layer {[round(v, 3) for v in st.nmse]}; dead {st.dead}",
          flush=True)
    if not clt.info["finished"]:
        print(f"stopped at step {st.steps} (--max-steps); run the same command again to resume", flush=True)
        return 0
    if a.eval_windows:
        q = clt_quality(m, clt, n=a.eval_windows)
        clt.info["quality"] = q.to_dict(orient="records")
        clt.info["replacement"] = clt_replacement_quality(m, clt, n=a.eval_windows)
        print(q.to_string(index=False), "\n", clt.info["replacement"], flush=True)
    save_clt(clt, out)
    (out / STATE_FILE).unlink(missing_ok=True)
    print(f"saved the CLT to {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
