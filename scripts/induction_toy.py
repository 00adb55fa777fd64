"""How fast does a Sprout-architecture model learn to copy from context? A small, fast probe.

Trains a freshly initialised ``sprout_model.GPT`` of any size on rows of random tokens that repeat
with a period, and prints the copying ratio (loss on the second copy / loss on the first, on held-out
repeated sequences of length 24 and 40) every ``--every`` steps. No corpus needed; used for the
experiments logged in ``model/TRAINING.md``.

    python scripts/induction_toy.py --vocab 64 --d-model 64 --layers 2 --heads 2          # phase change
    python scripts/induction_toy.py --vocab 8192 --d-model 64 --layers 2 --heads 2        # far slower
    python scripts/induction_toy.py --vocab 8192 --d-model 192 --layers 2 --heads 3 --fixed-period 64

With ``--fixed-period P`` every row is P random tokens twice (the classic test): a head that looks
exactly P-1 tokens back solves it, so the ratio at P drops fast while the ratios at 24 and 40 do not:
a positional head, not induction. Random periods (the default) leave induction as the only solution.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from sprout_model import GPT, Config
from sprout_model.cli import ArgumentParser, Whole, input_errors_exit


def rows(rng: np.random.Generator, batch: int, length: int, alphabet: int, fixed_period: int | None) -> torch.Tensor:
    """(batch, length) rows of random tokens 1..alphabet-1, each repeating with its own period."""
    out = []
    for _ in range(batch):
        p = fixed_period or int(rng.integers(8, length // 2 + 1))
        out.append(np.resize(rng.integers(1, alphabet, size=p), length))
    return torch.from_numpy(np.stack(out))


@torch.no_grad()
def copying_ratios(model: GPT, vocab: int, lengths: tuple[int, ...], high: int | None = None) -> list[float]:
    """Loss on copy two / copy one (positions 1..n-1 of each) of 32 fixed rows of n random tokens
    (ids 1..high-1; default the whole vocabulary)."""
    model.eval()
    out = []
    for n in lengths:
        half = torch.randint(1, high or vocab, (32, n), generator=torch.Generator().manual_seed(1))
        x = torch.cat([half, half], 1)
        logits, _ = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1), reduction="none").view(32, -1)
        out.append(round((loss[:, n:].mean() / loss[:, : n - 1].mean()).item(), 3))
    model.train()
    return out


@input_errors_exit
def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=Whole(2), default=64)
    p.add_argument("--alphabet", type=Whole(2), default=None, help="draw training tokens from 1..alphabet-1 only")
    p.add_argument("--d-model", type=Whole(1), default=64)
    p.add_argument("--layers", type=Whole(1), default=2)
    p.add_argument("--heads", type=Whole(1), default=2)
    p.add_argument("--d-ff", type=Whole(1), default=None)
    p.add_argument("--seq-len", type=Whole(1), default=128)
    p.add_argument("--batch", type=Whole(1), default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", type=Whole(0), default=600)
    p.add_argument("--every", type=Whole(1), default=50)
    p.add_argument("--fixed-period", type=Whole(1), default=None)
    p.add_argument("--embed-mean", type=float, default=0.0,
                   help="add one shared random direction of this norm to every embedding row at init")
    p.add_argument("--embed-lr", type=float, default=1.0, help="learning-rate multiplier for the (tied) embedding")
    p.add_argument("--threads", type=Whole(1), default=2)
    p.add_argument("--seed", type=Whole(0), default=0)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    lengths = (24, 40) + ((a.fixed_period,) if a.fixed_period else ())
    cfg = Config(vocab_size=a.vocab, context=max(a.seq_len + 1, 2 * max(lengths)), n_layer=a.layers, n_head=a.heads,
                 d_model=a.d_model, d_ff=a.d_ff or 2 * a.d_model)
    model = GPT(cfg)
    embed = model.embed.weight
    if a.embed_mean:
        with torch.no_grad():
            c = torch.randn(a.d_model)
            embed += a.embed_mean * c / c.norm()
    rest = [q for q in model.parameters() if q is not embed]
    opt = torch.optim.AdamW([{"params": rest}, {"params": [embed], "lr": a.lr * a.embed_lr}],
                            lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = np.random.default_rng(a.seed)
    extra = ", the same on the alphabet" if a.alphabet else ""
    print(f"{model.num_params():,} parameters; columns: step, train loss, copying ratio at n = {lengths}{extra}, seconds")
    t0 = time.time()
    for step in range(a.steps + 1):
        x = rows(rng, a.batch, a.seq_len + 1, a.alphabet or a.vocab, a.fixed_period)
        _, loss = model(x[:, :-1], x[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % a.every == 0:
            ratios = [copying_ratios(model, a.vocab, lengths)]
            if a.alphabet:
                ratios.append(copying_ratios(model, a.vocab, lengths, a.alphabet))
            print(step, round(loss.item(), 3), *ratios, round(time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
