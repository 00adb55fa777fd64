"""The logit lens: read the residual stream after the embedding and after every block through the
final RMSNorm and the tied head -- "what would the model say if it stopped here?"

Rows: 0 = after the embedding, l+1 = after block l (0-indexed in code; "block l+1" for people).
The last row is the model's real output. Probabilities are plain probabilities; losses, entropies and
KL divergences are in nats.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .residual import residual_stack, row_labels


@dataclass
class LogitLens:
    """Per-cell and per-row results of :func:`logit_lens`. Cell tensors are (row, batch, pos[, k])."""

    rows: list[str]  # "embedding", "block 1", …
    tokens: Int[Tensor, "batch pos"]
    mask: Bool[Tensor, "batch pos"]  # real (unpadded) tokens
    has_next: Bool[Tensor, "batch pos"]  # real tokens whose next token is real too
    topk_ids: Int[Tensor, "row batch pos k"]
    topk_probs: Float[Tensor, "row batch pos k"]
    next_prob: Float[Tensor, "row batch pos"]  # probability of the actual next token (nan where none)
    next_rank: Int[Tensor, "row batch pos"]  # its rank, 0 = top-1 (-1 where none)
    entropy: Float[Tensor, "row batch pos"]  # nats
    kl_final: Float[Tensor, "row batch pos"]  # KL(final ‖ row), nats

    @property
    def top1_correct(self) -> Bool[Tensor, "row batch pos"]:
        return (self.next_rank == 0) & self.has_next

    def _mean(self, x: Tensor, where: Tensor) -> Tensor:
        w = where.to(x.dtype)
        return (torch.nan_to_num(x) * w).sum((1, 2)) / w.sum().clamp(min=1)

    @property
    def confidence(self) -> Float[Tensor, "row"]:
        """Mean top-1 probability over real positions (the chapter's "confidence")."""
        return self._mean(self.topk_probs[..., 0], self.mask)

    @property
    def accuracy(self) -> Float[Tensor, "row"]:
        """Share of positions whose top-1 is the actual next token."""
        return self._mean(self.top1_correct.float(), self.has_next)

    @property
    def cross_entropy(self) -> Float[Tensor, "row"]:
        """Mean −log p(actual next token), nats/token."""
        return self._mean(-torch.log(self.next_prob.clamp(min=1e-45)), self.has_next)

    def summary(self) -> pd.DataFrame:
        """One row per stream row: block (1-indexed, 0 = embedding), layer (0-indexed, -1 = embedding),
        confidence, accuracy, cross_entropy (nats/token), entropy (nats), kl_final (nats)."""
        n = len(self.rows)
        return pd.DataFrame({
            "row": self.rows, "block": range(n), "layer": range(-1, n - 1),
            "confidence": self.confidence.tolist(), "accuracy": self.accuracy.tolist(),
            "cross_entropy": self.cross_entropy.tolist(),
            "entropy": self._mean(self.entropy, self.mask).tolist(),
            "kl_final": self._mean(self.kl_final, self.mask).tolist(),
        })

    def cells(self, str_tokens=None) -> pd.DataFrame:
        """Tidy table, one record per (row, batch, pos) of a real token: the token, the actual next token,
        its probability and rank, the top-k ids (and strings when ``str_tokens`` maps ids to text)."""
        recs = []
        R, B, T, K = self.topk_ids.shape
        for r in range(R):
            for b in range(B):
                for p in range(T):
                    if not self.mask[b, p]:
                        continue
                    ids = self.topk_ids[r, b, p].tolist()
                    rec = {
                        "row": self.rows[r], "block": r, "batch": b, "pos": p, "token_id": int(self.tokens[b, p]),
                        "next_id": int(self.tokens[b, p + 1]) if self.has_next[b, p] else None,
                        "next_prob": float(self.next_prob[r, b, p]), "next_rank": int(self.next_rank[r, b, p]),
                        "top1_id": ids[0], "top1_prob": float(self.topk_probs[r, b, p, 0]),
                        "top1_correct": bool(self.top1_correct[r, b, p]),
                        "topk_ids": ids, "topk_probs": self.topk_probs[r, b, p].tolist(),
                    }
                    if str_tokens is not None:
                        rec["topk"] = [str_tokens(i) for i in ids]
                    recs.append(rec)
        return pd.DataFrame.from_records(recs)

    def first_correct_row(self) -> Int[Tensor, "batch pos"]:
        """Index of the first row whose top-1 is the actual next token and stays so in the final row; -1 if never."""
        ok = self.top1_correct
        first = torch.where(ok.any(0), ok.float().argmax(0), torch.full_like(ok[0], -1, dtype=torch.long))
        return torch.where(ok[-1], first, torch.full_like(first, -1))


def read_out(model, stream: Float[Tensor, "... d_model"]) -> Float[Tensor, "... vocab"]:
    """Logits of a stream vector through the model's final RMSNorm and tied head."""
    gpt = model.model
    return gpt.head(gpt.norm(stream))


@torch.no_grad()
def logit_lens(
    model,
    tokens: Int[Tensor, "batch pos"],
    k: int = 5,
    attention_mask: Bool[Tensor, "batch pos"] | None = None,
    chunk: int = 1024,
) -> LogitLens:
    """Apply the logit lens to every row of the stream for ``tokens``.

    Works ``chunk`` positions at a time, so at most (chunk × vocab) probabilities per row exist at once
    instead of (rows × batch × pos × vocab).
    """
    stack = residual_stack(model, tokens)  # (R, B, T, d)
    R, B, T, d = stack.shape
    mask = torch.ones_like(tokens, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    has_next = mask.clone()
    has_next[:, -1] = False
    has_next[:, :-1] &= mask[:, 1:]
    nxt = torch.cat([tokens[:, 1:], tokens[:, :1]], 1).reshape(-1)  # last column is a dummy, masked out
    flat = stack.reshape(R, B * T, d)
    out = {n: [] for n in ("ids", "probs", "nprob", "rank", "ent", "kl")}
    for s in range(0, B * T, chunk):
        final = F.log_softmax(read_out(model, flat[-1, s: s + chunk]).float(), -1)
        p_final = final.exp()
        tgt = nxt[s: s + chunk, None]
        per_row = {n: [] for n in out}
        for r in range(R):
            lp = final if r == R - 1 else F.log_softmax(read_out(model, flat[r, s: s + chunk]).float(), -1)
            probs, ids = lp.topk(k, -1)
            per_row["ids"].append(ids)
            per_row["probs"].append(probs.exp())
            t_lp = lp.gather(-1, tgt)
            per_row["nprob"].append(t_lp.exp()[:, 0])
            per_row["rank"].append((lp > t_lp).sum(-1))
            per_row["ent"].append(-(lp.exp() * lp).sum(-1))
            per_row["kl"].append((p_final * (final - lp)).sum(-1))
        for n in out:
            out[n].append(torch.stack(per_row[n]))
    cat = {n: torch.cat(v, 1) for n, v in out.items()}
    shape = lambda x: x.reshape(R, B, T, *x.shape[2:])  # noqa: E731
    hn = has_next[None].expand(R, B, T)
    return LogitLens(
        rows=row_labels(R - 1), tokens=tokens, mask=mask, has_next=has_next,
        topk_ids=shape(cat["ids"]), topk_probs=shape(cat["probs"]),
        next_prob=torch.where(hn, shape(cat["nprob"]), torch.full_like(shape(cat["nprob"]), float("nan"))),
        next_rank=torch.where(hn, shape(cat["rank"]), torch.full_like(shape(cat["rank"]), -1)),
        entropy=shape(cat["ent"]), kl_final=shape(cat["kl"]),
    )


@torch.no_grad()
def embedding_echo_rate(lens: LogitLens) -> float:
    """Share of real positions where the embedding row's top-1 is the input token itself (tied weights)."""
    hit = (lens.topk_ids[0, ..., 0] == lens.tokens) & lens.mask
    return hit.sum().item() / lens.mask.sum().item()
