"""How long each dashboard page takes to load the first time, and to redraw after an interaction.

    .venv/bin/python benchmarks/dashboard_interaction.py                 # sprout (gpt-4 if not installed)
    .venv/bin/python benchmarks/dashboard_interaction.py --model gpt-4 --reps 7
    .venv/bin/python benchmarks/dashboard_interaction.py --sprout-shaped  # also a random-weight Sprout-sized model

Each page is opened in its own session (streamlit.testing.v1.AppTest, the script run without a
browser) on a 512-token text, loaded once (first load: model, analyses, caches; the pages are opened
in the order below, so a page's first load reuses the model and whatever an earlier page cached), then one
interaction per page is repeated, alternating between two values so every redraw is a real change;
rounds are interleaved over the pages so machine noise hits them alike. The table gives the first
load (wall-clock, and the CPU time of the whole process over it, every thread: the work the page does, which
waiting for a busy machine's CPUs does not inflate), and the median, fastest and slowest redraw over ``--reps``
rounds. Times are the script run (what the server does for an interaction); the browser's own drawing is not
included. The load average before and after is printed: on a shared machine, read the table with it.

``--sprout-shaped`` adds a model with Sprout's shape (8 blocks, d_model 384, 6 heads) and random
weights, saved to a temporary folder: its timings stand in for the trained sprout before that
checkpoint exists (the work per redraw does not depend on the weights' values).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboards" / "app.py"
OWN_PATH = "a checkpoint folder or course .pt…"
OWN_TEXT = "type your own…"
N_TOKENS = 512


def text_of(model, n: int = N_TOKENS) -> tuple[str, str]:
    """A text of at least ``n`` tokens for ``model``'s tokenizer, and where it came from."""
    from sprout_interp.core.texts import TEXTS, validation_sample

    try:
        ids = validation_sample(model.tokenizer, n=1, length=n, seed=0)[0]
        return model.to_string(ids), f"{n} tokens of held-out text"
    except Exception:  # no corpus installed: the ready-made texts, repeated
        text = " ".join(TEXTS.values())
        while len(model.tokenizer.encode(text, add_special_tokens=False).ids) < n:
            text += " " + text
        return text, f"the ready-made texts repeated, cut to {n} tokens"


def sprout_shaped(folder: Path) -> Path:
    """Save a random-weight model with Sprout's preset shape (and the shipped tokenizer) to ``folder``."""
    import torch

    from sprout_interp.core import loading
    from sprout_model import GPT
    from sprout_model.checkpoint import save_checkpoint
    from sprout_model.presets import PRESETS

    torch.manual_seed(0)
    gpt = GPT(PRESETS["sprout"]).eval()
    return save_checkpoint(gpt, folder, Path(loading.SHIPPED_DIR) / "tokenizer.json", {"note": "random weights"})


# page -> (file, widget kind, key, two values to alternate, what the interaction is)
INTERACTIONS = {
    "anatomy": ("views/anatomy.py", "radio", "anatomy_part", ("ffn", "attention"), "show another part's code"),
    "logit_lens": ("views/logit_lens.py", "number_input", "lens_pos", (100, 101), "pick another cell"),
    "residual": ("views/residual.py", "toggle", "rms_log", (False, True), "toggle log scale"),
    "attention": ("views/attention.py", "selectbox", "attn_head", (1, 0), "pick another head"),
    "ablations": ("views/ablations.py", "slider", "abl_start", (200, 1), "scroll the per-token chart"),
    "compare": ("views/compare.py", "slider", "cmp_start", (200, 1), "scroll the per-token chart"),
    "patching": ("views/patching.py", "slider", "patch_pos", (38, 39), "graph of another prediction"),
    "positions": ("views/positions.py", "number_input", "pos_m", (50, 51), "move the query"),
    "features": ("views/features.py", "radio", "feat_how", ("by token", "by number"), "find a feature by token"),
}


def run_model(key: str, path: str | None, text: str, reps: int) -> list[dict]:
    from streamlit.testing.v1 import AppTest

    sessions, first, first_cpu, pages = {}, {}, {}, dict(INTERACTIONS)
    for page, (file, kind, wkey, *_rest) in INTERACTIONS.items():
        at = AppTest.from_file(str(APP), default_timeout=900)
        at.session_state["model_choice"] = OWN_PATH if path else key
        if path:
            at.session_state["model_path"] = path
        at.session_state["text_choice"] = OWN_TEXT
        at.session_state["own_text"] = text
        at.switch_page(file)
        t, c = time.perf_counter(), time.process_time()
        at.run()
        first[page], first_cpu[page] = time.perf_counter() - t, time.process_time() - c
        if at.exception or at.error:
            raise RuntimeError(f"{page}: {[e.value for e in [*at.exception, *at.error]]}")
        try:
            getattr(at, kind)(key=wkey)
        except KeyError:  # the page has nothing to interact with for this model (a features page without an SAE)
            print(f"note: {page}: no {kind} {wkey!r} on the page for {key}; first load only", file=sys.stderr)
            del pages[page]
        sessions[page] = at

    def interact(page: str, value) -> float:
        _, kind, wkey, _, _ = INTERACTIONS[page]
        at = sessions[page]
        getattr(at, kind)(key=wkey).set_value(value)
        t = time.perf_counter()
        at.run()
        dt = time.perf_counter() - t
        if at.exception or at.error:
            raise RuntimeError(f"{page}: {[e.value for e in [*at.exception, *at.error]]}")
        return dt

    for page, (*_, values, _) in pages.items():  # warm-up: each value once (fills the caches)
        for v in values:
            interact(page, v)
    times = {p: [] for p in pages}
    for r in range(reps):
        for page, (*_, values, _) in pages.items():
            times[page].append(interact(page, values[r % 2]))
    nan = float("nan")
    return [
        dict(model=key, page=page, interaction=INTERACTIONS[page][4] if page in times else "(none: first load only)",
             first=first[page], first_cpu=first_cpu[page], median=statistics.median(times[page]) if page in times else nan,
             fastest=min(times[page]) if page in times else nan, slowest=max(times[page]) if page in times else nan)
        for page in INTERACTIONS
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="shipped name or checkpoint path (default: sprout, else gpt-4)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sprout-shaped", action="store_true", help="also time a random-weight Sprout-shaped model")
    ap.add_argument("--pages", nargs="*", default=list(INTERACTIONS), choices=list(INTERACTIONS))
    a = ap.parse_args(argv)
    for page in list(INTERACTIONS):
        if page not in a.pages:
            del INTERACTIONS[page]

    import torch

    import sprout_interp as si
    from sprout_interp.core import loading

    models: list[tuple[str, str | None]] = []
    if a.model:
        models.append((a.model, None if a.model in loading.SHIPPED else a.model))
    elif (Path(loading.SHIPPED_DIR) / "sprout" / "model.safetensors").is_file():
        models.append(("sprout", None))
    else:
        print("note: the sprout checkpoint is not installed; timing gpt-4 instead", file=sys.stderr)
        models.append(("gpt-4", None))
    tmp = None
    if a.sprout_shaped:
        tmp = tempfile.TemporaryDirectory(prefix="sprout-shaped-")
        models.append(("sprout-shaped (random weights)", str(sprout_shaped(Path(tmp.name) / "sprout-shaped"))))

    load_before = os.getloadavg()
    rows = []
    for key, path in models:
        m = si.load(path or key)
        text, source = text_of(m)
        print(f"{key}: {m.cfg.n_layers} blocks, d_model {m.cfg.d_model}, {m.cfg.n_heads} heads; text: {source}; "
              f"torch threads {torch.get_num_threads()}", file=sys.stderr)
        rows += run_model(key, path, text, a.reps)

    print(f"\nDashboard first load and redraw after one interaction (AppTest script run, {N_TOKENS}-token text, "
          f"median of {a.reps} interleaved rounds; {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}; "
          f"load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after)\n")
    w = max(len(r["model"]) for r in rows)
    wi = max(26, *(len(r["interaction"]) for r in rows))
    print(f"| {'model':{w}s} | page       | {'interaction':{wi}s} | first load | its CPU time | median redraw | fastest | "
          "slowest |")
    print(f"|{'-' * (w + 2)}|------------|{'-' * (wi + 2)}|-----------:|-------------:|--------------:|--------:|--------:|")
    for r in rows:
        print(f"| {r['model']:{w}s} | {r['page']:10s} | {r['interaction']:{wi}s} | {r['first']:8.2f} s | "
              f"{r['first_cpu']:10.2f} s | {r['median']:11.2f} s | {r['fastest']:5.2f} s | {r['slowest']:5.2f} s |")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
