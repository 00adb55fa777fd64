"""Compute the dashboard's slowest answers once per shipped checkpoint and write them beside it.

    .venv/bin/python scripts/precompute_dashboard.py                    # every installed shipped checkpoint
    .venv/bin/python scripts/precompute_dashboard.py gpt-4 runs/my/checkpoint

Writes ``<checkpoint folder>/dashboard.json``: every head's scores that rank the induction circuit, the circuit
confirmed by mean ablation, each head's part in copying, each head's OV copying scores, the logit and tuned lens
over the three ready-made texts, the patching page's default pair patched at both sites, and every SAE latent's
description (dashboards/precomputed.py, the functions the dashboard itself calls), stamped with the checkpoint's
fingerprint, the sha256 of its tuned lens and SAE files, and the settings. The dashboard reads it only when all
match the loaded model; after retraining a checkpoint, its lens or an SAE, run this again (until then the
dashboard computes). About 5 minutes for Sprout on a 2-core CPU, seconds for gpt-1 and gpt-4.

Also writes ``<checkpoint folder>/graph_view.json``, the Attribution graph page's first view of the default text
(node table, influence, scores, the pruned graph, labels), stamped with the checkpoint's fingerprint and the sha256
of the transcoders it was computed over: after shipping new transcoders, ``--graph-only`` rewrites just it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "dashboards"))
import precomputed  # noqa: E402

from sprout_interp.core.arguments import command_line  # noqa: E402
from sprout_model.cli import ArgumentParser  # noqa: E402


@command_line
def main(argv=None) -> int:
    from sprout_interp.core import loading

    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="shipped names or checkpoint paths (default: every installed shipped one)")
    ap.add_argument("--graph-only", action="store_true",
                    help=f"write only {precomputed.GRAPH_FILE} (the Attribution graph page's first view): after "
                         "shipping new transcoders")
    a = ap.parse_args(argv)
    names = a.models or [n for n in loading.SHIPPED if (Path(loading.SHIPPED_DIR) / n / "model.safetensors").is_file()]
    if not names:
        print("no shipped checkpoint is installed and none was named", file=sys.stderr)
        return 2
    import sprout_interp as si

    for name in names:
        m = si.load(name)
        t = time.perf_counter()
        view = precomputed.write_graph_view(m)
        print(f"{name}: " + ("no transcoders, no graph view" if view is None else
                             f"{view} ({view.stat().st_size / 1024:.0f} kB, {time.perf_counter() - t:.0f} s)"))
        if a.graph_only:
            continue
        t = time.perf_counter()
        data = precomputed.build(m, progress=lambda step: print(f"{name}: {step}…", file=sys.stderr))
        path = precomputed.write(m, data)
        c = precomputed.circuit_from_json(data["confirmed_circuit"])
        print(f"{name}: {path} ({path.stat().st_size / 1024:.0f} kB, {time.perf_counter() - t:.0f} s): {c.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
