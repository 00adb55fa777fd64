"""One attention cell in the real model, with single writes removed: the cells an induction head is read at on a
text with a repeated name, and what removing one head's (or one feed-forward's) write at one position does to a
head's pre-softmax score and attention probability at one cell.

A QK attribution (:mod:`sprout_interp.circuits.qk_attribution`) splits a score into what the query and the key
are made of, with the norms' scales frozen. Removing a write here is the same question asked of the real model,
where the norms, the later blocks' feed-forwards and every other head respond: a head in an earlier block whose
write at the key position is removed changes only the key (and the value) the later head reads there, so that
removal tests the key side alone; the same write removed at the query position tests the query side alone.

Positions are 0-based input indices; layers are 0-indexed (``blocks.{layer}``); scores are the pre-softmax
attention scores of ``blocks.{layer}.attn.hook_attn_scores`` (after the 1/sqrt(d_head) scale), probabilities
those of ``hook_pattern``.
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor

from sprout_interp.circuits.heads import block_label, head_label
from sprout_interp.core.arguments import check_index, describe
from sprout_interp.core.errors import ArgumentError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout, as_hooked

__all__ = ["Write", "name_cells", "repeat_cell", "swap_token", "remove_writes", "write_label", "SUBSTITUTES"]

#: a write at one position: ("head", layer, head, pos), ("mlp", layer, pos) or ("embed", pos)
Write = tuple

#: single-token replacements for a swapped token (the first that is one token and differs is used)
SUBSTITUTES = (" M", " K", " D", " T", " R", " B", " G", " H", "M", "K")


def _offsets(model: HookedSprout, ids: Tensor) -> list[tuple[int, int]]:
    """(start, end) character offsets of each token in the decoded text (pieces concatenated)."""
    out, at = [], 0
    for s in model.to_str_tokens(ids):
        out.append((at, at + len(s)))
        at += len(s)
    return out


def name_cells(model, text: str, name: str) -> pd.DataFrame:
    """The cells an induction head is read at where ``name`` comes a second time in ``text``.

    One row per token of the name's second occurrence that has the same token in its first occurrence:
    ``query_pos`` (that token at the second occurrence), ``copy_pos`` (the same token at the first), ``key_pos``
    (= copy_pos + 1: the token after the earlier copy, where an induction head looks), ``query_token`` and
    ``key_token`` (strings), ``pos_in_name`` (0 for the name's first token). The first row is the chapter's cell
    (the earliest token of the second occurrence whose copy comes earlier). A token of the first occurrence that
    ends the name is left out (its next token is not part of the name). Raises ``ArgumentError`` when ``name``
    does not occur twice or no token of its second occurrence has an earlier copy.
    """
    m = as_hooked(model)
    if not isinstance(name, str) or not name.strip():
        raise ArgumentError(f"name={describe(name)} must be a non-empty string that occurs twice in the text")
    first = text.find(name)
    second = text.find(name, first + 1) if first >= 0 else -1
    if second < 0:
        raise ArgumentError(f"name={name!r} does not occur twice in the text: pass a name the text repeats")
    ids = m.to_tokens(text)[0]
    offs = _offsets(m, ids)
    strs = m.to_str_tokens(ids)

    def span(start: int) -> list[int]:
        end = start + len(name)
        return [i for i, (a, b) in enumerate(offs) if b > start and a < end]

    one, two = span(first), span(second)
    rows = []
    for k, q in enumerate(two):
        copies = [j for j in one[:-1] if int(ids[j]) == int(ids[q]) and j + 1 < q]
        if not copies:
            continue
        j = copies[-1]
        rows.append(dict(query_pos=q, copy_pos=j, key_pos=j + 1, query_token=strs[q], key_token=strs[j + 1],
                         pos_in_name=k))
    if not rows:
        raise ArgumentError(f"no token of {name!r}'s second occurrence has a copy in its first (tokens "
                            f"{[strs[i] for i in one]} and {[strs[i] for i in two]}): pass a text whose name "
                            "repeats token for token")
    return pd.DataFrame(rows)


def repeat_cell(model, input, run: int = 3, limit: int | None = None) -> tuple[int, int] | None:
    """The first induction cell of a text, from its tokens alone: the earliest query position ``q`` whose ``run``
    tokens from ``q`` on came before, in the same order, from an earlier ``j`` on (a repeated name, a repeated
    phrase), as ``(q, j + 1)``: the query and the token after the earlier copy, where an induction head looks.
    ``limit``: only queries before it (the positions a page shows). None when the text repeats no run of ``run``
    tokens (the first ``run - 1`` tokens of a repeat have no next token to look at, so a run must fit before the
    end)."""
    m = as_hooked(model)
    toks, _ = m.prepare_input(input)
    if toks.shape[0] != 1:
        raise ArgumentError(f"repeat_cell takes one text, got {toks.shape[0]}")
    ids = toks[0].tolist()
    T = len(ids)
    if isinstance(run, bool) or not isinstance(run, int) or run < 2:
        raise ArgumentError(f"run={describe(run)} must be a whole number of tokens, 2 or more")
    end = T if limit is None else min(T, check_index(limit, "limit", T + 1, what="a position of the text, or its end"))
    seen: dict[tuple[int, ...], int] = {}
    for i in range(T - run + 1):
        gram = tuple(ids[i:i + run])
        j = seen.get(gram)
        if j is not None and j + 1 < i and i < end:
            return i, j + 1
        seen.setdefault(gram, i)
    return None


def swap_token(model, input, pos: int, substitutes: Sequence[str] = SUBSTITUTES) -> Int[Tensor, "1 pos"]:
    """The input's token ids (1, pos) with the token at ``pos`` replaced by the first of ``substitutes`` that is one
    token and differs from it: the same text, but nothing at ``pos`` marks what follows as following that token.
    Raises ``ArgumentError`` when no substitute fits."""
    m = as_hooked(model)
    toks, _ = m.prepare_input(input)
    if toks.shape[0] != 1:
        raise ArgumentError(f"swap_token takes one text, got {toks.shape[0]}")
    p = check_index(pos, "pos", int(toks.shape[1]), what="the input's positions")
    out = toks.clone()
    for s in substitutes:
        ids = m.to_tokens(s)
        if ids.shape[1] == 1 and int(ids[0, 0]) != int(toks[0, p]):
            out[0, p] = ids[0, 0]
            return out
    raise ArgumentError(f"none of substitutes={list(substitutes)!r} is one token other than the one at pos={p}")


def write_label(w: Write) -> str:
    """'block 1 head 0 (layer 0) at 12', 'feed-forward of block 1 (layer 0) at 12', 'embedding at 12'."""
    if w[0] == "head":
        return f"{head_label(w[1], w[2])} at {w[3]}"
    if w[0] == "mlp":
        return f"feed-forward of {block_label(w[1])} at {w[2]}"
    return f"embedding at {w[1]}"


def _check_write(m: HookedSprout, w, layer: int, T: int) -> Write:
    if not isinstance(w, (tuple, list)) or not w or w[0] not in ("head", "mlp", "embed"):
        raise ArgumentError(f"removed writes are ('head', layer, head, pos), ('mlp', layer, pos) or ('embed', pos), "
                            f"got {describe(w)}")
    n = {"head": 4, "mlp": 3, "embed": 2}[w[0]]
    if len(w) != n:
        raise ArgumentError(f"a removed {w[0]} write has {n} parts ({w[0]!r}, ...), got {describe(w)}")
    if w[0] == "embed":
        return ("embed", check_index(w[1], "removed embed pos", T, what="the input's positions"))
    wl = check_index(w[1], f"removed {w[0]} layer", layer,
                     what=f"a block before the attention head's, 0..{layer - 1}" if layer else "none: layer 0 reads only the embedding")
    if w[0] == "head":
        h = check_index(w[2], "removed head", m.cfg.n_heads, what=f"this model's {m.cfg.n_heads} heads")
        return ("head", wl, h, check_index(w[3], "removed head pos", T, what="the input's positions"))
    return ("mlp", wl, check_index(w[2], "removed mlp pos", T, what="the input's positions"))


@torch.no_grad()
def remove_writes(model, input, layer: int, head: int, query_pos: int, key_pos: int,
                  writes: Sequence[Sequence[Write]]) -> pd.DataFrame:
    """Head ``head`` of ``blocks.{layer}`` at the cell (``query_pos``, ``key_pos``), in the real model, with each
    group of writes in ``writes`` removed (each group in its own forward; the writes of a group together).

    A write is ``("head", l, h, pos)`` (head h of block l's output at one position: its ``hook_z`` there zeroed),
    ``("mlp", l, pos)`` (block l's feed-forward output at one position: ``hook_mlp_out`` zeroed there) or
    ``("embed", pos)`` (the token's embedding there). Writes come from blocks before ``layer``; everything
    downstream of a removal responds (norms, later heads, feed-forwards).

    Returns one row per group, after a first row for the unchanged model (``removed`` = "nothing"): ``removed``
    (the writes' labels joined by ' + '), ``score`` (pre-softmax score at the cell), ``prob`` (attention
    probability there), ``score_change`` and ``prob_change`` (against the unchanged model). ``attrs``: layer,
    head, query_pos, key_pos.
    """
    m = as_hooked(model)
    toks, mask = m.prepare_input(input)
    if toks.shape[0] != 1:
        raise ArgumentError(f"remove_writes takes one text, got {toks.shape[0]}")
    T = int(toks.shape[1])
    L = check_index(layer, "layer", m.cfg.n_layers, what=f"this model's {m.cfg.n_layers} blocks, 0-indexed")
    H = check_index(head, "head", m.cfg.n_heads, what=f"this model's {m.cfg.n_heads} heads")
    q = check_index(query_pos, "query_pos", T, what="the input's positions")
    k = check_index(key_pos, "key_pos", T, what="the input's positions")
    if k > q:
        raise ArgumentError(f"key_pos={k} is after query_pos={q}: attention is causal, pass key_pos <= query_pos")
    if isinstance(writes, (str, bytes)) or not hasattr(writes, "__iter__"):
        raise ArgumentError(f"writes={describe(writes)} must be a list of groups of writes")
    groups = [[_check_write(m, w, L, T) for w in g] for g in writes]
    for g in groups:
        if not g:
            raise ArgumentError("a group of removed writes is empty: give each group at least one write")
    got: dict[str, float] = {}

    def read(name: str):
        def hook(x: Tensor, hook) -> None:
            got[name] = float(x[0, H, q, k])
        return hook

    reads = [(act_name("attn_scores", L), read("score")), (act_name("pattern", L), read("prob"))]

    def zero(w: Write):
        if w[0] == "head":
            def hook(z: Tensor, hook) -> Tensor:
                z = z.clone()
                z[:, w[3], w[2]] = 0.0
                return z
            return (act_name("z", w[1]), hook)
        name, p = (act_name("mlp_out", w[1]), w[2]) if w[0] == "mlp" else ("hook_embed", w[1])

        def hook(x: Tensor, hook) -> Tensor:
            x = x.clone()
            x[:, p] = 0.0
            return x
        return (name, hook)

    rows = []
    for g in [[]] + groups:
        got.clear()
        m.run_with_hooks(toks, attention_mask=mask, fwd_hooks=[zero(w) for w in g] + reads,
                         stop_at_layer=L + 1)
        rows.append(dict(removed=" + ".join(write_label(w) for w in g) or "nothing", score=got["score"],
                         prob=got["prob"]))
    df = pd.DataFrame(rows)
    df["score_change"] = df["score"] - df["score"].iloc[0]
    df["prob_change"] = df["prob"] - df["prob"].iloc[0]
    df.attrs.update(layer=L, head=H, query_pos=q, key_pos=k)
    return df
