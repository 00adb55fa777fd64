"""Direct logit attribution: how much each part of the model writes towards one token's logit.

Sprout's logits are ``ln_final.hook_normalized @ W_U`` with ``hook_normalized = resid / scale``
(RMSNorm has no centring, and HookedSprout's ``W_U`` carries the final gain), and the final stream
is the sum of what the embedding, every attention head and every feed-forward wrote. Dividing each
part by the same cached ``scale`` and projecting it on ``W_U[:, answer] - W_U[:, wrong]`` splits the
logit difference *exactly*: the rows of every table below sum to the model's own logit difference
(``check``). This is what TransformerLens's ``cache.logit_attrs(cache.decompose_resid(...))``
computes, and the tests check both against each other.

Units: logits (for a difference of two tokens, nats of log-odds). Tables use the project's
conventions: ``layer`` 0-indexed as in code, ``block`` = layer + 1 as the chapter counts, ``head``
0-indexed, ``pos`` the 0-based input index of the prediction, ``src_pos`` the position a head reads.
"""
from __future__ import annotations

from typing import Literal, Optional, Union

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.circuits.heads import head_label
from sprout_interp.core.arguments import check_count, check_index
from sprout_interp.core.errors import ArgumentError, SproutError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout, as_hooked
from sprout_interp.core.tokens import token_id

__all__ = ["direct_logit_attribution", "head_token_effects", "contribution_graph"]

TokenLike = Union[str, int]


def _token_strings(model: HookedSprout, ids: list[int]) -> list[str]:
    """Each id's text, or the id itself written out when the model has no tokenizer."""
    if model.tokenizer is None:
        return [f"#{i}" for i in ids]
    return list(model.to_str_tokens(torch.tensor(ids)))


def _run(model: HookedSprout, input, pos: int, need_pattern: bool, need_post: bool = False):
    toks, mask = model.prepare_input(input)
    if toks.shape[0] != 1:
        raise SproutError(f"direct logit attribution reads one text at a time, got a batch of {toks.shape[0]}")
    T = toks.shape[1]
    p = check_index(pos, "pos", T, negative=True, what=f"the prediction position in the text's {T} tokens")
    L = model.cfg.n_layers
    names = {"hook_embed", "ln_final.hook_scale"}
    for l in range(L):
        names |= {act_name("z", l), act_name("mlp_out", l)}
        if need_pattern:
            names |= {act_name("pattern", l), act_name("v", l)}
        if need_post:
            names.add(act_name("post", l))
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks, names_filter=lambda n: n in names)
    return toks[0], p, logits[0, p], cache


@torch.no_grad()
def direct_logit_attribution(
    model,
    input: Union[str, Int[Tensor, " pos"], Int[Tensor, "1 pos"]],
    answer: TokenLike,
    wrong: Optional[TokenLike] = None,
    pos: int = -1,
    by: Literal["component", "head", "source", "neuron"] = "head",
) -> pd.DataFrame:
    """What each part of the model adds to ``logit[answer] - logit[wrong]`` at position ``pos``.

    Args:
        model: a HookedSprout (``si.load(...)``) or a ``sprout_model.GPT``.
        input: one text, or its token ids.
        answer, wrong: tokens (a one-token string or an id). Without ``wrong`` the attribution is to
            ``logit[answer]`` alone.
        pos: the prediction position (0-based input index; negative counts from the end).
        by: ``"component"``: the embedding, then each block's attention and feed-forward;
            ``"head"``: the embedding, each head and each feed-forward; ``"source"``: each head
            split by the position it reads (``pattern[q, k] · v[k] @ W_O``), so a head's rows sum
            to its ``"head"`` row; ``"neuron"``: each head, and each feed-forward split by its neurons
            (the SwiGLU's hidden units, ``hook_post = silu(hook_pre) * hook_pre_linear``, each writing
            ``hook_post[n] * W_out[n]``), so a feed-forward's neuron rows sum to its ``"head"`` row.

    Returns:
        One row per part:

        | column | meaning |
        |---|---|
        | ``component`` | a label (``"embedding"``, ``"block 1 attention"``, ``"block 1 feed-forward"``, ``"block 2 head 0"`` ...) |
        | ``kind`` | ``"embed"``, ``"attn"``, ``"head"``, ``"mlp"`` or ``"neuron"`` |
        | ``layer``, ``block`` | 0-indexed (-1 for the embedding); ``layer + 1`` (0 for the embedding) |
        | ``head`` | -1 where not a head |
        | ``pos`` | the prediction position, 0-based |
        | ``src_pos``, ``src_token`` | the position a head's row reads and its token (``by="source"`` only) |
        | ``neuron``, ``activation`` | the neuron's index in its layer and its ``hook_post`` value (``by="neuron"`` only; -1 and NaN elsewhere) |
        | ``attribution`` | the part's share of the logit difference, in logits |

        ``df.attrs["logit_diff"]`` is the model's own value and ``df.attrs["total"]`` the sum of the rows; they
        agree to float rounding (for ``by="source"`` the feed-forward and embedding rows are included once each).
    """
    model = as_hooked(model)
    if by not in ("component", "head", "source", "neuron"):
        raise SproutError(f"by must be 'component', 'head', 'source' or 'neuron', got {by!r}")
    a = token_id(model, answer, "answer")
    w = None if wrong is None else token_id(model, wrong, "wrong")
    toks, p, logits, cache = _run(model, input, pos, need_pattern=by == "source", need_post=by == "neuron")
    direction = model.tokens_to_residual_directions(a)
    if w is not None:
        direction = direction - model.tokens_to_residual_directions(w)
    scale = cache["ln_final.hook_scale"][0, p]  # (1,)
    L, H = model.cfg.n_layers, model.cfg.n_heads

    def onto(x: Float[Tensor, "... d_model"]) -> Float[Tensor, "..."]:
        return (x / scale) @ direction

    rows: list[dict] = [dict(component="embedding", kind="embed", layer=-1, block=0, head=-1,
                             attribution=float(onto(cache["hook_embed"][0, p])))]
    for l in range(L):
        W_O = model.blocks[l].attn.W_O  # (head, d_head, d_model)
        if by == "component":
            attn = torch.einsum("hd,hdm->m", cache[act_name("z", l)][0, p], W_O)
            rows.append(dict(component=f"block {l + 1} attention", kind="attn", layer=l, block=l + 1, head=-1,
                             attribution=float(onto(attn))))
        elif by in ("head", "neuron"):
            per_head = torch.einsum("hd,hdm->hm", cache[act_name("z", l)][0, p], W_O)
            vals = onto(per_head)
            rows += [dict(component=head_label(l, h, with_layer=False), kind="head", layer=l, block=l + 1, head=h,
                          attribution=float(vals[h])) for h in range(H)]
        else:
            pattern = cache[act_name("pattern", l)][0, :, p, : p + 1]  # (head, src)
            v = cache[act_name("v", l)][0, : p + 1]  # (src, head, d_head)
            per_src = torch.einsum("hs,shd,hdm->hsm", pattern, v, W_O)
            vals = onto(per_src)  # (head, src)
            src_tokens = _token_strings(model, toks[: p + 1].tolist())
            for h in range(H):
                rows += [dict(component=head_label(l, h, with_layer=False), kind="head", layer=l, block=l + 1, head=h,
                              src_pos=s, src_token=src_tokens[s],
                              attribution=float(vals[h, s])) for s in range(p + 1)]
        if by == "neuron":
            post = cache[act_name("post", l)][0, p]  # (d_mlp,)
            vals = post * onto(model.blocks[l].mlp.W_out)  # each neuron's write, hook_post[n] * W_out[n], projected
            rows += [dict(component=f"block {l + 1} neuron {n}", kind="neuron", layer=l, block=l + 1, head=-1,
                          neuron=n, activation=a, attribution=v)
                     for n, (a, v) in enumerate(zip(post.tolist(), vals.tolist()))]
        else:
            rows.append(dict(component=f"block {l + 1} feed-forward", kind="mlp", layer=l, block=l + 1, head=-1,
                             attribution=float(onto(cache[act_name("mlp_out", l)][0, p]))))
    df = pd.DataFrame(rows)
    df.insert(5, "pos", p)
    if by == "neuron":
        df["neuron"] = df["neuron"].fillna(-1).astype(int)
        df = df[[c for c in df.columns if c != "attribution"] + ["attribution"]]
    if by != "source":
        df = df.drop(columns=[c for c in ("src_pos", "src_token") if c in df])
    else:
        df["src_pos"] = df["src_pos"].fillna(-1).astype(int)
        df["src_token"] = df["src_token"].fillna("")
    true = logits[a] - (logits[w] if w is not None else 0.0)
    df.attrs.update(logit_diff=float(true), total=float(df["attribution"].sum()), answer=a, wrong=w, pos=p,
                    units="logits", convention="layer 0-indexed; block = layer + 1; pos 0-based input index")
    return df


@torch.no_grad()
def head_token_effects(
    model, input: Union[str, Int[Tensor, " pos"]], layer: int, head: int, pos: int = -1, k: int = 10
) -> pd.DataFrame:
    """The tokens whose logits one head's output at ``pos`` raises most (promoted) and lowers most (suppressed).

    The head's write ``z[pos, head] @ W_O[layer, head]``, divided by the final norm's scale at
    ``pos``, projected on every token's unembedding direction: its direct effect on each logit.
    Returns ``k`` promoted then ``k`` suppressed rows: ``effect`` ("promoted" / "suppressed"),
    ``rank`` (1 = strongest), ``token_id``, ``token``, ``logit`` (the direct effect, in logits),
    plus ``layer``, ``block``, ``head``, ``pos``.
    """
    model = as_hooked(model)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    what = f"layers 0..{L - 1} (block = layer + 1), heads 0..{H - 1}"
    try:
        layer, head = check_index(layer, "layer", L, what=what), check_index(head, "head", H, what=what)
    except ArgumentError as e:
        raise ArgumentError(f"no head {head!r} in layer {layer!r}: {e}") from None
    k = check_count(k, "k", high=model.cfg.d_vocab // 2, what="tokens listed each way, promoted and suppressed")
    toks, p, _, cache = _run(model, input, pos, need_pattern=False)
    write = cache[act_name("z", layer)][0, p, head] @ model.blocks[layer].attn.W_O[head]
    effect = (write / cache["ln_final.hook_scale"][0, p]) @ model.W_U  # (d_vocab,)
    rows = []
    for kind, (vals, ids) in (("promoted", effect.topk(k)), ("suppressed", (-effect).topk(k))):
        names = _token_strings(model, ids.tolist())
        for r, (v, i) in enumerate(zip(vals.tolist(), ids.tolist())):
            rows.append(dict(effect=kind, rank=r + 1, token_id=i, token=names[r], logit=v if kind == "promoted" else -v))
    df = pd.DataFrame(rows)
    df["layer"], df["block"], df["head"], df["pos"] = layer, layer + 1, head, p
    df.attrs.update(units="logits (direct effect through the final norm)", pos=p)
    return df


@torch.no_grad()
def contribution_graph(
    model, input: Union[str, Int[Tensor, " pos"]], pos: int = -1, token: Optional[TokenLike] = None,
    threshold: float = 0.05,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What built one prediction: each head's and feed-forward's direct push on the token, and where each head read.

    The LLM Transparency Tool's graph, with direct logit attribution as the weight: nodes are the
    embedding, every head and every feed-forward at ``pos``, weighted by how much each writes towards
    ``token`` (default: the model's own top prediction there) through the final norm; edges run from
    each earlier position a head reads to that head, weighted by the part of the head's write that
    comes from that position (``pattern · v @ W_O``, the ``by="source"`` split). Only parts whose
    weight is at least ``threshold`` of the largest absolute weight are kept.

    Returns ``(nodes, edges)``: nodes ``component, kind, layer, block, head, attribution`` (logits);
    edges ``layer, block, head, src_pos, src_token, attribution`` (logits); both carry
    ``attrs["token"]`` (the token explained), ``attrs["pos"]`` and ``attrs["logit"]``.
    """
    model = as_hooked(model)
    toks, _ = model.prepare_input(input)
    if toks.shape[0] != 1:
        raise SproutError(f"the contribution graph reads one text at a time, got a batch of {toks.shape[0]}")
    toks = toks[0]
    if token is None:
        logits = model(toks[None])[0, check_index(pos, "pos", len(toks), negative=True, what="a position of the text")]
        token = int(logits.argmax())
    token = token_id(model, token)
    src = direct_logit_attribution(model, toks, token, pos=pos, by="source")
    heads = src[src.kind == "head"].groupby(["layer", "block", "head", "component"], as_index=False)["attribution"].sum()
    heads["kind"] = "head"
    others = src[src.kind != "head"][["component", "kind", "layer", "block", "head", "attribution"]]
    nodes = pd.concat([others, heads[["component", "kind", "layer", "block", "head", "attribution"]]])
    nodes = nodes.sort_values(["layer", "kind", "head"]).reset_index(drop=True)
    scale = float(nodes["attribution"].abs().max()) or 1.0
    nodes = nodes[nodes["attribution"].abs() >= threshold * scale].reset_index(drop=True)
    edges = src[(src.kind == "head") & (src["attribution"].abs() >= threshold * scale)]
    edges = edges[["layer", "block", "head", "src_pos", "src_token", "attribution"]].reset_index(drop=True)
    for df in (nodes, edges):
        df.attrs.update(token=_token_strings(model, [int(token)])[0], token_id=int(token), pos=src.attrs["pos"],
                        logit=src.attrs["logit_diff"], units="logits", threshold=threshold)
    return nodes, edges
