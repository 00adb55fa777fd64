"""Neuron pages, as Neuroscope and the LLM Transparency Tool show them: the feed-forward's own units.

A *neuron* of Sprout's SwiGLU feed-forward is one hidden unit: its activation is
``blocks.{layer}.mlp.hook_post[..., n] = silu(hook_pre[..., n]) * hook_pre_linear[..., n]`` and it writes
``activation * W_out[n]`` into the residual stream. Sprout has ``d_mlp`` of them per block (1,024 in Sprout, 512 in
gpt-1 and gpt-4). Unlike a GELU neuron's, a SwiGLU neuron's activation has both signs, and both write (with
opposite signs): every table here keeps the sign, and a page shows the strongest contexts of each sign.

:func:`index_neurons` runs the model once over a token sample (default: held-out windows) and keeps one layer's
activations at every token (dense: ``d_mlp`` numbers a token). From it:

- :func:`neuron_summary`: one neuron's page -- its strongest positive and negative contexts, the histogram of its
  activations, the tokens its output direction promotes and suppresses (``W_out[n] @ W_U``, read through the
  unembedding as the logit lens reads the stream: HookedSprout's ``W_U`` carries the final RMSNorm's gain, and
  the norm's division by the stream's scale, a positive number common to every token, is left out), the tokens
  it fires on and a short description;
- :func:`neuron_table`: every neuron's statistics in one DataFrame;
- :func:`neurons_for_token`: the neurons most selective for a token (the largest mean activation on it, in
  standard deviations of the neuron's activation over the sample).

:func:`neuron_attribution` ranks every neuron of every block by its direct effect on one prediction (the LLM
Transparency Tool's feed-forward view): ``hook_post[n] * W_out[n]`` through the final norm onto
``W_U[:, answer] - W_U[:, wrong]``, the ``by="neuron"`` split of
:func:`sprout_interp.circuits.attribution.direct_logit_attribution`, whose rows sum to the model's logit difference.
:func:`ablate_neurons` reruns the model with chosen neurons set to zero or to their mean, the causal check of what
a page suggests.

Conventions: ``layer`` 0-indexed as in hook names, ``block`` = layer + 1 (the chapter's count), ``neuron`` the
0-based index of the hidden unit in its layer, ``pos`` the 0-based input index; activations in the units of
``hook_post``, logit effects in logits per unit of activation, attributions in logits, losses in nats/token.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Optional, Union

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.circuits.attribution import TokenLike, direct_logit_attribution
from sprout_interp.circuits.metrics import MetricLike, bind_metric
from sprout_interp.core.arguments import check_count, check_index
from sprout_interp.core.errors import SproutError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import as_hooked
from sprout_interp.features.inputs import feature_input
from sprout_interp.features.metrics import held_out_tokens
from sprout_interp.features.pages import (
    describe,
    token_occurrences,
    top_contexts,
    unit_tables,
    value_histogram,
    vocabulary_strings,
)

__all__ = [
    "NeuronIndex", "NeuronSummary", "index_neurons", "neuron_acts", "neuron_logit_effects", "neuron_summary",
    "neuron_table", "neurons_for_token", "neuron_attribution", "ablate_neurons", "neuron_means", "neuron_on_text",
    "FIRE_AT",
]

FIRE_AT = 0.25  # a neuron "fires" where its activation exceeds this fraction of its largest on the sample

Neuron = tuple[int, int]  # (layer, neuron), both 0-based


def _check_layer(model, layer) -> int:
    return check_index(layer, "layer", as_hooked(model).cfg.n_layers, what="a layer of this model; block = layer + 1")


def _check_neuron(d_mlp: int, neuron) -> int:
    return check_index(neuron, "neuron", d_mlp, what="a neuron of this layer's feed-forward")


@dataclass
class NeuronIndex:
    """One layer's neuron activations at every token of a sample: ``acts`` ``(batch, pos, d_mlp)``.

    Attributes:
        tokens: the sample's token ids ``(batch, pos)``; ``mask`` True at real tokens (None: all real).
        layer: 0-indexed (block = layer + 1); ``hook_name`` the hook read (``blocks.{layer}.mlp.hook_post``).
        token_strings: one string per vocabulary id (for tables).
        notice: set when a text was cut to the context.
    """

    tokens: Int[Tensor, "batch pos"]
    acts: Float[Tensor, "batch pos d_mlp"]
    layer: int
    hook_name: str
    token_strings: list[str] = field(repr=False, default_factory=list)
    mask: Optional[Tensor] = None
    notice: Optional[str] = None

    @property
    def d_mlp(self) -> int:
        return int(self.acts.shape[-1])

    @property
    def block(self) -> int:
        return self.layer + 1

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.numel() if self.mask is None else self.mask.sum())

    def real(self) -> Float[Tensor, "n d_mlp"]:
        """The activations at the real tokens only, one row per token."""
        return self.acts.reshape(-1, self.d_mlp) if self.mask is None else self.acts[self.mask]


@torch.no_grad()
def index_neurons(
    model,
    layer: int,
    tokens=None,
    n: int = 96,
    length: int = 128,
    seed: int = 0,
    batch: int = 16,
) -> NeuronIndex:
    """Run the model over ``tokens`` (a text, texts or ids; default ``n`` held-out windows of ``length`` tokens,
    seed ``seed``) up to block ``layer + 1`` and record ``blocks.{layer}.mlp.hook_post`` at every token. A text
    longer than the context is cut (notice set)."""
    m = as_hooked(model)
    _check_layer(m, layer)
    notice = None
    if tokens is None:
        toks, mask = held_out_tokens(m, n=n, length=length, seed=seed).to(m.device), None
    else:
        toks, mask, notice = feature_input(m, tokens)
    name = act_name("post", layer)
    acts = []
    for i in range(0, toks.shape[0], batch):
        _, cache = m.run_with_cache(toks[i:i + batch], names_filter=name, stop_at_layer=layer + 1)
        acts.append(cache[name].float().cpu())
    a = torch.cat(acts)
    if mask is not None:
        a = a * mask.cpu()[..., None]
    return NeuronIndex(tokens=toks.cpu(), acts=a, layer=layer, hook_name=name, token_strings=vocabulary_strings(m),
                       mask=None if mask is None else mask.cpu(), notice=notice)


def neuron_acts(index: NeuronIndex, neuron: int) -> Float[Tensor, "batch pos"]:
    """One neuron's activation at every token of the index's sample (0 at padding)."""
    return index.acts[..., _check_neuron(index.d_mlp, neuron)]


def neuron_on_text(model, text: Union[str, Int[Tensor, " pos"], Int[Tensor, "1 pos"]], layer: int,
                   neuron: int) -> pd.DataFrame:
    """One neuron's activation at every token of one text: ``pos, token, activation`` (``hook_post``). A text
    longer than the context is cut (``attrs["notice"]`` says so)."""
    index = index_neurons(model, layer, text if not isinstance(text, str) else [text])
    if index.tokens.shape[0] != 1:
        raise SproutError("neuron_on_text reads one text; pass a string or ids of shape (1, pos)")
    acts = neuron_acts(index, neuron)[0]
    strings = index.token_strings
    df = pd.DataFrame({"pos": range(acts.shape[0]), "token": [strings[int(t)] for t in index.tokens[0]],
                       "activation": acts.tolist()})
    df.attrs.update(notice=index.notice, layer=layer, block=layer + 1, neuron=neuron, hook_name=index.hook_name)
    return df


def neuron_logit_effects(model, layer: int, neuron: int) -> Float[Tensor, " vocab"]:
    """``W_out[layer][neuron] @ W_U``: the logit each token gains per unit of the neuron's activation (see the module
    docstring for the norm convention)."""
    m = as_hooked(model)
    W_out = m.blocks[_check_layer(m, layer)].mlp.W_out
    _check_neuron(W_out.shape[0], neuron)
    with torch.no_grad():
        return (W_out[neuron] @ m.W_U).float().cpu()


@dataclass
class NeuronSummary:
    """One neuron's page (see the module docstring). ``layer`` 0-indexed (block = layer + 1), ``pos`` 0-based.

    Attributes:
        contexts / negative_contexts: the strongest positive / most negative activations, ``rank, seq, pos, token,
            activation, tokens (list of str), acts (list of float), center`` (``center``: the firing token's index
            inside ``tokens``).
        histogram: ``left, right, count`` over every activation on the sample.
        promoted / suppressed: ``rank, token, logit`` (logits per unit activation; a negative activation turns
            them round).
        top_tokens / top_previous: ``token, count, share, mean_act`` over the tokens of its strongest positive
            activations, and over the token before each.
        frequency: the share of tokens where it fires (activation above ``FIRE_AT`` of its largest on the sample).
    """

    neuron: int
    layer: int
    hook_name: str
    frequency: float
    max_activation: float
    min_activation: float
    mean_activation: float
    std_activation: float
    positive_share: float
    n_tokens: int
    contexts: pd.DataFrame
    negative_contexts: pd.DataFrame
    histogram: pd.DataFrame
    promoted: pd.DataFrame
    suppressed: pd.DataFrame
    top_tokens: pd.DataFrame
    top_previous: pd.DataFrame
    description: str

    @property
    def block(self) -> int:
        return self.layer + 1


def neuron_summary(
    model,
    layer: int,
    neuron: int,
    index: Optional[NeuronIndex] = None,
    n_contexts: int = 12,
    before: int = 12,
    after: int = 4,
    n_tokens: int = 10,
    bins: int = 40,
    top_for_tokens: int = 200,
) -> NeuronSummary:
    """The page of ``neuron`` in ``layer`` (see :class:`NeuronSummary`), from ``index`` (default
    :func:`index_neurons` on the held-out sample; pass one index to build many pages). ``top_for_tokens``: how many
    of its strongest positive activations the token tables and the description count."""
    m = as_hooked(model)
    _check_layer(m, layer)
    index = index_neurons(m, layer) if index is None else index
    if index.layer != layer:
        raise SproutError(f"the index was built for layer {index.layer}, not layer {layer}: index_neurons(model, {layer})")
    acts = neuron_acts(index, neuron)
    strings = index.token_strings
    flat = acts.flatten()
    real = flat if index.mask is None else flat[index.mask.flatten()]
    n_real = max(int(real.numel()), 1)
    hi, lo = (float(real.max()), float(real.min())) if real.numel() else (0.0, 0.0)
    valid = torch.ones_like(flat, dtype=torch.bool) if index.mask is None else index.mask.flatten()
    pos_order = torch.argsort(torch.where(valid, flat, -torch.inf), descending=True)[:max(n_contexts, top_for_tokens)]
    pos_order = pos_order[flat[pos_order] > 0]
    neg_order = torch.argsort(torch.where(valid, flat, torch.inf))[:n_contexts]
    neg_order = neg_order[flat[neg_order] < 0]
    t = unit_tables(acts, index.tokens, strings, index.mask, pos_order, neuron_logit_effects(m, layer, neuron),
                    n_contexts, before, after, n_tokens, top_for_tokens)
    negative = top_contexts(acts, index.tokens, strings, neg_order, index.mask, before, after)
    freq = float((real > FIRE_AT * hi).sum()) / n_real if hi > 0 else 0.0
    return NeuronSummary(
        neuron=neuron, layer=layer, hook_name=index.hook_name, frequency=freq, max_activation=hi, min_activation=lo,
        mean_activation=float(real.mean()) if real.numel() else 0.0,
        std_activation=float(real.std()) if real.numel() > 1 else 0.0,
        positive_share=float((real > 0).sum()) / n_real, n_tokens=index.n_tokens, negative_contexts=negative,
        histogram=value_histogram(real, lo, hi, bins),
        description=describe(t["top_tokens"], t["top_previous"], t["promoted"], freq), **t,
    )


def neuron_table(index: NeuronIndex) -> pd.DataFrame:
    """One row per neuron of the index's layer: ``layer, block, neuron, max_act, min_act, mean_act, std_act,
    frequency`` (share of tokens above ``FIRE_AT`` of its max), ``selectivity`` (``(max - mean) / std``: how far its
    strongest firing stands out, in standard deviations), ``token_at_max``."""
    a = index.real()  # (n, d_mlp)
    mx, arg = a.max(0)
    mn, mean, std = a.min(0).values, a.mean(0), a.std(0)
    freq = (a > FIRE_AT * mx.clamp(min=0)[None]).float().mean(0)
    flat_tokens = index.tokens.flatten() if index.mask is None else index.tokens[index.mask]
    strings = index.token_strings
    return pd.DataFrame({
        "layer": index.layer, "block": index.block, "neuron": range(index.d_mlp), "max_act": mx.tolist(),
        "min_act": mn.tolist(), "mean_act": mean.tolist(), "std_act": std.tolist(),
        "frequency": torch.where(mx > 0, freq, torch.zeros_like(freq)).tolist(),
        "selectivity": ((mx - mean) / std.clamp(min=1e-12)).tolist(),
        "token_at_max": [strings[int(flat_tokens[i])] for i in arg.tolist()],
    })


def neurons_for_token(index: NeuronIndex, token: Union[int, str], n: int = 10, model=None) -> pd.DataFrame:
    """The neurons most selective for ``token`` (an id, or a one-token string: then pass ``model``): ``neuron,
    mean_act`` (its mean activation on the token's occurrences in the sample), ``z`` (that mean minus its mean over
    the whole sample, in its standard deviations; the ranking), ``occurrences``. Empty when the token does not
    occur. ``n``: the most rows, from 1 (ArgumentError otherwise)."""
    n = check_count(n, "n", what="neurons listed")
    where = token_occurrences(index.tokens, index.mask, token, model)
    occ = int(where.sum())
    if occ == 0:
        return pd.DataFrame(columns=["neuron", "mean_act", "z", "occurrences"])
    a = index.real()
    on = index.acts[where].mean(0)
    z = (on - a.mean(0)) / a.std(0).clamp(min=1e-12)
    top = torch.topk(z, min(n, index.d_mlp))
    return pd.DataFrame({"neuron": top.indices.tolist(), "mean_act": on[top.indices].tolist(),
                         "z": top.values.tolist(), "occurrences": occ})


@torch.no_grad()
def neuron_attribution(
    model,
    input: Union[str, Int[Tensor, " pos"], Int[Tensor, "1 pos"]],
    answer: TokenLike,
    wrong: Optional[TokenLike] = None,
    pos: int = -1,
    top: Optional[int] = 20,
    promotes: int = 3,
) -> pd.DataFrame:
    """The neurons that push hardest towards ``logit[answer] - logit[wrong]`` (or ``logit[answer]``) at ``pos``, by
    their direct effect (module docstring), strongest in absolute value first.

    Returns ``layer, block, neuron, pos, activation, attribution`` (logits) and ``promotes`` (the ``promotes``
    tokens the neuron's output direction raises most, as a signed activation applies it: for a negative activation
    the tokens ``W_out[n] @ W_U`` lowers most). ``top`` rows (None: all). ``attrs``: ``logit_diff`` (the model's
    own), ``neurons_total`` (the sum over every neuron, = the feed-forwards' direct effect), ``total`` (every part,
    = ``logit_diff`` to float rounding), ``answer``, ``wrong``, ``pos``.
    """
    m = as_hooked(model)
    df = direct_logit_attribution(m, input, answer, wrong, pos=pos, by="neuron")
    nrn = df[df["kind"] == "neuron"]
    order = nrn["attribution"].abs().sort_values(ascending=False, kind="stable").index
    out = nrn.loc[order if top is None else order[:top], ["layer", "block", "neuron", "pos", "activation", "attribution"]]
    out = out.reset_index(drop=True)
    strings = vocabulary_strings(m)
    words = [""] * len(out)
    for layer, rows in out.groupby("layer").groups.items():  # one matrix product a layer: (rows, d_model) @ W_U
        rows = list(rows)
        neurons = torch.tensor(out.loc[rows, "neuron"].to_numpy())
        sign = torch.tensor(out.loc[rows, "activation"].to_numpy() >= 0, dtype=m.W_U.dtype) * 2 - 1
        eff = (m.blocks[int(layer)].mlp.W_out[neurons] @ m.W_U) * sign[:, None]
        for i, ids in zip(rows, torch.topk(eff, promotes, dim=-1).indices.tolist()):
            words[i] = ", ".join(repr(strings[j]) for j in ids)
    out["promotes"] = words
    out.attrs.update(logit_diff=df.attrs["logit_diff"], total=df.attrs["total"], neurons_total=float(nrn["attribution"].sum()),
                     answer=df.attrs["answer"], wrong=df.attrs["wrong"], pos=df.attrs["pos"], units="logits",
                     convention="layer 0-indexed; block = layer + 1; neuron 0-based in its layer; pos 0-based input index")
    return out


def _check_neurons(model, neurons: Iterable[Neuron]) -> list[Neuron]:
    m = as_hooked(model)
    out = []
    for item in neurons:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise SproutError(f"a neuron is (layer, neuron), both 0-based; got {item!r}")
        layer = _check_layer(m, item[0])
        out.append((layer, _check_neuron(m.blocks[layer].mlp.W_out.shape[0], item[1])))
    if not out:
        raise SproutError("no neurons to ablate: pass [(layer, neuron), ...]")
    return out


@torch.no_grad()
def neuron_means(model, layers: Iterable[int], reference=None) -> dict[int, Float[Tensor, " d_mlp"]]:
    """Each layer's mean ``hook_post`` over every real token of ``reference`` (token ids or texts; default the
    held-out sample :func:`index_neurons` uses): what ``kind="mean"`` ablation puts in a neuron's place."""
    m = as_hooked(model)
    layers = sorted({_check_layer(m, layer) for layer in layers})
    toks, mask = (held_out_tokens(m).to(m.device), None) if reference is None else m.prepare_input(reference)
    names = [act_name("post", layer) for layer in layers]
    _, cache = m.run_with_cache(toks, attention_mask=mask, names_filter=lambda n: n in names,
                                stop_at_layer=layers[-1] + 1)
    out = {}
    for layer, name in zip(layers, names):
        a = cache[name]
        out[layer] = (a.reshape(-1, a.shape[-1]) if mask is None else a[mask.bool()]).mean(0)
    return out


@torch.no_grad()
def ablate_neurons(
    model,
    tokens,
    neurons: Iterable[Neuron],
    kind: Literal["zero", "mean"] = "zero",
    metric: Union[MetricLike, Sequence[MetricLike]] = "loss",
    reference=None,
    attention_mask=None,
) -> pd.DataFrame:
    """``metric`` with ``neurons`` (``[(layer, neuron), ...]``, 0-based) ablated, beside its clean value.

    ``kind``: ``"zero"`` sets each neuron's ``hook_post`` to 0 (it writes nothing); ``"mean"`` to its mean over
    ``reference`` (:func:`neuron_means`). ``tokens``: a text, texts (right-padded) or ids. ``metric``: any metric of
    :mod:`sprout_interp.circuits.metrics` (default ``"loss"``, the mean next-token loss over real targets, nats;
    ``LogitDiff(answer, wrong, pos)`` for one prediction, logits), or a list of them, all read from the same two
    forwards (clean and ablated).

    Returns one row per metric (one for a single metric): ``neurons`` (labels ``"block B neuron N (layer L)"``),
    ``kind``, ``metric`` (its name), ``clean``, ``ablated``, ``change`` (ablated - clean), and
    ``attrs["per_token"]``: the next-token loss change at every target ``(batch, pos - 1)`` in nats (0 at padding),
    whatever the metric.
    """
    m = as_hooked(model)
    chosen = _check_neurons(m, neurons)
    if kind not in ("zero", "mean"):
        raise SproutError(f"kind must be 'zero' or 'mean', got {kind!r}")
    toks, mask = m.prepare_input(tokens, attention_mask)
    metrics = list(metric) if isinstance(metric, (list, tuple)) else [metric]
    if not metrics:
        raise SproutError("metric is an empty list: name at least one metric (default 'loss')")
    bound = [bind_metric(mt, toks, mask, m.cfg.d_vocab) for mt in metrics]
    by_layer: dict[int, list[int]] = {}
    for layer, n in chosen:
        by_layer.setdefault(layer, []).append(n)
    means = neuron_means(m, by_layer, reference) if kind == "mean" else {}

    def hook_for(layer: int):
        idx = torch.tensor(by_layer[layer], device=toks.device)

        def hook(act, hook):
            act = act.clone()
            act[..., idx] = means[layer][idx].to(act.dtype) if kind == "mean" else 0.0
            return act
        return hook

    hooks = [(act_name("post", layer), hook_for(layer)) for layer in by_layer]
    with m.lock:
        clean = m(toks, attention_mask=mask)
        ablated = m.run_with_hooks(toks, attention_mask=mask, fwd_hooks=hooks)
    target = toks[:, 1:]
    keep = torch.ones_like(target, dtype=torch.bool) if mask is None else (mask[:, :-1] & mask[:, 1:]).bool()

    def per_token(logits: Tensor) -> Tensor:
        return F.cross_entropy(logits[:, :-1].float().transpose(1, 2), target, reduction="none") * keep

    labels = ", ".join(f"block {layer + 1} neuron {i} (layer {layer})" for layer, i in chosen)
    rows = []
    for b in bound:
        c, a = float(b.from_logits(clean)), float(b.from_logits(ablated))
        rows.append(dict(neurons=labels, kind=kind, metric=b.name, clean=c, ablated=a, change=a - c))
    df = pd.DataFrame(rows)
    df.attrs.update(per_token=(per_token(ablated) - per_token(clean)).cpu(), neurons=chosen,
                    units="the metric's (loss: nats/token; logit difference: logits)")
    return df
