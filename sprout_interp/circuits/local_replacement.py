"""The local replacement model of one prompt, the frozen linear model an attribution graph is computed in
(Ameisen et al. 2025, "Circuit Tracing"; ``circuit-tracer``): each block's feed-forward replaced by its transcoder
(:mod:`sprout_interp.features.transcoder`) plus an error node per (layer, position) that holds what the transcoder
misses on this prompt (``mlp_out - ŷ``), so it reproduces the real forward exactly; the attention patterns and every
RMSNorm's scale (``hook_scale``: ln1, ln2 and ln_final) frozen at their values on the prompt.

Also here: the transcoders checked against the model (:func:`check_transcoders`), the prompt's ids with
circuit-tracer's position-0 convention (:func:`prompt_tokens`), the logits a graph explains
(:func:`salient_logits`) and seeded random transcoders for tests and benchmarks (:func:`random_transcoders`).
:mod:`~sprout_interp.circuits.attribution_graph` computes the graph in this model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.core.arguments import check_count
from sprout_interp.core.errors import (
    AttributionGraphError,
    ContextLengthError,
    TranscoderMismatchError,
    TranscoderNotFoundError,
)
from sprout_interp.core.fingerprints import fingerprint, fingerprint_mismatch
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.tokens import eot_id
from sprout_interp.features.transcoder import Transcoder, TranscoderSet, load_transcoders, max_k, mlp_input

__all__ = ["TranscodersLike", "LocalReplacement", "check_transcoders", "prompt_tokens", "local_replacement", "salient_logits",
           "rms_norm_jacobian", "random_transcoders"]


TranscodersLike = Union[TranscoderSet, dict, None]


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
        transcoders: the transcoders, one per layer (as given).
        final_normalized (d,): ln_final's ``hook_normalized`` at the last position (``x / scale_final[-1]``, before
        the gain): where :func:`rms_norm_jacobian` takes the final norm's first-order map.
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

    @property
    def n_features(self) -> int:
        return int(self.feat_layer.numel())

    def layer_span(self, layer: int) -> tuple[int, int]:
        """The node indices ``[start, stop)`` of layer ``layer``'s active features."""
        lo = int(torch.searchsorted(self.feat_layer, layer))
        return lo, int(torch.searchsorted(self.feat_layer, layer, right=True))


def check_transcoders(model, transcoders: TranscodersLike) -> list[Transcoder]:
    """One transcoder per layer of ``model`` (a TranscoderSet, ``{layer: Transcoder}``, or None: the shipped set,
    :func:`~sprout_interp.features.transcoder.load_transcoders`), checked against the model.

    Raises TranscoderNotFoundError when a layer has none (a graph replaces every feed-forward) and
    TranscoderMismatchError for a transcoder of another width, layer or checkpoint.
    """
    m = as_hooked(model)
    if transcoders is None:
        transcoders = load_transcoders(m)
    if isinstance(transcoders, TranscoderSet):
        tcs = {tc.layer: tc for tc in transcoders}
    elif isinstance(transcoders, dict):
        tcs = dict(transcoders)
    else:
        raise AttributionGraphError(
            f"transcoders must be a TranscoderSet (si.sae.load_transcoders(model)), a dict {{layer: Transcoder}} or "
            f"None for the shipped set, got {type(transcoders).__name__}")
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
def local_replacement(model, text, transcoders: TranscodersLike = None, bos: bool = True) -> LocalReplacement:
    """One forward of the real model on the prompt, giving the frozen pieces and the nodes' values of its local
    replacement model (see :class:`LocalReplacement`; ``text`` and ``bos`` as in :func:`attribution_graph`)."""
    m = as_hooked(model)
    tcs = check_transcoders(m, transcoders)
    tokens = prompt_tokens(m, text, bos)
    L = m.cfg.n_layers
    names = [act_name("scale"), act_name("normalized")]
    for i in range(L):
        names += [act_name("pattern", i), act_name("scale", i, "ln1"), act_name("scale", i, "ln2"),
                  act_name("normalized", i, "ln2"), act_name("mlp_out", i)]
    logits, cache = m.run_with_cache(tokens[None], names_filter=names)
    f32 = dict(dtype=torch.float32)
    patterns = torch.stack([cache[act_name("pattern", i)][0] for i in range(L)]).to(**f32)
    scale1 = torch.stack([cache[act_name("scale", i, "ln1")][0, :, 0] for i in range(L)]).to(**f32)
    scale2 = torch.stack([cache[act_name("scale", i, "ln2")][0, :, 0] for i in range(L)]).to(**f32)
    mlp_in = torch.stack([mlp_input(m, i, cache[act_name("normalized", i, "ln2")][0]) for i in range(L)]).to(**f32)
    mlp_out = torch.stack([cache[act_name("mlp_out", i)][0] for i in range(L)]).to(**f32)
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
        tokens=tokens, bos=bos, patterns=patterns, scale1=scale1, scale2=scale2,
        scale_final=cache[act_name("scale")][0, :, 0].to(**f32), mlp_in=mlp_in, mlp_out=mlp_out,
        feat_layer=torch.cat(layers), feat_pos=torch.cat(poss), feat_index=torch.cat(idxs), feat_act=torch.cat(acts),
        feat_input=torch.cat(inputs), errors=errors, consts=consts, logits=logits[0, -1].float(), transcoders=tcs,
        final_normalized=cache[act_name("normalized")][0, -1].to(**f32))


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


# -- the backward passes ---------------------------------------------------------------------------------------


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
