"""Exports to Hugging Face (Qwen3ForCausalLM) and to TransformerLens's TransformerBridge, all offline.

Unit tests run on a tiny random Sprout with a 300-token BPE trained here; the integration test uses the
shipped ``gpt-4`` checkpoint and is skipped until that folder exists.
"""
from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from tokenizers import Tokenizer

from sprout_interp.core.errors import SproutError, VocabularyMismatchError
from sprout_interp.core.export import ExportError, hf_config, hf_tokenizer, to_hf, to_transformer_lens
from sprout_model import GPT
from sprout_model.tokenizer import EOT, decode, encode, train_tokenizer

pytestmark = pytest.mark.unit

VOCAB = 300
TEXTS = [
    "Zorbin Plax came home. The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a little sprout who wanted to grow tall.",
    "In the beginning was the word, and the word was with the tokens.",
    "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e emoji \U0001f331 tabs\tand\nnewlines",
] * 20
SAMPLES = [
    "Zorbin Plax came home.",
    "  leading spaces and a trailing one ",
    "caf\u00e9 \U0001f331 \u65e5\u672c",
    f"two documents{EOT}glued together",
    "x",
]
SHIPPED = Path(__file__).resolve().parents[2] / "model" / "checkpoints"
ATOL = 1e-5


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_tokenizer(TEXTS, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def gpt() -> GPT:
    torch.manual_seed(1)
    model = GPT(tiny_config(vocab_size=VOCAB, context=32, n_layer=3, n_head=2, d_model=16, d_ff=40)).eval()
    with torch.no_grad():  # non-trivial norm gains, so a swapped or skipped norm shows up
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or "_norm" in name or name == "norm.weight":
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def hf_pair(gpt, tok):
    return to_hf(gpt, tok)


def _ours(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(idx)[0]


def _resid_posts(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    """The residual stream after every block, straight from sprout_model.GPT's own modules."""
    T = idx.size(1)
    out = []
    with torch.no_grad():
        x = model.embed(idx)
        for block in model.blocks:
            x = block(x, model.cos[:T], model.sin[:T])
            out.append(x.clone())
    return out


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test (on top of HF_HUB_OFFLINE from conftest)."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


# ---------------------------------------------------------------------------------------------- Hugging Face


def test_tiny_tokenizer_trains(tok):
    assert tok.get_vocab_size() == VOCAB
    assert tok.token_to_id(EOT) == 0


def test_config_maps_sprout_shapes(gpt):
    c = hf_config(gpt.cfg)
    assert c.model_type == "qwen3"
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (16, 40, 3)
    assert c.num_attention_heads == c.num_key_value_heads == 2 and c.head_dim == 8
    assert c.max_position_embeddings == 32 and c.vocab_size == VOCAB
    assert c.tie_word_embeddings and not c.attention_bias and c.rms_norm_eps == 1e-6
    assert c.rope_parameters["rope_theta"] == gpt.cfg.rope_base and c.rope_parameters["rope_type"] == "default"
    assert c.sliding_window is None and set(c.layer_types) == {"full_attention"}
    assert c.hidden_act == "silu"


def test_hf_model_is_tied_float32_eval(hf_pair):
    hf, _ = hf_pair
    assert not hf.training
    assert all(p.dtype == torch.float32 for p in hf.parameters())
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    assert all(getattr(m, "bias", None) is None for m in hf.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("T", [1, 2, 7, 19, 32])
def test_hf_logits_equal_ours(gpt, tok, attn, T):
    hf, _ = to_hf(gpt, tok, attn_implementation=attn)
    assert hf.config._attn_implementation == attn
    torch.manual_seed(T)
    idx = torch.randint(0, VOCAB, (3, T))
    with torch.no_grad():
        theirs = hf(idx).logits
    torch.testing.assert_close(theirs, _ours(gpt, idx), atol=ATOL, rtol=0)


def test_hf_hidden_states_are_our_residual_stream(gpt, hf_pair):
    hf, _ = hf_pair
    idx = torch.randint(0, VOCAB, (2, 11))
    with torch.no_grad():
        hs = hf(idx, output_hidden_states=True).hidden_states
    torch.testing.assert_close(hs[0], gpt.embed(idx).detach(), atol=ATOL, rtol=0)
    # hidden_states[l + 1] is after block l, except the last, which HF reports after the final norm
    for l, ours in enumerate(_resid_posts(gpt, idx)[:-1]):
        torch.testing.assert_close(hs[l + 1], ours, atol=ATOL, rtol=0)


def test_export_does_not_touch_our_model(gpt, tok):
    before = {k: v.clone() for k, v in gpt.state_dict().items()}
    hf, _ = to_hf(gpt, tok)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(1.0)  # the export holds copies
    for k, v in gpt.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_hf_tokenizer_ids_equal_ours(tok, hf_pair):
    _, hf_tok = hf_pair
    assert hf_tok.eos_token == hf_tok.bos_token == hf_tok.pad_token == EOT
    assert hf_tok.eos_token_id == 0 and len(hf_tok) == VOCAB
    for s in SAMPLES:
        ids = encode(tok, s)
        assert hf_tok(s)["input_ids"] == ids, s
        assert hf_tok.encode(s) == ids, s
        assert hf_tok.decode(ids) == decode(tok, ids) == s


def test_save_pretrained_round_trip_offline(gpt, tok, hf_pair, tmp_path, no_network):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf, hf_tok = hf_pair
    hf.save_pretrained(tmp_path)
    hf_tok.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").is_file() and (tmp_path / "tokenizer.json").is_file()
    model2 = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    tok2 = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert type(model2).__name__ == "Qwen3ForCausalLM"
    assert model2.lm_head.weight.data_ptr() == model2.model.embed_tokens.weight.data_ptr()
    for T in (1, 9, 32):
        idx = torch.randint(0, VOCAB, (2, T))
        with torch.no_grad():
            torch.testing.assert_close(model2(idx).logits, hf(idx).logits, atol=0, rtol=0)
            torch.testing.assert_close(model2(idx).logits, _ours(gpt, idx), atol=ATOL, rtol=0)
    for s in SAMPLES:
        assert tok2(s)["input_ids"] == encode(tok, s), s
    assert tok2.eos_token_id == 0 and tok2.pad_token_id == 0


def test_hf_generate_greedy_matches_ours(gpt, hf_pair):
    hf, _ = hf_pair
    idx = torch.tensor([[5, 17, 101, 42]])
    ours = idx
    with torch.no_grad():
        for _ in range(6):
            nxt = gpt(ours)[0][:, -1].argmax(-1, keepdim=True)
            ours = torch.cat([ours, nxt], 1)
        theirs = hf.generate(idx, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(theirs, ours)


def test_to_hf_without_tokenizer(gpt):
    hf, hf_tok = to_hf(gpt)
    assert hf_tok is None
    idx = torch.randint(0, VOCAB, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, _ours(gpt, idx), atol=ATOL, rtol=0)


def test_tokenizer_from_path(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    hf_tok = hf_tokenizer(path)
    assert hf_tok.encode(SAMPLES[0]) == encode(tok, SAMPLES[0])
    with pytest.raises(ExportError, match="no tokenizer file"):
        hf_tokenizer(tmp_path / "missing.json")


@pytest.mark.unchecked_types
def test_errors_are_sprout_errors(tok):
    torch.manual_seed(0)
    wrong_vocab = GPT(tiny_config(vocab_size=64)).eval()
    with pytest.raises(VocabularyMismatchError, match="300 tokens .* 64"):
        to_hf(wrong_vocab, tok)
    with pytest.raises(ExportError, match="sprout_model.GPT"):
        to_hf(torch.nn.Linear(2, 2))
    no_eot = train_tokenizer(TEXTS, vocab_size=VOCAB)
    no_eot = Tokenizer.from_str(no_eot.to_str().replace(EOT, "<|notours|>"))
    with pytest.raises(SproutError, match="endoftext"):
        hf_tokenizer(no_eot)


def test_missing_qwen3_gives_clear_error(monkeypatch, gpt):
    import sys
    import types

    old = types.ModuleType("transformers")  # a transformers from before Qwen3 (4.51)
    old.__version__ = "4.40.0"
    monkeypatch.setitem(sys.modules, "transformers", old)
    with pytest.raises(ExportError, match="transformers 4.40.0 has no Qwen3 model"):
        to_hf(gpt)


# ------------------------------------------------------------------------------------------- TransformerLens


@pytest.fixture(scope="module")
def bridge_and_time(gpt, tok):
    start = time.perf_counter()
    bridge = to_transformer_lens(gpt, tok)
    return bridge, time.perf_counter() - start


def test_bridge_boots_offline(gpt, tok, no_network):
    bridge = to_transformer_lens(gpt, tok)
    assert type(bridge).__name__ == "TransformerBridge"
    assert bridge.cfg.n_layers == gpt.cfg.n_layer and bridge.cfg.d_model == gpt.cfg.d_model


def test_bridge_logits_equal_ours(gpt, bridge_and_time):
    bridge, _ = bridge_and_time
    for T in (1, 8, 32):
        idx = torch.randint(0, VOCAB, (2, T))
        with torch.no_grad():
            theirs = bridge(idx)
        ours = _ours(gpt, idx)
        # the bridge runs the raw HF weights (no centring), so raw logits match, hence log-softmax too
        torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)
        torch.testing.assert_close(theirs.log_softmax(-1), ours.log_softmax(-1), atol=1e-4, rtol=0)


def test_bridge_cache_resid_post_matches_ours(gpt, bridge_and_time):
    bridge, _ = bridge_and_time
    idx = torch.randint(0, VOCAB, (2, 13))
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(idx)
    torch.testing.assert_close(logits, _ours(gpt, idx), atol=1e-4, rtol=0)
    torch.testing.assert_close(cache["hook_embed"], gpt.embed(idx).detach(), atol=1e-4, rtol=0)
    for l, ours in enumerate(_resid_posts(gpt, idx)):
        torch.testing.assert_close(cache[f"blocks.{l}.hook_resid_post"], ours, atol=1e-4, rtol=0)
        if l + 1 < gpt.cfg.n_layer:
            torch.testing.assert_close(cache[f"blocks.{l + 1}.hook_resid_pre"], ours, atol=1e-4, rtol=0)
    assert cache["blocks.0.attn.hook_pattern"].shape == (2, gpt.cfg.n_head, 13, 13)


def test_bridge_tokenizes_like_ours(tok, bridge_and_time, gpt):
    bridge, _ = bridge_and_time
    for s in SAMPLES[:4]:
        assert bridge.to_tokens(s)[0].tolist() == encode(tok, s), s  # no BOS prepended
    s = SAMPLES[0]
    with torch.no_grad():
        torch.testing.assert_close(bridge(s), _ours(gpt, torch.tensor([encode(tok, s)])), atol=1e-4, rtol=0)


def test_bridge_hooks_are_removed_and_our_model_untouched(gpt, tok, bridge_and_time):
    bridge, _ = bridge_and_time
    before = {k: v.clone() for k, v in gpt.state_dict().items()}
    idx = torch.randint(0, VOCAB, (1, 6))
    with torch.no_grad():
        plain = bridge(idx)
        zeroed = bridge.run_with_hooks(idx, fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: x * 0)])
        after = bridge(idx)
    assert not torch.allclose(zeroed, plain)
    torch.testing.assert_close(after, plain, atol=0, rtol=0)
    for k, v in gpt.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_bridge_without_tokenizer(gpt, no_network):
    bridge = to_transformer_lens(gpt)
    idx = torch.randint(0, VOCAB, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(bridge(idx), _ours(gpt, idx), atol=1e-4, rtol=0)


def test_bridge_boot_time(bridge_and_time):
    _, seconds = bridge_and_time
    print(f"\nto_transformer_lens on a tiny model: {seconds:.2f} s")
    assert seconds < 60


# --------------------------------------------------------------------------------------- shipped checkpoint


@pytest.mark.acceptance
def test_shipped_gpt4_exports(no_network):
    folder = SHIPPED / "gpt-4"
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"{folder} is not there yet (the shipped checkpoint is trained separately)")
    from sprout_model.checkpoint import load_folder, tokenizer_path

    model, _ = load_folder(folder)
    tok_file = tokenizer_path(folder)
    assert tok_file is not None, f"no tokenizer.json in {folder} or beside it"
    tok = Tokenizer.from_file(str(tok_file))
    text = "Zorbin Plax came home. He opened the door and looked at the garden, where the sprout had grown."
    idx = torch.tensor([encode(tok, text)])
    ours = _ours(model, idx)

    hf, hf_tok = to_hf(model, tok)
    assert hf_tok(text)["input_ids"] == idx[0].tolist()
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, ours, atol=ATOL, rtol=0)

    bridge = to_transformer_lens(model, tok)
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(text)
    torch.testing.assert_close(logits, ours, atol=1e-4, rtol=0)
    for l, resid in enumerate(_resid_posts(model, idx)):
        torch.testing.assert_close(cache[f"blocks.{l}.hook_resid_post"], resid, atol=1e-4, rtol=0)


def test_hooked_wrapper_exports_delegate(tiny_model):
    """m.to_hf() on the hooked wrapper gives the same logits as the wrapper itself."""
    from sprout_interp.core.hooked import HookedSprout

    m = HookedSprout(tiny_model)
    hf, tok = m.to_hf()
    assert tok is None
    idx = torch.randint(0, tiny_model.cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, m(idx), atol=1e-5, rtol=0)
