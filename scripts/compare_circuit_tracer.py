"""Our attribution graphs against circuit-tracer's, on the same model, transcoders and token ids.

    bash scripts/setup_circuit_tracer.sh           # once: .venv-ct with circuit-tracer 0.5.0
    .venv/bin/python scripts/compare_circuit_tracer.py [--models gpt-4 sprout] [--prompts zorbin dialogue description]
        [--kinds per_layer clt] [--clt auto|random|shipped] [--bench-models sprout] [--bench-seq 64] [--reps 3]
        [--threads 1] [--batch-size 64] [--no-bench] [--json FILE]

For each model: ``to_hf()``'s export (``save_pretrained``; its tokenizer config names ``PreTrainedTokenizerFast``,
which circuit-tracer's transformers 4.57 can load, and its config gains a top-level ``rope_theta``, which 4.57
reads) and the model's shipped transcoders (float32, ``layer_{i}.safetensors`` + ``config.yaml``) go to a
temporary folder; ``scripts/circuit_tracer_worker.py`` runs under ``.venv-ct/bin/python`` (``HF_HUB_OFFLINE=1``),
loads circuit-tracer's ``ReplacementModel`` (nnsight backend) with them once, and calls ``attribute`` on the ids
we send. Both sides get the same ids, ``<|endoftext|>`` (id 0) first: circuit-tracer keeps a special token it
finds at position 0 and zeroes the features there, which is our ``bos=True``.

Two kinds of transcoders (``--kinds``): the model's shipped per-layer transcoders, and a cross-layer transcoder
(``--clt``: ``shipped``, the model's ``<checkpoint>/clt/``; ``random``, a seeded random CLT,
``local_replacement.random_clt(m, seed=0)``; ``auto``, the shipped one where the model has one, else the random
one), saved float32 in circuit-tracer's CLT layout and read by circuit-tracer's own ``load_clt``; each kind in a
worker of its own.

Per prompt: circuit-tracer's nodes are matched to ours by key (features by (layer, pos, feature), error nodes
by (layer, pos), embeddings by pos, logits by token id) and the table reports the largest |difference| of the
two adjacency matrices over the matched nodes (and the largest |edge|, for scale, and their ratio), whether the
sets of active features and of logit tokens are equal, the replacement and completeness scores from ``graph_scores``
and circuit-tracer's ``compute_graph_scores``, and ``cut_margin``: how far the prompt's active sets are from a tie
(per-layer TopK: the smallest gap between a position's k-th and (k+1)-th pre-activation; CLT JumpReLU: the smallest
``|pre-activation - threshold|``), so float rounding cannot decide which features are nodes.

Benchmark: a seeded random prompt of ``--bench-seq`` tokens plus ``<|endoftext|>`` (the one
``benchmarks/attribution_graph.py`` times), our ``si.attribution_graph`` and circuit-tracer's ``attribute`` (the
worker's model already loaded), interleaved: each repetition times one of each and the reference matrix product
of ``benchmarks/attribution_graph.py``; medians, the ratio, and the multiply-add floor beside them (our graph's
counted multiply-adds at the reference rate; ``graph_macs``' lower bound for circuit-tracer's). Both processes
run ``--threads`` torch threads on the same CPU, one after the other.

Prints markdown tables; ``--json`` also writes every number to a file (the acceptance test reads it).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch

import sprout_interp as si
from sprout_interp.circuits.attribution_graph import graph_macs
from sprout_interp.circuits.graphs import AttributionGraph, graph_scores
from sprout_interp.circuits.local_replacement import local_replacement, prompt_tokens, random_clt
from sprout_interp.core.arguments import command_line
from sprout_interp.core.texts import TEXTS
from sprout_interp.features.clt import CrossLayerTranscoder, clt_folder, load_clt, save_clt
from sprout_interp.features.transcoder import load_transcoders, save_transcoders
from sprout_model.cli import ArgumentParser, Whole

ROOT = Path(__file__).resolve().parent.parent
CT_PYTHON = ROOT / ".venv-ct" / "bin" / "python"
WORKER = Path(__file__).resolve().parent / "circuit_tracer_worker.py"


def _benchmark_module():
    """benchmarks/attribution_graph.py, whose reference product the floor uses (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("benchmark_attribution_graph", ROOT / "benchmarks" /
                                                  "attribution_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def second_zorbin() -> str:
    """The chapter's "Zorbin Plax" text up to the second "Zorbin" (the graph reads what comes next: " Plax")."""
    s = TEXTS["story"]
    second = s.index("Zorbin", s.index("Zorbin") + 1)
    return s[:second + len("Zorbin")]


PROMPTS = {
    "zorbin": second_zorbin,
    "dialogue": lambda: TEXTS["dialogue"][:120],
    "description": lambda: TEXTS["description"][:120],
    "short": lambda: "Zorbin Plax came home. Zorbin",
}


def export(m, ts, folder: Path) -> tuple[Path, Path]:
    """``to_hf()``'s export and ``ts`` (float32) in ``folder``, readable by circuit-tracer's transformers 4.57.
    Returns (model folder, transcoder folder)."""
    mdir, tdir = folder / "model", folder / "transcoders"
    hf, tok = m.to_hf()
    hf.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    cfg_path = mdir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("rope_theta", float(m.cfg.rotary_base))  # transformers 4.57 reads rope_theta, not rope_parameters
    cfg.setdefault("torch_dtype", "float32")
    cfg_path.write_text(json.dumps(cfg, indent=1))
    tcfg_path = mdir / "tokenizer_config.json"
    tcfg = json.loads(tcfg_path.read_text())
    tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # transformers 5 writes TokenizersBackend
    tcfg_path.write_text(json.dumps(tcfg, indent=1))
    if isinstance(ts, CrossLayerTranscoder):
        save_clt(ts, tdir, dtype=torch.float32)
    else:
        save_transcoders(ts, tdir, dtype=torch.float32)
    return mdir, tdir


def kind_transcoders(m, kind: str, clt: str = "auto") -> tuple:
    """(the transcoders of ``kind`` for model ``m``, where they come from): the shipped per-layer set; or a CLT,
    the shipped one (``clt="shipped"``, or ``"auto"`` where there is one) or a seeded random one."""
    if kind == "per_layer":
        return load_transcoders(m), "shipped"
    if clt == "shipped" or (clt == "auto" and (clt_folder(m) / "config.yaml").is_file()):
        return load_clt(m), "shipped"
    return random_clt(m, seed=0), "random (seed 0)"


def cut_margin(m, ids: torch.Tensor, ts) -> float:
    """How far the prompt's active features are from a tie, in pre-activation units, over every position that
    holds features (position 0 has none: ``bos``): per-layer TopK, the smallest gap between a position's k-th
    and (k+1)-th largest pre-activation; a CLT's JumpReLU, the smallest ``|pre-activation - threshold|``."""
    rep = local_replacement(m, ids, ts, bos=True, cross_layer=True)
    gaps = []
    with torch.no_grad():
        for i in range(m.cfg.n_layers):
            x = rep.mlp_in[i, 1:]
            if isinstance(ts, CrossLayerTranscoder):
                gaps.append((ts.pre_acts(i, x) - ts.threshold[i]).abs().min())
            else:
                tc = ts[i]
                top = tc.pre_acts(x).topk(tc.k + 1, dim=-1).values
                gaps.append((top[:, -2] - top[:, -1]).min())
    return float(torch.stack(gaps).min())


class Worker:
    """circuit-tracer in its own process (``.venv-ct``), model loaded once; stopped on leaving the ``with``."""

    def __init__(self, model_folder: Path, tc_folder: Path, out: Path, threads: int, timeout: float = 1800):
        if not CT_PYTHON.exists():
            raise SystemExit(f"{CT_PYTHON} is missing: run `bash scripts/setup_circuit_tracer.sh` first")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONNOUSERSITE="1")
        env.pop("PYTHONPATH", None)
        self.timeout = timeout
        self.proc = subprocess.Popen([str(CT_PYTHON), str(WORKER), str(model_folder), str(tc_folder), str(out),
                                      "--threads", str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=sys.stderr, text=True, env=env, cwd=str(out))
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the circuit-tracer worker ended (exit code {self.proc.wait()}); its errors are above")
        return json.loads(line)

    def attribute(self, name: str, ids: torch.Tensor, batch_size: int, max_n_logits: int = 10,
                  desired_logit_prob: float = 0.95, max_feature_nodes: Optional[int] = None,
                  save: bool = True) -> dict:
        self.proc.stdin.write(json.dumps({"name": name, "ids": ids.tolist(), "batch_size": batch_size,
                                          "max_n_logits": max_n_logits, "desired_logit_prob": desired_logit_prob,
                                          "max_feature_nodes": max_feature_nodes, "save": save}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def node_keys(g: AttributionGraph) -> list[tuple]:
    """One key per node of our graph, in its order: ("f", layer, pos, feature), ("e", layer, pos), ("t", pos),
    ("l", token id)."""
    df = g.nodes
    out = []
    for kind, layer, pos, feat, tok in zip(df["kind"], df["layer"], df["pos"], df["feature"], df["token_id"]):
        out.append({"feature": ("f", layer, pos, feat), "error": ("e", layer, pos), "embedding": ("t", pos),
                    "logit": ("l", tok)}[kind])
    return out


def ct_node_keys(ct: dict, n_layers: int) -> list[tuple]:
    """The same keys for circuit-tracer's graph (its order: selected features, errors by layer then pos, token
    embeddings, logits)."""
    T = int(ct["input_tokens"].numel())
    feats = ct["active_features"][ct["selected_features"]].tolist()
    return ([("f", *f) for f in feats] + [("e", layer, p) for layer in range(n_layers) for p in range(T)]
            + [("t", p) for p in range(T)] + [("l", int(t)) for t in ct["logit_ids"]])


def compare(ours: AttributionGraph, ct: dict, ct_scores: tuple[float, float]) -> dict:
    """Our graph against circuit-tracer's (tensors of the worker's file): matched by node key."""
    ka, kb = node_keys(ours), ct_node_keys(ct, ours.n_layers)
    fa, fb = {k for k in ka if k[0] == "f"}, {k for k in kb if k[0] == "f"}
    la, lb = [k[1] for k in ka if k[0] == "l"], [k[1] for k in kb if k[0] == "l"]
    ib = {k: i for i, k in enumerate(kb)}
    common = [(i, ib[k]) for i, k in enumerate(ka) if k in ib]
    ia = torch.tensor([i for i, _ in common])
    jb = torch.tensor([j for _, j in common])
    A = ours.adjacency[ia][:, ia].double()
    B = ct["adjacency"][jb][:, jb].double()
    diff = (A - B).abs()
    worst = int(diff.argmax()) if diff.numel() else 0
    r, c = divmod(worst, diff.shape[1]) if diff.numel() else (0, 0)
    ours_scores = graph_scores(ours)
    return {
        "positions": ours.n_pos, "same_tokens": bool(torch.equal(ours.tokens.long(), ct["input_tokens"].long())),
        "features": len(fa), "ct_features": len(fb), "same_features": fa == fb,
        "logits": la, "ct_logits": lb, "same_logits": la == lb, "same_nodes": ka == kb,
        "n_nodes": len(ka), "ct_n_nodes": len(kb), "matched": len(common),
        "max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
        "worst_edge": [str(ka[ia[r]]), str(ka[ia[c]])],
        "max_abs_edge": float(B.abs().max()) if B.numel() else 0.0,
        "max_rel_diff": float(diff.max() / B.abs().max()) if B.numel() and float(B.abs().max()) > 0 else 0.0,
        "max_abs_diff_features": float(diff[:, :len(fa)].max()) if len(fa) else 0.0,
        "replacement": ours_scores[0], "completeness": ours_scores[1],
        "ct_replacement": ct_scores[0], "ct_completeness": ct_scores[1],
    }


def _read_ct(path: str) -> dict:
    from safetensors.torch import load_file

    return load_file(path)


def compare_model(name: str, prompts: list[str], threads: int, batch_size: int, bench_seq: Optional[int],
                  reps: int, workdir: Path, max_feature_nodes: Optional[int] = None, kind: str = "per_layer",
                  clt: str = "auto") -> tuple[list[dict], Optional[dict]]:
    """Every prompt's comparison on model ``name`` with transcoders of ``kind`` (:func:`kind_transcoders`), and
    (with ``bench_seq``) the timing of a ``bench_seq``-token prompt. With ``max_feature_nodes`` the prompts' graphs
    keep that many features, chosen as circuit-tracer chooses them (its ``update_interval`` of 4 batches is our
    ``rerank_every = 4 * batch_size``). Returns (rows, benchmark or None)."""
    m = si.load(name)
    ts, source = kind_transcoders(m, kind, clt)
    folder = workdir / f"{name}-{kind}"
    folder.mkdir(parents=True, exist_ok=True)
    mdir, tdir = export(m, ts, folder)
    rows, bench = [], None
    with Worker(mdir, tdir, folder, threads) as w:
        for key in prompts:
            ids = prompt_tokens(m, PROMPTS[key](), bos=True)
            ans = w.attribute(f"{name}-{kind}-{key}", ids, batch_size, max_feature_nodes=max_feature_nodes)
            t0 = time.perf_counter()
            g = si.attribution_graph(m, ids, ts, bos=True, batch_size=batch_size, max_feature_nodes=max_feature_nodes,
                                     rerank_every=4 * batch_size)
            ours_s = time.perf_counter() - t0
            row = {"model": name, "kind": kind, "transcoders": source, "prompt": key,
                   "max_feature_nodes": max_feature_nodes, **compare(g, _read_ct(ans["file"]), ans["scores"]),
                   "ours_s": ours_s, "ct_s": ans["seconds"], "exactness": g.max_error(),
                   "graph_kind": g.transcoder_kind, "cut_margin": cut_margin(m, ids, ts)}
            rows.append(row)
        if bench_seq:
            bench = benchmark(m, ts, w, bench_seq, reps, batch_size)
            bench["model"], bench["kind"] = name, kind
        bench_info = w.info
    for r in rows:
        r["ct_torch"] = bench_info.get("torch")
    return rows, bench


def benchmark(m, ts, w: Worker, seq: int, reps: int, batch_size: int) -> dict:
    """Ours against circuit-tracer's on one seeded random ``seq``-token prompt, interleaved, with the floor."""
    bm = _benchmark_module()
    prompt = torch.randint(1, m.cfg.d_vocab, (seq,), generator=torch.Generator().manual_seed(0))
    ids = prompt_tokens(m, prompt, bos=True)
    ours_t, ct_t, rates, g = [], [], [], None
    w.attribute("warm-up", ids[:8], batch_size, save=False)
    for _ in range(reps):
        ct_t.append(w.attribute("bench", ids, batch_size, save=False)["seconds"])
        t0 = time.perf_counter()
        g = si.attribution_graph(m, ids, ts, bos=True, batch_size=batch_size)
        ours_t.append(time.perf_counter() - t0)
        rates.append(bm.reference_rate(m.cfg.d_model))
    skip = False if isinstance(ts, CrossLayerTranscoder) else ts[ts.layers[0]].has_skip
    est = graph_macs(m.cfg.n_layers, m.cfg.d_model, m.cfg.n_heads, g.n_pos,
                     g.n_features / (m.cfg.n_layers * (g.n_pos - 1)), skip, g.n_logits)
    rate = statistics.median(rates)
    ours, ct = statistics.median(ours_t), statistics.median(ct_t)
    return {"seq": seq, "positions": g.n_pos, "features": g.n_features, "logits": g.n_logits, "reps": reps,
            "threads": torch.get_num_threads(), "batch_size": batch_size, "ours_s": ours, "ct_s": ct,
            "ratio": ours / ct, "ours_times": ours_t, "ct_times": ct_t, "macs": g.info["macs"],
            "rate": rate, "floor_s": g.info["macs"] / rate, "ct_macs": est["circuit_tracer"],
            "ct_floor_s": est["circuit_tracer"] / rate, "macs_ratio": g.info["macs"] / est["circuit_tracer"]}


def tables(rows: list[dict], benches: list[dict]) -> str:
    out = ["| model | transcoders | prompt | positions | features (ours / circuit-tracer) | same features | "
           "logit tokens (same) | max abs difference | largest edge | relative | tie margin | replacement (ours / "
           "circuit-tracer) | completeness (ours / circuit-tracer) |",
           "|---|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['model']} | {r.get('kind', 'per_layer')} ({r.get('transcoders', 'shipped')}) | "
                   f"{r['prompt']} | {r['positions']} | {r['features']:,} / {r['ct_features']:,} "
                   f"| {'yes' if r['same_features'] else 'no'} | {len(r['logits'])} "
                   f"({'yes' if r['same_logits'] else 'no'}) | {r['max_abs_diff']:.1e} | {r['max_abs_edge']:.3g} | "
                   f"{r['max_rel_diff']:.1e} | {r['cut_margin']:.1e} | "
                   f"{r['replacement']:.4f} / {r['ct_replacement']:.4f} | "
                   f"{r['completeness']:.4f} / {r['ct_completeness']:.4f} |")
    if benches:
        out += ["", "| model (transcoders) | prompt | features | ours s (median) | circuit-tracer s (median) | ours / circuit-tracer "
                "| our multiply-adds | floor s | circuit-tracer multiply-adds (lower bound) | its floor s |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for b in benches:
            out.append(f"| {b['model']} ({b.get('kind', 'per_layer')}) | {b['seq']} tokens + <\\|endoftext\\|> | "
                       f"{b['features']:,} | {b['ours_s']:.2f} "
                       f"| {b['ct_s']:.2f} | {b['ratio']:.3f} | {b['macs']:.3g} | {b['floor_s']:.2f} | "
                       f"{b['ct_macs']:.3g} | {b['ct_floor_s']:.2f} |")
    return "\n".join(out)


@command_line
def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["gpt-4", "sprout"])
    p.add_argument("--prompts", nargs="+", default=["zorbin", "dialogue", "description"], choices=sorted(PROMPTS))
    p.add_argument("--bench-models", nargs="+", default=["sprout"], help="the models the benchmark times (of --models)")
    p.add_argument("--bench-seq", type=Whole(1), default=64)
    p.add_argument("--reps", type=Whole(1), default=3)
    p.add_argument("--threads", type=Whole(1), default=1)
    p.add_argument("--batch-size", type=Whole(1), default=64, help="target rows per backward pass, both sides")
    p.add_argument("--max-feature-nodes", type=Whole(1), default=None,
                   help="keep this many features in the prompts' graphs, both sides (default: every active one)")
    p.add_argument("--kinds", nargs="+", default=["per_layer", "clt"], choices=["per_layer", "clt"],
                   help="which transcoders: the shipped per-layer set, a cross-layer transcoder (see --clt)")
    p.add_argument("--clt", default="auto", choices=["auto", "random", "shipped"],
                   help="the CLT: the model's shipped one, a seeded random one, or the shipped one where there is one")
    p.add_argument("--no-bench", action="store_true")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    rows, benches = [], []
    with tempfile.TemporaryDirectory(prefix="sprout-ct-") as tmp:
        for name in a.models:
            for kind in a.kinds:
                bench_seq = None if a.no_bench or name not in a.bench_models else a.bench_seq
                r, b = compare_model(name, a.prompts, a.threads, a.batch_size, bench_seq, a.reps, Path(tmp),
                                     a.max_feature_nodes, kind, a.clt)
                rows += r
                if b:
                    benches.append(b)
    print(f"torch threads {a.threads}, batch size {a.batch_size}; circuit-tracer 0.5.0 (nnsight backend, float32, "
          f"CPU) under {rows[0]['ct_torch'] if rows else '?'}")
    print(tables(rows, benches))
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "benchmarks": benches}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
