"""The logit lens: read the residual stream after the embedding and after every block through the
final RMSNorm and the tied head -- "what would the model say if it stopped here?" (the chapter's
section "The logit lens: thoughts along the way").

Rows: 0 = after the embedding, r = after block r (blocks counted from 1, as the chapter does; that is
``blocks.{r-1}.hook_resid_post`` in code, where layers are 0-indexed). The last row is the model's real
output. Probabilities are plain probabilities; cross-entropies, entropies and KL divergences are in
nats. Tables carry ``block`` (1-indexed, 0 = embedding) and ``layer`` (0-indexed, -1 = embedding).

``lens="tuned"`` reads every row through its tuned-lens translator first (:mod:`sprout_interp.lens.tuned_lens`),
with the same tables; a checkpoint without a saved tuned lens falls back to the logit lens with a
warning and the result's ``notice``. :func:`trajectories` gives one text's per-token tables for both.

The work is done ``chunk`` positions at a time, so at most ``chunk × vocab`` probabilities exist at
once instead of ``rows × batch × pos × vocab``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from sprout_interp.core.arguments import check_count
from sprout_interp.core.errors import ArgumentError
from sprout_interp.core.hooked import as_hooked
from sprout_interp.lens.residual import residual_stack, row_labels
from sprout_interp.lens.tuned_lens import TunedLens, find_tuned_lens, read_out

__all__ = [
    "CHAPTER_SPROUT_CONFIDENCE", "LogitLens", "logit_lens", "lens_log_probs", "read_out",
    "embedding_echo_rate", "penultimate_vs_final", "trajectories", "LENSES",
]

#: The lenses ``lens=`` accepts by name.
LENSES = ("logit", "tuned")

#: The chapter's Sprout figures: mean top-1 probability on its three ready-made texts, by block
#: (blocks counted from 1): "77% on average after layer 7 and 59% after layer 8".
CHAPTER_SPROUT_CONFIDENCE: dict[int, float] = {7: 0.77, 8: 0.59}


@dataclass
class LogitLens:
    """Per-cell and per-row results of :func:`logit_lens`.

    Cell tensors are ``(row, batch, pos[, k])``; row 0 = after the embedding, row r = after block r.
    Cells at padding positions hold whatever the padding token gives and are left out of every mean
    and table; cells with no actual next token (the last real token of a sequence) have
    ``next_prob`` NaN and ``next_rank`` -1.
    """

    rows: list[str]  # "embedding", "block 1", …
    tokens: Int[Tensor, "batch pos"]
    mask: Bool[Tensor, "batch pos"]  # real (unpadded) tokens
    has_next: Bool[Tensor, "batch pos"]  # real tokens whose next token is real too
    topk_ids: Int[Tensor, "row batch pos k"]
    topk_probs: Float[Tensor, "row batch pos k"]
    next_prob: Float[Tensor, "row batch pos"]  # probability of the actual next token (nan where none)
    next_rank: Int[Tensor, "row batch pos"]  # how many tokens are strictly more probable (0 = top-1; -1 where none)
    entropy: Float[Tensor, "row batch pos"]  # nats
    kl_final: Float[Tensor, "row batch pos"]  # KL(final ‖ row), nats; 0 in the last row
    lens: str = "logit"  # the lens actually used: "logit" or "tuned"
    notice: Optional[str] = None  # why the lens asked for was not used (a missing tuned lens), for a page to show

    @property
    def n_rows(self) -> int:
        return len(self.rows)

    @property
    def next_ids(self) -> Int[Tensor, "batch pos"]:
        """The actual next token at every position (-1 where there is none)."""
        nxt = torch.full_like(self.tokens, -1)
        nxt[:, :-1] = self.tokens[:, 1:]
        return torch.where(self.has_next, nxt, torch.full_like(nxt, -1))

    @property
    def top1_correct(self) -> Bool[Tensor, "row batch pos"]:
        """Whether the row's top-1 token is the actual next token (the grid's frame)."""
        return (self.topk_ids[..., 0] == self.next_ids) & self.has_next

    def _mean(self, x: Tensor, where: Tensor) -> Float[Tensor, " row"]:
        w = where.to(x.dtype)
        return (torch.nan_to_num(x) * w).sum((1, 2)) / w.sum().clamp(min=1)

    @property
    def confidence(self) -> Float[Tensor, " row"]:
        """Mean top-1 probability over all real positions (the chapter's "confidence")."""
        return self._mean(self.topk_probs[..., 0], self.mask)

    @property
    def accuracy(self) -> Float[Tensor, " row"]:
        """Share of positions (with a next token) whose top-1 is the actual next token."""
        return self._mean(self.top1_correct.float(), self.has_next)

    @property
    def cross_entropy(self) -> Float[Tensor, " row"]:
        """Mean −log p(actual next token), nats/token (the last row's is the model's loss)."""
        return self._mean(-torch.log(self.next_prob.clamp(min=1e-45)), self.has_next)

    @property
    def mean_entropy(self) -> Float[Tensor, " row"]:
        """Mean entropy of the row's distribution over all real positions, nats."""
        return self._mean(self.entropy, self.mask)

    @property
    def mean_kl_final(self) -> Float[Tensor, " row"]:
        """Mean KL(final ‖ row) over all real positions, nats."""
        return self._mean(self.kl_final, self.mask)

    def summary(self) -> pd.DataFrame:
        """One line per stream row: ``row``, ``block`` (1-indexed, 0 = embedding), ``layer`` (0-indexed,
        -1 = embedding), ``confidence``, ``accuracy``, ``cross_entropy`` (nats/token), ``entropy`` (nats),
        ``kl_final`` (nats), ``n_tokens`` (real positions) and ``n_predictions`` (positions with a next token)."""
        n = self.n_rows
        return pd.DataFrame({
            "row": self.rows, "block": list(range(n)), "layer": list(range(-1, n - 1)),
            "confidence": self.confidence.tolist(), "accuracy": self.accuracy.tolist(),
            "cross_entropy": self.cross_entropy.tolist(), "entropy": self.mean_entropy.tolist(),
            "kl_final": self.mean_kl_final.tolist(),
            "n_tokens": int(self.mask.sum()), "n_predictions": int(self.has_next.sum()),
        })

    def cells(self, to_str: Optional[Callable[[Sequence[int]], Sequence[str]]] = None) -> pd.DataFrame:
        """Tidy table, one record per (row, batch, pos) of a real token.

        Columns: row, block, layer, batch, pos, token_id, next_id (-1 where none), next_prob, next_rank,
        top1_id, top1_prob, top1_correct, entropy, kl_final, topk_ids (list), topk_probs (list); and
        token, next_token, top1, topk (strings) when ``to_str`` maps a list of ids to token strings
        (for example ``model.to_str_tokens``).
        """
        R, B, T, K = self.topk_ids.shape
        r_idx, b_idx, p_idx = torch.meshgrid(torch.arange(R), torch.arange(B), torch.arange(T), indexing="ij")
        keep = self.mask.cpu()[None].expand(R, B, T)
        sel = lambda x: x.detach().cpu()[keep]  # noqa: E731
        r = sel(r_idx).numpy()
        nxt = self.next_ids.cpu()[None].expand(R, B, T)
        df = pd.DataFrame({
            "row": np.asarray(self.rows, dtype=object)[r], "block": r, "layer": r - 1,
            "batch": sel(b_idx).numpy(), "pos": sel(p_idx).numpy(),
            "token_id": sel(self.tokens.cpu()[None].expand(R, B, T)).numpy(),
            "next_id": sel(nxt).numpy(),
            "next_prob": sel(self.next_prob).numpy(), "next_rank": sel(self.next_rank).numpy(),
            "top1_id": sel(self.topk_ids[..., 0]).numpy(), "top1_prob": sel(self.topk_probs[..., 0]).numpy(),
            "top1_correct": sel(self.top1_correct).numpy(),
            "entropy": sel(self.entropy).numpy(), "kl_final": sel(self.kl_final).numpy(),
            "topk_ids": list(self.topk_ids.detach().cpu()[keep].tolist()),
            "topk_probs": list(self.topk_probs.detach().cpu()[keep].tolist()),
        })
        if to_str is not None:
            vocab = sorted({int(i) for i in df["token_id"]} | {int(i) for ids in df["topk_ids"] for i in ids}
                           | {int(i) for i in df["next_id"] if i >= 0})
            s = dict(zip(vocab, to_str(vocab)))
            df["token"] = [s[int(i)] for i in df["token_id"]]
            df["next_token"] = [s[int(i)] if i >= 0 else None for i in df["next_id"]]
            df["top1"] = [s[int(i)] for i in df["top1_id"]]
            df["topk"] = [[s[int(i)] for i in ids] for ids in df["topk_ids"]]
        return df

    def first_correct_row(self, require_final: bool = True) -> Int[Tensor, "batch pos"]:
        """The first row whose top-1 is the actual next token, per position ("where does the right
        answer first appear?"). The row index is also the block number counted from 1 (0 = embedding).

        -1 where no row gets it right, where there is no next token, and, with ``require_final``
        (the default), where the final row (the model's real output) does not get it right.
        """
        ok = self.top1_correct
        first = torch.where(ok.any(0), ok.to(torch.uint8).argmax(0), torch.full_like(self.tokens, -1))
        if require_final:
            first = torch.where(ok[-1], first, torch.full_like(first, -1))
        return first

    def mean_first_correct(self, require_final: bool = True) -> float:
        """Mean of :meth:`first_correct_row` over the positions where it is defined (NaN if none):
        the average block (from 1; 0 = embedding) at which the right answer first becomes top-1."""
        f = self.first_correct_row(require_final)
        f = f[f >= 0]
        return float(f.float().mean()) if f.numel() else float("nan")

    def first_correct_counts(self, require_final: bool = True) -> pd.DataFrame:
        """How many positions first get the right answer at each row: ``row``, ``block``, ``layer``,
        ``count``, ``share`` (of the positions counted)."""
        f = self.first_correct_row(require_final)
        f = f[f >= 0]
        counts = torch.bincount(f.flatten().cpu(), minlength=self.n_rows)[: self.n_rows]
        n = self.n_rows
        total = int(counts.sum())
        return pd.DataFrame({
            "row": self.rows, "block": list(range(n)), "layer": list(range(-1, n - 1)),
            "count": counts.tolist(), "share": (counts.float() / max(total, 1)).tolist(),
        })


def _read_row(model, stream: Tensor) -> tuple[Tensor, Tensor]:
    """Logits (n, vocab) of ``n`` stream vectors and their probabilities (n, vocab)."""
    z = read_out(model, stream).float()
    return z, torch.softmax(z, -1)


def _has_next(mask: Tensor) -> Tensor:
    has_next = torch.zeros_like(mask)
    has_next[:, :-1] = mask[:, :-1] & mask[:, 1:]
    return has_next


def _prep(model, tokens, attention_mask):
    """(model, tokens (batch, pos), mask (batch, pos), True at real tokens) for a text, texts or ids."""
    model = as_hooked(model)
    tokens, mask = model.prepare_input(tokens, attention_mask)
    return model, tokens, torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask


@torch.no_grad()
def lens_log_probs(model, tokens: Int[Tensor, "batch pos"], lens: str | TunedLens = "logit") -> Float[Tensor, "row batch pos vocab"]:
    """Every row's full log-probabilities at once: (rows × batch × pos × vocab) floats, so only for
    short inputs (one text in a notebook, a reference in tests). :func:`logit_lens` is the chunked way.
    ``lens`` as in :func:`logit_lens`."""
    model, tokens, _ = _prep(model, tokens, None)
    tuned, _ = find_tuned_lens(model, lens)
    stack = residual_stack(model, tokens)
    if tuned is not None:
        stack = tuned.translate(stack)
    return F.log_softmax(read_out(model, stack).float(), -1)


@torch.no_grad()
def logit_lens(
    model,
    tokens: Int[Tensor, "*batch pos"] | str | list[str],
    k: int = 5,
    attention_mask: Bool[Tensor, "*batch pos"] | None = None,
    chunk: int | None = 512,
    lens: str | TunedLens = "logit",
) -> LogitLens:
    """Apply the logit lens (or the tuned lens) to every row of the stream for ``tokens``.

    Args:
        model: a :class:`~sprout_interp.HookedSprout` (a plain ``sprout_model.GPT`` is wrapped).
        tokens: ids ``(batch, pos)`` or ``(pos,)``; a batch of texts may be right-padded.
        k: how many top candidates to keep per cell, 1..d_vocab.
        attention_mask: True at real tokens (``model.to_tokens_with_mask`` gives it); padding is left
            out of every mean, and a token followed by padding has no next token.
        chunk: positions (over batch × pos) read out at a time (at least 1), bounding memory at about
            ``chunk × vocab`` floats per row; None reads all positions at once.
        lens: ``"logit"`` (the stream as it is), ``"tuned"`` (through the tuned lens saved beside the
            checkpoint; without one, the logit lens, a :class:`~sprout_interp.lens.tuned_lens.MissingTunedLensWarning`
            and ``notice`` set) or a :class:`~sprout_interp.lens.tuned_lens.TunedLens`. A lens trained for another
            checkpoint raises :class:`~sprout_interp.core.errors.TunedLensMismatchError`.
    """
    model, tokens, mask = _prep(model, tokens, attention_mask)
    k = check_count(k, "k", high=model.cfg.d_vocab, what="top candidates kept per cell, at most the vocabulary")
    if chunk is not None:
        chunk = check_count(chunk, "chunk", what="positions read out at a time; None reads all at once")
    tuned, notice = find_tuned_lens(model, lens)
    stack = residual_stack(model, tokens)  # (R, B, T, d)
    if tuned is not None:
        stack = tuned.translate(stack)
    R, B, T, d = stack.shape
    has_next = _has_next(mask)
    nxt = torch.zeros_like(tokens)
    nxt[:, :-1] = tokens[:, 1:]  # last column: a dummy, masked out by has_next
    nxt = nxt.reshape(-1)
    flat = stack.reshape(R, B * T, d)
    N = B * T
    step = N if chunk is None else chunk
    out = {n: torch.empty(R, N, *shape, dtype=dt, device=stack.device) for n, shape, dt in (
        ("ids", (k,), torch.long), ("probs", (k,), torch.float32), ("nprob", (), torch.float32),
        ("rank", (), torch.long), ("ent", (), torch.float32), ("kl", (), torch.float32))}
    for s in range(0, N, step):
        e = min(s + step, N)
        tgt = nxt[s:e, None]
        z_final, p_final = _read_row(model, flat[-1, s:e])
        for r in range(R - 1, -1, -1):  # the final row first: the KL of every other row needs it
            z, p = (z_final, p_final) if r == R - 1 else _read_row(model, flat[r, s:e])
            top_z, ids = z.topk(k, -1)
            top_p = p.gather(-1, ids)
            # log-sum-exp from the softmax itself: p_i = exp(z_i - lse), taken at the top-1 (never tiny)
            lse = top_z[:, 0] - top_p[:, 0].log()
            out["ids"][r, s:e] = ids
            out["probs"][r, s:e] = top_p
            out["nprob"][r, s:e] = p.gather(-1, tgt)[:, 0]
            out["rank"][r, s:e] = (z > z.gather(-1, tgt)).float().sum(-1).long()
            h = lse - torch.linalg.vecdot(p, z)  # entropy: -sum p log p = lse - sum p z
            out["ent"][r, s:e] = h
            if r == R - 1:
                h_final = h
                out["kl"][r, s:e] = 0.0
            else:
                # KL(final || row) = sum pf (log pf - log p) = -H(final) - sum pf z + lse
                out["kl"][r, s:e] = (lse - torch.linalg.vecdot(p_final, z) - h_final).clamp(min=0.0)
    shape = lambda x: x.reshape(R, B, T, *x.shape[2:])  # noqa: E731
    hn = has_next[None].expand(R, B, T)
    nprob, rank = shape(out["nprob"]), shape(out["rank"])
    return LogitLens(
        rows=row_labels(R - 1), tokens=tokens, mask=mask, has_next=has_next,
        topk_ids=shape(out["ids"]), topk_probs=shape(out["probs"]),
        next_prob=torch.where(hn, nprob, torch.full_like(nprob, float("nan"))),
        next_rank=torch.where(hn, rank, torch.full_like(rank, -1)),
        entropy=shape(out["ent"]), kl_final=shape(out["kl"]),
        lens="logit" if tuned is None else "tuned", notice=notice,
    )


def trajectories(model, text, lenses: Sequence[str | TunedLens] = LENSES, k: int = 1) -> pd.DataFrame:
    """Per-token trajectories of one text through each lens (the tuned-lens paper's heatmaps, as a table).

    One record per (lens, stream row, position): ``lens`` (the lens used: "logit" / "tuned"; a missing tuned
    lens gives "logit" rows again, with the notice in ``df.attrs["notices"]``), ``lens_asked``, ``row``,
    ``block`` (1-indexed, 0 = embedding), ``layer`` (0-indexed, -1 = embedding), ``pos``, ``token``,
    ``next_token`` (missing, NaN, at the last position), ``entropy`` (nats), ``cross_entropy`` (−log p of the actual
    next token, nats; NaN at the last position), ``kl_to_final`` (KL(final ‖ row), nats), ``top1`` and
    ``top1_prob``. ``text`` is a text or ids ``(pos,)`` / ``(1, pos)``; ``lenses`` one lens or a non-empty list
    of them (ArgumentError otherwise).
    """
    model = as_hooked(model)
    k = check_count(k, "k", high=model.cfg.d_vocab, what="top candidates kept per cell, at most the vocabulary")
    tokens, _ = model.prepare_input(text)
    if tokens.shape[0] != 1:
        raise ArgumentError(f"trajectories reads one text; got a batch of {tokens.shape[0]}")
    if isinstance(lenses, (str, TunedLens)):
        lenses = [lenses]  # one lens alone is a list of one
    if not isinstance(lenses, (list, tuple)) or not lenses:
        raise ArgumentError(f"lenses must be a non-empty list of \"logit\", \"tuned\" or TunedLens objects, got "
                            f"{str(lenses)[:60]!r}")
    for which in lenses:
        if not (isinstance(which, TunedLens) or (isinstance(which, str) and which in LENSES)):
            raise ArgumentError(f"lenses holds {str(which)[:60]!r}: each lens is \"logit\", \"tuned\" or a TunedLens")
    frames, notices = [], []
    for which in lenses:
        ll = logit_lens(model, tokens, k=k, lens=which)
        if ll.notice:
            notices.append(ll.notice)
        df = ll.cells(model.to_str_tokens if model.tokenizer is not None else None)
        out = pd.DataFrame({
            "lens": ll.lens, "lens_asked": which if isinstance(which, str) else "tuned",
            "row": df["row"], "block": df["block"], "layer": df["layer"], "pos": df["pos"],
            "token": df["token"] if "token" in df else df["token_id"].astype(str),
            "next_token": df["next_token"] if "next_token" in df else df["next_id"].astype(str),
            "entropy": df["entropy"], "cross_entropy": -np.log(df["next_prob"].clip(lower=1e-45)),
            "kl_to_final": df["kl_final"],
            "top1": df["top1"] if "top1" in df else df["top1_id"].astype(str), "top1_prob": df["top1_prob"],
        })
        frames.append(out)
    res = pd.concat(frames, ignore_index=True)
    res.attrs["notices"] = notices
    res.attrs["units"] = "entropy, cross_entropy, kl_to_final: nats"
    return res


def embedding_echo_rate(lens: LogitLens) -> float:
    """Share of real positions where the embedding row's top-1 is the input token itself.

    The chapter: the "embedding" row nearly always repeats the input token, because the weights are
    tied (a token's vector is most similar to its own row of the table).
    """
    hit = (lens.topk_ids[0, ..., 0] == lens.tokens) & lens.mask
    return hit.sum().item() / max(lens.mask.sum().item(), 1)


def penultimate_vs_final(summary: pd.DataFrame, metric: str = "confidence") -> dict:
    """The chapter's "the last layer often steps back": the last two rows of a :meth:`LogitLens.summary`.

    Returns ``penultimate_block`` and ``final_block`` (blocks from 1; 0 = embedding), ``penultimate``
    and ``final`` (the metric there), ``drop`` (penultimate − final; positive when the last block
    steps back) and ``ratio`` (final / penultimate).
    """
    s = summary.sort_values("block")
    pen, fin = s.iloc[-2], s.iloc[-1]
    a, b = float(pen[metric]), float(fin[metric])
    return {
        "penultimate_block": int(pen["block"]), "final_block": int(fin["block"]),
        "penultimate": a, "final": b, "drop": a - b, "ratio": b / a if a else float("nan"),
    }
