"""Path patching: one head's output changed (clean vs corrupted) only as it enters chosen heads' queries, keys or
values, every other part of the model seeing the run unchanged; and its first-order estimate from one forward and one
backward pass (edge attribution patching, Syed et al. 2023).

A sender is a head ``(layer, head)``; a receiver ``(layer, head, "q" | "k" | "v")``. So a previous-token head ->
induction head (keys) path measures exactly the composition the chapter describes. The runs, the metric and the
score are those of activation patching (:mod:`~sprout_interp.circuits.patch_runs`): 0 = the corrupted run's value,
1 = the clean run's.

Tables: ``layer`` (0-indexed), ``block`` (= layer + 1, the chapter's count), ``head``, ``heads``, ``value`` (the
metric, in its own units) and ``score``.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Literal, Optional, Union

import pandas as pd
import torch
from torch import Tensor

from sprout_interp.circuits.gradients import metric_gradients
from sprout_interp.circuits.heads import heads_label
from sprout_interp.circuits.metrics import MetricLike, metric_from_read_logits, read_positions
from sprout_interp.circuits.patch_runs import bind_patch_metric, patch_endpoints
from sprout_interp.core.arguments import check_index
from sprout_interp.core.errors import MetricError, PatchingError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout, as_hooked, is_hooked

__all__ = ["Sender", "Receiver", "path_patch", "attribution_path_patch"]


Sender = tuple[int, int]
Receiver = tuple[int, int, str]


def _check_receivers(model: HookedSprout, receivers) -> list[Receiver]:
    """``receivers`` as ``(layer, head, "q" | "k" | "v")`` tuples of ints; PatchingError naming the bad one."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    form = f"a receiver is (layer, head, 'q' | 'k' | 'v') with layer 0..{L - 1}, head 0..{H - 1}"
    if isinstance(receivers, (str, bytes)) or not hasattr(receivers, "__iter__"):
        raise PatchingError(f"receivers is a list of receivers: {form}; got {receivers!r}")
    out = []
    for r in receivers:
        if not isinstance(r, (tuple, list)) or len(r) != 3 or r[2] not in ("q", "k", "v"):
            raise PatchingError(f"{form}; got {r!r}")
        out.append((check_index(r[0], "receivers layer", L, what=f"{form}; got {r!r}", error=PatchingError),
                    check_index(r[1], "receivers head", H, what=f"{form}; got {r!r}", error=PatchingError), r[2]))
    if not out:
        raise PatchingError("receivers is empty: name at least one (layer, head, 'q' | 'k' | 'v')")
    return out


def _check_sender(model: HookedSprout, s) -> Sender:
    """One sender head as a ``(layer, head)`` tuple of ints; PatchingError naming it otherwise."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    form = f"a sender is (layer, head) with layer 0..{L - 1}, head 0..{H - 1}; got {s!r}"
    if not isinstance(s, (tuple, list)) or len(s) != 2:
        raise PatchingError(form)
    return (check_index(s[0], "senders layer", L, what=form, error=PatchingError),
            check_index(s[1], "senders head", H, what=form, error=PatchingError))


def _check_path(model: HookedSprout, senders: Sequence[Sender], receivers: Sequence[Receiver]) -> None:
    if not receivers:
        raise PatchingError("receivers is empty: name at least one (layer, head, 'q' | 'k' | 'v')")
    first = min(r[0] for r in receivers)
    for s in senders:
        if s[0] >= first:
            raise PatchingError(
                f"sender {s} is not before every receiver (first receiver layer {first}): a path runs from an earlier "
                "layer to a later one"
            )


def _path_values(model: HookedSprout, base: Tensor, source: Tensor, metric, sender_sets: list[list[Sender]],
                 receivers: Sequence[Receiver], batched: bool) -> list[float]:
    """The metric for each set of senders, their changed output reaching only ``receivers``."""
    B, T = base.shape
    L = model.cfg.n_layers
    names = [act_name("z", l) for l in range(L)] + [act_name("resid_pre", l) for l in range(L)]
    _, bc = model.run_with_cache(base, names_filter=names, return_cache_object=False)
    _, sc = model.run_with_cache(source, names_filter=names, return_cache_object=False)
    W_O = model.W_O
    gpt = model.model
    first = min(r[0] for r in receivers)
    bound = bind_patch_metric(metric, base)
    read = read_positions(bound, T)

    def new_inputs(senders: list[Sender]) -> dict[tuple[int, str], Tensor]:
        """Per (receiver layer, q/k/v): the raw projections (B, T, head, d_head) with the senders' change added."""
        out = {}
        for l2 in sorted({r[0] for r in receivers}):
            delta = sum(((sc[act_name("z", l)][:, :, h] - bc[act_name("z", l)][:, :, h]) @ W_O[l, h]
                         for l, h in senders if l < l2), torch.zeros(B, T, model.cfg.d_model))
            blk = gpt.blocks[l2]
            q, k, v = blk.attn.heads(blk.norm1(bc[act_name("resid_pre", l2)] + delta))
            for kind, t in zip("qkv", (q, k, v)):
                out[(l2, kind)] = t.transpose(1, 2)  # (B, T, head, d_head), as the hooks see it
        return out

    def hooks_for(inputs: list[dict]) -> list:
        hooks = []
        for l2, kind in {(r[0], r[2]) for r in receivers}:
            heads = [r[1] for r in receivers if r[0] == l2 and r[2] == kind]
            new = torch.cat([inp[(l2, kind)] for inp in inputs])  # (n*B, T, head, d_head)

            def fn(act, hook, new=new, heads=heads):
                act = act.clone()
                act[:, :, heads] = new[:, :, heads]
                return act

            hooks.append((f"blocks.{l2}.attn.hook_{kind}", fn))
        return hooks

    values = []
    if batched:
        inputs = [new_inputs(s) for s in sender_sets]
        n = len(inputs)
        start = bc[act_name("resid_pre", first)].repeat(n, 1, 1)
        logits = model.run_with_hooks(start, start_at_layer=first, fwd_hooks=hooks_for(inputs))
        return metric_from_read_logits(bound, logits[:, read], read).tolist()
    for s in sender_sets:
        logits = model.run_with_hooks(base, fwd_hooks=hooks_for([new_inputs(s)]))
        values.append(float(metric_from_read_logits(bound, logits[:, read], read)[0]))
    return values


@torch.no_grad()
def path_patch(
    model,
    clean,
    corrupted,
    metric: MetricLike,
    receivers: Sequence[Receiver],
    senders: Optional[Sequence[Union[Sender, Sequence[Sender]]]] = None,
    direction: Literal["denoise", "noise"] = "denoise",
    method: Literal["fast", "naive"] = "fast",
) -> pd.DataFrame:
    """Path patching: each sender head's change, clean vs corrupted, let through only to ``receivers``.

    A sender's output (its ``hook_z`` through ``W_O``) changes to the other run's, but only as the
    receivers read it: their queries, keys or values (``(layer, head, "q" | "k" | "v")``) are
    recomputed from the stream of the run being patched plus that change, and every other part of
    the model sees the run unchanged. So a previous-token head -> induction head (keys) path
    measures exactly the composition the chapter describes.

    Args:
        senders: heads ``(layer, head)`` to try, one at a time, or lists of heads to patch together
            (one row each); default every head in a layer before the first receiver.
        direction, metric, clean, corrupted: as in :func:`activation_patch`.
        method: "fast" runs every sender in one batched forward from the first receiver's layer;
            "naive" one full forward per sender (the reference).

    Returns:
        One row per sender (or set of senders):

        | column | meaning |
        |---|---|
        | ``layer``, ``block``, ``head`` | the sender (the set's first head): layer 0-indexed, block = layer + 1 |
        | ``heads`` | the set, ``"block B head H + ..."`` |
        | ``value`` | the metric with that path patched, in the metric's units |
        | ``score`` | ``(value - corrupted) / (clean - corrupted)``: 0 = the corrupted run, 1 = the clean run |

        ``df.attrs`` holds ``clean``, ``corrupted``, ``receivers`` and ``direction``.
    """
    model = as_hooked(model)
    receivers, sets, clean_v, corrupt_v, name, base, source = _path_setup(
        model, clean, corrupted, metric, receivers, senders, direction)
    with model.lock:  # the user-hook check sees this caller's hooks only (as in activation_patch)
        user_hooks = any(is_hooked(hp) for hp in model.hook_dict.values())
        vals = _path_values(model, base, source, metric, sets, receivers, batched=method == "fast" and not user_hooks)
    return _path_table(sets, vals, clean_v, corrupt_v, receivers=receivers, direction=direction, metric=name,
                       method="exact")


def _path_setup(model: HookedSprout, clean, corrupted, metric, receivers, senders, direction: str):
    """Path patching's arguments checked: ``(receivers, sender sets, clean value, corrupted value, metric name,
    base ids, source ids)``; senders default to every head before the first receiver's layer, one set each."""
    receivers = _check_receivers(model, receivers)
    if senders is None:
        first = min((r[0] for r in receivers), default=0)
        senders = [(l, h) for l in range(first) for h in range(model.cfg.n_heads)]
    if isinstance(senders, (str, bytes)) or not hasattr(senders, "__iter__"):
        raise PatchingError(f"senders is a list of (layer, head) heads, or of lists of heads; got {senders!r}")
    one = lambda s: isinstance(s, (tuple, list)) and len(s) == 2 and not any(isinstance(x, (tuple, list)) for x in s)  # noqa: E731
    sets = [[_check_sender(model, s)] if one(s) else [_check_sender(model, x) for x in s] if isinstance(s, (tuple, list))
            else [_check_sender(model, s)] for s in senders]
    _check_path(model, [h for st in sets for h in st], receivers)
    if not sets or not all(sets):
        raise PatchingError("no senders: the receivers are in the first layer, which no head precedes")
    clean_t, corrupt_t, clean_v, corrupt_v, name = patch_endpoints(model, clean, corrupted, metric, direction)
    base, source = (corrupt_t, clean_t) if direction == "denoise" else (clean_t, corrupt_t)
    return receivers, sets, clean_v, corrupt_v, name, base, source


def _path_table(sets, vals, clean_v: float, corrupt_v: float, **attrs) -> pd.DataFrame:
    df = pd.DataFrame([dict(layer=st[0][0], block=st[0][0] + 1, head=st[0][1],
                            heads=heads_label(st, with_layer=False),
                            value=v, score=(v - corrupt_v) / (clean_v - corrupt_v)) for st, v in zip(sets, vals)])
    df.attrs.update(clean=clean_v, corrupted=corrupt_v, **attrs,
                    convention="layer 0-indexed; block = layer + 1; score 0 = corrupted, 1 = clean")
    return df


def attribution_path_patch(model, clean, corrupted, metric: MetricLike, receivers: Sequence[Receiver],
                           senders: Optional[Sequence[Union[Sender, Sequence[Sender]]]] = None,
                           direction: Literal["denoise", "noise"] = "denoise") -> pd.DataFrame:
    """Path patching to first order: every sender's path to ``receivers`` estimated from one forward and one
    backward pass (edge attribution patching, Syed et al. 2023).

    For a sender set, its change ``Δ`` (each sender's ``hook_z`` difference through ``W_O``) is carried into each
    receiver's query, key or value input by the derivative of that input (ln1 then the projection) at the run
    being patched, ``d input = J · Δ`` (forward-mode autodiff), and met by the metric's gradient there:
    ``value ≈ run + Σ grad · (J · Δ)``. It is the derivative of :func:`path_patch`'s value along ``t · Δ`` at
    ``t = 0`` (the tests check it by central differences); use it to rank many senders and confirm the top ones
    exactly.

    Returns:
        :func:`path_patch`'s table (``layer, block, head, heads, value, score``) with estimated values;
        ``attrs["method"]`` is ``"attribution"``, ``attrs["run_value"]`` the metric the gradient was taken at.
    """
    model = as_hooked(model)
    receivers, sets, clean_v, corrupt_v, name, base, source = _path_setup(
        model, clean, corrupted, metric, receivers, senders, direction)
    layers2 = sorted({r[0] for r in receivers})
    z_names = [act_name("z", l) for l in range(layers2[-1])]
    inputs = sorted({(r[0], r[2]) for r in receivers})
    with torch.no_grad():
        _, src = model.run_with_cache(source, names_filter=z_names, return_cache_object=False)
    names = [act_name(kind, l2) for l2, kind in inputs] + z_names + [act_name("resid_pre", l2) for l2 in layers2]
    try:
        # the receivers' own inputs cut from the stream: path patching recomputes them from the run and the senders'
        # change only, so no other path (an earlier receiver's effect on a later one, say) may reach them
        frozen = {act_name(kind, l2): [r[1] for r in receivers if r[0] == l2 and r[2] == kind] for l2, kind in inputs}
        run_v, acts, grads = metric_gradients(model, base, names, bind_patch_metric(metric, base), frozen=frozen)
    except MetricError as e:
        raise PatchingError(str(e)) from None
    W_O = model.W_O.detach()
    vals = []
    for st in sets:
        total = 0.0
        for l2 in layers2:
            before = [(l, h) for l, h in st if l < l2]
            if not before:
                continue
            delta = sum((src[act_name("z", l)][:, :, h] - acts[act_name("z", l)][:, :, h]) @ W_O[l, h] for l, h in before)
            blk, x = model.model.blocks[l2], acts[act_name("resid_pre", l2)]
            with torch.no_grad(), warnings.catch_warnings():
                # torch.func's own use of torch.jit.script warns on every call; nothing for a user to change
                warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*deprecated", category=DeprecationWarning)
                _, tangents = torch.func.jvp(lambda d: blk.attn.heads(blk.norm1(x + d)), (torch.zeros_like(x),), (delta,))
            for kind, t in zip("qkv", tangents):
                heads = [r[1] for r in receivers if r[0] == l2 and r[2] == kind]
                if heads:  # t: (batch, head, pos, d_head); the hooks see (batch, pos, head, d_head)
                    total += float((grads[act_name(kind, l2)][:, :, heads] * t.transpose(1, 2)[:, :, heads]).double().sum())
        vals.append(run_v + total)
    return _path_table(sets, vals, clean_v, corrupt_v, receivers=receivers, direction=direction, metric=name,
                       method="attribution", run_value=run_v)
