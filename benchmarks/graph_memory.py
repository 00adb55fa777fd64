"""Attribution-graph memory: the peak resident memory of a fresh process that loads a model and makes one graph with
the default arguments, for prompts of several lengths.

    python benchmarks/graph_memory.py [--models gpt-4 sprout] [--positions 200 300 511] [--threads 1]

Each (model, length) runs in its own child process (``python -c``), so the peak (the child's own ``ru_maxrss``,
``resource.getrusage(RUSAGE_SELF)`` read once the graph is made, before its exactness is checked) is the graph's
alone: Python,
torch, the model, its shipped transcoders and the graph. The prompt is the chapter's story repeated and cut to ``length - 1`` tokens,
``<|endoftext|>`` put first (``length`` positions in all). Prints one line per run: model, positions, the graph's
features kept of those active, peak MiB, seconds.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CHILD = r"""
import json, resource, sys, torch
torch.set_num_threads({threads})
import sprout_interp as si
from sprout_interp.core.texts import TEXTS
m = si.load({model!r})
ids = torch.tensor(m.tokenizer.encode(" ".join([TEXTS["story"]] * 20)).ids[: {positions} - 1])
g = si.attribution_graph(m, ids)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"features": g.n_features, "active": g.info["n_active_features"], "positions": g.n_pos,
                  "max_error": g.max_error() if {check} else float("nan"), "peak_mib": peak}}))
"""


def run(model: str, positions: int, threads: int, check: bool = True) -> dict:
    """One graph in a fresh child process: its result line, peak resident MiB and wall seconds."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD.format(model=model, positions=positions, threads=threads, check=check)],
                         capture_output=True, text=True)
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1], "seconds": time.perf_counter() - t0}
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["seconds"] = time.perf_counter() - t0
    return res


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["gpt-4", "sprout"])
    p.add_argument("--positions", nargs="+", type=int, default=[200, 300, 511])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-check", action="store_true", help="skip max_error() (it may hold the graph twice)")
    a = p.parse_args(argv)
    for model, n in ((m, n) for m in a.models for n in a.positions):
        r = run(model, n, a.threads, not a.no_check)
        if "error" in r:
            print(f"{model:8s} {n:4d} positions: refused or failed: {r['error'][:300]} ({r['seconds']:.1f} s)", flush=True)
        else:
            print(f"{model:8s} {r['positions']:4d} positions: {r['features']:6d} of {r['active']:6d} features, peak "
                  f"{r['peak_mib']:7.0f} MiB, exact to {r['max_error']:.1e}, {r['seconds']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
