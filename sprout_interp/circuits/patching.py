"""Activation patching: where in the model the information that decides a prediction lives.

Two inputs of the same length, *clean* and *corrupted*, differ in one detail (a name that appeared
before, and the same text with that first occurrence renamed). One activation is copied from one
run into the other and the model is run on: *denoising* (the default) patches a clean activation
into the corrupted run and asks how much of the clean behaviour comes back; *noising* patches a
corrupted activation into the clean run and asks how much is lost. ``score`` normalises the
metric: 0 = the corrupted run's value, 1 = the clean run's, in both directions.

What can be patched (``site``) and how it is split (``by``):

============================================  =======================  ==================================
site                                          hook                     by
============================================  =======================  ==================================
``resid_pre`` / ``resid_mid`` / ``resid_post``  ``blocks.{l}.hook_...``  ``"layer_pos"`` (default), ``"layer"``
``attn_out`` / ``mlp_out``                    ``blocks.{l}.hook_...``  ``"layer_pos"``, ``"layer"``
``z`` (each head's output, before W_O)        ``blocks.{l}.attn.hook_z``  ``"head"`` (all positions), ``"head_pos"``
``q`` / ``k`` / ``v`` / ``pattern``            ``blocks.{l}.attn.hook_...``  ``"head"`` (all positions)
============================================  =======================  ==================================

Exact and fast: everything before the patched layer is taken from the run being patched (never
recomputed); a patch at position ``p`` changes nothing before ``p`` (attention is causal), so the
later blocks run only from ``p`` on, reading the earlier positions' keys and values from that run; a patch
that copies an activation equal to the run's own (every position before the texts first differ, say) is
that run's value without running anything;
the logits are computed only where the metric reads; and every position (or head) of a layer runs
in one batched forward. The result equals one full forward per patch with a hook, the loop that
``transformer_lens.patching`` runs (the tests check both to 1e-5). With a hook of the user's own on
the model, every patch runs that full forward instead, so the hook is honoured.

:func:`attribution_patch` estimates the same table to first order from one forward and one backward pass
(``(source - run) . gradient`` over each patch's slice, through ``circuits.gradients``); :func:`patching_agreement`
puts an exact table beside its estimate. Path patching is :mod:`~sprout_interp.circuits.path_patching`'s (its two
functions are imported here, so ``si.patching`` is one namespace for every patching method); the runs, the metric and
the score both share are :mod:`~sprout_interp.circuits.patch_runs`'s.

Tables: ``layer`` (0-indexed as in code), ``block`` (= layer + 1, the chapter's count), ``head``,
``pos`` (0-based input index), ``value`` (the metric, in its own units) and ``score``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Optional

import pandas as pd
import torch
from torch import Tensor

from sprout_interp.circuits.gradients import metric_gradients
from sprout_interp.circuits.metrics import (
    LogitDiff,
    LogProb,
    Loss,
    MetricLike,
    TargetLogProb,
    metric_from_read_logits,
    read_positions,
)
from sprout_interp.circuits.patch_runs import bind_patch_metric, patch_endpoints
from sprout_interp.circuits.path_patching import attribution_path_patch, path_patch  # si.patching.path_patch
from sprout_interp.core.attention_maths import attend, attention_output, rotate, rotated_qkv
from sprout_interp.core.errors import MetricError, PatchingError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout, as_hooked, is_hooked

__all__ = [
    "PatchingError", "LogitDiff", "LogProb", "Loss", "TargetLogProb", "activation_patch", "naive_patch", "SITES", "patch_macs",
    "path_patch", "attribution_patch", "attribution_path_patch", "patching_agreement",
]

Site = Literal["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "q", "k", "v", "pattern"]
By = Literal["layer_pos", "layer", "head", "head_pos"]
SITES: dict[str, tuple[str, ...]] = {
    "resid_pre": ("layer_pos", "layer"), "resid_mid": ("layer_pos", "layer"), "resid_post": ("layer_pos", "layer"),
    "attn_out": ("layer_pos", "layer"), "mlp_out": ("layer_pos", "layer"),
    "z": ("head", "head_pos"), "q": ("head",), "k": ("head",), "v": ("head",), "pattern": ("head",),
}
_CHUNK = 16  # patches per batched forward: each chunk runs from its first patched position on


def _check_site(site: str, by: str) -> None:
    if site not in SITES:
        raise PatchingError(f"site must be one of {', '.join(SITES)}; got {site!r}")
    if by not in SITES[site]:
        raise PatchingError(f"site {site!r} is patched by {' or '.join(repr(b) for b in SITES[site])}, not {by!r}")


def _patches(model: HookedSprout, site: str, by: str, T: int) -> list[tuple[int, Optional[int], Optional[int]]]:
    """Every (layer, head or None, pos or None) to patch, layer-major."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    if by == "layer_pos":
        return [(l, None, p) for l in range(L) for p in range(T)]
    if by == "layer":
        return [(l, None, None) for l in range(L)]
    if by == "head":
        return [(l, h, None) for l in range(L) for h in range(H)]
    return [(l, h, p) for l in range(L) for p in range(T) for h in range(H)]


# --------------------------------------------------------------------------------------------
# the naive loop: one full forward with one hook per patch (the reference the fast path equals)


def _setter(site: str, head: Optional[int], pos: Optional[int], src: Tensor) -> Callable:
    def hook(act: Tensor, hook) -> Tensor:
        act = act.clone()
        if site == "pattern":  # (batch, head, query, key)
            act[:, head] = src[:, head]
        elif head is None and pos is None:
            act[:] = src
        elif head is None:
            act[:, pos] = src[:, pos]
        elif pos is None:
            act[:, :, head] = src[:, :, head]
        else:
            act[:, pos, head] = src[:, pos, head]
        return act

    return hook


@torch.no_grad()
def naive_patch(model, clean, corrupted, metric: MetricLike, site: Site = "resid_pre", by: By = "layer_pos",
                direction: Literal["denoise", "noise"] = "denoise") -> pd.DataFrame:
    """The same table as :func:`activation_patch`, from one full forward with a hook per patch (slow; the reference)."""
    return activation_patch(model, clean, corrupted, metric, site, by, direction, method="naive")


def _naive_values(model, base, src_cache, metric, site, patches) -> list[float]:
    bound = bind_patch_metric(metric, base)
    read = read_positions(bound, base.shape[1])
    out = []
    for l, h, p in patches:
        name = act_name(site, l)
        logits = model.run_with_hooks(base, fwd_hooks=[(name, _setter(site, h, p, src_cache[name]))])
        out.append(float(metric_from_read_logits(bound, logits[:, read], read)[0]))
    return out


# --------------------------------------------------------------------------------------------
# the fast path


class _Run:
    """What the fast path reads from the run being patched: per layer the stream and each head's keys and values."""

    def __init__(self, model: HookedSprout, tokens: Tensor, site: str):
        L = model.cfg.n_layers
        want = {"hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_rot_k", "attn.hook_v", "attn.hook_z"}
        if site in ("q", "k", "v", "pattern"):
            want |= {"attn.hook_rot_q"}
        names = {f"blocks.{l}.{w}" for l in range(L) for w in want}
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names, return_cache_object=False)
        self.logits = logits
        self.cache = cache
        self.k = [cache[act_name("rot_k", l)].transpose(1, 2) for l in range(L)]  # (batch, head, pos, d_head)
        self.v = [cache[act_name("v", l)].transpose(1, 2) for l in range(L)]

    def __getitem__(self, name: str) -> Tensor:
        return self.cache[name]


def _attention(blk, x: Tensor, run: _Run, l: int, s0: int, n: int, cos: Tensor, sin: Tensor) -> Tensor:
    """Block ``l``'s attention output for positions ``s0..`` of ``n`` patched copies; earlier keys/values from ``run``."""
    q, k, v = rotated_qkv(blk, x, cos, sin)
    if s0:
        k = torch.cat((run.k[l][:, :, :s0].repeat(n, 1, 1, 1), k), 2)
        v = torch.cat((run.v[l][:, :, :s0].repeat(n, 1, 1, 1), v), 2)
    return attention_output(blk, attend(q, k, v))


def _finish(model: HookedSprout, run: _Run, x: Tensor, layer: int, stage: str, s0: int, n: int,
            read: list[int]) -> Tensor:
    """Logits at ``read`` for ``n`` copies of the stream ``x`` (positions ``s0..``) entering ``layer`` at ``stage``.

    ``stage``: "pre" (x is resid_pre of ``layer``), "mid" (resid_mid: only the feed-forward of ``layer``
    is left), "post" (resid_post of ``layer``). Positions before ``s0`` keep ``run``'s logits.
    """
    gpt = model.model
    T = run.logits.shape[1]
    cos, sin = gpt.cos[s0:T], gpt.sin[s0:T]
    first = layer + 1 if stage == "post" else layer
    for l in range(first, model.cfg.n_layers):
        blk = gpt.blocks[l]
        if not (l == layer and stage == "mid"):
            x = x + _attention(blk, x, run, l, s0, n, cos, sin)
        x = x + blk.ffn(blk.norm2(x))
    late = [r for r in read if r >= s0]
    out = run.logits[:, read].repeat(n, 1, 1)
    if late:
        idx = [read.index(r) for r in late]
        out[:, idx] = gpt.head(gpt.norm(x[:, [r - s0 for r in late]]))
    return out


def _head_z(model: HookedSprout, run: _Run, src: dict, site: str, l: int, heads: list[int]) -> Tensor:
    """Block ``l``'s hook_z with one head per copy recomputed from ``src``'s q, k, v or pattern: (n*B, pos, head, d_head)."""
    blk = model.model.blocks[l]
    B, T = run.logits.shape[:2]
    z = run[act_name("z", l)].repeat(len(heads), 1, 1, 1)
    cos, sin = model.model.cos[:T], model.model.sin[:T]
    for i, h in enumerate(heads):
        rows = slice(i * B, (i + 1) * B)
        q = run[act_name("rot_q", l)][:, :, h]  # (B, T, d_head)
        k = run.k[l][:, h]  # (B, T, d_head)
        v = run.v[l][:, h]
        s = src[act_name(site, l)]
        if site == "q":
            q = rotate(blk.attn.q_norm, s[:, :, h], cos, sin)
        elif site == "k":
            k = rotate(blk.attn.k_norm, s[:, :, h], cos, sin)
        elif site == "v":
            v = s[:, :, h]
        if site == "pattern":
            y = torch.matmul(s[:, h], v)
        else:
            y = attend(q[:, None], k[:, None], v[:, None])[:, 0]
        z[rows, :, h] = y
    return z


def _fast_values(model: HookedSprout, base: Tensor, src_tokens: Tensor, metric, site: str, by: str,
                 patches) -> list[float]:
    B, T = base.shape
    L = model.cfg.n_layers
    run = _Run(model, base, site)
    names = [act_name(site, l) for l in range(L)]
    _, src = model.run_with_cache(src_tokens, names_filter=names, return_cache_object=False)
    bound = bind_patch_metric(metric, base)
    read = read_positions(bound, T)
    unpatched = float(metric_from_read_logits(bound, run.logits[:, read], read)[0])  # the run being patched, as it is
    gpt = model.model
    values: dict[tuple, float] = {}
    for l in range(L):
        mine = [pt for pt in patches if pt[0] == l]
        if not mine:
            continue
        s_act = src[names[l]]
        if site == "z":  # a head whose copied output equals the run's own changes nothing: the run's value, exactly
            own = run[names[l]]
            live = []
            for pt in mine:
                _, h, p = pt
                same = torch.equal(s_act[:, :, h], own[:, :, h]) if p is None else torch.equal(s_act[:, p, h], own[:, p, h])
                if same:
                    values[pt] = unpatched
                else:
                    live.append(pt)
            mine = live
        if site in ("z", "q", "k", "v", "pattern"):
            chunks = [mine] if mine else []
            if by == "head_pos":  # one batched forward per _CHUNK patches, all heads, from the first one's position on
                mine, step = sorted(mine, key=lambda pt: (pt[2], pt[1])), _CHUNK * model.cfg.n_heads
                chunks = [mine[i : i + step] for i in range(0, len(mine), step)]
            for chunk in chunks:
                n = len(chunk)
                s0 = min(pt[2] for pt in chunk) if by == "head_pos" else 0
                if site == "z":
                    z = run[names[l]][:, s0:].repeat(n, 1, 1, 1)
                    for i, (_, h, p) in enumerate(chunk):
                        rows = slice(i * B, (i + 1) * B)
                        if p is None:
                            z[rows, :, h] = s_act[:, s0:, h]
                        else:
                            z[rows, p - s0, h] = s_act[:, p, h]
                else:
                    z = _head_z(model, run, src, site, l, [pt[1] for pt in chunk])
                attn = gpt.blocks[l].attn.proj(z.reshape(n * B, T - s0, -1))
                x = run[act_name("resid_pre", l)][:, s0:].repeat(n, 1, 1) + attn
                logits = _finish(model, run, x, l, "mid", s0, n, read)
                for pt, v in zip(chunk, metric_from_read_logits(bound, logits, read).tolist()):
                    values[pt] = v
            continue
        # stream sites: resid_pre / resid_mid / resid_post / attn_out / mlp_out
        stage = {"resid_pre": "pre", "resid_mid": "mid", "attn_out": "mid"}.get(site, "post")
        start = {"pre": "hook_resid_pre", "mid": "hook_resid_mid", "post": "hook_resid_post"}[stage]
        stream = run[f"blocks.{l}.{start}"]
        if site == "attn_out":
            new = run[act_name("resid_pre", l)] + s_act
        elif site == "mlp_out":
            new = run[act_name("resid_mid", l)] + s_act
        else:
            new = s_act
        noop = (new == stream).all(-1).all(0)  # (pos,): the copied stream equals the run's own there
        if by == "layer":
            if bool(noop.all()):
                values[mine[0]] = unpatched
                continue
            logits = _finish(model, run, new, l, stage, 0, 1, read)
            values[mine[0]] = float(metric_from_read_logits(bound, logits, read)[0])
            continue
        for pt in mine:  # before the texts first differ, and wherever the stream is the same: no change, exactly
            if bool(noop[pt[2]]):
                values[pt] = unpatched
        live = sorted((pt for pt in mine if not bool(noop[pt[2]])), key=lambda pt: pt[2])
        for chunk in (live[i : i + _CHUNK] for i in range(0, len(live), _CHUNK)):
            c0 = chunk[0][2]
            n = len(chunk)
            x = stream[:, c0:].repeat(n, 1, 1)
            for i, (_, _, p) in enumerate(chunk):
                x[i * B : (i + 1) * B, p - c0] = new[:, p]
            logits = _finish(model, run, x, l, stage, c0, n, read)
            for pt, v in zip(chunk, metric_from_read_logits(bound, logits, read).tolist()):
                values[pt] = v
    return [values[pt] for pt in patches]


# --------------------------------------------------------------------------------------------
# entry point


@torch.no_grad()
def activation_patch(
    model,
    clean,
    corrupted,
    metric: MetricLike,
    site: Site = "resid_pre",
    by: By = "layer_pos",
    direction: Literal["denoise", "noise"] = "denoise",
    method: Literal["fast", "naive"] = "fast",
) -> pd.DataFrame:
    """Patch one activation at a time between the clean and the corrupted run; one row per patch.

    Args:
        model: a HookedSprout (``si.load(...)``) or a ``sprout_model.GPT``.
        clean, corrupted: texts, lists of texts or token ids of the same shape (a batch is averaged).
        metric: one number per run, measured after each patch (the metrics of ``sprout_interp.circuits.metrics``):

            | metric | value, in its units |
            |---|---|
            | :class:`LogitDiff` ``(answer, wrong, pos=-1)`` | ``logit[answer] - logit[wrong]`` at ``pos`` (nats of log-odds) |
            | :class:`LogProb` ``(target, pos=-1)`` | ``log p(target)`` at ``pos`` (nats) |
            | :class:`TargetLogProb` ``(positions, targets)`` | mean ``log p`` of several (position, target) pairs (nats) |
            | :class:`Loss` ``()`` or ``"loss"`` | mean next-token loss (nats/token) |
            | ``"copying"``, ``"copying_ratio"`` | loss on a repeated sequence's second copy; its ratio to the first |
            | a function of the logits ``(batch, pos, vocab)`` | the scalar it returns (TransformerLens's form) |

            A negative ``pos`` counts from each text's own last real token.
        site: the activation patched, at every layer:

            | site | hook | what it holds | ``by`` |
            |---|---|---|---|
            | ``"resid_pre"`` (default) | ``blocks.{l}.hook_resid_pre`` | the stream entering block l | ``"layer_pos"``, ``"layer"`` |
            | ``"resid_mid"`` | ``blocks.{l}.hook_resid_mid`` | the stream between attention and feed-forward | ``"layer_pos"``, ``"layer"`` |
            | ``"resid_post"`` | ``blocks.{l}.hook_resid_post`` | the stream leaving block l | ``"layer_pos"``, ``"layer"`` |
            | ``"attn_out"`` | ``blocks.{l}.hook_attn_out`` | the attention's output | ``"layer_pos"``, ``"layer"`` |
            | ``"mlp_out"`` | ``blocks.{l}.hook_mlp_out`` | the feed-forward's output | ``"layer_pos"``, ``"layer"`` |
            | ``"z"`` | ``blocks.{l}.attn.hook_z`` | each head's output, before ``W_O`` | ``"head"``, ``"head_pos"`` |
            | ``"q"``, ``"k"``, ``"v"`` | ``blocks.{l}.attn.hook_q`` ... | a head's query, key, value (before QK-norm and RoPE) | ``"head"`` |
            | ``"pattern"`` | ``blocks.{l}.attn.hook_pattern`` | a head's attention pattern | ``"head"`` |
        by: how a site is split into patches: ``"layer_pos"`` (default) one layer at one position, ``"layer"`` one
            layer at every position, ``"head"`` one head at every position, ``"head_pos"`` one head at one
            position; which splits a site takes is in the table above (another pair is a ``PatchingError``).
        direction: ``"denoise"`` (default) patches clean activations into the corrupted run: what is *sufficient*
            to bring the clean behaviour back; ``"noise"`` patches corrupted activations into the clean run: what is
            *necessary* to keep it.
        method: ``"fast"`` (default) takes everything before the patched layer and position from the run being
            patched and batches a layer's patches, exact; ``"naive"`` runs one full forward with a hook per patch
            (the reference; it is what runs whenever a hook of your own is on the model, so that it is honoured).

    Returns:
        One row per patch:

        | column | meaning |
        |---|---|
        | ``layer`` | 0-indexed, as in hook names |
        | ``block`` | ``layer + 1``, the chapter's count |
        | ``head`` | the head (head sites only) |
        | ``pos`` | the patched position, 0-based (``by="layer_pos"`` or ``"head_pos"`` only) |
        | ``token`` | the clean token at ``pos`` |
        | ``value`` | the metric after the patch, in the metric's units |
        | ``score`` | ``(value - corrupted) / (clean - corrupted)``: 0 = the corrupted run, 1 = the clean run |

        ``df.attrs`` holds ``clean`` and ``corrupted`` (the metric on each run), ``site``, ``by``, ``direction``,
        ``metric`` and the convention.
    """
    model = as_hooked(model)
    _check_site(site, by)
    clean_t, corrupt_t, clean_v, corrupt_v, name = patch_endpoints(model, clean, corrupted, metric, direction)
    base, source = (corrupt_t, clean_t) if direction == "denoise" else (clean_t, corrupt_t)
    patches = _patches(model, site, by, clean_t.shape[1])
    if method not in ("fast", "naive"):
        raise PatchingError(f"method must be 'fast' or 'naive', got {method!r}")
    # Under the model's lock, so the user-hook check sees this caller's hooks only: another thread's caching
    # hooks, attached for the length of its own run, would otherwise send this one down the naive path.
    with model.lock:
        user_hooks = any(is_hooked(hp) for hp in model.hook_dict.values())
        if method == "naive" or user_hooks:
            names = [act_name(site, l) for l in range(model.cfg.n_layers)]
            _, src = model.run_with_cache(source, names_filter=names, return_cache_object=False)
            vals = _naive_values(model, base, src, metric, site, patches)
        else:
            vals = _fast_values(model, base, source, metric, site, by, patches)
    return _table(model, clean_t, patches, vals, clean_v, corrupt_v, site=site, by=by, direction=direction,
                  metric=name, method="exact")


def _table(model: HookedSprout, clean_t: Tensor, patches, vals, clean_v: float, corrupt_v: float, **attrs) -> pd.DataFrame:
    """One row per patch: ``layer, block[, head][, pos, token], value, score``."""
    rows = []
    str_toks = model.to_str_tokens(clean_t[0]) if model.tokenizer is not None else [f"#{i}" for i in clean_t[0].tolist()]
    for (l, h, p), v in zip(patches, vals):
        r = {"layer": l, "block": l + 1}
        if h is not None:
            r["head"] = h
        if p is not None:
            r["pos"] = p
            r["token"] = str_toks[p]
        r["value"] = v
        r["score"] = (v - corrupt_v) / (clean_v - corrupt_v)
        rows.append(r)
    df = pd.DataFrame(rows)
    df.attrs.update(clean=clean_v, corrupted=corrupt_v, **attrs,
                    convention="layer 0-indexed; block = layer + 1; pos 0-based input index; score 0 = corrupted, 1 = clean")
    return df


def attribution_patch(model, clean, corrupted, metric: MetricLike, site: Site = "resid_pre", by: By = "layer_pos",
                      direction: Literal["denoise", "noise"] = "denoise") -> pd.DataFrame:
    """Attribution patching: every patch of :func:`activation_patch` estimated at once, to first order.

    The metric after patching a slice of an activation is estimated as the run's own value plus
    ``(source - run) . d metric / d activation`` over that slice, the gradient taken once on the run
    being patched (Nanda's attribution patching; Syed et al. 2023): one forward and one backward pass
    for every layer, head and position together, where exact patching runs the model once per patch.
    It is exact for a metric linear in the patched activation and a guide elsewhere: a large change
    (a whole token's embedding at ``resid_pre`` of layer 0, a head that saturates) can be far from its
    estimate, so check the rows that matter with :func:`activation_patch` (the dashboard shows both).

    Args: as :func:`activation_patch` (no ``method``: there is one computation).

    Returns:
        The same table as :func:`activation_patch`: ``layer``, ``block``, ``head`` (head sites), ``pos``,
        ``token``, ``value`` (the estimated metric after the patch, in the metric's units) and ``score``
        ((value - corrupted) / (clean - corrupted), from the estimate); ``df.attrs["method"]`` is
        ``"attribution"`` and ``df.attrs["run_value"]`` the metric the gradient was taken at (the unpatched
        run: ``corrupted`` when denoising).
    """
    model = as_hooked(model)
    _check_site(site, by)
    clean_t, corrupt_t, clean_v, corrupt_v, name = patch_endpoints(model, clean, corrupted, metric, direction)
    base, source = (corrupt_t, clean_t) if direction == "denoise" else (clean_t, corrupt_t)
    names = [act_name(site, l) for l in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, src = model.run_with_cache(source, names_filter=names, return_cache_object=False)
    try:
        run_v, acts, grads = metric_gradients(model, base, names, bind_patch_metric(metric, base))
    except MetricError as e:
        raise PatchingError(str(e)) from None
    per_layer = [((src[n].to(acts[n].dtype) - acts[n]) * grads[n]).double() for n in names]
    vals = []
    for l, h, p in _patches(model, site, by, clean_t.shape[1]):
        d = per_layer[l]  # (batch, pos, d) | (batch, pos, head, d_head) | pattern (batch, head, query, key)
        if site == "pattern":
            part = d[:, h]
        elif h is None and p is None:
            part = d
        elif h is None:
            part = d[:, p]
        elif p is None:
            part = d[:, :, h]
        else:
            part = d[:, p, h]
        vals.append(run_v + float(part.sum()))
    return _table(model, clean_t, _patches(model, site, by, clean_t.shape[1]), vals, clean_v, corrupt_v, site=site,
                  by=by, direction=direction, metric=name, method="attribution", run_value=run_v)


def patch_macs(cfg, seq_len: int, site: str = "resid_pre", by: str = "layer_pos", read: int = 1) -> dict[str, float]:
    """Multiply-adds of the naive loop (one full forward per patch) and of the fast path, and their ratio.

    ``cfg`` is a HookedSproutConfig (``n_layers``, ``d_model``, ``d_mlp``, ``d_vocab``, ``n_heads``);
    a block costs ``4·d² + 3·d·d_mlp`` per position plus ``2·d`` per (query, key) pair, the
    unembedding ``d·d_vocab`` per position the metric reads (the naive loop: every position). The
    fast path runs each patch from its layer and its chunk's first position on, and reads ``read``
    positions. Counts the stream sites and ``z``; the ratio is the floor a timing can approach.
    """
    L, d, f, V, T, H = cfg.n_layers, cfg.d_model, cfg.d_mlp, cfg.d_vocab, seq_len, cfg.n_heads
    block = 4 * d * d + 3 * d * f
    forward = T * L * block + L * d * T * (T + 1) + T * d * V  # the last term: the unembedding at every position
    n_patches = {"layer_pos": L * T, "layer": L, "head": L * H, "head_pos": L * T * H}[by]
    fast = 0.0
    for l in range(L):
        starts = [0] if by in ("layer", "head") else [(p // _CHUNK) * _CHUNK for p in range(T)]
        per_l = 1 if by in ("layer", "layer_pos") else H
        later = L - l if site in ("resid_pre", "z", "attn_out", "resid_mid") else L - l - 1
        for c0 in starts:
            S = T - c0
            fast += per_l * (later * (S * block + d * S * (S + 2 * c0 + 1)) + read * d * V)
    naive = n_patches * forward
    return {"naive": float(naive), "fast": fast, "ratio": fast / naive}


def patching_agreement(exact: pd.DataFrame, estimate: pd.DataFrame) -> pd.DataFrame:
    """Exact patching beside its attribution estimate, patch by patch.

    ``exact`` from :func:`activation_patch`, ``estimate`` from :func:`attribution_patch`, of the same inputs, site
    and split. Returns one row per patch: the patch's ``layer, block[, head][, pos, token]``, ``exact`` and
    ``estimate`` (scores, 0 = corrupted, 1 = clean) and ``error`` (estimate - exact); ``attrs``: ``r`` (Pearson
    correlation of the two scores over the patches), ``max_abs_error``, ``mean_abs_error`` (score units), ``site``,
    ``by``.
    """
    keys = [c for c in ("layer", "block", "head", "pos", "token") if c in exact.columns]
    if list(estimate.columns) != list(exact.columns) or len(exact) != len(estimate) or any(
            not exact[k].equals(estimate[k]) for k in keys) or any(
            exact.attrs.get(a) != estimate.attrs.get(a) for a in ("site", "by", "direction")):
        raise PatchingError("patching_agreement compares one activation_patch table with the attribution_patch table "
                            "of the same texts, site, by and direction")
    df = exact[keys].copy()
    df["exact"], df["estimate"] = exact["score"].to_numpy(), estimate["score"].to_numpy()
    df["error"] = df["estimate"] - df["exact"]
    a, b = torch.tensor(df["exact"].to_numpy()), torch.tensor(df["estimate"].to_numpy())
    r = float(torch.corrcoef(torch.stack([a, b]))[0, 1]) if len(df) > 1 and a.std() > 0 and b.std() > 0 else float("nan")
    df.attrs.update(r=r, max_abs_error=float(df["error"].abs().max()), mean_abs_error=float(df["error"].abs().mean()),
                    site=exact.attrs.get("site"), by=exact.attrs.get("by"), units="score: 0 = corrupted, 1 = clean")
    return df
