"""Feature pages, as Neuronpedia shows them: where a latent fires on held-out text and what it writes.

:func:`index_features` runs the model once over a token sample (default: held-out windows) and keeps, for every
token, the SAE's k active latents and their values (a sparse record, small enough to keep for a dashboard).
From it :func:`feature_summary` builds one latent's page:

- the top-activating contexts (token strings around the token where it fires, with the activation of every
  token in the window);
- the histogram of its non-zero activations, and how often it fires;
- the tokens its decoder direction promotes and suppresses: ``W_dec[f] @ W_U``, the direction read through the
  unembedding the way the logit lens reads the stream (HookedSprout's ``W_U`` carries the final RMSNorm's gain;
  the norm's division by the stream's scale is a positive number common to every token, so it changes no
  ranking and is left out), in logits per unit of activation;
- an automatic short description from its top tokens (no external model): the tokens it fires on, or the token
  before them when that is the more consistent one, and the tokens it promotes.

:func:`features_on_text` lists which latents fire where on a person's own text; :func:`features_for_token`
finds latents by a token (the ones that fire on it most).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sprout_interp.core.arguments import check_count
from sprout_interp.core.errors import SproutError
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.tokens import byte_labels, merge_byte_labels, token_bytes
from sprout_interp.features.inputs import feature_input
from sprout_interp.features.metrics import held_out_tokens
from sprout_interp.features.sae import SparseAutoencoder, check_for_model

__all__ = [
    "FeatureIndex", "FeatureSummary", "index_features", "feature_acts", "logit_effects", "feature_summary",
    "feature_summaries",
    "describe", "repeat_flags", "where_it_fires", "features_on_text", "features_for_token", "feature_table", "top_contexts", "token_shares",
    "token_tables", "promoted_suppressed", "vocabulary_strings", "index_transcoder_features", "unit_tables",
    "value_histogram", "token_occurrences",
    "transcoder_feature_summary", "transcoder_promoted",
]


@dataclass
class FeatureIndex:
    """Every token's active latents on a token sample: ``vals``/``idx`` ``(batch, pos, k)`` (value 0 = not active).

    Attributes:
        tokens: the sample's token ids ``(batch, pos)``; ``mask`` True at real tokens (None: all real).
        hook_name, d_sae: the SAE's.
        token_strings: one string per vocabulary id (for tables).
        notice: set when a text was cut to the context.
    """

    tokens: Int[Tensor, "batch pos"]
    vals: Float[Tensor, "batch pos k"]
    idx: Int[Tensor, "batch pos k"]
    hook_name: str
    d_sae: int
    token_strings: list[str] = field(repr=False, default_factory=list)
    mask: Optional[Tensor] = None
    notice: Optional[str] = None
    repeats: Optional[tuple] = field(default=None, repr=False)  # repeat_flags of the sample, once computed

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.numel() if self.mask is None else self.mask.sum())

    def density(self) -> Float[Tensor, " d_sae"]:
        """Fraction of (real) tokens on which each latent is active."""
        active = self.vals > 0
        if self.mask is not None:
            active = active & self.mask[..., None]
        counts = torch.bincount(self.idx[active].flatten(), minlength=self.d_sae)
        return counts.float() / max(self.n_tokens, 1)


def vocabulary_strings(model) -> list[str]:
    """One readable label per vocabulary id, for tables (``"#id"`` for a model without a tokenizer): the token's
    text, or for a piece of a UTF-8 character its bytes as ``⟨0xE2⟩`` (``core.tokens.token_labels`` of the id
    alone; a context's window merges adjacent pieces back into the character, :func:`top_contexts`)."""
    m = as_hooked(model)
    if m.tokenizer is None:  # ids-only model: tables show the ids
        return [f"#{i}" for i in range(m.cfg.d_vocab)]
    tok, n = m.tokenizer, m.cfg.d_vocab
    key = (id(tok), tok.get_vocab_size(with_added_tokens=True), n)
    held = _VOCABULARY_LABELS.get(key)
    if held is None or held[0] is not tok:  # (the tokenizer itself is kept: an id is not reused while it lives)
        held = (tok, [byte_labels([b])[0] for b in token_bytes(tok, range(n))])
        while len(_VOCABULARY_LABELS) >= 4:
            _VOCABULARY_LABELS.pop(next(iter(_VOCABULARY_LABELS)))
        _VOCABULARY_LABELS[key] = held
    return list(held[1])


# the labels of a few tokenizers' vocabularies (8,192 labels take 0.1 s to make; every feature, neuron and graph
# page reads them), by (tokenizer, its size with added tokens, the model's vocabulary)
_VOCABULARY_LABELS: dict[tuple, tuple] = {}


@torch.no_grad()
def index_features(
    model,
    sae: SparseAutoencoder,
    tokens=None,
    n: int = 96,
    length: int = 128,
    seed: int = 0,
    batch: int = 16,
) -> FeatureIndex:
    """Run the model over ``tokens`` (a text, texts or ids; default ``n`` held-out windows of ``length``) and
    record the SAE's active latents at every token. A text longer than the context is cut (notice set)."""
    m = as_hooked(model)
    check_for_model(sae, m)
    notice = None
    if tokens is None:
        toks, mask = held_out_tokens(m, n=n, length=length, seed=seed).to(m.device), None
    else:
        toks, mask, notice = feature_input(m, tokens)
    vals, idx = [], []
    for i in range(0, toks.shape[0], batch):
        _, cache = m.run_with_cache(toks[i:i + batch], names_filter=sae.hook_name, stop_at_layer=sae.layer + 1)
        v, j = sae.topk(sae.pre_acts(cache[sae.hook_name]))
        vals.append(v.cpu())
        idx.append(j.cpu())
    return FeatureIndex(tokens=toks.cpu(), vals=torch.cat(vals), idx=torch.cat(idx), hook_name=sae.hook_name,
                        d_sae=sae.d_sae, token_strings=vocabulary_strings(m), mask=None if mask is None else mask.cpu(),
                        notice=notice)


def _check_feature(index_or_sae, feature) -> int:
    d = index_or_sae.d_sae
    if not isinstance(feature, int) or isinstance(feature, bool) or not 0 <= feature < d:
        raise SproutError(f"feature {feature!r} is not a latent of this SAE: pick one of 0..{d - 1}")
    return feature


def feature_acts(index: FeatureIndex, feature: int) -> Float[Tensor, "batch pos"]:
    """One latent's activation at every token of the index's sample (0 where it is off or at padding)."""
    _check_feature(index, feature)
    a = (index.vals * (index.idx == feature)).sum(-1)
    return a if index.mask is None else a * index.mask


def logit_effects(model, sae: SparseAutoencoder, feature: int) -> Float[Tensor, " vocab"]:
    """``W_dec[feature] @ W_U``: the logit each token gains per unit of the latent's activation (see the module
    docstring for the norm convention)."""
    _check_feature(sae, feature)
    m = as_hooked(model)
    with torch.no_grad():
        return (sae.W_dec[feature].to(m.W_U.dtype) @ m.W_U).cpu()


@dataclass
class FeatureSummary:
    """One latent's page (see the module docstring). Tables use ``pos`` 0-based and layer 0-indexed (block = layer + 1).

    Attributes:
        contexts: ``rank, seq, pos, token, activation, tokens (list of str), acts (list of float), center``
            (``center``: the index of the firing token inside ``tokens``).
        histogram: ``left, right, count`` over the non-zero activations.
        promoted / suppressed: ``rank, token, logit`` (logits per unit activation).
        top_tokens: ``token, count, share, mean_act`` over the tokens it fires on; ``top_previous`` likewise for
            the token before.
        where: where in its text it fires (:func:`where_it_fires`: shares on repeated tokens and repeated pairs
            beside the sample's base rates, its mean position).
    """

    feature: int
    layer: int
    hook_name: str
    frequency: float
    max_activation: float
    mean_activation: float
    n_tokens: int
    contexts: pd.DataFrame
    histogram: pd.DataFrame
    promoted: pd.DataFrame
    suppressed: pd.DataFrame
    top_tokens: pd.DataFrame
    top_previous: pd.DataFrame
    description: str
    where: dict = field(default_factory=dict)

    @property
    def block(self) -> int:
        return self.layer + 1


def top_contexts(
    acts: Float[Tensor, "batch pos"],
    tokens: Int[Tensor, "batch pos"],
    strings: list[str],
    order: Int[Tensor, " n"],
    mask: Optional[Tensor] = None,
    before: int = 12,
    after: int = 4,
) -> pd.DataFrame:
    """The contexts of the flat positions ``order`` (indices into ``acts.flatten()``, strongest first), one row
    each: ``rank, seq, pos, token, activation, tokens, acts, center`` -- ``tokens``/``acts`` the window from
    ``before`` tokens before to ``after`` after (cut at padding; the window's pieces of a UTF-8 character merged
    into it, ``core.tokens.merge_byte_labels``), ``center`` the firing token's index in it."""
    T = acts.shape[1]
    flat = acts.flatten()
    rows = []
    for rank, j in enumerate(order.tolist()):
        s, p = divmod(j, T)
        lo, hi = max(0, p - before), min(T, p + after + 1)
        if mask is not None:
            hi = min(hi, int(mask[s].sum()))
        ids = tokens[s, lo:hi].tolist()
        rows.append(dict(rank=rank, seq=s, pos=p, token=strings[int(tokens[s, p])],
                         activation=float(flat[j]), tokens=merge_byte_labels([strings[i] for i in ids]),
                         acts=[float(a) for a in acts[s, lo:hi]], center=p - lo))
    return pd.DataFrame(rows, columns=["rank", "seq", "pos", "token", "activation", "tokens", "acts", "center"])


def token_tables(
    acts: Float[Tensor, "batch pos"],
    tokens: Int[Tensor, "batch pos"],
    strings: list[str],
    order: Int[Tensor, " n"],
    n: int,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(top_tokens, top_previous)``: :func:`token_shares` of the tokens at the flat positions ``order`` (indices
    into ``acts.flatten()``) weighted by their activation, and of the token before each (``"(start)"`` at pos 0)."""
    T = acts.shape[1]
    js = order.tolist()
    cur = [strings[int(tokens[j // T, j % T])] for j in js]
    prev = [strings[int(tokens[j // T, j % T - 1])] if j % T else "(start)" for j in js]
    w = [float(acts[j // T, j % T]) for j in js]
    return token_shares(cur, w, n), token_shares(prev, w, n)


def promoted_suppressed(effect: Float[Tensor, " vocab"], strings: list[str], n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``n`` tokens ``effect`` raises most and the ``n`` it lowers most: two DataFrames ``rank, token, logit``
    (the most extreme first)."""
    n = max(1, min(n, effect.shape[0] // 2))
    top, bot = torch.topk(effect, n), torch.topk(-effect, n)
    return (pd.DataFrame({"rank": range(n), "token": [strings[i] for i in top.indices.tolist()], "logit": top.values.tolist()}),
            pd.DataFrame({"rank": range(n), "token": [strings[i] for i in bot.indices.tolist()],
                          "logit": (-bot.values).tolist()}))


def token_shares(strings: list[str], weights: list[float], n: int) -> pd.DataFrame:
    """The ``n`` strings carrying most of ``weights`` (one weight per occurrence): ``token, count, share``
    (of the total weight), ``mean_act`` (mean weight per occurrence), largest share first."""
    total = sum(weights) or 1.0
    acc: dict[str, list[float]] = {}
    for s, w in zip(strings, weights):
        acc.setdefault(s, []).append(w)
    rows = sorted(((s, len(ws), sum(ws) / total, sum(ws) / len(ws)) for s, ws in acc.items()),
                  key=lambda r: -r[2])[:n]
    return pd.DataFrame(rows, columns=["token", "count", "share", "mean_act"])


def value_histogram(values: Float[Tensor, " n"], lo: float, hi: float, bins: int) -> pd.DataFrame:
    """``left, right, count``: ``values`` in ``bins`` equal bins from ``lo`` to ``hi`` (no rows when there is no
    value or ``hi <= lo``)."""
    if not values.numel() or not hi > lo:
        return pd.DataFrame(columns=["left", "right", "count"])
    counts = torch.histc(values, bins=bins, min=lo, max=hi)
    edges = torch.linspace(lo, hi, bins + 1)
    return pd.DataFrame({"left": edges[:-1].tolist(), "right": edges[1:].tolist(), "count": counts.long().tolist()})


def unit_tables(acts: Float[Tensor, "batch pos"], tokens: Int[Tensor, "batch pos"], strings: list[str],
                mask: Optional[Tensor], order: Int[Tensor, " n"], effect: Float[Tensor, " vocab"], n_contexts: int,
                before: int, after: int, n_tokens: int, top_for_tokens: int) -> dict[str, pd.DataFrame]:
    """What every unit's page (an SAE latent, a transcoder feature, a neuron) shows from its activations ``acts`` on
    a sample and its direct effect on the logits: ``contexts`` (:func:`top_contexts` of the first ``n_contexts``
    flat positions of ``order``, strongest first), ``promoted`` and ``suppressed`` (:func:`promoted_suppressed`),
    ``top_tokens`` and ``top_previous`` (:func:`token_tables` of the first ``top_for_tokens``)."""
    promoted, suppressed = promoted_suppressed(effect, strings, n_tokens)
    top_tokens, top_previous = token_tables(acts, tokens, strings, order[:top_for_tokens], n_tokens)
    return dict(contexts=top_contexts(acts, tokens, strings, order[:n_contexts], mask, before, after),
                promoted=promoted, suppressed=suppressed, top_tokens=top_tokens, top_previous=top_previous)


def token_occurrences(tokens: Int[Tensor, "batch pos"], mask: Optional[Tensor], token: Union[int, str],
                      model=None) -> Bool[Tensor, "batch pos"]:
    """Where ``token`` (an id, or a string that is one token: then pass ``model``, whose tokenizer reads it) stands
    among the real tokens of a sample."""
    if isinstance(token, str):
        if model is None:
            raise SproutError("to search by a token string, pass model=... (its tokenizer reads the string)")
        token = as_hooked(model).to_single_token(token)
    where = tokens == int(token)
    return where if mask is None else where & mask


def repeat_flags(tokens: Int[Tensor, "batch pos"], mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Where each token stands in its own sequence: ``(seen, continued)``, boolean ``(batch, pos)``. ``seen``: the
    token occurred earlier in the sequence (a repeat); ``continued``: the token before it occurred earlier followed
    by this same token (the pair repeats: where an induction head predicts, e.g. a name's second occurrence after
    its first word). Padding (``mask`` False) is neither and is not looked at."""
    B, T = tokens.shape
    seen = torch.zeros(B, T, dtype=torch.bool)
    cont = torch.zeros(B, T, dtype=torch.bool)
    for b in range(B):
        row = tokens[b].tolist()
        n = T if mask is None else int(mask[b].sum())
        singles, pairs = set(), set()
        for p in range(n):
            seen[b, p] = row[p] in singles
            cont[b, p] = p > 0 and (row[p - 1], row[p]) in pairs
            singles.add(row[p])
            if p > 0:
                pairs.add((row[p - 1], row[p]))
    return seen, cont


def where_it_fires(index: FeatureIndex, acts: Float[Tensor, "batch pos"], order: Int[Tensor, " n"]) -> dict:
    """Where in its text a latent fires, from its strongest firings ``order`` (flat positions, as in
    :func:`token_tables`) weighted by activation, beside the same share over every real token of the sample:
    ``repeat_share`` / ``repeat_base`` (on a token seen earlier in the sequence) and ``continued_share`` /
    ``continued_base`` (where the pair before-and-this repeats: the second occurrence of a name or phrase), each a
    share from 0 to 1; ``mean_pos`` (activation-weighted, 0-based) and ``n`` (firings counted)."""
    if index.repeats is None:
        index.repeats = repeat_flags(index.tokens, index.mask)
    seen, cont = index.repeats
    real = torch.ones_like(seen) if index.mask is None else index.mask.bool()
    T = acts.shape[1]
    js = order.tolist()
    w = [float(acts[j // T, j % T]) for j in js]
    total = sum(w) or 1.0

    def share(flags: Tensor) -> float:
        return sum(wk for wk, j in zip(w, js) if flags[j // T, j % T]) / total

    n_real = max(int(real.sum()), 1)
    return dict(repeat_share=share(seen), repeat_base=int((seen & real).sum()) / n_real,
                continued_share=share(cont), continued_base=int((cont & real).sum()) / n_real,
                mean_pos=sum(wk * (j % T) for wk, j in zip(w, js)) / total, n=len(js))


def _where_text(where: Optional[dict]) -> str:
    """The part of a description that says where in the text a latent fires, when that stands out from the
    sample's base rates (twice as often, or half as often, as a token of the sample); else ""."""
    if not where or not where.get("n"):
        return ""
    c, cb, r, rb = (where[k] for k in ("continued_share", "continued_base", "repeat_share", "repeat_base"))
    if c >= 0.5 and c >= 2 * cb:
        return (f"where an earlier pair of tokens repeats, as at the second occurrence of a name ({c:.0%} of its "
                f"activation, {cb:.0%} of tokens)")
    if r >= 0.5 and r >= 1.5 * rb:
        return f"on tokens seen earlier in the text ({r:.0%} of its activation, {rb:.0%} of tokens)"
    if r <= 0.5 * rb:
        return f"on a token's first occurrence in the text (only {r:.0%} of its activation on repeats, {rb:.0%} of tokens)"
    return ""


def _quote(tokens: list[str]) -> str:
    return ", ".join(repr(t) for t in tokens)


def describe(top_tokens: pd.DataFrame, top_previous: pd.DataFrame, promoted: pd.DataFrame, frequency: float,
             where: Optional[dict] = None) -> str:
    """A short description from a latent's measurements: what it fires on (or after) by its top tokens, where in
    the text it fires when that stands out (``where``: :func:`where_it_fires`), and what it promotes."""
    if frequency == 0 or top_tokens.empty:
        return "never fires on the sample (dead)"
    cur, prev = top_tokens.head(3), top_previous.head(3)
    cur_share, prev_share = float(cur["share"].sum()), float(prev["share"].sum()) if len(prev) else 0.0
    if prev_share > cur_share + 0.15:
        what = f"fires after {_quote(list(prev['token']))} ({prev_share:.0%} of its activation)"
    elif cur_share >= 0.3:
        what = f"fires on {_quote(list(cur['token']))} ({cur_share:.0%} of its activation)"
    else:
        what = f"fires on many tokens, most on {_quote(list(cur['token']))} ({cur_share:.0%})"
    if frequency > 0.1:
        what += f"; dense ({frequency:.0%} of tokens)"
    place = _where_text(where)
    if place:
        what += f"; {place}"
    return f"{what}; promotes {_quote(list(promoted['token'].head(3)))}"


def feature_summary(
    model,
    sae: SparseAutoencoder,
    feature: int,
    index: Optional[FeatureIndex] = None,
    n_contexts: int = 12,
    before: int = 12,
    after: int = 4,
    n_tokens: int = 10,
    bins: int = 30,
    top_for_tokens: int = 200,
) -> FeatureSummary:
    """The page of ``feature`` (see :class:`FeatureSummary`), from ``index`` (default :func:`index_features` on the
    held-out sample; pass one index to build many pages). ``top_for_tokens``: how many of its strongest firings the
    top-token tables and the description count."""
    return feature_summaries(model, sae, [feature], index, n_contexts, before, after, n_tokens, bins,
                             top_for_tokens)[feature]


def feature_summaries(
    model,
    sae: SparseAutoencoder,
    features,
    index: Optional[FeatureIndex] = None,
    n_contexts: int = 12,
    before: int = 12,
    after: int = 4,
    n_tokens: int = 10,
    bins: int = 30,
    top_for_tokens: int = 200,
) -> dict[int, FeatureSummary]:
    """``{feature: its page}`` for several latents, each exactly as :func:`feature_summary` builds it, with the SAE
    checked against the model once (the check hashes every weight of the model: about 0.3 s for Sprout) and one
    ``index`` for all (default :func:`index_features` on the held-out sample)."""
    m = as_hooked(model)
    check_for_model(sae, m)
    feats = [_check_feature(sae, f) for f in features]
    index = index_features(m, sae) if index is None else index
    if index.hook_name != sae.hook_name or index.d_sae != sae.d_sae:
        raise SproutError(f"the index was built for {index.hook_name} ({index.d_sae} latents), not for this SAE")
    return {f: _summary(index, f, sae.layer, logit_effects(m, sae, f), n_contexts, before, after, n_tokens, bins,
                        top_for_tokens) for f in feats}


def _summary(index: FeatureIndex, feature: int, layer: int, effect: Float[Tensor, " vocab"], n_contexts: int,
             before: int, after: int, n_tokens: int, bins: int, top_for_tokens: int) -> FeatureSummary:
    """One latent's page from an index of its activations and its direct logit effect (an SAE's or a transcoder's)."""
    acts = feature_acts(index, feature)
    strings = index.token_strings
    flat = acts.flatten()
    active = flat > 0
    n_active = int(active.sum())
    order = torch.argsort(flat, descending=True)[:max(n_contexts, top_for_tokens)]
    order = order[flat[order] > 0]
    nz = flat[active]
    top = float(nz.max()) if n_active else 0.0
    t = unit_tables(acts, index.tokens, strings, index.mask, order, effect, n_contexts, before, after, n_tokens,
                    top_for_tokens)
    where = where_it_fires(index, acts, order[:top_for_tokens])
    freq = n_active / max(index.n_tokens, 1)
    return FeatureSummary(
        feature=feature, layer=layer, hook_name=index.hook_name, frequency=freq,
        max_activation=top, mean_activation=float(nz.mean()) if n_active else 0.0,
        n_tokens=index.n_tokens, histogram=value_histogram(nz, 0.0, top, bins),
        description=describe(t["top_tokens"], t["top_previous"], t["promoted"], freq, where), where=where, **t,
    )


@torch.no_grad()
def index_transcoder_features(model, transcoder, n: int = 96, length: int = 128, seed: int = 0,
                              batch: int = 16) -> FeatureIndex:
    """:func:`index_features` for a per-layer transcoder (:class:`~sprout_interp.features.transcoder.Transcoder`):
    its k active features at every token of ``n`` held-out windows of ``length`` tokens, read from what its
    feed-forward reads (``blocks.{layer}.ln2.hook_normalized`` times ln2's gain). ``hook_name`` is that hook,
    ``d_sae`` the transcoder's width. A cross-layer transcoder's source layer
    (:meth:`~sprout_interp.features.clt.CrossLayerTranscoder.layer_features`) is indexed the same way: its JumpReLU's
    active features, as many per token as the most active anywhere in the sample (the rest padded with 0)."""
    from sprout_interp.features.transcoder import input_hook, mlp_input

    m = as_hooked(model)
    layer = int(transcoder.layer)
    if transcoder.d_model != m.cfg.d_model or not 0 <= layer < m.cfg.n_layers:
        raise SproutError(f"this transcoder (layer {layer}, d_model {transcoder.d_model}) does not fit "
                          f"{m.name or 'the model'} ({m.cfg.n_layers} blocks, d_model {m.cfg.d_model}): load the "
                          "model's own transcoders (sprout_interp.features.transcoder.load_transcoders)")
    hook = input_hook(layer)
    toks = held_out_tokens(m, n=n, length=length, seed=seed).to(m.device)
    vals, idx = [], []
    for i in range(0, toks.shape[0], batch):
        _, cache = m.run_with_cache(toks[i:i + batch], names_filter=hook, stop_at_layer=layer + 1)
        v, j = transcoder.topk(transcoder.pre_acts(mlp_input(m, layer, cache[hook])))
        vals.append(v.float().cpu())
        idx.append(j.cpu())
    k = max(v.shape[-1] for v in vals)  # a TopK's k everywhere; a JumpReLU's count differs from batch to batch
    vals = [torch.nn.functional.pad(v, (0, k - v.shape[-1])) for v in vals]
    idx = [torch.nn.functional.pad(j, (0, k - j.shape[-1])) for j in idx]
    return FeatureIndex(tokens=toks.cpu(), vals=torch.cat(vals), idx=torch.cat(idx), hook_name=hook,
                        d_sae=transcoder.d_transcoder, token_strings=vocabulary_strings(m))


def transcoder_feature_summary(model, transcoder, feature: int, index: Optional[FeatureIndex] = None,
                               n_contexts: int = 12, before: int = 12, after: int = 4, n_tokens: int = 10,
                               bins: int = 30, top_for_tokens: int = 200) -> FeatureSummary:
    """A transcoder feature's page, as :func:`feature_summary` builds an SAE latent's: where it fires on held-out
    text (``index``: default :func:`index_transcoder_features`) and the tokens its decoder row promotes and
    suppresses, ``W_dec[feature] @ W_U`` in logits per unit of activation (its direct effect through the
    unembedding, the final norm's division left out as on every feature page). For a cross-layer transcoder's
    feature pass its layer's :meth:`~sprout_interp.features.clt.CrossLayerTranscoder.layer_features`: its decoder
    row is then its rows to every layer it writes to, summed."""
    m = as_hooked(model)
    d = transcoder.d_transcoder
    if not isinstance(feature, int) or isinstance(feature, bool) or not 0 <= feature < d:
        raise SproutError(f"feature {feature!r} is not a feature of this transcoder: pick one of 0..{d - 1}")
    index = index_transcoder_features(m, transcoder) if index is None else index
    if index.d_sae != transcoder.d_transcoder:
        raise SproutError(f"the index was built for {index.hook_name} ({index.d_sae} features), not for this "
                          "transcoder")
    with torch.no_grad():
        effect = (transcoder.W_dec[feature].to(m.W_U.dtype) @ m.W_U).cpu()
    return _summary(index, feature, int(transcoder.layer), effect, n_contexts, before, after, n_tokens, bins,
                    top_for_tokens)


def transcoder_promoted(model, transcoders, features, n: int = 3) -> pd.DataFrame:
    """The tokens each transcoder feature's decoder row promotes most (``W_dec[f] @ W_U``, as on its page):
    ``layer, feature, promoted`` (the ``n`` token strings, the strongest first), one row per ``(layer, feature)``
    of ``features``; ``transcoders`` indexed by layer (a TranscoderSet or ``{layer: Transcoder}``), or a
    :class:`~sprout_interp.features.clt.CrossLayerTranscoder` (a feature's decoder rows to every layer it writes to,
    summed: :meth:`~sprout_interp.features.clt.CrossLayerTranscoder.layer_features`)."""
    from sprout_interp.features.clt import CrossLayerTranscoder

    n = check_count(n, "n", what="tokens listed per feature")
    m = as_hooked(model)
    strings = vocabulary_strings(m)
    rows = []
    by_layer: dict[int, list[int]] = {}
    for layer, f in features:
        by_layer.setdefault(int(layer), []).append(int(f))
    with torch.no_grad():
        for layer, fs in by_layer.items():
            tc = transcoders.layer_features(layer) if isinstance(transcoders, CrossLayerTranscoder) \
                else transcoders[layer]
            bad = [f for f in fs if not 0 <= f < tc.d_transcoder]
            if bad:
                raise SproutError(f"features {bad[:5]} are not features of layer {layer}'s transcoder: pick from "
                                  f"0..{tc.d_transcoder - 1}")
            top = (tc.W_dec[fs].to(m.W_U.dtype) @ m.W_U).topk(min(n, m.cfg.d_vocab), dim=-1).indices.cpu()
            rows += [dict(layer=layer, feature=f, promoted=[strings[i] for i in t.tolist()]) for f, t in zip(fs, top)]
    return pd.DataFrame(rows, columns=["layer", "feature", "promoted"])


def feature_table(model, sae: SparseAutoencoder, index: FeatureIndex, features=None) -> pd.DataFrame:
    """One row per latent (default all): ``layer, block, feature, frequency, max_act, description``."""
    dens = index.density()
    feats = range(sae.d_sae) if features is None else list(features)
    maxes = torch.zeros(sae.d_sae)
    flat_v, flat_i = index.vals.flatten(), index.idx.flatten()
    maxes.scatter_reduce_(0, flat_i, flat_v, reduce="amax")
    pages = feature_summaries(model, sae, [int(f) for f in feats], index, n_contexts=0, n_tokens=3) \
        if features is not None else {}
    rows = []
    for f in feats:
        s = pages.get(int(f))
        rows.append(dict(layer=sae.layer, block=sae.layer + 1, feature=int(f), frequency=float(dens[f]),
                         max_act=float(maxes[f]), description=s.description if s else ""))
    return pd.DataFrame(rows)


def features_on_text(model, sae: SparseAutoencoder, text: Union[str, Int[Tensor, "1 pos"]], min_act: float = 0.0):
    """Which latents fire where on one text: ``(cells, by_feature)`` DataFrames.

    ``cells``: one row per (pos, feature) where it is active, ``pos, token, feature, activation``.
    ``by_feature``: ``feature, n_positions, max_act, pos_of_max, token_at_max``, strongest first. A text longer
    than the context is cut (``cells.attrs["notice"]`` says so, and a TruncatedTextWarning is raised).
    """
    index = index_features(model, sae, text if not isinstance(text, str) else [text])
    if index.tokens.shape[0] != 1:
        raise SproutError("features_on_text reads one text; pass a string or ids of shape (1, pos)")
    strings = index.token_strings
    toks = index.tokens[0]
    rows = []
    for p in range(toks.shape[0]):
        for v, f in zip(index.vals[0, p].tolist(), index.idx[0, p].tolist()):
            if v > min_act:
                rows.append(dict(pos=p, token=strings[int(toks[p])], feature=int(f), activation=float(v)))
    cells = pd.DataFrame(rows, columns=["pos", "token", "feature", "activation"])
    if cells.empty:
        by = pd.DataFrame(columns=["feature", "n_positions", "max_act", "pos_of_max", "token_at_max"])
    else:
        g = cells.sort_values("activation", ascending=False).groupby("feature", sort=False)
        by = pd.DataFrame({"n_positions": g.size(), "max_act": g["activation"].max(), "pos_of_max": g["pos"].first(),
                           "token_at_max": g["token"].first()}).reset_index().sort_values("max_act", ascending=False)
        by = by.reset_index(drop=True)
    for df in (cells, by):
        df.attrs.update(notice=index.notice, layer=sae.layer, block=sae.layer + 1, hook_name=sae.hook_name)
    return cells, by


def features_for_token(index: FeatureIndex, token: Union[int, str], n: int = 10, model=None) -> pd.DataFrame:
    """The latents that fire most on ``token`` (an id, or a string that is one token: then pass ``model``):
    ``feature, mean_act`` (mean over the token's occurrences in the sample, 0 where off), ``share`` (of the
    occurrences on which it fires), ``occurrences``. ``n``: the most rows, from 1 (ArgumentError otherwise)."""
    n = check_count(n, "n", what="latents listed")
    where = token_occurrences(index.tokens, index.mask, token, model)
    occ = int(where.sum())
    if occ == 0:
        return pd.DataFrame(columns=["feature", "mean_act", "share", "occurrences"])
    v, i = index.vals[where], index.idx[where]  # (occ, k)
    sums = torch.zeros(index.d_sae).scatter_add_(0, i.flatten(), v.flatten())
    fires = torch.bincount(i[v > 0].flatten(), minlength=index.d_sae).float()
    top = torch.topk(sums, min(n, index.d_sae))
    keep = top.values > 0
    feats = top.indices[keep]
    return pd.DataFrame({"feature": feats.tolist(), "mean_act": (top.values[keep] / occ).tolist(),
                         "share": (fires[feats] / occ).tolist(), "occurrences": occ})

