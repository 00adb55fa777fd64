"""The sparse autoencoder itself: a TopK SAE on one hook point of the residual stream, and its files.

The architecture is Gao et al. 2024, "Scaling and evaluating sparse autoencoders" (OpenAI), as SAELens's
``TopKSAE`` computes it::

    pre  = (x - b_dec) @ W_enc + b_enc              (..., d_sae)
    acts = the k largest entries of pre, ReLU'd; every other entry 0
    x̂    = acts @ W_dec + b_dec                     (..., d_in)

``W_enc`` is ``(d_in, d_sae)``, ``W_dec`` is ``(d_sae, d_in)``: row ``f`` of ``W_dec`` is feature ``f``'s
direction in the stream (unit norm, kept so by training).

On disk an SAE is a folder in SAELens's format: ``sae_weights.safetensors`` with the tensors ``W_enc``,
``b_enc``, ``W_dec``, ``b_dec`` (float16 by default: a few MB for Sprout) and ``cfg.json`` with SAELens's keys
(``d_in``, ``d_sae``, ``dtype``, ``device``, ``architecture`` = ``"topk"``, ``k``, ``apply_b_dec_to_input``,
``normalize_activations``, ``reshape_activations``, ``metadata`` with ``model_name``, ``hook_name``,
``hook_layer``, ``context_size``, ``prepend_bos`` …; the pre-6.0 flat keys ``model_name``, ``hook_name``,
``hook_layer`` too) plus a ``sprout`` block: the checkpoint's fingerprint (its config and the sha256 of its
weights and vocabulary, :func:`sprout_interp.core.fingerprints.fingerprint`), the training recipe and its
numbers. :func:`load_sae` refuses a folder made for another checkpoint or hook point with
:class:`~sprout_interp.core.errors.SAEMismatchError`.

Shipped SAEs live beside their checkpoint: ``<checkpoint>/saes/blocks.{l}.hook_resid_post/``.
"""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Optional, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from sprout_interp.core.arguments import check_index
from sprout_interp.core.configs import check_weights
from sprout_interp.core.errors import NotACheckpointError, SAEMismatchError, SAENotFoundError, SproutError
from sprout_interp.core.files import as_path, read_json
from sprout_interp.core.fingerprints import check_fingerprint, fingerprint, fingerprint_mismatch
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.loading import read_safetensors

__all__ = [
    "SAE_WEIGHTS", "SAE_CFG", "RECIPE", "SparseAutoencoder", "resid_hook", "hook_layer", "sae_folder",
    "save_sae", "read_sae", "load_sae", "available_saes", "check_for_model",
]

SAE_WEIGHTS, SAE_CFG = "sae_weights.safetensors", "cfg.json"
#: The training recipe every SAE here follows (also written into each cfg.json).
RECIPE = ("TopK SAE, Gao et al. 2024 'Scaling and evaluating sparse autoencoders': k active latents, unit-norm "
          "decoder rows (gradient parallel to them removed), encoder started as the decoder's transpose, b_dec "
          "started at the mean, AuxK loss (top k_aux dead latents reconstruct the residual error, coefficient "
          "1/32), normalised MSE, Adam")
#: SAELens version whose cfg.json layout the files follow
SAELENS_FORMAT = "6.0.0"

#: SAELens's cfg.json settings that change what an SAE computes, and the values this toolkit applies (the first is
#: SAELens's default, taken when the entry is absent). A file with any other value is refused naming the setting.
_SETTINGS = {
    "apply_b_dec_to_input": (True, False),  # subtract b_dec from the input before encoding, or not: applied
    # SAELens's DTYPE_MAP names: the weights are read in their stored dtype and computed in float32 here
    "dtype": ("float32", "float16", "bfloat16", "float64", "torch.float32", "torch.float16", "torch.bfloat16",
              "torch.float64"),
    "normalize_activations": ("none",),
    "reshape_activations": ("none",),
    "rescale_acts_by_decoder_norm": (False,),
}
_SETTINGS_WHY = {
    "apply_b_dec_to_input": "true or false",
    "dtype": "SAELens's dtype names; computed in float32 here",
    "normalize_activations": "'expected_average_only_in' needs a scaling factor the file does not hold, and "
                             "'constant_norm_rescale' and 'layer_norm' rescale each token's reconstruction by its "
                             "input, which this toolkit does not apply: fold the normalisation into the weights "
                             "(SAELens's fold_activation_norm_scaling_factor) and save with 'none'",
    "reshape_activations": "this toolkit reads the residual stream, never hook_z",
    "rescale_acts_by_decoder_norm": "not applied here: fold the decoder norms into the encoder (SAELens's "
                                    "fold_W_dec_norm) and save with false",
}

_HOOK = re.compile(r"^blocks\.(\d+)\.hook_resid_(pre|mid|post)$")


def resid_hook(layer: int) -> str:
    """The hook point an SAE of ``layer`` (0-indexed) reads: ``blocks.{layer}.hook_resid_post``."""
    return act_name("resid_post", int(layer))


def hook_layer(hook_name: str) -> int:
    """The 0-indexed layer of a residual-stream hook name (``blocks.3.hook_resid_post`` -> 3)."""
    m = _HOOK.match(hook_name or "")
    if not m:
        raise SproutError(f"{hook_name!r} is not a residual-stream hook point (blocks.{{l}}.hook_resid_pre|mid|post)")
    return int(m.group(1))


class SparseAutoencoder(nn.Module):
    """A TopK sparse autoencoder on one hook point (see the module docstring for the maths).

    Attributes:
        W_enc (d_in, d_sae), b_enc (d_sae,), W_dec (d_sae, d_in), b_dec (d_in,): the parameters, SAELens's names.
        k: active latents per token.
        apply_b_dec_to_input: whether ``b_dec`` is subtracted from the input before encoding (SAELens's setting of
            the same name; True for every SAE trained here).
        hook_name: the hook point it reads and replaces (``blocks.{l}.hook_resid_post``).
        info: everything else the cfg.json records (model name, fingerprint, recipe, training numbers).
    """

    def __init__(self, d_in: int, d_sae: int, k: int, hook_name: str, info: Optional[dict] = None,
                 apply_b_dec_to_input: bool = True):
        super().__init__()
        if not (0 < k <= d_sae):
            raise SproutError(f"k must be between 1 and d_sae ({d_sae}), got {k}")
        if not isinstance(apply_b_dec_to_input, bool):
            raise SproutError(f"apply_b_dec_to_input must be True or False, got {apply_b_dec_to_input!r}")
        hook_layer(hook_name)
        self.d_in, self.d_sae, self.k, self.hook_name = int(d_in), int(d_sae), int(k), hook_name
        self.apply_b_dec_to_input = apply_b_dec_to_input
        self.W_enc = nn.Parameter(torch.zeros(d_in, d_sae))
        self.b_enc = nn.Parameter(torch.zeros(d_sae))
        self.W_dec = nn.Parameter(torch.zeros(d_sae, d_in))
        self.b_dec = nn.Parameter(torch.zeros(d_in))
        self.info = dict(info or {})

    @property
    def layer(self) -> int:
        """The 0-indexed layer of the hook point (block = layer + 1)."""
        return hook_layer(self.hook_name)

    def __repr__(self) -> str:
        return (f"SparseAutoencoder({self.hook_name}: d_in {self.d_in}, d_sae {self.d_sae}, k {self.k}, "
                f"model {self.info.get('model_name', '?')!r})")

    @classmethod
    def for_model(cls, model, layer: int, d_sae: int, k: int, seed: int = 0) -> "SparseAutoencoder":
        """A freshly initialised SAE for ``model``'s ``blocks.{layer}.hook_resid_post``, with its fingerprint.

        Decoder rows are random unit vectors (seeded), the encoder is their transpose, biases zero.
        """
        m = as_hooked(model)
        if not 0 <= layer < m.cfg.n_layers:
            raise SproutError(f"layer {layer} is out of range: the model has layers 0..{m.cfg.n_layers - 1}")
        sae = cls(m.cfg.d_model, d_sae, k, resid_hook(layer),
                  {"model_name": m.name or "", "fingerprint": fingerprint(m), "context_size": m.cfg.n_ctx})
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(d_sae, m.cfg.d_model, generator=g)
        with torch.no_grad():
            sae.W_dec.copy_(w / w.norm(dim=-1, keepdim=True))
            sae.W_enc.copy_(sae.W_dec.T)
        return sae

    # -- the maths --------------------------------------------------------------------------------

    def pre_acts(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """``(x - b_dec) @ W_enc + b_enc`` (``x @ W_enc + b_enc`` when ``apply_b_dec_to_input`` is False), before the
        TopK."""
        x = x.to(self.W_enc.dtype)
        return (x - self.b_dec if self.apply_b_dec_to_input else x) @ self.W_enc + self.b_enc

    def topk(self, pre: Float[Tensor, "... d_sae"]) -> tuple[Float[Tensor, "... k"], Int[Tensor, "... k"]]:
        """The k largest pre-activations, ReLU'd, and their latent indices."""
        vals, idx = pre.topk(self.k, dim=-1, sorted=False)
        return vals.relu(), idx

    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """Feature activations: the TopK of the pre-activations, every other latent 0 (dense tensor)."""
        vals, idx = self.topk(self.pre_acts(x))
        return torch.zeros(*vals.shape[:-1], self.d_sae, dtype=vals.dtype, device=vals.device).scatter_(-1, idx, vals)

    def decode(self, acts: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_in"]:
        """``acts @ W_dec + b_dec``."""
        return acts @ self.W_dec + self.b_dec

    def decode_sparse(self, vals: Float[Tensor, "... k"], idx: Int[Tensor, "... k"]) -> Float[Tensor, "... d_in"]:
        """The same as :meth:`decode` for activations given as (values, indices): only k rows of W_dec are read."""
        return torch.einsum("...k,...kd->...d", vals, self.W_dec[idx]) + self.b_dec

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_in"]:
        """The reconstruction x̂ of ``x``, in ``x``'s dtype."""
        vals, idx = self.topk(self.pre_acts(x))
        return self.decode_sparse(vals, idx).to(x.dtype)

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        """Scale every decoder row to unit norm (the recipe keeps them so)."""
        self.W_dec.div_(self.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-8))


# -- files --------------------------------------------------------------------------------------------


def sae_folder(model, layer: int, root: Union[str, Path, None] = None) -> Path:
    """Where the SAE of ``layer`` lives: ``<root or the checkpoint folder>/saes/blocks.{layer}.hook_resid_post``."""
    if root is None:
        src = getattr(as_hooked(model), "source", None)
        if not src:
            raise SAENotFoundError("the model has no checkpoint folder to keep SAEs in: pass folder=...")
        p = Path(src)
        root = p if p.is_dir() else p.parent
    return Path(root) / "saes" / resid_hook(layer)


def _cfg(sae: SparseAutoencoder, dtype: torch.dtype) -> dict:
    info = dict(sae.info)
    meta = {
        "sae_lens_version": SAELENS_FORMAT, "sae_lens_training_version": None,
        "model_name": info.get("model_name", ""), "hook_name": sae.hook_name, "hook_layer": sae.layer,
        "hook_head_index": None, "prepend_bos": False, "context_size": info.get("context_size"),
        "dataset_path": info.get("dataset_path", "sprout_model.corpus training documents"),
        "model_class_name": "HookedSprout", "exclude_special_tokens": False, "sequence_separator_token": None,
        "disable_concat_sequences": True, "neuronpedia_id": None, "model_from_pretrained_kwargs": {},
        "seqpos_slice": [None],
    }
    return {
        "d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": str(dtype).split(".")[-1], "device": "cpu",
        "architecture": "topk", "k": sae.k, "rescale_acts_by_decoder_norm": False,
        "apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": "none", "reshape_activations": "none",
        "metadata": meta,
        # the pre-6.0 flat keys, for readers of the older layout
        "model_name": meta["model_name"], "hook_name": sae.hook_name, "hook_layer": sae.layer,
        "context_size": meta["context_size"], "activation_fn": "topk", "activation_fn_kwargs": {"k": sae.k},
        "sprout": {k: v for k, v in info.items() if k not in ("model_name", "context_size", "dataset_path")},
    }


def save_sae(sae: SparseAutoencoder, folder: Union[str, Path], dtype: torch.dtype = torch.float16) -> Path:
    """Write ``sae_weights.safetensors`` (in ``dtype``) and ``cfg.json`` into ``folder``; returns the folder."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in sae.state_dict().items()}
    save_file(sd, str(folder / SAE_WEIGHTS), metadata={"format": "pt"})
    (folder / SAE_CFG).write_text(json.dumps(_cfg(sae, dtype), indent=1) + "\n", encoding="utf-8")
    return folder


def _cfg_fields(cfg: dict, where: str) -> tuple[int, int, int, str, dict, bool]:
    """(d_in, d_sae, k, hook name, info, apply_b_dec_to_input) from a cfg.json object, each of the form
    :func:`save_sae` writes; :class:`SAEMismatchError` naming the entry otherwise (nothing is converted: ``"16"``
    or ``16.0`` is no width; a SAELens setting this toolkit does not apply is refused, see ``_SETTINGS``)."""
    def bad(entry: str, v: object, should: str) -> SAEMismatchError:
        return SAEMismatchError(f"{where} is damaged: {SAE_CFG} has {entry} = {str(v)[:60]!r} ({type(v).__name__}); "
                                f"it should be {should}. Train it again")

    for entry in ("metadata", "sprout", "activation_fn_kwargs"):
        if not isinstance(cfg.get(entry) or {}, dict):
            raise bad(entry, cfg[entry], "an object")
    if cfg.get("architecture", "topk") != "topk" or cfg.get("activation_fn", "topk") != "topk":
        raise SAEMismatchError(f"{where} is a {str(cfg.get('architecture', cfg.get('activation_fn')))[:40]!r} SAE; "
                               "this toolkit runs TopK SAEs (architecture and activation_fn 'topk')")
    settings = {}
    for entry, should in _SETTINGS.items():  # SAELens's settings: applied, or the file refused naming them
        v = cfg.get(entry, should[0])
        if isinstance(v, bool) != isinstance(should[0], bool) or v not in should:
            raise SAEMismatchError(f"{where} sets {entry} = {str(v)[:60]!r} in {SAE_CFG}, outside the values this "
                                   f"toolkit applies: {list(should)} ({_SETTINGS_WHY[entry]})")
        settings[entry] = v
    meta, sprout = cfg.get("metadata") or {}, cfg.get("sprout") or {}
    k = cfg.get("k", (cfg.get("activation_fn_kwargs") or {}).get("k"))
    sizes = {"d_in": cfg.get("d_in"), "d_sae": cfg.get("d_sae"), "k": k}
    for entry, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise bad(entry, v, "a whole number of at least 1")
    hook = meta.get("hook_name") or cfg.get("hook_name")
    if not isinstance(hook, str):
        raise bad("hook_name", hook, "a residual-stream hook point such as 'blocks.3.hook_resid_post'")
    if "fingerprint" in sprout:
        check_fingerprint(sprout["fingerprint"], where, SAEMismatchError)
    info = dict(sprout, model_name=meta.get("model_name", ""), context_size=meta.get("context_size"))
    return sizes["d_in"], sizes["d_sae"], sizes["k"], hook, info, settings["apply_b_dec_to_input"]


def read_sae(folder: Union[str, Path]) -> SparseAutoencoder:
    """An SAE folder read as it is, float32, without checking which model it was made for (see :func:`load_sae`).

    Read as a checkpoint is: ``cfg.json`` of bounded size, an object with whole-number widths; the weights'
    dtypes and shapes checked from the header against those widths before anything is allocated (so a cfg.json
    asking for gigabytes costs nothing), then their values finite. Raises
    :class:`~sprout_interp.core.errors.NotAPathError` when ``folder`` is not a path,
    :class:`~sprout_interp.core.errors.SAENotFoundError` when it holds no SAE,
    :class:`~sprout_interp.core.errors.InvalidWeightsError` for NaN, infinite or non-float weights and
    :class:`~sprout_interp.core.errors.SAEMismatchError` for a damaged, oversized or malformed one.
    """
    folder = as_path(folder, "folder", f"an SAE folder holding {SAE_CFG} + {SAE_WEIGHTS}")
    if not (folder / SAE_WEIGHTS).is_file() or not (folder / SAE_CFG).is_file():
        raise SAENotFoundError(f"{folder} holds no {SAE_CFG} + {SAE_WEIGHTS}: train an SAE with "
                               "`python -m sprout_interp.features.train --model NAME --layer L`")
    where = f"the SAE in {folder}"
    try:
        cfg = read_json(folder / SAE_CFG, "SAE cfg")
    except SproutError as e:  # damaged, oversized, not an object, unreadable
        raise SAEMismatchError(f"{where} cannot be read: {e}. Train it again") from None
    d_in, d_sae, k, hook, info, b_dec_in = _cfg_fields(cfg, where)
    try:
        with torch.device("meta"):  # the shapes cfg.json asks for, nothing allocated
            want = {n: tuple(v.shape) for n, v in SparseAutoencoder(d_in, d_sae, k, hook).state_dict().items()}
    except SproutError as e:  # k above d_sae, a hook that is not on the residual stream
        raise SAEMismatchError(f"{where} cannot be used: {e}") from None

    def check_shapes(got: dict[str, tuple[int, ...]]) -> None:
        if got != want:
            raise SAEMismatchError(f"{where} holds tensors {dict(sorted(got.items())[:6])} where its {SAE_CFG} "
                                   f"needs {want}; train it again")

    source = str(folder / SAE_WEIGHTS)
    try:
        sd = read_safetensors(folder / SAE_WEIGHTS, source, check_shapes)
    except NotACheckpointError as e:  # damaged or oversized
        raise SAEMismatchError(f"{where} cannot be read: {e}") from None
    check_weights(sd, source)
    sae = SparseAutoencoder(d_in, d_sae, k, hook, info, apply_b_dec_to_input=b_dec_in)
    sae.load_state_dict({n: v.float() for n, v in sd.items()})
    return sae.eval()


def check_for_model(sae: SparseAutoencoder, model, layer: Optional[int] = None, where: str = "") -> None:
    """Raise :class:`SAEMismatchError` unless ``sae`` was made for ``model`` (same fingerprint: config, weights,
    vocabulary) and, when given, for ``layer``'s hook point."""
    m = as_hooked(model)
    where = where or "this SAE"
    if sae.d_in != m.cfg.d_model:
        raise SAEMismatchError(f"{where} reads {sae.d_in}-dimensional activations but {m.name or 'the model'} has "
                               f"d_model {m.cfg.d_model}: it belongs to another model")
    if layer is not None and sae.hook_name != resid_hook(layer):
        raise SAEMismatchError(f"{where} was trained on {sae.hook_name} (layer {sae.layer}), not on "
                               f"{resid_hook(layer)} (layer {layer}): load the SAE of layer {layer}")
    if sae.layer >= m.cfg.n_layers:
        raise SAEMismatchError(f"{where} reads {sae.hook_name}, but the model has only layers 0..{m.cfg.n_layers - 1}")
    fp = sae.info.get("fingerprint")
    if not fp:
        warnings.warn(f"{where} records no checkpoint fingerprint: nothing checks that it was trained on "
                      f"{m.name or 'this model'}", UserWarning, stacklevel=3)
        return
    bad = fingerprint_mismatch(fingerprint(m), fp, "SAE")
    if bad:
        raise SAEMismatchError(
            f"{where} was trained for another checkpoint ({sae.info.get('trained_on') or 'unknown'}): its "
            f"{', '.join(bad)} differ from {m.name or 'this model'}'s. Train an SAE for this checkpoint "
            "(python -m sprout_interp.features.train --model ... --layer ...)")


def load_sae(model, layer: Optional[int] = None, folder: Union[str, Path, None] = None) -> SparseAutoencoder:
    """The SAE saved for ``model``: the one of ``layer`` beside its checkpoint, or the one in ``folder``.

    Raises :class:`~sprout_interp.core.errors.ArgumentError` for a ``layer`` that is not a whole number in
    0..n_layers-1 (``"1"``, ``1.5`` and ``True`` are no layer), :class:`~sprout_interp.core.errors.NotAPathError`
    for a ``folder`` that is not a path, :class:`~sprout_interp.core.errors.SAENotFoundError` when there is none
    and :class:`~sprout_interp.core.errors.SAEMismatchError` when it was made for another checkpoint (a different
    config, vocabulary or weights) or another layer, or cannot be read (see :func:`read_sae`).
    """
    if layer is None and folder is None:
        raise SproutError("load_sae needs a layer (the SAE beside the checkpoint) or a folder")
    if layer is not None:
        L = as_hooked(model).cfg.n_layers
        layer = check_index(layer, "layer", L, what=f"a layer of this model, 0..{L - 1}; block = layer + 1")
    folder = sae_folder(model, layer) if folder is None else as_path(folder, "folder", "an SAE folder")
    sae = read_sae(folder)
    check_for_model(sae, model, layer, where=f"the SAE in {folder}")
    return sae.to(as_hooked(model).device)


def available_saes(model) -> list[int]:
    """The layers (0-indexed) with an SAE saved beside the model's checkpoint."""
    try:
        root = sae_folder(model, 0).parent
    except SAENotFoundError:
        return []
    out = []
    for p in sorted(root.glob("blocks.*.hook_resid_post")):
        if (p / SAE_WEIGHTS).is_file() and (p / SAE_CFG).is_file():
            out.append(hook_layer(p.name))
    return sorted(out)
