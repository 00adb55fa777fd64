"""Cross-layer transcoders (CLTs): each layer's features read that layer's feed-forward input and write to its own
and every later layer's feed-forward output, in circuit-tracer's ``CrossLayerTranscoder`` format.

The maths (Ameisen et al. 2025, "Circuit Tracing"; circuit-tracer 0.5's ``CrossLayerTranscoder``), for layers
``i`` (source) and ``j`` (target), ``0 <= i <= j < n_layers``::

    pre_i  = x_i @ W_enc[i].T + b_enc[i]                           (..., d_transcoder)
    a_i    = JumpReLU(pre_i) = pre_i * (pre_i > threshold[i])      circuit-tracer's JumpReLU, feature by feature
    ŷ_j    = b_dec[j] + Σ_{i <= j} a_i @ W_dec[i][:, j - i, :]

``x_i`` is what feed-forward ``i`` reads (``blocks.{i}.ln2.hook_normalized`` times ln2's gain: circuit-tracer's
``mlp.hook_in`` on the Qwen3 export, as for the per-layer transcoders of
:mod:`sprout_interp.features.transcoder`); ``ŷ_j`` predicts ``blocks.{j}.hook_mlp_out`` (``mlp.hook_out``).
Shapes are circuit-tracer's: ``W_enc (n_layers, d_transcoder, d_model)``, ``b_enc (n_layers, d_transcoder)``,
``b_dec (n_layers, d_model)``, ``threshold (n_layers, d_transcoder)`` and, per source layer ``i``,
``W_dec[i] (d_transcoder, n_layers - i, d_model)``. circuit-tracer's CLT loader knows ReLU and JumpReLU only (no
TopK, and it reads no skip connection), so a CLT here is a JumpReLU CLT without ``W_skip``; the trainer
(:mod:`sprout_interp.features.clt_train`) trains it with BatchTopK and sets each layer's threshold from it.

On disk a CLT is a folder, circuit-tracer's lazy-loading layout: ``W_enc_{i}.safetensors`` with ``W_enc_{i}``,
``b_enc_{i}``, ``b_dec_{i}`` and ``threshold_{i}``, and ``W_dec_{i}.safetensors`` with ``W_dec_{i}``, for every
layer ``i`` (float16 when shipped); ``config.yaml`` is a JSON object (JSON is YAML) with circuit-tracer's keys
(``model_kind = "cross_layer_transcoder"``, ``feature_input_hook = "mlp.hook_in"``, ``feature_output_hook =
"mlp.hook_out"``, ``scan``) and a ``sprout`` block (hook names, the checkpoint's fingerprint, training and quality
numbers). :func:`load_clt` checks the fingerprint and every file before it allocates a tensor.

Shipped CLTs live beside their checkpoint: ``<checkpoint>/clt/``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from sprout_interp.core import limits
from sprout_interp.core.arguments import check_count, check_index
from sprout_interp.core.configs import check_finite
from sprout_interp.core.errors import NotACheckpointError, SproutError, TranscoderMismatchError, TranscoderNotFoundError
from sprout_interp.core.files import as_path, read_json
from sprout_interp.core.fingerprints import check_fingerprint, fingerprint, fingerprint_mismatch
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.loading import read_safetensors
from sprout_interp.features.transcoder import FEATURE_INPUT_HOOK, FEATURE_OUTPUT_HOOK, TC_CONFIG

__all__ = ["CLT_RECIPE", "CrossLayerTranscoder", "CLTLayer", "enc_file", "dec_file", "clt_folder", "save_clt", "load_clt"]

#: The training recipe (also written into config.yaml).
CLT_RECIPE = ("cross-layer transcoder trained with BatchTopK per source layer (the k x batch largest ReLU'd "
              "pre-activations of the batch kept; Bussmann et al. 2024) and saved as circuit-tracer's JumpReLU with "
              "each layer's threshold the BatchTopK cut over 8,192 training tokens (k features per token on average "
              "there); loss: the sum over layers "
              "of each output's normalised MSE, plus AuxK on dead features (coefficient 1/32) against the errors "
              "of the layers they write to; each feature's decoder (all the layers it writes to together) kept at "
              "unit norm; inputs and outputs scaled to mean norm sqrt(d_model) per layer while training and folded "
              "into W_enc and W_dec before saving; Adam, linear decay over the last 20% of steps; activations "
              "collected in chunks of fresh training windows")


def enc_file(layer: int) -> str:
    """circuit-tracer's encoder file of a source layer: ``W_enc_{layer}.safetensors``."""
    return f"W_enc_{int(layer)}.safetensors"


def dec_file(layer: int) -> str:
    """circuit-tracer's decoder file of a source layer: ``W_dec_{layer}.safetensors``."""
    return f"W_dec_{int(layer)}.safetensors"


class CrossLayerTranscoder(nn.Module):
    """A JumpReLU cross-layer transcoder over all ``n_layers`` feed-forwards (the module docstring has the maths).

    Attributes:
        W_enc (n_layers, d_transcoder, d_model), b_enc (n_layers, d_transcoder), b_dec (n_layers, d_model),
        threshold (n_layers, d_transcoder), W_dec: a ParameterList, ``W_dec[i]`` (d_transcoder, n_layers - i,
        d_model): circuit-tracer's names and layouts. info: fingerprint, recipe, training and quality numbers.
    """

    def __init__(self, n_layers: int, d_model: int, d_transcoder: int, info: Optional[dict] = None):
        super().__init__()
        n_layers, d_model = check_count(n_layers, "n_layers"), check_count(d_model, "d_model")
        d_transcoder = check_count(d_transcoder, "d_transcoder")
        self.n_layers, self.d_model, self.d_transcoder = n_layers, d_model, d_transcoder
        self.W_enc = nn.Parameter(torch.zeros(n_layers, d_transcoder, d_model))
        self.b_enc = nn.Parameter(torch.zeros(n_layers, d_transcoder))
        self.b_dec = nn.Parameter(torch.zeros(n_layers, d_model))
        self.threshold = nn.Parameter(torch.zeros(n_layers, d_transcoder), requires_grad=False)
        self.W_dec = nn.ParameterList([nn.Parameter(torch.zeros(d_transcoder, n_layers - i, d_model))
                                       for i in range(n_layers)])
        self.info = dict(info or {})

    def __repr__(self) -> str:
        return (f"CrossLayerTranscoder({self.n_layers} layers: d_model {self.d_model}, d_transcoder "
                f"{self.d_transcoder} per layer, JumpReLU, model {self.info.get('model_name', '?')!r})")

    @classmethod
    def for_model(cls, model, d_transcoder: int, seed: int = 0) -> "CrossLayerTranscoder":
        """A freshly initialised CLT for every feed-forward of ``model``, with the model's fingerprint: each
        feature's decoder (all its target layers together) a random unit vector (seeded), its encoder row its
        own layer's decoder slice scaled to unit norm, biases and thresholds zero."""
        m = as_hooked(model)
        clt = cls(m.cfg.n_layers, m.cfg.d_model, d_transcoder, {"model_name": m.name or "", "fingerprint": fingerprint(m)})
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for i, w in enumerate(clt.W_dec):
                w.copy_(torch.randn(w.shape, generator=g))
                clt.W_enc[i].copy_(w[:, 0] / w[:, 0].norm(dim=-1, keepdim=True))
            clt.normalize_decoder()
        return clt

    def _layer(self, layer) -> int:
        return check_index(layer, "layer", self.n_layers, what="the CLT's layers, 0-indexed")

    # -- the maths --------------------------------------------------------------------------------

    def pre_acts(self, layer: int, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_transcoder"]:
        """``x @ W_enc[layer].T + b_enc[layer]``: the pre-activations of source ``layer``'s features."""
        i = self._layer(layer)
        return x.to(self.W_enc.dtype) @ self.W_enc[i].T + self.b_enc[i]

    def activate(self, layer: int, pre: Float[Tensor, "... d_transcoder"]) -> Float[Tensor, "... d_transcoder"]:
        """circuit-tracer's JumpReLU: ``pre`` where it exceeds its feature's threshold, else 0."""
        return pre * (pre > self.threshold[self._layer(layer)])

    def encode_layer(self, layer: int, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_transcoder"]:
        """Feature activations of source ``layer`` from its feed-forward input ``x`` (dense, mostly 0)."""
        return self.activate(layer, self.pre_acts(layer, x))

    def encode(self, xs: Float[Tensor, "n_layers ... d_model"]) -> Float[Tensor, "n_layers ... d_transcoder"]:
        """Every layer's feature activations from every layer's feed-forward input (stacked on the first axis)."""
        self._check_stack(xs, "xs")
        return torch.stack([self.encode_layer(i, xs[i]) for i in range(self.n_layers)])

    def decode_layer(self, layer: int, acts) -> Float[Tensor, "... d_model"]:
        """The prediction ŷ of target ``layer``'s feed-forward output: ``b_dec[layer]`` plus what the features
        of every source layer up to it write there. ``acts[i]`` is source layer ``i``'s activations
        ``(..., d_transcoder)`` (a stacked tensor, a list or a dict by layer; layers after ``layer`` are not read)."""
        j = self._layer(layer)
        out = self.b_dec[j].expand(*acts[0].shape[:-1], self.d_model)
        for i in range(j + 1):
            out = out + acts[i].to(self.W_enc.dtype) @ self.W_dec[i][:, j - i]
        return out

    def decode(self, acts: Float[Tensor, "n_layers ... d_transcoder"]) -> Float[Tensor, "n_layers ... d_model"]:
        """Every target layer's prediction ŷ from every source layer's activations."""
        self._check_stack(acts, "acts", self.d_transcoder)
        return torch.stack([self.decode_layer(j, acts) for j in range(self.n_layers)])

    def forward(self, xs: Float[Tensor, "n_layers ... d_model"]) -> Float[Tensor, "n_layers ... d_model"]:
        """Every feed-forward's predicted output from every feed-forward's input, in ``xs``' dtype."""
        return self.decode(self.encode(xs)).to(xs.dtype)

    def _check_stack(self, t: Tensor, name: str, width: Optional[int] = None) -> None:
        width = self.d_model if width is None else width
        if not isinstance(t, Tensor) or t.dim() < 2 or t.shape[0] != self.n_layers or t.shape[-1] != width:
            raise SproutError(f"{name} must be a tensor (n_layers={self.n_layers}, ..., {width}), got "
                              f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")

    def summed_decoder(self, layer: int, features=None) -> Float[Tensor, "n d_model"]:
        """The direction each feature of source ``layer`` writes into the residual stream per unit of activation:
        its decoder rows summed over every layer it writes to, ``W_dec[layer][f].sum(0)``, for ``features`` (a list
        of feature indices; None: all ``d_transcoder``), float32."""
        w = self.W_dec[self._layer(layer)]
        with torch.no_grad():
            return (w if features is None else w[features]).sum(1).float()

    def layer_features(self, layer: int) -> "CLTLayer":
        """Source ``layer``'s features seen as one layer's transcoder (:class:`CLTLayer`), for the code that reads
        a per-layer transcoder's features (feature pages, promoted tokens)."""
        return CLTLayer(self, layer)

    def decoder_norms(self) -> Float[Tensor, "n_layers d_transcoder"]:
        """Each feature's decoder norm over every layer it writes to (1 for the training recipe's raw units)."""
        return torch.stack([w.flatten(1).norm(dim=-1) for w in self.W_dec])

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        """Scale each feature's decoder (all the layers it writes to together) to unit norm."""
        for w in self.W_dec:
            w.div_(w.flatten(1).norm(dim=-1).clamp_min(1e-8)[:, None, None])


class CLTLayer:
    """One source layer of a :class:`CrossLayerTranscoder` with the interface of a per-layer
    :class:`~sprout_interp.features.transcoder.Transcoder` that feature pages read (``layer``, ``d_transcoder``,
    ``d_model``, ``pre_acts``, ``topk``, ``W_dec``): its features read layer ``layer``'s feed-forward input through
    that layer's encoder and JumpReLU, and ``W_dec`` is what each writes in all, its decoder rows summed over every
    layer it writes to (:meth:`CrossLayerTranscoder.summed_decoder`). A view: it reads the CLT's weights on each call."""

    def __init__(self, clt: CrossLayerTranscoder, layer: int):
        self.clt, self.layer = clt, clt._layer(layer)
        self.d_transcoder, self.d_model = clt.d_transcoder, clt.d_model

    def __repr__(self) -> str:
        return f"CLTLayer(layer {self.layer} of {self.clt!r})"

    @property
    def W_dec(self) -> Float[Tensor, "d_transcoder d_model"]:
        """Each feature's decoder rows summed over every layer it writes to (float32)."""
        return self.clt.summed_decoder(self.layer)

    def pre_acts(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_transcoder"]:
        """``x @ W_enc[layer].T + b_enc[layer]``."""
        return self.clt.pre_acts(self.layer, x)

    def topk(self, pre: Float[Tensor, "... d_transcoder"]) -> tuple[Float[Tensor, "... n"], Int[Tensor, "... n"]]:
        """The JumpReLU's active features at each position as ``(values, indices)``, strongest first, padded to
        ``n`` = the most active at any position of ``pre`` (at least 1) with value 0 and index 0: a value of 0 is
        "not active", as in :class:`~sprout_interp.features.pages.FeatureIndex` (a threshold below 0 would let a
        negative value through JumpReLU; such a value is kept here and read as not firing there)."""
        a = self.clt.activate(self.layer, pre)
        n = max(int((a != 0).sum(-1).max()) if a.numel() else 0, 1)
        vals, idx = a.abs().topk(min(n, a.shape[-1]), dim=-1)
        vals = a.gather(-1, idx)
        return vals, idx * (vals != 0)


# -- files --------------------------------------------------------------------------------------------


def clt_folder(model) -> Path:
    """Where the shipped CLT of ``model`` lives: ``<checkpoint folder>/clt``."""
    src = getattr(as_hooked(model), "source", None)
    if not src:
        raise TranscoderNotFoundError("the model has no checkpoint folder to keep a CLT in: pass folder=...")
    p = Path(src)
    return (p if p.is_dir() else p.parent) / "clt"


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save_clt(clt: CrossLayerTranscoder, folder: Union[str, Path], dtype: torch.dtype = torch.float32) -> Path:
    """Write ``clt`` into ``folder`` in circuit-tracer's layout (``W_enc_{i}``/``W_dec_{i}`` files in ``dtype``:
    float16 for shipping) with its ``config.yaml``. Returns the folder."""
    from safetensors.torch import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(clt.n_layers):
        enc = {f"W_enc_{i}": clt.W_enc[i], f"b_enc_{i}": clt.b_enc[i], f"b_dec_{i}": clt.b_dec[i],
               f"threshold_{i}": clt.threshold[i]}
        enc = {k: v.detach().to("cpu", dtype).contiguous() for k, v in enc.items()}
        _write_atomic(folder / enc_file(i), save(enc, metadata={"format": "pt"}))
        dec = {f"W_dec_{i}": clt.W_dec[i].detach().to("cpu", dtype).contiguous()}
        _write_atomic(folder / dec_file(i), save(dec, metadata={"format": "pt"}))
    name = clt.info.get("model_name", "")
    cfg = {
        "model_name": name, "model_kind": "cross_layer_transcoder", "scan": f"sprout-interp/{name}-clt",
        "feature_input_hook": FEATURE_INPUT_HOOK, "feature_output_hook": FEATURE_OUTPUT_HOOK,
        "activation": "jump_relu", "skip_connection": False, "n_layers": clt.n_layers,
        "d_transcoder": clt.d_transcoder, "d_model": clt.d_model,
        "sprout": {"input_hook": "blocks.{layer}.ln2.hook_normalized times ln2's gain",
                   "output_hook": "blocks.{layer}.hook_mlp_out", "recipe": CLT_RECIPE,
                   "fingerprint": clt.info.get("fingerprint") or {},
                   "info": {k: v for k, v in clt.info.items() if k not in ("fingerprint", "model_name", "recipe")}},
    }
    _write_atomic(folder / TC_CONFIG, (json.dumps(cfg, indent=1) + "\n").encode("utf-8"))
    return folder


def _bad(folder: Path, why: str) -> TranscoderMismatchError:
    return TranscoderMismatchError(
        f"the cross-layer transcoder in {folder} cannot be used: {why}. Train it again "
        "(python -m sprout_interp.features.clt_train --model NAME --out FOLDER)")


def _int(cfg: dict, key: str, lo: int, hi: int, folder: Path) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(folder, f"config.yaml's {key!r} must be an int in {lo}..{hi}, got {str(v)[:40]!r}")
    return v


def load_clt(model, folder: Union[str, Path, None] = None) -> CrossLayerTranscoder:
    """The cross-layer transcoder saved for ``model``: the one beside its checkpoint (``<checkpoint>/clt``) or in
    ``folder``, float32 on the model's device.

    Before any tensor is allocated it checks the config (a JSON object; whole numbers in range; circuit-tracer's
    kind and hooks), each file's size, tensor names, float dtypes and shapes against the config and the model;
    after reading, that no value is NaN or infinite; and the checkpoint fingerprint. Raises
    :class:`~sprout_interp.core.errors.NotAPathError` when ``folder`` is not a path,
    :class:`~sprout_interp.core.errors.TranscoderNotFoundError` when there is no CLT there,
    :class:`~sprout_interp.core.errors.InvalidWeightsError` for NaN, infinite or non-float weights and
    :class:`~sprout_interp.core.errors.TranscoderMismatchError` for anything else wrong, naming the file.
    """
    m = as_hooked(model)
    folder = clt_folder(m) if folder is None else as_path(folder, "folder", "a cross-layer transcoder folder")
    if not (folder / TC_CONFIG).exists():
        raise TranscoderNotFoundError(
            f"{folder} holds no {TC_CONFIG}: train a cross-layer transcoder with "
            "`python -m sprout_interp.features.clt_train --model NAME --out FOLDER`")
    try:
        cfg = read_json(folder / TC_CONFIG, "cross-layer transcoder config")
    except SproutError as e:
        raise _bad(folder, str(e)) from None
    if cfg.get("model_kind") != "cross_layer_transcoder":
        raise _bad(folder, f"config.yaml's model_kind is {str(cfg.get('model_kind'))[:40]!r}, not "
                           "'cross_layer_transcoder' (a per-layer set loads with load_transcoders)")
    if (cfg.get("feature_input_hook"), cfg.get("feature_output_hook")) != (FEATURE_INPUT_HOOK, FEATURE_OUTPUT_HOOK):
        raise _bad(folder, f"config.yaml's hooks must be {FEATURE_INPUT_HOOK!r} -> {FEATURE_OUTPUT_HOOK!r}")
    if cfg.get("activation") != "jump_relu" or cfg.get("skip_connection") is not False:
        raise _bad(folder, "config.yaml must name activation 'jump_relu' and skip_connection false")
    n_layers = _int(cfg, "n_layers", 1, limits.LIMITS["n_layer"], folder)
    d_model = _int(cfg, "d_model", 1, limits.LIMITS["d_model"], folder)
    d_tc = _int(cfg, "d_transcoder", 1, 1 << 24, folder)
    sprout = cfg.get("sprout")
    if not isinstance(sprout, dict):
        raise _bad(folder, "config.yaml has no 'sprout' block")
    if (n_layers, d_model) != (m.cfg.n_layers, m.cfg.d_model):
        raise TranscoderMismatchError(
            f"the cross-layer transcoder in {folder} spans {n_layers} layers of width {d_model} but "
            f"{m.name or 'the model'} has {m.cfg.n_layers} of width {m.cfg.d_model}: it belongs to another model")
    fp = check_fingerprint(sprout.get("fingerprint"), f"the cross-layer transcoder in {folder}", TranscoderMismatchError)
    bad = fingerprint_mismatch(fingerprint(m), fp, "cross-layer transcoder")
    if bad:
        raise TranscoderMismatchError(
            f"the cross-layer transcoder in {folder} was trained for another checkpoint "
            f"({cfg.get('model_name') or 'unknown'}): its {', '.join(bad)} differ from {m.name or 'this model'}'s")
    info = sprout.get("info")
    clt = CrossLayerTranscoder(n_layers, d_model, d_tc, dict(info if isinstance(info, dict) else {},
                                                             model_name=cfg.get("model_name", ""), fingerprint=fp))
    state = {}
    for i in range(n_layers):
        for name, shapes in ((enc_file(i), {f"W_enc_{i}": (d_tc, d_model), f"b_enc_{i}": (d_tc,),
                                            f"b_dec_{i}": (d_model,), f"threshold_{i}": (d_tc,)}),
                             (dec_file(i), {f"W_dec_{i}": (d_tc, n_layers - i, d_model)})):
            p = folder / name
            if not p.is_file():
                raise _bad(folder, f"{name} is missing")

            def check_shapes(got: dict[str, tuple[int, ...]], p: Path = p, shapes: dict = shapes) -> None:
                if got != shapes:
                    raise _bad(folder, f"{p.name} holds tensors {dict(sorted(got.items())[:6])} where config.yaml "
                                       f"needs {shapes}")

            try:
                sd = read_safetensors(p, str(p), check_shapes)
            except NotACheckpointError as e:
                raise _bad(folder, f"{p.name}: {e}") from None
            check_finite(sd, str(p))
            state.update(sd)
    with torch.no_grad():
        for i in range(n_layers):
            clt.W_enc[i].copy_(state[f"W_enc_{i}"].float())
            clt.b_enc[i].copy_(state[f"b_enc_{i}"].float())
            clt.b_dec[i].copy_(state[f"b_dec_{i}"].float())
            clt.threshold[i].copy_(state[f"threshold_{i}"].float())
            clt.W_dec[i].copy_(state[f"W_dec_{i}"].float())
    clt.info["folder"] = str(folder)
    return clt.eval().to(m.device)
