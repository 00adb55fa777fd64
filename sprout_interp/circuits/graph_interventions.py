"""Checking an attribution graph by intervention: change one feature's activation and compare what the downstream
features' inputs and the logit nodes do with what the graph's edges predict.

:func:`frozen_run` runs the local replacement model of a prompt (patterns and norm scales frozen, each
feed-forward replaced by its transcoder's skip connection, constant writes, error vector and feature writes)
through the model's own hooked forward, a path independent of the graph's backward passes. Features are held
at given activations, or (``linear=True``) follow their own pre-activations with the active set fixed (TopK
keeps the values as they are, so this is the replacement model itself, linear in the stream).

:func:`intervention_check` sets a feature node's activation to ``factor`` times its value, and measures, for
every feature node of a later layer and every logit node, the change of its input:

* ``direct_frozen``: in the frozen model, every other node held: the graph predicts it exactly,
  ``direct_predicted = (factor - 1) · adjacency[t, s]``;
* ``total_frozen``: in the frozen model, features following their pre-activations: predicted exactly by the
  graph's edges through every path, ``total_predicted`` (features propagate, errors and constants held; the
  features a graph made with ``max_feature_nodes`` left out are held too);
* ``real``: in the real model (the feature's decoder write changed inside the true feed-forward's output; the
  patterns, norms and feed-forwards all respond): measured, to be compared with ``total_predicted``.

:func:`ablation_prediction` predicts the removal of any set of sources from the edges; :func:`real_run` makes such
removals (features, error vectors, token embeddings, one attention weight) in the real model;
:func:`copy_interventions` tests a name's copy read off its graph part by part with them, against controls.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence, Union

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from sprout_interp.circuits.attribution_graph import attribution_graph
from sprout_interp.circuits.graphs import AttributionGraph, check_graph, graph_kind, node_influence
from sprout_interp.circuits.heads import head_label
from sprout_interp.circuits.local_replacement import (
    LocalReplacement,
    TranscodersLike,
    local_replacement,
    resolve_transcoders,
)
from sprout_interp.core.arguments import check_count, check_index, check_indices, check_number
from sprout_interp.core.errors import AttributionGraphError
from sprout_interp.core.hook_points import act_name
from sprout_interp.core.hooked import HookedSprout, as_hooked

__all__ = ["FrozenRun", "frozen_run", "intervention_check", "intervention_summary", "ablation_prediction", "real_run",
           "cut_attention", "copy_positions", "copy_interventions"]


@dataclass
class FrozenRun:
    """One run of the frozen replacement model: ``feature_inputs`` (n_features,): ``W_enc[f] · x`` at each feature
    node; ``activations`` (n_features,): what each feature wrote; ``logits`` (d_vocab,): at the last position (on
    the CPU)."""

    feature_inputs: Float[Tensor, " n"]
    activations: Float[Tensor, " n"]
    logits: Float[Tensor, " vocab"]


def frozen_run(model, rep: LocalReplacement, *, activations: Optional[Tensor] = None, linear: bool = False,
               clamp: Optional[dict] = None, held: Optional[Tensor] = None, embed: Union[bool, Tensor] = True,
               errors: Union[bool, Tensor] = True, consts: bool = True) -> FrozenRun:
    """Run the frozen local replacement model of ``rep`` (see the module docstring).

    Args:
        activations: (n_features,) the features' activations (default: their values on the prompt).
        linear: features follow their pre-activations (``W_enc[f] · x + b_enc[f]``, active set fixed) instead.
        clamp: {feature node: activation} held whatever ``linear`` says.
        held: (n_features,) bool: features held at ``activations`` whatever ``linear`` says (e.g. the features a
            graph with ``max_feature_nodes`` left out, which no edge of it follows).
        embed, errors, consts: keep the token embeddings, the error vectors, the constant writes (``b_dec``; the
            zeroed first position's feed-forward output); False writes zero instead. ``embed`` may also be a
            (pos,) and ``errors`` a (layer, pos) tensor of weights, one per embedding or error node.
    """
    m = as_hooked(model)
    L = m.cfg.n_layers
    base = rep.feat_act if activations is None else activations.float()
    if base.shape != rep.feat_act.shape:
        raise AttributionGraphError(f"activations must have shape {tuple(rep.feat_act.shape)} (one per feature "
                                    f"node), got {tuple(base.shape)}")
    clamp = dict(clamp or {})
    if held is not None and (not isinstance(held, Tensor) or held.dtype != torch.bool or held.shape != base.shape):
        raise AttributionGraphError(f"held must be a bool tensor of shape {tuple(base.shape)} (one per feature node), "
                                    f"got {held!r}"[:300])
    T = rep.tokens.numel()
    emb_w = _weights(embed, (T,), "embed").to(rep.feat_act.device)
    err_w = _weights(errors, (L, T), "errors").to(rep.feat_act.device)
    inputs = torch.zeros_like(rep.feat_act)
    acts = torch.zeros_like(rep.feat_act)
    seen: dict[int, Tensor] = {}

    def const(value: Tensor):
        return lambda act, hook: value.to(act.dtype).reshape(act.shape)

    def grab(act, hook, layer):
        seen[layer] = act[0] * m.blocks[layer].ln2.w
        return act

    def mlp_out(act, hook, layer):
        x = seen.pop(layer).float()
        lo, hi = rep.layer_span(layer)
        pos, f = rep.feat_pos[lo:hi], rep.feat_index[lo:hi]
        W_enc, b_enc = rep.encoder(layer)
        inputs[lo:hi] = (x[pos] * W_enc[f]).sum(-1)
        a = inputs[lo:hi] + b_enc[f] if linear else base[lo:hi].clone()
        if linear and held is not None:
            a = torch.where(held[lo:hi].to(a.device), base[lo:hi], a)
        for node, value in clamp.items():
            if lo <= node < hi:
                a[node - lo] = value
        acts[lo:hi] = a
        out = rep.skip_out(layer, x)
        if consts:
            out = out + rep.consts[layer]
        out = out + rep.errors[layer] * err_w[layer, :, None]
        for source in range(layer + 1):  # the features that write here: this layer's, and a CLT's earlier layers'
            if layer not in rep.targets(source):
                continue
            s0, s1 = rep.layer_span(source)
            out = out.index_add(0, rep.feat_pos[s0:s1], acts[s0:s1, None] * rep.decoder(source, layer)[
                rep.feat_index[s0:s1]])
        return out[None].to(act.dtype)

    hooks = [(act_name("scale"), const(rep.scale_final))]
    hooks.append((act_name("embed"), lambda act, hook: act * emb_w[None, :, None].to(act.dtype)))
    for i in range(L):
        hooks += [(act_name("pattern", i), const(rep.patterns[i])),
                  (act_name("scale", i, "ln1"), const(rep.scale1[i])),
                  (act_name("scale", i, "ln2"), const(rep.scale2[i])),
                  (act_name("normalized", i, "ln2"), lambda act, hook, i=i: grab(act, hook, i)),
                  (act_name("mlp_out", i), lambda act, hook, i=i: mlp_out(act, hook, i))]
    with torch.no_grad():
        logits = m.run_with_hooks(rep.tokens[None], fwd_hooks=hooks)
    return FrozenRun(inputs.cpu(), acts.cpu(), logits[0, -1].float().cpu())


def _weights(value, shape: tuple, name: str) -> Tensor:
    if isinstance(value, bool):
        return torch.full(shape, float(value))
    if not isinstance(value, Tensor) or tuple(value.shape) != shape:
        raise AttributionGraphError(f"{name} must be True, False or a tensor of shape {shape} (one weight per node), "
                                    f"got {value!r}"[:300])
    return value.float()


def _real_run(m: HookedSprout, rep: LocalReplacement, node: Optional[int] = None, delta: float = 0.0
              ) -> tuple[Tensor, Tensor]:
    """The real model's feature inputs ``W_enc[f] · x`` (n_features,) and last logits, with feature ``node``'s
    decoder write changed by ``delta`` times its decoder row inside the true feed-forward's output."""
    inputs = torch.zeros_like(rep.feat_act)

    def read(act, hook, layer):
        lo, hi = rep.layer_span(layer)
        pos, f = rep.feat_pos[lo:hi], rep.feat_index[lo:hi]
        x = (act[0] * m.blocks[layer].ln2.w).float()
        inputs[lo:hi] = (x[pos] * rep.encoder(layer)[0][f]).sum(-1)
        return act

    hooks = [(act_name("normalized", i, "ln2"), lambda act, hook, i=i: read(act, hook, i))
             for i in range(m.cfg.n_layers)]
    if node is not None:
        layer, pos, f = int(rep.feat_layer[node]), int(rep.feat_pos[node]), int(rep.feat_index[node])
        for target in rep.targets(layer):  # its own feed-forward's output, and with a CLT every later one's
            vec = delta * rep.decoder(layer, target)[f]

            def steer(act, hook, vec=vec):
                out = act.clone()
                out[0, pos] += vec.to(act.dtype)
                return out

            hooks.append((act_name("mlp_out", target), steer))
    with torch.no_grad():
        logits = m.run_with_hooks(rep.tokens[None], fwd_hooks=hooks)
    return inputs.cpu(), logits[0, -1].float().cpu()


def _total_prediction(graph: AttributionGraph, act: Tensor, node: int, delta: float) -> tuple[Tensor, Tensor]:
    """What the graph's edges predict through every path when feature ``node`` moves by ``delta``: the change of
    each feature's input and each logit node's input, features following their inputs (errors held)."""
    nF, A = graph.n_features, graph.adjacency
    A_ff = A[:nF, :nF]  # a view: the products run in float32, the changes are kept in float64
    d_act = torch.zeros(nF, dtype=torch.float64)
    d_act[node] = delta
    d_in = torch.zeros(nF, dtype=torch.float64)
    for _ in range(graph.n_layers + 1):  # each step reaches one layer further; the graph has n_layers of features
        d_in = (A_ff @ (d_act / act).float()).double()
        new = d_in.clone()
        new[node] = delta
        if torch.equal(new, d_act):
            break
        d_act = new
    d_logit = (A[-graph.n_logits:, :nF] @ (d_act / act).float()).double()
    return d_in, d_logit


def ablation_prediction(graph: AttributionGraph, nodes: Sequence[int]) -> dict[str, Tensor]:
    """What the graph's edges predict when the writes of source nodes ``nodes`` (features, error nodes, embeddings)
    are removed: the change of every feature's input (n_features,) and every logit node's input (n_logits,).

    Returns ``{"direct_features", "direct_logits"}``: every other node held (the sum of the removed nodes' edges,
    negated), and ``{"total_features", "total_logits"}``: the features follow their inputs (the linear replacement
    model: a feature's activation moves as its input does, the removed ones held at 0; errors and constants held),
    through every path. Float64; the units are the targets' (pre-activation; logit minus the mean logit).
    In the frozen model they are exact: ``frozen_run(..., linear=True)`` with the removed features held at 0. For a
    graph made with ``final_norm="jacobian"`` the logit changes are first-order changes through the final norm's
    Jacobian (the feature changes are the same).
    """
    graph = check_graph(graph)
    n, nF, nL = graph.adjacency.shape[0], graph.n_features, graph.n_logits
    nodes = check_indices(nodes, "nodes", n - nL, what="source nodes of the graph: features, errors, embeddings",
                          error=AttributionGraphError)
    A = graph.adjacency
    act = torch.tensor(graph.nodes["activation"].values[:nF], dtype=torch.float64)
    x0 = torch.zeros(n, dtype=torch.float64)  # each source's write, as a share of its own (-1: removed)
    x0[nodes] = -1.0
    follow = torch.ones(nF, dtype=torch.bool)
    follow[[i for i in nodes if i < nF]] = False
    direct = (A[:nF] @ x0.float()).double()
    x, d_in = x0.clone(), direct
    for _ in range(graph.n_layers + 1):  # each step reaches one layer further
        new = x0.clone()
        new[:nF][follow] = d_in[follow] / act[follow]
        if torch.equal(new, x):
            break
        x = new
        d_in = (A[:nF] @ x.float()).double()
    return {"direct_features": direct, "direct_logits": (A[n - nL:] @ x0.float()).double(),
            "total_features": d_in, "total_logits": (A[n - nL:] @ x.float()).double()}


def intervention_check(model, graph: AttributionGraph, transcoders: TranscodersLike = None,
                       nodes: Optional[Sequence[int]] = None, n: int = 5, factor: float = 0.0) -> pd.DataFrame:
    """Intervene on feature nodes of ``graph`` (``nodes``, or the ``n`` features of most influence on the logits)
    by setting each one's activation to ``factor`` times its value, one at a time, and measure the change of
    every later feature's input and every logit node's input in the frozen and the real model (see the module
    docstring for the columns). ``transcoders`` must be the ones the graph was made with (None: the shipped ones
    of the graph's kind, ``graph.info["transcoder_kind"]``: per-layer or cross-layer; a CLT feature's write is
    changed at every layer it writes to).

    Returns one row per (node, target): ``node``, ``layer``, ``pos``, ``feature`` (the intervened node),
    ``target``, ``target_kind``, ``target_layer``, ``target_pos``, and ``direct_predicted``, ``direct_frozen``,
    ``total_predicted``, ``total_frozen``, ``real``, all in the targets' units (pre-activation; logit minus mean).
    """
    m = as_hooked(model)
    graph = check_graph(graph)
    if graph.final_norm != "frozen":
        raise AttributionGraphError(
            f"intervention_check compares a graph with its frozen replacement model, whose final norm's scale is "
            f"frozen, but this graph's logit rows pass the final norm's {graph.final_norm}: make it with "
            "final_norm='frozen', or measure it against the real model with "
            "sprout_interp.circuits.graph_predictions.logit_predictions")
    factor = check_number(factor, "factor", error=AttributionGraphError)
    transcoders = resolve_transcoders(m, transcoders, graph_kind(graph))
    with m.lock:
        rep = local_replacement(m, graph.tokens, transcoders, bos=bool(graph.info.get("bos", True)), cross_layer=True)
    nF = graph.n_features
    gsel = _graph_features(graph, rep)
    if gsel is None or not torch.allclose(rep.feat_input.cpu()[gsel], torch.tensor(
            graph.nodes["input"].values[:nF], dtype=torch.float32), atol=1e-4):
        raise AttributionGraphError("the graph was not made with these transcoders on this model: pass the set it "
                                    "was made with")
    held = torch.ones(rep.n_features, dtype=torch.bool)
    held[gsel] = False  # features the graph left out (max_feature_nodes): held, as no edge of it follows them
    held = held.to(rep.feat_act.device)
    if nodes is None:
        n = check_count(n, "n", high=max(nF, 1), error=AttributionGraphError)
        nodes = node_influence(graph)[:nF].argsort(descending=True)[:n].tolist()
    else:
        nodes = check_indices(nodes, "nodes", nF, what="feature nodes of the graph", error=AttributionGraphError)
    act = rep.feat_act.double().cpu()[gsel]
    logit_ids = torch.tensor(graph.nodes["token_id"].values[-graph.n_logits:])
    base_fixed, base_linear = frozen_run(m, rep), frozen_run(m, rep, linear=True, held=held)
    with m.lock:
        base_real = _real_run(m, rep)

    def demeaned(logits: Tensor) -> Tensor:
        return logits[logit_ids] - logits.mean()

    frames = []
    for s in nodes:
        r = int(gsel[s])  # the node's index among every active feature
        layer = int(rep.feat_layer[r])
        delta = (factor - 1.0) * float(rep.feat_act[r])
        after = frozen_run(m, rep, clamp={r: factor * float(rep.feat_act[r])})
        after_lin = frozen_run(m, rep, linear=True, clamp={r: factor * float(rep.feat_act[r])}, held=held)
        with m.lock:
            real = _real_run(m, rep, r, delta)
        tot_in, tot_logit = _total_prediction(graph, act, s, delta)
        later = (torch.tensor(graph.nodes["layer"].values[:nF]) > layer).nonzero()[:, 0]
        later_r = gsel[later]
        t_nodes = later.tolist() + list(range(len(graph.nodes) - graph.n_logits, len(graph.nodes)))
        pick = graph.nodes.iloc[t_nodes]
        frames.append(pd.DataFrame({
            "node": s, "layer": layer, "pos": int(rep.feat_pos[r]), "feature": int(rep.feat_index[r]),
            "target": t_nodes, "target_kind": pick["kind"].values, "target_layer": pick["layer"].values,
            "target_pos": pick["pos"].values,
            "direct_predicted": ((factor - 1.0) * graph.adjacency[t_nodes, s].double()).tolist(),
            "direct_frozen": torch.cat([(after.feature_inputs - base_fixed.feature_inputs)[later_r],
                                        demeaned(after.logits) - demeaned(base_fixed.logits)]).tolist(),
            "total_predicted": torch.cat([tot_in[later], tot_logit]).tolist(),
            "total_frozen": torch.cat([(after_lin.feature_inputs - base_linear.feature_inputs)[later_r],
                                       demeaned(after_lin.logits) - demeaned(base_linear.logits)]).tolist(),
            "real": torch.cat([(real[0] - base_real[0])[later_r], demeaned(real[1]) - demeaned(base_real[1])]).tolist(),
        }))
    df = pd.concat(frames, ignore_index=True)
    df.attrs["units"] = "changes of each target's input: feature pre-activation, or logit minus the mean logit"
    df.attrs["factor"] = factor
    return df


def _graph_features(graph: AttributionGraph, rep: LocalReplacement) -> Optional[Tensor]:
    """The index among ``rep``'s active features of each feature node of ``graph`` (ascending; a graph made with
    ``max_feature_nodes`` holds some of them), or None when one of its features is not active in ``rep``."""
    nF = graph.n_features
    key = lambda layer, pos, f: (layer * (1 << 20) + pos) * (1 << 24) + f  # noqa: E731
    g = graph.nodes.iloc[:nF]
    gk = key(torch.tensor(g["layer"].values), torch.tensor(g["pos"].values), torch.tensor(g["feature"].values))
    rk = key(rep.feat_layer.cpu(), rep.feat_pos.cpu(), rep.feat_index.cpu())  # ascending: sorted by (layer, pos, f)
    idx = torch.searchsorted(rk, gk).clamp(max=max(rk.numel() - 1, 0))
    if rk.numel() == 0:
        return None if nF else idx
    return idx if bool((rk[idx] == gk).all()) else None


def _r(a: Tensor, b: Tensor) -> float:
    if a.numel() < 2:
        return float("nan")
    a, b = a - a.mean(), b - b.mean()
    den = float(a.norm() * b.norm())
    return float((a * b).sum()) / den if den > 0 else float("nan")


def intervention_summary(checks: pd.DataFrame) -> pd.DataFrame:
    """One row per intervened node and target kind (feature / logit) of :func:`intervention_check`'s table, then one
    per target kind over every node together (``node`` -1): the largest ``|frozen - predicted|`` for direct and
    total effects (exact up to float rounding), and how the real model follows the total prediction: Pearson
    ``r_real`` (NaN for a single target) and ``rel_error_real = ‖real - predicted‖ / ‖real‖``."""
    rows = []
    groups = [((node, kind), g) for (node, kind), g in checks.groupby(["node", "target_kind"], sort=False)]
    groups += [((-1, kind), g) for kind, g in checks.groupby("target_kind", sort=False)]
    for (node, kind), g in groups:
        t = {c: torch.tensor(g[c].values, dtype=torch.float64) for c in
             ("direct_predicted", "direct_frozen", "total_predicted", "total_frozen", "real")}
        one = node != -1
        rows.append({"node": node, "layer": int(g["layer"].iloc[0]) if one else -1,
                     "pos": int(g["pos"].iloc[0]) if one else -1, "feature": int(g["feature"].iloc[0]) if one else -1,
                     "target_kind": kind, "targets": len(g),
                     "direct_max_error": float((t["direct_frozen"] - t["direct_predicted"]).abs().max()),
                     "total_max_error": float((t["total_frozen"] - t["total_predicted"]).abs().max()),
                     "r_real": _r(t["real"], t["total_predicted"]),
                     "rel_error_real": float((t["real"] - t["total_predicted"]).norm() / t["real"].norm().clamp(
                         min=1e-30))})
    return pd.DataFrame(rows)


# -- a copy read off a graph, tested part by part ---------------------------------------------------------------


def copy_positions(tokens: Int[Tensor, " pos"], target: int) -> tuple[int, int]:
    """(p1, last): ``p1`` the last earlier position holding ``target`` right after a copy of the last token."""
    T = tokens.numel()
    hits = [i for i in range(1, T - 1) if int(tokens[i]) == target and int(tokens[i - 1]) == int(tokens[-1])]
    if not hits:
        raise AttributionGraphError(f"the prompt holds no earlier occurrence of token {target} right after a copy of "
                                    f"its last token {int(tokens[-1])}: cut the text just before a repeated name's "
                                    "later token")
    return hits[-1], T - 1


def _demeaned(logits: Tensor, target: int) -> float:
    return float(logits[target] - logits.mean())


def real_run(model, rep: LocalReplacement, *, features: Sequence[int] = (), errors: bool = False,
             embeds: Sequence[int] = (), head: Optional[tuple[int, int]] = None, key: int = -1
             ) -> tuple[Float[Tensor, " vocab"], Float[Tensor, " vocab"]]:
    """The real model on the prompt with the writes of feature nodes ``features`` removed from the feed-forwards'
    true outputs, the error vectors removed (``errors``), the token embeddings at positions ``embeds`` set to 0, or
    head ``(layer, head)``'s attention from the last position to ``key`` set to 0. Returns the last position's
    (logits, log-probabilities) as float tensors."""
    m = as_hooked(model)
    T = rep.tokens.numel()
    features = check_indices(features, "features", rep.n_features, what="feature nodes of rep",
                             error=AttributionGraphError) if len(features) else []
    embeds = check_indices(embeds, "embeds", T, what="positions of the prompt", error=AttributionGraphError) \
        if len(embeds) else []
    if head is not None:
        head = _check_head(m, rep, head, key)
    feats = torch.tensor(sorted(features), dtype=torch.long, device=rep.feat_layer.device)
    hooks = []
    if len(embeds):
        def no_embed(act, hook, pos=list(embeds)):
            out = act.clone()
            out[0, pos] = 0
            return out

        hooks.append((act_name("embed"), no_embed))
    for layer in range(m.cfg.n_layers):
        # the removed features that write into this feed-forward's output: its own, and with a CLT earlier layers'
        sel = feats[torch.tensor([layer in rep.targets(int(i)) for i in rep.feat_layer[feats].tolist()],
                                 dtype=torch.bool, device=feats.device)] if feats.numel() else feats
        if sel.numel() or errors:
            write = torch.zeros_like(rep.mlp_out[layer])
            for source in rep.feat_layer[sel].unique().tolist():
                one = sel[rep.feat_layer[sel] == source]
                vec = rep.feat_act[one, None] * rep.decoder(source, layer)[rep.feat_index[one]]
                write.index_add_(0, rep.feat_pos[one], vec)
            if errors:
                write += rep.errors[layer]
            hooks.append((act_name("mlp_out", layer), lambda act, hook, w=write: act - w.to(act.dtype)[None]))
    if head is not None:
        def cut(act, hook, h=head[1]):
            out = act.clone()
            out[0, h, -1, key] = 0
            return out

        hooks.append((act_name("pattern", head[0]), cut))
    with torch.no_grad():
        logits = m.run_with_hooks(rep.tokens[None], fwd_hooks=hooks)[0, -1].float().cpu()
    return logits, torch.log_softmax(logits, -1)


def _frozen_zeroed(m, rep: LocalReplacement, features: Sequence[int] = (), errors: bool = True,
                   held: Optional[Tensor] = None) -> Tensor:
    """The frozen linear replacement model's last logits with ``rep``'s features ``features`` held at 0 (and the
    error vectors removed unless ``errors``); ``held`` (n_features,) bool: features also held at their values (those
    a graph left out)."""
    acts = rep.feat_act.clone()
    held = torch.zeros_like(acts, dtype=torch.bool) if held is None else held.clone()
    if len(features):
        idx = torch.tensor(sorted(features), dtype=torch.long, device=acts.device)
        acts[idx], held[idx] = 0, True
    return frozen_run(m, rep, activations=acts, linear=True, held=held, errors=errors).logits


def _check_head(m: HookedSprout, rep: LocalReplacement, head, key: int) -> tuple[int, int]:
    if not isinstance(head, tuple) or len(head) != 2:
        raise AttributionGraphError(f"head must be a (layer, head) pair, got {head!r}"[:200])
    layer = check_index(head[0], "layer", m.cfg.n_layers, error=AttributionGraphError)
    h = check_index(head[1], "head", m.cfg.n_heads, error=AttributionGraphError)
    check_index(key, "key", rep.tokens.numel(), negative=True, what="a position of the prompt",
                error=AttributionGraphError)
    return layer, h


def cut_attention(rep: LocalReplacement, layer: int, head: int, key: int) -> LocalReplacement:
    """``rep`` with head ``(layer, head)``'s frozen attention from the last position to ``key`` set to 0 (not
    renormalized: the head reads the other positions as before)."""
    L, H, T, _ = rep.patterns.shape
    layer = check_index(layer, "layer", L, error=AttributionGraphError)
    head = check_index(head, "head", H, error=AttributionGraphError)
    key = check_index(key, "key", T, negative=True, what="a position of the prompt", error=AttributionGraphError)
    patterns = rep.patterns.clone()
    patterns[layer, head, -1, key] = 0
    return replace(rep, patterns=patterns)


def copy_interventions(model, text, surname: str, induction: tuple[int, int], n_random: int = 20, seed: int = 0,
                       transcoders: TranscodersLike = None, max_feature_nodes: Optional[int] = None) -> dict:
    """The copy of a name read off its attribution graph, each part tested by its own intervention, in the frozen
    replacement model (what the graph's edges predict) and in the real model, against controls.

    ``text`` ends just before a repeated name's later token; ``surname``'s first token is the target (the graph's one
    logit node); ``p1`` is the earlier position holding the target right after a copy of the last token, and
    ``induction`` the induction head ``(layer, head)``. Interventions, each a change of the target's logit minus the
    mean logit: every feature at ``p1 - 1`` and ``p1`` zeroed ("read at the first occurrence"); the features at
    ``p1`` alone, at ``p1 - 1`` alone, at the last position, and every error node ("context"); the token embeddings
    at ``p1 - 1`` and ``p1`` ("read at the first occurrence: the tokens"); the induction head's attention from the
    last position to ``p1`` set to 0 ("moved by the induction head's OV"), and the same with every feature held
    ("into the logit": the direct path, frozen model only). Controls: ``n_random`` draws (seed ``seed``) of as many
    features (or embeddings) at positions other than ``p1 - 1``, ``p1`` and the last; for the head, every other
    head's same attention weight. ``transcoders``: as :func:`attribution_graph` takes them (None: the best shipped
    kind). ``max_feature_nodes``: as :func:`attribution_graph` takes it (None: every active feature that fits its
    memory budget). The feature interventions and controls are on the graph's feature nodes; where the graph left
    features out, the frozen model holds them (no edge follows them, so the edges still predict it exactly) and
    the real model keeps their writes.

    Returns {"rows": one row per intervention (``part``,
    ``intervention``, ``n_nodes``, ``graph_direct`` / ``graph_total`` (what the edges predict), ``frozen``,
    ``real`` (the target's logit minus the mean logit: its change), ``real_logprob`` (change of log P(target)),
    ``frozen_control_max`` / ``real_control_max`` (the controls' largest change, frozen and real), "graph", "target",
    "p1", "last", "tokens", "p_target" (the real model's P(target)), "first_share" (the edges from every node at
    p1-1 and p1 into the logit, as a share of all its |edges|), "n_active_features" (the prompt's active
    features; the graph keeps ``graph.n_features`` of them)}."""
    m = as_hooked(model)
    n_random = check_count(n_random, "n_random", low=0, error=AttributionGraphError)
    seed = check_count(seed, "seed", low=0, error=AttributionGraphError)
    transcoders = resolve_transcoders(m, transcoders)
    with m.lock:
        rep = local_replacement(m, text, transcoders, cross_layer=True)
    target = int(m.to_tokens(surname)[0, 0])
    p1, last = copy_positions(rep.tokens.cpu(), target)
    g = attribution_graph(m, rep.tokens, transcoders, attribution_targets=[target],
                          max_feature_nodes=max_feature_nodes)
    nF = g.n_features
    gsel = _graph_features(g, rep)  # each feature node's index among rep's active features
    if gsel is None:
        raise AttributionGraphError("the graph's features are not active in the local replacement model of the same "
                                    "prompt: the transcoders changed between the two")
    fpos = torch.tensor(g.nodes["pos"].values[:nF], dtype=torch.long)
    left_out = torch.ones(rep.n_features, dtype=torch.bool)  # what the graph left out: held in the frozen model
    left_out[gsel] = False
    left_out = left_out.to(rep.feat_act.device)

    def active(nodes: list[int]) -> list[int]:
        """Feature nodes of the graph as indices among rep's active features."""
        return gsel[torch.tensor(nodes, dtype=torch.long)].tolist() if nodes else []

    base_real, base_lp = real_run(m, rep)
    base_frozen = frozen_run(m, rep, linear=True, held=left_out).logits
    gen = torch.Generator().manual_seed(seed)
    others = ((fpos != p1) & (fpos != p1 - 1) & (fpos != last)).nonzero()[:, 0]

    def real_change(**kw) -> tuple[float, float]:
        logits, lp = real_run(m, rep, **kw)
        return _demeaned(logits, target) - _demeaned(base_real, target), float(lp[target] - base_lp[target])

    def frozen_change(logits: Tensor) -> float:
        return _demeaned(logits, target) - _demeaned(base_frozen, target)

    def controls(count: int) -> tuple[list[float], list[float]]:
        """(frozen, real) changes of ``n_random`` draws of ``count`` feature nodes at other positions, zeroed."""
        fr, re = [], []
        for _ in range(n_random):
            pick = active(others[torch.randperm(others.numel(), generator=gen)[:count]].tolist())
            fr.append(frozen_change(_frozen_zeroed(m, rep, pick, held=left_out)))
            re.append(real_change(features=pick)[0])
        return fr, re

    other_pos = [p for p in range(1 if rep.bos else 0, last) if p not in (p1 - 1, p1)]

    def embed_controls(count: int) -> tuple[list[float], list[float]]:
        """(frozen, real) changes of ``n_random`` draws of ``count`` token embeddings at other positions, zeroed."""
        fr, re = [], []
        for _ in range(n_random):
            pick = [other_pos[i] for i in torch.randperm(len(other_pos), generator=gen)[:count].tolist()]
            w = torch.ones(g.n_pos)
            w[pick] = 0
            fr.append(frozen_change(frozen_run(m, rep, linear=True, embed=w, held=left_out).logits))
            re.append(real_change(embeds=tuple(pick))[0])
        return fr, re

    def largest(vals: list[float]) -> float:
        return max(vals, key=abs) if vals else float("nan")

    rows = []
    first = [i for i in range(nF) if int(fpos[i]) in (p1 - 1, p1)]

    def feature_row(part: str, what: str, nodes: list[int], errors: bool = False, embeds: tuple = ()) -> None:
        if not nodes:  # a graph that left out every feature there: nothing to zero, nothing changes
            rows.append({"part": part, "intervention": what, "n_nodes": 0, "graph_direct": 0.0, "graph_total": 0.0,
                         "frozen": 0.0, "frozen_control_max": float("nan"), "real": 0.0, "real_logprob": 0.0,
                         "real_control_max": float("nan")})
            return
        pred = ablation_prediction(g, nodes)
        if errors:
            frozen = frozen_run(m, rep, linear=True, errors=False, held=left_out).logits
        elif embeds:
            w = torch.ones(g.n_pos)
            w[list(embeds)] = 0
            frozen = frozen_run(m, rep, linear=True, embed=w, held=left_out).logits
        else:
            frozen = _frozen_zeroed(m, rep, active(nodes), held=left_out)
        real, lp = real_change(features=active([i for i in nodes if i < nF]), errors=errors, embeds=embeds)
        if not n_random:
            fr, re = [], []
        elif embeds:
            fr, re = embed_controls(len(embeds))
        else:
            fr, re = controls(len(first) if errors else len(nodes))
        rows.append({"part": part, "intervention": what, "n_nodes": len(nodes),
                     "graph_direct": float(pred["direct_logits"][0]), "graph_total": float(pred["total_logits"][0]),
                     "frozen": frozen_change(frozen), "frozen_control_max": largest(fr), "real": real,
                     "real_logprob": lp, "real_control_max": largest(re)})

    feature_row("read at the first occurrence", f"features at p1-1 and p1 ({len(first)}) zeroed", first)
    feature_row("context", "features at p1 alone zeroed", [i for i in first if int(fpos[i]) == p1])
    feature_row("context", "features at p1-1 alone zeroed", [i for i in first if int(fpos[i]) == p1 - 1])
    current = [i for i in range(nF) if int(fpos[i]) == last]
    feature_row("context", f"current token's features ({len(current)}) zeroed", current)
    emb = nF + g.n_errors
    feature_row("read at the first occurrence: the tokens", "token embeddings at p1-1 and p1 zeroed (controls: "
                "as many embeddings elsewhere)", [emb + p1 - 1, emb + p1], embeds=(p1 - 1, p1))
    errs = list(range(nF, nF + g.n_errors))
    feature_row("context", "every error node zeroed (controls: as many random features as part 1)", errs, errors=True)

    # the induction head's attention from the last position to p1
    li, hi = induction
    cut = cut_attention(rep, li, hi, p1)
    fixed = _demeaned(frozen_run(m, cut).logits, target) - _demeaned(frozen_run(m, rep).logits, target)
    lin = frozen_change(frozen_run(m, cut, linear=True, held=left_out).logits)
    real, lp = real_change(head=(li, hi), key=p1)
    other_f, other_r, other_h = [], [], []
    for layer in range(m.cfg.n_layers):
        for h in range(m.cfg.n_heads):
            if (layer, h) != (li, hi):
                other_f.append(frozen_change(frozen_run(m, cut_attention(rep, layer, h, p1), linear=True,
                                                        held=left_out).logits))
                other_r.append(real_change(head=(layer, h), key=p1)[0])
                other_h.append(head_label(layer, h))
    top = max(range(len(other_r)), key=lambda i: abs(other_r[i])) if other_r else None
    first_nodes = first + [nF + layer * g.n_pos + p for layer in range(g.n_layers) for p in (p1 - 1, p1)] + \
        [nF + g.n_errors + p for p in (p1 - 1, p1)]
    edges = g.adjacency[-1]
    share = float(edges[first_nodes].sum() / edges[:-1].abs().sum())
    rows.append({"part": "moved by the induction head's OV",
                 "intervention": f"{head_label(li, hi)}'s attention last -> p1 set to 0 (largest control: "
                                 f"{other_h[top] if top is not None else '-'})", "n_nodes": 1,
                 "graph_direct": float(edges[first_nodes].sum()), "graph_total": float("nan"), "frozen": lin,
                 "frozen_control_max": largest(other_f), "real": real, "real_logprob": lp,
                 "real_control_max": largest(other_r)})
    nan = float("nan")
    rows.append({"part": "into the logit", "intervention": "the same, every feature held (direct path)",
                 "n_nodes": 1, "graph_direct": nan, "graph_total": nan, "frozen": fixed, "frozen_control_max": nan,
                 "real": nan, "real_logprob": nan, "real_control_max": nan})
    probs = torch.softmax(base_real, -1)
    return {"rows": rows, "graph": g, "target": target, "p1": p1, "last": last,
            "tokens": m.to_str_tokens(rep.tokens.cpu()), "p_target": float(probs[target]),
            "first_share": share, "n_active_features": rep.n_features}
