"""Grow a trained model into a deeper and wider one that computes exactly the same function.

``train --init-from`` uses this to start a bigger preset from a smaller run (Net2Net-style growth):
a gpt-4 (4 blocks, width 192, 3 heads) becomes a Sprout (8 blocks, width 384, 6 heads) whose logits
are the gpt-4's, and training goes on from there. Every weight the small model has is kept; what is
new is freshly initialised, except the few matrices that must start at zero so that nothing new
reaches the residual stream yet:

- the residual stream keeps the old coordinates first; the new ones start at 0 (embedding columns,
  and every row of W_O and W2 that writes them);
- new heads and new feed-forward units read the stream (random weights) but their outputs start at
  0 (their columns of W_O and W2);
- new blocks start as the identity (their W_O and W2 are zero).

RMSNorm divides by the root mean square over the whole width, and the zero coordinates make that
smaller by sqrt(d_old / d_new), so the old gains are scaled by the same factor (new coordinates get
that value as their gain, so gradients reach them). Heads keep their width (head_dim), so head h of
the small model is head h of the big one, with the same RoPE and QK-norm.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor

from .checkpoint import load_folder
from .cli import ArgumentParser, input_errors_exit
from .model import GPT
from .run_state import read_state


def read_source(src: Path) -> tuple[dict[str, Tensor], dict]:
    """The weights of ``src`` and what it says of itself (steps, tokens_seen, history, args, init_from).

    ``src`` is a run folder (its ``state.pt``: the last weights) or a checkpoint folder (best weights).
    """
    if (src / "state.pt").is_file():
        s = read_state(src / "state.pt")
        return s["model"], {"steps": s["step"], "tokens_seen": s["tokens_seen"], "history": s["history"],
                            "args": s.get("args"), "init_from": s.get("init")}
    if (src / "model.safetensors").is_file():
        loaded, info = load_folder(src)
        return loaded.state_dict(), {"steps": info.get("steps", 0), "tokens_seen": info.get("tokens_seen", 0),
                                     "history": info.get("history", []), "args": info.get("args"),
                                     "init_from": info.get("init_from")}
    raise FileNotFoundError(f"--init-from {src}: neither a run folder with state.pt nor a checkpoint folder")


def source_shape(sd: dict[str, Tensor]) -> dict[str, int]:
    """The small model's n_layer, d_model, head_dim, n_head and d_ff, read off its state dict."""
    blocks = {int(k.split(".")[1]) for k in sd if k.startswith("blocks.")}
    d = sd["embed.weight"].shape[1]
    hd = sd["blocks.0.attn.q_norm.weight"].shape[0] if blocks else d
    return {"n_layer": max(blocks) + 1 if blocks else 0, "d_model": d, "head_dim": hd, "n_head": d // hd,
            "d_ff": sd["blocks.0.ffn.w1.weight"].shape[0] if blocks else 0, "vocab_size": sd["embed.weight"].shape[0]}


def check_growable(model: GPT, src: dict[str, int]) -> None:
    """Raise ValueError (saying what differs) unless ``model`` is at least as big as ``src`` everywhere."""
    cfg = model.cfg
    problems = []
    for key, mine in (("n_layer", cfg.n_layer), ("d_model", cfg.d_model), ("n_head", cfg.n_head), ("d_ff", cfg.d_ff)):
        if src[key] > mine:
            problems.append(f"{src[key]} {key.replace('n_layer', 'blocks')}, more than this model's {mine}")
    if src["head_dim"] != cfg.head_dim:
        problems.append(f"head width {src['head_dim']}, this model's is {cfg.head_dim} (heads can be added, not widened)")
    if src["vocab_size"] != cfg.vocab_size:
        problems.append(f"vocabulary {src['vocab_size']}, this model's is {cfg.vocab_size}")
    if problems:
        raise ValueError("--init-from does not fit this model: it has " + "; ".join(problems))


@torch.no_grad()
def load_grown(model: GPT, sd: dict[str, Tensor]) -> None:
    """Load the (possibly shallower and narrower) state dict ``sd`` into ``model`` so that ``model``
    computes the same logits as the model ``sd`` came from (up to RMSNorm's eps); see the module
    docstring for what is kept, what is new and what starts at zero."""
    src = source_shape(sd)
    check_growable(model, src)
    mine = model.state_dict()
    expected = {k for k in mine if not k.startswith("blocks.") or int(k.split(".")[1]) < src["n_layer"]}
    if set(sd) - set(mine) or expected - set(sd):
        raise ValueError(f"--init-from does not fit this model: unexpected {sorted(set(sd) - set(mine))[:4]}, "
                         f"missing {sorted(expected - set(sd))[:4]}")
    cfg = model.cfg
    d, D = src["d_model"], cfg.d_model
    f = src["d_ff"]
    scale = math.sqrt(d / D)  # RMS over D coordinates of which only d are non-zero

    model.embed.weight[:, :d] = sd["embed.weight"]
    model.embed.weight[:, d:] = 0.0

    def gain(norm, key: str) -> None:
        norm.weight.fill_(scale)
        norm.weight[:d] = sd[key] * scale

    gain(model.norm, "norm.weight")
    for i in range(src["n_layer"]):
        b, p = model.blocks[i], f"blocks.{i}."
        gain(b.norm1, p + "norm1.weight")
        gain(b.norm2, p + "norm2.weight")
        # qkv stacks W_Q, W_K, W_V (each D rows, heads one after another): old heads keep their rows
        old_qkv = sd[p + "attn.qkv.weight"]
        for part in range(3):
            b.attn.qkv.weight[part * D: part * D + d, :d] = old_qkv[part * d: (part + 1) * d]
        b.attn.q_norm.weight.copy_(sd[p + "attn.q_norm.weight"])
        b.attn.k_norm.weight.copy_(sd[p + "attn.k_norm.weight"])
        b.attn.proj.weight.zero_()
        b.attn.proj.weight[:d, :d] = sd[p + "attn.proj.weight"]
        b.ffn.w1.weight[:f, :d] = sd[p + "ffn.w1.weight"]
        b.ffn.w3.weight[:f, :d] = sd[p + "ffn.w3.weight"]
        b.ffn.w2.weight.zero_()
        b.ffn.w2.weight[:d, :f] = sd[p + "ffn.w2.weight"]
    for b in model.blocks[src["n_layer"]:]:  # new blocks: the identity
        b.attn.proj.weight.zero_()
        b.ffn.w2.weight.zero_()


@input_errors_exit
def main(argv: list[str] | None = None) -> None:
    """``python -m sprout_model.grow RUN_OR_CHECKPOINT --preset sprout``: grow the run's weights and
    print both models' validation loss on the same held-out tokens (they should agree)."""
    from .evaluation import first_val_windows
    from .presets import PRESETS, preset

    p = ArgumentParser(description=main.__doc__)
    p.add_argument("source", help="a run folder (state.pt) or a checkpoint folder")
    p.add_argument("--preset", default="sprout", choices=sorted(PRESETS))
    p.add_argument("--data", default="data/default")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    a = p.parse_args(argv)
    if a.rows < 1 or a.seq_len < 1:
        p.error(f"--rows and --seq-len must be 1 or more, got {a.rows} and {a.seq_len}")
    sd, _ = read_source(Path(a.source))
    shape = source_shape(sd)
    cfg = preset(a.preset)
    cfg.vocab_size = shape["vocab_size"]  # as train does: the corpus's tokenizer decides
    if a.seq_len > cfg.context:
        p.error(f"--seq-len {a.seq_len} is longer than {a.preset}'s context of {cfg.context}: pass --seq-len "
                f"{cfg.context} or less")
    big = GPT(cfg)
    load_grown(big, sd)
    small = GPT(type(cfg).from_dict({**cfg.to_dict(), **{k: shape[k] for k in ("n_layer", "d_model", "n_head", "d_ff")}}))
    small.load_state_dict(sd)
    x = first_val_windows(a.data, a.rows, a.seq_len, cfg.vocab_size)
    with torch.no_grad():
        (ls, l_small), (lb, l_big) = small.eval()(x[:, :-1], x[:, 1:]), big.eval()(x[:, :-1], x[:, 1:])
    print(f"{a.source}: {small.num_params():,} parameters, validation loss {l_small.item():.5f} nats/token "
          f"on {a.rows} x {a.seq_len} held-out tokens")
    print(f"grown to {a.preset}: {big.num_params():,} parameters, validation loss {l_big.item():.5f}; "
          f"largest logit difference {(ls - lb).abs().max().item():.1e}")


if __name__ == "__main__":
    main()
