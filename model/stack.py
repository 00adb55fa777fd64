"""Depthwise stacking: give a trained model's weak blocks the weights of its own trained blocks.

A model grown by ``grow`` starts its new blocks as the identity (their output matrices zero), and in the
shipped Sprout those blocks stayed nearly idle: a zero ``W_O`` or ``W2`` passes no gradient to the
block's other weights at first, and the blocks that already work keep doing the job. Stacking (Gong et al.
2019, "Efficient Training of BERT by Progressively Stacking"; Du et al. 2024, "Stacking Your
Transformers", their G_stack) instead copies trained blocks on top: here blocks 5–8 of a Sprout become
copies of its blocks 1–4, every weight of the block (both norms, the attention with its QK-norm gains, the
feed-forward), so every weight of the copies receives gradient from the first step. The stacked model does
*not* compute the same function (the copies apply the lower blocks' updates a second time); training from
it (``train --init-from``) must recover that loss first.

Interleaving (``--blocks 1-8 --copies-of 1,1,2,2,3,3,4,4``) instead puts each copy beside its original, and
``--out-scales`` multiplies each filled block's two output matrices (attention ``W_O``, feed-forward ``W2``) so
that a pair shares its original's update (e.g. 0.7 and 0.3) rather than applying it twice: the model starts
near the source's function with every block doing part of a trained block's job.

``python -m sprout_model.stack model/checkpoints/sprout --blocks 5-8 --copies-of 1-4 --out runs/sprout-stack-init``
writes a checkpoint folder (float32) and prints the validation loss before and after on the same windows.
Block numbers are 1-based (the chapter's count; ``layer`` = block - 1 in the tables).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from .checkpoint import load_folder, save_checkpoint, tokenizer_path
from .cli import ArgumentParser, input_errors_exit, numbers, writable_folder
from .evaluation import first_val_windows
from .model import GPT


def parse_blocks(spec: str, n_layer: int) -> list[int]:
    """Block numbers from ``"5-8"`` or ``"5,6,8"`` (1-based, as the chapter counts), as 0-based layers;
    raises ValueError when one is outside 1..n_layer."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"block numbers {spec!r}: expected e.g. '5-8' or '5,6,7,8'") from None
        if not 1 <= a <= b <= n_layer:
            raise ValueError(f"block numbers {spec!r}: this model has blocks 1..{n_layer}")
        out.extend(range(a - 1, b))
    return out


def stacked_state(sd: dict[str, Tensor], targets: list[int], sources: list[int]) -> dict[str, Tensor]:
    """A copy of the state dict ``sd`` in which layer ``targets[i]`` holds a copy of every weight of layer
    ``sources[i]`` (0-based layers; a target's own weights are dropped). The other tensors are copied as they are."""
    if len(targets) != len(sources):
        raise ValueError(f"{len(targets)} blocks to fill but {len(sources)} to copy them from: give as many of each")
    if len(set(targets)) != len(targets):
        raise ValueError(f"a block is filled twice: {[t + 1 for t in targets]}")
    layers = {int(k.split(".")[1]) for k in sd if k.startswith("blocks.")}
    missing = sorted({*targets, *sources} - layers)
    if missing:
        raise ValueError(f"the model has no block {missing[0] + 1} (it has {len(layers)})")
    out = {k: v.clone() for k, v in sd.items() if not (k.startswith("blocks.") and int(k.split(".")[1]) in targets)}
    for t, s in zip(targets, sources):
        for k, v in sd.items():
            if k.startswith(f"blocks.{s}."):
                out[f"blocks.{t}." + k[len(f"blocks.{s}."):]] = v.clone()
    return out


def output_scaled(sd: dict[str, Tensor], layers: list[int], scales: list[float]) -> dict[str, Tensor]:
    """A copy of ``sd`` in which layer ``layers[i]``'s attention output matrix and feed-forward output matrix
    (``attn.proj``, ``ffn.w2``) are multiplied by ``scales[i]``: the block's write to the residual stream
    scales by that factor, its reading of it is unchanged."""
    if len(layers) != len(scales):
        raise ValueError(f"{len(layers)} blocks but {len(scales)} output scales: give one per filled block")
    out = {k: v.clone() for k, v in sd.items()}
    for layer, a in zip(layers, scales):
        for name in ("attn.proj.weight", "ffn.w2.weight"):
            out[f"blocks.{layer}.{name}"] = out[f"blocks.{layer}.{name}"] * a
    return out


def _loss(model: GPT, x: Tensor) -> float:
    with torch.no_grad():
        return model.eval()(x[:, :-1], x[:, 1:])[1].item()


@input_errors_exit
def main(argv: list[str] | None = None) -> None:
    """``python -m sprout_model.stack CHECKPOINT --blocks 5-8 --copies-of 1-4 --out FOLDER``: write the stacked
    checkpoint folder (float32, its train.json the source's plus ``stacked``) and print both models' validation
    loss (nats/token) on the same held-out windows."""
    p = ArgumentParser(description=main.__doc__)
    p.add_argument("source", help="a checkpoint folder (model.safetensors + config.json)")
    p.add_argument("--blocks", default="5-8", help="the blocks to overwrite, 1-based (default 5-8)")
    p.add_argument("--copies-of", default="1-4", help="the blocks whose weights they get, in the same order (default 1-4)")
    p.add_argument("--out", required=True, help="the checkpoint folder to write (train --init-from reads it)")
    p.add_argument("--out-scales", default=None, type=numbers,
                   help="comma-separated factors for each filled block's output matrices, in --blocks order (default: all 1)")
    p.add_argument("--data", default="data/default", help="a prepared corpus whose val.bin measures the loss")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    a = p.parse_args(argv)
    writable_folder(a.out, "--out")
    src = Path(a.source)
    model, info = load_folder(src)
    if a.rows < 1 or a.seq_len < 1:  # checked before --out is written
        p.error(f"--rows and --seq-len must be 1 or more, got {a.rows} and {a.seq_len}")
    if a.seq_len > model.cfg.context and (Path(a.data) / "val.bin").is_file():  # the loss is measured on it
        p.error(f"--seq-len {a.seq_len} is longer than the checkpoint's context of {model.cfg.context}: pass "
                f"--seq-len {model.cfg.context} or less")
    n = model.cfg.n_layer
    targets, sources = parse_blocks(a.blocks, n), parse_blocks(a.copies_of, n)
    stacked = GPT(model.cfg)
    sd = stacked_state(model.state_dict(), targets, sources)
    scales = [1.0] * len(targets)
    if a.out_scales is not None:
        scales = a.out_scales
        sd = output_scaled(sd, targets, scales)
    stacked.load_state_dict(sd)
    record = {**info, "stacked": {"from": str(src), "blocks": [t + 1 for t in targets], "copies_of": [s + 1 for s in sources],
                                  "out_scales": scales}}
    save_checkpoint(stacked, a.out, tokenizer_path(src), record)
    val_file = Path(a.data) / "val.bin"
    if not val_file.is_file():
        print(f"wrote {a.out}; no {val_file} to measure the loss on (prepare the corpus, or pass --data)")
        return
    x = first_val_windows(a.data, a.rows, a.seq_len, model.cfg.vocab_size)
    print(json.dumps({"source": str(src), "out": a.out, "blocks": [t + 1 for t in targets],
                      "copies_of": [s + 1 for s in sources], "out_scales": scales, "rows": a.rows, "seq_len": a.seq_len,
                      "val_loss_source": round(_loss(model, x), 5), "val_loss_stacked": round(_loss(stacked, x), 5)}))


if __name__ == "__main__":
    main()
