"""QK-attribution speed: one head-cell attribution (with and without transcoders) and the head loadings of a whole
pruned graph, beside the attribution graph's own time, interleaved; and the two ways to get the bilinear table's
component vectors (a forward push of each kept component against a Jacobian: one backward per d_head direction).

    python benchmarks/qk_attribution.py [--model sprout] [--reps 5] [--threads 1] [--layer 1] [--head 0] [--kind clt]

The chapter's default prompt (the story up to its second "Zorbin", as the attribution-graph page opens on), the
head's cell at its last position looking at the token after the first occurrence of the last token (the induction
cell), with the shipped per-layer transcoders and, where the model ships one, its cross-layer transcoder. The graph:
``si.attribution_graph`` with the shipped transcoders of ``--kind`` (per-layer by default) and circuit-tracer's
defaults (every active feature), the loadings: ``si.head_loadings`` over the edges ``prune_graph`` keeps (default
thresholds), the graph given. Prints medians (``benchmarks/timing.py``), the sizes, and the largest exactness errors.

On a shared machine, one thread is the honest setting (``--threads``).
"""
from __future__ import annotations

import argparse
import time

import torch
from timing import interleaved, medians, ratio_table

import sprout_interp as si
from sprout_interp.circuits.carriers import carried_backward, carried_forward, frozen_maps, mlp_replacement, node_writes
from sprout_interp.circuits.graphs import prune_graph
from sprout_interp.circuits.local_replacement import shipped_kinds
from sprout_interp.circuits.qk_attribution import qk_maps
from sprout_interp.core.texts import TEXTS
from sprout_interp.features.clt import load_clt


def default_prompt() -> str:
    story = TEXTS["story"]
    return story[:story.index(" Plax", story.index(" Plax") + 1)]


def induction_cell(m, text: str) -> tuple[int, int]:
    ids = m.prepare_input(text)[0][0]
    first = int((ids[:-1] == ids[-1]).nonzero()[0, 0])
    return ids.numel() - 1, first + 1


def push_against_jacobian(m, text: str, layer: int, head: int, i: int, j: int, n: int, reps: int) -> str:
    """The key side's n largest components' d_head vectors both ways, timed interleaved, and their largest gap."""
    a = si.qk_attribution(m, text, layer, head, i, j, n_components=n)
    tokens = a.tokens
    rep = mlp_replacement(m, tokens)
    maps = qk_maps(m, layer, head, tokens, i, j)
    bw = frozen_maps(m, rep)
    kept = a.key_components.iloc[:n]
    nodes = torch.tensor(kept["node"].to_numpy(), dtype=torch.long)

    via_l = torch.tensor(kept["via_layer"].fillna(-1).to_numpy(dtype="int64"))
    via_h = torch.tensor(kept["via_head"].fillna(0).to_numpy(dtype="int64"))
    H = m.cfg.n_heads

    def push():
        row, origin, pos, vecs = node_writes(bw, rep, nodes, layer)
        out = carried_forward(bw, layer, j, origin, pos, vecs, via_l[row], via_h[row])
        return torch.zeros(n, out.shape[1]).index_add_(0, row, out) @ maps["MK"]

    def jacobian():
        c = carried_backward(bw, rep, layer, False, torch.full((m.cfg.d_head,), j), maps["MK"].T.contiguous())
        g = torch.where(via_l < 0, torch.full_like(via_l, c.nodes.shape[0] - 1), via_l * H + via_h)
        return c.nodes[g, :, nodes]  # (n, d_head)

    times, res = interleaved({"push": push, "jacobian": jacobian}, reps, warmup=True)
    gap = float((res["push"] - res["jacobian"]).abs().max())
    return (ratio_table(times, "push", {"push": f"forward push of {n} components",
                                        "jacobian": f"Jacobian ({m.cfg.d_head} directions)"})
            + f"\nlargest gap between the two: {gap:.1e}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sprout")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--layer", type=int, default=1)
    p.add_argument("--head", type=int, default=0)
    p.add_argument("--warmup", action="store_true", help="run each variant once, untimed, first")
    p.add_argument("--kind", choices=["per_layer", "clt"], default="per_layer",
                   help="the transcoders of the graph and its head loadings")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    m = si.load(a.model)
    ts = si.sae.load_transcoders(m)
    clt = load_clt(m) if "clt" in shipped_kinds(m) else None
    gts = clt if a.kind == "clt" else ts
    text = default_prompt()
    i, j = induction_cell(m, text)
    L = m.cfg.n_layers
    t0 = time.perf_counter()
    g = si.attribution_graph(m, text, gts)
    pruned = prune_graph(g)
    print(f"{a.model}, {a.threads} thread(s); prompt of {i + 1} tokens; cell: block {a.layer + 1} head {a.head} "
          f"(layer {a.layer}), query {i}, key {j}; graph {g} ({time.perf_counter() - t0:.1f} s to make), "
          f"{int(pruned.edge_mask.sum())} edges kept by prune_graph")
    variants = {
        "cell": lambda: si.qk_attribution(m, text, a.layer, a.head, i, j),
        "cell_tc": lambda: si.qk_attribution(m, text, a.layer, a.head, i, j, ts),
        "cell_last": lambda: si.qk_attribution(m, text, L - 1, a.head, i, j, ts),
        "graph": lambda: si.attribution_graph(m, text, gts),
        "loadings": lambda: si.head_loadings(m, g, pruned, gts),
    }
    labels = {"cell": "one cell, feed-forward outputs", "cell_tc": "one cell, per-layer transcoders",
              "cell_last": f"one cell of the last block ({L}), per-layer transcoders",
              "graph": f"the attribution graph ({a.kind})", "loadings": f"head loadings of the pruned graph's edges ({a.kind})"}
    if clt is not None:
        variants.update(cell_clt=lambda: si.qk_attribution(m, text, a.layer, a.head, i, j, clt),
                        cell_last_clt=lambda: si.qk_attribution(m, text, L - 1, a.head, i, j, clt))
        labels.update(cell_clt="one cell, cross-layer transcoder",
                      cell_last_clt=f"one cell of the last block ({L}), cross-layer transcoder")
    times, res = interleaved(variants, a.reps, warmup=a.warmup, progress=True)
    sizes = {k: f"{len(r.key_components) + len(r.query_components)} component rows" for k, r in res.items()
             if k.startswith("cell")}
    sizes["graph"] = f"{g.n_features} features"
    sizes["loadings"] = f"{len(res['loadings'])} (edge, head) rows"
    print(ratio_table(times, "graph", labels, {"header": "size", **sizes}))
    med = medians(times)
    print(f"one cell: {med['cell']:.2f} s without transcoders, {med['cell_tc']:.2f} s with (aim: under 1 s)")
    for k in [k for k in res if k.startswith("cell")]:
        r = res[k]
        err = max(abs(float(r.key_components["value"].sum()) - r.score),
                  abs(float(r.query_components["value"].sum()) - r.score), abs(float(r.terms["term"].sum()) - r.score))
        print(f"{labels[k]}: score {r.score:.3f}, largest gap of a sum to it < 1e-4: {err < 1e-4}")
    lo = res["loadings"]
    s = lo.groupby(["target", "source"])["value"].sum()
    edge = lo.groupby(["target", "source"])["edge"].first()
    print(f"head loadings: {lo.attrs['n_edges']} edges, largest gap of an edge's parts to it < 1e-5: "
          f"{float((s - edge).abs().max()) < 1e-5}")
    print(push_against_jacobian(m, text, a.layer, a.head, i, j, 12, a.reps))


if __name__ == "__main__":
    main()
