"""The transcoder quality table: how well a set of transcoders replaces a model's feed-forwards, on held-out text.

    .venv/bin/python scripts/transcoder_quality.py                                     # Sprout's shipped per-layer set
    .venv/bin/python scripts/transcoder_quality.py --model sprout --folder runs/transcoders/sprout
    .venv/bin/python scripts/transcoder_quality.py --kind clt --folder runs/clt/sprout   # a cross-layer transcoder
        [--n 16] [--length 256] [--max-feature-nodes 2048] [--no-graphs] [--threads 1] [--json FILE]

Three tables, in markdown:

1. per layer (``transcoder_quality`` / ``clt_quality`` on ``--n`` held-out windows of ``--length`` tokens, seed 0):
   width, k, L0 (active features per token), FVE (fraction of the feed-forward output's variance explained, on the
   clean model's inputs), dead features (never active on the sample) and the loss recovered with that layer alone
   replaced;
2. every feed-forward replaced at once, no error terms (``replacement_quality`` / ``clt_replacement_quality``):
   clean, replacement and zeroed losses (nats/token) and the share of the gap recovered;
3. attribution graphs (``si.attribution_graph`` with circuit-tracer's defaults and at most ``--max-feature-nodes``
   feature nodes, as the dashboard's page; 0 keeps every active feature) and their replacement and completeness
   scores (``si.graph_scores``), on the chapter's default prompt (the story cut just before the second " Plax",
   so the logits predict " Pl") and on each held-out name text (``sprout_model.evaluation.HELDOUT_NAME_TEXTS``)
   cut the same way, just before its name's last word comes back; and the seconds each graph took.

A cross-layer transcoder's graph rows are measured when ``si.attribution_graph`` takes one; until then they say
why not. ``--json`` also writes every number to a file.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from sprout_interp.core.arguments import command_line  # noqa: E402
from sprout_interp.core.errors import SproutError  # noqa: E402
from sprout_model.cli import ArgumentParser, Whole  # noqa: E402

#: the name whose second occurrence the chapter's default prompt stops inside
STORY_NAME = "Zorbin Plax"


def cut_before_last_word(text: str, name: str) -> str:
    """``text`` up to (not including) the second occurrence of ``name``'s last word, with its leading space: the
    prompt whose next token starts the copied word ("... Zorbin" -> " Pl"). Raises SproutError when ``name`` does
    not occur twice."""
    first = text.find(name)
    second = text.find(name, first + len(name)) if first >= 0 else -1
    if second < 0:
        raise SproutError(f"{name!r} must occur twice in the text to cut it before its second occurrence")
    words = name.split()
    return text[:second + len(name) - len(words[-1]) - 1] if len(words) > 1 else text[:second].rstrip()


def graph_prompts() -> list[tuple[str, str]]:
    """``(label, prompt text)``: the chapter's default prompt (``TEXTS['story']`` cut before the second " Plax"),
    then each held-out name text cut before its name's last word comes back."""
    from sprout_interp.core.texts import TEXTS
    from sprout_model.evaluation import HELDOUT_NAME_TEXTS

    out = [("story (default prompt)", cut_before_last_word(TEXTS["story"], STORY_NAME))]
    out += [(f"held-out: {name}", cut_before_last_word(text, name)) for name, text in HELDOUT_NAME_TEXTS]
    return out


def layer_table(m, kind: str, ts, n: int = 16, length: int = 256, tokens=None) -> pd.DataFrame:
    """Per layer: ``layer, block, d_transcoder, k, n_tokens, l0, fve, dead, loss_recovered`` on ``n`` held-out
    windows of ``length`` (or on ``tokens``)."""
    if kind == "plt":
        from sprout_interp.features.transcoder_metrics import transcoder_quality

        q = transcoder_quality(m, ts, tokens=tokens, n=n, length=length)
    else:
        from sprout_interp.features.clt_metrics import clt_quality

        q = clt_quality(m, ts, tokens=tokens, n=n, length=length)
        q["k"] = float("nan")  # a JumpReLU: no fixed k, its L0 says how many fire
    return q[["layer", "block", "d_transcoder", "k", "n_tokens", "l0", "fve", "dead", "loss_recovered"]]


def replaced_at_once(m, kind: str, ts, n: int = 16, length: int = 256, tokens=None) -> dict:
    """Every feed-forward replaced at once (no error terms), on ``n`` held-out windows (or ``tokens``):
    ``n_tokens, ce_clean, ce_replacement, ce_mlp_zero, gap_recovered`` (nats/token; a fraction)."""
    if kind == "plt":
        from sprout_interp.features.transcoder_metrics import replacement_quality

        q = replacement_quality(m, ts, tokens=tokens, n=n, length=length)
    else:
        from sprout_interp.features.clt_metrics import clt_replacement_quality

        q = clt_replacement_quality(m, ts, tokens=tokens, n=n, length=length)
    return {k: q[k] for k in ("n_tokens", "ce_clean", "ce_replacement", "ce_mlp_zero", "gap_recovered")}


def graph_table(m, ts, max_feature_nodes: int | None, prompts: list[tuple[str, str]] | None = None) -> pd.DataFrame:
    """One row per prompt (``(label, text or token ids)``; :func:`graph_prompts` by default): ``prompt,
    positions, active_features, feature_nodes, replacement, completeness, seconds`` (the graph's own time, this machine, informative);
    ``note`` says why a row was not measured (a transcoder kind the graph does not take)."""
    import sprout_interp as si

    rows = []
    for label, text in prompts or graph_prompts():
        ids = text if isinstance(text, torch.Tensor) else m.to_tokens(text, truncate=True)[0]
        row = {"prompt": label, "positions": int(ids.shape[-1])}
        t0 = time.perf_counter()
        try:
            g = si.attribution_graph(m, ids, ts, max_feature_nodes=max_feature_nodes)
        except SproutError as e:  # e.g. a CLT before the graph takes one: said in the row, not hidden
            rows.append({**row, "note": str(e).splitlines()[0][:160]})
            continue
        secs = time.perf_counter() - t0
        replacement, completeness = si.graph_scores(g)
        row["positions"] = g.n_pos  # <|endoftext|> put first by the graph
        rows.append({**row, "active_features": int(g.info["n_active_features"]), "feature_nodes": int(g.n_features),
                     "replacement": replacement, "completeness": completeness, "seconds": secs, "note": ""})
    return pd.DataFrame(rows)


def _load(m, kind: str, folder: str | None):
    if kind == "plt":
        from sprout_interp.features.transcoder import load_transcoders

        return load_transcoders(m, folder)
    from sprout_interp.features.clt import load_clt

    return load_clt(m, folder)


def _md(df: pd.DataFrame, floats: dict[str, str]) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" if c in floats else "---" for c in cols) + "|"]
    for r in df.to_dict("records"):
        cells = []
        for c in cols:
            v = r[c]
            if c in floats and isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
                cells.append(format(v, floats[c]))
            else:
                cells.append("" if isinstance(v, float) and math.isnan(v) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@command_line
def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sprout", help="a shipped name or a checkpoint path")
    p.add_argument("--kind", choices=("plt", "clt"), default="plt", help="per-layer transcoders or a cross-layer one")
    p.add_argument("--folder", default=None, help="the set's folder (default: the one shipped beside the checkpoint)")
    p.add_argument("--n", type=Whole(1), default=16, help="held-out windows for the per-layer and replaced-at-once rows")
    p.add_argument("--length", type=Whole(2), default=256, help="tokens per held-out window")
    p.add_argument("--max-feature-nodes", type=Whole(0), default=2048,
                   help="feature nodes each graph keeps (the dashboard's 2048; 0: every active feature)")
    p.add_argument("--no-graphs", action="store_true", help="skip the attribution graphs")
    p.add_argument("--threads", type=Whole(1), default=1, help="torch CPU threads")
    p.add_argument("--json", default=None, help="also write every number to this file")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from sprout_interp.core.hooked import load_hooked

    m = load_hooked(a.model)
    ts = _load(m, a.kind, a.folder)
    where = a.folder or "shipped"
    layers = layer_table(m, a.kind, ts, a.n, a.length)
    print(f"## {m.name} {a.kind} ({where}): per layer, {int(layers['n_tokens'].iloc[0]):,} held-out tokens\n")
    print(_md(layers.drop(columns="n_tokens"), {"l0": ".1f", "fve": ".3f", "loss_recovered": ".3f"}) + "\n", flush=True)
    whole = replaced_at_once(m, a.kind, ts, a.n, a.length)
    print("## every feed-forward replaced at once (no error terms)\n")
    print(_md(pd.DataFrame([whole]), {"ce_clean": ".4f", "ce_replacement": ".4f", "ce_mlp_zero": ".4f",
                                      "gap_recovered": ".3f"}) + "\n", flush=True)
    out = {"model": m.name, "kind": a.kind, "folder": where, "n": a.n, "length": a.length,
           "layers": layers.to_dict("records"), "replaced_at_once": whole}
    if not a.no_graphs:
        graphs = graph_table(m, ts, a.max_feature_nodes or None)
        print(f"## attribution graphs (at most {a.max_feature_nodes or 'every'} feature nodes)\n")
        print(_md(graphs, {"replacement": ".3f", "completeness": ".3f", "seconds": ".1f"}) + "\n")
        ok = graphs.dropna(subset=["replacement"]) if "replacement" in graphs else graphs.iloc[:0]
        held = ok[ok["prompt"].str.startswith("held-out")]
        if len(held):
            print(f"held-out name texts, mean: replacement {held['replacement'].mean():.3f}, completeness "
                  f"{held['completeness'].mean():.3f}")
        out["graphs"] = graphs.to_dict("records")
        out["max_feature_nodes"] = a.max_feature_nodes
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
