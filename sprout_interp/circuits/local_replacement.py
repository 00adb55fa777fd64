"""The local replacement model of one prompt, the frozen linear model an attribution graph is computed in
(Ameisen et al. 2025, "Circuit Tracing"; ``circuit-tracer``): each block's feed-forward replaced by its transcoder
(:mod:`sprout_interp.features.transcoder`) plus an error node per (layer, position) that holds what the transcoder
misses on this prompt (``mlp_out - ŷ``), so it reproduces the real forward exactly; the attention patterns and every
RMSNorm's scale (``hook_scale``: ln1, ln2 and ln_final) frozen at their values on the prompt.

Two kinds of transcoders (``TRANSCODER_KINDS``): ``"per_layer"``, one transcoder per block, each feature writing
to its own block's feed-forward output only; ``"clt"``, a cross-layer transcoder
(:mod:`sprout_interp.features.clt`), whose features of layer ``i`` read feed-forward ``i``'s input and write to the
output of every feed-forward ``j >= i`` (``ŷ_j = b_dec[j] + Σ_{i <= j} a_i @ W_dec[i][:, j - i]``; the error node
of (``j``, pos) is then ``mlp_out_j - ŷ_j``, the CLT's whole reconstruction at that layer).

Also here: which kinds a checkpoint ships and which is best (:func:`shipped_kinds`, :func:`best_kind`; the
recorded held-out quality decides), the transcoders a graph uses resolved from an argument
(:func:`resolve_transcoders`), the per-layer transcoders checked against the model (:func:`check_transcoders`), the
prompt's ids with circuit-tracer's position-0 convention (:func:`prompt_tokens`), the logits a graph explains
(:func:`salient_logits`) and seeded random transcoders for tests and benchmarks (:func:`random_transcoders`,
:func:`random_clt`). :mod:`~sprout_interp.circuits.attribution_graph` computes the graph in this model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.core.arguments import check_count, describe
from sprout_interp.core.errors import (
    AttributionGraphError,
    ContextLengthError,
    SproutError,
    TranscoderMismatchError,
    TranscoderNotFoundError,
)
from sprout_interp.core.files import as_path, read_json
from sprout_interp.core.fingerprints import fingerprint, fingerprint_mismatch
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.texts import TEXTS
from sprout_interp.core.tokens import eot_id
from sprout_interp.features.clt import CrossLayerTranscoder, clt_folder, load_clt
from sprout_interp.features.transcoder import (
    TC_CONFIG,
    Transcoder,
    TranscoderSet,
    load_transcoders,
    max_k,
    mlp_input,
    transcoder_folder,
)

__all__ = ["TranscodersLike", "TRANSCODER_KINDS", "LocalReplacement", "shipped_kinds", "best_kind",
           "resolve_transcoders", "transcoder_kind", "check_transcoders", "check_clt", "prompt_tokens",
           "local_replacement", "salient_logits", "rms_norm_jacobian", "random_transcoders", "random_clt"]


TranscodersLike = Union[TranscoderSet, dict, CrossLayerTranscoder, str, Path, None]
#: the kinds of transcoders a graph can replace the feed-forwards with: one per block, or one cross-layer transcoder
TRANSCODER_KINDS = ("per_layer", "clt")


# -- the local replacement model on one prompt ----------------------------------------------------------------


@dataclass
class LocalReplacement:
    """The frozen pieces of one prompt's local replacement model (one forward of the real model).

    Attributes (L layers, T positions, H heads, d = d_model):
        tokens (T,); bos: whether position 0 holds no feature or error nodes.
        patterns (L, H, T, T) (query, key); scale1 / scale2 (L, T): ln1's and ln2's ``hook_scale``; scale_final (T,).
        mlp_in (L, T, d): what each feed-forward read (ln2's output times its gain); mlp_out (L, T, d): what it wrote.
        feat_layer / feat_pos / feat_index (n,): the active features, sorted by (layer, pos, feature);
        feat_act (n,): their activations; feat_input (n,): ``W_enc[f] · x`` (pre-activation without ``b_enc``).
        errors (L, T, d): ``mlp_out - ŷ`` (zero at position 0 with ``bos``); consts (L, T, d): the constant
        writes (``b_dec``; at a zeroed position 0, ``mlp_out - skip``). logits (d_vocab,): at the last position.
        transcoders: the per-layer transcoders, one per layer (as given); empty with a cross-layer transcoder.
        final_normalized (d,): ln_final's ``hook_normalized`` at the last position (``x / scale_final[-1]``, before
        the gain): where :func:`rms_norm_jacobian` takes the final norm's first-order map.
        clt: the cross-layer transcoder (None with per-layer transcoders): its features of layer ``i`` write to
        every layer ``j >= i`` (``kind`` "clt"), and ``errors`` / ``consts`` are of its whole reconstruction.
    """

    tokens: Int[Tensor, " pos"]
    bos: bool
    patterns: Float[Tensor, "layer head pos pos"]
    scale1: Float[Tensor, "layer pos"]
    scale2: Float[Tensor, "layer pos"]
    scale_final: Float[Tensor, " pos"]
    mlp_in: Float[Tensor, "layer pos d_model"]
    mlp_out: Float[Tensor, "layer pos d_model"]
    feat_layer: Int[Tensor, " n"]
    feat_pos: Int[Tensor, " n"]
    feat_index: Int[Tensor, " n"]
    feat_act: Float[Tensor, " n"]
    feat_input: Float[Tensor, " n"]
    errors: Float[Tensor, "layer pos d_model"]
    consts: Float[Tensor, "layer pos d_model"]
    logits: Float[Tensor, " vocab"]
    transcoders: list = field(repr=False)
    final_normalized: Float[Tensor, " d_model"] = field(repr=False)
    clt: Optional[CrossLayerTranscoder] = field(default=None, repr=False)

    @property
    def n_features(self) -> int:
        return int(self.feat_layer.numel())

    @property
    def kind(self) -> str:
        """Which transcoders replace the feed-forwards (``TRANSCODER_KINDS``): "per_layer" or "clt"."""
        return "per_layer" if self.clt is None else "clt"

    def layer_span(self, layer: int) -> tuple[int, int]:
        """The node indices ``[start, stop)`` of layer ``layer``'s active features."""
        lo = int(torch.searchsorted(self.feat_layer, layer))
        return lo, int(torch.searchsorted(self.feat_layer, layer, right=True))

    def encoder(self, layer: int) -> tuple[Float[Tensor, "d_transcoder d_model"], Float[Tensor, " d_transcoder"]]:
        """(``W_enc``, ``b_enc``) of layer ``layer``'s features, float32 (detached)."""
        if self.clt is None:
            tc = self.transcoders[layer]
            return tc.W_enc.detach().float(), tc.b_enc.detach().float()
        return self.clt.W_enc[layer].detach().float(), self.clt.b_enc[layer].detach().float()

    def decoder(self, source: int, target: int) -> Float[Tensor, "d_transcoder d_model"]:
        """The rows layer ``source``'s features write into feed-forward ``target``'s output (float32, detached): a
        per-layer transcoder's ``W_dec`` when ``target == source``; a CLT's ``W_dec[source][:, target - source]``
        for ``target >= source``. SproutError for a target the features do not write to."""
        if target not in self.targets(source):
            raise SproutError(f"layer {source}'s features write to layers {list(self.targets(source))}, not {target}")
        if self.clt is None:
            return self.transcoders[source].W_dec.detach().float()
        return self.clt.W_dec[source][:, target - source].detach().float()

    def targets(self, source: int) -> range:
        """The layers whose feed-forward output layer ``source``'s features write to: its own (per-layer), or its
        own and every later one (CLT)."""
        return range(source, source + 1) if self.clt is None else range(source, self.clt.n_layers)

    def decoder_norms(self, layer: int) -> Float[Tensor, " d_transcoder"]:
        """Each of layer ``layer``'s features' decoder norm over every layer it writes to (float32)."""
        if self.clt is None:
            return self.transcoders[layer].W_dec.detach().float().norm(dim=-1)
        return self.clt.W_dec[layer].detach().float().flatten(1).norm(dim=-1)

    def skip_out(self, layer: int, x: Float[Tensor, "pos d_model"]) -> Float[Tensor, "pos d_model"]:
        """What feed-forward ``layer``'s replacement writes through a skip connection from its input ``x`` (zeros
        for a CLT and for per-layer transcoders without one), float32."""
        if self.clt is None:
            return self.transcoders[layer].skip(x).float()
        return torch.zeros_like(x, dtype=torch.float32)


def _mean_fve(rows, n_layers: int) -> float:
    """The mean of every layer's recorded held-out ``fve`` (NaN when a layer's is missing or not a number)."""
    got = {}
    for r in rows:
        if isinstance(r, dict) and isinstance(r.get("layer"), int) and isinstance(r.get("fve"), (int, float)) \
                and not isinstance(r.get("fve"), bool):
            got[r["layer"]] = float(r["fve"])
    if sorted(got) != list(range(n_layers)) or not all(math.isfinite(v) for v in got.values()):
        return math.nan
    return sum(got.values()) / n_layers


def _kind_folders(m) -> dict[str, Path]:
    """Where each kind would be shipped beside the checkpoint of ``m`` (empty when it has no folder)."""
    try:
        return {"per_layer": transcoder_folder(m), "clt": clt_folder(m)}
    except TranscoderNotFoundError:
        return {}


def shipped_kinds(model) -> dict[str, float]:
    """The kinds of transcoders shipped beside ``model``'s checkpoint (``<checkpoint>/transcoders/``: "per_layer";
    ``<checkpoint>/clt/``: "clt"), each with its recorded quality: the mean over layers of the held-out fraction of
    each feed-forward's output variance explained (``fve``), written into the folder's ``config.yaml`` when it was
    trained (per-layer: ``sprout.layers[i].quality.fve``; CLT: ``sprout.info.quality[i].fve``, every earlier layer's
    features included), NaN when not recorded. Reads the configs only (no weights); an empty dict when none is
    shipped. A config that is not a JSON object raises what :func:`~sprout_interp.core.files.read_json` raises."""
    m = as_hooked(model)
    out = {}
    for kind, folder in _kind_folders(m).items():
        if not (folder / TC_CONFIG).is_file():
            continue
        cfg = read_json(folder / TC_CONFIG, f"{kind} transcoder config")
        sprout = cfg.get("sprout") if isinstance(cfg.get("sprout"), dict) else {}
        if kind == "per_layer":
            layers = sprout.get("layers") if isinstance(sprout.get("layers"), dict) else {}
            rows = [dict(layer=int(k), fve=(v.get("quality") or {}).get("fve"))
                    for k, v in layers.items() if str(k).isdigit() and isinstance(v, dict)
                    and isinstance(v.get("quality") or {}, dict)]
        else:
            info = sprout.get("info") if isinstance(sprout.get("info"), dict) else {}
            rows = info.get("quality") if isinstance(info.get("quality"), list) else []
        out[kind] = _mean_fve(rows, m.cfg.n_layers)
    return out


def best_kind(model) -> str:
    """The kind of transcoders ``model``'s graphs use by default: of the kinds shipped beside its checkpoint
    (:func:`shipped_kinds`), the one whose recorded mean held-out FVE is higher; "per_layer" on a tie or when
    neither records one, a kind with a number over one without. TranscoderNotFoundError when none is shipped."""
    kinds = shipped_kinds(model)
    if not kinds:
        m = as_hooked(model)
        raise TranscoderNotFoundError(
            f"{m.name or 'the model'} ships no transcoders (neither <checkpoint>/transcoders/ nor <checkpoint>/clt/): "
            "train them (python -m sprout_interp.features.transcoder_train or sprout_interp.features.clt_train) or "
            "pass transcoders=...")
    return max(kinds, key=lambda k: (-math.inf if math.isnan(kinds[k]) else kinds[k], k == "per_layer"))


def transcoder_kind(transcoders) -> str:
    """The kind (``TRANSCODER_KINDS``) of resolved transcoders: "clt" for a CrossLayerTranscoder, else
    "per_layer"."""
    return "clt" if isinstance(transcoders, CrossLayerTranscoder) else "per_layer"


def resolve_transcoders(model, transcoders: TranscodersLike = None, kind: Optional[str] = None
                        ) -> Union[TranscoderSet, dict, CrossLayerTranscoder]:
    """The transcoders a graph of ``model`` uses, from what was passed:

    * ``transcoders`` a TranscoderSet, ``{layer: Transcoder}`` or CrossLayerTranscoder: itself (``kind``, if given,
      must be its kind);
    * a folder (str or Path): the per-layer set or the CLT saved there (its ``config.yaml``'s ``model_kind`` says
      which);
    * None: the shipped transcoders of ``kind`` ("per_layer" or "clt"), or with ``kind=None`` the best shipped
      kind (:func:`best_kind`).

    Raises AttributionGraphError for a ``kind`` that is not one of ``TRANSCODER_KINDS`` or does not match
    ``transcoders``, TranscoderNotFoundError naming the kinds that exist when ``kind`` is not shipped, and what the
    loaders raise for a damaged folder."""
    m = as_hooked(model)
    if kind is not None and (not isinstance(kind, str) or kind not in TRANSCODER_KINDS):
        raise AttributionGraphError(f"kind must be one of {TRANSCODER_KINDS} (per-layer transcoders or a cross-layer "
                                    f"transcoder) or None (the best shipped kind), got {describe(kind)}")
    if isinstance(transcoders, (str, Path)):
        folder = as_path(transcoders, "transcoders", "a folder of transcoders")
        cfg = read_json(folder / TC_CONFIG, "transcoder config") if (folder / TC_CONFIG).is_file() else {}
        transcoders = load_clt(m, folder) if cfg.get("model_kind") == "cross_layer_transcoder" else \
            load_transcoders(m, folder)
    if transcoders is not None:
        got = transcoder_kind(transcoders)
        if kind is not None and kind != got:
            raise AttributionGraphError(f"kind={kind!r} but transcoders is {'a cross-layer transcoder' if got == 'clt' else 'per-layer'} "
                                        f"({got!r}): pass one of them, or both of the same kind")
        return transcoders
    if kind is None:
        kind = best_kind(m)
    kinds = shipped_kinds(m)
    if kind not in kinds:
        have = ", ".join(repr(k) for k in kinds) or "none"
        what = "cross-layer transcoder (<checkpoint>/clt/)" if kind == "clt" else \
            "per-layer transcoders (<checkpoint>/transcoders/)"
        raise TranscoderNotFoundError(f"{m.name or 'the model'} ships no {what}: kind must be one it ships ({have}), "
                                      "or pass transcoders=...")
    return load_clt(m) if kind == "clt" else load_transcoders(m)


def check_clt(model, clt: CrossLayerTranscoder) -> CrossLayerTranscoder:
    """``clt`` checked against ``model``: every layer, the model's width, its checkpoint (the fingerprint it
    records). TranscoderMismatchError otherwise."""
    m = as_hooked(model)
    if (clt.n_layers, clt.d_model) != (m.cfg.n_layers, m.cfg.d_model):
        raise TranscoderMismatchError(
            f"the cross-layer transcoder spans {clt.n_layers} layers of width {clt.d_model} but {m.name or 'the model'} "
            f"has {m.cfg.n_layers} of width {m.cfg.d_model}: load the CLT of this model")
    got = clt.info.get("fingerprint")
    if got and fingerprint_mismatch(fingerprint(m), got):
        raise TranscoderMismatchError(
            f"the cross-layer transcoder was trained for another checkpoint: its "
            f"{', '.join(fingerprint_mismatch(fingerprint(m), got))} differ from {m.name or 'this model'}'s. Load the "
            "CLT of this model")
    return clt


def check_transcoders(model, transcoders: TranscodersLike) -> list[Transcoder]:
    """One transcoder per layer of ``model`` (a TranscoderSet, ``{layer: Transcoder}``, or None: the shipped set,
    :func:`~sprout_interp.features.transcoder.load_transcoders`), checked against the model.

    Raises TranscoderNotFoundError when a layer has none (a graph replaces every feed-forward) and
    TranscoderMismatchError for a transcoder of another width, layer or checkpoint.
    """
    m = as_hooked(model)
    if transcoders is None:
        transcoders = load_transcoders(m)
    if isinstance(transcoders, CrossLayerTranscoder):
        raise TranscoderMismatchError(
            "this analysis reads per-layer transcoders (one per block), not a cross-layer transcoder: pass a "
            "TranscoderSet (si.sae.load_transcoders(model)); attribution graphs and their intervention checks take "
            "either kind")
    if isinstance(transcoders, TranscoderSet):
        tcs = {tc.layer: tc for tc in transcoders}
    elif isinstance(transcoders, dict):
        tcs = dict(transcoders)
    else:
        raise AttributionGraphError(
            f"transcoders must be a TranscoderSet (si.sae.load_transcoders(model)), a dict {{layer: Transcoder}}, a "
            f"CrossLayerTranscoder where a graph takes one, a folder of either, or None for the shipped set, got "
            f"{type(transcoders).__name__}")
    missing = [i for i in range(m.cfg.n_layers) if i not in tcs]
    if missing:
        raise TranscoderNotFoundError(
            f"an attribution graph replaces every block's feed-forward, but transcoders has none for layer(s) "
            f"{missing} of {m.name or 'the model'} (layers 0..{m.cfg.n_layers - 1}): train or load all of them")
    fp = None
    out = []
    for layer in range(m.cfg.n_layers):
        tc = tcs[layer]
        if not isinstance(tc, Transcoder) or tc.layer != layer or tc.d_model != m.cfg.d_model:
            raise TranscoderMismatchError(
                f"transcoders[{layer}] must be a Transcoder of layer {layer} reading d_model {m.cfg.d_model}, got {tc!r}")
        got = tc.info.get("fingerprint")
        if got:
            fp = fingerprint(m) if fp is None else fp
            if fingerprint_mismatch(fp, got):
                raise TranscoderMismatchError(
                    f"the transcoder of layer {layer} was trained for another checkpoint: its "
                    f"{', '.join(fingerprint_mismatch(fp, got))} differ from {m.name or 'this model'}'s. Load the "
                    "transcoders of this model")
        out.append(tc)
    return out


def prompt_tokens(model, text, bos: bool = True) -> Int[Tensor, " pos"]:
    """The one prompt a graph is made for, as ids ``(pos,)``: a text or ids ``(pos,)`` / ``(1, pos)`` (through
    ``prepare_input``); with ``bos``, ``<|endoftext|>`` put first when it is not there already.

    Raises UnequalLengthsError for texts of different lengths and AttributionGraphError for a batch.
    """
    m = as_hooked(model)
    if not isinstance(bos, bool):
        raise AttributionGraphError(f"bos must be True or False, got {bos!r}")
    toks, _ = m.prepare_input(text, padding=False, argument="text")
    if toks.shape[0] != 1:
        raise AttributionGraphError(
            f"text holds {toks.shape[0]} rows: an attribution graph is made for one prompt; pass one text at a time")
    toks = toks[0]
    if bos:
        start = eot_id(m.tokenizer)
        if int(toks[0]) != start:
            if toks.numel() + 1 > m.cfg.n_ctx:
                raise ContextLengthError(
                    f"the prompt has {toks.numel()} tokens and bos=True puts <|endoftext|> first, more than the "
                    f"model's context of {m.cfg.n_ctx}: shorten it")
            toks = torch.cat([toks.new_tensor([start]), toks])
    return toks


@torch.no_grad()
def local_replacement(model, text, transcoders: TranscodersLike = None, bos: bool = True, *,
                      cross_layer: bool = False) -> LocalReplacement:
    """One forward of the real model on the prompt, giving the frozen pieces and the nodes' values of its local
    replacement model (see :class:`LocalReplacement`; ``text`` and ``bos`` as in :func:`attribution_graph`).

    ``transcoders``: per-layer transcoders (None: the shipped set); with ``cross_layer=True`` (the callers that
    handle both kinds: attribution graphs and their intervention checks) also a CrossLayerTranscoder. Analyses that
    read per-layer transcoders leave it False, so a CLT gets a TranscoderMismatchError naming why."""
    m = as_hooked(model)
    if not isinstance(cross_layer, bool):
        raise AttributionGraphError(f"cross_layer must be True or False, got {describe(cross_layer)}")
    if cross_layer and isinstance(transcoders, CrossLayerTranscoder):
        return _clt_replacement(m, text, check_clt(m, transcoders), bos)
    tcs = check_transcoders(m, transcoders)
    tokens = prompt_tokens(m, text, bos)
    fr = _frozen_pieces(m, tokens)
    mlp_in, mlp_out = fr["mlp_in"], fr["mlp_out"]
    errors, consts = torch.empty_like(mlp_out), torch.empty_like(mlp_out)
    layers, poss, idxs, acts, inputs = [], [], [], [], []
    for i, tc in enumerate(tcs):
        x = mlp_in[i]
        pre = tc.pre_acts(x).float()
        vals, idx = tc.topk(pre)
        dense = torch.zeros_like(pre).scatter_(-1, idx, vals)
        recon = tc.decode_sparse(vals, idx, x).float()
        errors[i] = mlp_out[i] - recon
        consts[i] = tc.b_dec.float()
        if bos:
            dense[0] = 0
            errors[i, 0] = 0
            consts[i, 0] = mlp_out[i, 0] - tc.skip(x[:1]).float()[0]
        pos, feat = dense.nonzero(as_tuple=True)  # row-major: sorted by (pos, feature)
        layers.append(torch.full_like(pos, i))
        poss.append(pos)
        idxs.append(feat)
        acts.append(dense[pos, feat])
        inputs.append(pre[pos, feat] - tc.b_enc.float()[feat])
    return LocalReplacement(
        tokens=tokens, bos=bos, patterns=fr["patterns"], scale1=fr["scale1"], scale2=fr["scale2"],
        scale_final=fr["scale_final"], mlp_in=mlp_in, mlp_out=mlp_out,
        feat_layer=torch.cat(layers), feat_pos=torch.cat(poss), feat_index=torch.cat(idxs), feat_act=torch.cat(acts),
        feat_input=torch.cat(inputs), errors=errors, consts=consts, logits=fr["logits"], transcoders=tcs,
        final_normalized=fr["final_normalized"])


def _frozen_pieces(m, tokens: Tensor) -> dict:
    """One forward of the real model on ``tokens`` (pos,): patterns, norm scales, each feed-forward's input and
    output (float32), the last logits and ln_final's normalized stream at the last position."""
    L = m.cfg.n_layers
    names = [act_name("scale"), act_name("normalized")]
    for i in range(L):
        names += [act_name("pattern", i), act_name("scale", i, "ln1"), act_name("scale", i, "ln2"),
                  act_name("normalized", i, "ln2"), act_name("mlp_out", i)]
    logits, cache = m.run_with_cache(tokens[None], names_filter=names)
    f32 = dict(dtype=torch.float32)
    return dict(
        patterns=torch.stack([cache[act_name("pattern", i)][0] for i in range(L)]).to(**f32),
        scale1=torch.stack([cache[act_name("scale", i, "ln1")][0, :, 0] for i in range(L)]).to(**f32),
        scale2=torch.stack([cache[act_name("scale", i, "ln2")][0, :, 0] for i in range(L)]).to(**f32),
        mlp_in=torch.stack([mlp_input(m, i, cache[act_name("normalized", i, "ln2")][0]) for i in range(L)]).to(**f32),
        mlp_out=torch.stack([cache[act_name("mlp_out", i)][0] for i in range(L)]).to(**f32),
        scale_final=cache[act_name("scale")][0, :, 0].to(**f32), logits=logits[0, -1].float(),
        final_normalized=cache[act_name("normalized")][0, -1].to(**f32))


def _clt_replacement(m, text, clt: CrossLayerTranscoder, bos: bool) -> LocalReplacement:
    """:func:`local_replacement` with a cross-layer transcoder: each layer's features encoded (JumpReLU) from what
    its feed-forward read; the error node of (layer ``j``, pos) ``mlp_out_j - ŷ_j`` with ``ŷ_j`` the CLT's whole
    reconstruction (every layer ``i <= j``'s features and ``b_dec[j]``); with ``bos`` position 0's features
    zeroed and its feed-forward outputs constants (``consts[j, 0] = mlp_out_j``)."""
    tokens = prompt_tokens(m, text, bos)
    L = m.cfg.n_layers
    fr = _frozen_pieces(m, tokens)
    mlp_in, mlp_out = fr["mlp_in"], fr["mlp_out"]
    errors, consts = torch.empty_like(mlp_out), torch.empty_like(mlp_out)
    dense, pres = [], []
    for i in range(L):
        pre = clt.pre_acts(i, mlp_in[i]).float()
        dense.append(clt.activate(i, pre).float())
        pres.append(pre)
    layers, poss, idxs, acts, inputs = [], [], [], [], []
    for j in range(L):
        errors[j] = mlp_out[j] - clt.decode_layer(j, dense).float()
        consts[j] = clt.b_dec[j].float()
        if bos:
            errors[j, 0] = 0
            consts[j, 0] = mlp_out[j, 0]
    for i in range(L):
        a = dense[i]
        if bos:
            a[0] = 0
        pos, feat = a.nonzero(as_tuple=True)  # row-major: sorted by (pos, feature)
        layers.append(torch.full_like(pos, i))
        poss.append(pos)
        idxs.append(feat)
        acts.append(a[pos, feat])
        inputs.append(pres[i][pos, feat] - clt.b_enc[i].float()[feat])
    return LocalReplacement(
        tokens=tokens, bos=bos, patterns=fr["patterns"], scale1=fr["scale1"], scale2=fr["scale2"],
        scale_final=fr["scale_final"], mlp_in=mlp_in, mlp_out=mlp_out, feat_layer=torch.cat(layers),
        feat_pos=torch.cat(poss), feat_index=torch.cat(idxs), feat_act=torch.cat(acts), feat_input=torch.cat(inputs),
        errors=errors, consts=consts, logits=fr["logits"], transcoders=[],
        final_normalized=fr["final_normalized"], clt=clt)


def rms_norm_jacobian(x: Float[Tensor, " d"], gain: Float[Tensor, " d"], eps: float) -> Float[Tensor, "d d"]:
    """The Jacobian ``J[i, j] = d y_i / d x_j`` of Sprout's RMSNorm ``y = gain * x / s``, ``s = sqrt(mean(x²) + eps)``,
    at ``x`` (float64): ``ds/dx = x / (d·s)``, so ``J = diag(gain) (I - x̂ x̂ᵀ / d) / s`` with ``x̂ = x / s`` (``eps``
    enters through ``s`` only). Its rows are the first-order change of each output per unit change of each input;
    ``J @ x = (eps / s²) · y``: the norm undoes a scaling of the whole stream but for ``eps``."""
    x = x.detach().double()
    d = x.numel()
    s = torch.sqrt(x.pow(2).mean() + eps)
    xh = x / s
    eye = torch.eye(d, dtype=torch.float64, device=x.device)
    return gain.detach().double()[:, None] * (eye - torch.outer(xh, xh) / d) / s


def salient_logits(logits: Float[Tensor, " vocab"], max_n_logits: int = 10, desired_logit_prob: float = 0.95
                   ) -> tuple[Int[Tensor, " k"], Float[Tensor, " k"]]:
    """circuit-tracer's logit nodes: the most probable tokens, in order, until their summed probability reaches
    ``desired_logit_prob`` (that token included), at most ``max_n_logits``. Returns (token ids, probabilities)."""
    probs = torch.softmax(logits.float(), dim=-1)
    top_p, top_idx = probs.topk(min(max_n_logits, probs.numel()))
    n = int(torch.searchsorted(top_p.cumsum(0), torch.tensor(desired_logit_prob, dtype=top_p.dtype))) + 1
    return top_idx[:n], top_p[:n]


# -- random transcoders for tests and benchmarks -------------------------------------------------------------


@torch.no_grad()
def random_transcoders(model, k: int = 32, d_transcoder: Optional[int] = None, skip: bool = True,
                       seed: int = 0) -> TranscoderSet:
    """Seeded random TopK transcoders, one per block of ``model``, scaled to its own feed-forward inputs and outputs
    (on seeded random token ids): a baseline set. A graph is exact for any transcoders, so tests, benchmarks and
    comparisons use these where trained ones are not there.

    Encoder rows are Gaussian over the inputs' mean norm (pre-activations of order 1), ``b_enc`` small; decoder
    rows unit vectors times the outputs' mean norm over ``sqrt(k)``; ``b_dec`` and ``W_skip`` (with ``skip``)
    small random parts of the output. ``d_transcoder`` defaults to ``4 * d_model``.
    """
    m = as_hooked(model)
    d = m.cfg.d_model
    d_transcoder = check_count(4 * d if d_transcoder is None else d_transcoder, "d_transcoder", high=1 << 20,
                               error=AttributionGraphError)
    k = check_count(k, "k", high=max_k(d_transcoder), what=f"active features per token, 1..{max_k(d_transcoder)}",
                    error=AttributionGraphError)
    seed = check_count(seed, "seed", low=0, error=AttributionGraphError)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, m.cfg.d_vocab, (4, min(64, m.cfg.n_ctx)), generator=g)
    names = [n for i in range(m.cfg.n_layers) for n in (act_name("normalized", i, "ln2"), act_name("mlp_out", i))]
    with m.lock:
        _, cache = m.run_with_cache(tokens.to(m.device), names_filter=names)
    out = {}
    for i in range(m.cfg.n_layers):
        xn = mlp_input(m, i, cache[names[2 * i]]).norm(dim=-1).mean().item()
        yn = cache[names[2 * i + 1]].norm(dim=-1).mean().item()
        tc = Transcoder.for_model(m, i, d_transcoder, k, skip, seed=seed + i)
        tc.W_enc.copy_(torch.randn(d_transcoder, d, generator=g) / max(xn, 1e-6))
        tc.b_enc.copy_(torch.randn(d_transcoder, generator=g) * 0.1)
        tc.W_dec.mul_(yn / k ** 0.5)
        tc.b_dec.copy_(torch.randn(d, generator=g) * (0.3 * yn / d ** 0.5))
        if skip:
            tc.W_skip.copy_(torch.randn(d, d, generator=g) * (0.5 * yn / max(xn, 1e-6) / d ** 0.5))
        out[i] = tc.eval()
    return TranscoderSet(out, {"model_name": m.name or "", "random_seed": seed}).to(m.device)


@torch.no_grad()
def random_clt(model, d_transcoder: Optional[int] = None, density: float = 0.02, seed: int = 0
               ) -> CrossLayerTranscoder:
    """A seeded random cross-layer transcoder for ``model``, scaled to its own feed-forward inputs and outputs (on
    the ready-made texts of :mod:`sprout_interp.core.texts`, or seeded random token ids for a model without a
    tokenizer): a baseline for tests, benchmarks and comparisons (a graph is exact for any CLT).

    Encoder rows Gaussian over the inputs' mean norm (pre-activations of order 1), ``b_enc`` small; each layer's
    thresholds the ``1 - density`` quantile of its pre-activations on those tokens (about ``density *
    d_transcoder`` features active per token and layer, none exactly at a threshold); each feature's decoder to a
    later layer ``j`` a Gaussian row over ``sqrt(d_model)`` times layer ``j``'s mean output norm over ``sqrt(active
    features writing there)``; ``b_dec`` a small random part of the output (sizes measured at positions 1 on).
    ``d_transcoder`` defaults to ``4 * d_model``."""
    m = as_hooked(model)
    d, L = m.cfg.d_model, m.cfg.n_layers
    d_transcoder = check_count(4 * d if d_transcoder is None else d_transcoder, "d_transcoder", high=1 << 20,
                               error=AttributionGraphError)
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0 < density < 1:
        raise AttributionGraphError(f"density must be a fraction in (0, 1) of features active per token, got "
                                    f"{describe(density)}")
    seed = check_count(seed, "seed", low=0, error=AttributionGraphError)
    g = torch.Generator().manual_seed(seed)
    n = min(64, m.cfg.n_ctx)
    tokens = torch.randint(0, m.cfg.d_vocab, (4, n), generator=g)
    if m.tokenizer is not None:  # the ready-made texts: a model's outputs on random ids can be far from its text's
        ids = [m.to_tokens(TEXTS[k])[0] for k in ("story", "dialogue", "description")]
        n = min(n, *(t.numel() for t in ids))
        tokens = torch.stack([t[:n].cpu() for t in ids])
    names = [n for i in range(L) for n in (act_name("normalized", i, "ln2"), act_name("mlp_out", i))]
    with m.lock:
        _, cache = m.run_with_cache(tokens.to(m.device), names_filter=names)
    clt = CrossLayerTranscoder(L, d, d_transcoder, {"model_name": m.name or "", "fingerprint": fingerprint(m),
                                                    "random_seed": seed})
    n_active = max(1.0, density * d_transcoder)
    # sizes from positions 1 on: a feed-forward's output at position 0 can be far larger (an attention sink's), and
    # a graph with bos holds no features there
    cache = {k: v[:, 1:] for k, v in cache.items()}
    for i in range(L):
        x = mlp_input(m, i, cache[names[2 * i]]).float().cpu()
        xn = x.norm(dim=-1).mean().item()
        clt.W_enc[i].copy_(torch.randn(d_transcoder, d, generator=g) / max(xn, 1e-6))
        clt.b_enc[i].copy_(torch.randn(d_transcoder, generator=g) * 0.1)
        pre = (x.reshape(-1, d) @ clt.W_enc[i].T + clt.b_enc[i]).flatten()
        clt.threshold[i].copy_(torch.quantile(pre, 1 - density).expand(d_transcoder) +
                               torch.rand(d_transcoder, generator=g) * 1e-3)
    for j in range(L):
        yn = cache[names[2 * j + 1]].float().norm(dim=-1).mean().item()
        clt.b_dec[j].copy_(torch.randn(d, generator=g) * (0.3 * yn / d ** 0.5))
    for i in range(L):
        for j in range(i, L):
            yn = cache[names[2 * j + 1]].float().norm(dim=-1).mean().item()
            clt.W_dec[i][:, j - i].copy_(torch.randn(d_transcoder, d, generator=g) *
                                         (yn / (d * n_active * (j + 1)) ** 0.5))
    return clt.eval().to(m.device)
