"""Feature labels: the time to label a graph's few hundred features, measured (one forward over the held-out sample
for all of them) and read from the shipped labels.json, and to label every node of the default prompt's graph.

    python benchmarks/feature_labels.py [--model sprout] [--n 300] [--reps 2] [--threads 2]

The features are ``--n`` (layer, feature) pairs drawn with seed 0 from the model's shipped per-layer transcoders;
the two variants run interleaved (benchmarks/timing.py) and the medians are printed, then the graph of the chapter's
story up to the second "Zorbin" (as docs/attribution_graphs.md makes it) is labelled once, from the file.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved, medians  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="sprout")
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    import sprout_interp as si
    from sprout_interp.core.texts import TEXTS
    from sprout_interp.features.transcoder import load_transcoders

    m = si.load(a.model)
    ts = load_transcoders(m)
    g = torch.Generator().manual_seed(0)
    d = ts[ts.layers[0]].d_transcoder
    pairs = [(ts.layers[int(i)], int(f)) for i, f in zip(torch.randint(0, len(ts), (a.n,), generator=g),
                                                          torch.randint(0, d, (a.n,), generator=g))]
    times, results = interleaved({
        "measured": lambda: si.feature_labels(m, ts, pairs, use_file=False),
        "file": lambda: si.feature_labels(m, ts, pairs),
    }, reps=a.reps)
    med = medians(times)
    same = (results["measured"]["label"].values == results["file"]["label"].values).mean()
    print(f"{a.model}: {a.n} features, median of {a.reps}: measured {med['measured']:.1f} s, from "
          f"{results['file'].attrs['source']} {med['file']:.2f} s; labels equal {same:.0%}")
    story = TEXTS["story"]
    graph = si.attribution_graph(m, story[:story.index(" Plax", story.index(" Plax") + 1)], ts)
    t = time.perf_counter()
    labels = si.graph_labels(graph, m, ts)
    print(f"graph_labels of the default prompt's graph ({graph.n_features} features, {len(labels)} nodes): "
          f"{time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    main()
