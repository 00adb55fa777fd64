"""Per-layer transcoders: a sparse, wide replacement of each block's feed-forward, in circuit-tracer's format.

A transcoder reads the feed-forward's input and predicts its output (Dunefsky et al. 2024; the per-layer
transcoders of Ameisen et al. 2025, "Circuit Tracing", library ``circuit-tracer``)::

    pre  = x @ W_enc.T + b_enc                      (..., d_transcoder)
    acts = TopK(pre): the k largest entries kept as they are, every other entry 0
    ŷ    = acts @ W_dec + b_dec  (+ x @ W_skip.T with the optional skip connection)

``x`` is what the feed-forward reads: ``blocks.{l}.ln2.hook_normalized`` times ln2's gain (the output of
Qwen3's ``post_attention_layernorm`` in ``to_hf()``'s export, circuit-tracer's ``mlp.hook_in``); ``ŷ``
predicts ``blocks.{l}.hook_mlp_out`` (circuit-tracer's ``mlp.hook_out``). Shapes are circuit-tracer's
``SingleLayerTranscoder``'s: ``W_enc`` and ``W_dec`` are both ``(d_transcoder, d_model)``, ``W_skip`` is
``(d_model, d_model)``. The activation is circuit-tracer's ``TopK`` exactly (no ReLU after it, unlike the
SAEs' Gao et al. TopK), so its graphs and ours use the same feature values.

On disk a set is a folder: ``layer_{i}.safetensors`` per layer with the tensors ``W_enc``, ``W_dec``,
``b_enc``, ``b_dec`` and, with a skip connection, ``W_skip`` (float16 when shipped), and ``config.yaml``, a
JSON object (JSON is YAML, so circuit-tracer's ``yaml.safe_load`` reads it too) with circuit-tracer's keys
(``model_kind``, ``feature_input_hook = "mlp.hook_in"``, ``feature_output_hook = "mlp.hook_out"``,
``activation = "topk"``, ``k``, ``transcoders``: the layer files) plus a ``sprout`` block: our hook names, the
checkpoint's fingerprint (:func:`sprout_interp.core.fingerprints.fingerprint`) and each layer's ``k``, training
and quality numbers. Layers may differ in ``k`` (the top-level ``k`` is the lowest layer's; each layer's entry
names its own), not in width or skip connection (circuit-tracer's ``TranscoderSet`` holds one width).
:func:`load_transcoders` checks the fingerprint and every file before it allocates a tensor.

Shipped sets live beside their checkpoint: ``<checkpoint>/transcoders/``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Union

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from sprout_interp.core import limits
from sprout_interp.core.arguments import check_count, check_index, check_indices, integer
from sprout_interp.core.configs import check_weights
from sprout_interp.core.errors import NotACheckpointError, SproutError, TranscoderMismatchError, TranscoderNotFoundError
from sprout_interp.core.files import as_path, read_json
from sprout_interp.core.fingerprints import check_fingerprint, fingerprint, fingerprint_mismatch
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.loading import read_safetensors

__all__ = [
    "TC_CONFIG", "TC_RECIPE", "FEATURE_INPUT_HOOK", "FEATURE_OUTPUT_HOOK", "Transcoder", "TranscoderSet",
    "input_hook", "output_hook", "mlp_input", "layer_file", "transcoder_folder", "save_transcoder_layer",
    "save_transcoders", "load_transcoders", "max_k",
]

TC_CONFIG = "config.yaml"
FEATURE_INPUT_HOOK, FEATURE_OUTPUT_HOOK = "mlp.hook_in", "mlp.hook_out"
#: The training recipe every transcoder here follows (also written into config.yaml).
TC_RECIPE = ("TopK per-layer transcoder (circuit-tracer's TopK: k largest pre-activations kept as they are): the SAE "
             "recipe of Gao et al. 2024 with the feed-forward's output as the target: unit-norm decoder rows "
             "(gradient parallel to them removed), encoder started as the decoder rows, b_dec started at the mean "
             "output, W_skip (if any) at zero, AuxK loss on dead latents (coefficient 1/32), normalised MSE against "
             "the output's variance, inputs and outputs scaled to mean norm sqrt(d_model) and the scales folded "
             "back before saving, Adam, linear decay over the last 20% of steps")


def input_hook(layer: int) -> str:
    """The hook point a transcoder of ``layer`` reads (times ln2's gain): ``blocks.{layer}.ln2.hook_normalized``."""
    return act_name("normalized", int(layer), "ln2")


def output_hook(layer: int) -> str:
    """The hook point a transcoder of ``layer`` predicts: ``blocks.{layer}.hook_mlp_out``."""
    return act_name("mlp_out", int(layer))


def _check_layer(m, layer) -> int:
    return check_index(layer, "layer", m.cfg.n_layers, what=f"{m.name or 'the model'}'s blocks, 0-indexed")


def mlp_input(model, layer: int, normalized: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
    """The feed-forward's input from ``blocks.{layer}.ln2.hook_normalized``: times ln2's gain (what ``w1``/``w3``
    read, and circuit-tracer's ``mlp.hook_in`` on the Qwen3 export)."""
    m = as_hooked(model)
    return normalized * m.blocks[_check_layer(m, layer)].ln2.w


class Transcoder(nn.Module):
    """One layer's TopK transcoder (see the module docstring for the maths and shapes).

    Attributes:
        W_enc (d_transcoder, d_model), b_enc (d_transcoder,), W_dec (d_transcoder, d_model), b_dec (d_model,),
        W_skip (d_model, d_model) or None: circuit-tracer's names and layouts.
        k: active features per token; layer: the 0-indexed block whose feed-forward it replaces.
        info: the fingerprint, recipe, training and quality numbers config.yaml records for this layer.
    """

    def __init__(self, d_model: int, d_transcoder: int, k: int, layer: int, skip: bool = False,
                 info: Optional[dict] = None):
        super().__init__()
        d_model, d_transcoder = check_count(d_model, "d_model"), check_count(d_transcoder, "d_transcoder")
        layer = check_count(layer, "layer", low=0)
        k = check_count(k, "k", high=max_k(d_transcoder),
                        what=f"active features per token, 1..{max_k(d_transcoder)}: at most a quarter of d_transcoder")
        self.d_model, self.d_transcoder, self.k, self.layer = d_model, d_transcoder, k, layer
        self.W_enc = nn.Parameter(torch.zeros(d_transcoder, d_model))
        self.W_dec = nn.Parameter(torch.zeros(d_transcoder, d_model))
        self.b_enc = nn.Parameter(torch.zeros(d_transcoder))
        self.b_dec = nn.Parameter(torch.zeros(d_model))
        self.W_skip = nn.Parameter(torch.zeros(d_model, d_model)) if skip else None
        self.info = dict(info or {})

    @property
    def has_skip(self) -> bool:
        """True when the transcoder has a skip connection ``W_skip``."""
        return self.W_skip is not None

    def __repr__(self) -> str:
        return (f"Transcoder(layer {self.layer}: d_model {self.d_model}, d_transcoder {self.d_transcoder}, k {self.k}"
                f"{', skip' if self.has_skip else ''})")

    @classmethod
    def for_model(cls, model, layer: int, d_transcoder: int, k: int, skip: bool = False,
                  seed: int = 0) -> "Transcoder":
        """A freshly initialised transcoder for ``model``'s feed-forward ``layer``, with the model's fingerprint.

        Decoder rows are random unit vectors (seeded), the encoder rows start equal to them, biases and
        ``W_skip`` zero.
        """
        m = as_hooked(model)
        tc = cls(m.cfg.d_model, d_transcoder, k, _check_layer(m, layer), skip,
                 {"model_name": m.name or "", "fingerprint": fingerprint(m)})
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(d_transcoder, m.cfg.d_model, generator=g)
        with torch.no_grad():
            tc.W_dec.copy_(w / w.norm(dim=-1, keepdim=True))
            tc.W_enc.copy_(tc.W_dec)
        return tc

    # -- the maths --------------------------------------------------------------------------------

    def pre_acts(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_transcoder"]:
        """``x @ W_enc.T + b_enc``, before the TopK."""
        return F.linear(x.to(self.W_enc.dtype), self.W_enc, self.b_enc)

    def topk(self, pre: Float[Tensor, "... d_transcoder"]) -> tuple[Float[Tensor, "... k"], Int[Tensor, "... k"]]:
        """The k largest pre-activations, as they are (circuit-tracer's TopK), and their feature indices."""
        return pre.topk(self.k, dim=-1, sorted=False)

    def encode(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_transcoder"]:
        """Feature activations: the TopK of the pre-activations, every other feature 0 (dense tensor)."""
        vals, idx = self.topk(self.pre_acts(x))
        return torch.zeros(*vals.shape[:-1], self.d_transcoder, dtype=vals.dtype, device=vals.device).scatter_(
            -1, idx, vals)

    def skip(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The skip connection's term ``x @ W_skip.T`` (zeros when there is none)."""
        if self.W_skip is None:
            return torch.zeros_like(x, dtype=self.b_dec.dtype)
        return x.to(self.W_skip.dtype) @ self.W_skip.T

    def decode(self, acts: Float[Tensor, "... d_transcoder"],
               x: Optional[Float[Tensor, "... d_model"]] = None) -> Float[Tensor, "... d_model"]:
        """``acts @ W_dec + b_dec`` plus, with a skip connection, ``x @ W_skip.T`` (then ``x`` is required)."""
        out = acts @ self.W_dec + self.b_dec
        if self.W_skip is not None:
            if x is None:
                raise SproutError("this transcoder has a skip connection: decode(acts, x) needs the input x too")
            out = out + self.skip(x)
        return out

    def decode_sparse(self, vals: Float[Tensor, "... k"], idx: Int[Tensor, "... k"],
                      x: Optional[Float[Tensor, "... d_model"]] = None) -> Float[Tensor, "... d_model"]:
        """The same as :meth:`decode` for activations given as (values, indices): only k rows of W_dec are read."""
        out = torch.einsum("...k,...kd->...d", vals, self.W_dec[idx]) + self.b_dec
        if self.W_skip is not None:
            if x is None:
                raise SproutError("this transcoder has a skip connection: decode_sparse(vals, idx, x) needs x too")
            out = out + self.skip(x)
        return out

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The predicted feed-forward output ŷ of the input ``x``, in ``x``'s dtype."""
        vals, idx = self.topk(self.pre_acts(x))
        return self.decode_sparse(vals, idx, x).to(x.dtype)

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        """Scale every decoder row to unit norm (the recipe keeps them so)."""
        self.W_dec.div_(self.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-8))


class TranscoderSet(nn.Module):
    """Transcoders of several layers of one model (all of them, for a replacement model), as circuit-tracer's
    ``TranscoderSet``: index it by layer, iterate it in layer order.

    Attributes:
        transcoders: {layer: Transcoder}; layers: their sorted layer numbers.
        feature_input_hook / feature_output_hook: circuit-tracer's names (``mlp.hook_in`` / ``mlp.hook_out``).
        info: the config.yaml's ``sprout`` block (model name, fingerprint, hook names).
    """

    feature_input_hook = FEATURE_INPUT_HOOK
    feature_output_hook = FEATURE_OUTPUT_HOOK

    def __init__(self, transcoders: dict[int, Transcoder], info: Optional[dict] = None):
        super().__init__()
        if not transcoders:
            raise SproutError("a TranscoderSet needs at least one transcoder")
        for layer, tc in transcoders.items():
            if not isinstance(tc, Transcoder) or tc.layer != layer:
                raise SproutError(f"transcoders[{layer!r}] must be the Transcoder of layer {layer!r}, got {tc!r}")
        self.layers = sorted(transcoders)
        self._tcs = nn.ModuleDict({str(i): transcoders[i] for i in self.layers})
        self.info = dict(info or {})

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer: int) -> Transcoder:
        if integer(layer) is None or integer(layer) not in self.layers:
            raise SproutError(f"no transcoder for layer {layer!r}: this set has layers {self.layers}")
        return self._tcs[str(integer(layer))]

    def __iter__(self):
        return (self._tcs[str(i)] for i in self.layers)

    def __repr__(self) -> str:
        t = self[self.layers[0]]
        ks = sorted({tc.k for tc in self})
        k = ks[0] if len(ks) == 1 else "/".join(str(tc.k) for tc in self) + " by layer"
        return (f"TranscoderSet(layers {self.layers}, d_transcoder {t.d_transcoder}, k {k}"
                f"{', skip' if t.has_skip else ''}, model {self.info.get('model_name', '?')!r})")


# -- files --------------------------------------------------------------------------------------------


def layer_file(layer: int) -> str:
    """circuit-tracer's file name for a layer: ``layer_{layer}.safetensors``."""
    return f"layer_{int(layer)}.safetensors"


def transcoder_folder(model) -> Path:
    """Where the shipped transcoders of ``model`` live: ``<checkpoint folder>/transcoders``."""
    src = getattr(as_hooked(model), "source", None)
    if not src:
        raise TranscoderNotFoundError("the model has no checkpoint folder to keep transcoders in: pass folder=...")
    p = Path(src)
    return (p if p.is_dir() else p.parent) / "transcoders"


def _config(model_name: str, fp: dict, layers: dict[int, dict], k: int, skip: bool, d_transcoder: int,
            d_model: int) -> dict:
    """circuit-tracer's keys plus the ``sprout`` block. ``k`` is the lowest layer's (circuit-tracer's one k); a
    layer whose k differs names its own in its ``sprout.layers`` entry, which :func:`load_transcoders` reads."""
    return {
        "model_name": model_name, "model_kind": "transcoder_set", "scan": f"sprout-interp/{model_name}-plt-topk{k}",
        "feature_input_hook": FEATURE_INPUT_HOOK, "feature_output_hook": FEATURE_OUTPUT_HOOK,
        "activation": "topk", "k": k, "skip_connection": skip, "d_transcoder": d_transcoder, "d_model": d_model,
        "transcoders": [layer_file(i) for i in sorted(layers)],
        "sprout": {"input_hook": input_hook(0).replace(".0.", ".{layer}.") + " times ln2's gain",
                   "output_hook": output_hook(0).replace(".0.", ".{layer}."), "recipe": TC_RECIPE,
                   "fingerprint": fp, "layers": {str(i): layers[i] for i in sorted(layers)}},
    }


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save_transcoder_layer(tc: Transcoder, folder: Union[str, Path], dtype: torch.dtype = torch.float32) -> Path:
    """Write ``layer_{l}.safetensors`` (in ``dtype``) into ``folder`` and add the layer to its ``config.yaml``
    (created when missing; a layer already there is replaced). Returns the folder.

    Raises TranscoderMismatchError when the folder's config.yaml belongs to another model or another width, k
    or skip setting.
    """
    from safetensors.torch import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fp = tc.info.get("fingerprint") or {}
    layers: dict[int, dict] = {}
    if (folder / TC_CONFIG).is_file():
        old = read_json(folder / TC_CONFIG, "transcoder config")
        same = (old.get("skip_connection"), old.get("d_transcoder"), (old.get("sprout") or {}).get(
            "fingerprint")) == (tc.has_skip, tc.d_transcoder, fp)
        if not same:
            raise TranscoderMismatchError(
                f"{folder / TC_CONFIG} describes transcoders of another model, width or skip setting: save layer "
                f"{tc.layer} into a folder of its own")
        layers = {int(i): v for i, v in (old["sprout"].get("layers") or {}).items()}
        for v in layers.values():  # an entry written before layers named their own k has the set's
            if isinstance(v, dict) and "k" not in v:
                v["k"] = old.get("k")
    info = {k: v for k, v in tc.info.items() if k not in ("fingerprint", "model_name", "recipe", "k")}
    layers[tc.layer] = {"k": tc.k, **info}  # each layer's own k: a set may mix them (one width: circuit-tracer's)
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in tc.state_dict().items()}
    _write_atomic(folder / layer_file(tc.layer), save(sd, metadata={"format": "pt"}))
    low = layers[min(layers)]
    cfg = _config(tc.info.get("model_name", ""), fp, layers, low.get("k", tc.k) if isinstance(low, dict) else tc.k,
                  tc.has_skip, tc.d_transcoder, tc.d_model)
    _write_atomic(folder / TC_CONFIG, (json.dumps(cfg, indent=1) + "\n").encode("utf-8"))
    return folder


def save_transcoders(ts: TranscoderSet, folder: Union[str, Path], dtype: torch.dtype = torch.float16) -> Path:
    """Write every layer of ``ts`` (in ``dtype``: float16 for shipping) and one ``config.yaml`` into ``folder``."""
    for tc in ts:
        save_transcoder_layer(tc, folder, dtype)
    return Path(folder)


def max_k(d_transcoder: int) -> int:
    """The largest ``k`` a transcoder of width ``d_transcoder`` may have: a quarter of its width (at least 1).

    A TopK transcoder is sparse (the shipped ones keep 32 of 768 features, Gao et al. 2024 keep k well under 1% of
    the width); an attribution graph holds ``k + 2`` source vectors per (layer, position), so a "TopK" of the whole
    width would make every graph as large as one of dense features (6 GB for a prompt of gpt-4 with k = width)."""
    return max(1, int(d_transcoder) // 4)


def _bad(folder: Path, why: str) -> TranscoderMismatchError:
    return TranscoderMismatchError(
        f"the transcoders in {folder} cannot be used: {why}. Train them again "
        "(python -m sprout_interp.features.transcoder_train --model NAME --layers ...)")


def _int(cfg: dict, key: str, lo: int, hi: int, folder: Path) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(folder, f"config.yaml's {key!r} must be an int in {lo}..{hi}, got {str(v)[:40]!r}")
    return v


def load_transcoders(model, folder: Union[str, Path, None] = None,
                     layers: Optional[list[int]] = None) -> TranscoderSet:
    """The transcoders saved for ``model``: those beside its checkpoint (``<checkpoint>/transcoders``) or in
    ``folder``, every layer config.yaml lists (or only ``layers``), float32 on the model's device.

    Before any tensor is allocated it checks the config (a JSON object of at most
    ``limits.MAX_JSON_BYTES``; whole numbers in range), each layer file's size
    (``limits.MAX_WEIGHTS_BYTES``), its tensor names, float dtypes and shapes against the config and the
    model (:func:`~sprout_interp.core.loading.read_safetensors`, the checkpoints' and SAEs' reader); after
    reading, that no value is NaN, infinite or beyond ``limits.MAX_WEIGHT_ABS`` (:func:`~sprout_interp.core.configs.check_weights`); and the
    checkpoint fingerprint (config, weights, vocabulary). Raises
    :class:`~sprout_interp.core.errors.NotAPathError` when ``folder`` is not a path,
    :class:`~sprout_interp.core.errors.TranscoderNotFoundError` when there is no set,
    :class:`~sprout_interp.core.errors.InvalidWeightsError` for NaN, infinite or non-float weights and
    :class:`~sprout_interp.core.errors.TranscoderMismatchError` for anything else wrong, naming the file.
    """
    m = as_hooked(model)
    folder = transcoder_folder(m) if folder is None else as_path(folder, "folder", "a transcoder folder")
    if not (folder / TC_CONFIG).exists():
        raise TranscoderNotFoundError(
            f"{folder} holds no {TC_CONFIG}: train transcoders with "
            "`python -m sprout_interp.features.transcoder_train --model NAME --out FOLDER`")
    try:
        cfg = read_json(folder / TC_CONFIG, "transcoder config")
    except SproutError as e:  # damaged, oversized, not an object, not a regular file
        raise _bad(folder, str(e)) from None
    d_model = _int(cfg, "d_model", 1, limits.LIMITS["d_model"], folder)
    d_tc = _int(cfg, "d_transcoder", 1, 1 << 24, folder)
    k = _int(cfg, "k", 1, max_k(d_tc), folder)
    skip = cfg.get("skip_connection")
    if not isinstance(skip, bool) or cfg.get("activation") != "topk":
        raise _bad(folder, "config.yaml must name activation 'topk' and skip_connection true or false")
    if (cfg.get("feature_input_hook"), cfg.get("feature_output_hook")) != (FEATURE_INPUT_HOOK, FEATURE_OUTPUT_HOOK):
        raise _bad(folder, f"config.yaml's hooks must be {FEATURE_INPUT_HOOK!r} -> {FEATURE_OUTPUT_HOOK!r}")
    sprout = cfg.get("sprout")
    files = cfg.get("transcoders")
    if not isinstance(sprout, dict) or not isinstance(sprout.get("layers"), dict) or not isinstance(files, list):
        raise _bad(folder, "config.yaml has no 'transcoders' list or 'sprout' block with its 'layers'")
    listed = {}
    for f in files:
        name = f if isinstance(f, str) else ""
        stem = name[len("layer_"):-len(".safetensors")] if name.startswith("layer_") and name.endswith(
            ".safetensors") else ""
        if not stem.isdigit() or name != layer_file(int(stem)) or not int(stem) < m.cfg.n_layers:
            raise _bad(folder, f"config.yaml lists {str(f)[:60]!r}, not a file layer_L.safetensors for a layer "
                               f"0..{m.cfg.n_layers - 1} of {m.name or 'this model'}")
        listed[int(stem)] = name
    want = sorted(listed) if layers is None else check_indices(layers, "layers", m.cfg.n_layers,
                                                                what=f"{m.name or 'the model'}'s blocks, 0-indexed")
    for layer in want:
        if layer not in listed:
            raise TranscoderNotFoundError(f"{folder} has no transcoder for layer {layer!r}: it has {sorted(listed)}")
    if d_model != m.cfg.d_model:
        raise TranscoderMismatchError(f"the transcoders in {folder} read {d_model}-dimensional activations but "
                                      f"{m.name or 'the model'} has d_model {m.cfg.d_model}: they belong to another model")
    fp = check_fingerprint(sprout.get("fingerprint"), f"the transcoders in {folder}", TranscoderMismatchError)
    bad = fingerprint_mismatch(fingerprint(m), fp, "transcoders")
    if bad:
        raise TranscoderMismatchError(
            f"the transcoders in {folder} were trained for another checkpoint ({cfg.get('model_name') or 'unknown'}): "
            f"their {', '.join(bad)} differ from {m.name or 'this model'}'s. Train transcoders for this checkpoint")
    shapes = {"W_enc": (d_tc, d_model), "W_dec": (d_tc, d_model), "b_enc": (d_tc,), "b_dec": (d_model,)}
    if skip:
        shapes["W_skip"] = (d_model, d_model)
    out = {}
    for layer in want:
        p = folder / listed[layer]

        def check_shapes(got: dict[str, tuple[int, ...]], p: Path = p) -> None:
            if got != shapes:
                raise _bad(folder, f"{p.name} holds tensors {dict(sorted(got.items())[:6])} where config.yaml "
                                   f"needs {shapes}")

        try:
            sd = read_safetensors(p, str(p), check_shapes)
        except NotACheckpointError as e:  # damaged or oversized
            raise _bad(folder, f"{p.name}: {e}") from None
        check_weights(sd, str(p))
        info = sprout["layers"].get(str(layer))
        info = info if isinstance(info, dict) else {}
        k_layer = _int(info, "k", 1, max_k(d_tc), folder) if "k" in info else k  # a layer's own k, else the set's
        tc = Transcoder(d_model, d_tc, k_layer, layer, skip, dict(info, model_name=cfg.get("model_name", ""),
                                                                  fingerprint=fp))
        tc.load_state_dict({n: t.float() for n, t in sd.items()})
        out[layer] = tc.eval()
    return TranscoderSet(out, {"model_name": cfg.get("model_name", ""), "fingerprint": fp, "folder": str(folder),
                               "input_hook": sprout.get("input_hook"), "output_hook": sprout.get("output_hook")}
                         ).to(m.device)

