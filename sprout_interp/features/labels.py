"""A short label for every transcoder feature, made from what was measured: ``" Pl" after " Zorbin" -> "ax"``.

:func:`feature_labels` runs the model once over held-out text (``n_texts`` windows of ``length`` tokens from
:func:`sprout_interp.core.texts.held_out_for`, seeded, so the same for every call), reads every needed layer's
feed-forward input from that one pass, and for each asked ``(layer, feature)`` measures:

- where it fires: its activation at every real token (a per-layer transcoder's TopK, a cross-layer transcoder's
  JumpReLU; it *fires* where the activation is above 0, as on the feature pages); ``frequency`` is the share of
  tokens it fires on, ``max_activation`` its largest value;
- the token it fires on and the token before it: among its ``top`` strongest firings, each token's share of their
  summed activation (:func:`sprout_interp.features.pages.token_tables`, the feature pages' own tables);
  ``top_token``/``top_share`` and ``previous_token``/``previous_share`` are the largest, ``*_margin`` the gap to
  the runner-up (``"(start)"`` is the window's first position, which has no token before it);
- where in its text it fires (:func:`sprout_interp.features.pages.where_it_fires`, the feature pages' measure):
  ``repeat_share``, the share of that activation on tokens seen earlier in their text, and ``continued_share``, on
  tokens whose pair with the token before repeats an earlier pair (the second occurrence of a name);
- the token it promotes: the top of its decoder direction read through the unembedding, ``direction @ W_U`` (the
  feature pages' convention: ``W_U`` carries the final norm's gain, the norm's division by the stream's scale is
  one positive number for every token and is left out), ``promoted_logit`` in logits per unit of activation and
  ``promoted_margin`` the gap to the second token. A per-layer feature's direction is its decoder row; a
  cross-layer feature writes to its own and every later feed-forward output, all of which add to the residual
  stream the unembedding reads, so its direction is the **sum of its decoder rows over every layer it writes
  to** (its whole direct effect on the logits).

The label (:func:`label_text`, at most :data:`MAX_LABEL` characters): the top token when it carries at least
:data:`CLEAR_SHARE` of the activation, ``after <previous token>`` when that one does (``at start`` for the window's
first position), both when both do, else ``mixed <top token> <share>`` (``dense <frequency>`` for a feature firing on
at least :data:`DENSE` of tokens); ``(repeat)`` or ``(repeat pair)`` when it fires mostly on repeats
(:func:`where_word`); then ``-> <promoted token>``, e.g. ``mixed " B" 14% (repeat) -> " book"``. A feature that never fired reads "never fires on
held-out text". Tokens are quoted by :func:`quote_token`: in double quotes, with newlines, tabs and every control
or format character (bidi overrides, zero-width marks) made visible; a label is plain text and still needs HTML
escaping where it is drawn (``plots.common.escape_label``).

Shipped labels: :func:`write_labels` (``python -m sprout_interp.features.labels --model sprout --write``) writes
``labels.json`` beside a transcoder set or a cross-layer transcoder (``<checkpoint>/transcoders/labels.json``,
``<checkpoint>/clt/labels.json``): every feature's label and measured parts, with the fingerprint it was measured
under (the checkpoint's, each layer's transcoder weights' sha256 and the settings). :func:`feature_labels` reads it
back, instead of measuring, when the request matches it (no ``texts``, the same settings, the same model and
weights); otherwise it measures.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import unicodedata
from pathlib import Path
from typing import Optional, Union

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from sprout_interp.core.arguments import check_count, check_index, command_line, describe, integer
from sprout_interp.core.errors import ArgumentError, SproutError, TranscoderMismatchError
from sprout_interp.core.files import read_json
from sprout_interp.core.fingerprints import fingerprint
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.texts import held_out_for, sample_corpus
from sprout_interp.features.clt import CrossLayerTranscoder
from sprout_interp.features.inputs import feature_input
from sprout_interp.features.pages import FeatureIndex, token_tables, vocabulary_strings, where_it_fires
from sprout_interp.features.transcoder import Transcoder, TranscoderSet, input_hook, mlp_input
from sprout_model.cli import ArgumentParser, Whole

__all__ = ["MAX_LABEL", "CLEAR_SHARE", "DENSE", "NEVER", "LABELS_FILE", "LABEL_COLUMNS", "quote_token", "label_text",
           "where_word",
           "decoder_directions", "feature_labels", "labels_fingerprint", "write_labels", "read_labels", "main"]

#: the longest label, in characters
MAX_LABEL = 40
#: the share of a feature's top activation a token must carry to be named in its label
CLEAR_SHARE = 0.3
#: the firing frequency from which a feature without a clear token reads "dense"
DENSE = 0.1
#: the label of a feature that never fired on the held-out text
NEVER = "never fires on held-out text"
LABELS_FILE = "labels.json"
_FORMAT = "sprout-interp feature labels"
#: the label rules' version, part of the fingerprint (a change of the rules makes shipped files stale)
_RULES = 2
LABEL_COLUMNS = ("layer", "block", "feature", "label", "frequency", "max_activation", "top_token", "top_share",
                 "top_margin", "previous_token", "previous_share", "previous_margin", "repeat_share",
                 "continued_share", "promoted", "promoted_logit", "promoted_margin")
_START = "(start)"  # token_tables' name for the token before position 0
# the numbers the file keeps per feature as whole thousandths (the frequency as the count of firings; the margins,
# diagnostics of the exact measurement, are not kept)
_MILLI = ("max_activation", "top_share", "previous_share", "repeat_share", "continued_share", "promoted_logit")
_MARGINS = ("top_margin", "previous_margin", "promoted_margin")

TranscodersArg = Union[TranscoderSet, dict, CrossLayerTranscoder, str, Path, None]


# -- the label text ---------------------------------------------------------------------------------------------


def quote_token(s: str, most: int = 10) -> str:
    """A token string in double quotes, safe in a label: newlines as ↵, tabs as ⇥, carriage returns as ␍, ``"`` and
    ``\\`` escaped with a backslash, every other control or format character (bidi overrides, zero-width marks) as
    ``\\xNN`` / ``\\uNNNN``; cut to ``most`` characters inside the quotes, the last one "…", where it is longer.

    >>> quote_token(" Pl"), quote_token("\\n\\n"), quote_token('"'), quote_token(" Jonathanson", 6)
    ('" Pl"', '"↵↵"', '"\\\\""', '" Jona…"')
    """
    most = check_count(most, "most", low=2, what="characters shown inside the quotes")
    out = []
    for ch in str(s):
        if ch in "\n\t\r":
            out.append({"\n": "↵", "\t": "⇥", "\r": "␍"}[ch])
        elif ch in '"\\':
            out.append("\\" + ch)
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    if len(out) > most:  # cut between characters, never inside an escape
        out = out[:most - 1] + ["…"]
    return '"' + "".join(out) + '"'


def label_text(top_token: Optional[str], top_share: float, previous_token: Optional[str], previous_share: float,
               promoted: str, frequency: float, where: str = "") -> str:
    """The label of a feature from its measured parts (the module docstring has the rule): at most
    :data:`MAX_LABEL` characters, tokens shortened (to no fewer than 4 characters each) until it fits.
    ``top_token`` None (or ``frequency`` 0): the feature never fired. ``previous_token`` ``"(start)"``: the window's
    first position. ``where``: ``"repeat"`` or ``"repeat pair"`` (:func:`where_word`), shown in brackets after the
    tokens."""
    if top_token is None or frequency <= 0:
        return NEVER
    for most in range(10, 3, -1):
        q = lambda s: quote_token(s, most)  # noqa: E731
        cur = q(top_token) if top_share >= CLEAR_SHARE else None
        prev = None
        if previous_token is not None and previous_share >= CLEAR_SHARE:
            prev = "at start" if previous_token == _START else f"after {q(previous_token)}"
        if cur or prev:
            head = " ".join(p for p in (cur, prev) if p)
        elif frequency >= DENSE:
            head = f"dense {frequency:.0%}"
        else:
            head = f"mixed {q(top_token)} {top_share:.0%}"
        label = f"{head}{f' ({where})' if where else ''} -> {q(promoted)}"
        if len(label) <= MAX_LABEL:
            break
    return label[:MAX_LABEL]


def where_word(repeat_share: float, repeat_base: float, continued_share: float, continued_base: float) -> str:
    """``"repeat pair"`` when at least half of a feature's top activation is where the pair before-and-this token
    repeats an earlier pair of its text (the second occurrence of a name) and that is at least twice the sample's
    share of such tokens; else ``"repeat"`` when at least half is on tokens seen earlier in the text and that is at
    least 1.5 times the sample's share; else ``""``. The feature pages' thresholds
    (:func:`sprout_interp.features.pages.where_it_fires` measures the shares)."""
    if continued_share >= 0.5 and continued_share >= 2 * continued_base:
        return "repeat pair"
    if repeat_share >= 0.5 and repeat_share >= 1.5 * repeat_base:
        return "repeat"
    return ""


# -- the transcoders, either kind -------------------------------------------------------------------------------


def _kind(transcoders) -> str:
    return "clt" if isinstance(transcoders, CrossLayerTranscoder) else "per_layer"


def _layers_of(transcoders) -> dict[int, int]:
    """{layer: its number of features}."""
    if isinstance(transcoders, CrossLayerTranscoder):
        return {i: transcoders.d_transcoder for i in range(transcoders.n_layers)}
    tcs = {tc.layer: tc for tc in transcoders} if isinstance(transcoders, TranscoderSet) else transcoders
    return {int(layer): int(tc.d_transcoder) for layer, tc in tcs.items()}


def _resolve(m, transcoders: TranscodersArg, kind: Optional[str] = None):
    """The transcoders to label, as an attribution graph resolves them
    (:func:`sprout_interp.circuits.local_replacement.resolve_transcoders`: None the shipped ones of ``kind``, by
    default the best shipped kind; a folder what it holds), checked to fit the model."""
    from sprout_interp.circuits.local_replacement import resolve_transcoders

    if transcoders is None or isinstance(transcoders, (str, Path)):
        transcoders = resolve_transcoders(m, transcoders, kind)
    elif kind is not None:
        resolve_transcoders(m, transcoders, kind)  # refuses a kind that is not the transcoders' own
    if isinstance(transcoders, CrossLayerTranscoder):
        if (transcoders.n_layers, transcoders.d_model) != (m.cfg.n_layers, m.cfg.d_model):
            raise TranscoderMismatchError(
                f"this cross-layer transcoder spans {transcoders.n_layers} layers of width {transcoders.d_model}; "
                f"{m.name or 'the model'} has {m.cfg.n_layers} of width {m.cfg.d_model}: load the model's own "
                "(sprout_interp.features.clt.load_clt)")
        return transcoders
    if isinstance(transcoders, (TranscoderSet, dict)) and len(transcoders):
        tcs = {tc.layer: tc for tc in transcoders} if isinstance(transcoders, TranscoderSet) else transcoders
        for layer, tc in tcs.items():
            if not isinstance(tc, Transcoder) or integer(layer) is None or tc.layer != integer(layer):
                raise ArgumentError(f"transcoders[{layer!r}] must be the Transcoder of layer {layer!r}, got "
                                    f"{describe(tc)}")
            if tc.d_model != m.cfg.d_model or not 0 <= tc.layer < m.cfg.n_layers:
                raise TranscoderMismatchError(
                    f"the transcoder of layer {tc.layer} (d_model {tc.d_model}) does not fit {m.name or 'the model'} "
                    f"({m.cfg.n_layers} blocks, d_model {m.cfg.d_model}): load the model's own (load_transcoders)")
        return transcoders
    raise ArgumentError(f"transcoders={describe(transcoders)} is not a TranscoderSet, a {{layer: Transcoder}} dict, "
                        "a CrossLayerTranscoder or a folder: pass one, or None for the model's shipped transcoders")


def decoder_directions(transcoders, layer: int, features: list[int]) -> Float[Tensor, "n d_model"]:
    """The direction each feature of ``layer`` writes, float32: a per-layer transcoder's decoder row ``W_dec[f]``; a
    cross-layer transcoder's decoder rows summed over every layer it writes to (``W_dec[layer][f].sum(0)``: its
    whole write into the residual stream per unit of activation)."""
    with torch.no_grad():
        if isinstance(transcoders, CrossLayerTranscoder):
            return transcoders.summed_decoder(layer, features)
        return transcoders[layer].W_dec[features].float()


def _activations(ts, m, layer: int, x: Tensor, features: list[int]) -> Float[Tensor, "... n"]:
    """The activations of ``features`` of ``layer`` from ``blocks.{layer}.ln2.hook_normalized`` ``x``, float32."""
    x = mlp_input(m, layer, x)
    if isinstance(ts, CrossLayerTranscoder):
        pre = x.to(ts.W_enc.dtype) @ ts.W_enc[layer][features].T + ts.b_enc[layer][features]
        return (pre * (pre > ts.threshold[layer][features])).float()
    tc = ts[layer]
    vals, idx = tc.topk(tc.pre_acts(x))
    dense = torch.zeros(*vals.shape[:-1], tc.d_transcoder, dtype=torch.float32, device=vals.device)
    return dense.scatter_(-1, idx, vals.float())[..., features]


def _weights_sha256(ts, layer: int) -> str:
    """sha256 of the weights a layer's labels depend on (names, shapes and float32 values): a per-layer
    transcoder's whole state; of a cross-layer transcoder, the layer's encoder, biases and thresholds and its
    decoder to every layer it writes to (``W_dec[layer]``)."""
    if isinstance(ts, CrossLayerTranscoder):
        sd = {"W_enc": ts.W_enc[layer], "b_enc": ts.b_enc[layer], "threshold": ts.threshold[layer],
              "W_dec": ts.W_dec[layer]}
    else:
        sd = ts[layer].state_dict()
    h = hashlib.sha256()
    for name, t in sorted(sd.items()):
        h.update(f"{name}:{tuple(t.shape)};".encode())
        h.update(t.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def _folder_of(ts) -> Optional[Path]:
    folder = ts.info.get("folder") if isinstance(ts, (TranscoderSet, CrossLayerTranscoder)) else None
    return Path(folder) if folder else None


# -- arguments --------------------------------------------------------------------------------------------------


def _check_features(features, widths: dict[int, int]) -> list[tuple[int, int]]:
    if features is None:
        return [(layer, f) for layer in sorted(widths) for f in range(widths[layer])]
    span = ", ".join(f"layer {layer}: 0..{w - 1}" for layer, w in sorted(widths.items()))
    if isinstance(features, (str, bytes, dict)) or not hasattr(features, "__iter__"):
        raise ArgumentError(f"features={describe(features)} is not a list of (layer, feature) pairs ({span}); None "
                            "labels every feature")
    out = []
    for i, pair in enumerate(features):
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise ArgumentError(f"features[{i}]={describe(pair)} is not a (layer, feature) pair ({span})")
        layer = integer(pair[0])
        if layer is None or layer not in widths:
            raise ArgumentError(f"features[{i}] layer={describe(pair[0])} has no transcoder: the layers are "
                                f"{sorted(widths)}")
        out.append((layer, check_index(pair[1], f"features[{i}] feature", widths[layer],
                                       what=f"layer {layer}'s transcoder features")))
    if not out:
        raise ArgumentError(f"features is empty: pass at least one (layer, feature) pair ({span}), or None for all")
    return out


def _settings(m, n_texts, length, seed, top) -> dict:
    n_texts = check_count(n_texts, "n_texts", high=1 << 16, what="held-out windows measured")
    length = check_count(length, "length", high=m.cfg.n_ctx, what=f"tokens per window, at most the context "
                                                                   f"{m.cfg.n_ctx}")
    seed = check_count(seed, "seed", low=0, what="the held-out sample's seed")
    top = check_count(top, "top", high=1 << 20, what="strongest firings whose tokens are counted")
    return {"n_texts": n_texts, "length": length, "seed": seed, "top": top, "corpus": sample_corpus(m),
            "rules": _RULES}


# -- measuring --------------------------------------------------------------------------------------------------


def labels_fingerprint(model, transcoders: TranscodersArg = None, *, kind: Optional[str] = None, n_texts: int = 32,
                       length: int = 128, seed: int = 0, top: int = 100) -> dict:
    """What a labels file records and a request must match: ``model`` (the checkpoint's
    :func:`~sprout_interp.core.fingerprints.fingerprint`), ``kind`` ("per_layer" or "clt"), ``layers``
    (``{layer: sha256 of the weights its labels depend on}``) and ``settings`` (``n_texts``, ``length``, ``seed``,
    ``top``, the held-out ``corpus`` and the label rules' version)."""
    m = as_hooked(model)
    ts = _resolve(m, transcoders, kind)
    return _fingerprint(m, ts, sorted(_layers_of(ts)), _settings(m, n_texts, length, seed, top))


def _fingerprint(m, ts, layers: list[int], settings: dict) -> dict:
    return {"model": fingerprint(m), "kind": _kind(ts), "layers": {str(i): _weights_sha256(ts, i) for i in layers},
            "settings": settings}


@torch.no_grad()
def _measure(m, ts, pairs: list[tuple[int, int]], tokens: Tensor, mask: Optional[Tensor], top: int,
             batch: int) -> pd.DataFrame:
    """The label table of ``pairs`` measured on ``tokens`` (one forward per batch of rows, every layer read from it)."""
    by_layer: dict[int, list[int]] = {}
    for layer, f in pairs:
        if f not in by_layer.setdefault(layer, []):
            by_layer[layer].append(f)
    layers = sorted(by_layer)
    hooks = [input_hook(i) for i in layers]
    tokens = tokens.to(m.device)
    xs: dict[int, list[Tensor]] = {i: [] for i in layers}
    for s in range(0, tokens.shape[0], batch):
        _, cache = m.run_with_cache(tokens[s:s + batch], names_filter=hooks, stop_at_layer=layers[-1] + 1)
        for i, h in zip(layers, hooks):
            xs[i].append(cache[h])
    real = torch.ones(tokens.shape, dtype=torch.bool) if mask is None else mask.cpu().bool()
    n_real = max(int(real.sum()), 1)
    toks = tokens.cpu()
    # where_it_fires reads only the sample's tokens, mask and repeat flags: an index of no recorded latents
    sample = FeatureIndex(tokens=toks, vals=torch.zeros(*toks.shape, 0), idx=torch.zeros(*toks.shape, 0,
                          dtype=torch.long), hook_name="", d_sae=0, mask=None if mask is None else real)
    id_strings = [str(i) for i in range(m.cfg.d_vocab)]  # token_tables then names ids; strings come after
    strings = vocabulary_strings(m)
    W_U = m.W_U.float()
    rows: dict[tuple[int, int], dict] = {}
    for layer in layers:
        feats = by_layer[layer]
        acts = torch.cat([_activations(ts, m, layer, x, feats) for x in xs.pop(layer)]).cpu()  # (B, T, n)
        acts = acts * real[..., None]
        B, T, n = acts.shape
        flat = acts.reshape(B * T, n)
        fires = (flat > 0).sum(0)
        kk = min(top, B * T)
        tv, ti = flat.topk(kk, dim=0)  # (kk, n), strongest first
        eff = decoder_directions(ts, layer, feats).to(W_U.device) @ W_U  # (n, vocab)
        pv, pi = eff.topk(min(2, eff.shape[-1]), dim=-1)
        pv, pi = pv.cpu(), pi.cpu()
        for c, f in enumerate(feats):
            order = ti[:, c][tv[:, c] > 0]
            promoted = strings[int(pi[c, 0])]
            prom_logit = float(pv[c, 0])
            prom_margin = float(pv[c, 0] - pv[c, 1]) if pv.shape[1] > 1 else 0.0
            row = dict(layer=layer, block=layer + 1, feature=f, frequency=int(fires[c]) / n_real,
                       max_activation=max(float(tv[0, c]), 0.0), promoted=promoted, promoted_logit=prom_logit,
                       promoted_margin=prom_margin)
            if order.numel():
                cur, prev = token_tables(acts[..., c], toks, id_strings, order, 2)
                row.update(_top(cur, "top", strings), **_top(prev, "previous", strings))
                w = where_it_fires(sample, acts[..., c], order)
                row.update(repeat_share=w["repeat_share"], continued_share=w["continued_share"])
                where = where_word(w["repeat_share"], w["repeat_base"], w["continued_share"], w["continued_base"])
            else:
                row.update(top_token="", top_share=0.0, top_margin=0.0, previous_token="", previous_share=0.0,
                           previous_margin=0.0, repeat_share=0.0, continued_share=0.0)
                where = ""
            row["label"] = label_text(row["top_token"] or None, row["top_share"], row["previous_token"] or None,
                                      row["previous_share"], promoted, row["frequency"], where)
            rows[(layer, f)] = row
    return pd.DataFrame([rows[p] for p in pairs], columns=list(LABEL_COLUMNS))


def _top(shares: pd.DataFrame, name: str, strings: list[str]) -> dict:
    """``{name}_token``, ``{name}_share``, ``{name}_margin`` from a :func:`token_tables` table of token ids."""
    first = shares.iloc[0]
    token = first["token"] if first["token"] == _START else strings[int(first["token"])]
    second = float(shares.iloc[1]["share"]) if len(shares) > 1 else 0.0
    return {f"{name}_token": token, f"{name}_share": float(first["share"]),
            f"{name}_margin": float(first["share"]) - second}


def feature_labels(model, transcoders: TranscodersArg = None, features=None, *, kind: Optional[str] = None,
                   texts=None, n_texts: int = 32, length: int = 128, seed: int = 0, top: int = 100, batch: int = 16,
                   use_file: bool = True) -> pd.DataFrame:
    """A short measured label for each transcoder feature (the module docstring says how each part is measured).

    Args:
        transcoders, kind: the transcoders as :func:`~sprout_interp.circuits.attribution_graph.attribution_graph`
            takes them: a TranscoderSet, ``{layer: Transcoder}``, a CrossLayerTranscoder or a folder; None: the
            shipped ones of ``kind`` ("per_layer" or "clt"; None: the kind graphs use by default).
        features: ``(layer, feature)`` pairs (layer 0-indexed), in the order the rows are wanted; None: every
            feature of every layer.
        texts: a text or a list of texts (of any lengths; padding counts nowhere) to measure on instead of the
            held-out sample; None: ``n_texts`` held-out windows of ``length`` tokens drawn with ``seed``.
        top: how many of a feature's strongest firings the token shares count.
        batch: rows per forward pass.
        use_file: read the labels file beside the transcoders (``labels.json``) when it was measured with these
            settings for this model and these weights (never with ``texts``); False: always measure.

    Returns a DataFrame with the columns :data:`LABEL_COLUMNS`, one row per pair: ``layer``, ``block`` (layer + 1),
    ``feature``, ``label`` (plain text, at most :data:`MAX_LABEL` characters), ``frequency`` (share of tokens it
    fires on, 0-1), ``max_activation``, ``top_token`` / ``previous_token`` (vocabulary strings, ``"(start)"`` for the
    window's first position, ``""`` when it never fired) with their ``*_share`` of the activation of its ``top``
    strongest firings (0-1) and ``*_margin`` (the gap to the runner-up's share), ``repeat_share`` and
    ``continued_share`` (0-1: on repeated tokens, on repeated pairs), ``promoted`` (the token its
    direction raises most) with ``promoted_logit`` (logits per unit of activation) and ``promoted_margin``.
    ``attrs``: ``source`` ("file" or "measured"), ``settings``, ``kind``. Raises ArgumentError naming a bad
    argument and its valid range, AttributionGraphError for a ``kind`` that is not one, TranscoderNotFoundError when
    the model ships none of that kind, TranscoderMismatchError for transcoders of another model.
    """
    m = as_hooked(model)
    ts = _resolve(m, transcoders, kind)
    widths = _layers_of(ts)
    pairs = _check_features(features, widths)
    settings = _settings(m, n_texts, length, seed, top)
    batch = check_count(batch, "batch", high=1 << 16, what="rows per forward pass")
    if texts is None and use_file is True:
        held = _from_file(m, ts, pairs, settings)
        if held is not None:
            return held
    elif use_file is not True and use_file is not False:
        raise ArgumentError(f"use_file={describe(use_file)} must be True or False")
    if texts is None:
        tokens, mask = held_out_for(m, n=settings["n_texts"], length=settings["length"], seed=settings["seed"]), None
    else:
        if not isinstance(texts, str) and not (isinstance(texts, (list, tuple)) and texts
                                                and all(isinstance(t, str) for t in texts)):
            raise ArgumentError(f"texts={describe(texts)} is not a text or a non-empty list of texts; None measures on "
                                "the held-out sample")
        tokens, mask, _ = feature_input(m, [texts] if isinstance(texts, str) else list(texts))
        settings = dict(settings, n_texts=None, length=None, seed=None, corpus=None)
    out = _measure(m, ts, pairs, tokens, mask, settings["top"], batch)
    out.attrs.update(source="measured", settings=settings, kind=_kind(ts))
    return out


# -- the file ---------------------------------------------------------------------------------------------------


def write_labels(model, transcoders: TranscodersArg = None, folder: Union[str, Path, None] = None, *,
                 kind: Optional[str] = None, n_texts: int = 32, length: int = 128, seed: int = 0, top: int = 100,
                 batch: int = 16, reuse: bool = True) -> Path:
    """Measure every feature's label (:func:`feature_labels` with ``use_file=False``) and write ``labels.json`` into
    ``folder`` (default: the transcoders' own folder, where they were loaded from; ``transcoders`` and ``kind`` as
    :func:`feature_labels` takes them). The file: ``format``,
    ``fingerprint`` (:func:`labels_fingerprint`), ``layers``: per layer, column lists of ``label`` and the measured
    parts (tokens as vocabulary ids, -1 for "(start)", null where it never fired; ``fires``, the count of tokens it
    fired on of ``n_tokens``; every other number in whole thousandths). With ``reuse``, the layers of a labels file
    already there whose fingerprint (model, settings and that layer's weights) matches are kept as they are and only
    the others measured (a retrained layer costs its own measurement). Returns the path."""
    m = as_hooked(model)
    ts = _resolve(m, transcoders, kind)
    folder = _folder_of(ts) if folder is None else Path(folder)
    if folder is None:
        raise ArgumentError("these transcoders were not loaded from a folder: pass folder=... to write labels.json")
    if reuse is not True and reuse is not False:
        raise ArgumentError(f"reuse={describe(reuse)} must be True or False")
    settings = _settings(m, n_texts, length, seed, top)
    widths = _layers_of(ts)
    fp = _fingerprint(m, ts, sorted(widths), settings)
    n_tokens = settings["n_texts"] * settings["length"]
    layers = _reusable(folder / LABELS_FILE, fp, n_tokens, widths) if reuse else {}
    stale = [layer for layer in sorted(widths) if str(layer) not in layers]
    table = feature_labels(m, ts, [(layer, f) for layer in stale for f in range(widths[layer])], n_texts=n_texts,
                           length=length, seed=seed, top=top, batch=batch, use_file=False) if stale else \
        pd.DataFrame(columns=list(LABEL_COLUMNS))
    ids = {s: i for i, s in reversed(list(enumerate(vocabulary_strings(m))))}
    ids[_START] = -1
    for layer, g in table.groupby("layer", sort=True):
        col = {"label": list(g["label"])}
        for name in ("top_token", "previous_token", "promoted"):
            col[name] = [ids[s] if s else None for s in g[name]]
        col["fires"] = [round(float(v) * n_tokens) for v in g["frequency"]]
        for name in _MILLI:
            col[name] = [round(float(v) * 1000) for v in g[name]]
        layers[str(layer)] = col
    doc = {"format": _FORMAT, "version": 1, "n_tokens": n_tokens,
           "units": "tokens as vocabulary ids (-1: the window's first position, null: never fired); fires: tokens "
                    "it fired on, of n_tokens; every other number in thousandths",
           "fingerprint": fp, "layers": {k: layers[k] for k in sorted(layers, key=int)}}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LABELS_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def _reusable(path: Path, fp: dict, n_tokens: int, widths: dict[int, int]) -> dict[str, dict]:
    """The layers of the labels file at ``path`` that a file of fingerprint ``fp`` may keep as they are: those whose
    weights' sha256 matches, when the model, kind, settings and sample size match too; {} for anything else."""
    try:
        doc = read_json(path, "feature labels") if path.is_file() else {}
        old = doc.get("fingerprint") or {}
        if doc.get("format") != _FORMAT or doc.get("n_tokens") != n_tokens or \
                any(old.get(k) != fp[k] for k in ("model", "kind", "settings")):
            return {}
        return {k: v for k, v in doc["layers"].items() if (old.get("layers") or {}).get(k) == fp["layers"].get(k)
                and isinstance(v, dict) and k.isdigit() and int(k) in widths and len(v.get("label", ())) == widths[int(k)]}
    except (SproutError, AttributeError, TypeError, ValueError):
        return {}


def read_labels(model, path: Union[str, Path]) -> tuple[dict, pd.DataFrame]:
    """``(fingerprint, table)`` of a labels file written by :func:`write_labels` for ``model``: the table as
    :func:`feature_labels` gives it, numbers as rounded in the file, the margins NaN (the file keeps none). Raises
    TranscoderMismatchError for a file that is not one."""
    m = as_hooked(model)
    path = Path(path)
    try:
        doc = read_json(path, "feature labels")
    except SproutError as e:
        raise TranscoderMismatchError(f"{path} is not a labels file ({e}): write it again with `python -m "
                                      "sprout_interp.features.labels --model NAME --write`") from None
    strings = vocabulary_strings(m)

    def token(i) -> str:
        if i is None:
            return ""
        if i == -1:
            return _START
        return strings[i]

    try:
        n_tokens = doc.get("n_tokens")
        if doc.get("format") != _FORMAT or not isinstance(doc.get("layers"), dict) or integer(n_tokens) is None \
                or n_tokens < 1:
            raise ValueError("no labels")
        frames = []
        for layer, col in doc["layers"].items():
            n = len(col["label"])
            df = pd.DataFrame({"layer": int(layer), "block": int(layer) + 1, "feature": range(n),
                               "label": [str(s) for s in col["label"]],
                               "frequency": [int(v) / n_tokens for v in col["fires"]],
                               **{k: [int(v) / 1000 for v in col[k]] for k in _MILLI},
                               **{k: float("nan") for k in _MARGINS},
                               **{k: [token(i) for i in col[k]] for k in ("top_token", "previous_token", "promoted")}})
            if any(len(col[k]) != n for k in col):
                raise ValueError("columns of unequal length")
            frames.append(df)
        table = pd.concat(frames, ignore_index=True)[list(LABEL_COLUMNS)]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise TranscoderMismatchError(f"{path} is damaged ({str(e)[:80]}): write it again with `python -m "
                                      "sprout_interp.features.labels --model NAME --write`") from None
    return doc.get("fingerprint") or {}, table


def _from_file(m, ts, pairs: list[tuple[int, int]], settings: dict) -> Optional[pd.DataFrame]:
    """The rows of ``pairs`` from the labels file beside ``ts`` when it matches the request; else None."""
    folder = _folder_of(ts)
    if folder is None or not (folder / LABELS_FILE).is_file():
        return None
    try:
        fp, table = read_labels(m, folder / LABELS_FILE)
    except SproutError:
        return None
    layers = sorted({layer for layer, _ in pairs})
    if not isinstance(fp, dict) or fp.get("settings") != settings or fp.get("kind") != _kind(ts) \
            or not isinstance(fp.get("layers"), dict):
        return None
    if any(fp["layers"].get(str(i)) != _weights_sha256(ts, i) for i in layers) or fp.get("model") != fingerprint(m):
        return None
    index = {(int(r.layer), int(r.feature)): i for i, r in enumerate(table[["layer", "feature"]].itertuples())}
    if any(p not in index for p in pairs):
        return None
    out = table.iloc[[index[p] for p in pairs]].reset_index(drop=True)
    out.attrs.update(source="file", settings=settings, kind=_kind(ts))
    return out


# -- the command ------------------------------------------------------------------------------------------------


@command_line
def main(argv: Optional[list[str]] = None) -> int:
    """Command line: ``--write`` measures every feature's label and writes labels.json beside the transcoders;
    without it, says whether that file is fresh (exit 1 when it is missing or stale) and prints a few labels."""
    p = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sprout", help="a shipped name or a checkpoint path")
    p.add_argument("--folder", default=None, help="a transcoder or CLT folder (default: the shipped ones of --kind)")
    p.add_argument("--kind", choices=("per_layer", "clt"), default="per_layer",
                   help="which shipped transcoders: per-layer (<checkpoint>/transcoders) or the CLT (<checkpoint>/clt)")
    p.add_argument("--write", action="store_true", help="measure every feature and write labels.json")
    p.add_argument("--n-texts", type=Whole(1), default=32, help="held-out windows")
    p.add_argument("--length", type=Whole(1), default=128, help="tokens per window")
    p.add_argument("--seed", type=Whole(0), default=0)
    p.add_argument("--top", type=Whole(1), default=100, help="strongest firings counted per feature")
    a = p.parse_args(argv)
    import time

    from sprout_interp.core.hooked import load_hooked

    m = load_hooked(a.model)
    ts = _resolve(m, a.folder, None if a.folder else a.kind)
    kw = dict(n_texts=a.n_texts, length=a.length, seed=a.seed, top=a.top)
    if a.write:
        t = time.perf_counter()
        path = write_labels(m, ts, **kw)
        fp, table = read_labels(m, path)
        never = int((table["label"] == NEVER).sum())
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB): {len(table)} features, {never} never fire on "
              f"held-out text, in {time.perf_counter() - t:.1f} s")
        return 0
    folder = _folder_of(ts)
    widths = _layers_of(ts)
    sample = [(layer, f) for layer in sorted(widths) for f in range(0, widths[layer], max(widths[layer] // 4, 1))]
    got = feature_labels(m, ts, sample, **kw)
    fresh = got.attrs["source"] == "file"
    print(f"{folder / LABELS_FILE if folder else 'labels.json'}: {'fresh' if fresh else 'missing or stale'}")
    print(got[["layer", "feature", "label"]].to_string(index=False))
    return 0 if fresh else 1


if __name__ == "__main__":
    sys.exit(main())
