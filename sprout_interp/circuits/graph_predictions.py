"""How well an attribution graph predicts the real model, measured over many prompts rather than one chosen example:
each of a prompt's strongest features removed alone in the real model (its decoder write taken out of the
feed-forward's true output at its position, and with a cross-layer transcoder its writes to every later
feed-forward's output too, the patterns, norms and feed-forwards all responding:
:func:`~sprout_interp.circuits.graph_interventions.real_run`), against what the graph's edges predict for that
removal, with the final RMSNorm's scale frozen (circuit-tracer's graph) and through its Jacobian
(``attribution_graph(..., final_norm="jacobian")``).

The target is the prompt's top logit (the real model's most probable next token, the graph's one logit node), in
the graph's units: that token's logit minus the mean logit. A feature's predicted change is the total effect of
removing it in the graph's linear replacement model (every path through later features, as
:func:`~sprout_interp.circuits.graph_interventions.ablation_prediction` computes it; errors and constants held),
and its direct edge into the logit beside it.
"""
from __future__ import annotations

from typing import Optional, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.circuits.attribution_graph import FINAL_NORMS, attribution_graph
from sprout_interp.circuits.graph_interventions import real_run
from sprout_interp.circuits.graphs import AttributionGraph, node_influence
from sprout_interp.circuits.local_replacement import (
    TranscodersLike,
    local_replacement,
    resolve_transcoders,
    transcoder_kind,
)
from sprout_interp.core.arguments import check_count
from sprout_interp.core.errors import AttributionGraphError
from sprout_interp.core.hooked import as_hooked
from sprout_interp.core.texts import TEXTS, held_out_for

__all__ = ["SELECTIONS", "logit_totals", "logit_predictions", "prediction_summary", "prediction_prompts"]

#: how a prompt's features are chosen for removal, each in the frozen graph: ``influence`` (circuit-tracer's
#: influence on the logit, every path), ``logit_edge`` (the largest |direct edge| into the logit) and
#: ``last_layer`` (the same among the last block's features only)
SELECTIONS = ("influence", "logit_edge", "last_layer")


def logit_totals(graph: AttributionGraph) -> Float[Tensor, " sources"]:
    """Each source node's total effect on the first logit node in the graph's linear replacement model: its direct
    edge plus every path through later features (a feature's activation moving as its input does; errors, embeddings
    and constants held), float64, one per feature, error and embedding node in node order. Removing source ``s``
    alone changes the logit by ``-totals[s]``: what :func:`~sprout_interp.circuits.graph_interventions.
    ablation_prediction` gives as ``total_logits[0]`` for ``[s]``, for every source in one backward pass."""
    if not isinstance(graph, AttributionGraph):
        raise AttributionGraphError(f"graph must be an AttributionGraph, got {type(graph).__name__}")
    if graph.n_logits < 1:
        raise AttributionGraphError("the graph has no logit node: make it with at least one")
    n, nF = graph.adjacency.shape[0], graph.n_features
    A = graph.adjacency
    row = A[n - graph.n_logits, :n - graph.n_logits].double()
    act = torch.tensor(graph.nodes["activation"].values[:nF], dtype=torch.float64)
    total = row.clone()
    for _ in range(graph.n_layers + 1):  # each step reaches one layer further back
        new = row + ((total[:nF] / act).float() @ A[:nF, :n - graph.n_logits]).double()
        if torch.equal(new, total):
            break
        total = new
    return total


def _texts(texts) -> list:
    if isinstance(texts, (str, Tensor)) or not isinstance(texts, Sequence) or not len(texts):
        raise AttributionGraphError(
            f"texts must be a non-empty list of prompts (texts, or token ids (pos,)), one graph each, got "
            f"{type(texts).__name__}: wrap a single prompt in a list")
    return list(texts)


def _feature_nodes(graph: AttributionGraph) -> dict[tuple[int, int, int], int]:
    f = graph.nodes.iloc[:graph.n_features]
    return {(int(a), int(b), int(c)): i for i, (a, b, c) in enumerate(zip(f["layer"], f["pos"], f["feature"]))}


@torch.no_grad()
def logit_predictions(model, texts, transcoders: TranscodersLike = None, *, kind: Optional[str] = None, k: int = 3,
                      selections: Sequence[str] = SELECTIONS, bos: bool = True) -> pd.DataFrame:
    """For each prompt of ``texts``: its graph with the top logit as the one logit node, made twice (the final norm
    frozen, and through its Jacobian), ``k`` features picked in the frozen graph by each of ``selections`` (see
    ``SELECTIONS``), and each picked feature removed alone in the real model.

    Args:
        texts: a list of prompts, each a text or token ids ``(pos,)`` (lengths may differ: each is graphed alone).
        transcoders, kind: as :func:`~sprout_interp.circuits.attribution_graph.attribution_graph` takes them:
            per-layer transcoders or a cross-layer transcoder (a CLT feature's removal takes out its writes to its own
            and every later feed-forward's output), or None: the shipped ones of ``kind`` (None: the best kind the
            model ships). bos: as in ``attribution_graph``.

    Returns one row per (prompt, selection, rank, final norm): ``transcoder_kind`` ("per_layer" or "clt"), ``text``
    (the prompt's index), ``n_pos``, ``target``
    (token id), ``token``, ``prob`` (the real model's probability of it), ``select``, ``rank`` (0 = strongest),
    ``node`` (in the frozen graph), ``layer``, ``block``, ``pos``, ``feature``, ``activation``, ``final_norm``,
    ``predicted_direct`` (minus the feature's edge into the logit), ``predicted_total`` (minus its total effect,
    :func:`logit_totals`) and ``real`` (the real model's change), all in logits (the target's logit minus the mean
    logit). Raises AttributionGraphError for bad arguments, as ``attribution_graph`` does for a bad prompt.
    """
    m = as_hooked(model)
    texts = _texts(texts)
    k = check_count(k, "k", high=1 << 16, what="features removed per prompt and selection", error=AttributionGraphError)
    if isinstance(selections, str) or not selections or any(s not in SELECTIONS for s in selections):
        raise AttributionGraphError(f"selections must be a non-empty list of {SELECTIONS}, got {selections!r}"[:300])
    if not isinstance(bos, bool):
        raise AttributionGraphError(f"bos must be True or False, got {bos!r}")
    tcs = resolve_transcoders(m, transcoders, kind)
    tc_kind = transcoder_kind(tcs)
    L = m.cfg.n_layers
    rows = []
    for i, text in enumerate(texts):
        with m.lock:
            rep = local_replacement(m, text, tcs, bos, cross_layer=True)
        target = int(rep.logits.argmax())
        graphs = {mode: attribution_graph(m, rep.tokens, tcs, bos=bos, attribution_targets=[target], final_norm=mode)
                  for mode in FINAL_NORMS}
        g = graphs["frozen"]
        nF = g.n_features
        totals = {mode: logit_totals(gr) for mode, gr in graphs.items()}
        nodes = {mode: _feature_nodes(gr) for mode, gr in graphs.items()}
        rep_nodes = {(int(a), int(b), int(c)): j for j, (a, b, c) in
                     enumerate(zip(rep.feat_layer.tolist(), rep.feat_pos.tolist(), rep.feat_index.tolist()))}
        layer = torch.tensor(g.nodes["layer"].values[:nF])
        edge = g.adjacency[-1, :nF].double().abs()
        scores = {"influence": node_influence(g)[:nF].double(), "logit_edge": edge,
                  "last_layer": torch.where(layer == L - 1, edge, torch.full_like(edge, -1.0))}
        base, _ = real_run(m, rep)
        base_value = float(base[target] - base.mean())
        prob = float(torch.softmax(base, -1)[target])
        token = m.to_str_tokens(torch.tensor([target]))[0] if m.tokenizer is not None else f"#{target}"
        real_cache: dict[int, float] = {}
        for sel in selections:
            score = scores[sel]
            order = torch.sort(score, descending=True, stable=True).indices
            picked = [int(j) for j in order[:k] if float(score[j]) >= 0][:k]
            for rank, node in enumerate(picked):
                f = g.nodes.iloc[node]
                key = (int(f["layer"]), int(f["pos"]), int(f["feature"]))
                r = rep_nodes[key]
                if r not in real_cache:
                    logits, _ = real_run(m, rep, features=[r])
                    real_cache[r] = float(logits[target] - logits.mean()) - base_value
                for mode, gr in graphs.items():
                    s = nodes[mode][key]
                    rows.append({"transcoder_kind": tc_kind, "text": i, "n_pos": g.n_pos, "target": target,
                                 "token": token, "prob": prob, "select": sel, "rank": rank, "node": node, "layer": key[0], "block": key[0] + 1,
                                 "pos": key[1], "feature": key[2], "activation": float(f["activation"]),
                                 "final_norm": mode, "predicted_direct": -float(gr.adjacency[-1, s]),
                                 "predicted_total": -float(totals[mode][s]), "real": real_cache[r]})
    df = pd.DataFrame(rows)
    df.attrs["units"] = ("changes of the target's logit minus the mean logit when one feature's write is removed: "
                         "predicted by the graph (direct edge; total through later features) and in the real model")
    return df


def _pearson(a: Tensor, b: Tensor) -> float:
    if a.numel() < 2:
        return float("nan")
    a, b = a - a.mean(), b - b.mean()
    den = float(a.norm() * b.norm())
    return float((a * b).sum()) / den if den > 0 else float("nan")


def prediction_summary(predictions: pd.DataFrame, prediction: str = "predicted_total", by: Sequence[str] = ()
                       ) -> pd.DataFrame:
    """How close ``prediction`` (``predicted_total`` or ``predicted_direct``) of :func:`logit_predictions`'s table
    comes to ``real``, per (``model`` and ``transcoder_kind`` when the table has them, ``select``, ``final_norm``,
    then the columns ``by``, e.g. ``["block"]``): ``removals``, ``prompts``, Pearson ``r``, ``sign_agreement``
    (share of removals whose predicted and real changes have the same sign) and ``median_rel_error`` (median of
    ``|predicted - real| / |real|``)."""
    if prediction not in ("predicted_total", "predicted_direct"):
        raise AttributionGraphError(f"prediction must be 'predicted_total' or 'predicted_direct', got {prediction!r}")
    if not isinstance(predictions, pd.DataFrame) or not {"select", "final_norm", prediction, "real", "text"} <= set(
            predictions.columns):
        raise AttributionGraphError("predictions must be logit_predictions' table (columns select, final_norm, "
                                    f"text, {prediction}, real)")
    if isinstance(by, str) or any(c not in predictions for c in by):
        raise AttributionGraphError(f"by must be a list of the table's columns, got {by!r}"[:300])
    by = [c for c in ("model", "transcoder_kind", "select", "final_norm") if c in predictions] + list(by)
    rows = []
    for key, g in predictions.groupby(by, sort=False):
        p = torch.tensor(g[prediction].values, dtype=torch.float64)
        r = torch.tensor(g["real"].values, dtype=torch.float64)
        rel = (p - r).abs() / r.abs().clamp(min=1e-12)
        rows.append({**dict(zip(by, key if isinstance(key, tuple) else (key,))), "removals": len(g),
                     "prompts": g["text"].nunique(), "r": _pearson(p, r),
                     "sign_agreement": float((torch.sign(p) == torch.sign(r)).double().mean()),
                     "median_rel_error": float(rel.median())})
    return pd.DataFrame(rows)


def prediction_prompts(model, n: int = 36, min_len: int = 12, max_len: int = 96, seed: int = 0,
                       ready_made: Sequence[int] = (24, 48, 72)) -> list[Int[Tensor, " pos"]]:
    """Prompts for :func:`logit_predictions`: ``n`` held-out windows (``held_out_for(model, n, max_len, seed)``, text
    no shipped model trained on), the ``i``-th cut to a length spread evenly from ``min_len`` to ``max_len``
    tokens, then each of the three ready-made texts (``TEXTS``) cut to each length of ``ready_made`` (shorter texts
    whole). Token ids ``(pos,)``, before ``<|endoftext|>`` is put first. Raises CorpusError without the corpus
    (``n=0`` reads none)."""
    m = as_hooked(model)
    n = check_count(n, "n", low=0, high=4096, what="held-out prompts (0: the ready-made texts only)",
                    error=AttributionGraphError)
    max_len = check_count(max_len, "max_len", high=m.cfg.n_ctx - 1, what="tokens of the longest prompt",
                          error=AttributionGraphError)
    min_len = check_count(min_len, "min_len", high=max_len, what="tokens of the shortest prompt, at most max_len",
                          error=AttributionGraphError)
    lengths = [check_count(x, "ready_made", high=m.cfg.n_ctx - 1, what="lengths of the ready-made prompts",
                           error=AttributionGraphError) for x in ready_made]
    out = []
    if n:
        windows = held_out_for(m, n=n, length=max_len, seed=seed)
        out = [windows[i, :min_len + round(i * (max_len - min_len) / max(n - 1, 1))] for i in range(n)]
    for text in TEXTS.values():
        ids = m.to_tokens(text)[0].cpu()
        out += [ids[:x] for x in lengths]
    return out
