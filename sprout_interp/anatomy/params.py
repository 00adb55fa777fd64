"""Sprout's parts, where their code lives in ``model/model.py``, and what they cost in parameters.

Everything here is read from the real objects at run time (``inspect`` on ``sprout_model.model``),
so line numbers always match the file on disk.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

import sprout_model.model as arch
from sprout_model import Config

__all__ = ["Part", "PARTS", "PARTS_BY_KEY", "CALCULATOR_PRESETS", "CHAPTER_COUNTS", "source", "project_path", "numbered",
           "param_breakdown", "part_params", "counted_breakdown"]


@dataclass(frozen=True)
class Part:
    """One part of the model in the chapter's parameter table: its name, parameter count and formula."""
    key: str  # short id used by the dashboard
    title: str  # what a person calls it
    obj: object  # the class or function in sprout_model.model
    what: str  # one line on its role


PARTS: list[Part] = [
    Part("embed", "Token embedding (tied with the output head)", arch.GPT.__init__,
         "One row of V×d numbers per token; the same matrix scores the output (weight tying)."),
    Part("rmsnorm", "RMSNorm", arch.RMSNorm, "Divides the copy a layer reads by its RMS, times a learned gain."),
    Part("rope", "RoPE (rotary positions)", arch.apply_rope, "Rotates query/key pairs by position; no parameters."),
    Part("rope_tables", "RoPE tables", arch.rope_tables, "cos/sin of m·θᵢ for every position and frequency."),
    Part("attention", "Attention with QK-norm", arch.Attention, "Heads read earlier tokens; the only place tokens mix."),
    Part("ffn", "SwiGLU feed-forward", arch.FeedForward, "silu(x·W1) ⊙ (x·W3), back with W2; per token."),
    Part("block", "Block (pre-norm, residual)", arch.Block, "x ← x + Attn(Norm(x)); x ← x + FFN(Norm(x))."),
    Part("gpt", "GPT: stack, final norm, head, initialisation", arch.GPT, "Embedding, the blocks, final norm, tied head."),
    Part("forward", "Forward pass and loss", arch.GPT.forward, "Runs the stack and scores the next token."),
    Part("config", "Config", arch.Config, "The few numbers that separate gpt-1 from Sprout."),
]
PARTS_BY_KEY = {p.key: p for p in PARTS}


def source(part: Part | str) -> tuple[str, int, int, str]:
    """(file path, first line, last line, code) of a part, read from the file now (1-indexed lines)."""
    part = PARTS_BY_KEY[part] if isinstance(part, str) else part
    lines, start = inspect.getsourcelines(part.obj)
    return inspect.getsourcefile(part.obj), start, start + len(lines) - 1, "".join(lines)


def project_path(path: str | Path) -> str:
    """A source file's path as a reader of the project knows it (``model/model.py``), not where the server
    keeps it: relative to the project's root when it is inside it, else to the folder of its package."""
    p = Path(path).resolve()
    root = Path(__file__).resolve().parents[2]
    for base in (root, *p.parents[1:2]):
        try:
            return p.relative_to(base).as_posix()
        except ValueError:
            continue
    return p.name


def numbered(code: str, first: int) -> str:
    """``code`` with each line prefixed by its line number in the file (``first`` for the first line), so a
    code box shows the file's own numbers (Streamlit's start at 1)."""
    lines = code.rstrip("\n").split("\n")
    width = len(str(first + len(lines) - 1))
    return "\n".join(f"{first + i:>{width}} │ {line}" for i, line in enumerate(lines))


def param_breakdown(d_model: int, n_layer: int, d_ff: int, vocab_size: int, n_head: int, tied: bool = True) -> dict:
    """The chapter's count, piece by piece: embedding V·d (once if tied, twice if not), per block
    attention 4d² + 2·head_dim QK-norm gains, SwiGLU 3·d·d_ff, two norms 2d; one final norm d.

    Returns a dict with each piece, ``per_block``, ``blocks`` (all blocks), ``total`` and
    ``vocab_share`` (embedding and head parameters / total).
    """
    head_dim = d_model // n_head
    embedding = vocab_size * d_model * (1 if tied else 2)
    attention = 4 * d_model * d_model + 2 * head_dim
    ffn = 3 * d_model * d_ff
    norms = 2 * d_model
    per_block = attention + ffn + norms
    total = embedding + n_layer * per_block + d_model
    return {"embedding": embedding, "attention": attention, "ffn": ffn, "norms": norms, "per_block": per_block,
            "blocks": n_layer * per_block, "final_norm": d_model, "total": total, "vocab_share": embedding / total}


def part_params(cfg: Config) -> dict[str, int]:
    """Parameter count of each part for a model of ``cfg`` (per block where the part sits in a block)."""
    b = param_breakdown(cfg.d_model, cfg.n_layer, cfg.d_ff, cfg.vocab_size, cfg.n_head)
    return {"embed": b["embedding"], "rmsnorm": cfg.d_model, "rope": 0, "rope_tables": 0,
            "attention": b["attention"], "ffn": b["ffn"], "block": b["per_block"], "gpt": b["total"],
            "forward": 0, "config": 0}


CALCULATOR_PRESETS: dict[str, dict[str, int]] = {
    "gpt-1": dict(d_model=192, n_layer=1, d_ff=512, vocab_size=8192, n_head=3),
    "gpt-4": dict(d_model=192, n_layer=4, d_ff=512, vocab_size=8192, n_head=3),
    "sprout": dict(d_model=384, n_layer=8, d_ff=1024, vocab_size=8192, n_head=6),
    # GPT-2 small's widths and vocabulary in Sprout's architecture (SwiGLU at 2/3·4d)
    "GPT-2-small-sized": dict(d_model=768, n_layer=12, d_ff=2048, vocab_size=50257, n_head=12),
}


def counted_breakdown(model) -> dict:
    """The same pieces as :func:`param_breakdown`, counted on a real ``GPT`` (``numel`` of its tensors):
    embedding, attention / ffn / norms of block 0, all blocks, final norm, total (tied matrix once)."""
    b0 = model.blocks[0]
    count = lambda mod: sum(p.numel() for p in mod.parameters())  # noqa: E731
    total = model.num_params()
    embedding = model.embed.weight.numel()
    return {"embedding": embedding, "attention": count(b0.attn), "ffn": count(b0.ffn),
            "norms": count(b0.norm1) + count(b0.norm2), "per_block": count(b0),
            "blocks": sum(count(b) for b in model.blocks), "final_norm": count(model.norm), "total": total,
            "vocab_share": embedding / total}


CHAPTER_COUNTS = {  # the chapter's own figures
    "sprout": {"total": 17_309_056, "untied": 20_454_784, "embedding": 3_145_728, "attention": 589_824 + 128,
               "ffn": 1_179_648, "norms": 768, "vocab_share": 0.18},
    "gpt-1": {"vocab_share": 0.80},
}
