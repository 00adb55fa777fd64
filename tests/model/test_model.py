"""Sprout's architecture against the chapter: parameter arithmetic, RoPE, tying, init, RMSNorm,
compatibility with the chapter's own model.py (tests/fixtures/course_model.py), loss and generate."""
from __future__ import annotations

import math
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

from sprout_model import GPT, PRESETS, Config, RMSNorm, apply_rope, preset, rope_tables
from sprout_model.model import Attention, Block, FeedForward

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def sprout_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(preset("sprout"))


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------- parameter counts

def test_sprout_parameter_count(sprout_gpt):
    assert sprout_gpt.num_params() == 17_309_056
    assert _numel(sprout_gpt) == 17_309_056
    # the chapter's formula, term by term
    V, d, L, dff = 8192, 384, 8, 1024
    assert V * d + L * (4 * d * d + 2 * 64 + 3 * d * dff + 2 * d) + d == 17_309_056


def test_sprout_untied_would_have_20_45m():
    torch.manual_seed(0)
    model = GPT(preset("sprout"))
    model.head.weight = torch.nn.Parameter(model.embed.weight.detach().clone())  # untie
    assert model.num_params() == 20_454_784 == 17_309_056 + 8192 * 384


def test_sprout_per_block_breakdown(sprout_gpt):
    block = sprout_gpt.blocks[0]
    attn = block.attn
    assert attn.qkv.weight.numel() + attn.proj.weight.numel() == 589_824 == 4 * 384**2
    assert attn.q_norm.weight.numel() + attn.k_norm.weight.numel() == 128 == 2 * 64
    assert _numel(attn) == 589_824 + 128
    assert _numel(block.ffn) == 1_179_648 == 3 * 384 * 1024
    assert _numel(block.norm1) + _numel(block.norm2) == 768
    assert _numel(block) == 589_824 + 128 + 1_179_648 + 768
    assert _numel(sprout_gpt.norm) == 384
    assert sprout_gpt.embed.weight.numel() == 3_145_728


@pytest.mark.parametrize("name, count", [("gpt-1", 2_015_936), ("gpt-4", 3_344_576)])
def test_small_preset_parameter_counts(name, count):
    assert GPT(preset(name)).num_params() == count


@pytest.mark.parametrize("name, share", [("gpt-1", 0.78), ("sprout", 0.18)])
def test_embedding_share(name, share):
    cfg = preset(name)
    model = GPT(cfg)
    frac = model.embed.weight.numel() / model.num_params()
    assert frac == pytest.approx(share, abs=0.01)


def test_shapes_match_the_chapter(sprout_gpt):
    sd = sprout_gpt.state_dict()
    assert sd["embed.weight"].shape == (8192, 384)
    assert sd["head.weight"].shape == (8192, 384)
    assert sd["blocks.0.attn.qkv.weight"].shape == (3 * 384, 384)
    assert sd["blocks.0.attn.proj.weight"].shape == (384, 384)
    assert sd["blocks.0.attn.q_norm.weight"].shape == (64,)
    assert sd["blocks.0.ffn.w1.weight"].shape == (1024, 384)
    assert sd["blocks.0.ffn.w3.weight"].shape == (1024, 384)
    assert sd["blocks.0.ffn.w2.weight"].shape == (384, 1024)
    assert "cos" not in sd and "sin" not in sd  # RoPE tables are not parameters
    assert not any(k.endswith(".bias") for k in sd)  # no biases anywhere


# ---------------------------------------------------------------- RoPE

def _rot(x: torch.Tensor, pos: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return apply_rope(x, cos[pos], sin[pos])


def test_rope_score_depends_only_on_distance():
    cos, sin = rope_tables(64, 512, 10000.0)
    assert cos.shape == sin.shape == (512, 32)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        q = F.normalize(torch.randn(64, generator=g), dim=0)
        k = F.normalize(torch.randn(64, generator=g), dim=0)
        scores = {(m, n): (_rot(q, m, cos, sin) @ _rot(k, n, cos, sin)).item()
                  for m, n in [(5, 2), (105, 102), (400, 397), (5, 4)]}
        assert scores[(105, 102)] == pytest.approx(scores[(5, 2)], abs=1e-5)
        assert scores[(400, 397)] == pytest.approx(scores[(5, 2)], abs=1e-5)
        # the same pair at a different distance gives a different score
        assert abs(scores[(5, 4)] - scores[(5, 2)]) > 1e-3


def test_rope_matches_chapter_numpy_reference():
    """The chapter's numpy rope (float64) and our torch tables agree."""
    np = pytest.importorskip("numpy")
    d = 64
    inv_freq = 1.0 / (10000 ** (np.arange(0, d, 2) / d))
    rng = np.random.default_rng(1)
    q = rng.standard_normal(d)
    cos, sin = rope_tables(d, 512, 10000.0)
    for pos in (0, 5, 77, 400, 511):
        a = pos * inv_freq
        ref = np.concatenate([q[: d // 2] * np.cos(a) - q[d // 2:] * np.sin(a),
                              q[: d // 2] * np.sin(a) + q[d // 2:] * np.cos(a)])
        ours = _rot(torch.tensor(q, dtype=torch.float32), pos, cos, sin).double().numpy()
        assert np.allclose(ours, ref, atol=2e-4)


def test_rope_pairs_are_i_and_i_plus_half():
    cos, sin = rope_tables(8, 16, 10000.0)
    x = torch.zeros(8)
    x[1] = 1.0  # the "x" of pair 1; its "y" is x[5]
    r = _rot(x, 3, cos, sin)
    angle = 3 * 10000 ** (-2 / 8)
    nonzero = torch.nonzero(r.abs() > 1e-7).flatten().tolist()
    assert nonzero == [1, 5]
    assert r[1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert r[5].item() == pytest.approx(math.sin(angle), abs=1e-6)


def test_rope_keeps_length():
    cos, sin = rope_tables(64, 512, 10000.0)
    x = torch.randn(2, 3, 512, 64, generator=torch.Generator().manual_seed(0))
    r = apply_rope(x, cos, sin)
    assert torch.allclose(r.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)
    # position 0 is no rotation at all
    assert torch.allclose(r[:, :, 0], x[:, :, 0])


# ---------------------------------------------------------------- tying and initialisation

def test_tied_weights_are_one_tensor():
    model = GPT(tiny_config())
    assert model.head.weight is model.embed.weight
    assert model.head.weight.data_ptr() == model.embed.weight.data_ptr()
    with torch.no_grad():
        model.embed.weight[3, 2] = 7.0
    assert model.head.weight[3, 2].item() == 7.0
    # counted once
    names = [n for n, _ in model.named_parameters()]
    assert "embed.weight" in names and "head.weight" not in names


def test_tied_weights_survive_loading_a_state_dict():
    a, b = GPT(tiny_config()), GPT(tiny_config())
    b.load_state_dict(a.state_dict(), strict=True)
    assert b.head.weight is b.embed.weight
    assert torch.equal(b.head.weight, a.embed.weight)


def test_initial_std(sprout_gpt):
    small = 0.02 / math.sqrt(2 * 8)  # 0.005: proj and w2 start 4x smaller
    for name, p in sprout_gpt.named_parameters():
        if name.endswith("proj.weight") or name.endswith("w2.weight"):
            assert p.std().item() == pytest.approx(small, rel=0.05), name
            assert abs(p.mean().item()) < 0.1 * small, name
        elif p.dim() >= 2:  # embed (= head), qkv, w1, w3
            assert p.std().item() == pytest.approx(0.02, rel=0.05), name
            assert abs(p.mean().item()) < 0.002, name
        else:  # norm gains start at one
            assert torch.all(p == 1.0), name


# ---------------------------------------------------------------- RMSNorm

def test_rmsnorm_eps_and_formula():
    norm = RMSNorm(16)
    assert norm.eps == 1e-6
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 16))
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)).double() * 3
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.double()
    assert torch.allclose(norm(x.float()).double(), ref, atol=1e-5)
    # eps is 1e-6 exactly: a vector with mean square 1e-6 comes out at 1/sqrt(2)
    tiny = torch.full((1, 16), 1e-3)
    assert torch.allclose(RMSNorm(16)(tiny), torch.full((1, 16), 1e-3 / math.sqrt(2e-6)), rtol=1e-5)


def test_rmsnorm_computes_in_float32():
    norm = RMSNorm(64)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.3, 1.7, 64))
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)) * 50
    xb = x.to(torch.bfloat16)
    out = norm(xb)
    assert out.dtype == torch.bfloat16
    # exactly the float32 computation rounded once at the end
    assert torch.equal(out, norm(xb.float()).to(torch.bfloat16))
    # half precision overflows when squaring 1000s; float32 inside does not
    xh = torch.full((1, 64), 1000.0, dtype=torch.float16)
    outh = norm(xh)
    assert outh.dtype == torch.float16 and torch.isfinite(outh).all()
    assert torch.allclose(outh.float(), norm.weight.detach().to(torch.float16).float(), rtol=1e-2)


# ---------------------------------------------------------------- compatibility with the chapter's model.py

def test_config_defaults_equal_the_chapters(course):
    assert asdict(Config()) == asdict(course.Config())
    assert asdict(Config()) == dict(vocab_size=8192, context=512, n_layer=8, n_head=8, d_model=512, d_ff=1408,
                                    rope_base=10000.0)


def test_presets_are_the_chapter_sizes():
    assert set(PRESETS) == {"gpt-1", "gpt-4", "sprout"}
    expect = {
        "gpt-1": dict(n_layer=1, d_model=192, n_head=3, d_ff=512),
        "gpt-4": dict(n_layer=4, d_model=192, n_head=3, d_ff=512),
        "sprout": dict(n_layer=8, d_model=384, n_head=6, d_ff=1024),
    }
    for name, fields in expect.items():
        assert asdict(preset(name)) == dict(vocab_size=8192, context=512, rope_base=10000.0, **fields)
    # preset() hands out a copy: changing it leaves PRESETS alone
    cfg = preset("gpt-4")
    cfg.vocab_size = 300
    assert PRESETS["gpt-4"].vocab_size == 8192
    with pytest.raises(KeyError, match="unknown preset"):
        preset("gpt-5")


def test_same_seed_same_init_as_the_chapter(course):
    kw = dict(vocab_size=64, context=32, n_layer=2, n_head=2, d_model=16, d_ff=24)
    torch.manual_seed(0)
    theirs = course.GPT(course.Config(**kw))
    torch.manual_seed(0)
    ours = GPT(Config(**kw))
    a, b = theirs.state_dict(), ours.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k


def _logits(model, idx):
    model.eval()
    with torch.no_grad():
        return model(idx)[0]


@pytest.mark.parametrize("direction", ["course_to_ours", "ours_to_course"])
def test_state_dict_round_trip_with_the_chapter(course, tmp_path, direction):
    kw = dict(vocab_size=64, context=32, n_layer=2, n_head=2, d_model=16, d_ff=24)
    torch.manual_seed(1)
    src = course.GPT(course.Config(**kw)) if direction == "course_to_ours" else GPT(Config(**kw))
    with torch.no_grad():  # move every parameter off its init so nothing matches by accident
        for p in src.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    torch.manual_seed(2)
    dst = GPT(Config(**kw)) if direction == "course_to_ours" else course.GPT(course.Config(**kw))
    idx = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(3))

    dst.load_state_dict(src.state_dict(), strict=True)
    assert torch.equal(_logits(dst, idx), _logits(src, idx))

    # through a course-style .pt file read safely
    path = tmp_path / "ckpt.pt"
    torch.save(src.state_dict(), path)
    torch.manual_seed(4)
    dst2 = GPT(Config(**kw)) if direction == "course_to_ours" else course.GPT(course.Config(**kw))
    dst2.load_state_dict(torch.load(path, weights_only=True), strict=True)
    assert dst2.head.weight is dst2.embed.weight
    assert torch.equal(_logits(dst2, idx), _logits(src, idx))
    # losses agree too, plain and masked
    tgt = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(5))
    mask = (torch.arange(20) % 3 == 0).expand(3, 20)
    with torch.no_grad():
        assert torch.equal(dst2(idx, tgt)[1], src(idx, tgt)[1])
        assert torch.equal(dst2(idx, tgt, mask)[1], src(idx, tgt, mask)[1])


def test_submodules_match_the_chapter(course):
    """Each part, given the same weights and input, computes the same thing as the chapter's."""
    cfg = tiny_config()
    x = torch.randn(2, 10, cfg.d_model, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_tables(cfg.head_dim, cfg.context, cfg.rope_base)
    ccos, csin = course.rope_tables(cfg.head_dim, cfg.context, cfg.rope_base)
    assert torch.equal(cos, ccos) and torch.equal(sin, csin)
    for ours_cls, theirs_cls, args in [
        (Attention, course.Attention, (cos[:10], sin[:10])),
        (FeedForward, course.FeedForward, ()),
        (Block, course.Block, (cos[:10], sin[:10])),
    ]:
        torch.manual_seed(0)
        ours = ours_cls(cfg)
        theirs = theirs_cls(cfg)
        theirs.load_state_dict(ours.state_dict(), strict=True)
        with torch.no_grad():
            assert torch.equal(ours(x, *args), theirs(x, *args)), ours_cls.__name__


# ---------------------------------------------------------------- forward and loss

def test_forward_shapes_and_plain_loss(tiny_model):
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    tgt = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    logits, loss = tiny_model(idx)
    assert logits.shape == (2, 12, 64) and loss is None
    logits, loss = tiny_model(idx, tgt)
    manual = F.cross_entropy(logits.reshape(-1, 64), tgt.reshape(-1))
    assert loss.shape == () and torch.allclose(loss, manual)
    # a fresh model predicts roughly uniformly: loss near ln(vocab)
    assert loss.item() == pytest.approx(math.log(64), abs=0.2)


def test_forward_is_causal(tiny_model):
    idx = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    changed = idx.clone()
    changed[0, 8] = (changed[0, 8] + 1) % 64
    a, b = _logits(tiny_model, idx), _logits(tiny_model, changed)
    assert torch.equal(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_masked_loss_is_masked_mean(tiny_model):
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 64, (3, 10), generator=g)
    tgt = torch.randint(0, 64, (3, 10), generator=g)
    mask = torch.rand(3, 10, generator=g) > 0.5
    logits, loss = tiny_model(idx, tgt, mask)
    per_token = F.cross_entropy(logits.reshape(-1, 64), tgt.reshape(-1), reduction="none").reshape(3, 10)
    manual = per_token[mask].mean()
    assert torch.allclose(loss, manual, atol=1e-6)
    # float mask, bool mask and int mask agree
    assert torch.allclose(tiny_model(idx, tgt, mask.long())[1], manual, atol=1e-6)
    assert torch.allclose(tiny_model(idx, tgt, mask.float())[1], manual, atol=1e-6)
    # an all-zero mask gives 0, not NaN (sum clamped to at least 1)
    zero = tiny_model(idx, tgt, torch.zeros(3, 10))[1]
    assert zero.item() == 0.0
    # all ones equals the plain mean
    assert torch.allclose(tiny_model(idx, tgt, torch.ones(3, 10))[1], tiny_model(idx, tgt)[1])


def test_loss_backward_reaches_every_parameter(tiny_model):
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    tiny_model.train()
    _, loss = tiny_model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    for name, p in tiny_model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


# ---------------------------------------------------------------- generate

def test_generate_length_and_prompt_kept(tiny_model):
    prompt = torch.tensor([[1, 2, 3]])
    torch.manual_seed(0)
    out = tiny_model.generate(prompt, max_new=10)
    assert out.shape == (1, 13)
    assert torch.equal(out[:, :3], prompt)
    assert out.dtype == torch.long and int(out.min()) >= 0 and int(out.max()) < 64


def test_generate_crops_to_context(tiny_model):
    prompt = torch.randint(0, 64, (1, 30), generator=torch.Generator().manual_seed(0))  # context is 32
    torch.manual_seed(0)
    out = tiny_model.generate(prompt, max_new=8, top_k=1)
    assert out.shape == (1, 38)


def test_generate_top_k_1_is_greedy(tiny_model):
    idx = torch.tensor([[5, 9, 1]])
    expect = idx
    for _ in range(6):
        nxt = _logits(tiny_model, expect)[:, -1].argmax(-1, keepdim=True)
        expect = torch.cat((expect, nxt), dim=1)
    for seed in (0, 1):
        torch.manual_seed(seed)
        assert torch.equal(tiny_model.generate(idx, 6, temperature=1.0, top_k=1), expect)


def test_generate_stop_token(tiny_model):
    idx = torch.tensor([[5, 9, 1]])
    first = int(_logits(tiny_model, idx)[0, -1].argmax())
    out = tiny_model.generate(idx, 20, top_k=1, stop={first})
    assert out.shape == (1, 4) and out[0, -1].item() == first
    # a stop token that is never produced changes nothing
    greedy = tiny_model.generate(idx, 5, top_k=1)
    never = set(range(64)) - set(greedy[0, 3:].tolist())
    assert torch.equal(tiny_model.generate(idx, 5, top_k=1, stop={min(never)}), greedy)


def test_generate_deterministic_with_seed(tiny_model):
    idx = torch.tensor([[5, 9, 1]])
    torch.manual_seed(123)
    a = tiny_model.generate(idx, 15, temperature=1.5, top_p=1.0)
    torch.manual_seed(123)
    b = tiny_model.generate(idx, 15, temperature=1.5, top_p=1.0)
    torch.manual_seed(124)
    c = tiny_model.generate(idx, 15, temperature=1.5, top_p=1.0)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_generate_same_as_the_chapter(course, tiny_model):
    theirs = course.GPT(tiny_model.cfg)
    theirs.load_state_dict(tiny_model.state_dict(), strict=True)
    theirs.eval()
    idx = torch.tensor([[5, 9, 1], [2, 2, 2]])
    for kw in (dict(), dict(top_k=5), dict(temperature=1.3, top_p=0.5)):
        torch.manual_seed(7)
        a = tiny_model.generate(idx, 12, **kw)
        torch.manual_seed(7)
        b = theirs.generate(idx, 12, **kw)
        assert torch.equal(a, b), kw
