"""Exports: Sprout as a Hugging Face ``Qwen3ForCausalLM`` and as a TransformerLens ``TransformerBridge``.

Sprout's architecture is Qwen3's (pre-norm RMSNorm, per-head QK-norm before rotate-half RoPE, SwiGLU,
tied embeddings, no biases), so a checkpoint maps onto it weight for weight:

=============================  =========================================================
Sprout (``sprout_model.GPT``)   Hugging Face ``Qwen3ForCausalLM``
=============================  =========================================================
``embed``                       ``model.embed_tokens`` (``lm_head`` tied to it)
``blocks.i.norm1``              ``model.layers.i.input_layernorm``
``blocks.i.attn.qkv``           ``model.layers.i.self_attn.{q,k,v}_proj`` (rows split in that order)
``blocks.i.attn.q_norm/k_norm`` ``model.layers.i.self_attn.q_norm/k_norm``
``blocks.i.attn.proj``          ``model.layers.i.self_attn.o_proj``
``blocks.i.norm2``              ``model.layers.i.post_attention_layernorm``
``blocks.i.ffn.w1/w3/w2``       ``model.layers.i.mlp.gate_proj/up_proj/down_proj``
``norm``                        ``model.norm``
=============================  =========================================================

Everything here works without network access: nothing is looked up on the Hub, the TransformerLens
bridge is booted around the already-built Hugging Face model and tokenizer.

Example::

    from sprout_model.checkpoint import load_folder
    from tokenizers import Tokenizer
    from sprout_interp.core.export import to_hf, to_transformer_lens

    gpt, _ = load_folder("model/checkpoints/gpt-4")
    tok = Tokenizer.from_file("model/checkpoints/tokenizer.json")
    hf_model, hf_tok = to_hf(gpt, tok)
    hf_model.save_pretrained("sprout-hf"); hf_tok.save_pretrained("sprout-hf")
    bridge = to_transformer_lens(gpt, tok)
    logits, cache = bridge.run_with_cache("Zorbin Plax came home.")
    cache["blocks.3.hook_resid_post"]
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tokenizers import Tokenizer

from sprout_interp.core.errors import ExportError, VocabularyMismatchError
from sprout_interp.core.tokens import tokenizer_call, tokenizer_from_json
from sprout_model import GPT, Config

if TYPE_CHECKING:  # imported lazily at run time: transformers is heavy and optional for most users
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

__all__ = ["ExportError", "hf_config", "hf_state_dict", "hf_tokenizer", "to_hf", "to_transformer_lens"]

EOT = "<|endoftext|>"
RMS_EPS = 1e-6  # sprout_model.RMSNorm's default, used by every norm in GPT
BRIDGE_MODEL_NAME = "sprout-export"  # a local label for the bridge; never resolved on the Hub


def _transformers_qwen3():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - transformers is a TransformerLens dependency
        raise ExportError(
            "exporting to Hugging Face needs the `transformers` package (>= 4.51, which added Qwen3); "
            "install it with `pip install 'transformers>=4.51'`"
        ) from e
    try:
        from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    except ImportError as e:
        raise ExportError(
            f"the installed transformers {transformers.__version__} has no Qwen3 model, which Sprout exports to; "
            "upgrade with `pip install -U 'transformers>=4.51'`"
        ) from e
    return transformers, Qwen3Config, Qwen3ForCausalLM, PreTrainedTokenizerFast


def _check_model(model: Any) -> Config:
    if not isinstance(model, GPT):
        # a HookedSprout (or any wrapper) that holds its GPT as .model is accepted too
        inner = getattr(model, "model", None)
        if isinstance(inner, GPT):
            return inner.cfg
        raise ExportError(f"expected a sprout_model.GPT (for example from sprout_interp.load(...).model), got {type(model).__name__}")
    return model.cfg


def _unwrap(model: Any) -> GPT:
    return model if isinstance(model, GPT) else model.model


def hf_config(cfg: Config, attn_implementation: str = "sdpa") -> "Qwen3Config":
    """The ``Qwen3Config`` with Sprout's shapes: full attention everywhere, tied embeddings, no biases, float32."""
    _, Qwen3Config, _, _ = _transformers_qwen3()
    if cfg.d_model % cfg.n_head:
        raise ExportError(f"d_model={cfg.d_model} is not a multiple of n_head={cfg.n_head}")
    kwargs = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_head,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        max_position_embeddings=cfg.context,
        rms_norm_eps=RMS_EPS,
        tie_word_embeddings=True,
        attention_bias=False,
        attention_dropout=0.0,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=cfg.n_layer,
        layer_types=["full_attention"] * cfg.n_layer,
        # pad_token_id stays None: in Qwen3Model it becomes the embedding's padding_idx, which would
        # freeze the gradient of <|endoftext|> (id 0, Sprout's document separator) in any fine-tuning
        bos_token_id=0,
        eos_token_id=0,
        architectures=["Qwen3ForCausalLM"],
    )
    # transformers >= 5 reads RoPE from rope_parameters; 4.x from rope_theta
    if "rope_parameters" in getattr(Qwen3Config, "__dataclass_fields__", {}) or hasattr(Qwen3Config(), "rope_parameters"):
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": float(cfg.rope_base)}
    else:  # pragma: no cover - transformers 4.x
        kwargs["rope_theta"] = float(cfg.rope_base)
    config = Qwen3Config(**kwargs)
    config._attn_implementation = attn_implementation
    try:
        config.dtype = torch.float32
    except Exception:  # pragma: no cover - older attribute name
        config.torch_dtype = torch.float32
    return config


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Sprout's weights under Qwen3ForCausalLM's parameter names (float32 copies; ``lm_head`` is the embedding)."""
    cfg = _check_model(model)
    model = _unwrap(model)
    sd: dict[str, torch.Tensor] = {}

    def put(name: str, t: torch.Tensor) -> None:
        sd[name] = t.detach().to(torch.float32).clone().contiguous()

    put("model.embed_tokens.weight", model.embed.weight)
    for i, b in enumerate(model.blocks):
        p = f"model.layers.{i}."
        q, k, v = b.attn.qkv.weight.split(cfg.d_model, dim=0)  # nn.Linear: (out, in); q, k, v stacked on out
        put(p + "self_attn.q_proj.weight", q)
        put(p + "self_attn.k_proj.weight", k)
        put(p + "self_attn.v_proj.weight", v)
        put(p + "self_attn.o_proj.weight", b.attn.proj.weight)
        put(p + "self_attn.q_norm.weight", b.attn.q_norm.weight)
        put(p + "self_attn.k_norm.weight", b.attn.k_norm.weight)
        put(p + "input_layernorm.weight", b.norm1.weight)
        put(p + "post_attention_layernorm.weight", b.norm2.weight)
        put(p + "mlp.gate_proj.weight", b.ffn.w1.weight)
        put(p + "mlp.up_proj.weight", b.ffn.w3.weight)
        put(p + "mlp.down_proj.weight", b.ffn.w2.weight)
    put("model.norm.weight", model.norm.weight)
    return sd


def _check_norm_eps(model: GPT) -> None:
    for name, m in model.named_modules():
        eps = getattr(m, "eps", None)
        if eps is not None and abs(float(eps) - RMS_EPS) > 0:
            raise ExportError(f"{name} uses eps={eps}, but the export assumes every RMSNorm uses {RMS_EPS}")


def _as_tokenizer(tokenizer: Tokenizer | str | Path) -> Tokenizer:
    if isinstance(tokenizer, Tokenizer):
        # a copy: the HF wrapper sets padding/truncation on it
        return tokenizer_from_json(tokenizer_call("writing the tokenizer out", tokenizer.to_str), "the tokenizer passed")
    path = Path(tokenizer)
    if not path.is_file():
        raise ExportError(f"no tokenizer file at {path}; pass a tokenizers.Tokenizer or the path of a tokenizer.json")
    return tokenizer_from_json(path.read_text(encoding="utf-8"), str(path))


def hf_tokenizer(
    tokenizer: Tokenizer | str | Path, context: int | None = None, *, bos_token: bool = True
) -> "PreTrainedTokenizerFast":
    """A ``PreTrainedTokenizerFast`` around Sprout's byte-level BPE, with ``<|endoftext|>`` as BOS, EOS and pad.

    It adds no special tokens when encoding (like ``sprout_model.tokenizer.encode``), so ids are identical.
    ``bos_token=False`` leaves BOS unset, as Qwen's own tokenizers do (the TransformerLens export uses that).
    """
    _, _, _, PreTrainedTokenizerFast = _transformers_qwen3()
    tok = _as_tokenizer(tokenizer)
    if tok.token_to_id(EOT) is None:
        raise ExportError(f"the tokenizer has no {EOT} token; is it Sprout's tokenizer.json?")
    kwargs: dict[str, Any] = dict(tokenizer_object=tok, eos_token=EOT, pad_token=EOT)
    if bos_token:
        kwargs["bos_token"] = EOT
    if context is not None:
        kwargs["model_max_length"] = context
    hf_tok = PreTrainedTokenizerFast(**kwargs)
    hf_tok.padding_side = "right"
    return hf_tok


def _matching_tokenizer(tokenizer: Tokenizer | str | Path, cfg: Config, bos_token: bool = True) -> "PreTrainedTokenizerFast":
    hf_tok = hf_tokenizer(tokenizer, context=cfg.context, bos_token=bos_token)
    if len(hf_tok) != cfg.vocab_size:
        raise VocabularyMismatchError(
            f"the tokenizer has {len(hf_tok)} tokens but the model's embedding has {cfg.vocab_size}; "
            "pass the tokenizer.json that was trained with this checkpoint"
        )
    return hf_tok


def to_hf(
    model: GPT,
    tokenizer: Tokenizer | str | Path | None = None,
    *,
    attn_implementation: str = "sdpa",
) -> tuple["Qwen3ForCausalLM", "PreTrainedTokenizerFast | None"]:
    """Sprout as a float32 ``Qwen3ForCausalLM`` in eval mode (same device as ``model``), and its tokenizer.

    ``tokenizer`` is a ``tokenizers.Tokenizer`` or the path of a ``tokenizer.json``; without one the second
    element is None. Both are ``save_pretrained``-able and reload offline with ``from_pretrained(folder)``.
    ``attn_implementation`` is "sdpa" (what Sprout itself runs) or "eager" (explicit softmax).
    """
    _, _, Qwen3ForCausalLM, _ = _transformers_qwen3()
    cfg = _check_model(model)
    gpt = _unwrap(model)
    _check_norm_eps(gpt)
    hf_tok = None if tokenizer is None else _matching_tokenizer(tokenizer, cfg)
    config = hf_config(cfg, attn_implementation=attn_implementation)
    device = gpt.embed.weight.device
    hf = Qwen3ForCausalLM(config)
    sd = hf_state_dict(gpt)
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ExportError(
            f"the installed transformers' Qwen3ForCausalLM does not match Sprout's layout "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]}); it may be too new or too old for this export"
        )
    if hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr():
        hf.lm_head.weight = hf.model.embed_tokens.weight  # tie by hand if this version did not
    hf.generation_config.bos_token_id = 0
    hf.generation_config.eos_token_id = 0
    hf.generation_config.pad_token_id = 0
    hf = hf.to(device=device, dtype=torch.float32).eval()
    return hf, hf_tok


def to_transformer_lens(
    model: GPT,
    tokenizer: Tokenizer | str | Path | None = None,
    *,
    device: str | torch.device | None = None,
    compatibility_mode: bool = True,
) -> "TransformerBridge":
    """Sprout as a TransformerLens 4.x ``TransformerBridge`` over its Hugging Face Qwen3 export, fully offline.

    The bridge is booted with ``TransformerBridge.boot_transformers`` around a freshly exported model and
    tokenizer (``hf_model=``/``tokenizer=``), so nothing is read from the Hub or the disk. By default the
    bridge is in TransformerLens's compatibility mode with the norms' gains folded into the weights
    (``enable_compatibility_mode(center_unembed=False)``): its ``W_Q``, ``W_U`` ... equal HookedSprout's,
    ``ActivationCache`` methods with ``apply_ln=True`` and ``logit_attrs`` are exact, and its logits are
    still the model's (the unembedding is not centred). ``compatibility_mode=False`` returns the raw
    bridge, whose unfolded weights make direct logit attribution wrong: use it for hooks only. Attention
    runs eagerly so that ``hook_pattern``/``hook_attn_scores`` fire. ``blocks.{l}.hook_resid_post`` is the
    residual stream after block ``l``. Without a tokenizer the bridge is built by the same loader-agnostic
    builder ``boot_transformers`` uses, and takes token tensors only, not strings.
    """
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError as e:
        raise ExportError(
            "exporting to TransformerLens needs transformer-lens 4.x (TransformerBridge); "
            "install it with `pip install 'transformer-lens>=4,<5'`"
        ) from e
    boot = getattr(TransformerBridge, "boot_transformers", None)
    if boot is None:
        raise ExportError("the installed transformer-lens has no TransformerBridge.boot_transformers; install transformer-lens 4.x")
    cfg = _check_model(model)
    gpt = _unwrap(model)
    # The bridge replaces the HF model's submodules in place, so it gets its own copy. Its tokenizer has no
    # BOS, like Qwen's: given one, TransformerLens would reload the tokenizer from the Hub (or from
    # `name_or_path`) with add_bos_token=True; without, it sets BOS to EOS itself and keeps our ids.
    hf_tok = None if tokenizer is None else _matching_tokenizer(tokenizer, cfg, bos_token=False)
    hf, _ = to_hf(gpt, None, attn_implementation="eager")
    if device is None:
        device = gpt.embed.weight.device
    hf = hf.to(device)
    try:
        if hf_tok is not None:
            bridge = boot(BRIDGE_MODEL_NAME, hf_model=hf, tokenizer=hf_tok, device=device, dtype=torch.float32)
        else:
            # boot_transformers would fetch a tokenizer by name (from the Hub); the loader-agnostic builder
            # behind it wraps the same model without one
            try:
                from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module
            except ImportError as e:
                raise ExportError(
                    "this transformer-lens cannot build a bridge without a tokenizer; "
                    "pass the checkpoint's tokenizer.json to to_transformer_lens"
                ) from e
            bridge = build_bridge_from_module(
                hf, "Qwen3ForCausalLM", hf_config=hf.config, dtype=torch.float32, device=device,
                model_name=BRIDGE_MODEL_NAME,
            )
    except (ValueError, KeyError, NotImplementedError) as e:
        raise ExportError(
            f"TransformerLens could not wrap the Qwen3 export ({type(e).__name__}: {e}); "
            "this transformer-lens version may not support Qwen3ForCausalLM"
        ) from e
    bridge.eval()
    if compatibility_mode:
        bridge.enable_compatibility_mode(disable_warnings=True, center_unembed=False)
    return bridge
